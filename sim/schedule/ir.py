"""The schedule IR shared by `sim` and `exec`.

An `Action` names a model stage, a kind and a micro-batch; its text form is the one of
torch.distributed.pipelining (`2F0` = stage 2, forward, micro-batch 0; `0SEND_F1`).
A kind done once per stage per step (`sim.schedule.kinds.ONCE_PER_STAGE`: REDUCE_GRAD) has no
micro-batch: its text form omits it, as torch's does (`0REDUCE_GRAD`), and its `Action`
has micro-batch 0. FSDP's UNSHARD and RESHARD (`sim.schedule.kinds.GATHERS`) count a
stage's gathers in their micro-batch, written only where it is not 0 (`0UNSHARD`, as
torch writes it; `0UNSHARD1`, which torch reads).
A `Schedule` is plain data: for each device (rank) the ordered list of its actions, and
the placement of stages on devices. Generators write compute actions only (F, B, I, W);
`sim.passes.grad_reduce.add_grad_reduce` adds the data-parallel reductions (REDUCE_GRAD),
`sim.passes.offload.add_offload` the copies of activations to host memory and back (OFFLOAD,
RELOAD), `sim.passes.fsdp.add_fsdp` FSDP's gathers and releases (UNSHARD, RESHARD), and
`sim.passes.lowering.lower` derives the communication actions from the data dependencies.
"""
from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from operator import itemgetter
from typing import Callable, Iterable, NamedTuple, Sequence

from .kinds import BESIDE, COPIES, GATHERS, ONCE_PER_STAGE, PAIRS, TRANSFERS, Kind


def _alternatives(kinds) -> str:
    # longest spellings first so that the alternation never stops at a prefix; fullmatch anyway
    return "|".join(sorted((k.value for k in kinds), key=len, reverse=True))


# <stage><kind><micro-batch>, <stage><kind> for a kind done once per stage, and either for a gather
_ACTION_RE = re.compile(r"(\d+)(?:(" + _alternatives(set(Kind) - ONCE_PER_STAGE - GATHERS) + r")(\d+)|("
                        + _alternatives(ONCE_PER_STAGE) + r")|(" + _alternatives(GATHERS) + r")(\d*))")


class ScheduleError(ValueError):
    """A schedule is malformed, incomplete, or would deadlock."""


class Action(NamedTuple):
    """One step of a device's program: `stage` `kind` `micro` (e.g. `2F0`).

    A named tuple: schedules of a million actions build and hash these in bulk, and a tuple
    does both several times faster than a dataclass."""

    stage: int
    kind: Kind
    micro: int

    def __str__(self) -> str:
        if self.kind in ONCE_PER_STAGE:
            # micro-batch 0 always: `Schedule` refuses another, and names it so
            return f"{self.stage}{self.kind.value}" + (f"(micro={self.micro})" if self.micro else "")
        if self.kind in GATHERS and not self.micro:
            return f"{self.stage}{self.kind.value}"
        return f"{self.stage}{self.kind.value}{self.micro}"

    def __repr__(self) -> str:
        return f"Action({str(self)!r})"

    @classmethod
    def parse(cls, text: str) -> "Action":
        """Parse torch.distributed.pipelining's action string, e.g. `1B3`, `0SEND_F1` or
        `0REDUCE_GRAD` (a kind done once per stage has no micro-batch); `0UNSHARD` is
        `0UNSHARD0`."""
        m = _ACTION_RE.fullmatch(text.strip())
        if m is None:
            raise ScheduleError(
                f"not an action: {text!r}; expected <stage><kind><micro-batch> with kind in "
                f"{', '.join(k.value for k in Kind if k not in ONCE_PER_STAGE)}, e.g. '2F0' or '0SEND_F1', "
                f"or <stage><kind> with kind in {', '.join(k.value for k in ONCE_PER_STAGE)}, e.g. '0REDUCE_GRAD'"
            )
        if m.group(4):
            return cls(int(m.group(1)), Kind(m.group(4)), 0)
        if m.group(5):
            return cls(int(m.group(1)), Kind(m.group(5)), int(m.group(6) or 0))
        return cls(int(m.group(1)), Kind(m.group(2)), int(m.group(3)))


