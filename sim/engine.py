"""The discrete-event engine: one SimPy process per device runs its lowered program.

The rules (docs/rules.md; `exec` honours the same ones):
1. A device runs its actions in program order, one at a time.
2. A compute action (F, B, I, W) starts when the device reaches it and every tensor it
   needs from another device has arrived; it then occupies the device for its cost.
3. A SEND is issued right after the compute that made its tensor and does not block the
   device. A RECV only posts the receive (one compute ahead, see `sim.passes.lower`).
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


def _costs(p: Plan, c: StageCosts):
    """Per compute id: its duration and the activation bytes of its stage; per transfer
    (named by the compute that receives it): its sending rank, its link (numbered per
    sender -> receiver pair) and the time it holds the link."""
    duration = {_F: c.forward, _B: c.backward, _I: c.backward_input, _W: c.backward_weight}
    dur = [duration[a.kind][a.stage] for a in p.actions]
    nbytes = [c.activation_bytes[a.stage] for a in p.actions]
    src, link, busy = [-1] * len(p.actions), [0] * len(p.actions), [0.0] * len(p.actions)
    links: dict[tuple[int, int], int] = {}
    for t, j in enumerate(p.producer):
        if j >= 0:
            src[t] = p.rank[j]
            link[t] = links.setdefault((src[t], p.rank[t]), len(links))
            # the tensor between stages s and s+1 has the size of stage s's output
            busy[t] = c.transfer_time(c.activation_bytes_sent[min(p.actions[j].stage, p.actions[t].stage)])
    return dur, nbytes, src, link, busy, len(links)


class _Run:
    """What a run recorded, as flat lists indexed by compute id (a transfer is numbered by
    the compute that receives it); `Event` records are made from them only on demand."""

    def __init__(self, p: Plan, src, start, end, sent, posted, arrive):
        self.plan, self.src = p, src
        self.start, self.end, self.sent, self.posted, self.arrive = start, end, sent, posted, arrive

    def events(self) -> list[Event]:
        p = self.plan
        out = [Event(r, a, s, e) for r, a, s, e in zip(p.rank, p.actions, self.start, self.end)]
        for t, j in enumerate(p.producer):
            if j >= 0:
                out.append(Event(self.src[t], p.comm_action(t, True), self.sent[t], self.arrive[t], p.rank[t]))
                out.append(Event(p.rank[t], p.comm_action(t, False), self.posted[t], self.arrive[t], self.src[t]))
        return out


def run(schedule: Schedule, c: StageCosts):
    """Run a schedule (compute-only, or lowered with complete communication). Return the
    `_Run` record, each rank's memory and activations over time, and which ranks finished
    their program (not all of them if the ranks got stuck)."""
    p = plan(schedule)
    dur, act_bytes, src, link, busy, nlinks = _costs(p, c)
    actions, producer, local = p.actions, p.producer, p.local
    n = ncomputes = len(p.actions)
    env = simpy.Environment()
    latency = c.latency
    sent: list[float | None] = [None] * n
    posted: list[float | None] = [None] * n
    arrive_at: list[float | None] = [None] * n       # known once sent and posted
    waiter: list[_Arrival | None] = [None] * n       # a receiver blocked on it
    link_free = [0.0] * nlinks
    start_of, end_of = [0.0] * ncomputes, [0.0] * ncomputes
    done = [False] * ncomputes
    finished = [False] * schedule.ranks
    busy_time = [0.0] * schedule.ranks

    def communicate(ops, now: float) -> None:
        """Issue SENDs and post RECVs at `now`; the second side of a transfer starts it: it
        takes the link from max(now, the time the link is free) for busy[t], and the data
        arrives `latency` after that."""
        for t, sending in ops:
            if sending:
                sent[t] = now
                if posted[t] is None:
                    continue
            else:
                posted[t] = now
                if sent[t] is None:
                    continue
            free = link_free[link[t]]
            leaves = (now if now >= free else free) + busy[t]
            link_free[link[t]] = leaves
            arrive_at[t] = leaves + latency
            if waiter[t] is not None:
                waiter[t].arrive_after(leaves + latency - now)

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
        for ops, i in p.programs[r]:
            if ops:
                communicate(ops, now)
            for d in local[i]:
                if not done[d]:
                    return  # a local input comes later in this very program: stuck for good
            # Start when the remote input is here. Where its arrival time is known, waiting
            # and computing are one timeout; only a tensor not sent yet needs an event,
            # which the sender triggers at the arrival.
            start = now
            if producer[i] >= 0:
                at = arrive_at[i]
                if at is None:
                    waiter[i] = _Arrival(env)
                    yield waiter[i]
                    now = at = arrive_at[i]
                if at > start:
                    start = at
            k = actions[i].kind
            if k is _F:  # F takes its micro-batch's activations
                held += 1
                held_bytes += act_bytes[i]
                mem((start, held_bytes))
                act((start, held))
            yield timeout(start + dur[i] - now)
            now = env.now
            start_of[i], end_of[i] = start, now
            computing += now - start
            done[i] = True
            if k is _B or k is _W:  # the last backward (W where it is split) frees them
                held -= 1
                held_bytes -= act_bytes[i]
                mem((now, held_bytes))
                act((now, held))
        communicate(p.tails[r], now)
        busy_time[r] = computing
        finished[r] = True

    for r in range(schedule.ranks):
        env.process(device(r))
    env.run()
    record = _Run(p, src, start_of, end_of, sent, posted, arrive_at)
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
