"""The command of the plan-against-run bench (`benchmarks/bench_plan_vs_run.py`): its options, a run's row, the summary by shape, and the check it records into the profile (`layers.checked`, docs/profiles.md).

The grid, the runs and their errors are `exec.measure.plan_vs_run`'s; the bench's usage is
in its own docstring.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import asdict
from pathlib import Path

import sim
from exec.launch.host import host_cores, loadavg
from exec.measure.plan_vs_run import (GRID_SCHEDULES, MODEL, SCHEDULES, SHAPES, compare, compute_error, grid,
                                      median_runs, paired, read_rounds, reference, repredict, reprofile, shape_name)


def row(r: dict) -> str:
    c = r["case"]
    lost = "n/a" if r["lost_share"] is None else f"{r['lost_share'] * 100:.0f}%"
    steal = "n/a" if r.get("steal") is None else f"{r['steal'] * 100:.1f}%"
    return (f"{shape_name(r['model']):>22} {c.schedule:>5} {c.recompute:>4}  {r['predicted_s'] * 1e3:7.1f} "
            f"{r['measured_s'] * 1e3:7.1f} {r['error_pct']:+6.1f}% {r['drift']:5.2f} {r['scaled_error_pct']:+6.1f}% "
            f"{compute_error(r):+7.1f}% {r['spread'] * 100:5.1f}% {r['memory_error_pct']:7.3f}% {lost:>5} {steal:>5}  "
            f"{r['load']}")


UNTOUCHED = 0.05  # a run whose steps other processes took less than this share of (exec.run's lost_share)


def summary(rows: list[dict]) -> list[str]:
    """Per shape, and over the shapes other than MODEL: the median and worst |error|, raw,
    drift-scaled and paired (`paired`), and the worst peak-memory error; then the same over
    the runs that other processes barely touched (`UNTOUCHED`), the profiled shape's and the others'."""
    def stats(rs, key):
        e = [abs(r[key]) for r in rs if key in r]
        return f"{statistics.median(e):4.1f}% / {max(e):5.1f}%" if e else "-"

    out = [f"{'shape':>22}  {'raw median / worst':>18}  {'drift-scaled':>15}  {'paired':>15}  {'computes':>15}  "
           f"{'computes paired':>15}  memory"]
    rows = [r | {"compute_error_pct": compute_error(r)} for r in rows]
    others = paired(rows)
    groups = {shape_name(MODEL): [r for r in rows if r["model"] == MODEL]}
    for r in others:
        groups.setdefault(shape_name(r["model"]), []).append(r)
    untouched = [r for r in rows if (r.get("lost_share") or 1.0) < UNTOUCHED]
    for name, rs in list(groups.items()) + ([("not profiled", others)] if others else []) + [
            ("profiled, lost < 5%", [r for r in untouched if r["model"] == MODEL]),
            ("others, lost < 5%", [r for r in untouched if r["model"] != MODEL])]:
        if rs:
            out.append(f"{name:>22}  {stats(rs, 'error_pct'):>18}  {stats(rs, 'scaled_error_pct'):>15}  "
                       f"{stats(rs, 'paired_error_pct'):>15}  {stats(rs, 'compute_error_pct'):>15}  "
                       f"{stats(rs, 'paired_compute_pct'):>15}  {max(r['memory_error_pct'] for r in rs):.3f}%")
    return out


def record(path: Path, rows: list[dict], command: str) -> None:
    """Write into the profile at `path` (`layers.checked`, docs/profiles.md) how far its
    predictions held: per shape its runs and median and worst |step error| (%), paired for the
    shapes the profile did not measure (`paired`), raw for the profiled one."""
    import datetime
    import platform
    profile = sim.load_profile(path)
    out = []
    others = paired(rows)
    for model in [MODEL] + [m for m in dict.fromkeys(tuple(r["model"].items()) for r in others)]:
        model = dict(model)
        rs = [r for r in (rows if model == MODEL else others) if r["model"] == model]
        e = [abs(r["error_pct" if model == MODEL else "paired_error_pct"]) for r in rs]
        if e:
            out.append([*(model[k] for k in ("layers", "hidden", "heads", "seq", "vocab")), len(e),
                        max(statistics.median(e), 1e-9), max(max(e), 1e-9)])
    data = profile.to_dict()
    data["layers"]["checked"] = {"rows": out, "source": "measured", "command": command,
                                 "machine": f"{platform.node()}: {profile.gpu.name}",
                                 "date": datetime.date.today().isoformat(),
                                 "how": "benchmarks/bench_plan_vs_run.py: |step error| %, raw for the profiled shape, "
                                        "paired with the profiled shape's runs around it for the others"}
    sim.save_profile(data, path)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="bench_plan_vs_run", allow_abbrev=False,
                                 description="the planner against real runs of model shapes on a measured device profile")
    ap.add_argument("--profile", help="a device profile (python -m exec.profile_device --out FILE)")
    ap.add_argument("--summary", type=Path, action="append",
                    help="print the summary of a run --json wrote, and measure nothing (repeat: the median of "
                         "each case over the files' rounds, `median_runs`)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run the grid this many times, one after another, and read each case by the median "
                         "of its rounds (`median_runs`)")
    ap.add_argument("--quick", action="store_true", help="6 runs (1F1B, one other shape), 2 measured steps")
    ap.add_argument("--pp", type=int, default=2)
    ap.add_argument("--schedule", action="append", choices=SCHEDULES, help="only this schedule (repeat)")
    ap.add_argument("--recompute", action="append", choices=("none", "full"), help="only this mode (repeat)")
    ap.add_argument("--shape", action="append", metavar="L,H,A,S,V",
                    help="a model shape instead of SHAPES: layers, hidden, heads, sequence, vocabulary (repeat)")
    ap.add_argument("--json", type=Path, help="write every row to this file")
    ap.add_argument("--record", action="store_true",
                    help="write into the profile how far from its blocks it held (layers.checked, docs/profiles.md)")
    ap.add_argument("--reprofile", action="store_true",
                    help="measure the device again just before each case and predict it with that profile "
                         "(a VM's speed can drift 20-30 %% in minutes: docs/validation.md)")
    return ap


def stored_summary(paths: list[Path], profile_path: str | None) -> int:
    """`--summary`: the summary of stored runs (each case by its median over the rounds),
    predicted again from `profile_path` if given; nothing measured. 2 (one line) where a file
    or the profile cannot be read."""
    try:
        rounds = read_rounds(paths)
        rows = median_runs(rounds) if len(rounds) > 1 else rounds[0]
    except (OSError, ValueError, TypeError, KeyError, IndexError) as e:
        print(f"bench_plan_vs_run: {' '.join(map(str, paths))}: {e}", file=sys.stderr)
        return 2
    if profile_path:  # the same runs, predicted again from this profile
        try:
            profile = sim.load_profile(profile_path)
        except (OSError, ValueError) as e:
            print(f"bench_plan_vs_run: {e}", file=sys.stderr)
            return 2
        rows = [repredict(profile, r) for r in rows]
    print("\n".join(summary(rows)))
    return 0


def run_grid(args: argparse.Namespace, profile, shapes) -> tuple[list[dict], object]:
    """Every case of the grid, `args.rounds` times, each measured and predicted (`compare`,
    the profile measured again before each under `--reprofile`), its row printed and, with
    `--json`, every row so far written; each row carries its `round`. Returns the rows and
    the profile of the last case."""
    steps, warmup = (2, 1) if args.quick else (5, 2)
    measured = sorted({(k[1], k[2], k[4]) for k in profile.layers.blocks}) if profile else []
    start = (reference() + reference()) / 2
    print(f"profile blocks measured at (hidden, heads, seq): {measured}; reference block {start * 1e3:.2f} ms; "
          f"load {loadavg()}")
    print(f"{'shape':>22} {'sched':>5} {'rc':>4}  {'pred':>7} {'meas ms':>7} {'error':>7} {'drift':>5} "
          f"{'scaled':>7} {'computes':>8} {'spread':>6} {'mem err':>8} {'lost':>5} {'steal':>5}  "
          f"load (1, 5, 15 min) before -> after")
    rows = []
    cases = grid(len(host_cores()), args.pp, args.quick, args.schedule or GRID_SCHEDULES,
                 args.recompute or ("none", "full"), shapes)
    for k in range(args.rounds):
        if args.rounds > 1:
            print(f"round {k + 1} of {args.rounds}; load {loadavg()}", flush=True)
        for model, case in cases:
            if args.reprofile:
                profile = reprofile(args.profile)
            rows.append(compare(profile, case, model, steps, warmup, drift=reference() / start) | {"round": k})
            print(row(rows[-1]), flush=True)
            if args.json:
                args.json.write_text(json.dumps([{**r, "case": asdict(r["case"])} for r in rows], indent=1) + "\n")
    return rows, profile


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.summary:
        return stored_summary(args.summary, args.profile)
    if not args.profile or args.rounds < 1:
        print("bench_plan_vs_run: give --profile (or --summary FILE)" if not args.profile else
              f"bench_plan_vs_run: --rounds must be at least 1, got {args.rounds}", file=sys.stderr)
        return 2
    try:
        profile = None if args.reprofile else sim.load_profile(args.profile)
        shapes = [dict(zip(("layers", "hidden", "heads", "seq", "vocab"), map(int, s.split(",")), strict=True))
                  for s in args.shape] if args.shape else SHAPES
    except (OSError, ValueError) as e:
        print(f"bench_plan_vs_run: {e}", file=sys.stderr)
        return 2
    rows, profile = run_grid(args, profile, shapes)
    if args.rounds > 1:
        rows = median_runs([[r for r in rows if r["round"] == k] for k in range(args.rounds)])
        print(f"each case: the median of its {args.rounds} rounds (paired: paired in each round, then the median)")
    print("\n".join(summary(rows)))
    if args.record and rows and "layers" in profile.to_dict():
        record(Path(args.profile), rows, "python benchmarks/bench_plan_vs_run.py " + " ".join(argv or sys.argv[1:]))
    return 0