Where = Callable[..., str]  # (rank, step) -> how an error names that cell; (rank) -> that row


def _at_step(rank: int, step: int | None = None) -> str:
    return f"rank {rank}" if step is None else f"rank {rank} step {step}"


def check_actions(programs: Sequence[Sequence[Action]], placement: Sequence[int], micro_batches: int,
                  where: Where = _at_step, pipelines: int = 1) -> None:
    """No action appears twice, and every stage has, for every micro-batch that runs through
    it (`route`), its forward F and its backward (B, or I and W). Raises `ScheduleError`
    naming the cell (`where`).

    This is the one check of completeness. What else can be wrong (an action on the wrong
    rank, a stage or micro-batch that does not exist: `sim.passes.checks.check_complete`;
    a deadlock: `sim.validate`) is checked before a schedule is lowered or run. A fast
    pass counts with C-level tools; only a schedule that fails it is walked action by action."""
    total = sum(map(len, programs))
    unique = set(itertools.chain.from_iterable(programs))
    stages = len(placement)
    if len(unique) == total:
        # S*M distinct Fs and Bs: all there, unless some name a stage or micro-batch that
        # does not exist, which validate says
        listed = list(map(itemgetter(1), unique))   # (list.count: a quarter of Counter's time)
        kinds = {k: listed.count(k) for k in (Kind.F, Kind.B, Kind.I, Kind.W)}
        if kinds[Kind.F] == kinds[Kind.B] == stages // pipelines * micro_batches and not kinds[Kind.I] \
                and not kinds[Kind.W]:
            return
        if pipelines == 1 and _split_complete(unique, kinds, stages, micro_batches):
            return
    cells = _first_cells(programs, unique if len(unique) == total else None, where)
    for m in range(micro_batches):
        for s in route(m, stages, micro_batches, pipelines):
            _check_stage_micro(s, m, placement[s], cells, where)


def _split_complete(unique: set, kinds: dict[Kind, int], stages: int, micro_batches: int) -> bool:
    """Whether every (stage, micro-batch) of one pipeline has its F, I and W and none its B: the
    fast pass for a split backward (C-level: an `Action` is a tuple, equal to the plain one)."""
    cells = stages * micro_batches
    if kinds[Kind.B] or not kinds[Kind.F] == kinds[Kind.I] == kinds[Kind.W] == cells:
        return False
    return unique.issuperset(itertools.product(range(stages), (Kind.F, Kind.I, Kind.W), range(micro_batches)))


def route(index: int, stages: int, micro_batches: int, pipelines: int = 1) -> range:
    """The stages micro-batch number `index` runs through: all of them in one pipeline; with
    `pipelines` = k copies of the model (DualPipe's two directions), the stages are k
    chains of stages/k, and the micro-batches k equal groups in order, group g running
    chain g (`Schedule.pipelines`)."""
    chain = stages // pipelines
    first = index // (micro_batches // pipelines) * chain
    return range(first, first + chain)


def _check_per_stage(programs: Sequence[Sequence[Action]], where: Where) -> None:
    """An action of a kind done once per stage (REDUCE_GRAD) has micro-batch 0."""
    for r, prog in enumerate(programs):
        for i, a in enumerate(prog):
            if a.kind in ONCE_PER_STAGE and a.micro != 0:
                raise ScheduleError(f"{a} at {where(r, i)}: a {a.kind.value} is done once per stage and has no "
                                    f"micro-batch; write it {a.stage}{a.kind.value} (micro-batch 0)")


