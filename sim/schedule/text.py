"""A schedule written by hand: the text form (one line a rank, `0F0 0F1 0B0 ...`) and torch.distributed.pipelining's CSV, read cell by cell and written back.

    >>> cells = read_cells("0F0 0F1 0B0 0B1\\n1F0 1B0 1F1 1B1")
    >>> [str(c.action) for c in cells[1]]
    ['1F0', '1B0', '1F1', '1B1']
    >>> print(schedule_text(read_schedule("0F0,(0F1;0B0)OVERLAP_F_B,0B1\\n"), csv=True), end="")
    0F0,(0F1;0B0)OVERLAP_F_B,0B1

Both forms hold one row per rank and one action per cell, in torch's text form (`2F0`,
`0SEND_F1`, `0REDUCE_GRAD`: `sim.schedule.ir.Action.parse`). A row is CSV where it holds a
comma (torch's `_dump_csv`; an empty cell is an idle step and is dropped), else its actions
are separated by spaces. `#` starts a comment; blank lines are no rank. torch writes an
overlapped forward-backward pair as one composite cell, `(0F3;3B1)OVERLAP_F_B` (its F
first, then the backward); in our IR that is an OVERLAP_F_B mark naming the backward,
then the F, then the backward (`sim.schedule.kinds`, rule 18), and it is written back as
torch writes it. `read_cells` keeps each action's row and column, so that a check can
name the cell a student wrote (`sim.passes.diagnose`); `read_schedule` makes the `Schedule`.
"""
from __future__ import annotations

import re
from typing import NamedTuple, Sequence

from .ir import Action, Schedule, ScheduleError
from .kinds import Kind

__all__ = ["Cell", "scan_cells", "read_cells", "read_schedule", "schedule_text", "is_csv"]

_PAIR_RE = re.compile(r"\(([^;()]+);([^;()]+)\)OVERLAP_F_B")


class Cell(NamedTuple):
    """One action as written: its rank (row), its step (index in the rank's program), the
    column of the row it came from, and `text`, what the cell said. A cell that is not
    an action has `action` None and `why` says what is wrong with it."""

    rank: int
    step: int
    column: int
    action: Action | None
    text: str
    why: str = ""


def is_csv(text: str) -> bool:
    """Whether `text` is torch's CSV (a comma in any row), not the space-separated form."""
    return any("," in line.split("#", 1)[0] for line in text.splitlines())


def _rows(text: str) -> list[list[str]]:
    """The cells of each row, as written (comments and blank lines dropped)."""
    csv = is_csv(text)
    rows = []
    for line in text.splitlines():
        line = line.split("#", 1)[0]
        if line.strip():
            rows.append(line.split(",") if csv else line.split())
    return rows


def _actions(cell: str) -> list[Action]:
    """The actions of one cell: one, or torch's composite pair as the mark, its F and its backward."""
    pair = _PAIR_RE.fullmatch(cell)
    if pair is None:
        return [Action.parse(cell)]
    f, b = Action.parse(pair.group(1)), Action.parse(pair.group(2))
    if f.kind is not Kind.F or b.kind not in (Kind.B, Kind.I):
        raise ScheduleError(f"{cell!r}: an overlapped pair is (forward;backward)OVERLAP_F_B, e.g. (0F3;3B1)OVERLAP_F_B")
    return [Action(b.stage, Kind.OVERLAP_F_B, b.micro), f, b]


def scan_cells(text: str) -> list[list[Cell]]:
    """Per rank, its cells in order, a cell that is not an action included (`action` None)."""
    if not isinstance(text, str):
        raise TypeError(f"a schedule's text must be a str, got {type(text).__name__}")
    out = []
    for r, row in enumerate(_rows(text)):
        cells: list[Cell] = []
        for j, cell in enumerate(c.strip() for c in row):
            if not cell:
                continue  # an idle step of torch's CSV
            try:
                cells += [Cell(r, len(cells) + i, j, a, cell) for i, a in enumerate(_actions(cell))]
            except ScheduleError as e:
                cells.append(Cell(r, len(cells), j, None, cell, str(e)))
        out.append(cells)
    return out


def read_cells(text: str) -> list[list[Cell]]:
    """Per rank, its cells in order. Raises `ScheduleError` naming the first cell that is
    not an action by its row and column (`scan_cells` keeps them all)."""
    rows = scan_cells(text)
    for c in (c for row in rows for c in row if c.action is None):
        raise ScheduleError(f"row {c.rank} (rank {c.rank}) column {c.column}: {c.why}")
    return rows


def read_schedule(text: str, placement: Sequence[int] | None = None, name: str = "custom",
                  pipelines: int | None = None) -> Schedule:
    """The `Schedule` written in `text` (either form; `Schedule.from_csv` says how the
    placement and the copies of the model are found when not given). Raises
    `ScheduleError` for a cell that is not an action or a schedule that is incomplete;
    whether it can run is `sim.check_schedule`'s question."""
    programs = [[c.action for c in row] for row in read_cells(text)]
    return Schedule.from_csv("".join(",".join(map(str, p)) + "\n" for p in programs), placement, name, pipelines)


def schedule_text(schedule: Schedule, csv: bool = False) -> str:
    """`schedule` written out, one line a rank: its actions separated by spaces, or by
    commas (`csv`, torch's CSV); an OVERLAP_F_B mark and the two computes it pairs as
    torch's composite cell `(F;B)OVERLAP_F_B`. `read_schedule` reads it back."""
    lines = []
    for prog in schedule.programs:
        cells, i = [], 0
        while i < len(prog):
            a = prog[i]
            if a.kind is Kind.OVERLAP_F_B and i + 2 < len(prog) and _pairs(a, prog[i + 1], prog[i + 2]):
                cells.append(f"({prog[i + 1]};{prog[i + 2]})OVERLAP_F_B")
                i += 3
                continue
            cells.append(str(a))
            i += 1
        lines.append(("," if csv else " ").join(cells) + "\n")
    return "".join(lines)


def _pairs(mark: Action, f: Action, b: Action) -> bool:
    """Whether the mark is right before the F and the backward it names (a lowered
    schedule may put a transfer between them: then the mark is written as it is)."""
    return f.kind is Kind.F and b.kind in (Kind.B, Kind.I) and (b.stage, b.micro) == (mark.stage, mark.micro)
