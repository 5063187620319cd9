"""DualPipe and DualPipeV: DeepSeek's bidirectional pipeline and its "cut in half" V form
(deepseek-ai/DualPipe, dualpipe.py and dualpipev.py; the DeepSeek-V3 technical report,
arXiv 2412.19437, Section 3.2.1 and Table 2; torch's ScheduleDualPipeV).

DualPipe feeds micro-batches from both ends: the first half enter at device 0 and run
down, the second half enter at device P-1 and run up, through a second copy of the model
(parameters twice: `Schedule.pipelines` = 2). Device r holds stage r of the down copy and
stage P-1-r of the up copy; as 2P stages, the down copy is 0..P-1 and the up copy P..2P-1
(stage P+i is the up copy's stage i, on device P-1-i): the V placement
(`sim.schedule.zerobubble.v_placement`). DualPipeV runs one copy along that V instead
(device r holds stages r and 2P-1-r of one 2P-stage chain) on half the devices' count.

Both run the same eight steps per device (`_eight_steps`). In the steady state a device
runs the forward of one chunk and the backward of the other as one overlapped pair, to
hide the expert-parallel all-to-all of each under the other's compute. With
`overlap=True` a pair is an OVERLAP_F_B mark before its F (torch's OVERLAP_F_B;
docs/rules.md rule 18); without, two actions one after the other, F first. Most
backwards are full (B); near the end a device splits them into I and W and defers the Ws
("zero bubble"), as the reference does.
"""
from __future__ import annotations

from collections import deque

from .ir import Action, Kind, Schedule, ScheduleError
from .zerobubble import v_placement


class _Device:
    """One device's program as it is written: counts each chunk's Fs and backwards, and
    queues the Ws of split backwards until a `weight()` runs the oldest."""

    def __init__(self, stages: tuple[int, int], overlap: bool = False, first: tuple[int, int] = (0, 0)):
        self.chunk, self.overlap = stages, overlap
        self.program: list[Action] = []
        self.next = {(s, k): m for s, m in zip(stages, first) for k in (Kind.F, Kind.B)}
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

    def pair(self, f: int, b: int, overlap: bool = True) -> None:
        """DualPipe's forward of chunk f and backward of chunk b: an overlapped pair where
        the device overlaps (its mark names the B), else F, then B."""
        if self.overlap and overlap:
            s = self.chunk[b]
            self.program.append(Action(s, Kind.OVERLAP_F_B, self.next[s, Kind.B]))
        self.forward(f)
        self.backward(b)

    def _add(self, stage: int, kind: Kind, counter=None) -> int:
        key = counter or (stage, kind)
        m = self.next[key]
        self.next[key] = m + 1
        self.program.append(Action(stage, kind, m))
        return m


def _eight_steps(d: _Device, P: int, M: int, r: int, middle: bool = False) -> list[Action]:
    """The eight steps of the reference on device r of a pipeline of P devices and M
    micro-batches (DualPipe: per direction, P/2 and M/2, r its distance from the nearer
    end); chunk 0 runs the way that reaches this device first. "F0B1" is the pair F of
    chunk 0, B of chunk 1. A `middle` device runs its first steady pair unoverlapped, as
    DualPipe's does."""
    for _ in range(2 * (P - r - 1)):           # 1: F0
        d.forward(0)
    for _ in range(r + 1):                     # 2: F0 F1
        d.forward(0)
        d.forward(1)
    for _ in range(P - r - 1):                 # 3: I1 W1 F1 (zero bubble)
        d.backward(1, split=True)
        d.weight()
        d.forward(1)
    for i in range(M - 2 * P + r + 1):         # 4: the steady state, F0B1 then F1B0
        d.pair(0, 1, overlap=not (middle and i == 0))
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
    return d.program


def dualpipev(devices: int, micro_batches: int, virtual: int = 2, overlap: bool = False) -> Schedule:
    """DualPipeV's eight steps on device r of p, for M >= 2p micro-batches (chunk 0 is
    stage r, chunk 1 is stage 2p-1-r). `overlap`: its steady pairs as OVERLAP_F_B."""
    P, M = devices, micro_batches
    programs = [_eight_steps(_Device((r, 2 * P - 1 - r), overlap), P, M, r) for r in range(P)]
    return Schedule(programs, v_placement(P), micro_batches=M, name="dualpipev")


def check_dualpipe(devices: int, micro_batches: int, virtual: int = 2, overlap: bool = False) -> str | None:
    """Why DualPipe refuses these sizes (the reference asserts the same), or None; `overlap`
    refuses no size."""
    if devices % 2:
        return f"needs an even number of devices (half of them feed each direction), got {devices}"
    if micro_batches % 2 or micro_batches < 2 * devices:
        return (f"needs an even number of micro-batches, at least 2P = {2 * devices} (half of them enter at each "
                f"end, at least P per direction), got {micro_batches}")
    return None


def dualpipe(devices: int, micro_batches: int, virtual: int = 2, overlap: bool = False) -> Schedule:
    """DualPipe on P devices (P even) and M micro-batches (M even, M >= 2P): micro-batches
    0..M/2-1 run down through stages 0..P-1, M/2..M-1 up through stages P..2P-1 (the
    second copy of the model). Device r runs the eight steps of a pipeline of P/2 devices
    and M/2 micro-batches at its distance h = min(r, P-1-r) from the nearer end; chunk 0 is
    the direction that reaches it first. `overlap`: its steady pairs as OVERLAP_F_B."""
    P, M = devices, micro_batches
    reason = check_dualpipe(P, M)
    if reason:
        raise ScheduleError(f"dualpipe on {P} devices, {M} micro-batches: {reason}")
    programs = []
    for r in range(P):
        down, up = r, 2 * P - 1 - r
        chunks, first = ((down, up), (0, M // 2)) if r < P // 2 else ((up, down), (M // 2, 0))
        d = _Device(chunks, overlap, first)
        programs.append(_eight_steps(d, P // 2, M // 2, min(r, P - 1 - r), middle=r in (P // 2 - 1, P // 2)))
    return Schedule(programs, v_placement(P), micro_batches=M, name="dualpipe", pipelines=2)
