"""Numbering: a schedule's computes, transfers and the actions beside the device as the numbered `Program` the engine runs.

`number_program` numbers the computes in program order over the ranks and places the
communication by the rules of lowering (docs/rules.md, rules 2 and 3): a SEND right
after the compute that made its tensor, the RECVs a compute needs posted one compute
early. `sim.engine.program.Program.lowered` writes the result out as SEND/RECV actions
(what `sim.lower` returns); `sim.engine.core` runs it without making an `Action` per step.
"""
from __future__ import annotations

import itertools
import operator
from operator import itemgetter

from sim.engine.program import Op, Program, new_op
from sim.schedule.ir import Action, Schedule
from sim.schedule.kinds import BESIDE, COMPUTE, KINDS, NEEDS, PAIRS, Role, grad_kind, peer_key, recv_consumer

_COMPUTE, _SEND, _RECV, _PAIR = Role.COMPUTE, Role.SEND, Role.RECV, Role.PAIR

__all__ = ["number_program", "inputs_by_compute", "inputs_by_group"]


def number_program(schedule: Schedule) -> Program:
    """Number the computes and transfers of a complete schedule. For a lowered schedule the
    SENDs and RECVs stay where they are; for a compute-only one this is where the rules of
    `lower` place them, written once for `lower` and for the engine."""
    progs = schedule.compute_only().programs if schedule.is_lowered else schedule.programs
    beside: dict[Role, list[Action]] = {}   # role -> its actions beside the device, in order
    side_ids: dict[Action, Op] = {}   # each of those -> its Op
    if schedule.has_beside:  # numbered apart; `_insert_side` puts them back
        progs, places = _take_side(progs, beside, side_ids)
    if schedule.has_pairs:  # an overlapped pair's mark is put back before its F (`_insert_pairs`)
        progs = [[a for a in prog if a.kind not in PAIRS] for prog in progs]
    actions: list[Action] = list(itertools.chain.from_iterable(progs))
    n, stages = len(actions), schedule.chain
    rank = list(itertools.chain.from_iterable(itertools.repeat(r, len(p)) for r, p in enumerate(progs)))
    first = list(itertools.accumulate(map(len, progs), initial=0))  # rank r's computes: first[r]..first[r+1]-1
    cid = dict(zip(actions, range(n)))  # also the `computes` that the dependency functions ask
    inputs = inputs_by_group(progs, first, cid, stages, schedule.micro_batches)
    producer, consumer, stuck = inputs or inputs_by_compute(actions, rank, cid, stages, schedule.ranks)
    computes = list(map(new_op, zip(itertools.repeat(_COMPUTE), range(n))))
    if schedule.is_lowered:
        programs = _number_lowered(schedule, computes, cid, side_ids)
        if schedule.has_pairs:
            programs = [[Op(_PAIR, _partner(a, cid)) if a.kind in PAIRS else op for a, op in zip(prog, ops)]
                        for prog, ops in zip(schedule.programs, programs)]
    else:
        # The lowering rules: a SEND goes right after the compute that made its tensor; the
        # RECV for compute k+1 is posted just before compute k (the first compute's RECV
        # goes first). So rank r runs: RECV(lo)?, then for each compute k: RECV(k+1)?, k, SEND?
        recv_ops = map(new_op, zip(itertools.repeat(_RECV), range(n)))
        recvs = [op if j >= 0 else None for op, j in zip(recv_ops, producer)]
        sends = [None if c < 0 else op for c, op in zip(consumer, map(new_op, zip(itertools.repeat(_SEND), consumer)))]
        programs = []
        for lo, hi in zip(first, first[1:]):
            steps = itertools.chain.from_iterable(zip(recvs[lo + 1:hi] + [None], computes[lo:hi], sends[lo:hi]))
            programs.append(list(filter(None, itertools.chain(recvs[lo:lo + 1], steps))))  # (an Op is never false)
        if side_ids:
            _insert_side(programs, places, first, computes, sends)
        if schedule.has_pairs:
            _insert_pairs(programs, schedule, computes, cid)
    starts = [None if i is None else computes[i] for i in stuck]
    runnable = [len(prog) if op is None else prog.index(op) for prog, op in zip(programs, starts)]
    return Program(schedule, actions, rank, producer, programs, runnable, beside)


def inputs_by_compute(actions: list[Action], rank: list[int], cid: dict, stages: int, ranks: int):
    """Per compute: the compute on another rank whose tensor it takes (`producer`, -1 for
    none) and the one on another rank that takes its result (`consumer`); per rank, the first
    compute that needs the result of a compute later in its own program (`stuck`, or None).
    One call of its kind's dependency function per compute."""
    n = len(actions)
    producer, consumer = [-1] * n, [-1] * n
    stuck: list[int | None] = [None] * ranks
    for i, (s, k, m) in enumerate(actions):
        for d in NEEDS[k](s, m, stages, cid):
            j = cid[d]
            if rank[j] != rank[i]:
                if consumer[j] >= 0:
                    raise AssertionError(f"{actions[j]} feeds two computes on other ranks")
                producer[i], consumer[j] = j, i
            elif j > i and stuck[rank[i]] is None:  # a local input that comes later in the same program
                stuck[rank[i]] = i
    return producer, consumer, stuck


