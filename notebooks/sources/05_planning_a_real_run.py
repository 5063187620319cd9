# %% [markdown]
# # 5. Planning a real run: from a model and a cluster to a plan
#
# Notebooks 1 to 4 used made-up costs. Here the costs come from a model and a GPU: `sim.estimate`
# times each layer's matmuls, memory-bound kernels and tensor-parallel collectives on the GPU
# (`sim.layer`, `sim.kernels`), puts them on the pipeline stages, runs the schedule on the
# simulator and adds the memory of weights, gradients and optimizer state. The run to plan:
#
# - **GPT-3 175B** (96 layers, hidden 12288, 96 heads, sequence 2048; Brown et al. 2020), trained on
#   **1024 A100-80GB** with a batch of **1536 sequences**: the example Narayanan et al. 2021
#   (Sec. 5.1, Eq. 4) use to estimate a training time (140 TFLOP/s per GPU, 34 days for 300
#   billion tokens);
# - Megatron-LM's layout: tensor parallelism inside a node, pipeline stages across nodes, data
#   parallelism over the rest.
#
# The sections:
#
# 1. one estimate, its Gantt chart and memory;
# 2. where the time goes and where the memory goes;
# 3. what recompute, interleaving, zero-bubble schedules and ZeRO each buy;
# 4. how close the estimate is to published measurements;
# 5. the planner (a search over layouts).
#
# Everything runs on the simulator, in well under a minute. What the estimate leaves out is listed
# in [docs/planner.md](../docs/planner.md); the formulas and their sources are there too.

# %%
# Parameters: change them and run all cells again
MODEL = "gpt3-175b"     # a preset of sim.MODELS
GPU = "a100-80gb"       # a preset of sim.GPUS
GPUS = 1024             # the cluster: 128 nodes of 8
TP, PP = 8, 8           # tensor parallel inside a node, pipeline stages across nodes
GLOBAL_BATCH = 1536     # sequences per step
MICRO_BATCH = 1
SCHEDULE, VIRTUAL = "interleaved-1f1b", 3
RECOMPUTE, SEQUENCE_PARALLEL = "selective", True   # Korthikanti et al. 2022
TOKENS = 300e9          # GPT-3's training tokens (Brown et al. 2020; Narayanan et al. 2021, Sec. 5.1)

# %%
# %matplotlib inline
import matplotlib.pyplot as plt
from nbhelp import show  # notebooks/nbhelp.py, first: it finds an uninstalled sim

import sim
from sim.plot import plot_result

# %% [markdown]
# ## 1. One estimate
#
# `sim.estimate` returns an `Estimate`: the step time, the throughput (FLOPs actually computed,
# recompute included, per GPU: Narayanan et al. 2021, Eq. 3), the MFU (model FLOPs without
# recompute over the GPU's peak: Korthikanti et al. 2022, Eq. 7), the bubble, the peak memory of
# each pipeline device and whether it fits, and `result`, the simulated step itself.

# %%
DP = GPUS // (TP * PP)
model, gpu = sim.MODELS[MODEL], sim.GPUS[GPU]
layout = dict(tp=TP, pp=PP, dp=DP, micro_batch=MICRO_BATCH, global_batch=GLOBAL_BATCH, schedule=SCHEDULE,
              virtual=VIRTUAL, recompute=RECOMPUTE, sequence_parallel=SEQUENCE_PARALLEL)
est = sim.estimate(MODEL, GPU, **layout)
GiB = 2**30
print(f"{MODEL}: {model.params().total / 1e9:.1f}B parameters on {GPUS} x {GPU}: t={TP}, p={PP}, d={DP}, "
      f"{est.layout.micro_batches} micro-batches of {MICRO_BATCH} per pipeline")
print(f"step {est.step_time:.2f} s, {est.tflops_per_gpu:.0f} TFLOP/s per GPU, MFU {est.mfu:.1%}, "
      f"pipeline bubble {est.bubble_fraction:.1%}, peak memory {max(est.peak_memory) / GiB:.1f} of "
      f"{gpu.memory / GiB:.0f} GiB: fits {est.fits}")
steps = TOKENS / (GLOBAL_BATCH * model.seq)
print(f"{TOKENS / 1e9:.0f}B tokens = {steps:,.0f} steps: {steps * est.step_time / 86400:.0f} days")

# Narayanan et al. 2021 ran it with full recompute: Eq. 4, 8TP/(nX), with their measured X = 140
# TFLOP/s gives 34 days (8 = 2 x 4: forward, backward twice, the recomputed forward).
full = sim.estimate(MODEL, GPU, **{**layout, "recompute": "full", "sequence_parallel": False})
eq4 = 8 * TOKENS * model.params().total / (GPUS * 140e12) / 86400
print(f"with full recompute: {steps * full.step_time / 86400:.0f} days, {full.tflops_per_gpu:.0f} TFLOP/s per GPU; "
      f"published: {eq4:.0f} days at 140 TFLOP/s")

