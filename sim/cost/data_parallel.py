"""What data parallelism and the optimizer step cost one GPU: the parameters each stage holds,
the reduction of their gradients over the replicas, ZeRO-3's gathers, and the optimizer's step.

`sim.estimate` puts the reductions on the step as REDUCE_GRAD actions (with one stage a device
and overlap_grad_reduce, only what the last backward does not hide bucket by bucket:
`bucketed_tail`), ZeRO-3's gathers into each micro-batch's passes (pp = 1) or as FSDP's
UNSHARD actions (pp > 1: `fsdp_as_actions`), and the optimizer step after the pipeline flush. What they read of the
run's layout is a `Parallelism` (the planner's `sim.plan.layout.Layout` is one: its tp, dp, pp,
cp, ZeRO stage, precision, optimizer, and nodes, `topology`, which says how each data-parallel group sits on
them); collectives are timed by `sim.hardware.network`. With context parallelism the replicas
of a parameter are dp x cp (each cp rank computes gradients of its s/cp tokens): gradients are
reduced, and ZeRO shards, over the "dp_cp" group (Megatron-Core's data-parallel group with
context parallel), which is the "dp" group where cp = 1.
"""
from __future__ import annotations

import math
from typing import Protocol

from sim.model.footprint import optimizer_step_bytes, state_bytes_per_param
from sim.hardware.profile import DeviceProfile
from sim.hardware.kernels import memory_time
from sim.hardware.network import collective_time, links_of
from sim.hardware.topology import Group, Topology, one_node
from sim.model.transformer import Transformer
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
    optimizer: str  # a name of sim.model.footprint.OPTIMIZERS

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
    dp = topo.group("dp_cp")

    def reduce(nbytes: float, s: int) -> float:
        def tail(seconds: float) -> float:
            k = buckets(params[s], lay.dp * lay.cp)
            return seconds if backward is None else bucketed_tail(seconds, backward[s], k)
        if lay.zero == 0:
            return tail(collective_time(links, "all_reduce", nbytes, dp))
        scatter = tail(collective_time(links, "reduce_scatter", nbytes, dp)) if lay.zero == 1 else 0.0
        return scatter + collective_time(links, "all_gather", nbytes, dp)

    # ZeRO-3 as FSDP's actions reduce-scatters once, after the stage's last backward (HSDP:
    # within its shard group, then all-reduces its shard across the replicas); as
    # DeepSpeed's, every micro-batch's gradients in its backward (`zero3_times`)
    if fsdp_as_actions(lay):
        shard, replicas = hsdp_groups(lay)
        out = [collective_time(links, "reduce_scatter", p * grad, shard)
               + (collective_time(links, "all_reduce", p * grad / shard.size, replicas) if replicas.size > 1 else 0.0)
               for p in params]
    else:
        out = [0.0 if lay.zero == 3 else reduce(p * grad, s) for s, p in enumerate(params)]
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


def fsdp_as_actions(lay: Parallelism) -> bool:
    """Whether ZeRO-3 runs as FSDP's gathers and releases, actions the engine schedules
    (`sim.add_fsdp`, `fsdp_times`): with pp > 1, as torch.distributed.pipelining lowers them.
    With pp = 1 a stage is the whole model, which FSDP never gathers at once: there the
    gathers stay in each micro-batch's passes (`zero3_times`, DeepSpeed's ZeRO-3)."""
    return lay.zero == 3 and lay.pp > 1


def shard_size(lay: Parallelism) -> int:
    """The ranks ZeRO shards over: the dp x cp replicas ("dp_cp"), or under HSDP (zero=3 with
    `fsdp_shard`) each shard group of that many consecutive replicas."""
    return lay.fsdp_shard or lay.dp * lay.cp


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


def fsdp_times(g: DeviceProfile, lay: Parallelism, params: list[float]) -> tuple[list[float], list[float]]:
    """Per stage, FSDP's UNSHARD: the all-gather of its 16-bit parameters from their shards
    over the data-parallel group (HSDP: its shard group), in seconds, and the bytes it gathers
    (held until its RESHARD). The reduce-scatter of its gradients is its REDUCE_GRAD
    (`grad_reduce_times`)."""
    weight = state_bytes_per_param(lay.precision)["weights"]
    shard = hsdp_groups(lay)[0]
    return [collective_time(links_of(g), "all_gather", p * weight, shard) for p in params], [p * weight for p in params]


def zero3_times(g: DeviceProfile, lay: Parallelism, params: list[float]) -> tuple[list[float], list[float]]:
    """Per stage and micro-batch under ZeRO-3, the all-gather of the stage's 16-bit weights
    from their dp shards (before F, and again before the backward) and the reduce-scatter of
    its gradients (after it): DeepSpeed's ZeRO-3, 1.5x a data-parallel all-reduce's bytes per
    micro-batch (Rajbhandari et al. 2020, Sec. 7.2.2). Taken as not overlapped with the
    compute (DeepSpeed prefetches some of it; not modelled). Under ZeRO-2 (pp = 1 only) the
    reduce-scatter of the stage's gradients after each micro-batch's backward, DeepSpeed's
    stage 2, so that only 1/dp of them accumulates (docs/planner.md, "ZeRO with pipelining").
    Zero for other stages, and for ZeRO-3 as FSDP's actions (`fsdp_as_actions`)."""
    if lay.zero < 2 or fsdp_as_actions(lay):
        return [0.0] * len(params), [0.0] * len(params)
    links, dp = links_of(g), lay.topology().group("dp_cp")
    weight, grad = (state_bytes_per_param(lay.precision)[k] for k in ("weights", "grads"))  # 16-bit under FP8 too
    gather = [collective_time(links, "all_gather", p * weight, dp) if lay.zero == 3 else 0.0 for p in params]
    scatter = [collective_time(links, "reduce_scatter", p * (weight if lay.zero == 3 else grad), dp) for p in params]
    return gather, scatter


def optimizer_time(m: Transformer, g: DeviceProfile, lay: Parallelism, layers: list[int], placement) -> float:
    """The optimizer's step after the pipeline flush: memory-bound over the parameters each GPU
    updates (all it holds; 1/dp of them under ZeRO), on the device that holds the most, at
    the bytes its optimizer reads and writes per parameter (`sim.model.footprint.optimizer_step_bytes`).
    Under FP8, with it, Transformer Engine's once-a-step casts of the Linear weights to their
    FP8 copies (`sim.cost.fp8.weight_cast_bytes`, memory-bound)."""
    params = stage_params(m, layers, lay.tp, placement)
    per_rank, held = [0.0] * lay.pp, [0] * lay.pp
    for s, r in enumerate(placement):
        per_rank[r] += params[s]
        held[r] += layers[s]
    share = shard_size(lay) if lay.zero >= 1 else 1
    step = memory_time(g, max(per_rank) / share * optimizer_step_bytes(lay.precision, lay.optimizer), "optimizer")
    return step + (memory_time(g, weight_cast_bytes(m, max(held), lay.tp)) if lay.precision == "fp8" else 0.0)
