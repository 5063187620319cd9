"""V-Min and V-Half, the memory-controlled V schedules, built from the paper's building blocks.

Qi, Wan, Amar and Lin, "Pipeline Parallelism with Controllable Memory" (NeurIPS 2024, arXiv
2405.15362): a building block repeated every six slots, squeezed and reordered.

The V placement of ZB-V (device d holds stages d and 2P-1-d, `v_placement`). With F = I = W
= one slot, a micro-batch's *building block* on device d is six passes: F of chunk 0 (stage
d), F of chunk 1 (stage 2P-1-d), I of chunk 1, I of chunk 0, and the two Ws. The block
fixes the slots of the four F and I passes; micro-batch k's block is micro-batch 0's moved
by 6k slots, and each W goes into the first free slot after its I. How long a block lives
on a device (its first F to its last W) is what the device holds: the paper's point is that
the lifespan decides the peak memory. V-Min's block lives about 2P/3 micro-batches' worth
of slots, V-Half's about P/2, ZB-V's P. The repeated blocks leave the warm-up and cool-down
full of holes, which the paper removes by moving each pass to the earliest free slot its
dependencies allow without raising the peak ("squeeze" and "reorder"); the device's order
is then its passes sorted by slot. The slots only order the programs: timing is
`sim.simulate`'s. The reference is `zbv_greedy.py` of sail-sg/zero-bubble-pipeline-
parallelism (read for the building blocks and the greedy order; no code copied).

Slots are kept per device as six lists over micro-batches, indexed by the pass (`PASSES`).
"""
from __future__ import annotations

import functools

from .ir import Action, Kind, Schedule
from .zerobubble import v_placement

# the passes of a block, in the reference's order: (kind, chunk); chunk 0 is stage d, chunk 1 stage 2P-1-d
PASSES = ((Kind.F, 0), (Kind.F, 1), (Kind.I, 1), (Kind.I, 0), (Kind.W, 1), (Kind.W, 0))
PERIOD = 6  # slots between two micro-batches' blocks: F, I and W of two chunks
HELD = (1, 1, 0, 0, -1, -1)  # chunk activations a pass takes (F) or gives back (W), as `Costs` defaults count them


def v_min_block(devices: int) -> list[list[int]]:
    """V-Min's building block: on device d, the slots of F0, F1, I1, I0 of micro-batch 0.
    The Is start 2P slots in (2P+2 where 3 divides P, to keep the six passes of the
    repeated blocks apart mod 6)."""
    gap = 2 if devices % 3 == 0 else 0
    return [[d, 2 * devices - 1 - d, 2 * devices + gap + d, 4 * devices + gap - 1 - d] for d in range(devices)]


def v_half_block(devices: int) -> list[list[int]]:
    """V-Half's building block: the forwards two slots apart down the V (F0 at 2d), so the
    Is come later (3P slots in, 3P+3 where P is even) and each block lives longer than
    V-Min's."""
    gap = 3 if devices % 2 == 0 else 0
    return [[2 * d, 3 * devices - 2 - d, 3 * devices + gap - 1 + 2 * d, 6 * devices + gap - 2 - d]
            for d in range(devices)]


def repeat(block: list[list[int]], micro_batches: int) -> list[list[list[int]]]:
    """Every micro-batch's block: micro-batch k's slots are micro-batch 0's plus 6k."""
    return [[[x + PERIOD * k for k in range(micro_batches)] for x in device] for device in block]


def fill_weights(passes: list[list[int]], split: bool) -> list[list[int]]:
    """One device's four F and I lists with Ws added: each I leaves a W that runs in the next
    free slot (after the last pass, one slot after another). `split`: W1 and W0 as two
    lists (the W of chunk 1 first where both wait), else one list of Ws in I order."""
    at = slot_map(passes[:4])
    end = max(max(slots) for slots in passes[:4])
    weights: list[list[int]] = [[], []]
    waiting = [0, 0]
    t = 0
    while t <= end or sum(waiting):
        if t in at:
            if at[t] in (2, 3):
                waiting[at[t] - 2 if split else 0] += 1
        else:
            w = 0 if waiting[0] else 1
            if waiting[w]:
                weights[w].append(t)
                waiting[w] -= 1
        t += 1
    return [list(s) for s in passes[:4]] + (weights if split else weights[:1])


