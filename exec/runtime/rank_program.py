"""One rank's part of the compiled program (`sim.compile`), as the interpreter runs it: its actions in order, each compute's wait, each transfer's peer and tag.

`sim.compile(schedule, backend)` numbers every compute and transfer of the step and puts
each rank's SENDs and RECVs where the rules place them (`sim.engine.program.Program`);
exec runs that program as it is. `rank_program(program, rank)` reads rank `rank`'s part
out of its numbers, without asking the schedule again:

    >>> import sim
    >>> p = rank_program(sim.compile(sim.make_schedule("1f1b", 2, 2), "gloo"), 1)
    >>> [str(a) for a in p.actions]
    ['1RECV_F0', '1F0', '1RECV_F1', '1B0', '1SEND_B0', '1F1', '1B1', '1SEND_B1']
    >>> [str(r) for r in p.waits[sim.Action(1, sim.Kind.F, 0)]], p.routes[sim.Action(1, sim.Kind.SEND_B, 0)]
    (['1RECV_F0'], Route(peer=0, tag=2))

- `actions`: the rank's actions in the compiled order;
- `waits[a]`: the RECVs whose data compute `a` waits for (the one transfer the program
  numbers by `a`, where its input comes from another rank; none otherwise);
- `routes[a]`: a SEND's or RECV's peer (the schedule's rank) and its tag: the transfer's
  number in the program (a transfer is numbered by the compute that receives it), the
  same on both ranks;
- `pairs[a]`: the backward an OVERLAP_F_B mark names.

`waits_of(program, i)` is compute i's wait, and `sends_to_recvs(program)` pairs every
SEND with its RECV, for the step's record.
"""
from __future__ import annotations

from typing import NamedTuple

from sim import Action
from sim.engine.program import Program
from sim.schedule.kinds import Role

__all__ = ["Route", "RankProgram", "rank_program", "waits_of", "sends_to_recvs", "compiled"]


class Route(NamedTuple):
    """Where a SEND goes or a RECV comes from: the schedule's rank of the other side, and
    the tag both sides use (the transfer's number in the program)."""

    peer: int
    tag: int


class RankProgram(NamedTuple):
    """One rank's part of a compiled `Program` (see the module's docstring)."""

    rank: int
    actions: list[Action]
    waits: dict[Action, list[Action]]
    routes: dict[Action, Route]
    pairs: dict[Action, Action]


def rank_program(program: Program, rank: int) -> RankProgram:
    """Rank `rank`'s actions, waits, routes and pair marks, read off `program`'s numbers."""
    actions: list[Action] = []
    waits: dict[Action, list[Action]] = {}
    routes: dict[Action, Route] = {}
    pairs: dict[Action, Action] = {}
    for op in program.programs[rank]:
        a = program.action(op)
        actions.append(a)
        role, i = op
        if role is Role.COMPUTE:
            waits[a] = waits_of(program, i)
        elif role is Role.SEND:   # transfer i goes to the rank of compute i
            routes[a] = Route(program.rank[i], i)
        elif role is Role.RECV:   # transfer i comes from the rank of its producer
            routes[a] = Route(program.rank[program.producer[i]], i)
        elif role is Role.PAIR:   # the mark names its backward, compute i
            pairs[a] = program.actions[i]
    return RankProgram(rank, actions, waits, routes, pairs)


def waits_of(program: Program, i: int) -> list[Action]:
    """The RECVs compute i waits for: the one transfer the program numbers by it, where its
    input comes from another rank (a compute takes at most one), else none."""
    return [program.comm_action(i, sending=False)] if program.producer[i] >= 0 else []


def sends_to_recvs(program: Program) -> dict[Action, Action]:
    """Every transfer's SEND action -> its RECV action."""
    return {program.comm_action(t, sending=True): program.comm_action(t, sending=False)
            for t, producer in enumerate(program.producer) if producer >= 0}


def compiled(program, backend: str) -> Program:
    """`program` if it is a `Program` compiled for a run on `backend`, else a one-line error
    (TypeError for a schedule, ValueError for the wrong target): exec runs what
    `sim.compile(schedule, backend)` made, and checks nothing of the schedule again."""
    if not isinstance(program, Program):
        raise TypeError(f"exec runs a compiled program, not a {type(program).__name__}; pass "
                        f"sim.compile(schedule, {backend!r})")
    if program.target not in ("gloo", "nccl") or (backend == "nccl" and program.target != "nccl"):
        raise ValueError(f"schedule {program.schedule.name!r} was compiled for {program.target!r}, not for a run on "
                         f"{backend}; pass sim.compile(schedule, {backend!r})"
                         + (" (NCCL pairs a rank's transfers by order, rule 12)" if backend == "nccl" else ""))
    return program
