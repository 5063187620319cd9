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
import time
from pathlib import Path

import pytest

import sim
from sim.plan.planner import search
from sim.plan.space import Config
from sim.plan.cli import ProgressBar
from sim.search.zbauto import order_peak, split_1f1b, zb_auto

ROOT = Path(__file__).resolve().parents[1]


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
    assert "of the step lost to other processes" in doc["load"] or "no scheduler statistics" in doc["load"]


# ---------------------------------------------------------------- the load of a step (exec.measure.busy)

def test_step_load_sees_another_process_on_the_core():
    """A busy process pinned beside this one on one core: this thread, spinning for 0.4 s
    of wall time, was runnable but not running a good part of it, and its waiting and
    running add up to the wall time (it never sleeps)."""
    from exec.measure.busy import StepLoad, load_summary, thread_sched
    if thread_sched() is None or not hasattr(os, "sched_setaffinity"):
        pytest.skip("no scheduler statistics here")
    old = os.sched_getaffinity(0)
    core = {min(old)}
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        os.sched_setaffinity(hog.pid, core)
        os.sched_setaffinity(0, core)
        time.sleep(0.1)
        with StepLoad() as load:
            end = time.perf_counter() + 0.4
            while time.perf_counter() < end:
                pass
    finally:
        hog.kill()
        hog.wait()
        os.sched_setaffinity(0, old)
    rec = load.record
    assert rec["waited"] + rec["cpu"] == pytest.approx(rec["wall"], rel=0.1)
    assert rec["waited"] > 0.1 * rec["wall"]
    s = load_summary([[rec]])
    assert s["lost_share_max"] == pytest.approx(rec["waited"] / rec["wall"])


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
    t = time.perf_counter()
    with pytest.raises(ValueError, match=r"^pp=200 = 200 stages is more than the model's 96 layers"):
        sim.estimate("gpt3-175b", "a100-80gb", tp=8, pp=200, global_batch=1536)
    with pytest.raises(ValueError, match=r"^pp=64 x V 2 = 128 stages"):
        sim.estimate("gpt3-175b", "a100-80gb", tp=8, pp=64, schedule="interleaved-1f1b", virtual=2)
    assert time.perf_counter() - t < 30  # refused before any simulation (it took 15-31 s)


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
    proc = run("sim.plot", "--compare", "1f1b,zb-h1,zb-h2,zbv", "--stages", "4", "--micro", "8",
               "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["compare_1f1b+zb-h1+zb-h2+zbv_p4_m8.png"]
    assert "peak activations: per rank" in proc.stdout  # chunks and micro-batches of memory told apart
    proc = run("sim.plot", "--compare", "naive,gpipe,1f1b", "--stages", "4", "--micro", "8", "--out", str(tmp_path))
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


def test_progress_bar_moves_while_nothing_settles(capsys):
    bar = ProgressBar(every=0.1)
    bar(3, 10)
    time.sleep(0.45)
    bar.close()
    drawn = capsys.readouterr().err.split("\r")
    assert len([d for d in drawn if "3/10 settled" in d]) >= 3  # redrawn with a moving clock


def test_planner_bounds_do_not_search_zb_auto():
    """The bounds read zb-auto's shape from the split 1F1B: a configuration of 768
    micro-batches on 64 devices is bounded in well under a second (it took minutes)."""
    from sim.plan.bounds import Bounds
    from sim.hardware.gpus import gpu
    from sim.model.transformer import model
    b = Bounds(model("gpt3-175b"), gpu("a100-80gb"), 1536, "bf16", 8)
    c = Config(8, 64, 2, 1, "zb-auto", 1, "full", 1, True)
    t = time.perf_counter()
    assert b.memory(c) > 0 and b.time(c) > 0
    assert time.perf_counter() - t < 20


# ---------------------------------------------------------------- zb-auto's budget

@pytest.mark.parametrize("p, m, limit", [(4, 12, 4.0), (4, 12, 7.0), (3, 9, 2.0), (5, 10, 9.0)])
def test_zb_auto_with_a_budget_fits_and_beats_split_1f1b(p, m, limit):
    costs = sim.Costs(forward=1.0, backward_input=1.1, backward_weight=0.7)
    c = costs.for_stages(p)
    full = sim.simulate(zb_auto(p, m, costs=costs, memory_limit=limit), costs).makespan
    for runs in (2, 3, 8):
        s = zb_auto(p, m, costs=costs, memory_limit=limit, max_runs=runs)
        assert order_peak(s, c) <= limit * (1 + 1e-9)
        span = sim.simulate(s, costs).makespan
        assert full <= span + 1e-9  # the whole family is never worse
        if order_peak(split_1f1b(p, m), c) <= limit:  # a candidate it always tries
            assert span <= sim.simulate(split_1f1b(p, m), costs).makespan + 1e-9
    with pytest.raises(sim.ScheduleError, match="max_runs must be an integer >= 2"):
        zb_auto(p, m, costs=costs, memory_limit=limit, max_runs=1)
