"""A schedule that holds the model twice (DualPipe: `sim.Schedule.pipelines` = 2) in the planner: one copy's stages costed, their costs repeated for every copy.

DualPipe runs k = 2 copies of the model, each over the P devices (`sim.schedule.ir.route`:
stages 0..P-1 the first copy, P..2P-1 the second, stage P+i the second copy's stage i on
device P-1-i). Each copy's P stages hold the whole model, so the layers split over P stages
(`sim.plan.stage_costs.partition_layers`) and stage s of the schedule costs what stage s mod P
of one copy does: its passes, activations, weights, gradients and optimizer state (ZeRO
sharded over both copies' replicas, `sim.cost.data_parallel.shard_size`), and its gradient
reduction, one collective over both copies' replicas (`sim.cost.data_parallel.reduce_group`).

    >>> from sim.engine.costs import Costs
    >>> repeat_costs(Costs(forward=(1.0, 2.0), static_bytes=(5.0, 3.0)), [0, 1, 1, 0], 2).static_bytes
    (5.0, 5.0, 0.0, 0.0)
"""
from __future__ import annotations

from dataclasses import replace

from sim.engine.costs import Costs
from sim.engine.fields import PER_STAGE


def repeat_costs(costs: Costs, placement, pipelines: int) -> Costs:
    """`costs` of one copy's stages (per-stage fields of len(placement) / pipelines values, or
    one number) for all the schedule's stages, stage s taking one copy's stage s mod P; the MoE
    dispatcher's buffers (`static_bytes`) held once a device, the most of its stages', on its
    first stage (a layer at a time runs: `sim.plan.experts.dispatch_buffers`)."""
    if pipelines == 1:
        return costs
    fields = {name: tuple(value) * pipelines for name in PER_STAGE
              if not isinstance(value := getattr(costs, name), (int, float, type(None)))}
    static = fields.get("static_bytes")
    if static is not None:
        mine: dict[int, list[int]] = {}
        for s, r in enumerate(placement):
            mine.setdefault(r, []).append(s)
        fields["static_bytes"] = tuple(max(static[t] for t in mine[r]) if s == mine[r][0] else 0.0
                                       for s, r in enumerate(placement))
    return replace(costs, **fields)
