"""The numbered program: a schedule's computes, transfers, collectives and copies as numbers, as the engine runs it.

`number_program` numbers the computes in program order over the ranks and places the
communication by the rules of lowering (docs/rules.md, rules 2 and 3): a SEND right
after the compute that made its tensor, the RECVs a compute needs posted one compute
early. `sim.passes.lowering.lower` writes the result out as SEND/RECV actions;
`sim.engine.core` runs it without making an `Action` per step.
"""
from __future__ import annotations

import itertools
from functools import partial
from typing import NamedTuple, Sequence

from sim.schedule.ir import Action, Schedule
from sim.schedule.kinds import COLLECTIVES, COMPUTE, COPIES, KINDS, NEEDS, Role, peer_key, recv_consumer

# Hot loops name the roles by these module globals: `Role.COMPUTE` is an attribute lookup
# on an Enum class, several times slower than a global.
_COMPUTE, _SEND, _RECV, _COLLECTIVE, _COPY = Role.COMPUTE, Role.SEND, Role.RECV, Role.COLLECTIVE, Role.COPY

__all__ = ["Op", "Program", "number_program"]


class Op(NamedTuple):
    """One step of a rank's program in a `Program`: its role, and the compute it runs
    (`index` = compute id) or the transfer whose SEND it issues or whose RECV it posts
    (`index` = transfer id: a transfer is numbered by the compute that receives it)."""

    role: Role
    index: int


_new_op = partial(tuple.__new__, Op)  # Op(*t) without a Python call per op


class Program(NamedTuple):
    """A lowered schedule in numbers, as the engine runs it (`number_program` makes one).

    Computes are numbered in program order over the ranks. A compute takes at most one
    tensor from another rank and gives its result to at most one compute on another rank
    (see `sim.schedule.kinds`), so a transfer is numbered by the compute that receives it.

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


def number_program(schedule: Schedule) -> Program:
    """Number the computes and transfers of a complete schedule. For a lowered schedule the
    SENDs and RECVs stay where they are; for a compute-only one this is where the rules of
    `lower` place them, written once for `lower` and for the engine."""
    progs = schedule.compute_only().programs if schedule.is_lowered else schedule.programs
    collectives: list[Action] = []
    copies: list[Action] = []
    side_ids: dict[Action, Op] = {}   # each collective and copy -> its Op
    if schedule.has_collectives or schedule.has_copies:  # numbered apart; `_insert_side` puts them back
        progs, places = _take_side(progs, collectives, copies, side_ids)
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
        programs = _number_lowered(schedule, computes, cid, side_ids)
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
    return Program(actions, rank, producer, programs, runnable, collectives, copies, copy_after, copy_feeds)


def _take_side(progs, collectives: list[Action], copies: list[Action], side_ids: dict[Action, Op]):
    """Number the collectives and copies apart (into `collectives`, `copies` and their Ops
    into `side_ids`); return the programs without them and, per rank, where each stood:
    (number of the rank's computes before it, its Op)."""
    side = COLLECTIVES | COPIES
    for prog in progs:
        for a in prog:
            if a.kind in side:
                kept = collectives if a.kind in COLLECTIVES else copies
                side_ids[a] = Op(KINDS[a.kind].role, len(kept))
                kept.append(a)
    places = [[(sum(a.kind in COMPUTE for a in prog[:i]), side_ids[a]) for i, a in enumerate(prog)
               if a.kind in side] for prog in progs]
    return [[a for a in prog if a.kind not in side] for prog in progs], places


def _number_lowered(schedule: Schedule, computes: list[Op], cid: dict, side_ids: dict[Action, Op]) -> list[list[Op]]:
    """The programs of a lowered schedule as `Op`s, its SENDs and RECVs where they are."""
    def number(a: Action) -> Op:
        role = KINDS[a.kind].role
        if role is _COMPUTE:
            return computes[cid[a]]
        if role is _COLLECTIVE or role is _COPY:
            return side_ids[a]
        recv = peer_key(*a) if role is _SEND else a  # the RECV: its consumer names the transfer
        return Op(role, cid[recv_consumer(*recv, cid)])

    return [list(map(number, prog)) for prog in schedule.programs]


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
