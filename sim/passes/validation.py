"""Validation: whether a schedule can finish, proved by running it abstractly, or explained with the step x rank grid.

`check_deadlock` runs the lowered program with no time (rules 1-5 of docs/rules.md, in
order only); `run_abstractly` is that run for a schedule `sim.compile` has checked (it
runs it for `exec`'s targets, before anything starts). `sim.simulate` needs neither: its
run is the deadlock check, and it runs `run_abstractly` only to explain a run that stopped.
"""
from __future__ import annotations

from collections import deque

from sim.schedule.ir import Action, Schedule, ScheduleError
from sim.schedule.kinds import BESIDE, KINDS, NEEDS, RECVS, SENDS, Computes, Kind, peer_key, recv_consumer
from .checks import check_communication, check_complete
from .dependencies import compute_set
from .lowering import lower_unchecked

__all__ = ["check_deadlock", "run_abstractly", "stuck_actions"]


def check_deadlock(schedule: Schedule) -> None:
    """Run the lowered program abstractly, with no time: a SEND issues once its tensor is
    computed, a RECV posts at once, a compute starts once its local inputs are computed
    and its remote inputs are posted here and sent there. If the ranks get stuck, raise a
    `ScheduleError` showing the step x rank grid with each stuck action marked and what
    it waits on.

    The run takes time linear in the number of actions: a rank runs until an action waits
    on something not yet done, and is woken only when that thing gets done.

    A schedule of compute actions only (as the generators write them) is checked as
    `lower` writes it out: without that its transfers would all be "missing"."""
    computes = compute_set(schedule)
    if not schedule.is_lowered:
        check_complete(schedule)
        schedule = lower_unchecked(schedule)  # its communication is right by construction
    else:
        check_communication(schedule, computes)
    _run_abstractly(schedule, computes)


def run_abstractly(lowered: Schedule) -> None:
    """`check_deadlock` for a lowered schedule whose communication is right (`sim.compile`
    checked it): raise the `ScheduleError` with the step x rank grid if its ranks get stuck."""
    _run_abstractly(lowered, compute_set(lowered))


def _run_abstractly(schedule: Schedule, computes: Computes) -> None:
    """The run of `check_deadlock`, for a schedule whose communication is right."""
    stuck = stuck_actions(schedule, computes)
    if stuck:
        reasons = "; ".join(f"rank {r} waits at {schedule.programs[r][i]} for {why}" for r, (i, why) in stuck.items())
        marks = {r: i for r, (i, _) in stuck.items()}
        raise ScheduleError(f"schedule {schedule.name!r} deadlocks: {reasons}\n{schedule.grid(marks)}")


def stuck_actions(schedule: Schedule, computes: Computes | None = None) -> dict[int, tuple[int, str]]:
    """Run a lowered schedule whose communication is right abstractly (`check_deadlock`'s
    run) and return, for each rank that gets stuck, the step it stops at and what that
    action waits for (empty: the schedule finishes)."""
    if computes is None:
        computes = compute_set(schedule)
    placement, stages = schedule.placement, schedule.chain
    done: set[tuple[int, Kind, int]] = set()   # keys of the actions that ran

    def blocker(r: int, a: Action) -> tuple[int, Kind, int] | None:
        """The key of the first thing that `a` on rank r waits for and is not done yet."""
        s, k, m = a.stage, a.kind, a.micro
        if k in RECVS:
            return None
        if k in BESIDE:  # its rank's own backwards; its F, or its OFFLOAD; nothing (a gather)
            needs = KINDS[k].needs
            return next((d for d in needs(s, m, stages, computes) if d not in done), None) if needs else None
        if k in SENDS:  # the tensor it sends: made by the compute its peer's consumer needs
            recv = peer_key(s, k, m)
            src = next(d for d in NEEDS[recv_consumer(*recv, computes)[1]](recv[0], m, stages, computes)
                       if d[0] == s)
            return None if src in done else src
        for d in NEEDS[k](s, m, stages, computes):
            if placement[d[0]] == r:
                if d not in done:
                    return d
            else:  # posted here, and sent there
                recv = (s, KINDS[d[1]].recv, m)
                if recv not in done:
                    return recv
                send = peer_key(*recv)
                if send not in done:
                    return send
        return None

    def why(r: int, a: Action) -> str:
        key = blocker(r, a)
        if key[1] in RECVS:
            return f"{Action(*key)} (not posted before it)"
        if a.kind in SENDS:
            return f"{Action(*key)} (the tensor it sends)"
        return f"{Action(*key)} on rank {placement[key[0]]}"

    pc = [0] * schedule.ranks
    waiting: dict[tuple[int, Kind, int], list[int]] = {}  # key -> the ranks stuck on it
    ready = deque(range(schedule.ranks))
    while ready:
        r = ready.popleft()
        prog = schedule.programs[r]
        while pc[r] < len(prog):
            a = prog[pc[r]]
            key = blocker(r, a)
            if key is not None:
                waiting.setdefault(key, []).append(r)
                break
            key = (a.stage, a.kind, a.micro)
            done.add(key)
            pc[r] += 1
            ready.extend(waiting.pop(key, ()))
    return {r: (pc[r], why(r, prog[pc[r]])) for r, prog in enumerate(schedule.programs) if pc[r] < len(prog)}