def walk(at: dict[int, int], owing: bool, held: int, owed: int, slots: range):
    """(held, owed) after each slot of `slots`, one device, from (held, owed) before them:
    the pass at a slot (`at`: slot -> pass) takes or gives back chunk activations (`HELD`);
    with `owing` (no W lists) an I owes its W instead, and a free slot runs an owed W."""
    for t in slots:
        pass_ = at.get(t)
        if pass_ is None:
            if owed:
                held, owed = held - 1, owed - 1
        elif owing and pass_ in (2, 3):
            owed += 1
        else:
            held += HELD[pass_]
        yield held, owed


def slot_map(passes: list[list[int]]) -> dict[int, int]:
    """One device's slot -> the pass run there."""
    return {t: i for i, slots in enumerate(passes) for t in slots}


def neighbour(devices: int, d: int, pass_: int) -> int | None:
    """The device whose same pass of the same micro-batch this one waits for: down the V for
    F0 and I1 (d-1), up it for F1 and I0 (d+1); None at the V's ends and for W."""
    if pass_ in (0, 2):
        return d - 1 if d > 0 else None
    if pass_ in (1, 3):
        return d + 1 if d < devices - 1 else None
    return None


def earliest(slots: list[list[list[int]]], d: int, pass_: int, k: int) -> int:
    """The first slot where pass `pass_` of micro-batch k may run on device d: after the
    neighbour's same pass, the pass before it in the block (F0, F1, I1, I0), the k-th I for
    the k-th W (one list of Ws), and its own pass of micro-batch k-1."""
    after = [-1]
    other = neighbour(len(slots), d, pass_)
    if other is not None:
        after.append(slots[other][pass_][k])
    if 0 < pass_ < 4:
        after.append(slots[d][pass_ - 1][k])
    if pass_ == 4:
        after.append(sorted(slots[d][2] + slots[d][3])[k])
    if k > 0:
        after.append(slots[d][pass_][k - 1])
    return max(after) + 1


def eager(slots: list[list[list[int]]]) -> list[list[list[int]]]:
    """Squeeze: each pass, one slot long, starts as soon as its device's previous pass (in
    slot order) and its neighbour's same pass have ended."""
    order = sorted((t, d, i, k) for d, passes in enumerate(slots) for i, s in enumerate(passes) for k, t in enumerate(s))
    start = [[[0] * len(s) for s in passes] for passes in slots]
    free = [0] * len(slots)
    for _, d, i, k in order:
        other = neighbour(len(slots), d, i)
        ready = start[other][i][k] + 1 if other is not None else 0
        start[d][i][k] = max(free[d], ready)
        free[d] = start[d][i][k] + 1
    return start


def reorder(slots: list[list[list[int]]], micro_batches: int, warm_up: bool) -> list[list[list[int]]]:
    """The paper's reordering, greedy in slot order: a pass of the cool-down (from the last
    F0 on) or, with `warm_up`, of the warm-up (until device 0's first I0) moves to the
    earliest free slot its inputs allow (`earliest`) that keeps its device within the
    peak the blocks had; the steady state stays as the blocks lay it."""
    slots = [[list(s) for s in passes] for passes in slots]
    devices = [Held(passes) for passes in slots]
    limit = max(device.peak() for device in devices)
    order = sorted((t, d, i, k) for d, passes in enumerate(slots) for i, s in enumerate(passes) for k, t in enumerate(s))
    taken: list[set[int]] = [set() for _ in slots]
    phase = "warm-up"
    for t, d, i, k in order:
        if phase == "warm-up" and (i, d) == (3, 0):
            phase = "steady"
        if phase == "steady" or (phase == "warm-up" and not warm_up):
            if phase == "steady" and (i, k) == (0, micro_batches - 1):
                phase = "cool-down"
            taken[d].add(t)
            continue
        raises = i < 2 or (i < 4 and devices[d].owing)  # an F, or an I that owes its W; a W only gives back
        for s in range(earliest(slots, d, i, k), t):
            if s not in taken[d] and (not raises or devices[d].peak_if_moved(i, s, t) <= limit):
                slots[d][i][k] = s
                devices[d].move(i, s, t)
                break
        taken[d].add(slots[d][i][k])
    return slots


