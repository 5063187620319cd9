"""A compute right after its core idled against the same compute back to back: what a pipeline's waits cost the compute that follows them on a CPU rank.

    PYTHONPATH=. python benchmarks/bench_idle_warmup.py                       # about 10 s
    PYTHONPATH=. python benchmarks/bench_idle_warmup.py --shape 32,1,32,8 --gap 0.001 --gap 0.02

A rank of a pipeline step waits for its inputs (the bubble, the handoffs) and then computes;
the profile's blocks and exec's calibration time computes back to back (a compute-only step),
so they never see a compute that follows a wait. This times exec's GPT blocks (two blocks of
`--shape` hidden,heads,seq,micro-batch: forward and backward) on one core, one thread, as a
rank runs them: back to back, and after sleeping each `--gap` seconds (the core idle, as in a
wait for data). Per shape and gap it prints the median compute and its excess over back to
back, over `--repeats` computes each, the gaps interleaved round by round so that a VM's
drift falls on every column alike. docs/measurements.md ("... and the compute after a wait") reads it.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the repository's sim and exec, installed or not

from sim.cli import OneLineParser, number, whole  # noqa: E402

SHAPES = ((32, 1, 32, 8), (64, 2, 64, 8), (128, 4, 64, 8))  # hidden, heads, seq, micro-batch: the grid's sizes
GAPS = (0.0, 0.0002, 0.001, 0.005, 0.02)  # seconds idle before each compute


def shape(text: str) -> tuple[int, int, int, int]:
    """'hidden,heads,seq,micro-batch' -> four positive whole numbers."""
    parts = text.split(",")
    if len(parts) != 4 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"--shape needs hidden,heads,seq,micro-batch (four positive whole numbers), got {text!r}")
    h, a, s, b = (int(p) for p in parts)
    if h % a:
        raise argparse.ArgumentTypeError(f"--shape: hidden {h} is not a multiple of heads {a}")
    return h, a, s, b


def compute_of(hidden: int, heads: int, seq: int, micro_batch: int):
    """A callable running two of exec's GPT blocks of this shape forward and backward."""
    import torch
    from exec.models.spec import ModelSpec
    spec = ModelSpec("gpt", layers=2, hidden=hidden, heads=heads, seq=seq, vocab=256)
    blocks = torch.nn.Sequential(*spec.build_layers()[1:3])
    x = torch.randn(micro_batch, seq, hidden, requires_grad=True)

    def run():
        blocks(x).sum().backward()
    return run


def measure(run, gaps, repeats: int) -> dict[float, float]:
    """{gap: median seconds of `run` after idling `gap` seconds}, the gaps interleaved."""
    for _ in range(10):
        run()
    times: dict[float, list[float]] = {g: [] for g in gaps}
    for _ in range(repeats):
        for g in gaps:
            if g:
                time.sleep(g)
            t = time.perf_counter()
            run()
            times[g].append(time.perf_counter() - t)
    return {g: statistics.median(v) for g, v in times.items()}


def main(argv=None) -> int:
    p = OneLineParser(prog="bench_idle_warmup", description=__doc__.splitlines()[0], error_prog="bench_idle_warmup")
    p.add_argument("--shape", type=shape, action="append", help="hidden,heads,seq,micro-batch (repeat)")
    p.add_argument("--gap", type=number, action="append", help="seconds idle before a compute (repeat)")
    p.add_argument("--repeats", type=whole, default=30, help="computes per gap (default 30)")
    args = p.parse_args(argv)
    import torch
    torch.set_num_threads(1)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    gaps = tuple(sorted({0.0, *(args.gap or GAPS)}))
    print(f"{'shape (h, heads, s, b)':>24}  " + "  ".join(f"{'idle ' + format(g * 1e3, 'g') + ' ms':>18}" for g in gaps))
    for s in args.shape or SHAPES:
        print(f"{str(s):>24}  ", end="", flush=True)
        t = measure(compute_of(*s), gaps, args.repeats)
        print("  ".join(f"{t[g] * 1e3:7.3f} ms {(t[g] - t[0.0]) * 1e6:+6.0f} us" for g in gaps), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
