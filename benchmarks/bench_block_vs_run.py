"""The profile's block lines against exec.run's own computes in the same minutes, by schedule and recompute: does a stage's compute cost in a run what the layer bench says?

    PYTHONPATH=. python benchmarks/bench_block_vs_run.py                      # 5 rounds, about 4 min
    PYTHONPATH=. python benchmarks/bench_block_vs_run.py --shape 64,2,64,1024 --rounds 8

The planner predicts a run from the profile's layer table (`exec.profiler.layer_bench`): per
stage and pass kind, the line through a stage's median compute at 1, 2 and 3 blocks, taken
inside 1F1B steps. A VM drifts by 10 % and more over the half hour between a profile and the
runs it predicts, so comparing a grid with a profile mixes that drift with what the lines
miss. Here each round times the layer bench's lines (recompute none and full) and then runs
exec's pipeline (`exec.pipeline.runner.run_pipeline`: 2 ranks, 4 blocks, 4 micro-batches of 8,
AdamW, 5 steps after 2 of warm-up) under 1F1B and GPipe, recompute none and full, all within a
minute or two. Per round and run it prints each stage's median compute in the run against
the line's value at 2 blocks a stage; then, per schedule, recompute and kind, the median
over rounds and stages of run / line - 1. A cell that stands out is a cost of that schedule
or mode the profile's 1F1B lines do not see (docs/measurements.md reads it).
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the repository's sim and exec, installed or not
from sim.cli import OneLineParser, whole  # noqa: E402

RUNS = (("1f1b", "none"), ("1f1b", "full"), ("gpipe", "none"), ("gpipe", "full"))
MICRO_BATCH, MICRO_BATCHES, BLOCKS = 8, 4, 2  # the runs': 2 blocks a stage on 2 stages


def shape(text: str) -> tuple[int, int, int, int]:
    """hidden,heads,seq,vocab"""
    parts = tuple(int(x) for x in text.split(","))
    if len(parts) != 4 or min(parts) < 1 or parts[0] % parts[1]:
        raise ValueError(f"--shape wants hidden,heads,seq,vocab (heads dividing hidden), got {text!r}")
    return parts


def lines(ctx, hidden: int, heads: int, seq: int, vocab: int) -> dict:
    """{(recompute, "<stage><kind>"): seconds} of the layer bench's line at `BLOCKS` blocks a
    stage (both ranks: `stage_medians` gathers them), for recompute none and full."""
    from exec.models.spec import ModelSpec
    from exec.profiler.layer_bench import BLOCK_COUNTS, fit_line, stage_medians
    model = ModelSpec("gpt", layers=2 * BLOCKS, hidden=hidden, heads=heads, seq=seq, vocab=vocab).transformer()
    stage_medians(ctx, model, MICRO_BATCH, "none", max(BLOCK_COUNTS), "1f1b", 1)  # a cold first step, untimed
    out = {}
    for recompute in ("none", "full"):
        med = {n: stage_medians(ctx, model, MICRO_BATCH, recompute, n, "1f1b", 5) for n in BLOCK_COUNTS}
        for (stage, kind) in med[BLOCK_COUNTS[0]]:
            a, slope = fit_line([(n, med[n][(stage, kind)]) for n in BLOCK_COUNTS])
            out[(recompute, f"{stage}{kind}")] = a + BLOCKS * slope
    return out


def run_computes(hidden: int, heads: int, seq: int, vocab: int, schedule: str, recompute: str) -> tuple[dict, float]:
    """({"<stage><kind>": median seconds} of exec.run's measured steps' computes, the median step)."""
    from exec.models.spec import ModelSpec
    from exec.pipeline.config import RunConfig
    from exec.pipeline.runner import run_pipeline
    spec = ModelSpec("gpt", layers=2 * BLOCKS, hidden=hidden, heads=heads, seq=seq, vocab=vocab,
                     batch_size=MICRO_BATCH * MICRO_BATCHES, recompute=recompute)
    r = run_pipeline(spec, schedule, 2, MICRO_BATCHES, RunConfig(steps=5, warmup=2, optimizer="adamw"))
    times: dict[str, list[float]] = {}
    for step in r.steps:
        for e in step.events:
            if e.action.kind.is_compute:
                times.setdefault(f"{e.action.stage}{e.action.kind.name}", []).append(e.duration)
    return {k: statistics.median(v) for k, v in times.items()}, r.measured_step_s


def main(argv=None) -> int:
    p = OneLineParser(prog="bench_block_vs_run", description=__doc__.splitlines()[0], error_prog="bench_block_vs_run")
    p.add_argument("--shape", type=shape, default=(128, 4, 64, 512), help="hidden,heads,seq,vocab (default the profiled)")
    p.add_argument("--rounds", type=whole, default=5, help="rounds (default 5)")
    args = p.parse_args(argv)
    from exec.launch.processes import launch
    ratios: dict[tuple[str, str, str], list[float]] = {}
    for k in range(args.rounds):
        line = launch(lines, 2, *args.shape, timeout=600)[0]
        for schedule, recompute in RUNS:
            run, step = run_computes(*args.shape, schedule, recompute)
            cells = []
            for key in sorted(run):
                if (recompute, key) in line:
                    r = run[key] / line[(recompute, key)]
                    ratios.setdefault((schedule, recompute, key[1:]), []).append(r)
                    cells.append(f"{key} {run[key] * 1e3:6.2f} / {line[(recompute, key)] * 1e3:6.2f} ({(r - 1) * 100:+3.0f}%)")
            print(f"round {k + 1} {time.strftime('%H:%M:%S')} {schedule:5} {recompute:4} step {step * 1e3:6.1f} ms  "
                  + "  ".join(cells), flush=True)
    print(f"\nrun / line - 1, median over {args.rounds} rounds and both stages")
    for (schedule, recompute, kind), rs in sorted(ratios.items()):
        print(f"{schedule:5} {recompute:4} {kind}  {(statistics.median(rs) - 1) * 100:+5.1f}%   "
              f"(from {(min(rs) - 1) * 100:+.0f}% to {(max(rs) - 1) * 100:+.0f}%, {len(rs)} values)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
