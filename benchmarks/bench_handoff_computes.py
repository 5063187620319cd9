"""A block's compute while a pipeline's handoffs move (its own send in flight, its next input arriving) against the same compute back to back, on two gloo CPU ranks.

    PYTHONPATH=. python benchmarks/bench_handoff_computes.py            # about 20 s
    PYTHONPATH=. python benchmarks/bench_handoff_computes.py --shape 32,1,32,8 --rounds 60

Two ranks, each pinned to its own core with one thread (exec's launch: rule 9), time two of
exec's GPT blocks (forward and backward) of `--shape` hidden,heads,seq,micro-batch:
back to back, then in GPipe's pattern on 2 ranks: the sender computes four times, issuing
an isend of one micro-batch's activation (fp32, micro-batch x seq x hidden) after each; the
receiver posts each irecv one compute early (rule 3), waits for its input and computes
while the next arrives; then the other way round. It prints the median excess of a
sending and of a receiving compute over back to back, each round's back-to-back computes
run just before its handoffs so that a VM's drift falls on both. The profile's
`arrive_overhead` is timed over 256 x 256 matmuls (`exec.measure.calibrate_link.call_costs`),
work that keeps its data in the caches; this times the work the arrival really shares its
core with (docs/measurements.md, "... and the compute after a wait").
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the repository's sim and exec, installed or not

from sim.cli import OneLineParser, whole  # noqa: E402
from bench_idle_warmup import compute_of, shape  # noqa: E402  (this folder is on the path)

SHAPES = ((32, 1, 32, 8), (64, 2, 64, 8), (128, 4, 64, 8))  # hidden, heads, seq, micro-batch: the grid's sizes
COMPUTES = 4  # a phase's computes (micro-batches)


def _timed(f, into: list) -> None:
    t = time.perf_counter()
    f()
    into.append(time.perf_counter() - t)


def _phase(ctx, f, elements: int, sender: bool, into: list) -> None:
    """One GPipe phase on 2 ranks: the sender computes and isends after each compute; the
    receiver posts each irecv one compute early, waits for it and computes."""
    import torch
    import torch.distributed as dist
    peer = 1 - ctx.rank
    if sender:
        sends = []
        for _ in range(COMPUTES):
            _timed(f, into)
            sends.append(dist.isend(torch.zeros(elements), peer))
        for w in sends:
            w.wait()
        return
    r = dist.irecv(torch.empty(elements), peer)
    for k in range(COMPUTES):
        r.wait()
        r = dist.irecv(torch.empty(elements), peer) if k < COMPUTES - 1 else None
        _timed(f, into)


def rank_work(ctx, hidden: int, heads: int, seq: int, micro_batch: int, rounds: int) -> dict[str, list[float]]:
    """This rank's compute times (s): back to back, sending and receiving."""
    import torch.distributed as dist
    f = compute_of(hidden, heads, seq, micro_batch)
    for _ in range(10):
        f()
    out: dict[str, list[float]] = {"back to back": [], "sending": [], "receiving": []}
    for _ in range(rounds):
        dist.barrier()
        for _ in range(COMPUTES):
            _timed(f, out["back to back"])
        for src in (0, 1):  # forward: rank 0 sends; backward: rank 1 does
            dist.barrier()
            sender = ctx.rank == src
            _phase(ctx, f, micro_batch * seq * hidden, sender, out["sending" if sender else "receiving"])
    return out


def main(argv=None) -> int:
    p = OneLineParser(prog="bench_handoff_computes", description=__doc__.splitlines()[0], error_prog="bench_handoff_computes")
    p.add_argument("--shape", type=shape, action="append", help="hidden,heads,seq,micro-batch (repeat)")
    p.add_argument("--rounds", type=whole, default=30, help="rounds of back to back and handoffs (default 30)")
    p.add_argument("--timeout", type=whole, default=240, help="seconds for each launch of the two ranks (default 240)")
    args = p.parse_args(argv)
    from exec.launch.processes import launch
    print(f"{'shape (h, heads, s, b)':>24}  {'message':>9}  {'back to back':>12}  {'sending':>9}  {'receiving':>9}")
    for s in args.shape or SHAPES:
        per_rank = launch(rank_work, 2, *s, args.rounds, backend="gloo", timeout=args.timeout, threads=1)
        times = {k: [t for r in per_rank for t in r[k]] for k in per_rank[0]}
        base = statistics.median(times["back to back"])
        kb = s[3] * s[2] * s[0] * 4 / 1024
        print(f"{str(s):>24}  {kb:6.0f} KB  {base * 1e3:9.3f} ms  " + "  ".join(
            f"{(statistics.median(times[k]) - base) * 1e6:+6.0f} us" for k in ("sending", "receiving")), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
