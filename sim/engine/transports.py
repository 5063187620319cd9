"""Transports as models: when a transfer may leave its sender, and what it costs the two ends.

The engine (`sim.engine`) knows actions, devices and links: a transfer that leaves at
time t waits for its link (FIFO), holds it for bytes / bandwidth, and arrives `latency`
later (rule 6). What happens before the data leaves belongs to the transport, chosen by
name in `Costs.transport`:

- `ideal`: the data leaves when its SEND is issued, right after the compute that made
  it; issuing, posting and taking in cost nothing. For planning: what the links allow.
- `gloo-cpu`: the executor's runtime on CPU ranks over gloo (docs/rules.md): the
  rendezvous of rule 5 (the data leaves once the SEND is issued and the receiver's ready
  notice is in), the cost of the isend and irecv calls and of taking data in (rules 2
  and 3: `send_overhead`, `recv_overhead`, `arrive_overhead`), and a late notice that
  waits for the sender's I/O thread (rule 10: `io_tick`). With all of these at 0 it is
  the plain rendezvous.

A transport binds two hooks to the run's links (`bind`, a `sim.engine.links.Links`):
`issued(t, now)` when the SEND of transfer t is issued and `posted(t, now)` when its RECV
is posted; they call `links.leave(t, at)` once they know when the data leaves. A transport that needs to know
what a sender is doing when a notice comes in sets `watches_devices`; the engine then
keeps, per rank, until when its transport thread is free to run (`free_until`: it waits,
or it is in a SEND call), until when its current action holds it (`held_until`) and
where its program goes on (`resume`). To add one (an `nccl` model, say): subclass
`Transport` or `Rendezvous`, list the `Costs` fields it reads, and register it in
`TRANSPORTS`.
"""
from __future__ import annotations

from typing import Callable

from sim.schedule.kinds import Role
from .fields import CALL_FIELDS

INF = float("inf")

Hook = Callable[[int, float], None]  # (transfer, now)

# the Costs fields of the calls (`CostField.call`); every transport reads latency and bandwidth (the links)


class Transport:
    """A transport model: `fields` are the `Costs` fields it reads besides latency and
    bandwidth; a Costs that sets any other of the call fields is refused."""

    name = "transport"
    fields: tuple[str, ...] = ()
    watches_devices = False

    def __init__(self, costs):
        self.costs = costs  # a sim.engine.costs.StageCosts
        get = lambda f: getattr(costs, f) if f in self.fields else 0.0  # noqa: E731
        self.send_call = get("send_overhead")     # issuing a SEND holds its rank this long
        self.recv_call = get("recv_overhead")     # posting a RECV holds its rank this long
        self.take_in = get("arrive_overhead")     # taking arrived data in, before the compute

    @classmethod
    def check(cls, costs) -> None:
        """Refuse a `Costs` that sets a call field this transport does not model."""
        for f in CALL_FIELDS:
            if f not in cls.fields and getattr(costs, f):
                raise ValueError(f"Costs.{f} is a cost of the gloo-cpu transport, not of {cls.name!r}; "
                                 f"leave it at 0 or use transport='gloo-cpu'")

    def prepare(self, program, dur: list[float]) -> None:
        """Look at the whole run before it starts (`program`: the compiled `sim.engine.program.Program`; `dur`:
        each compute's time)."""

    def bind(self, links) -> tuple[Hook, Hook]:
        raise NotImplementedError


class Ideal(Transport):
    """The data leaves when its SEND is issued; no call costs."""

    name = "ideal"

    def bind(self, links) -> tuple[Hook, Hook]:
        def posted(t: int, now: float) -> None:
            pass

        return links.leave, posted  # the data leaves as the SEND is issued


