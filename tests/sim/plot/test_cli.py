"""`python -m sim.plot`, all of its command line: what it writes and prints, the flags
that reach the simulation, large steps drawn in bounded time and size, steps too large
refused at once, units everywhere, `--help` with the defaults, and every bad argument
refused with one line on stderr and exit status 2.

The tests call its `main(argv)` in this process (`helpers.run_main`); the last two run the
command itself, as a user types it (slow: each starts Python)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import sim
from sim.plot import cli as plot_cli
from sim.plot.gantt import DPI, MAX_HEIGHT, WIDTH
from sim.schedule.registry import TEXTBOOK  # what the CLI draws unless told
from helpers import one_line, run_main

ROOT = Path(__file__).resolve().parents[3]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
USERS_COMMAND = ("--stages", "4", "--micro", "8")  # the users' own spelling of --devices 4 --micro-batches 8

# `sim.cli.heartbeat`'s line: only a build or simulation slow enough (a loaded machine) prints one
HEARTBEAT = re.compile(r"^sim\.plot: [^\[].*: \d+ s so far$")


def run_cli(*args: str) -> subprocess.CompletedProcess:
    """`python -m sim.plot ARGS`, run in this process: exit status, stdout, stderr."""
    return run_main(plot_cli.main, *args)


def steady(stderr: str) -> list[str]:
    """The lines of `stderr` that do not depend on how fast the machine is: all but the heartbeat's."""
    return [line for line in stderr.splitlines() if not HEARTBEAT.match(line)]


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) in pixels, from the PNG's header."""
    data = path.read_bytes()[:24]
    assert data[:8] == PNG_MAGIC, f"{path} is not a PNG"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, f"{path} is not a PNG"
    assert len(data) > 10_000, f"{path} is suspiciously small ({len(data)} bytes)"


# ---------------------------------------------------------------- 1. large figures

