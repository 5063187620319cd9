"""How busy the machine was during a measured step: per rank, the time its threads were runnable but not running, and the CPU time they got.

    >>> with StepLoad() as load:                      # doctest: +SKIP
    ...     run_step(...)
    >>> load.record                                   # doctest: +SKIP
    {'wall': 0.13, 'cpu': 0.11, 'cpu_process': 0.12, 'waited': 0.001, 'waited_transport': 0.004, ...}

The kernel keeps, per thread, the time it ran on a CPU and the time it was runnable but
waited for one (`/proc/self/task/<tid>/schedstat`: on-CPU ns, run-delay ns, slices;
Linux's scheduler statistics). A rank's thread that runs the program (the main thread)
waits for a core only when something else runs on it: on a host where each rank has its
own cores (docs/rules.md, rule 9), that is another process. So `waited / wall` of the main
thread is the share of the step other processes took from the rank ("the machine was
busy: 41 % of the step lost to other processes"). gloo's transport thread shares the
rank's core and runs at SCHED_BATCH (`exec.launch.host.io_thread_batch`): it waits for the rank's
own compute by design (rule 10), so its wait is reported apart (`waited_transport`).

`cpu` is the main thread's CPU time over the step (`time.thread_time`), `cpu_process`
every thread's (`time.process_time`). Where /proc is missing (not Linux), the waits are
None and only the CPU times are kept.
"""
from __future__ import annotations

import gc
import os
import statistics
import threading
import time
from typing import Sequence

from exec.launch.host import GLOO_IO_THREAD

__all__ = ["thread_sched", "StepLoad", "load_summary", "describe_load", "BUSY_SHARE"]

BUSY_SHARE = 0.02  # a step that lost more than this share to other processes is said to be disturbed


def thread_sched() -> dict[int, tuple[str, float, float]] | None:
    """Per thread of this process: (name, seconds it ran on a CPU, seconds it was runnable
    but waited for a CPU), from /proc/self/task/*/schedstat; None where there is none."""
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return None
    out = {}
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                ran, waited, _ = f.read().split()
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
        except (OSError, ValueError):  # the thread just ended, or no scheduler statistics
            continue
        out[int(tid)] = (name, int(ran) / 1e9, int(waited) / 1e9)
    return out or None


class StepLoad:
    """A context manager around one step on one rank: `record` holds its wall time, the
    CPU time of the main thread and of the process, and how long the main thread and the
    transport thread(s) waited for a core (None without scheduler statistics)."""

    def __enter__(self) -> "StepLoad":
        self.tid = threading.get_native_id()
        self.sched = thread_sched()
        self.gc = sum(g["collections"] for g in gc.get_stats())
        self.t, self.cpu, self.proc = time.perf_counter(), time.thread_time(), time.process_time()
        return self

    def __exit__(self, *exc) -> None:
        wall = time.perf_counter() - self.t
        cpu, proc = time.thread_time() - self.cpu, time.process_time() - self.proc
        after = thread_sched()
        waited = transport = None
        if self.sched is not None and after is not None and self.tid in after:
            delta = {tid: (name, w - self.sched.get(tid, (name, 0.0, 0.0))[2]) for tid, (name, _, w) in after.items()}
            waited = delta[self.tid][1]
            transport = sum(w for tid, (name, w) in delta.items() if name == GLOO_IO_THREAD)
        self.record = {"wall": wall, "cpu": cpu, "cpu_process": proc, "waited": waited, "waited_transport": transport,
                       "gc_collections": sum(g["collections"] for g in gc.get_stats()) - self.gc}


def load_summary(per_rank: Sequence[Sequence[dict]], step: int | None = None) -> dict:
    """`StepLoad` records, per rank a list over the measured steps, summed up for one step
    (`step`: its index) or every step (None): per rank the share of its wall time the
    main thread waited for a core (`lost_share`: what other processes took), its CPU time
    over its wall time (`cpu_share`), the transport thread's wait in seconds; and
    `lost_share_max`, the most of any rank (None without scheduler statistics)."""
    ranks = []
    for records in per_rank:
        rs = list(records) if step is None else [records[step]]
        wall = sum(r["wall"] for r in rs)
        waits = [r["waited"] for r in rs]
        lost = sum(waits) / wall if wall > 0 and None not in waits else None
        transport = [r["waited_transport"] for r in rs]
        ranks.append({"lost_share": lost, "cpu_share": sum(r["cpu"] for r in rs) / wall if wall > 0 else None,
                      "transport_waited_s": sum(transport) if None not in transport else None, "wall_s": wall})
    losts = [r["lost_share"] for r in ranks]
    return {"ranks": ranks, "lost_share_max": max(losts) if losts and None not in losts else None}


def describe_load(summary: dict, cores: int | None = None) -> str:
    """One line: how much of the step other processes took, by the rank that lost most. Where
    the ranks outnumber this process's `cores` (default: those it may run on), they take
    turns on them: the wait then counts the run's own ranks, and the line says so."""
    lost = summary.get("lost_share_max")
    if lost is None:
        cpus = [r["cpu_share"] for r in summary["ranks"] if r["cpu_share"] is not None]
        return f"no scheduler statistics here; CPU time {statistics.fmean(cpus):.0%} of the step" if cpus else \
            "no scheduler statistics here"
    worst = max(range(len(summary["ranks"])), key=lambda r: summary["ranks"][r]["lost_share"])
    cpu = summary["ranks"][worst]["cpu_share"]
    ranks = len(summary["ranks"])
    cores = len(os.sched_getaffinity(0)) if cores is None and hasattr(os, "sched_getaffinity") else cores
    if cores is not None and ranks > cores:
        return (f"{ranks} ranks on {cores} cores take turns: {lost:.0%} of the step runnable but not running (rank "
                f"{worst}) counts the run's own ranks, not other processes alone; CPU time {cpu:.0%} of its wall time")
    state = "busy" if lost > BUSY_SHARE else "quiet"
    return (f"the machine was {state}: {lost:.0%} of the step lost to other processes (rank {worst} runnable but "
            f"not running; CPU time {cpu:.0%} of its wall time)")
