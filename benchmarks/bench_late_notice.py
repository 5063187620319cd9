"""Rule 10 (docs/rules.md) against measurement: how long the data of a send whose receive
is posted after it waits for the sending rank's transport thread, as a function of X, the
time from the ready notice to the sender's next yield.

    python benchmarks/bench_late_notice.py                  # X from 0.25 to 16 ms
    python benchmarks/bench_late_notice.py --repeats 60 --holds 1,2,3,4,5

Two ranks started as the runtime starts them (`exec.launch.processes`: each pinned to its own core,
gloo's I/O thread SCHED_BATCH). Rank 0 issues a send (`exec.runtime.interpreter.isend`) and computes
for `hold` ms without a yield, then waits for the send (its next yield); rank 1 posts the
receive 1 ms after the send and times it to the data's arrival. X = the end of rank 0's
compute - the post (one clock: CLOCK_MONOTONIC is the same in both processes). The base is
the same exchange with rank 0 waiting at once (its transport thread runs as the notice
comes in). The simulator predicts base + E[min(X, U(0, io_tick))], with `io_tick` as
calibration measures it (`exec.measure.calibrate_link.late_notice`, `exec.measure.costs.io_tick_from`), in
the same launch. The table gives, per hold, the median X, the measured mean extra wait
over the base and the mean prediction (both over the same samples), and the measured
median, p10 and p90 against those of min(X, U)."""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def _exchange(ctx, hold: float, tag: int) -> tuple[float, float] | None:
    """One late-notice exchange; rank 1 returns (its post time, the wait), rank 0 sends the
    end of its compute over afterwards and rank 1 returns X too."""
    import torch
    import torch.distributed as dist
    from exec.runtime.interpreter import isend

    x, buf, stamp = torch.randn(128, 128), torch.zeros(1024), torch.zeros(1, dtype=torch.float64)
    dist.barrier()
    if ctx.rank == 0:
        w = isend(buf, 1, tag)
        until = time.perf_counter() + hold
        while time.perf_counter() < until:
            x @ x
        stamp[0] = time.perf_counter()  # the compute ends: the next yield is the wait
        w.wait()
        dist.send(stamp, 1)
        return None
    time.sleep(0.001)
    t = time.perf_counter()
    dist.irecv(buf, 0, tag=tag).wait()
    wait = time.perf_counter() - t
    dist.recv(stamp, 0)
    return wait, max(0.0, float(stamp[0]) - t)


def _rank(ctx, holds, repeats):
    from exec.measure.calibrate_link import late_notice
    late = late_notice(ctx, repeats)
    rows = {}
    for hold in holds:
        rows[hold] = []
        for _ in range(repeats):
            base = _exchange(ctx, 0.0, 11)
            busy = _exchange(ctx, hold, 12)
            if ctx.rank == 1:
                rows[hold].append((base[0], busy[0], busy[1]))
    return late, rows


def expected_min(x: float, tick: float, n: int = 2000) -> list[float]:
    """min(x, u) over n phases u spread evenly on [0, tick]."""
    return [min(x, (i + 0.5) * tick / n) for i in range(n)]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--holds", default="0.25,1,2,3,4,5,6,8,16", help="ms rank 0 computes after its send")
    ap.add_argument("--repeats", type=int, default=40)
    args = ap.parse_args(argv)
    from exec.launch.processes import launch
    from exec.measure.costs import io_tick_from
    from sim.engine.transports import expected_wait

    holds = [float(h) / 1e3 for h in args.holds.split(",")]
    (late0, _), (late1, rows) = launch(_rank, 2, holds, args.repeats, timeout=600)
    tick = io_tick_from([late0, late1])
    print(f"io_tick (exec.measure.costs, this launch): {tick * 1e3:.2f} ms\n")
    print("| hold ms | X median ms | extra wait mean ms | predicted mean ms | measured median / p10 / p90 ms | predicted median / p10 / p90 ms |")
    print("|---:|---:|---:|---:|---:|---:|")
    base = statistics.median(b for r in rows.values() for b, _, _ in r)
    for hold in holds:
        extra = sorted(w - base for _, w, _ in rows[hold])
        xs = [x for _, _, x in rows[hold]]
        model = sorted(v for x in xs for v in expected_min(x, tick, 200))
        pred_mean = statistics.fmean(expected_wait(x, tick) for x in xs)

        def q(v, f):
            return v[min(len(v) - 1, int(f * len(v)))] * 1e3

        print(f"| {hold * 1e3:g} | {statistics.median(xs) * 1e3:.2f} | {statistics.fmean(extra) * 1e3:.2f} | {pred_mean * 1e3:.2f} | "
              f"{q(extra, .5):.2f} / {q(extra, .1):.2f} / {q(extra, .9):.2f} | {q(model, .5):.2f} / {q(model, .1):.2f} / {q(model, .9):.2f} |")
    print(f"\nbase (rank 0 waits at once): median {base * 1e3:.3f} ms from the post to the data's arrival")


if __name__ == "__main__":
    main()
