"""Our runtime against torch's own, on the same schedule, model and gloo ranks: step times side by side.

    python benchmarks/bench_torch_runtime.py                          # 1f1b and gpipe, P=2, M=8
    python benchmarks/bench_torch_runtime.py --schedules 1f1b --rounds 5 --steps 10

Each round runs every schedule both ways, one after the other in the same process: our
runtime (`exec.pipeline.runner.run_pipeline`, the step's makespan: from the ranks' common start
at a barrier to the end of the last action) and torch's `_PipelineScheduleRuntime` on the
CSV `exec.torch_pipelining.runtime.to_torch_csv` exports (`run_torch_runtime`: from a barrier to the
end of the slowest rank's `step()`). Each launch runs `--warmup` steps, then `--steps`
measured ones; the table gives the median over every measured step of every round, and
the median of the round medians' ratio, ours / torch's (below 1: ours is faster). Both
check the first step's gradients against one process. The machine's load changes from
second to second, so the runtimes take turns within every round.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from exec.models.spec import ModelSpec  # noqa: E402
from exec.pipeline.runner import run_pipeline  # noqa: E402
from exec.torch_pipelining.runtime import run_torch_runtime  # noqa: E402


def one_round(spec: ModelSpec, name: str, ranks: int, micro: int, steps: int, warmup: int) -> dict:
    """One launch of each runtime; their measured step times (seconds) and gradient checks."""
    ours = run_pipeline(spec, name, ranks, micro, steps=steps, warmup=warmup, timeout=900.0)
    theirs = run_torch_runtime(spec, name, ranks, micro, steps=steps, warmup=warmup, timeout=900.0)
    return {"ours": ours.step_times, "torch": theirs.step_times,
            "grads": ours.grad_match and theirs.grad_match}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--schedules", nargs="+", default=["1f1b", "gpipe"])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--micro-batches", "--micro", dest="micro_batches", type=int, default=8,
                    help="micro-batches per step (--micro: alias of --micro-batches)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args(argv)
    spec = ModelSpec()
    load, rows = os.getloadavg()[0], []
    for r in range(args.rounds):
        for name in args.schedules:
            print(f"round {r + 1}/{args.rounds}: {name}", file=sys.stderr, flush=True)
            rows.append((name, one_round(spec, name, args.ranks, args.micro_batches, args.steps, args.warmup)))
    print(f"load average before: {load:.1f}, after: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; "
          f"ModelSpec() ({spec.layers} MLP blocks, hidden {spec.hidden}, batch {spec.batch_size}), "
          f"P={args.ranks}, M={args.micro_batches}, {args.rounds} rounds x {args.steps} steps, gloo")
    print("| schedule | ours: median step (ms) | torch: median step (ms) | ours / torch (median of rounds) "
          "| each round's ratio | gradients = one process |")
    print("|---|---|---|---|---|---|")
    for name in args.schedules:
        mine = [x for n, x in rows if n == name]
        ours = statistics.median(t for x in mine for t in x["ours"])
        theirs = statistics.median(t for x in mine for t in x["torch"])
        ratios = [statistics.median(x["ours"]) / statistics.median(x["torch"]) for x in mine]
        ratio = statistics.median(ratios)
        ok = "yes" if all(x["grads"] for x in mine) else "NO"
        print(f"| {name} | {ours * 1e3:.2f} | {theirs * 1e3:.2f} | {ratio:.3f} | {', '.join(f'{q:.2f}' for q in ratios)} | {ok} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
