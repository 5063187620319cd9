"""A top-k mixture-of-experts MLP in torch: router, experts, and the token dispatch over expert-parallel ranks by all-to-all.

`MoE` is the MLP of a MoE layer as `sim.model.moe.Experts` counts it (one definition,
principle 2): a router (one h x E matrix, no bias), E routed experts and S shared experts,
each a GeLU MLP of width `expert_ffn` with biases, as exec's dense GPT MLP:

    >>> moe = MoE(hidden=8, experts=4, top_k=2, expert_ffn=16)
    >>> moe(torch.randn(3, 5, 8)).shape
    torch.Size([3, 5, 8])

Routing (Mixtral, Jiang et al. 2024, Eq. 1; Megatron-Core's default,
`moe_router_pre_softmax=False`): each token's k largest router logits are chosen, and its
gates are the softmax over those k alone, so they sum to 1 (with k = 1 the gate is 1, and
the router gets no gradient: Switch's gate differs). One expert has nothing to route: no
router, gate 1, a dense MLP. The output is the gated sum of the token's k experts plus the
shared experts' outputs (DeepSeekMoE, Dai et al. 2024, Eq. 3-5). Nothing is dropped: no
capacity factor here, and the routing is whatever the router decides, so
`sim.Transformer.load_imbalance` (a planner's assumption) has no counterpart.

Expert parallelism (`MoE.expert_parallel(group)`): each of the group's ep ranks keeps E/ep
consecutive experts (rank r: experts r*E/ep .. (r+1)*E/ep - 1; the others are deleted), and
a forward moves tokens as Megatron-Core's alltoall token dispatcher does
(`megatron/core/transformer/moe/token_dispatcher.py`): the k copies of each token are
sorted by expert (permute); every rank tells every other how many copies it sends to each
of its experts (an all-to-all of E counts, the split sizes); the copies go to their
experts' ranks (`all_to_all_single` with those splits: gloo has it, uneven splits
included, in torch 2.13); each rank regroups what it received by local expert, runs its
experts, and sends the results back the same way reversed (combine); the source rank
multiplies in the gates and adds each token's k results (unpermute). Without a group every
expert runs here: the one-process reference. Parameter names keep the global expert index
(`experts.5.fc1.weight` on every rank that holds expert 5), so a rank's gradients compare
by name with one process's.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

__all__ = ["Expert", "Router", "MoE", "AllToAll", "expert_parallel", "is_expert_param"]


class Expert(nn.Module):
    """One expert: Linear(GELU(Linear(x))), h -> F -> h, with biases (exec's GPT MLP)."""

    def __init__(self, hidden: int, ffn: int):
        super().__init__()
        self.fc1 = nn.Linear(hidden, ffn)
        self.fc2 = nn.Linear(ffn, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Router(nn.Module):
    """Top-k routing: (T, h) tokens -> their k experts (T, k) and gates (T, k), the softmax
    of the k chosen logits (they sum to 1 per token)."""

    def __init__(self, hidden: int, experts: int, top_k: int):
        super().__init__()
        self.top_k = top_k
        self.gate = nn.Linear(hidden, experts, bias=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        chosen_logits, chosen = self.gate(x).topk(self.top_k, dim=-1)
        return torch.softmax(chosen_logits, dim=-1), chosen


class AllToAll(torch.autograd.Function):
    """`all_to_all_single` over `group` with autograd: the forward sends `in_splits[r]` rows
    of `x` to rank r and receives `out_splits[r]` rows from it; the backward sends the
    gradients back along the same routes, the splits swapped (Megatron-Core's `_AllToAll`)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, out_splits: list[int], in_splits: list[int], group) -> torch.Tensor:
        ctx.splits, ctx.group = (out_splits, in_splits), group
        return _exchange(x, out_splits, in_splits, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        out_splits, in_splits = ctx.splits
        return _exchange(grad, in_splits, out_splits, ctx.group), None, None, None


def _exchange(x: torch.Tensor, out_splits: list[int], in_splits: list[int], group) -> torch.Tensor:
    out = x.new_empty((sum(out_splits), *x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
    return out


class MoE(nn.Module):
    """A MoE layer's MLP: router, `experts` routed experts (`top_k` a token) and
    `shared_experts` shared ones, all of width `expert_ffn` (see the module docstring)."""

    def __init__(self, hidden: int, experts: int, top_k: int, expert_ffn: int, shared_experts: int = 0):
        super().__init__()
        if not 1 <= top_k <= experts:
            raise ValueError(f"MoE: top_k must be between 1 and experts = {experts}, got {top_k}")
        self.num_experts, self.top_k = experts, top_k
        self.router = Router(hidden, experts, top_k) if experts > 1 else None
        self.experts = nn.ModuleDict({str(e): Expert(hidden, expert_ffn) for e in range(experts)})
        self.shared = nn.ModuleList(Expert(hidden, expert_ffn) for _ in range(shared_experts))
        self.ep_group, self.ep, self.ep_rank = None, 1, 0

    def expert_parallel(self, group) -> None:
        """Keep only this rank's E/ep experts of the `group` (ep ranks) and dispatch to the
        others' by all-to-all; call it on every rank of the group with the same weights."""
        ep, rank = dist.get_world_size(group), dist.get_rank(group)
        if self.num_experts % ep or len(self.experts) != self.num_experts:
            raise ValueError(f"MoE.expert_parallel: ep={ep} must divide the {self.num_experts} experts, "
                             f"and the layer must hold them all (it holds {len(self.experts)})")
        n = self.num_experts // ep
        for e in range(self.num_experts):
            if not rank * n <= e < (rank + 1) * n:
                del self.experts[str(e)]
        self.ep_group, self.ep, self.ep_rank = group, ep, rank

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(gates, chosen experts), each (T, k), of the (T, h) tokens `x`."""
        if self.router is None:
            ones = x.new_ones(x.shape[0], 1)
            return ones, torch.zeros(x.shape[0], 1, dtype=torch.long, device=x.device)
        return self.router(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape, x = x.shape, x.reshape(-1, x.shape[-1])
        gates, chosen = self.route(x)
        order = chosen.reshape(-1).argsort(stable=True)  # the token copies, sorted by expert (permute)
        token = order // chosen.shape[1]
        counts = torch.bincount(chosen.reshape(-1), minlength=self.num_experts)
        copies = x[token]
        done = self.run_local(copies, counts) if self.ep_group is None else self.dispatch(copies, counts)
        weighted = done * gates.reshape(-1)[order].unsqueeze(1)
        y = torch.zeros_like(x).index_add(0, token, weighted)  # each token's gated sum (unpermute)
        for expert in self.shared:
            y = y + expert(x)
        return y.reshape(shape)

    def run_local(self, copies: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Every expert on its rows of `copies` (sorted by expert, `counts` rows each)."""
        parts = copies.split(counts.tolist())
        return torch.cat([self.experts[str(e)](part) for e, part in enumerate(parts)])

    def dispatch(self, copies: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Send the copies to their experts' ranks, run this rank's experts on what arrives,
        and bring the results back (rows in the order of `copies`)."""
        ep, n, group = self.ep, self.num_experts // self.ep, self.ep_group
        arriving = torch.empty_like(counts)  # arriving[src * n + j]: copies from rank src for local expert j
        dist.all_to_all_single(arriving, counts, group=group)  # the split sizes first
        send = counts.view(ep, n).sum(1).tolist()
        grid = arriving.view(ep, n).tolist()
        receive = [sum(row) for row in grid]
        got = AllToAll.apply(copies, receive, send, group).split([c for row in grid for c in row])
        first = self.ep_rank * n
        outs = [self.experts[str(first + j)](torch.cat([got[src * n + j] for src in range(ep)]))
                for j in range(n)]  # regrouped by local expert
        pieces = [out.split([grid[src][j] for src in range(ep)]) for j, out in enumerate(outs)]
        back = torch.cat([pieces[j][src] for src in range(ep) for j in range(n)])  # by source rank again
        return AllToAll.apply(back, send, receive, group)


def expert_parallel(modules, group) -> None:
    """`MoE.expert_parallel(group)` for every MoE layer inside `modules` (an iterable of
    torch modules); nothing where there is none or `group` is None."""
    if group is None:
        return
    for module in modules:
        for m in module.modules():
            if isinstance(m, MoE):
                m.expert_parallel(group)


def is_expert_param(name: str) -> bool:
    """Whether the parameter `name` (as `named_parameters` spells it) belongs to a routed
    expert: sharded by ep, its gradient reduced over the expert data-parallel ranks."""
    return ".experts." in f".{name}"
