"""The schedule IR shared by `sim` and `exec`.

An `Action` names a model stage, a kind and a micro-batch; its text form is the one of
torch.distributed.pipelining (`2F0` = stage 2, forward, micro-batch 0; `0SEND_F1`).
A `Schedule` is plain data: for each device (rank) the ordered list of its actions, and
the placement of stages on devices. Generators write compute actions only (F, B, I, W);
`sim.passes.lower` derives the communication actions from the data dependencies.
"""
from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from operator import itemgetter
from typing import Iterable, NamedTuple, Sequence

from .kinds import COMPUTE, Kind


# Longest spellings first so that the alternation never stops at a prefix; fullmatch anyway.
_ACTION_RE = re.compile(r"(\d+)(" + "|".join(sorted((k.value for k in Kind), key=len, reverse=True)) + r")(\d+)")


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
        return f"{self.stage}{self.kind.value}{self.micro}"

    def __repr__(self) -> str:
        return f"Action({str(self)!r})"

    @classmethod
    def parse(cls, text: str) -> "Action":
        """Parse torch.distributed.pipelining's action string, e.g. `1B3` or `0SEND_F1`."""
        m = _ACTION_RE.fullmatch(text.strip())
        if m is None:
            raise ScheduleError(
                f"not an action: {text!r}; expected <stage><kind><micro-batch> with kind in "
                f"{', '.join(k.value for k in Kind)}, e.g. '2F0' or '0SEND_F1'"
            )
        return cls(int(m.group(1)), Kind(m.group(2)), int(m.group(3)))


def action(text: str | Action) -> Action:
    """Accept an `Action` or its text form."""
    return text if isinstance(text, Action) else Action.parse(text)


@dataclass(frozen=True)
class Schedule:
    """Per device, the ordered actions it runs, and which device hosts each stage.

    `placement[s]` is the rank that runs stage `s`; a rank may host several stages
    (interleaved and V-shaped schedules). `programs[r]` is rank r's action list.
    """

    programs: tuple[tuple[Action, ...], ...]
    placement: tuple[int, ...]
    micro: int
    name: str = "custom"

    def __init__(self, programs: Sequence[Iterable[Action | str]], placement: Sequence[int] | None = None,
                 micro: int | None = None, name: str = "custom"):
        # generators hand over Actions already; only text needs parsing
        progs = tuple(prog if set(map(type, prog)) <= {Action} else tuple(map(action, prog))
                      for prog in map(tuple, programs))
        if not progs:
            raise ScheduleError("a schedule needs at least one device")
        if placement is None:  # one stage per device, stage s on rank s
            placement = range(len(progs))
        placement = tuple(int(r) for r in placement)
        if micro is None:
            micro = 1 + max((a.micro for prog in progs for a in prog), default=-1)
        object.__setattr__(self, "programs", progs)
        object.__setattr__(self, "placement", placement)
        object.__setattr__(self, "micro", int(micro))
        object.__setattr__(self, "name", name)
        # asked often and the programs never change: compute it once
        object.__setattr__(self, "_lowered",
                           not COMPUTE.issuperset(map(itemgetter(1), itertools.chain.from_iterable(progs))))

    @property
    def ranks(self) -> int:
        return len(self.programs)

    @property
    def stages(self) -> int:
        return len(self.placement)

    def rank_of(self, stage: int) -> int:
        return self.placement[stage]

    def compute_only(self) -> "Schedule":
        """The same schedule without communication actions."""
        return Schedule([[a for a in p if a.kind.is_compute] for p in self.programs],
                        self.placement, self.micro, self.name)

    @property
    def is_lowered(self) -> bool:
        """Whether the programs hold SEND/RECV actions (see `sim.passes.lower`)."""
        return self._lowered

    def to_csv(self) -> str:
        """torch's CSV: no header, row i = rank i, one action string per cell."""
        return "".join(",".join(str(a) for a in prog) + "\n" for prog in self.programs)

    @classmethod
    def from_csv(cls, text: str, placement: Sequence[int] | None = None, name: str = "custom") -> "Schedule":
        """Read torch's CSV. Empty cells are idle steps and are dropped (timing is the
        simulator's business, not the IR's)."""
        rows = text.splitlines()
        while rows and not rows[-1].strip():
            rows.pop()
        programs = []
        for i, row in enumerate(rows):
            cells = [c.strip() for c in row.split(",")]
            try:
                programs.append([Action.parse(c) for c in cells if c])
            except ScheduleError as e:
                raise ScheduleError(f"row {i} (rank {i}): {e}") from None
        return cls(programs, placement, name=name)

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
                f"{n(self.micro, 'micro-batch', 'micro-batches')}\n" + self.grid())
