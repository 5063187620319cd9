# %% [markdown]
# # 8. Mixtures of experts: the layer, the all-to-all and the schedules that hide it
#
# A mixture-of-experts (MoE) layer replaces the dense MLP by E routed experts, k of them a token,
# beside S shared experts every token passes through. Its FLOPs are those of a dense MLP k + S
# experts wide, but its step is shaped by what a dense layer does not have: a router, the
# permutation of the token copies into expert order, and two **all-to-alls** (dispatch and
# combine) that send each copy to the GPU holding its expert and back. This notebook prices them
# with the cost layer and the simulator, for DeepSeek-V3 on H100s:
#
# 1. **a MoE layer's time and memory**, part by part, against the dense layer of the same active
#    FLOPs (`sim.cost.layer.layer_times(..., moe=True)`, `sim.cost.moe.routed_parts`,
#    `sim.model.moe.Experts.activation_bytes`);
# 2. **the all-to-all on one node against across nodes**: expert parallelism (ep) 8 inside a node
#    over NVLink, 16 to 256 across nodes through the NICs (`sim.hardware.network.all_to_all_time`);
# 3. **when DualPipe beats interleaved 1F1B and when it does not**: the pipeline simulated with
#    per-stage costs whose all-to-alls come from section 2, each forward-backward pair hiding
#    one all-to-all under the other compute (docs/rules.md, rule 18), against W's size, ep's
#    size and memory.
#
# Each section ends with its conclusions, which the cell above them asserts: if the cost layer's
# numbers move, the notebook fails there. It runs on the simulator alone (no torch), in seconds.
#
# **Where the numbers come from** (the profile `h100-80gb-dgxc`, docs/profiles.md): the plain GEMM
# efficiency is *calibrated* (least squares on the 31 dense BF16 rows of the H100 development
# set); the attention kernel's efficiency, HBM bandwidth, NVLink's and a NIC's bus bandwidth are
# *published* best-case figures (cited in the profile, printed below); the H100's peak FLOP/s and
# memory are datasheet values. The **grouped GEMM efficiency is not calibrated** here: the
# experts' grouped GEMMs run at the plain GEMM rate of the same total shape, an optimistic bound
# (grouped GEMMs over many small experts run slower). No MoE row has been fitted: the times are
# the model's, not measurements.

# %%
# Parameters: change them and run all cells again
MODEL = "deepseek-v3-671b"   # a MoE preset of sim.MODELS (mixtral-8x7b, qwen3-235b-a22b, gpt-oss-120b, ...)
PROFILE = "h100-80gb-dgxc"   # the device profile (docs/profiles.md)
MICRO_BATCH = 1              # sequences per micro-batch: each GPU routes MICRO_BATCH x seq tokens a layer
GPUS_PER_NODE = 8            # a DGX H100: 8 GPUs on NVLink, one 400 Gb/s NIC each
EP_NODE = 8                  # expert parallelism inside one node
EP_ACROSS = (16, 32, 64, 128, 256)  # ... and across 2 to 32 nodes
# Section 3: the pipeline
P, M = 16, 32                # pipeline devices and micro-batches (DeepSeek-V3 trains with 16 stages)
MOE_LAYERS = 64              # MoE layers in the pipeline, 2P chunks of them (the model's 58, rounded up to
                             # divide; its dense layers and the embedding and output layers left out)
GPUS = 2048                  # the cluster: data parallelism is GPUS / P (ZeRO-1's optimizer shards)

# %%
# %matplotlib inline
import dataclasses

import matplotlib.pyplot as plt
from nbhelp import show  # notebooks/nbhelp.py, first: it finds an uninstalled sim

import sim
from sim.cost.layer import layer_times
from sim.cost.moe import routed_parts
from sim.cost.slice import Slice
from sim.hardware.network import all_to_all_time, bus_bandwidth, links_of
from sim.hardware.profile import profile
from sim.hardware.topology import Topology
from sim.model.footprint import state_bytes_per_param
from sim.plan.layout import usable_memory

