"""A Chrome/Kineto trace written by torch.profiler, read back into the schedule's actions: measured spans over the simulated step, and the differences listed by action.

    >>> match = read_trace("run.trace.json", schedule)          # doctest: +SKIP
    >>> match.missing, match.extra                               # doctest: +SKIP
    >>> print(match.table(sim.simulate(schedule, costs)))        # doctest: +SKIP
    >>> fig = match.overlay(sim.simulate(schedule, costs))       # doctest: +SKIP

The reader parses JSON only (no torch): a span (`"ph": "X"`) names an action when its name
holds one in torch.distributed.pipelining's text form as a word of its own: exec's ranks
name theirs `2F0` (`exec.runtime.interpreter`, whenever a profiler runs), torch's own
runtime `PP:2F0`, and its composite pair `PP:(0F3;3B1)OVERLAP_F_B` gives both computes
the pair's span; torch's single-stage schedules (GPipe, 1F1B) write `Forward 3` and
`Backward 3`, read as the rank's one stage. Where a file is one rank's (torch's
`distributedInfo`, or a process named `rank N` as `merge_rank_traces` writes them), a span
on a rank that does not host its stage is reported (`misplaced`); else the rank is the
schedule's. CUDA runs also trace each span on the device (`gpu_user_annotation`): those
are read where there are any. A trace of several steps holds each action several times:
`step` picks one occurrence (default the last).

Writing a trace needs torch: `trace_rank` (in each rank of `exec.pipeline.worker`, for
`RunConfig.trace`, `python -m exec.run --trace FILE`) and `merge_rank_traces` (one file
for every rank, each rank a process `rank N`, which Perfetto and chrome://tracing open).
"""
from __future__ import annotations

import contextlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import sim
from sim import Action, Event, Kind, Result, Schedule, ScheduleError
from sim.files import atomic_write

__all__ = ["TraceMatch", "read_trace", "spans_of", "trace_rank", "merge_rank_traces", "rank_part"]

_TOKEN = re.compile(r"(?<![\w(])(\d+[A-Z_]+\d*)(?![\w])")
_PAIR = re.compile(r"\((\d+F\d+);(\d+[BI]\d+)\)OVERLAP_F_B")
_SINGLE = re.compile(r"(Forward|Backward) (\d+)")  # torch's PipelineScheduleSingle spans
_RANK = re.compile(r"rank (\d+)")
DEVICE_CATEGORY = "gpu_user_annotation"


def spans_of(name: str) -> list[Action]:
    """The actions a span's name holds (none, one, or a composite pair's two)."""
    pair = _PAIR.search(name)
    if pair:
        return [Action.parse(pair.group(1)), Action.parse(pair.group(2))]
    out = []
    for token in _TOKEN.findall(name):
        try:
            out.append(Action.parse(token))
        except ScheduleError:
            pass
    return out


@dataclass
class TraceMatch:
    """A trace's spans mapped onto a schedule's compute actions."""

    schedule: Schedule
    measured: Result                           # the matched spans as a measured step (seconds)
    missing: list[Action]                      # compute actions of the schedule without a span
    extra: list[str]                           # spans that name an action the schedule does not hold
    misplaced: list[tuple[Action, int, int]]   # (action, rank in the trace, rank in the schedule)
    ignored: int = 0                           # spans that name no action (ops, kernels, other annotations)
    steps: int = 0                             # the most occurrences of one action: the steps traced
    found: dict = field(default_factory=dict)  # action -> its Event

    @property
    def ok(self) -> bool:
        """Every compute action found, each on its own rank."""
        return not self.missing and not self.misplaced

    def differences(self, simulated: Result) -> list[tuple[Action, int, float, float, float, float]]:
        """Per compute action found: (action, rank, measured start, measured duration,
        simulated start, simulated duration), starts from each step's own t0, in the
        step's program order."""
        sim_events = {e.action: e for e in simulated.events if e.action.kind.is_compute}
        t0, s0 = self.measured.t0, simulated.t0
        out = []
        for prog in self.schedule.programs:
            for a in prog:
                if a in self.found and a in sim_events:
                    m, s = self.found[a], sim_events[a]
                    out.append((a, m.rank, m.start - t0, m.duration, s.start - s0, s.duration))
        return out

    def table(self, simulated: Result, scale: float = 1e3, unit: str = "ms") -> str:
        """The differences as text, one action a line, then what is missing, extra or misplaced
        (`scale`: the measured seconds to `unit`, in which the simulated times are too)."""
        lines = [f"{'action':>8} {'rank':>4} {'start meas':>11} {'sim':>9} {'dur meas':>10} {'sim':>9} {'ratio':>6}"]
        for a, r, ms, md, ss, sd in self.differences(simulated):
            ratio = f"{md * scale / sd:6.2f}" if sd > 0 else "     -"
            lines.append(f"{str(a):>8} {r:>4} {ms * scale:>11.3f} {ss:>9.3f} {md * scale:>10.3f} {sd:>9.3f} {ratio}")
        lines.append(f"(times in {unit}; ratio = measured / simulated duration)")
        if self.missing:
            lines.append(f"missing from the trace: {', '.join(map(str, self.missing))}")
        for a, got, want in self.misplaced:
            lines.append(f"misplaced: {a} traced on rank {got}, but the schedule runs it on rank {want}")
        if self.extra:
            lines.append(f"spans naming actions the schedule does not hold (ignored): {', '.join(self.extra)}")
        return "\n".join(lines)

    def overlay(self, simulated: Result):
        """Measured spans over the simulated step, per rank (`sim.plot.gantt.plot_overlay`)."""
        from sim.plot.gantt import plot_overlay
        return plot_overlay(simulated, self.measured)


