"""The discrete-event engine: one SimPy process per device runs its lowered program.

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

The engine knows actions, devices and links; the transport (`Costs.transport`, see
`sim.engine.transports`) decides when a transfer leaves its sender and what the calls cost the
two ends, and the action-kind table (`sim.schedule.kinds`) what each compute costs and does to
memory.

The engine runs a compiled `sim.engine.program.Program` (`sim.compile` makes one); it
compiles nothing and checks nothing itself: `sim.simulate` compiles, runs and explains.
How it stays fast (docs/performance.md): it runs the numbered program, not `Action`
objects. A compute whose input's arrival time is known waits and computes in one
timeout; a transfer is an event only when its receiver already waits for it, or when its
sender must first see the notice. Link queueing needs no process: each link keeps the
time it is next free. A run that stops with ranks unfinished is a deadlock: `Run.finished`
says which ranks got through, and the caller explains it (`sim.passes.validation.check_deadlock`).
"""
from __future__ import annotations

import itertools
import math
from operator import itemgetter
from typing import Mapping, NamedTuple

import simpy

from .costs import StageCosts, pair_times
from sim.schedule.ir import Action
from sim.schedule.kinds import KINDS, Role
from sim.schedule.liveness import change
from .program import Program
from .resources import RESOURCES, Resource, merge_memory
from .result import Event, Result
from .links import Arrival, Links
from .transports import Transport, transport_class

INF = float("inf")
_COMPUTE, _RECV, _SEND, _PAIR = Role.COMPUTE, Role.RECV, Role.SEND, Role.PAIR


def _costs(p: Program, c: StageCosts):
    """Per compute id: its duration (its kind's cost field, and its `comm` field unless an
    overlapped pair hides it: rule 18) and what it does to memory at
    its start and at its end ((bytes, micro-batches) or None; `sim.schedule.kinds`); per transfer
    (named by the compute that receives it): its link (numbered per sender -> receiver
    pair) and the time it holds the link. These lists are as long as the schedule, so
    they are built with map and zip, from values worked out once per (stage, kind)."""
    stage = list(map(itemgetter(0), p.actions))
    by_kind = {}
    for k, spec in KINDS.items():
        if spec.role is _COMPUTE:
            comm = getattr(c, spec.comm) if spec.comm else itertools.repeat(0.0)
            for s, (t, a2a) in enumerate(zip(getattr(c, spec.cost), comm)):
                by_kind[s, k] = (t + a2a, change(k, "start", c, s), change(k, "end", c, s))
    per = list(map(by_kind.__getitem__, zip(stage, map(itemgetter(1), p.actions))))
    dur, at_start, at_end = (list(map(itemgetter(i), per)) for i in range(3))
    if p.schedule.has_pairs:
        _pair_durations(p, c, dur)
    # A transfer's link and hold time depend only on the stages at its two ends: work them
    # out once per pair of stages.
    placement = p.placement
    transfers = [t for t, j in enumerate(p.producer) if j >= 0]
    ends = list(zip(map(stage.__getitem__, map(p.producer.__getitem__, transfers)), map(stage.__getitem__, transfers)))
    links: dict[tuple[int, int], int] = {}   # (sending rank, receiving rank) -> link number
    channel = {}                            # (sending stage, receiving stage) -> (link, hold time)
    for s, d in set(ends):
        link_number = links.setdefault((placement[s], placement[d]), len(links))
        # the tensor between stages s and s+1 has the size of stage s's output
        channel[s, d] = (link_number, c.transfer_time(c.activation_bytes_sent[min(s, d)]))
    link, busy = [0] * len(stage), [0.0] * len(stage)
    for t, (l, b) in zip(transfers, map(channel.__getitem__, ends)):
        link[t], busy[t] = l, b
    return dur, at_start, at_end, link, busy, len(links)


