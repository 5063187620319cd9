"""Passes over a `Schedule`: the one dependency function, validation, and lowering.

Data flows one way: generators write compute actions -> `plan` numbers them and places
the communication (`lower` writes it out as SEND/RECV actions) -> `sim.simulate` or `exec`
run it; `check_deadlock` proves or explains whether it can finish.
"""
from __future__ import annotations

import itertools
from collections import Counter, deque
from operator import itemgetter
from typing import NamedTuple

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
    # A quick pass that counts with C-level tools; only a schedule that fails it is walked
    # action by action, to say exactly what is wrong.
    counts = Counter(itertools.chain.from_iterable(schedule.programs))
    if len(counts) == sum(map(len, schedule.programs)) and _stages_and_micros_fit(schedule):
        by_kind: dict[Kind, set[tuple[int, int]]] = {k: set() for k in Kind}
        for s, k, m in counts:
            by_kind[k].add((s, m))
        if len(by_kind[_F]) == S * M and not by_kind[_B] & by_kind[_I] and by_kind[_I] == by_kind[_W] \
                and len(by_kind[_B]) + len(by_kind[_I]) == S * M:
            return
    _explain_incomplete(schedule, counts)
    raise AssertionError(f"check_complete found a problem in {schedule.name!r} but could not name it")


def _stages_and_micros_fit(schedule: Schedule) -> bool:
    """Every action names a stage hosted by its rank and an existing micro-batch."""
    for r, prog in enumerate(schedule.programs):
        if prog:
            stages = set(map(itemgetter(0), prog))
            micros = set(map(itemgetter(2), prog))
            if min(micros) < 0 or max(micros) >= schedule.micro or min(stages) < 0 \
                    or max(stages) >= schedule.stages or any(schedule.placement[s] != r for s in stages):
                return False
    return True


def _explain_incomplete(schedule: Schedule, counts: Counter) -> None:
    """Raise a `ScheduleError` naming the first thing that makes `schedule` incomplete."""
    S, M = schedule.stages, schedule.micro
    for r, prog in enumerate(schedule.programs):
        for i, a in enumerate(prog):
            if not 0 <= a.stage < S:
                raise ScheduleError(f"{_at(r, i, a)}: stage {a.stage} does not exist (stages 0..{S - 1})")
            if not 0 <= a.micro < M:
                raise ScheduleError(f"{_at(r, i, a)}: micro-batch {a.micro} does not exist (0..{M - 1})")
            if schedule.placement[a.stage] != r:
                raise ScheduleError(f"{_at(r, i, a)}: stage {a.stage} lives on rank {schedule.placement[a.stage]}, not {r}")
    for a, n in counts.items():
        if n > 1:
            raise ScheduleError(f"{a} appears {n} times; each action runs exactly once")
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
    p = plan(schedule, kinds)
    programs = []
    for steps, tail in zip(p.programs, p.tails):
        prog: list[Action] = []
        for ops, i in steps:
            prog.extend(p.comm_action(t, sending) for t, sending in ops)
            prog.append(p.actions[i])
        prog.extend(p.comm_action(t, sending) for t, sending in tail)
        programs.append(prog)
    return Schedule(programs, schedule.placement, schedule.micro, schedule.name)


Ops = tuple[tuple[int, bool], ...]  # SENDs and RECVs in a row: (transfer, is it the send)


class Plan(NamedTuple):
    """A schedule in numbers, as the engine runs it. Computes are numbered in program order
    over the ranks; a compute takes at most one tensor from another rank, so a transfer is
    numbered by the compute that receives it.

    - actions[i], rank[i]: compute i and its rank
    - producer[i]: the compute on another rank whose tensor compute i receives, or -1
    - local[i]: the computes on its own rank whose results compute i needs
    - programs[r]: per compute of rank r, in order, (the SENDs and RECVs just before it, i)
    - tails[r]: the SENDs and RECVs after the last compute of rank r
    """

    actions: list[Action]
    rank: list[int]
    producer: list[int]
    local: list[tuple[int, ...]]
    programs: list[list[tuple[Ops, int]]]
    tails: list[Ops]

    def comm_action(self, t: int, sending: bool) -> Action:
        """The SEND (on the producer's rank) or the RECV (on the consumer's) of transfer t."""
        c = self.actions[t]
        recv = Action(c.stage, _RECV_F if c.kind is _F else _RECV_B, c.micro)
        return _peer(recv) if sending else recv


def plan(schedule: Schedule, kinds: set[tuple[int, int, Kind]] | None = None) -> Plan:
    """Number the computes and transfers of a complete schedule. For a lowered schedule the
    SENDs and RECVs stay where they are; for a compute-only one this is where the rules of
    `lower` place them, written once for `lower` and for the engine."""
    kinds = _kinds(schedule) if kinds is None else kinds
    stages = schedule.stages
    progs = schedule.compute_only().programs if schedule.is_lowered else schedule.programs
    actions: list[Action] = list(itertools.chain.from_iterable(progs))
    rank = list(itertools.chain.from_iterable(itertools.repeat(r, len(p)) for r, p in enumerate(progs)))
    cid = dict(zip(actions, range(len(actions))))
    producer = [-1] * len(actions)
    local: list[tuple[int, ...]] = [()] * len(actions)
    for i, a in enumerate(actions):
        mine = []
        for d in _dependency_keys(*a, stages, kinds):
            j = cid[d]
            if rank[j] == rank[i]:
                mine.append(j)
            else:
                producer[i] = j
        if mine:
            local[i] = tuple(mine)
    programs, tails = [], []
    if schedule.is_lowered:
        def transfer(a: Action) -> tuple[int, bool]:
            sending = a.kind is _SEND_F or a.kind is _SEND_B
            s, k, m = _peer_key(a.stage, a.kind, a.micro) if sending else (a.stage, a.kind, a.micro)
            return cid[(s, _F if k is _RECV_F else grad_kind(kinds, s, m), m)], sending

        for prog in schedule.programs:
            steps, ops = [], []
            for a in prog:
                if a.kind in COMPUTE:
                    steps.append((tuple(ops), cid[a]))
                    ops = []
                else:
                    ops.append(transfer(a))
            programs.append(steps)
            tails.append(tuple(ops))
        return Plan(actions, rank, producer, local, programs, tails)
    consumers: list[list[int]] = [[] for _ in actions]
    for i, j in enumerate(producer):
        if j >= 0:
            consumers[j].append(i)
    i = 0
    for prog in schedule.programs:
        ids = range(i, i + len(prog))
        i += len(prog)
        # receives for compute 0 and 1 go first; those for compute k+1 go before compute k;
        # sends go right after the compute that made their tensor
        ops = [(ids[0], False)] if prog and producer[ids[0]] >= 0 else []
        steps = []
        for k in ids:
            if k + 1 < ids.stop and producer[k + 1] >= 0:
                ops.append((k + 1, False))
            steps.append((tuple(ops), k))
            ops = [(c, True) for c in consumers[k]]
        programs.append(steps)
        tails.append(tuple(ops))
    return Plan(actions, rank, producer, local, programs, tails)


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


def check_communication(schedule: Schedule) -> None:
    """The SENDs and RECVs of a lowered schedule are exactly those that `lower` adds."""
    _check_communication(schedule, _kinds(schedule))


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
