"""The command line of `sim.plot`: simulate schedules, print a table, draw the figures.

    python -m sim.plot --devices 4 --micro-batches 8   # out/<schedule>_p4_m8.png ..., out/compare_p4_m8.png
    python -m sim.plot --stages 4 --micro 8            # the same: the old flags are aliases
    python -m sim.plot --compare 1f1b,zb-h1,zb-h2,zbv   # out/compare_1f1b+zb-h1+zb-h2+zbv_p4_m8.png only
    python -m sim.plot --compare naive,gpipe,1f1b --out figures   # the README's figure

Files go to `--out` (default `out/`, which git ignores), each named after what it shows,
so that no command overwrites another's figure: a comparison of other schedules than
naive, GPipe and 1F1B names them.

Everything that can be refused is refused before any work, on one line with exit status
2: bad arguments, a step too large for this machine's memory (`check_size`), an `--out`
that cannot be written. Progress goes to stderr, a line per figure.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import NoReturn, Sequence

from sim import cli, limits
from sim.cli import number, whole
from sim.engine.costs import Costs
from sim.engine.fields import CHUNKED, COST_FIELDS
from sim.simulation import simulate
from sim.schedule.ir import Kind, ScheduleError
from .gantt import format_memory, format_times, human_bytes, memory_unit, plot_compare, \
    plot_result, plural, save_figure, time_unit, timeline_style, TIME_UNIT
from sim.engine.result import Result
from .labels import costs_note, device_micro_batches
from sim.schedule.ir import Schedule
from sim.schedule.registry import SCHEDULES, TEXTBOOK, lookup, make_schedule

BIG_STEP = 100_000
STYLES = {"bars": "a bar per compute", "dense": "bars without outlines", "heat": "heat map of busy time"}
# The options some generators take (`Generator.options`), as command-line flags: (flag,
# metavar, type, help). A generator whose options include "costs" gets the step's `Costs`.
OPTION_FLAGS = {
    "max_active": ("--max-active", "N", whole, "most micro-batches in flight per device"),
    "memory_limit": ("--memory-limit", "BYTES", lambda t: number(t, strict=True), "activation bytes a device may hold"),
    "group_size": ("--group-size", "N", whole, "micro-batches per group of chunks (Megatron-Core's "
                   "microbatch_group_size_per_vp_stage)"),
}
# The Costs fields that have a flag (`CostField.flag`): times first, then bandwidth, then bytes
FLAGGED = sorted((f for f in COST_FIELDS if f.flag), key=lambda f: (("time", "bandwidth", "bytes").index(f.unit),
                                                                       not f.per_stage))
PER_STAGE = tuple(f.name for f in FLAGGED if f.per_stage)


def fail(message: str) -> NoReturn:
    """Print `sim.plot: error: <message>` on one line to stderr and exit with status 2."""
    cli.fail("sim.plot", message)


def progress(message: str) -> None:
    print(f"sim.plot: {message}", file=sys.stderr, flush=True)


def _per_stage(text: str) -> list[float]:
    """`'1'` or `'1,2,1,2'`: one number for all stages or one per stage."""
    return [number(t.strip()) for t in text.split(",")]


def flag_of(field: str) -> str:
    return "--" + field.replace("_", "-")


# The Costs fields a measured runtime's calibration sets (exec.measure.calibrate fits them):
# a textbook step leaves them at their defaults, so `--help` lists them last, in a group of their own.
CALIBRATION = tuple(f.name for f in FLAGGED if f.call or f.name.endswith("_compute") or f.name == "first_compute_tau")
METAVARS = {"time": "T", "bandwidth": "RATE", "bytes": "BYTES"}


def add_cost_flags(groups: dict[str, argparse._ArgumentGroup]) -> None:
    """A flag per `FLAGGED` field of `Costs`, with its unit, default and help from the field:
    a compute's time in `groups["compute"]`, transfers and memory in `groups["memory"]`, the
    runtime's calibrated costs (`CALIBRATION`) in `groups["calibration"]`."""
    per = "one number, or a comma-separated list with one per stage"
    for f in FLAGGED:
        text = f.help + (f", in {TIME_UNIT}" if f.unit == "time" else "")
        if f.fallback:
            text += f" (default: {f.default_text(flag_of)})"
        kind = _per_stage if f.per_stage else (lambda s, f=f: number(s, strict=f.positive, allow_inf=f.inf))
        where = ("calibration" if f.name in CALIBRATION else "compute" if f.unit == "time" and f.per_stage
                 else "memory")
        groups[where].add_argument(flag_of(f.name), type=kind, default=None if f.fallback else f.default_text(),
                                   metavar=METAVARS[f.unit], help=text + (f"; {per}" if f.per_stage else ""))