def _first_cells(programs: Sequence[Sequence[Action]], unique: set | None, where: Where) -> dict[Action, tuple[int, int]]:
    """Where each action first appears; raises on the first one that appears again."""
    cells: dict[Action, tuple[int, int]] = {}
    for r, prog in enumerate(programs):
        for i, a in enumerate(prog):
            if unique is None and a in cells:
                n = sum(p.count(a) for p in programs)
                raise ScheduleError(f"{a} appears {n} times, at {where(*cells[a])} and {where(r, i)}"
                                    f"{' and later' if n > 2 else ''}; each action runs exactly once")
            cells.setdefault(a, (r, i))
    return cells


def _check_stage_micro(s: int, m: int, rank: int, cells: dict[Action, tuple[int, int]], where: Where) -> None:
    f, b, i, w = (Action(s, k, m) for k in (Kind.F, Kind.B, Kind.I, Kind.W))
    has = [a for a in (f, b, i, w) if a in cells]
    if f not in cells:
        also = f" (its {has[0]} is at {where(*cells[has[0]])})" if has else ""
        raise ScheduleError(f"{f} is missing: {where(rank)}, which hosts stage {s}, has no forward of "
                            f"micro-batch {m}{also}; every stage runs every micro-batch forward")
    if b in cells and (i in cells or w in cells):
        split = i if i in cells else w
        raise ScheduleError(f"stage {s} micro-batch {m} has both B and I/W ({b} at {where(*cells[b])}, {split} at "
                            f"{where(*cells[split])}); use B, or I and W")
    if b not in cells and (i in cells) != (w in cells):
        there, gone = (i, w) if i in cells else (w, i)
        raise ScheduleError(f"{gone} is missing: {there} is at {where(*cells[there])}, half of a split backward, "
                            f"but {where(rank)} has no {gone}; every micro-batch needs its backward on every stage")
    if b not in cells and i not in cells:
        raise ScheduleError(f"{b} is missing: {f} is at {where(*cells[f])}, but {where(rank)} has no backward of it "
                            f"(B, or I and W); every micro-batch needs its backward on every stage")


def placement_of(programs: Sequence[Sequence[Action]]) -> Sequence[int]:
    """Stage s on rank s, unless the programs name more stages than ranks (several stages
    per rank, as a CSV of an interleaved or V-shaped schedule): then each stage on the first
    rank that computes it."""
    stages = 1 + max((a.stage for prog in programs for a in prog), default=-1)
    if stages <= len(programs):
        return range(len(programs))
    where: dict[int, int] = {}
    for r, prog in enumerate(programs):
        for a in prog:
            if a.kind.is_compute:
                where.setdefault(a.stage, r)
    return [where.get(s, s % len(programs)) for s in range(stages)]


def _check_pipelines(pipelines: int, stages: int, micro_batches: int) -> None:
    """`pipelines` copies of the model divide the stages and the micro-batches evenly."""
    if isinstance(pipelines, bool) or not isinstance(pipelines, int) or pipelines < 1:
        raise ScheduleError(f"pipelines must be a positive integer, got {pipelines!r}")
    if stages % pipelines or micro_batches % pipelines:
        raise ScheduleError(f"{pipelines} pipelines (copies of the model) must divide the {stages} stages and the "
                            f"{micro_batches} micro-batches evenly")


def pipelines_of(programs: Sequence[Sequence[Action]]) -> int:
    """k where micro-batch 0 runs forward through stages 0..S/k-1 exactly (of S stages),
    k copies of the model; else 1."""
    stages = 1 + max((a.stage for prog in programs for a in prog), default=-1)
    first = {a.stage for prog in programs for a in prog if a.kind is Kind.F and a.micro == 0}
    if first and first == set(range(len(first))) and stages % len(first) == 0:
        return stages // len(first)
    return 1


def action(text: str | Action) -> Action:
    """Accept an `Action` or its text form."""
    return text if isinstance(text, Action) else Action.parse(text)


