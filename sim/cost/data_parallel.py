"""What data parallelism and the optimizer step cost one GPU: the parameters each stage holds,
the reduction of their gradients over the replicas, ZeRO-3's gathers, and the optimizer's step.

`sim.estimate` puts the reductions on the step as REDUCE_GRAD actions (with one stage a device
and overlap_grad_reduce, only what the last backward does not hide bucket by bucket:
`bucketed_tail`), ZeRO-3 as FSDP's UNSHARD and RESHARD actions (`fsdp_as_actions`; with
pp = 1 what the gathers and reduce-scatters leave exposed goes into each micro-batch's passes:
`fsdp_layer_exposure` with the layer as FSDP's unit, `zero3_times` with the stage), and the
optimizer step after the pipeline flush. What they read of the
run's layout is a `Parallelism` (the planner's `sim.plan.layout.Layout` is one: its tp, dp, pp,
cp, ZeRO stage, precision, optimizer, and nodes, `topology`, which says how each data-parallel group sits on
them); collectives are timed by `sim.hardware.network`. With context parallelism the replicas
of a parameter are dp x cp (each cp rank computes gradients of its s/cp tokens): gradients are
reduced, and ZeRO shards, over the "dp_cp" group (Megatron-Core's data-parallel group with
context parallel), which is the "dp" group where cp = 1. With k copies of the model
(`Parallelism.pipelines`; DualPipe: 2, stage i of one copy and stage P-1-i of the other on
device i), the replicas of a stage are k dp x cp, on its devices i and P-1-i: they reduce as
one group (`reduce_group`) and ZeRO shards over all of them (`shard_size`).
"""
from __future__ import annotations

import math
from typing import Protocol

from sim.model.footprint import optimizer_step_bytes, state_bytes_per_param
from sim.hardware.profile import DeviceProfile
from sim.hardware.kernels import memory_time
from sim.hardware.network import collective_time, links_of
from sim.hardware.topology import Group, Topology, one_node
from sim.model.transformer import ARCHS, Transformer
from .fp8 import weight_cast_bytes


class Parallelism(Protocol):
    """What these costs read of a run's parallel layout (`sim.plan.layout.Layout` is one)."""
    tp: int
    pp: int
    dp: int
    cp: int
    zero: int
    precision: str
    fsdp_shard: int | None  # HSDP's shard group (None: all the dp x cp replicas)
    fsdp_unit: str  # what FSDP gathers at once: "layer" or "stage" (FSDP_UNITS)
    reshard_after_forward: bool
    optimizer: str  # a name of sim.model.footprint.OPTIMIZERS
    pipelines: int  # the copies of the model its schedule holds (`sim.Schedule.pipelines`; DualPipe: 2)

    def topology(self) -> Topology:
        """Where the run's GPUs sit and which links its groups use (`sim.hardware.topology`)."""


def stage_params(m: Transformer, layers: list[int], tp: int, placement) -> list[float]:
    """Parameters one GPU holds for each stage: its layers' share over tp, the embedding on
    the first stage, the final norm and the output layer on the last. A tied output layer
    is the embedding itself where the first and last stage share a device, else a second
    copy of the word embedding (Megatron-LM keeps one on each end of the pipeline and
    all-reduces their gradients: Shoeybi et al. 2019; Narayanan et al. 2021, Sec. 5)."""
    p = m.params()
    out = [n * p.per_layer / tp for n in layers]
    out[0] += p.embedding / tp
    copy = p.tied and placement[0] != placement[-1]
    out[-1] += (m.vocab * m.hidden if copy else p.output) / tp + p.final_norm
    return out


