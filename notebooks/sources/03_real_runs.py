# %% [markdown]
# # 3. Real runs: the same schedules on real processes
#
# `exec` runs the **very same** `sim.Schedule` objects on real devices with `torch.distributed`: one
# process per device ("rank"), activations and gradients sent between them, every action timed into
# the same `sim.Result` record the simulator produces. Here the devices are CPU processes talking
# over gloo, so it runs on any laptop (about a minute on 2 cores). This notebook:
#
# 1. runs a small model with 1F1B on 2 ranks, and measures as it runs what the simulator needs
#    (`exec.measure.calibrate`, merged by `exec.measure.costs`): its `Costs`;
# 2. checks that the pipelined gradients equal single-process training;
# 3. overlays the measured and simulated timelines and reads off where and why they differ;
# 4. compares GPipe with 1F1B, measured on real tensors.
#
# It needs torch: `pip install -e ".[exec,notebooks]"`.

# %%
# Parameters: change them and run all cells again
SCHEDULE = "1f1b"  # the schedule to study: "1f1b", "gpipe" or "naive"
STAGES = 2         # one process per stage; keep it at most the number of CPU cores
MICRO = 4          # micro-batches per step; must divide BATCH_SIZE
LAYERS = 8         # MLP blocks of the model, cut into STAGES stages
HIDDEN = 128       # width of the model
BATCH_SIZE = 32    # samples per step
STEPS = 3          # measured steps per run (the median one is shown) ...
WARMUP = 1         # ... after this many unmeasured ones

# %%
# %matplotlib inline
from nbhelp import show  # notebooks/nbhelp.py, first: it finds an uninstalled sim

import sim
from sim.plot import plot_overlay, plot_result

# %%
import time

import torch  # exec needs it: pip install -e ".[exec]"
from exec import ModelSpec, breakdown, compare, run_pipeline

spec = ModelSpec(model="mlp", layers=LAYERS, hidden=HIDDEN, batch_size=BATCH_SIZE)
schedule = sim.make_schedule(SCHEDULE, STAGES, MICRO)
print(schedule)

# %% [markdown]
# ## 1. Run the schedule, and measure its costs as it runs
#
# `run_pipeline` starts one process per rank, builds each rank's stages, runs `WARMUP + STEPS`
# training steps by interpreting the schedule action by action, and returns the median measured
# step as a `sim.Result`. It also trains the same model in a single process and compares the
# gradients of the first step (section 2).
#
# The simulator needs to know how long each stage's forward and backward take, how long a transfer
# takes, and how many bytes each stage keeps. With `calibrate=1`, before each measured step the ranks
# measure exactly that (`exec.measure.calibrate.calibrate_rank`), on the very modules, processes and cores the
# steps use: they time each stage's F and B (all ranks computing at once, and each alone), fit
# latency and bandwidth to ping-pong transfers of several sizes, and count the bytes. Measuring in
# the same minute as the steps matters on a shared machine, where a core's speed changes from
# second to second.

# %%
t = time.perf_counter()
run = run_pipeline(spec, schedule, steps=STEPS, warmup=WARMUP, calibrate=1, progress=True)
costs, details = run.costs, run.calibration
print(f"ran in {time.perf_counter() - t:.1f} s, stage bounds (layers) {run.bounds}; "
      f"step times {[f'{s * 1e3:.1f} ms' for s in run.step_times]}")
for s in range(STAGES):
    c = costs.for_stages(STAGES)
    print(f"stage {s}: F {c.forward[s] * 1e3:6.2f} ms   B {c.backward[s] * 1e3:6.2f} ms   "
          f"activations kept {c.activation_bytes[s] / 2**20:5.1f} MiB/micro-batch   "
          f"static {c.static_total(s) / 2**20:5.1f} MiB (weights, gradients, optimizer state)")
print(f"transfers: latency {costs.latency * 1e6:.0f} us, bandwidth {costs.bandwidth / 2**30:.2f} GiB/s")
print(f"an F or B runs {details['slowdown_median']:.2f}x slower while the other rank computes too "
      f"(the costs above are those 'concurrent' times)")
show(plot_result(run.result))

# %% [markdown]
# ## 2. Do the gradients equal single-process training?
#
# A pipeline must not change *what* is computed, only *where and when*. The loss of each micro-batch
# is scaled by `1/m`, so summing the micro-batches' gradients gives exactly the gradient of the whole
# batch. `run_pipeline` computed the same step in one process (the whole model on the whole batch)
# and compared every parameter's gradient. They agree up to float rounding: summing `m` partial
# gradients adds in a different order than one big matrix product.

# %%
print(f"loss: pipelined {run.losses[0]:.6f}, single process {run.reference_loss:.6f}")
print(f"gradients match: {run.grad_match}; largest difference {run.max_grad_diff:.2e} (in {run.worst_param})")
assert run.loss_match, "the pipelined loss differs from single-process training"
assert run.grad_match and run.max_grad_diff < 1e-4, "the pipelined gradients differ from single-process training"

# %% [markdown]
# ## 3. Measured against simulated
#
# `exec.compare` simulates the same schedule under the profiled costs and puts both steps
# side by side. In the overlay, the wide hatched bars are the simulation and the narrow solid bars
# the measurement, on the same rows. The `error`, in the table and in the figure's title, is
# `(simulated - measured) / measured`: positive when the simulator predicts a longer step.

# %%
cmp = compare(run.result, costs, grad_match=run.grad_match)
print(cmp.table())
show(plot_overlay(cmp.simulated, cmp.measured))
assert cmp.measured.peak_activations == cmp.simulated.peak_activations  # memory follows the rules exactly,
assert cmp.measured.peak_memory == cmp.simulated.peak_memory            # to the byte

