"""`simulate`: one training step of a schedule, compiled for the simulator, run on the engine, and explained if it gets stuck.

It sits above both the passes (`sim.compile`) and the engine (`sim.engine.core.run`),
which knows nothing of the passes: the engine runs a compiled `Program`, and a run that
stops with ranks unfinished comes back here to be explained.
"""
from __future__ import annotations

import gc
import math
from typing import Mapping

from sim.engine import core as engine
from sim.engine.costs import Costs
from sim.engine.result import Result
from sim.limits import check_cells
from sim.passes.compile import compile
from sim.passes.validation import run_abstractly
from sim.schedule.ir import Action, Schedule

__all__ = ["DegenerateStep", "check_makespan", "simulate"]


class DegenerateStep(ValueError):
    """A simulated step of no time (every cost 0) or of more time than a float holds."""


def check_makespan(makespan: float, name: str) -> None:
    """Raise `DegenerateStep`, one line naming the fix, for a step (of the schedule `name`)
    whose makespan is 0 or not finite: the one rule of `sim.simulate` and the command lines on it."""
    span = makespan
    if not math.isfinite(span):
        raise DegenerateStep(f"the step of {name} lasts {span} time units: the costs overflow a float; "
                             f"give smaller times (e.g. in ms rather than ns)")
    if span <= 0:
        raise DegenerateStep(f"the step of {name} takes no time (every cost is 0); give forward and backward "
                             f"costs > 0 (sim.Costs(forward=..., backward=...), --forward and --backward)")


def simulate(schedule: Schedule, costs: Costs | None = None, durations: Mapping[Action, float] | None = None
             ) -> Result:
    """Simulate one training step of `schedule` (compute-only or lowered) under `costs`.

    `durations` (compute action -> time) overrides the cost of those actions: to replay a
    measured step under the rules with the very compute times it had
    (`exec.measure.compare.replay_error`).

    A schedule that cannot finish raises `ScheduleError` showing where each rank waits: the
    run itself is the deadlock check (`sim.passes.validation.check_deadlock` explains what it found).
    A step too large for this machine's memory raises `sim.limits.StepTooLarge` (a
    ValueError) before anything is compiled or run; a step under `costs` alone (no
    `durations`) that takes no time (every cost 0) or lasts past a float's range raises
    `DegenerateStep` (a ValueError, `check_makespan`):
    there is nothing to measure or draw (`python -m sim.plot` refuses it with the same line)."""
    if not isinstance(schedule, Schedule):
        hint = f"sim.make_schedule({schedule!r}, devices, micro_batches)" if isinstance(schedule, str) else "sim.make_schedule(...)"
        raise TypeError(f"simulate needs a sim.Schedule, got {type(schedule).__name__} {schedule!r:.40}; build one "
                        f"with {hint}")
    if costs is not None and not isinstance(costs, Costs):
        raise TypeError(f"simulate's costs must be a sim.Costs, got {type(costs).__name__}")
    check_cells(schedule.stages * schedule.micro_batches, hint="simulate a schedule of fewer stages or micro-batches")
    # A step of a big schedule makes millions of small objects that all live to the end;
    # Python's cyclic garbage collector would walk them again and again (it doubles the
    # time of p=64, m=1024). None of them needs collecting before we return. (As
    # `sim.limits.collector_paused`, written out: through it the whole step measured ~10 %
    # slower, docs/performance.md.)
    collecting = gc.isenabled()
    gc.disable()
    try:
        program = compile(schedule, "sim")
        c = (costs or Costs()).for_stages(schedule.stages)
        if durations:
            _check_durations(durations)
        run = engine.run(program, c, durations)
        if not all(run.finished):
            run_abstractly(program.lowered())  # raises, naming each stuck rank and what it waits for
            raise AssertionError("the simulation stopped early but the schedule does not deadlock")
        result = run.result()
        if not durations:  # a replay's own times are what was measured, whatever they are
            check_makespan(result.makespan, schedule.name)
        return result
    finally:
        if collecting:
            gc.enable()


def _check_durations(durations: Mapping[Action, float]) -> None:
    bad = [f"{a}: {t!r}" for a, t in durations.items()
           if not (isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) and t >= 0)]
    if bad:
        raise ValueError(f"durations must be finite numbers >= 0, got {', '.join(bad[:3])}")
