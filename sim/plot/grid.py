"""The step x rank grid of a hand-written schedule, its bad cells marked: what `sim.check_schedule` found, drawn.

    >>> fig = plot_grid(sim.check_schedule("0F0 0B0\\n1B0 1F0"))     # doctest: +SKIP

One row per rank, one cell per step, coloured by kind (`sim.plot.bars.COLORS`); a cell
with a problem gets a red frame and its number `!n`, and an action that is missing is a
dashed red cell after its rank's last step. The problems are listed under the grid, as
`ScheduleReport` numbers them. Each cell is a Rectangle whose gid is `cell r i`
(`missing r ACTION` for a missing one), so a test can find what is marked.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from sim.passes.diagnose import ScheduleReport
from .bars import COLORS
from .gantt import MAX_HEIGHT, WIDTH, new_figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["plot_grid", "BAD", "OTHER"]

BAD = "#d62728"       # the frame of a cell with a problem
OTHER = "#bbbbbb"     # a cell of a kind that is not a compute (a transfer, a mark), or unreadable
SHOWN_PROBLEMS = 12   # listed under the grid; the rest are counted


def plot_grid(report: ScheduleReport, title: str | None = None) -> "Figure":
    """The report's step x rank grid, bad cells framed and numbered, the problems listed."""
    from matplotlib.patches import Rectangle

    rows = report.cells
    marks: dict[tuple[int, int], list[int]] = {}
    missing: dict[int, list[str]] = {}
    for n, p in enumerate(report.problems, 1):
        if p.rank is not None and p.step is not None:
            marks.setdefault((p.rank, p.step), []).append(n)
        elif p.rank is not None:
            missing.setdefault(p.rank, []).append(f"{p.action}!{n}")
    steps = max([len(r) + len(missing.get(i, [])) for i, r in enumerate(rows)] + [1])
    listed = report.problems[:SHOWN_PROBLEMS]
    lines = [f"!{n} {p}" for n, p in enumerate(listed, 1)]
    if len(report.problems) > len(listed):
        lines.append(f"... and {len(report.problems) - len(listed)} more")
    grid_h, text_h = 0.8 + 0.45 * len(rows), 0.16 * (len(lines) + 1)
    fig = new_figure(WIDTH, min(MAX_HEIGHT, grid_h + text_h + 0.3))
    ax, notes = fig.subplots(2, 1, height_ratios=[grid_h, text_h])
    notes.axis("off")
    for row in rows:
        for c in row:
            kind = c.action.kind if c.action is not None else None
            bad = marks.get((c.rank, c.step))
            ax.add_patch(Rectangle((c.step, c.rank - 0.4), 0.94, 0.8, facecolor=COLORS.get(kind, OTHER),
                                   edgecolor=BAD if bad else "white", linewidth=2.2 if bad else 0.5,
                                   gid=f"cell {c.rank} {c.step}"))
            text = (str(c.action) if c.action is not None else c.text) + "".join(f"!{n}" for n in bad or [])
            ax.text(c.step + 0.47, c.rank, text, ha="center", va="center", fontsize=6, clip_on=True,
                    color=BAD if c.action is None else "black")
    for r, names in missing.items():
        for j, name in enumerate(names):
            x = len(rows[r]) + j
            ax.add_patch(Rectangle((x, r - 0.4), 0.94, 0.8, facecolor="white", edgecolor=BAD, linestyle="--",
                                   linewidth=1.2, gid=f"missing {r} {name.split('!')[0]}"))
            ax.text(x + 0.47, r, name, ha="center", va="center", fontsize=6, color=BAD)
    ax.set_xlim(-0.1, steps + 0.1)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_yticks(range(len(rows)), [f"rank {r}" for r in range(len(rows))])
    ax.set_xlabel("step (index in the rank's program)")
    head = title or ("the schedule checks clean" if report.ok else f"{len(report.problems)} problem(s)")
    ax.set_title(head, loc="left", fontsize=10, color="black" if report.ok else BAD)
    notes.text(0.0, 1.0, "\n".join(lines), ha="left", va="top", fontsize=7, family="monospace",
               transform=notes.transAxes)
    return fig
