"""Schedules over the looped placement: P devices, V model chunks each, stage s on device s mod P.

- `interleaved_1f1b`: Megatron-LM's interleaved 1F1B (Narayanan et al., "Efficient
  Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", SC'21, Sec. 2.2):
  depth first, each device cycles through its chunks in groups of micro-batches, one
  forward and one backward at a time once warmed up. Bubble (P-1)(F+B) in chunk costs,
  V times smaller than 1F1B's on the same devices.
- `looped_bfs`: breadth-first (Lamy-Poirier, "Breadth-First Pipeline Parallelism",
  MLSys 2023; torch's ScheduleLoopedBFS): each device runs every forward of its first
  chunk, then of its next one, then every backward in reverse.
"""
from __future__ import annotations

from .ir import Action, Kind, Schedule


def looped_placement(devices: int, virtual: int) -> list[int]:
    """Stage s of the P*V model stages lives on device s mod P."""
    return [s % devices for s in range(devices * virtual)]


def rounds(devices: int, micro_batches: int) -> tuple[int, int]:
    """(rounds, micro-batches per round) of an interleaved step, as torch's Interleaved1F1B:
    max(1, M // P) rounds of M / rounds micro-batches each (Megatron's groups of P when P
    divides M; one group of all M when M < P)."""
    n = max(1, micro_batches // devices)
    return n, micro_batches // n


def check_interleaved(devices: int, micro_batches: int, virtual: int) -> str | None:
    """The one size torch's Interleaved1F1B refuses: M not a multiple of its rounds (with
    V = 1 there are no rounds to keep: it is 1F1B)."""
    n, _ = rounds(devices, micro_batches)
    if virtual > 1 and micro_batches % n:
        return (f"M={micro_batches} is not a multiple of max(1, M // P) = {n}, the number of equal rounds "
                f"torch's Interleaved1F1B runs; take M < P or M a multiple of P")
    return None


def interleaved_1f1b(devices: int, micro_batches: int, virtual: int = 2, overlap: bool = False) -> Schedule:
    """Megatron-LM's interleaved 1F1B. Device r's k-th forward is of chunk (k // g) mod V and
    micro-batch (k // gV) g + k mod g, for g micro-batches per round (`rounds`); its k-th
    backward walks the chunks in reverse. It warms up with (V-1) g + 2(P-1-r) forwards
    (Megatron's get_forward_backward_func, torch's _get_warmup_ops), alternates one forward
    and one backward, and cools down with the backwards left. With V = 1 the warm-up is
    1F1B's P-1-r: the schedule is 1F1B.

    `overlap`: Megatron-Core's overlapped 1F1B (`--overlap-moe-expert-parallel-comm`):
    each steady forward and the backward after it, of another micro-batch, run as one
    overlapped pair (OVERLAP_F_B, docs/rules.md rule 16), hiding each one's expert
    all-to-all under the other's compute."""
    _, g = rounds(devices, micro_batches)
    total = micro_batches * virtual  # chunk-micro-batches per device

    def nth(r: int, k: int, kind: Kind) -> Action:
        chunk = (k // g) % virtual
        if kind is not Kind.F:
            chunk = virtual - 1 - chunk
        return Action(chunk * devices + r, kind, (k // (g * virtual)) * g + k % g)

    programs = []
    for r in range(devices):
        extra = 2 * (devices - 1 - r) if virtual > 1 else devices - 1 - r
        warmup = min((virtual - 1) * g + extra, total)
        prog = [nth(r, k, Kind.F) for k in range(warmup)]
        for k in range(warmup, total):
            f, b = nth(r, k, Kind.F), nth(r, k - warmup, Kind.B)
            pair = overlap and f.micro != b.micro  # a micro-batch's backward needs its forward: no pair
            prog += [Action(b.stage, Kind.OVERLAP_F_B, b.micro)] * pair + [f, b]
        prog += [nth(r, k, Kind.B) for k in range(total - warmup, total)]
        programs.append(prog)
    return Schedule(programs, looped_placement(devices, virtual), micro_batches, name="interleaved-1f1b")


def looped_bfs(devices: int, micro_batches: int, virtual: int = 2) -> Schedule:
    """Breadth-first over the looped placement: device r runs all M forwards of stage r,
    then of stage r+P, ..., then the backwards from its last chunk to its first, each
    chunk's micro-batches in reverse (torch's ScheduleLoopedBFS). All M V chunk
    activations are held at once, as in GPipe."""
    programs = []
    for r in range(devices):
        mine = range(r, devices * virtual, devices)
        prog = [Action(s, Kind.F, m) for s in mine for m in range(micro_batches)]
        prog += [Action(s, Kind.B, m) for s in reversed(mine) for m in reversed(range(micro_batches))]
        programs.append(prog)
    return Schedule(programs, looped_placement(devices, virtual), micro_batches, name="looped-bfs")