GiB, ms = 2**30, 1e-3
model, dev = sim.MODELS[MODEL], profile(PROFILE)
experts, links = model.moe, links_of(dev)
print(f"{MODEL}: {model.layers} layers ({model.dense_layers} dense), h {model.hidden}, E {experts.experts}, "
      f"k {experts.top_k}, S {experts.shared_experts}, expert F {experts.expert_ffn}, s {model.seq}")


def provenance(*path):
    """A profile number and where it comes from (its `source` and citation, or dataset)."""
    node = dev.data
    for key in path:
        node = node[key]
    return f"{node['value']:.4g} ({node['source']}: {node.get('citation') or node.get('dataset')})"


print("plain GEMM efficiency      ", provenance("matmul", "efficiency")[:90], "...")
print("grouped GEMM efficiency    ", dev.grouped_gemm_efficiency, "(none: the plain GEMM rate, uncalibrated)")
print("attention kernel efficiency", provenance("attention", "efficiency")[:90], "...")
print("HBM bandwidth (B/s)        ", provenance("memory_bound", "bandwidth")[:90], "...")
print("NVLink bus bandwidth (B/s) ", provenance("collectives", "node", "bus_bandwidth"))
print("NIC bus bandwidth (B/s)    ", provenance("collectives", "network", "bus_bandwidth"))
print(f"peak BF16 {dev.gpu.flops('bf16') / 1e12:.0f} TFLOP/s and {dev.gpu.memory / GiB:.1f} GiB: the datasheet's")

# %% [markdown]
# ## 1. A MoE layer's time and memory, part by part
#
# One GPU routes its micro-batch's `T = b s` tokens (here 4,096) through one of DeepSeek-V3's MoE
# layers, as Megatron-Core's MoE layer runs it (alltoall dispatcher, grouped GEMMs;
# docs/planner.md, "A MoE layer's time"): multi-head latent attention and the norms as in a dense
# layer; the **shared expert** as a dense MLP of width S F; the **router** (a T x h by h x E GEMM,
# then its sigmoid and top-k in fp32); the **permutation** of the k T copies into expert order
# and back; the **routed experts'** two grouped GEMMs over the copies the GPU receives and the
# activation between them; and the **dispatch and combine all-to-alls**, here over the 8 GPUs of
# one node (ep = 8, 32 experts on each). Routing is balanced (each GPU receives k T copies).
#
# DeepSeek-V3's first three layers are dense with an MLP of width 18,432 = (k + S) F: the same
# active FLOPs, but for the router's. That dense layer is the yardstick.

# %%
node_slice = Slice(MICRO_BATCH, ep=EP_NODE)
moe = layer_times(model, dev, node_slice, moe=True)
dense = layer_times(model, dev, Slice(MICRO_BATCH), moe=False)
no_shared = layer_times(dataclasses.replace(model, shared_experts=0), dev, node_slice, moe=True)
routed = routed_parts(model, dev, node_slice)
routed_f = sum(v for k, v in routed["F"].items() if k != "all_to_all")
routed_b = sum(v for p in "IW" for k, v in routed[p].items() if k != "all_to_all")
parts = {  # (forward, backward) seconds; the backward is I + W
    "attention, norms": (no_shared.forward - routed_f, no_shared.backward - routed_b),
    "shared expert": (moe.forward - no_shared.forward, moe.backward - no_shared.backward),
    "router": (routed["F"]["router"], routed["I"]["router"] + routed["W"]["router"]),
    "permutation": (routed["F"]["permutation"], routed["I"]["permutation"]),
    "routed experts": (routed["F"]["experts"], routed["I"]["experts"] + routed["W"]["experts"]),
    "all-to-alls": (moe.a2a_forward, moe.a2a_backward),
}
total = {"forward": moe.forward + moe.a2a_forward, "backward": moe.backward + moe.a2a_backward}
print(f"{'part':18s} {'forward':>9s} {'backward':>9s} {'share':>6s}   (ms, one GPU, one micro-batch, ep = {EP_NODE})")
for name, (f, b) in parts.items():
    print(f"{name:18s} {f / ms:9.2f} {b / ms:9.2f} {(f + b) / sum(total.values()):6.1%}")