def _load(paths: str | os.PathLike | Sequence[str | os.PathLike]) -> list[dict]:
    """The trace files as JSON; a file that is missing or no trace is a ValueError naming it."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    out = []
    for p in paths:
        try:
            data = json.loads(Path(p).read_text())
        except (OSError, ValueError) as e:
            raise ValueError(f"{p}: cannot read a trace: {e}") from None
        events = data.get("traceEvents") if isinstance(data, dict) else data
        if not isinstance(events, list):
            raise ValueError(f"{p}: not a Chrome trace (no traceEvents list)")
        out.append({"events": events, "rank": (data.get("distributedInfo") or {}).get("rank")
                    if isinstance(data, dict) else None, "path": str(p)})
    return out


def _rank_names(events: Iterable[dict]) -> dict:
    """pid -> rank, where a process is named `rank N`."""
    out = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            m = _RANK.fullmatch(str((e.get("args") or {}).get("name", "")))
            if m:
                out[e.get("pid")] = int(m.group(1))
    return out


def _spans(files: list[dict], schedule: Schedule) -> tuple[list[tuple[Action, int | None, float, float]], list, int]:
    """Every span naming an action as (action, its rank in the trace or None, start, end) in
    seconds; the names of those the schedule does not hold; and how many name none."""
    one_stage = schedule.stages == schedule.ranks
    held = {a for prog in schedule.programs for a in prog}
    out, extra, ignored = [], [], 0
    for f in files:
        named = _rank_names(f["events"])
        xs = [e for e in f["events"] if e.get("ph") == "X" and "ts" in e and "dur" in e]
        if any(e.get("cat") == DEVICE_CATEGORY for e in xs):
            xs = [e for e in xs if e.get("cat") == DEVICE_CATEGORY]
        for e in xs:
            name, rank = str(e.get("name", "")), f["rank"] if f["rank"] is not None else named.get(e.get("pid"))
            actions = spans_of(name)
            single = _SINGLE.fullmatch(name)
            if not actions and single and one_stage and rank is not None:
                actions = [Action(rank, Kind.F if single.group(1) == "Forward" else Kind.B, int(single.group(2)))]
            actions = [a for a in actions if a.kind.is_compute]
            if not actions:
                ignored += 1
            start, end = float(e["ts"]) * 1e-6, (float(e["ts"]) + float(e["dur"])) * 1e-6
            for a in actions:
                if a in held:
                    out.append((a, rank, start, end))
                else:
                    extra.append(name)
    return out, sorted(set(extra)), ignored


def read_trace(paths: str | os.PathLike | Sequence[str | os.PathLike], schedule: Schedule,
               step: int = -1) -> TraceMatch:
    """Read the trace file(s) at `paths` (one merged file, or one per rank) and match their
    spans to `schedule`'s compute actions: occurrence `step` of each (default the last of
    the steps traced). A ValueError names a file that is not a trace."""
    spans, extra, ignored = _spans(_load(paths), schedule)
    by_action: dict[Action, list] = {}
    for a, rank, start, end in sorted(spans, key=lambda s: s[2]):
        by_action.setdefault(a, []).append((rank, start, end))
    steps = max(map(len, by_action.values()), default=0)
    index = step if step >= 0 else steps + step
    events, misplaced, found = [], [], {}
    for a, seen in by_action.items():
        if not 0 <= index < len(seen):
            continue
        rank, start, end = seen[index]
        want = schedule.placement[a.stage]
        if rank is not None and rank != want:
            misplaced.append((a, rank, want))
        found[a] = Event(want, a, start, end)
        events.append(found[a])
    missing = [a for prog in schedule.programs for a in prog if a.kind.is_compute and a not in found]
    measured = Result(schedule, sorted(events, key=lambda e: (e.rank, e.start)), [[] for _ in range(schedule.ranks)],
                      [[] for _ in range(schedule.ranks)], source="measured")
    return TraceMatch(schedule, measured, missing, extra, misplaced, ignored, steps, found)


def rank_part(path: str | os.PathLike, rank: int) -> Path:
    """Where rank `rank` writes its part of the trace at `path` before `merge_rank_traces`."""
    return Path(f"{path}.rank{rank}.json")


@contextlib.contextmanager
def trace_rank(path: str | os.PathLike, rank: int, device):
    """Trace what runs inside with torch.profiler (CPU, and CUDA on a GPU) into this rank's
    part (`rank_part`); exec's interpreter names each action's span (`2F0`)."""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if getattr(device, "type", "cpu") == "cuda" else [])
    with profile(activities=activities) as prof:
        yield prof
    prof.export_chrome_trace(str(rank_part(path, rank)))


def merge_rank_traces(path: str | os.PathLike, ranks: int) -> None:
    """Merge the parts `rank_part(path, 0..ranks-1)` into one trace at `path`, each rank a
    process named `rank N` (pid N); flow arrows (whose ids would clash) are dropped. The
    parts are removed."""
    merged = []
    for r in range(ranks):
        part = rank_part(path, r)
        events = json.loads(part.read_text()).get("traceEvents", [])
        merged.append({"ph": "M", "name": "process_name", "pid": r, "tid": 0, "args": {"name": f"rank {r}"}})
        merged += [dict(e, pid=r) for e in events if e.get("ph") in ("X", "i", "C")
                   or (e.get("ph") == "M" and e.get("name") == "thread_name")]
    with atomic_write(path) as f:
        json.dump({"traceEvents": merged, "displayTimeUnit": "ms"}, f)
    for r in range(ranks):
        rank_part(path, r).unlink()

