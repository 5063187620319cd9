"""Host tuning: what makes CPU ranks behave like devices of their own (docs/rules.md, rule 9).

A GPU rank owns its device by construction. CPU ranks share one host, so `exec.launch.processes`
sets up each rank process with these:

- `rank_cores` / `pin_threads`: each rank, and every thread it starts (torch's pool,
  gloo's I/O thread), keeps to its own block of cores;
- `io_thread_batch`: gloo's I/O thread gets the SCHED_BATCH policy, so it runs when the
  rank's core is free and never preempts the rank's compute thread;
- `keep_freed_memory`: glibc's malloc keeps what the rank frees (as a GPU's caching
  allocator does), so a compute takes no page faults in one step and not in the next;
- `paused_gc`: Python's cyclic garbage collector runs before a timed region, never inside
  it (a collection stopped a measured step at random, as `timeit` also avoids).

Where the ranks ran: each rank reports its `rank_place` (host name, the cores it holds, its
torchrun node), and `hosts_of` counts them per host, so that a run knows the cores its ranks
had together on each host, and when several nodes (torchrun launchers) shared one host,
each pinning its ranks as if it had the host alone (`crowding`).

And what a benchmark reads beside its runs: `loadavg`, and `cpu_ticks` / `steal_share`, the
share of the machine's CPU time the hypervisor took.

Everything here is Linux-only where it says so and does nothing elsewhere.
"""
from __future__ import annotations

import contextlib
import gc
import os
import socket
from typing import Iterator, Sequence

from sim.limits import collector_paused

__all__ = ["host_cores", "rank_cores", "rank_place", "hosts_of", "crowding", "thread_ids", "pin_threads", "keep_freed_memory", "io_thread_batch",
           "paused_gc", "loadavg", "cpu_ticks", "steal_share", "GLOO_IO_THREAD", "MALLOC_MMAP_MAX_BLOCK"]

GLOO_IO_THREAD = "gloo_tcp_loop"  # the name gloo's TCP transport gives its event-loop thread
MALLOC_MMAP_MAX_BLOCK = 32 << 20  # glibc's largest M_MMAP_THRESHOLD on 64-bit


def host_cores() -> list[int]:
    """The cores this process may run on (its affinity where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def rank_cores(local_rank: int, local_world: int, cores: Sequence[int]) -> tuple[int, ...] | None:
    """The cores of rank `local_rank` among `local_world` ranks on one host: `cores` cut
    into equal contiguous blocks, one per rank (a remainder stays unused). None when
    there are fewer cores than ranks: then the OS places them."""
    per = len(cores) // local_world
    if per < 1:
        return None
    return tuple(cores[local_rank * per:(local_rank + 1) * per])


def rank_place() -> dict:
    """Where this rank runs: its host's name, the cores it may use now (after pinning: its
    own block) and its node, torchrun's GROUP_RANK (None outside torchrun: one launcher)."""
    node = os.environ.get("GROUP_RANK")
    return {"host": socket.gethostname(), "cores": host_cores(), "node": int(node) if node is not None else None}


def hosts_of(places: Sequence[dict]) -> list[dict]:
    """Per host, in the order of its first rank: its name, its ranks, the cores they hold
    together (the union of their blocks), the nodes (torchrun launchers) they came from, and
    whether ranks share cores (`shared`: their blocks overlap, so rule 9 does not hold there).

        >>> hosts_of([{"host": "a", "cores": [0], "node": 0}, {"host": "a", "cores": [1], "node": 0}])
        [{'host': 'a', 'ranks': 2, 'cores': 2, 'nodes': 1, 'shared': False}]
        >>> hosts_of([{"host": "a", "cores": [0, 1], "node": n} for n in (0, 1)])   # two nodes, both on 0-1
        [{'host': 'a', 'ranks': 2, 'cores': 2, 'nodes': 2, 'shared': True}]
    """
    hosts: dict[str, dict] = {}
    for p in places:
        h = hosts.setdefault(p["host"], {"ranks": 0, "held": 0, "cores": set(), "nodes": set()})
        h["ranks"] += 1
        h["held"] += len(p["cores"])
        h["cores"].update(p["cores"])
        h["nodes"].add(p["node"])
    return [{"host": name, "ranks": h["ranks"], "cores": len(h["cores"]), "nodes": len(h["nodes"]),
             "shared": h["held"] > len(h["cores"])} for name, h in hosts.items()]