def build_parser() -> argparse.ArgumentParser:
    p = cli.OneLineParser(
        error_prog="sim.plot", prog="python -m sim.plot", formatter_class=cli.DefaultsFormatter,
        description="Simulate pipeline schedules, print their makespan, bubble and peak memory, "
                    "and draw their timelines and memory.",
        epilog=f"Times are in {TIME_UNIT}: any one unit, used for every time option (seconds, if you give "
               "seconds). Memory is in bytes; left at the defaults (1 byte per activation, no static "
               "bytes) it counts the micro-batches whose activations a device holds. A cost given as one "
               "number is a device's share of the model: a schedule with V chunks per device takes 1/V of "
               "it per chunk (times and bytes held), so that compared schedules run the same model; a "
               "per-stage list gives each of the P x V model stages its own. The schedules: "
               + "; ".join(f"{n}: {g.summary}" for n, g in SCHEDULES.items()) + ".")
    step = p.add_argument_group("the step")
    step.add_argument("--devices", "--stages", dest="devices", type=whole, default=4, metavar="P",
                      help="pipeline devices P, a rank each; the schedule has P x V model stages "
                           "(--stages: alias of --devices)")
    step.add_argument("--micro-batches", "--micro", dest="micro_batches", type=whole, default=8, metavar="M",
                      help="micro-batches per step (--micro: alias of --micro-batches)")
    step.add_argument("--virtual", type=whole, metavar="V",
                      help="model stages (chunks) per device (default: the schedule's own, 1 or 2 for the V-shaped ones)")
    which = step.add_mutually_exclusive_group()
    which.add_argument("--schedule", action="append", metavar="NAME",
                       help=f"schedule(s) to draw, repeatable or comma-separated: {', '.join(SCHEDULES)} "
                            f"(default: {','.join(TEXTBOOK)})")
    which.add_argument("--compare", metavar="NAMES",
                       help="comma-separated schedules to draw in one comparison figure only (each its Gantt "
                            "chart over its memory, memory on one scale), e.g. 1f1b,zb-h1,zb-h2,zbv")
    groups = {"compute": p.add_argument_group("compute times"),
              "memory": p.add_argument_group("transfers and memory")}
    output = p.add_argument_group("output")
    output.add_argument("--out", default="out", help="folder for the files, created if missing (default out/, "
                                                     "which git ignores)")
    output.add_argument("--trace", action="store_true", help="also write a Chrome trace JSON per schedule")
    output.add_argument("--no-figures", action="store_true", help="print the table only, draw nothing")
    options = p.add_argument_group("schedule options", "for the generators that take them")
    for option, (flag, metavar, kind, text) in OPTION_FLAGS.items():
        takers = [n for n, g in SCHEDULES.items() if option in g.options]
        options.add_argument(flag, type=kind, metavar=metavar,
                             help=f"{text}, for the schedules that take it: {', '.join(takers) or 'none yet'}")
    groups["calibration"] = p.add_argument_group(
        "calibration", "a measured runtime's own costs, which exec.measure.calibrate fits to replay a real step "
                       "(docs/performance.md); a textbook step leaves them at their defaults")
    add_cost_flags(groups)
    return p


def _schedule_names(args: argparse.Namespace) -> list[str]:
    """The schedules asked for (`--schedule` or `--compare`), each once ('GPipe' and 'gpipe'
    are one), checked."""
    flag = "--compare" if args.compare is not None else "--schedule"
    items = [args.compare] if args.compare is not None else args.schedule or [",".join(TEXTBOOK)]
    given = [n.strip() for item in items for n in item.split(",") if n.strip()]
    if not given:
        fail(f"argument {flag}: no name given; choose from {', '.join(SCHEDULES)}")
    names: list[str] = []
    for n in given:
        try:
            key, _ = lookup(n)
        except ScheduleError:
            fail(f"argument {flag}: unknown schedule {n!r}; choose from {', '.join(SCHEDULES)}")
        if key not in names:
            names.append(key)
    return names


def _virtual(args: argparse.Namespace, name: str) -> int:
    """V of `name`: `--virtual`, or the schedule's own."""
    return args.virtual if args.virtual is not None else SCHEDULES[name].virtual


def _options(args: argparse.Namespace, names: list[str], costs: Costs) -> dict[str, dict]:
    """Per schedule, the options it gets: each option flag given goes to the schedules
    that take it, and is refused if none of them does; "costs" goes to those that take it."""
    options: dict[str, dict] = {n: {} for n in names}
    for option, (flag, *_) in OPTION_FLAGS.items():
        value = getattr(args, option)
        if value is None:
            continue
        takers = [n for n in names if option in SCHEDULES[n].options]
        if not takers:
            known = [n for n, g in SCHEDULES.items() if option in g.options]
            fail(f"argument {flag}: {', '.join(names)} take{'s' * (len(names) == 1)} no {flag}; "
                 f"it is for {', '.join(known) or 'no schedule yet'}")
        for n in takers:
            options[n][option] = value
    for n in names:
        if "costs" in SCHEDULES[n].options:
            options[n]["costs"] = costs
    return options


