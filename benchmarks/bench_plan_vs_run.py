"""The planner against real runs of several model shapes: sim.estimate on one measured device profile predicts each shape's step time and per-rank peak memory; exec.run measures them.

    python -m exec.profile_device --out /tmp/cpu.json                     # once, just before
    PYTHONPATH=. python benchmarks/bench_plan_vs_run.py --profile /tmp/cpu.json            # about 12 min
    PYTHONPATH=. python benchmarks/bench_plan_vs_run.py --profile /tmp/cpu.json --quick    # 6 runs

The grid: seven shapes the profile did not measure (`SHAPES`: other hidden sizes, sequence
lengths, head counts, vocabularies and depths), each under 1F1B, GPipe and ZB-H1 with
recompute none and full, 4 micro-batches of a batch of 32, 2 CPU ranks, AdamW; and the
profiled shape (exec's --model gpt: 4 blocks, hidden 128, 4 heads, sequence 64, vocabulary
512) run just before and just after each of them under the same case. A shape the profile
did not measure is timed by the kernel model run as a step runs it, fitted on the blocks the
profile measured (`sim.cost.block_fit`). Per run it prints the predicted and measured step (the
median step), their error, the drift of the machine (`reference`: a block of the profiled
shape timed in this process just before the run, over the same timed when the bench started,
right after the profile) and the error with the prediction scaled by it, the spread of the
measured steps ((max - min) / median), the peak-memory error of the worst rank, the share of
the step other processes took (exec.run's `lost_share`), the share of the machine's CPU time
the hypervisor took (`steal`) and the load average (/proc/loadavg) before and after. Then,
per shape and over the shapes the profile did not measure, the
median and worst |error|: raw, drift-scaled, paired (`paired`: against the profiled
shape's error in the runs around it, which cancels what the machine's drift and load do to
both) and of the computes alone (`compute_error`: the median over kinds and stages of each
compute's predicted / measured duration). A VM's speed drifts 20-30 % in minutes (docs/validation.md), and other processes
slow a pipeline's handoffs more than its computes: read the errors beside the load.
The summary also gives the same over the runs other processes took less than 5 % of
(`UNTOUCHED`). `--schedule`, `--recompute` and `--shape` narrow or change the grid; `--json
FILE` writes every row (`--summary FILE` prints that run's summary again, measuring nothing);
`--summary FILE --profile P` predicts those runs again from the profile P (how another profile of the
same machine predicts the same measured runs); `--record` writes the summary into the profile (`layers.checked`, docs/profiles.md); `--reprofile` measures the device again before each run and writes it to `--profile`.
`--rounds K` runs the grid K times, one after another, and reads each case by the median of
its rounds (`median_runs`), as does `--summary` given several files: a VM's slow minute
passes (docs/validation.md, "The host's slow minutes"). A shape's paired error is taken in each round, against the
profiled runs of its own minute, and then read by its median over the rounds: the host can
slow this VM for minutes unseen by it (no steal, faults or pressure), and slows a shape's run
and the profiled runs around it alike. With a profile that is itself the median of several
(`python -m exec.profile_device --repeat 3`), that is the loop's check on this VM:

    python -m exec.profile_device --out /tmp/cpu.json --repeat 3                          # about 16 min
    PYTHONPATH=. python benchmarks/bench_plan_vs_run.py --profile /tmp/cpu.json --rounds 3  # about 36 min
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's sim and exec, installed or not

from exec.measure.plan_report import main  # noqa: E402  (the grid and the runs: exec.measure.plan_vs_run)

if __name__ == "__main__":
    sys.exit(main())
