"""Passes over a `Schedule`: the one dependency function, validation, and lowering.

Data flows one way: generators write compute actions -> `lower` adds communication ->
`check_deadlock` proves the program runs -> `sim.simulate` or `exec` run it.
"""
from __future__ import annotations

from collections import Counter

from .ir import COMPUTE, RECVS, SENDS, Action, Kind, Schedule, ScheduleError

# A received tensor is named by the action that consumes it on the receiving stage;
# its sender is named by the action that produces it on the sending stage.
_RECV_OF = {Kind.F: Kind.RECV_F, Kind.B: Kind.RECV_B, Kind.I: Kind.RECV_B}


def grad_kind(schedule_kinds: set[tuple[int, int, Kind]], stage: int, micro: int) -> Kind:
    """Which backward of (stage, micro) produces its input gradient: I if the schedule
    splits the backward, else B."""
    return Kind.I if (stage, micro, Kind.I) in schedule_kinds else Kind.B


def dependencies(a: Action, stages: int, kinds: set[tuple[int, int, Kind]]) -> list[Action]:
    """The compute actions whose results `a` consumes. The one place where the data
    dependencies of pipeline training are written down:

    - F(s, m) needs F(s-1, m): the previous stage's output activation.
    - B(s, m) and I(s, m) need F(s, m) (the activations it saved) and, except on the last
      stage, the input gradient of stage s+1, made by B(s+1, m) or I(s+1, m).
    - W(s, m) needs I(s, m) (the output gradient it saw).
    """
    s, m = a.stage, a.micro
    if a.kind is Kind.F:
        return [Action(s - 1, Kind.F, m)] if s > 0 else []
    if a.kind in (Kind.B, Kind.I):
        deps = [Action(s, Kind.F, m)]
        if s < stages - 1:
            deps.append(Action(s + 1, grad_kind(kinds, s + 1, m), m))
        return deps
    if a.kind is Kind.W:
        return [Action(s, Kind.I, m)]
    raise ValueError(f"dependencies() takes compute actions, not {a}")


def _kinds(schedule: Schedule) -> set[tuple[int, int, Kind]]:
    return {(a.stage, a.micro, a.kind) for p in schedule.programs for a in p if a.kind.is_compute}


def check_complete(schedule: Schedule) -> None:
    """Every stage runs F once and its backward (B, or I and W) once per micro-batch, on
    the device that hosts it. Raises `ScheduleError` naming the first problem."""
    S, M, R = schedule.stages, schedule.micro, schedule.ranks
    if S < 1 or M < 1:
        raise ScheduleError(f"a schedule needs at least one stage and one micro-batch, got {S} and {M}")
    for s, r in enumerate(schedule.placement):
        if not 0 <= r < R:
            raise ScheduleError(f"stage {s} is placed on rank {r}, but there are only ranks 0..{R - 1}")
    counts = Counter()
    for r, prog in enumerate(schedule.programs):
        for i, a in enumerate(prog):
            where = f"rank {r} step {i} ({a})"
            if not 0 <= a.stage < S:
                raise ScheduleError(f"{where}: stage {a.stage} does not exist (stages 0..{S - 1})")
            if not 0 <= a.micro < M:
                raise ScheduleError(f"{where}: micro-batch {a.micro} does not exist (0..{M - 1})")
            if schedule.placement[a.stage] != r:
                raise ScheduleError(f"{where}: stage {a.stage} lives on rank {schedule.placement[a.stage]}, not {r}")
            counts[(a.stage, a.kind, a.micro)] += 1
    for key, n in counts.items():
        if n > 1:
            s, k, m = key
            raise ScheduleError(f"{Action(s, k, m)} appears {n} times; each action runs exactly once")
    for s in range(S):
        for m in range(M):
            has = {k for k in COMPUTE if counts[(s, k, m)]}
            if Kind.F not in has:
                raise ScheduleError(f"{Action(s, Kind.F, m)} is missing: every stage runs every micro-batch forward")
            if Kind.B in has and has & {Kind.I, Kind.W}:
                raise ScheduleError(f"stage {s} micro-batch {m} has both B and I/W; use B, or I and W")
            if Kind.B not in has and has & {Kind.I, Kind.W} != {Kind.I, Kind.W}:
                missing = Action(s, Kind.B, m) if not has & {Kind.I, Kind.W} else \
                    Action(s, Kind.W if Kind.I in has else Kind.I, m)
                raise ScheduleError(f"{missing} is missing: every micro-batch needs its backward on every stage")


def transfers(schedule: Schedule) -> list[tuple[Action, Action]]:
    """The (send, recv) pairs that the data dependencies imply between different ranks."""
    kinds = _kinds(schedule)
    pairs = []
    for prog in schedule.programs:
        for a in prog:
            if not a.kind.is_compute or a.kind is Kind.W:
                continue
            for d in dependencies(a, schedule.stages, kinds):
                if d.stage != a.stage and schedule.rank_of(d.stage) != schedule.rank_of(a.stage):
                    send = Kind.SEND_F if a.kind is Kind.F else Kind.SEND_B
                    pairs.append((Action(d.stage, send, a.micro), Action(a.stage, _RECV_OF[a.kind], a.micro)))
    return pairs