@dataclass(frozen=True)
class Schedule:
    """Per device, the ordered actions it runs, and which device hosts each stage.

    `placement[s]` is the rank that runs stage `s`; a rank may host several stages
    (interleaved and V-shaped schedules). Without it, stage s is on rank s, or, where the
    programs name more stages than ranks, on the rank that computes it. `programs[r]` is
    rank r's action list.
    """

    programs: tuple[tuple[Action, ...], ...]
    placement: tuple[int, ...]
    micro_batches: int
    name: str = "custom"
    pipelines: int = 1

    def __init__(self, programs: Sequence[Iterable[Action | str]], placement: Sequence[int] | None = None,
                 micro_batches: int | None = None, name: str = "custom", pipelines: int = 1):
        # generators hand over Actions already; only text needs parsing
        progs = tuple(prog if set(map(type, prog)) <= {Action} else tuple(map(action, prog))
                      for prog in map(tuple, programs))
        self._init(progs, placement, micro_batches, name, _at_step, pipelines)

    def _init(self, progs: tuple[tuple[Action, ...], ...], placement: Sequence[int] | None,
              micro_batches: int | None, name: str, where: Where, pipelines: int = 1) -> None:
        """Set the fields and check the actions (`check_actions`); `where` names a cell in errors."""
        if not progs:
            raise ScheduleError("a schedule needs at least one device")
        if placement is None:
            placement = placement_of(progs)
        placement = tuple(int(r) for r in placement)
        if micro_batches is None:
            micro_batches = 1 + max((a.micro for prog in progs for a in prog if a.kind not in GATHERS), default=-1)
        _check_pipelines(pipelines, len(placement), int(micro_batches))
        check_actions(progs, placement, int(micro_batches), where, pipelines)
        # asked often and the programs never change: compute them once
        kinds = set(map(itemgetter(1), itertools.chain.from_iterable(progs)))
        if not ONCE_PER_STAGE.isdisjoint(kinds):
            _check_per_stage(progs, where)
        object.__setattr__(self, "programs", progs)
        object.__setattr__(self, "placement", placement)
        object.__setattr__(self, "micro_batches", int(micro_batches))
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "pipelines", pipelines)
        object.__setattr__(self, "_lowered", not TRANSFERS.isdisjoint(kinds))
        object.__setattr__(self, "_collectives", not ONCE_PER_STAGE.isdisjoint(kinds))
        object.__setattr__(self, "_copies", not COPIES.isdisjoint(kinds))
        object.__setattr__(self, "_beside", not BESIDE.isdisjoint(kinds))
        object.__setattr__(self, "_pairs", not PAIRS.isdisjoint(kinds))
        object.__setattr__(self, "_gathers", not GATHERS.isdisjoint(kinds))

    @property
    def ranks(self) -> int:
        return len(self.programs)

    @property
    def stages(self) -> int:
        """The model stages (P*V); the devices are `ranks`."""
        return len(self.placement)

    @property
    def chain(self) -> int:
        """The stages one micro-batch runs through: `stages`, or stages / pipelines where
        the schedule holds several copies of the model (DualPipe: 2). Stage s is stage
        s mod chain of its copy; what a stage's first and last are, the kinds' `needs` ask
        of the chain (`sim.schedule.kinds`)."""
        return len(self.placement) // self.pipelines

    def route(self, index: int) -> range:
        """The stages micro-batch number `index` runs through (`sim.schedule.ir.route`)."""
        return route(index, self.stages, self.micro_batches, self.pipelines)

    def with_programs(self, programs: Sequence[Iterable[Action | str]]) -> "Schedule":
        """The same schedule (placement, micro-batches, name, pipelines) with other programs:
        what a pass that adds or removes actions returns."""
        return Schedule(programs, self.placement, self.micro_batches, self.name, self.pipelines)

    def rank_of(self, stage: int) -> int:
        return self.placement[stage]

    def compute_only(self) -> "Schedule":
        """The same schedule without its transfers (SEND, RECV): what `sim.lower` started
        from. Collectives (REDUCE_GRAD), copies (OFFLOAD, RELOAD) and gathers (UNSHARD,
        RESHARD) stay where they are."""
        return self.with_programs([a for a in p if a.kind not in TRANSFERS] for p in self.programs)

    @property
    def is_lowered(self) -> bool:
        """Whether the programs hold SEND/RECV actions (see `sim.passes.lowering.lower`)."""
        return self._lowered

    @property
    def has_collectives(self) -> bool:
        """Whether the programs hold collectives (REDUCE_GRAD, `sim.passes.grad_reduce.add_grad_reduce`)."""
        return self._collectives

    @property
    def has_copies(self) -> bool:
        """Whether the programs hold copies to host memory and back (OFFLOAD, RELOAD: `sim.add_offload`)."""
        return self._copies

    @property
    def has_gathers(self) -> bool:
        """Whether the programs hold FSDP's gathers and releases (UNSHARD, RESHARD: `sim.add_fsdp`)."""
        return self._gathers

    @property
    def has_beside(self) -> bool:
        """Whether the programs hold actions that run beside the device (collectives,
        copies: `sim.schedule.kinds.BESIDE`)."""
        return self._beside

    @property
    def has_pairs(self) -> bool:
        """Whether the programs hold overlapped forward-backward pairs (OVERLAP_F_B marks)."""
        return self._pairs

    def to_csv(self) -> str:
        """torch's CSV: no header, row i = rank i, one action string per cell."""
        return "".join(",".join(str(a) for a in prog) + "\n" for prog in self.programs)

    @classmethod
    def from_csv(cls, text: str, placement: Sequence[int] | None = None, name: str = "custom",
                 pipelines: int | None = None) -> "Schedule":
        """Read torch's CSV. Empty cells are idle steps and are dropped (timing is the
        simulator's business, not the IR's); errors name the cell by row and column.
        Without `placement`, stage s is on rank s, unless the rows name more stages than
        there are rows (interleaved, V-shaped): then each stage is on the row that runs it.
        Without `pipelines`, k copies of the model where micro-batch 0 runs forward through
        exactly the first 1/k of the stages (DualPipe's CSV), else one."""
        rows = text.splitlines()
        while rows and not rows[-1].strip():
            rows.pop()
        programs, columns = [], []
        for i, row in enumerate(rows):
            cells = [(j, c.strip()) for j, c in enumerate(row.split(",")) if c.strip()]
            try:
                programs.append(tuple(Action.parse(c) for _, c in cells))
            except ScheduleError as e:
                raise ScheduleError(f"row {i} (rank {i}): {e}") from None
            columns.append([j for j, _ in cells])

        def at_cell(rank: int, step: int | None = None) -> str:
            if step is None:
                return f"row {rank} (rank {rank})"
            return f"row {rank} column {columns[rank][step]} (rank {rank} step {step})"

        if placement is None and max((a.stage for prog in programs for a in prog), default=-1) >= len(programs):
            placement = placement_of(programs)
        schedule = cls.__new__(cls)
        if pipelines is None:
            pipelines = pipelines_of(programs)
        schedule._init(tuple(programs), placement, None, name, at_cell, pipelines)
        return schedule


    def grid(self, mark: dict[int, int] | None = None) -> str:
        """A step x rank table of the programs; `mark[rank] = index` flags a cell with `*`."""
        mark = mark or {}
        width = max([len(str(a)) for p in self.programs for a in p] + [4]) + 1
        header = "step " + "".join(f"{'rank' + str(r):>{width + 1}}" for r in range(self.ranks))
        lines = [header]
        for step in range(max(len(p) for p in self.programs)):
            cells = []
            for r, prog in enumerate(self.programs):
                text = str(prog[step]) if step < len(prog) else ""
                text += "*" if mark.get(r) == step else " "
                cells.append(f"{text:>{width + 1}}")
            lines.append(f"{step:>4} " + "".join(cells))
        return "\n".join(lines)

    def __str__(self) -> str:
        def n(count: int, word: str, many: str) -> str:
            return f"{count} {word if count == 1 else many}"

        return (f"Schedule {self.name!r}: {n(self.stages, 'stage', 'stages')} on {n(self.ranks, 'device', 'devices')}, "
                f"{n(self.micro_batches, 'micro-batch', 'micro-batches')}\n" + self.grid())
