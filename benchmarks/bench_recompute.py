"""Activation recomputation on 2 CPU ranks: the memory it saves and the time it costs, measured and simulated.

    python benchmarks/bench_recompute.py                                  # gpipe, 1f1b, zb-h1 x none, full, selective
    python benchmarks/bench_recompute.py --schedules 1f1b --modes none full --rounds 5 --json out.json

For each schedule and recompute mode (`exec.models.spec.ModelSpec.recompute`), `--rounds` runs of
`exec.pipeline.runner.run_pipeline` on the same GPT, each calibrated inside the run as `exec.run`
does (a calibration round before every measured step), each giving its median measured
step and the simulated step under its own costs. A round runs every config once, so that
a change of the machine's load falls on all of them. The tables give the medians over the
rounds (peak memory is the same in every round and step); a mode's time cost against none
is the median over rounds of the cost within each round.

First table: step time measured and simulated and the error (simulated - measured) /
measured; peak memory per rank (KiB), measured and simulated. Second table, each mode
against none on the same schedule: the memory saved (peak none - peak mode, per rank), the
time recompute costs ((step mode - step none) / step none, paired by round), measured and simulated; the
error of the simulated saving in % of the measured one, and of the simulated time cost in
percentage points of the step (simulated cost - measured cost: a cost near 0 has no useful
relative error).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace

import sim
from exec.models.spec import ModelSpec
from exec.pipeline.runner import run_pipeline
from sim.files import atomic_write

SPEC = ModelSpec("gpt", layers=4, batch_size=16)  # exec's default widths (hidden 128, seq 64), 4 blocks


def one_run(spec: ModelSpec, schedule: str, micro: int, steps: int, warmup: int) -> tuple[float, float, tuple, tuple]:
    """One run calibrated inside: its median measured step, the simulated step under its
    costs, and the measured and simulated peak memory per rank."""
    run = run_pipeline(spec, schedule, 2, micro, steps=steps, warmup=warmup, calibrate=1, timeout=600)
    if not run.grad_match:
        raise RuntimeError(f"{schedule} recompute={spec.recompute}: gradients differ by {run.max_grad_diff}")
    simulated = sim.simulate(run.schedule, run.costs)
    print(f"  {schedule} {spec.recompute}: measured {run.measured_step_s * 1e3:.1f} ms, "
          f"simulated {simulated.makespan * 1e3:.1f} ms", file=sys.stderr, flush=True)
    return run.measured_step_s, simulated.makespan, tuple(run.result.peak_memory), tuple(simulated.peak_memory)


def measure(schedules, modes, micro: int, rounds: int, steps: int, warmup: int) -> list[dict]:
    """Every (schedule, mode) once per round, rounds one after the other, so that a change
    of the machine's load falls on every mode alike; per config the medians over the rounds,
    and each mode's time cost against none paired round by round."""
    runs = {(n, m): [] for n in schedules for m in modes}
    for _ in range(rounds):
        for name in schedules:
            for mode in modes:
                runs[(name, mode)].append(one_run(replace(SPEC, recompute=mode), name, micro, steps, warmup))
    rows = []
    for (name, mode), rs in runs.items():
        peaks = {(r[2], r[3]) for r in rs}
        if len(peaks) != 1:
            raise RuntimeError(f"{name} recompute={mode}: peak memory changed between rounds: {peaks}")
        (meas_peak, sim_peak), = peaks
        row = {"schedule": name, "recompute": mode, "measured_s": statistics.median(r[0] for r in rs),
               "simulated_s": statistics.median(r[1] for r in rs), "measured_rounds_s": [r[0] for r in rs],
               "simulated_rounds_s": [r[1] for r in rs], "measured_peak": list(meas_peak),
               "simulated_peak": list(sim_peak)}
        if (name, "none") in runs and mode != "none":
            base = runs[(name, "none")]
            row["cost_measured"] = statistics.median(r[0] / b[0] - 1 for r, b in zip(rs, base))
            row["cost_simulated"] = statistics.median(r[1] / b[1] - 1 for r, b in zip(rs, base))
        rows.append(row)
    return rows


def _err(sim_value: float, meas_value: float) -> str:
    return f"{(sim_value - meas_value) / meas_value * 100:+.1f}%" if meas_value else "n/a"


def _kib(values) -> str:
    return "/".join(f"{v / 1024:.0f}" for v in values)


def tables(rows: list[dict]) -> str:
    out = [f"{'schedule':<8} {'recompute':<9} {'meas ms':>8} {'sim ms':>8} {'error':>7}  "
           f"{'peak KiB meas r0/r1':>20} {'peak KiB sim r0/r1':>19}"]
    for r in rows:
        out.append(f"{r['schedule']:<8} {r['recompute']:<9} {r['measured_s'] * 1e3:8.1f} {r['simulated_s'] * 1e3:8.1f} "
                   f"{_err(r['simulated_s'], r['measured_s']):>7}  {_kib(r['measured_peak']):>20} "
                   f"{_kib(r['simulated_peak']):>19}")
    out += ["", f"{'schedule':<8} {'recompute':<9} {'saved KiB meas r0/r1':>21} {'saved KiB sim r0/r1':>20} "
                f"{'error r0/r1':>13}  {'time cost meas':>14} {'sim':>7} {'error pp':>8}"]
    base = {r["schedule"]: r for r in rows if r["recompute"] == "none"}
    for r in rows:
        b = base.get(r["schedule"])
        if r["recompute"] == "none" or b is None:
            continue
        saved_m = [x - y for x, y in zip(b["measured_peak"], r["measured_peak"])]
        saved_s = [x - y for x, y in zip(b["simulated_peak"], r["simulated_peak"])]
        cost_m, cost_s = r["cost_measured"], r["cost_simulated"]
        errs = "/".join(_err(s, m) for s, m in zip(saved_s, saved_m))
        out.append(f"{r['schedule']:<8} {r['recompute']:<9} {_kib(saved_m):>21} {_kib(saved_s):>20} {errs:>13}  "
                   f"{cost_m * 100:+13.1f}% {cost_s * 100:+6.1f}% {(cost_s - cost_m) * 100:+8.1f}")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--schedules", nargs="+", default=["gpipe", "1f1b", "zb-h1"])
    ap.add_argument("--modes", nargs="+", default=["none", "full", "selective"], choices=["none", "full", "selective"])
    ap.add_argument("--micro-batches", "--micro", dest="micro_batches", type=int, default=4,
                    help="micro-batches per step (--micro: alias of --micro-batches)")
    ap.add_argument("--rounds", type=int, default=3, help="runs per config; the tables give their medians")
    ap.add_argument("--steps", type=int, default=3, help="measured steps per run (median step)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--json", help="also write every number to this file")
    args = ap.parse_args()
    rows = measure(args.schedules, args.modes, args.micro_batches, args.rounds, args.steps, args.warmup)
    print(f"model: {SPEC}, micro-batches {args.micro_batches}, 2 gloo ranks, {args.rounds} rounds x {args.steps} steps")
    print(tables(rows))
    if args.json:
        with atomic_write(args.json) as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
