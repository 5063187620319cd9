"""A mixture-of-experts MLP as the planner sees it: the router, the routed and shared experts; their parameters, FLOPs and activation bytes.

A MoE layer replaces the dense MLP by E routed experts, each an MLP of width F with the
dense MLP's matrices, of which a router picks k per token, and S shared experts that every
token passes through (Shazeer et al. 2017; Fedus et al. 2021, Switch; Dai et al. 2024,
DeepSeekMoE, Sec. 3). The router is one h x E matrix (its logits, 2hE FLOPs a token); a layer
of one expert has nothing to choose, so it has no router and is a dense MLP.

    >>> x = Experts(experts=8, top_k=2, expert_ffn=14336, shared_experts=0, matrices=3)   # Mixtral 8x7B's layer
    >>> x.params(4096)["routed"] / 1e9, x.active_params(4096) / 1e9
    (1.409286144, 0.352354304)

Routing is balanced by default: each expert gets k*T/E of the T tokens (most published
throughputs force it: Megatron-Core's `--moe-router-force-load-balancing`, DeepSeek-V3's
auxiliary-loss-free balance). `load_imbalance` L is the busiest expert's tokens over that
mean (MaxVio + 1 of Wang et al. 2024, "Auxiliary-loss-free load balancing"), so 1 <= L <= E/k;
`capacity_factor` C drops what an expert gets beyond C times the mean (Fedus et al. 2021,
Sec. 2.2; Megatron-Core's `--moe-expert-capacity-factor`, without `--moe-pad-expert-input-to-capacity`).
FLOPs are the model's (k experts a token, nothing dropped: what MFU counts); imbalance and
dropping change what the busiest rank computes and keeps (`rank_load`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

_FP32 = 4  # the router's scores and the gates are fp32


def _count(owner: str, name: str, value, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        kind = "a positive int" if least == 1 else f"an int >= {least}"
        raise ValueError(f"{owner}: {name} must be {kind}, got {value!r}")


def moe_fields(experts: int | None, layers: int, ffn: int, given: dict) -> dict:
    """The MoE fields of a `sim.Transformer` of `layers` layers and dense MLP width `ffn`,
    those not `given` (None) set to their defaults: top_k 1, expert_ffn ffn, shared_experts 0,
    dense_layers 0, load_imbalance 1.0, capacity_factor None. ValueError if one is given
    without `experts`, or dense_layers leaves no MoE layer."""
    if experts is None:
        if any(v is not None for v in given.values()):
            named = ", ".join(n for n, v in given.items() if v is not None)
            raise ValueError(f"Transformer: {named} describe a mixture of experts; give experts= too")
        return {}
    defaults = dict(top_k=1, expert_ffn=ffn, shared_experts=0, dense_layers=0, load_imbalance=1.0)
    out = {n: defaults.get(n) if v is None else v for n, v in given.items()}
    n = out["dense_layers"]
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n < layers:
        raise ValueError(f"Transformer: dense_layers must be an int from 0 to layers-1 = {layers - 1} "
                         f"(at least one MoE layer), got {n!r}")
    return out


@dataclass(frozen=True)
class Experts:
    """One MoE layer's MLP: `experts` routed experts of width `expert_ffn`, `top_k` of them a
    token, `shared_experts` always-active experts of the same width, each of `matrices` weight
    matrices (the dense MLP's kind: 2, or 3 where gated)."""
    experts: int
    top_k: int
    expert_ffn: int
    shared_experts: int
    matrices: int
    load_imbalance: float = 1.0
    capacity_factor: float | None = None
    bias: bool = False  # each expert's matrices have biases (the arch's, as the dense MLP's)

    def __post_init__(self):
        owner = "Transformer"
        for name, least in (("experts", 1), ("top_k", 1), ("expert_ffn", 1), ("shared_experts", 0)):
            _count(owner, name, getattr(self, name), least)
        if self.top_k > self.experts:
            raise ValueError(f"{owner}: top_k {self.top_k} is more than the {self.experts} experts; "
                             f"use top_k <= experts")
        most = self.experts / self.top_k  # the busiest expert can take every token, once
        x = self.load_imbalance
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not 1 <= x <= most:
            raise ValueError(f"{owner}: load_imbalance (busiest expert's tokens over the mean) must be "
                             f"between 1 and experts/top_k = {most:g}, got {x!r}")
        c = self.capacity_factor
        if c is not None and (isinstance(c, bool) or not isinstance(c, (int, float)) or not 0 < c < math.inf):
            raise ValueError(f"{owner}: capacity_factor must be a positive number (or None: no token "
                             f"dropped), got {c!r}")

    @property
    def routed(self) -> bool:
        """Whether there is anything to route: more than one expert."""
        return self.experts > 1

    def expert_params(self, hidden: int) -> int:
        """One expert's weights: `matrices` h x F matrices, and one bias per output feature where
        `bias` (as the dense MLP's)."""
        f = self.expert_ffn
        return self.matrices * hidden * f + ((self.matrices - 1) * f + hidden if self.bias else 0)

    def params(self, hidden: int) -> dict[str, int]:
        """The layer's MLP parameters by part: the router (h x E; none for one expert), the
        routed and the shared experts."""
        return {"router": hidden * self.experts if self.routed else 0,
                "routed": self.experts * self.expert_params(hidden),
                "shared": self.shared_experts * self.expert_params(hidden)}

    def active_params(self, hidden: int) -> int:
        """What one token uses of them: the router, k routed and the shared experts."""
        p = self.params(hidden)
        return p["router"] + (self.top_k + self.shared_experts) * self.expert_params(hidden)

    def flops(self, tokens: int, hidden: int) -> dict[str, float]:
        """Forward FLOPs of the layer's MLP over `tokens` tokens (2 a multiply-add): the router's
        logits 2ThE, the k routed experts' matrices 2Tkh F each, the shared ones' 2ThSF each; the
        input matrices (one, or two where gated) apart from the output one, as the dense MLP's."""
        t, h, f, m, s = tokens, hidden, self.expert_ffn, self.matrices, self.shared_experts
        return {"router": 2 * t * h * self.experts if self.routed else 0,
                "experts_in": 2 * t * self.top_k * h * f * (m - 1), "experts_out": 2 * t * self.top_k * h * f,
                "shared_in": 2 * t * s * h * f * (m - 1), "shared_out": 2 * t * s * h * f}

    def rank_load(self, ep: int = 1) -> float:
        """The token copies the busiest of `ep` expert-parallel ranks computes, over the k*T of a
        balanced rank (T: the tokens each rank routes). Its n = E/ep experts are the busiest
        one (L times the mean, or C if it drops beyond C) and n-1 at the mean; no expert keeps
        more than C times the mean; and no rank gets more than the ep ranks' tokens, all of
        them: min((n - 1 + min(L, C))/n, C, ep). 1 for balanced routing."""
        _count("Experts.rank_load", "ep", ep, 1)
        if self.experts % ep:
            raise ValueError(f"ep={ep} does not divide the {self.experts} experts; use ep in "
                             f"{[d for d in range(1, self.experts + 1) if self.experts % d == 0]}")
        n, cap = self.experts // ep, math.inf if self.capacity_factor is None else self.capacity_factor
        return min((n - 1 + min(self.load_imbalance, cap)) / n, cap, ep)

    def activation_bytes(self, tokens: int, hidden: int, element: int, ep: int = 1) -> dict[str, float]:
        """Bytes the layer's MLP keeps for its backward on the busiest expert-parallel rank, per
        micro-batch of `tokens` tokens, as Megatron-Core's alltoall dispatcher and grouped
        experts keep them (tensor and expert tensor parallelism 1), beside the MLP input that
        the dense layer's count has already. `element`: bytes of an activation.
        - "router": the router's fp32 scores (its softmax or sigmoid keeps its output, T x E;
          `--moe-router-dtype fp32`) and the routing map the permutation keeps (T x E, 1 byte);
        - "permuted": the k*T*load token copies the experts receive (`rank_load`), the input
          of their first grouped GEMM (the permutation and the all-to-alls keep only indices);
        - "experts": their intermediate, `matrices` tensors of F per copy as the dense MLP's
          (SwiGLU: its two inputs and product), and each copy's fp32 gate, which Megatron-Core
          multiplies in with the activation (`weighted_bias_swiglu`): the combine keeps nothing;
        - "shared": the shared experts' intermediate, T tokens of width S*F.
        One expert (nothing routed) is a dense MLP: only its intermediate."""
        t, f, m = tokens, self.expert_ffn, self.matrices
        shared = element * t * self.shared_experts * f * m
        if not self.routed:
            return {"router": 0, "permuted": 0, "experts": element * t * f * m, "shared": shared}
        copies = self.top_k * t * self.rank_load(ep)
        return {"router": (_FP32 + 1) * t * self.experts, "permuted": element * copies * hidden,
                "experts": copies * (element * f * m + _FP32), "shared": shared}
