"""A whole pipelined training run: one process per rank, warm-up and measured steps, calibration between them, and the check against one process.

    >>> run = run_pipeline(ModelSpec(), "1f1b", stages=2, micro=8, calibrate=1)   # doctest: +SKIP
    >>> run.grad_match, run.result.makespan, run.costs                            # doctest: +SKIP
    >>> run = run_pipeline(ModelSpec(), "1f1b", stages=2, micro=4, dp=2)          # doctest: +SKIP

`run_pipeline` validates and lowers the schedule, starts the ranks (`exec.launch.processes`), each
of which runs `pipeline_worker`: it builds its stages and its optimizer (`exec.runtime.optim`),
learns the receive shapes (`exec.runtime.shapes`), and runs `warmup + steps` steps
(`exec.runtime.step.run_step`), calibrating (`exec.measure.calibrate`) before every `calibrate` measured
steps if asked. The parent checks the first step's gradients against one process
(`exec.runtime.check`) and merges the calibration into `sim.Costs` (`exec.measure.costs`).

With `dp` > 1 the run has `dp` pipeline replicas, pp * dp processes in Megatron-LM's
order (`exec.runtime.dp`): each replica trains on its own contiguous 1/dp of the batch, and the
schedule's REDUCE_GRAD actions average each stage's gradients over its replicas
(`sim.add_grad_reduce`; a schedule named by a string gets them, a `Schedule` must have
them). Every replica's gradients are checked against one process on the whole batch.

A rank can be made to fail on purpose (`fault="raise:1"`, `"exit:1"`, `"hang:1"`) to test
how a run ends.
"""
from __future__ import annotations

import math
import os
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

import torch

import sim
from sim import Result, Schedule
from sim.passes.order import order_transfers

from exec.measure.calibrate import calibrate_rank, message_sizes
from exec.measure.busy import StepLoad, describe_load, load_summary
from exec.runtime.check import compare_grads, reference_step, split_micro_batches
from exec.runtime.dp import Grid, check_dp, replica_context, shard
from exec.launch.host import host_cores, paused_gc
from exec.runtime.interpreter import refuse_offload
from exec.launch.processes import launch
from exec.runtime.optim import OPTIMIZERS, make_optimizer
from exec.measure.costs import costs_from_reports
from exec.runtime.shapes import infer_shapes
from exec.runtime.step import run_step

__all__ = ["run_pipeline", "pipeline_worker", "PipelineRun", "median_step", "parse_fault", "FAULTS"]

FAULTS = ("raise", "exit", "hang")


def parse_fault(text: str | None) -> tuple[str, int] | None:
    """'raise:1' / 'exit:1' / 'hang:1' -> (what, rank): make that rank fail on purpose
    (before its first measured step), to test how a run ends. None -> None."""
    if not text:
        return None
    what, _, rank = text.partition(":")
    if what not in FAULTS or not rank.isdigit():
        raise ValueError(f"fault must be KIND:RANK with KIND in {', '.join(FAULTS)}, e.g. 'raise:1'; got {text!r}")
    return what, int(rank)


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


# ---------------------------------------------------------------------------- inside a rank

def _build_rank(ctx, spec, schedule: Schedule, bounds: Sequence[int], lr: float, optimizer: str):
    """This rank's stages (stage -> module), its optimizer, its replica's micro-batches
    and the receive shapes (`ctx`: its `exec.runtime.dp.ReplicaContext`)."""
    mine = [s for s, r in enumerate(schedule.placement) if r == ctx.rank]
    all_stages = spec.build_stages(schedule.stages, bounds=bounds)
    modules = {s: all_stages[s].to(ctx.device) for s in mine}
    del all_stages
    opt = make_optimizer(optimizer, [p for s in mine for p in modules[s].parameters()], lr)
    inputs, targets = shard(*spec.batch(), ctx.dp, ctx.replica)
    micro_inputs, micro_targets = split_micro_batches(inputs, targets, schedule.micro)
    shapes = infer_shapes(ctx, schedule, modules, micro_inputs[0])
    return modules, opt, micro_inputs, micro_targets, shapes


