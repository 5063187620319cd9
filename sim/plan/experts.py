"""Expert parallelism in the planner: Megatron-Core's folding of the experts onto a layout's ranks, its checks, and what each stage's experts hold and reduce.

Megatron-Core's MoE parallel folding (`initialize_model_parallel`: a second `RankGenerator` for
the expert layers) runs a MoE layer's attention on the stage's tp x cp x dp ranks and its
routed experts on the same ranks split another way, expert_tp x ep x edp:

    edp = tp * cp * dp / (expert_tp * ep)

`ep` ranks hold E/ep experts each (the all-to-all group, `Topology.group("ep")`), `expert_tp`
ranks split each expert's matrices (Megatron-Core's `--expert-tensor-parallel-size`; 1 here by
default, as NeMo's MoE recipes set it), and the `edp` replicas of an expert reduce its gradients
(`Topology.group("edp")`) and shard its distributed-optimizer state. Everything else of the
layer (attention, norms, the router, the shared experts: Megatron-Core's `SharedExpertMLP` is a
tensor-parallel MLP) is a dense parameter: split over tp, reduced and sharded over dp x cp. The
first `dense_layers` layers of the model are dense layers.

    >>> from sim.model.registry import find_model
    >>> from sim.plan.layout import Layout
    >>> lay = Layout(tp=2, pp=8, dp=32, ep=64, sequence_parallel=True)
    >>> lay.edp, moe_layers(find_model("deepseek-v3-671b"), [8, 8, 8, 7, 7, 7, 8, 8])[:2]
    (1, [5, 8])
"""
from __future__ import annotations

from sim.cost.data_parallel import bucketed_tail, buckets, reduce_group, shard_size, stage_params
from sim.cost import fp8
from sim.hardware.kernels import memory_time, precision_bytes
from sim.hardware.network import collective_time, links_of
from sim.hardware.profile import DeviceProfile
from sim.model.footprint import optimizer_step_bytes, state_bytes_per_param
from sim.model.transformer import Transformer

GATE_BYTES = 4  # each token copy's routing weight, fp32 (sim.model.moe)


