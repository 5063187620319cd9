"""How fast is the planner? Searches of growing size, and how many configurations each simulates.

    python benchmarks/bench_plan.py                  # the cases below, 3 runs each
    python benchmarks/bench_plan.py --runs 1 --case small
    python benchmarks/bench_plan.py --commands       # the commands of issue 47's targets, timed whole

Each case runs `sim.plan.search` (top 10, the default space) `--runs` times in this process
and prints the configurations enumerated, those simulated, and the median of the CPU time
(process_time) and of the wall time over the runs. The machine may be shared: read the
medians, and compare CPU times only between runs on the same machine. `--commands` runs each
of `COMMANDS` (`python -m sim.plan ...`, a fresh process each) `--runs` times and prints the
median wall time against its target; `RECORDED` is the last such table, measured as it says.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import sim.plan  # noqa: E402

CASES = {
    "small": dict(model="megatron-1.7b", gpu="a100-80gb", gpus=16, global_batch=64),
    "sagemaker-60b": dict(model="sagemaker-gpt2-60b", gpu="a100-40gb", gpus=256, global_batch=896),
    "gpt3-1024": dict(model="gpt3-175b", gpu="a100-80gb", gpus=1024, global_batch=1536),
}


# issue 47's targets: the command (its arguments to `python -m sim.plan`) and the seconds it should take
COMMANDS = {
    "gpt3-175b, 1024 A100s": ("--model gpt3-175b --gpu a100-80gb --gpus 1024 --global-batch 1536 --no-figures", 5.0),
    "deepseek-v3, 2048 H100s": ("--model deepseek-v3-671b --gpu h100-80gb --gpus 2048 --global-batch 4096 --seq 4096 "
                                "--no-figures", 10.0),
    "gpt3-175b, 1,048,576 A100s": ("--model gpt3-175b --gpu a100-80gb --gpus 1048576 --global-batch 2097152 "
                                   "--no-figures", None),
}
# The last such table, 2026-12-02 06:08-06:16 UTC on the 2-core development machine, nearly quiet (load
# 0.2-1.0: wall is CPU): wall seconds of each command in a fresh process, before (2c78956) and after (b4fc984;
# the last row 9fde2d7: b4fc984 less the collector change) alternating in one loop, medians of 3, 3 and 1 runs.
# What the rest costs: docs/validation.md, "Planner speed".
RECORDED = """
command                      before s  after s  target s
gpt3-175b, 1024 A100s             7.2      4.8         5
deepseek-v3, 2048 H100s           9.1      7.8        10
gpt3-175b, 1,048,576 A100s       12.0      7.4         -
"""


def time_commands(runs: int) -> None:
    """Each of `COMMANDS` `runs` times in a fresh process: the median wall seconds and the target."""
    print(f"{'command':<28} {'median s':>8} {'target s':>8}")
    for name, (args, target) in COMMANDS.items():
        walls = []
        for _ in range(runs):
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "sim.plan", *args.split(), "--quiet"], check=True,
                           stdout=subprocess.DEVNULL)
            walls.append(time.perf_counter() - start)
        shown = "-" if target is None else f"{target:g}"
        print(f"{name:<28} {statistics.median(walls):>8.1f} {shown:>8}", flush=True)
    print(f"\nlast recorded (RECORDED):{RECORDED}", end="")


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
    ap.add_argument("--commands", action="store_true", help="time issue 47's commands instead (COMMANDS)")
    args = ap.parse_args()
    if args.commands:
        time_commands(args.runs)
        return
    print(f"# {platform.python_implementation()} {platform.python_version()}, {os.cpu_count()} cores, "
          f"load {os.getloadavg()[0]:.2f}, {args.runs} runs each (medians)")
    print(f"{'case':<14} {'enumerated':>10} {'simulated':>9} {'cpu s':>7} {'wall s':>7}")
    for name in args.case or CASES:
        enumerated, simulated, cpu, wall = run(CASES[name], args.runs)
        print(f"{name:<14} {enumerated:>10} {simulated:>9} {cpu:>7.1f} {wall:>7.1f}", flush=True)


if __name__ == "__main__":
    main()
