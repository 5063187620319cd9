"""Figures of a training step, and the command line that draws them.

Every function takes a `sim.Result`, simulated or measured, so `exec` draws its runs
with the same code:

- `draw_timeline(result, ax)`: a Gantt chart, one row per device, one bar per compute.
- `draw_memory(result, ax)`: memory held by each device over time.
- `plot_result(result)`: both, stacked on a shared time axis.
- `plot_overlay(simulated, measured)`: measured bars over simulated ones, to see drift.
- `plot_compare(results)`: several schedules on one time axis.
- `save_figure(fig, path)`: write a PNG whole or not at all.

    python -m sim.plot --stages 4 --micro 8          # figures/<schedule>_p4_m8.png ...

Figures are built with `matplotlib.figure.Figure` and the Agg canvas, not `pyplot`:
no display is needed and no global figure registry is touched.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, Sequence

from . import cli
from .cli import number, whole
from .costs import Costs
from .engine import simulate
from .files import atomic_write
from .ir import Schedule, ScheduleError
from .kinds import KINDS, Kind, Role
from .result import Event, Result
from .schedules import SCHEDULES, make_schedule

if TYPE_CHECKING:  # matplotlib takes about a second to import; only the figures need it
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

# One colour per compute kind, from the kind table (colour-blind friendly: the Okabe-Ito palette).
COLORS = {k: spec.colour for k, spec in KINDS.items() if spec.role is Role.COMPUTE}
NAMES = {k: spec.label for k, spec in KINDS.items() if spec.role is Role.COMPUTE}
RANK_COLORS = ["#000000", "#d62728", "#9467bd", "#8c564b", "#7f7f7f", "#bcbd22", "#17becf"]
TRACK = "#f4f4f4"        # the empty row behind the bars: what shows through is idle time
LABEL_GID = "bar-label"  # marks the micro-batch numbers that `fit_labels` may hide
DPI = 130


# ----------------------------------------------------------------------------- helpers

def _new_figure(width: float, height: float) -> "Figure":
    """A Figure on the Agg canvas (renders to PNG, no display, no pyplot state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _time_label(result: Result) -> str:
    # measured runs are timed in seconds; simulated ones in whatever unit the costs used
    return "time since step start (s)" if result.source == "measured" else "time"


def _rank_rows(ax: "Axes", ranks: int, end: float) -> None:
    """Rank r on row r, rank 0 at the top, each row a light track from 0 to `end`."""
    for r in range(ranks):
        # broken_barh makes a collection, not Rectangle patches, so ax.patches stays
        # exactly one Rectangle per compute bar
        ax.broken_barh([(0, end)], (r - 0.45, 0.9), facecolor=TRACK, edgecolor="none", zorder=0)
    ax.set_yticks(range(ranks), [f"rank {r}" for r in range(ranks)])
    ax.set_ylim(ranks - 0.5, -0.5)  # inverted: rank 0 on top
    ax.set_xlim(0, end)
    ax.tick_params(axis="y", length=0)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)


def _bar_text(event: Event, one_stage_per_rank: bool) -> str:
    a = event.action
    # with several stages per rank the micro-batch alone is ambiguous: add the stage
    return str(a.micro) if one_stage_per_rank else f"{a.micro}/s{a.stage}"


def _draw_bars(ax: "Axes", result: Result, height: float, label: bool, **style) -> None:
    """One Rectangle per compute event of `result`, on its rank's row, coloured by kind;
    with `label`, the micro-batch number in the middle of each bar."""
    t0 = result.t0
    one_stage = result.schedule.stages == result.schedule.ranks
    events = result.compute_events()
    bars = ax.barh([e.rank for e in events], [e.duration for e in events], height=height,
                   left=[e.start - t0 for e in events], color=[COLORS[e.action.kind] for e in events],
                   **style)
    for e, bar in zip(events, bars):
        bar.set_gid(f"compute {e.action}")  # lets a reader (or a test) find the bar of an action
        if label:
            ax.text(e.start - t0 + e.duration / 2, e.rank, _bar_text(e, one_stage), ha="center",
                    va="center", fontsize=7, color="white", gid=LABEL_GID, clip_on=True,
                    in_layout=False)  # inside the axes: layout need not measure them


