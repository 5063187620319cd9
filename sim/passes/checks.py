"""Checks of a `Schedule` before it is lowered or run: where each action stands, and the communication of a lowered one.

Completeness (every action once; every stage's F and backward for every micro-batch) is
checked once, when a `Schedule` is made (`sim.schedule.ir.check_actions`). What the IR
cannot know alone is checked here (`check_complete`): that the placement names existing
ranks, every action names an existing stage and micro-batch on its stage's rank, and the
collectives and copies stand where rules 13 and 14 (docs/rules.md) put them.
`check_communication` checks that a lowered schedule's SENDs and RECVs are exactly the
transfers its data dependencies imply.
"""
from __future__ import annotations

from operator import itemgetter

from sim.schedule.ir import Action, Schedule, ScheduleError
from sim.schedule.kinds import TRANSFERS, Computes, peer_key
from .dependencies import compute_set, peer, transfer_keys
from .grad_reduce import check_collectives
from .offload import check_copies

__all__ = ["check_complete", "check_communication"]


def _at(r: int, i: int, a: Action) -> str:
    return f"rank {r} step {i} ({a})"


def check_complete(schedule: Schedule) -> None:
    """A `Schedule` (complete by construction) that can run: at least one stage and one
    micro-batch, each stage placed on an existing rank, every action naming an existing
    stage and micro-batch of a stage its rank hosts, and the collectives and copies where
    they belong. Raises `ScheduleError` naming the first problem."""
    S, M, R = schedule.stages, schedule.micro_batches, schedule.ranks
    if S < 1 or M < 1:
        raise ScheduleError(f"a schedule needs at least one stage and one micro-batch, got {S} and {M}")
    for s, r in enumerate(schedule.placement):
        if not 0 <= r < R:
            raise ScheduleError(f"stage {s} is placed on rank {r}, but there are only ranks 0..{R - 1}")
    if schedule.has_collectives:
        check_collectives(schedule)
    if schedule.has_copies:
        check_copies(schedule)
    if not _stages_and_micros_fit(schedule):
        _explain_misplaced(schedule)
        raise AssertionError(f"check_complete found a problem in {schedule.name!r} but could not name it")


def _stages_and_micros_fit(schedule: Schedule) -> bool:
    """Every action names a stage hosted by its rank and an existing micro-batch (a quick
    pass with C-level tools; only a schedule that fails it is walked action by action)."""
    for r, prog in enumerate(schedule.programs):
        if prog:
            stages = set(map(itemgetter(0), prog))
            micros = set(map(itemgetter(2), prog))
            if min(micros) < 0 or max(micros) >= schedule.micro_batches or min(stages) < 0 \
                    or max(stages) >= schedule.stages or any(schedule.placement[s] != r for s in stages):
                return False
    return True


def _explain_misplaced(schedule: Schedule) -> None:
    """Raise a `ScheduleError` naming the first action that names a stage or micro-batch
    that does not exist, or a stage another rank hosts."""
    S, M = schedule.stages, schedule.micro_batches
    for r, prog in enumerate(schedule.programs):
        for i, a in enumerate(prog):
            if not 0 <= a.stage < S:
                raise ScheduleError(f"{_at(r, i, a)}: stage {a.stage} does not exist (stages 0..{S - 1})")
            if not 0 <= a.micro < M:
                raise ScheduleError(f"{_at(r, i, a)}: micro-batch {a.micro} does not exist (0..{M - 1})")
            if schedule.placement[a.stage] != r:
                raise ScheduleError(f"{_at(r, i, a)}: stage {a.stage} lives on rank {schedule.placement[a.stage]}, not {r}")


def check_communication(schedule: Schedule, computes: Computes | None = None) -> None:
    """The SENDs and RECVs of a lowered schedule are exactly those that `lower` adds
    (`computes`: its compute actions, `compute_set(schedule)` if not given)."""
    if computes is None:
        computes = compute_set(schedule)
    comm = [a for p in schedule.programs for a in p if a.kind in TRANSFERS]
    comm_set = {(a.stage, a.kind, a.micro) for a in comm}
    for a in comm:
        if peer_key(*a) not in comm_set:
            raise ScheduleError(f"{a} has no matching {peer(a)}")
    expected = {x for pair in transfer_keys(schedule, computes) for x in pair}
    if comm_set != expected:
        extra = sorted(map(str, (Action(*k) for k in comm_set - expected)))
        missing = sorted(map(str, (Action(*k) for k in expected - comm_set)))
        what = f"missing {', '.join(missing[:4])}" if missing else f"unneeded {', '.join(extra[:4])}"
        raise ScheduleError(f"communication does not match the data dependencies: {what}")
