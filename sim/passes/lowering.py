"""Passes over a `Schedule`: the one dependency function, validation, and lowering.

Data flows one way: generators write compute actions -> `add_grad_reduce` may add the
data-parallel gradient reductions (REDUCE_GRAD), `sim.add_offload` the copies of
activations to host memory and back (OFFLOAD, RELOAD) -> `plan` numbers them and places the
communication (`lower` writes it out as SEND/RECV actions) -> `sim.simulate` or `exec`
run it; `check_deadlock` proves or explains whether it can finish.
"""
from __future__ import annotations

import gc
import itertools
from collections import Counter, deque
from operator import itemgetter
from functools import partial
from typing import NamedTuple, Sequence

from .grad_reduce import add_grad_reduce, check_collectives
from sim.schedule.ir import Action, Schedule, ScheduleError
from .offload import check_copies
from sim.schedule.kinds import COLLECTIVES, COMPUTE, COPIES, KINDS, NEEDS, RECVS, SENDS, TRANSFERS, Computes, Kind, Role, needs, \
    peer_key, recv_consumer, remote_inputs

# Hot loops name the kinds by these module globals: `Kind.F` is an attribute lookup on an
# Enum class, several times slower than a global, and the passes make millions of them.
_F, _B, _I, _W = Kind.F, Kind.B, Kind.I, Kind.W
_COMPUTE, _SEND, _RECV, _COLLECTIVE, _COPY = Role.COMPUTE, Role.SEND, Role.RECV, Role.COLLECTIVE, Role.COPY

__all__ = ["dependencies", "waits_for", "compute_set", "check_complete", "add_grad_reduce", "lower", "Op", "Plan",
           "plan", "peer", "check_deadlock", "check_communication", "validate"]


def dependencies(a: Action, stages: int, computes: Computes) -> list[Action]:
    """The compute actions whose results `a` consumes (`sim.kinds`: each kind's `needs`)."""
    return [Action(*d) for d in needs(a.stage, a.kind, a.micro, stages, computes)]


def waits_for(a: Action, schedule: Schedule, computes: Computes) -> list[Action]:
    """The RECV actions whose data compute `a` waits for before it starts: one for each of
    its inputs made on another rank (`sim.schedule.kinds.remote_inputs`)."""
    return [Action(*k) for k in remote_inputs(a.stage, a.kind, a.micro, schedule.stages, computes,
                                              schedule.placement)]


def _key(a: Action) -> tuple[int, Kind, int]:
    return (a.stage, a.kind, a.micro)


def compute_set(schedule: Schedule) -> set[Action]:
    """The compute actions of a schedule, as a set."""
    return {a for p in schedule.programs for a in p if a.kind in COMPUTE}


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
    if schedule.has_collectives:
        check_collectives(schedule)
    if schedule.has_copies:
        check_copies(schedule)
    # A quick pass that counts with C-level tools; only a schedule that fails it is walked
    # action by action, to say exactly what is wrong.
    counts = Counter(itertools.chain.from_iterable(schedule.programs))
    if len(counts) == sum(map(len, schedule.programs)) and _stages_and_micros_fit(schedule):
        # No action twice, and each names an existing (stage, micro-batch) on its rank: so
        # S*M distinct Fs are all of them, and likewise for B where nothing is split.
        per_kind = Counter(map(itemgetter(1), counts))
        if per_kind[_F] == S * M and per_kind[_B] == S * M and not per_kind[_I] and not per_kind[_W]:
            return
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