print(f"{'MoE layer':18s} {total['forward'] / ms:9.2f} {total['backward'] / ms:9.2f}")
print(f"{'dense layer':18s} {dense.forward / ms:9.2f} {dense.backward / ms:9.2f}   (MLP 18,432 wide: the same "
      f"active FLOPs)")
moe_flops, dense_flops = (sum(model.layer_flops(MICRO_BATCH, moe=flag).values()) for flag in (True, False))
print(f"forward FLOPs: MoE layer {moe_flops / 1e12:.2f} T, dense layer {dense_flops / 1e12:.2f} T")

fig, ax = plt.subplots(figsize=(8, 2.6))
for row, (label, pieces) in enumerate([("dense layer", {"dense layer": (dense.forward, dense.backward)}),
                                       ("MoE layer", parts)]):
    left = 0.0
    for name, (f, b) in pieces.items():
        ax.barh(row, (f + b) / ms, left=left, label=name, color=None if row else "lightgrey")
        left += (f + b) / ms
ax.set(yticks=[0, 1], yticklabels=["dense layer", f"MoE layer, ep {EP_NODE}"], xlabel="forward + backward (ms)",
       title=f"{MODEL}: one layer on one GPU, {MICRO_BATCH * model.seq} tokens")
ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# **Memory.** What the layer keeps for its backward per micro-batch (`Transformer.activation_bytes_per_layer`,
# without recompute; the MoE part from `Experts.activation_bytes`, docs/planner.md, "A MoE
# layer's activations"): the attention's and the norms' as the dense layer's, then the router's
# fp32 scores and routing map, the k T copies the experts receive (the first grouped GEMM's input),
# their intermediate (SwiGLU's two inputs and product, and each copy's fp32 gate) and the shared
# expert's.

# %%
moe_bytes = model.activation_bytes_per_layer(MICRO_BATCH, moe=True, ep=EP_NODE)
expert_bytes = model.moe_activation_bytes(MICRO_BATCH, ep=EP_NODE)
dense_bytes = model.activation_bytes_per_layer(MICRO_BATCH)
memory = {"attention, norms, MLP input": moe_bytes - sum(expert_bytes.values()), **expert_bytes}
for name, b in memory.items():
    print(f"{name:28s} {b / GiB:6.3f} GiB {b / moe_bytes:6.1%}")
print(f"{'MoE layer':28s} {moe_bytes / GiB:6.3f} GiB;  dense layer {dense_bytes / GiB:.3f} GiB")

# %%
# the conclusions below, checked
f_b = {name: f + b for name, (f, b) in parts.items()}
layer = sum(total.values())
assert abs(sum(f_b.values()) - layer) < 1e-9 * layer                      # the parts are the layer
assert max(f_b, key=f_b.get) == "routed experts" and 0.35 < f_b["routed experts"] / layer < 0.45
assert 0.3 < f_b["attention, norms"] / layer < 0.37
assert f_b["router"] < 0.01 * layer and 0.07 < f_b["permutation"] / layer < 0.1   # memory-bound, no dense analogue
assert 0.11 < f_b["all-to-alls"] / layer < 0.15
dense_time = dense.forward + dense.backward
assert 1.25 < layer / dense_time < 1.33 and 1.1 < (layer - f_b["all-to-alls"]) / dense_time < 1.16
assert abs(moe_flops / dense_flops - 1) < 0.005
assert 1.3 < moe_bytes / dense_bytes < 1.4 and 0.45 < (expert_bytes["permuted"] + expert_bytes["experts"]) / moe_bytes < 0.5

