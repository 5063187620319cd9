"""The zero-bubble schedules: ZB-H1 and ZB-H2 (Qi et al., "Zero Bubble Pipeline
Parallelism", ICLR 2024, Figure 3) and ZB-V (Qi et al., "Pipeline Parallelism with
Controllable Memory", 2024; the zero-bubble paper's Section 6).

Each splits the backward into I (the input gradient, which the previous stage waits for)
and W (the weight gradient, which nobody waits for), and moves the Ws into what would be
bubbles. docs/schedules.md gives their closed forms with equal costs F = I = W.
"""
from __future__ import annotations

from collections import deque

from .ir import Action, Kind, Schedule


def F(s: int, m: int) -> Action:
    return Action(s, Kind.F, m)


def I(s: int, m: int) -> Action:  # noqa: E743 (the paper's name)
    return Action(s, Kind.I, m)


def W(s: int, m: int) -> Action:
    return Action(s, Kind.W, m)


def zb_h1(devices: int, micro_batches: int, virtual: int = 1) -> Schedule:
    """ZB-H1: 1F1B with the backward split, where stage s puts off its first s Ws. The
    Is then reach the first stage sooner, and the Ws put off fill the tail that 1F1B
    leaves idle. Each stage holds as many micro-batches as in 1F1B (p - s)."""
    programs = []
    for s in range(devices):
        warmup = min(devices - 1 - s, micro_batches)
        prog = [F(s, m) for m in range(warmup)]
        for k in range(micro_batches):                  # steady state: F, I, and the W put off s rounds ago
            if warmup + k < micro_batches:
                prog.append(F(s, warmup + k))
            prog.append(I(s, k))
            if k >= s:
                prog.append(W(s, k - s))
        prog += [W(s, m) for m in range(max(micro_batches - s, 0), micro_batches)]  # the tail: the Ws put off
        programs.append(prog)
    return Schedule(programs, micro_batches=micro_batches, name="zb-h1")


def split_1f1b(devices: int, micro_batches: int) -> Schedule:
    """1F1B with each backward split into I and then, at once, its W: the candidate that
    holds as much as 1F1B and is never slower (an I sends its gradient before the W)."""
    programs = []
    for s in range(devices):
        warmup = min(devices - s - 1, micro_batches)
        prog = [Action(s, Kind.F, m) for m in range(warmup)]
        for m in range(micro_batches):
            if m + warmup < micro_batches:
                prog.append(Action(s, Kind.F, m + warmup))
            prog += [Action(s, Kind.I, m), Action(s, Kind.W, m)]
        programs.append(prog)
    return Schedule(programs, micro_batches=micro_batches, name="1f1b-split")


def zb_h2(devices: int, micro_batches: int, virtual: int = 1) -> Schedule:
    """ZB-H2: stage s warms up with 2(p-1-s)+1 forwards, enough to keep it busy until its
    first I arrives, and so holds up to 2p-1 micro-batches on the first stage. Then I, W, F
    in turn; in the last 2p-1 rounds the Is come faster (every other slot), and a stage
    fills the one slot between them with its forwards left, then with Ws; the Ws left go
    last. With F = I = W every stage is busy from its first action to its last: a
    parallelogram. Needs micro_batches >= 2p-1 (see `SCHEDULES`)."""
    P, M = devices, micro_batches
    programs = []
    for s in range(P):
        forwards, weights = deque(range(M)), deque()
        prog = [F(s, forwards.popleft()) for _ in range(2 * (P - 1 - s) + 1)]
        for k in range(M):
            prog.append(I(s, k))
            weights.append(k)
            if k == M - 1:
                break
            if k <= M - 2 * P:   # steady state: two slots until the next I
                prog += [W(s, weights.popleft()), F(s, forwards.popleft())]
            else:                # tail: one slot until the next I
                prog.append(F(s, forwards.popleft()) if forwards else W(s, weights.popleft()))
        prog += [W(s, m) for m in weights]
        programs.append(prog)
    return Schedule(programs, micro_batches=micro_batches, name="zb-h2")


def v_placement(devices: int) -> list[int]:
    """The V shape: of 2p model stages, device r holds stages r and 2p-1-r (so the first
    and the last stage are on device 0, and stages p-1 and p meet on device p-1)."""
    return [s if s < devices else 2 * devices - 1 - s for s in range(2 * devices)]


def zbv(devices: int, micro_batches: int, virtual: int = 2) -> Schedule:
    """ZB-V: device r runs chunk 0 (stage r) and chunk 1 (stage 2p-1-r). It warms up with
    2(p-r)-1 forwards of chunk 0, then r pairs of forwards (chunk 1, chunk 0), then p-r
    rounds of chunk 1's F, I, W; in the steady state F, I, W of chunk 0 then of chunk 1;
    it cools down with Is first and Ws last. Every device holds at most 2p chunks (p
    micro-batches of the whole model), as 1F1B's first device. The pattern is written for
    at least 2p-1 micro-batches; with fewer, the actions of the missing ones are left out
    (as the paper's code and torch's ZBVZeroBubble do)."""
    P, M = devices, micro_batches
    n = max(2 * P - 1, M)
    programs = []
    for r in range(P):
        c0, c1 = r, 2 * P - 1 - r
        count = {(c, k): 0 for c in (c0, c1) for k in (Kind.F, Kind.I, Kind.W)}

        def act(c: int, k: Kind) -> Action:
            count[c, k] += 1
            return Action(c, k, count[c, k] - 1)

        prog = [act(c0, Kind.F) for _ in range(2 * (P - r) - 1)]
        for _ in range(r):
            prog += [act(c1, Kind.F), act(c0, Kind.F)]
        for _ in range(P - r):
            prog += [act(c1, Kind.F), act(c1, Kind.I), act(c1, Kind.W)]
        while count[c1, Kind.F] < count[c0, Kind.F] or count[c0, Kind.F] < n:   # steady state
            if count[c0, Kind.F] < n:
                prog.append(act(c0, Kind.F))
            prog += [act(c0, Kind.I), act(c0, Kind.W), act(c1, Kind.F), act(c1, Kind.I), act(c1, Kind.W)]
        for _ in range(r):                                                    # cool-down
            prog += [act(c0, Kind.I), act(c1, Kind.I)]
        for _ in range(P - r):
            prog += [act(c0, Kind.I), act(c0, Kind.W)]
        for c in (c1, c0):
            prog += [act(c, Kind.W) for _ in range(count[c, Kind.I] - count[c, Kind.W])]
        programs.append([a for a in prog if a.micro < M])
    return Schedule(programs, v_placement(P), micro_batches=M, name="zbv")