def _transfer_keys(schedule: Schedule, computes: Computes) -> list[tuple[tuple, tuple]]:
    """`transfers` as (send key, recv key) pairs of (stage, kind, micro) tuples: one for
    each input a compute takes from another rank, named by its producer's kinds."""
    pairs = []
    placement, stages = schedule.placement, schedule.stages
    for prog in schedule.programs:
        for s, k, m in prog:
            if k not in COMPUTE:
                continue
            for d in NEEDS[k](s, m, stages, computes):
                if placement[d[0]] != placement[s]:
                    spec = KINDS[d[1]]
                    pairs.append(((d[0], spec.send, m), (s, spec.recv, m)))
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
    # As in `sim.simulate`: the ~100k actions of a big schedule all live on; Python's cyclic
    # garbage collector would only walk them (and every object of the process) again and
    # again, which doubles the time where torch is imported.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _lower(schedule)
    finally:
        if collecting:
            gc.enable()


def _lower(schedule: Schedule) -> Schedule:
    """`lower` for a schedule that `check_complete` accepted."""
    p = plan(schedule)
    return Schedule([list(map(p.action, prog)) for prog in p.programs],
                    schedule.placement, schedule.micro, schedule.name)


class Op(NamedTuple):
    """One step of a rank's program in a `Plan`: its role, and the compute it runs
    (`index` = compute id) or the transfer whose SEND it issues or whose RECV it posts
    (`index` = transfer id: a transfer is numbered by the compute that receives it)."""

    role: Role
    index: int


_new_op = partial(tuple.__new__, Op)  # Op(*t) without a Python call per op


class Plan(NamedTuple):
    """A lowered schedule in numbers, as the engine runs it.

    Computes are numbered in program order over the ranks. A compute takes at most one
    tensor from another rank and gives its result to at most one compute on another rank
    (see `sim.kinds`), so a transfer is numbered by the compute that receives it.

    - actions[i], rank[i]: compute i and its rank
    - producer[i]: the compute on another rank whose tensor compute i receives, or -1
    - programs[r]: rank r's program, as `Op` records
    - runnable[r]: how far rank r gets: the index in programs[r] of the first compute that
      needs the result of a compute later in its own program, where it is stuck for good
      (len(programs[r]) if there is none)
    - collectives[x]: collective x (a REDUCE_GRAD), numbered in program order over the
      ranks; an `Op` of role COLLECTIVE names it by x
    - copies[y]: copy y (an OFFLOAD or RELOAD), numbered the same way; an `Op` of role COPY
      names it by y. copy_after[y]: the copy whose end it waits for (a RELOAD's OFFLOAD),
      or -1; copy_feeds[y]: the compute that waits for its end (a RELOAD's backward), or -1
    """

    actions: list[Action]
    rank: list[int]
    producer: list[int]
    programs: list[list[Op]]
    runnable: list[int]
    collectives: Sequence[Action] = ()
    copies: Sequence[Action] = ()
    copy_after: Sequence[int] = ()
    copy_feeds: Sequence[int] = ()

    def comm_action(self, t: int, sending: bool) -> Action:
        """The SEND (on the producer's rank) or the RECV (on the consumer's) of transfer t."""
        c, spec = self.actions[t], KINDS[self.actions[self.producer[t]].kind]
        if sending:
            return Action(self.actions[self.producer[t]].stage, spec.send, c.micro)
        return Action(c.stage, spec.recv, c.micro)

    def action(self, op: Op) -> Action:
        """The action that `op` stands for."""
        role, x = op
        if role is _COLLECTIVE:
            return self.collectives[x]
        if role is _COPY:
            return self.copies[x]
        return self.actions[x] if role is _COMPUTE else self.comm_action(x, role is _SEND)


