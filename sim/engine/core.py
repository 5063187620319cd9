"""The discrete-event engine: each device runs its lowered program, on SimPy where the order of things at one time matters.

It obeys the rules of docs/rules.md, cited in this module by their numbers there (`exec`
honours the same ones): a device runs its actions in program order (rule 1); a SEND is
issued right after the compute that made its tensor and a RECV only posts the receive, one
compute early, each holding the device for its call (rules 2, 3); a compute starts once it
is reached and its remote input has arrived and been taken in (rules 3, 4); transfers
rendezvous (rule 5), a late notice waiting for the sender's transport thread (rule 10), and
then take their link, first come first served (rule 6); memory is held from F to the end
of the backward (rule 7); the step ends with its last compute or collective (rule 8); the
runtime holds the device around each compute (rule 11); collectives run on the rank's
stream (rule 13) and copies on its two copy engines (rule 14), beside the device: one
class per role, `sim.engine.resources.RESOURCES`.

The engine knows actions, devices and links: the devices' loops are `sim.engine.devices`,
the links `sim.engine.links`; the transport (`Costs.transport`, see `sim.engine.transports`)
decides when a transfer leaves its sender and what the calls cost the two ends, and the
action-kind table (`sim.schedule.kinds`) what each compute costs and does to memory.

The engine runs a compiled `sim.engine.program.Program` (`sim.compile` makes one); it
compiles nothing and checks nothing itself: `sim.simulate` compiles, runs and explains.
How it stays fast (docs/performance.md): it runs the numbered program, not `Action`
objects, with each compute's costs worked out before the run (`compute_costs`,
`channels`). Where neither the transport nor the links depend on the order of
things at one time, the devices run ahead of any clock, without SimPy
(`sim.engine.devices.run_ahead`); elsewhere a compute whose input's arrival is known waits
and computes in one timeout, and a transfer is an event only when its receiver already
waits for it. Link queueing needs no process: each link keeps the time it is next free. A
run that stops with ranks unfinished is a deadlock: `Run.finished` says which ranks got
through, and the caller explains it (`sim.passes.validation.check_deadlock`).
"""
from __future__ import annotations

import itertools
import operator
from operator import itemgetter
from typing import Mapping

import simpy

from .costs import StageCosts, first_excess, pair_times  # noqa: F401  (first_excess: exec.profiler reads it here)
from sim.schedule.ir import Action
from sim.schedule.kinds import KINDS, Role
from sim.schedule.liveness import change
from .devices import NEVER, Devices, run_ahead, run_with_simpy
from .links import Links
from .program import Program
from .resources import RESOURCES, Resource, merge_memory
from .result import Event, Result
from .transports import Transport, transport_class

_COMPUTE, _PAIR = Role.COMPUTE, Role.PAIR


def run(p: Program, c: StageCosts, durations: Mapping[Action, float] | None = None) -> "Run":
    """Run a compiled program under `c` (`durations`: compute action -> time, overriding
    their costs). Return the `Run` record, stuck ranks and all."""
    computes = compute_costs(p, c)
    if durations:
        computes[0] = [durations.get(a, d) for a, d in zip(p.actions, computes[0])]
    channel = channels(p, c)
    transport: Transport = transport_class(c.transport)(c)
    # Run ahead of SimPy where neither the transport nor the links depend on the order in
    # which things happen at one time: no device watching, free links (`sim.engine.devices`).
    ahead = not transport.watches_devices and not any(hold for _, hold in channel.values())
    if ahead:
        links = Links(None, p, c)
    else:
        links = Links(simpy.Environment(), p, c, *per_transfer(p, channel), len({n for n, _ in channel.values()}))
    gated = any(RESOURCES[role].gates_computes for role in p.beside)
    ready = [0.0] * len(p.actions) if gated else None  # per compute: when its resources let it start
    resources = {role: RESOURCES[role](p, c, durations, ready) for role in p.beside}
    for res in resources.values():
        res.check_transport(transport)
    transport.prepare(p, computes[0])
    devices = Devices(links, transport, c, tuple(computes), resources, ready, ahead)
    if ahead:
        run_ahead(devices)
    else:
        run_with_simpy(devices, links.env)
    return Run(p, links, devices, list(resources.values()), held_over_time(p, c, devices, computes, resources))


