"""Figures of a training step.

Every function takes a `sim.Result`, simulated or measured, so `exec` draws its runs
with the same code:

- `draw_timeline(result, ax)`: a Gantt chart, one row per device, one bar per compute.
- `draw_memory(result, ax)`: memory held by each device over time, a row per device.
- `plot_result(result)`: both, stacked on a shared time axis.
- `plot_overlay(simulated, measured)`: measured bars over simulated ones, to see drift.
- `plot_compare(results)`: several schedules, their memory on one scale.
- `save_figure(fig, path)`: write a PNG whole or not at all.

Large steps are drawn so that they still read, in bounded time and size: past
`DETAIL_BARS` computes, or where bars are a few pixels wide, the bars lose their outlines
and numbers and are drawn as one collection per kind; past `DENSE_PER_ROW`, or past `MAX_BAR_ROWS` devices,
the chart becomes a heat map of busy time (`sim.plot.heatmap`). A figure is `WIDTH` inches
wide and at most `MAX_HEIGHT` tall.

The bars (a colour per kind, a hatch per chunk where a rank holds several stages) are
drawn by `sim.plot.bars`, numbers and units written by `sim.plot.labels`; the command line is
`sim.plot.cli` (`python -m sim.plot --stages 4 --micro 8`).

Figures are built with `matplotlib.figure.Figure` and the Agg canvas, not `pyplot`:
no display is needed and no global figure registry is touched.
"""
from __future__ import annotations

import math
import os
import sys
from collections import Counter
from typing import TYPE_CHECKING, Sequence

import numpy as np

from . import heatmap
from sim.files import atomic_write
from .bars import COLORS, HATCHES, LABEL_GID, NAMES, TRACK, chunks, draw_bars, fit_labels, kind_legend, \
    kinds_of
from .labels import TIME_UNIT, counts_micro_batches, format_memory, format_times, human_bytes, \
    memory_unit, plural, size, time_unit, time_label
from sim.engine.result import Result

__all__ = [  # the figures, and the words and numbers of `sim.plot.labels` that they write, found here too
    "draw_timeline", "draw_memory", "plot_result", "plot_overlay", "plot_compare", "save_figure", "fit_labels",
    "timeline_style", "TIME_UNIT", "counts_micro_batches", "format_memory", "format_times", "human_bytes",
    "memory_unit", "plural", "size", "time_unit", "time_label", "COLORS", "NAMES", "HATCHES", "LABEL_GID", "TRACK", "chunks",
]

if TYPE_CHECKING:  # matplotlib takes about a second to import; only the figures need it
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

MEMORY_COLOUR = "#5e4b8b"  # not a kind's colour: nobody reads a memory band as "backward"
DPI = 130
WIDTH, MAX_HEIGHT = 11.0, 14.0  # inches: every figure is this wide and at most this tall
MAX_BAR_ROWS = 32          # more devices than this: heat maps
DETAIL_BARS = 1024         # up to this many computes: outlined, numbered bars (a patch each)
MIN_OUTLINED_PX = 6        # ... if the typical bar is at least this many pixels wide
DENSE_PER_ROW = 400        # up to this many on a device: bars without outlines; beyond: a heat map
MIN_DENSE_PX = 2           # and a heat map where the typical bar is narrower than this
PLOT_PX = 0.8 * WIDTH * DPI  # about the width of a chart in pixels


# ----------------------------------------------------------------------------- helpers

def new_figure(width: float, height: float) -> "Figure":
    """A Figure on the Agg canvas (renders to PNG, no display, no pyplot state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, min(height, MAX_HEIGHT)), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def timeline_style(result: Result) -> str:
    """How `draw_timeline` draws `result`: "bars" (outlined and numbered: at most
    `DETAIL_BARS` computes, the typical one at least `MIN_OUTLINED_PX` wide), "dense" (one
    collection per kind, no outlines), or "heat" (a heat map of busy time: more than
    `MAX_BAR_ROWS` devices, more than `DENSE_PER_ROW` computes on one, or the typical bar
    under `MIN_DENSE_PX` pixels)."""
    if result.ranks > MAX_BAR_ROWS:
        return "heat"
    computes = [e for e in result.events if e.action.kind.is_compute]
    if max(Counter(e.rank for e in computes).values(), default=0) > DENSE_PER_ROW:
        return "heat"
    typical = float(np.median([e.duration for e in computes])) if computes else 0.0
    px = typical * PLOT_PX / result.makespan if result.makespan > 0 else 0.0  # its width in pixels
    if px < MIN_DENSE_PX:
        return "heat"
    return "bars" if len(computes) <= DETAIL_BARS and px >= MIN_OUTLINED_PX else "dense"


def _panel_heights(result: Result, per_row: float = 0.45) -> tuple[float, float]:
    """Inches for the chart and the memory panel of `result`, bounded whatever its size;
    `per_row`: for each device's row in the chart (the memory rows are a little lower)."""
    if result.ranks > MAX_BAR_ROWS:
        return 3.6, 3.0
    return min(per_row * result.ranks, 6.0) + 0.55, max(1.3, min(0.8 * per_row * result.ranks, 4.5) + 0.65)


