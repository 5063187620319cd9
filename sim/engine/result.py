"""The event record shared by simulated and measured runs, and the metrics over it."""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Callable

from sim.files import atomic_write
from sim.schedule.ir import Action, Schedule
from sim.schedule.kinds import COLLECTIVES, COPIES, Kind
from .program import Program


@dataclass(slots=True)
class Event:
    """One action on one device: when it started and ended.

    Compute actions (F, B, I, W) span the time the device computes. A SEND spans from
    the moment the rank issues it to the moment the data arrives at `peer`; a RECV from
    the moment the rank posts it to the moment the data is there. A collective
    (REDUCE_GRAD) spans its time on the rank's collective stream, a copy (OFFLOAD, RELOAD)
    its time on the rank's copy engine.
    """

    rank: int
    action: Action
    start: float
    end: float
    peer: int = -1  # the other rank of a SEND or RECV

    @property
    def duration(self) -> float:
        return self.end - self.start

    @property
    def is_compute(self) -> bool:
        return self.action.kind.is_compute

    @property
    def is_collective(self) -> bool:
        return self.action.kind in COLLECTIVES

    @property
    def is_copy(self) -> bool:
        return self.action.kind in COPIES


class Result:
    """A simulated or measured training step.

    `memory[r]` is rank r's memory over time as (time, bytes) steps; `activations[r]`
    the same for the number of micro-batches whose activations rank r holds.

    `schedule` is the lowered schedule that ran, or the compiled `Program` it ran as (the
    simulator gives that: `schedule` then writes it out as actions once, when asked).
    `events` may be given as a function that makes them: the simulator does so, and a
    sweep that reads only the makespan, the bubble and the peaks never pays for a million
    `Event` records. It then also gives `makespan`, `busy` and `compute_end`, which are
    otherwise derived from the events, and `t0`, the first event's start.
    """

    def __init__(self, schedule: Schedule | Program, events: list[Event] | Callable[[], list[Event]],
                 memory: list[list[tuple[float, float]]], activations: list[list[tuple[float, int]]],
                 source: str = "simulated", *, makespan: float | None = None, busy: list[float] | None = None,
                 t0: float = 0.0, compute_end: float | None = None):
        self._schedule, self._events = schedule, events
        self._program = schedule if isinstance(schedule, Program) else None
        self.memory, self.activations, self.source = memory, activations, source
        self._makespan, self._busy, self._compute_end = makespan, busy, compute_end
        self._spans: list[tuple[float, float]] | None = None
        self._t0 = t0 if makespan is not None else None
        # times in seconds (a measured step; a step simulated under costs in seconds, as
        # `sim.estimate` makes), or in the costs' own unit (figures say "time units")
        self.in_seconds = source == "measured"

    def __repr__(self) -> str:
        s = self.schedule
        on = f"{s.stages} stage{'s' * (s.stages != 1)} on {s.ranks} rank{'s' * (s.ranks != 1)}"
        return (f"<Result {s.name!r} ({self.source}): {on}, {s.micro_batches} micro-batch{'es' * (s.micro_batches != 1)}, "
                f"makespan {self.makespan:.6g}{' s' * (self.source == 'measured')}, "
                f"bubble {self.bubble_fraction:.1%}>")

    @property
    def schedule(self) -> Schedule:
        """The lowered schedule that ran."""
        if isinstance(self._schedule, Program):
            self._schedule = self._schedule.lowered()
        return self._schedule

    @property
    def program(self) -> Program | None:
        """The compiled program that ran (a simulated step, or one exec measured), else None."""
        return self._program

    @property
    def events(self) -> list[Event]:
        """One record per action (compute, SEND and RECV) on every rank."""
        if callable(self._events):
            self._events = self._events()
        return self._events

    @property
    def makespan(self) -> float:
        """Length of the step: from its first start to its last end."""
        if self._makespan is None:
            self._makespan = max((e.end for e in self.events), default=0.0) - self.t0
        return self._makespan

    @property
    def t0(self) -> float:
        """Start of the step (0 for simulated runs; measured runs may be offset)."""
        if self._t0 is None:
            self._t0 = min((e.start for e in self.events), default=0.0)
        return self._t0

    @property
    def compute_end(self) -> float:
        """When the last compute ends (the pipeline's flush; collectives may run on after it)."""
        if self._compute_end is None:
            self._compute_end = max((e.end for e in self.events if e.action.kind.is_compute), default=0.0)
        return self._compute_end

    @property
    def ranks(self) -> int:
        return len(self.memory)  # one series per rank; does not make a lazy schedule

    def busy(self) -> list[float]:
        """Compute time of each rank (its collectives run beside it, on their stream)."""
        if self._busy is not None:
            return list(self._busy)
        busy = [0.0] * self.ranks
        for e in self.events:
            if e.action.kind.is_compute:
                busy[e.rank] += e.end - e.start
        return busy

    def collective_time(self) -> list[float]:
        """Per rank, the time its collective stream is busy (its REDUCE_GRADs)."""
        out = [0.0] * self.ranks
        for e in self.events:
            if e.action.kind in COLLECTIVES:
                out[e.rank] += e.end - e.start
        return out

    @property
    def bubble_fraction(self) -> float:
        """Idle share of device-time over the step: 1 - sum(busy) / (ranks * makespan)."""
        if self.makespan <= 0:
            return 0.0
        return 1.0 - sum(self.busy()) / (self.ranks * self.makespan)

    @property
    def pipeline_bubble_fraction(self) -> float:
        """Idle share of device-time until the last compute ends: 1 - sum(busy) / (ranks *
        (compute_end - t0)). The pipeline's own bubble, without the gradient reduction
        that may run on after the last compute (`sim.Estimate.bubble_fraction`); equal to
        `bubble_fraction` when nothing does."""
        span = self.compute_end - self.t0
        if span <= 0:
            return 0.0
        return 1.0 - sum(self.busy()) / (self.ranks * span)

    def spans(self) -> list[tuple[float, float]]:
        """Per rank, (start of its first compute, end of its last compute or collective:
        its stages' weights are ready for the next step once their gradients are
        reduced); (0, 0) for a rank that computes nothing."""
        if self._spans is not None:
            return list(self._spans)
        # events not made yet are made for this and let go (0.6 KB per stage x micro-batch
        # at p=64, m=1024): a table of several big steps holds one step's at a time
        events = self._events() if callable(self._events) else self._events
        first, last = [math.inf] * self.ranks, [-math.inf] * self.ranks
        for e in events:
            if e.action.kind.is_compute:
                first[e.rank] = min(first[e.rank], e.start)
                last[e.rank] = max(last[e.rank], e.end)
            elif e.action.kind in COLLECTIVES:
                last[e.rank] = max(last[e.rank], e.end)
        self._spans = [(a, b) if b >= a else (0.0, 0.0) for a, b in zip(first, last)]
        return list(self._spans)

    @property
    def steady_step(self) -> float:
        """The step's length when steps follow each other without a pipeline flush: the
        longest time one device takes from its first compute's start to its last
        compute's end (the "cost" of Qi et al., "Zero Bubble Pipeline Parallelism", ICLR
        2024, Section 5.3). With the optimizer step not synchronising the devices (the
        paper's post-validation, Section 4), device r can run step k over its own span
        shifted by k x steady_step: the dependencies inside a step keep their offsets,
        and no device's span overlaps its next. At most the makespan."""
        return max((b - a for a, b in self.spans()), default=0.0)

    @property
    def steady_bubble_fraction(self) -> float:
        """Idle share of device-time when steps repeat every `steady_step`:
        1 - sum(busy) / (ranks * steady_step). Where every device computes the same time
        (equal stages), it is the paper's bubble rate (cost - m(T_F + T_B + T_W)) / cost
        (Qi et al. 2024, Section 5.3), with cost = `steady_step`."""
        step = self.steady_step
        if step <= 0:
            return 0.0
        return 1.0 - sum(self.busy()) / (self.ranks * step)

    @property
    def peak_activations(self) -> list[int]:
        """Per rank, the most micro-batches whose activations it held at once."""
        return [max((n for _, n in series), default=0) for series in self.activations]

    @property
    def peak_memory(self) -> list[float]:
        """Per rank, the most bytes (static plus activations) it held at once."""
        return [max((b for _, b in series), default=0.0) for series in self.memory]

    def compute_events(self, rank: int | None = None) -> list[Event]:
        """Compute events, in start order, of one rank or of all."""
        evs = [e for e in self.events if e.action.kind.is_compute and (rank is None or e.rank == rank)]
        return sorted(evs, key=lambda e: (e.start, e.end))

    def summary(self) -> dict:
        return {
            "schedule": self.schedule.name,
            "source": self.source,
            "devices": self.schedule.ranks,
            "stages": self.schedule.stages,
            "micro_batches": self.schedule.micro_batches,
            "makespan": self.makespan,
            "bubble_fraction": self.bubble_fraction,
            "steady_step": self.steady_step,
            "steady_bubble_fraction": self.steady_bubble_fraction,
            "peak_activations": self.peak_activations,
            "peak_memory": self.peak_memory,
        }

    def chrome_trace(self, time_scale: float = 1e6) -> dict:
        """The step as a Chrome trace (open it in https://ui.perfetto.dev). Times are
        multiplied by `time_scale` to get microseconds (1e6 for seconds)."""
        t0 = self.t0
        out = [{"name": "process_name", "ph": "M", "pid": 0, "args": {"name": f"{self.schedule.name} ({self.source})"}}]
        for r in range(self.ranks):
            out.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": r, "args": {"name": f"rank {r}"}})
            out.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": 1000 + r, "args": {"name": f"rank {r} comm"}})
        for e in self.events:
            a = e.action
            out.append({
                "name": str(a), "cat": a.kind.value, "ph": "X",
                "ts": (e.start - t0) * time_scale, "dur": (e.end - e.start) * time_scale,
                "pid": 0, "tid": e.rank if a.kind.is_compute else 1000 + e.rank,
                "args": {"stage": a.stage, "micro": a.micro, **({"peer": e.peer} if e.peer >= 0 else {})},
            })
        for r, series in enumerate(self.memory):
            for t, b in series:
                out.append({"name": f"memory rank {r}", "ph": "C", "pid": 0, "ts": (t - t0) * time_scale,
                            "args": {"bytes": b}})
        return {"traceEvents": out, "displayTimeUnit": "ms"}

    def save_chrome_trace(self, path: str | os.PathLike, time_scale: float = 1e6) -> None:
        """Write `chrome_trace()` to `path` as JSON, whole or not at all."""
        with atomic_write(path) as f:
            json.dump(self.chrome_trace(time_scale), f)


def reload_waits(result) -> list[float]:
    """Per rank, how long its backwards waited for their RELOADs in `result` (a simulated
    step): for each backward with a RELOAD, how much later than the end of the rank's
    compute before it (and the arrival of its input from another rank) its RELOAD ended,
    as the `ideal` transport runs them (no call overheads). Zero where the copies were on time."""
    events = result.events
    reload_end = {(e.action.stage, e.action.micro): e.end for e in events if e.action.kind is Kind.RELOAD}
    arrived = {(e.action.stage, e.action.micro): e.end for e in events
               if e.action.kind is Kind.RECV_B}   # a backward's input from another rank
    out = [0.0] * result.ranks
    last = [0.0] * result.ranks     # the end of each rank's compute before
    for e in sorted((e for e in events if e.is_compute), key=lambda e: (e.start, e.end)):
        key = (e.action.stage, e.action.micro)
        if e.action.kind in (Kind.B, Kind.I) and key in reload_end:
            ready = max(last[e.rank], arrived.get(key, 0.0))
            out[e.rank] += max(0.0, min(e.start, reload_end[key]) - ready)
        last[e.rank] = e.end
    return out
