"""What a new user trips over (issue 23): each bad input refused at once on one line, outputs
checked before the work, a planner that keeps talking, numbers that agree with each other,
and the machine's load reported beside a measured step.

CLI tests run the command in a subprocess: one line on stderr, exit status 2 (or 1 where
the work itself fails), nothing written where it should not be."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import types
from pathlib import Path

import pytest

import sim
from sim.plan.planner import search
from sim.plan.layout import Layout
from sim.plan.cli import ProgressBar
from sim.schedule.liveness import schedule_peak
from sim.schedule.zerobubble import split_1f1b
from sim.search.zbauto import zb_auto
from helpers import counting_calls

ROOT = Path(__file__).resolve().parents[2]


def run(module: str, *args: str, timeout: float = 120, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env)


def one_line(proc: subprocess.CompletedProcess, code: int, *words: str) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == code, proc.stderr
    assert len(lines) == 1, proc.stderr
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


# ---------------------------------------------------------------- exec.run: refused before any rank

def _costs_file(tmp_path: Path, doc) -> Path:
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize("args, words", [
    (["--out", "/proc/x"], ["--out", "/proc/x"]),
    (["--out", "README.md/sub"], ["--out", "README.md/sub"]),
    (["--lr", "-5"], ["--lr", "-5"]),
    (["--lr", "nan"], ["--lr", "nan"]),
])
def test_exec_run_refuses_outputs_and_lr_up_front(args, words):
    one_line(run("exec.run", *args), 2, *words)


def test_exec_run_refuses_costs_naming_the_file(tmp_path):
    one_line(run("exec.run", "--costs", str(tmp_path)), 2, str(tmp_path), "directory")
    for doc, what in (({"costs": {"forward": -1}}, "forward"), ([1, 2], "no costs"),
                      ({"costs": [1]}, "JSON object"), ({"costs": {"forward": [1, 2, 3]}}, "3 values")):
        path = _costs_file(tmp_path, doc)
        one_line(run("exec.run", "--costs", str(path)), 2, str(path), what)


def test_exec_run_costs_refused_without_torch(tmp_path):
    """The costs are checked before torch is imported, so a refusal costs no start-up."""
    path = _costs_file(tmp_path, {"costs": {"forward": -1}})
    code = ("import sys, runpy; sys.argv = ['exec.run', '--costs', %r]\n"
            "try:\n    runpy.run_module('exec.run', run_name='__main__')\n"
            "except SystemExit as e:\n    print(e.code, 'torch' in sys.modules)" % str(path))
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout.split() == ["2", "False"], proc.stdout + proc.stderr


@pytest.mark.slow
def test_exec_run_non_finite_loss_exits_1_naming_the_step():
    """A real two-rank run whose loss overflows: the table shows the last loss (nan), the
    exit status is 1 and the line says at which step; the JSON carries the machine's load."""
    proc = run("exec.run", "--lr", "1e30", "--steps", "2", "--warmup", "1", "--no-compare", "--quiet", "--json",
               "--timeout", "120", timeout=180)
    assert proc.returncode == 1, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("exec.run: error: the loss became") and "at step" in last, last
    doc = json.loads(proc.stdout)
    assert doc["loss"] is None and doc["first_loss"] > 0 and doc["steps"] == 3  # nan -> null in JSON
    assert len(doc["lost_share_per_rank"]) == 2
    assert doc["lost_share"] is None or 0 <= doc["lost_share"] <= 1
    # busy or quiet, the line's shape; with fewer cores than ranks (not on 2 cores) it says they take turns
    assert any(s in doc["load"] for s in ("of the step lost to other processes", "take turns", "no scheduler statistics"))


# ---------------------------------------------------------------- the load of a step (exec.measure.busy)