def _rank_rows(ax: "Axes", ranks: int, end: float) -> None:
    """Rank r on row r, rank 0 at the top, each row a light track from 0 to `end`."""
    from matplotlib.collections import PolyCollection

    # one collection for all the tracks, so that ax.patches holds only compute bars
    tracks = [[(0, r - 0.45), (0, r + 0.45), (end, r + 0.45), (end, r - 0.45)] for r in range(ranks)]
    ax.add_collection(PolyCollection(tracks, facecolor=TRACK, edgecolor="none", zorder=0), autolim=False)
    ax.set_yticks(range(ranks), [f"rank {r}" for r in range(ranks)])
    ax.set_ylim(ranks - 0.5, -0.5)  # inverted: rank 0 on top
    ax.set_xlim(0, end)
    ax.tick_params(axis="y", length=0)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)


# ----------------------------------------------------------------------------- panels

def draw_timeline(result: Result, ax: "Axes", legend: bool | Sequence[Result] = True) -> "Axes":
    """Draw `result` as a Gantt chart on `ax`: one row per device (rank 0 on top), one
    bar per compute action coloured by kind (F, B, I, W) with its micro-batch number.

    Compute is drawn, and each collective (REDUCE_GRAD) as a thin hatched bar along the
    bottom of its row, as it runs beside the compute; the light track that shows through
    between compute bars is time the device sits idle (the pipeline bubble). Times are relative to `result.t0`. A large
    step is drawn as `timeline_style` says: bars without outlines and numbers, or a heat
    map of the share of each time bin each device computes. `legend`: whether to draw
    one, or the results whose kinds and chunks it lists (a comparison's legend)."""
    style = timeline_style(result)
    if style == "heat":
        heatmap.draw_busy(result, ax)
    else:
        _rank_rows(ax, result.ranks, result.makespan)
        outline = {"edgecolor": "black", "linewidth": 0.4} if style == "bars" else {}
        draw_bars(ax, result, height=0.8, detail=style == "bars", label=True, **outline)
        if legend:
            listed = [result] if legend is True else list(legend)
            kind_legend(ax, set().union(*map(kinds_of, listed)),
                        chunk_count=max(max(chunks(r).values(), default=0) for r in listed) + 1)
    ax.set_xlabel(time_label(result))
    return ax


def draw_memory(result: Result, ax: "Axes", legend: bool = True, *, top: float | None = None,
                unit: tuple[float, str] | None = None) -> "Axes":
    """Draw each device's memory over time on `ax`, one row per device as in the Gantt
    chart (rank 0 on top), so that each device can be followed on its own. A full row
    stands for `top` (default: this result's peak; `plot_compare` gives all its results
    the largest, so they share one scale); each row's peak is written on its right.

    With the default costs (no static bytes, one byte per activation) memory counts the
    micro-batches whose activations a device holds; otherwise it is in bytes, in KiB,
    MiB, GiB... chosen from `top` (or `unit`: (scale, name)). Past `MAX_BAR_ROWS`
    devices it is a heat map. `legend` is kept for callers of the former line chart."""
    peaks = result.peak_memory
    top = max(peaks, default=0.0) if top is None else top
    scale, name = unit or memory_unit([result], top)
    if result.ranks > MAX_BAR_ROWS:
        heatmap.draw_memory_map(result, ax, top, scale, name)
    else:
        _memory_rows(result, ax, top, scale, name)
    ax.set_xlabel(time_label(result))
    return ax


