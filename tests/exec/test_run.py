"""exec: the launcher and the host tuning, the interpreter that runs schedules on real ranks, and the CLI.

Two gloo ranks on CPU. Every launch gets a timeout, so no test can hang; runs that need
the same ranks share one launch (starting processes that import torch is the slow part).
"""
from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import sim  # noqa: E402
from sim import Action, Kind  # noqa: E402
from sim.schedule.textbook import gpipe_on  # noqa: E402
from exec.runtime.check import compare_grads, reference_step, split_micro_batches  # noqa: E402
from exec.launch.host import GLOO_IO_THREAD, host_cores, rank_cores  # noqa: E402
from exec.launch.processes import RankError, children_of, free_port, launch  # noqa: E402
from exec.models.spec import ModelSpec  # noqa: E402
from exec.pipeline.config import RunConfig  # noqa: E402
from exec.pipeline.worker import pipeline_worker  # noqa: E402
from sim import load_costs, save_costs  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 90  # seconds for any one launch
MLP = ModelSpec("mlp", layers=4, hidden=32, seq=8, batch_size=8)
GPT = ModelSpec("gpt", layers=2, hidden=32, seq=8, vocab=64, heads=2, batch_size=8)


# ---------------------------------------------------------------------------- functions the ranks run

def _sum_ranks(ctx, offset):
    t = torch.tensor([float(ctx.rank + offset)])
    dist.all_reduce(t)
    return ctx.rank, t.item(), str(ctx.device), torch.get_num_threads()


def _raise_on_rank_1(ctx):
    if ctx.rank == 1:
        raise ValueError("rank one is broken on purpose")
    dist.barrier()  # rank 0 waits for a peer that is gone


def _exit_on_rank_1(ctx):
    if ctx.rank == 1:
        os._exit(3)
    dist.barrier()


def _hang_on_rank_1(ctx):
    if ctx.rank == 1:
        time.sleep(3600)
    dist.barrier()


def _placement(ctx):
    """Each thread of this rank: its name, the cores it may run on, its policy."""
    out = []
    for tid in sorted(os.listdir("/proc/self/task")):
        name = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
        out.append((name, sorted(os.sched_getaffinity(int(tid))), os.sched_getscheduler(int(tid))))
    return ctx.cores, torch.get_num_threads(), out


def _many_runs(ctx, jobs):
    """Several pipeline runs in the same two processes: one start-up for all of them."""
    return [pipeline_worker(ctx, *job) for job in jobs]


def _rank_processes() -> list[int]:
    """Rank processes of this test process still around (the resource tracker is not one)."""
    out = []
    for pid in children_of([os.getpid()]):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"spawn_main" in cmd:
            out.append(pid)
    return out


# ---------------------------------------------------------------------------- the launcher

@pytest.mark.slow
def test_launch_returns_each_ranks_value():
    out = launch(_sum_ranks, 2, 10, timeout=TIMEOUT, threads=1)
    assert out == [(0, 21.0, "cpu", 1), (1, 21.0, "cpu", 1)]
    assert _rank_processes() == []


@pytest.mark.slow
@pytest.mark.parametrize("fn, message, exitcode", [
    (_raise_on_rank_1, "rank 1 raised ValueError: rank one is broken on purpose", None),
    (_exit_on_rank_1, "rank 1 exited with code 3", 3),
])
def test_a_failing_rank_ends_the_run_naming_it(fn, message, exitcode):
    """A RankError, not the TimeoutError of a run that waited for its timeout: the failure ends it."""
    with pytest.raises(RankError) as info:
        launch(fn, 2, timeout=TIMEOUT)
    assert message in str(info.value) and info.value.rank == 1 and info.value.exitcode == exitcode
    assert _rank_processes() == []


class TickingClock:
    """A monotonic clock that moves `tick` seconds at every reading, whatever the wall clock does."""

    def __init__(self, tick: float):
        self.now, self.tick, self.readings = 0.0, tick, 0

    def monotonic(self) -> float:
        self.now += self.tick
        self.readings += 1
        return self.now