def _grads(modules: dict) -> dict:
    """Every parameter's gradient per stage, as (name, numpy array) copies (numpy() of a
    CPU tensor shares its memory, and the gradient tensors live on)."""
    return {s: [(n, (p.grad if p.grad is not None else torch.zeros_like(p)).detach().cpu().numpy().copy())
                for n, p in m.named_parameters()] for s, m in modules.items()}


def _say(text: str) -> None:
    print(f"exec: {text}", file=sys.stderr, flush=True)


class _Progress:
    """Rank 0's progress lines, and a heartbeat: after `every` seconds without one, a
    line says what the run is still doing and for how long (a run never stalls silently)."""

    def __init__(self, on: bool, first: str, every: float = 5.0):
        self.on, self.every, self.what, self.since = on, every, first, time.monotonic()
        self._done = threading.Event()
        if on:
            threading.Thread(target=self._beat, name="exec-progress", daemon=True).start()

    def say(self, text: str, doing: str | None = None) -> None:
        self.what, self.since = doing or text, time.monotonic()
        if self.on:
            _say(text)

    def _beat(self) -> None:
        last = time.monotonic()
        while not self._done.wait(1.0):
            now = time.monotonic()
            if now - max(self.since, last) >= self.every:
                last = now
                _say(f"{self.what}: still running after {now - self.since:.0f} s")

    def close(self) -> None:
        self._done.set()


