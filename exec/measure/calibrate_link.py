"""Calibration of the transport between ranks 0 and 1: what its calls cost the ranks' cores, and how fast it moves data.

Run inside `exec.measure.calibrate.calibrate_rank` on every rank; only ranks 0 and 1 take part
(the others return at once, so no collective of all ranks may be used here):

- `call_costs`: the CPU time of an `isend` and an `irecv` post inside a step, and of
  taking in a message that arrived during a compute (`send_overhead`, `recv_overhead`,
  `arrive_overhead`; docs/rules.md, rules 2, 3 and 9);
- `late_notice`: the wait of a send whose ready notice comes while the sender computes
  (`io_tick`, rule 10);
- `pingpong`: round trips of messages of several sizes, for `latency + bytes / bandwidth`
  (rule 6), and what posting and waiting cost.
"""
from __future__ import annotations

import statistics
import time
from typing import Sequence

import torch
import torch.distributed as dist

from exec.runtime.interpreter import isend

__all__ = ["call_costs", "late_notice", "pingpong"]


def _work_of(seconds: float):
    """A fixed piece of compute of about `seconds` (256 x 256 matmuls), as a function."""
    x = torch.randn(256, 256)
    t = time.perf_counter()
    for _ in range(10):
        x @ x
    n = max(1, round(seconds / ((time.perf_counter() - t) / 10)))

    def compute() -> None:
        for _ in range(n):
            x @ x
    return compute


