"""Passes over a `Schedule`: the one dependency function, validation, and lowering.

Data flows one way: generators write compute actions -> `lower` adds communication ->
`check_deadlock` proves the program runs -> `sim.simulate` or `exec` run it.
"""
from __future__ import annotations

from collections import deque

from .ir import COMPUTE, RECVS, SENDS, Action, Kind, Schedule, ScheduleError

# Hot loops name the kinds by these module globals: `Kind.F` is an attribute lookup on an
# Enum class, several times slower than a global, and the passes make millions of them.
_F, _B, _I, _W = Kind.F, Kind.B, Kind.I, Kind.W
_SEND_F, _RECV_F, _SEND_B, _RECV_B = Kind.SEND_F, Kind.RECV_F, Kind.SEND_B, Kind.RECV_B

# A received tensor is named by the action that consumes it on the receiving stage;
# its sender is named by the action that produces it on the sending stage.
_RECV_OF = {_F: _RECV_F, _B: _RECV_B, _I: _RECV_B}


def grad_kind(schedule_kinds: set[tuple[int, int, Kind]], stage: int, micro: int) -> Kind:
    """Which backward of (stage, micro) produces its input gradient: I if the schedule
    splits the backward, else B."""
    return _I if (stage, micro, _I) in schedule_kinds else _B


def dependencies(a: Action, stages: int, kinds: set[tuple[int, int, Kind]]) -> list[Action]:
    """The compute actions whose results `a` consumes (see `_dependency_keys`)."""
    return [Action(*d) for d in _dependency_keys(a.stage, a.kind, a.micro, stages, kinds)]


def _dependency_keys(s: int, kind: Kind, m: int, stages: int,
                     kinds: set[tuple[int, int, Kind]]) -> list[tuple[int, Kind, int]]:
    """The one place where the data dependencies of pipeline training are written down,
    as (stage, kind, micro) keys of the compute actions that (s, kind, m) consumes:

    - F(s, m) needs F(s-1, m): the previous stage's output activation.
    - B(s, m) and I(s, m) need F(s, m) (the activations it saved) and, except on the last
      stage, the input gradient of stage s+1, made by B(s+1, m) or I(s+1, m).
    - W(s, m) needs I(s, m) (the output gradient it saw).

    The passes work on such tuples rather than on `Action`s: they hash and build faster,
    which matters for schedules of hundreds of thousands of actions.
    """
    if kind is _F:
        return [(s - 1, _F, m)] if s > 0 else []
    if kind is _B or kind is _I:
        deps = [(s, _F, m)]
        if s < stages - 1:
            deps.append((s + 1, grad_kind(kinds, s + 1, m), m))
        return deps
    if kind is _W:
        return [(s, _I, m)]
    raise ValueError(f"dependencies() takes compute actions, not {Action(s, kind, m)}")


def _key(a: Action) -> tuple[int, Kind, int]:
    return (a.stage, a.kind, a.micro)


def _kinds(schedule: Schedule) -> set[tuple[int, int, Kind]]:
    return {(a.stage, a.micro, a.kind) for p in schedule.programs for a in p if a.kind in COMPUTE}


def _at(r: int, i: int, a: Action) -> str:
    return f"rank {r} step {i} ({a})"