def compute_costs(p: Program, c: StageCosts) -> list[list]:
    """Per compute id: its duration (its kind's cost field, and its `comm` field unless an
    overlapped pair hides it: rule 18) and what it does to memory at its start and at its
    end ((bytes, micro-batches) or None; `sim.schedule.kinds`), as three lists. They are as
    long as the schedule, so they are built with map and zip, from values worked out once
    per (stage, kind)."""
    by_kind = {}
    for k, spec in KINDS.items():
        if spec.role is _COMPUTE:
            comm = getattr(c, spec.comm) if spec.comm else itertools.repeat(0.0)
            for s, (t, a2a) in enumerate(zip(getattr(c, spec.cost), comm)):
                by_kind[s, k] = (t + a2a, change(k, "start", c, s), change(k, "end", c, s))
    per = list(map(by_kind.__getitem__, map(itemgetter(0, 1), p.actions)))
    dur, at_start, at_end = (list(map(itemgetter(i), per)) for i in range(3))
    if p.schedule.has_pairs:
        pair_durations(p, c, dur)
    return [dur, at_start, at_end]


def pair_durations(p: Program, c: StageCosts, dur: list) -> None:
    """The two computes of each overlapped pair take their shares of its time (rule 18:
    `sim.engine.costs.pair_times`): an `Op(PAIR, y)` names the backward y, its F is y - 1."""
    for prog in p.programs:
        for role, y in prog:
            if role is _PAIR:
                (sf, _, _), (sb, kb, _) = p.actions[y - 1], p.actions[y]
                back = KINDS[kb]
                dur[y - 1], dur[y] = pair_times(c.forward[sf], c.a2a_forward[sf],
                                                getattr(c, back.cost)[sb], getattr(c, back.comm)[sb])


def channels(p: Program, c: StageCosts) -> dict[tuple[int, int], tuple[int, float]]:
    """Per pair of stages that a transfer joins (sending stage, receiving stage): its link,
    numbered per sending rank -> receiving rank, and the time a transfer holds it. A
    transfer's link and hold time depend only on the stages at its two ends, so they are
    worked out once per pair."""
    stage = list(map(itemgetter(0), p.actions))
    ends = {(stage[j], d) for d, j in zip(stage, p.producer) if j >= 0}
    links: dict[tuple[int, int], int] = {}   # (sending rank, receiving rank) -> link number
    out = {}
    for s, d in sorted(ends):
        number = links.setdefault((p.placement[s], p.placement[d]), len(links))
        # the tensor between stages s and s+1 has the size of stage s's output
        out[s, d] = (number, c.transfer_time(c.activation_bytes_sent[min(s, d)]))
    return out


def per_transfer(p: Program, channel: dict[tuple[int, int], tuple[int, float]]) -> tuple[list[int], list[float]]:
    """Per transfer (named by the compute that receives it): its link and the time it holds
    it (`channels`); 0 and 0.0 for a compute that receives nothing."""
    link, busy = [0] * len(p.actions), [0.0] * len(p.actions)
    for t, j in enumerate(p.producer):
        if j >= 0:
            link[t], busy[t] = channel[p.actions[j].stage, p.actions[t].stage]
    return link, busy


def held_over_time(p: Program, c: StageCosts, devices: Devices, computes: list[list], resources: dict[Role, Resource]):
    """Per rank, its memory (time, bytes) and the activations it holds (time, micro-batches)
    over the run: its stages' static bytes, the changes of the computes it ran (`changes`)
    and those of its actions beside the device."""
    static = [0.0] * p.ranks
    for s, r in enumerate(p.placement):
        static[r] += c.static_total(s)
    _, at_start, at_end = computes
    logs = [changes(devices.start, devices.end, at_start, at_end, ids) for ids in devices.computes_of]
    memory, activations = zip(*(_series(*log, held) for log, held in zip(logs, static))) if logs else ((), ())
    memory = [merge_memory(series, [x for res in resources.values() for x in res.changes[r]])
              for r, series in enumerate(memory)]
    return memory, list(activations)


