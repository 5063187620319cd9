"""Our schedules on torch's own pipelining runtime: the CSV that `_PipelineScheduleRuntime` loads, and a run of it on our stages.

    >>> print(to_torch_csv(sim.make_schedule("1f1b", 2, 2)), end="")       # doctest: +SKIP
    0F0,0SEND_F0,0RECV_B0,0F1,0SEND_F1,0RECV_B1,0B0,0B1
    1RECV_F0,1F0,1RECV_F1,1B0,1SEND_B0,1F1,1B1,1SEND_B1
    >>> run = run_torch_runtime(ModelSpec(), "1f1b", 2, 8)                  # doctest: +SKIP
    >>> run.grad_match, run.step_times                                      # doctest: +SKIP

torch's `_PipelineScheduleRuntime._load_csv(path, format="compute_comms")` reads a CSV
with the communication already in it, one row per rank, in the very text form of our
actions (`2F0`, `0SEND_F1`, `1RECV_B3`), so the CSV is our lowered schedule. torch's
runtime gives every transfer the same tag and so pairs a rank's messages by order (as
NCCL does): the export posts receives in the order the peer sends them
(`sim.passes.order.order_transfers`, docs/rules.md rule 12). It lists no REDUCE_GRAD actions
(torch adds them only when it lowers a compute-only CSV itself), so the runtime does not
scale the gradients: the loss is divided by the number of micro-batches, as in our
runtime (`exec.runtime.interpreter`), and the gradients are the full batch's.

`run_torch_runtime` takes what `exec.pipeline.runner.run_pipeline` takes (a model, a
schedule, an `exec.pipeline.config.RunConfig`) and runs it on one process per rank
(`exec.launch.processes`): each rank wraps its stages of `ModelSpec.build_stages` in torch's
`PipelineStage`, loads the CSV and runs `warmup + steps` steps, each timed from a barrier to the end of the rank's `step()` (the
optimizer's step after it is not timed, as in our runtime's makespan); a step's time is
its slowest rank's. The first step's gradients are checked against one process
(`exec.runtime.check`).
"""
from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.distributed as dist

import sim
from sim import Schedule

from exec.launch.processes import launch
from exec.pipeline.config import RunConfig, run_options, run_schedule
from exec.runtime.check import compare_grads, reference_step
from exec.runtime.optim import make_optimizer

__all__ = ["to_torch_csv", "run_torch_runtime", "torch_runtime_worker", "TorchRuntimeRun", "READS"]


def to_torch_csv(schedule: Schedule, in_order: bool = True) -> str:
    """The CSV that torch's `_PipelineScheduleRuntime` loads with format="compute_comms":
    `schedule` compiled (`sim.compile`) for torch's runtime, which pairs transfers by order
    as NCCL does: its receives posted in the order the peer sends them (rule 12;
    `in_order=False` compiles it as for gloo, in `sim.lower`'s order, to show what a
    mismatch does). Raises `ScheduleError` for a schedule that cannot run, or that torch's
    runtime cannot read: two copies of the model (DualPipe), or OVERLAP_F_B marks (torch
    writes a pair as one action holding both computes)."""
    if schedule.pipelines > 1 or schedule.has_pairs:
        what = f"{schedule.pipelines} copies of the model" if schedule.pipelines > 1 else "OVERLAP_F_B marks"
        raise sim.ScheduleError(f"schedule {schedule.name!r} holds {what}, which torch's runtime cannot read from "
                                f"a CSV; run it with exec.run_pipeline")
    return sim.compile(schedule, "nccl" if in_order else "gloo").lowered().to_csv()


def _runtime(ctx, spec, schedule: Schedule, bounds: Sequence[int], csv_text: str):
    """This rank's stages as torch `PipelineStage`s and the runtime with the CSV loaded."""
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

    mine = [s for s, r in enumerate(schedule.placement) if r == ctx.rank]
    modules = spec.build_stages(schedule.stages, bounds=bounds)
    stages = [PipelineStage(modules[s].to(ctx.device), s, schedule.stages, ctx.device, group=dist.group.WORLD)
              for s in mine]
    M = schedule.micro_batches

    def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return spec.loss(output, target) / M  # the full batch's gradients, as our runtime

    runtime = _PipelineScheduleRuntime(stages, M, loss_fn=loss, scale_grads=False)
    with tempfile.TemporaryDirectory() as tmp:  # _load_csv reads a file
        path = os.path.join(tmp, "schedule.csv")
        with open(path, "w") as f:
            f.write(csv_text)
        runtime._load_csv(path, format="compute_comms")
    return {s: modules[s] for s in mine}, runtime


