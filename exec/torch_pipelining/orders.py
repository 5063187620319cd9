"""torch.distributed.pipelining's own schedule orders, read into our IR (`exec.torch_pipelining.orders.from_torch`).

torch builds a schedule's order when its class is instantiated: `pipeline_order[rank]` is
rank's list of `_Action`s, with None for an idle step. We instantiate the class as torch's
`_schedule_visualizer.get_schedule_ops` does, on stand-in stage objects (no model, no
process group), and keep the compute actions: FORWARD F, FULL_BACKWARD B, BACKWARD_INPUT I,
BACKWARD_WEIGHT W, and both halves of DualPipeV's OVERLAP_F_B (forward first, as its text
form lists them). Idle steps, REDUCE_GRAD and communication are dropped: lowering and
timing are ours. It lives in `exec`, as `sim` never imports torch; torch is imported inside
the function, so a missing torch is a `ScheduleError`.
"""
from __future__ import annotations

import sim
from sim import Action, Kind, Schedule, ScheduleError
from sim.schedule.registry import name_key

# torch's names (get_schedule_class) and ours that mean the same schedule
TORCH_NAMES = ("GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV")
ALIASES = {
    "interleavedzb": "InterleavedZeroBubble",  # torch's ZB1P over V chunks (sim.schedule.interleaved_zb)
    "zbh1": "InterleavedZeroBubble",  # with V=1 it is ZB-H1 (Qi et al. 2024)
    "zbv": "ZBVZeroBubble",
}
_KIND = {"F": Kind.F, "B": Kind.B, "I": Kind.I, "W": Kind.W}  # torch's _ComputationType values


def torch_name(name: str) -> str:
    """torch's name for `name`, ours or torch's (dashes and case optional)."""
    by_key = {name_key(n): n for n in TORCH_NAMES} | ALIASES
    if not isinstance(name, str) or name_key(name) not in by_key:
        raise ScheduleError(f"torch has no schedule {name!r}; choose one of {', '.join(TORCH_NAMES)} "
                            f"(or ours: gpipe, 1f1b, interleaved-1f1b, looped-bfs, interleaved-zb, zb-h1, zbv, dualpipev)")
    return by_key[name_key(name)]


def from_torch(name: str, devices: int, micro_batches: int, virtual: int | None = None) -> Schedule:
    """torch's order of schedule `name` for `devices` ranks, `micro_batches` micro-batches and `virtual`
    devices per rank (default: 1 for GPipe and 1F1B, 2 for the others), checked by
    `sim.compile(schedule, "gloo")`. Raises `ScheduleError` if torch is missing, refuses the sizes, or
    builds an order that is not a valid schedule."""
    tname = torch_name(name)
    try:
        from torch.distributed.pipelining import schedules as ts
    except ImportError as e:
        raise ScheduleError(f"from_torch needs torch.distributed.pipelining: {e}") from None
    cls = ts.get_schedule_class(tname)
    single = issubclass(cls, ts.PipelineScheduleSingle)
    v = (1 if single else 2) if virtual is None else virtual
    if single and v != 1:
        raise ScheduleError(f"torch's {tname} holds one stage per rank (V=1), not V={v}")
    instance = _instantiate(cls, single, tname, devices, micro_batches, v)
    programs = [_compute_actions(instance.pipeline_order[r]) for r in range(devices)]
    mapping = getattr(instance, "stage_index_to_group_rank", None) or {s: s for s in range(devices)}
    placement = [mapping[s] for s in range(devices * v)]
    try:
        schedule = Schedule(programs, placement, micro_batches, name=f"torch-{tname}")
        sim.compile(schedule, "gloo")
    except ScheduleError as e:
        raise ScheduleError(f"torch's {tname} order for P={devices}, M={micro_batches}, V={v} is not a valid schedule: {e}") \
            from None
    return schedule


def _instantiate(cls, single: bool, tname: str, devices: int, micro_batches: int, v: int):
    """The schedule class built on stand-in devices, as torch's get_schedule_ops does."""
    from unittest import mock

    from torch.distributed.pipelining.stage import PipelineStage

    stage = mock.create_autospec(PipelineStage, instance=True)
    stage.group_rank, stage.group_size, stage.submod, stage.num_stages = 0, devices, None, devices * v
    try:
        return cls(stage if single else [stage] * v, micro_batches)
    except (ValueError, AssertionError, RuntimeError, ZeroDivisionError) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ScheduleError(f"torch's {tname} refuses P={devices}, M={micro_batches}, V={v}: {reason}") from None


def _compute_actions(order) -> list[Action]:
    """Our compute actions from one rank's torch order (None: idle; OVERLAP_F_B: its halves)."""
    out = []
    for a in order:
        if a is None:
            continue
        for part in a.sub_actions or (a,):
            kind = _KIND.get(part.computation_type.value)
            if kind is not None:
                out.append(Action(part.stage_index, kind, part.microbatch_index))
    return out
