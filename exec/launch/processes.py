"""Run a function on `world_size` ranks, each a fresh process with torch.distributed set up.

    >>> from exec.launch.processes import launch
    >>> def hello(ctx):
    ...     return f"rank {ctx.rank} of {ctx.world_size} on {ctx.device}"
    >>> launch(hello, 2)                     # doctest: +SKIP
    ['rank 0 of 2 on cpu', 'rank 1 of 2 on cpu']

The parent picks a free TCP port on 127.0.0.1, starts one process per rank with the
`spawn` start method (fresh interpreters: no forked CUDA or thread state), and then only
*polls*: every wait has a deadline, so a run always ends in bounded time.

Faults end the whole run, and no rank process is left behind:

- a rank raises        -> `RankError` naming the rank and the last line of its traceback;
- a rank dies          -> `RankError` naming the rank and its exit code (or signal);
- the run takes longer than `timeout` seconds -> `TimeoutError`.

Each rank process is set up as `exec.launch.host` says (its own cores, gloo's I/O thread at
SCHED_BATCH, freed memory kept) before `fn` runs.

Under `torchrun` (RANK, WORLD_SIZE and MASTER_ADDR set in the environment) `launch` does
not start processes: it runs `fn` in this process as that rank, and returns every rank's
value gathered with `all_gather_object`, so callers see the same list either way.

`fn` must be picklable by reference (a module-level function) and so must its arguments
and return value.
"""
from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import pickle
import queue as queue_mod
import signal
import socket
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from exec.launch.host import host_cores, io_thread_batch, keep_freed_memory, pin_threads, rank_cores

DEFAULT_TIMEOUT = 300.0  # seconds for the whole run
_POLL = 0.05             # seconds between looks at the ranks
_GRACE = 1.0             # seconds a terminated rank gets before it is killed
_SETTLE = 1.0            # seconds to wait, after a failure, for the reports that explain it


class RankError(RuntimeError):
    """A rank raised an exception or died; the run was stopped.

    `rank` is the failing rank, `exitcode` its exit code (negative: killed by that signal;
    None if it raised), `remote_traceback` the rank's traceback text when it raised.
    """

    def __init__(self, message: str, rank: int, exitcode: int | None = None, remote_traceback: str = ""):
        super().__init__(message)
        self.rank = rank
        self.exitcode = exitcode
        self.remote_traceback = remote_traceback

    def __reduce__(self):  # keep the fields when pickled (e.g. across pytest-xdist)
        return (RankError, (str(self), self.rank, self.exitcode, self.remote_traceback))


@dataclass(frozen=True)
class RankContext:
    """What a rank knows about itself: passed as the first argument of `fn`."""

    rank: int
    world_size: int
    local_rank: int
    backend: str
    cores: tuple[int, ...] | None = None   # the cores this rank is pinned to (None: not pinned)

    @property
    def device(self):
        """`cpu` for gloo; `cuda:<local_rank>` for nccl."""
        import torch
        return torch.device(f"cuda:{self.local_rank}") if self.backend == "nccl" else torch.device("cpu")

    dp_group = None  # no data parallelism (`exec.runtime.dp.ReplicaContext` has one)

    def global_rank(self, pipe_rank: int) -> int:
        """The world rank of the schedule's rank `pipe_rank`: itself, with one pipeline."""
        return pipe_rank

    @property
    def is_first(self) -> bool:
        return self.rank == 0

    @property
    def is_last(self) -> bool:
        return self.rank == self.world_size - 1


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def under_torchrun() -> bool:
    """True when the environment names this process's rank (torchrun, SLURM wrappers)."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR"))


def local_world(world_size: int) -> int:
    """The ranks of a `world_size` run that start on this host: torchrun's LOCAL_WORLD_SIZE
    under torchrun (one node of several, perhaps), else all of them (`launch` starts them here)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", world_size)) if under_torchrun() else world_size


def check_gpus(backend: str, ranks_here: int) -> None:
    """The one rule for GPUs: with nccl every rank on this host needs a GPU of its own
    (`local_world`); ValueError naming both counts otherwise (gloo needs none)."""
    if backend != "nccl":
        return
    import torch
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus < ranks_here:
        raise ValueError(f"nccl runs one process per GPU: {ranks_here} ranks need {ranks_here} GPUs, this machine "
                         f"has {gpus}; use the gloo backend (CPU ranks) or fewer ranks")


