"""`python -m sim.plot` as a new user meets it: large steps draw in bounded time and size,
steps too large are refused at once, units everywhere, `--help` shows the defaults.

Each test runs the command in a subprocess with a time limit; the limits are generous
(the machine is shared), the memory measured is in docs/validation.md, "Host memory of a big step"."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sim.plot.gantt import DPI, MAX_HEIGHT, WIDTH

ROOT = Path(__file__).resolve().parents[3]


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sim.plot", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) in pixels, from the PNG's header."""
    data = path.read_bytes()[:24]
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


# ---------------------------------------------------------------- 1. large figures

def test_large_step_draws_in_bounded_time_and_size(tmp_path):
    """64 stages x 512 micro-batches: about 10 s here (it took 13 minutes, 4.3 GB and a
    4212-pixel-tall figure with a patch per bar); the limit leaves room for a loaded machine."""
    proc = run_cli("--devices", "64", "--micro-batches", "512", "--out", str(tmp_path), timeout=480)
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
    line = assert_refused(run_cli(*args, timeout=60), "too large for this machine", "the limit here is",
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
    proc = run_cli("--devices", "64", "--micro-batches", "512", "--out", str(blocker / "figures"), timeout=60)
    assert_refused(proc, "argument --out: cannot write to", "Not a directory")
    assert not (blocker.parent / "figures").exists()


def test_out_is_not_touched_when_nothing_is_written(tmp_path):
    proc = run_cli("--no-figures", "--out", str(tmp_path / "never"), timeout=60)
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
    _, *rows = table(run_cli("--devices", "32", "--micro-batches", "128", "--latency", "0.1", "--no-figures", timeout=180))
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
    assert_refused(run_cli("--schedule", "1f1b", "--virtual", "2", "--no-figures", timeout=60),
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
    assert_refused(run_cli(*args, "--no-figures", timeout=60), *words)


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
