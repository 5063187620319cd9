"""Memory counting: the bytes a stage holds for the whole step, and those it keeps per
micro-batch between its forward and its backward (docs/rules.md, rule 7).

- `static_memory(module, optimizer)`: the stage's parameters, their gradients and the
  optimizer's state for them, in real tensor bytes: `sim.Costs.weight_bytes`,
  `grad_bytes` and `optimizer_bytes`.
- `SavedBytes`: what autograd saves for backward during one forward
  (`sim.Costs.activation_bytes`), each storage once, parameters excluded; and, after a
  split backward's I, what of it the graph still holds for W (`kept_bytes`:
  `sim.Costs.w_activation_bytes`).

The runtime counts a rank's memory with these, and calibration reports them into
`sim.Costs`, so that a simulated step holds exactly the bytes a measured one holds.
"""
from __future__ import annotations

import weakref
from dataclasses import asdict, dataclass
from typing import Iterable

import torch
from torch import nn

from exec.runtime.optim import state_bytes

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
    `optimizer` keeps for them (`exec.runtime.optim.state_bytes`: what it holds, or what its
    first step will create; none without an optimizer)."""
    params = list(module.parameters())
    grads = sum(tensor_bytes([p.grad if p.grad is not None else p]) for p in params if p.requires_grad)
    opt = state_bytes(optimizer, params) if optimizer is not None else 0
    return StaticMemory(tensor_bytes(params), grads, opt)


def param_storages(module: nn.Module) -> frozenset[int]:
    """The addresses of the storages of `module`'s parameters (for `SavedBytes`)."""
    return frozenset(p.untyped_storage().data_ptr() for p in module.parameters())


class _Saved:
    """What autograd holds for one saved tensor: a box around it, so that `SavedBytes` can
    tell, by a weak reference, whether the graph still holds it. It holds the tensor
    detached (same storage): a node that saves its own output would otherwise hold itself
    through the output's grad_fn, a cycle that only running the node breaks, and a node
    that W never runs would never be freed. Autograd gives the unpacked tensor back its
    grad_fn."""

    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor


class SavedBytes:
    """Counts the bytes autograd saves for backward during a forward (saved_tensors_hooks):
    each storage once, parameters excluded (they are static memory). `params`: the
    stage's `param_storages`, found once, not at every forward (walking a module's
    parameters costs more than many a small action).

    Each saved tensor is kept in a box that the graph owns; `kept_bytes()` counts, the
    same way, the storages whose boxes the graph still holds (a node's saved tensors go
    when the node goes: after a split backward's I, those W still needs)."""

    def __init__(self, params: frozenset[int]):
        self.params = params
        self.seen: set[int] = set()
        self.nbytes = 0
        self.boxes: list[tuple[weakref.ref, int, int]] = []  # (box, storage address, storage bytes)

    def pack(self, t: torch.Tensor) -> _Saved:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        box = _Saved(t.detach())
        if ptr not in self.params:
            self.boxes.append((weakref.ref(box), ptr, storage.nbytes()))
            if ptr not in self.seen:
                self.seen.add(ptr)
                self.nbytes += storage.nbytes()
        return box

    def kept_bytes(self) -> int:
        """Bytes of the storages that the graph still holds (each once)."""
        kept = {ptr: n for box, ptr, n in self.boxes if box() is not None}
        return sum(kept.values())

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, _unpack)


def _unpack(box: _Saved) -> torch.Tensor:
    return box.tensor
