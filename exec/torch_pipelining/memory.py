"""The activations torch.distributed.pipelining's runtime holds, counted in its own stage caches, beside `sim.schedule.liveness`'s.

torch 2.13 has no activation liveness analysis of its own (one is proposed upstream,
pytorch/pytorch#196464, not in 2.13): what a schedule holds is what its runtime keeps
referenced. A `PipelineStage` keeps micro-batch m's stage inputs and outputs (and so its
autograd graph) in `fwd_cache[m]` from the forward until a backward pops them; a split
backward's input half (I) then parks them, with the weight half's `param_groups`, in
`backward_state[m]` until the weight half (W) pops them. So torch holds a micro-batch
from F to B, or to W where the backward is split, where our rule holds it from F to B
or I and counts what W still needs in bytes only (docs/rules.md, rule 7).

    >>> torch_held(from_torch("InterleavedZeroBubble", 4, 8))                 # doctest: +SKIP
    [8, 8, 8, 8]
    >>> count_torch_caches(ModelSpec(layers=8), ["InterleavedZeroBubble"], 4, 8)  # doctest: +SKIP
    {('InterleavedZeroBubble', None): [8, 8, 8, 8]}

- `torch_held(schedule)`: that rule, per rank, from the order alone;
- `count_torch_caches(spec, names, devices, micro_batches)`: the count itself, read off
  torch's caches after every compute of one step of each schedule, each built by torch's
  own schedule class and run by torch's runtime on `devices` gloo ranks.
"""
from __future__ import annotations

from typing import Sequence

import torch.distributed as dist

from sim import Kind, Schedule

from exec.launch.processes import launch
from exec.torch_pipelining.orders import from_torch, torch_name

__all__ = ["torch_held", "count_torch_caches", "STARTS", "ENDS"]

STARTS = (Kind.F,)        # torch's fwd_cache[m] is filled by the forward ...
ENDS = (Kind.B, Kind.W)   # ... and emptied by the full backward, or by W after I


def torch_held(schedule: Schedule) -> list[int]:
    """Per rank, the most micro-batch chunks (one stage's micro-batch) torch's runtime keeps
    referenced at once when it runs `schedule`'s order: each from its F to its B, or to its
    W where the backward is split."""
    peaks = []
    for program in schedule.programs:
        now = peak = 0
        for a in program:
            now += (a.kind in STARTS) - (a.kind in ENDS)
            peak = max(peak, now)
        peaks.append(peak)
    return peaks


def _torch_schedule(name: str, micro_batches: int, stages, loss):
    """torch's own schedule class `name` over this rank's `stages` (one for GPipe and 1F1B)."""
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle, get_schedule_class

    cls = get_schedule_class(torch_name(name))
    if issubclass(cls, PipelineScheduleSingle):
        return cls(stages[0], micro_batches, loss_fn=loss)
    return cls(stages, micro_batches, loss_fn=loss)


def _counting(stages) -> list[int]:
    """Wrap each stage's compute calls so that after each one the rank's cache entries
    (fwd_cache and backward_state over its stages) are counted; returns the list of counts."""
    counts = [0]

    def wrap(call):
        def counted(*args, **kwargs):
            out = call(*args, **kwargs)
            counts.append(sum(len(st.fwd_cache) + len(st.backward_state) for st in stages))
            return out
        return counted

    for st in stages:
        for method in ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk"):
            setattr(st, method, wrap(getattr(st, method)))
    return counts


def cache_worker(ctx, spec, runs: Sequence[tuple[str, int, list[int], list[int]]]) -> list[int]:
    """What every rank runs: one step of each (name, micro_batches, placement, bounds) in
    `runs` on torch's own schedule class; returns, per run, the most cache entries this
    rank held after any of its computes."""
    from torch.distributed.pipelining import PipelineStage

    inputs, targets = spec.batch()
    peaks = []
    for name, micro_batches, placement, bounds in runs:
        modules = spec.build_stages(len(placement), bounds=bounds)
        stages = [PipelineStage(modules[s], s, len(placement), ctx.device, group=dist.group.WORLD)
                  for s, r in enumerate(placement) if r == ctx.rank]
        counts = _counting(stages)
        schedule = _torch_schedule(name, micro_batches, stages, spec.loss)
        schedule.step(inputs, target=targets, losses=[], return_outputs=False)
        dist.barrier()
        peaks.append(max(counts))
    return peaks


def count_torch_caches(spec, schedules: Sequence[str | tuple[str, int]], devices: int, micro_batches: int,
                       timeout: float = 300) -> dict[tuple[str, int | None], list[int]]:
    """Per schedule of `schedules` (torch's names or ours, as `from_torch` takes them, each
    alone or with its stages per rank: ("InterleavedZeroBubble", 1); default 1 for GPipe
    and 1F1B, else 2), per rank, the most micro-batch chunks torch's runtime held in its
    stage caches during one step of `spec` on `devices` gloo ranks, the schedule built by
    torch's own class. Keyed by (name, virtual or None); one launch runs them all."""
    keys = [(s, None) if isinstance(s, str) else tuple(s) for s in schedules]
    runs = []
    for name, virtual in keys:
        single = torch_name(name) in ("GPipe", "1F1B")
        placement = list(range(devices)) if single else from_torch(name, devices, micro_batches, virtual).placement
        runs.append((name, micro_batches, placement, spec.partition(len(placement), "layers", micro_batches)))
    per_rank = launch(cache_worker, devices, spec, runs, timeout=timeout)
    return {key: [per_rank[r][i] for r in range(devices)] for i, key in enumerate(keys)}