def test_step_load_reads_the_kernels_waits_per_thread(monkeypatch):
    """The kernel's scheduler statistics and the clocks, faked: a step of 0.4 s wall time
    in which the main thread ran 0.3 s and waited 0.1 s for a core, and the transport
    threads (one of them started during the step) waited 0.05 s and 0.02 s. The record
    takes the differences, the summary the main thread's share, the line says busy."""
    from exec.launch.host import GLOO_IO_THREAD
    from exec.measure import busy
    main = threading.get_native_id()
    before = {main: ("python", 1.0, 0.5), 7: (GLOO_IO_THREAD, 0.2, 0.1), 8: ("other", 0.0, 0.0)}
    after = {main: ("python", 1.3, 0.6), 7: (GLOO_IO_THREAD, 0.25, 0.15), 9: (GLOO_IO_THREAD, 0.0, 0.02),
             8: ("other", 0.5, 3.0)}
    reads = iter([before, after])
    monkeypatch.setattr(busy, "thread_sched", lambda: next(reads))
    clocks = {"perf_counter": iter([10.0, 10.4]), "thread_time": iter([2.0, 2.3]), "process_time": iter([5.0, 5.5])}
    monkeypatch.setattr(busy, "time", types.SimpleNamespace(**{k: (lambda it=it: next(it)) for k, it in clocks.items()}))
    with busy.StepLoad() as load:
        pass
    rec = load.record
    assert rec["wall"] == pytest.approx(0.4) and rec["cpu"] == pytest.approx(0.3)
    assert rec["cpu_process"] == pytest.approx(0.5)
    assert rec["waited"] == pytest.approx(0.1) and rec["waited_transport"] == pytest.approx(0.07)
    s = busy.load_summary([[rec], [dict(rec, waited=0.0)]])
    assert s["lost_share_max"] == pytest.approx(0.25) and s["ranks"][1]["lost_share"] == 0.0
    assert busy.describe_load(s).startswith("the machine was busy: 25% of the step lost to other processes (rank 0")


def test_thread_sched_names_this_thread():
    """The kernel's statistics themselves: this thread is among them, with the time it ran."""
    from exec.measure.busy import thread_sched
    sched = thread_sched()
    if sched is None:
        pytest.skip("no scheduler statistics here")
    name, ran, waited = sched[threading.get_native_id()]
    assert name and ran > 0 and waited >= 0


def test_replay_of_a_simulated_step_under_its_own_costs_is_exact():
    from exec.measure.compare import replay_median
    costs = sim.Costs(forward=[1.0, 1.5], backward=[2.0, 2.5], latency=0.1)
    r = sim.simulate(sim.make_schedule("1f1b", 2, 8), costs)
    assert replay_median([r, r, r], costs) == pytest.approx(0.0, abs=1e-9)
    with pytest.raises(ValueError, match="no measured steps"):
        replay_median([], costs)


# ---------------------------------------------------------------- the API

def test_simulate_refuses_a_schedule_name():
    with pytest.raises(TypeError, match=r"simulate needs a sim.Schedule, got str '1f1b'.*make_schedule\('1f1b'"):
        sim.simulate("1f1b", sim.Costs())
    with pytest.raises(TypeError, match="costs must be a sim.Costs, got dict"):
        sim.simulate(sim.make_schedule("1f1b", 2, 2), {"forward": 1})


def test_estimate_refuses_more_stages_than_layers_at_once():
    """Refused before any simulation (it took 15-31 s): the simulator is never called."""
    with counting_calls(sim.simulate) as calls:
        with pytest.raises(ValueError, match=r"^pp=200 = 200 stages is more than the model's 96 layers"):
            sim.estimate("gpt3-175b", "a100-80gb", tp=8, pp=200, global_batch=1536)
        with pytest.raises(ValueError, match=r"^pp=64 x V 2 = 128 stages"):
            sim.estimate("gpt3-175b", "a100-80gb", tp=8, pp=64, schedule="interleaved-1f1b", virtual=2)
    assert calls[sim.simulate] == 0


