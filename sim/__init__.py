"""sim: a discrete-event simulator of pipeline-parallel training schedules.

    >>> import sim
    >>> r = sim.simulate(sim.make_schedule("1f1b", stages=4, micro=8), sim.Costs())
    >>> r.makespan, r.bubble_fraction
    (33.0, 0.2727272727272727)

`import sim` never imports torch; `exec` runs the same `Schedule` objects on devices.
"""
from .costs import Costs, StageCosts, load_costs, save_costs
from .engine import simulate
from .estimate import Estimate, Layout, estimate
from .gpus import GPU, GPUS
from .ir import Action, Schedule, ScheduleError
from .kinds import KINDS, Kind, KindSpec, Role
from .offload import add_offload
from .device_profile import DeviceProfile, ProfileError, load_profile, profile, save_profile
from .passes import add_grad_reduce, check_deadlock, dependencies, lower, validate, waits_for
from .result import Event, Result
from .schedules import SCHEDULES, make_schedule
from .transformer import MODELS, Transformer
from .transports import TRANSPORTS

__all__ = [
    "Action", "Kind", "KINDS", "KindSpec", "Role", "Schedule", "ScheduleError", "Costs", "StageCosts",
    "save_costs", "load_costs", "TRANSPORTS", "simulate", "Event", "Result", "make_schedule", "SCHEDULES",
    "lower", "add_grad_reduce", "add_offload", "validate", "check_deadlock", "dependencies", "waits_for",
    "Transformer", "MODELS", "GPU", "GPUS", "estimate", "Estimate", "Layout",
    "DeviceProfile", "ProfileError", "load_profile", "save_profile", "profile",
]
