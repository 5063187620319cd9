"""FSDP as actions: the pass that gathers each stage's parameters (UNSHARD) ahead of its computes and releases them (RESHARD) after.

Fully sharded data parallelism keeps on each rank only its shard of a stage's parameters;
before the stage computes, an all-gather over its data-parallel group brings the whole
parameters (`sUNSHARD`), and afterwards they are freed again (`sRESHARD`), the shard
staying. After the stage's last backward its gradients are reduce-scattered: under FSDP
the stage's REDUCE_GRAD (`sim.add_grad_reduce`) is that reduce-scatter, timed by
`Costs.grad_reduce` as the caller's cost model says (torch.distributed.pipelining's
`perform_reduce_grad` runs FSDP's post-backward, the reduce-scatter, there).

This is the lowering torch.distributed.pipelining does with `_add_unshard_reshard`
(torch/distributed/pipelining/schedules.py), per stage of the schedule, with FSDP2's
options: the all-gathers run on the rank's own all-gather stream, one at a time, and the
computes of a stage wait for its gather's end (docs/rules.md, rule 16; the engine's
`sim.engine.resources.Gathers`). With one device and V stages the stages are FSDP's
units (layers or blocks) gathered one by one; with pp > 1 each stage is one.

    >>> import sim
    >>> print(sim.add_fsdp(sim.make_schedule("looped-bfs", devices=1, micro_batches=1, virtual=2)).to_csv(), end="")
    0UNSHARD,1UNSHARD,0F0,0RESHARD,1F0,0UNSHARD1,1B0,1RESHARD,0B0,0RESHARD1

The planner's hook (zero=3 as actions; `sim.estimate` does this, with
`sim.plan.stage_costs.fsdp_costs`; with pp = 1 the one UNSHARD takes no time, FSDP's per-layer
gathers being inside the passes): build the schedule, then
`add_fsdp(schedule, lookahead, reshard_after_forward)`, then `add_grad_reduce(..., overlap=True)`
(the reduce-scatters after each stage's last backward, as torch orders them), and give
`Costs(unshard=all-gather time, unshard_bytes=gathered bytes, grad_reduce=reduce-scatter
time, weight_bytes=the shard)` per stage.
"""
from __future__ import annotations

from sim.schedule.ir import Action, Schedule
from sim.schedule.kinds import COMPUTE, Kind
from .checks import check_pass_input

__all__ = ["add_fsdp", "DEFAULT_LOOKAHEAD"]

_F, _UNSHARD, _RESHARD = Kind.F, Kind.UNSHARD, Kind.RESHARD

# FSDP2 prefetches one module ahead (its implicit backward prefetch; forward prefetch is
# one module through `set_modules_to_forward_prefetch`): one compute ahead here.
DEFAULT_LOOKAHEAD = 1


def add_fsdp(schedule: Schedule, lookahead: int = DEFAULT_LOOKAHEAD, reshard_after_forward: bool = True) -> Schedule:
    """`schedule` (unlowered: compute actions, and REDUCE_GRADs or copies if any) with FSDP's
    gathers: on each rank, a stage is gathered (`sUNSHARD k`, its k-th gather of the step)
    for a *hold*, a run of its rank's program over which it stays gathered, and released
    (`sRESHARD k`) right after the hold's last compute.

    - A hold ends after the stage's last backward on its rank, always (FSDP's reshard after
      backward), and after a forward where `reshard_after_forward` and the rank's next
      compute is of another stage (FSDP2's `reshard_after_forward`; where the next is of
      the same stage, gathering again at once would only cost, as FSDP2 keeps its root
      module). After any other backward the stage stays gathered:
      torch.distributed.pipelining sets `set_reshard_after_backward(False)` until the last.
      `reshard_after_forward=False`: each stage is held from its first forward to its
      last backward.
    - A hold's UNSHARD is issued `lookahead` computes ahead of the hold's first compute on
      its rank (0: right before it, no prefetch), but not before the stage's previous
      RESHARD: a stage is gathered once at a time."""
    check_pass_input(schedule, "add_fsdp", "UNSHARD/RESHARD", schedule.has_gathers, "lookahead", lookahead,
                     f"computes ahead that a gather is issued; default {DEFAULT_LOOKAHEAD}")
    return schedule.with_programs(_fsdp_program(prog, lookahead, reshard_after_forward) for prog in schedule.programs)


def _holds(computes: list[Action], reshard_after_forward: bool) -> list[tuple[int, int, int]]:
    """The holds of one rank, as (stage, first compute, last compute), indices into
    `computes` (the rank's computes in order), in the order they begin."""
    last = {a.stage: j for j, a in enumerate(computes)}   # each stage's last compute: its last backward
    holds, open_ = [], {}                                 # stage -> index of its hold in `holds`
    for j, a in enumerate(computes):
        s = a.stage
        if s not in open_:
            open_[s] = len(holds)
            holds.append([s, j, j])
        holds[open_[s]][2] = j
        leaves = j + 1 == len(computes) or computes[j + 1].stage != s
        if j == last[s] or (reshard_after_forward and a.kind is _F and leaves):
            del open_[s]
    return [tuple(h) for h in holds]


def _fsdp_program(prog, lookahead: int, reshard_after_forward: bool) -> list[Action]:
    """One rank's program with its UNSHARDs and RESHARDs (see `add_fsdp`)."""
    where = [i for i, a in enumerate(prog) if a.kind in COMPUTE]   # compute j stands at prog[where[j]]
    before: dict[int, list[Action]] = {}   # position in prog -> the UNSHARDs issued right before it
    after: dict[int, list[Action]] = {}    # position in prog -> the RESHARDs right after it
    count: dict[int, int] = {}             # stage -> its gathers so far
    free_from: dict[int, int] = {}         # stage -> the first compute after its last RESHARD
    for s, first, last in _holds([prog[i] for i in where], reshard_after_forward):
        k = count[s] = count.get(s, -1) + 1
        slot = max(first - lookahead, free_from.get(s, 0))
        before.setdefault(where[slot], []).append(Action(s, _UNSHARD, k))
        after.setdefault(where[last], []).append(Action(s, _RESHARD, k))
        free_from[s] = last + 1
    return [x for i, a in enumerate(prog) for x in before.get(i, []) + [a] + after.get(i, [])]