def grad_reduce_times(m: Transformer, g: DeviceProfile, lay: Parallelism, params: list[float], placement,
                      backward: list[float] | None = None) -> list[float]:
    """Per stage, the reduction of its gradients (the engine's REDUCE_GRAD): a ring all-reduce
    of its gradient bytes over the dp replicas (ZeRO 1-2: a reduce-scatter and, after the
    optimizer, an all-gather of the updated weights, the same bytes, Rajbhandari et al. 2020,
    Sec. 7.2; ZeRO-3 reduces each micro-batch's in its backward instead: `zero3_times`),
    over the data-parallel group's link (`sim.hardware.topology`); on the
    first and last stage, where they are on two devices and the output layer is tied, also
    the all-reduce of the word embedding's gradient between its two copies (Megatron-LM's
    embedding group). `backward` (per stage, its last backward's seconds): the all-reduce or
    reduce-scatter is overlapped with it bucket by bucket and only its tail counted
    (`bucketed_tail`; with one stage per device and overlap_grad_reduce)."""
    grad = state_bytes_per_param(lay.precision)["grads"]
    topo, links = lay.topology(), links_of(g)
    dp = reduce_group(lay)

    def reduce(nbytes: float, s: int) -> float:
        def tail(seconds: float) -> float:
            k = buckets(params[s], shard_size(lay))
            return seconds if backward is None else bucketed_tail(seconds, backward[s], k)
        if lay.zero == 0:
            return tail(collective_time(links, "all_reduce", nbytes, dp))
        scatter = tail(collective_time(links, "reduce_scatter", nbytes, dp)) if lay.zero == 1 else 0.0
        return scatter + collective_time(links, "all_gather", nbytes, dp)

    # ZeRO-3 with pp > 1 reduce-scatters once, after the stage's last backward (HSDP:
    # within its shard group, then all-reduces its shard across the replicas); with pp = 1
    # every micro-batch's gradients in its backward (`fsdp_layer_exposure`, `zero3_times`)
    seen = {}  # a stage with the parameters (and last backward) of one seen reduces alike

    def once(s: int) -> float:
        key = (params[s], None if backward is None else backward[s])
        if key not in seen:
            if lay.zero == 3 and lay.pp > 1:
                seen[key] = fsdp_reduce_time(g, lay, params[s] * grad)
            else:
                seen[key] = 0.0 if lay.zero == 3 else reduce(params[s] * grad, s)
        return seen[key]
    out = [once(s) for s in range(len(params))]
    if m.params().tied and placement[0] != placement[-1]:
        tied = collective_time(links, "all_reduce", m.vocab * m.hidden / lay.tp * grad, topo.group("embedding"))
        out[0] += tied
        out[-1] += tied
    return out


# Megatron-Core's data-parallel gradient bucket: max(40M, 1M x dp) parameters
# (megatron/core/distributed/distributed_data_parallel.py, `bucket_size` when the config gives none).
BUCKET_PARAMS, BUCKET_PARAMS_PER_REPLICA = 40_000_000, 1_000_000


def buckets(params: float, dp: int) -> int:
    """How many gradient buckets Megatron-Core cuts `params` parameters into at `dp` replicas."""
    return max(1, math.ceil(params / max(BUCKET_PARAMS, BUCKET_PARAMS_PER_REPLICA * dp)))


def bucketed_tail(reduce: float, backward: float, k: int) -> float:
    """Seconds of a reduction of `reduce` seconds left after a backward of `backward` seconds
    that makes its k equal buckets one by one (bucket i ready at i/k of it, evenly in time) and
    hands each to the collective stream, which reduces them one at a time (Megatron-Core's
    --overlap-grad-reduce; torch DDP's buckets): the last bucket ends at the later of
    (backward + reduce / k) and (backward / k + reduce), so what is left after the backward is
    max(reduce / k, reduce - backward (k - 1) / k)."""
    return max(reduce / k, reduce - backward * (k - 1) / k)


def reduce_group(lay: Parallelism, axis: str = "dp_cp") -> Group:
    """The group a stage's gradients are reduced over: `axis`'s, or with two copies of the model
    (DualPipe) the replicas of both copies, on pipeline devices i and P-1-i (`Topology.mirrored`):
    one all-reduce (ZeRO-1: one reduce-scatter) of the two copies' gradients, which sums them as
    the dp replicas' (deepseek-ai/DualPipe leaves the sum to the trainer; its
    examples/example_dualpipe.py adds each copy's gradient to its twin's over the pipeline group)."""
    topo = lay.topology()
    return topo.mirrored(axis) if lay.pipelines > 1 else topo.group(axis)


