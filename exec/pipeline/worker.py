"""What every rank of a pipelined run runs: `pipeline_worker` builds its stages and optimizer, runs the warm-up and measured steps, and calibrates between them.

    >>> launch(pipeline_worker, 2, spec, sim.compile(schedule, "gloo"), bounds, RunConfig(steps=3))   # doctest: +SKIP

Every rank runs the same compiled program (`sim.engine.program.Program`, made once by the
parent: `exec.pipeline.runner.check_run`). Each rank builds its stages and its optimizer (`exec.runtime.optim`), learns the receive
shapes (`exec.runtime.shapes`), and runs `warmup + steps` steps (`exec.runtime.step.run_step`),
calibrating (`exec.measure.calibrate`) before every `calibrate` measured steps if asked. A
rank can be made to fail on purpose (`RunConfig.fault`) to test how a run ends. With
`RunConfig.trace`, one more step after the measured ones runs under torch.profiler, each
rank writing its part (`exec.measure.trace.trace_rank`; the runner merges them). Rank 0
says what it does, and what it is still doing after `RunConfig.progress_every` silent
seconds (`Progress`, on `sim.cli.Heartbeat`).
"""
from __future__ import annotations

import copy
import os
import sys
import time
from dataclasses import replace
from typing import Any, Callable, NamedTuple, Sequence

import torch
from torch import nn

from sim import Schedule
from sim.cli import Heartbeat
from sim.engine.program import Program

from exec.launch.host import paused_gc, rank_place
from exec.measure.busy import StepLoad
from exec.measure.calibrate import calibrate_rank, message_sizes
from exec.measure.trace import trace_rank
from exec.models.moe import expert_parallel
from exec.pipeline.config import RunConfig
from exec.runtime.check import split_micro_batches
from exec.runtime.dp import replica_context, shard
from exec.runtime.optim import make_optimizer
from exec.runtime.shapes import TensorMeta, infer_shapes
from exec.runtime.step import run_step

__all__ = ["pipeline_worker", "say", "Progress"]


def say(text: str) -> None:
    """One progress line on stderr, as exec writes them."""
    print(f"exec: {text}", file=sys.stderr, flush=True)


def _inject(fault: tuple[str, int] | None, rank: int) -> None:
    if fault is None or fault[1] != rank:
        return
    what = fault[0]
    if what == "raise":
        raise RuntimeError(f"fault injected on rank {rank} (--fault raise:{rank})")
    if what == "exit":
        os._exit(3)
    while True:  # hang
        time.sleep(1.0)


class _Rank(NamedTuple):
    """What a rank builds before its first step."""

    modules: dict[int, nn.Module]     # stage -> its module
    optimizer: torch.optim.Optimizer
    inputs: list[torch.Tensor]        # its replica's micro-batches
    targets: list[torch.Tensor]
    shapes: dict[int, TensorMeta]     # what it receives


def _build_rank(ctx, spec, schedule: Schedule, bounds: Sequence[int], config: RunConfig) -> _Rank:
    """This rank's stages, its optimizer, its replica's micro-batches and the receive
    shapes (`ctx`: its `exec.runtime.dp.ReplicaContext`)."""
    mine = [s for s, r in enumerate(schedule.placement) if r == ctx.rank]
    all_stages = spec.build_stages(schedule.chain, bounds=bounds)  # stage s is s mod chain of its copy
    modules = {s: (all_stages[s] if s < schedule.chain else copy.deepcopy(all_stages[s % schedule.chain])).to(ctx.device)
               for s in mine}
    del all_stages
    expert_parallel(modules.values(), ctx.ep_group)  # keep this rank's experts (ep > 1)
    opt = make_optimizer(config.optimizer, [p for s in mine for p in modules[s].parameters()], config.lr)
    inputs, targets = shard(*spec.batch(), ctx.dp, ctx.replica)
    micro_inputs, micro_targets = split_micro_batches(inputs, targets, schedule.micro_batches)
    shapes = infer_shapes(ctx, schedule, modules, micro_inputs[0])
    return _Rank(modules, opt, micro_inputs, micro_targets, shapes)


def _grads(modules: dict) -> dict:
    """Every parameter's gradient per stage, as (name, numpy array) copies (numpy() of a
    CPU tensor shares its memory, and the gradient tensors live on)."""
    return {s: [(n, (p.grad if p.grad is not None else torch.zeros_like(p)).detach().cpu().numpy().copy())
                for n, p in m.named_parameters()] for s, m in modules.items()}


class Progress:
    """Rank 0's progress lines (`on`), and its heartbeat: after `every` seconds of `clock`
    without a line, a line says what the run is still doing and for how long (a run never
    stalls silently). `write` prints a line (default `say`). Run it as a context manager to
    beat from a thread on the real clock; a test calls `beat()` on a clock it moves.

        >>> now, out = [0.0], []
        >>> p = Progress(True, "step 1/2", every=5, clock=lambda: now[0], write=out.append)
        >>> now[0] = 5.0; _ = p.beat()
        >>> now[0] = 6.0; p.say("step 1/2: loss 0.5", doing="step 2/2")
        >>> now[0] = 10.9; _ = p.beat()
        >>> now[0] = 11.0; _ = p.beat()
        >>> out
        ['step 1/2: still running after 5 s', 'step 1/2: loss 0.5', 'step 2/2: still running after 5 s']
    """

    def __init__(self, on: bool, first: str, every: float = 5.0, clock: Callable[[], float] = time.monotonic,
                 write: Callable[[str], None] = say):
        self.on, self.what, self.write = on, first, write
        self.heart = Heartbeat(lambda s: f"{self.what}: still running after {s:.0f} s", every=every,
                               clock=clock, write=write)

    def say(self, text: str, doing: str | None = None) -> None:
        """A line (if `on`); `doing`: what the run does next, for the heartbeat (default `text`)."""
        self.what = doing or text
        self.heart.said()
        if self.on:
            self.write(text)

    def beat(self) -> bool:
        """A heartbeat line if one is due (and `on`); whether it wrote one."""
        return self.on and self.heart.beat()

    def __enter__(self) -> "Progress":
        if self.on:
            self.heart.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.heart.__exit__(*exc)


