"""The automatic zero-bubble scheduler: the heuristic of Qi et al., "Zero Bubble Pipeline
Parallelism" (ICLR 2024), Section 3.1, tried over a grid of its knobs, each candidate
simulated, the fastest that fits the memory limit kept.

The heuristic lays out the device programs together, in time order (a list scheduler:
the device that is free earliest picks its next action; a transfer takes the paper's
T_comm, latency + activation bytes / bandwidth). A free device picks:

1. An I (input gradient) or an F (forward) whose input is there, in the order the knob
   `forward_first` says. Until its first I, a device runs as many forwards as memory
   allows (the paper's rule 1, warm-up); after it, a forward only replaces a micro-batch
   that an I finished, so the count in flight stays at the warm-up's (rule 2, one F and
   one B in turn).
2. If memory holds back what is ready, a W (weight gradient), which gives bytes back
   (rule 2, W "recycles memory").
3. With nothing ready, a W if it fits in the bubble before the next input; when the
   bubble is shorter than a W, the knob `fill` decides: "fit" waits, "always" inserts
   the W anyway, "balance" inserts it if the bubble would make this device's cumulative
   bubble the largest of all (rule 2).
4. The W passes left at the end (rule 4).
Rule 3 (a stage runs at least one more F than the next) holds by construction.

Memory is counted as the engine counts it (docs/rules.md, `sim.schedule.liveness`): activation_bytes
from the start of F to the end of I, then w_activation_bytes until the end of W. The
knob `budget`: device r may hold `budget * max(activation_bytes[r], w_activation_bytes[r])`
bytes (budget micro-batches' worth).

`zb_auto` takes the I/W-split 1F1B and ZB-H1 (`sim.schedule.zerobubble`: `split_1f1b`,
`zb_h1`) and the heuristic for every knob setting and budget (1, 2, ... and no bound; `budgets` leaves
out those whose runs cannot fit), simulates every candidate whose peak fits the limit
and keeps the shortest makespan; among equal makespans the smallest bubble of one
device (`device_bubble`, the paper's measure), then the smallest peak. The candidates
are a family that does not depend on the limit, filtered by it: more memory never makes
the result worse. It adds itself to `sim.SCHEDULES` as "zb-auto" (a search that simulates
lives above the engine, the registry below it).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import lru_cache

from sim.engine.costs import Costs, StageCosts
from sim.simulation import simulate
from sim.schedule.ir import Action, Kind, Schedule, ScheduleError
from sim.schedule.liveness import held_after, schedule_peak
from sim.schedule.registry import SCHEDULES, Generator
from sim.schedule.zerobubble import split_1f1b, zb_h1

FILLS = ("fit", "always", "balance")


@dataclass(frozen=True)
class Knobs:
    """One setting of the heuristic: see the module's docstring."""

    budget: int | None    # micro-batches' worth of bytes each device may hold (None: no bound)
    forward_first: bool   # when both are ready, F before I
    fill: str             # what to do with a bubble shorter than a W: "fit", "always", "balance"


def within(nbytes: float, limit: float) -> bool:
    """nbytes <= limit, but for the rounding of adding and taking back bytes that are not
    whole numbers (a relative 1e-9: far below one byte of any real step)."""
    return nbytes <= limit * (1 + 1e-9)