def plan(schedule: Schedule) -> Plan:
    """Number the computes and transfers of a complete schedule. For a lowered schedule the
    SENDs and RECVs stay where they are; for a compute-only one this is where the rules of
    `lower` place them, written once for `lower` and for the engine."""
    progs = schedule.compute_only().programs if schedule.is_lowered else schedule.programs
    collectives: list[Action] = []
    copies: list[Action] = []
    side_ids: dict[Action, Op] = {}   # each collective and copy -> its Op
    if schedule.has_collectives or schedule.has_copies:  # numbered apart; `_insert_side` puts them back
        side = COLLECTIVES | COPIES
        for prog in progs:
            for a in prog:
                if a.kind in side:
                    kept = collectives if a.kind in COLLECTIVES else copies
                    side_ids[a] = Op(KINDS[a.kind].role, len(kept))
                    kept.append(a)
        places = [[(sum(a.kind in COMPUTE for a in prog[:i]), side_ids[a]) for i, a in enumerate(prog)
                   if a.kind in side] for prog in progs]
        progs = [[a for a in prog if a.kind not in side] for prog in progs]
    actions: list[Action] = list(itertools.chain.from_iterable(progs))
    n, stages = len(actions), schedule.stages
    rank = list(itertools.chain.from_iterable(itertools.repeat(r, len(p)) for r, p in enumerate(progs)))
    first = list(itertools.accumulate(map(len, progs), initial=0))  # rank r's computes: first[r]..first[r+1]-1
    cid = dict(zip(actions, range(n)))  # also the `computes` that the dependency functions ask
    producer, consumer = [-1] * n, [-1] * n
    stuck: list[int | None] = [None] * schedule.ranks  # the first compute of each rank that waits on a later one
    for i, (s, k, m) in enumerate(actions):
        for d in NEEDS[k](s, m, stages, cid):
            j = cid[d]
            if rank[j] != rank[i]:
                if consumer[j] >= 0:
                    raise AssertionError(f"{actions[j]} feeds two computes on other ranks")
                producer[i], consumer[j] = j, i
            elif j > i and stuck[rank[i]] is None:  # a local input that comes later in the same program
                stuck[rank[i]] = i
    computes = list(map(_new_op, zip(itertools.repeat(_COMPUTE), range(n))))
    if schedule.is_lowered:
        def number(a: Action) -> Op:
            role = KINDS[a.kind].role
            if role is _COMPUTE:
                return computes[cid[a]]
            if role is _COLLECTIVE or role is _COPY:
                return side_ids[a]
            recv = peer_key(*a) if role is _SEND else a  # the RECV: its consumer names the transfer
            return Op(role, cid[recv_consumer(*recv, cid)])

        programs = [list(map(number, prog)) for prog in schedule.programs]
    else:
        # The lowering rules: a SEND goes right after the compute that made its tensor; the
        # RECV for compute k+1 is posted just before compute k (the first compute's RECV
        # goes first). So rank r runs: RECV(lo)?, then for each compute k: RECV(k+1)?, k, SEND?
        recv_ops = map(_new_op, zip(itertools.repeat(_RECV), range(n)))
        recvs = [op if j >= 0 else None for op, j in zip(recv_ops, producer)]
        sends = [None if c < 0 else op for c, op in zip(consumer, map(_new_op, zip(itertools.repeat(_SEND), consumer)))]
        programs = []
        for lo, hi in zip(first, first[1:]):
            steps = itertools.chain.from_iterable(zip(recvs[lo + 1:hi] + [None], computes[lo:hi], sends[lo:hi]))
            programs.append([op for op in itertools.chain(recvs[lo:lo + 1], steps) if op is not None])
        if side_ids:
            _insert_side(programs, places, first, computes, sends)
    starts = [None if i is None else computes[i] for i in stuck]
    runnable = [len(prog) if op is None else prog.index(op) for prog, op in zip(programs, starts)]
    copy_after, copy_feeds = _copy_links(copies, cid)
    return Plan(actions, rank, producer, programs, runnable, collectives, copies, copy_after, copy_feeds)


def _copy_links(copies: list[Action], cid: dict) -> tuple[list[int], list[int]]:
    """Per copy: the copy whose end it waits for (a RELOAD's OFFLOAD) and the compute that
    waits for its end (a RELOAD's B or I), as numbers; -1 where there is none."""
    copy_id = {a: y for y, a in enumerate(copies)}
    after = [copy_id.get(Action(*KINDS[a.kind].needs(a.stage, a.micro, 0, cid)[0]), -1) for a in copies]
    feeds = [cid.get(recv_consumer(*a, cid), -1) if KINDS[a.kind].feeds else -1 for a in copies]
    return after, feeds


