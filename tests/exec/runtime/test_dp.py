"""exec with data parallelism: pp x dp gloo ranks in Megatron-LM's order, REDUCE_GRAD run for real.

One launch of 4 CPU ranks (pp = 2, dp = 2) runs interleaved 1F1B with two stages per
rank, its gradient reductions placed both ways (`sim.add_grad_reduce`, overlap True and
False: with two stages per rank they differ), and one calibration round. Every
replica's gradients must equal one process's on the whole batch. With 4 ranks on a
2-core machine rule 9 cannot hold, so nothing here compares times: only what the
program order fixes (docs/rules.md, rules 9 and 13).
"""
from __future__ import annotations

import statistics

import pytest
from helpers import rank_processes

torch = pytest.importorskip("torch")

import sim  # noqa: E402
from sim import Kind  # noqa: E402
from sim.hardware.topology import Topology  # noqa: E402
from exec.measure.calibrate import calibrate_rank  # noqa: E402
from exec.runtime.check import compare_grads, reference_step  # noqa: E402
from exec.runtime.dp import check_dp, replica_context, shard  # noqa: E402
from exec.launch.processes import launch  # noqa: E402
from exec.models.spec import ModelSpec  # noqa: E402
from exec.pipeline.config import RunConfig  # noqa: E402
from exec.pipeline.runner import run_pipeline  # noqa: E402
from exec.pipeline.worker import pipeline_worker  # noqa: E402
from exec.measure.costs import costs_from_reports  # noqa: E402

TIMEOUT = 120  # seconds for the one launch
PP, DP, MICRO = 2, 2, 2
SPEC = ModelSpec("mlp", layers=4, hidden=16, seq=4, batch_size=8)


# ---------------------------------------------------------------------------- the layout, without processes

def test_replicas_take_disjoint_shards_that_make_the_batch():
    x, y = SPEC.batch()
    parts = [shard(x, y, DP, d) for d in range(DP)]
    assert torch.equal(torch.cat([a for a, _ in parts]), x) and torch.equal(torch.cat([b for _, b in parts]), y)
    with pytest.raises(ValueError, match=r"dp must be an integer >= 1"):
        check_dp(0, 8, 2)
    with pytest.raises(ValueError, match=r"does not split into dp x micro_batches = 3 x 2 .* divisors of 8"):
        check_dp(3, 8, 2)


def test_bad_data_parallel_runs_are_refused_before_any_rank_starts():
    plain = sim.make_schedule("1f1b", PP, MICRO)
    with pytest.raises(ValueError, match=r"does not split into dp x micro_batches = 3 x 2"):
        run_pipeline(SPEC, "1f1b", PP, MICRO, dp=3, timeout=10)
    with pytest.raises(ValueError, match=r"dp must be an integer >= 1"):
        run_pipeline(SPEC, plain, dp=0, timeout=10)
    with pytest.raises(ValueError, match=r"has no REDUCE_GRAD actions; pass sim.add_grad_reduce"):
        run_pipeline(SPEC, plain, dp=2, timeout=10)
    with pytest.raises(ValueError, match=r"gloo\) only"):
        run_pipeline(SPEC, sim.add_grad_reduce(plain, True), backend="nccl", timeout=10)


# ---------------------------------------------------------------------------- one launch of pp x dp ranks

def _schedule(overlap: bool) -> sim.Schedule:
    return sim.lower(sim.add_grad_reduce(sim.make_schedule("interleaved-1f1b", PP, MICRO, 2), overlap))