def _pair_durations(p: Program, c: StageCosts, dur: list) -> None:
    """The two computes of each overlapped pair take their shares of its time (rule 18:
    `sim.engine.costs.pair_times`): an `Op(PAIR, y)` names the backward y, its F is y - 1."""
    for prog in p.programs:
        for role, y in prog:
            if role is _PAIR:
                (sf, _, _), (sb, kb, _) = p.actions[y - 1], p.actions[y]
                back = KINDS[kb]
                dur[y - 1], dur[y] = pair_times(c.forward[sf], c.a2a_forward[sf],
                                                getattr(c, back.cost)[sb], getattr(c, back.comm)[sb])


class Run:
    """What a run recorded, as flat lists indexed by compute id (a transfer is numbered by
    the compute that receives it), with each rank's memory and activations over time,
    busy time and whether it finished its program (not all ranks do where they got
    stuck: a deadlock, which the caller explains). `result()` makes the `Result`; its
    `Event` records are made from these lists only on demand."""

    def __init__(self, p: Program, net: "Links", devices: "_Devices", resources: list[Resource], memory, activations):
        self.program, self.resources = p, resources
        self.start, self.end, self.busy, self.finished = devices.start, devices.end, devices.busy, devices.finished
        self.sent, self.posted, self.arrive = net.sent, net.posted, net.arrive_at
        self.memory, self.activations = memory, activations

    def events(self) -> list[Event]:
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


def run(p: Program, c: StageCosts, durations: Mapping[Action, float] | None = None) -> Run:
    """Run a compiled program under `c` (`durations`: compute action -> time, overriding
    their costs). Return the `Run` record, stuck ranks and all."""
    dur, at_start, at_end, link, busy, nlinks = _costs(p, c)
    if durations:
        dur = [durations.get(a, d) for a, d in zip(p.actions, dur)]
    env = simpy.Environment()
    net = Links(env, p, c, link, busy, nlinks, p.ranks)
    transport: Transport = transport_class(c.transport)(c)
    gated = any(RESOURCES[role].gates_computes for role in p.beside)
    ready = [0.0] * len(p.actions) if gated else None  # per compute: when its resources let it start
    resources = {role: RESOURCES[role](p, c, durations, ready) for role in p.beside}
    for res in resources.values():
        res.check_transport(transport)
    transport.prepare(p, dur)
    devices = _Devices(net, transport, c, (dur, at_start, at_end), resources, ready)
    logs = [[] for _ in range(p.ranks)]   # per rank: (time, (bytes, micro-batches)) changes
    for r in range(p.ranks):
        env.process(devices.run(r, logs[r].append))
    env.run()
    static = [0.0] * p.ranks
    for s, r in enumerate(p.placement):
        static[r] += c.static_total(s)
    memory, activations = zip(*map(_series, logs, static)) if logs else ((), ())
    memory = [merge_memory(series, [x for res in resources.values() for x in res.changes[r]])
              for r, series in enumerate(memory)]
    return Run(p, net, devices, list(resources.values()), memory, list(activations))


def _series(log: list, static: float) -> tuple[list, list]:
    """A rank's memory (bytes) and activations held (micro-batches) over time, from its
    log of changes, starting at (0, static bytes) and (0, none)."""
    times = [0.0, *map(itemgetter(0), log)]
    changes = list(map(itemgetter(1), log))
    held_bytes = itertools.accumulate(map(itemgetter(0), changes), initial=static)
    held = itertools.accumulate(map(itemgetter(1), changes), initial=0)
    return list(zip(times, held_bytes)), list(zip(times, held))


def first_excess(most: float, tau: float, d: float) -> float:
    """Rule 19: what a rank's first compute of a step, of duration `d`, takes more. The core
    starts the step `most` / `tau` below its speed and recovers with time constant `tau`: the
    compute loses the integral of that deficit over its duration, most x (1 - exp(-d / tau)).
    `tau` 0: `most`, whatever `d`."""
    return -most * math.expm1(-d / tau) if tau > 0 else most


