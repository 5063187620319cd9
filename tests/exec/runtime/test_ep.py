"""exec with expert parallelism: a MoE GPT on 4 gloo ranks, its experts spread over ep of the dp replicas and reached by all-to-all, checked against one process.

One launch of 4 CPU ranks runs four configurations one after the other (`pipeline_worker`,
one step): under 1F1B, one stage on 4 replicas with ep = 4 (each rank one expert, edp = 1)
and with ep = 2 (edp = 2: each expert on two ranks, its gradients reduced over them), and
pp = 2 ranks x dp = 2 replicas with ep = 2; and DualPipeV (two stages a rank, a split
backward, overlapped forward-backward pairs) on pp = 2 x dp = 2 with ep = 2. For every rank, the loss and every parameter's
gradient after the first step must be one process's on the whole batch, each rank's experts
against the same experts of the one process, and the rank must hold exactly its ep rank's
experts. `run_pipeline` runs pp = 2 x ep = 2 once more, as `python -m exec.run --ep 2` does,
with a calibration round (the replicas of an ep group compute their turn together).
Nothing here compares times.
"""
from __future__ import annotations


import pytest
from helpers import rank_processes

torch = pytest.importorskip("torch")

import sim  # noqa: E402
from sim.hardware.topology import Topology  # noqa: E402
from exec.launch.processes import launch  # noqa: E402
from exec.models.moe import is_expert_param  # noqa: E402
from exec.models.spec import ModelSpec  # noqa: E402
from exec.pipeline.config import RunConfig  # noqa: E402
from exec.pipeline.runner import run_pipeline  # noqa: E402
from exec.pipeline.worker import pipeline_worker  # noqa: E402
from exec.runtime.check import param_names, reference_step  # noqa: E402
from exec.runtime.ep import holds_expert  # noqa: E402

TIMEOUT = 240  # seconds for a launch
WORLD, MICRO = 4, 2
SPEC = ModelSpec("gpt", layers=2, hidden=16, heads=2, seq=8, vocab=32, batch_size=8, experts=4, top_k=2,
                 expert_ffn=16, shared_experts=1, dense_layers=1)
RUNS = [(1, 4, 4, "1f1b"), (1, 4, 2, "1f1b"), (2, 2, 2, "1f1b"), (2, 2, 2, "dualpipev")]  # (pp, dp, ep, schedule)


def _program(pp: int, name: str):
    micro = 2 * pp if name == "dualpipev" else MICRO  # DualPipeV: at least 2P micro-batches
    return sim.compile(sim.add_grad_reduce(sim.make_schedule(name, pp, micro), False), "gloo")


def _jobs(ctx, jobs):
    return [pipeline_worker(ctx, *job) for job in jobs]


# starts ranks: every test that uses it is marked slow
@pytest.fixture(scope="module")
def ep_runs():
    jobs = []
    for pp, dp, ep, name in RUNS:
        program = _program(pp, name)
        jobs.append((SPEC, program, SPEC.partition(program.stages),
                     RunConfig(steps=1, warmup=0, dp=dp, ep=ep, optimizer="sgd")))
    per_rank = launch(_jobs, WORLD, jobs, timeout=TIMEOUT)
    return jobs, per_rank


def _reference():
    loss, grads = reference_step(SPEC, MICRO)
    return loss, dict(zip(param_names(SPEC), grads))


@pytest.mark.slow
@pytest.mark.parametrize("i", range(len(RUNS)))
def test_every_rank_has_one_process_gradients_for_what_it_holds(ep_runs, i):
    jobs, per_rank = ep_runs
    (pp, dp, ep, name), (_, program, bounds, _) = RUNS[i], jobs[i]
    schedule = program.schedule
    ref_loss, ref = _reference()
    topo = Topology(tp=1, pp=pp, dp=dp)
    for rank in range(WORLD):
        _, replica, pipe_rank = topo.coords(rank)
        out = per_rank[rank][i]
        assert out["losses"][0] == pytest.approx(ref_loss, rel=1e-5)
        held = set()
        for s, grads in out["grads"].items():
            assert schedule.rank_of(s) == pipe_rank
            for param, g in grads:
                layer, rest = param.split(".", 1)
                whole = f"{bounds[s] + int(layer)}.{rest}"  # the name in the whole model
                held.add(whole)
                assert torch.allclose(torch.as_tensor(g), ref[whole], rtol=1e-4, atol=1e-5), \
                    f"{name} pp={pp} dp={dp} ep={ep}, rank {rank}: {whole} differs by " \
                    f"{(torch.as_tensor(g) - ref[whole]).abs().max():.3g}"
        layers = {x for s in out["grads"] for x in range(bounds[s], bounds[s + 1])}  # its stages', in the whole model
        assert held == {n for n in ref if int(n.split(".")[0]) in layers
                        and holds_expert(n, SPEC.experts, ep, replica % ep)}
        moe_layers = sum(1 + SPEC.dense_layers <= layer <= SPEC.layers for layer in layers)
        assert sum(map(is_expert_param, held)) == moe_layers * 4 * SPEC.experts // ep  # fc1, fc2: weight, bias


@pytest.mark.slow
def test_an_expert_parallel_pipeline_runs_and_calibrates_as_the_cli_does():
    run = run_pipeline(SPEC, "1f1b", 2, MICRO, dp=2, ep=2, steps=2, warmup=0, optimizer="sgd", calibrate=2,
                       timeout=TIMEOUT)
    assert run.grad_match and run.loss_match, f"{run.max_grad_diff} at {run.worst_param}"
    assert run.losses[1] < run.losses[0]
    costs = run.costs.for_stages(2)  # the ep peers calibrated together
    assert all(f > 0 for f in costs.forward) and all(g > 0 for g in costs.grad_reduce)


@pytest.mark.slow
def test_the_runs_leave_no_rank_process_behind(ep_runs):
    assert rank_processes() == []


def test_runs_exec_cannot_make_expert_parallel_are_refused_before_any_rank_starts():
    fsdp = sim.add_grad_reduce(sim.add_fsdp(sim.make_schedule("looped-bfs", 1, MICRO, 2)), True)
    with pytest.raises(ValueError, match=r"FSDP .* would shard the routed experts"):
        run_pipeline(SPEC, fsdp, dp=2, ep=2, timeout=10)
    with pytest.raises(ValueError, match="must divide dp=2"):
        run_pipeline(SPEC, "1f1b", 2, MICRO, dp=2, ep=4, timeout=10)
    with pytest.raises(ValueError, match="the model has none"):
        run_pipeline(ModelSpec("gpt", layers=2, hidden=16, heads=2, seq=8, vocab=32, batch_size=8), "1f1b", 1,
                     MICRO, dp=2, ep=2, timeout=10)
