"""A hand-written schedule checked cell by cell: every problem found, each with its rank, step, action and what is wrong, for the step x rank grid (`sim.check_schedule`).

    >>> report = check_schedule("0F0 0B0\\n1B0 1F0")
    >>> [(p.rank, p.step, p.action, p.kind) for p in report.problems]
    [(1, 0, '1B0', 'before its dependency'), (0, 1, '0B0', 'deadlock')]
    >>> report.ok, check_schedule("0F0 0B0\\n1F0 1B0").ok
    (False, True)

The checks are the passes' own, asked for every cell rather than stopped at the first:
cells that are not actions (`sim.schedule.text.scan_cells`); each action once, on the rank
that hosts its stage, and every forward and backward there (as `Schedule` checks it);
what `sim.passes.checks.check_complete` refuses; an action before its dependency on its
own rank; a deadlock (`sim.passes.validation.stuck_actions`: each rank's stuck cell and
what it waits for); a lowered schedule's transfers out of NCCL's order
(`sim.passes.order.order_mismatches`); and a memory limit exceeded
(`sim.schedule.liveness.held_by_step`). `ScheduleReport.checked()` returns the schedule,
or raises `ScheduleError` with the problems and the grid; `sim.plot.grid.plot_grid` draws it.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import NamedTuple, Sequence

from sim.schedule.ir import Action, Schedule, ScheduleError, pipelines_of, placement_of, route
from sim.schedule.kinds import COMPUTE, GATHERS, Kind
from sim.schedule.liveness import held_by_step
from sim.schedule.text import Cell, scan_cells
from .checks import check_communication, check_complete
from .dependencies import compute_set, dependencies
from .lowering import lower_unchecked
from .order import order_mismatches
from .validation import stuck_actions

__all__ = ["Problem", "ScheduleReport", "check_schedule"]


class Problem(NamedTuple):
    """What is wrong at one cell: `rank` and `step` (None where no cell holds it: a missing
    action, or a problem of the whole schedule), the `action` as written, the `kind` of
    problem and `what`, one line."""

    rank: int | None
    step: int | None
    action: str
    kind: str
    what: str

    def __str__(self) -> str:
        where = "" if self.rank is None else f"rank {self.rank}" + ("" if self.step is None else f" step {self.step}")
        return f"{where + ': ' if where else ''}{self.action}: {self.kind}: {self.what}"


@dataclass
class ScheduleReport:
    """A schedule as written (`cells`, per rank), the `Schedule` it makes (None where it
    makes none) and its `problems`."""

    cells: list[list[Cell]]
    schedule: Schedule | None
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def grid(self) -> str:
        """The step x rank table of the cells, each bad cell marked `!n` (problem n)."""
        marks: dict[tuple[int, int], list[int]] = {}
        for n, p in enumerate(self.problems, 1):
            if p.rank is not None and p.step is not None:
                marks.setdefault((p.rank, p.step), []).append(n)
        text = {(c.rank, c.step): str(c.action) if c.action is not None else c.text for row in self.cells for c in row}
        cell = lambda r, i: text.get((r, i), "") + "".join(f"!{n}" for n in marks.get((r, i), []))  # noqa: E731
        steps = max((len(row) for row in self.cells), default=0)
        width = max([len(cell(r, i)) for r in range(len(self.cells)) for i in range(steps)] + [5]) + 1
        lines = ["step " + "".join(f"{'rank' + str(r):>{width}}" for r in range(len(self.cells)))]
        lines += [f"{i:>4} " + "".join(f"{cell(r, i):>{width}}" for r in range(len(self.cells))) for i in range(steps)]
        return "\n".join(lines)

    def __str__(self) -> str:
        head = "the schedule checks clean" if self.ok else f"{len(self.problems)} problem(s):"
        return "\n".join([head, *(f"  !{n} {p}" for n, p in enumerate(self.problems, 1)), self.grid()])

    def checked(self) -> Schedule:
        """The schedule, if it has no problem; else raise `ScheduleError` with them and the grid."""
        if not self.ok:
            raise ScheduleError(str(self))
        return self.schedule


def check_schedule(source: str | Schedule, *, max_held: int | None = None, memory_limit: float | None = None,
                   costs=None, placement: Sequence[int] | None = None, pipelines: int | None = None,
                   name: str = "custom") -> ScheduleReport:
    """Check a schedule written as text or torch's CSV (`sim.schedule.text`), or a
    `Schedule`, cell by cell (the module's docstring). `max_held`: the micro-batch chunks a
    rank may hold at once; `memory_limit` with `costs` (`sim.Costs`): the bytes of
    activations it may."""
    if isinstance(source, Schedule):
        cells = [[Cell(r, i, i, a, str(a)) for i, a in enumerate(p)] for r, p in enumerate(source.programs)]
    else:
        cells = scan_cells(source)
    report = ScheduleReport(cells, None)
    bad = [Problem(c.rank, c.step, c.text, "not an action", c.why) for row in cells for c in row if c.action is None]
    if bad or not cells:
        report.problems = bad or [Problem(None, None, "", "empty", "a schedule needs at least one rank")]
        return report
    programs = [[c.action for c in row] for row in cells]
    places = list(placement) if placement is not None else list(placement_of(programs))
    report.problems = _completeness(programs, places, pipelines or pipelines_of(programs))
    if report.problems:
        return report
    try:
        schedule = Schedule(programs, places, None, name, pipelines or pipelines_of(programs))
        check_complete(schedule)
    except ScheduleError as e:
        report.problems = [Problem(None, None, "", "malformed", str(e).splitlines()[0])]
        return report
    report.schedule = schedule
    report.problems = _before_dependencies(schedule)
    report.problems += _deadlock(schedule, {p.rank for p in report.problems})
    if schedule.is_lowered:
        report.problems += _order(schedule)
    if max_held is not None or memory_limit is not None:
        report.problems += _memory(schedule, max_held, memory_limit, costs)
    return report


def _completeness(programs: list[list[Action]], placement: Sequence[int], pipelines: int) -> list[Problem]:
    """Each action once, on the rank that hosts its stage, of an existing stage and
    micro-batch; every stage's forward and backward of each micro-batch that runs through it."""
    out, seen = [], {}
    stages = len(placement)
    micros = 1 + max((a.micro for p in programs for a in p if a.kind not in GATHERS), default=-1)
    for r, prog in enumerate(programs):
        for i, a in enumerate(prog):
            if a in seen:
                out.append(Problem(r, i, str(a), "duplicate", f"already at rank {seen[a][0]} step {seen[a][1]}; "
                                                              f"each action runs once"))
                continue
            seen[a] = (r, i)
            if not 0 <= a.stage < stages or placement[a.stage] != r:
                host = f"lives on rank {placement[a.stage]}" if 0 <= a.stage < stages else "does not exist"
                out.append(Problem(r, i, str(a), "wrong rank", f"stage {a.stage} {host}, not rank {r}"))
    if micros % pipelines or stages % pipelines:
        return out + [Problem(None, None, "", "malformed", f"{pipelines} copies of the model must divide the "
                                                            f"{stages} stages and {micros} micro-batches")]
    for m in range(micros):
        for s in route(m, stages, micros, pipelines):
            for a in _missing(seen, s, m):
                out.append(Problem(placement[s], None, str(a), "missing", f"rank {placement[s]} hosts stage {s} "
                                                                           f"but never runs {a}"))
    return out


def _missing(seen: dict, s: int, m: int) -> list[Action]:
    """The forward and backward of (s, m) that are not there (B, or I and W)."""
    f, b, i, w = (Action(s, k, m) for k in (Kind.F, Kind.B, Kind.I, Kind.W))
    out = [] if f in seen else [f]
    if b not in seen:
        out += [b] if i not in seen and w not in seen else [x for x in (i, w) if x not in seen]
    return out


def _before_dependencies(schedule: Schedule) -> list[Problem]:
    """Each compute placed before a compute of its own rank that it needs."""
    computes, out = compute_set(schedule), []
    for r, prog in enumerate(schedule.programs):
        at = {a: i for i, a in enumerate(prog)}
        for i, a in enumerate(prog):
            if a.kind not in COMPUTE:
                continue
            for d in dependencies(a, schedule.chain, computes):
                if at.get(d, -1) > i:
                    out.append(Problem(r, i, str(a), "before its dependency",
                                       f"needs {d}, which this rank runs later, at step {at[d]}"))
    return out


def _deadlock(schedule: Schedule, explained: set) -> list[Problem]:
    """Each rank's cell where the abstract run gets stuck, and what it waits for (ranks
    whose stop an action before its dependency explains are left out)."""
    try:
        if schedule.is_lowered:
            check_communication(schedule)
            lowered = schedule
        else:
            lowered = lower_unchecked(schedule)
    except ScheduleError as e:
        return [Problem(None, None, "", "communication", str(e))]
    out = []
    for r, (i, why) in sorted(stuck_actions(lowered).items()):
        if r in explained:
            continue
        # the cell as written: the stuck action, or (a transfer `lower` added) the next one written
        written = {a: j for j, a in enumerate(schedule.programs[r])}
        later = [written[a] for a in lowered.programs[r][i:] if a in written]
        step = later[0] if later else len(schedule.programs[r]) - 1
        out.append(Problem(r, step, str(schedule.programs[r][step]), "deadlock",
                           f"rank {r} stops here: {lowered.programs[r][i]} waits for {why}"))
    return out


def _order(schedule: Schedule) -> list[Problem]:
    """Each RECV that NCCL, which pairs transfers by the order they are posted, would pair wrongly."""
    return [Problem(b, recv.step, str(recv.action), "NCCL order",
                    f"transfer {k} from rank {a}: rank {a} step {send.step} sends {send.action} then, so NCCL "
                    f"pairs them; post the RECVs in the order rank {a} sends")
            for a, b, k, send, recv in order_mismatches(schedule)]


def _memory(schedule: Schedule, max_held: int | None, memory_limit: float | None, costs) -> list[Problem]:
    """The first cell of each rank where it holds more than `max_held` micro-batch chunks,
    or more than `memory_limit` bytes of activations under `costs`."""
    if memory_limit is not None and costs is None:
        raise ValueError("memory_limit counts bytes of activations: give the costs that say them (sim.Costs)")
    out, per_stage = [], costs.for_stages(schedule.stages) if costs is not None else None
    for limit, unit, use in ((max_held, "micro-batches", None), (memory_limit, "bytes of activations", per_stage)):
        if limit is None:
            continue
        for r, prog in enumerate(schedule.programs):
            over = [(i, n) for i, n in enumerate(held_by_step(prog, use)) if n > limit]
            if over:
                i, n = over[0]
                out.append(Problem(r, i, str(prog[i]), "memory", f"rank {r} holds {n:g} {unit} here, over the "
                                                                 f"limit of {limit:g}"))
    return out
