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

How it stays fast (docs/performance.md): a transfer costs one SimPy event, its arrival.
Link queueing needs no process: each link keeps the time it is next free, so a transfer
that starts at `now` occupies it from max(now, free) on. Before the run, every program is
turned into a list of plain tuples and every transfer into an integer id, so the inner
loop does no dictionary work on `Action`s.
"""
from __future__ import annotations

import gc

import simpy

from .costs import Costs, StageCosts
from .ir import Kind, Schedule
from .passes import _B, _F, _I, _RECV_B, _RECV_F, _RECV_OF, _SEND_B, _SEND_F, _W, _peer_key, validate
from .result import Event, Result


class _Arrival(simpy.Event):
    """The arrival of one transfer at its receiver: triggered with a delay, like a Timeout,
    but created by whichever side (send or recv) gets there first."""

    def arrive_after(self, delay: float) -> None:
        self._ok = True
        self._value = None
        self.env.schedule(self, delay=delay)


# the step kinds of a device's program, once turned into tuples (see `_steps`)
_SEND, _RECV, _COMPUTE = 0, 1, 2


def _steps(lowered: Schedule, c: StageCosts):
    """Number the transfers and turn each program into a list of plain tuples:
    (_SEND, transfer), (_RECV, transfer) and (_COMPUTE, action, duration, transfers it
    waits for, whether it takes activations (F), whether it frees them (the last
    backward: B, or W where the backward is split), activation bytes of its stage).
    Transfer t has recv[t] and send[t] (its two actions), src[t] and dst[t] (ranks),
    link[t] (index of the link src -> dst) and busy[t] (the time it holds the link)."""
    placement = lowered.placement
    duration = {_F: c.forward, _B: c.backward, _I: c.backward_input, _W: c.backward_weight}
    # A transfer is named by its RECV (stage, kind, micro), as in `sim.passes`: the RECV
    # names the compute that consumes the tensor, the SEND is its `peer`.
    ids: dict[tuple[int, Kind, int], int] = {}
    recv, send, src, dst, link, busy = [], [], [], [], [], []
    links: dict[tuple[int, int], int] = {}
    for prog in lowered.programs:
        for a in prog:
            if a.kind is _RECV_F or a.kind is _RECV_B:
                ids[(a.stage, a.kind, a.micro)] = len(recv)
                recv.append(a)
                send.append(None)  # filled in below, from the sender's program
                src.append(placement[a.stage - 1 if a.kind is _RECV_F else a.stage + 1])
                dst.append(placement[a.stage])
                link.append(links.setdefault((src[-1], dst[-1]), len(links)))
                nbytes = c.activation_bytes_sent[a.stage - 1 if a.kind is _RECV_F else a.stage]
                busy.append(c.transfer_time(nbytes))
    programs = []
    for prog in lowered.programs:
        steps = []
        for a in prog:
            k = a.kind
            if k is _SEND_F or k is _SEND_B:
                t = ids[_peer_key(a.stage, k, a.micro)]
                send[t] = a
                steps.append((_SEND, t))
            elif k is _RECV_F or k is _RECV_B:
                steps.append((_RECV, ids[(a.stage, k, a.micro)]))
            else:
                # the transfer it waits for: the RECV named after it, if there is one
                # (`check_deadlock` made sure there is one exactly for each remote input)
                t = ids.get((a.stage, _RECV_OF[k], a.micro)) if k is not _W else None
                # F takes its activations, the last backward (B, or W where it is split) frees them
                steps.append((_COMPUTE, a, duration[k][a.stage], () if t is None else (t,),
                              k is _F, k is _B or k is _W, c.activation_bytes[a.stage]))
        programs.append(steps)
    return programs, recv, send, src, dst, link, busy, len(links)


def run(lowered: Schedule, c: StageCosts):
    """Run a lowered, validated schedule; return (events, memory, activations), the
    fields of `Result`."""
    programs, recv, send, src, dst, link, busy, nlinks = _steps(lowered, c)
    ntransfers = len(recv)
    env = simpy.Environment()
    latency = c.latency
    events: list[Event] = []
    record = events.append
    arrivals: list[_Arrival | None] = [None] * ntransfers
    pending: list[float | None] = [None] * ntransfers  # transfers with one side there: its time
    posted_at: list[float] = [0.0] * ntransfers
    link_free = [0.0] * nlinks

    def arrival(t: int) -> _Arrival:
        ev = arrivals[t]
        if ev is None:
            ev = arrivals[t] = _Arrival(env)
        return ev

    def rendezvous(t: int, sending: bool) -> None:
        """Called by the sender and by the receiver; the second one starts the transfer:
        it takes the link from max(now, the time the link is free) for busy[t], and the
        data arrives `latency` after that."""
        t_now = env.now
        other = pending[t]
        if other is None:
            pending[t] = t_now
            return
        pending[t] = None
        issued = t_now if sending else other
        free = link_free[link[t]]
        done = (t_now if t_now >= free else free) + busy[t]
        link_free[link[t]] = done
        arrive = done + latency
        arrival(t).arrive_after(arrive - t_now)
        record(Event(src[t], send[t], issued, arrive, dst[t]))

    static = [0.0] * lowered.ranks
    for s, r in enumerate(lowered.placement):
        static[r] += c.static_bytes[s]
    memory = [[(0.0, static[r])] for r in range(lowered.ranks)]
    activations = [[(0.0, 0)] for _ in range(lowered.ranks)]

    def device(r: int):
        held_bytes, held = static[r], 0
        mem, act = memory[r].append, activations[r].append
        timeout = env.timeout
        for step in programs[r]:
            op = step[0]
            if op == _SEND:
                rendezvous(step[1], True)
            elif op == _RECV:
                posted_at[step[1]] = env.now
                rendezvous(step[1], False)
            else:
                _, a, duration, waits, takes, frees, nbytes = step
                for t in waits:
                    ev = arrival(t)
                    if ev.callbacks is not None:  # not processed yet: wait for it
                        yield ev
                    record(Event(r, recv[t], posted_at[t], env.now, src[t]))
                start = env.now
                if takes:
                    held += 1
                    held_bytes += nbytes
                    mem((start, held_bytes))
                    act((start, held))
                yield timeout(duration)
                end = env.now
                record(Event(r, a, start, end))
                if frees:
                    held -= 1
                    held_bytes -= nbytes
                    mem((end, held_bytes))
                    act((end, held))

    for r in range(lowered.ranks):
        env.process(device(r))
    env.run()
    return events, memory, activations


def simulate(schedule: Schedule, costs: Costs | None = None) -> Result:
    """Simulate one training step of `schedule` (compute-only or lowered) under `costs`."""
    # A step of a big schedule makes millions of small objects that all live to the end;
    # Python's cyclic garbage collector would walk them again and again (it doubles the
    # time of p=64, m=1024). None of them needs collecting before we return.
    collecting = gc.isenabled()
    gc.disable()
    try:
        lowered = validate(schedule)
        c = (costs or Costs()).for_stages(lowered.stages)
        events, memory, activations = run(lowered, c)
        return Result(lowered, events, memory, activations)
    finally:
        if collecting:
            gc.enable()
