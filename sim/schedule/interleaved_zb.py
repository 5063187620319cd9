"""Interleaved zero bubble: ZB-H1 over V chunks a device on the looped placement, as torch builds it.

torch.distributed.pipelining's `ScheduleInterleavedZeroBubble` (torch 2.13; "the ZB1P
schedule" of Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024), which torchtitan
ships: interleaved 1F1B's order of chunks and micro-batches (`sim.schedule.interleaved`),
with the backward split into I and W as ZB-H1 splits it (`sim.schedule.zerobubble.zb_h1`):
device r warms up with (V-1)g + P-1-r forwards (torch's `_get_warmup_ops` with
`multiply_factor=1`, where interleaved 1F1B takes 2(P-1-r)), then runs F, I and the W of r
backwards earlier, and ends with the r Ws it put off.
"""
from __future__ import annotations

from .interleaved import interleaved_order, looped_placement, rounds
from .ir import Action, Kind, Schedule


def interleaved_zb(devices: int, micro_batches: int, virtual: int = 2, group_size: int | None = None) -> Schedule:
    """torch's interleaved zero bubble (ZB1P over V chunks). Groups of micro-batches as
    interleaved 1F1B's (`interleaved_order`: torch's rounds, refused where they do not
    divide M, or Megatron-Core's groups of `group_size`). With V = 1 it is ZB-H1, program
    for program."""
    P, V = devices, virtual
    order = interleaved_order(P, micro_batches, V, group_size)
    g = group_size or rounds(P, micro_batches)[1]
    total = micro_batches * V  # chunk micro-batches per device
    programs = []
    for r in range(P):
        def nth(k: int, kind: Kind) -> Action:
            m, chunk = order[k]
            return Action((chunk if kind is Kind.F else V - 1 - chunk) * P + r, kind, m)

        warmup = min((V - 1) * g + P - 1 - r, total)
        prog = [nth(k, Kind.F) for k in range(warmup)]
        for b in range(total):                 # the b-th backward, after the forward warmup + b
            if warmup + b < total:
                prog.append(nth(warmup + b, Kind.F))
            prog.append(nth(b, Kind.I))
            if b >= r:                         # the W of the backward r before
                prog.append(nth(b - r, Kind.W))
        prog += [nth(b, Kind.W) for b in range(max(total - r, 0), total)]  # the Ws put off
        programs.append(prog)
    return Schedule(programs, looped_placement(P, V), micro_batches, name="interleaved-zb")