def pipeline_worker(ctx, spec, schedule: Schedule, steps: int, warmup: int, bounds: Sequence[int], lr: float,
                    fault: tuple[str, int] | None, progress: bool, calibrate: int = 0,
                    optimizer: str = "sgd", dp: int = 1) -> dict:
    """The function every rank runs (via `exec.launch.processes.launch`, on `schedule.ranks * dp`
    ranks): build this rank's stages and its `optimizer` (a name from
    `exec.runtime.optim.OPTIMIZERS`), run `warmup + steps` steps, and return what the parent needs.
    `fault` names a world rank; the ranks of replica d are `exec.runtime.dp.Grid.pipe_ranks(d)`.

    Every rank returns the gradients of its stages after the first step (numpy arrays,
    before the optimizer moved the weights, so they compare with `reference_step`) and
    the step losses (the mean over the replicas); world rank 0 also returns the measured
    steps' `sim.Result`s (its replica's pipeline).

    With `calibrate` = k > 0, the run also measures what the simulator needs: before
    every k measured steps, the ranks calibrate (`exec.measure.calibrate.calibrate_rank`) on these
    very modules and this optimizer, so that calibration and measurement share the same
    processes, cores and time window (the first round also bounces messages for the
    transfer fit). Every rank returns its reports, one per round, for
    `exec.measure.costs.costs_from_reports`. With `dp` > 1 calibration runs on a replica's
    shard of the batch (the micro-batches a step computes)."""
    world_rank = ctx.rank
    ctx = replica_context(ctx, schedule.ranks, dp)
    modules, opt, micro_inputs, micro_targets, shapes = _build_rank(ctx, spec, schedule, bounds, lr, optimizer)
    out: dict[str, Any] = {"rank": world_rank, "losses": [], "results": [], "train_steps": [], "grads": {},
                           "reports": [],
                           "load": []}
    say = _Progress(progress and world_rank == 0, f"warm-up 1/{warmup}" if warmup else f"step 1/{steps}")
    shard_spec = replace(spec, batch_size=spec.batch_size // dp)  # what one replica computes, for calibration
    try:
        _steps(ctx, shard_spec, schedule, steps, warmup, bounds, fault, calibrate, modules, opt,
               micro_inputs, micro_targets, shapes, out, say)
    finally:
        say.close()
    return out


def _steps(ctx, spec, schedule, steps, warmup, bounds, fault, calibrate, modules, opt, micro_inputs,
           micro_targets, shapes, out, say: _Progress) -> None:
    """`pipeline_worker`'s loop: warm-up and measured steps, calibration rounds between
    (on `spec`, the batch of one replica)."""
    for i in range(warmup + steps):
        if i == warmup:
            _inject(fault, ctx.world_rank)
        measured = i >= warmup
        if calibrate and measured and (i - warmup) % calibrate == 0:
            rnd = (i - warmup) // calibrate
            say.say(f"calibrating {rnd + 1}/{-(-steps // calibrate)}")
            sizes = message_sizes(spec, schedule.micro) if rnd == 0 else None
            out["reports"].append(calibrate_rank(ctx, spec, schedule, schedule.micro, bounds, steps=3,
                                                 sizes=sizes, modules=modules, optimizer=opt))
        t = time.perf_counter()
        with paused_gc(), StepLoad() as load:
            step = run_step(ctx, schedule, modules, micro_inputs, micro_targets, spec.loss, opt,
                            record=measured, shapes=shapes)
        if measured:
            out["load"].append(load.record)
        out["losses"].append(step.loss)
        if i == 0:
            out["grads"] = _grads(modules)
        if measured and ctx.world_rank == 0:
            out["results"].append(step.result)
            out["train_steps"].append(step.train_step_s)
        what = f"step {i - warmup + 1}/{steps}" if measured else f"warm-up {i + 1}/{warmup}"
        span = f"{step.result.makespan * 1e3:.2f} ms" if measured else f"{(time.perf_counter() - t) * 1e3:.0f} ms wall"
        nxt = f"warm-up {i + 2}/{warmup}" if i + 1 < warmup else f"step {i - warmup + 2}/{steps}"
        say.say(f"{what}: loss {step.loss:.5f}, {span}", doing=nxt)


# ---------------------------------------------------------------------------- the parent

@dataclass
class PipelineRun:
    """What `run_pipeline` measured and checked."""

    schedule: Schedule                # lowered
    bounds: list[int]                 # stage s = layers bounds[s] .. bounds[s+1]-1
    result: Result                    # the median measured step
    steps: list[Result]               # every measured step
    losses: list[float]               # per step, warm-up included
    reference_loss: float
    grad_match: bool
    max_grad_diff: float
    worst_param: str
    costs: sim.Costs | None = None    # calibrated inside the run (`calibrate` > 0), else None
    calibration: dict | None = None   # its details (`exec.measure.costs.costs_from_reports`)
    reports: list[list[dict]] = field(default_factory=list)  # per round, every rank's report
    optimizer: str = "sgd"
    dp: int = 1                       # pipeline replicas; result, losses: replica 0's pipeline, the mean loss
    train_step_times: list[float] = field(default_factory=list)  # per measured step, start to the optimizer's end
    load: list[list[dict]] = field(default_factory=list)  # per world rank, per measured step: exec.measure.busy.StepLoad

    @property
    def step_times(self) -> list[float]:
        return [r.makespan for r in self.steps]

    @property
    def measured_step_s(self) -> float:
        return self.result.makespan

    @property
    def nonfinite_step(self) -> int | None:
        """The index of the first step (warm-up included) whose loss is NaN or infinite, else None."""
        return next((i for i, x in enumerate(self.losses) if not math.isfinite(x)), None)

    @property
    def loss_match(self) -> bool:
        return math.isclose(self.losses[0], self.reference_loss, rel_tol=1e-5, abs_tol=1e-6)

    def summary(self) -> dict:
        s = self.schedule
        return {
            "schedule": s.name, "stages": s.stages, "ranks": s.ranks, "micro": s.micro, "bounds": self.bounds,
            "dp": self.dp, "world_size": s.ranks * self.dp,
            "optimizer": self.optimizer,
            "measured_step_s": self.measured_step_s, "step_times_s": self.step_times,
            "measured_train_step_s": statistics.median(self.train_step_times) if self.train_step_times else None,
            "train_step_times_s": self.train_step_times,
            "bubble_fraction": self.result.bubble_fraction, "peak_activations": self.result.peak_activations,
            "peak_memory": self.result.peak_memory,
            "loss": self.losses[-1], "first_loss": self.losses[0], "steps": len(self.losses),
            "reference_loss": self.reference_loss, "loss_match": self.loss_match,
            "grad_match": self.grad_match, "max_grad_diff": self.max_grad_diff, "worst_param": self.worst_param,
            "grad_reduce_s": self.grad_reduce_s,
        }

    def load_json(self) -> dict:
        """How busy the machine was over the measured steps (`exec.measure.busy.load_summary`):
        `lost_share`, the most of any rank's wall time other processes took (None without
        scheduler statistics), and per rank that share and the CPU time it got."""
        load = load_summary(self.load)
        return {"lost_share": load["lost_share_max"], "lost_share_per_rank": [r["lost_share"] for r in load["ranks"]],
                "cpu_share_per_rank": [r["cpu_share"] for r in load["ranks"]],
                "load": describe_load(load)}

    @property
    def grad_reduce_s(self) -> list[float] | None:
        """Per stage, how long its REDUCE_GRAD took in the median step (None without them)."""
        spans = {e.action.stage: e.duration for e in self.result.events if e.is_collective}
        return [spans.get(s, 0.0) for s in range(self.schedule.stages)] if spans else None


def median_step(results: Sequence[Result]) -> Result:
    """The step whose makespan is the median (the lower one of the middle two)."""
    if not results:
        raise ValueError("no measured steps; run at least one step")
    ordered = sorted(results, key=lambda r: r.makespan)
    return ordered[(len(ordered) - 1) // 2]


def _check_run_args(spec, schedule: Schedule, steps: int, warmup: int, calibrate: int, backend: str,
                    optimizer: str, fault: str | None, dp: int = 1, lr: float = 0.01
                    ) -> tuple[Schedule, tuple[str, int] | None]:
    """The lowered schedule and the parsed fault, or a ValueError before anything starts."""
    for what, n, least in (("steps", steps, 1), ("warmup", warmup, 0), ("calibrate", calibrate, 0)):
        if isinstance(n, bool) or not isinstance(n, int) or n < least:
            raise ValueError(f"{what} must be an integer >= {least}, got {n!r}")
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not (math.isfinite(lr) and lr >= 0):
        raise ValueError(f"lr must be a finite number >= 0, got {lr!r}")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {optimizer!r}")
    if calibrate and backend != "gloo":
        raise ValueError(f"calibrate times CPU ranks (gloo) only, not backend={backend!r}; "
                         f"simulate an NCCL run with costs written by sim.save_costs")
    check_dp(dp, spec.batch_size, schedule.micro)
    if dp > 1 and not schedule.has_collectives:
        raise ValueError(f"dp={dp} replicas must average their gradients, but schedule {schedule.name!r} has no "
                         f"REDUCE_GRAD actions; pass sim.add_grad_reduce(schedule, overlap) (a schedule name gets them)")
    if schedule.has_collectives and backend != "gloo":
        raise ValueError(f"exec runs REDUCE_GRAD (data parallelism) on CPU ranks (gloo) only, not backend={backend!r}")
    lowered = sim.validate(schedule)
    refuse_offload(lowered)
    if backend == "nccl":  # NCCL pairs a rank's transfers by order, not tag (docs/rules.md)
        lowered = order_transfers(lowered)
    split_micro_batches(torch.empty(spec.batch_size, 0), torch.empty(spec.batch_size, 0), lowered.micro)
    injected = parse_fault(fault)
    if injected is not None and injected[1] >= lowered.ranks * dp:
        raise ValueError(f"fault {fault!r} names rank {injected[1]} but the run has ranks 0..{lowered.ranks * dp - 1}")
    return lowered, injected


def _check_replicas(per_rank: list[dict], lowered: Schedule, dp: int, ref_grads, rtol: float, atol: float
                    ) -> tuple[bool, float, str]:
    """Every replica's gradients after the first step against one process on the whole
    batch: (all match, largest difference, where; "replica d: stageS.name" with dp > 1)."""
    grid, checks = Grid(lowered.ranks, dp), []
    for d in range(dp):
        grads = [(f"stage{s}.{n}", g) for s in range(lowered.stages)
                 for n, g in per_rank[grid.rank(lowered.rank_of(s), d)]["grads"][s]]
        match, worst, where = compare_grads(grads, ref_grads, rtol, atol)
        checks.append((worst, match, f"replica {d}: {where}" if dp > 1 else where))
    worst, _, where = max(checks, key=lambda c: c[0])
    return all(match for _, match, _ in checks), worst, where


def run_pipeline(spec, schedule: Schedule | str, stages: int | None = None, micro: int | None = None, *,
                 steps: int = 5, warmup: int = 2, balance: str = "layers", bounds: Sequence[int] | None = None,
                 backend: str = "gloo", timeout: float = 300.0, threads: int | None = None, lr: float = 0.01,
                 fault: str | None = None, progress: bool = False, rtol: float = 1e-4, atol: float = 1e-5,
                 calibrate: int = 0, optimizer: str = "sgd", dp: int = 1,
                 overlap_grad_reduce: bool = False) -> PipelineRun:
    """Run `schedule` (a `sim.Schedule`, or a name from `sim.SCHEDULES` with `stages` and
    `micro`) on one process per rank, `warmup` + `steps` training steps of `spec` with
    `optimizer` ("sgd" or "adamw", `exec.runtime.optim`), and check the first step's loss and
    gradients against `reference_step`.

    `calibrate` = k > 0 also measures the simulator's costs in the same processes: a
    calibration round before every k measured steps (`pipeline_worker`); the run's
    `costs` pool every round (`exec.measure.costs.costs_from_reports`). CPU ranks (gloo) only.

    `dp` = number of pipeline replicas (data parallelism, `exec.runtime.dp`): schedule.ranks * dp
    processes, each replica on its own 1/dp of the batch, the batch a multiple of dp *
    micro. A schedule name with dp > 1 gets `sim.add_grad_reduce(schedule,
    overlap_grad_reduce)`; a `Schedule` must hold its REDUCE_GRAD actions already. The
    gradients of every replica are checked (`grad_match`: all of them match).

    Raises `exec.launch.processes.RankError` / `TimeoutError` if a rank fails or the run is too slow."""
    if isinstance(schedule, str):
        if stages is None or micro is None:
            raise ValueError("a schedule name needs stages and micro, e.g. run_pipeline(spec, '1f1b', 2, 8)")
        schedule = sim.make_schedule(schedule, stages, micro)
        if isinstance(dp, int) and dp > 1:
            schedule = sim.add_grad_reduce(schedule, overlap_grad_reduce)
    lowered, injected = _check_run_args(spec, schedule, steps, warmup, calibrate, backend, optimizer, fault, dp, lr)
    # balance="time" profiles a micro-batch of the size a replica computes
    bounds = list(bounds) if bounds is not None else spec.partition(lowered.stages, balance, lowered.micro * dp)
    world = lowered.ranks * dp
    if progress and backend == "gloo" and world > len(host_cores()):
        _say(f"warning: {world} ranks share {len(host_cores())} cores, so they wait for each other's "
             f"cores and measured times cannot match the simulation (docs/rules.md, rule 9)")
    per_rank = launch(pipeline_worker, world, spec, lowered, steps, warmup, bounds, lr,
                      injected, progress, calibrate, optimizer, dp, backend=backend, timeout=timeout, threads=threads)
    ref_loss, ref_grads = reference_step(spec, lowered.micro)
    match, worst, where = _check_replicas(per_rank, lowered, dp, ref_grads, rtol, atol)
    results = per_rank[0]["results"]
    run = PipelineRun(lowered, bounds, median_step(results), results, per_rank[0]["losses"],
                      ref_loss, match, worst, where, optimizer=optimizer, dp=dp,
                      train_step_times=per_rank[0]["train_steps"],
                      load=[r["load"] for r in per_rank])
    if calibrate:
        run.reports = [list(rnd) for rnd in zip(*(r["reports"] for r in per_rank))]
        run.costs, run.calibration = costs_from_reports([rep for rnd in run.reports for rep in rnd], lowered)
        run.calibration.update(bounds=bounds, backend=backend, calibrate_every=calibrate, optimizer=optimizer)
    return run