# %% [markdown]
# The simulated step: each row a pipeline device, each bar one chunk's forward (F) or backward (B)
# of one micro-batch (interleaving puts `VIRTUAL` chunks on each device; the second and third are
# hatched), the memory of each device below. The fill at the start and the drain at the end are
# the bubble.

# %%
show(plot_result(est.result))

# %% [markdown]
# With a hundred micro-batches the chart shows how busy each device is (dark: computing). The
# same layout with 16 micro-batches per pipeline (a smaller global batch), bar by bar, shows the
# interleaved order: the chunks, the fill and the drain.

# %%
small = sim.estimate(MODEL, GPU, **{**layout, "global_batch": DP * MICRO_BATCH * 16})
show(plot_result(small.result))

# %% [markdown]
# ## 2. Where the time goes, where the memory goes
#
# `est.time_parts` splits the step of one pipeline device (the mean over the devices): the
# layers' matmuls (`gemm`), their memory-bound kernels (LayerNorm, softmax, GeLU, dropout:
# `memory_bound`), the tensor-parallel collectives the layers wait for (`tp_collectives`), the
# embedding and output layer, the pipeline's idle time until the last compute ends
# (`pipeline_bubble`), the data-parallel gradient reduction the step still waits for after it
# (`grad_reduce`), the optimizer step. They add up to the step.
#
# `est.memory_parts` gives, per pipeline device, the bytes of weights, gradients, optimizer
# state (mixed-precision Adam: 2 + 4 + 12 bytes a parameter, divided by ZeRO) and the peak of
# activations the schedule holds.

# %%
from sim.plan import published

parts = est.time_parts
fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(12, 4), gridspec_kw={"width_ratios": [1, 1.3]})
ax_t.barh(list(parts), list(parts.values()), color="#4c72b0")
ax_t.invert_yaxis()
ax_t.set_xlabel("seconds per step, one pipeline device")
ax_t.set_title(f"where the {est.step_time:.1f} s step goes")
for i, v in enumerate(parts.values()):
    ax_t.text(v, i, f" {v / est.step_time:.0%}", va="center", fontsize=8)
kinds = ["weights", "grads", "optimizer", "activations"]
bottom = [0.0] * PP
for k in kinds:
    values = [mp[k] / GiB for mp in est.memory_parts]
    ax_m.bar(range(PP), values, bottom=bottom, label=k)
    bottom = [b + v for b, v in zip(bottom, values)]
ax_m.axhline(gpu.memory / GiB, color="black", linestyle=":", label=f"{GPU} memory")
ax_m.set_ylim(0, gpu.memory / GiB * 1.3)
ax_m.set_xlabel("pipeline device")
ax_m.set_ylabel("GiB")
ax_m.set_title("where the memory goes (peak)")
ax_m.legend(fontsize=8, loc="upper center", ncol=3)
plt.show()
print({k: f"{v:.2f} s" for k, v in parts.items()})

# %% [markdown]
# The first device holds the most activations: in 1F1B and its interleaved form, device 0 starts
# `p` micro-batches (and a bit more when interleaved) before the first backward frees one
# (notebook 2). The other parts of the memory are the same on every device except for the
# embedding on the first and the output layer on the last. Most of it is the optimizer state:
# that is what ZeRO divides over the data-parallel ranks (section 3).
#
# ## 3. What each choice buys
#
# One knob at a time, the rest as above:
#
# - **recompute**: keep every activation (`none`), recompute only the attention core (`selective`,
#   Korthikanti et al. 2022), or the whole layer from its input (`full`); sequence parallelism
#   splits what tensor parallelism leaves whole;
# - **interleaving**: `v` chunks per device divide the bubble by `v` (notebook 4);
# - **zero-bubble schedules**: split the backward into I and W and fill the bubble with Ws (ZB-H1,
#   ZB-H2, ZB-V; Qi et al. 2024);
# - **ZeRO**: divide optimizer state (1), gradients too (2), weights too (3) over the `d`
#   data-parallel ranks (Rajbhandari et al. 2020);
# - **partition**: the same number of layers on every stage (`even`), or the fastest split in
#   which every stage fits its GPU (`balanced`: fewer layers where more micro-batches wait).

