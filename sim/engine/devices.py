"""The devices of one engine run: each runs its rank's program in order, one named step per action (docs/rules.md, rules 1-4, 11 and 19).

A device's loop (`Devices.run`) reads its next `Op` and takes the step of its role:
`post` a RECV (rule 3), `issue` a SEND (rule 2), wait for a compute's input and `compute`
it (rules 4, 11, 19), wait at an overlapped pair's mark (`pair_mark`, rule 18), or hand
an action to its resource beside the device (rules 13, 14, 16: `sim.engine.resources`).
The transport's hooks take the SENDs and RECVs (`sim.engine.transports`); the links say
when data arrives (`sim.engine.links`).

A loop is a generator that yields only to wait: for data that has not left yet (what
`Links.wait` gives), or, in step with SimPy, for the time an action holds the rank. Two
drivers run the loops (`sim.engine.core.run` picks one):

- `run_with_simpy`: one SimPy process per device, which waits for each action's time.
  Needed where the order of things at one time matters: a transport that watches what
  a sender does when a notice comes in (rule 10), or links that queue (rule 6).
- `run_ahead`: where neither does, when a transfer leaves is the later of its SEND and
  its notice, whichever the engine learns first. A device then keeps its own clock and
  stops only for data that has not left yet; a plain loop runs each device until it
  waits, and the data's leaving (`Links.leave`) wakes it. No SimPy event at all.
"""
from __future__ import annotations

import bisect
import functools
import operator

import simpy

from sim.schedule.kinds import Role
from .costs import StageCosts, first_excess
from .links import Links
from .resources import Resource
from .transports import Transport

INF = float("inf")
NEVER = -1.0  # the start and end of a compute that did not run (a stuck rank's)
# Hot loops name the roles by module globals: `Role.COMPUTE` is an attribute lookup on an Enum class.
_COMPUTE, _RECV, _SEND, _PAIR = Role.COMPUTE, Role.RECV, Role.SEND, Role.PAIR


