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
"""
from __future__ import annotations

import simpy

from .costs import Costs
from .ir import Action, Kind, Schedule
from .passes import _RECV_OF, _kinds, dependencies, peer, validate
from .result import Event, Result


class _Arrival(simpy.Event):
    """The arrival of one transfer at its receiver: triggered with a delay, like a Timeout,
    but created by whichever side (send or recv) gets there first."""

    def arrive_after(self, delay: float) -> None:
        self._ok = True
        self._value = None
        self.env.schedule(self, delay=delay)


def simulate(schedule: Schedule, costs: Costs | None = None) -> Result:
    """Simulate one training step of `schedule` (compute-only or lowered) under `costs`."""
    lowered = validate(schedule)
    c = (costs or Costs()).for_stages(lowered.stages)
    env = simpy.Environment()
    events: list[Event] = []
    placement = lowered.placement
    kinds = _kinds(lowered)
    durations = {Kind.F: c.forward, Kind.B: c.backward, Kind.I: c.backward_input, Kind.W: c.backward_weight}
    # the backward that frees a micro-batch's activations: W where the backward is split
    frees = {Kind.B, Kind.W}

    arrivals: dict[Action, _Arrival] = {}   # keyed by the RECV action
    pending: dict[Action, float] = {}       # transfers with one side there: recv -> time
    link_free: dict[tuple[int, int], float] = {}

    def start_transfer(recv: Action, src: int, dst: int, issued: float) -> None:
        nbytes = c.activation_bytes_sent[recv.stage - 1 if recv.kind is Kind.RECV_F else recv.stage]
        now = env.now
        begin = max(now, link_free.get((src, dst), 0.0))
        done = begin + c.transfer_time(nbytes)
        link_free[(src, dst)] = done
        arrive = done + c.latency
        arrivals.setdefault(recv, _Arrival(env)).arrive_after(arrive - now)
        events.append(Event(src, peer(recv), issued, arrive, dst))

    def rendezvous(recv: Action, src: int, dst: int, sending: bool) -> None:
        """Called by the sender and by the receiver; the second one starts the transfer."""
        other = pending.pop(recv, None)
        if other is None:
            pending[recv] = env.now
            return
        issued = env.now if sending else other
        start_transfer(recv, src, dst, issued)

    # for each compute action, the RECVs whose data it waits for
    waits: dict[Action, list[Action]] = {}
    for prog in lowered.programs:
        for a in prog:
            if a.kind.is_compute and a.kind is not Kind.W:
                waits[a] = [Action(a.stage, _RECV_OF[a.kind], a.micro)
                            for d in dependencies(a, lowered.stages, kinds)
                            if placement[d.stage] != placement[a.stage]]

    memory = [[(0.0, 0.0)] for _ in range(lowered.ranks)]
    activations = [[(0.0, 0)] for _ in range(lowered.ranks)]
    static = [0.0] * lowered.ranks
    for s, r in enumerate(placement):
        static[r] += c.static_bytes[s]
    for r in range(lowered.ranks):
        memory[r][0] = (0.0, static[r])

    def device(r: int):
        held_bytes, held = static[r], 0
        mem, act = memory[r], activations[r]
        posted_at: dict[Action, float] = {}
        for a in lowered.programs[r]:
            k = a.kind
            if k is Kind.SEND_F or k is Kind.SEND_B:
                recv = peer(a)
                rendezvous(recv, r, placement[recv.stage], sending=True)
            elif k is Kind.RECV_F or k is Kind.RECV_B:
                src = placement[peer(a).stage]
                posted_at[a] = env.now
                rendezvous(a, src, r, sending=False)
            else:
                for recv in waits.get(a, ()):
                    ev = arrivals.get(recv)
                    if ev is None:
                        ev = arrivals[recv] = _Arrival(env)
                    if not ev.processed:
                        yield ev
                    events.append(Event(r, recv, posted_at.pop(recv), env.now, placement[peer(recv).stage]))
                start = env.now
                if k is Kind.F:
                    held += 1
                    held_bytes += c.activation_bytes[a.stage]
                    mem.append((start, held_bytes))
                    act.append((start, held))
                yield env.timeout(durations[k][a.stage])
                events.append(Event(r, a, start, env.now))
                if k in frees:
                    held -= 1
                    held_bytes -= c.activation_bytes[a.stage]
                    mem.append((env.now, held_bytes))
                    act.append((env.now, held))

    for r in range(lowered.ranks):
        env.process(device(r))
    env.run()
    return Result(lowered, events, memory, activations)