def _memory_rows(result: Result, ax: "Axes", top: float, scale: float, unit: str) -> None:
    end = result.makespan
    _rank_rows(ax, result.ranks, end)
    per = 0.84 / top if top > 0 else 0.0
    label_rows = result.ranks <= 16  # more rows are too thin for a label each
    for r, (series, peak) in enumerate(zip(result.memory, result.peak_memory)):
        times, held = heatmap.memory_steps(series, result.t0, end)
        y = r + 0.42 - per * held  # row r spans r + 0.42 (nothing held) up to r - 0.42 (`top`)
        ax.fill_between(times, r + 0.42, y, step="post", color=MEMORY_COLOUR, alpha=0.3, linewidth=0)
        ax.step(times, y, where="post", color=MEMORY_COLOUR, linewidth=1.0, gid=f"memory rank {r}")
        if label_rows:
            ax.text(1.005, r, f"peak {format_memory(peak, scale, unit)}", transform=ax.get_yaxis_transform(),
                    fontsize=7, va="center", ha="left")
    what = "activations held" if unit == "micro-batches" else "memory held"
    ax.set_ylabel(f"{what}\n(full row: {format_memory(top, scale, unit)})", fontsize=9)


def _bubbles(result: Result) -> str:
    """`makespan 33 time units, bubble 27.3% (steady 27.3%)`: the step's length and idle
    share, and the idle share when steps repeat without a flush (`Result.steady_step`)."""
    (makespan,) = format_times([result.makespan])
    tail = result.makespan - (result.compute_end - result.t0)
    if tail > 1e-12 * max(result.makespan, 1.0):  # a gradient reduction after the last compute
        return (f"makespan {makespan} {time_unit(result)}, pipeline bubble {result.pipeline_bubble_fraction:.1%} "
                f"(to the last compute; {result.bubble_fraction:.1%} of the whole step)")
    return (f"makespan {makespan} {time_unit(result)}, bubble {result.bubble_fraction:.1%} "
            f"(steady {result.steady_bubble_fraction:.1%})")


def _title(result: Result) -> str:
    where = "" if result.source == "simulated" else f" ({result.source})"
    return f"{result.schedule.name}{where}: {size(result)}  |  {_bubbles(result)}"


# ----------------------------------------------------------------------------- figures

def plot_result(result: Result, unit: tuple[float, str] | None = None) -> "Figure":
    """The Gantt chart over the memory panel, on a shared time axis, titled with the
    schedule, its size, the makespan and the bubble fraction. `unit`: the memory's
    (scale, name), as `draw_memory` takes it."""
    heights = _panel_heights(result)
    fig = new_figure(WIDTH, sum(heights) + 0.5)
    gantt, mem = fig.subplots(2, 1, sharex=True, height_ratios=heights)
    draw_timeline(result, gantt)
    gantt.set_xlabel("")  # the memory panel below carries the shared time axis
    draw_memory(result, mem, unit=unit)
    fig.suptitle(_title(result), fontsize=11)
    return fig