class Held:
    """What one device holds after each slot, kept as its passes move earlier: a move from
    slot t to s changes it from s on, and before t only by what `peak_if_moved` walks."""

    def __init__(self, passes: list[list[int]]):
        self.owing = len(passes) == 4
        self.at = slot_map(passes)
        self.after = list(walk(self.at, self.owing, 0, 0, range(max(self.at) + 1)))

    def peak(self) -> int:
        """The most chunk activations the device holds: +1 at each F, -1 at each W (or, with
        the Ws owed, one run in each free slot while one is owed, as `fill_weights` puts them)."""
        return max(0, *(held for held, _ in self.after))

    def _before(self, s: int) -> tuple[int, int]:
        return self.after[s - 1] if s else (0, 0)

    def peak_if_moved(self, pass_: int, s: int, t: int) -> int:
        """The most held over slots s..t-1 with `pass_` moved from t to s: past t no more is
        held than now (the moved pass is in as it was, and its old slot frees a W sooner)."""
        self.at[s] = pass_
        try:
            return max(held for held, _ in walk(self.at, self.owing, *self._before(s), range(s, t)))
        finally:
            del self.at[s]

    def move(self, pass_: int, s: int, t: int) -> None:
        """Move `pass_` from slot t to s: the slots from s on walked again, until past t they
        hold what they held (from there on nothing differs)."""
        del self.at[t]
        self.at[s] = pass_
        for slot, now in zip(range(s, len(self.after)), walk(self.at, self.owing, *self._before(s),
                                                              range(s, len(self.after)))):
            if slot >= t and now == self.after[slot]:
                break
            self.after[slot] = now


def build(block: list[list[int]], micro_batches: int) -> list[list[list[int]]]:
    """The slots of every pass on every device: the blocks repeated, reordered with the Ws
    (warm-up and cool-down), squeezed, reordered again without them (cool-down only),
    squeezed, and the Ws put back into the free slots, W1 and W0 apart."""
    slots = [fill_weights(passes, split=False) for passes in repeat(block, micro_batches)]
    slots = eager(reorder(slots, micro_batches, warm_up=True))
    slots = reorder([passes[:4] for passes in slots], micro_batches, warm_up=False)
    slots = eager([fill_weights(passes, split=False) for passes in slots])
    return [fill_weights(passes[:4], split=True) for passes in slots]


def programs_of(slots: list[list[list[int]]]) -> list[list[Action]]:
    """Each device's actions in slot order."""
    last = 2 * len(slots) - 1
    programs = []
    for d, passes in enumerate(slots):
        timed = sorted((t, i, k) for i, s in enumerate(passes) for k, t in enumerate(s))
        programs.append([Action(d if PASSES[i][1] == 0 else last - d, PASSES[i][0], k) for _, i, k in timed])
    return programs


@functools.lru_cache(maxsize=64)  # half a second at P=8, M=1024, and the planner asks for the same sizes again
def v_min(devices: int, micro_batches: int, virtual: int = 2) -> Schedule:
    """V-Min: V-shaped, two chunks a device, each block living about 2P/3 micro-batches'
    slots: the least memory of the family, (P+4)//3 micro-batches of a whole device's
    activations by the authors' table (docs/schedules.md)."""
    slots = build(v_min_block(devices), micro_batches)
    return Schedule(programs_of(slots), v_placement(devices), micro_batches, name="v-min")


@functools.lru_cache(maxsize=64)
def v_half(devices: int, micro_batches: int, virtual: int = 2) -> Schedule:
    """V-Half: as V-Min with a longer-lived block: half of 1F1B's memory, (P+2)//2
    micro-batches' worth by the authors' table, and less bubble than V-Min."""
    slots = build(v_half_block(devices), micro_batches)
    return Schedule(programs_of(slots), v_placement(devices), micro_batches, name="v-half")
