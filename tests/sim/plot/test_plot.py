"""sim.plot: the figures work on any Result, the CLI writes what it says, bad arguments
fail with one line and status 2."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from matplotlib.patches import Rectangle

import sim
from sim.plot import heatmap
from sim.schedule.registry import TEXTBOOK  # what the CLI draws unless told
from sim.plot.gantt import DPI, MAX_HEIGHT, WIDTH, counts_micro_batches, format_times, human_bytes, plot_compare, plot_overlay, \
    plot_result, save_figure, timeline_style

ROOT = Path(__file__).resolve().parents[3]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# `sim.cli.heartbeat`'s line: only a build or simulation slow enough (a loaded machine) prints one
HEARTBEAT = re.compile(r"^sim\.plot: [^\[].*: \d+ s so far$")


def steady(stderr: str) -> list[str]:
    """The lines of `stderr` that do not depend on how fast the machine is: all but the heartbeat's."""
    return [line for line in stderr.splitlines() if not HEARTBEAT.match(line)]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sim.plot", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, f"{path} is not a PNG"
    assert len(data) > 10_000, f"{path} is suspiciously small ({len(data)} bytes)"


def compute_bars(ax) -> list[Rectangle]:
    return [p for p in ax.patches if isinstance(p, Rectangle) and (p.get_gid() or "").startswith("compute")]


def measured_copy(result: sim.Result, offset: float = 1000.0, stretch: float = 0.1) -> sim.Result:
    """`result` as if measured: times start at `offset` and rank r runs (1 + stretch*r) slower."""
    def t(time: float, rank: int) -> float:
        return offset + time * (1 + stretch * rank)

    events = [sim.Event(e.rank, e.action, t(e.start, e.rank), t(e.end, e.rank), e.peer) for e in result.events]
    memory = [[(t(x, r), b) for x, b in series] for r, series in enumerate(result.memory)]
    activations = [[(t(x, r), n) for x, n in series] for r, series in enumerate(result.activations)]
    return sim.Result(result.schedule, events, memory, activations, source="measured")


# ---------------------------------------------------------------- the command line

USERS_COMMAND = ("--stages", "4", "--micro", "8")  # the users' own spelling of --devices 4 --micro-batches 8


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("figures")
    proc = run_cli(*USERS_COMMAND, "--out", str(out), "--trace")
    assert proc.returncode == 0, proc.stderr
    return out, proc


def test_the_old_flags_are_aliases_that_say_so_in_the_help_only(cli_run, tmp_path):
    """`--stages 4 --micro 8` runs exactly as `--devices 4 --micro-batches 8`, printing nothing
    on stderr but its progress (no warning); only `--help` says they are aliases."""
    _, proc = cli_run
    assert all(line.startswith("sim.plot: [") for line in steady(proc.stderr)), proc.stderr  # progress only
    new = run_cli("--devices", "4", "--micro-batches", "8", "--no-figures")
    old = run_cli(*USERS_COMMAND, "--no-figures")
    assert new.returncode == old.returncode == 0
    assert (new.stdout, steady(new.stderr)) == (old.stdout, steady(old.stderr))
    assert not any(word in old.stderr.lower() for word in ("warn", "deprecat", "alias"))
    text = "".join(run_cli("--help").stdout.split())  # without the help's line breaks
    assert "--devicesP,--stagesP" in text and "(--stages:aliasof--devices)" in text
    assert "--micro-batchesM,--microM" in text and "(--micro:aliasof--micro-batches)" in text


def test_cli_writes_one_png_per_schedule_and_a_comparison(cli_run):
    out, _ = cli_run
    for name in list(TEXTBOOK) + ["compare"]:
        assert_png(out / f"{name}_p4_m8.png")


def test_cli_table_has_the_closed_form_makespans(cli_run):
    _, proc = cli_run
    rows = {line.split()[0]: line.split() for line in proc.stdout.splitlines() if line.strip()}
    assert rows["schedule"][:2] == ["schedule", "makespan"]
    assert float(rows["naive"][1]) == 96      # p * m * (F + B)
    assert float(rows["gpipe"][1]) == 33      # (m + p - 1) * (F + B)
    assert float(rows["1f1b"][1]) == 33
    # rank 0 spans the whole step: steady step = makespan, both bubbles (p - 1) / (m + p - 1) = 3 / 11
    assert [float(rows["1f1b"][3]), rows["1f1b"][2], rows["1f1b"][4]] == [33, "27.3%", "27.3%"]
    assert rows["1f1b"][5] == "4,3,2,1"       # 1F1B holds p - s micro-batches on stage s
    assert rows["gpipe"][5] == "8,8,8,8"      # GPipe holds all of them