def pipeline_worker(ctx, spec, program: Program, bounds: Sequence[int], config: RunConfig) -> dict:
    """The function every rank runs (via `exec.launch.processes.launch`, on
    `program.ranks * config.dp` ranks): build this rank's stages and its optimizer, run
    `config.warmup + config.steps` steps of the compiled `program` (`sim.compile(schedule,
    config.backend)`) on the model `spec` cut
    at `bounds`, and return what the parent needs. `config.fault` names a world rank (laid
    out by `sim.hardware.topology.Topology`: `coords` gives a rank's replica and pipeline rank).

    Every rank returns the gradients of its stages after the first step (numpy arrays,
    before the optimizer moved the weights, so they compare with `reference_step`) and
    the step losses (the mean over the replicas) and where it ran (`exec.launch.host.rank_place`);
    world rank 0 also returns the measured
    steps' `sim.Result`s (its replica's pipeline).

    With `config.calibrate` = k > 0, the run also measures what the simulator needs:
    before every k measured steps, the ranks calibrate
    (`exec.measure.calibrate.calibrate_rank`) on these very modules and this optimizer,
    so that calibration and measurement share the same processes, cores and time window
    (the first round also bounces messages for the transfer fit). Every rank returns its
    reports, one per round, for `exec.measure.costs.costs_from_reports`. With dp > 1
    calibration runs on a replica's shard of the batch (the micro-batches a step computes)."""
    world_rank = ctx.rank
    ctx = replica_context(ctx, program.ranks, config.dp, config.ep)
    rank = _build_rank(ctx, spec, program.schedule, bounds, config)
    out: dict[str, Any] = {"rank": world_rank, "losses": [], "results": [], "train_steps": [], "grads": {},
                           "reports": [], "load": [], "place": rank_place()}
    first = f"warm-up 1/{config.warmup}" if config.warmup else f"step 1/{config.steps}"
    shard_spec = replace(spec, batch_size=spec.batch_size // config.dp)  # what one replica computes, for calibration
    with Progress(config.progress and world_rank == 0, first, every=config.progress_every) as progress:
        _steps(ctx, shard_spec, program, bounds, config, rank, out, progress)
    return out


def _calibrate(ctx, spec, program: Program, bounds, config: RunConfig, rank: _Rank, measured: int,
               progress: Progress) -> dict:
    """One calibration round, before measured step `measured` (a multiple of `config.calibrate`)."""
    rnd = measured // config.calibrate
    progress.say(f"calibrating {rnd + 1}/{-(-config.steps // config.calibrate)}")
    micro_batches = program.schedule.micro_batches
    sizes = message_sizes(spec, micro_batches) if rnd == 0 else None
    return calibrate_rank(ctx, spec, program, micro_batches, bounds, steps=3, sizes=sizes,
                          modules=rank.modules, optimizer=rank.optimizer)


def _steps(ctx, spec, program: Program, bounds, config: RunConfig, rank: _Rank, out: dict,
           progress: Progress) -> None:
    """`pipeline_worker`'s loop: warm-up and measured steps, calibration rounds between
    (on `spec`, the batch of one replica)."""
    warmup, steps = config.warmup, config.steps
    for i in range(warmup + steps):
        if i == warmup:
            _inject(config.injected, ctx.world_rank)
        measured = i >= warmup
        if config.calibrate and measured and (i - warmup) % config.calibrate == 0:
            out["reports"].append(_calibrate(ctx, spec, program, bounds, config, rank, i - warmup, progress))
        t = time.perf_counter()
        with paused_gc(), StepLoad() as load:
            step = run_step(ctx, program, rank.modules, rank.inputs, rank.targets, spec.loss, rank.optimizer,
                            record=measured, shapes=rank.shapes)
        if measured:
            out["load"].append(load.record)
        out["losses"].append(step.loss)
        if i == 0:
            out["grads"] = _grads(rank.modules)
        if measured and ctx.world_rank == 0:
            out["results"].append(step.result)
            out["train_steps"].append(step.train_step_s)
        what = f"step {i - warmup + 1}/{steps}" if measured else f"warm-up {i + 1}/{warmup}"
        span = f"{step.result.makespan * 1e3:.2f} ms" if measured else f"{(time.perf_counter() - t) * 1e3:.0f} ms wall"
        nxt = f"warm-up {i + 2}/{warmup}" if i + 1 < warmup else f"step {i - warmup + 2}/{steps}"
        progress.say(f"{what}: loss {step.loss:.5f}, {span}", doing=nxt)
    if config.trace is not None:  # after the measured steps, so that the profiler's own time is in none of them
        with paused_gc(), trace_rank(config.trace, ctx.world_rank, ctx.device):
            run_step(ctx, program, rank.modules, rank.inputs, rank.targets, spec.loss, rank.optimizer,
                     record=False, shapes=rank.shapes)
