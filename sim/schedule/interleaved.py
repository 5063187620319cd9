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

from .groups import check_group_size, group_table
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


def check_interleaved(devices: int, micro_batches: int, virtual: int, group_size: int | None = None,
                      overlap: bool = False) -> str | None:
    """The sizes an interleaved schedule refuses: without `group_size`, the one torch's
    Interleaved1F1B refuses, M not a multiple of its rounds; with it, what Megatron-Core
    refuses (`sim.schedule.groups.check_group_size`). With V = 1 there are no chunks to
    group: it is 1F1B (or ZB-H1), any M, and no `group_size`. `overlap` (pairs) refuses
    no size."""
    if virtual == 1:
        return None if group_size is None else "group_size groups the chunks of V > 1; with V=1 there are none"
    if group_size is not None:
        return check_group_size(devices, micro_batches, group_size)
    n, _ = rounds(devices, micro_batches)
    if micro_batches % n:
        return (f"M={micro_batches} is not a multiple of max(1, M // P) = {n}, the number of equal rounds "
                f"torch's Interleaved1F1B runs; take M < P or M a multiple of P, or a group_size (Megatron-Core's)")
    return None


def interleaved_order(devices: int, micro_batches: int, virtual: int, group_size: int | None) -> list[tuple[int, int]]:
    """(micro-batch, chunk) of a device's k-th forward (`sim.schedule.groups.group_table`),
    in torch's rounds unless `group_size` is given; the k-th backward is the same
    micro-batch of chunk V-1-chunk."""
    return group_table(micro_batches, virtual, group_size or rounds(devices, micro_batches)[1])


def interleaved_1f1b(devices: int, micro_batches: int, virtual: int = 2, group_size: int | None = None,
                     overlap: bool = False) -> Schedule:
    """Megatron-LM's interleaved 1F1B. Device r's forwards run the micro-batches of a group
    through each chunk in turn (`interleaved_order`: torch's rounds, or Megatron-Core's
    groups of `group_size`); its backwards walk the chunks in reverse. It warms up with
    (V-1) g + 2(P-1-r) forwards, g the micro-batches of a group (Megatron's
    get_pp_rank_microbatches, torch's _get_warmup_ops), alternates one forward and one
    backward, and cools down with the backwards left. With V = 1 the warm-up is 1F1B's
    P-1-r: the schedule is 1F1B.

    `overlap`: Megatron-Core's overlapped 1F1B (`--overlap-moe-expert-parallel-comm`):
    each steady forward and the backward after it, of another micro-batch, run as one
    overlapped pair (OVERLAP_F_B, docs/rules.md rule 18), hiding each one's expert
    all-to-all under the other's compute."""
    order = interleaved_order(devices, micro_batches, virtual, group_size)
    g = group_size or rounds(devices, micro_batches)[1]
    total = micro_batches * virtual  # chunk-micro-batches per device

    def nth(r: int, k: int, kind: Kind) -> Action:
        m, chunk = order[k]
        return Action((chunk if kind is Kind.F else virtual - 1 - chunk) * devices + r, kind, m)

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
