"""Optimizers: the ones a run can use, made by name, and the state each keeps per parameter.

    >>> opt = make_optimizer("adamw", model.parameters(), lr=0.01)   # doctest: +SKIP

The names are the planner's (`sim.model.footprint.OPTIMIZERS`, `sim.estimate(optimizer=)`),
and so is the default, AdamW. torch creates an optimizer's state in its first `step()`: SGD
without momentum keeps none; with momentum ("sgd-momentum", 0.9) one `momentum_buffer` of
each parameter's shape; Adam and AdamW keep two moments of each parameter's shape and dtype (`exp_avg`,
`exp_avg_sq`) and a scalar `step` tensor (float32, or float64 under a float64 default
dtype). `state_bytes` counts the tensors the optimizer holds, or, before its first step,
those that step will create, so that the memory of a step does not depend on whether
the optimizer has stepped yet.

Importing this module does not import torch (the command line reads `OPTIMIZERS` first).
torch's Adam family also keeps its scalar `step` (4 bytes a parameter tensor), which the
planner, counting bytes per parameter element, leaves out.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from sim.model.footprint import DEFAULT_OPTIMIZER, OPTIMIZERS as _NAMES

if TYPE_CHECKING:
    import torch

__all__ = ["OPTIMIZERS", "DEFAULT_OPTIMIZER", "MOMENTUM", "make_optimizer", "state_bytes", "expected_state_bytes"]

OPTIMIZERS = tuple(_NAMES)  # adamw (the default), adam, sgd, sgd-momentum
MOMENTUM = 0.9  # "sgd-momentum"'s


def make_optimizer(name: str, params: Iterable[torch.nn.Parameter], lr: float) -> torch.optim.Optimizer:
    """The optimizer `name` over `params`: `torch.optim.SGD` without momentum ("sgd") or with
    `MOMENTUM` ("sgd-momentum"), `torch.optim.Adam` or `torch.optim.AdamW` (torch's defaults)."""
    import torch
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if name == "sgd-momentum":
        return torch.optim.SGD(params, lr=lr, momentum=MOMENTUM)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr)
    raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {name!r}")


def _tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _scalar_bytes() -> int:
    """Bytes of the scalar `step` tensor torch's Adam family keeps per parameter."""
    import torch
    dtype = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
    return torch.empty((), dtype=dtype).element_size()


def expected_state_bytes(optimizer: torch.optim.Optimizer, param: torch.Tensor, group: dict) -> int:
    """Bytes of the state the first `step()` of `optimizer` creates for `param` (in
    `group`, one of its param_groups), as torch stores it."""
    import torch
    if isinstance(optimizer, torch.optim.SGD):
        return _tensor_bytes(param) if group.get("momentum", 0) else 0  # momentum_buffer
    if isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
        moments = 3 if group.get("amsgrad") else 2  # exp_avg, exp_avg_sq (, max_exp_avg_sq)
        return moments * _tensor_bytes(param) + _scalar_bytes()
    raise ValueError(f"cannot tell the state {type(optimizer).__name__} will keep before its first step; "
                     f"use one of {', '.join(OPTIMIZERS)} (exec.runtime.optim.make_optimizer)")


def state_bytes(optimizer: torch.optim.Optimizer, params: Iterable[torch.Tensor]) -> int:
    """Bytes of the optimizer's state for `params`: the tensors it holds for each one, or,
    for a parameter it has no state for yet, what its first step will create."""
    import torch
    groups = {id(p): g for g in optimizer.param_groups for p in g["params"]}
    total = 0
    for p in params:
        if id(p) not in groups:
            continue  # not optimized by this optimizer
        state = optimizer.state.get(p)
        if state:
            total += sum(_tensor_bytes(v) for v in state.values() if isinstance(v, torch.Tensor))
        else:
            total += expected_state_bytes(optimizer, p, groups[id(p)])
    return total