def _kind_legend(ax: "Axes", kinds: set[Kind], extra: Sequence = (), **kw) -> None:
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=COLORS[k], label=NAMES[k]) for k in COLORS if k in kinds]
    handles.append(Patch(facecolor=TRACK, edgecolor="#bbbbbb", label="idle (bubble)"))
    ax.legend(handles=handles + list(extra), loc="upper left", bbox_to_anchor=(1.005, 1.0),
              fontsize=8, frameon=False, **kw)


def _kinds(result: Result) -> set[Kind]:
    return {e.action.kind for e in result.events if e.action.kind.is_compute}


def fit_labels(fig: "Figure") -> None:
    """Hide every micro-batch number that is wider than the bar it sits on.

    Whether a label fits depends on the final figure size and x range, so this runs
    after layout (`save_figure` calls it)."""
    fig.draw_without_rendering()  # lay out (constrained layout moves the axes), paint nothing
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        rows: dict[float, list] = {}  # row centre -> the bars on that row
        for bar in ax.patches:
            rows.setdefault(round(bar.get_y() + bar.get_height() / 2, 6), []).append(bar)
        for text in ax.texts:
            if text.get_gid() != LABEL_GID:
                continue
            x, y = text.get_position()
            # the label sits at the centre of its bar; the last bar drawn there is on top
            under = [b for b in rows.get(round(y, 6), []) if b.get_x() <= x <= b.get_x() + b.get_width()]
            if under:
                text.set_visible(True)  # an invisible text has no extent to measure
                fits = text.get_window_extent(renderer).width + 2 <= under[-1].get_window_extent(renderer).width
                text.set_visible(fits)


def human_bytes(n: float) -> str:
    """`1536` -> `'1.5 KiB'`: bytes in the largest binary unit that keeps the number >= 1."""
    scale, unit = _byte_unit(abs(n))
    return f"{n / scale:.3g} {unit}"


def _byte_unit(peak: float) -> tuple[float, str]:
    for i, unit in reversed(list(enumerate(["B", "KiB", "MiB", "GiB", "TiB", "PiB"]))):
        if peak >= 1024 ** i:
            return 1024 ** i, unit
    return 1, "B"


def counts_micro_batches(result: Result) -> bool:
    """True when memory equals the number of micro-batches held (no static bytes, one
    byte per activation: the default `Costs`), so the memory axis is a count."""
    return all(
        len(mem) == len(act) and all(b == n for (_, b), (_, n) in zip(mem, act))
        for mem, act in zip(result.memory, result.activations)
    )


# ----------------------------------------------------------------------------- figures

def draw_timeline(result: Result, ax: "Axes", legend: bool = True) -> "Axes":
    """Draw `result` as a Gantt chart on `ax`: one row per device (rank 0 on top), one
    bar per compute action coloured by kind (F, B, I, W) with its micro-batch number.

    Only compute is drawn; the light track that shows through between bars is time the
    device sits idle (the pipeline bubble). Times are relative to `result.t0`."""
    _rank_rows(ax, result.ranks, result.makespan)
    _draw_bars(ax, result, height=0.8, label=True, edgecolor="black", linewidth=0.4)
    ax.set_xlabel(_time_label(result))
    if legend:
        _kind_legend(ax, _kinds(result))
    return ax


