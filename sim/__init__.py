"""sim: a discrete-event simulator of pipeline-parallel training schedules.

    >>> import sim
    >>> r = sim.simulate(sim.make_schedule("1f1b", stages=4, micro=8), sim.Costs())
    >>> r.makespan, r.bubble_fraction
    (33.0, 0.2727272727272727)

`import sim` never imports torch; `exec` runs the same `Schedule` objects on devices.
"""
from .costs import Costs, StageCosts
from .engine import simulate
from .ir import Action, Kind, Schedule, ScheduleError
from .passes import check_deadlock, dependencies, lower, validate
from .result import Event, Result
from .schedules import SCHEDULES, make_schedule

__all__ = [
    "Action", "Kind", "Schedule", "ScheduleError", "Costs", "StageCosts", "simulate",
    "Event", "Result", "make_schedule", "SCHEDULES", "lower", "validate", "check_deadlock",
    "dependencies",
]
