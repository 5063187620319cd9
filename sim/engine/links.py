"""The links of one engine run, the simulator's transfer model: when each transfer leaves its sender, takes its link and arrives.

`Links` keeps when each transfer's SEND was issued and its RECV posted, and when its data
arrives (rules 5, 6 and 10 of docs/rules.md). `sim.engine.core` makes one per run; the
transport's hooks (`sim.engine.transports`) read it and call its `leave`, and each device's
loop reports to it where the rank lets its transport thread run (`yielded`). (NCCL's cost
model of a network, for the planner, is `sim.hardware.network`.)
"""
from __future__ import annotations

import simpy

from .costs import StageCosts
from .program import Program

INF = float("inf")


class Arrival(simpy.Event):
    """The arrival of a transfer that a receiver is already waiting for: the sender
    triggers it with a delay, as a Timeout would be."""

    def arrive_after(self, delay: float) -> None:
        self._ok = True
        self._value = None
        self.env.schedule(self, delay=delay)


class Links:
    """What the engine knows of transfers while it runs, and what a transport's hooks
    read and call (`sim.engine.transports`): when each SEND was issued and each RECV posted,
    `leave` (the data takes its link and arrives), `later` (run a function at a later
    time), and, if the transport watches the devices, each rank's state.

    `env` is the run's SimPy environment, or None where the devices run ahead of it
    (`sim.engine.devices.run_ahead`: no link queues, no transport watching): a receiver
    that waits is then woken by its rank's number in `woken`, not by a SimPy event. `link`,
    `busy`: per transfer, its link (of `nlinks`) and the time it holds it (`sim.engine.core.per_transfer`;
    not needed running ahead)."""

    def __init__(self, env: simpy.Environment | None, p: Program, c: StageCosts,
                 link: list[int] | None = None, busy: list[float] | None = None, nlinks: int = 0):
        n, ranks = len(p.actions), p.ranks
        self.env, self.program = env, p
        self.sent: list[float | None] = [None] * n
        self.posted: list[float | None] = [None] * n
        self.arrive_at: list[float | None] = [None] * n   # known once the data has left
        self.waiter: list = [None] * n   # a receiver blocked on it: its Arrival, or (running ahead) its rank
        self.woken: list[int] = []       # running ahead: the ranks whose data arrived, to go on
        # each rank's state, for a transport that watches it: until when its transport thread
        # may run at once (it waits, or has ended, or is in a SEND call), until when its
        # current action holds it, and where its program goes on
        self.free_until = [-1.0] * ranks
        self.held_until = [0.0] * ranks
        self.resume = [0] * ranks
        self.at_yield: list[list[int]] = [[] for _ in range(ranks)]  # notices waiting for each rank's next yield
        if env is None:
            self.leave = self._leave_at_once(c.latency)
        else:
            self.leave = self._leave_by_the_links(c.latency, link, busy, nlinks)

    def wait(self, r: int, x: int):
        """Rank r waits until the data of transfer x has left and its arrival is known (rule
        10: its transport thread runs meanwhile); returns what its loop yields to wait."""
        self.free_until[r] = INF
        if self.env is None:
            self.waiter[x] = r
            return x
        self.waiter[x] = Arrival(self.env)
        return self.waiter[x]

    def yielded(self, r: int, now: float) -> None:
        """Rank r lets its transport thread run at `now`: the notices that waited for it
        (`at_yield`, rule 10 without a tick) are taken in, and their data leave."""
        for t in self.at_yield[r]:
            self.leave(t, now)
        self.at_yield[r].clear()

    def later(self, delay: float, fn, *args) -> None:
        """Call fn(*args) `delay` from now (on SimPy's clock)."""
        self.env.timeout(delay).callbacks.append(lambda _: fn(*args))

    def _leave_at_once(self, latency: float):
        arrive_at, waiter, woken = self.arrive_at, self.waiter, self.woken

        def leave(t: int, at: float) -> None:
            """The data of transfer t leaves its sender at `at` and arrives `latency` later:
            with free bandwidth, links never make one wait."""
            arrive_at[t] = at + latency
            if waiter[t] is not None:
                woken.append(waiter[t])

        return leave

    def _leave_by_the_links(self, latency: float, link, busy, nlinks: int):
        env, later, arrive_at, waiter = self.env, self.later, self.arrive_at, self.waiter
        link_free = [0.0] * nlinks
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

        return leave
