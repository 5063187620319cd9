"""The discrete-event engine: one SimPy process per device runs its lowered program.

The rules (docs/rules.md; `exec` honours the same ones):
1. A device runs its actions in program order, one at a time.
2. A compute action (F, B, I, W) starts when the device reaches it and every tensor it
   needs from another device has arrived and been taken in (`arrive_overhead` after the
   later of the two); it then occupies the device for its cost.
3. A SEND is issued right after the compute that made its tensor and does not wait for
   the transfer. A RECV only posts the receive (one compute ahead, see `sim.passes.lower`).
   Issuing a SEND holds the device for `send_overhead`, posting a RECV for
   `recv_overhead` (the CPU time of the call).
4. Transfers rendezvous: posting the RECV sends a ready notice, which reaches the sender
   `latency` later. If it is there when the SEND is issued, the data leaves at once;
   otherwise the data leaves when the sender's transport handles the notice: at once if
   the sender waits or has ended, else at its next yield (a SEND, a wait for data, its
   end) or the scheduler tick, whichever comes first (`io_tick`, rule 10; the expected
   time over the tick's phase). The data then waits for its link (one per direction
   between two devices, FIFO), occupies it for bytes / bandwidth, and arrives `latency`
   later; the latency does not hold the link.
5. Around each compute the runtime holds the device for its own work: `before_compute`
   before the compute starts (once its inputs are in) and `after_compute` after it ends.
6. Memory of a device = static bytes + the activations of each micro-batch it holds,
   from the start of that micro-batch's F until the end of its last backward (B or W).

How it stays fast (docs/performance.md): it runs the numbered `sim.passes.plan`, not
`Action` objects. A compute whose input's arrival time is known waits and computes in one
timeout; a transfer is an event only when its receiver already waits for it, or when its
sender must first see the notice. Link queueing needs no process: each link keeps the
time it is next free. A run that stops with ranks unfinished is a deadlock, explained by
`sim.passes.check_deadlock`.
"""
from __future__ import annotations

import gc
import math
from operator import itemgetter
from typing import Mapping

import simpy

from .costs import Costs, StageCosts
from .ir import Action, Schedule
from .passes import _B, _F, _I, _W, Plan, check_communication, check_complete, check_deadlock, lower, plan
from .result import Event, Result

INF = float("inf")


class _Arrival(simpy.Event):
    """The arrival of a transfer that a receiver is already waiting for: the sender
    triggers it with a delay, as a Timeout would be."""

    def arrive_after(self, delay: float) -> None:
        self._ok = True
        self._value = None
        self.env.schedule(self, delay=delay)


def _costs(p: Plan, c: StageCosts, placement: tuple[int, ...]):
    """Per compute id: its duration; per transfer (named by the compute that receives it):
    its link (numbered per sender -> receiver pair) and the time it holds the link. These
    lists are as long as the schedule, so they are built with map and zip where possible."""
    stage = list(map(itemgetter(0), p.actions))
    times = {(s, k): t for k, per_stage in ((_F, c.forward), (_B, c.backward), (_I, c.backward_input),
                                            (_W, c.backward_weight)) for s, t in enumerate(per_stage)}
    dur = list(map(times.__getitem__, zip(stage, map(itemgetter(1), p.actions))))
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
    return dur, link, busy, len(links)


def _to_yield(prog, end: int, dur, producer, recv_overhead: float, around: float) -> list[float]:
    """For each position i of a rank's program (up to `end`, where it ends or gets stuck):
    how long after reaching action i the rank next lets its transport thread run, if
    nothing makes it wait: at a SEND (it yields the core first), at a compute with an input
    from another rank (it waits for the data or takes it in), or at the end. A compute in
    between holds the rank for its cost plus the runtime's own time around it (`around`)."""
    out = [0.0] * (end + 1)
    ahead = 0.0
    for i in range(end - 1, -1, -1):
        op = prog[i]
        if op < 0:
            ahead = ahead + recv_overhead if op & 1 else 0.0
        elif producer[op] >= 0:
            ahead = 0.0
        else:
            ahead += dur[op] + around
        out[i] = ahead
    return out