class Loop(NamedTuple):
    """What a device's loop reads (`_Devices.run` binds each to a local once: the loop
    runs once per action)."""

    env: simpy.Environment
    timeout: object          # env.timeout
    producer: list[int]      # the program's: per compute, the compute whose tensor it receives, or -1
    sent: list               # the links' (`Links`): when each SEND was issued
    posted: list             # when each RECV was posted
    arrive_at: list          # when each transfer arrives, once known
    waiter: list             # a receiver blocked on each transfer
    free_until: list         # per rank, for a transport that watches the devices
    held_until: list
    resume: list
    at_yield: list
    yielded: object          # the links': rank r lets its transport thread run now
    ahead: bool              # a device may run ahead of SimPy's clock (see `_Devices`)
    take_in: float           # the transport's call costs
    send_call: float
    recv_call: float
    issued: object           # the transport's hooks: a SEND issued, a RECV posted
    posted_hook: object
    before: float            # the runtime's own time around a compute (rule 11)
    after: float
    first: float             # what a rank's first compute of the step takes more (rule 19) at most,
    first_tau: float         # and how fast the core recovers (0: all of `first`)
    dur: list                # per compute: its time, its memory change at start and end
    at_start: list
    at_end: list
    start_of: list           # per compute: when it started and ended (what the run records)
    end_of: list
    resources: dict          # role -> the `Resource` beside the devices
    ready: list | None       # per compute: when its resources let it start (None: none gate it)