def test_trace_path_in_a_missing_folder_is_an_error_and_creates_nothing(tmp_path):
    r = sim.simulate(sim.make_schedule("1f1b", 2, 2), sim.Costs())
    with pytest.raises(FileNotFoundError, match="does not exist"):
        r.save_chrome_trace(tmp_path / "no" / "dir" / "x.json")
    assert not (tmp_path / "no").exists()
    with pytest.raises(IsADirectoryError, match=f"cannot write {tmp_path}: it is a directory"):
        r.save_chrome_trace(tmp_path)
    assert list(tmp_path.iterdir()) == []  # no temporary file left either


def test_reprs_are_readable():
    text = repr(sim.SCHEDULES)
    assert "Generator(" not in text and "function" not in text
    assert all(f"  {name} " in text for name in sim.SCHEDULES)
    assert len(text.splitlines()) == len(sim.SCHEDULES) + 1
    e = sim.estimate("gpt3-175b", "a100-80gb", tp=8, pp=8, dp=16, global_batch=1536)
    assert repr(e).startswith("<Estimate gpt3-175b on 1024 x a100-80gb") and "summary()" in repr(e)
    assert len(repr(e)) < 300


def test_one_bubble_per_planned_step():
    """The estimate's bubble is its step's pipeline bubble (to the last compute), and the
    figure's title says that number; the whole step's idle share is larger by the tail."""
    e = sim.estimate("gpt3-175b", "a100-80gb", tp=8, pp=8, dp=16, global_batch=1536)
    r = e.result
    assert e.bubble_fraction == pytest.approx(r.pipeline_bubble_fraction)
    assert r.makespan > r.compute_end - r.t0  # a gradient reduction runs after the last compute
    assert r.bubble_fraction > r.pipeline_bubble_fraction
    from sim.plot.gantt import plot_result
    fig = plot_result(r)
    assert f"pipeline bubble {e.bubble_fraction:.1%}" in fig._suptitle.get_text()
    assert r.in_seconds and fig.axes[-1].get_xlabel() == "time (s)"


# ---------------------------------------------------------------- sim.plot

@pytest.mark.parametrize("args, words", [
    (["--forward", "0", "--backward", "0"], ["takes no time"]),
    (["--forward", "1e308", "--backward", "1e308"], ["overflow"]),
])
def test_plot_refuses_degenerate_costs(tmp_path, args, words):
    one_line(run("sim.plot", *args, "--out", str(tmp_path)), 2, *words)
    assert list(tmp_path.iterdir()) == []


