# %% [markdown]
# # 06 · Closing the loop: profile this machine, predict a run, measure it
#
# The planner (`sim.estimate`) has so far predicted GPUs from datasheets and published tables.
# Here it meets a run we can measure. Three steps, all on this machine:
#
# 1. **Profile** the device as exec's ranks use it (`exec.profile_device`, docs/exec.md):
#    matmuls of the shapes the planner asks for, memory-bound kernels by class, the host's
#    cost per op, gloo's collectives and sends, and whole blocks of this model timed as a
#    step runs them (a kernel alone in a loop runs 5-30 % faster than inside a step; the
#    planner takes the blocks where it has them). `--quick` takes about twenty seconds.
# 2. **Predict** a step of exec's small GPT with `sim.estimate(..., gpu=sim.load_profile(...))`:
#    the model is the same object, `ModelSpec.transformer()`, so the planner's activation bytes
#    are what autograd saves (tests/exec/runtime/test_saved_bytes.py).
# 3. **Run** it with `exec.run_pipeline` and overlay the predicted and measured timelines.
#
# A shared, loaded machine measures slower than the profile says (read the load average
# printed beside the numbers; docs/rules.md, rule 9); the memory does not depend on the load.

# %%
# %matplotlib inline
from nbhelp import show  # notebooks/nbhelp.py, first: it finds an uninstalled sim

import sim
from sim.plot import plot_overlay, plot_result

# %%
import os
import tempfile
from pathlib import Path

from exec import ModelSpec, measure_device

SPEC = ModelSpec("gpt", layers=2, hidden=64, heads=4, seq=32, vocab=128, batch_size=8)
MICRO = 4
PROFILE = Path(tempfile.mkdtemp()) / "this-machine.json"
measure_device(PROFILE, "gloo", ranks=2, quick=True, model=SPEC.transformer(),
               micro_batches=(SPEC.batch_size // MICRO,), timeout=120)
profile = sim.load_profile(PROFILE)
print(profile.name, "| load average:", open("/proc/loadavg").read().split()[:3])
print(f"peak fp32 {profile.gpu.peak_flops['fp32'] / 1e9:.0f} GFLOP/s, copy {profile.gpu.hbm_bandwidth / 1e9:.0f} GB/s")

# %%
e = sim.estimate(SPEC.transformer(), gpu=profile, gpus_per_node=2, tp=1, pp=2, dp=1,
                 micro_batch=SPEC.batch_size // MICRO, global_batch=SPEC.batch_size, schedule="1f1b",
                 recompute="none", precision="fp32")
print(f"predicted step {e.step_time * 1e3:.1f} ms, peak memory per rank {[int(b) for b in e.peak_memory]} bytes")
print({k: f"{v * 1e3:.2f} ms" for k, v in e.time_parts.items() if v})
show(plot_result(e.result))  # the predicted step

# %%
from exec import run_pipeline

run = run_pipeline(SPEC, "1f1b", 2, MICRO, steps=3, warmup=1, optimizer="adamw")
measured = sorted(run.train_step_times)[len(run.train_step_times) // 2]
print(f"measured step {measured * 1e3:.1f} ms (error {(e.step_time / measured - 1) * 100:+.0f} %), "
      f"load {open('/proc/loadavg').read().split()[:3]}")
print("peak memory per rank, measured:", [int(b) for b in run.result.peak_memory])
assert [round(b) for b in e.peak_memory] == [round(b) for b in run.result.peak_memory] or \
    max(abs(p / m - 1) for p, m in zip(e.peak_memory, run.result.peak_memory)) < 0.005
show(plot_overlay(e.result, run.result))

# %% [markdown]
# The bars drawn light and hatched are the planner's, the narrow solid ones exec's. The peak
# memory agrees to AdamW's per-tensor step counters (a few bytes); the step time agrees as
# well as the machine is quiet. `benchmarks/bench_plan_vs_run.py` runs the whole grid.
