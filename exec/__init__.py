"""exec: run the simulator's `Schedule` objects on real devices with torch.distributed
and measure every action into the same `sim.Result` record.

The front door, what notebooks and users need, one import away:

    >>> from exec import ModelSpec, RunConfig, run_pipeline, compare    # doctest: +SKIP
    >>> run = run_pipeline(ModelSpec(), "1f1b", 2, 8, RunConfig(steps=3, calibrate=1))   # doctest: +SKIP
    >>> compare(run.result, run.costs).error_pct                          # doctest: +SKIP

- `ModelSpec`: a model and its batch (the built-in MLP and GPT, or your own torch blocks:
  `ModelSpec.from_blocks`);
- `RunConfig`: the one options record of every entry point that starts ranks;
- `run_pipeline` (-> `PipelineRun`): a schedule run on one process per rank, checked
  against one process; `run_torch_runtime` (-> `TorchRuntimeRun`): the same on
  torch.distributed.pipelining's own runtime;
- `compare` (-> `Comparison`), `breakdown`, `replay_error`: a measured step against the
  simulated one;
- `profile_costs`: `sim.Costs` measured in a launch of its own; `measure_device`: this
  machine's device profile for the planner (`python -m exec.profile_device`);
- `RankError`: a rank failed (a run that is too slow raises `TimeoutError`).

`import exec` stays light (no torch): each name is imported from its module on first use
(PEP 562's module `__getattr__`; `EXPORTS` says where each lives).

A package per concern, each importing only those before it (docs/exec.md, Layout):

- `exec.models`: small models (MLP, GPT) and a user's own blocks: `spec` (`ModelSpec`),
  `blocks`, `layers`, `cuts` (stages).
- `exec.launch`: `processes` (one process per rank, bounded in time), `host` (the host
  tuning that makes CPU ranks behave like devices of their own).
- `exec.runtime`: one step. `interpreter` (`RankInterpreter`, a rank's part of the program
  `sim.compile` made, action by action, as `rank_program` reads it off the program's numbers)
  with `clocks`, `memory`, `optim`, `shapes`, `split_backward` and `dp`
  (pp x dp ranks laid out by `sim.hardware.topology.Topology`, the gradient reduction on a
  collective stream); `step` (`run_step`, one training step on every rank, as one
  `sim.Result`); `check` (the same step in one process).
- `exec.measure`: what the simulator needs. `calibrate` and `calibrate_link` (inside the
  ranks), `busy` (the machine's load), `costs` (the reports fitted into `sim.Costs`),
  `compare` (measured against simulated).
- `exec.pipeline`: a whole run. `config` (`RunConfig`), `worker` (what each rank runs),
  `runner` (`run_pipeline`: warm-up, measured steps, calibration, check), `profile`
  (`profile_costs`, a calibration launch of its own).
- `exec.profiler`: the device profile's measurements (`device_bench`, `comm_bench`, `assemble`).
- `exec.torch_pipelining`: torch.distributed.pipelining's own schedule orders as
  `sim.Schedule`s (`orders`), and our schedules on torch's runtime (`runtime`).
- The command lines: `python -m exec.run --schedule 1f1b --stages 2 --micro 8` and
  `python -m exec.profile_device --out F`; `python -m exec` prints their index.
"""
from __future__ import annotations

import importlib

EXPORTS = {  # name -> the module it lives in
    "ModelSpec": "exec.models.spec",
    "RunConfig": "exec.pipeline.config",
    "run_pipeline": "exec.pipeline.runner", "PipelineRun": "exec.pipeline.runner",
    "run_torch_runtime": "exec.torch_pipelining.runtime", "TorchRuntimeRun": "exec.torch_pipelining.runtime",
    "compare": "exec.measure.compare", "Comparison": "exec.measure.compare",
    "breakdown": "exec.measure.compare", "replay_error": "exec.measure.compare",
    "profile_costs": "exec.pipeline.profile",
    "measure_device": "exec.profile_device",
    "RankError": "exec.launch.processes",
}

__all__ = list(EXPORTS)


def __getattr__(name: str):
    """`exec.NAME` for a name of `EXPORTS`: imported from its module the first time, then kept."""
    if name not in EXPORTS:
        raise AttributeError(f"module 'exec' has no attribute {name!r}")
    value = getattr(importlib.import_module(EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(EXPORTS))
