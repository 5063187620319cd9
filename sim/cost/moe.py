"""One MoE layer's routed experts on one GPU as Megatron-Core runs them: the router, the permutations, the grouped GEMMs, expert tensor parallelism's collectives and the dispatch and combine all-to-alls.

A MoE layer (`sim.model.moe.Experts`) is a dense layer whose MLP is E routed experts, k a
token, beside S shared experts. `sim.cost.layer.layer_times(..., moe=True)` times its
attention, norms and residuals as a dense layer's, its shared experts as that layer's MLP
of width S*F (tensor-parallel like it, with its sequence-parallel all-gather and
reduce-scatter; Megatron-Core's `SharedExpertMLP`), and adds what this module times, from
Megatron-Core's MoE layer with `--moe-token-dispatcher-type alltoall` and
`--moe-grouped-gemm` (megatron/core/transformer/moe/moe_layer.py, router.py,
token_dispatcher.py `MoEAlltoAllTokenDispatcher`, experts.py `TEGroupedMLP`):

- **The tokens.** Each GPU routes its own T tokens: its micro-batch's b s/cp, split t ways
  by sequence parallelism (Megatron-Core requires sequence parallelism for a MoE layer under
  tensor parallelism, so tp > 1 without it is refused). Its k*T token copies go to the E
  experts, E/ep on each of the ep ranks of its expert-parallel group; the busiest rank
  receives k*T*`Experts.rank_load(ep)` copies (k*T when balanced).
- **The router** (router.py): one T x h by h x E GEMM (the logits, at the activations'
  precision), then in fp32 its score function (softmax or sigmoid) and the top-k with the
  routing map, memory-bound over the T x E scores.
- **Permutation** (moe_utils.py `permute`, `unpermute`, `sort_chunks_by_idxs`): the k*T copies
  gathered into expert order before the dispatch and scattered back (weighted) after the
  combine, and, with more than one local expert, the received copies sorted by local expert
  and back: a read and a write of each copy each way.
- **The experts** (experts.py `TEGroupedMLP`, Transformer Engine's `GroupedLinear`): two grouped
  GEMMs over the received copies, fc1 (h -> F, 2F gated) and fc2 (F -> h), each expert's
  matrices split `expert_tp` ways by F; the activation function between them, memory-bound
  over the copies' F. A grouped GEMM runs at the profile's `grouped_gemm_efficiency` of one
  plain GEMM of the same total shape (all the copies as its rows); FP8 under "fp8", as TE's
  Linear (`sim.cost.fp8`), with its casts.
- **Expert tensor parallelism** (`expert_tp` > 1): after the dispatch the received copies are
  all-gathered over the expert tensor-parallel group, and before the combine their outputs
  reduce-scattered (`dispatch_postprocess`, `combine_preprocess`); the backward runs the
  reverse pair. The group is taken inside one node (Megatron-Core folds ETP innermost).
- **The all-to-alls** (`dispatch_all_to_all`, `combine_all_to_all`) over the ep group
  (`Slice.expert_group`), timed by `sim.hardware.network.all_to_all_time` with the busiest
  rank's copies as the buffer, hidden-wide, at the activations' precision: BF16 under "fp8"
  too, since the alltoall dispatcher sends the hidden states as the attention leaves them and
  TE casts inside `GroupedLinear`, after the dispatch (the FP8 dispatch of DeepSeek-V3, Sec.
  3.3.2, is DeepEP's, not this dispatcher's). F runs the dispatch and the combine; the
  backward their gradients, all-to-alls of the same bytes; full recompute runs F's pair again
  in the backward. They are the layer's `a2a_forward` and `a2a_backward`, outside its passes
  (docs/rules.md, rule 18: the engine adds them, or hides them under a paired compute).

A layer of one expert routes nothing: no router, no permutation, no all-to-all; its expert is
a dense MLP (`dense_width`), as `sim.model.moe.Experts` counts it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from sim.hardware.kernels import elementwise_time, gemm_time, precision_bytes
from sim.hardware.network import all_to_all_time, collective_time, links_of
from sim.hardware.profile import DeviceProfile
from sim.hardware.topology import one_node
from sim.model.transformer import Transformer

from . import fp8
from .shapes import gemm_products
from .slice import Slice

_FP32 = 4  # the router's scores, probabilities and their gradients
# (name, bytes an element, tensor, memory-bound class) by pass. Tensors: "scores" T x E (fp32:
# not scaled by the activations' precision), "sent" this rank's k*T copies x h, "received" the
# copies its experts compute x h, "expert" their activation's output, copies x F.
_FORWARD = [("router_score", 2 * _FP32, "scores", "softmax"), ("router_topk", 2 * _FP32 + 1, "scores", "elementwise"),
            ("permute", 4, "sent", "copy"), ("sort_chunks", 4, "received", "copy"),
            ("unsort_chunks", 4, "received", "copy"), ("unpermute", 4, "sent", "copy")]
_BACKWARD = [("router_score", 3 * _FP32, "scores", "softmax"), ("router_topk", 2 * _FP32, "scores", "elementwise"),
             ("permute", 4, "sent", "copy"), ("sort_chunks", 4, "received", "copy"),
             ("unsort_chunks", 4, "received", "copy"), ("unpermute", 6, "sent", "copy")]  # + the probs' gradient
# The activation between the grouped GEMMs, forward and backward (as the dense MLP's, over F)
_ACTIVATION = {"gelu": (4, 6), "squared-relu": (4, 6), "swiglu": (6, 10)}


@dataclass(frozen=True)
class RoutedTimes:
    """Seconds one GPU spends on a MoE layer's routed part for one micro-batch: F and I by
    part ({"gemm", "memory", "collectives"}), W, one pass's all-to-alls (dispatch + combine),
    and the kernels each pass launches ({"F", "I", "W"}: `routed_kernels`)."""
    forward: dict
    backward_input: dict
    backward_weight: float
    all_to_all: float
    kernels: dict


def dense_width(m: Transformer) -> int:
    """The MLP width a MoE layer of `m` runs as ordinary tensor-parallel GEMMs: its shared
    experts' S*F, and its one expert's F too where it has one (nothing routed)."""
    x = m.moe
    return (x.shared_experts + (0 if x.routed else 1)) * x.expert_ffn


def layer_kinds(m: Transformer, first: int, count: int) -> tuple[int, int]:
    """How many of the `count` layers from layer `first` (0-based) are dense and how many MoE:
    a model's first `dense_layers` are dense, the rest MoE (all dense without experts). A stage
    that holds both sums `sim.cost.layer.layer_times` of each kind by these counts."""
    if first < 0 or count < 0 or first + count > m.layers:
        raise ValueError(f"layers {first}..{first + count - 1} are not among the model's {m.layers}")
    if m.experts is None:
        return count, 0
    dense = max(0, min(first + count, m.dense_layers) - first)
    return dense, count - dense


def routed_tokens(m: Transformer, x: Slice) -> int:
    """The tokens T one GPU routes per micro-batch: b s/cp, split by sequence parallelism."""
    if x.tp > 1 and not x.sequence_parallel:
        raise ValueError(f"a MoE layer under tp={x.tp} needs sequence_parallel=True (Megatron-Core: \"When using "
                         f"expert parallelism and tensor parallelism, sequence parallelism must be used\")")
    return x.tokens(m) // x.tp


def received_copies(m: Transformer, x: Slice) -> float:
    """Token copies the busiest rank's experts receive per micro-batch: k T rank_load(ep)."""
    e = m.moe
    return e.top_k * routed_tokens(m, x) * e.rank_load(x.ep)