def check_experts(model: Transformer, lay) -> None:
    """ValueError, one line naming the fix, for expert parallelism Megatron-Core refuses: ep or
    expert_tp on a dense model; ep not dividing the experts; expert_tp x ep not dividing the
    tp x cp x dp ranks of a stage; expert_tp not dividing an expert's width; a MoE model with
    tp > 1 and no sequence parallelism (Megatron-LM's arguments: "When using MoE and tensor
    parallelism, sequence parallelism must be used"). Also what the planner does not model:
    ZeRO 2 and 3 with experts (Megatron-Core's distributed optimizer is zero=1)."""
    for name in ("ep", "expert_tp"):
        value = getattr(lay, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if model.moe is None:
        if lay.ep > 1 or lay.expert_tp > 1:
            raise ValueError(f"ep={lay.ep}, expert_tp={lay.expert_tp} split the experts of a mixture of experts; "
                             f"the model is dense (experts=None): use ep=1, expert_tp=1")
        return
    ranks = lay.tp * lay.cp * lay.dp
    if model.experts % lay.ep:
        raise ValueError(f"ep={lay.ep} does not divide the model's {model.experts} experts; use ep in "
                         f"{expert_sizes(model, ranks, lay.expert_tp)}")
    if ranks % (lay.expert_tp * lay.ep):
        raise ValueError(f"expert_tp x ep = {lay.expert_tp} x {lay.ep} does not divide the tp x cp x dp = {ranks} "
                         f"ranks of a stage that the experts fold onto; use ep in "
                         f"{expert_sizes(model, ranks, lay.expert_tp)}")
    if model.expert_ffn % lay.expert_tp:
        raise ValueError(f"expert_tp={lay.expert_tp} does not divide an expert's width {model.expert_ffn}")
    if lay.tp > 1 and not lay.sequence_parallel:
        raise ValueError(f"tp={lay.tp} on a mixture of experts needs sequence_parallel=True (Megatron-Core "
                         f"refuses MoE with tensor parallelism and no sequence parallelism)")
    if lay.zero >= 2:
        raise ValueError(f"zero={lay.zero} with experts is not modelled: the planner shards expert state as "
                         f"Megatron-Core's distributed optimizer does (zero <= 1)")


def expert_sizes(model: Transformer, ranks: int, expert_tp: int = 1) -> list[int]:
    """The ep that fold onto `ranks` ranks a stage with `expert_tp`: divisors of the experts
    with expert_tp x ep dividing the ranks."""
    return [e for e in range(1, model.experts + 1) if model.experts % e == 0 and ranks % (expert_tp * e) == 0]


def moe_layers(model: Transformer, layers: list[int]) -> list[int]:
    """How many of each stage's layers (`layers`, in model order) are MoE layers: all but the
    model's first `dense_layers` (as `sim.cost.moe.layer_kinds`; here also for more layers than
    the model has, as the balanced partition's memory caps try)."""
    if model.moe is None:
        return [0] * len(layers)
    starts = [sum(layers[:s]) for s in range(len(layers))]
    return [n - max(0, min(first + n, model.dense_layers) - first) for first, n in zip(starts, layers)]


def split_params(model: Transformer, layers: list[int], lay, placement) -> tuple[list[float], list[float]]:
    """Per stage, the dense and the expert parameters one GPU holds: `stage_params`'s count with
    each MoE layer's dense part (attention, norms, router, shared experts) over tp, and its
    routed experts over ep x expert_tp."""
    dense = stage_params(model, layers, lay.tp, placement)
    if model.moe is None:
        return dense, [0.0] * len(layers)
    (shared, experts), moe = moe_layer_params(model, lay), moe_layers(model, layers)
    dense_mlp = shared - model.params().per_layer / lay.tp  # a MoE layer's dense part less a dense layer's
    return ([d + k * dense_mlp for d, k in zip(dense, moe)],
            [k * experts for k in moe])


def moe_layer_params(model: Transformer, lay) -> tuple[float, float]:
    """One MoE layer's parameters on one GPU: its dense part over tp, its routed experts over
    ep x expert_tp."""
    routed = model.moe.params(model.hidden)["routed"]
    return (model.params().per_moe_layer - routed) / lay.tp, routed / (lay.ep * lay.expert_tp)


def state_bytes(lay, dense: list[float], expert: list[float]) -> dict[str, list[float]]:
    """Per stage, bytes of weights, gradients and optimizer state on one GPU: the dense
    parameters' sharded over dp x cp (ZeRO's `shard_size`), the experts' over edp (`expert_shard`)."""
    per_dense = state_bytes_per_param(lay.precision, lay.zero, shard_size(lay), lay.optimizer)
    per_expert = state_bytes_per_param(lay.precision, lay.zero, expert_shard(lay), lay.optimizer)
    return {k: [d * per_dense[k] + e * per_expert[k] for d, e in zip(dense, expert)] for k in per_dense}


def expert_shard(lay) -> int:
    """The replicas of an expert, which reduce its gradients and shard its optimizer state: edp,
    and with k copies of the model (DualPipe) the k edp of its copies (`sim.cost.data_parallel.reduce_group`)."""
    return lay.edp * lay.pipelines


def layer_activations(model: Transformer, lay, precision: str) -> tuple[float, float, float]:
    """Bytes one GPU keeps per micro-batch of one layer of `model` (its sequence s/cp: the cost
    layer's `per_rank`), activations of `precision`: a dense layer's for its backward, what its W
    still needs after I (MLA's: all of them, an upper bound: `Transformer.w_activation_bytes_per_layer`
    does not count MLA's), and a MoE layer's (0 for a dense model; all of them kept until W).
    Under FP8 less the Linears' inputs TE saves in FP8 (`sim.cost.fp8.saved_bytes_saving`;
    a MoE layer's attention only, its experts' FP8 inputs not counted: an upper bound)."""
    b, tp, sp, recompute = lay.micro_batch, lay.tp, lay.sequence_parallel, lay.recompute
    dense = model.activation_bytes_per_layer(b, tp, sp, recompute, precision)
    saving = fp8.saved_bytes_saving(model, b, tp, sp, recompute) if lay.precision == "fp8" else 0.0
    act = dense - saving
    w = act if model.mla is not None else model.w_activation_bytes_per_layer(b, tp, sp, precision, recompute)
    if model.moe is None:
        return act, w, 0.0
    mlp_out = model.seq * b * model.ffn / tp if saving else 0.0  # the dense MLP-out input's share of the saving
    return act, w, moe_layer_activations(model, lay, dense, precision) - (saving - mlp_out)


def moe_layer_activations(model: Transformer, lay, dense_bytes: float, precision: str) -> float:
    """Bytes one MoE layer keeps per micro-batch on one GPU, given `dense_bytes`, a dense layer's
    (`Transformer.activation_bytes_per_layer` of `model`, its sequence s/cp): those less the
    dense MLP's intermediate (its m sbf/t tensors, Korthikanti et al. 2022, Sec. 4.1), plus
    the experts' (`sim.model.moe.Experts.activation_bytes`) on the b s/(cp t) tokens this rank
    routes (sequence parallel), its expert_tp ranks each receiving every copy of a token (the
    all-gather of Megatron-Core's dispatcher) with 1/expert_tp of each expert's width. Full
    recompute keeps the layer's input only, as a dense layer."""
    if lay.recompute == "full":
        return dense_bytes
    element, tokens = precision_bytes(precision), model.seq * lay.micro_batch  # s/cp already
    mlp = element * tokens * model.ffn * model.mlp_matrices / lay.tp
    parts = model.moe.activation_bytes(tokens // lay.tp, model.hidden, element, lay.ep)
    copies = parts["permuted"] / (element * model.hidden)  # token copies one expert_tp rank of them receives
    gathered = (lay.expert_tp - 1) * (parts["permuted"] + GATE_BYTES * copies)  # the other ranks' copies, gates
    return dense_bytes - mlp + sum(parts.values()) + gathered


def dispatch_buffers(model: Transformer, lay, placement, sparse: list[int], precision: str) -> tuple[float, ...]:
    """Per stage, the alltoall dispatcher's working buffers while a MoE layer runs, once a device
    (on its first stage that has MoE layers; a layer at a time runs): the k T copies the rank
    permutes and sends and the k T r copies it receives (gathered over expert_tp), h wide, at
    `precision` (`model`: its sequence s/cp). Freed after the layer; counted held for the step."""
    if model.moe is None:
        return (0.0,) * len(sparse)
    element, tokens = precision_bytes(precision), model.seq * lay.micro_batch // lay.tp
    sent = element * model.top_k * tokens * model.hidden
    received = lay.expert_tp * model.moe.activation_bytes(tokens, model.hidden, element, lay.ep)["permuted"]
    first = {}
    for s, (r, k) in enumerate(zip(placement, sparse)):
        if k:
            first.setdefault(r, s)
    return tuple(sent + received if first.get(r) == s else 0.0 for s, r in enumerate(placement))


def fp8_copy_bytes(model: Transformer, lay, layers: int, moe: int) -> float:
    """Bytes of TE's FP8 weight copies on one GPU for a stage of `layers` layers, `moe` of them
    MoE layers: the dense layers' (`sim.cost.fp8.weight_copy_bytes`), and each MoE layer's
    weights, 2 bytes each (its norms and router, under 0.01 %, counted with them)."""
    dense = fp8.weight_copy_bytes(model, layers - moe, lay.tp)
    return dense + 2 * moe * sum(moe_layer_params(model, lay)) if moe else dense


def expert_reduce_times(g: DeviceProfile, lay, expert: list[float], backward: list[float] | None = None,
                        dense: list[float] | None = None) -> list[float]:
    """Per stage, the reduction of its expert gradients over the edp group (Megatron-Core keeps
    them in a buffer of their own, reduced over the expert data-parallel group): an all-reduce
    (zero=0) or a reduce-scatter and, after the optimizer, an all-gather (zero=1). It runs on
    the collective stream after the dense reduction (`dense`, seconds a stage, unhidden);
    with `backward` (per stage, overlap_grad_reduce with a stage a device) its buckets hide
    under what of the backward the dense reduction leaves (`bucketed_tail`). With two copies of the
    model (DualPipe), over both copies' edp groups (`sim.cost.data_parallel.reduce_group`)."""
    if not any(expert):
        return [0.0] * len(expert)
    grad = state_bytes_per_param(lay.precision)["grads"]
    links, group = links_of(g), reduce_group(lay, "edp")
    out = []
    for s, p in enumerate(expert):
        reduce = collective_time(links, "all_reduce" if lay.zero == 0 else "reduce_scatter", p * grad, group)
        if backward is not None:
            reduce = bucketed_tail(reduce, max(0.0, backward[s] - dense[s]), buckets(p, expert_shard(lay)))
        out.append(reduce + (collective_time(links, "all_gather", p * grad, group) if lay.zero else 0.0))
    return out


def moe_optimizer_time(model: Transformer, g: DeviceProfile, lay, layers: list[int], placement) -> float:
    """`sim.cost.data_parallel.optimizer_time` for a mixture of experts: the step over what the
    fullest device updates, its dense parameters (1/(dp cp) of them under ZeRO) and its experts'
    (1/edp), and under FP8 the casts of the dense layers' and the experts' weights."""
    dense, expert = split_params(model, layers, lay, placement[:len(layers)])
    share, expert_share = (shard_size(lay), expert_shard(lay)) if lay.zero >= 1 else (1, 1)
    updated, held, n = [0.0] * lay.pp, [0.0] * lay.pp, len(layers)
    for s, r in enumerate(placement):  # with k copies of the model, `layers` are one copy's stages
        updated[r] += dense[s % n] / share + expert[s % n] / expert_share
        held[r] += dense[s % n] + expert[s % n]
    step = memory_time(g, max(updated) * optimizer_step_bytes(lay.precision, lay.optimizer), "optimizer")
    per_param = fp8.weight_cast_bytes(model, 1) / model.params().per_layer  # bytes a Linear weight's cast moves
    return step + (memory_time(g, max(held) * per_param) if lay.precision == "fp8" else 0.0)


def expert_all_to_alls(moe, counts: list[int]) -> dict:
    """`Costs.a2a_forward` and `a2a_backward` per stage: its MoE layers' (`counts`) dispatch and
    combine all-to-alls, `LayerTimes.a2a_forward` and `a2a_backward` each (none for a dense model),
    which the engine adds to an unpaired compute and hides in an overlapped pair (docs/rules.md, rule 18)."""
    if moe is None:
        return {}
    return {"a2a_forward": tuple(k * moe.a2a_forward for k in counts),
            "a2a_backward": tuple(k * moe.a2a_backward for k in counts)}