# %%
base = {**layout, "schedule": "1f1b", "virtual": None}
variants = {
    "recompute": [("none", dict(recompute="none", sequence_parallel=False)),
                  ("none + SP", dict(recompute="none")),
                  ("selective + SP", {}),
                  ("full", dict(recompute="full", sequence_parallel=False))],
    "interleaving": [(f"v={v}", dict(schedule="interleaved-1f1b" if v > 1 else "1f1b", virtual=v if v > 1 else None))
                     for v in (1, 2, 3)],
    "schedule": [(s, dict(schedule=s)) for s in ("1f1b", "zb-h1", "zb-h2", "zbv")],
    "ZeRO": [(f"zero={z}", dict(zero=z)) for z in (0, 1, 2, 3)],
    "partition": [(f"{p}, no recompute", dict(recompute="none", sequence_parallel=False, partition=p))
                  for p in ("even", "balanced")],
}
rows, labels, steps, peaks, colours, refused = [], [], [], [], [], []
for colour, (group, options) in zip(["C0", "C1", "C2", "C3", "C4"], variants.items()):
    for label, change in options:
        try:
            e = sim.estimate(MODEL, GPU, **{**base, **change})
        except ValueError as err:  # a layout that cannot run says why
            refused.append(f"{group} {label}: {err}")
            continue
        rows.append([group, label, f"{e.step_time:.2f}", f"{e.tflops_per_gpu:.0f}", f"{e.mfu:.1%}",
                     f"{e.bubble_fraction:.1%}", f"{max(e.peak_memory) / GiB:.1f}", "yes" if e.fits else "NO"])
        labels.append(f"{group}: {label}")
        steps.append(e.step_time)
        peaks.append(max(e.peak_memory) / GiB)
        colours.append(colour)
header = ["knob", "choice", "step s", "TFLOP/s", "MFU", "bubble", "peak GiB", "fits"]
widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
for r in [header, *rows]:
    print("  ".join(str(c).rjust(w) for c, w in zip(r, widths)))
print("refused:", *refused, sep="\n  ")

# %%
fig, (ax_s, ax_p) = plt.subplots(1, 2, figsize=(12, 5), sharey=True)
y = range(len(labels))
ax_s.barh(y, steps, color=colours)
ax_s.set_yticks(list(y), labels)
ax_s.invert_yaxis()
ax_s.set_xlim(min(steps) * 0.9, max(steps) * 1.02)
ax_s.set_xlabel("step time, s (axis does not start at 0)")
ax_p.barh(y, peaks, color=colours)
ax_p.axvline(gpu.memory / GiB, color="black", linestyle=":", label=f"{GPU} memory")
ax_p.set_xlabel("peak memory of the fullest device, GiB")
ax_p.legend(fontsize=8)
fig.suptitle(f"{MODEL} on {GPUS} GPUs, t={TP} p={PP} d={DP}: one knob at a time (1F1B, selective + SP otherwise)")
plt.show()

# %% [markdown]
# What to read from it:
#
# - **Recompute** is a memory knob: without it the activations of `p` micro-batches do not fit
#   unless sequence parallelism splits them; full recompute fits easily and costs a whole extra
#   forward (about a third more time). Selective recompute with sequence parallelism costs a few
#   percent (Korthikanti et al. 2022, Table 4: 4 %).
# - **Interleaving** shrinks the bubble for a little more memory on the first device and `v` times
#   the pipeline transfers.
# - **Zero-bubble schedules** shrink the bubble without more devices or micro-batches; ZB-H2 pays
#   for it in memory, ZB-V does not.
# - **ZeRO** leaves the time nearly alone (its reduce-scatter and all-gather move the bytes of an
#   all-reduce) and frees most of the optimizer state; ZeRO-3 would gather the weights for every
#   micro-batch, which no pipeline-parallel framework does: the estimate refuses it, with the fix.
# - **Partition**: without recompute the first device, which holds the most micro-batches, does
#   not fit with an even split; the balanced one moves layers to the later stages until every
#   device fits, for a longer step (the slowest stage has more layers). Recompute is the cheaper
#   way here.
#
# ## 4. How close the estimate is to published measurements
#
# `sim.published` holds the published tables and runs the estimate on each row:
# Narayanan et al. 2021, Table 1 (ten GPT models from 1.7B to 1T parameters on 32 to 3072
# A100s, TFLOP/s per GPU) and Korthikanti et al. 2022, Table 5 (iteration times of four models
# with full recompute and with selective recompute + sequence parallelism). The full tables,
# with the per-layer times of Table 4, are printed by `python benchmarks/bench_published.py`
# (it needs scipy: `pip install -e ".[bench]"`) and recorded in
# [docs/validation.md](../docs/validation.md#the-planner-against-published-runs).

# %%
narayanan = published.narayanan_table_1()
korthikanti = published.korthikanti_table_5()
for r in narayanan:
    print(f"{r['model']:>16}  t={r['tp']} p={r['pp']:>2} d={r['dp']:>2}  predicted {r['predicted']:5.1f}  "
          f"published {r['published']}  TFLOP/s per GPU  {r['error']:+.0%}")
