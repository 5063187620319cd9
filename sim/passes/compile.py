"""The compile pipeline: the passes that turn a schedule into the `Program` a target runs, in one list.

    >>> import sim
    >>> program = sim.compile(sim.make_schedule("1f1b", devices=2, micro_batches=2), "nccl")
    >>> print(program.lowered().to_csv(), end="")   # the lowered schedule the ranks run
    0F0,0SEND_F0,0RECV_B0,0F1,0SEND_F1,0RECV_B1,0B0,0B1
    1RECV_F0,1F0,1RECV_F1,1B0,1SEND_B0,1F1,1B1,1SEND_B1

`simulate` and `exec` both call `compile`; nothing else checks, lowers or numbers a
schedule on its way to a run (exec's ranks run the `Program` itself: its per-rank order,
each compute's wait and each transfer's number, `exec.runtime.rank_program`) (zero-bubble's `run_schedule_passes`: the whole pipeline
in one short function). The passes that add actions (`sim.add_grad_reduce`,
`sim.add_offload`, `sim.add_fsdp`) are the caller's choice of what the step does, made
before (FSDP's gathers first, then the reductions: torch's order).

A target says what runs the program:
- "sim": the simulator (`sim.simulate`). Its run is its own deadlock check, so none runs
  here (a run that stops early is explained afterwards: `sim.passes.validation.run_abstractly`).
- "gloo": `exec` on torch.distributed with gloo, which pairs transfers by tag: the
  deadlock check runs here, before any rank starts.
- "nccl": as "gloo", and NCCL pairs the transfers between two ranks by the order they are
  posted, not by tag: each rank's RECVs are put in the order its peer sends
  (`sim.passes.order.order_transfers`, docs/rules.md rule 12).
"""
from __future__ import annotations

from sim.engine.program import Program
from sim.schedule.ir import Schedule
from .checks import check_communication, check_complete
from .numbering import number_program
from .order import order_transfers
from .validation import run_abstractly

__all__ = ["TARGETS", "compile", "validate"]

TARGETS = ("sim", "gloo", "nccl")


def compile(schedule: Schedule, target: str = "sim") -> Program:  # noqa: A001 (as torch.compile)
    """Check `schedule` (compute-only or lowered) and compile it into the `Program` that
    `target` runs (the module's docstring). Raises `ScheduleError` naming the first problem."""
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; choose one of {', '.join(TARGETS)}")
    check_complete(schedule)                   # each action where rules 13, 14 and 16 let it stand
    if schedule.is_lowered:
        check_communication(schedule)          # its SENDs and RECVs: those its dependencies imply
    program = number_program(schedule)         # numbered; SEND/RECV placed by rules 2 and 3
    if target == "nccl":                       # RECVs in the order the peer sends (rule 12)
        program = number_program(order_transfers(program.lowered()))
    if target != "sim":                        # exec must know before its ranks start
        run_abstractly(program.lowered())
    return program._replace(target=target)


def validate(schedule: Schedule) -> Schedule:
    """Check a schedule (compute-only or lowered) and return its lowered form: what `exec`
    runs on gloo."""
    return compile(schedule, "gloo").lowered()
