"""A whole pipelined training run: one process per rank, warm-up and measured steps, calibration between them, and the check against one process.

    >>> run = run_pipeline(ModelSpec(), "1f1b", devices=2, micro_batches=8, calibrate=1)   # doctest: +SKIP
    >>> run.grad_match, run.result.makespan, run.costs                            # doctest: +SKIP
    >>> run = run_pipeline(ModelSpec(), "1f1b", 2, 4, RunConfig(dp=2, steps=3))    # doctest: +SKIP

`run_pipeline` checks its `exec.pipeline.config.RunConfig` against the model and the
schedule and compiles the schedule for its backend (`check_run`, which calls `sim.compile`,
the one pipeline of checks and passes that `sim.simulate` runs too), starts the ranks
(`exec.launch.processes`), each of which runs the compiled program as it is
(`exec.pipeline.worker.pipeline_worker`), then checks the first step's
gradients against one process (`exec.runtime.check`) and merges the calibration into
`sim.Costs` (`exec.measure.costs`).

With `dp` > 1 the run has `dp` pipeline replicas, pp * dp processes in Megatron-LM's
order (`exec.runtime.dp`): each replica trains on its own contiguous 1/dp of the batch,
and the schedule's REDUCE_GRAD actions average each stage's gradients over its replicas
(`sim.add_grad_reduce`; a schedule named by a string gets them from `exec.pipeline.config.step_schedule`, a
`Schedule` must have them). Every replica's gradients are checked against one process on the whole batch.
With `ep` > 1 the routed experts of a MoE model are spread over ep of the replicas
(`exec.runtime.ep`), and each replica's experts are checked against the same experts of
the one process.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Sequence

import torch

import sim
from sim import Result, Schedule
from sim.engine.program import Program
from sim.hardware.topology import Topology

from exec.launch.host import host_cores, hosts_of
from exec.launch.processes import check_gpus, launch, local_world
from exec.measure.busy import describe_load, load_summary
from exec.measure.calibrate import check_calibrated
from exec.measure.costs import costs_from_reports
from exec.measure.trace import merge_rank_traces
from exec.pipeline.config import NCCL_NOT_YET, RunConfig, model_spec, run_options, run_schedule
from exec.pipeline.worker import pipeline_worker, say
from exec.runtime.check import compare_grads, param_names, reference_step, split_micro_batches
from exec.runtime.dp import check_dp
from exec.runtime.ep import check_ep, holds_expert
from exec.runtime.interpreter import refuse_offload
from exec.runtime.optim import DEFAULT_OPTIMIZER

__all__ = ["run_pipeline", "check_run", "PipelineRun", "median_step"]

@dataclass
class PipelineRun:
    """What `run_pipeline` measured and checked."""

    program: Program                  # what the ranks ran (`sim.compile(schedule, backend)`)
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
    optimizer: str = DEFAULT_OPTIMIZER
    dp: int = 1                       # pipeline replicas; result, losses: replica 0's pipeline, the mean loss
    train_step_times: list[float] = field(default_factory=list)  # per measured step, start to the optimizer's end
    load: list[list[dict]] = field(default_factory=list)  # per world rank, per measured step: exec.measure.busy.StepLoad
    hosts: list[dict] = field(default_factory=list)  # per host: its ranks, their cores, nodes (exec.launch.host.hosts_of)

    @property
    def schedule(self) -> Schedule:
        """The lowered schedule the ranks ran: the program written out (`Result.schedule`)."""
        return self.result.schedule

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
            "schedule": s.name, "stages": s.stages, "ranks": s.ranks, "micro_batches": s.micro_batches, "bounds": self.bounds,
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
            "grad_reduce_s": self.grad_reduce_s, "hosts": self.hosts,
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


def check_run(spec, schedule: Schedule, config: RunConfig) -> Program:
    """The schedule compiled for `config.backend` (`sim.compile`): the program every rank
    runs; or a ValueError (a `sim.ScheduleError` for the schedule itself) before anything
    starts: the model, the schedule and the configuration must fit together."""
    dp, backend = config.dp, config.backend
    check_dp(dp, spec.batch_size, schedule.micro_batches)
    if dp > 1 and not schedule.has_collectives:
        raise ValueError(f"dp={dp} replicas must average their gradients, but schedule {schedule.name!r} has no "
                         f"REDUCE_GRAD actions; pass sim.add_grad_reduce(schedule, overlap) (a schedule name gets them)")
    if schedule.has_collectives and backend != "gloo":
        raise ValueError(f"dp={dp}: data parallelism (REDUCE_GRAD in {schedule.name!r}) {NCCL_NOT_YET}; "
                         f"it runs on CPU ranks (gloo) only")
    check_gpus(backend, local_world(schedule.ranks * dp))
    program = sim.compile(schedule, backend)  # for nccl, RECVs in the order the peer sends
    if config.calibrate:
        check_calibrated(schedule)
    refuse_offload(schedule)
    _check_experts(spec, schedule, config)
    split_micro_batches(torch.empty(spec.batch_size, 0), torch.empty(spec.batch_size, 0), schedule.micro_batches)
    fault = config.injected
    if fault is not None and fault[1] >= schedule.ranks * dp:
        raise ValueError(f"fault {config.fault!r} names rank {fault[1]} but the run has ranks "
                         f"0..{schedule.ranks * dp - 1}")
    return program


def _check_experts(spec, schedule: Schedule, config: RunConfig) -> None:
    """ValueError for expert parallelism where exec does not run it (`exec.runtime.ep`)."""
    check_ep(config.ep, config.dp, getattr(spec, "experts", None))
    if config.ep == 1:
        return
    if schedule.has_gathers:
        raise ValueError(f"ep={config.ep}: FSDP (UNSHARD in {schedule.name!r}) would shard the routed experts over "
                         f"dp; exec runs expert parallelism without FSDP")


def _check_replicas(per_rank: list[dict], schedule: Schedule, dp: int, ref_grads, rtol: float, atol: float,
                    expert_ranks: tuple[int, int, list[str]] | None = None) -> tuple[bool, float, str]:
    """Every replica's gradients after the first step against one process on the whole
    batch: (all match, largest difference, where; "replica d: stageS.name" with dp > 1).
    `expert_ranks` (experts, ep, the reference's parameter names) where ep > 1: replica d
    holds the experts of ep rank d mod ep, and is held against those of the reference."""
    topo, checks = Topology(tp=1, pp=schedule.ranks, dp=dp), []
    for d in range(dp):
        grads = [(f"stage{s}.{n}", g) for s in range(schedule.chain)  # a copy's stage holds the sum (DualPipe)
                 for n, g in per_rank[topo.rank(0, d, schedule.rank_of(s))]["grads"][s]]
        ref = ref_grads
        if expert_ranks is not None:
            experts, ep, names = expert_ranks
            ref = [g for n, g in zip(names, ref_grads) if holds_expert(n, experts, ep, d % ep)]
        match, worst, where = compare_grads(grads, ref, rtol, atol)
        checks.append((worst, match, f"replica {d}: {where}" if dp > 1 else where))
    worst, _, where = max(checks, key=lambda c: c[0])
    return all(match for _, match, _ in checks), worst, where


def run_pipeline(spec, schedule: Schedule | str, devices: int | None = None, micro_batches: int | None = None,
                 config: RunConfig | None = None, **options) -> PipelineRun:
    """Run `schedule` (a `sim.Schedule`, or a name from `sim.SCHEDULES` with `devices` and
    `micro_batches`) on one process per rank as `config` (an `exec.pipeline.config.RunConfig`) says:
    `warmup` + `steps` training steps of `spec` with its `optimizer`, and check the first
    step's loss and gradients against `reference_step`. Keyword `options` set fields of
    `config` (`run_pipeline(spec, "1f1b", 2, 8, steps=3)` is `run_pipeline(spec, "1f1b", 2,
    8, RunConfig(steps=3))`); it reads every field. `spec`: an `exec.ModelSpec`, or a name of
    `exec.pipeline.config.MODELS` ("mlp", "gpt") for `ModelSpec(name)`.

    `calibrate` = k > 0 also measures the simulator's costs in the same processes: a
    calibration round before every k measured steps (`exec.pipeline.worker`); the run's
    `costs` pool every round (`exec.measure.costs.costs_from_reports`). CPU ranks (gloo) only.

    `dp` = number of pipeline replicas (data parallelism, `exec.runtime.dp`):
    schedule.ranks * dp processes, each replica on its own 1/dp of the batch, the batch a
    multiple of dp * micro. A schedule name with dp > 1 gets `sim.add_grad_reduce(schedule,
    overlap_grad_reduce)`; a `Schedule` must hold its REDUCE_GRAD actions already. The
    gradients of every replica are checked (`grad_match`: all of them match).

    Raises `exec.launch.processes.RankError` / `TimeoutError` if a rank fails or the run is too slow."""
    spec = model_spec("run_pipeline", spec)
    config = run_options("run_pipeline", config, options)
    schedule = run_schedule("run_pipeline", schedule, devices, micro_batches, config)
    program, dp = check_run(spec, schedule, config), config.dp
    # balance="time" profiles a micro-batch of the size a replica computes
    bounds = list(config.bounds) if config.bounds is not None else \
        spec.partition(schedule.chain, config.balance, schedule.micro_batches * dp)
    world = schedule.ranks * dp
    here = local_world(world)  # the ranks that start on this host: all, or torchrun's node
    if config.progress and config.backend == "gloo" and here > len(host_cores()):
        say(f"warning: {here} ranks share {len(host_cores())} cores, so they wait for each other's "
            f"cores and measured times cannot match the simulation (docs/rules.md, rule 9)")
    per_rank = launch(pipeline_worker, world, spec, program, bounds, config, backend=config.backend,
                      timeout=config.timeout, threads=config.threads)
    return _gather(per_rank, spec, program, bounds, config)


def _gather(per_rank: list[dict], spec, program: Program, bounds: list[int], config: RunConfig) -> PipelineRun:
    """The run from what every rank returned: the check against one process, the median
    step, and the costs calibrated inside it."""
    schedule = program.schedule
    ref_loss, ref_grads = reference_step(spec, schedule.micro_batches)
    experts = (spec.experts, config.ep, param_names(spec)) if config.ep > 1 else None
    match, worst, where = _check_replicas(per_rank, schedule, config.dp, ref_grads, config.rtol, config.atol, experts)
    results = per_rank[0]["results"]
    if config.trace is not None:
        merge_rank_traces(config.trace, len(per_rank))
    run = PipelineRun(program, bounds, median_step(results), results, per_rank[0]["losses"],
                      ref_loss, match, worst, where, optimizer=config.optimizer, dp=config.dp,
                      train_step_times=per_rank[0]["train_steps"],
                      load=[r["load"] for r in per_rank], hosts=hosts_of([r["place"] for r in per_rank]))
    if config.calibrate:
        run.reports = [list(rnd) for rnd in zip(*(r["reports"] for r in per_rank))]
        run.costs, run.calibration = costs_from_reports([rep for rnd in run.reports for rep in rnd], schedule)
        run.calibration.update(bounds=bounds, backend=config.backend, calibrate_every=config.calibrate,
                               optimizer=config.optimizer)
    return run
