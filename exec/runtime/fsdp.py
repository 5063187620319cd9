"""FSDP on CPU ranks: each stage's parameters as one flat buffer, freed by RESHARD and all-gathered back from the data-parallel group's shards by UNSHARD.

As FSDP2 does it (`torch.distributed.fsdp`, its `FSDPParamGroup`): a stage's parameters
become views of one flat buffer, padded to a multiple of the group's size; the rank keeps
its own contiguous 1/dp of it (its shard), and the buffer's storage is freed
(`untyped_storage().resize_(0)`: the views, and the tensors autograd saved from them,
stay valid, their data gone). `unshard` reallocates the storage and fills it with the
all-gather of every rank's shard (`all_gather_single`, torch 2.13's name for
`all_gather_into_tensor`, which gloo runs), so that a backward finds the weights its
forward saved gathered again (the runtime saves them through its hooks,
`exec.runtime.memory.SavedBytes`, so autograd checks no version).
A compute between a RESHARD and the next UNSHARD would read freed storage; the
schedule's checks (`sim.passes.checks.check_gathers`) refuse one.

What is not FSDP here: the gather is synchronous (the rank waits for it in its UNSHARD,
where the simulator runs it on a stream of its own beside the computes); the gradients
are averaged whole (REDUCE_GRAD's all-reduce, `exec.runtime.dp`) rather than
reduce-scattered, and the optimizer steps whole parameters, which `restore` gathers
after the step's program: each rank keeps every gradient, so that the check against one
process (`exec.runtime.check`) reads them as without FSDP.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["Shards"]

# torch 2.13 deprecates all_gather_into_tensor (a FutureWarning) for all_gather_single
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class Shards:
    """The flat, sharded parameters of a rank's stages over its data-parallel `group`
    (None: one rank, nothing to gather). Made at the step's start, every stage resharded."""

    def __init__(self, modules: dict[int, nn.Module], group):
        self.group = group
        self.size = dist.get_world_size(group) if group is not None else 1
        index = dist.get_rank(group) if group is not None else 0
        self.flat: dict[int, torch.Tensor] = {}
        self.shard: dict[int, torch.Tensor] = {}
        for s, module in modules.items():
            params = list(module.parameters())
            n = sum(p.numel() for p in params)
            per = -(-n // self.size)  # ceil: the last shard padded
            flat = torch.zeros(per * self.size, dtype=params[0].dtype if params else torch.float32)
            offset = 0
            for p in params:
                flat[offset:offset + p.numel()].copy_(p.detach().reshape(-1))
                p.data = flat[offset:offset + p.numel()].view_as(p)
                offset += p.numel()
            self.flat[s], self.shard[s] = flat, flat[index * per:(index + 1) * per].clone()
            self.reshard(s)

    def unshard(self, stage: int) -> int:
        """All-gather `stage`'s parameters into its flat buffer; return its bytes."""
        flat = self.flat[stage]
        gathered = self.shard[stage]
        if self.size > 1:
            gathered = torch.empty(flat.numel(), dtype=flat.dtype, device=flat.device)
            _all_gather(gathered, self.shard[stage], group=self.group)
        flat.untyped_storage().resize_(flat.numel() * flat.element_size())
        with torch.no_grad():  # autograd saved the weights through the runtime's hooks: no version check
            flat.copy_(gathered)
        return flat.numel() * flat.element_size()

    def reshard(self, stage: int) -> None:
        """Free `stage`'s gathered parameters; its shard stays."""
        self.flat[stage].untyped_storage().resize_(0)

    def restore(self) -> None:
        """Gather every stage back, after the step's program: the optimizer steps whole
        parameters (see the module's docstring)."""
        for s, flat in self.flat.items():
            if flat.untyped_storage().nbytes() == 0:
                self.unshard(s)
