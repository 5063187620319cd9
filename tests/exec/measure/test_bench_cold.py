"""The benchmarks of a compute after a wait and during handoffs (benchmarks/bench_cold_computes.py, bench_idle_warmup.py, bench_handoff_computes.py) and of the profile's lines against a run (bench_block_vs_run.py): their reading of a run's trace and calibration, their grouping, their interleaving, their refusals, and the handoff pattern on two real ranks. No timing assertions."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_cold_computes as cold  # noqa: E402
import bench_idle_warmup as idle  # noqa: E402


def _run_dir(tmp_path: Path) -> Path:
    """A run's out folder: rank 0 computes F at 0-1000 us and 1050-2050 us (its send of the
    first in flight 1000-1500), B at 5000-7000; rank 1 F at 1500-2600; calibrated F 900 us,
    B 1800 us, rank 1's F 1000 us."""
    costs = {"details": {"compute_median": {"concurrent": {"0F": 900e-6, "0B": 1800e-6, "1F": 1000e-6}}}}
    (tmp_path / "costs.json").write_text(json.dumps(costs))
    x = [dict(ph="X", cat=c, tid=t, ts=ts, dur=d) for c, t, ts, d in
         (("F", 0, 0, 1000), ("F", 0, 1050, 1000), ("B", 0, 5000, 2000), ("F", 1, 1500, 1100),
          ("SEND_F", 1000, 1000, 500))]
    (tmp_path / "gpipe_p2_m4_measured.trace.json").write_text(json.dumps({"traceEvents": x + [dict(ph="M")]}))
    return tmp_path


def test_each_compute_gets_its_excess_its_gap_and_whether_it_was_sending(tmp_path):
    rows = cold.computes(_run_dir(tmp_path))
    assert [round(r["excess"] * 1e6) for r in rows] == [100, 100, 200, 100]
    assert [None if r["gap"] is None else round(r["gap"] * 1e6) for r in rows] == [None, 50, 2950, None]
    assert [r["sending"] for r in rows] == [False, True, False, False]


def test_the_table_groups_by_what_came_before():
    rows = [dict(excess=e, gap=g, sending=s) for e, g, s in
            ((1e-3, None, False), (2e-4, 5e-5, True), (4e-4, 5e-5, False), (3e-4, 2e-3, False))]
    lines = {line.strip().split("  ")[0]: line for line in cold.table(rows)}
    assert "+1000 us" in lines["first in the step"] and "1 computes" in lines["first in the step"]
    assert "+300 us" in lines["after a compute (< 0.1 ms)"] and "2 computes" in lines["after a compute (< 0.1 ms)"]
    assert "after a wait of 0.1-1 ms" not in lines  # an empty group is left out
    assert "+300 us" in lines["after a wait of > 1 ms"]


def test_the_idle_benchmark_interleaves_its_gaps(monkeypatch):
    """Each round runs every gap once, in order, sleeping just before the compute it times."""
    log = []
    monkeypatch.setattr(idle.time, "sleep", lambda s: log.append(("sleep", s)))
    out = idle.measure(lambda: log.append(("run",)), (0.0, 0.001, 0.02), repeats=2)
    assert set(out) == {0.0, 0.001, 0.02}
    timed = log[10:]  # after 10 warm-up runs
    assert timed == [("run",), ("sleep", 0.001), ("run",), ("sleep", 0.02), ("run",)] * 2


@pytest.mark.parametrize("main, argv", [(idle.main, ["--shape", "64,3,32,8"]), (idle.main, ["--gap", "-1"]),
                                        (idle.main, ["--repeats", "0"]), (cold.main, ["--shape", "4,32,1,32"]),
                                        (cold.main, ["--runs", "0"]), (cold.main, ["--schedule", "zb-h1"])])
def test_bad_arguments_are_one_line_and_exit_2(main, argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and len(capsys.readouterr().err.strip().splitlines()) == 1


@pytest.mark.parametrize("bench, argv", [
    ("bench_handoff_computes", ["--shape", "64,3,32,8"]), ("bench_handoff_computes", ["--rounds", "0"]),
    ("bench_handoff_computes", ["--shape", "1,2,3"]), ("bench_block_vs_run", ["--shape", "64,3,32,256"]),
    ("bench_block_vs_run", ["--rounds", "0"]), ("bench_block_vs_run", ["--shape", "64,2,32"])])
def test_the_two_rank_benchmarks_refuse_bad_arguments_in_one_line(bench, argv, capsys):
    import importlib
    with pytest.raises(SystemExit) as e:
        importlib.import_module(bench).main(argv)
    assert e.value.code == 2 and len(capsys.readouterr().err.strip().splitlines()) == 1


@pytest.mark.slow
def test_the_handoff_benchmark_times_every_compute_on_two_real_ranks():
    """Two gloo ranks, two rounds: each rank times its 4 back-to-back computes a round, and
    in the two phases sends after 4 computes and receives before 4 (every message matched:
    the run ends, within its timeout)."""
    pytest.importorskip("torch")
    import bench_handoff_computes as handoff
    from exec.launch.processes import launch
    per_rank = launch(handoff.rank_work, 2, 8, 2, 4, 1, 2, backend="gloo", timeout=120, threads=1)
    for r in per_rank:
        assert {k: len(v) for k, v in r.items()} == {"back to back": 8, "sending": 8, "receiving": 8}
        assert all(t > 0 for v in r.values() for t in v)


@pytest.mark.slow
def test_the_block_against_run_benchmark_sets_every_run_beside_its_line(capsys):
    """One round at a tiny shape: the layer bench's lines on two real ranks, then exec's four
    runs; every schedule, recompute and kind gets a ratio from both stages (no timing asserted)."""
    pytest.importorskip("torch")
    import bench_block_vs_run as block
    assert block.main(["--shape", "16,1,8,32", "--rounds", "1"]) == 0
    summary = capsys.readouterr().out.split("run / line - 1")[1].strip().splitlines()[1:]
    cells = {tuple(line.split()[:3]) for line in summary}
    assert cells == {(s, r, k) for s, r in block.RUNS for k in "FB"}
    assert all(line.endswith("2 values)") for line in summary)