# %% [markdown]
# **What the numbers say** (the cell above asserts each claim):
#
# - **The routed experts are the largest part**, about 40 % of the layer's forward and backward
#   (their grouped GEMMs and the activation between them); the attention (MLA, 128 heads at
#   s = 4,096) and the norms are about a third, the shared expert 5 %.
# - **The permutation costs 8 %**, and has no counterpart in the dense layer: memory-bound copies
#   of the k T = 32,768 token copies, h wide, into expert order and back, each way. The router
#   itself is under 1 % (its GEMM is h x E, and its scores T x E are small beside the copies).
# - **The all-to-alls inside one node add about an eighth** (13 %), left exposed unless a
#   schedule hides them (section 3).
# - At the same active FLOPs (within 0.5 %), the MoE layer takes about 1.3 times the dense
#   layer's time, 1.13 times without its all-to-alls; and it keeps about 1.34 times the dense
#   layer's activations: the k T copies and their expert intermediate are nearly half of what
#   it keeps.
#
# The grouped GEMMs are timed at the plain GEMM rate: if they run slower (small experts, load
# imbalance), the routed experts' share grows. Imbalance is `load_imbalance=` on the model
# (`Experts.rank_load`).

# %% [markdown]
# ## 2. The all-to-all on one node against across nodes
#
# Each GPU sends its k T copies, h wide in BF16 (470 MB for DeepSeek-V3 at b = 1), spread over
# the ep GPUs of its expert-parallel group, and gets as many back: the dispatch, then the
# combine, in the forward, and their gradients in the backward. Inside a node every GPU has
# NVLink to every other through the NVSwitch: (n-1)/n of the buffer at NVLink's bus bandwidth.
# Across nodes, each GPU's (n-k)/n bound for other nodes leaves through **its own NIC** (one per
# GPU on a DGX H100), while its (k-1)/n to its own node's GPUs goes over NVLink at the same time
# (`sim.hardware.network.all_to_all_time`; k = 8 GPUs of the group on each node). With tensor and
# context parallelism 1, Megatron-Core folds ep right after them, so an ep group is ep
# consecutive ranks: a group over whole nodes, placed here as a dp group of ep ranks
# (`sim.hardware.topology.Topology.group`).

# %%
def ep_slice(ep):
    """The slice of one GPU at expert parallelism `ep`: inside a node up to a node's GPUs, else across."""
    group = None if ep <= GPUS_PER_NODE else Topology(tp=1, pp=1, dp=ep, gpus_per_node=GPUS_PER_NODE).group("dp")
    return Slice(MICRO_BATCH, ep=ep, ep_group=group)


buffer = experts.top_k * MICRO_BATCH * model.seq * model.hidden * 2   # bytes a GPU sends in one all-to-all
expert_compute = routed_f                                              # the routed part's forward compute
print(f"buffer {buffer / 1e6:.0f} MB a GPU; the routed experts' forward {expert_compute / ms:.2f} ms, "
      f"the whole layer's forward {moe.forward / ms:.2f} ms")
print(f"{'ep':>4s} {'nodes':>5s} {'link':>7s} {'GB/s a GPU':>10s} {'off node':>8s} {'dispatch+combine':>17s} "
      f"{'/ experts':>9s} {'/ layer F':>9s}")
a2a = {}
for ep in (EP_NODE, *EP_ACROSS):
    x = ep_slice(ep)
    group = x.expert_group
    per_gpu = bus_bandwidth(links, group) if not group.network else \
        min(links.node.bus_bandwidth, group.nic_share / group.per_node * links.network.bus_bandwidth)
    off = (ep - group.per_node) / ep if group.network else 0.0
    a2a[ep] = layer_times(model, dev, x, moe=True).a2a_forward
    assert abs(a2a[ep] - 2 * all_to_all_time(links, buffer, group)) < 1e-12   # the layer's is the network's
    print(f"{ep:4d} {group.nodes:5d} {'network' if group.network else 'NVLink':>7s} {per_gpu / 1e9:10.0f} "
          f"{off:8.1%} {a2a[ep] / ms:14.2f} ms {a2a[ep] / expert_compute:9.2f} {a2a[ep] / moe.forward:9.2f}")

fig, ax = plt.subplots(figsize=(9, 3.8))
eps = list(a2a)
ax.plot(eps, [a2a[e] / ms for e in eps], "o-", label="dispatch + combine (forward)")
ax.axhline(expert_compute / ms, color="C1", ls="--", label="the routed experts' forward compute")
ax.axhline(moe.forward / ms, color="C2", ls=":", label="the whole layer's forward compute")
ax.axhline(2 * buffer / links.network.bus_bandwidth / ms, color="grey", lw=0.8,
           label="limit: the whole buffer through one NIC, twice")