def expected_wait(until_yield: float, tick: float) -> float:
    """The expected wait of a message for a computing rank's transport thread: it runs at
    the rank's next yield, `until_yield` away, or at the scheduler tick, uniform on
    [0, tick] over the tick's unknown phase: E[min(X, U(0, tick))] (math.inf: X)."""
    if until_yield < tick:
        return until_yield - until_yield * until_yield / (2 * tick)
    return tick / 2


class _Run:
    """What a run recorded, as flat lists indexed by compute id (a transfer is numbered by
    the compute that receives it); `Event` records are made from them only on demand."""

    def __init__(self, p: Plan, start, end, sent, posted, arrive):
        self.plan = p
        self.start, self.end, self.sent, self.posted, self.arrive = start, end, sent, posted, arrive

    def events(self) -> list[Event]:
        p = self.plan
        out = [Event(r, a, s, e) for r, a, s, e in zip(p.rank, p.actions, self.start, self.end)]
        for t, j in enumerate(p.producer):
            if j >= 0:
                out.append(Event(p.rank[j], p.comm_action(t, True), self.sent[t], self.arrive[t], p.rank[t]))
                out.append(Event(p.rank[t], p.comm_action(t, False), self.posted[t], self.arrive[t], p.rank[j]))
        return out


def run(schedule: Schedule, c: StageCosts, durations: Mapping[Action, float] | None = None):
    """Run a schedule (compute-only, or lowered with complete communication). Return the
    `_Run` record, each rank's memory and activations over time, and which ranks finished
    their program (not all of them if the ranks got stuck)."""
    p = plan(schedule)
    dur, link, busy, nlinks = _costs(p, c, schedule.placement)
    if durations:
        dur = [durations.get(a, d) for a, d in zip(p.actions, dur)]
    act_bytes = c.activation_bytes
    actions, producer, rank_of = p.actions, p.producer, p.rank
    n = ncomputes = len(p.actions)
    env = simpy.Environment()
    latency, take_in, tick = c.latency, c.arrive_overhead, c.io_tick
    before, after = c.before_compute, c.after_compute  # the runtime's own time around a compute
    overhead = (c.send_overhead, c.recv_overhead)  # indexed by op & 1: 0 for a SEND, 1 for a RECV
    sent: list[float | None] = [None] * n
    posted: list[float | None] = [None] * n
    arrive_at: list[float | None] = [None] * n       # known once the data has left
    waiter: list[_Arrival | None] = [None] * n       # a receiver blocked on it
    link_free = [0.0] * nlinks
    start_of, end_of = [0.0] * ncomputes, [0.0] * ncomputes
    finished = [False] * schedule.ranks
    busy_time = [0.0] * schedule.ranks
    # Where the transport thread may have to wait for its rank (io_tick > 0), each rank
    # tells where it is: until when its thread may run at once (the rank waits for data or
    # has ended), until when its current action holds it, and where its program goes on.
    free_until = [-1.0] * schedule.ranks
    held_until = [0.0] * schedule.ranks
    resume = [0] * schedule.ranks
    to_yield = [_to_yield(prog, end, dur, producer, c.recv_overhead, before + after) if tick else None
                for prog, end in zip(p.programs, p.runnable)]

    static = [0.0] * schedule.ranks
    for s, r in enumerate(schedule.placement):
        static[r] += c.static_bytes[s]
    memory = [[(0.0, static[r])] for r in range(schedule.ranks)]
    activations = [[(0.0, 0)] for _ in range(schedule.ranks)]

    def later(delay: float, fn, *args) -> None:
        env.timeout(delay).callbacks.append(lambda _: fn(*args))

    # With every transfer's link time 0 (free bandwidth), links never make one wait: a
    # transfer's departure and arrival are known as soon as its leaving time is.
    queues = any(busy)

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

    def notice(t: int, at: float) -> None:
        """The receiver's ready notice of transfer t reaches its sender at `at`, after the
        send was issued: the data leaves when the sender's transport thread runs."""
        if not tick:
            return leave(t, at)
        now = env.now
        if at > now:  # what the sender is doing then is known only then
            return later(at - now, notice, t, at)
        r = rank_of[producer[t]]
        if now <= free_until[r]:
            leave(t, now)
        else:
            leave(t, now + expected_wait(held_until[r] + to_yield[r][resume[r]] - now, tick))

    def device(r: int):
        held_bytes, held = static[r], 0
        mem, act = memory[r].append, activations[r].append
        timeout = env.timeout
        now = env.now
        computing = 0.0  # this rank's busy time
        prog, runnable = p.programs[r], p.runnable[r]
        for i, op in enumerate(prog if runnable == len(prog) else prog[:runnable], 1):
            if op < 0:
                # Issue a SEND or post a RECV at `now`. A RECV sends the ready notice; the
                # data leaves once the sender has issued the SEND and seen the notice.
                t = (-1 - op) >> 1
                if op & 1:  # RECV
                    posted[t] = now
                    if sent[t] is not None:
                        notice(t, now + latency)
                else:
                    sent[t] = now
                    if tick:
                        free_until[r] = now  # the runtime yields the core before the call
                    if posted[t] is not None:
                        ready = posted[t] + latency
                        leave(t, now) if ready <= now else notice(t, ready)
                if overhead[op & 1]:  # the call holds the device
                    if tick:
                        held_until[r] = now + overhead[op & 1]
                        resume[r] = i
                    yield timeout(overhead[op & 1])
                    now = env.now
                continue
            # Compute op. Start when the remote input is here. Where its arrival time is
            # known, waiting, computing and the runtime's work around it are one timeout;
            # only a tensor that has not left yet needs an event, which the sender triggers
            # at the arrival.
            start = now
            if producer[op] >= 0:
                at = arrive_at[op]
                if at is None:
                    waiter[op] = _Arrival(env)
                    free_until[r] = INF  # the rank waits: its transport thread runs
                    yield waiter[op]
                    now = at = arrive_at[op]
                if at > start:
                    start = at
                start += take_in  # the device takes the tensor in (0 unless modelled)
                free_until[r] = start
            start += before
            s, k, _ = actions[op]
            if k is _F:  # F takes its micro-batch's activations
                held += 1
                held_bytes += act_bytes[s]
                mem((start, held_bytes))
                act((start, held))
            end = start + dur[op]
            if tick:
                held_until[r] = end + after
                resume[r] = i
            yield timeout(end + after - now)
            now = env.now
            start_of[op], end_of[op] = start, end
            computing += end - start
            if k is _B or k is _W:  # the last backward (W where it is split) frees them
                held -= 1
                held_bytes -= act_bytes[s]
                mem((end, held_bytes))
                act((end, held))
        free_until[r] = INF  # done (or stuck): it waits for its sends
        busy_time[r] = computing
        finished[r] = runnable == len(prog)  # if not, the next compute waits on a later one

    for r in range(schedule.ranks):
        env.process(device(r))
    env.run()
    record = _Run(p, start_of, end_of, sent, posted, arrive_at)
    return record, memory, activations, finished, busy_time


def simulate(schedule: Schedule, costs: Costs | None = None, durations: Mapping[Action, float] | None = None
             ) -> Result:
    """Simulate one training step of `schedule` (compute-only or lowered) under `costs`.

    `durations` (compute action -> time) overrides the cost of those actions: to replay a
    measured step under the rules with the very compute times it had
    (`exec.compare.replay_error`).

    A schedule that cannot finish raises `ScheduleError` showing where each rank waits: the
    run itself is the deadlock check (`sim.passes.check_deadlock` explains what it found)."""
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
        # compute's end: every transfer feeds a compute that starts after it arrives.
        t0 = min((0.0 if prog[0] < 0 else record.start[prog[0]] for prog in record.plan.programs if prog),
                 default=0.0)
        makespan = max(record.end, default=0.0) - t0
        return Result(lowered or (lambda: lower(schedule)), record.events, memory, activations,
                      makespan=makespan, busy=busy, t0=t0)
    finally:
        if collecting:
            gc.enable()
