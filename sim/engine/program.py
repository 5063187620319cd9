"""The compiled program the engine runs: a schedule's computes, transfers and the actions beside the device, as numbers.

`sim.passes.numbering.number_program` makes one and `sim.passes.compile.compile` returns it;
the engine (`sim.engine.core`) runs it without making an `Action` per step, and
`Program.lowered` writes it out as the lowered `Schedule` (its SEND and RECV actions)
for figures, `exec` and the reader.
"""
from __future__ import annotations

from functools import partial
from typing import Mapping, NamedTuple, Sequence

from sim.schedule.ir import Action, Schedule
from sim.schedule.kinds import KINDS, Kind, Role

# Hot loops name the roles by these module globals: `Role.COMPUTE` is an attribute lookup
# on an Enum class, several times slower than a global.
_COMPUTE, _SEND, _RECV, _PAIR = Role.COMPUTE, Role.SEND, Role.RECV, Role.PAIR

__all__ = ["Op", "Program", "new_op"]


class Op(NamedTuple):
    """One step of a rank's program in a `Program`: its role, and the compute it runs
    (`index` = compute id), the transfer whose SEND it issues or whose RECV it posts
    (`index` = transfer id: a transfer is numbered by the compute that receives it), the
    action beside the device it issues (`index` into `Program.beside[role]`), or the mark
    of an overlapped pair (`index` = the compute id of its backward; its F is index - 1)."""

    role: Role
    index: int


new_op = partial(tuple.__new__, Op)  # Op(*t) without a Python call per op


class Program(NamedTuple):
    """A lowered schedule in numbers, as the engine runs it.

    Computes are numbered in program order over the ranks. A compute takes at most one
    tensor from another rank and gives its result to at most one compute on another rank
    (see `sim.schedule.kinds`), so a transfer is numbered by the compute that receives it.

    - schedule: the schedule that was numbered (compute-only, or lowered)
    - actions[i], rank[i]: compute i and its rank
    - producer[i]: the compute on another rank whose tensor compute i receives, or -1
    - programs[r]: rank r's program, as `Op` records
    - runnable[r]: how far rank r gets: the index in programs[r] of the first compute that
      needs the result of a compute later in its own program, where it is stuck for good
      (len(programs[r]) if there is none)
    - beside[role]: the actions of that role that run beside the device (collectives,
      copies: `sim.schedule.kinds.BESIDE`), numbered in program order over the ranks; an
      `Op` of that role names one by its number
    - target: what it was compiled for (`sim.passes.compile.TARGETS`): "gloo" and "nccl"
      programs passed the deadlock check, "nccl" ones post each rank's RECVs in the order
      their peer sends
    """

    schedule: Schedule
    actions: list[Action]
    rank: list[int]
    producer: list[int]
    programs: list[list[Op]]
    runnable: list[int]
    beside: Mapping[Role, Sequence[Action]]
    target: str = "sim"

    @property
    def placement(self) -> tuple[int, ...]:
        return self.schedule.placement

    @property
    def ranks(self) -> int:
        return self.schedule.ranks

    @property
    def stages(self) -> int:
        return self.schedule.stages

    def comm_action(self, t: int, sending: bool) -> Action:
        """The SEND (on the producer's rank) or the RECV (on the consumer's) of transfer t."""
        c, spec = self.actions[t], KINDS[self.actions[self.producer[t]].kind]
        if sending:
            return Action(self.actions[self.producer[t]].stage, spec.send, c.micro)
        return Action(c.stage, spec.recv, c.micro)

    def action(self, op: Op) -> Action:
        """The action that `op` stands for."""
        role, x = op
        if role is _COMPUTE:
            return self.actions[x]
        if role is _SEND or role is _RECV:
            return self.comm_action(x, role is _SEND)
        if role is _PAIR:  # the mark of an overlapped pair names its backward x
            return Action(self.actions[x].stage, Kind.OVERLAP_F_B, self.actions[x].micro)
        return self.beside[role][x]

    def lowered(self) -> Schedule:
        """The program written out as a lowered `Schedule`: every action, its SENDs and
        RECVs where the numbering put them (the schedule itself where it was lowered)."""
        s = self.schedule
        if s.is_lowered:
            return s
        return s.with_programs(list(map(self.action, prog)) for prog in self.programs)