class Devices:
    """The devices of one run and what they record: each compute's start and end, each
    rank's busy time and whether it finished."""

    def __init__(self, links: Links, transport: Transport, c: StageCosts, computes: tuple[list, list, list],
                 resources: dict[Role, Resource], ready: list[float] | None, ahead: bool):
        p = links.program
        n, ranks = len(p.actions), p.ranks
        self.links, self.program, self.resources, self.ahead = links, p, resources, ahead
        self.free_until, self.held_until, self.resume = links.free_until, links.held_until, links.resume
        self.sent, self.posted, self.at_yield = links.sent, links.posted, links.at_yield
        self.on_send, self.on_post = transport.bind(links)     # the transport's hooks
        self.send_call, self.recv_call = transport.send_call, transport.recv_call  # how long a call holds its rank
        self.take_in = transport.take_in                        # taking arrived data in, before the compute
        self.watched = transport.watches_devices                # whether it reads held_until and resume
        self.before, self.after = c.before_compute, c.after_compute  # the runtime's time around a compute (rule 11)
        self.first = [c.first_compute] * ranks                  # what each rank's first compute takes more (rule 19)
        self.first_tau = c.first_compute_tau
        self.dur, self.at_start, self.at_end = computes         # per compute: its time, its memory change at start and end
        self.ready = ready                                      # per compute: when its resources let it start (or None)
        self.start, self.end = [NEVER] * n, [NEVER] * n         # per compute (NEVER: it did not run)
        first = [bisect.bisect_left(p.rank, r) for r in range(ranks + 1)]  # computes are numbered rank by rank
        self.computes_of = [range(lo, hi) for lo, hi in zip(first, first[1:])]  # per rank: its compute ids
        self.busy, self.finished = [0.0] * ranks, [False] * ranks

    def run(self, r: int):
        """The loop of device r: each action's step in program order, up to where the rank
        is stuck for good (`Program.runnable`; a rank that waits forever never ends)."""
        links, ahead = self.links, self.ahead
        producer, arrive_at, at_yield = self.program.producer, links.arrive_at, links.at_yield[r]
        compute, post, issue, resources = self.compute, self.post, self.issue, self.resources
        timeout = links.env.timeout if not ahead else None
        prog, runnable = self.program.programs[r], self.program.runnable[r]
        now = links.env.now if not ahead else 0.0
        for i, (role, x) in enumerate(prog if runnable == len(prog) else prog[:runnable], 1):
            if role is _COMPUTE:
                at = None
                if producer[x] >= 0:  # its input comes from another rank (rule 4)
                    if at_yield:      # it yields the core to wait for or take in its input
                        links.yielded(r, now)
                    at = arrive_at[x]
                    if at is None:    # the data has not left yet: the rank waits (rule 10)
                        yield links.wait(r, x)
                        at = arrive_at[x]
                        if not ahead:
                            now = at
                until = compute(r, x, i, now, at)
                if ahead:
                    now = until
                else:
                    yield timeout(until - now)
                    now = links.env.now
            elif role is _RECV or role is _SEND:
                hold = post(r, x, now) if role is _RECV else issue(r, x, now)
                if hold:  # the call holds the rank
                    links.held_until[r], links.resume[r] = now + hold, i
                    if ahead:
                        now += hold
                    else:
                        yield timeout(hold)
                        now = links.env.now
            elif role is _PAIR:
                now = yield from self.pair_mark(r, x, now)
            else:  # a collective, a copy or a gather: beside the device, which goes on
                resources[role].issue(r, x, now)
        self.finish(r, now, runnable == len(prog))

    def post(self, r: int, x: int, now: float) -> float:
        """Rank r posts the RECV of transfer x at `now` (rule 3); returns how long the call
        holds it."""
        self.posted[x] = now
        self.on_post(x, now)
        return self.recv_call

    def issue(self, r: int, x: int, now: float) -> float:
        """Rank r issues the SEND of transfer x at `now` (rule 2), yielding the core before the
        call (rule 9): the transport decides when the data leaves. Returns how long the call
        holds the rank."""
        self.sent[x] = self.free_until[r] = now
        if self.at_yield[r]:
            self.links.yielded(r, now)
        self.on_send(x, now)
        return self.send_call

    def compute(self, r: int, x: int, i: int, now: float, at: float | None) -> float:
        """Rank r runs compute x (the i-th action of its program), reached at `now`, its input
        from another rank arrived at `at` (None: it has none). It starts once that input is
        taken in, after the runtime's own time before it (rule 11; the first compute of the
        step takes more, rule 19) and once its resources let it (a RELOAD, rule 14). Returns
        when the rank is free again, after the runtime's time after it. (What it does to
        memory, rule 7, is read off its start and end after the run: `sim.engine.core.held_over_time`.)"""
        start = now
        if at is not None:
            self.free_until[r] = start = (at if at > start else start) + self.take_in
        start = start + self.before
        if self.first[r]:
            start, self.first[r] = start + first_excess(self.first[r], self.first_tau, self.dur[x]), 0.0
        if self.ready is not None and self.ready[x] > start:
            start = self.ready[x]
        end = self.end[x] = start + self.dur[x]
        self.start[x] = start
        if self.watched:
            self.held_until[r], self.resume[r] = end + self.after, i
        return end + self.after

    def pair_mark(self, r: int, y: int, now: float):
        """The mark of an overlapped pair whose backward is compute y (rule 18): rank r waits
        here until the backward's input has arrived, and then goes on to the pair's F
        (compute y - 1), which takes its own input as any compute does. Returns the rank's
        clock."""
        links = self.links
        if self.program.producer[y] < 0:
            return now
        if links.at_yield[r]:
            links.yielded(r, now)
        at = links.arrive_at[y]
        if at is None:
            yield links.wait(r, y)
            at = links.arrive_at[y]
            if not self.ahead:
                now = at
        links.free_until[r] = at if at > now else now  # it waits for the data: its transport thread runs
        if at > now:
            if not self.ahead:
                yield links.env.timeout(at - now)
            now = at
        return now

    def finish(self, r: int, now: float, finished: bool) -> None:
        """Rank r is done with its program (or with what it can run of it): it waits for its
        sends, its transport thread free. Its busy time: its computes' times, added in
        program order (one that did not run adds 0)."""
        self.links.free_until[r] = INF
        self.links.yielded(r, now)
        ids = self.computes_of[r]
        self.busy[r] = functools.reduce(operator.add, map(operator.sub, self.end[ids.start:ids.stop],
                                                          self.start[ids.start:ids.stop]), 0.0)
        self.finished[r] = finished


def run_with_simpy(devices: Devices, env: simpy.Environment) -> None:
    """Run every device as a SimPy process until none can go on."""
    for r in range(devices.program.ranks):
        env.process(devices.run(r))
    env.run()


def run_ahead(devices: Devices) -> None:
    """Run every device on its own clock until none can go on: each runs until it waits for
    a transfer, and the transfer's leaving wakes it (`Links.woken`)."""
    loops = [devices.run(r) for r in range(devices.program.ranks)]
    woken = devices.links.woken
    woken.extend(reversed(range(len(loops))))
    while woken:
        for _ in loops[woken.pop()]:  # to the rank's next wait, or to its end
            break