def check_complete(schedule: Schedule) -> None:
    """Every stage runs F once and its backward (B, or I and W) once per micro-batch, on
    the device that hosts it. Raises `ScheduleError` naming the first problem."""
    S, M, R = schedule.stages, schedule.micro, schedule.ranks
    if S < 1 or M < 1:
        raise ScheduleError(f"a schedule needs at least one stage and one micro-batch, got {S} and {M}")
    for s, r in enumerate(schedule.placement):
        if not 0 <= r < R:
            raise ScheduleError(f"stage {s} is placed on rank {r}, but there are only ranks 0..{R - 1}")
    counts: dict[tuple[int, Kind, int], int] = {}
    for r, prog in enumerate(schedule.programs):
        for i, a in enumerate(prog):
            if not 0 <= a.stage < S:
                raise ScheduleError(f"{_at(r, i, a)}: stage {a.stage} does not exist (stages 0..{S - 1})")
            if not 0 <= a.micro < M:
                raise ScheduleError(f"{_at(r, i, a)}: micro-batch {a.micro} does not exist (0..{M - 1})")
            if schedule.placement[a.stage] != r:
                raise ScheduleError(f"{_at(r, i, a)}: stage {a.stage} lives on rank {schedule.placement[a.stage]}, not {r}")
            key = (a.stage, a.kind, a.micro)
            counts[key] = counts.get(key, 0) + 1
    for key, n in counts.items():
        if n > 1:
            s, k, m = key
            raise ScheduleError(f"{Action(s, k, m)} appears {n} times; each action runs exactly once")
    for s in range(S):
        for m in range(M):
            has = {k for k in COMPUTE if (s, k, m) in counts}
            if _F not in has:
                raise ScheduleError(f"{Action(s, _F, m)} is missing: every stage runs every micro-batch forward")
            if _B in has and has & {_I, _W}:
                raise ScheduleError(f"stage {s} micro-batch {m} has both B and I/W; use B, or I and W")
            if _B not in has and has & {_I, _W} != {_I, _W}:
                missing = Action(s, _B, m) if not has & {_I, _W} else \
                    Action(s, _W if _I in has else _I, m)
                raise ScheduleError(f"{missing} is missing: every micro-batch needs its backward on every stage")


def _transfer_keys(schedule: Schedule, kinds: set[tuple[int, int, Kind]]) -> list[tuple[tuple, tuple]]:
    """`transfers` as (send key, recv key) pairs of (stage, kind, micro) tuples."""
    pairs = []
    placement, stages = schedule.placement, schedule.stages
    for prog in schedule.programs:
        for a in prog:
            if not a.kind in COMPUTE or a.kind is _W:
                continue
            for d in _dependency_keys(a.stage, a.kind, a.micro, stages, kinds):
                if d[0] != a.stage and placement[d[0]] != placement[a.stage]:
                    send = _SEND_F if a.kind is _F else _SEND_B
                    pairs.append(((d[0], send, a.micro), (a.stage, _RECV_OF[a.kind], a.micro)))
    return pairs


def transfers(schedule: Schedule) -> list[tuple[Action, Action]]:
    """The (send, recv) pairs that the data dependencies imply between different ranks."""
    return [(Action(*send), Action(*recv)) for send, recv in _transfer_keys(schedule, _kinds(schedule))]


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
    return _lower(schedule, _kinds(schedule))


def _lower(schedule: Schedule, kinds: set[tuple[int, int, Kind]]) -> Schedule:
    """`lower` for a schedule that `check_complete` accepted."""
    sends_after: dict[tuple, list[Action]] = {}   # producer key -> its SENDs
    recvs_for: dict[tuple, list[Action]] = {}     # consumer key -> its RECVs
    for (ss, sk, sm), (rs, rk, rm) in _transfer_keys(schedule, kinds):
        producer = (ss, _F if sk is _SEND_F else grad_kind(kinds, ss, sm), sm)
        consumer = (rs, _F if rk is _RECV_F else grad_kind(kinds, rs, rm), rm)
        sends_after.setdefault(producer, []).append(Action(ss, sk, sm))
        recvs_for.setdefault(consumer, []).append(Action(rs, rk, rm))
    programs = []
    for prog in schedule.programs:
        out: list[Action] = []
        keys = [_key(a) for a in prog]
        # receives for compute 0 and 1 go first; those for compute k+1 go before compute k
        if prog:
            out.extend(recvs_for.get(keys[0], ()))
        for k, a in enumerate(prog):
            if k + 1 < len(prog):
                out.extend(recvs_for.get(keys[k + 1], ()))
            out.append(a)
            out.extend(sends_after.get(keys[k], ()))
        programs.append(out)
    return Schedule(programs, schedule.placement, schedule.micro, schedule.name)


# the matching half of a transfer: SEND_F(s) <-> RECV_F(s+1), SEND_B(s) <-> RECV_B(s-1)
_PEER = {
    _SEND_F: (+1, _RECV_F),
    _RECV_F: (-1, _SEND_F),
    _SEND_B: (-1, _RECV_B),
    _RECV_B: (+1, _SEND_B),
}


