"""exec: run the simulator's `Schedule` objects on real devices with torch.distributed
and measure every action into the same `sim.Result` record.

One concern per module:

- `exec.models.spec`: small models (MLP, GPT) cut into stages, and their batches.
- `exec.launch.processes`: one process per rank, bounded in time; `exec.launch.host`: the host tuning
  that makes CPU ranks behave like devices of their own (cores, I/O thread, allocator).
- `exec.runtime.shapes`: the shape handshake before the first step.
- `exec.runtime.interpreter`: `RankInterpreter`, one rank interpreting its lowered program
  action by action; `exec.runtime.clocks` its clocks, `exec.runtime.memory` its memory counting,
  `exec.runtime.optim` the optimizers and their state.
- `exec.runtime.dp`: data parallelism: pp x dp ranks in Megatron-LM's order, a replica's view of
  its pipeline, its shard of the batch, the gradient reduction on a collective stream.
- `exec.runtime.step`: `run_step`, one training step on every rank, as one `sim.Result`.
- `exec.runtime.check`: the same step in one process, and the gradients compared.
- `exec.pipeline.runner`: `run_pipeline`, a whole run (warm-up, measured steps, calibration,
  check) and `pipeline_worker`, what each rank runs in it.
- `exec.measure.calibrate`: what each rank measures for the simulator; `exec.measure.costs`: those
  measurements merged into `sim.Costs`, and `profile_costs`.
- `exec.measure.compare`: measured against simulated.
- `exec.torch_pipelining.orders`: torch.distributed.pipelining's own schedule orders as `sim.Schedule`s;
  `exec.torch_pipelining.runtime`: our schedules run on torch's runtime.
- `python -m exec.run --schedule 1f1b --stages 2 --micro 8`: the command line.

`import exec` stays light (no torch); the submodules import torch.
"""
