"""DualPipeV: DeepSeek's DualPipe "cut in half" (deepseek-ai/DualPipe, dualpipev.py; the
DeepSeek-V3 technical report, arXiv 2412.19437, Section 3.2.1; torch's ScheduleDualPipeV).

The V placement of ZB-V (device r holds stages r and 2p-1-r, `sim.schedule.zerobubble.v_placement`).
DualPipe runs the forward of one chunk and the backward of the other as one overlapped
pair, to hide the expert-parallel all-to-all of each under the other's compute; here there
is no such communication to hide, so a pair is two actions run one after the other, F
first (as torch's OVERLAP_F_B lists them). Most backwards are full (B); near the end a
device splits them into I and W and defers the Ws ("zero bubble"), as dualpipev.py does.
"""
from __future__ import annotations

from collections import deque

from .ir import Action, Kind, Schedule
from .zerobubble import v_placement


class _Device:
    """One device's program as it is written: counts each chunk's Fs and backwards, and
    queues the Ws of split backwards until a `weight()` runs the oldest."""

    def __init__(self, stages: tuple[int, int]):
        self.chunk = stages
        self.program: list[Action] = []
        self.next = {(s, k): 0 for s in stages for k in (Kind.F, Kind.B)}
        self.weights: deque[tuple[int, int]] = deque()

    def forward(self, c: int) -> None:
        self._add(self.chunk[c], Kind.F)

    def backward(self, c: int, split: bool = False) -> None:
        """B of chunk c, or only its I with its W queued."""
        s = self.chunk[c]
        m = self._add(s, Kind.I if split else Kind.B, counter=(s, Kind.B))
        if split:
            self.weights.append((s, m))

    def weight(self) -> None:
        """The oldest W queued, if any."""
        if self.weights:
            self.program.append(Action(self.weights[0][0], Kind.W, self.weights.popleft()[1]))

    def pair(self, f: int, b: int) -> None:
        """DualPipe's overlapped forward of chunk f and backward of chunk b: here F, then B."""
        self.forward(f)
        self.backward(b)

    def _add(self, stage: int, kind: Kind, counter=None) -> int:
        key = counter or (stage, kind)
        m = self.next[key]
        self.next[key] = m + 1
        self.program.append(Action(stage, kind, m))
        return m


def dualpipev(devices: int, micro_batches: int, virtual: int = 2) -> Schedule:
    """DualPipeV's eight steps on device r of p, for M >= 2p micro-batches (chunk 0 is
    stage r, chunk 1 is stage 2p-1-r; "F0B1" is the pair F of chunk 0, B of chunk 1)."""
    P, M = devices, micro_batches
    programs = []
    for r in range(P):
        d = _Device((r, 2 * P - 1 - r))
        for _ in range(2 * (P - r - 1)):           # 1: F0
            d.forward(0)
        for _ in range(r + 1):                     # 2: F0 F1
            d.forward(0)
            d.forward(1)
        for _ in range(P - r - 1):                 # 3: I1 W1 F1 (zero bubble)
            d.backward(1, split=True)
            d.weight()
            d.forward(1)
        for _ in range(M - 2 * P + r + 1):         # 4: the steady state, F0B1 then F1B0
            d.pair(0, 1)
            d.pair(1, 0)
        for _ in range(P - r - 1):                 # 5: B1, F1B0
            d.backward(1)
            d.pair(1, 0)
        split = False                              # 6: B1 B0, split from the middle on
        for i in range(r + 1):
            split |= i == (r + 1) // 2 and r % 2 == 1
            d.backward(1, split)
            split |= i == (r + 1) // 2 and r % 2 == 0
            d.backward(0, split)
        for _ in range(P - r - 1):                 # 7: W, B0
            d.weight()
            d.backward(0, split)
        for _ in range(r + 1):                     # 8: the Ws left
            d.weight()
        programs.append(d.program)
    return Schedule(programs, v_placement(P), micro_batches=M, name="dualpipev")