def _peer_key(stage: int, kind: Kind, micro: int) -> tuple[int, Kind, int]:
    step, other = _PEER[kind]
    return (stage + step, other, micro)


def _peer(a: Action) -> Action:
    return Action(*_peer_key(a.stage, a.kind, a.micro))


def peer(a: Action) -> Action:
    """The other half of the transfer that a SEND or RECV action belongs to."""
    if a.kind in COMPUTE:
        raise ValueError(f"{a} is a compute action; only SEND/RECV have a peer")
    return _peer(a)


def check_deadlock(schedule: Schedule) -> None:
    """Run the lowered program abstractly, with no time: a SEND issues once its tensor is
    computed, a RECV posts at once, a compute starts once its local inputs are computed
    and its remote inputs are posted here and sent there. If the ranks get stuck, raise a
    `ScheduleError` showing the step x rank grid with each stuck action marked and what
    it waits on.

    The run takes time linear in the number of actions: a rank runs until an action waits
    on something not yet done, and is woken only when that thing gets done."""
    kinds = _kinds(schedule)
    _check_communication(schedule, kinds)
    _run_abstractly(schedule, kinds)


def _check_communication(schedule: Schedule, kinds: set[tuple[int, int, Kind]]) -> None:
    """The SENDs and RECVs of a lowered schedule are exactly those that `lower` adds."""
    comm = [a for p in schedule.programs for a in p if not a.kind in COMPUTE]
    comm_set = {_key(a) for a in comm}
    for a in comm:
        if _peer_key(*_key(a)) not in comm_set:
            raise ScheduleError(f"{a} has no matching {_peer(a)}")
    expected = {x for pair in _transfer_keys(schedule, kinds) for x in pair}
    if comm_set != expected:
        extra = sorted(map(str, (Action(*k) for k in comm_set - expected)))
        missing = sorted(map(str, (Action(*k) for k in expected - comm_set)))
        what = f"missing {', '.join(missing[:4])}" if missing else f"unneeded {', '.join(extra[:4])}"
        raise ScheduleError(f"communication does not match the data dependencies: {what}")


def _run_abstractly(schedule: Schedule, kinds: set[tuple[int, int, Kind]]) -> None:
    """The run of `check_deadlock`, for a schedule whose communication is right."""
    placement, stages = schedule.placement, schedule.stages
    done: set[tuple[int, Kind, int]] = set()   # keys of the actions that ran

    def blocker(r: int, a: Action) -> tuple[int, Kind, int] | None:
        """The key of the first thing that `a` on rank r waits for and is not done yet."""
        s, k, m = a.stage, a.kind, a.micro
        if k is _RECV_F or k is _RECV_B:
            return None
        if k is _SEND_F or k is _SEND_B:  # the tensor it sends
            src = (s, _F if k is _SEND_F else grad_kind(kinds, s, m), m)
            return None if src in done else src
        for d in _dependency_keys(s, k, m, stages, kinds):
            if placement[d[0]] == r:
                if d not in done:
                    return d
            else:  # posted here, and sent there
                recv = (s, _RECV_OF[k], m)
                if recv not in done:
                    return recv
                send = _peer_key(*recv)
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
    stuck = {r: pc[r] for r, prog in enumerate(schedule.programs) if pc[r] < len(prog)}
    if stuck:
        reasons = "; ".join(f"rank {r} waits at {schedule.programs[r][i]} for {why(r, schedule.programs[r][i])}"
                            for r, i in stuck.items())
        raise ScheduleError(f"schedule {schedule.name!r} deadlocks: {reasons}\n{schedule.grid(stuck)}")


def validate(schedule: Schedule) -> Schedule:
    """Check a schedule (compute-only or lowered) and return its lowered form."""
    check_complete(schedule)
    if schedule.is_lowered:
        check_deadlock(schedule)
        return schedule
    kinds = _kinds(schedule)
    lowered = _lower(schedule, kinds)  # its communication is right by construction
    _run_abstractly(lowered, kinds)
    return lowered
