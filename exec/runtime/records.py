"""What one rank's step leaves: each action's clock marks (`Marks`) and the rank's trace in seconds (`RankTrace`), as the interpreter writes them."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from sim import Action, Event

__all__ = ["Marks", "RankTrace"]


class Marks(NamedTuple):
    """One action's record in a step: its start and end as clock marks (`clock.seconds`
    reads them out; on CPU they are `time.perf_counter()` seconds) and, for a SEND or
    RECV, the other rank (-1 for a compute)."""

    action: Action
    start: Any
    end: Any
    peer: int = -1


@dataclass
class RankTrace:
    """What one rank measured, in seconds since its step start (picklable, for gathering)."""

    rank: int
    events: list[Event] = field(default_factory=list)
    memory: list[tuple[float, float]] = field(default_factory=list)
    activations: list[tuple[float, int]] = field(default_factory=list)
    loss: float | None = None
    step_end: float | None = None  # when the optimizer step ended (`exec.runtime.step.run_step`)