@pytest.mark.slow
def test_a_hung_rank_hits_the_timeout(monkeypatch):
    """On the launcher's clock (faked: 0.5 s a reading, one reading a look at the ranks),
    the run is given up once the timeout has passed, not before (16 readings), and soon
    after (a look past it and the few readings that stop the ranks); the ranks are gone."""
    from exec.launch import processes
    clock = TickingClock(0.5)
    monkeypatch.setattr(processes, "time", clock)
    with pytest.raises(TimeoutError, match="longer than timeout=8s; ranks 0, 1 had not returned"):
        launch(_hang_on_rank_1, 2, timeout=8)
    assert 8 / 0.5 < clock.readings <= 8 / 0.5 + 8
    assert _rank_processes() == []


@pytest.mark.slow
def test_under_torchrun_launch_runs_this_process_as_its_rank(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(
        "import torch, torch.distributed as dist\n"
        "from exec.launch.processes import launch\n"
        "def fn(ctx):\n"
        "    t = torch.ones(1) * ctx.rank\n"
        "    dist.all_reduce(t)\n"
        "    return ctx.rank, t.item()\n"
        "if __name__ == '__main__':\n"
        "    import os, pathlib\n"
        f"    out = launch(fn, 2, timeout={TIMEOUT})\n"
        "    pathlib.Path(f\"out{os.environ['RANK']}.txt\").write_text(repr(out))\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env = {k: v for k, v in env.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR")}
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                        "--master-port", str(free_port()), str(script)],
                       capture_output=True, text=True, timeout=TIMEOUT + 60, env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    for rank in range(2):  # every rank gets every rank's value
        assert (tmp_path / f"out{rank}.txt").read_text() == "[(0, 1.0), (1, 1.0)]"


@given(st.integers(0, 10**9), st.integers(1, 10**6), st.integers(0, 10**6))
def test_the_steal_share_is_the_stolen_ticks_over_all_ticks_between_two_readings(total, more, stolen):
    """`steal_share` of two readings (all ticks, stolen ticks) is the stolen ticks between them
    over all of them; no reading, or no time between two, gives None."""
    from exec.launch.host import steal_share
    stolen = min(stolen, more)
    assert steal_share((total, 5), (total + more, 5 + stolen)) == pytest.approx(stolen / more)
    assert steal_share(None, (total, 0)) is None and steal_share((total, 0), None) is None
    assert steal_share((total, 0), (total, 0)) is None


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="no /proc/stat (Linux only)")
def test_this_machine_s_cpu_ticks_grow_and_steal_is_part_of_them():
    """Read twice around some work, the machine's ticks do not go back, its steal is part of
    them, and the share is a fraction."""
    from exec.launch.host import cpu_ticks, steal_share
    before = cpu_ticks()
    sum(i * i for i in range(200_000))
    after = cpu_ticks()
    assert after[0] >= before[0] and after[1] >= before[1] and 0 <= after[1] <= after[0]
    share = steal_share(before, after)
    assert share is None or 0.0 <= share <= 1.0


_KEPT = """
import ctypes, sys
from exec.launch.host import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
class Info(ctypes.Structure):  # glibc's struct mallinfo2
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
kept = []
for step in range(6):  # a step: three 8 MiB blocks, then freed
    blocks = [libc.malloc(8 << 20) for _ in range(3)]
    for b in blocks:
        libc.free(b)
    kept.append(libc.mallinfo2().fordblks)
print(*kept)
"""