class _Greedy:
    """One run of the heuristic: the device programs, each action's end time and
    whether the memory budget ever held an action back."""

    def __init__(self, devices: int, micro_batches: int, c: StageCosts, knobs: Knobs):
        self.P, self.M, self.c, self.k = devices, micro_batches, c, knobs
        self.unit = [max(a, w) for a, w in zip(c.activation_bytes, c.w_activation_bytes)]
        self.hop = [c.latency + c.transfer_time(b) for b in c.activation_bytes_sent]  # T_comm from stage s to s+1
        self.clock = [0.0] * devices
        self.done = {Kind.F: [0] * devices, Kind.I: [0] * devices, Kind.W: [0] * devices}
        self.end: dict[tuple[int, Kind, int], float] = {}
        self.bubble = [0.0] * devices
        self.programs: list[list[Action]] = [[] for _ in range(devices)]
        self.bound = False
        self.asked = False  # whether the knob `fill` decided anything (a bubble shorter than a W)
        self.costs = {Kind.F: c.forward, Kind.I: c.backward_input, Kind.W: c.backward_weight}
        self.warmup = [0] * devices  # forwards a device ran before its first I (0: none yet)

    def ready(self, s: int, kind: Kind) -> tuple[float, bool]:
        """When the next `kind` of stage s may start: (time, exact) where not exact means
        its input is not made yet and the time is only a lower bound."""
        m = self.done[kind][s]
        if kind is Kind.F:
            if s == 0:
                return 0.0, True
            src, hop = (s - 1, Kind.F, m), self.hop[s - 1]
        else:
            own = self.end[s, Kind.F, m]
            if s == self.P - 1:
                return own, True
            src, hop = (s + 1, Kind.I, m), self.hop[s]
        if src in self.end:
            return max(self.end[src] + hop, 0.0 if kind is Kind.F else own), True
        return self.clock[src[0]] + self.costs[src[1]][src[0]] + hop, False

    def held(self, s: int, kind: Kind | None = None) -> float:
        """Activation bytes device s holds now, or after one more `kind`: counted from the
        actions done (`sim.schedule.liveness.held_after`)."""
        return held_after({k: done[s] + (k is kind) for k, done in self.done.items()}, self.c, s)

    def fits(self, s: int, kind: Kind) -> bool:
        """Whether one more `kind` on device s keeps it within its budget: an action that
        gives bytes back (W), or holds no more than before (I where W needs no more than F
        saved), always does."""
        c = self.c
        grows = {Kind.F: c.activation_bytes[s], Kind.I: c.w_activation_bytes[s] - c.activation_bytes[s],
                 Kind.W: -c.w_activation_bytes[s]}[kind]
        if grows <= 0 or self.k.budget is None:
            return True
        return within(self.held(s, kind), self.k.budget * self.unit[s])

    def put(self, s: int, kind: Kind, start: float) -> bool:
        m = self.done[kind][s]
        self.clock[s] = self.end[s, kind, m] = start + self.costs[kind][s]
        if kind is Kind.I and not self.warmup[s]:
            self.warmup[s] = self.done[Kind.F][s]
        self.done[kind][s] += 1
        self.programs[s].append(Action(s, kind, m))
        return True

    def step(self, s: int) -> bool:
        """Lay out stage s's next action, or move its clock to the time it waits for.
        False when it can do neither (its producer has the same clock)."""
        now, done = self.clock[s], self.done
        options = []  # (kind, ready time, exact), in the order the knob prefers
        if done[Kind.I][s] < done[Kind.F][s]:
            options.append((Kind.I, *self.ready(s, Kind.I)))
        in_flight = done[Kind.F][s] - done[Kind.I][s]
        if done[Kind.F][s] < self.M and (not self.warmup[s] or in_flight < self.warmup[s]):  # rule 2: 1F per I
            options.append((Kind.F, *self.ready(s, Kind.F)))
        if self.k.forward_first:
            options.reverse()
        w_left = done[Kind.W][s] < done[Kind.I][s]
        ready = [kind for kind, t, exact in options if exact and t <= now]
        for kind in ready:
            if self.fits(s, kind):
                return self.put(s, kind, now)
        if ready:
            self.bound = True  # memory holds back what is ready: a W gives some back (rule 2)
            if w_left:
                return self.put(s, Kind.W, now)
        waits = [(t, exact) for kind, t, exact in options if kind not in ready]
        nxt, exact = min(waits) if waits else (math.inf, True)
        if w_left and self.fill(s, nxt - now, exact):
            return self.put(s, Kind.W, now)  # a W in the bubble (rule 3), or the last ones (rule 4)
        if nxt <= now or math.isinf(nxt):
            return False
        self.bubble[s] += (nxt - now) * (done[Kind.F][s] > 0)
        self.clock[s] = nxt  # idle until then at least
        return True

    def fill(self, s: int, gap: float, exact: bool) -> bool:
        """Rule 3 of the module's docstring: does a W go into a bubble of `gap`?"""
        if gap >= self.c.backward_weight[s]:
            return True
        self.asked = True
        if self.k.fill == "always":
            return True
        return self.k.fill == "balance" and exact and self.bubble[s] + gap > max(self.bubble)

    def run(self) -> "_Greedy":
        live, clock, ws = list(range(self.P)), self.clock.__getitem__, self.done[Kind.W]
        while live:
            s = min(live, key=clock)
            if not self.step(s):  # the earliest device, else the next that can move
                if not any(self.step(s) for s in sorted(live, key=clock)):
                    raise ScheduleError("zb-auto heuristic stalled")  # zero costs all round
                live = [s for s in live if ws[s] < self.M]
            elif ws[s] >= self.M:  # only s moved: only s can have finished
                live.remove(s)
        return self