class Rendezvous(Transport):
    """Rule 5: posting the RECV sends a ready notice that reaches the sender `latency`
    later; the data leaves once the SEND is issued and the notice is in. A notice that
    comes after the SEND is handled by `notice`: here at once."""

    name = "rendezvous"

    def bind(self, links) -> tuple[Hook, Hook]:
        sent, posted_at, leave, latency = links.sent, links.posted, links.leave, self.costs.latency
        notice = self.notice(links)

        def issued(t: int, now: float) -> None:
            if posted_at[t] is not None:
                ready = posted_at[t] + latency
                leave(t, now) if ready <= now else notice(t, ready)

        def posted(t: int, now: float) -> None:
            # (the engine may learn of a SEND before a RECV posted earlier: `sim.engine`
            # lets a device run ahead where the order of events does not matter)
            if sent[t] is not None:
                ready = now + latency
                leave(t, sent[t]) if ready <= sent[t] else notice(t, ready)

        return issued, posted

    def notice(self, links) -> Callable[[int, float], None]:
        """What happens when the ready notice of transfer t reaches its sender at `at`,
        after the SEND was issued: the data leaves then."""
        return links.leave


def expected_wait(until_yield: float, tick: float) -> float:
    """The expected wait of a message for a computing rank's transport thread: it runs at
    the rank's next yield, `until_yield` away, or at the scheduler tick, uniform on
    [0, tick] over the tick's unknown phase: E[min(X, U(0, tick))] (math.inf: X)."""
    if until_yield < tick:
        return until_yield - until_yield * until_yield / (2 * tick)
    return tick / 2


class GlooCpu(Rendezvous):
    """The rendezvous as the executor's gloo runtime on CPU ranks runs it: the isend and
    irecv calls hold their rank (rules 2, 3), taking data in holds the receiver (rule 3),
    and a notice that comes in while the sender computes waits for the sender's I/O
    thread: its next yield or the scheduler tick, whichever comes first (rule 10)."""

    name = "gloo-cpu"
    fields = CALL_FIELDS

    @property
    def watches_devices(self) -> bool:  # only rule 10 needs to know what a sender does
        return bool(self.costs.io_tick)

    def prepare(self, program, dur: list[float]) -> None:
        """For each rank and position i of its program, how long after reaching action i
        the rank next lets its transport thread run if nothing makes it wait: at a SEND
        (it yields the core first), at a compute with an input from another rank (it
        waits for the data or takes it in) or a pair's mark whose backward has one, or at its end. A compute in between holds the
        rank for its cost and the runtime's own time around it; a RECV post for its call;
        an action beside the device (a collective) not at all."""
        if not self.watches_devices:
            return
        around = self.costs.before_compute + self.costs.after_compute
        self.to_yield = []
        for prog, end in zip(program.programs, program.runnable):
            out = [0.0] * (end + 1)
            ahead = 0.0
            for i in range(end - 1, -1, -1):
                role, x = prog[i]
                if role is Role.RECV:
                    ahead += self.recv_call
                elif role is Role.SEND or (role is Role.PAIR and program.producer[x] >= 0):
                    ahead = 0.0  # (a pair's mark waits for its backward's input from another rank, rule 18)
                elif role is not Role.COMPUTE:
                    pass  # it goes to its resource beside the device (a collective stream): the rank does not stop
                elif program.producer[x] >= 0:
                    ahead = 0.0
                else:
                    ahead += dur[x] + around
                out[i] = ahead
            self.to_yield.append(out)

    def notice(self, links) -> Callable[[int, float], None]:
        tick = self.costs.io_tick
        if not tick:
            return links.leave
        env, leave, later = links.env, links.leave, links.later
        sender = [links.program.rank[j] if j >= 0 else -1 for j in links.program.producer]
        free_until, held_until, resume, to_yield = links.free_until, links.held_until, links.resume, self.to_yield
        at_yield = links.at_yield

        def notice(t: int, at: float) -> None:
            now = env.now
            if at > now:  # what the sender is doing then is known only then
                return later(at - now, notice, t, at)
            r = sender[t]
            if now <= free_until[r]:
                leave(t, now)
            elif tick == INF:  # at the sender's next yield, which its loop reports (`yielded`)
                at_yield[r].append(t)
            else:
                leave(t, now + expected_wait(held_until[r] + to_yield[r][resume[r]] - now, tick))

        return notice


TRANSPORTS: dict[str, type[Transport]] = {"ideal": Ideal, "gloo-cpu": GlooCpu}


def transport_class(name: str) -> type[Transport]:
    """The transport model registered under `name`."""
    try:
        return TRANSPORTS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown transport {name!r}; choose one of {', '.join(TRANSPORTS)}") from None