@pytest.mark.slow  # a fresh process is the point: its malloc has not been tuned by this one
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_a_rank_keeps_the_memory_it_frees():
    """By default glibc gives the memory a step frees back to the OS (the next step's
    tensors land on fresh pages and take a page fault each, about 3 us on this VM); after
    `keep_freed_memory()` (every gloo rank calls it) it keeps all of it, ready for the next
    step. glibc's own count of the free bytes it holds (mallinfo2) says which."""
    def kept(mode):
        p = subprocess.run([sys.executable, "-c", _KEPT, mode], capture_output=True, text=True,
                           timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
        if "mallinfo2" in p.stderr:
            pytest.skip("glibc older than 2.33: no mallinfo2")
        assert p.returncode == 0, p.stderr
        return [int(n) for n in p.stdout.split()]
    step = 3 * (8 << 20)
    assert all(n < step for n in kept("default"))   # given back at every step's end
    assert all(n >= step for n in kept("keep"))     # every step's 24 MiB kept


@given(n=st.integers(1, 64), world=st.integers(1, 16), offset=st.integers(0, 8))
def test_rank_cores_are_equal_disjoint_blocks(n, world, offset):
    cores = list(range(offset, offset + n))
    blocks = [rank_cores(r, world, cores) for r in range(world)]
    if n < world:
        assert blocks == [None] * world
        return
    assert all(len(b) == n // world for b in blocks)
    flat = [c for b in blocks for c in b]
    assert len(set(flat)) == len(flat) and set(flat) <= set(cores)
    assert all(list(b) == sorted(b) and b[-1] - b[0] == len(b) - 1 for b in blocks)  # contiguous


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(host_cores()) < 2,
                    reason="needs Linux affinity and two cores")
def test_each_rank_and_its_threads_keep_to_their_own_cores():
    out = launch(_placement, 2, timeout=TIMEOUT)
    per = len(host_cores()) // 2
    (c0, n0, t0), (c1, n1, t1) = out
    assert len(c0) == len(c1) == per == n0 == n1 and not set(c0) & set(c1)
    for cores, threads in ((c0, t0), (c1, t1)):
        assert all(aff == list(cores) for _, aff, _ in threads)   # gloo's threads included
        io = [pol for name, _, pol in threads if name == GLOO_IO_THREAD]
        assert io and all(pol == os.SCHED_BATCH for pol in io)
    unpinned = launch(_placement, 2, timeout=TIMEOUT, pin=False)
    assert [c for c, _, _ in unpinned] == [None, None]
    assert all(pol == os.SCHED_OTHER for _, _, threads in unpinned for _, _, pol in threads)


def test_launch_rejects_bad_arguments_before_starting_anything():
    with pytest.raises(ValueError, match="world_size"):
        launch(_sum_ranks, 0, 1)
    with pytest.raises(ValueError, match="backend"):
        launch(_sum_ranks, 2, 1, backend="mpi")


# ---------------------------------------------------------------------------- the interpreter, steps and runs

def _gpipe_on(placement, micro_batches, split=False):
    """`gpipe_on`, named as the runs' records name it."""
    return gpipe_on(placement, micro_batches, split, name="v-split" if split else "v")


CASES = [  # (id, spec, schedule)
    ("naive-mlp", MLP, sim.make_schedule("naive", 2, 4)),
    ("gpipe-mlp", MLP, sim.make_schedule("gpipe", 2, 4)),
    ("1f1b-mlp", MLP, sim.make_schedule("1f1b", 2, 4)),
    ("1f1b-gpt", GPT, sim.make_schedule("1f1b", 2, 2)),
    ("v-shape-mlp", MLP, _gpipe_on([0, 1, 1, 0], 2)),           # two stages per rank
    ("v-shape-split-mlp", MLP, _gpipe_on([0, 1, 1, 0], 2, True)),  # and I/W backwards
]


# starts ranks: every test that uses it is marked slow
@pytest.fixture(scope="module")
def runs():
    """Each case: 1 step (its gradients are checked) + 1 more (its events are checked);
    with each, the compiled program the ranks ran, written out as a lowered schedule."""
    jobs = []
    for _, spec, schedule in CASES:
        bounds = spec.partition(schedule.stages)
        # plain SGD: static = weights + gradients
        jobs.append((spec, sim.compile(schedule, "gloo"), bounds, RunConfig(steps=2, warmup=0, optimizer="sgd")))
    per_rank = launch(_many_runs, 2, jobs, timeout=TIMEOUT)
    return {name: (spec, job[1].lowered(), [r[i] for r in per_rank])
            for i, ((name, spec, _), job) in enumerate(zip(CASES, jobs))}


@pytest.mark.slow
@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_loss_and_gradients_match_one_process(runs, name):
    spec, lowered, per_rank = runs[name]
    grads = [(f"stage{s}.{n}", g) for s in range(lowered.stages) for n, g in per_rank[lowered.rank_of(s)]["grads"][s]]
    ref_loss, ref_grads = reference_step(spec, lowered.micro_batches)
    ok, worst, where = compare_grads(grads, ref_grads)
    assert ok, f"{name}: gradients differ by up to {worst} at {where}"
    assert per_rank[0]["losses"][0] == pytest.approx(ref_loss, rel=1e-5)
    assert per_rank[1]["losses"] == per_rank[0]["losses"]  # every rank knows the loss
    assert per_rank[0]["losses"][1] < per_rank[0]["losses"][0]  # the optimizer stepped


@pytest.mark.slow
@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_every_action_is_measured_once_in_program_order(runs, name):
    _, lowered, per_rank = runs[name]
    result = per_rank[0]["results"][-1]
    assert result.source == "measured" and result.schedule == lowered
    seen = Counter((e.rank, e.action) for e in result.events)
    assert seen == Counter((r, a) for r, prog in enumerate(lowered.programs) for a in prog)
    for r, prog in enumerate(lowered.programs):
        ev = {e.action: e for e in result.events if e.rank == r}
        starts = [ev[a].start for a in prog]
        assert starts == sorted(starts), f"rank {r} did not start its actions in program order"
        computes = [ev[a] for a in prog if a.kind.is_compute]
        for e, nxt in zip(computes, computes[1:]):
            assert e.start <= e.end <= nxt.start
    for e in result.events:
        assert e.end >= e.start and math.isfinite(e.end)
        if not e.action.kind.is_compute:  # transfers name the other rank
            assert e.peer == lowered.rank_of(sim.passes.dependencies.peer(e.action).stage)
    # a SEND ends when its data is there, after the compute that made it
    ends = {(e.rank, e.action): e.end for e in result.events}
    for e in result.events:
        if e.action.kind is Kind.SEND_F:
            assert e.start >= ends[(e.rank, Action(e.action.stage, Kind.F, e.action.micro))]


@pytest.mark.slow
def test_memory_follows_the_micro_batches_held(runs):
    for name, peaks in (("gpipe-mlp", [4, 4]), ("1f1b-mlp", [2, 1]), ("naive-mlp", [1, 1])):
        spec, lowered, per_rank = runs[name]
        result = per_rank[0]["results"][-1]
        assert result.peak_activations == peaks, name
        stages = spec.build_stages(lowered.stages, bounds=spec.partition(lowered.stages))
        for r in range(2):
            assert result.activations[r][-1][1] == 0  # all freed at the end of the step
            static = result.memory[r][0][1]
            # SGD without momentum: the rank's weights and their gradients, nothing more
            weights = sum(p.numel() * p.element_size() for s in range(lowered.stages) if lowered.rank_of(s) == r
                          for p in stages[s].parameters())
            assert static == 2 * weights and result.memory[r][-1][1] == pytest.approx(static)
            assert result.peak_memory[r] > static
    # the sim metrics and the Chrome trace work on a measured step unchanged
    result = runs["1f1b-mlp"][2][0]["results"][-1]
    assert 0 <= result.bubble_fraction < 1
    assert len(result.chrome_trace()["traceEvents"]) > len(result.events)


def test_micro_batches_must_split_the_batch_evenly():
    x = torch.zeros(8, 3)
    xs, ys = split_micro_batches(x, x, 4)
    assert len(xs) == 4 and xs[0].shape == (2, 3)
    with pytest.raises(ValueError, match="does not split into 3 equal micro-batches"):
        split_micro_batches(x, x, 3)


@pytest.mark.parametrize("spec", [MLP, GPT], ids=["mlp", "gpt"])
def test_static_memory_is_weights_gradients_and_optimizer_state(spec):
    """A stage's static memory in real tensor bytes: its parameters, their gradients, and
    the optimizer's state for them. SGD without momentum keeps none, with momentum one
    buffer of each parameter; Adam and AdamW two moments of each parameter and a float32
    `step` tensor per parameter. Before the first step the
    optimizer holds nothing yet, and what its first step creates is counted; after it,
    what torch holds: the same bytes."""
    from exec.runtime.memory import StaticMemory, static_memory
    from exec.runtime.optim import OPTIMIZERS, make_optimizer
    for optimizer in OPTIMIZERS:
        stage = spec.build_stages(1)[0]
        params = list(stage.parameters())
        weights = sum(p.numel() * p.element_size() for p in params)
        opt = make_optimizer(optimizer, params, lr=0.01)
        state = {"sgd": 0, "sgd-momentum": weights}.get(optimizer, 2 * weights + 4 * len(params))
        expected = static_memory(stage, opt)
        assert expected == StaticMemory(weights, weights, state) and expected.total == 2 * weights + state
        assert not opt.state  # nothing held yet
        x, y = spec.batch()
        spec.loss(stage(x), y).backward()
        opt.step()
        held = sum(v.numel() * v.element_size() for st in opt.state.values() for v in st.values()
                   if isinstance(v, torch.Tensor))
        assert held == state and static_memory(stage, opt) == expected, optimizer
    assert static_memory(stage).optimizer_bytes == 0  # no optimizer, no state
    with pytest.raises(ValueError, match="optimizer must be one of adamw, adam, sgd, sgd-momentum"):
        make_optimizer("lion", params, lr=0.01)


def test_exec_and_the_planner_agree_on_the_optimizers_and_the_default():
    """`exec.run --optimizer`, `RunConfig` and `sim.estimate(optimizer=)` take the same names
    (`sim.model.footprint.OPTIMIZERS`) and default to AdamW."""
    from exec.pipeline.config import RunConfig
    from exec.run import build_parser
    from exec.runtime.optim import OPTIMIZERS
    from sim.model.footprint import DEFAULT_OPTIMIZER, OPTIMIZERS as PLANNED
    assert OPTIMIZERS == tuple(PLANNED) == ("adamw", "adam", "sgd", "sgd-momentum")
    assert DEFAULT_OPTIMIZER == RunConfig().optimizer == build_parser().get_default("optimizer") == "adamw"


def test_every_kind_has_its_handler_in_the_interpreter():
    """The interpreter dispatches each kind to the method `sim.schedule.kinds.KINDS` names."""
    from exec.runtime.interpreter import RankInterpreter
    from sim.schedule.kinds import KINDS
    for kind, spec in KINDS.items():
        assert callable(getattr(RankInterpreter, spec.handler, None)), (kind, spec.handler)


# ---------------------------------------------------------------------------- the command line

SMALL = ["--layers", "4", "--hidden", "32", "--seq", "8", "--batch-size", "8", "--micro-batches", "4"]


def _cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "exec.run", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def test_the_old_flags_are_aliases_that_say_so_in_the_help_only(capsys):
    """`--stages 2 --micro 8` parses as `--devices 2 --micro-batches 8`, with nothing said at
    run time; `--help` names them aliases."""
    import warnings
    from exec.run import build_parser
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        old = build_parser().parse_args(["--stages", "2", "--micro", "8"])
    assert vars(old) == vars(build_parser().parse_args(["--devices", "2", "--micro-batches", "8"]))
    assert (old.devices, old.micro_batches) == (2, 8) and capsys.readouterr() == ("", "")
    text = "".join(build_parser().format_help().split())
    assert "--devicesP,--stagesP" in text and "--stages:aliasof--devices" in text
    assert "--micro-batchesM,--microM" in text and "--micro:aliasof--micro-batches" in text


@pytest.mark.slow
def test_cli_json_is_all_of_stdout(tmp_path):
    costs = tmp_path / "costs.json"  # given costs: no profiling run
    save_costs(sim.Costs(forward=1e-3, backward=2e-3), costs)
    p = _cli("--schedule", "gpipe", "--devices", "2", *SMALL, "--steps", "2", "--warmup", "1",
             "--costs", str(costs), "--json", "--out", str(tmp_path / "out"))
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)  # the table and progress go to stderr
    assert "measured step" in p.stderr
    for key in ("schedule", "stages", "micro_batches", "measured_step_s", "simulated_step_s", "error_pct",
                "grad_match", "max_grad_diff"):
        assert key in out, key
    assert out["schedule"] == "gpipe" and out["stages"] == 2 and out["micro_batches"] == 4
    assert out["grad_match"] is True and out["measured_step_s"] > 0 and out["simulated_step_s"] > 0
    assert (tmp_path / "out" / "gpipe_p2_m4_measured.trace.json").is_file()