def fsdp_as_actions(lay: Parallelism) -> bool:
    """Whether ZeRO-3 runs as FSDP's gathers and releases, actions the engine schedules
    (`sim.add_fsdp`): always. With pp > 1 each UNSHARD gathers its whole stage and takes its
    time (`fsdp_times`), as torch.distributed.pipelining lowers them; with pp = 1 the one
    UNSHARD takes no time and holds what FSDP keeps gathered (`fsdp_held_bytes`), the gathers'
    exposed time being in each micro-batch's passes."""
    return lay.zero == 3


def shard_size(lay: Parallelism) -> int:
    """The ranks ZeRO shards over: the dp x cp replicas ("dp_cp"; with k copies of the model the
    k dp x cp replicas of a stage's copies, `reduce_group`), or under HSDP (zero=3 with
    `fsdp_shard`) each shard group of that many consecutive replicas."""
    return lay.fsdp_shard or lay.dp * lay.cp * lay.pipelines


def hsdp_groups(lay: Parallelism) -> tuple[Group, Group]:
    """The slowest shard group and replica group of HSDP (FSDP2's 2-D mesh: shard within
    `shard_size` consecutive replicas, replicate across them); plain FSDP: the dp group, and
    a group of one."""
    topo, n = lay.topology(), shard_size(lay)
    if n == lay.dp * lay.cp:
        return topo.group("dp_cp"), one_node(1)
    dp = topo.groups("dp_cp")
    return (topo.slowest([g[i:i + n] for g in dp for i in range(0, len(g), n)]),
            topo.slowest([g[i::n] for g in dp for i in range(n)]))


def fsdp_times(g: DeviceProfile, lay: Parallelism, params: list[float]) -> list[float]:
    """Per stage (pp > 1), FSDP's UNSHARD: the all-gather of its 16-bit parameters from their
    shards over the data-parallel group (HSDP: its shard group), in seconds. The reduce-scatter
    of its gradients is its REDUCE_GRAD (`grad_reduce_times`)."""
    weight = state_bytes_per_param(lay.precision)["weights"]
    shard = hsdp_groups(lay)[0]
    return [collective_time(links_of(g), "all_gather", p * weight, shard) for p in params]


FSDP_UNITS = ("layer", "stage")  # what FSDP gathers at once (`Parallel.fsdp_unit`)


def prefetched(c: float, a: float, n: int) -> float:
    """Seconds that gathers of `a` seconds add to a pass over n units of `c` seconds of compute
    each, the gathers on a stream of their own, prefetched one unit ahead (FSDP2: unit i+1's
    all-gather issued as unit i's compute starts; two units gathered at most). Unit 1 starts at
    a; gather i+1 runs from unit i's start S_i (gather i ended by then), so unit i+1 starts at
    S_i + max(a, c): the pass ends at a + (n - 1) max(a, c) + c, which is n c plus
    a + (n - 1) max(0, a - c). Zero for n = 0."""
    return a + (n - 1) * max(0.0, a - c) if n else 0.0