ax.axvspan(eps[0] * 0.8, GPUS_PER_NODE * 1.25, color="C0", alpha=0.08)
ax.set(xscale="log", xticks=eps, xticklabels=eps, xlabel="expert parallelism ep (shaded: one node)",
       ylabel="ms per layer", title=f"{MODEL}: the all-to-all on one node and across nodes")
ax.minorticks_off()
ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
fig.tight_layout()
plt.show()

# %%
# the conclusions below, checked
nic_limit = 2 * buffer / links.network.bus_bandwidth
assert a2a[EP_NODE] < 0.4 * expert_compute and a2a[EP_NODE] < 0.25 * moe.forward
assert all(a2a[e] > expert_compute for e in EP_ACROSS)                      # across nodes: above the experts
assert a2a[16] < moe.forward < a2a[32]                                      # ... and from 4 nodes, above the layer
assert 4 < a2a[16] / a2a[EP_NODE] < 5 and 7.5 < a2a[64] / a2a[EP_NODE] < 8
assert all(a2a[a] < a2a[b] < nic_limit for a, b in zip(EP_ACROSS, EP_ACROSS[1:]))
assert a2a[256] > 0.95 * nic_limit

# %% [markdown]
# **What the numbers say:**
#
# - **Inside a node the all-to-all is cheap**: at ep = 8 the dispatch and combine take about a
#   third of the routed experts' forward compute and a fifth of the layer's forward, at
#   NVLink's 370 GB/s.
# - **Across nodes it is the bottleneck.** From ep = 16 (2 nodes) half or more of each buffer
#   leaves through a 48 GB/s NIC, almost 8 times slower than NVLink: the all-to-all takes 4.4
#   times as long as in one node, 1.6 times the routed experts' compute and nearly the whole
#   layer's forward; from ep = 32 (4 nodes) more than that forward. It grows with the share
#   that leaves the node, (n - k)/n, towards the whole buffer through one NIC (ep = 64: 7.7
#   times the one-node time).
# - The all-to-all does not shrink with ep: each GPU sends its own k T copies whatever the
#   group's size, so a larger ep saves memory (fewer experts a GPU: section 3) and costs time.
#
# Not modelled: DeepSeek-V3's node-limited routing (each token to at most 4 nodes) and DeepEP's
# dispatch, which sends a token once per node over InfiniBand and forwards it over NVLink (the
# V3 report, Sec. 3.2.2): they cut the network's share well below (n - k)/n. That is why DeepSeek
# reports a computation-to-communication ratio near 1:1 where this plain alltoall dispatcher
# gives about 1:1.7 at ep = 64 (a layer's forward against its dispatch and combine).

# %% [markdown]
# ## 3. When DualPipe beats interleaved 1F1B, and when it does not
#
# A schedule can hide an all-to-all only under another compute on the same GPU. DeepSeek's
# **DualPipe** (the V3 report, Sec. 3.2.1) and its V-shaped half, **DualPipeV**, run the forward
# of one chunk and the backward of another as an overlapped pair, each one's all-to-all under the
# other's compute; so does Megatron-Core's **overlapped interleaved 1F1B**
# (`--overlap-moe-expert-parallel-comm`) in its steady phase. The simulator prices a pair as the
# two computes plus what of each all-to-all the other does not cover (docs/rules.md, rule 18,
# `sim.engine.costs.pair_times`); an unpaired compute waits for its own all-to-all.
#
# The pipeline: `MOE_LAYERS` of DeepSeek-V3's MoE layers on P = 16 devices, M = 32 micro-batches
# of one sequence. Each schedule cuts them into its stages (2P chunks of 2 layers for interleaved
# 1F1B with V = 2, ZB-V and DualPipeV; DualPipe, two copies of the model of P stages each), and a
# stage's costs are its layers' (`layer_times`): F, I, W, and the all-to-alls of section 2.
# Pipeline sends are free (`transport="ideal"`), as in notebook 4. Memory: each GPU holds the
# dense part of its layers and E/ep experts of each, as BF16 weights and fp32 gradients, and
# ZeRO-1's optimizer state (12 bytes a parameter) sharded over the GPUS/P data-parallel ranks
# for the dense part and over the GPUS/(P ep) ranks that hold the same experts for those;
# DualPipe keeps its two copies' weights and gradients, and one optimizer state.

