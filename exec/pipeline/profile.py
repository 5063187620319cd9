"""A calibration launch of its own: `profile_costs` measures `sim.Costs` for a model and a schedule in fresh rank processes.

    >>> costs, details = profile_costs(ModelSpec(), "1f1b", 2, 8)             # doctest: +SKIP
    >>> sim.save_costs(costs, "costs.json", details)                          # doctest: +SKIP

It takes what `exec.pipeline.runner.run_pipeline` takes (a model, a schedule, an
`exec.pipeline.config.RunConfig`), compiles the schedule for gloo (`sim.compile`), starts one
process per rank (`exec.launch.processes`), each running `exec.measure.calibrate.calibrate_rank`
on that program and fresh copies of its stages, and fits the
reports into `sim.Costs` (`exec.measure.costs.costs_from_reports`). A run that calibrates
inside itself (`run_pipeline(calibrate=k)`) measures on the very modules and processes of
its steps instead.
"""
from __future__ import annotations

import sim

from exec.launch.processes import launch
from exec.measure.calibrate import calibrate_rank, check_calibrated, message_sizes
from exec.measure.costs import costs_from_reports
from exec.pipeline.config import RunConfig, run_options, run_schedule

__all__ = ["profile_costs", "READS"]

READS = ("steps", "balance", "bounds", "backend", "timeout", "threads", "optimizer")


def profile_costs(spec, schedule: "sim.Schedule | str", devices: int | None = None, micro_batches: int | None = None,
                  config: RunConfig | None = None, *, repeats: int = 20, use: str = "concurrent",
                  transfer: tuple[float, float] | None = None, **options) -> tuple[sim.Costs, dict]:
    """Measure `sim.Costs` for `spec` cut into the stages of `schedule` (a `sim.Schedule`: its
    placement and compute order, or a name with `devices` and `micro_batches`).

    `config` (keyword `options` set its fields) gives what it reads (`READS`): `steps` timed
    steps of each rank's program, the cut (`bounds`, else `spec.partition(stages, balance,
    micro_batches)`), `backend` (gloo only), `timeout`, `threads` (as the real run's) and the
    `optimizer` whose state counts in the static memory. `repeats`: ping-pongs and call
    timings per size. `use` picks the compute times: "concurrent" (all ranks compute at once,
    as in a step's steady state) or "alone" (one rank at a time). `transfer` = (latency,
    bandwidth) reuses a transfer fit instead of measuring it again. Returns (costs, details)."""
    config = run_options("profile_costs", config, options, READS)
    if config.backend != "gloo":
        raise ValueError(f"profile_costs measures CPU ranks over gloo only, not backend={config.backend!r}: its "
                         f"compute timing has no CUDA synchronisation and its messages are CPU tensors; "
                         f"for an NCCL run, simulate with costs written by sim.save_costs (exec.run --costs)")
    schedule = run_schedule("profile_costs", schedule, devices, micro_batches, config)
    check_calibrated(schedule)
    program = sim.compile(schedule, "gloo")
    micro_batches = schedule.micro_batches
    bounds = list(config.bounds) if config.bounds is not None else spec.partition(schedule.chain, config.balance, micro_batches)
    sizes = None if transfer else message_sizes(spec, micro_batches)
    reports = launch(calibrate_rank, schedule.ranks, spec, program, micro_batches, bounds, config.steps, sizes, repeats, None,
                     config.optimizer, backend=config.backend, timeout=config.timeout, threads=config.threads)
    costs, details = costs_from_reports(reports, schedule, use, transfer)
    details.update(spec=spec.describe(), bounds=bounds,
                   backend=config.backend, optimizer=config.optimizer)
    return costs, details