# %% [markdown]
# **Reading the difference.** The *shape* should match: the same order of actions, the same fill and
# drain, the same number of micro-batches held (asserted above: memory follows directly from the
# schedule). The *length* can differ, and `breakdown` says why, per rank:
#
# - `compute`: time spent in F and B. If a measured F or B is far from its profiled cost
#   (`ratio` below), the step differs because the *costs* are off, not the rules: on a shared
#   2-core machine two ranks computing at once slow each other down (the profile measured each
#   action both alone and concurrently, and uses the concurrent time, although in a real step a
#   rank often computes while the other waits), caches are warm or cold, and other programs
#   steal the cores.
# - `wait`: time a rank waited for an activation or a gradient from the other rank. The
#   simulator predicts these waits from the rules.
# - `overhead`: the runtime's own time between actions: posting sends and receives, and its
#   Python work around each compute, which the simulator models as `send_overhead`,
#   `recv_overhead` and `before_compute` + `after_compute` (rules 2, 3 and 11), all measured by
#   the profile.

# %%
bd = breakdown(run.result, costs)
bd_sim = breakdown(cmp.simulated, costs)
print("per rank, ms        measured / simulated")
for r, q in zip(bd["ranks"], bd_sim["ranks"]):
    print(f"  rank {r['rank']}: compute {r['compute'] * 1e3:6.1f} / {q['compute'] * 1e3:6.1f}   "
          f"wait {r['wait'] * 1e3:6.1f} / {q['wait'] * 1e3:6.1f}   "
          f"overhead {r['overhead'] * 1e3:5.1f} / {q['overhead'] * 1e3:5.1f}   "
          f"tail {r['tail'] * 1e3:5.1f} / {q['tail'] * 1e3:5.1f}")
print("per stage and kind: measured median against the profiled cost")
for key, a in bd["actions"].items():
    print(f"  {key}: measured {a['median'] * 1e3:6.2f} ms, cost {a['cost'] * 1e3:6.2f} ms, ratio {a['ratio']:.2f}")

# %% [markdown]
# To separate the two sources of error, simulate again with other compute times: those the
# profile measured with each rank computing *alone*, and those *measured in this run* (the medians
# above). With this run's own times, what remains is what the rules do not model, and the spread
# of each action around its median. On a CPU host much of that spread is
# sharing: an action runs at its *alone* speed while the other rank waits and at its *concurrent*
# speed while both compute, which one fixed cost per action cannot express. Last, the *replay*:
# every compute takes exactly the time it took in this step (`sim.simulate(..., durations=)`,
# `exec.replay_error`), so only the rules of communication and of the runtime are left to
# be wrong.

# %%
import dataclasses
from exec import replay_error

alone = details["compute_median"]["alone"]
alone_costs = dataclasses.replace(
    costs,
    forward=[alone[f"{s}F"] for s in range(STAGES)],
    backward=[alone[f"{s}B"] for s in range(STAGES)],
)
acts = bd["actions"]
measured_costs = dataclasses.replace(
    costs,
    forward=[acts[f"{s}F"]["median"] for s in range(STAGES)],
    backward=[acts[f"{s}B"]["median"] for s in range(STAGES)],
)
recal = compare(run.result, measured_costs)
print(f"error with the profiled costs (concurrent): {cmp.error_pct:+6.1f}%")
print(f"error with the profiled costs (alone):      {compare(run.result, alone_costs).error_pct:+6.1f}%")
print(f"error with this run's own compute times:    {recal.error_pct:+6.1f}%")
print(f"replay, every compute at its own time:      {replay_error(run.result, costs):+6.1f}%")
if abs(recal.error_pct) < abs(cmp.error_pct):
    print("-> most of the error came from the compute costs: this run's F and B were not the profiled ones")
else:
    print("-> the profiled compute costs were fine; the error is what the rules leave out (overhead, noise)")
show(plot_overlay(recal.simulated, recal.measured))

# %% [markdown]
# ## 4. GPipe against 1F1B, measured
#
# Notebook 2 predicted that GPipe holds all `m` micro-batches on every stage and 1F1B at most
# `p-s`. The runtime records the activations each rank really keeps, so we can check it on real
# tensors (and that both schedules compute the same gradients).

# %%
runs = {}
for name in ("gpipe", "1f1b"):
    runs[name] = run_pipeline(spec, name, STAGES, MICRO, steps=2, warmup=1, bounds=run.bounds)
    r = runs[name]
    assert r.grad_match, name
    print(f"{name:5s}: step {r.measured_step_s * 1e3:6.1f} ms, bubble {r.result.bubble_fraction:.1%}, "
          f"micro-batches held {r.result.peak_activations}, "
          f"peak memory {[f'{b / 2**20:.1f} MiB' for b in r.result.peak_memory]}")
assert runs["gpipe"].result.peak_activations == [MICRO] * STAGES
assert runs["1f1b"].result.peak_activations == [min(STAGES - s, MICRO) for s in range(STAGES)]
show(plot_result(runs["gpipe"].result))

# %% [markdown]
# ## Summary
#
# - `exec` runs the simulator's schedules unchanged, and its measured steps are `sim.Result`s: the
#   same metrics, figures and traces (`run.result.save_chrome_trace("step.json")`, open it in
#   [Perfetto](https://ui.perfetto.dev)).
# - The pipelined gradients equal single-process training: pipelining changes when things are
#   computed, not what.
# - The simulator predicts the order and the memory exactly; its time is as good as its costs.
#   When a prediction is off, look at the breakdown first (costs or rules?), and fix the rule in
#   both places ([docs/rules.md](../docs/rules.md)) rather than scaling a number.
#
# Try `SCHEDULE = "naive"`, or `MICRO = 8`, and run all cells again.