# %%
CONTENDERS = {  # label: (schedule, options)
    "interleaved 1F1B": ("interleaved-1f1b", {}),
    "interleaved 1F1B, overlapped": ("interleaved-1f1b", {"overlap": True}),
    "ZB-V": ("zbv", {}),
    "DualPipeV": ("dualpipev", {"overlap": True}),
    "DualPipe": ("dualpipe", {"overlap": True}),
    "DualPipe, no pairs": ("dualpipe", {}),
}
schedules = {label: sim.make_schedule(name, P, M, **options) for label, (name, options) in CONTENDERS.items()}
DP = GPUS // P
split = experts.params(model.hidden)
dense_params = model.params().per_moe_layer - split["routed"]   # attention, norms, router, shared expert


def stage_costs(schedule, lt, ep, recompute="none"):
    """Costs of one stage of `schedule`: its MoE layers' times (`lt`, one layer), all-to-alls and bytes."""
    n = MOE_LAYERS * schedule.pipelines / schedule.stages          # layers a stage holds
    state = state_bytes_per_param("bf16")                          # bytes per parameter, unsharded
    params = n * (dense_params + split["routed"] / ep)
    optimizer = n * state["optimizer"] * (dense_params / DP + split["routed"] / ep / (DP / ep))
    kept = model.activation_bytes_per_layer(MICRO_BATCH, recompute=recompute, moe=True, ep=ep)
    return sim.Costs(forward=n * lt.forward, backward=n * lt.backward, backward_input=n * lt.backward_input,
                     backward_weight=n * lt.backward_weight, a2a_forward=n * lt.a2a_forward,
                     a2a_backward=n * lt.a2a_backward, activation_bytes=n * kept,
                     weight_bytes=params * state["weights"], grad_bytes=params * state["grads"],
                     optimizer_bytes=optimizer / schedule.pipelines, transport="ideal")


def run(label, ep, recompute="none", lt=None):
    """The simulated step of contender `label` at expert parallelism `ep`."""
    lt = lt or layer_times(model, dev, ep_slice(ep), recompute, moe=True)
    return sim.simulate(schedules[label], stage_costs(schedules[label], lt, ep, recompute))


steps = {(label, ep): run(label, ep) for ep in (EP_NODE, *EP_ACROSS[:3]) for label in CONTENDERS}
print(f"{'schedule':30s}" + "".join(f"{'ep ' + str(ep):>9s}" for ep in (EP_NODE, *EP_ACROSS[:3]))
      + "   (step s; no recompute, memory aside)")
for label in CONTENDERS:
    print(f"{label:30s}" + "".join(f"{steps[label, ep].makespan:9.2f}" for ep in (EP_NODE, *EP_ACROSS[:3])))

fig, ax = plt.subplots(figsize=(9, 3.8))
eps = [EP_NODE, *EP_ACROSS[:3]]
for label in CONTENDERS:
    ax.plot(eps, [steps[label, e].makespan / steps["interleaved 1F1B", e].makespan for e in eps], "o-", label=label)
ax.set(xscale="log", xticks=eps, xticklabels=eps, xlabel="expert parallelism ep (8: one node)",
       ylabel="step / interleaved 1F1B's", title=f"{MODEL}-like, P={P}, M={M}: who hides the all-to-all")
ax.minorticks_off()
ax.grid(alpha=0.3)
ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# **W's size.** DualPipe is also a zero-bubble schedule: near the end its devices split backwards
# into I and W and move the Ws into the bubble; its bubble is (P/2-1)(F&B + B - 3W) in the
# report's Table 2 (tests/sim/schedule/test_dualpipe.py). With little W there is little to move.
# Holding every time of the layer fixed but the split of its backward into I and W (a what-if:
# with full recompute, I also runs the forward again and W's share falls to a quarter):