def draw_memory(result: Result, ax: "Axes", legend: bool = True) -> "Axes":
    """Draw each device's memory over time on `ax` as a step line (one per rank).

    With the default costs (no static bytes, one byte per activation) the axis counts
    the micro-batches whose activations a device holds; otherwise it shows bytes in
    KiB, MiB, GiB... chosen from the peak."""
    from matplotlib import colormaps
    from matplotlib.ticker import MaxNLocator

    t0, end = result.t0, result.makespan
    if counts_micro_batches(result):
        scale, ylabel = 1.0, "activations held\n(micro-batches)"
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # no 0.2 of a micro-batch
    else:
        scale, unit = _byte_unit(max(result.peak_memory, default=0.0))
        ylabel = f"memory ({unit})"
    # Rank colours avoid the blue/orange/green/pink of the compute kinds above, so that
    # nobody reads an orange line as "backward". Many ranks: a dark-to-green ramp.
    def color(r: int):
        if result.ranks <= len(RANK_COLORS):
            return RANK_COLORS[r]
        return colormaps["viridis"](0.85 * r / (result.ranks - 1))

    for r, series in enumerate(result.memory):
        # Times relative to the step start; a point before it (a measured run's initial
        # value at time 0) is clamped to the start. Several changes at one instant (a B
        # frees as the next F allocates) would draw a zero-width spike: keep the last.
        last: dict[float, float] = {}
        for t, b in series:
            last[min(max(t - t0, 0.0), end)] = b / scale
        times, values = list(last), list(last.values())
        times.append(end)  # the last value holds until the end of the step
        values.append(values[-1] if values else 0.0)
        # lines of different ranks often coincide: draw lower ranks thicker so that
        # every line still peeks out from under the ones drawn after it
        width = 1.2 + 2.4 * (result.ranks - 1 - r) / max(result.ranks - 1, 1)
        ax.step(times, values, where="post", color=color(r), linewidth=width, label=f"rank {r}")
    ax.set_xlim(0, end)
    ax.set_ylim(bottom=0)
    ax.set_ylabel(ylabel)
    ax.set_xlabel(_time_label(result))
    ax.grid(axis="y", color="#dddddd", linewidth=0.6)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    if legend:
        ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)
    return ax


def _title(result: Result) -> str:
    s = result.schedule
    where = "" if result.source == "simulated" else f" ({result.source})"
    return (f"{s.name}{where}: {s.stages} stages, {s.micro} micro-batches  |  "
            f"makespan {result.makespan:.4g}, bubble {result.bubble_fraction:.1%}")


def plot_result(result: Result) -> "Figure":
    """The Gantt chart over the memory panel, on a shared time axis, titled with the
    schedule, its size, the makespan and the bubble fraction."""
    fig = _new_figure(11, 1.6 + 0.45 * result.ranks + 2.0)
    gantt, mem = fig.subplots(2, 1, sharex=True, height_ratios=[0.45 * result.ranks + 0.6, 2.0])
    draw_timeline(result, gantt)
    gantt.set_xlabel("")  # the memory panel below carries the shared time axis
    draw_memory(result, mem)
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
    fig = _new_figure(11, 1.4 + 0.5 * ranks)
    ax = fig.subplots()
    _rank_rows(ax, ranks, end)
    _draw_bars(ax, simulated, height=0.84, label=False, alpha=0.35, hatch="///",
               edgecolor="#555555", linewidth=0.4)
    _draw_bars(ax, measured, height=0.36, label=True, edgecolor="black", linewidth=0.4)
    # where each step ends; a little room on the right so the later line is not on the frame
    ax.axvline(simulated.makespan, color="black", linestyle=":", linewidth=1)
    ax.axvline(measured.makespan, color="black", linestyle="-", linewidth=1)
    ax.set_xlim(0, end * 1.01)
    ax.set_xlabel(_time_label(measured))
    how = [Patch(facecolor="#bbbbbb", alpha=0.5, hatch="///", edgecolor="#555555", label="simulated (wide)"),
           Patch(facecolor="#555555", label="measured (narrow)"),
           Line2D([], [], color="black", linestyle=":", label="simulated end"),
           Line2D([], [], color="black", linestyle="-", label="measured end")]
    _kind_legend(ax, _kinds(simulated) | _kinds(measured), extra=how)
    # the simulator's error, as everywhere in the project: (simulated - measured) / measured
    err = (simulated.makespan - measured.makespan) / measured.makespan if measured.makespan else math.nan
    s = measured.schedule
    fig.suptitle(f"{s.name}: {s.stages} stages, {s.micro} micro-batches  |  makespan simulated "
                 f"{simulated.makespan:.4g}, measured {measured.makespan:.4g}, error {err:+.1%}", fontsize=10)
    return fig