def check_size(args: argparse.Namespace, schedules: int, virtual: int = 1) -> None:
    """Refuse, before allocating anything, a step whose simulation (and figures, and
    traces) of `schedules` schedules would need more of this machine's memory than it may
    take (`sim.limits.check_cells`); `virtual`: the most model stages per device among them."""
    parts = ("table",) + (() if args.no_figures else ("figures",)) + (("trace",) if args.trace else ())
    more = [o for o, on in (("fewer --schedule", schedules > 1), ("--no-figures", "figures" in parts),
                            ("no --trace", args.trace)) if on]
    v = f" x V {virtual}" if virtual > 1 else ""
    hint = (f"give fewer --devices or --micro-batches (now {args.devices}{v} x {args.micro_batches})"
            + (f", or {' or '.join(more)} to allow more" if more else ""))
    try:
        limits.check_cells(args.devices * virtual * args.micro_batches, parts, schedules, hint)
    except limits.StepTooLarge as e:
        fail(str(e))


def costs_of(args: argparse.Namespace) -> Costs:
    """`Costs` from the arguments; the lengths of per-stage lists are checked against
    each schedule (`_check_lengths`)."""
    fields = {}
    for f in FLAGGED:
        value = getattr(args, f.name)
        if value is not None:
            fields[f.name] = (value[0] if len(value) == 1 else tuple(value)) if f.per_stage else value
    try:
        return Costs(**fields)
    except ValueError as e:
        fail(str(e))


def _check_lengths(args: argparse.Namespace, name: str) -> None:
    """Each per-stage list has one value or one per model stage of `name` (P x V)."""
    v = _virtual(args, name)
    stages = args.devices * v
    where = "" if v == 1 else f" of {name} ({args.devices} devices x V {v})"
    for field in PER_STAGE:
        values = getattr(args, field)
        if values is not None and len(values) not in (1, stages):
            fail(f"argument {flag_of(field)}: got {len(values)} values for {plural(stages, 'stage')}{where}; "
                 f"give one number or {stages} comma-separated numbers")


def _schedules(args: argparse.Namespace, names: list[str], costs: Costs) -> list[Schedule]:
    """The schedules asked for, or one line naming what a generator refuses."""
    options = _options(args, names, costs)
    schedules = []
    for name in names:
        _check_lengths(args, name)
        try:
            with cli.heartbeat("sim.plot", f"building {name}" + (" (its search simulates candidate steps)" if name == "zb-auto" else "")):
                schedules.append(make_schedule(name, args.devices, args.micro_batches, args.virtual, **options[name]))
        except (ScheduleError, ValueError) as e:
            fail(str(e).splitlines()[0])
    return schedules


def _check_out(out: Path) -> None:
    """Make the folder and write a file in it, before any work (`sim.cli.folder_problem`)."""
    problem = cli.folder_problem(out)
    if problem:
        fail(f"argument --out: {problem}")


def _compact(values: Sequence[int]) -> str:
    """`4,3,2,1`; past 8 values the first three and the last: `64,63,62,...,1`."""
    shown = [str(v) for v in values]
    return ",".join(shown if len(shown) <= 8 else shown[:3] + ["...", shown[-1]])


def format_table(results: Sequence[Result], counts: bool = False) -> str:
    """One aligned line per result: makespan and bubble, the steady step and its bubble
    (steps repeating without a flush: `Result.steady_step`), peak activations per rank,
    peak memory, each with its unit. `counts`: the memory is in units of one micro-batch's
    activations of a device (the default costs), whatever the results hold."""
    results = list(results)
    units = {time_unit(r) for r in results}
    top = max((max(r.peak_memory, default=0.0) for r in results), default=0.0)
    scale, unit = (1.0, "micro-batches") if counts else memory_unit(results, top)
    rows = [("schedule", f"makespan ({' or '.join(sorted(units))})", "bubble", "steady step", "steady bubble",
             "peak activations (micro-batches)", "peak memory")]
    times = format_times([t for r in results for t in (r.makespan, r.steady_step)])
    for i, r in enumerate(results):
        peak = max(r.peak_memory, default=0.0)
        memory = format_memory(peak, scale, unit) if unit == "micro-batches" else human_bytes(peak)
        rows.append((r.schedule.name, times[2 * i], f"{r.bubble_fraction:.1%}", times[2 * i + 1],
                     f"{r.steady_bubble_fraction:.1%}", _compact(device_micro_batches(r)), memory))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    left = (0, len(rows[0]) - 1)  # the schedule name and the memory read left-aligned, numbers right-aligned
    return "\n".join(
        "  ".join(c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))).rstrip()
        for row in rows
    )