def test_large_step_draws_in_bounded_time_and_size(tmp_path):
    """64 stages x 512 micro-batches: about 10 s here (it took 13 minutes, 4.3 GB and a
    4212-pixel-tall figure with a patch per bar)."""
    proc = run_cli("--devices", "64", "--micro-batches", "512", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    pngs = sorted(tmp_path.glob("*.png"))
    assert [p.name for p in pngs] == ["1f1b_p64_m512.png", "compare_p64_m512.png", "gpipe_p64_m512.png",
                                      "naive_p64_m512.png"]
    for png in pngs:
        width, height = png_size(png)
        assert width <= WIDTH * DPI and height <= MAX_HEIGHT * DPI, png
    # progress on stderr: a line per figure, before it is drawn
    progress = [line for line in proc.stderr.splitlines() if " writing " in line]
    assert len(progress) == 4 and all(line.startswith("sim.plot: [") for line in progress)
    assert "heat map" in progress[0]


# ---------------------------------------------------------------- 2. refused before any work

def assert_refused(proc: subprocess.CompletedProcess, *words: str) -> str:
    """Exit status 2, nothing on stdout, one line on stderr that holds `words`."""
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("sim.plot: error: "), proc.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("args,cells,more", [(["--devices", "10000000"], "80,000,000", "fewer --schedule or --no-figures"),
                                             (["--micro-batches", "10000000"], "40,000,000", "--no-figures"),
                                             (["--devices", "2000", "--micro-batches", "2000", "--no-figures"],
                                              "4,000,000", "fewer --schedule to allow more")])
def test_a_step_too_large_for_the_machine_is_refused_at_once(args, cells, more):
    """--devices 10000000 used to eat memory silently, --micro-batches 10000000 to end in a
    MemoryError traceback; now both are refused before anything is allocated, saying what
    to give instead (`sim.limits.check_cells` with the command's hint)."""
    line = assert_refused(run_cli(*args), "too large for this machine", "the limit here is",
                          "of its memory", "give fewer --devices or --micro-batches", more)
    assert f"{cells} stage-micro-batches" in line


def test_the_limit_is_what_the_memory_allows(monkeypatch):
    from sim import limits
    from sim.plot import cli as plot_cli

    per = limits.BYTES_PER_CELL["table"]
    monkeypatch.setattr(limits, "machine_memory", lambda: 2 * limits.BASE_BYTES + 2 * 3 * per * 1000)
    args = plot_cli.build_parser().parse_args(["--devices", "10", "--micro-batches", "100", "--no-figures"])
    plot_cli.check_size(args, 3)  # exactly at the limit: 1000 stage-micro-batches of 3 schedules
    args.micro_batches = 101
    with pytest.raises(SystemExit) as e:
        plot_cli.check_size(args, 3)
    assert e.value.code == 2
    plot_cli.check_size(args, 1)  # one schedule: three times as many allowed
    args.micro_batches, args.no_figures = 100, False  # at the limit, but figures take more per stage-micro-batch
    with pytest.raises(SystemExit):
        plot_cli.check_size(args, 3)


def test_an_unwritable_out_is_refused_before_any_work(tmp_path):
    """A folder that cannot be made is found before simulating (no table on stdout), not
    after the first figure."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    proc = run_cli("--devices", "64", "--micro-batches", "512", "--out", str(blocker / "figures"))
    assert_refused(proc, "argument --out: cannot write to", "Not a directory")
    assert not (blocker.parent / "figures").exists()


def test_out_is_not_touched_when_nothing_is_written(tmp_path):
    proc = run_cli("--no-figures", "--out", str(tmp_path / "never"))
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / "never").exists()


# ---------------------------------------------------------------- 3. units and labels

def table(proc: subprocess.CompletedProcess) -> list[str]:
    assert proc.returncode == 0, proc.stderr
    return [line for line in proc.stdout.splitlines() if line and not line.startswith("wrote ")]


def test_the_table_gives_units_and_counts_micro_batches_without_bytes():
    header, *rows = table(run_cli("--no-figures"))
    assert "makespan (time units)" in header and "peak activations (micro-batches)" in header
    # the default costs give no bytes: memory is a count of micro-batches, not "8 B"
    assert [row.split(None, 6)[6] for row in rows] == ["1 micro-batch", "8 micro-batches", "4 micro-batches"]


def test_the_table_gives_bytes_with_suffixes_when_bytes_are_given():
    _, *rows = table(run_cli("--no-figures", "--activation-bytes", str(2**20), "--static-bytes", str(2**30)))
    assert [row.split(None, 6)[6] for row in rows] == ["1 GiB", "1.01 GiB", "1 GiB"]


def test_makespans_are_printed_in_one_format():
    # naive 32 * 128 * (1 + 2) = 12288.x and 1F1B 400-odd: never 1.229e+04 beside 437.2
    _, *rows = table(run_cli("--devices", "32", "--micro-batches", "128", "--latency", "0.1", "--no-figures"))
    makespans = [row.split()[1] for row in rows]
    assert all("e" not in m for m in makespans)
    assert len({len(m.split(".")[1]) for m in makespans}) == 1, makespans  # as many decimals each
    assert float(makespans[0]) > 12288


def test_help_shows_defaults_and_units():
    proc = run_cli("--help")
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    for default in ("pipeline devices P, a rank each; the schedule has P x V model stages "
                    "(--stages: alias of --devices) (default: 4)",
                    "micro-batches per step (--micro: alias of --micro-",  # the help breaks the line there
                    "(default: 8)",
                    "(default: inf)", "(default: out)", "in time units"):
        assert default in text
    assert text.count("(default: ") >= 17


def test_one_stage_is_singular():
    proc = run_cli("--devices", "1", "--forward", "1,2")
    assert_refused(proc, "got 2 values for 1 stage;")


# ---------------------------------------------------------------- 4. the schedule zoo's flags

def test_virtual_names_the_v_the_schedule_refuses():
    assert_refused(run_cli("--schedule", "1f1b", "--virtual", "2", "--no-figures"),
                   "1f1b on 4 devices, 8 micro-batches: V=2")


@pytest.mark.parametrize("args,words", [
    (["--compare", "1f1b,zigzag"], ["argument --compare: unknown schedule 'zigzag'; choose from naive, gpipe, 1f1b"]),
    (["--compare", ","], ["argument --compare: no name given"]),
    (["--compare", "1f1b", "--schedule", "gpipe"], ["not allowed with argument"]),
    (["--schedule", "naive", "--max-active", "2"], ["argument --max-active: naive takes no --max-active"]),
    (["--schedule", "naive,1f1b", "--memory-limit", "1e9"], ["naive, 1f1b take no --memory-limit"]),
    (["--max-active", "0"], ["argument --max-active: got 0"]),
    (["--memory-limit", "0"], ["argument --memory-limit: got 0"]),
    (["--virtual", "0"], ["argument --virtual: got 0"]),
    (["--backward-input", "-1"], ["argument --backward-input"]),
    (["--backward-weight", "1,2"], ["argument --backward-weight: got 2 values for 4 stages"]),
    (["--w-activation-bytes", "x"], ["argument --w-activation-bytes"]),
])
def test_the_zoo_flags_refuse_bad_input_with_one_line(args, words):
    assert_refused(run_cli(*args, "--no-figures"), *words)


def test_compare_writes_one_figure_and_the_table(tmp_path):
    proc = run_cli("--compare", "1f1b,GPipe", "--out", str(tmp_path))
    header, *rows = table(proc)
    assert "steady step" in header and "steady bubble" in header
    assert [row.split()[0] for row in rows] == ["1f1b", "gpipe"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["compare_1f1b+gpipe_p4_m8.png"]  # named after them
    width, height = png_size(tmp_path / "compare_1f1b+gpipe_p4_m8.png")
    assert width == WIDTH * DPI and height > 600


def test_every_flagged_costs_field_has_a_flag_that_sets_it():
    """The flags of `python -m sim.plot` come from the Costs field spec: each flagged field
    has one, shows its unit and reaches the Costs (a list per stage where it is per stage)."""
    from sim.engine.fields import COST_FIELDS
    from sim.plot import cli as plot_cli
    flagged = [f for f in COST_FIELDS if f.flag]
    assert {f.name for f in flagged} >= {"forward", "backward", "latency", "bandwidth", "io_tick", "activation_bytes"}
    argv = []
    for i, f in enumerate(flagged, 1):
        argv += [plot_cli.flag_of(f.name), "0.5,0.25" if f.per_stage else str(i)]
    costs = plot_cli.costs_of(plot_cli.build_parser().parse_args(argv))
    for i, f in enumerate(flagged, 1):
        assert getattr(costs, f.name) == ((0.5, 0.25) if f.per_stage else float(i)), f.name


# ---------------------------------------------------------------- 5. the users' command and the flags that reach the simulation

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


# ---------------------------------------------------------------- 6. options, V and split costs

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


def cli_parts(*args: str) -> tuple[int, str, str]:
    """`run_cli`'s exit status, stdout and stderr, as three names."""
    proc = run_cli(*args)
    return proc.returncode, proc.stdout, proc.stderr


def test_cli_options_go_to_the_schedules_that_take_them(zoo):
    code, out, err = cli_parts("--schedule", "capped,naive,auto", "--max-active", "2", "--memory-limit", "3e9",
                               "--backward-input", "1.5", "--no-figures")
    assert code == 0, err
    assert zoo["capped"] == {"max_active": 2}
    assert zoo["auto"]["memory_limit"] == 3e9 and zoo["auto"]["costs"].backward_input == 1.5
    code, _, err = cli_parts("--schedule", "naive", "--max-active", "2", "--no-figures")
    assert code == 2 and err.count("\n") == 1
    assert err.startswith("sim.plot: error: argument --max-active: naive takes no --max-active; it is for ")
    assert "capped" in err and "1f1b" in err


def test_cli_turns_a_generators_refusal_into_one_line(zoo):
    code, out, err = cli_parts("--schedule", "auto", "--devices", "4", "--micro-batches", "2", "--no-figures")
    assert code == 2 and out == ""
    assert err == "sim.plot: error: auto on 4 devices, 2 micro-batches: M=2 is fewer than the 4 devices\n"


def test_cli_virtual_and_split_costs_reach_the_simulation(zoo, tmp_path):
    """--virtual 3 gives 2 x 3 model stages; per-stage lists count them, and one number is a
    device's share, 1/3 of it per chunk; the table is the simulation of the same schedule
    under those costs, in process."""
    from sim.schedule.textbook import gpipe_on

    costs = sim.Costs(forward=(1, 2, 1, 2, 1, 2), backward_input=0.5 / 3, backward_weight=0.25 / 3,
                      w_activation_bytes=0.75 / 3, activation_bytes=1 / 3)
    expected = sim.simulate(gpipe_on([0, 1, 0, 1, 0, 1], 4, split=True), costs)
    code, out, err = cli_parts("--schedule", "looped", "--devices", "2", "--micro-batches", "4", "--virtual", "3",
                               "--forward", "1,2,1,2,1,2", "--backward-input", "0.5", "--backward-weight", "0.25",
                               "--w-activation-bytes", "0.75", "--out", str(tmp_path))
    assert code == 0, err
    row = out.splitlines()[1].split()
    assert row[0] == "looped" and float(row[1]) == pytest.approx(expected.makespan, abs=0.01)  # as printed
    assert float(row[3]) == pytest.approx(expected.steady_step, abs=0.01)
    assert row[-1] == "B" and float(row[-2]) == pytest.approx(max(expected.peak_memory), rel=0.01)
    assert (tmp_path / "looped_p2_m4_v3.png").exists()
    code, _, err = cli_parts("--schedule", "looped", "--devices", "2", "--forward", "1,2", "--no-figures")
    assert code == 2 and "got 2 values for 4 stages of looped (2 devices x V 2); give one number or 4" in err


def test_cli_compares_schedules_on_the_same_model(tmp_path):
    """One number is a device's share of the model: ZB-V's two chunks per device each take
    half of it, so with F = 1, B = 2 per device (F = I = W = 0.5 per chunk) ZB-V's step is
    6Mt + (P-1)t with t = 0.5 (docs/schedules.md) and it holds P micro-batches' activations
    per device at most, as 1F1B does (Qi et al. 2024, ZB-V)."""
    code, out, err = cli_parts("--compare", "1f1b,zbv", "--devices", "4", "--micro-batches", "8", "--out", str(tmp_path))
    assert code == 0, err
    rows = {line.split()[0]: line for line in out.splitlines()[1:3]}
    assert float(rows["zbv"].split()[1]) == 6 * 8 * 0.5 + 3 * 0.5
    assert rows["1f1b"].endswith("  4 micro-batches") and rows["zbv"].endswith("  4 micro-batches")


# ---------------------------------------------------------------- 7. what a new user trips over

@pytest.mark.parametrize("args, words", [
    (["--forward", "0", "--backward", "0"], ["takes no time"]),
    (["--forward", "1e308", "--backward", "1e308"], ["overflow"]),
])
def test_plot_refuses_degenerate_costs(tmp_path, args, words):
    one_line(run_cli(*args, "--out", str(tmp_path)), 2, *words)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("schedule", ["1f1b", "zb-h1", "interleaved-1f1b"])
@pytest.mark.parametrize("costs, words", [(dict(forward=0, backward=0), "takes no time"),
                                          (dict(forward=1e308, backward=1e308), "overflow")])
def test_simulate_refuses_a_degenerate_step_with_the_command_line_s_own_line(tmp_path, schedule, costs, words):
    """One rule in one place: `sim.simulate` raises `DegenerateStep` for a step of no time or
    past a float's range, and `sim.plot` prints that very message."""
    from sim.simulation import DegenerateStep
    with pytest.raises(DegenerateStep, match=words) as refused:
        sim.simulate(sim.make_schedule(schedule, 4, 8), sim.Costs(**costs))
    assert isinstance(refused.value, ValueError) and "\n" not in str(refused.value)
    flags = [f"--{k}={v:g}" for k, v in costs.items()]
    line = one_line(run_cli("--schedule", schedule, *flags, "--out", str(tmp_path)), 2, words)
    assert line == f"sim.plot: error: {refused.value}"
    assert sim.simulate(sim.make_schedule(schedule, 4, 8), sim.Costs(forward=0, backward=1e-9)).makespan > 0


def test_help_puts_the_students_options_first_and_the_calibration_knobs_last():
    """`--help` in argument groups: the step, its compute times, transfers and memory, the
    output, then the schedules' options and the runtime's calibrated costs; every option
    is in one group, and the calibration group holds the transport's call costs."""
    text = run_cli("--help").stdout
    options = text.split("\nTimes are in")[0]  # before the epilog
    titles = [line[:-1] for line in options.splitlines() if line.endswith(":") and not line.startswith(" ")]
    assert titles[1:] == ["the step", "compute times", "transfers and memory", "output", "schedule options",
                          "calibration"]
    parser = plot_cli.build_parser()
    groups = {g.title: [a.dest for a in g._group_actions] for g in parser._action_groups}
    assert groups["the step"][:2] == ["devices", "micro_batches"]
    assert {"forward", "backward"} <= set(groups["compute times"])
    flagged = {f.name for f in plot_cli.FLAGGED}
    calibration = set(groups["calibration"])
    assert {f.name for f in plot_cli.FLAGGED if f.call} <= calibration <= flagged
    assert not calibration & {"forward", "backward", "latency", "bandwidth", "activation_bytes"}
    every = [d for g in groups.values() for d in g if d != "help"]
    assert len(every) == len(set(every)) == len([a for a in parser._actions if a.dest != "help"])
    assert options.index("\n  --devices") < options.index("\n  --forward") < options.index("\n  --out") \
        < options.index("\n  --send-overhead")


def test_readme_commands_leave_the_checkout_clean(tmp_path):
    """The compare figure of other schedules is named after them, never the README's; by
    default figures go to out/, which git ignores."""
    proc = run_cli("--compare", "1f1b,zb-h1,zb-h2,zbv", "--devices", "4", "--micro-batches", "8",
                   "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["compare_1f1b+zb-h1+zb-h2+zbv_p4_m8.png"]
    assert "peak activations: per rank" in proc.stdout  # chunks and micro-batches of memory told apart
    proc = run_cli("--compare", "naive,gpipe,1f1b", "--devices", "4", "--micro-batches", "8", "--out", str(tmp_path))
    assert (tmp_path / "compare_p4_m8.png").exists()
    assert "/out/" in (ROOT / ".gitignore").read_text().split()
    assert sorted(p.name for p in (ROOT / "figures").iterdir()) == ["compare_p4_m8.png"]
    assert "figures/compare_p4_m8.png" in (ROOT / "README.md").read_text()


# ---------------------------------------------------------------- 8. the command itself, as a user types it

def python_m_sim_plot(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sim.plot", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.mark.slow
def test_the_readme_command_runs_without_a_warning(tmp_path):
    """`python -m sim.plot --stages 4 --micro 8`, the README's, in a fresh Python: exit 0, a
    figure per schedule and the comparison, nothing on stderr but the progress lines."""
    proc = python_m_sim_plot(*USERS_COMMAND, "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert all(line.startswith("sim.plot: [") for line in steady(proc.stderr)), proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{n}_p4_m8.png" for n in [*TEXTBOOK, "compare"])


@pytest.mark.slow
def test_the_command_refuses_with_one_line_and_status_2(tmp_path):
    proc = python_m_sim_plot("--devices", "0", "--out", str(tmp_path))
    assert proc.stdout == "" and one_line(proc, 2).startswith("sim.plot: error: argument --devices")
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- 9. the README's figure

def test_the_readme_figure_shares_its_time_axis(tmp_path):
    import matplotlib.pyplot as plt
    from sim.plot import gantt
    seen = []
    original = gantt.plot_compare

    def spy(results, shared_time=None, unit=None, note=None):
        seen.append((shared_time, note))
        return original(results, shared_time, unit, note=note)

    plot_cli.plot_compare, saved = spy, plot_cli.plot_compare
    try:
        assert plot_cli.main(["--stages", "4", "--micro", "8", "--out", str(tmp_path)]) == 0
    finally:
        plot_cli.plot_compare = saved
        plt.close("all")
    assert seen == [(True, "costs: F 1, B 2 a stage; transfers free")]
