"""The two edges of a training step on CPU ranks: what its first compute takes more (rule 19) by the compute's duration, and its AdamW step inside the step against the same step in a loop of its own (rule 20).

    PYTHONPATH=. python benchmarks/bench_step_edges.py              # about 1.5 min
    PYTHONPATH=. python benchmarks/bench_step_edges.py --steps 8 --rows

On 2 ranks, for exec's GPT at hidden 64, 128 and 256 (sequence 64), micro-batches 1, 2, 4 and
8, 1 to 3 blocks a stage, recompute none and full, it runs 1F1B training steps as the profiler's
layer bench does (`exec.profiler.layer_bench.stage_medians`: AdamW) and keeps, per
configuration and rank, the first compute's median duration d and its median excess as a
step's first, and the median AdamW step with the rank's parameter tensors and parameters.
It prints the excess by d (median per bin) and rule 19's law fitted to every point
(`exec.profiler.host_bench.first_compute_law`: most x (1 - exp(-d / tau)), with its residual);
then the AdamW step per tensor beyond its memory-bound part, inside the steps
(`exec.profiler.device_bench.in_step_per_tensor`, with the memory-bound part as the profile
`--profile` times it) against `--profile`'s `optimizer_per_tensor.adamw`. `--rows` prints
every configuration. Read beside docs/measurements.md ("Rules 19 and 20").
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the repository's sim and exec, installed or not

SHAPES = ((64, 2, 64, 1024), (128, 4, 64, 512), (256, 8, 64, 512))  # hidden, heads, seq, vocab
MICRO_BATCHES, BLOCKS, RECOMPUTES = (1, 2, 4, 8), (1, 2, 3), ("none", "full")
BINS_MS = (0, 1, 2, 3, 4, 6, 9, 14, 30, 1000)


def _rank(ctx, steps: int) -> list:
    """Per configuration: (config, [(d, median excess)] and [(tensors, parameters, median AdamW
    seconds)] of both ranks), timed as the profiler's layer bench times them (`stage_medians`)."""
    from exec.models.spec import ModelSpec
    from exec.profiler.layer_bench import stage_medians
    out = []
    for hidden, heads, seq, vocab in SHAPES:
        model = ModelSpec("gpt", layers=1, hidden=hidden, heads=heads, seq=seq, vocab=vocab).transformer()
        for b in MICRO_BATCHES:
            for n in BLOCKS:
                for recompute in RECOMPUTES:
                    firsts, optimizers = [], []
                    stage_medians(ctx, model, b, recompute, n, "1f1b", steps, firsts, optimizers)
                    out.append(((hidden, b, n, recompute), firsts, optimizers))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5, help="timed steps a configuration (default 5)")
    ap.add_argument("--profile", default=str(ROOT / "data/cpu-loop/profile-s9.json"),
                    help="the profile whose memory-bound optimizer class and per-tensor cost to read")
    ap.add_argument("--rows", action="store_true", help="print every configuration")
    args = ap.parse_args(argv)
    import sim
    from exec.launch.processes import launch
    from exec.profiler.device_bench import in_step_per_tensor
    from exec.profiler.host_bench import first_compute_law
    from sim.engine.core import first_excess
    from sim.hardware.kernels import memory_time
    print(f"{len(SHAPES) * len(MICRO_BATCHES) * len(BLOCKS) * len(RECOMPUTES)} configurations on 2 ranks, "
          f"{args.steps} steps each", file=sys.stderr, flush=True)
    got = launch(_rank, 2, args.steps, timeout=1800)[0]  # both ranks' points, gathered on each
    rows = [(r, cfg, f, o) for cfg, firsts, opts in got for r, (f, o) in enumerate(zip(firsts, opts))]
    if args.rows:
        for r, cfg, (d, ex), (n, p, t) in rows:
            print(f"rank {r} {cfg}: first F {d * 1e3:.2f} ms, excess {ex * 1e3:.3f} ms; AdamW {n} tensors "
                  f"{p / 1e3:.0f}K parameters {t * 1e3:.2f} ms")
    firsts = [f for _, _, f, _ in rows]
    print("\nfirst compute (ms)   points   excess median (ms)")
    for lo, hi in zip(BINS_MS, BINS_MS[1:]):
        sel = [ex for d, ex in firsts if lo <= d * 1e3 < hi]
        if sel:
            print(f"{lo:6.0f} - {hi:<6.0f}     {len(sel):5d}   {statistics.median(sel) * 1e3:8.3f}")
    most, tau, rms = first_compute_law(firsts)
    res = [abs(ex - first_excess(most, tau, d)) for d, ex in firsts]
    print(f"rule 19's law: most {most * 1e3:.3f} ms, tau {tau * 1e3:.2f} ms; residual rms {rms * 1e3:.3f} ms, "
          f"median |residual| {statistics.median(res) * 1e3:.3f} ms over {len(firsts)} points")
    dev = sim.load_profile(args.profile)
    per, rms = in_step_per_tensor([o for _, _, _, o in rows], lambda nbytes: memory_time(dev, nbytes, "optimizer"))
    print(f"\nAdamW per parameter tensor inside the steps: {per * 1e6:.1f} us (rms residual {rms * 1e6:.0f} us over "
          f"{len(rows)} steps); in a loop of its own ({args.profile}): "
          f"{dev.optimizer_per_tensor.get('adamw', 0.0) * 1e6:.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
