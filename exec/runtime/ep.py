"""Expert parallelism folded into data parallelism, as Megatron-Core folds it: the ep and edp groups, and the expert gradients' reduction.

    >>> expert_groups(dp=4, ep=2)          # (ep groups, edp groups) of replica indices
    ([(0, 1), (2, 3)], [(0, 2), (1, 3)])

A run of `dp` replicas (`exec.runtime.dp`) computes the dense part of each stage (attention,
norms, router, shared experts, embedding, head) data-parallel over all dp replicas; the
routed experts of its MoE layers are spread over ep of them and replicated over the other
edp = dp / ep (attention on dp, experts on ep x edp of the same ranks: Megatron-Core's
parallel folding with tp = cp = etp = 1). The replicas of an ep group are adjacent (ep
fastest, as Megatron-Core's expert rank order etp-ep-dp has it): replica d is ep rank
d mod ep of group d // ep, and its edp group holds the replicas with the same ep rank.

Gradients: a dense parameter's are averaged over the dp replicas, an expert's are summed
over its edp group and divided by dp, both by the stage's REDUCE_GRAD
(`split_parameters`; `exec.runtime.dp.CollectiveStream`, two all-reduces side by side):
the expert rank already holds the sum, over its ep group, of the
gradients the group's replicas' tokens sent it (the backward of the all-to-all brings them
back), each of a loss that is its replica's mean; so the step's gradient, the mean over all
dp replicas, is the sum over the edp group over dp.
"""
from __future__ import annotations

import re

from torch import nn

from exec.models.moe import is_expert_param

__all__ = ["expert_groups", "check_ep", "split_parameters", "holds_expert"]


def check_ep(ep: int, dp: int, experts: int | None) -> None:
    """ValueError unless `ep` is a positive integer dividing `dp` and, where ep > 1, the
    model's `experts`."""
    if isinstance(ep, bool) or not isinstance(ep, int) or ep < 1:
        raise ValueError(f"ep must be an integer >= 1 (the ranks a MoE layer's experts are spread over), got {ep!r}")
    if ep == 1:
        return
    if experts is None:
        raise ValueError(f"ep={ep} spreads experts over ranks, but the model has none; give it experts "
                         f"(ModelSpec('gpt', experts=E), --experts E)")
    if dp % ep:
        raise ValueError(f"ep={ep} must divide dp={dp}: the expert-parallel ranks are data-parallel replicas "
                         f"(experts on ep x edp of the dp ranks); use dp a multiple of ep")
    if experts % ep:
        raise ValueError(f"ep={ep} must divide the {experts} experts; use ep in "
                         f"{[d for d in range(1, experts + 1) if experts % d == 0 and dp % d == 0]}")


def expert_groups(dp: int, ep: int) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
    """The replica indices of every ep group (adjacent replicas) and every edp group (the
    replicas with the same ep rank), each list in ascending order."""
    eps = [tuple(range(g * ep, (g + 1) * ep)) for g in range(dp // ep)]
    edps = [tuple(range(r, dp, ep)) for r in range(ep)]
    return eps, edps


def split_parameters(module: nn.Module, ep: int) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """The parameters of `module` that REDUCE_GRAD averages over dp, and the routed experts'
    (`exec.models.moe.is_expert_param`) that it sums over edp and divides by dp: with
    ep = 1 every parameter is of the first kind (the experts are on every replica)."""
    named = list(module.named_parameters())
    if ep == 1:
        return [p for _, p in named], []
    return [p for n, p in named if not is_expert_param(n)], [p for n, p in named if is_expert_param(n)]


_EXPERT = re.compile(r"(?:^|\.)experts\.(\d+)\.")


def holds_expert(name: str, experts: int, ep: int, ep_rank: int) -> bool:
    """Whether ep rank `ep_rank` of `ep` holds the parameter `name` of the whole model: any
    parameter but a routed expert's, and the experts ep_rank * E/ep .. (ep_rank + 1) * E/ep - 1."""
    found = _EXPERT.search(name)
    if found is None:
        return True
    n = experts // ep
    return ep_rank * n <= int(found.group(1)) < (ep_rank + 1) * n
