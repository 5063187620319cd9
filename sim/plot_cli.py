"""The command line of `sim.plot`: simulate schedules, print a table, draw the figures.

    python -m sim.plot --stages 4 --micro 8          # figures/<schedule>_p4_m8.png ...

Everything that can be refused is refused before any work, on one line with exit status
2: bad arguments, a step too large for this machine's memory (`check_size`), an `--out`
that cannot be written. Progress goes to stderr, a line per figure.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import NoReturn, Sequence

from . import cli
from .cli import number, whole
from .costs import Costs
from .engine import simulate
from .ir import ScheduleError
from .plot import format_memory, format_times, human_bytes, memory_unit, plot_compare, \
    plot_result, plural, save_figure, time_unit, timeline_style, TIME_UNIT
from .result import Result
from .schedules import SCHEDULES, TEXTBOOK, lookup, make_schedule

# What a run holds at its peak (maximum resident set, /usr/bin/time -v, all three schedules,
# 2-core x86-64 machine, Python 3.11, 2026-11): a fixed part (Python, numpy, matplotlib:
# 97 MB for p=2, m=1) plus, per stage x micro-batch of each schedule, what the table needs
# (2.3 KB at p=64 m=2048 and p=8192 m=8, 3.1 KB at p=65536 m=1), what the figures add (to
# 2.5 KB at p=64 m=2048, 3.5 KB at p=2 m=65536) and what a Chrome trace adds (a JSON record
# per event: 3.7 KB in all at p=64 m=512, no figures, and at p=64 m=1024 with them). Each
# figure below rounds the largest measured up.
BASE_BYTES = 100 * 2**20
BYTES_PER_CELL = {"table": 3_200, "figures": 400, "trace": 1_600}
MEMORY_SHARE = 0.5  # of the machine's memory, which other work shares
BIG_STEP = 100_000
STYLES = {"bars": "a bar per compute", "dense": "bars without outlines", "heat": "heat map of busy time"}  # stage x micro-batches from which the simulation reports its progress


def fail(message: str) -> NoReturn:
    """Print `sim.plot: error: <message>` on one line to stderr and exit with status 2."""
    cli.fail("sim.plot", message)


def progress(message: str) -> None:
    print(f"sim.plot: {message}", file=sys.stderr, flush=True)


def _per_stage(text: str) -> list[float]:
    """`'1'` or `'1,2,1,2'`: one number for all stages or one per stage."""
    return [number(t.strip()) for t in text.split(",")]


class _Formatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default, except for flags and options with none to show."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default in (None, False, argparse.SUPPRESS):
            return action.help or ""
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    p = cli.OneLineParser(
        error_prog="sim.plot", prog="python -m sim.plot", formatter_class=_Formatter,
        description="Simulate pipeline schedules, print their makespan, bubble and peak memory, "
                    "and draw their timelines and memory.",
        epilog=f"Times are in {TIME_UNIT}: any one unit, used for every time option (seconds, if you give "
               "seconds). Memory is in bytes; left at the defaults (1 byte per activation, no static "
               "bytes) it counts the micro-batches whose activations a device holds.")
    p.add_argument("--stages", type=whole, default=4, help="pipeline stages, one per device")
    p.add_argument("--micro", type=whole, default=8, help="micro-batches per step")
    p.add_argument("--schedule", action="append", metavar="NAME",
                   help=f"schedule(s) to draw, repeatable or comma-separated: {', '.join(SCHEDULES)} "
                        f"(default: {','.join(TEXTBOOK)})")
    per = "one number, or a comma-separated list with one per stage"
    t = TIME_UNIT
    p.add_argument("--forward", type=_per_stage, default="1", help=f"forward time per micro-batch in {t}; {per}")
    p.add_argument("--backward", type=_per_stage, default="2", help=f"backward time per micro-batch in {t}; {per}")
    p.add_argument("--latency", type=number, default="0", help=f"fixed delay of every transfer, in {t}")
    p.add_argument("--send-overhead", type=number, default="0",
                   help=f"time issuing a SEND holds its device (the isend call), in {t}")
    p.add_argument("--recv-overhead", type=number, default="0",
                   help=f"time posting a RECV holds its device (the irecv call), in {t}")
    p.add_argument("--arrive-overhead", type=number, default="0",
                   help=f"time taking in an arrived tensor holds the receiving device, in {t}")
    p.add_argument("--before-compute", type=number, default="0",
                   help=f"the runtime's own time before each compute starts, holding its device, in {t}")
    p.add_argument("--after-compute", type=number, default="0",
                   help=f"the runtime's own time after each compute ends, holding its device, in {t}")
    p.add_argument("--io-tick", type=lambda s: number(s, allow_inf=True), default="0",
                   help=f"longest a late ready notice waits for a computing sender's transport thread, in {t} "
                        "(the scheduler tick; 0: at once; inf: only at the sender's yields)")
    p.add_argument("--bandwidth", type=lambda s: number(s, strict=True, allow_inf=True), default="inf",
                   help=f"bytes per {t[:-1]} of each link (inf: transfers are free)")
    p.add_argument("--activation-bytes", type=_per_stage, default="1",
                   help=f"bytes a stage keeps per micro-batch until its backward; {per}")
    p.add_argument("--activation-bytes-sent", type=_per_stage, default="0",
                   help=f"bytes a stage sends forward per micro-batch; {per}")
    p.add_argument("--static-bytes", type=_per_stage, default="0",
                   help=f"bytes a stage holds for the whole step (weights, gradients, optimizer state and the rest together); {per}")
    p.add_argument("--out", default="figures", help="folder for the files, created if missing")
    p.add_argument("--trace", action="store_true", help="also write a Chrome trace JSON per schedule")
    p.add_argument("--no-figures", action="store_true", help="print the table only, draw nothing")
    return p


def _schedule_names(args: argparse.Namespace) -> list[str]:
    """The schedules asked for, each once ('GPipe' and 'gpipe' are one), checked."""
    given = [n.strip() for item in args.schedule or [",".join(TEXTBOOK)] for n in item.split(",") if n.strip()]
    if not given:
        fail(f"argument --schedule: no name given; choose from {', '.join(SCHEDULES)}")
    names: list[str] = []
    for n in given:
        try:
            key, _ = lookup(n)
        except ScheduleError:
            fail(f"argument --schedule: unknown schedule {n!r}; choose from {', '.join(SCHEDULES)}")
        if key not in names:
            names.append(key)
    return names


def machine_memory() -> int:
    """Bytes of memory this process may use: the machine's (os.sysconf), or its cgroup's
    limit where that is lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        if limit.isdigit():
            total = min(total, int(limit))
    except OSError:
        pass
    return total


