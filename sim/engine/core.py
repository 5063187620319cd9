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
stream (rule 13) and copies on its two copy engines (rule 14), beside the device.

The engine knows actions, devices and links; the transport (`Costs.transport`, see
`sim.engine.transports`) decides when a transfer leaves its sender and what the calls cost the
two ends, and the action-kind table (`sim.schedule.kinds`) what each compute costs and does to
memory.

How it stays fast (docs/performance.md): it runs the numbered program (`sim.passes.program.number_program`), not
`Action` objects. A compute whose input's arrival time is known waits and computes in one
timeout; a transfer is an event only when its receiver already waits for it, or when its
sender must first see the notice. Link queueing needs no process: each link keeps the
time it is next free. A run that stops with ranks unfinished is a deadlock, explained by
`sim.passes.validation.check_deadlock`.
"""
from __future__ import annotations

import gc
import itertools
import math
from operator import itemgetter
from typing import Mapping

import simpy

from .costs import Costs, StageCosts
from sim.schedule.ir import Action, Schedule
from sim.schedule.kinds import KINDS, Role
from sim.schedule.liveness import change
from sim.passes.offload import CopyEngines
from sim.passes.checks import check_communication, check_complete
from sim.passes.lowering import lower
from sim.passes.program import Program, number_program
from sim.passes.validation import check_deadlock
from .result import Event, Result
from .transports import Transport, transport_class

INF = float("inf")
_COMPUTE, _RECV, _SEND, _COLLECTIVE = Role.COMPUTE, Role.RECV, Role.SEND, Role.COLLECTIVE


class _Arrival(simpy.Event):
    """The arrival of a transfer that a receiver is already waiting for: the sender
    triggers it with a delay, as a Timeout would be."""

    def arrive_after(self, delay: float) -> None:
        self._ok = True
        self._value = None
        self.env.schedule(self, delay=delay)


def _costs(p: Program, c: StageCosts, placement: tuple[int, ...]):
    """Per compute id: its duration (its kind's cost field) and what it does to memory at
    its start and at its end ((bytes, micro-batches) or None; `sim.schedule.kinds`); per transfer
    (named by the compute that receives it): its link (numbered per sender -> receiver
    pair) and the time it holds the link. These lists are as long as the schedule, so
    they are built with map and zip, from values worked out once per (stage, kind)."""
    stage = list(map(itemgetter(0), p.actions))
    by_kind = {}
    for k, spec in KINDS.items():
        if spec.role is _COMPUTE:
            for s, t in enumerate(getattr(c, spec.cost)):
                by_kind[s, k] = (t, change(k, "start", c, s), change(k, "end", c, s))
    per = list(map(by_kind.__getitem__, zip(stage, map(itemgetter(1), p.actions))))
    dur, at_start, at_end = (list(map(itemgetter(i), per)) for i in range(3))
    # A transfer's link and hold time depend only on the stages at its two ends: work them
    # out once per pair of stages.
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


class _Run:
    """What a run recorded, as flat lists indexed by compute id (a transfer is numbered by
    the compute that receives it); `Event` records are made from them only on demand."""

    def __init__(self, p: Program, start, end, sent, posted, arrive, collective_start, collective_end, placement,
                 copy_start=(), copy_end=()):
        self.program = p
        self.start, self.end, self.sent, self.posted, self.arrive = start, end, sent, posted, arrive
        self.collective_start, self.collective_end, self.placement = collective_start, collective_end, placement
        self.copy_start, self.copy_end = copy_start, copy_end

    def events(self) -> list[Event]:
        p = self.program
        out = [Event(r, a, s, e) for r, a, s, e in zip(p.rank, p.actions, self.start, self.end)]
        out += [Event(self.placement[a.stage], a, s, e)
                for a, s, e in zip(p.collectives, self.collective_start, self.collective_end)]
        out += [Event(self.placement[a.stage], a, s, e) for a, s, e in zip(p.copies, self.copy_start, self.copy_end)]
        for t, j in enumerate(p.producer):
            if j >= 0:
                out.append(Event(p.rank[j], p.comm_action(t, True), self.sent[t], self.arrive[t], p.rank[t]))
                out.append(Event(p.rank[t], p.comm_action(t, False), self.posted[t], self.arrive[t], p.rank[j]))
        return out


class _Network:
    """What the engine knows of transfers while it runs, and what a transport's hooks
    read and call (`sim.engine.transports`): when each SEND was issued and each RECV posted,
    `leave` (the data takes its link and arrives), `later` (run a function at a later
    time), and, if the transport watches the devices, each rank's state."""

    def __init__(self, env, p: Program, c: StageCosts, link, busy, nlinks: int, ranks: int):
        n = len(p.actions)
        self.env, self.program = env, p
        self.sent: list[float | None] = [None] * n
        self.posted: list[float | None] = [None] * n
        self.arrive_at: list[float | None] = [None] * n   # known once the data has left
        self.waiter: list[_Arrival | None] = [None] * n   # a receiver blocked on it
        # each rank's state, for a transport that watches it: until when its transport thread
        # may run at once (it waits, or has ended, or is in a SEND call), until when its
        # current action holds it, and where its program goes on
        self.free_until = [-1.0] * ranks
        self.held_until = [0.0] * ranks
        self.resume = [0] * ranks
        self.leave = self._leave_function(c.latency, link, busy, nlinks)

    def later(self, delay: float, fn, *args) -> None:
        self.env.timeout(delay).callbacks.append(lambda _: fn(*args))

    def _leave_function(self, latency: float, link, busy, nlinks: int):
        env, later, arrive_at, waiter = self.env, self.later, self.arrive_at, self.waiter
        link_free = [0.0] * nlinks
        # With every transfer's link time 0 (free bandwidth), links never make one wait: a
        # transfer's departure and arrival are known as soon as its leaving time is.
        queues = self.queues = any(busy)

        def leave(t: int, at: float) -> None:
            """The data of transfer t leaves its sender at `at` (now or later): it takes the
            link from when the link is free for busy[t], and arrives `latency` after that.
            Links serve transfers in the order they leave, so a later one waits for `at`."""
            now = env.now
            if queues:
                if at > now:
                    return later(at - now, leave, t, at)
                free = link_free[link[t]]
                at = (at if at >= free else free) + busy[t]
                link_free[link[t]] = at
            arrive_at[t] = at + latency
            if waiter[t] is not None:
                waiter[t].arrive_after(at + latency - now)

        return leave


def run(schedule: Schedule, c: StageCosts, durations: Mapping[Action, float] | None = None):
    """Run a schedule (compute-only, or lowered with complete communication). Return the
    `_Run` record, each rank's memory and activations over time, which ranks finished
    their program (not all of them if the ranks got stuck), and each rank's busy time."""
    p = number_program(schedule)
    dur, at_start, at_end, link, busy, nlinks = _costs(p, c, schedule.placement)
    collective_dur = [getattr(c, KINDS[a.kind].cost)[a.stage] for a in p.collectives]
    if durations:
        dur = [durations.get(a, d) for a, d in zip(p.actions, dur)]
        collective_dur = [durations.get(a, d) for a, d in zip(p.collectives, collective_dur)]
    env = simpy.Environment()
    net = _Network(env, p, c, link, busy, nlinks, schedule.ranks)
    transport: Transport = transport_class(c.transport)(c)
    copies = CopyEngines(p, c, durations, schedule.ranks) if p.copies else None
    if copies and transport.watches_devices:
        raise ValueError("a schedule with OFFLOAD/RELOAD (copies to host memory, a GPU's) cannot run under "
                         "Costs.io_tick > 0 (a CPU rank's I/O thread, rule 10); set io_tick=0")
    transport.prepare(p, dur)
    devices = _Devices(net, transport, c, (dur, at_start, at_end), collective_dur, copies, schedule.ranks)
    logs = [[] for _ in range(schedule.ranks)]   # per rank: (time, (bytes, micro-batches)) changes
    for r in range(schedule.ranks):
        env.process(devices.run(r, logs[r].append))
    env.run()
    record = _Run(p, devices.start, devices.end, net.sent, net.posted, net.arrive_at, devices.collective_start,
                  devices.collective_end, schedule.placement, *((copies.start, copies.end) if copies else ()))
    static = [0.0] * schedule.ranks
    for s, r in enumerate(schedule.placement):
        static[r] += c.static_total(s)
    memory, activations = zip(*map(_series, logs, static)) if logs else ((), ())
    memory, activations = list(memory), list(activations)
    if copies:
        memory = [copies.merge(r, series) for r, series in enumerate(memory)]
    return record, memory, activations, devices.finished, devices.busy


def _series(log: list, static: float) -> tuple[list, list]:
    """A rank's memory (bytes) and activations held (micro-batches) over time, from its
    log of changes, starting at (0, static bytes) and (0, none)."""
    times = [0.0, *map(itemgetter(0), log)]
    changes = list(map(itemgetter(1), log))
    held_bytes = itertools.accumulate(map(itemgetter(0), changes), initial=static)
    held = itertools.accumulate(map(itemgetter(1), changes), initial=0)
    return list(zip(times, held_bytes)), list(zip(times, held))


class _Devices:
    """The devices of one run: each runs its program's `Op`s in order as a SimPy process
    (`run`; rules 1-4 and 11 of docs/rules.md); the transport's hooks take its SENDs and
    RECVs; its collectives go to its stream (rule 13), its copies to its copy engines
    (rule 14: `copies`). Records each compute's start and end, each collective's, each
    rank's busy time and whether it finished."""

    def __init__(self, net: _Network, transport: Transport, c: StageCosts, computes, collective_dur,
                 copies: CopyEngines | None, ranks: int):
        n = len(net.program.actions)
        self.net, self.copies = net, copies
        self.issued, self.posted_hook = transport.bind(net)
        self.start, self.end = [0.0] * n, [0.0] * n
        self.collective_dur = collective_dur
        self.collective_start, self.collective_end = [0.0] * len(collective_dur), [0.0] * len(collective_dur)
        self.stream = [0.0] * ranks   # when each rank's collective stream is free
        self.finished, self.busy = [False] * ranks, [0.0] * ranks
        # Run ahead: where neither the transport nor the links depend on the order in which
        # things happen at one time (no device watching, free links), when a transfer leaves
        # is the later of its SEND and its notice, whichever the engine learns first. Then a
        # device needs SimPy only to wait for data that has not left yet: it keeps its own
        # clock, which is never behind SimPy's, and computes without a timeout.
        ahead = not transport.watches_devices and not net.queues
        # what `run` reads, bound to its locals at once (the loop runs once per action)
        self.shared = (net.env, net.env.timeout, net.program.producer, net.sent, net.posted, net.arrive_at, net.waiter,
                       net.free_until, net.held_until, net.resume, transport.watches_devices, ahead,
                       transport.take_in, c.before_compute, c.after_compute, transport.send_call,
                       transport.recv_call, *computes, self.start, self.end, self.issued, self.posted_hook,
                       self.beside, copies.ready if copies else None)

    def beside(self, r: int, role: Role, x: int, now: float) -> None:
        """Issue collective or copy x of rank r at `now`; the device goes on meanwhile."""
        if role is not _COLLECTIVE:
            self.copies.issue(r, x, now)
            return
        begin = self.stream[r] if self.stream[r] > now else now
        self.stream[r] = begin + self.collective_dur[x]
        self.collective_start[x], self.collective_end[x] = begin, self.stream[r]

    def run(self, r: int, log):
        """The SimPy process of device r; `log((time, (bytes, micro-batches)))` records
        each change of what it holds. A compute starts once its remote input is here:
        waiting, computing and the runtime's work around it are one timeout; only a tensor
        that has not left yet needs an event (which the sender triggers at its arrival)."""
        (env, timeout, producer, sent, posted, arrive_at, waiter, free_until, held_until, resume, watch, ahead,
         take_in, before, after, send_call, recv_call, dur, at_start, at_end, start_of, end_of, issued, posted_hook,
         beside, ready) = self.shared   # `ready`: per compute, when its RELOAD has ended (None: no copies)
        prog, runnable = self.net.program.programs[r], self.net.program.runnable[r]
        now, computing = env.now, 0.0
        for i, (role, x) in enumerate(prog if runnable == len(prog) else prog[:runnable], 1):
            if role is not _COMPUTE:  # post a RECV or issue a SEND at `now`: the transport decides when data leaves
                if role is _RECV:  # rule 3 (docs/rules.md)
                    posted[x] = now
                    posted_hook(x, now)
                    hold = recv_call
                elif role is _SEND:  # rule 2
                    sent[x] = now
                    if watch:
                        free_until[r] = now  # the runtime yields the core before the call
                    issued(x, now)
                    hold = send_call  # (send_call, recv_call: how long the call holds the rank)
                else:  # a collective or a copy: beside the device, which goes on (rules 13, 14)
                    beside(r, role, x, now)
                    continue
                if hold and ahead:
                    now += hold
                elif hold:  # the call holds the device
                    if watch:
                        held_until[r], resume[r] = now + hold, i
                    yield timeout(hold)
                    now = env.now
                continue
            start = now  # compute x
            if producer[x] >= 0:
                at = arrive_at[x]
                if at is None:
                    waiter[x] = _Arrival(env)
                    free_until[r] = INF  # the rank waits: its transport thread runs (rule 10)
                    yield waiter[x]
                    at = arrive_at[x]
                    if not ahead:
                        now = at
                start = (at if at > start else start) + take_in  # taking the tensor in (0 unless modelled)
                free_until[r] = start
            start += before  # rule 11
            if ready is not None and ready[x] > start:  # a backward waits for its RELOAD (rule 14)
                start = ready[x]
            if (change := at_start[x]) is not None:  # e.g. F takes its micro-batch's activations (rule 7)
                log((start, change))
            end = start + dur[x]
            if watch:
                held_until[r], resume[r] = end + after, i
            if ahead:
                now = end + after
            else:
                yield timeout(end + after - now)
                now = env.now
            start_of[x], end_of[x] = start, end
            computing += end - start
            if (change := at_end[x]) is not None:  # e.g. the last backward (W where it is split) frees them
                log((end, change))
        free_until[r] = INF  # done (or stuck): it waits for its sends
        self.busy[r], self.finished[r] = computing, runnable == len(prog)  # if not, it waits on a later compute


def simulate(schedule: Schedule, costs: Costs | None = None, durations: Mapping[Action, float] | None = None
             ) -> Result:
    """Simulate one training step of `schedule` (compute-only or lowered) under `costs`.

    `durations` (compute action -> time) overrides the cost of those actions: to replay a
    measured step under the rules with the very compute times it had
    (`exec.measure.compare.replay_error`).

    A schedule that cannot finish raises `ScheduleError` showing where each rank waits: the
    run itself is the deadlock check (`sim.passes.validation.check_deadlock` explains what it found)."""
    if not isinstance(schedule, Schedule):
        hint = f"sim.make_schedule({schedule!r}, devices, micro_batches)" if isinstance(schedule, str) else "sim.make_schedule(...)"
        raise TypeError(f"simulate needs a sim.Schedule, got {type(schedule).__name__} {schedule!r:.40}; build one "
                        f"with {hint}")
    if costs is not None and not isinstance(costs, Costs):
        raise TypeError(f"simulate's costs must be a sim.Costs, got {type(costs).__name__}")
    # A step of a big schedule makes millions of small objects that all live to the end;
    # Python's cyclic garbage collector would walk them again and again (it doubles the
    # time of p=64, m=1024). None of them needs collecting before we return.
    collecting = gc.isenabled()
    gc.disable()
    try:
        check_complete(schedule)
        if schedule.is_lowered:
            check_communication(schedule)
        c = (costs or Costs()).for_stages(schedule.stages)
        if durations:
            bad = [f"{a}: {t!r}" for a, t in durations.items()
                   if not (isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) and t >= 0)]
            if bad:
                raise ValueError(f"durations must be finite numbers >= 0, got {', '.join(bad[:3])}")
        record, memory, activations, finished, busy = run(schedule, c, durations)
        lowered = schedule if schedule.is_lowered else None
        if not all(finished):
            lowered = lowered or lower(schedule)
            check_deadlock(lowered)  # raises, naming each stuck rank and what it waits for
            raise AssertionError("the simulation stopped early but the schedule does not deadlock")
        # The step runs from the first action's start (each rank's first: 0 for a RECV post,
        # else its first compute's, after the runtime's own time before it) to the last
        # compute's or collective's end: every transfer feeds a compute that starts after it arrives.
        t0 = min((record.start[prog[0].index] if prog[0].role is _COMPUTE else 0.0
                  for prog in record.program.programs if prog), default=0.0)
        computed = max(record.end, default=0.0)
        makespan = max(computed, max(record.collective_end, default=0.0)) - t0
        return Result(lowered or (lambda: lower(schedule)), record.events, memory, activations,
                      makespan=makespan, busy=busy, t0=t0, compute_end=computed)
    finally:
        if collecting:
            gc.enable()
