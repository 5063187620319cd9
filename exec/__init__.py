"""exec: run the simulator's `Schedule` objects on real devices with torch.distributed
and measure every action into the same `sim.Result` record.

- `exec.launch.launch(fn, world_size, ...)`: one process per rank, bounded in time.
- `exec.runtime.run_step(...)`: one rank interprets its lowered program for one step.
- `python -m exec.run --schedule 1f1b --stages 2 --micro 8`: the command line.

`import exec` stays light (no torch); the submodules import torch.
"""