def torch_runtime_worker(ctx, spec, schedule: Schedule, bounds: Sequence[int], csv_text: str,
                         config: RunConfig) -> dict:
    """What every rank runs: `config.warmup + config.steps` steps of torch's runtime on the
    CSV. Returns this rank's step times (seconds, measured steps only), the losses rank by
    rank (the last stage's ranks know them) and its stages' gradients after the first step."""
    modules, runtime = _runtime(ctx, spec, schedule, bounds, csv_text)
    opt = make_optimizer(config.optimizer, [p for m in modules.values() for p in m.parameters()], config.lr)
    warmup, steps = config.warmup, config.steps
    inputs, targets = spec.batch()
    inputs, targets = inputs.to(ctx.device), targets.to(ctx.device)
    out = {"times": [], "losses": [], "grads": {}}
    for i in range(warmup + steps):
        opt.zero_grad(set_to_none=True)
        losses: list[torch.Tensor] = []
        dist.barrier()
        start = time.perf_counter()
        runtime.step(inputs, target=targets, losses=losses, return_outputs=False)
        took = time.perf_counter() - start
        if i >= warmup:
            out["times"].append(took)
        out["losses"].append(float(sum(x.detach() for x in losses)) if losses else None)
        if i == 0:
            out["grads"] = {s: [(n, (p.grad if p.grad is not None else torch.zeros_like(p)).detach().cpu().numpy().copy())
                                for n, p in m.named_parameters()] for s, m in modules.items()}
        opt.step()
    return out


@dataclass
class TorchRuntimeRun:
    """What `run_torch_runtime` measured and checked."""

    csv: str                    # what torch loaded
    step_times: list[float]     # per measured step, its slowest rank's, in seconds
    losses: list[float]         # per step, warm-up included
    reference_loss: float
    grad_match: bool
    max_grad_diff: float
    worst_param: str

    @property
    def median_step_s(self) -> float:
        ordered = sorted(self.step_times)
        return ordered[(len(ordered) - 1) // 2]


READS = ("steps", "warmup", "lr", "optimizer", "balance", "bounds", "timeout", "threads", "rtol", "atol")


def run_torch_runtime(spec, schedule: Schedule | str, devices: int | None = None, micro_batches: int | None = None,
                      config: RunConfig | None = None, *, in_order: bool = True, **options) -> TorchRuntimeRun:
    """Run `schedule` (a `sim.Schedule`, or a name with `devices` and `micro_batches`) on torch's `_PipelineScheduleRuntime`, one gloo
    process per rank, `warmup + steps` steps of `spec` with `config.optimizer`, and check
    the first step's gradients against `exec.runtime.check.reference_step`. `config` is
    `run_pipeline`'s `exec.pipeline.config.RunConfig` (keyword `options` set its fields); it
    reads the fields in `READS` and refuses the others set. `in_order`: as in `to_torch_csv`.
    Raises `exec.launch.processes.RankError` / `TimeoutError` as `exec.launch.processes.launch` does."""
    config = run_options("run_torch_runtime", config, options, READS)
    schedule = run_schedule("run_torch_runtime", schedule, devices, micro_batches, config)
    csv_text = to_torch_csv(schedule, in_order)
    bounds = list(config.bounds) if config.bounds is not None else \
        spec.partition(schedule.stages, config.balance, schedule.micro_batches)
    ref_loss, ref_grads = reference_step(spec, schedule.micro_batches)  # also checks that micro divides the batch
    per_rank = launch(torch_runtime_worker, schedule.ranks, spec, schedule, bounds, csv_text, config,
                      timeout=config.timeout, threads=config.threads)
    grads = [(f"stage{s}.{n}", g) for s in range(schedule.stages)
             for n, g in per_rank[schedule.rank_of(s)]["grads"][s]]
    match, worst, where = compare_grads(grads, ref_grads, config.rtol, config.atol)
    last = per_rank[schedule.rank_of(schedule.stages - 1)]
    times = [max(ts) for ts in zip(*(r["times"] for r in per_rank))]
    return TorchRuntimeRun(csv_text, times, last["losses"], ref_loss, match, worst, where)