def chunk_costs(costs: Costs, virtual: int) -> Costs:
    """The costs of one model stage of a schedule with `virtual` chunks per device: a
    field that a device's share of the model splits (`sim.engine.fields.CHUNKED`: what a
    chunk computes, keeps and holds; the activation a stage sends on keeps its size) given
    as one number (or left at its default) is a device's share, so each chunk takes 1/V
    of it, and every schedule of a comparison runs the same model; a per-stage list gives
    each of the P x V model stages its own value."""
    if virtual == 1:
        return costs
    one = {f: getattr(costs, f) for f in CHUNKED if isinstance(getattr(costs, f), (int, float))}
    return dataclasses.replace(costs, **{f: v / virtual for f, v in one.items()})


def _simulate(args: argparse.Namespace, schedules: list[Schedule], costs: Costs) -> list[Result]:
    big = args.devices * args.micro_batches >= BIG_STEP
    results = []
    try:
        for schedule in schedules:
            if big:
                progress(f"simulating {schedule.name}: {plural(schedule.stages, 'stage')}, "
                         f"{plural(args.micro_batches, 'micro-batch', 'micro-batches')}")
            # a stage is 1/V of a device's share of one copy of the model (DualPipe holds two)
            with cli.heartbeat("sim.plot", f"simulating {schedule.name}"):
                results.append(simulate(schedule, chunk_costs(costs, schedule.chain // args.devices)))
    except (ScheduleError, ValueError) as e:
        fail(str(e).splitlines()[0])  # a deadlock report adds a grid below its first line
    return results


def _write(args: argparse.Namespace, results: list[Result], out: Path, counts: bool = False) -> list[Path]:
    """Draw and write what was asked for, a progress line per file; returns the paths.
    With `--compare`, the comparison figure is the only figure. `counts`: memory in
    micro-batches of a device's activations (the default bytes), as in the table."""
    unit = (1.0, "micro-batches") if counts else None
    tag = f"p{args.devices}_m{args.micro_batches}" + (f"_v{args.virtual}" if args.virtual is not None else "")
    jobs = []
    for r in results:
        if not args.no_figures and args.compare is None:
            jobs.append((out / f"{r.schedule.name}_{tag}.png", lambda p, r=r: save_figure(plot_result(r, unit), p),
                         STYLES[timeline_style(r)]))
        if args.trace:
            jobs.append((out / f"{r.schedule.name}_{tag}.trace.json", lambda p, r=r: r.save_chrome_trace(p),
                         "Chrome trace"))
    if not args.no_figures and (len(results) > 1 or args.compare is not None):
        names = [r.schedule.name for r in results]
        which = "" if names == list(TEXTBOOK) else "+".join(names) + "_"  # the README's figure keeps its name
        # the textbook three share one time axis: that naive takes longest is their lesson
        shared = True if names == list(TEXTBOOK) else None
        note = costs_note(costs_of(args), max(r.schedule.stages // r.ranks for r in results),
                          any(a.kind is Kind.I for r in results for p in r.schedule.programs for a in p))
        jobs.append((out / f"compare_{which}{tag}.png",
                     lambda p: save_figure(plot_compare(results, shared, unit, note=note), p), "comparison"))
    start = time.perf_counter()
    for i, (path, write, what) in enumerate(jobs, 1):
        progress(f"[{i}/{len(jobs)}] writing {path} ({what}; {time.perf_counter() - start:.1f} s so far)")
        write(path)
    return [path for path, _, _ in jobs]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (2 for what is refused, via `fail`)."""
    args = build_parser().parse_args(argv)
    names = _schedule_names(args)
    check_size(args, len(names), max(_virtual(args, n) for n in names))
    costs = costs_of(args)
    schedules = _schedules(args, names, costs)
    out = Path(args.out)
    if args.trace or not args.no_figures:
        _check_out(out)
    results = _simulate(args, schedules, costs)  # a step of no time or past a float's range: sim.simulate refuses
    # the default bytes (1 per activation, nothing static): memory counts micro-batches' activations
    counts = args.activation_bytes == [1.0] and args.w_activation_bytes is None and args.static_bytes == [0.0]
    print(format_table(results, counts), flush=True)
    if counts and any(r.schedule.stages != r.ranks or any(a.kind is Kind.I for p in r.schedule.programs for a in p)
               for r in results):
        print("peak activations: per rank, the micro-batches between their F and their B or I; peak memory: what "
              "the fullest rank holds (W keeps its part after I); both in micro-batches of a device's activations, "
              "of which a chunk's (one of V stages on a rank) is 1/V", flush=True)
    try:
        written = _write(args, results, out, counts)
    except OSError as e:  # e.g. the disk is full
        print(f"sim.plot: error: cannot write to {out}: {e.strerror or e}", file=sys.stderr)
        return 1
    for path in written:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