def _check_args(world_size: int, backend: str, timeout: float, threads: int | None) -> None:
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' (CPU) or 'nccl' (one GPU per rank), got {backend!r}")
    if not timeout > 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads must be a positive integer or None, got {threads!r}")
    check_gpus(backend, local_world(world_size))


def _setup(rank: int, world_size: int, local_rank: int, backend: str, timeout: float,
           threads: int | None, init_method: str | None, pin: bool = True) -> RankContext:
    """Pin this rank to its cores, tune the host for it (`exec.launch.host`), set its threads,
    the device and the process group."""
    import torch
    import torch.distributed as dist

    available = host_cores()
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    cores = rank_cores(local_rank, local_world, available) if pin and hasattr(os, "sched_setaffinity") else None
    if cores is not None:
        pin_threads(cores)  # before the process group starts gloo's thread, which inherits it
    if backend == "gloo":
        keep_freed_memory()
    torch.set_num_threads(threads or (len(cores) if cores else max(1, len(available) // world_size)))
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    kwargs = {"init_method": init_method} if init_method else {}
    # the group's own timeout comes later than the run's, so a hang is reported by the
    # parent as a TimeoutError rather than by some rank as a collective that timed out
    dist.init_process_group(backend, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout + 30), **kwargs)
    if backend == "gloo" and cores is not None:
        io_thread_batch()
    return RankContext(rank, world_size, local_rank, backend, cores)


def _teardown() -> None:
    import torch.distributed as dist
    if dist.is_initialized():
        dist.destroy_process_group()


def _rank_main(fn: Callable, args: tuple, rank: int, world_size: int, port: int, backend: str,
               timeout: float, threads: int | None, pin: bool, results: "mp.Queue") -> None:
    """Body of one rank process: set up, run `fn`, report ("ok", value) or ("error", text)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    try:
        ctx = _setup(rank, world_size, rank, backend, timeout, threads, f"tcp://127.0.0.1:{port}", pin)
        value = fn(ctx, *args)
        try:  # plain pickle: tensors travel by value, not as shared memory of a dying process
            payload = pickle.dumps(value)
        except Exception as e:  # noqa: BLE001
            raise TypeError(f"fn returned a {type(value).__name__} that cannot be pickled ({e}); "
                            f"return plain data, numpy arrays or tensors") from None
        results.put((rank, "ok", payload, time.time()))
    except BaseException as e:  # noqa: BLE001 - everything goes back to the parent
        text = traceback.format_exc()
        last = f"{type(e).__name__}: {e}".strip().splitlines()[0] if str(e) else type(e).__name__
        results.put((rank, "error", (last, text), time.time()))
    finally:
        # the report is in the parent's pipe before this rank leaves the group: a peer that
        # fails because it left reports later, however slow the machine (`_root_cause`)
        results.close()
        results.join_thread()
        try:
            _teardown()
        except Exception:  # noqa: BLE001 - a broken group must not hide the real error
            pass


def children_of(pids: Sequence[int]) -> list[int]:
    """All descendants of `pids`, read from /proc (Linux); [] where /proc is missing."""
    parent_of: dict[int, int] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
            parent_of[int(name)] = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    found, frontier = [], set(pids)
    while frontier:
        kids = {p for p, pp in parent_of.items() if pp in frontier}
        found += kids
        frontier = kids
    return found


def _stop(procs: Sequence[mp.process.BaseProcess]) -> None:
    """Terminate the rank processes (and anything they started); kill what is left."""
    doomed = children_of([p.pid for p in procs if p.pid])
    for p in procs:
        if p.is_alive():
            p.terminate()
    procs = [p for p in procs if p.pid is not None]  # one that never started has nothing to stop
    deadline = time.monotonic() + _GRACE
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(_GRACE)
    for pid in doomed:  # grandchildren a rank started (data loaders, shells, ...)
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def launch(fn: Callable[..., Any], world_size: int, *args: Any, backend: str = "gloo",
           timeout: float = DEFAULT_TIMEOUT, threads: int | None = None, pin: bool = True) -> list[Any]:
    """Run `fn(ctx, *args)` on `world_size` ranks and return their values, indexed by rank.

    Each rank is a fresh process (spawn) with `torch.distributed` initialised over TCP on
    127.0.0.1. With `pin` (the default) and at least one core per rank, each rank and
    every thread it starts (torch's pool, gloo's I/O thread) is pinned to its own block of
    the host's cores (`rank_cores`; `ctx.cores`), so that a rank's communication competes
    only with its own compute, never with another rank's (docs/rules.md, rule 9).
    `torch.set_num_threads(threads or cores per rank)`. `timeout` (seconds) bounds the
    whole run (start-up included); the process group's own timeout is 30 s longer, so a
    hang surfaces here as a `TimeoutError`.

    Raises `RankError` if a rank raises or dies, `TimeoutError` if the run takes longer
    than `timeout`; in both cases every rank process has been stopped when it returns.
    """
    _check_args(world_size, backend, timeout, threads)
    if under_torchrun():
        return _launch_here(fn, world_size, args, backend, timeout, threads, pin)

    spawn = mp.get_context("spawn")
    results = spawn.Queue()
    port = free_port()
    procs = [spawn.Process(target=_rank_main, name=f"rank{r}", daemon=True,
                           args=(fn, args, r, world_size, port, backend, timeout, threads, pin, results))
             for r in range(world_size)]
    reports: dict[int, tuple[str, Any, float]] = {}  # rank -> (status, payload, wall time)
    deadline = time.monotonic() + timeout
    settle_until = None  # after the first failure: a moment to learn which rank failed first
    try:
        for p in procs:
            p.start()
        while True:
            _drain(results, reports, wait=_POLL)
            if len(reports) == world_size and all(st == "ok" for st, _, _ in reports.values()):
                for p in procs:  # they are exiting; give them a moment, then stop them anyway
                    p.join(max(0.0, min(_GRACE, deadline - time.monotonic())))
                return [pickle.loads(reports[r][1]) for r in range(world_size)]
            now = time.monotonic()
            failed = any(st == "error" for st, _, _ in reports.values()) or \
                any(p.exitcode is not None and r not in reports for r, p in enumerate(procs))
            if failed and settle_until is None:
                settle_until = min(now + _SETTLE, deadline)
            if settle_until is not None and now >= settle_until:
                _drain(results, reports, wait=_POLL)
                raise _root_cause(procs, reports)
            if now > deadline:
                pending = [r for r in range(world_size) if r not in reports]
                raise TimeoutError(f"the run took longer than timeout={timeout:g}s; ranks "
                                   f"{', '.join(map(str, pending))} had not returned (hung or too slow); "
                                   f"all ranks were stopped")
    finally:
        _stop(procs)
        results.cancel_join_thread()
        results.close()


def _drain(results: "mp.Queue", reports: dict[int, tuple[str, Any, float]], wait: float) -> None:
    """Move the reports waiting in `results` into `reports` (waiting `wait` s for the first)."""
    block = True
    while True:
        try:
            rank, status, payload, when = results.get(block=block, timeout=wait if block else None)
        except queue_mod.Empty:
            return
        block = False
        reports[rank] = (status, payload, when)


def _root_cause(procs: Sequence[mp.process.BaseProcess], reports: dict[int, tuple[str, Any, float]]) -> RankError:
    """The failure to report. A rank that died without a word comes first (the others
    usually fail *because* their peer vanished); else the rank that raised first."""
    for r, p in enumerate(procs):
        if p.exitcode is not None and r not in reports:
            return RankError(f"rank {r} {_describe_exit(p.exitcode)} before it returned",
                             rank=r, exitcode=p.exitcode)
    errors = sorted((when, r, payload) for r, (st, payload, when) in reports.items() if st == "error")
    when, r, (last, text) = errors[0]
    others = [str(o) for _, o, _ in errors[1:]]
    also = f" (then rank{'s' if len(others) > 1 else ''} {', '.join(others)} failed too)" if others else ""
    return RankError(f"rank {r} raised {last}{also}", rank=r, remote_traceback=text)


def _launch_here(fn: Callable, world_size: int, args: tuple, backend: str, timeout: float,
                 threads: int | None, pin: bool) -> list[Any]:
    """The torchrun path: this process is one rank; gather every rank's value."""
    import torch.distributed as dist

    env_world = int(os.environ["WORLD_SIZE"])
    if env_world != world_size:
        raise ValueError(f"launch asked for {world_size} ranks but WORLD_SIZE={env_world}; "
                         f"start torchrun with --nproc-per-node={world_size}")
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    owns_group = not dist.is_initialized()
    ctx = _setup(rank, world_size, local_rank, backend, timeout, threads, None, pin) if owns_group else \
        RankContext(rank, world_size, local_rank, backend)
    try:
        value = fn(ctx, *args)
        gathered: list[Any] = [None] * world_size
        dist.all_gather_object(gathered, value)
        return gathered
    finally:
        if owns_group:
            _teardown()
