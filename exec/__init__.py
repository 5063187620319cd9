"""exec: run the simulator's `Schedule` objects on real devices with torch.distributed
and measure every action into the same `sim.Result` record.

A package per concern, each importing only those before it (docs/exec.md, Layout):

- `exec.models`: small models (MLP, GPT): `spec` (`ModelSpec`), `layers`, `cuts` (stages).
- `exec.launch`: `processes` (one process per rank, bounded in time), `host` (the host
  tuning that makes CPU ranks behave like devices of their own).
- `exec.runtime`: one step. `interpreter` (`RankInterpreter`, a rank's lowered program
  action by action) with `clocks`, `memory`, `optim`, `shapes`, `split_backward` and `dp`
  (pp x dp ranks, the gradient reduction on a collective stream); `step` (`run_step`, one
  training step on every rank, as one `sim.Result`); `check` (the same step in one process).
- `exec.measure`: what the simulator needs. `calibrate` and `calibrate_link` (inside the
  ranks), `busy` (the machine's load), `costs` (the reports fitted into `sim.Costs`,
  `profile_costs`), `compare` (measured against simulated).
- `exec.pipeline`: a whole run. `config` (`RunConfig`), `worker` (what each rank runs),
  `runner` (`run_pipeline`: warm-up, measured steps, calibration, check).
- `exec.profiler`: the device profile's measurements (`device_bench`, `comm_bench`, `assemble`).
- `exec.torch_pipelining`: torch.distributed.pipelining's own schedule orders as
  `sim.Schedule`s (`orders`), and our schedules on torch's runtime (`runtime`).
- The command lines: `python -m exec.run --schedule 1f1b --stages 2 --micro 8` (also
  `python -m exec`) and `python -m exec.profile_device --out F`.

`import exec` stays light (no torch); the submodules import torch.
"""