# %%
shares = [0.0, 0.1, 0.2, 0.3, 0.39]
sweep = {}
for ep in (EP_NODE, 64):
    base = layer_times(model, dev, ep_slice(ep), moe=True)
    b = base.backward_input + base.backward_weight
    for share in shares:
        lt = dataclasses.replace(base, backward_input=(1 - share) * b, backward_weight=share * b)
        for label in ("interleaved 1F1B", "interleaved 1F1B, overlapped", "DualPipe"):
            sweep[label, ep, share] = run(label, ep, lt=lt).makespan
w_share = moe.backward_weight / (moe.backward_input + moe.backward_weight)
fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), sharey=True)
for ax, ep in zip(axes, (EP_NODE, 64)):
    for label in ("interleaved 1F1B, overlapped", "DualPipe"):
        ax.plot(shares, [sweep[label, ep, s] / sweep["interleaved 1F1B", ep, s] for s in shares], "o-", label=label)
    ax.axhline(1, color="grey", lw=0.8)
    ax.axvline(w_share, color="grey", ls="--", label="this layer's W share")
    ax.set(xlabel="W / (I + W)", title=f"ep {ep}" + (" (one node)" if ep <= GPUS_PER_NODE else " (8 nodes)"))
axes[0].set(ylabel="step / interleaved 1F1B's")
axes[1].legend(fontsize=8)
fig.tight_layout()
plt.show()
print(f"this layer's W: {w_share:.0%} of the backward")

# %% [markdown]
# **Memory.** Without recompute none of these layouts fits an H100 at 4,096 tokens a micro-batch
# (a MoE layer keeps 1.7 GiB, section 1): with full recompute a stage keeps only each layer's
# input. What a schedule holds then is its parameters, and DualPipe holds two copies; how many
# parameters a GPU holds is set by ep (E/ep experts of each layer).

# %%
budget = usable_memory(dev.gpu.memory)   # all but the 10 % headroom the planner keeps
memory_grid = {(label, ep, rc): run(label, ep, rc) for ep in (EP_NODE, 64) for rc in ("none", "full")
               for label in ("interleaved 1F1B", "interleaved 1F1B, overlapped", "ZB-V", "DualPipeV", "DualPipe")}
print(f"{'schedule':30s} {'ep':>3s} {'recompute':>9s} {'step s':>7s} {'peak GiB':>9s}  (x: above the {budget / GiB:.1f} "
      f"GiB usable)")
for (label, ep, rc), r in memory_grid.items():
    peak = max(r.peak_memory)
    print(f"{label:30s} {ep:3d} {rc:>9s} {r.makespan:7.2f} {peak / GiB:9.1f}{'  x' if peak > budget else ''}")


def fastest(ep):
    """The fastest (schedule, recompute) that fits at expert parallelism `ep`."""
    fits = [(r.makespan, label, rc) for (label, e, rc), r in memory_grid.items() if e == ep and
            max(r.peak_memory) <= budget]
    return min(fits)[1:]


print(f"fastest that fits: ep {EP_NODE}: {fastest(EP_NODE)}, ep 64: {fastest(64)}")

