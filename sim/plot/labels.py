"""How figures and tables write numbers, units and sizes: plurals, times in one format,
bytes in binary units, memory as a count of micro-batches where it is one, the costs a figure assumes."""
from __future__ import annotations

import math
from typing import Sequence

from sim.engine.costs import Costs
from sim.engine.result import Result

TIME_UNIT = "time units"   # simulated times are in the costs' unit, whatever it is


def plural(n: int, word: str, many: str | None = None) -> str:
    """`1 stage`, `4 stages`; `many` for irregular plurals (`micro-batches`)."""
    return f"{n} {word if n == 1 else many or word + 's'}"


def size(result: Result) -> str:
    """`4 stages, 8 micro-batches` (and the ranks, where they are not one per stage)."""
    s = result.schedule
    on = "" if s.ranks == s.stages else f" on {plural(s.ranks, 'rank')}"
    return f"{plural(s.stages, 'stage')}{on}, {plural(s.micro_batches, 'micro-batch', 'micro-batches')}"


def format_times(values: Sequence[float]) -> list[str]:
    """Times in one fixed-point format: as many decimals as four significant digits of the
    smallest need, no trailing zero that every value has (96 and 33; 19.30 and 13.15)."""
    nonzero = [abs(v) for v in values if v and math.isfinite(v)]
    decimals = min(9, max(0, 3 - math.floor(math.log10(min(nonzero))))) if nonzero else 0
    while decimals and all(f"{v:.{decimals}f}".endswith("0") for v in values):
        decimals -= 1
    return [f"{v:.{decimals}f}" for v in values]


def time_unit(result: Result) -> str:
    """Measured runs are timed in seconds, and so are steps whose costs are in seconds
    (`Result.in_seconds`: `sim.estimate`'s); other simulated ones in the unit of their costs."""
    return "s" if result.in_seconds else TIME_UNIT


def time_label(result: Result) -> str:
    if result.source == "measured":
        return "time since step start (s)"
    return f"time ({time_unit(result)})"


def human_bytes(n: float) -> str:
    """`1536` -> `'1.5 KiB'`: bytes in the largest binary unit that keeps the number >= 1."""
    scale, unit = _byte_unit(abs(n))
    return f"{n / scale:.3g} {unit}"


def _byte_unit(peak: float) -> tuple[float, str]:
    for i, unit in reversed(list(enumerate(["B", "KiB", "MiB", "GiB", "TiB", "PiB"]))):
        if peak >= 1024 ** i:
            return 1024 ** i, unit
    return 1, "B"


def counts_micro_batches(result: Result) -> bool:
    """True when memory equals the number of micro-batches held (no static bytes, one
    byte per activation: the default `Costs`), so the memory axis is a count."""
    return all(
        len(mem) == len(act) and all(b == n for (_, b), (_, n) in zip(mem, act))
        for mem, act in zip(result.memory, result.activations)
    )


def memory_unit(results: Sequence[Result], top: float) -> tuple[float, str]:
    """(scale, unit) for memory up to `top`: micro-batches where every result counts them,
    else bytes in KiB, MiB, GiB... chosen from `top`."""
    if all(map(counts_micro_batches, results)):
        return 1.0, "micro-batches"
    return _byte_unit(top)


def format_memory(value: float, scale: float, unit: str) -> str:
    if unit == "micro-batches":
        return plural(int(value), "micro-batch", "micro-batches") if value == int(value) else f"{value:g} {unit}"
    return f"{value / scale:.3g} {unit}"


def costs_note(costs: Costs, virtual: int = 1, split: bool = False) -> str:
    """`costs: F 1, B 2 a stage; transfers free`: what a figure's steps assume, written on it
    (with `split`, the halves I and W of a split backward too)."""
    def show(value, half: bool = False) -> str:
        values = value if isinstance(value, (list, tuple)) else [value]
        return "/".join(f"{v / (2 if half else 1):g}" for v in values)
    halves = ""
    if split:
        i, w = costs.backward_input, costs.backward_weight
        halves = f" (I {show(costs.backward if i is None else i, i is None)} + W {show(costs.backward if w is None else w, w is None)})"
    free = costs.latency == 0 and (costs.bandwidth == float("inf") or costs.activation_bytes_sent == 0)
    where = "a device (1/V of it a chunk)" if virtual > 1 else "a stage"
    return f"costs: F {show(costs.forward)}, B {show(costs.backward)}{halves} {where}; transfers {'free' if free else 'timed'}"


def device_micro_batches(result: Result) -> list[str]:
    """Per rank, the most micro-batches whose activations it holds at once, in the unit of the
    memory column and the figures: a device's micro-batch, of which a chunk's (one of V
    stages on the rank) is 1/V (zbv's 8 chunk micro-batches are 4)."""
    per = result.schedule.stages // result.ranks
    return [f"{n / per:g}" for n in result.peak_activations]
