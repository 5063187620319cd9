"""exec with FSDP: UNSHARD and RESHARD run for real on gloo CPU ranks (`exec.runtime.fsdp`).

One launch of 2 ranks (pp = 1, dp = 2) runs three stages of an MLP on one rank each
replica, its stages gathered for each forward and again for each backward
(`sim.add_fsdp`, reshard after forward), their storage freed in between, and the
gradients averaged by REDUCE_GRAD; one of 4 ranks (pp = 2, dp = 2) runs interleaved 1F1B
with two stages a rank so. Every replica's gradients must equal one process's on
the whole batch: a compute that ran on freed or stale weights would not. Nothing here
compares times (2 ranks on a busy 2-core machine).
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import sim  # noqa: E402
from sim import Kind  # noqa: E402
from exec.models.spec import ModelSpec  # noqa: E402
from exec.pipeline.runner import run_pipeline  # noqa: E402
from exec.runtime.fsdp import Shards  # noqa: E402

SPEC = ModelSpec("mlp", layers=3, hidden=16, seq=4, batch_size=8)
SPEC_PP = ModelSpec("mlp", layers=4, hidden=16, seq=4, batch_size=8)


def _schedule(reshard_after_forward: bool = True) -> sim.Schedule:
    layers = sim.make_schedule("looped-bfs", devices=1, micro_batches=2, virtual=3)
    return sim.add_grad_reduce(sim.add_fsdp(layers, 1, reshard_after_forward), overlap=True)


def test_shards_free_and_gather_back_one_rank():
    """With one rank (no group) a stage's parameters are views of one flat buffer whose
    storage RESHARD frees and UNSHARD refills with the same values."""
    module = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Linear(5, 2))
    before = [p.detach().clone() for p in module.parameters()]
    shards = Shards({0: module}, None)
    assert all(p.untyped_storage().nbytes() == 0 for p in module.parameters())
    assert shards.unshard(0) == sum(p.numel() for p in before) * 4
    assert all(torch.equal(p, b) for p, b in zip(module.parameters(), before))
    shards.reshard(0)
    shards.restore()
    assert all(torch.equal(p, b) for p, b in zip(module.parameters(), before))


@pytest.mark.slow
@pytest.mark.parametrize("pp", [1, 2])
def test_every_replica_has_the_gradients_of_one_process_with_fsdp(pp):
    if pp == 1:
        schedule, gathered = _schedule(), 5  # 3 forwards' and 2 backwards' gathers
    else:
        schedule = sim.add_grad_reduce(sim.add_fsdp(sim.make_schedule("interleaved-1f1b", 2, 2, 2)), overlap=True)
        gathered = 3  # rank 0: stage 0 for its forwards and again for its backwards, stage 2 once
    assert sum(a.kind is Kind.UNSHARD for a in schedule.programs[0]) == gathered
    run = run_pipeline(SPEC if pp == 1 else SPEC_PP, schedule, dp=2, steps=2, warmup=0, timeout=180)
    assert run.grad_match, f"gradients differ by up to {run.max_grad_diff} at {run.worst_param}"
    assert run.losses[0] == pytest.approx(run.reference_loss, rel=1e-5)
    assert run.losses[1] < run.losses[0]  # the optimizer stepped the whole parameters alike on both replicas
    gathers = [e for e in run.result.events if e.action.kind is Kind.UNSHARD]
    assert len([e for e in gathers if e.rank == 0]) == gathered and all(e.end >= e.start for e in gathers)
