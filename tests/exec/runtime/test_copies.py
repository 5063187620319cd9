"""exec.runtime.copies: DualPipe's two copies of each stage train as one model on four gloo ranks.

Each copy sees half the micro-batches; `sum_copies` gives both the sum of their
gradients before the optimizer. The first step's gradients are one process's, and the
losses of later steps are 1F1B's on the same model: the copies stay one model.
"""
from __future__ import annotations

import pytest

pytest.importorskip("torch")

import sim  # noqa: E402
from exec.models.spec import ModelSpec  # noqa: E402
from exec.pipeline.runner import run_pipeline  # noqa: E402

MLP = ModelSpec("mlp", layers=4, hidden=16, seq=4, batch_size=8)


@pytest.mark.slow
def test_dualpipe_on_four_ranks_trains_as_1f1b_does():
    one = run_pipeline(MLP, "1f1b", 4, 8, steps=3, warmup=0, timeout=120)
    for overlap in (False, True):
        run = run_pipeline(MLP, sim.make_schedule("dualpipe", 4, 8, overlap=overlap), steps=3, warmup=0, timeout=120)
        assert run.grad_match, (overlap, run.max_grad_diff, run.worst_param)
        assert run.losses == pytest.approx(one.losses, rel=1e-5)
        assert run.losses[2] < run.losses[0]  # it trains


@pytest.mark.slow
def test_dualpipe_with_two_replicas_trains_as_1f1b_does():
    """dp = 2: each copy's REDUCE_GRAD averages it over its replicas, then `sum_copies` adds the
    twins': the sum over both copies' replicas that the planner times as one collective
    (docs/rules.md, rule 13), and the gradients one process computes."""
    one = run_pipeline(MLP, "1f1b", 2, 4, dp=2, steps=2, warmup=0, timeout=200)
    run = run_pipeline(MLP, "dualpipe", 2, 4, dp=2, steps=2, warmup=0, timeout=200)
    assert run.grad_match, (run.max_grad_diff, run.worst_param)
    assert run.losses == pytest.approx(one.losses, rel=1e-5)
    assert len(run.grad_reduce_s) == 4  # a REDUCE_GRAD for each of the 2 x 2 stages


def test_calibration_refuses_two_copies_before_anything_starts():
    from exec.pipeline.config import RunConfig
    from exec.pipeline.runner import check_run
    with pytest.raises(ValueError, match="calibration does not measure schedule 'dualpipe' of 2 copies"):
        check_run(MLP, sim.make_schedule("dualpipe", 2, 4), RunConfig(calibrate=1))
    assert check_run(MLP, sim.make_schedule("dualpipe", 2, 4), RunConfig()).schedule.pipelines == 2
