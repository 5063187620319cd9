"""Does the simulator predict real steps? Measured against simulated, over schedules and
micro-batch counts, on gloo ranks on this machine.

    python benchmarks/bench_exec.py                                  # naive, gpipe, 1f1b x 2,4,8,16
    python benchmarks/bench_exec.py --schedules gpipe 1f1b --micro 4 8 --rounds 5
    python benchmarks/bench_exec.py --ranks 4 --model gpt --json out.json --figures out/exec
    python benchmarks/bench_exec.py --schedules 1f1b --micro 8 --rounds 5 --steps 1 --repeat 3   # spread

Each (schedule, micro) runs in one launch of `--ranks` processes, exactly as `python -m
exec.run` calibrates and measures (`exec.pipeline.runner.run_pipeline(calibrate=--steps)`): a
warm-up step, then `--rounds` times [calibrate (`exec.measure.calibrate.calibrate_rank`: every
stage's F and B timed inside the ranks on the very modules the steps run, with the
runtime's own handlers, all computing at once, and taking turns; the call and arrival
costs; in the first round, the transfer fit by ping-pong), then `--steps` measured
steps], so calibration and measurement share the time window (on a machine shared with
other work, the load changes from second to second). The median-makespan step is compared
(`exec.measure.compare.compare`) with the simulation under the pooled calibration: "error", the
figure `exec.run` reports. "paired error" is the median over steps of each step against
the costs calibrated just before it. "replay error" is the median over steps of each step
against the simulation with every compute taking the time it took in that step
(`exec.measure.compare.replay_error`): what the communication and runtime rules miss, free of the
compute times drifting between calibration and step. "sim, alone costs" is the simulation
with the F and B measured while the other ranks were idle, and "concurrent / alone" the
median ratio of the two: how much a compute slows when every rank computes at once (the
simulator has no rule for that yet; docs/exec.md, Accuracy).

`--detail` adds, per config, where the measured step's time went
(`exec.measure.compare.breakdown`): each stage's measured F and B against its profiled cost, and
per rank the time spent waiting for data and the runtime's own time between actions
(the simulator models its calls and its time around each compute, rules 2, 3 and 11;
"replay, no rule 11" is the replay error without the latter).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import sim  # noqa: E402
from exec.measure.compare import breakdown, compare, overlay_figure, replay_error, sharing_check  # noqa: E402
from exec.models.spec import ModelSpec  # noqa: E402
from exec.runtime.optim import DEFAULT_OPTIMIZER, OPTIMIZERS  # noqa: E402
from exec.pipeline.runner import run_pipeline  # noqa: E402
from exec.measure.costs import costs_from_reports  # noqa: E402
from exec.pipeline.profile import profile_costs  # noqa: E402


def run_config(spec: ModelSpec, name: str, ranks: int, micro: int, rounds: int, steps: int, balance: str,
               threads: int | None, separate: bool = False, optimizer: str = DEFAULT_OPTIMIZER) -> dict:
    """Calibrate and measure one (schedule, micro) in one run (`run_pipeline(calibrate=steps)`,
    as `exec.run` does), simulate, compare. With `separate`, also profile in a launch of its
    own right after the run (`profile_costs`) and compare the same step with that."""
    schedule = sim.make_schedule(name, ranks, micro)
    t = time.perf_counter()
    run = run_pipeline(spec, schedule, steps=rounds * steps, warmup=1, balance=balance, threads=threads,
                       calibrate=steps, timeout=1800.0, optimizer=optimizer)
    wall = time.perf_counter() - t
    costs, details, results = run.costs, run.calibration, run.steps
    transfer = (costs.latency, costs.bandwidth)  # fitted in the first round
    alone, _ = costs_from_reports([rep for rnd in run.reports for rep in rnd], run.schedule, "alone", transfer)
    # paired: each measured step against the simulation under the costs calibrated just before it
    paired = []
    for i, rnd in enumerate(run.reports):
        c, _ = costs_from_reports(rnd, run.schedule, "concurrent", transfer)
        sim_s = sim.simulate(schedule, c).makespan
        paired += [(sim_s - r.makespan) / r.makespan * 100 for r in results[i * steps:(i + 1) * steps]]
    cmp = compare(run.result, costs)
    if separate:
        own, _ = profile_costs(spec, schedule, bounds=run.bounds, threads=threads, steps=steps * rounds,
                               optimizer=optimizer)
        separate_pct = compare(run.result, own).error_pct
    replay = [replay_error(r, costs) for r in results]
    # the same replay without rule 11 (the runtime's own time around each compute)
    bare = dataclasses.replace(costs, before_compute=0.0, after_compute=0.0)
    replay_bare = [replay_error(r, bare) for r in results]
    checks = [sharing_check(r, alone, costs) for r in results]
    sharing = {k: statistics.median(ch[k] for ch in checks) for k in checks[0]}
    row = cmp.as_json()
    row.update(measured_steps_s=[r.makespan for r in results], bounds=run.bounds, wall_s=wall,
               simulated_alone_step_s=sim.simulate(schedule, alone).makespan,
               slowdown=details["slowdown_median"], paired_error_pct=statistics.median(paired),
               replay_error_pct=statistics.median(replay), replay_error_no_rule11_pct=statistics.median(replay_bare),
               before_compute_s=costs.before_compute, after_compute_s=costs.after_compute,
               **{k: v for k, v in run.load_json().items() if k in ("lost_share", "load")},
               latency_s=costs.latency, bandwidth=costs.bandwidth, grad_match=run.grad_match, sharing=sharing)
    if separate:
        row["separate_profile_error_pct"] = separate_pct
    return {"row": row, "comparison": cmp, "costs": costs, "alone": alone, "details": details,
            "results": results, "breakdown": breakdown(run.result, costs),
            "simulated_breakdown": breakdown(cmp.simulated, costs)}


def format_rows(rows: list[dict]) -> str:
    """The accuracy table as markdown (with the separate profile's error when every row has it)."""
    separate = all("separate_profile_error_pct" in r for r in rows)
    head = ("| schedule | micro-batches | measured step (ms) | spread (ms) | simulated (ms) | error | paired error "
            "| replay error | replay, no rule 11 | sim, alone costs (ms) | concurrent / alone | bubble meas / sim |")
    head += " error, separate profile |" if separate else ""
    lines = [head, "|---|---:" + "|---:" * (10 + separate) + "|"]
    for r in rows:
        spread = max(r["measured_steps_s"]) - min(r["measured_steps_s"])
        lines.append(f"| {r['schedule']} | {r['micro_batches']} | {r['measured_step_s'] * 1e3:.1f} | {spread * 1e3:.1f} | "
                     f"{r['simulated_step_s'] * 1e3:.1f} | {r['error_pct']:+.1f}% | {r['paired_error_pct']:+.1f}% | "
                     f"{r['replay_error_pct']:+.1f}% | {r['replay_error_no_rule11_pct']:+.1f}% | "
                     f"{r['simulated_alone_step_s'] * 1e3:.1f} | {r['slowdown']:.2f} | "
                     f"{r['measured_bubble']:.3f} / {r['simulated_bubble']:.3f} |"
                     + (f" {r['separate_profile_error_pct']:+.1f}% |" if separate else ""))
    return "\n".join(lines)


def format_detail(out: dict) -> str:
    """Per stage: measured F/B in the run vs profiled; per rank: wait and overhead."""
    bd, sbd = out["breakdown"], out["simulated_breakdown"]
    r = out["row"]
    lines = [f"  {r['schedule']} micro_batches={r['micro_batches']}: error {r['error_pct']:+.2f}%; transfers: latency "
             f"{r['latency_s'] * 1e6:.0f} us, bandwidth {r['bandwidth'] / 1e9:.2f} GB/s; runtime's own time per "
             f"compute (rule 11): before {r['before_compute_s'] * 1e6:.0f} us, after {r['after_compute_s'] * 1e6:.0f} us"]
    for key, a in bd["actions"].items():
        lines.append(f"    {key:>4}: run median {a['median'] * 1e3:7.2f} ms (min {a['min'] * 1e3:.2f}, "
                     f"max {a['max'] * 1e3:.2f}), profiled {a['cost'] * 1e3:7.2f} ms, ratio {a['ratio']:.3f}")
    sh = r["sharing"]
    lines.append(f"    per-action duration, median |error| of: concurrent cost {sh['concurrent_median_abs_err'] * 100:.1f}%, "
                 f"alone cost {sh['alone_median_abs_err'] * 100:.1f}%, sharing rule {sh['sharing_median_abs_err'] * 100:.1f}% "
                 f"(median overlap {sh['overlap_share_median'] * 100:.0f}%)")
    for m, s in zip(bd["ranks"], sbd["ranks"]):
        per = m["overhead"] / max(1, m["actions"]) * 1e6
        lines.append(f"    rank {m['rank']}: compute {m['compute'] * 1e3:.1f} (sim {s['compute'] * 1e3:.1f}) ms, "
                     f"wait {m['wait'] * 1e3:.1f} (sim {s['wait'] * 1e3:.1f}) ms, overhead {m['overhead'] * 1e3:.2f} "
                     f"(sim {s['overhead'] * 1e3:.2f}) ms "
                     f"= {per:.0f} us x {m['actions']} actions, tail {m['tail'] * 1e3:.1f} (sim {s['tail'] * 1e3:.1f}) ms, "
                     f"gap between computes with nothing to wait for: median {_us(m['free_gap_median'])} over {m['free_gaps']}")
    return "\n".join(lines)


def format_spread(rows: list[dict]) -> str:
    """Per (schedule, micro) run `--repeat` times: the error and the replay error of each
    run, their spread (max - min, in points) and the most of a step other processes took."""
    by: dict[tuple, list[dict]] = {}
    for r in rows:
        by.setdefault((r["schedule"], r["micro_batches"]), []).append(r)
    lines = ["| schedule | micro | runs | errors | spread | replay errors | spread | lost to other processes |",
             "|---|---:|---:|---|---:|---|---:|---|"]
    for (name, micro), rs in by.items():
        err, rep = [r["error_pct"] for r in rs], [r["replay_error_pct"] for r in rs]
        lost = [r.get("lost_share") for r in rs]
        lost_s = ", ".join("-" if x is None else f"{x:.0%}" for x in lost)
        lines.append(f"| {name} | {micro} | {len(rs)} | {', '.join(f'{e:+.1f}%' for e in err)} | "
                     f"{max(err) - min(err):.1f} | {', '.join(f'{e:+.1f}%' for e in rep)} | "
                     f"{max(rep) - min(rep):.1f} | {lost_s} |")
    return "\n".join(lines)


def _us(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e6:.0f} us"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--schedules", nargs="+", default=["naive", "gpipe", "1f1b"], choices=sorted(sim.SCHEDULES))
    p.add_argument("--micro-batches", "--micro", dest="micro_batches", nargs="+", type=int, default=[2, 4, 8, 16],
                   help="micro-batch counts (--micro: alias of --micro-batches)")
    p.add_argument("--ranks", type=int, default=2, help="pipeline ranks P (a schedule with V stages per rank has P*V stages)")
    p.add_argument("--rounds", type=int, default=3, help="calibrate-then-measure rounds per config")
    p.add_argument("--steps", type=int, default=3, help="measured steps per round (the median of all is kept)")
    p.add_argument("--model", default="mlp", choices=["mlp", "gpt"])
    p.add_argument("--balance", default="layers", choices=["layers", "time"])
    p.add_argument("--threads", type=int, default=None, help="torch threads per rank (default cores / ranks)")
    p.add_argument("--optimizer", default=DEFAULT_OPTIMIZER, choices=list(OPTIMIZERS), help="default adamw")
    p.add_argument("--separate-profile", action="store_true",
                   help="also profile each config in a launch of its own after its run (profile_costs), "
                        "and give the same step's error against that")
    p.add_argument("--detail", action="store_true", help="per-action and per-rank breakdown of each config")
    p.add_argument("--repeat", type=int, default=1,
                   help="run each config this many times and report the spread of its error and replay error")
    p.add_argument("--json", help="write every row, costs and breakdown here")
    p.add_argument("--figures", help="write an overlay PNG per config into this folder")
    args = p.parse_args(argv)
    if args.ranks < 2:
        p.error("--ranks must be at least 2 (a pipeline)")
    if args.repeat < 1:
        p.error("--repeat must be at least 1")
    spec = ModelSpec(args.model)
    print(f"model {spec}; {args.ranks} gloo ranks, {os.cpu_count()} cores, threads/rank "
          f"{args.threads or max(1, (os.cpu_count() or 1) // args.ranks)}", flush=True)
    outs = []
    for name, micro, _ in ((n, m, k) for n in args.schedules for m in args.micro_batches for k in range(args.repeat)):
        out = run_config(spec, name, args.ranks, micro, args.rounds, args.steps, args.balance, args.threads,
                         args.separate_profile, args.optimizer)
        outs.append(out)
        r = out["row"]
        print(f"{name:>6} micro={micro:<3} measured {r['measured_step_s'] * 1e3:8.1f} ms  simulated "
              f"{r['simulated_step_s'] * 1e3:8.1f} ms  error {r['error_pct']:+6.2f}%  (alone costs: "
              f"{r['simulated_alone_step_s'] * 1e3:.1f} ms; concurrent/alone {r['slowdown']:.2f})", flush=True)
        if args.detail:
            print(format_detail(out), flush=True)
        if args.figures:
            os.makedirs(args.figures, exist_ok=True)
            overlay_figure(out["comparison"], os.path.join(args.figures, f"overlay_{name}_m{micro}.png"))
    print()
    print(format_rows([o["row"] for o in outs]))
    if args.repeat > 1:
        print()
        print(format_spread([o["row"] for o in outs]))
    if args.json:
        from sim.engine.costs import jsonable
        from sim.files import atomic_write
        doc = [{"row": o["row"], "costs": o["costs"].to_dict(), "breakdown": o["breakdown"],
                "compute_median": o["details"]["compute_median"]} for o in outs]
        with atomic_write(args.json) as f:
            json.dump(jsonable(doc), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