@pytest.mark.slow
def test_cli_calibrates_in_the_run_and_keeps_the_costs(tmp_path):
    """Without --costs the run calibrates between its steps; --out keeps the costs, and the
    simulated step it reports is the simulation under them, which --costs reproduces."""
    p = _cli("--schedule", "1f1b", "--devices", "2", *SMALL, "--steps", "2", "--warmup", "1", "--json",
             "--out", str(tmp_path / "out"))
    assert p.returncode == 0, p.stderr
    # the two rounds' own lines; a slow round's heartbeat lines ("calibrating 1/2: still running ...") are not rounds
    assert re.findall(r"^exec: calibrating \d+/\d+$", p.stderr, re.M) == ["exec: calibrating 1/2", "exec: calibrating 2/2"]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    costs = load_costs(tmp_path / "out" / "costs.json")
    simulated = sim.simulate(sim.make_schedule("1f1b", 2, 4), costs)
    assert out["simulated_step_s"] == pytest.approx(simulated.makespan, rel=1e-12)
    assert out["simulated_peak_memory"] == out["measured_peak_memory"]
    assert out["costs"]["forward"] == list(costs.forward)
    again = _cli("--schedule", "1f1b", "--devices", "2", *SMALL, "--steps", "1", "--warmup", "0", "--json",
                 "--costs", str(tmp_path / "out" / "costs.json"))
    assert again.returncode == 0 and "calibrating" not in again.stderr
    assert json.loads(again.stdout.strip().splitlines()[-1])["simulated_step_s"] == out["simulated_step_s"]


