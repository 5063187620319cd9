"""How large a step this machine can simulate: the one host-memory guard of every entry point.

A step's simulation keeps records for every stage x micro-batch ("cell"), so its memory grows
with their product. The entry points (`sim.make_schedule`, `sim.simulate`, `sim.plot`,
`sim.estimate`, `sim.plan`) ask `check_cells` before they build anything, so a step too large
for this machine is refused in well under a second with one line, instead of growing until
the operating system kills the process (in a notebook: the kernel). Nothing else in `sim`
asks about the host: whether a layout is valid never depends on the machine that plans it.
`collector_paused` keeps Python's garbage collector out of the way while a big step's
actions are made (`sim.make_schedule`; `sim.simulate` does the same inline).

    >>> check_cells(4 * 8)                       # 1F1B on 4 stages, 8 micro-batches: fine
    >>> check_cells(10**12)         # doctest: +ELLIPSIS, +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    ...
    sim.limits.StepTooLarge: step too large for this machine: 1,000,000,000,000 stage-micro-batches ...
"""
from __future__ import annotations

import contextlib
import gc
import os

# What a run holds at its peak: a fixed part plus, per cell, what the engine's records and the
# schedule ("table"), a figure's artists ("figures") and a Chrome trace ("trace") need; each
# rounds up the largest measured (docs/validation.md, "Host memory of a big step").
BYTES_PER_CELL = {"table": 3_800, "figures": 400, "trace": 1_600}
BASE_BYTES = 100 * 2**20
MEMORY_SHARE = 0.5          # of the machine's memory, which other work shares


class StepTooLarge(ValueError):
    """A step whose simulation would need more of this machine's memory than it may take."""


def machine_memory() -> int:
    """Bytes of memory this process may use: the machine's (os.sysconf), or its cgroup's
    limit where that is lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        if limit.isdigit():
            total = min(total, int(limit))
    except OSError:
        pass
    return total


def most_cells(parts: tuple[str, ...] = ("table",), copies: int = 1) -> int:
    """The most stage-micro-batches `copies` steps may have here, keeping `parts` of each."""
    per = copies * sum(BYTES_PER_CELL[p] for p in parts)
    return max(0, int((MEMORY_SHARE * machine_memory() - BASE_BYTES) // per))


def check_cells(cells: int, parts: tuple[str, ...] = ("table",), copies: int = 1, hint: str = "") -> None:
    """Raise `StepTooLarge` (one line, ending with `hint` where given) if `copies` steps of
    `cells` stage-micro-batches, keeping `parts` of each, would need more than
    `MEMORY_SHARE` of this machine's memory."""
    limit = most_cells(parts, copies)
    if cells <= limit:
        return
    need = BASE_BYTES + copies * cells * sum(BYTES_PER_CELL[p] for p in parts)
    times = f" x {copies} steps" if copies > 1 else ""
    raise StepTooLarge(
        f"step too large for this machine: {cells:,} stage-micro-batches{times} would need about "
        f"{need / 2**30:.1f} GiB ({' + '.join(parts)}), more than the {MEMORY_SHARE * machine_memory() / 2**30:.1f} GiB "
        f"allowed ({MEMORY_SHARE:.0%} of its memory); the limit here is {limit:,}" + (f"; {hint}" if hint else ""))


@contextlib.contextmanager
def collector_paused():
    """Python's cyclic garbage collector off inside the block (as it was, after it). A big
    step makes millions of small objects that all live to the end; the collector would walk
    them again and again (it doubles the time of `sim.simulate` at p=64, m=1024, and adds
    half to `sim.make_schedule`'s: docs/performance.md). None of them needs collecting
    before the block ends."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()