def inputs_by_group(progs, first: list[int], cid: dict, stages: int, micro_batches: int):
    """What `inputs_by_compute` answers, with one call of the dependency function per
    (stage, kind) instead of one per compute, where every (stage, kind) a rank computes has
    every micro-batch; None where one does not (DualPipe's two halves, a partial stage), or
    where the answers are not those of one micro-batch, and then the caller asks per compute.

    The dependency functions (`sim.schedule.kinds`) name the inputs of (s, k, m) among
    the computes of micro-batch m, and ask `computes` only about micro-batch m: so where
    every micro-batch has the same computes, the inputs of (s, k, m) are those of (s, k, 0)
    with m for 0 (`tests/sim/passes/test_numbering.py` checks both ways agree)."""
    micros = range(micro_batches)
    groups: dict[tuple, tuple[list[int], int]] = {}  # (stage, kind) -> its compute ids by micro-batch, its rank
    for r, prog in enumerate(progs):
        for s in set(map(itemgetter(0), prog)):
            for k in set(map(itemgetter(1), prog)):
                ids = list(map(cid.get, zip(itertools.repeat(s), itertools.repeat(k), micros)))
                if ids.count(None) == micro_batches:
                    continue
                if None in ids or min(ids) < first[r] or max(ids) >= first[r + 1]:
                    return None
                groups[s, k] = ids, r
    if sum(len(ids) for ids, _ in groups.values()) != first[-1]:
        return None
    n = first[-1]
    producer_of: dict[int, int] = {}
    consumer_of: dict[int, int] = {}
    stuck: list[int | None] = [None] * (len(first) - 1)
    remote = 0
    for (s, k), (ids, r) in groups.items():
        for d in NEEDS[k](s, 0, stages, cid):
            if d[2] != 0 or d[:2] not in groups:
                return None
            inputs, there = groups[d[:2]]
            if there != r:
                producer_of.update(zip(ids, inputs))
                consumer_of.update(zip(inputs, ids))
                remote += micro_batches
            elif any(map(operator.gt, inputs, ids)):  # a local input that comes later in the same program
                i = min(itertools.compress(ids, map(operator.gt, inputs, ids)))
                stuck[r] = i if stuck[r] is None else min(stuck[r], i)
    if len(consumer_of) != remote:  # a compute feeds two on other ranks: said by `inputs_by_compute`
        return None
    minus = itertools.repeat(-1)
    return list(map(producer_of.get, range(n), minus)), list(map(consumer_of.get, range(n), minus)), stuck


def _take_side(progs, beside: dict[Role, list[Action]], side_ids: dict[Action, Op]):
    """Number the actions beside the device apart, per role (into `beside`, and their Ops
    into `side_ids`); return the programs without them and, per rank, where each stood:
    (number of the rank's computes before it, its Op)."""
    for prog in progs:
        for a in prog:
            if a.kind in BESIDE:
                kept = beside.setdefault(KINDS[a.kind].role, [])
                side_ids[a] = Op(KINDS[a.kind].role, len(kept))
                kept.append(a)
    places = []
    for prog in progs:  # one pass a program, counting its computes as it goes
        done, here = 0, []
        for a in prog:
            if a.kind in BESIDE:
                here.append((done, side_ids[a]))
            done += a.kind in COMPUTE
        places.append(here)
    return [[a for a in prog if a.kind not in BESIDE] for prog in progs], places


def _partner(mark: Action, cid: dict) -> int:
    """The compute id of the backward an OVERLAP_F_B mark names (its F is the compute before)."""
    return cid[(mark.stage, grad_kind(cid, mark.stage, mark.micro), mark.micro)]


def _insert_pairs(programs: list[list[Op]], schedule: Schedule, computes: list[Op], cid: dict) -> None:
    """Put each OVERLAP_F_B mark back right before its F, after the RECVs posted there:
    `Op(PAIR, y)` names the pair's backward y (its F is y - 1)."""
    for r, prog in enumerate(programs):
        marks = {computes[y - 1]: Op(_PAIR, y) for y in (_partner(a, cid) for a in schedule.programs[r]
                                                            if a.kind in PAIRS)}
        if marks:
            prog[:] = [x for op in prog for x in ((marks[op], op) if op in marks else (op,))]


def _number_lowered(schedule: Schedule, computes: list[Op], cid: dict, side_ids: dict[Action, Op]) -> list[list[Op]]:
    """The programs of a lowered schedule as `Op`s, its SENDs and RECVs where they are."""
    def number(a: Action) -> Op:
        role = KINDS[a.kind].role
        if role is _COMPUTE:
            return computes[cid[a]]
        if role is _PAIR:  # numbered by the caller
            return None
        if role is not _SEND and role is not _RECV:  # beside the device
            return side_ids[a]
        recv = peer_key(*a) if role is _SEND else a  # the RECV: its consumer names the transfer
        return Op(role, cid[recv_consumer(*recv, cid)])

    return [list(map(number, prog)) for prog in schedule.programs]


def _insert_side(programs: list[list[Op]], places, first: list[int], computes: list[Op], sends) -> None:
    """Put each action beside the device back after the compute it followed (and that compute's
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