def expert_gemm_shapes(m: Transformer, x: Slice) -> dict[str, tuple[int, int, int, int]]:
    """The forward matmuls of the routed part on the busiest rank, (m, n, k, batch): the router
    (T x h by h x E) and the grouped GEMMs as one plain GEMM of their total shape, all the
    copies it computes (gathered over expert tensor parallelism) as rows, F split by expert_tp."""
    e, h, etp = m.moe, m.hidden, x.expert_tp
    if e.expert_ffn % etp:
        raise ValueError(f"expert_tp={etp} does not divide expert_ffn {e.expert_ffn}")
    rows, f = math.ceil(received_copies(m, x) * etp), e.expert_ffn // etp
    return {"router": (routed_tokens(m, x), e.experts, h, 1), "fc1": (rows, (e.matrices - 1) * f, h, 1),
            "fc2": (rows, h, f, 1)}


def _gemm(dev: DeviceProfile, x: Slice, name: str, product: tuple) -> float:
    """A product's seconds: the router's at the activations' precision; an expert's grouped GEMM
    in FP8 under "fp8", at the profile's grouped-GEMM efficiency of the plain GEMM's rate."""
    if name == "router":
        return gemm_time(dev, x.activation_precision, *product)
    plain = fp8.linear_gemm_time(dev, *product) if x.precision == "fp8" else \
        gemm_time(dev, x.activation_precision, *product)
    return plain / (dev.grouped_gemm_efficiency or 1.0)