def crowding(hosts: Sequence[dict]) -> list[str]:
    """One line per host whose ranks share cores (`hosts_of`'s `shared`), saying why when
    several nodes share it.

        >>> crowding([{"host": "a", "ranks": 4, "cores": 2, "nodes": 2, "shared": True}])[0][:67]
        '2 nodes (torchrun launchers) share host a: 4 ranks on its 2 cores, '
    """
    lines = []
    for h in (h for h in hosts if h["shared"]):
        if h["nodes"] > 1:
            lines.append(f"{h['nodes']} nodes (torchrun launchers) share host {h['host']}: {h['ranks']} ranks on its "
                         f"{h['cores']} cores, each node pinning its ranks as if it had the host alone; "
                         f"give each node a host of its own (or one launcher with --nproc-per-node {h['ranks']})")
        else:
            lines.append(f"{h['ranks']} ranks on {h['cores']} cores of host {h['host']}: ranks share cores")
    return lines


def thread_ids() -> list[tuple[int, str]]:
    """(thread id, name) of every thread of this process; [(0, "")] (this thread) where
    /proc is missing."""
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return [(0, "")]
    out = []
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                out.append((int(tid), f.read().strip()))
        except OSError:  # it just ended
            pass
    return out


def pin_threads(cores: tuple[int, ...]) -> None:
    """Pin every thread of this process, and so every thread it starts later (torch's
    pool, gloo's I/O thread), to `cores`."""
    for tid, _ in thread_ids():
        try:
            os.sched_setaffinity(tid, cores)
        except (ProcessLookupError, PermissionError):  # a thread that just ended, or a locked one
            pass


def keep_freed_memory() -> bool:
    """Make glibc's malloc keep the memory this process frees, as a GPU caching allocator
    does (docs/rules.md, rule 9): blocks up to 32 MiB come from the heap rather than from
    a fresh mmap, and freed heap memory is not given back to the OS. By default glibc
    returns what a step frees at its end, so the next step's tensors land on fresh pages
    and its computes take page faults, more or fewer from one step to the next, and more
    in a calibration than in a step. Returns False where this is not glibc (nothing
    changes)."""
    import ctypes
    import ctypes.util
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    return bool(mallopt(M_TRIM_THRESHOLD, 2**31 - 1)) and bool(mallopt(M_MMAP_THRESHOLD, MALLOC_MMAP_MAX_BLOCK))


def io_thread_batch() -> None:
    """Give gloo's I/O thread the SCHED_BATCH policy (Linux): it then runs whenever the
    rank's core is free (the rank waits, or yields before each send:
    `exec.runtime.interpreter.isend`) or at a scheduler tick, but it no longer preempts the rank's
    compute thread the moment a message wakes it. Under the default policy it did, also
    in the middle of an isend or irecv call, and then spun on the gloo pair lock that call
    holds for up to a whole scheduler slice (4.5 ms measured with `perf sched`);
    docs/rules.md, rule 9."""
    if not hasattr(os, "SCHED_BATCH"):
        return
    for tid, name in thread_ids():
        if name == GLOO_IO_THREAD:
            try:
                os.sched_setscheduler(tid, os.SCHED_BATCH, os.sched_param(0))
            except OSError:  # gone, or not allowed: leave it as it is
                pass


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """Collect now, then keep the cyclic garbage collector off until the block ends (as it
    was before: on or off). A step allocates thousands of objects (events, autograd
    nodes); a collection that falls inside a timed step or compute adds its time to that
    one at random, and a calibration round's garbage made it fall on the step after it."""
    gc.collect()
    with collector_paused():
        yield


def loadavg() -> str:
    """The machine's load averages over 1, 5 and 15 minutes (/proc/loadavg), or "n/a"."""
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "n/a"


def cpu_ticks() -> tuple[int, int] | None:
    """The machine's CPU time so far in clock ticks, all of it and the hypervisor's steal
    (the first line of /proc/stat: steal is its eighth field, the time a virtual CPU had work
    and the host ran something else), or None where there is no /proc/stat."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    return sum(fields), fields[7] if len(fields) == 8 else 0


def steal_share(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """The share of the machine's CPU time between two `cpu_ticks` readings that the
    hypervisor took (None without both, or with no time between them). What it cannot see:
    a host that slows this guest's CPUs without descheduling them (another tenant on the
    same core's other hyperthread, or in its caches) steals nothing by this count."""
    if before is None or after is None or after[0] <= before[0]:
        return None
    return (after[1] - before[1]) / (after[0] - before[0])
