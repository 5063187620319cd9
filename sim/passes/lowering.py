"""Lowering: a compute-only `Schedule` with the SEND and RECV actions its data dependencies imply.

Data flows one way: generators write compute actions -> `sim.passes.grad_reduce.add_grad_reduce`
may add the data-parallel gradient reductions (REDUCE_GRAD), `sim.passes.offload.add_offload`
the copies of activations to host memory and back (OFFLOAD, RELOAD), `sim.passes.fsdp.add_fsdp`
FSDP's gathers (UNSHARD, RESHARD) -> `sim.compile` checks
it and numbers it (`sim.passes.numbering.number_program` places the communication, which
`lower` writes out as SEND/RECV actions) -> `sim.simulate` or `exec` run it;
`sim.passes.validation` proves or explains whether it can finish.
"""
from __future__ import annotations

from sim.limits import collector_paused
from sim.schedule.ir import Schedule, ScheduleError
from .checks import check_complete
from .numbering import number_program

__all__ = ["lower", "lower_unchecked"]


def lower(schedule: Schedule) -> Schedule:
    """Add the communication actions that the data dependencies imply.

    Rules (docs/rules.md, rules 2 and 3; the runtime of `exec` interprets exactly these):
    - a SEND comes right after the compute that produced the tensor; it is asynchronous.
    - the RECVs that compute k needs are posted one compute early, just before compute
      k-1 (at the start for the first compute); a RECV only posts the receive, and the
      rank waits for the data just before compute k starts.
    """
    if schedule.is_lowered:
        raise ScheduleError("schedule is already lowered (it contains SEND/RECV actions)")
    check_complete(schedule)
    # the ~100k actions of a big schedule all live on: nothing for the collector to find
    # (it doubles the time where torch is imported)
    with collector_paused():
        return lower_unchecked(schedule)


def lower_unchecked(schedule: Schedule) -> Schedule:
    """`lower` for a compute-only schedule that `check_complete` accepted: its
    communication is right by construction."""
    return number_program(schedule).lowered()