def check_size(args: argparse.Namespace, schedules: int) -> None:
    """Refuse, before allocating anything, a step whose simulation (and figures, and
    traces) would need more than `MEMORY_SHARE` of this machine's memory, by the bytes
    per stage x micro-batch measured for each (`BYTES_PER_CELL`)."""
    parts = ["table"] + ([] if args.no_figures else ["figures"]) + (["trace"] if args.trace else [])
    per = sum(BYTES_PER_CELL[p] for p in parts)
    cells = args.stages * args.micro
    allowed = MEMORY_SHARE * machine_memory()
    need = BASE_BYTES + schedules * cells * per
    if need > allowed:
        most = max(0, int((allowed - BASE_BYTES) / (schedules * per)))
        more = [o for o, on in (("fewer --schedule", schedules > 1), ("--no-figures", len(parts) > 1)) if on]
        fail(f"step too large for this machine: --stages {args.stages} x --micro {args.micro} = {cells:,} "
             f"stage-micro-batches x {plural(schedules, 'schedule')} would need about {human_bytes(need)} "
             f"({per:,} bytes each for the {' + '.join(parts)}, as measured), more than the {human_bytes(allowed)} "
             f"allowed ({MEMORY_SHARE:.0%} of its {human_bytes(machine_memory())} of memory); the limit here is "
             f"{most:,} stage-micro-batches" + (f" ({' or '.join(more)} allow more)" if more else ""))


def _costs(args: argparse.Namespace) -> Costs:
    """`Costs` from the arguments, checking that each per-stage list fits `--stages`."""
    fields = {}
    for name in ("forward", "backward", "activation_bytes", "activation_bytes_sent", "static_bytes"):
        values = getattr(args, name)
        if len(values) not in (1, args.stages):
            flag = "--" + name.replace("_", "-")
            fail(f"argument {flag}: got {len(values)} values for {plural(args.stages, 'stage')}; "
                 f"give one number or {args.stages} comma-separated numbers")
        fields[name] = values[0] if len(values) == 1 else tuple(values)
    try:
        costs = Costs(latency=args.latency, bandwidth=args.bandwidth, send_overhead=args.send_overhead,
                      recv_overhead=args.recv_overhead, arrive_overhead=args.arrive_overhead,
                      io_tick=args.io_tick, before_compute=args.before_compute,
                      after_compute=args.after_compute, **fields)
        costs.for_stages(args.stages)  # the lengths against the stage count
    except ValueError as e:
        fail(str(e))
    return costs


