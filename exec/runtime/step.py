"""One training step on every rank: each interprets its part of the compiled program, and their traces become one `sim.Result`.

    >>> program = sim.compile(schedule, "gloo")                                    # doctest: +SKIP
    >>> step = run_step(ctx, program, modules, xs, ys, loss_fn, optimizer)         # doctest: +SKIP
    >>> step.result.makespan, step.result.peak_memory, step.loss                   # doctest: +SKIP

`run_step` takes the program `sim.compile(schedule, backend)` made for the run's backend
(`sim.engine.program.Program`; it checks nothing of the schedule again), zeroes the
gradients, starts every rank together at a barrier, runs this rank's
`exec.runtime.interpreter.RankInterpreter`, steps the optimizer (its end is the step's
`train_step_s`: the planner's step, where the makespan of the `Result` is the
pipeline's), and gathers every rank's trace into the same `sim.Result` the simulator
produces (`source="measured"`, on the same program), so metrics, plots and the Chrome
trace work unchanged. With data parallelism
(`exec.runtime.dp.ReplicaContext`) each replica's ranks get their own pipeline's `Result`, and
the step's loss is the mean over the replicas (each the mean over its equal shard).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.distributed as dist
from torch import nn

from sim import Event, Result
from sim.engine.program import Program
from sim.schedule.kinds import KINDS, Role

from exec.runtime.copies import sum_copies
from exec.runtime.interpreter import LossFn, RankInterpreter, RankTrace, refuse_offload
from exec.runtime.memory import static_memory
from exec.runtime.rank_program import compiled, sends_to_recvs
from exec.runtime.shapes import TensorMeta, infer_shapes

__all__ = ["StepResult", "run_step", "assemble_result"]


@dataclass
class StepResult:
    """One measured step: the `sim.Result` (every rank's events; None if not recorded) and
    the step's loss (mean over micro-batches), known on every rank."""

    result: Result | None
    loss: float
    train_step_s: float | None = None  # from the start to the last rank's optimizer step's end (recorded steps)
    optimizer_s: float | None = None  # this rank's optimizer step, on its own clock (None without an optimizer)


def assemble_result(program: Program, traces: Sequence[RankTrace]) -> Result:
    """Every rank's trace -> one `sim.Result` of `program`. A SEND ends when its data was
    there on the receiving rank: when the matching RECV's wait returned. (gloo cannot tell
    earlier: its `is_completed()` stays False until `wait()`.)"""
    role = {k: spec.role for k, spec in KINDS.items()}
    recv_of = sends_to_recvs(program)
    recv_end = {e.action: e.end for t in traces for e in t.events if role[e.action.kind] is Role.RECV}
    events = []
    for t in traces:
        for e in t.events:
            if role[e.action.kind] is Role.SEND:
                e = Event(e.rank, e.action, e.start, max(e.start, recv_end[recv_of[e.action]]), e.peer)
            events.append(e)
    memory = [sorted(t.memory, key=lambda x: x[0]) for t in traces]
    activations = [sorted(t.activations, key=lambda x: x[0]) for t in traces]
    return Result(program, events, memory, activations, source="measured")


def check_step_args(ctx, program: Program, stage_modules: dict, micro_inputs: Sequence,
                    micro_targets: Sequence) -> None:
    """ValueError (TypeError for a schedule not compiled) where the step cannot run on
    this rank: the program not compiled for `ctx.backend` (`exec.runtime.rank_program.compiled`),
    what exec does not run, or modules and micro-batches that do not fit the program."""
    schedule = compiled(program, ctx.backend).schedule
    refuse_offload(schedule)
    if schedule.has_collectives and getattr(ctx, "dp_group", None) is None:
        raise ValueError(f"schedule {schedule.name!r} has REDUCE_GRAD actions but the rank has no data-parallel "
                         f"group to reduce over; pass exec.runtime.dp.replica_context(ctx, pp, dp) as ctx (run_pipeline does)")
    if schedule.has_collectives and ctx.device.type != "cpu":
        raise ValueError(f"schedule {schedule.name!r} has REDUCE_GRAD actions, which exec runs and times on CPU "
                         f"ranks (gloo) only; run it with backend='gloo'")
    if schedule.ranks != ctx.world_size:
        raise ValueError(f"schedule {schedule.name!r} has {schedule.ranks} ranks but "
                         f"the process group has {ctx.world_size}; launch one process per rank")
    mine = {s for s, r in enumerate(schedule.placement) if r == ctx.rank}
    if set(stage_modules) != mine:
        raise ValueError(f"rank {ctx.rank} hosts stages {sorted(mine)} but was given modules for {sorted(stage_modules)}")
    if len(micro_inputs) != schedule.micro_batches or len(micro_targets) != schedule.micro_batches:
        raise ValueError(f"schedule has {schedule.micro_batches} micro-batches but got {len(micro_inputs)} "
                         f"inputs and {len(micro_targets)} targets")


def run_step(ctx, program: Program, stage_modules: dict[int, nn.Module],
             micro_inputs: Sequence[torch.Tensor], micro_targets: Sequence[torch.Tensor], loss_fn: LossFn,
             optimizer: torch.optim.Optimizer | None, record: bool = True,
             shapes: dict[int, TensorMeta] | None = None) -> StepResult:
    """One training step of this rank's part of `program` (`sim.compile(schedule,
    ctx.backend)`); call it on every rank at once.

    `stage_modules` holds this rank's stages; `micro_inputs`/`micro_targets` the
    micro-batches (stage 0 reads the inputs, the last stage the targets). Gradients are
    zeroed first, accumulate over micro-batches, and `optimizer.step()` closes the step.
    The rank's static memory is its stages' weights, gradients and optimizer state
    (`exec.runtime.memory.static_memory`). `shapes` (from `exec.runtime.shapes.infer_shapes`) saves a
    setup pass when given. With `record`, every rank's events are gathered and each rank
    gets the whole `sim.Result`.
    """
    check_step_args(ctx, program, stage_modules, micro_inputs, micro_targets)
    if shapes is None:
        shapes = infer_shapes(ctx, program.schedule, stage_modules, micro_inputs[0])
    if optimizer is not None:
        optimizer.zero_grad(set_to_none=True)
    else:
        for mod in stage_modules.values():
            mod.zero_grad(set_to_none=True)
    static = sum(static_memory(mod, optimizer).total for mod in stage_modules.values())
    interp = RankInterpreter(ctx, program, stage_modules, micro_inputs, micro_targets, loss_fn,
                             shapes, static)
    dist.barrier()  # all ranks start together: each rank's clock starts at the barrier exit
    trace = interp.run()
    sum_copies(ctx, program.schedule, stage_modules)  # DualPipe's two copies of a stage: one gradient
    begin = interp.clock.mark()
    if optimizer is not None:
        optimizer.step()
    end = interp.clock.mark()
    interp.clock.finish()
    trace.step_end = interp.clock.seconds(end)
    optimizer_s = trace.step_end - interp.clock.seconds(begin) if optimizer is not None else None
    gathered: list[RankTrace | None] = [None] * dist.get_world_size()  # every replica's ranks
    dist.all_gather_object(gathered, trace if record else RankTrace(ctx.rank, loss=trace.loss, step_end=trace.step_end))
    # per replica, its last stages' (one per copy of the model), each over its micro-batches
    losses = [t.loss for t in gathered if t.loss is not None]
    traces = [gathered[ctx.global_rank(r)] for r in range(ctx.world_size)]
    ends = [t.step_end for t in traces if t.step_end is not None]
    replicas = dist.get_world_size() // ctx.world_size
    return StepResult(assemble_result(program, traces) if record else None, sum(losses) / replicas,
                      max(ends) if record and ends else None, optimizer_s)
