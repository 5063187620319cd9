"""Groups of micro-batches in the interleaved schedules: which micro-batch and chunk a device's k-th forward runs.

A device of an interleaved schedule (V chunks, stage s on device s mod P) runs the
micro-batches of one *group* through its chunk 0, then the same group through chunk 1, and
so on, before the next group; its backwards walk the same table with the chunks reversed.
Two rules fix the groups:

- torch's (`ScheduleInterleaved1F1B`, `ScheduleInterleavedZeroBubble`): max(1, M // P)
  rounds of equal size, refused where they do not divide M
  (`sim.schedule.interleaved.rounds`). The default.
- Megatron-Core's (`microbatch_group_size_per_vp_stage`, N, `--microbatch-group-size-per-
  virtual-pipeline-stage`; its `get_schedule_table`): groups of N micro-batches, the last
  one taking what is left. It asks P <= N <= M, and a last group of 0 or at least P
  micro-batches ("otherwise it introduces dependency bubbles"); its default N = P so asks
  M to be a multiple of P, and another N lets M be any count that one N fits
  (`check_group_size`).
"""
from __future__ import annotations


def check_group_size(devices: int, micro_batches: int, group_size: int) -> str | None:
    """Megatron-Core's two rules on its group size N, or None where N is allowed."""
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        return f"group_size must be a positive integer (micro-batches per group), got {group_size!r}"
    if not devices <= group_size <= micro_batches:
        return (f"group_size={group_size} is outside [P, M] = [{devices}, {micro_batches}]: Megatron-Core's "
                f"microbatch_group_size_per_vp_stage must be at least the pipeline size and at most M")
    last = micro_batches % group_size
    if 0 < last < devices:
        return (f"group_size={group_size} leaves a last group of M % N = {last} micro-batches, fewer than P={devices}: "
                f"Megatron-Core refuses it (dependency bubbles); take N dividing M or leaving at least P")
    return None


def group_table(micro_batches: int, virtual: int, group_size: int) -> list[tuple[int, int]]:
    """(micro-batch, chunk) of a device's k-th forward: groups of `group_size` micro-batches
    (the last one what is left), each run through chunk 0, then chunk 1, ... (Megatron-Core's
    `get_schedule_table`; torch's order where `group_size` is its round)."""
    table = []
    for first in range(0, micro_batches, group_size):
        group = range(first, min(first + group_size, micro_batches))
        table += [(m, chunk) for chunk in range(virtual) for m in group]
    return table