for r in korthikanti:
    print(f"{r['model']:>16}  full recompute {r['full']:6.2f} s (published {r['full_published']}, {r['full_error']:+.0%})"
          f"   selective + SP {r['present']:6.2f} s (published {r['present_published']}, {r['present_error']:+.0%})")
fig, (ax_a, ax_b) = plt.subplots(1, 2, figsize=(12, 4.5))
pub = [r["published"] for r in narayanan]
ax_a.scatter(pub, [r["predicted"] for r in narayanan])
ax_a.plot([120, 220], [120, 220], color="grey", linestyle=":", label="predicted = published")
ax_a.set_xlabel("published TFLOP/s per GPU")
ax_a.set_ylabel("predicted TFLOP/s per GPU")
ax_a.set_title("Narayanan et al. 2021, Table 1")
ax_a.legend(fontsize=8)
x = range(len(korthikanti))
for shift, (key, label) in zip((-0.2, 0.2), (("full", "full recompute"), ("present", "selective + SP"))):
    ax_b.bar([i + shift for i in x], [100 * r[f"{key}_error"] for r in korthikanti], width=0.4, label=label)
ax_b.set_xticks(list(x), [r["model"].removeprefix("korthikanti-") for r in korthikanti])
ax_b.axhline(0, color="black", linewidth=0.8)
ax_b.set_ylabel("error of the iteration time, % (predicted - published)")
ax_b.set_title("Korthikanti et al. 2022, Table 5")
ax_b.legend(fontsize=8)
plt.show()

# %% [markdown]
# The estimate is optimistic: it predicts 10 to 23 % more throughput than Table 1 and
# 9-17 % shorter iterations than Table 5. Its orders agree with the papers (sequence
# parallelism shortens the forward; full recompute costs more than selective; the bigger models
# reach the higher MFU), and the MFU computed from the published times with our FLOP count equals
# the published MFU (tests/sim/plan/test_published.py). Where it is off, and by how much, is recorded in
# [docs/validation.md](../docs/validation.md#the-planner-against-published-runs); nothing was fitted to make it closer.
#
# ## 5. The planner
#
# The planner searches the layouts (t, p, d, micro-batch, schedule, recompute, ZeRO) of a model on
# a cluster, keeps those that fit, and ranks them by step time: `sim.plan.search(...)`, and from
# the shell `python -m sim.plan`. The SageMaker model parallel library's best practices give
# reference configurations to compare with (GPT-2 shapes, sequence 512, on 8 x A100-40GB nodes;
# the page gives no hidden size or layers: `sim.sagemaker` picks GPT-2-style shapes of those sizes):

# %%
print("params  instances  GPUs  pipeline  tensor  optimizer sharding  checkpointing           batch  micro-batches")
for billions, nodes, pp, tp, sharding, checkpointing, batch, micro in published.SAGEMAKER_REFERENCE:
    print(f"{billions:>5}B  {nodes:>9}  {8 * nodes:>4}  {pp:>8}  {tp:>6}  {str(sharding):>18}  {checkpointing:<22}  "
          f"{batch:>5}  {micro or '-':>13}")

import sim.plan
import sim.model.sagemaker

# sim.sagemaker chooses GPT-2-style shapes of those sizes (its docstring says which and why) and
# reads each row as sim.estimate's arguments: does it fit in 40 GB, and what breaks without
# checkpointing (recompute="none") or optimizer-state sharding (zero=0)?
print("\nrow   as published          no checkpointing      no sharding")
for key in sim.model.sagemaker.REFERENCES:
    cells = []
    for overrides in ({}, {"recompute": "none"}, {"zero": 0}):
        e = sim.plan.published.sagemaker_estimate(key, **overrides)
        cells.append(f"{max(e.peak_memory) / GiB:5.1f} GiB {'fits' if e.fits else 'OOM ':4}")
    print(f"{key:>4}  " + "     ".join(cells))

# the planner over a narrowed space (the whole space: python -m sim.plan, about ten seconds)
plan = sim.plan.search(MODEL, GPU, gpus=1024, global_batch=1536, top=5, tp=8, recompute="selective", zero=1,
                       sequence_parallel=True, schedules=["1f1b", "interleaved-1f1b", "zbv"])
print(f"\n{plan.enumerated} configurations, {plan.simulated} simulated; the fastest that fit:")
for r in plan:
    c = r.config
    print(f"t={c.tp} p={c.pp} d={c.dp} b={c.micro_batch} {c.schedule:<16} V={c.virtual}  "
          f"{r.step_time:6.2f} s  MFU {r.mfu:.1%}  peak {r.peak_memory / GiB:5.1f} GiB")
