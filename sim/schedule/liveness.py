"""Activation liveness: what each action takes and gives back, and how much a device holds in program order; every held-activation question asks this module.

A device holds a micro-batch's activations from the start of its F to the end of its B
(or I, where the backward is split); what W still needs after I is held until W's end,
counted in bytes only (docs/rules.md, rule 7). The action-kind table says this once, as
each kind's `memory` effects (`sim.schedule.kinds.KINDS`); this module reads them and
answers the questions the others ask (the counterpart of torch.distributed.pipelining's
activation liveness analysis):

- `memory_delta`, `change`: what one action does to its device at its start or end (the
  engine, its copy engines);
- `program_peak`, `schedule_peak`, `held`: the most a device holds while it runs its
  program, from the order alone, in bytes or micro-batches (the planner's memory bound
  and caps, zb-auto's filter);
- `held_after`: what a device holds after so many actions of each kind (zb-auto's greedy
  layout, which counts as it goes);
- `held_by_step`: what a device holds at each action of its program (a hand-written
  schedule's memory limit, checked cell by cell: `sim.passes.diagnose`);
- `simulated_peak`: the same read off a simulated step, to cross-check the order with a run.

`costs` here is a `sim.engine.costs.StageCosts` (per-stage lists of the `Costs` fields).
"""
from __future__ import annotations

from typing import Iterable, Mapping

from .ir import Action, Schedule
from .kinds import KINDS, Kind

__all__ = ["memory_delta", "change", "program_peak", "schedule_peak", "held", "held_after", "held_by_step",
           "simulated_peak"]

HELD_FIELD = "activation_bytes"  # the effects that count a micro-batch as held (Result.peak_activations)


def memory_delta(kind: Kind, at: str, costs, stage: int) -> float:
    """Bytes that an action of `kind` on `stage` takes (> 0) or gives back (< 0) at its
    "start" or "end"."""
    return sum(e.sign * getattr(costs, e.field)[stage] for e in KINDS[kind].memory if e.at == at)


def micro_batches_delta(kind: Kind, at: str) -> int:
    """Micro-batches whose activations an action of `kind` starts (+1) or stops (-1)
    holding at its "start" or "end"."""
    return sum(e.sign for e in KINDS[kind].memory if e.at == at and e.field == HELD_FIELD)


def change(kind: Kind, at: str, costs, stage: int) -> tuple[float, int] | None:
    """(bytes, micro-batches) that an action of `kind` on `stage` adds to its device at its
    start or end; None if its kind does nothing to memory then."""
    if not any(e.at == at for e in KINDS[kind].memory):
        return None
    return memory_delta(kind, at, costs, stage), micro_batches_delta(kind, at)


def _peak(program: Iterable[Action], delta) -> float:
    """The most a device holds over `program`, each action adding delta(action) = (at its
    start, at its end): a device computes one action at a time."""
    seen = {}  # (stage, kind) -> its (start, end) change, worked out once
    held_now = peak = 0
    for a in program:
        d = seen.get((a.stage, a.kind))
        if d is None:
            d = seen[a.stage, a.kind] = delta(a)
        held_now += d[0]
        if held_now > peak:
            peak = held_now
        held_now += d[1]
        if held_now > peak:
            peak = held_now
    return peak


def program_peak(program: Iterable[Action], costs) -> float:
    """The most bytes of activations a device holds while it runs `program` (its actions in
    order), from the order alone: no simulation is needed."""
    return float(_peak(program, lambda a: (memory_delta(a.kind, "start", costs, a.stage),
                                           memory_delta(a.kind, "end", costs, a.stage))))


def schedule_peak(schedule: Schedule, costs) -> float:
    """The most bytes of activations any device of `schedule` holds, from its program order."""
    return max((program_peak(prog, costs) for prog in schedule.programs), default=0.0)


def held(schedule: Schedule) -> list[int]:
    """Per device, the most micro-batch chunks (one stage's micro-batch) whose activations
    it holds at once, from its program order (what `sim.Result.peak_activations` finds in
    a run of it)."""
    count = lambda a: (micro_batches_delta(a.kind, "start"), micro_batches_delta(a.kind, "end"))  # noqa: E731
    return [int(_peak(prog, count)) for prog in schedule.programs]


def held_after(done: Mapping[Kind, int], costs, stage: int) -> float:
    """Bytes of activations a device holds for `stage` once it has run done[kind] actions
    of each kind of it (all of them ended): each kind's effects, times its count, so that
    no rounding piles up over a step."""
    return sum(n * (memory_delta(k, "start", costs, stage) + memory_delta(k, "end", costs, stage))
               for k, n in done.items() if n)


def simulated_peak(result, costs) -> float:
    """The most bytes of activations any device held in a simulated step (`result`, one
    stage per device): its peak memory less its static bytes; equal to `schedule_peak` of
    its schedule but for the rounding of the static bytes in and out."""
    return max(peak - costs.static_total(r) for r, peak in enumerate(result.peak_memory))


def held_by_step(program: Iterable[Action], costs=None) -> list[float]:
    """Per action of `program`, the most its device holds while that action runs (after its
    start's effects, and its end's where they add): micro-batch chunks without `costs`,
    bytes of activations with them. Its maximum is `held` (or `program_peak`)."""
    if costs is None:
        delta = lambda a: (micro_batches_delta(a.kind, "start"), micro_batches_delta(a.kind, "end"))  # noqa: E731
    else:
        delta = lambda a: (memory_delta(a.kind, "start", costs, a.stage),  # noqa: E731
                           memory_delta(a.kind, "end", costs, a.stage))
    out, now = [], 0
    for a in program:
        start, end = delta(a)
        now += start
        out.append(max(now, now + end))
        now += end
    return out