def _check_out(out: Path) -> None:
    """Make the folder and write a file in it, before any work."""
    if out.exists() and not out.is_dir():
        fail(f"argument --out: {out} is a file; give a folder (it is created if missing)")
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as e:
        fail(f"argument --out: cannot write to {out}: {e.strerror or e}")


def _compact(values: Sequence[int]) -> str:
    """`4,3,2,1`; past 8 values the first three and the last: `64,63,62,...,1`."""
    shown = [str(v) for v in values]
    return ",".join(shown if len(shown) <= 8 else shown[:3] + ["...", shown[-1]])


def format_table(results: Sequence[Result]) -> str:
    """One aligned line per result: makespan, bubble, peak activations per rank, peak
    memory, each with its unit."""
    results = list(results)
    units = {time_unit(r) for r in results}
    top = max((max(r.peak_memory, default=0.0) for r in results), default=0.0)
    scale, unit = memory_unit(results, top)
    rows = [("schedule", f"makespan ({' or '.join(sorted(units))})", "bubble", "peak activations (micro-batches)",
             "peak memory")]
    for r, makespan in zip(results, format_times([r.makespan for r in results])):
        peak = max(r.peak_memory, default=0.0)
        memory = format_memory(peak, scale, unit) if unit == "micro-batches" else human_bytes(peak)
        rows.append((r.schedule.name, makespan, f"{r.bubble_fraction:.1%}", _compact(r.peak_activations), memory))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    # the schedule name and the memory read left-aligned, numbers right-aligned
    return "\n".join(
        "  ".join(c.ljust(w) if i in (0, 4) else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))).rstrip()
        for row in rows
    )


def _simulate(args: argparse.Namespace, names: list[str], costs: Costs) -> list[Result]:
    big = args.stages * args.micro >= BIG_STEP
    results = []
    try:
        for name in names:
            if big:
                progress(f"simulating {name}: {plural(args.stages, 'stage')}, "
                         f"{plural(args.micro, 'micro-batch', 'micro-batches')}")
            results.append(simulate(make_schedule(name, args.stages, args.micro), costs))
    except (ScheduleError, ValueError) as e:
        fail(str(e).splitlines()[0])  # a deadlock report adds a grid below its first line
    return results


def _write(args: argparse.Namespace, results: list[Result], out: Path) -> list[Path]:
    """Draw and write what was asked for, a progress line per file; returns the paths."""
    tag = f"p{args.stages}_m{args.micro}"
    jobs = []
    for r in results:
        if not args.no_figures:
            jobs.append((out / f"{r.schedule.name}_{tag}.png", lambda p, r=r: save_figure(plot_result(r), p),
                         STYLES[timeline_style(r)]))
        if args.trace:
            jobs.append((out / f"{r.schedule.name}_{tag}.trace.json", lambda p, r=r: r.save_chrome_trace(p),
                         "Chrome trace"))
    if not args.no_figures and len(results) > 1:
        jobs.append((out / f"compare_{tag}.png", lambda p: save_figure(plot_compare(results), p), "comparison"))
    start = time.perf_counter()
    for i, (path, write, what) in enumerate(jobs, 1):
        progress(f"[{i}/{len(jobs)}] writing {path} ({what}; {time.perf_counter() - start:.1f} s so far)")
        write(path)
    return [path for path, _, _ in jobs]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (2 for what is refused, via `fail`)."""
    args = build_parser().parse_args(argv)
    names = _schedule_names(args)
    check_size(args, len(names))
    costs = _costs(args)
    out = Path(args.out)
    if args.trace or not args.no_figures:
        _check_out(out)
    results = _simulate(args, names, costs)
    print(format_table(results), flush=True)
    try:
        written = _write(args, results, out)
    except OSError as e:  # e.g. the disk is full
        print(f"sim.plot: error: cannot write to {out}: {e.strerror or e}", file=sys.stderr)
        return 1
    for path in written:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
