"""The compute bars of a Gantt chart: a colour per kind (from the kind table), a hatch
per chunk where a rank holds several stages, and labels that fit their bars; and the
collectives (REDUCE_GRAD) as thin bars along the bottom of their rank's row, and the
copies to host memory and back (OFFLOAD, RELOAD) and FSDP's gathers (UNSHARD) as thin bars along its top.

`sim.plot` draws its charts with these; `draw_bars` puts one Rectangle per compute
(findable by its gid, `compute 0F0`) or, for large steps, one PolyCollection per kind and
chunk, and one thin Rectangle per collective (`collective 0REDUCE_GRAD`) and per copy
(`copy 0OFFLOAD3`); `fit_labels`
runs after layout and keeps, per bar, the longest label that fits.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

from sim.schedule.kinds import COLLECTIVES, COPIES, KINDS, Kind, Role
from sim.engine.result import Event, Result

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

# One colour per compute kind, from the kind table (the Okabe-Ito palette, which stays apart
# for the three kinds of colour blindness: tests/sim/plot/test_figures.py checks them simulated).
COLORS = {k: spec.colour for k, spec in KINDS.items() if spec.role is Role.COMPUTE}
NAMES = {k: spec.label for k, spec in KINDS.items() if spec.role is Role.COMPUTE}
# A collective runs on its rank's stream beside the compute: a thin hatched bar in the
# bottom part of the row (COLLECTIVE_HEIGHT of it), over any compute it overlaps.
COLLECTIVE_COLORS = {k: KINDS[k].colour for k in COLLECTIVES}
COLLECTIVE_NAMES = {k: KINDS[k].label for k in COLLECTIVES}
COLLECTIVE_HEIGHT = 0.3
COLLECTIVE_HATCH = "xxxx"
# A copy runs on its rank's copy engine beside the compute: a thin bar in the top part of
# the row, with an edge so that back-to-back copies stay apart.
COPY_COLORS = {k: KINDS[k].colour for k in COPIES}
COPY_NAMES = {k: KINDS[k].label for k in COPIES}
# FSDP's gather (UNSHARD) runs on its rank's all-gather stream: drawn as a copy is, dotted.
COPY_COLORS[Kind.UNSHARD], COPY_NAMES[Kind.UNSHARD] = KINDS[Kind.UNSHARD].colour, KINDS[Kind.UNSHARD].label
GATHER_HATCH = "...."
TRACK = "#f4f4f4"          # the empty row behind the bars: what shows through is idle time
LABEL_GID = "bar-label"    # marks the micro-batch numbers that `fit_labels` may hide
# Where a rank holds several stages, its k-th stage (chunk k, in stage order) is drawn with
# HATCHES[k]: the kind keeps its colour, the chunk shows as a pattern, even on bars too thin
# for a label (the zero-bubble paper tells chunks apart by text colour, its Figure 8).
HATCHES = ("", "////", "....", "xxxx", "\\\\\\\\", "++++")
HATCH_COLOUR = "#ffffffb0"  # light lines over the kind's colour


def chunks(result: Result) -> dict[int, int]:
    """Stage -> its chunk: its place (0, 1, ...) among the stages of its rank, in stage
    order. All 0 where each rank holds one stage."""
    by_rank: dict[int, list[int]] = {}
    for stage, rank in enumerate(result.schedule.placement):
        by_rank.setdefault(rank, []).append(stage)
    return {s: k for stages in by_rank.values() for k, s in enumerate(sorted(stages))}


def _bar_texts(event: Event, one_stage_per_rank: bool) -> tuple[str, ...]:
    """The labels a bar may take, longest first: with several stages per rank, the
    micro-batch and its stage ("3 s5"), else the micro-batch alone (the hatch gives the chunk)."""
    a = event.action
    return (str(a.micro),) if one_stage_per_rank else (f"{a.micro} s{a.stage}", str(a.micro))


def draw_bars(ax: "Axes", result: Result, height: float, detail: bool, label: bool = False,
               hatch_chunks: bool = True, **style) -> None:
    """The compute events of `result` on their ranks' rows, coloured by kind, each chunk
    of a rank with several stages in its hatch (`HATCHES`, unless not `hatch_chunks`).
    With `detail`, one Rectangle each (findable by its gid, `compute 0F0`) and, with
    `label`, its micro-batch (and stage) on it; without, one PolyCollection per kind and
    chunk, fast at any count."""
    t0 = result.t0
    events = result.compute_events()
    chunk = chunks(result) if hatch_chunks else {}
    draw_collectives(ax, result, height)
    draw_copies(ax, result, height)
    if not detail:
        bar_collections(ax, events, t0, height, chunk, **style)
        return
    one_stage = result.schedule.stages == result.schedule.ranks
    bars = ax.barh([e.rank for e in events], [e.duration for e in events], height=height,
                   left=[e.start - t0 for e in events], color=[COLORS[e.action.kind] for e in events],
                   **style)
    for e, bar in zip(events, bars):
        bar.set_gid(f"compute {e.action}")  # lets a reader (or a test) find the bar of an action
        k = chunk.get(e.action.stage, 0)
        if k:
            bar.set_hatch(HATCHES[k % len(HATCHES)])
            bar.set_hatchcolor(HATCH_COLOUR)
        if label:
            texts = _bar_texts(e, one_stage)
            # on a hatched bar the number sits on a patch of the bar's own colour, not on the hatching
            box = dict(boxstyle="square,pad=0.15", facecolor=COLORS[e.action.kind], edgecolor="none") if k else None
            text = ax.text(e.start - t0 + e.duration / 2, e.rank, texts[0], ha="center", va="center", fontsize=7,
                           color="white", gid=LABEL_GID, clip_on=True, bbox=box,
                           in_layout=False)  # inside the axes: layout need not measure them
            text.sim_bar, text.sim_texts = bar, texts  # for `fit_labels`


def draw_collectives(ax: "Axes", result: Result, height: float) -> None:
    """Each collective (REDUCE_GRAD) as a thin hatched bar in the bottom part of its rank's
    row (rows run down the page), findable by its gid (`collective 0REDUCE_GRAD`)."""
    events = [e for e in result.events if e.action.kind in COLLECTIVES]
    if not events:
        return
    thin = height * COLLECTIVE_HEIGHT
    bars = ax.barh([e.rank + (height - thin) / 2 for e in events], [e.duration for e in events], height=thin,
                   left=[e.start - result.t0 for e in events], color=[COLLECTIVE_COLORS[e.action.kind] for e in events],
                   edgecolor="black", linewidth=0.4, hatch=COLLECTIVE_HATCH, zorder=3)
    for e, bar in zip(events, bars):
        bar.set_gid(f"collective {e.action}")
        bar.set_hatchcolor(HATCH_COLOUR)


def draw_copies(ax: "Axes", result: Result, height: float) -> None:
    """Each copy (OFFLOAD, RELOAD) as a thin bar in the top part of its rank's row (rows run
    down the page), findable by its gid (`copy 0OFFLOAD3`), and each FSDP gather (UNSHARD;
    a RESHARD takes no time) as a dotted one there (`gather 0UNSHARD1`)."""
    events = [e for e in result.events if e.action.kind in COPIES or e.action.kind is Kind.UNSHARD]
    if not events:
        return
    thin = height * COLLECTIVE_HEIGHT
    bars = ax.barh([e.rank - (height - thin) / 2 for e in events], [e.duration for e in events], height=thin,
                   left=[e.start - result.t0 for e in events], color=[COPY_COLORS[e.action.kind] for e in events],
                   edgecolor="black", linewidth=0.4, zorder=3)
    for e, bar in zip(events, bars):
        gather = e.action.kind is Kind.UNSHARD
        bar.set_gid(f"{'gather' if gather else 'copy'} {e.action}")
        if gather:
            bar.set_hatch(GATHER_HATCH)
            bar.set_hatchcolor(HATCH_COLOUR)


def bar_collections(ax: "Axes", events: Sequence[Event], t0: float, height: float, chunk: dict[int, int],
                     **style) -> None:
    from matplotlib.collections import PolyCollection

    groups: dict[tuple[Kind, int], list[tuple[float, float, int]]] = {}
    for e in events:
        groups.setdefault((e.action.kind, chunk.get(e.action.stage, 0)), []).append((e.start - t0, e.end - t0, e.rank))
    style.setdefault("edgecolor", "none")
    style.setdefault("linewidth", 0)
    for (kind, k), spans in groups.items():
        x0, x1, y = np.array(spans, dtype=float).T
        lo, hi = y - height / 2, y + height / 2
        verts = np.stack([np.column_stack(c) for c in ((x0, lo), (x0, hi), (x1, hi), (x1, lo))], axis=1)
        gid = f"computes {kind.value}" + (f" chunk {k}" if k else "")
        bars = PolyCollection(verts, facecolor=COLORS[kind], gid=gid, **style)
        if k:
            bars.set_hatch(HATCHES[k % len(HATCHES)])
            bars.set_hatchcolor(HATCH_COLOUR)
        ax.add_collection(bars, autolim=False)


def kind_legend(ax: "Axes", kinds: set[Kind], extra: Sequence = (), chunk_count: int = 1, **kw) -> None:
    """The kinds' colours, the idle track and, for `chunk_count` > 1, each chunk's hatch."""
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=COLORS[k], label=NAMES[k]) for k in COLORS if k in kinds]
    handles += [Patch(facecolor=COLLECTIVE_COLORS[k], hatch=COLLECTIVE_HATCH, hatchcolor=HATCH_COLOUR,
                      edgecolor="black", linewidth=0.4, label=f"{COLLECTIVE_NAMES[k]} (its stream)")
                for k in COLLECTIVE_COLORS if k in kinds]
    handles += [Patch(facecolor=COPY_COLORS[k], edgecolor="black", linewidth=0.4, hatchcolor=HATCH_COLOUR,
                      hatch=GATHER_HATCH if k is Kind.UNSHARD else None,
                      label=f"{COPY_NAMES[k]} ({'its stream' if k is Kind.UNSHARD else 'copy engine'})")
                for k in COPY_COLORS if k in kinds]
    handles.append(Patch(facecolor=TRACK, edgecolor="#bbbbbb", label="idle (bubble)"))
    if chunk_count > 1:
        handles += [Patch(facecolor="#888888", hatch=HATCHES[k % len(HATCHES)], hatchcolor=HATCH_COLOUR,
                          label=f"chunk {k}: a rank's {_ordinal(k + 1)} stage") for k in range(chunk_count)]
    ax.legend(handles=handles + list(extra), loc="upper left", bbox_to_anchor=(1.005, 1.0),
              fontsize=8, frameon=False, **kw)


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def kinds_of(result: Result) -> set[Kind]:
    """The compute, collective, copy and gather kinds of `result`'s events: what its legend lists."""
    return {e.action.kind for e in result.events
            if e.action.kind.is_compute or e.action.kind in COLLECTIVES or e.action.kind in COPY_COLORS}


def fit_labels(fig: "Figure") -> None:
    """Give each bar the longest of its labels that fits (micro-batch and stage, or the
    micro-batch alone), and hide the label of a bar too narrow for any.

    Whether a label fits depends on the final figure size and x range, so this runs
    after layout (`save_figure` calls it)."""
    fig.draw_without_rendering()  # lay out (constrained layout moves the axes), paint nothing
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        for text in ax.texts:
            bar = getattr(text, "sim_bar", None)
            if text.get_gid() != LABEL_GID or bar is None:
                continue
            room = bar.get_window_extent(renderer).width
            text.set_visible(True)  # an invisible text has no extent to measure
            for candidate in getattr(text, "sim_texts", (text.get_text(),)):
                text.set_text(candidate)
                if text.get_window_extent(renderer).width + 2 <= room:
                    break
            else:
                text.set_visible(False)
