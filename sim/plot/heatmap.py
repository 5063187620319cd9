"""Large steps in a form that reads: per device and per time bin, the share of the bin the
device computes (a heat map of busy time) and the most memory it holds.

A step of 64 devices and 512 micro-batches has 65,536 computes: as bars they are a pixel
wide, and drawn one patch each they take minutes. Here each device's events become one
row of numbers, computed with numpy in time linear in the step, and the figure draws them
as one image (`sim.plot` decides when; `draw_busy`, `draw_memory_map`). Past `MAX_ROWS`
devices only a sample is shown: every k-th rank.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

import numpy as np

from sim.engine.result import Result

if TYPE_CHECKING:
    from matplotlib.axes import Axes

BINS = 1200        # time bins: about one per pixel column of a figure 11 inches wide
MAX_ROWS = 256     # more ranks than this: show every k-th one
BUSY_COLOURS = ("#f4f4f4", "#222222")  # idle: the light track of the bar charts; busy: ink
MEMORY_CMAP = "viridis"


def shown_ranks(ranks: int, most: int = MAX_ROWS) -> list[int]:
    """All ranks if there are at most `most`, else every k-th one (0, k, 2k, ...)."""
    return list(range(0, ranks, max(1, math.ceil(ranks / most))))


def busy_share(result: Result, rows: Sequence[int], bins: int = BINS) -> np.ndarray:
    """For each rank in `rows` (one row each) and each of `bins` equal time bins over the
    step, the share of the bin the rank spends computing (0 idle ... 1 busy).

    The busy time up to grid point k (time k*w) is sum over computes started by then of
    (k*w - start) minus the same over computes ended by then; both sums come from
    per-row histograms of the starts and ends, so no event is visited twice."""
    end, t0 = result.makespan, result.t0
    row_of = np.full(result.ranks, -1)
    row_of[list(rows)] = np.arange(len(rows))
    ev = [(e.rank, e.start, e.end) for e in result.events if e.action.kind.is_compute]
    arr = np.array(ev, dtype=float).reshape(-1, 3)
    row = row_of[arr[:, 0].astype(int)]
    keep = row >= 0
    row, starts, ends = row[keep], arr[keep, 1] - t0, arr[keep, 2] - t0
    if end <= 0 or not len(row):
        return np.zeros((len(rows), bins))
    w = end / bins
    grid = np.arange(bins + 1) * w

    def integral(times: np.ndarray) -> np.ndarray:
        # per row and grid point k: sum over `times` <= k*w of (k*w - time)
        k = np.clip(np.ceil(times / w), 0, bins + 1).astype(int)  # the first grid point at or after it
        index = row * (bins + 2) + k
        size = len(rows) * (bins + 2)
        count = np.bincount(index, minlength=size).reshape(len(rows), bins + 2).cumsum(axis=1)[:, :-1]
        total = np.bincount(index, weights=times, minlength=size).reshape(len(rows), bins + 2).cumsum(axis=1)[:, :-1]
        return grid * count - total

    busy = integral(starts) - integral(ends)
    return np.clip(np.diff(busy, axis=1) / w, 0.0, 1.0)


def memory_steps(series: Sequence[tuple[float, float]], t0: float, end: float) -> tuple[np.ndarray, np.ndarray]:
    """A memory series as (times, values) to draw as steps (`where="post"`) over [0, end]:
    exact where it has at most `BINS` points, else the most held in each of `BINS` bins.
    The last value holds until `end`."""
    if len(series) <= BINS:
        pts = np.asarray(series, dtype=float).reshape(-1, 2)
        pts = pts[np.argsort(pts[:, 0], kind="stable")]
        t, v = np.clip(pts[:, 0] - t0, 0.0, end), pts[:, 1]
        last = np.append(t[1:] != t[:-1], True)  # several changes at one instant: keep the last
        t, v = t[last], v[last]
    else:
        t, v = np.arange(BINS) * (end / BINS), binned_max(series, t0, end)
    if not len(t):
        t, v = np.zeros(1), np.zeros(1)
    return np.append(t, end), np.append(v, v[-1])


def binned_max(series: Sequence[tuple[float, float]], t0: float, end: float, bins: int = BINS) -> np.ndarray:
    """The most a (time, value) step series holds in each of `bins` equal bins of
    [0, end] (times relative to `t0`; a point before the step counts at its start).

    Of several changes at one instant only the last counts (a B frees as the next F
    allocates: no zero-width spike), as in the drawn lines of small steps."""
    if not series:
        return np.zeros(bins)
    pts = np.asarray(series, dtype=float)
    pts = pts[np.argsort(pts[:, 0], kind="stable")]
    t, v = np.clip(pts[:, 0] - t0, 0.0, end), pts[:, 1]
    last = np.append(t[1:] != t[:-1], True)
    t, v = t[last], v[last]
    w = end / bins if end > 0 else 1.0
    at = np.searchsorted(t, np.arange(bins) * w, side="right") - 1  # the change in force at each bin's start
    out = np.where(at >= 0, v[np.maximum(at, 0)], 0.0)
    np.maximum.at(out, np.minimum((t / w).astype(int), bins - 1), v)
    return out


def _rank_axis(ax: "Axes", rows: Sequence[int], ranks: int) -> None:
    """Row i of an image is rank rows[i]; label a few of them, and say if some are left out."""
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    ax.yaxis.set_major_locator(MaxNLocator(nbins=8, integer=True))
    ax.yaxis.set_major_formatter(FuncFormatter(
        lambda y, _: f"rank {rows[int(round(y))]}" if 0 <= round(y) < len(rows) else ""))
    ax.tick_params(axis="y", length=0)
    if len(rows) < ranks:
        ax.set_ylabel(f"one rank in {rows[1] - rows[0]} of {ranks}", fontsize=8)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)


def _colourbar(ax: "Axes", image, label: str) -> None:
    """A thin colour bar just right of `ax`, where the legends of bar charts go."""
    bar = ax.inset_axes([1.01, 0.0, 0.012, 1.0])
    cb = ax.figure.colorbar(image, cax=bar)
    cb.set_label(label, fontsize=8)
    cb.ax.tick_params(labelsize=7)


def draw_busy(result: Result, ax: "Axes", colourbar: bool = True) -> None:
    """The busy share of each shown rank (a row, rank 0 on top) in each time bin; the light
    cells are the bubble."""
    from matplotlib.colors import LinearSegmentedColormap

    rows = shown_ranks(result.ranks)
    share = busy_share(result, rows)
    cmap = LinearSegmentedColormap.from_list("busy", BUSY_COLOURS)
    image = ax.imshow(share, aspect="auto", interpolation="nearest", cmap=cmap, vmin=0.0, vmax=1.0,
                      extent=(0.0, result.makespan, len(rows) - 0.5, -0.5))
    _rank_axis(ax, rows, result.ranks)
    ax.set_xlim(0, result.makespan)
    if colourbar:
        _colourbar(ax, image, "share of the bin computing\n(light: idle, the bubble)")


def draw_memory_map(result: Result, ax: "Axes", top: float, scale: float, unit: str) -> None:
    """The most memory each shown rank (a row) holds in each time bin, in `unit`
    (`scale` of the raw values each), on a colour scale from 0 to `top` raw."""
    rows = shown_ranks(result.ranks)
    end = result.makespan
    grid = np.stack([binned_max(result.memory[r], result.t0, end) for r in rows]) / scale
    image = ax.imshow(grid, aspect="auto", interpolation="nearest", cmap=MEMORY_CMAP, vmin=0.0,
                      vmax=max(top / scale, 1e-300), extent=(0.0, end, len(rows) - 0.5, -0.5))
    _rank_axis(ax, rows, result.ranks)
    ax.set_xlim(0, end)
    _colourbar(ax, image, f"memory held ({unit})")