def test_cli_bad_costs_file_exits_2_before_running(tmp_path, capsys):
    from exec.run import main
    three = tmp_path / "three.json"
    save_costs(sim.Costs(forward=[1e-3] * 3, backward=2e-3), three)
    (tmp_path / "junk.json").write_text("not json")
    for path, says in ((three, "Costs.forward has 3 values but the schedule has 2 stages"),
                       (tmp_path / "junk.json", "junk.json"), (tmp_path / "none.json", "no such file")):
        with pytest.raises(SystemExit) as info:
            main(["--devices", "2", *SMALL, "--costs", str(path)])
        err = capsys.readouterr().err
        assert info.value.code == 2 and err.count("\n") == 1 and says in err, err


@pytest.mark.slow
def test_cli_under_torchrun_reports_once(tmp_path):
    """`torchrun ... -m exec.run`: each process is one rank; rank 0 alone prints the table
    (on stderr, with --json) and the JSON (stdout), with the calibration done in the run."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR")}
    env["PYTHONPATH"] = str(ROOT)
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                        "--master-port", str(free_port()), "-m", "exec.run", "--devices", "2", *SMALL,
                        "--steps", "1", "--warmup", "1", "--json"],
                       capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout)  # one JSON object: rank 1 printed nothing
    assert sum(line.startswith("grad_match") for line in p.stderr.splitlines()) == 1
    assert out["grad_match"] is True and out["simulated_step_s"] > 0
    if len(host_cores()) >= 2:  # each rank pinned to its own half: the job holds both halves, shares none
        assert out["cores"] == 2 * (len(host_cores()) // 2) and out["hosts"][0]["shared"] is False
        assert not any("rule 9" in line or "share" in line for line in p.stderr.splitlines()), p.stderr


@pytest.mark.parametrize("args, says", [
    (["--devices", "0"], "--devices"),
    (["--stages", "0"], "--devices/--stages"),  # the old flag, an alias
    (["--schedule", "zigzag"], "unknown schedule"),
    (["--micro-batches", "5"], "does not split"),
    (["--model", "rnn"], "--model"),
    (["--optimizer", "lion"], "--optimizer"),
    (["--fault", "raise:7"], "names rank 7"),
    (["--out", __file__], "is a file"),
    (["--dp", "0"], "--dp"),
    (["--dp", "3", "--micro-batches", "4", "--batch-size", "8"], "does not split into dp x micro_batches = 3 x 4"),
    (["--dp", "2", "--fault", "raise:4"], "names rank 4"),
    (["--overlap-grad-reduce"], "give --dp 2 or more"),
    (["--experts", "4"], "give --model gpt"),
    (["--model", "gpt", "--top-k", "2"], "give experts= too"),
    (["--model", "gpt", "--experts", "4", "--ep", "0"], "--ep"),
    (["--model", "gpt", "--experts", "4", "--ep", "2", "--no-compare"], "must divide dp=1"),
    (["--model", "gpt", "--experts", "3", "--ep", "2", "--dp", "2", "--micro-batches", "2", "--no-compare"],
     "must divide the 3 experts"),
])
def test_cli_bad_arguments_exit_2_with_one_line(args, says, capsys):
    from exec.run import main
    with pytest.raises(SystemExit) as info:
        main(args)
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert err.count("\n") == 1 and err.startswith("exec.run: error:") and says in err


@pytest.mark.slow
def test_more_ranks_than_cores_calibrate_with_a_warning():
    """Three ranks calibrate (ranks 0 and 1 time the transport without the third one) and
    the run says at its start, in one line, that it has more ranks than cores, and its
    table says it again beside the simulated step."""
    p = _cli("--schedule", "1f1b", "--devices", "3", *SMALL, "--steps", "1", "--warmup", "0", "--json",
             "--timeout", "150", timeout=200)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["grad_match"] is True
    warned = [line for line in p.stderr.splitlines() if "ranks share" in line]
    assert len(warned) == (1 if len(host_cores()) < 3 else 0)
    noted = [line for line in p.stderr.splitlines() if line.startswith("note") and "rule 9" in line]
    assert len(noted) == len(warned)  # and the table says so beside the simulated step


def test_a_silent_rank_gets_a_progress_line_every_few_seconds():
    """Rank 0's heartbeat, on a clock the test moves (one process, no ranks): a line every
    `every` seconds while the run is silent, none while lines come more often, none at
    all when progress is off. No bound here depends on how loaded the machine is."""
    from exec.pipeline.worker import Progress
    now, out = [0.0], []
    progress = Progress(True, "step 1/3", every=5, clock=lambda: now[0], write=out.append)
    for now[0] in (4.99, 5.0, 9.0, 10.0, 15.0):   # silent: a line at 5, 10 and 15 s
        progress.beat()
    assert out == [f"step 1/3: still running after {s} s" for s in (5, 10, 15)]
    out.clear()
    for t in range(16, 40, 4):                      # a line every 4 s: never silent for 5
        now[0] = float(t)
        progress.say(f"step {t}: loss 0.5", doing="step 2/3")
        now[0] = t + 3.99
        assert not progress.beat()
    assert not any("still running" in line for line in out)
    now[0] = 36 + 5.0                                # the last line was at 36 s
    assert progress.beat() and out[-1] == "step 2/3: still running after 5 s"
    off = Progress(False, "step 1/3", every=5, clock=lambda: now[0], write=out.append)
    now[0] += 100
    off.say("step 1/3: loss 0.5")
    now[0] += 100
    assert not off.beat() and out[-1] == "step 2/3: still running after 5 s"  # nothing new


@pytest.mark.slow
def test_a_hung_run_is_never_silent():
    """End to end: rank 1 hangs; rank 0's heartbeat (every second here) says so on stderr
    until the run's timeout (the usual generous one: the assert is on the line, not on
    when it came) ends the run with exit status 1."""
    p = _cli("--devices", "2", *SMALL, "--steps", "1", "--warmup", "0", "--no-compare", "--fault", "hang:1",
             "--timeout", str(TIMEOUT), "--progress-every", "1", timeout=TIMEOUT + 60)
    assert p.returncode == 1 and f"took longer than timeout={TIMEOUT}s" in p.stderr
    assert p.stderr.count("step 1/1: still running after") >= 1


@pytest.mark.slow
def test_cli_rank_failure_is_one_line_and_exit_1(capsys):
    from exec.run import main
    with pytest.raises(SystemExit) as info:
        main(["--devices", "2", *SMALL, "--steps", "1", "--warmup", "0", "--no-compare", "--quiet",
              "--fault", "raise:1", "--timeout", str(TIMEOUT)])
    err = capsys.readouterr().err
    assert info.value.code == 1
    assert err.count("\n") == 1 and err.startswith("exec.run: rank 1 raised RuntimeError: fault injected")


# ---------------------------------------------------------------------------- GPUs

@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_nccl_run_matches_one_process():
    from exec.pipeline.runner import run_pipeline
    ranks = min(2, torch.cuda.device_count())
    run = run_pipeline(MLP, "1f1b", ranks, 4, steps=2, warmup=1, backend="nccl", timeout=TIMEOUT, atol=1e-4)
    assert run.grad_match, run.max_grad_diff
    assert run.measured_step_s > 0 and run.result.peak_memory[0] > 0


def test_run_pipeline_and_torch_runtime_take_devices_and_micro_batches_only():
    from exec.pipeline.runner import run_pipeline
    from exec.torch_pipelining.runtime import run_torch_runtime
    for run in (run_pipeline, run_torch_runtime):
        # a name without micro_batches is refused before any process starts
        with pytest.raises(ValueError, match=r"a schedule name needs devices and micro_batches"):
            run(MLP, "1f1b", devices=2)
        with pytest.raises(TypeError, match=r"unexpected keyword argument 'stages'"):
            run(MLP, "1f1b", stages=2)  # the old keyword for devices is gone
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'step'"):
        run_torch_runtime(MLP, "1f1b", 2, 4, step=1)