def plot_compare(results: Sequence[Result]) -> "Figure":
    """The Gantt charts of several results stacked on one common time axis, so their
    step lengths compare directly (the naive schedule's is much longer)."""
    end = max(r.makespan for r in results)
    heights = [0.45 * r.ranks + 0.5 for r in results]
    fig = _new_figure(11, 0.9 + sum(heights))
    axes = fig.subplots(len(results), 1, sharex=True, height_ratios=heights, squeeze=False)[:, 0]
    for i, (res, ax) in enumerate(zip(results, axes)):
        draw_timeline(res, ax, legend=(i == 0))
        ax.set_xlabel("")
        ax.axvline(res.makespan, color="black", linestyle=":", linewidth=0.8)
        ax.set_title(f"{res.schedule.name}: makespan {res.makespan:.4g}, bubble {res.bubble_fraction:.1%}",
                     loc="left", fontsize=9)
    axes[-1].set_xlim(0, end)  # shared: every chart gets the longest step's range
    axes[-1].set_xlabel(_time_label(results[0]))
    s = results[0].schedule
    fig.suptitle(f"{s.stages} stages, {s.micro} micro-batches, on one time axis", fontsize=11)
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


# ----------------------------------------------------------------------------- command line

def fail(message: str) -> NoReturn:
    """Print `sim.plot: error: <message>` on one line to stderr and exit with status 2."""
    cli.fail("sim.plot", message)


def _per_stage(text: str) -> list[float]:
    """`'1'` or `'1,2,1,2'`: one number for all stages or one per stage."""
    return [number(t.strip()) for t in text.split(",")]


def build_parser() -> argparse.ArgumentParser:
    p = cli.OneLineParser(error_prog="sim.plot", prog="python -m sim.plot",
                description="Simulate pipeline schedules and draw their timelines and memory.")
    p.add_argument("--stages", type=whole, default=4, help="pipeline stages = devices (default 4)")
    p.add_argument("--micro", type=whole, default=8, help="micro-batches per step (default 8)")
    p.add_argument("--schedule", action="append", metavar="NAME",
                   help=f"schedule(s) to draw, repeatable or comma-separated; default all: {','.join(SCHEDULES)}")
    per = "one number, or a comma-separated list with one per stage"
    p.add_argument("--forward", type=_per_stage, default=[1.0], help=f"forward time per micro-batch; {per}")
    p.add_argument("--backward", type=_per_stage, default=[2.0], help=f"backward time per micro-batch; {per}")
    p.add_argument("--latency", type=number, default=0.0, help="fixed delay of every transfer")
    p.add_argument("--send-overhead", type=number, default=0.0,
                   help="time issuing a SEND holds its device (the isend call; default 0)")
    p.add_argument("--recv-overhead", type=number, default=0.0,
                   help="time posting a RECV holds its device (the irecv call; default 0)")
    p.add_argument("--arrive-overhead", type=number, default=0.0,
                   help="time taking in an arrived tensor holds the receiving device (default 0)")
    p.add_argument("--before-compute", type=number, default=0.0,
                   help="the runtime's own time before each compute starts, holding its device (default 0)")
    p.add_argument("--after-compute", type=number, default=0.0,
                   help="the runtime's own time after each compute ends, holding its device (default 0)")
    p.add_argument("--io-tick", type=lambda t: number(t, allow_inf=True), default=0.0,
                   help="longest a late ready notice waits for a computing sender's transport thread "
                        "(the scheduler tick; default 0: at once; inf: only at the sender's yields)")
    p.add_argument("--bandwidth", type=lambda t: number(t, strict=True, allow_inf=True), default=math.inf,
                   help="bytes/s of each link (default inf: transfers are free)")
    p.add_argument("--activation-bytes", type=_per_stage, default=[1.0],
                   help=f"bytes a stage keeps per micro-batch until its backward; {per}")
    p.add_argument("--activation-bytes-sent", type=_per_stage, default=[0.0],
                   help=f"bytes a stage sends forward per micro-batch; {per}")
    p.add_argument("--static-bytes", type=_per_stage, default=[0.0],
                   help=f"weights, gradients and optimizer state of a stage; {per}")
    p.add_argument("--out", default="figures", help="folder for the files (default figures/)")
    p.add_argument("--trace", action="store_true", help="also write a Chrome trace JSON per schedule")
    p.add_argument("--no-figures", action="store_true", help="print the table only, draw nothing")
    return p


