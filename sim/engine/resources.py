"""What runs beside the devices, one class per role: each rank's collective stream, its two copy engines and its all-gather stream, in a table keyed by role.

A device issues an action of such a role in program order and goes on with its program
(docs/rules.md, rules 13, 14 and 16); the action runs on its rank's resource of that role.
The engine (`sim.engine.core`) asks `RESOURCES[role]` for the class, makes one per run
that has actions of the role (`Program.beside[role]`), and calls `issue` when a device
reaches one: the DeepSpeed pipeline engine's idea of a map from instruction type to
handler, so that a new role is one class and one entry here (docs/performance.md, "How to
add a role").

A `Resource` keeps when each of its actions starts and ends and what they do to their
rank's memory (their kind's `memory` effects, at their own start and end:
`sim.schedule.liveness`); one whose actions a compute waits for (a RELOAD's backward)
sets `gates_computes` and raises `ready[compute]` to when it lets the compute start.
"""
from __future__ import annotations

from typing import Mapping

from sim.schedule.ir import Action
from sim.schedule.kinds import KINDS, Kind, Role, recv_consumer
from sim.schedule.liveness import memory_delta
from .result import Event

__all__ = ["Resource", "CollectiveStream", "CopyEngines", "Gathers", "RESOURCES", "merge_memory"]


class Resource:
    """The actions of one role beside the devices, in a run: each starts once `issue`
    says it was reached and its resource is free. `ends_step`: the step lasts until the
    last of them ends (rule 8). `gates_computes`: a compute may wait for one of them."""

    role: Role
    ends_step = False
    gates_computes = False

    def __init__(self, program, costs, durations: Mapping[Action, float] | None, ready: list[float] | None):
        self.actions = program.beside[self.role]
        self.dur = [getattr(costs, KINDS[a.kind].cost)[a.stage] if KINDS[a.kind].cost else 0.0 for a in self.actions]
        if durations:
            self.dur = [durations.get(a, d) for a, d in zip(self.actions, self.dur)]
        self.effect = [(memory_delta(a.kind, "start", costs, a.stage), memory_delta(a.kind, "end", costs, a.stage))
                       for a in self.actions]
        self.start, self.end = [0.0] * len(self.actions), [0.0] * len(self.actions)
        self.ready = ready  # per compute: the earliest start its resources allow (gates_computes)
        self.changes: list[list] = [[] for _ in range(program.ranks)]  # per rank: (time, order, bytes)

    def check_transport(self, transport) -> None:
        """Refuse a transport model this role cannot run under (ValueError)."""

    def issue(self, r: int, x: int, now: float) -> None:
        """Rank r reaches action x at `now`."""
        raise NotImplementedError

    def ran(self, r: int, x: int, begin: float, end: float) -> None:
        """Record that action x of rank r ran from `begin` to `end`, and what it did to
        the rank's memory: at one time, after the computes' changes where it takes bytes,
        before them where it gives bytes back."""
        self.start[x], self.end[x] = begin, end
        take, give = self.effect[x]
        if take:
            self.changes[r].append((begin, 2, take))
        if give:
            self.changes[r].append((end, 0, give))

    def events(self, placement) -> list[Event]:
        return [Event(placement[a.stage], a, s, e) for a, s, e in zip(self.actions, self.start, self.end)]


class CollectiveStream(Resource):
    """Each rank's collective stream (rule 13): one collective at a time, in the order
    they are issued (NCCL's one communication stream)."""

    role = Role.COLLECTIVE
    ends_step = True

    def __init__(self, program, costs, durations, ready):
        super().__init__(program, costs, durations, ready)
        self.free = [0.0] * program.ranks  # when each rank's stream is free

    def issue(self, r: int, x: int, now: float) -> None:
        begin = self.free[r] if self.free[r] > now else now
        self.free[r] = begin + self.dur[x]
        self.ran(r, x, begin, self.free[r])