@lru_cache(maxsize=4096)
def heuristic(devices: int, micro_batches: int, c: StageCosts, knobs: Knobs) -> tuple[tuple[tuple[Action, ...], ...], bool, bool]:
    """The device programs the heuristic lays out with `knobs`; whether its memory budget
    held an action back (if not, a larger budget lays out the same); whether the knob
    `fill` decided anything (if not, another `fill` lays out the same)."""
    g = _Greedy(devices, micro_batches, c, knobs).run()
    return tuple(map(tuple, g.programs)), g.bound, g.asked


def candidates(devices: int, micro_batches: int, c: StageCosts, limit: float, runs: int | None = None):
    """The candidate schedules that may fit `limit`: the I/W-split 1F1B, ZB-H1 where
    `sim.schedule.zerobubble.zb_h1`, and the heuristic for each knob setting and each budget
    (`budgets`) up to the first that does not bind; with `runs`, at most that many runs of
    the heuristic, the likeliest fastest first (`_few`)."""
    yield split_1f1b(devices, micro_batches)
    yield zb_h1(devices, micro_batches)
    yield from (_every if runs is None else _few)(devices, micro_batches, c, limit, runs)


def _every(devices: int, micro_batches: int, c: StageCosts, limit: float, runs=None):
    """The heuristic for every knob setting and every budget up to the first that does not bind."""
    seen = set()
    for forward_first, fill in itertools.product((False, True), FILLS):
        for budget in budgets(c, limit):
            programs, bound, asked = heuristic(devices, micro_batches, c, Knobs(budget, forward_first, FILLS[0]))
            if fill != FILLS[0] and asked:
                programs, bound, _ = heuristic(devices, micro_batches, c, Knobs(budget, forward_first, fill))
            # else `fill` decided nothing: the same run as with FILLS[0]
            if programs not in seen:
                seen.add(programs)
                yield Schedule([list(p) for p in programs], micro_batches=micro_batches, name="zb-auto")
            if not bound:
                break


def _few(devices: int, micro_batches: int, c: StageCosts, limit: float, runs: int):
    """At most `runs` runs of the heuristic, the likeliest fastest first: a schedule that
    may hold more in flight has the smaller bubble, so each fill (in the order of `FILLS`),
    each `forward_first`, with no budget, then, where that run holds more than `limit`,
    with the largest budget that keeps every device within it (so two runs find one that
    fits). A fill other than the first is run
    only where the first's run asked it (else it lays out the same)."""
    units = [u for u in map(max, c.activation_bytes, c.w_activation_bytes) if u > 0]
    largest = max(1, math.floor(limit / max(units))) if units else None  # every device within limit
    seen, asked, fits, tried = set(), set(), set(), set()
    for fill, forward_first, budget in itertools.product(FILLS, (False, True), (None, largest)):
        knobs = Knobs(budget, forward_first, fill)
        if len(tried) >= runs:
            return
        if knobs in tried or (budget is not None and (forward_first, fill) in fits) or \
                (fill != FILLS[0] and (forward_first, budget) not in asked):
            continue
        tried.add(knobs)
        programs, _, did_ask = heuristic(devices, micro_batches, c, knobs)
        if did_ask:
            asked.add((forward_first, budget))
        cand = Schedule([list(p) for p in programs], micro_batches=micro_batches, name="zb-auto")
        if budget is None and within(schedule_peak(cand, c), limit):
            fits.add((forward_first, fill))  # no budget needed: a budget would lay out no faster
        if programs not in seen:
            seen.add(programs)
            yield cand