def _costs(args: argparse.Namespace) -> Costs:
    """`Costs` from the arguments, checking that each per-stage list fits `--stages`."""
    fields = {}
    for name in ("forward", "backward", "activation_bytes", "activation_bytes_sent", "static_bytes"):
        values = getattr(args, name)
        if len(values) not in (1, args.stages):
            flag = "--" + name.replace("_", "-")
            fail(f"argument {flag}: got {len(values)} values for {args.stages} stages; "
                 f"give one number or {args.stages} comma-separated numbers")
        fields[name] = values[0] if len(values) == 1 else tuple(values)
    try:
        costs = Costs(latency=args.latency, bandwidth=args.bandwidth, send_overhead=args.send_overhead,
                      recv_overhead=args.recv_overhead, arrive_overhead=args.arrive_overhead,
                      io_tick=args.io_tick, before_compute=args.before_compute,
                      after_compute=args.after_compute, **fields)
        costs.for_stages(args.stages)  # Costs checks per-stage fields only when expanded
    except ValueError as e:
        fail(str(e))
    return costs


def _schedule_names(args: argparse.Namespace) -> list[str]:
    if not args.schedule:
        return list(SCHEDULES)
    names = [n.strip() for item in args.schedule for n in item.split(",") if n.strip()]
    if not names:
        fail(f"argument --schedule: no name given; choose from {', '.join(SCHEDULES)}")
    return names


def format_table(results: Sequence[Result]) -> str:
    """One aligned line per result: makespan, bubble, peak activations per rank, peak memory."""
    rows = [("schedule", "makespan", "bubble", "peak activations", "peak memory")]
    for r in results:
        rows.append((r.schedule.name, f"{r.makespan:.4g}", f"{r.bubble_fraction:.1%}",
                     ",".join(str(n) for n in r.peak_activations), human_bytes(max(r.peak_memory, default=0.0))))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    # the schedule name reads left-aligned, numbers right-aligned
    return "\n".join(
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))).rstrip()
        for row in rows
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (2 for bad arguments, via `fail`)."""
    args = build_parser().parse_args(argv)
    costs = _costs(args)
    out, tag = Path(args.out), f"p{args.stages}_m{args.micro}"
    if out.exists() and not out.is_dir():
        fail(f"argument --out: {out} is a file; give a folder (it is created if missing)")
    try:
        schedules = [make_schedule(n, args.stages, args.micro) for n in _schedule_names(args)]
        # 'GPipe' and 'gpipe' are one schedule: keep the first of each
        unique: dict[str, Schedule] = {}
        for s in schedules:
            unique.setdefault(s.name, s)
        schedules = list(unique.values())
        results = [simulate(s, costs) for s in schedules]
    except (ScheduleError, ValueError) as e:
        fail(str(e).splitlines()[0])  # a deadlock report adds a grid below its first line

    print(format_table(results))
    try:
        written = []
        for r in results:
            if not args.no_figures:
                written.append(out / f"{r.schedule.name}_{tag}.png")
                save_figure(plot_result(r), written[-1])
            if args.trace:
                written.append(out / f"{r.schedule.name}_{tag}.trace.json")
                r.save_chrome_trace(written[-1])
        if not args.no_figures and len(results) > 1:
            written.append(out / f"compare_{tag}.png")
            save_figure(plot_compare(results), written[-1])
    except OSError as e:  # e.g. --out names a file, or the disk is full
        print(f"sim.plot: error: cannot write to {out}: {e.strerror or e}", file=sys.stderr)
        return 1
    for path in written:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
