"""What the backend achieves between ranks of one host: collectives and point-to-point sends by message size, and the ring model fitted to them.

`collective_rows` and `p2p_rows` run inside the ranks of an `exec.launch.processes` (every rank
calls them at once); the times are rank 0's medians over repeats, each started at a
barrier. `ring_fit` and `p2p_fit` fit the models `sim.hardware.kernels` uses (NCCL's ring:
base + steps x hop + steps/n x bytes / bus bandwidth; a send: latency + bytes / bandwidth)
by least squares, never below zero.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable, Sequence

import torch
import torch.distributed as dist

from sim.hardware.network import OPS as COLLECTIVE_STEPS

__all__ = ["OPS", "collective_rows", "p2p_rows", "ring_fit", "p2p_fit", "nonnegative_lstsq"]

OPS = ("all_reduce", "reduce_scatter", "all_gather")


def _timed(fn: Callable[[], None], device: torch.device, repeats: int) -> float:
    """Median seconds of `fn` over `repeats` runs, each started at a barrier, as rank 0 sees it."""
    samples = []
    for _ in range(repeats + 1):  # the first warms up
        dist.barrier()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        samples.append(time.perf_counter() - t)
    return statistics.median(samples[1:])


def _op(op: str, nbytes: int, device: torch.device) -> Callable[[], None]:
    n = dist.get_world_size()
    elements = max(n, nbytes // 4 // n * n)  # fp32, a multiple of the ranks
    whole = torch.ones(elements, device=device)
    piece = torch.ones(elements // n, device=device)
    if op == "all_reduce":
        return lambda: dist.all_reduce(whole)
    if op == "reduce_scatter":  # torch 2.13 names them *_single; older, *_tensor
        scatter = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
        return lambda: scatter(piece, whole)
    gather = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
    return lambda: gather(whole, piece)


def collective_rows(sizes: Sequence[int], device: torch.device, repeats: int,
                    say: Callable[[str], None]) -> list[list]:
    """[op, "node", ranks, bytes, seconds] for each op of `OPS` and message size (bytes of
    the whole buffer), over this launch's ranks. An op the backend lacks is left out (said)."""
    n, rows = dist.get_world_size(), []
    for op in OPS:
        for nbytes in sizes:
            fn = _op(op, nbytes, device)
            try:
                seconds = _timed(fn, device, repeats)
            except (RuntimeError, NotImplementedError) as e:  # a backend without this collective
                say(f"{op} on {n} ranks: not measured ({str(e).splitlines()[0][:80]})")
                break
            rows.append([op, "node", n, max(n, nbytes // 4 // n * n) * 4, seconds])
        say(f"{op} on {n} ranks: {len(sizes)} sizes")
    return rows


def p2p_rows(sizes: Sequence[int], device: torch.device, repeats: int, say: Callable[[str], None]) -> list[list]:
    """["node", bytes, seconds] of one send from rank 0 to rank 1: half a ping-pong (the
    other ranks wait at the barriers)."""
    rank, rows = dist.get_rank(), []
    for nbytes in sizes:
        buf = torch.ones(max(1, nbytes // 4), device=device)

        def pingpong():
            if rank == 0:
                dist.send(buf, 1)
                dist.recv(buf, 1)
            elif rank == 1:
                dist.recv(buf, 0)
                dist.send(buf, 0)
        rows.append(["node", buf.numel() * 4, _timed(pingpong, device, repeats) / 2])
    say(f"p2p: {len(sizes)} sizes")
    return rows


def nonnegative_lstsq(columns: list[list[float]], y: list[float]) -> list[float]:
    """Least squares y ~ sum(c_i * column_i) with every c_i >= 0: drop a negative
    coefficient's column and fit again (a few columns: exhaustive enough)."""
    import numpy as np
    active = list(range(len(columns)))
    while True:
        a = np.array([columns[i] for i in active]).T
        coef = np.linalg.lstsq(a, np.array(y), rcond=None)[0] if active else []
        if all(c >= 0 for c in coef):
            out = [0.0] * len(columns)
            for i, c in zip(active, coef):
                out[i] = float(c)
            return out
        active.pop(int(np.argmin(coef)))


def ring_fit(rows: Sequence[Sequence]) -> dict[str, float]:
    """NCCL's ring model (`sim.hardware.network.ring_time`) fitted to collective rows:
    base_latency, hop_latency (seconds) and bus_bandwidth (bytes/s)."""
    ones, steps, traffic, y = [], [], [], []
    for op, _, n, nbytes, seconds in rows:
        s = COLLECTIVE_STEPS[op] * (n - 1)
        ones.append(1.0)
        steps.append(float(s))
        traffic.append(s / n * nbytes)
        y.append(seconds)
    base, hop, per_byte = nonnegative_lstsq([ones, steps, traffic], y)
    if per_byte <= 0:  # latency-bound or noisy: the largest one's traffic over its time bounds the bandwidth
        i = max(range(len(y)), key=lambda j: traffic[j])
        return {"base_latency": min(y), "hop_latency": 0.0, "bus_bandwidth": traffic[i] / y[i]}
    return {"base_latency": base, "hop_latency": hop, "bus_bandwidth": 1 / per_byte}


def p2p_fit(rows: Sequence[Sequence]) -> dict[str, float]:
    """latency (seconds) and bandwidth (bytes/s) of a send fitted to p2p rows. Where the times
    do not grow with the size (every measured send latency-bound, or timing noise on a busy
    machine), the latency is the fastest send's time and the bandwidth the largest send's
    bytes over its time: a lower bound on the real bandwidth, never an invented one."""
    latency, per_byte = nonnegative_lstsq([[1.0] * len(rows), [float(r[1]) for r in rows]],
                                           [r[2] for r in rows])
    if per_byte <= 0:
        largest = max(rows, key=lambda r: r[1])
        return {"latency": min(r[2] for r in rows), "bandwidth": largest[1] / largest[2]}
    return {"latency": latency, "bandwidth": 1 / per_byte}