def fsdp_layer_exposure(m: Transformer, g: DeviceProfile, lay: Parallelism, layers: list[int], params: list[float],
                        forward: float, backward: float) -> tuple[list[float], list[float], list[float]]:
    """Per stage, with the layer as FSDP's unit at pp = 1 (torchtitan's FSDP2: `fully_shard` on
    the embedding, each block, the final norm with the output layer, and the root; Megatron-FSDP
    per module), what one micro-batch's gathers and reduce-scatters add to its passes, in seconds,
    for layers of `forward` and `backward` seconds: the forward's gathers (`prefetched`; the first
    layer's with the ends', which the pass waits for); the backward's gathers, again when
    `reshard_after_forward` (torchtitan's default at pp = 1; the ends stay gathered: the output
    layer's unit is not resharded after forward, the embedding's regather is taken as hidden),
    and the reduce-scatter of each layer's gradients once its backward ends, on FSDP2's
    reduce-scatter stream; then the ends', counted exposed. The backward's gathers (a each) and
    reduce-scatters (r each) share the data-parallel links: they add `prefetched(backward, a + r, n)`,
    exact where either is none, else at most one gather above the two on one link one at a time
    (tests/sim/plan/test_fsdp_unit.py). Every micro-batch reduce-scatters: torchtitan's
    gradient accumulation at pp = 1 runs forward and backward per micro-batch without
    `set_requires_gradient_sync(False)` (pytorch/torchtitan, torchtitan/train.py, `train_step`).
    Gathers move 16-bit weights, reductions the gradients' bytes (FP32: torchtitan's reduce
    dtype); HSDP over its shard group (`fsdp_reduce_time`). Returned per stage: the forward's,
    the backward's before its last reduce-scatter, and the reduce-scatters' tail."""
    weight, grad = (state_bytes_per_param(lay.precision)[k] for k in ("weights", "grads"))
    links, shard, layer = links_of(g), hsdp_groups(lay)[0], m.params().per_layer / lay.tp
    gathers, regathers, tails = [], [], []
    for n, p in zip(layers, params):
        ends, a = p - n * layer, collective_time(links, "all_gather", layer * weight, shard)
        first = collective_time(links, "all_gather", (ends + (layer if n else 0.0)) * weight, shard)
        gathers.append(first + prefetched(forward, a, n) - (a if n else 0.0))
        r = fsdp_reduce_time(g, lay, layer * grad) if n else 0.0
        regathers.append(prefetched(backward, (a if lay.reshard_after_forward else 0.0) + r, n) - r)
        tails.append(r + fsdp_reduce_time(g, lay, ends * grad))
    return gathers, regathers, tails


def fsdp_held_bytes(m: Transformer, lay: Parallelism, layers: list[int], params: list[float]) -> list[float]:
    """Per stage, the bytes FSDP holds beside its shards (its UNSHARD's `unshard_bytes`): with
    pp > 1 the whole stage's 16-bit weights, whatever the unit (torch.distributed.pipelining
    gathers every FSDP module of the stage at its UNSHARD, `_PipelineScheduleRuntime`, and keeps
    each layer gathered after every backward but the last, `set_reshard_after_backward(False)`;
    the gradients stay whole in `grad_bytes`). With pp = 1 and the layer as unit: two layers
    (the one computing, the one prefetched) and the ends when `reshard_after_forward`, else
    every layer, from its forward to its backward; and one layer's unsharded gradients
    awaiting their reduce-scatter. With the stage as unit: its weights and its gradients."""
    weight, grad = (state_bytes_per_param(lay.precision)[k] for k in ("weights", "grads"))
    if lay.pp > 1:
        return [p * weight for p in params]
    if lay.fsdp_unit == "stage":
        return [p * (weight + grad) for p in params]
    layer = m.params().per_layer / lay.tp
    kept = [max(n - 2, 0) if lay.reshard_after_forward else 0 for n in layers]  # layers resharded meanwhile
    return [(p - k * layer) * weight + min(n, 1) * layer * grad for n, k, p in zip(layers, kept, params)]


def zero3_times(g: DeviceProfile, lay: Parallelism, params: list[float]) -> tuple[list[float], list[float]]:
    """Per stage and micro-batch under ZeRO-3, the all-gather of the stage's 16-bit weights
    from their dp shards (before F, and again before the backward) and the reduce-scatter of
    its gradients (after it): DeepSpeed's ZeRO-3, 1.5x a data-parallel all-reduce's bytes per
    micro-batch (Rajbhandari et al. 2020, Sec. 7.2.2). Taken as not overlapped with the
    compute (DeepSpeed prefetches some of it; not modelled). Under ZeRO-2 (pp = 1 only) the
    reduce-scatter of the stage's gradients after each micro-batch's backward, DeepSpeed's
    stage 2, so that only 1/dp of them accumulates (docs/planner.md, "ZeRO with pipelining").
    ZeRO-3 so is FSDP with the stage as its unit (`fsdp_unit="stage"`) at pp = 1; HSDP gathers
    within its shard group and all-reduces the reduced shard across the replicas. Zero for
    other stages, with pp > 1, and with the layer as FSDP's unit (`fsdp_layer_exposure`)."""
    if lay.zero < 2 or lay.pp > 1 or (lay.zero == 3 and lay.fsdp_unit == "layer"):
        return [0.0] * len(params), [0.0] * len(params)
    links, dp = links_of(g), lay.topology().group("dp_cp")
    weight, grad = (state_bytes_per_param(lay.precision)[k] for k in ("weights", "grads"))  # 16-bit under FP8 too
    if lay.zero == 2:
        return [0.0] * len(params), [collective_time(links, "reduce_scatter", p * grad, dp) for p in params]
    return ([collective_time(links, "all_gather", p * weight, hsdp_groups(lay)[0]) for p in params],
            [fsdp_reduce_time(g, lay, p * weight) for p in params])