class CopyEngines(Resource):
    """Each rank's two copy engines (rule 14): device to host and host to device, one copy
    at a time each; a RELOAD starts after its OFFLOAD's end, and the backward it feeds
    waits for its end."""

    role = Role.COPY
    gates_computes = True

    def __init__(self, program, costs, durations, ready):
        super().__init__(program, costs, durations, ready)
        self.engine = [0 if KINDS[a.kind].stream == "to host" else 1 for a in self.actions]
        self.free = [[0.0, 0.0] for _ in range(program.ranks)]  # per rank: when each copy engine is free
        # per copy: the copy whose end it waits for (a RELOAD's OFFLOAD), the compute that
        # waits for its end (a RELOAD's B or I); -1 where there is none
        cid = dict(zip(program.actions, range(len(program.actions))))
        copy_id = {a: y for y, a in enumerate(self.actions)}
        self.after = [copy_id.get(Action(*KINDS[a.kind].needs(a.stage, a.micro, 0, cid)[0]), -1) for a in self.actions]
        self.feeds = [cid.get(recv_consumer(*a, cid), -1) if KINDS[a.kind].feeds else -1 for a in self.actions]

    def check_transport(self, transport) -> None:
        if transport.watches_devices:
            raise ValueError("a schedule with OFFLOAD/RELOAD (copies to host memory, a GPU's) cannot run under "
                             "Costs.io_tick > 0 (a CPU rank's I/O thread, rule 10); set io_tick=0")

    def issue(self, r: int, y: int, now: float) -> None:
        """It runs on its engine once that is free (and, for a RELOAD, its OFFLOAD has ended)."""
        free, k = self.free[r], self.engine[y]
        begin = max(now, free[k], self.end[self.after[y]] if self.after[y] >= 0 else 0.0)
        end = free[k] = begin + self.dur[y]
        self.ran(r, y, begin, end)
        if self.feeds[y] >= 0 and self.ready[self.feeds[y]] < end:
            self.ready[self.feeds[y]] = end


class Gathers(Resource):
    """Each rank's all-gather stream (rule 16): FSDP's UNSHARDs, one at a time in the order
    they are issued (FSDP2 all-gathers on a stream of its own); the computes of the stage
    that follow an UNSHARD on its rank, up to the stage's next RESHARD, wait for its end.
    A RESHARD takes no time: the gathered parameters go when the device reaches it."""

    role = Role.GATHER
    gates_computes = True

    def __init__(self, program, costs, durations, ready):
        super().__init__(program, costs, durations, ready)
        self.free = [0.0] * program.ranks  # when each rank's all-gather stream is free
        self.unshard = [a.kind is Kind.UNSHARD for a in self.actions]
        self.feeds: list[list[int]] = [[] for _ in self.actions]  # per UNSHARD: the computes that wait for it
        self.gather_of = [-1] * len(self.actions)                  # per RESHARD: the UNSHARD it ends
        for prog in program.programs:
            open_: dict[int, int] = {}  # stage -> its UNSHARD not resharded yet
            for role, x in prog:
                if role is Role.COMPUTE and program.actions[x].stage in open_:
                    self.feeds[open_[program.actions[x].stage]].append(x)
                elif role is Role.GATHER:
                    stage = self.actions[x].stage
                    if self.unshard[x]:
                        open_[stage] = x
                    else:
                        self.gather_of[x] = open_.pop(stage, -1)

    def issue(self, r: int, x: int, now: float) -> None:
        if not self.unshard[x]:  # RESHARD: now, or once its gather has ended if that is later
            g = self.gather_of[x]
            end = now if g < 0 or self.end[g] <= now else self.end[g]
            return self.ran(r, x, end, end)
        begin = self.free[r] if self.free[r] > now else now
        end = self.free[r] = begin + self.dur[x]
        self.ran(r, x, begin, end)
        ready = self.ready
        for c in self.feeds[x]:
            if ready[c] < end:
                ready[c] = end


# role -> the class that runs its actions beside the devices (a new role: one class, one entry)
RESOURCES: dict[Role, type[Resource]] = {
    Role.COLLECTIVE: CollectiveStream, Role.COPY: CopyEngines, Role.GATHER: Gathers}


def merge_memory(series: list, changes: list) -> list:
    """A rank's memory series (time, bytes) with the changes of its actions beside it
    ((time, order, bytes): order 0 before the computes' changes at that time, 2 after)."""
    if not changes:
        return series
    steps = [(series[0][0], -1, series[0][1])]
    steps += [(t, 1, b - prev) for (_, prev), (t, b) in zip(series, series[1:])]
    held, out = 0.0, []
    for t, _, change in sorted(steps + changes, key=lambda x: x[:2]):
        held += change
        out.append((t, held))
    return out
