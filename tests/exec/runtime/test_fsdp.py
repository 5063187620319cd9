"""exec with FSDP: UNSHARD and RESHARD run for real on gloo CPU ranks (`exec.runtime.fsdp`).

One launch of 2 ranks (pp = 1, dp = 2) runs three stages of an MLP on one rank each
replica, its stages gathered for each forward and again for each backward
(`sim.add_fsdp`, reshard after forward), their storage freed in between, and the
gradients averaged by REDUCE_GRAD. Every replica's gradients must equal one process's on
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
def test_every_replica_has_the_gradients_of_one_process_with_fsdp():
    schedule = _schedule()
    assert sum(a.kind is Kind.UNSHARD for a in schedule.programs[0]) == 5  # 3 forwards' and 2 backwards' gathers
    run = run_pipeline(SPEC, schedule, dp=2, steps=2, warmup=0, timeout=120)
    assert run.grad_match, f"gradients differ by up to {run.max_grad_diff} at {run.worst_param}"
    assert run.losses[0] == pytest.approx(run.reference_loss, rel=1e-5)
    assert run.losses[1] < run.losses[0]  # the optimizer stepped the whole parameters alike on both replicas
    gathers = [e for e in run.result.events if e.action.kind is Kind.UNSHARD]
    assert len(gathers) == 5 and all(e.end >= e.start for e in gathers)