# %%
# the conclusions below, checked
step = {key: r.makespan for key, r in steps.items()}
gain = {ep: 1 - step["DualPipe", ep] / step["interleaved 1F1B", ep] for ep in eps}
assert all(step["DualPipe", ep] < step["interleaved 1F1B, overlapped", ep] < step["interleaved 1F1B", ep] for ep in eps)
assert 0.2 < gain[64] < 0.25 and 0.08 < gain[EP_NODE] < 0.11
hiding = {ep: 1 - step["DualPipe", ep] / step["DualPipe, no pairs", ep] for ep in eps}
assert hiding[EP_NODE] < 0.02 and hiding[64] > 0.15                       # pairs matter only across nodes
assert abs(step["DualPipe", EP_NODE] / step["ZB-V", EP_NODE] - 1) < 0.03   # in a node: ZB-V's speed ...
assert step["DualPipe", 64] < 0.9 * step["ZB-V", 64]                       # ... across nodes, well ahead
assert abs(step["DualPipeV", 64] / step["DualPipe", 64] - 1) < 0.01
one_node = {s: sweep["DualPipe", EP_NODE, s] / sweep["interleaved 1F1B, overlapped", EP_NODE, s] for s in shares}
assert one_node[0.0] > 1.03 and one_node[0.1] > 1 > one_node[0.2]          # W small, ep small: DualPipe loses
assert all(sweep["DualPipe", 64, s] < 0.95 * sweep["interleaved 1F1B, overlapped", 64, s] for s in shares)
peak = {key: max(r.peak_memory) for key, r in memory_grid.items()}
assert all(p > budget for (label, ep, rc), p in peak.items() if rc == "none")
assert peak["DualPipe", EP_NODE, "full"] > budget > peak["interleaved 1F1B", EP_NODE, "full"]
assert fastest(EP_NODE) in (("DualPipeV", "full"), ("ZB-V", "full")) and fastest(64) == ("DualPipe", "full")
full = {label: memory_grid[label, EP_NODE, "full"].makespan for label in ("ZB-V", "DualPipeV", "DualPipe")}
assert abs(full["DualPipeV"] / full["ZB-V"] - 1) < 0.01 and full["DualPipe"] < full["DualPipeV"]
assert peak["DualPipe", 64, "full"] < 0.5 * budget
assert 1.7 < peak["DualPipe", EP_NODE, "full"] / peak["interleaved 1F1B", EP_NODE, "full"] < 1.9

# %% [markdown]
# **What the numbers say**, for this model and layout (the cell above asserts each claim):
#
# - **DualPipe wins when the all-to-all is comparable to the compute: expert parallelism across
#   nodes.** At ep = 64 (8 nodes) it is about 22 % faster than interleaved 1F1B, 14 % faster
#   than the overlapped interleaved 1F1B and well ahead of ZB-V; most of that is the pairs (the
#   same DualPipe without them takes a fifth longer). DualPipeV, on half the parameters, is as
#   fast.
# - **With a small all-to-all (ep inside one node) the pairs hide next to nothing** (1 %):
#   DualPipe's 10 % lead over interleaved 1F1B is then that of a zero-bubble schedule, and ZB-V,
#   with one copy of the parameters and no pairs, is as fast.
# - **W small: DualPipe loses.** Its bubble is filled with Ws; with W under about 15 % of the
#   backward and ep inside a node, the overlapped interleaved 1F1B beats it (by about 5 % at
#   W = 0). Across nodes the all-to-all it hides outweighs that, and it wins at any W.
# - **Memory bound: DualPipe does not fit where the others do.** At 4,096 tokens a micro-batch
#   nothing fits without full recompute. With it, what a GPU holds is mostly its parameters: at
#   ep = 8 each GPU holds 32 experts of each of its layers, and DualPipe's second copy takes it
#   to about 1.8 times interleaved 1F1B's memory, over the usable 71.7 GiB, where it would have
#   been the fastest; the fastest that fits are DualPipeV and ZB-V (a tie). At ep = 64 each GPU holds 4 experts a layer, and DualPipe
#   fits in under half the budget and is the fastest, as the report says of its large EP.
#
# So DualPipe pays where DeepSeek used it: expert parallelism spread over nodes, which both makes
# the all-to-all worth hiding and shards the experts thin enough for two copies.

# %% [markdown]
# ## Summary
#
# - A MoE layer of DeepSeek-V3 takes about 1.3 times the time of the dense layer of the same
#   active FLOPs: the permutation (memory-bound) and the all-to-alls are the extra.
# - Inside a node the all-to-all is a fraction of the experts' compute; across nodes each GPU's
#   share of it goes through its own NIC and it exceeds the experts' compute, and from 4 nodes
#   the whole layer's forward.
# - DualPipe (or DualPipeV, at half its parameters) beats interleaved 1F1B when that all-to-all
#   is large; with ep inside a node it is only a zero-bubble schedule, loses when W is small, and
#   its second copy of the parameters may not fit.
#
# More in [docs/planner.md](../docs/planner.md) ("A MoE layer's time", "Mixtures of experts: what
# the tutorial finds") and [docs/rules.md](../docs/rules.md) (rule 18, the overlapped pair).
