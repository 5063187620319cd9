"""The discrete-event engine: one SimPy process per device runs its lowered program.

The rules (docs/rules.md; `exec` honours the same ones):
1. A device runs its actions in program order, one at a time.
2. A compute action (F, B, I, W) starts when the device reaches it and every tensor it
   needs from another device has arrived and been taken in (`arrive_overhead` after the
   later of the two); it then occupies the device for its cost.
3. A SEND is issued right after the compute that made its tensor and does not wait for
   the transfer. A RECV only posts the receive (one compute ahead, see `sim.passes.lower`).
   Issuing a SEND holds the device for `send_overhead`, posting a RECV for
   `recv_overhead` (the CPU time of the call); the transfer may start when the call does.
4. A transfer starts once it is both sent and posted (both gloo and NCCL rendezvous);
   it then waits for its link (one per direction between two devices, FIFO), occupies it
   for bytes / bandwidth, and arrives `latency` later; the latency does not hold the link.
5. Memory of a device = static bytes + the activations of each micro-batch it holds,
   from the start of that micro-batch's F until the end of its last backward (B or W).

How it stays fast (docs/performance.md): it runs the numbered `sim.passes.plan`, not
`Action` objects. A compute whose input's arrival time is known waits and computes in one
timeout; a transfer is an event only when its receiver already waits for it. Link
queueing needs no process: each link keeps the time it is next free. A run that stops
with ranks unfinished is a deadlock, explained by `sim.passes.check_deadlock`.
"""
from __future__ import annotations

import gc
from operator import itemgetter

import simpy

from .costs import Costs, StageCosts
from .ir import Schedule
from .passes import _B, _F, _I, _W, Plan, check_communication, check_complete, check_deadlock, lower, plan
from .result import Event, Result


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


def run(schedule: Schedule, c: StageCosts):
    """Run a schedule (compute-only, or lowered with complete communication). Return the
    `_Run` record, each rank's memory and activations over time, and which ranks finished
    their program (not all of them if the ranks got stuck)."""
    p = plan(schedule)
    dur, link, busy, nlinks = _costs(p, c, schedule.placement)
    act_bytes = c.activation_bytes
    actions, producer = p.actions, p.producer
    n = ncomputes = len(p.actions)
    env = simpy.Environment()
    latency, take_in = c.latency, c.arrive_overhead
    overhead = (c.send_overhead, c.recv_overhead)  # indexed by op & 1: 0 for a SEND, 1 for a RECV
    sent: list[float | None] = [None] * n
    posted: list[float | None] = [None] * n
    arrive_at: list[float | None] = [None] * n       # known once sent and posted
    waiter: list[_Arrival | None] = [None] * n       # a receiver blocked on it
    link_free = [0.0] * nlinks
    start_of, end_of = [0.0] * ncomputes, [0.0] * ncomputes
    finished = [False] * schedule.ranks
    busy_time = [0.0] * schedule.ranks

    static = [0.0] * schedule.ranks
    for s, r in enumerate(schedule.placement):
        static[r] += c.static_bytes[s]
    memory = [[(0.0, static[r])] for r in range(schedule.ranks)]
    activations = [[(0.0, 0)] for _ in range(schedule.ranks)]

    def device(r: int):
        held_bytes, held = static[r], 0
        mem, act = memory[r].append, activations[r].append
        timeout = env.timeout
        now = env.now
        computing = 0.0  # this rank's busy time
        prog, runnable = p.programs[r], p.runnable[r]
        for op in prog if runnable == len(prog) else prog[:runnable]:
            if op < 0:
                # Issue a SEND or post a RECV at `now`. The second side of a transfer starts
                # it: it takes the link from max(now, the time the link is free) for busy[t],
                # and the data arrives `latency` after that.
                t = (-1 - op) >> 1
                if op & 1:  # RECV
                    posted[t] = now
                    second = sent[t] is not None
                else:
                    sent[t] = now
                    second = posted[t] is not None
                if second:
                    free = link_free[link[t]]
                    leaves = (now if now >= free else free) + busy[t]
                    link_free[link[t]] = leaves
                    arrive_at[t] = leaves + latency
                    if waiter[t] is not None:
                        waiter[t].arrive_after(leaves + latency - now)
                if overhead[op & 1]:  # the call holds the device
                    yield timeout(overhead[op & 1])
                    now = env.now
                continue
            # Compute op. Start when the remote input is here. Where its arrival time is
            # known, waiting and computing are one timeout; only a tensor not sent yet needs
            # an event, which the sender triggers at the arrival.
            start = now
            if producer[op] >= 0:
                at = arrive_at[op]
                if at is None:
                    waiter[op] = _Arrival(env)
                    yield waiter[op]
                    now = at = arrive_at[op]
                if at > start:
                    start = at
                start += take_in  # the device takes the tensor in (0 unless modelled)
            s, k, _ = actions[op]
            if k is _F:  # F takes its micro-batch's activations
                held += 1
                held_bytes += act_bytes[s]
                mem((start, held_bytes))
                act((start, held))
            yield timeout(start + dur[op] - now)
            now = env.now
            start_of[op], end_of[op] = start, now
            computing += now - start
            if k is _B or k is _W:  # the last backward (W where it is split) frees them
                held -= 1
                held_bytes -= act_bytes[s]
                mem((now, held_bytes))
                act((now, held))
        busy_time[r] = computing
        finished[r] = runnable == len(prog)  # if not, the next compute waits on a later one

    for r in range(schedule.ranks):
        env.process(device(r))
    env.run()
    record = _Run(p, start_of, end_of, sent, posted, arrive_at)
    return record, memory, activations, finished, busy_time


def simulate(schedule: Schedule, costs: Costs | None = None) -> Result:
    """Simulate one training step of `schedule` (compute-only or lowered) under `costs`.

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
        record, memory, activations, finished, busy = run(schedule, c)
        lowered = schedule if schedule.is_lowered else None
        if not all(finished):
            lowered = lowered or lower(schedule)
            check_deadlock(lowered)  # raises, naming each stuck rank and what it waits for
            raise AssertionError("the simulation stopped early but the schedule does not deadlock")
        # every transfer feeds a compute that starts after it arrives: the last compute ends the step
        makespan = max(record.end, default=0.0)
        return Result(lowered or (lambda: lower(schedule)), record.events, memory, activations,
                      makespan=makespan, busy=busy)
    finally:
        if collecting:
            gc.enable()