def _kernels(m: Transformer, x: Slice, scaling: str) -> dict[str, list]:
    """The routed part's memory-bound kernels by pass, (name, bytes, elements, class): the lists
    above, the activation, and under FP8 Transformer Engine's casts of each grouped GEMM's input
    (F) and output gradient (I) (`sim.cost.fp8.cast_kernels`' recipe)."""
    e, h = m.moe, m.hidden
    scale = precision_bytes(x.activation_precision) / 2
    copies = received_copies(m, x) * x.expert_tp
    size = {"scores": routed_tokens(m, x) * e.experts, "sent": e.top_k * routed_tokens(m, x) * h,
            "received": copies * h, "expert": received_copies(m, x) * e.expert_ffn}
    local = e.experts // x.ep > 1  # sort_chunks only with more than one local expert
    f_act, b_act = _ACTIVATION[m.mlp]
    out = {}
    for p, table, act in (("F", _FORWARD, f_act), ("I", _BACKWARD, b_act)):
        rows = [(n, per * (1 if t == "scores" else scale), size[t], c) for n, per, t, c in table
                if local or "chunks" not in n]
        rows.append(("activation", act * scale, size["expert"], "elementwise"))
        out[p] = rows
    if x.precision == "fp8":
        name, per, _ = fp8.cast_kernels(m, scaling)["F"][0]
        out["F"] += [(name, per, size["received"], "elementwise"), (name, per, size["expert"], "elementwise")]
        out["I"] += [(name, per, size["received"], "elementwise")] + \
                    [(name, per, size["expert"], "elementwise")] * (e.matrices - 1)
    return out


def routed_times(m: Transformer, dev: DeviceProfile, x: Slice) -> RoutedTimes | None:
    """The routed part of one MoE layer of `m` on the busiest rank of `x` (see the module's
    docstring); None where nothing is routed (one expert: a dense MLP, `dense_width`)."""
    if not m.moe.routed:
        return None
    products = {n: gemm_products(*s) for n, s in expert_gemm_shapes(m, x).items()}
    fwd, dx, dw = ({n: _gemm(dev, x, n, q[i]) for n, q in products.items()} for i in range(3))
    kernels = _kernels(m, x, dev.fp8_scaling)
    memory = {p: sum(elementwise_time(dev, per * n, c, n) for _, per, n, c in kernels[p]) for p in kernels}
    etp = 0.0
    if x.expert_tp > 1:
        gathered = received_copies(m, x) * x.expert_tp * m.hidden * precision_bytes(x.activation_precision)
        group, links = one_node(x.expert_tp), links_of(dev)
        etp = collective_time(links, "all_gather", gathered, group) + \
            collective_time(links, "reduce_scatter", gathered, group)
    buffer = received_copies(m, x) * m.hidden * precision_bytes(x.activation_precision)
    a2a = 2 * all_to_all_time(links_of(dev), buffer, x.expert_group)  # dispatch + combine
    return RoutedTimes(forward={"gemm": sum(fwd.values()), "memory": memory["F"], "collectives": etp},
                       backward_input={"gemm": sum(dx.values()), "memory": memory["I"], "collectives": etp},
                       backward_weight=sum(dw.values()), all_to_all=a2a,
                       kernels=routed_kernels(m, x, dev.fp8_scaling))


def routed_kernels(m: Transformer, x: Slice, scaling: str = "delayed") -> dict[str, int]:
    """Kernels the routed part launches per pass (F, I, W): its matmuls, its memory-bound
    kernels (FP8's casts of `scaling` among them), the two all-to-alls and, with expert tensor
    parallelism, its all-gather and reduce-scatter; none where nothing is routed."""
    if not m.moe.routed:
        return {"F": 0, "I": 0, "W": 0}
    kernels, gemms = _kernels(m, x, scaling), len(expert_gemm_shapes(m, x))
    launched = {p: sum(fp8.KERNELS_PER_CAST.get(n, 1) for n, *_ in kernels[p]) for p in kernels}
    collectives = 2 + 2 * (x.expert_tp > 1)
    return {"F": gemms + launched["F"] + collectives, "I": gemms + launched["I"] + collectives, "W": gemms}