def call_costs(ctx, nbytes: int, repeats: int) -> dict:
    """What the transport costs the ranks' own cores inside a step, for a message of
    `nbytes`. Ranks 0 and 1 take turns as the poster, while the other computes:

    - the poster times posting an `irecv` into a buffer it allocates first (as the
      interpreter's RECV does) and issuing an `isend` (the interpreter's call,
      `exec.runtime.interpreter.isend`) into a receive the peer has already posted (RECVs are
      posted one compute early), so gloo writes the data from inside the call:
      `send_overhead` and `recv_overhead` (rules 2 and 3);
    - the peer computes a fixed piece of work during which the message arrives, then
      waits for it, and does the same work again with nothing arriving: the difference is
      what taking the message in cost its core (the transport's receive work runs on the
      rank's own core, rule 9): `arrive_overhead`. The two pieces run back to back on the
      same core, so a change of the machine's speed cancels out.

    Returns this rank's medians, means and largest calls, in seconds; the simulator's
    costs are the means (a step adds them up)."""
    out: dict[str, list[float]] = {"isend_busy": [], "irecv_busy": [], "arrive_busy": []}
    if ctx.rank > 1:
        return {}
    peer, compute = ctx.global_rank(1 - ctx.rank), _work_of(0.004)
    buf_in, buf_out = torch.zeros(max(1, nbytes // 4)), torch.zeros(max(1, nbytes // 4))
    for poster in (0, 1):
        for _ in range(repeats):
            if ctx.rank == poster:
                time.sleep(0.001)  # the peer has posted its receive and computes by now
                t = time.perf_counter()
                r = dist.irecv(torch.empty(buf_in.shape), peer, tag=7)
                t1 = time.perf_counter()
                w = isend(buf_out, peer, tag=8)
                t2 = time.perf_counter()
                out["irecv_busy"].append(t1 - t)
                out["isend_busy"].append(t2 - t1)
                r.wait()
                w.wait()
            else:
                r = dist.irecv(buf_out, peer, tag=8)
                t = time.perf_counter()
                compute()  # the message arrives meanwhile
                r.wait()
                t1 = time.perf_counter()
                compute()  # nothing arrives
                out["arrive_busy"].append((t1 - t) - (time.perf_counter() - t1))
                dist.send(buf_in, peer, tag=7)
    res = {k: statistics.median(v) for k, v in out.items() if v}
    res.update({f"{k}_mean": statistics.fmean(v) for k, v in out.items() if v})
    res.update({f"{k}_max": max(v) for k, v in out.items() if v})
    return res


def _pair_barrier(ctx, peer: int) -> None:
    """Ranks 0 and 1 both reach this point before either leaves it (the other ranks do
    not take part: a `dist.barrier()` here would wait for them for ever)."""
    token = torch.zeros(1)
    if ctx.rank == 0:
        dist.send(token, peer, tag=11)
        dist.recv(token, peer, tag=11)
    else:
        dist.recv(token, peer, tag=11)
        dist.send(token, peer, tag=11)


def late_notice(ctx, repeats: int, hold: float = 0.012) -> dict:
    """How long the data of a send whose receive is posted after it waits for the sending
    rank's transport thread while that rank computes (docs/rules.md, rule 10). Ranks 0
    and 1 take turns as the sender. It issues a send (`exec.runtime.interpreter.isend`) before the
    peer has posted the receive, and then either waits for the send at once (its transport
    thread is free when the ready notice comes in) or first computes for `hold` seconds
    without a yield (the thread must wait for the core). The peer posts the receive 1 ms
    after the send and times it to the data's arrival. The two cases alternate on the same
    cores; `exec.measure.costs.io_tick_from` turns the samples into `io_tick`. `hold` exceeds the
    notice's arrival by more than one tick up to HZ = 100 (10 ms)."""
    out: dict[str, list[float]] = {"notice_free": [], "notice_busy": []}
    if ctx.rank > 1:
        return {}
    peer = ctx.global_rank(1 - ctx.rank)
    x, buf = torch.randn(128, 128), torch.zeros(1024)
    for sender in (0, 1):
        for i in range(2 * repeats):
            busy = i % 2 == 1
            _pair_barrier(ctx, peer)
            if ctx.rank == sender:
                w = isend(buf, peer, tag=9)
                if busy:
                    until = time.perf_counter() + hold
                    while time.perf_counter() < until:
                        x @ x
                w.wait()
            else:
                time.sleep(0.001)
                t = time.perf_counter()
                dist.irecv(buf, peer, tag=9).wait()
                out["notice_busy" if busy else "notice_free"].append(time.perf_counter() - t)
    return out


def _pingpong_size(ctx, buf: torch.Tensor, repeats: int) -> tuple[list, list, list]:
    """Round trips of `buf` between ranks 0 and 1: rank 0's round trips and isend posts,
    rank 1's irecv posts (two warm-up trips first)."""
    peer, rtts, posts_s, posts_r = ctx.global_rank(1 - ctx.rank), [], [], []
    for i in range(repeats + 2):
        if ctx.rank == 0:
            t0 = time.perf_counter()
            w = dist.isend(buf, peer)
            t1 = time.perf_counter()
            w.wait()
            dist.irecv(buf, peer).wait()
            t2 = time.perf_counter()
            if i >= 2:
                rtts.append(t2 - t0)
                posts_s.append(t1 - t0)
        else:
            t0 = time.perf_counter()
            r = dist.irecv(buf, peer)
            t1 = time.perf_counter()
            r.wait()
            dist.isend(buf, peer).wait()
            if i >= 2:
                posts_r.append(t1 - t0)
    return rtts, posts_s, posts_r


def _wait_ready(ctx, buf: torch.Tensor, nbytes: int, repeats: int) -> list[float]:
    """Rank 1 times a wait that finds its data already there."""
    peer, waits = ctx.global_rank(1 - ctx.rank), []
    for _ in range(repeats):
        if ctx.rank == 0:
            dist.isend(buf, peer).wait()
            dist.recv(torch.zeros(1), peer)  # the peer says it has its data
        else:
            r = dist.irecv(buf, peer)
            time.sleep(0.002 + nbytes / 1e9)   # the data arrives meanwhile
            t = time.perf_counter()
            r.wait()
            waits.append(time.perf_counter() - t)
            dist.send(torch.zeros(1), peer)
    return waits


def pingpong(ctx, sizes: Sequence[int], repeats: int) -> dict:
    """Ranks 0 and 1 bounce float32 messages of each size with isend/irecv; rank 0 times
    round trips, and both time what posting and waiting cost on the CPU."""
    out = {"sizes": [], "one_way": [], "isend_post": [], "irecv_post": [], "wait_ready": []}
    if ctx.rank > 1:
        return out

    def median(v, scale=1.0):
        return statistics.median(v) * scale if v else None

    for nbytes in sizes:
        buf = torch.zeros(max(1, nbytes // 4))
        rtts, posts_s, posts_r = _pingpong_size(ctx, buf, repeats)
        waits = _wait_ready(ctx, buf, nbytes, repeats)
        out["sizes"].append(nbytes)
        out["one_way"].append(median(rtts, 0.5))
        out["isend_post"].append(median(posts_s))
        out["irecv_post"].append(median(posts_r))
        out["wait_ready"].append(median(waits))
    return out
