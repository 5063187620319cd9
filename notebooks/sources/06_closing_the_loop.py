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
# well as the machine is quiet.
#
# ## A model the profile did not measure
#
# The profile timed whole blocks of *this* model only. Another model (other hidden size,
# sequence, vocabulary, depth) has no measured block: the planner times its kernels (the
# kernel model) and runs them as a step runs them, with two numbers per pass fitted on the
# blocks the profile did measure (`sim.cost.block_fit`): how much slower the kernels run inside
# a step than alone in a loop, and the host's cost per kernel inside a step (autograd, exec's
# hooks, Python). Without that fit the kernel model was 8-47 % short on this machine, most on
# small shapes (docs/validation.md, "One profile, many shapes"). Two numbers do not hold over
# every shape, so a block also takes what the fit missed at the nearest block the profile
# measured (measured over fitted). The full profile (`python -m exec.profile_device`, without
# `--quick`) measures blocks at a quarter, half and twice the model's shape for that; this
# quick one measured the model's only. It also times torch's attention call by shape (the
# profile's `attention.table`), which the kernel model takes in place of the call's two
# matmuls and its own kernels: on this CPU the call takes 0.7 to 7 times as long as they say.

# %%
from sim.cost.layer import block_fits

for kind, f in block_fits(SPEC.transformer(), profile).items():
    print(f"{kind}: kernels x {f.slowdown:.2f} in a step, + {f.per_kernel * 1e6:.0f} us a kernel "
          f"(fitted on {f.rows} measured block(s), largest residual {f.residual * 100:.0f} %)")

OTHER = ModelSpec("gpt", layers=4, hidden=96, heads=4, seq=48, vocab=256, batch_size=8)
e2 = sim.estimate(OTHER.transformer(), gpu=profile, gpus_per_node=2, tp=1, pp=2, dp=1,
                  micro_batch=OTHER.batch_size // MICRO, global_batch=OTHER.batch_size, schedule="1f1b",
                  recompute="none", precision="fp32")
run2 = run_pipeline(OTHER, "1f1b", 2, MICRO, steps=3, warmup=1, optimizer="adamw")
measured2 = sorted(run2.train_step_times)[len(run2.train_step_times) // 2]
print(f"hidden 96, seq 48, vocab 256, 4 blocks: predicted {e2.step_time * 1e3:.1f} ms, measured "
      f"{measured2 * 1e3:.1f} ms (error {(e2.step_time / measured2 - 1) * 100:+.0f} %), "
      f"load {open('/proc/loadavg').read().split()[:3]}")
print("peak memory per rank, predicted and measured:", [int(b) for b in e2.peak_memory],
      [int(b) for b in run2.result.peak_memory])

# %% [markdown]
# One run on a shared machine says little about the step time (the load moves it by more
# than the model's error); the memory does not depend on the load. `benchmarks/bench_plan_vs_run.py`
# runs the grid: the profiled shape and seven shapes the profile did not measure (hidden 32 to
# 256, sequence 32 to 128, vocabulary 256 to 2048, 4 to 8 blocks), each under 1F1B, GPipe and
# ZB-H1 with recompute none and full, beside the machine's drift and load. A VM's host can slow
# it for minutes unseen by the guest, and such a minute slows the profiled shape's runs around
# a shape as much as the shape's own, so the bench pairs each shape with them in its own round,
# then takes the median over rounds. Its current result (docs/validation.md, "The planner
# against runs on this machine"): five shapes never run before, chosen before any ran, came out
# at 4.6 % median and 18.2 % worst, paired; peak memory within 0.008 %.
