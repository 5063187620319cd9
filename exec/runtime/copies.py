"""The copies of a stage that DualPipe holds (parameters twice): each takes the sum of all copies' gradients before the optimizer.

A schedule with `pipelines` = k > 1 (`sim.Schedule.pipelines`; DualPipe: k = 2) runs k
copies of the model, stage s being stage s mod chain of its copy: the copies of a stage
see different micro-batches, and the step's gradient of the stage is the sum of theirs.
`sum_copies` exchanges them point to point between the ranks that hold the copies
(DualPipe's device r and P-1-r) and adds them, so that every copy takes the same
optimizer step and holds the gradient one process would compute.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from sim import Schedule

__all__ = ["sum_copies"]

TAG = 1 << 20  # above every transfer's tag: its number in the program (`exec.runtime.rank_program`)


def _flat(module: nn.Module) -> torch.Tensor:
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                      for p in module.parameters()])


def sum_copies(ctx, schedule: Schedule, modules: dict[int, nn.Module]) -> None:
    """Give every copy of each of this rank's stages the sum of all copies' gradients
    (call on every rank at once; nothing to do with one copy of the model)."""
    if schedule.pipelines == 1:
        return
    chain, works, got = schedule.chain, [], []
    for s, module in modules.items():
        mine = _flat(module)
        for twin in range(s % chain, schedule.stages, chain):
            if twin == s:
                continue
            peer = ctx.global_rank(schedule.rank_of(twin))
            buf = torch.empty_like(mine)
            works.append(dist.isend(mine, peer, tag=TAG + s))
            works.append(dist.irecv(buf, peer, tag=TAG + twin))
            got.append((module, buf))
    for w in works:
        w.wait()
    for module, buf in got:
        at = 0
        for p in module.parameters():
            part = buf[at:at + p.numel()].view_as(p)
            p.grad = part.clone() if p.grad is None else p.grad + part
            at += p.numel()