def _dp_jobs(ctx, jobs, calib_schedule):
    """The pipeline runs, then one calibration round of `calib_schedule` on fresh stages."""
    runs = [pipeline_worker(ctx, *job) for job in jobs]
    rctx = replica_context(ctx, PP, DP)
    shard_spec = ModelSpec("mlp", layers=4, hidden=16, seq=4, batch_size=SPEC.batch_size // DP)
    report = calibrate_rank(rctx, shard_spec, sim.compile(calib_schedule, "gloo"), MICRO, SPEC.partition(calib_schedule.stages),
                            steps=1, repeats=3)
    return runs, report


# starts ranks: every test that uses it is marked slow
@pytest.fixture(scope="module")
def dp_runs():
    schedules = {overlap: _schedule(overlap) for overlap in (True, False)}
    bounds = SPEC.partition(schedules[True].stages)
    jobs = [(SPEC, sim.compile(schedules[o], "gloo"), bounds, RunConfig(steps=2, warmup=0, dp=DP)) for o in (True, False)]
    per_rank = launch(_dp_jobs, PP * DP, jobs, schedules[True], timeout=TIMEOUT)
    return schedules, [r[0] for r in per_rank], [r[1] for r in per_rank]


@pytest.mark.slow
def test_the_run_leaves_no_rank_process_behind(dp_runs):
    assert rank_processes() == []


def test_the_two_placements_of_the_reduction_differ():
    assert _schedule(True).programs != _schedule(False).programs


@pytest.mark.slow
@pytest.mark.parametrize("overlap", [True, False])
def test_every_replica_has_the_gradients_of_one_process_on_the_whole_batch(dp_runs, overlap):
    schedules, runs, _ = dp_runs
    i = 0 if overlap else 1
    lowered, topo = schedules[overlap], Topology(tp=1, pp=PP, dp=DP)
    ref_loss, ref_grads = reference_step(SPEC, MICRO)
    for d in range(DP):
        grads = [(f"stage{s}.{n}", g) for s in range(lowered.stages)
                 for n, g in runs[topo.rank(0, d, lowered.rank_of(s))][i]["grads"][s]]
        ok, worst, where = compare_grads(grads, ref_grads)
        assert ok, f"overlap={overlap}, replica {d}: gradients differ by up to {worst} at {where}"
    losses = [runs[r][i]["losses"] for r in range(PP * DP)]
    assert losses[0][0] == pytest.approx(ref_loss, rel=1e-5)   # the mean over the replicas' shards
    assert all(x == losses[0] for x in losses)                  # every rank of every replica knows it
    assert losses[0][1] < losses[0][0]                          # the replicas stepped alike


@pytest.mark.slow
@pytest.mark.parametrize("overlap", [True, False])
def test_reductions_run_one_at_a_time_after_their_stages_backwards(dp_runs, overlap):
    """Rule 13, as far as program order fixes it: each stage's REDUCE_GRAD is recorded
    once on its rank, starts after its stage's last backward ends, the rank's reductions
    do not overlap one another (one stream, in issue order); with overlap the first one
    starts before the rank's last compute, without it after the rank's last compute."""
    schedules, runs, _ = dp_runs
    lowered = schedules[overlap]
    result = runs[0][0 if overlap else 1]["results"][-1]
    reductions = [e for e in result.events if e.is_collective]
    assert sorted(e.action.stage for e in reductions) == list(range(lowered.stages))
    for r in range(PP):
        mine = sorted((e for e in reductions if e.rank == r), key=lambda e: e.start)
        assert [e.action for e in mine] == [a for a in lowered.programs[r] if a.kind is Kind.REDUCE_GRAD]
        computes = result.compute_events(r)
        for e in mine:
            assert e.end >= e.start
            last_b = max(c.end for c in computes if c.action.stage == e.action.stage and c.action.kind is Kind.B)
            assert e.start >= last_b
        for a, b in zip(mine, mine[1:]):
            assert b.start >= a.end
        if overlap:
            assert mine[0].start < computes[-1].start
        else:
            assert mine[0].start >= computes[-1].end


@pytest.mark.slow
def test_calibration_measures_each_stages_reduction_for_the_simulator(dp_runs):
    """`grad_reduce` per stage is the mean of every replica's samples of it; the
    simulation of the run's schedule under the calibrated costs holds each reduction
    for exactly that time."""
    schedules, _, reports = dp_runs
    costs, _ = costs_from_reports(reports, schedules[True])
    for s in range(schedules[True].stages):
        samples = [v for r in reports for v in r["grad_reduce"].get(str(s), [])]
        assert len(samples) == 3 * DP and all(v > 0 for v in samples)
        assert costs.grad_reduce[s] == pytest.approx(statistics.fmean(samples))
    simulated = sim.simulate(schedules[True], costs)
    spans = {e.action.stage: e.duration for e in simulated.events if e.is_collective}
    assert spans == pytest.approx({s: costs.grad_reduce[s] for s in range(schedules[True].stages)})
    assert sum(r["comm"] is not None for r in reports) == 2  # the transport: replica 0's ranks 0 and 1