def budgets(c: StageCosts, limit: float):
    """The budgets (in micro-batches) whose runs may fit `limit` bytes: 1, 2, ... and then
    no bound. A run that a budget of k binds held more than (k-1) micro-batches' worth on
    the device it bound, so runs bound at k >= limit / unit + 1 cannot fit; a run that its
    budget does not bind is the run with no bound. So these are all the candidates of the
    limit-free family that may fit, and more memory only adds candidates."""
    units = [u for u in map(max, c.activation_bytes, c.w_activation_bytes) if u > 0]
    last = math.floor(limit / min(units)) + 1 if units else 0
    yield from range(1, last)
    yield None


def device_bubble(result) -> float:
    """The zero-bubble paper's bubble: the most idle time of one device between its first
    compute's start and its last compute's end (what consecutive steps cost when the
    optimizer step does not synchronise the pipeline; `sim.Result.spans`)."""
    return max(hi - lo - busy for (lo, hi), busy in zip(result.spans(), result.busy()))


def zb_auto(devices: int, micro_batches: int, virtual: int = 1, costs: Costs | None = None,
            memory_limit: float | None = None, max_runs: int | None = None) -> Schedule:
    """The best schedule the zero-bubble heuristic finds (the module's docstring) for
    `devices` devices and `micro_batches` micro-batches under `costs` (default F = I = W = 1),
    whose activations never exceed `memory_limit` bytes on any device (default: `devices`
    micro-batches' activation_bytes of the largest stage: the paper's ZB-1p; twice that
    is its ZB-2p). Static bytes (weights, gradients, optimizer state) do not count.
    `max_runs` (>= 2) bounds the search to that many runs of the heuristic, the likeliest
    fastest first (`candidates`; the planner's budget); None runs the whole family."""
    if virtual != 1:
        raise ScheduleError(f"zb-auto holds one stage per device (V=1), got V={virtual}")
    costs = Costs(backward_input=1.0, backward_weight=1.0) if costs is None else costs
    if not isinstance(costs, Costs):
        raise ScheduleError(f"zb-auto costs must be a sim.Costs, got {type(costs).__name__}")
    try:
        c = costs.for_stages(devices)
    except ValueError as e:
        raise ScheduleError(f"zb-auto: {e}") from None
    one = max(map(max, c.activation_bytes, c.w_activation_bytes))
    limit = devices * max(c.activation_bytes) if memory_limit is None else memory_limit
    if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not limit >= one:
        raise ScheduleError(f"zb-auto memory_limit {limit!r} is below one micro-batch's activations ({one:g} bytes)")
    if max_runs is not None and (isinstance(max_runs, bool) or not isinstance(max_runs, int) or max_runs < 2):
        raise ScheduleError(f"zb-auto max_runs must be an integer >= 2 (a run with no budget, and one within the "
                            f"limit) or None, got {max_runs!r}")
    try:
        hash(costs)
    except TypeError:  # costs with lists in them: search without the cache
        return _search.__wrapped__(devices, micro_batches, costs, float(limit), max_runs)
    return _search(devices, micro_batches, costs, float(limit), max_runs)


@lru_cache(maxsize=256)
def _search(devices: int, micro_batches: int, costs: Costs, limit: float, runs: int | None = None) -> Schedule:
    """Simulate every candidate that may fit `limit` (at most `runs` runs of the
    heuristic) and keep the best: the shortest makespan, then the smallest
    `device_bubble`, then the smallest peak."""
    c, best = costs.for_stages(devices), None
    for cand in candidates(devices, micro_batches, c, limit, runs):
        peak = schedule_peak(cand, c)  # what the simulation finds, without rounding the static bytes in
        if not within(peak, limit):
            continue
        r = simulate(cand, costs)
        if best is None or r.makespan <= best[0][0]:
            score = (r.makespan, device_bubble(r), peak)
            if best is None or score < best[0]:
                best = (score, cand)
    return Schedule(best[1].programs, micro_batches=micro_batches, name="zb-auto")


SCHEDULES.add("zb-auto", Generator(zb_auto, "the zero-bubble paper's automatic scheduler: best found under costs "
                                   "and memory_limit (Qi et al. 2024, Sec. 3)", options=("costs", "memory_limit", "max_runs")))