def lower(schedule: Schedule) -> Schedule:
    """Add the communication actions that the data dependencies imply.

    Rules (the runtime of `exec` interprets exactly these):
    - a SEND comes right after the compute that produced the tensor; it is asynchronous.
    - the RECVs that compute k needs are posted one compute early, just before compute
      k-1 (at the start for the first compute); a RECV only posts the receive, and the
      rank waits for the data just before compute k starts.
    """
    if schedule.is_lowered:
        raise ScheduleError("schedule is already lowered (it contains SEND/RECV actions)")
    check_complete(schedule)
    sends_after: dict[Action, list[Action]] = {}
    recvs_for: dict[Action, list[Action]] = {}
    kinds = _kinds(schedule)
    for send, recv in transfers(schedule):
        producer = Action(send.stage, Kind.F if send.kind is Kind.SEND_F else grad_kind(kinds, send.stage, send.micro), send.micro)
        consumer = Action(recv.stage, Kind.F if recv.kind is Kind.RECV_F else grad_kind(kinds, recv.stage, recv.micro), recv.micro)
        sends_after.setdefault(producer, []).append(send)
        recvs_for.setdefault(consumer, []).append(recv)
    programs = []
    for prog in schedule.programs:
        out: list[Action] = []
        computes = list(prog)
        # receives for compute 0 and 1 go first; those for compute k+1 go before compute k
        out.extend(recvs_for.get(computes[0], [])) if computes else None
        for k, a in enumerate(computes):
            if k + 1 < len(computes):
                out.extend(recvs_for.get(computes[k + 1], []))
            out.append(a)
            out.extend(sends_after.get(a, []))
        programs.append(out)
    return Schedule(programs, schedule.placement, schedule.micro, schedule.name)


def _peer(a: Action) -> Action:
    """The matching half of a transfer: SEND_F(s) <-> RECV_F(s+1), SEND_B(s) <-> RECV_B(s-1)."""
    return {
        Kind.SEND_F: lambda: Action(a.stage + 1, Kind.RECV_F, a.micro),
        Kind.RECV_F: lambda: Action(a.stage - 1, Kind.SEND_F, a.micro),
        Kind.SEND_B: lambda: Action(a.stage - 1, Kind.RECV_B, a.micro),
        Kind.RECV_B: lambda: Action(a.stage + 1, Kind.SEND_B, a.micro),
    }[a.kind]()


def peer(a: Action) -> Action:
    """The other half of the transfer that a SEND or RECV action belongs to."""
    if a.kind.is_compute:
        raise ValueError(f"{a} is a compute action; only SEND/RECV have a peer")
    return _peer(a)


def check_deadlock(schedule: Schedule) -> None:
    """Run the lowered program abstractly, with no time: a SEND issues once its tensor is
    computed, a RECV posts at once, a compute starts once its local inputs are computed
    and its remote inputs are posted here and sent there. If the ranks get stuck, raise a
    `ScheduleError` showing the step x rank grid with each stuck action marked and what
    it waits on."""
    kinds = _kinds(schedule)
    comm = [a for p in schedule.programs for a in p if not a.kind.is_compute]
    comm_set = set(comm)
    for a in comm:
        if _peer(a) not in comm_set:
            raise ScheduleError(f"{a} has no matching {_peer(a)}")
    expected = {x for pair in transfers(schedule) for x in pair}
    if comm_set != expected:
        extra = sorted(comm_set - expected, key=str)
        missing = sorted(expected - comm_set, key=str)
        what = f"missing {', '.join(map(str, missing[:4]))}" if missing else f"unneeded {', '.join(map(str, extra[:4]))}"
        raise ScheduleError(f"communication does not match the data dependencies: {what}")

    done: set[Action] = set()
    pc = [0] * schedule.ranks

    def blocker(r: int, a: Action) -> str | None:
        if a.kind in RECVS:
            return None
        if a.kind in SENDS:
            src = Action(a.stage, Kind.F if a.kind is Kind.SEND_F else grad_kind(kinds, a.stage, a.micro), a.micro)
            return None if src in done else f"{src} (the tensor it sends)"
        for d in dependencies(a, schedule.stages, kinds):
            if schedule.rank_of(d.stage) == r:
                if d not in done:
                    return f"{d} on rank {r}"
            else:
                recv = Action(a.stage, _RECV_OF[a.kind], a.micro)
                send = _peer(recv)
                if recv not in done:
                    return f"{recv} (not posted before it)"
                if send not in done:
                    return f"{send} on rank {schedule.rank_of(send.stage)}"
        return None

    progress = True
    while progress:
        progress = False
        for r, prog in enumerate(schedule.programs):
            while pc[r] < len(prog) and blocker(r, prog[pc[r]]) is None:
                done.add(prog[pc[r]])
                pc[r] += 1
                progress = True
    stuck = {r: pc[r] for r, prog in enumerate(schedule.programs) if pc[r] < len(prog)}
    if stuck:
        why = "; ".join(f"rank {r} waits at {schedule.programs[r][i]} for {blocker(r, schedule.programs[r][i])}"
                        for r, i in stuck.items())
        raise ScheduleError(f"schedule {schedule.name!r} deadlocks: {why}\n{schedule.grid(stuck)}")


def validate(schedule: Schedule) -> Schedule:
    """Check a schedule (compute-only or lowered) and return its lowered form."""
    check_complete(schedule)
    lowered = schedule if schedule.is_lowered else lower(schedule)
    check_deadlock(lowered)
    return lowered
