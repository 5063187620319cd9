"""How fast is the planner? Searches of growing size, and how many configurations each simulates.

    python benchmarks/bench_plan.py                  # the cases below, 3 runs each
    python benchmarks/bench_plan.py --runs 1 --case small

Each case runs `sim.plan.search` (top 10, the default space) `--runs` times in this process
and prints the configurations enumerated, those simulated, and the median of the CPU time
(process_time) and of the wall time over the runs. The machine may be shared: read the
medians, and compare CPU times only between runs on the same machine.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import sim.plan  # noqa: E402

CASES = {
    "small": dict(model="megatron-1.7b", gpu="a100-80gb", gpus=16, global_batch=64),
    "sagemaker-60b": dict(model="sagemaker-gpt2-60b", gpu="a100-40gb", gpus=256, global_batch=896),
    "gpt3-1024": dict(model="gpt3-175b", gpu="a100-80gb", gpus=1024, global_batch=1536),
}


def run(case: dict, runs: int) -> tuple[int, int, float, float]:
    cpu, wall = [], []
    for _ in range(runs):
        c0, w0 = time.process_time(), time.perf_counter()
        p = sim.plan.search(**case)
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
    return p.enumerated, p.simulated, statistics.median(cpu), statistics.median(wall)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--case", choices=list(CASES), action="append")
    args = ap.parse_args()
    print(f"# {platform.python_implementation()} {platform.python_version()}, {os.cpu_count()} cores, "
          f"load {os.getloadavg()[0]:.2f}, {args.runs} runs each (medians)")
    print(f"{'case':<14} {'enumerated':>10} {'simulated':>9} {'cpu s':>7} {'wall s':>7}")
    for name in args.case or CASES:
        enumerated, simulated, cpu, wall = run(CASES[name], args.runs)
        print(f"{name:<14} {enumerated:>10} {simulated:>9} {cpu:>7.1f} {wall:>7.1f}", flush=True)


if __name__ == "__main__":
    main()
