"""Figures of a plan: the best configuration's step, and every simulated one's time against memory.

- `plot_best(plan)`: the fastest configuration that fits, its Gantt chart over its memory
  (`sim.plot.plot_result`), titled with its layout and predictions.
- `plot_scatter(plan)`: step time against peak memory of each simulated configuration, those
  that fit and those that do not, the ranked ones marked, the GPU's memory and its usable
  part (less the headroom) as lines.
- `write_figures(plan, out)`: both, as PNGs written whole or not at all (`sim.plot.save_figure`).
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from sim.hardware.gpus import GIB
from sim.plot.gantt import WIDTH, new_figure, plot_result, save_figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from .planner import Plan, Row


def describe(row: "Row") -> str:
    """`tp=8 pp=8 dp=16 b=1 m=96 1f1b V=1 recompute=selective zero=1 sp`: a row's layout."""
    config = row.config
    cp = f"cp={config.cp} " if config.cp > 1 else ""
    return (f"tp={config.tp} {cp}pp={config.pp} dp={config.dp} b={config.micro_batch} m={row.micro_batches} {config.schedule}{'+pairs' if config.overlap else ''} V={config.virtual} "
            f"recompute={config.recompute} zero={config.zero}{'' if config.reshard_after_forward else ' keep'}"
            f"{' sp' if config.sequence_parallel else ''}")


def plot_best(plan: "Plan", name: str | None = None) -> "Figure":
    """The best row's simulated step: Gantt chart and memory per pipeline device."""
    best = plan.best
    if best is None or best.estimate is None:
        raise ValueError("the plan has no configuration that fits: nothing to draw")
    fig = plot_result(best.estimate.result)
    fig.suptitle(f"{_what(plan, name)}, best: {describe(best)}\nstep {best.step_time:.3g} s, {best.tflops_per_gpu:.0f} "
                 f"TFLOP/s/GPU, MFU {best.mfu:.1%}, bubble {best.bubble_fraction:.1%}, "
                 f"peak {best.peak_memory / GIB:.1f} of {plan.usable_memory / GIB:.1f} GiB usable "
                 f"({plan.gpu.memory / GIB:.0f} GiB less the headroom)", fontsize=10)
    return fig


def _what(plan: "Plan", name: str | None = None) -> str:
    """The run in words; `name`: the model's as the user gave it (else the registry's)."""
    from sim.model.registry import model_name
    return f"{name or model_name(plan.model)} on {plan.gpus} x {plan.gpu.name}, global batch {plan.global_batch}"


def plot_scatter(plan: "Plan", name: str | None = None) -> "Figure":
    """Step time against peak memory of every simulated configuration."""
    fig = new_figure(WIDTH, 6.0)
    ax = fig.subplots()
    fits = [point for point in plan.points if point.fits]
    over = [point for point in plan.points if not point.fits]
    for rows, style in ((fits, dict(marker="o", color="#4c72b0", alpha=0.5, label="fits")),
                        (over, dict(marker="x", color="#999999", alpha=0.6, label="does not fit"))):
        if rows:
            ax.scatter([row.peak_memory / GIB for row in rows], [row.step_time for row in rows], s=14, **style)
    if plan.rows:
        ax.scatter([row.peak_memory / GIB for row in plan.rows], [row.step_time for row in plan.rows], s=40,
                   facecolors="none", edgecolors="#dd8452", linewidths=1.2, label=f"ranked ({len(plan.rows)})")
        best = plan.rows[0]
        ax.scatter([best.peak_memory / GIB], [best.step_time], s=160, marker="*", color="#c44e52", zorder=3,
                   label=f"best: {describe(best)}")
    ax.axvline(plan.gpu.memory / GIB, color="black", linestyle="--", linewidth=1,
               label=f"{plan.gpu.name} memory ({plan.gpu.memory / GIB:.0f} GiB)")
    if plan.usable_memory < plan.gpu.memory:
        ax.axvline(plan.usable_memory / GIB, color="black", linestyle=":", linewidth=1,
                   label=f"usable: less the headroom ({plan.usable_memory / GIB:.1f} GiB)")
    times = [point.step_time for point in plan.points]
    if times and max(times) > 10 * min(times):
        ax.set_yscale("log")
    ax.set_xlabel("peak memory of the fullest device (GiB)")
    ax.set_ylabel("predicted step time (s)")
    ax.legend(fontsize=8, loc="best")
    ax.set_title(f"{_what(plan, name)}\n{plan.simulated} of {plan.enumerated} configurations simulated; the others "
                 f"were dropped by the memory and step-time bounds (docs/planner.md)", fontsize=10)
    return fig


def figure_paths(plan: "Plan", out: str | os.PathLike, name: str | None = None) -> tuple[Path, Path]:
    """`<out>/plan_<model>_<gpu>_n<gpus>_B<batch>_best.png` and `..._scatter.png`."""
    from sim.model.registry import model_name
    tag = re.sub(r"[^A-Za-z0-9.-]+", "-", f"{name or model_name(plan.model)}_{plan.gpu.name}") \
        + f"_n{plan.gpus}_B{plan.global_batch}"
    out = Path(out)
    return out / f"plan_{tag}_best.png", out / f"plan_{tag}_scatter.png"


def write_figures(plan: "Plan", out: str | os.PathLike, name: str | None = None) -> list[Path]:
    """Write the best step (when a configuration fits) and the scatter; returns the paths.
    `name`: the model's as the user gave it (a preset's alias, a file), else the registry's."""
    best, scatter = figure_paths(plan, out, name)
    written = []
    if plan.best is not None:
        save_figure(plot_best(plan, name), best)
        written.append(best)
    save_figure(plot_scatter(plan, name), scatter)
    written.append(scatter)
    return written