def test_readme_commands_leave_the_checkout_clean(tmp_path):
    """The compare figure of other schedules is named after them, never the README's; by
    default figures go to out/, which git ignores."""
    proc = run("sim.plot", "--compare", "1f1b,zb-h1,zb-h2,zbv", "--devices", "4", "--micro-batches", "8",
               "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["compare_1f1b+zb-h1+zb-h2+zbv_p4_m8.png"]
    assert "peak activations: per rank" in proc.stdout  # chunks and micro-batches of memory told apart
    proc = run("sim.plot", "--compare", "naive,gpipe,1f1b", "--devices", "4", "--micro-batches", "8", "--out", str(tmp_path))
    assert (tmp_path / "compare_p4_m8.png").exists()
    assert "/out/" in (ROOT / ".gitignore").read_text().split()
    assert sorted(p.name for p in (ROOT / "figures").iterdir()) == ["compare_p4_m8.png"]
    assert "figures/compare_p4_m8.png" in (ROOT / "README.md").read_text()


# ---------------------------------------------------------------- sim.plan

def test_plan_exits_1_when_nothing_fits_and_counts_add_up():
    proc = run("sim.plan", "--model", "gpt3-175b", "--gpu", "a100-80gb", "--gpus", "3", "--global-batch", "1536",
               "--no-figures", "--quiet")
    one_line(proc, 1, "no configuration fits")
    head = proc.stdout.splitlines()[0]
    enumerated = int(head.split(": ")[1].split()[0])
    dropped = proc.stdout.split("dropped (of the")[1].split("not enumerated")[0]
    counts = [int(line.split()[0]) for line in dropped.splitlines()[1:] if line.strip()]
    assert sum(counts) == enumerated  # none fits: every enumerated configuration is dropped once


def test_plan_counts_add_up_when_some_fit():
    plan = search("megatron-1.7b", "a100-80gb", 16, 64, top=3)
    fit = plan.simulated - plan.dropped_configs["does not fit (simulated)"]
    assert sum(plan.dropped_configs.values()) + fit == plan.enumerated


class FakeClock:
    """A clock that moves only when the test says so."""

    def __init__(self, now: float = 100.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_progress_bar_moves_while_nothing_settles(capsys):
    """While nothing settles, the bar is redrawn once each `every` seconds of its clock,
    with the clock's time; settling redraws it at most ten times a second, and the last
    configuration ends the line and the redrawing."""
    clock = FakeClock()
    bar = ProgressBar(every=1.0, clock=clock)
    bar(3, 10)                                      # drawn: the first state
    for step in (0.5, 0.5, 0.2, 2.5, 0.9, 0.2):     # due at +1.0, +3.7 and +4.8
        clock.now += step
        bar.beat()
    clock.now += 0.05
    bar(4, 10)                                      # within 0.1 s of the last drawing: not drawn
    clock.now += 0.06
    bar(5, 10)                                      # 0.11 s after it: drawn
    bar(10, 10)                                     # the last one always is, with a newline
    clock.now += 5
    bar.beat()                                      # done: nothing more
    bar.close()
    err = capsys.readouterr().err
    drawn = [d.split("] ")[1] for d in err.split("\r") if d]
    assert drawn == ["3/10 settled, 0.0 s", "3/10 settled, 1.0 s", "3/10 settled, 3.7 s", "3/10 settled, 4.8 s",
                     "5/10 settled, 4.9 s", "10/10 settled, 4.9 s\n"]


def test_planner_bounds_do_not_search_zb_auto():
    """The bounds read zb-auto's shape from the split 1F1B: a configuration of 768
    micro-batches on 64 devices is bounded without searching zb-auto's order or simulating
    (it took minutes)."""
    from sim.plan.bounds import Bounds
    from sim.hardware.gpus import gpu
    from sim.model.registry import find_model as model
    b = Bounds(model("gpt3-175b"), gpu("a100-80gb"))
    c = Layout(tp=8, pp=64, dp=2, schedule="zb-auto", virtual=1, recompute="full", zero=1, sequence_parallel=True,
               global_batch=1536)
    search = sim.SCHEDULES["zb-auto"].make
    with counting_calls(search, sim.simulate) as calls:
        assert b.memory(c) > 0 and b.time(c) > 0
    assert calls[search] == 0 and calls[sim.simulate] == 0
    with counting_calls(search) as calls:  # the count sees the search where it runs
        sim.make_schedule("zb-auto", 2, 2)
    assert calls[search] == 1


# ---------------------------------------------------------------- zb-auto's budget

@pytest.mark.parametrize("p, m, limit", [(4, 12, 4.0), (4, 12, 7.0), (3, 9, 2.0), (5, 10, 9.0)])
def test_zb_auto_with_a_budget_fits_and_beats_split_1f1b(p, m, limit):
    costs = sim.Costs(forward=1.0, backward_input=1.1, backward_weight=0.7)
    c = costs.for_stages(p)
    full = sim.simulate(zb_auto(p, m, costs=costs, memory_limit=limit), costs).makespan
    for runs in (2, 3, 8):
        s = zb_auto(p, m, costs=costs, memory_limit=limit, max_runs=runs)
        assert schedule_peak(s, c) <= limit * (1 + 1e-9)
        span = sim.simulate(s, costs).makespan
        assert full <= span + 1e-9  # the whole family is never worse
        if schedule_peak(split_1f1b(p, m), c) <= limit:  # a candidate it always tries
            assert span <= sim.simulate(split_1f1b(p, m), costs).makespan + 1e-9
    with pytest.raises(sim.ScheduleError, match="max_runs must be an integer >= 2"):
        zb_auto(p, m, costs=costs, memory_limit=limit, max_runs=1)
