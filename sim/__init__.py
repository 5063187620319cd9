"""sim: a discrete-event simulator of pipeline-parallel training schedules.

    >>> import sim
    >>> r = sim.simulate(sim.make_schedule("1f1b", devices=4, micro_batches=8), sim.Costs())
    >>> r.makespan, r.bubble_fraction
    (33.0, 0.2727272727272727)

`import sim` never imports torch; `exec` runs the same `Schedule` objects on devices.
"""
from sim.engine.costs import Costs, StageCosts, load_costs, save_costs
from sim.simulation import simulate
from sim.limits import StepTooLarge
from sim.passes.compile import compile, validate
from sim.plan.estimation import Estimate, Layout, estimate
from sim.hardware.gpus import GPU, GPUS
from sim.schedule.ir import Action, Schedule, ScheduleError
from sim.schedule.kinds import KINDS, Kind, KindSpec, Role
from sim.passes.offload import add_offload
from sim.passes.fsdp import add_fsdp
from sim.hardware.profile import DeviceProfile, ProfileError, load_profile, profile, save_profile
from sim.passes.dependencies import dependencies, waits_for
from sim.passes.grad_reduce import add_grad_reduce
from sim.passes.lowering import lower
from sim.passes.validation import check_deadlock
from sim.passes.diagnose import ScheduleReport, check_schedule
from sim.schedule.text import read_schedule, schedule_text
from sim.engine.result import Event, Result
from sim.schedule.registry import SCHEDULES, make_schedule
from sim.search.zbauto import zb_auto  # noqa: F401  its import adds "zb-auto" to SCHEDULES (a search: above the engine)
from sim.model.transformer import Transformer
from sim.model.registry import MODELS
from sim.engine.transports import TRANSPORTS

__all__ = [
    "Action", "Kind", "KINDS", "KindSpec", "Role", "Schedule", "ScheduleError", "Costs", "StageCosts",
    "save_costs", "load_costs", "TRANSPORTS", "compile", "simulate", "Event", "Result", "make_schedule", "SCHEDULES",
    "lower", "add_grad_reduce", "add_offload", "add_fsdp", "validate", "check_deadlock", "dependencies", "waits_for",
    "Transformer", "MODELS", "GPU", "GPUS", "estimate", "Estimate", "Layout", "StepTooLarge",
    "DeviceProfile", "ProfileError", "load_profile", "save_profile", "profile",
    "check_schedule", "ScheduleReport", "read_schedule", "schedule_text",
]