def fsdp_reduce_time(g: DeviceProfile, lay: Parallelism, nbytes: float) -> float:
    """FSDP's reduction of `nbytes` of gradients: a reduce-scatter over the shard group and,
    under HSDP, an all-reduce of the shard across the replicas (`hsdp_groups`)."""
    links, (shard, replicas) = links_of(g), hsdp_groups(lay)
    across = collective_time(links, "all_reduce", nbytes / shard.size, replicas) if replicas.size > 1 else 0.0
    return collective_time(links, "reduce_scatter", nbytes, shard) + across


def optimizer_time(m: Transformer, g: DeviceProfile, lay: Parallelism, layers: list[int], placement) -> float:
    """The optimizer's step after the pipeline flush: memory-bound over the parameters each GPU
    updates (all it holds; 1/dp of them under ZeRO), at the bytes its optimizer reads and
    writes per parameter (`sim.model.footprint.optimizer_step_bytes`), plus the profile's
    host cost per parameter tensor of that optimizer (`stage_tensors`; docs/planner.md), on the slowest device.
    With k copies of the model (DualPipe), `layers` are one copy's stages, stage s of `placement`
    holding layers[s mod len(layers)]; ZeRO shards over the copies' replicas (`shard_size`).
    Under FP8, with it, Transformer Engine's once-a-step casts of the Linear weights to their
    FP8 copies (`sim.cost.fp8.weight_cast_bytes`, memory-bound)."""
    params, n = stage_params(m, layers, lay.tp, placement[:len(layers)]), len(layers)
    tensors = stage_tensors(m, layers, placement[:len(layers)])
    per_rank, held, count = [0.0] * lay.pp, [0] * lay.pp, [0] * lay.pp
    for s, r in enumerate(placement):  # with k copies of the model, `layers` are one copy's stages
        per_rank[r] += params[s % n]
        held[r] += layers[s % n]
        count[r] += tensors[s % n]
    share, per_tensor = shard_size(lay) if lay.zero >= 1 else 1, g.optimizer_per_tensor.get(lay.optimizer, 0.0)
    step = max(memory_time(g, p / share * optimizer_step_bytes(lay.precision, lay.optimizer), "optimizer")
               + per_tensor * c for p, c in zip(per_rank, count))
    return step + (memory_time(g, weight_cast_bytes(m, max(held), lay.tp)) if lay.precision == "fp8" else 0.0)


def stage_tensors(m: Transformer, layers: list[int], placement) -> list[int]:
    """Parameter tensors one GPU holds for each stage, as exec's GPT and Megatron-LM hold them
    (tensor parallelism splits each, the count stays): a layer's fused QKV, projection, MLP in
    (a gated MLP's gate and up matrices together) and MLP out, with a bias each where the arch
    has biases, and its two norms' gain (and bias); the word embedding (and learned
    positions) on the first stage; the final norm's and the output layer (a tied one only as
    `stage_params`'s copy) on the last. MLA's and the experts' own projections are not
    counted. An optimizer that steps tensor by tensor (torch's for-loop AdamW, its CPU
    default) pays the profile's `optimizer_per_tensor` of that optimizer for each (`optimizer_time`)."""
    a = ARCHS[m.arch]
    out = [n * (4 * (2 if a["bias"] else 1) + 2 * a["norm_params"]) for n in layers]
    out[0] += 1 + (m.positions == "learned")
    out[-1] += a["norm_params"] + (0 if m.tied and placement[0] == placement[-1] else 1)
    return out