def test_cli_trace_is_chrome_json(cli_run):
    out, _ = cli_run
    for name in TEXTBOOK:
        with open(out / f"{name}_p4_m8.trace.json") as f:
            trace = json.load(f)
        assert isinstance(trace["traceEvents"], list) and trace["traceEvents"]


def test_cli_schedule_choice_and_no_figures(tmp_path):
    proc = run_cli("--schedule", "1F1B", "--schedule", "gpipe,1f1b", "--no-figures", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    names = [line.split()[0] for line in proc.stdout.splitlines()[1:] if not line.startswith("wrote")]
    assert names == ["1f1b", "gpipe"]
    assert list(tmp_path.iterdir()) == []


def test_cli_call_overheads_reach_the_simulation(tmp_path):
    """naive on 2 stages, m = 3: 2m(F + B + L + o_arrive) + (2m - 1) o_recv = 18 + 6 * 0.05 + 5 * 0.2
    (docs/rules.md)."""
    proc = run_cli("--devices", "2", "--micro-batches", "3", "--schedule", "naive", "--recv-overhead", "0.2",
                   "--send-overhead", "0.1", "--arrive-overhead", "0.05", "--no-figures", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    row = proc.stdout.splitlines()[1].split()
    assert row[0] == "naive" and float(row[1]) == pytest.approx(19.3)


def test_cli_io_tick_reaches_the_simulation(tmp_path):
    """GPipe on 2 stages, m = 4, forward 1 and 2.5, backward 1: a ready notice comes in late
    (at 3.5, rank 0 sent F2 at 3) while rank 0 computes F3, but rank 1 is still busy with
    F1 until 6, so the step is the same with and without the wait; the SEND_F2 in the
    trace ends at 3.5 + E[min(0.5, U(0, 1))] = 3.875 (tests/sim/engine/test_core.py has the rule)."""
    base = ["--devices", "2", "--micro-batches", "4", "--schedule", "gpipe", "--forward", "1,2.5", "--backward", "1",
            "--no-figures", "--trace"]
    steps = []
    for tick in ("0", "1"):
        out = tmp_path / tick
        proc = run_cli(*base, "--io-tick", tick, "--out", str(out))
        assert proc.returncode == 0, proc.stderr
        steps.append(float(proc.stdout.splitlines()[1].split()[1]))
        trace = json.loads(next(out.glob("*.json")).read_text())
        span = next(e for e in trace["traceEvents"] if e.get("name") == "0SEND_F2")
        assert (span["ts"] + span["dur"]) / 1e6 == pytest.approx(3.5 if tick == "0" else 3.875)
    assert steps[0] == steps[1]


def test_cli_runtime_time_around_computes():
    """Naive on 2 stages, m = 2, F = 1, B = 2: all 4m computes are on the critical path, each
    with the runtime's time before it and all but the last with the time after it:
    2m(F + B) + 4m x 0.1 + (4m - 1) x 0.05 = 13.15 (the closed form is in tests/sim/engine/test_core.py)."""
    proc = run_cli("--devices", "2", "--micro-batches", "2", "--schedule", "naive", "--forward", "1", "--backward", "2",
                   "--before-compute", "0.1", "--after-compute", "0.05", "--no-figures")
    assert proc.returncode == 0, proc.stderr
    assert float(proc.stdout.splitlines()[1].split()[1]) == pytest.approx(13.15)


@pytest.mark.parametrize("args", [
    ["--devices", "0"],
    ["--micro", "-3"],
    ["--stages", "four"],
    ["--micro", "2.5"],
    ["--schedule", "zigzag"],
    ["--forward", "1,2"],              # 2 values for 4 stages
    ["--backward", "x"],
    ["--latency", "-1"],
    ["--recv-overhead", "-0.1"],
    ["--arrive-overhead", "nan"],
    ["--io-tick", "-1"],
    ["--before-compute", "-0.5"],
    ["--after-compute", "inf"],
    ["--bandwidth", "0"],
    ["--static-bytes", "nan"],
    ["--no-such-option"],
    ["--out", str(Path(__file__))],    # a file, not a folder
])
def test_cli_bad_arguments_fail_with_one_line(args):
    proc = run_cli(*args)
    assert proc.returncode == 2
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("sim.plot: error: ")
    assert "Traceback" not in proc.stderr and "usage" not in proc.stderr


# ---------------------------------------------------------------- options, V and split costs, in process

@pytest.fixture
def zoo(monkeypatch):
    """Generators registered for the test: 'capped' takes max_active; 'auto' takes costs and
    memory_limit and refuses M < P; 'looped' puts V stages on each device (stage s on
    s mod P) with a split backward. Each records the options it was given."""
    from sim.schedule.registry import Generator, SCHEDULES
    from sim.schedule.textbook import gpipe_on, one_f_one_b

    calls = {}

    def record(name, schedule, **options):
        calls[name] = options
        return schedule

    def looped(p, m, v):
        return record("looped", gpipe_on([s % p for s in range(p * v)], m, split=True, name="looped"))

    monkeypatch.setitem(SCHEDULES, "capped", Generator(
        lambda p, m, v, **o: record("capped", one_f_one_b(p, m), **o), "1f1b, capped", options=("max_active",)))
    monkeypatch.setitem(SCHEDULES, "auto", Generator(
        lambda p, m, v, **o: record("auto", one_f_one_b(p, m), **o), "automatic", options=("costs", "memory_limit"),
        check=lambda p, m, v, **o: f"M={m} is fewer than the {p} devices" if m < p else None))
    monkeypatch.setitem(SCHEDULES, "looped", Generator(looped, "looped, split", virtual=2, takes_virtual=True))
    return calls


def run_main(capsys, *args: str) -> tuple[int, str, str]:
    from sim.plot import cli as plot_cli

    try:
        code = plot_cli.main(list(args))
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_options_go_to_the_schedules_that_take_them(zoo, capsys):
    code, out, err = run_main(capsys, "--schedule", "capped,naive,auto", "--max-active", "2", "--memory-limit", "3e9",
                              "--backward-input", "1.5", "--no-figures")
    assert code == 0, err
    assert zoo["capped"] == {"max_active": 2}
    assert zoo["auto"]["memory_limit"] == 3e9 and zoo["auto"]["costs"].backward_input == 1.5
    code, _, err = run_main(capsys, "--schedule", "naive", "--max-active", "2", "--no-figures")
    assert code == 2 and err.count("\n") == 1
    assert err.startswith("sim.plot: error: argument --max-active: naive takes no --max-active; it is for ")
    assert "capped" in err and "1f1b" in err


def test_cli_turns_a_generators_refusal_into_one_line(zoo, capsys):
    code, out, err = run_main(capsys, "--schedule", "auto", "--devices", "4", "--micro-batches", "2", "--no-figures")
    assert code == 2 and out == ""
    assert err == "sim.plot: error: auto on 4 devices, 2 micro-batches: M=2 is fewer than the 4 devices\n"


def test_cli_virtual_and_split_costs_reach_the_simulation(zoo, capsys, tmp_path):
    """--virtual 3 gives 2 x 3 model stages; per-stage lists count them, and one number is a
    device's share, 1/3 of it per chunk; the table is the simulation of the same schedule
    under those costs, in process."""
    from sim.schedule.textbook import gpipe_on

    costs = sim.Costs(forward=(1, 2, 1, 2, 1, 2), backward_input=0.5 / 3, backward_weight=0.25 / 3,
                      w_activation_bytes=0.75 / 3, activation_bytes=1 / 3)
    expected = sim.simulate(gpipe_on([0, 1, 0, 1, 0, 1], 4, split=True), costs)
    code, out, err = run_main(capsys, "--schedule", "looped", "--devices", "2", "--micro-batches", "4", "--virtual", "3",
                              "--forward", "1,2,1,2,1,2", "--backward-input", "0.5", "--backward-weight", "0.25",
                              "--w-activation-bytes", "0.75", "--out", str(tmp_path))
    assert code == 0, err
    row = out.splitlines()[1].split()
    assert row[0] == "looped" and float(row[1]) == pytest.approx(expected.makespan, abs=0.01)  # as printed
    assert float(row[3]) == pytest.approx(expected.steady_step, abs=0.01)
    assert row[-1] == "B" and float(row[-2]) == pytest.approx(max(expected.peak_memory), rel=0.01)
    assert (tmp_path / "looped_p2_m4_v3.png").exists()
    code, _, err = run_main(capsys, "--schedule", "looped", "--devices", "2", "--forward", "1,2", "--no-figures")
    assert code == 2 and "got 2 values for 4 stages of looped (2 devices x V 2); give one number or 4" in err


# ---------------------------------------------------------------- the figures

@pytest.fixture(scope="module")
def one_f_one_b():
    return sim.simulate(sim.make_schedule("1f1b", devices=4, micro_batches=8), sim.Costs())


def test_plot_result_draws_one_bar_per_compute_event(one_f_one_b):
    fig = plot_result(one_f_one_b)
    gantt, memory = fig.axes[:2]
    bars = compute_bars(gantt)
    assert len(bars) == len(one_f_one_b.compute_events()) == 4 * 8 * 2
    # bars start at their event's start, relative to t0, on their rank's row
    first = next(b for b in bars if b.get_gid() == "compute 0F0")
    assert first.get_x() == 0 and first.get_width() == 1
    assert memory.get_ylabel().startswith("activations held")
    assert len(memory.get_lines()) == one_f_one_b.ranks


def test_plot_result_of_split_backward_and_bytes(tmp_path):
    # I and W bars, and byte-sized memory with static weights: the axis is in GiB
    sched = sim.Schedule([["0F0", "0F1", "0I0", "0W0", "0I1", "0W1"],
                          ["1F0", "1I0", "1F1", "1I1", "1W0", "1W1"]], name="split")
    result = sim.simulate(sched, sim.Costs(static_bytes=2 * 2**30, activation_bytes=2**29))
    assert not counts_micro_batches(result)
    fig = plot_result(result)
    assert len(compute_bars(fig.axes[0])) == 12
    assert fig.axes[1].get_ylabel() == "memory held\n(full row: 3 GiB)"  # 2 GiB static + 2 x 0.5 GiB
    save_figure(fig, tmp_path / "split.png")
    assert_png(tmp_path / "split.png")


def test_plot_overlay_of_simulated_and_measured(one_f_one_b, tmp_path):
    measured = measured_copy(one_f_one_b)
    assert measured.t0 == 1000.0 and measured.makespan > one_f_one_b.makespan
    fig = plot_overlay(one_f_one_b, measured)
    ax = fig.axes[0]
    # both runs drawn, each from its own t0
    assert len(compute_bars(ax)) == 2 * len(one_f_one_b.compute_events())
    assert min(b.get_x() for b in compute_bars(ax)) == 0
    error = (one_f_one_b.makespan - measured.makespan) / measured.makespan  # the simulator's error
    assert f"{error:+.1%}" in fig._suptitle.get_text()
    save_figure(fig, tmp_path / "overlay.png")
    assert_png(tmp_path / "overlay.png")
    # a measured result alone draws too, times relative to its t0
    fig = plot_result(measured)
    assert min(b.get_x() for b in compute_bars(fig.axes[0])) == 0


@pytest.fixture(scope="module")
def p8_m32():
    return [sim.simulate(sim.make_schedule(n, 8, 32)) for n in TEXTBOOK]


def chart_axes(fig) -> list:
    """The axes of a figure that hold a chart or a memory panel (not colour bars)."""
    return [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]


def test_compare_shares_one_time_axis_when_asked_or_when_steps_are_alike():
    results = [sim.simulate(sim.make_schedule(n, 3, 4)) for n in TEXTBOOK]  # 36, 18, 18
    for fig in (plot_compare(results), plot_compare(results, shared_time=True)):
        assert {ax.get_xlim()[1] for ax in fig.axes} == {max(r.makespan for r in results)}
        assert "on one time axis" in fig._suptitle.get_text()


def test_compare_gives_each_schedule_its_own_time_axis_when_one_is_much_longer(p8_m32):
    """At p=8, m=32 naive takes 768 and GPipe 117: on one axis GPipe would get 15 % of it."""
    fig = plot_compare(p8_m32)
    axes = chart_axes(fig)
    assert len(axes) == 6  # a chart and a memory panel per schedule
    for i, r in enumerate(p8_m32):
        assert axes[2 * i].get_xlim() == axes[2 * i + 1].get_xlim() == (0, r.makespan)
    assert "each on its own time axis (the longest step is 6.6x the shortest)" in fig._suptitle.get_text()


def peak_heights(ax) -> list[float]:
    """Per row of a memory panel, the height of its highest point as a share of the row."""
    return [(r + 0.42 - line.get_ydata().min()) / 0.84 for r, line in enumerate(ax.get_lines())]


def test_compare_draws_memory_on_one_scale(p8_m32):
    naive, gpipe, one_f_one_b = chart_axes(plot_compare(p8_m32))[1::2]
    assert naive.get_ylabel() == gpipe.get_ylabel() == one_f_one_b.get_ylabel() == \
        "activations held\n(full row: 32 micro-batches)"
    assert peak_heights(gpipe) == pytest.approx([1.0] * 8)                            # 32 of 32
    assert peak_heights(one_f_one_b) == pytest.approx([(8 - s) / 32 for s in range(8)])  # p - s of 32
    assert peak_heights(naive) == pytest.approx([1 / 32] * 8)


def test_memory_has_a_row_per_device_that_can_be_followed():
    """Naive's devices all hold 0 or 1 micro-batch: as lines on one axis they hid each
    other; each is now in its own row, and the rows do not overlap."""
    result = sim.simulate(sim.make_schedule("naive", 4, 8))
    memory = plot_result(result).axes[1]
    for r, line in enumerate(memory.get_lines()):
        assert line.get_gid() == f"memory rank {r}"
        y = line.get_ydata()
        assert r - 0.42 - 1e-9 <= y.min() and y.max() <= r + 0.42 + 1e-9
        assert y.min() == pytest.approx(r - 0.42)  # its own peak fills its row
    assert [t.get_text() for t in memory.texts] == ["peak 1 micro-batch"] * 4


def test_save_figure_hides_labels_that_do_not_fit(tmp_path):
    # forward 100x shorter than backward: its bars are far too narrow for a number
    result = sim.simulate(sim.make_schedule("gpipe", 2, 2), sim.Costs(forward=0.02, backward=2.0))
    fig = plot_result(result)
    save_figure(fig, tmp_path / "narrow.png")
    shown = {t.get_text() for t in fig.axes[0].texts if t.get_visible()}
    assert len([t for t in fig.axes[0].texts if t.get_visible()]) == 4  # the four B bars
    assert shown == {"0", "1"}


def test_human_bytes():
    assert human_bytes(0) == "0 B"
    assert human_bytes(1536) == "1.5 KiB"
    assert human_bytes(3 * 2**30) == "3 GiB"


# ---------------------------------------------------------------- large steps

def png_size(path: Path) -> tuple[int, int]:
    """(width, height) in pixels, from the PNG's header."""
    data = path.read_bytes()[:24]
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


@pytest.fixture(scope="module")
def large():
    return sim.simulate(sim.make_schedule("1f1b", devices=64, micro_batches=512))


def test_large_step_is_a_heat_map_of_bounded_size(large, tmp_path):
    assert timeline_style(large) == "heat"
    fig = plot_result(large)
    chart, memory = fig.axes[:2]
    assert not chart.patches and not memory.get_lines()   # no patch per bar, no line per rank
    assert chart.images[0].get_array().shape == (64, heatmap.BINS)
    assert memory.images[0].get_array().shape == (64, heatmap.BINS)
    assert chart.get_legend() is None and memory.get_legend() is None
    save_figure(fig, tmp_path / "large.png")
    width, height = png_size(tmp_path / "large.png")
    assert width <= WIDTH * DPI and height <= MAX_HEIGHT * DPI


def test_compare_of_large_steps_is_bounded(large, tmp_path):
    gpipe = sim.simulate(sim.make_schedule("gpipe", devices=64, micro_batches=512))
    fig = plot_compare([gpipe, large])
    assert fig.get_size_inches()[1] <= MAX_HEIGHT
    memory_scales = {ax.images[0].get_clim() for ax in fig.axes[1::2] if ax.images}
    assert memory_scales == {(0.0, 512.0)}  # GPipe's peak, for both


def test_dense_bars_are_one_collection_per_kind_without_outlines():
    result = sim.simulate(sim.make_schedule("gpipe", devices=4, micro_batches=128))  # 256 bars per rank, ~4 px each
    assert timeline_style(result) == "dense"
    fig = plot_result(result)
    chart = fig.axes[0]
    assert not compute_bars(chart) and not chart.texts
    bars = {c.get_gid(): c for c in chart.collections if (c.get_gid() or "").startswith("computes")}
    assert set(bars) == {"computes F", "computes B"}
    assert all(len(c.get_paths()) == 4 * 128 and not c.get_linewidth().any() for c in bars.values())
    assert len(chart.get_legend().get_texts()) == 3  # F, B, idle


def test_many_devices_show_a_sample():
    result = sim.simulate(sim.make_schedule("gpipe", devices=600, micro_batches=1))
    rows = heatmap.shown_ranks(result.ranks)
    assert rows == list(range(0, 600, 3))
    fig = plot_result(result)
    assert fig.axes[0].images[0].get_array().shape == (200, heatmap.BINS)
    assert fig.axes[0].get_ylabel() == "one rank in 3 of 600"


def test_busy_share_is_the_busy_time_per_bin():
    # one rank: F on [0, 1], B on [1, 3], idle to the end of rank 1's work at 4
    result = sim.simulate(sim.make_schedule("gpipe", devices=2, micro_batches=1))
    assert result.makespan == 6
    share = heatmap.busy_share(result, [0, 1], bins=12)
    w = result.makespan / 12
    assert share.sum(axis=1) * w == pytest.approx(result.busy())
    assert share[0].tolist() == [1, 1] + [0] * 6 + [1, 1, 1, 1]      # 0F0, idle, 0B0
    assert share[1].tolist() == [0, 0, 1, 1, 1, 1, 1, 1] + [0] * 4   # 1F0 1B0


def test_binned_max_keeps_peaks_and_the_last_change_at_an_instant():
    series = [(0.0, 0.0), (1.0, 5.0), (1.2, 2.0), (2.0, 3.0), (2.0, 1.0), (3.5, 0.0)]
    # bins [0, 1), [1, 2) with the spike to 5, [2, 3) from 1 (3 and 1 at one instant), [3, 4)
    assert heatmap.binned_max(series, t0=0.0, end=4.0, bins=4).tolist() == [0.0, 5.0, 1.0, 1.0]
    assert heatmap.binned_max([], 0.0, 1.0, bins=3).tolist() == [0.0, 0.0, 0.0]


def test_titles_give_units_and_singulars():
    result = sim.simulate(sim.make_schedule("gpipe", devices=1, micro_batches=1))
    fig = plot_result(result)
    assert fig._suptitle.get_text() == \
        "gpipe: 1 stage, 1 micro-batch  |  makespan 3 time units, bubble 0.0% (steady 0.0%)"
    assert fig.axes[0].get_xlabel() == "" and fig.axes[1].get_xlabel() == "time (time units)"
    assert str(result.schedule).startswith("Schedule 'gpipe': 1 stage on 1 device, 1 micro-batch\n")
    assert format_times([98304.0, 1725.0]) == ["98304", "1725"]
    assert format_times([19.3, 13.15]) == ["19.30", "13.15"]
    assert format_times([0.012345]) == ["0.01235"]


def test_cli_compares_schedules_on_the_same_model(capsys, tmp_path):
    """One number is a device's share of the model: ZB-V's two chunks per device each take
    half of it, so with F = 1, B = 2 per device (F = I = W = 0.5 per chunk) ZB-V's step is
    6Mt + (P-1)t with t = 0.5 (docs/schedules.md) and it holds P micro-batches' activations
    per device at most, as 1F1B does (Qi et al. 2024, ZB-V)."""
    code, out, err = run_main(capsys, "--compare", "1f1b,zbv", "--devices", "4", "--micro-batches", "8", "--out", str(tmp_path))
    assert code == 0, err
    rows = {line.split()[0]: line for line in out.splitlines()[1:3]}
    assert float(rows["zbv"].split()[1]) == 6 * 8 * 0.5 + 3 * 0.5
    assert rows["1f1b"].endswith("  4 micro-batches") and rows["zbv"].endswith("  4 micro-batches")
