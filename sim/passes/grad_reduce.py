"""The data-parallel gradient reduction as an action: the pass that adds one REDUCE_GRAD per stage (where they may stand: `sim.passes.checks.check_collectives`).

With data parallelism, each pipeline stage has replicas, one in each pipeline copy; after
the backward, the replicas of a stage reduce their gradients (all-reduce, or
reduce-scatter under ZeRO). As an action, `sREDUCE_GRAD` runs on its rank's collective
stream (one per rank, one collective at a time, as NCCL's one communication stream)
while the device goes on with its program (docs/rules.md, rule 13).
"""
from __future__ import annotations

from sim.schedule.ir import Action, Schedule, ScheduleError
from sim.schedule.kinds import Kind

_B, _W, _REDUCE_GRAD = Kind.B, Kind.W, Kind.REDUCE_GRAD


def add_grad_reduce(schedule: Schedule, overlap: bool) -> Schedule:
    """`schedule` (compute actions only) with one REDUCE_GRAD per stage: the data-parallel
    reduction of that stage's gradients, which runs on its rank's collective stream.

    - overlap=True: right after the stage's last backward (B, or W where it is split) in
      its rank's program, so that with several stages per rank (interleaved, V-shaped) the
      reduction of one chunk overlaps the compute of the others (Megatron-LM's
      `--overlap-grad-reduce`, at the granularity of a chunk).
    - overlap=False: after the rank's last compute, its stages in the order their last
      backwards come (Megatron-LM's `finalize_model_grads`, once the whole backward is done).

    With one stage per rank the two are the same schedule; the reductions still overlap
    the other ranks' work (the cool-down), as each data-parallel group holds the replicas
    of one stage."""
    if schedule.is_lowered or schedule.has_collectives:
        raise ScheduleError(f"add_grad_reduce takes a schedule of compute actions only (as the generators write "
                            f"them), without SEND/RECV or REDUCE_GRAD; {schedule.name!r} has them")
    programs = []
    for prog in schedule.programs:
        last = {a.stage: i for i, a in enumerate(prog) if a.kind is _B or a.kind is _W}  # stage -> its last backward
        if overlap:
            after: dict[int, list[int]] = {}
            for s, i in last.items():
                after.setdefault(i, []).append(s)
            programs.append([x for i, a in enumerate(prog)
                             for x in [a] + [Action(s, _REDUCE_GRAD, 0) for s in after.get(i, ())]])
        else:
            programs.append(list(prog) + [Action(s, _REDUCE_GRAD, 0) for s in sorted(last, key=last.get)])
    return schedule.with_programs(programs)