def changes(start: list[float], end: list[float], at_start: list, at_end: list, ids: range) -> tuple[list, list]:
    """What the computes `ids` of one rank (in program order) did to its memory (rule 7): a
    compute takes its `at_start` change ((bytes, micro-batches), or None) at its start and
    its `at_end` change at its end. Returns the times and the changes, in order, up to the
    first compute that did not run (start `NEVER`: a stuck rank's)."""
    lo, hi = ids.start, ids.stop
    hi -= start[lo:hi].count(NEVER)  # a rank runs a prefix of its computes
    deltas = list(itertools.chain.from_iterable(zip(at_start[lo:hi], at_end[lo:hi])))
    some = list(map(operator.is_not, deltas, itertools.repeat(None)))
    times = itertools.chain.from_iterable(zip(start[lo:hi], end[lo:hi]))
    return list(itertools.compress(times, some)), list(itertools.compress(deltas, some))


def _series(times: list[float], deltas: list[tuple], static: float) -> tuple[list, list]:
    """A rank's memory (bytes) and activations held (micro-batches) over time, from the
    times and (bytes, micro-batches) of its changes, starting at (0, static bytes) and (0, none)."""
    times = [0.0, *times]
    held_bytes = itertools.accumulate(map(itemgetter(0), deltas), initial=static)
    held = itertools.accumulate(map(itemgetter(1), deltas), initial=0)
    return list(zip(times, held_bytes)), list(zip(times, held))


class Run:
    """What a run recorded, as flat lists indexed by compute id (a transfer is numbered by
    the compute that receives it), with each rank's memory and activations over time,
    busy time and whether it finished its program (not all ranks do where they got
    stuck: a deadlock, which the caller explains). `result()` makes the `Result`; its
    `Event` records are made from these lists only on demand."""

    def __init__(self, p: Program, links: Links, devices: Devices, resources: list[Resource], held):
        self.program, self.resources = p, resources
        self.start, self.end, self.busy, self.finished = devices.start, devices.end, devices.busy, devices.finished
        self.sent, self.posted, self.arrive = links.sent, links.posted, links.arrive_at
        self.memory, self.activations = held

    def events(self) -> list[Event]:
        """One record per compute, per action beside the devices, and per SEND and RECV."""
        p = self.program
        out = [Event(r, a, s, e) for r, a, s, e in zip(p.rank, p.actions, self.start, self.end)]
        for res in self.resources:
            out += res.events(p.placement)
        for t, j in enumerate(p.producer):
            if j >= 0:
                out.append(Event(p.rank[j], p.comm_action(t, True), self.sent[t], self.arrive[t], p.rank[t]))
                out.append(Event(p.rank[t], p.comm_action(t, False), self.posted[t], self.arrive[t], p.rank[j]))
        return out

    def result(self) -> Result:
        """The step as a `Result` (a run whose ranks all finished). It runs from the first
        action's start (each rank's first: 0 for a RECV post, else its first compute's,
        after the runtime's own time before it) to the last compute's end, or the last end
        of a resource that ends the step (a collective): every transfer feeds a compute
        that starts after it arrives."""
        t0 = min((self.start[prog[0].index] if prog[0].role is _COMPUTE else 0.0
                  for prog in self.program.programs if prog), default=0.0)
        computed = max(self.end, default=0.0)
        last = max([computed, *(max(res.end, default=0.0) for res in self.resources if res.ends_step)])
        return Result(self.program, self.events, self.memory, self.activations,
                      makespan=last - t0, busy=self.busy, t0=t0, compute_end=computed)