def plot_overlay(simulated: Result, measured: Result) -> "Figure":
    """Measured compute bars drawn over simulated ones, one row per device.

    Simulated bars are wide, light and hatched; measured bars are narrow and solid in the
    middle of the same row, so where the two runs drift apart shows at a glance. Each run
    is drawn from its own t0; the title gives both makespans and the error in percent."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    ranks = max(simulated.ranks, measured.ranks)
    end = max(simulated.makespan, measured.makespan)
    detail = timeline_style(simulated) == timeline_style(measured) == "bars"
    fig = new_figure(WIDTH, 1.4 + min(0.5 * ranks, MAX_HEIGHT))
    ax = fig.subplots()
    _rank_rows(ax, ranks, end)
    draw_bars(ax, simulated, height=0.84, detail=detail, alpha=0.35, hatch="///", hatch_chunks=False,
               edgecolor="#555555", linewidth=0.4 if detail else 0)
    draw_bars(ax, measured, height=0.36, detail=detail, label=True,
               **({"edgecolor": "black", "linewidth": 0.4} if detail else {}))
    # where each step ends; a little room on the right so the later line is not on the frame
    ax.axvline(simulated.makespan, color="black", linestyle=":", linewidth=1)
    ax.axvline(measured.makespan, color="black", linestyle="-", linewidth=1)
    ax.set_xlim(0, end * 1.01)
    ax.set_xlabel(time_label(measured))
    how = [Patch(facecolor="#bbbbbb", alpha=0.5, hatch="///", edgecolor="#555555", label="simulated (wide)"),
           Patch(facecolor="#555555", label="measured (narrow)"),
           Line2D([], [], color="black", linestyle=":", label="simulated end"),
           Line2D([], [], color="black", linestyle="-", label="measured end")]
    kind_legend(ax, kinds_of(simulated) | kinds_of(measured), extra=how)
    # the simulator's error, as everywhere in the project: (simulated - measured) / measured
    err = (simulated.makespan - measured.makespan) / measured.makespan if measured.makespan else math.nan
    sim_end, run_end = format_times([simulated.makespan, measured.makespan])
    fig.suptitle(f"{measured.schedule.name}: {size(measured)}  |  makespan simulated {sim_end}, measured "
                 f"{run_end} {time_unit(measured)}, error {err:+.1%}", fontsize=10)
    return fig


def plot_compare(results: Sequence[Result], shared_time: bool | None = None,
                 unit: tuple[float, str] | None = None, note: str | None = None) -> "Figure":
    """For each result, its Gantt chart over its memory panel; every memory panel on one
    scale (the largest peak), so that GPipe's m micro-batches and 1F1B's p - s differ
    at a glance.

    `shared_time`: one time axis for all, so step lengths compare directly; else each
    schedule on its own, so a short step is not squeezed by a long one. Default: shared
    when the shortest step is at least half the longest. The title says which; `note` (the
    costs the steps assume) is a second line of it."""
    results = list(results)
    ends = [r.makespan for r in results]
    if shared_time is None:
        shared_time = min(ends) >= 0.5 * max(ends)
    heights = [h for r in results for h in _panel_heights(r, per_row=0.38)]
    room = MAX_HEIGHT - 0.6
    heights = [h * min(1.0, room / sum(heights)) for h in heights]
    fig = new_figure(WIDTH, sum(heights) + 0.6)
    axes = fig.subplots(len(heights), 1, height_ratios=heights, squeeze=False)[:, 0]
    top = max(max(r.peak_memory, default=0.0) for r in results)
    unit = unit or memory_unit(results, top)
    for i, res in enumerate(results):
        gantt, mem = axes[2 * i], axes[2 * i + 1]
        mem.sharex(axes[1] if shared_time else gantt)
        if shared_time:
            gantt.sharex(axes[1])
        draw_timeline(res, gantt, legend=False)
        if i == 0:
            from matplotlib.lines import Line2D
            end = [Line2D([], [], color="black", linestyle=":", linewidth=0.8, label="end of step")] \
                if shared_time else []
            kind_legend(gantt, set().union(*map(kinds_of, results)), extra=end,
                        chunk_count=max(max(chunks(r).values(), default=0) for r in results) + 1)
        draw_memory(res, mem, top=top, unit=unit)
        gantt.set_xlabel("")
        gantt.tick_params(labelbottom=False)
        if shared_time:
            gantt.axvline(res.makespan, color="black", linestyle=":", linewidth=0.8)
            if i < len(results) - 1:
                mem.set_xlabel("")
        on = f" ({plural(res.schedule.stages, 'stage')})" if res.schedule.stages != res.ranks else ""
        gantt.set_title(f"{res.schedule.name}{on}: {_bubbles(res)}", loc="left", fontsize=9)
    if shared_time:
        axes[-1].set_xlim(0, max(ends))
        how = "on one time axis"
    else:
        ratio = f" (the longest step is {max(ends) / min(ends):.1f}x the shortest)" if min(ends) > 0 else ""
        how = f"each on its own time axis{ratio}"
    first = results[0].schedule
    fig.suptitle(f"{plural(first.ranks, 'device')}, {plural(first.micro_batches, 'micro-batch', 'micro-batches')}: "
                 f"{how}; memory on one scale" + (f"\n{note}" if note else ""), fontsize=11)
    return fig


def save_figure(fig: "Figure", path: str | os.PathLike, dpi: int = DPI) -> None:
    """Write `fig` to `path` as a PNG, whole or not at all, then release the figure.

    Micro-batch numbers too wide for their bars are hidden first (`fit_labels`)."""
    fit_labels(fig)
    with atomic_write(path, "wb") as f:
        fig.savefig(f, format="png", dpi=dpi)
    # We never use pyplot, but a caller may have made `fig` with it: let pyplot forget it.
    if "matplotlib.pyplot" in sys.modules:
        sys.modules["matplotlib.pyplot"].close(fig)