def _insert_side(programs: list[list[Op]], places, first: list[int], computes: list[Op], sends) -> None:
    """Put each collective and copy back after the compute it followed (and that compute's
    SEND): `places[r]` holds (number of rank r's computes before it, its Op) in order."""
    for r in reversed(range(len(programs))):
        prog = programs[r]
        for before, op in reversed(places[r]):
            at = 0
            if before:
                j = first[r] + before - 1   # the compute it follows
                at = prog.index(computes[j]) + 1
                if at < len(prog) and sends[j] is not None and prog[at] is sends[j]:
                    at += 1
            prog.insert(at, op)


def peer(a: Action) -> Action:
    """The other half of the transfer that a SEND or RECV action belongs to."""
    if a.kind not in TRANSFERS:
        raise ValueError(f"{a} is a {KINDS[a.kind].role.value} action; only SEND/RECV have a peer")
    return Action(*peer_key(*a))


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
        schedule = _lower(schedule)  # its communication is right by construction
    else:
        _check_communication(schedule, computes)
    _run_abstractly(schedule, computes)


def _check_communication(schedule: Schedule, computes: Computes) -> None:
    """The SENDs and RECVs of a lowered schedule are exactly those that `lower` adds."""
    comm = [a for p in schedule.programs for a in p if a.kind in TRANSFERS]
    comm_set = {_key(a) for a in comm}
    for a in comm:
        if peer_key(*_key(a)) not in comm_set:
            raise ScheduleError(f"{a} has no matching {peer(a)}")
    expected = {x for pair in _transfer_keys(schedule, computes) for x in pair}
    if comm_set != expected:
        extra = sorted(map(str, (Action(*k) for k in comm_set - expected)))
        missing = sorted(map(str, (Action(*k) for k in expected - comm_set)))
        what = f"missing {', '.join(missing[:4])}" if missing else f"unneeded {', '.join(extra[:4])}"
        raise ScheduleError(f"communication does not match the data dependencies: {what}")


def _run_abstractly(schedule: Schedule, computes: Computes) -> None:
    """The run of `check_deadlock`, for a schedule whose communication is right."""
    placement, stages = schedule.placement, schedule.stages
    done: set[tuple[int, Kind, int]] = set()   # keys of the actions that ran

    def blocker(r: int, a: Action) -> tuple[int, Kind, int] | None:
        """The key of the first thing that `a` on rank r waits for and is not done yet."""
        s, k, m = a.stage, a.kind, a.micro
        if k in RECVS:
            return None
        if k in COLLECTIVES or k in COPIES:  # its rank's own backwards; its F, or its OFFLOAD
            return next((d for d in KINDS[k].needs(s, m, stages, computes) if d not in done), None)
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
    stuck = {r: pc[r] for r, prog in enumerate(schedule.programs) if pc[r] < len(prog)}
    if stuck:
        reasons = "; ".join(f"rank {r} waits at {schedule.programs[r][i]} for {why(r, schedule.programs[r][i])}"
                            for r, i in stuck.items())
        raise ScheduleError(f"schedule {schedule.name!r} deadlocks: {reasons}\n{schedule.grid(stuck)}")


def check_communication(schedule: Schedule) -> None:
    """The SENDs and RECVs of a lowered schedule are exactly those that `lower` adds."""
    _check_communication(schedule, compute_set(schedule))


def validate(schedule: Schedule) -> Schedule:
    """Check a schedule (compute-only or lowered) and return its lowered form."""
    check_complete(schedule)
    if schedule.is_lowered:
        check_deadlock(schedule)
        return schedule
    computes = compute_set(schedule)
    lowered = _lower(schedule)  # its communication is right by construction
    _run_abstractly(lowered, computes)
    return lowered