class _Devices:
    """The devices of one run: each runs its program's `Op`s in order as a SimPy process
    (`run`; rules 1-4 and 11 of docs/rules.md); the transport's hooks take its SENDs and
    RECVs; its actions of another role go to their resource beside it (rules 13, 14, 16:
    `sim.engine.resources`). Records each compute's start and end, each rank's busy time
    and whether it finished."""

    def __init__(self, net: Links, transport: Transport, c: StageCosts, computes,
                 resources: dict[Role, Resource], ready: list[float] | None):
        n, ranks = len(net.program.actions), net.program.ranks
        self.net = net
        issued, posted_hook = transport.bind(net)
        self.start, self.end = [0.0] * n, [0.0] * n
        self.finished, self.busy = [False] * ranks, [0.0] * ranks
        # Run ahead: where neither the transport nor the links depend on the order in which
        # things happen at one time (no device watching, free links), when a transfer leaves
        # is the later of its SEND and its notice, whichever the engine learns first. Then a
        # device needs SimPy only to wait for data that has not left yet: it keeps its own
        # clock, which is never behind SimPy's, and computes without a timeout.
        ahead = not transport.watches_devices and not net.queues
        dur, at_start, at_end = computes
        self.loop = Loop(
            env=net.env, timeout=net.env.timeout, producer=net.program.producer, sent=net.sent, posted=net.posted,
            arrive_at=net.arrive_at, waiter=net.waiter, free_until=net.free_until, held_until=net.held_until,
            resume=net.resume, at_yield=net.at_yield, yielded=net.yielded, ahead=ahead, take_in=transport.take_in,
            send_call=transport.send_call, recv_call=transport.recv_call, issued=issued, posted_hook=posted_hook,
            before=c.before_compute, after=c.after_compute, first=c.first_compute, first_tau=c.first_compute_tau, dur=dur, at_start=at_start, at_end=at_end,
            start_of=self.start, end_of=self.end, resources=resources, ready=ready)

    def run(self, r: int, log):
        """The SimPy process of device r; `log((time, (bytes, micro-batches)))` records
        each change of what it holds. A compute starts once its remote input is here:
        waiting, computing and the runtime's work around it are one timeout; only a tensor
        that has not left yet needs an event (which the sender triggers at its arrival).
        A rank that does not finish waits on a later compute."""
        # the loop's fields as locals, once (`Loop`, in its order): the loop below runs once per action
        (env, timeout, producer, sent, posted, arrive_at, _, free_until, held_until, resume, at_yield, yielded,
         ahead, take_in, send_call, recv_call, issued, posted_hook, before, after, first, first_tau, dur, at_start,
         at_end, start_of, end_of, resources, ready) = self.loop  # (first, first_tau: rule 19)
        prog, runnable = self.net.program.programs[r], self.net.program.runnable[r]
        now, computing = env.now, 0.0
        for i, (role, x) in enumerate(prog if runnable == len(prog) else prog[:runnable], 1):
            if role is not _COMPUTE:  # post a RECV or issue a SEND at `now`: the transport decides when data leaves
                if role is _RECV:  # rule 3 (docs/rules.md)
                    posted[x] = now
                    posted_hook(x, now)
                    hold = recv_call
                elif role is _SEND:  # rule 2
                    sent[x] = free_until[r] = now  # the runtime yields the core before the call (rule 9)
                    if at_yield[r]:
                        yielded(r, now)
                    issued(x, now)
                    hold = send_call  # (send_call, recv_call: how long the call holds the rank)
                elif role is _PAIR:  # rule 18: the pair's F waits for its backward's input too
                    now = yield from self._pair(r, x, now)
                    continue
                else:  # a collective, a copy or a gather: beside the device, which goes on (rules 13, 14, 16)
                    resources[role].issue(r, x, now)
                    continue
                if hold and ahead:
                    now += hold
                elif hold:  # the call holds the device (held_until, resume: read where the transport watches)
                    held_until[r], resume[r] = now + hold, i
                    yield timeout(hold)
                    now = env.now
                continue
            start = now  # compute x
            if producer[x] >= 0:
                if at_yield[r]:  # it yields the core to wait for or take in its input
                    yielded(r, now)
                at = arrive_at[x]
                if at is None:  # the rank waits: its transport thread runs (rule 10)
                    at = yield from self._arrival(r, x)
                    if not ahead:
                        now = at
                free_until[r] = start = (at if at > start else start) + take_in  # taking it in (0 unless modelled)
            start, first = start + before + (first_excess(first, first_tau, dur[x]) if first else 0.0), 0.0  # 11, 19
            if ready is not None and ready[x] > start:  # e.g. a backward waits for its RELOAD (rule 14)
                start = ready[x]
            if (delta := at_start[x]) is not None:  # e.g. F takes its micro-batch's activations (rule 7)
                log((start, delta))
            end = start + dur[x]
            held_until[r], resume[r] = end + after, i  # (read where the transport watches the devices)
            if ahead:
                now = end + after
            else:
                yield timeout(end + after - now)
                now = env.now
            start_of[x], end_of[x], computing = start, end, computing + (end - start)
            if (delta := at_end[x]) is not None:  # e.g. the last backward (W where it is split) frees them
                log((end, delta))
        free_until[r] = INF  # done (or stuck): it waits for its sends
        yielded(r, now)
        self.busy[r], self.finished[r] = computing, runnable == len(prog)

    def _arrival(self, r: int, x: int):
        """Rank r waits until the data of transfer x has left and its arrival is known
        (a step of its SimPy process); returns the arrival."""
        k = self.loop
        k.waiter[x] = Arrival(k.env)
        k.free_until[r] = INF  # its transport thread runs (rule 10)
        yield k.waiter[x]
        return k.arrive_at[x]

    def _pair(self, r: int, y: int, now: float):
        """The mark of an overlapped pair whose backward is compute y (rule 18): rank r
        waits here until the backward's input has arrived, and then goes on to the pair's
        F (compute y - 1), which takes its own input as any compute does. Returns the
        rank's clock."""
        k = self.loop
        if k.producer[y] < 0:
            return now
        if k.at_yield[r]:
            k.yielded(r, now)
        at = k.arrive_at[y]
        if at is None:
            at = yield from self._arrival(r, y)
            if not k.ahead:
                now = at
        k.free_until[r] = at if at > now else now  # it waits for the data: its transport thread runs
        if at > now:
            if not k.ahead:
                yield k.timeout(at - now)
            now = at
        return now
