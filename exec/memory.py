"""Memory counting: the bytes a stage holds for the whole step, and those it keeps per
micro-batch between its forward and its backward (docs/rules.md, rule 7).

- `static_memory(module, optimizer)`: the stage's parameters, their gradients and the
  optimizer's state for them, in real tensor bytes: `sim.Costs.weight_bytes`,
  `grad_bytes` and `optimizer_bytes`.
- `SavedBytes`: what autograd saves for backward during one forward
  (`sim.Costs.activation_bytes`), each storage once, parameters excluded.

The runtime counts a rank's memory with these, and calibration reports them into
`sim.Costs`, so that a simulated step holds exactly the bytes a measured one holds.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Iterable

import torch
from torch import nn

from .optim import state_bytes

__all__ = ["StaticMemory", "static_memory", "tensor_bytes", "param_storages", "SavedBytes"]


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the elements of `tensors` (not of the storages they view)."""
    return sum(t.numel() * t.element_size() for t in tensors)


@dataclass(frozen=True)
class StaticMemory:
    """What a stage holds for the whole step, in bytes; the field names are those of
    `sim.Costs`."""

    weight_bytes: int
    grad_bytes: int
    optimizer_bytes: int

    @property
    def total(self) -> int:
        return self.weight_bytes + self.grad_bytes + self.optimizer_bytes

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def static_memory(module: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> StaticMemory:
    """The parameters of `module`, their gradients (the tensor in `.grad`, or, where there
    is none yet, the one backward will make: the parameter's size) and the state
    `optimizer` keeps for them (`exec.optim.state_bytes`: what it holds, or what its
    first step will create; none without an optimizer)."""
    params = list(module.parameters())
    grads = sum(tensor_bytes([p.grad if p.grad is not None else p]) for p in params if p.requires_grad)
    opt = state_bytes(optimizer, params) if optimizer is not None else 0
    return StaticMemory(tensor_bytes(params), grads, opt)


def param_storages(module: nn.Module) -> frozenset[int]:
    """The addresses of the storages of `module`'s parameters (for `SavedBytes`)."""
    return frozenset(p.untyped_storage().data_ptr() for p in module.parameters())


class SavedBytes:
    """Counts the bytes autograd saves for backward during a forward (saved_tensors_hooks):
    each storage once, parameters excluded (they are static memory). `params`: the
    stage's `param_storages`, found once, not at every forward (walking a module's
    parameters costs more than many a small action)."""

    def __init__(self, params: frozenset[int]):
        self.params = params
        self.seen: set[int] = set()
        self.nbytes = 0

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in self.params and ptr not in self.seen:
            self.seen.add(ptr)
            self.nbytes += storage.nbytes()
        return t

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)
