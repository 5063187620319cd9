# %% [markdown]
# # 4. Modern schedules: interleaving, zero bubble and V shapes
#
# Notebooks 1 and 2 left 1F1B with a bubble of `(p-1)/(m+p-1)` and `p` micro-batches of
# activations on its first device. The schedules people choose between today attack that bubble
# in three ways, each at some price in memory or communication. This notebook draws them with the
# simulator (`sim.make_schedule`, names in `sim.SCHEDULES`), sizes their memory in bytes for a real
# model, and runs one of them for real:
#
# 1. **interleaving**: each device holds `V` model chunks (`interleaved-1f1b`, `looped-bfs`);
# 2. **zero bubble**: the backward split into input and weight gradients (`zb-h1`, `zb-h2`);
# 3. **V shapes**: two chunks per device, placed as a V (`zbv`, `dualpipev`);
# 4. the **bubble/memory trade-off** of every schedule, in one figure;
# 5. an `explore` cell to move `p`, `m`, `V` and the F:I:W ratio;
# 6. **a real run** on 2 CPU ranks, 2 model stages on each, compared with its simulation;
# 7. **is it worth it?** For Llama 2 70B on 256 H100s, which of ZB-H1/ZB-V, V-Half, V-Min,
#    DualPipeV and interleaved 1F1B wins, with memory, recompute and W's size as the axes.
#
# Every schedule is drawn with two bubbles: the **bubble** of one step (idle share of
# `p × makespan`), and the **steady** bubble of the zero-bubble paper: the longest time one device
# takes from its first compute to its last, which is the step time when steps follow each other
# without a flush (docs/schedules.md, "Zero bubble: ZB-H1, ZB-H2, ZB-V"). Communication is free here (`transport="ideal"`), as in
# the papers' closed forms; notebook 1 shows what latency does.
#
# It needs torch for section 6 only: `pip install -e ".[exec,notebooks]"`.

# %%
# Parameters: change them and run all cells again
P = 4          # pipeline devices
M = 8          # micro-batches per step (zb-h2 needs M >= 2P-1, dualpipev M >= 2P)
V = 2          # model chunks per device of interleaved-1f1b and looped-bfs (zbv and dualpipev: always 2)
F, I, W = 1.0, 1.0, 1.0  # time of the forward, input-gradient and weight-gradient pass of one device's
                         # layers (any unit); unsplit schedules run B = I + W. The papers' closed forms
                         # take F = I = W; in real models W <= I, and I + W is about 2F

# The model whose activations we count: GPT-3 6.7B (Brown et al. 2020, Table 2.1: 32 layers,
# d_model 4096, 32 heads, context 2048), one sequence per micro-batch, 16-bit activations
LAYERS, HIDDEN, HEADS, SEQ, MICRO_BATCH = 32, 4096, 32, 2048, 1

# Section 6: one real run on CPU ranks (gloo), a small MLP
REAL_SCHEDULE = "zbv"  # V-shaped: 2 model stages per rank, the backward split into I and W
REAL_RANKS = 2       # processes; keep it at most the number of CPU cores
REAL_MICRO = 4       # micro-batches per step; must divide REAL_BATCH
REAL_LAYERS, REAL_HIDDEN, REAL_BATCH = 8, 128, 32

# %%
# %matplotlib inline
import matplotlib.pyplot as plt
from nbhelp import Choice, Float, Int, show, sliders  # notebooks/nbhelp.py, first: it finds an uninstalled sim

import sim
from sim.plot import plot_compare, plot_overlay

# %% [markdown]
# **Memory in bytes.** Per transformer layer and micro-batch, the forward saves `sb(34h + 5as)`
# bytes that the backward needs (s sequence, b micro-batch, h hidden, a heads; Korthikanti et al.
# 2022, and Table 1 of Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024). Where the
# backward is split, I frees all but the `32sbh` bytes that W still needs (same table). For the
# model above that is 0.89 GiB and 0.25 GiB per layer. Cut into `p` stages, a device's `32/p`
# layers hold `A` bytes per micro-batch (7.1 GiB at p=4), `A_W` of them until W; a schedule with
# `V` chunks per device cuts the same layers into `pV` stages of `A/V` each, and its chunk
# costs are the device's F, I, W divided by `V`. The weights, gradients and optimizer state are
# the same for every schedule (the same layers on every device) and are left out: memory below is
# activations only.

# %%
GiB = 2**30
PER_LAYER_F = SEQ * MICRO_BATCH * (34 * HIDDEN + 5 * HEADS * SEQ)  # bytes F saves per layer (Qi et al. Table 1)
PER_LAYER_W = 32 * SEQ * MICRO_BATCH * HIDDEN                      # ... of which W needs after I (same table)
A, A_W = LAYERS / P * PER_LAYER_F, LAYERS / P * PER_LAYER_W        # one device of the P-stage split
B = I + W
LOOPED = ("interleaved-1f1b", "looped-bfs")  # the schedules whose V you choose


def model_costs(p=P, v=1, f=F, i=I, w=W):
    """Costs of one chunk when the model is cut into p*v stages: a device's time and layers over v."""
    layers = LAYERS / (p * v)
    return sim.Costs(forward=f / v, backward=(i + w) / v, backward_input=i / v, backward_weight=w / v,
                     activation_bytes=layers * PER_LAYER_F, w_activation_bytes=layers * PER_LAYER_W,
                     transport="ideal")


def run(name, p=P, m=M, v=None, f=F, i=I, w=W, **options):
    """Simulate schedule `name` on the model above; v: chunks per device (None: the schedule's default)."""
    schedule = sim.make_schedule(name, p, m, v, **options)
    return sim.simulate(schedule, model_costs(p, schedule.stages // p, f, i, w))


def label(r):
    v = r.schedule.stages // r.ranks
    return r.schedule.name + (f" V={v}" if r.schedule.name in LOOPED else "")


def table(results, names=None):
    print(f"{'schedule':22s} {'makespan':>8s} {'bubble':>7s} {'steady':>7s}   peak memory per device (GiB)")
    for r, name in zip(results, names or map(label, results)):
        print(f"{name:22s} {r.makespan:8.2f} {r.bubble_fraction:7.1%} {r.steady_bubble_fraction:7.1%}   "
              + "  ".join(f"{b / GiB:5.1f}" for b in r.peak_memory))


def close(x, y):
    return abs(x - y) <= 1e-9 * max(1.0, abs(y))


print(f"A = {A / GiB:.2f} GiB per micro-batch on each of {P} devices, A_W = {A_W / GiB:.2f} GiB of it until W")

# %% [markdown]
# ## 1. Interleaving: V chunks per device
#
# Megatron-LM's **interleaved 1F1B** (Narayanan et al., SC'21) gives each device `V` smaller
# chunks of the model, stage `s` on device `s mod p`: device 0 holds stages 0 and p, device 1
# stages 1 and p+1, and so on. A micro-batch loops through the devices `V` times. The fill and
# the drain still cross `p-1` devices, but each crossing now costs a chunk, `(F+B)/V`, so with `m`
# a multiple of `p`
#
# $$\text{makespan} = (mV + p - 1)\,\frac{F+B}{V}, \qquad \text{bubble} = \frac{p-1}{mV+p-1}:$$
#
# 1F1B's idle time divided by `V`. The price: `V` times as many transfers, and more activations on
# the first device (its warm-up runs `(V-1)g + 2(p-1)` chunk forwards, `g` micro-batches a round).
# **Looped BFS** (Lamy-Poirier, MLSys 2023) uses the same placement breadth first: all `m` forwards
# of one chunk, then the next, like GPipe; the same makespan here, GPipe's memory.

# %%
one = run("1f1b")
inter = run("interleaved-1f1b", v=V)
bfs = run("looped-bfs", v=V)
table([one, inter, bfs])
show(plot_compare([one, inter, bfs]))

# %% [markdown]
# The closed forms against the simulator (if the generators drift, this notebook fails here):

# %%
assert close(one.makespan, (M + P - 1) * (F + B))
assert all(close(one.peak_memory[s], min(P - s, M) * A) for s in range(P))
if M % P == 0:  # Megatron's rounds of g = p micro-batches
    assert close(inter.makespan, (M * V + P - 1) * (F + B) / V)
    assert close(inter.bubble_fraction, (P - 1) / (M * V + P - 1))
    assert close(bfs.makespan, inter.makespan)
if V >= 2:  # V = 1 is 1F1B itself
    g = M // max(1, M // P)
    for r in range(P):
        assert close(inter.peak_memory[r], min((V - 1) * g + 2 * (P - 1 - r) + 1, M * V) * A / V)
assert all(close(b, M * A) for b in bfs.peak_memory)  # every chunk keeps all m micro-batches
print(f"bubble: 1F1B {one.bubble_fraction:.1%} = (p-1)/(m+p-1), interleaved {inter.bubble_fraction:.1%} "
      f"= (p-1)/(mV+p-1); memory on device 0: {one.peak_memory[0] / A:g}A against {inter.peak_memory[0] / A:g}A")

# %% [markdown]
# ## 2. Zero bubble: splitting the backward
#
# The backward of a layer computes two things: the gradient with respect to its **input** (I),
# which the previous stage is waiting for, and the gradient with respect to its **weights** (W),
# which nobody waits for until the optimizer step. Qi et al. ("Zero Bubble Pipeline Parallelism",
# ICLR 2024, Figure 3) run I at once and put the Ws off into what would be idle time:
#
# - **ZB-H1**: 1F1B's order with each B split; a device puts off `s` Ws and runs them in the
#   drain. Same peak memory as 1F1B on device 0; the bubble drops from `(p-1)(F+B)` to
#   `(p-1)(F+I-W)`: a third of it when F = I = W.
# - **ZB-H2**: a longer warm-up (`2(p-1-s)+1` forwards) so that the Ws fill the drain entirely:
#   every device busy from its first compute to its last, the steady bubble `(p-1)(F+I-2W)` is 0
#   at F = I = W, for `2p-1` micro-batches on device 0.
#
# The Gantt charts colour F, I, W and B apart. Between its I and its W a micro-batch still holds
# `A_W` bytes, so the later devices, which put off more Ws, hold more than in 1F1B.

# %%
h1, h2 = run("zb-h1"), run("zb-h2")
table([one, h1, h2])
show(plot_compare([one, h1, h2]))

# %%
if W <= min(F, I):  # the Ws put off fit into the drain (docs/schedules.md, "Zero bubble: ZB-H1, ZB-H2, ZB-V")
    assert close(h1.makespan, M * (F + I + W) + (P - 1) * (F + I - W))
    assert close(h2.steady_step, M * (F + I + W) + (P - 1) * (F + I - 2 * W))
for s in range(P):  # peak bytes on device s (docs/schedules.md, "The memory of the split backward")
    assert close(h1.peak_memory[s], (P - s) * A + s * A_W)
    assert close(h2.peak_memory[s], (2 * P - 1 - 2 * s) * A + 2 * s * A_W)
print(f"idle per device in one step: 1F1B {(P - 1) * (F + B):g}, ZB-H1 {(P - 1) * (F + I - W):g} = (p-1)(F+I-W); "
      f"ZB-H2 steady step {h2.steady_step:g} = m(F+I+W) + (p-1)(F+I-2W)")
print(f"device 0 holds {h1.peak_memory[0] / A:g}A (ZB-H1) and {h2.peak_memory[0] / A:g}A (ZB-H2, 2p-1)")

# %% [markdown]
# ## 3. V shapes: ZB-V and DualPipeV
#
# Both cut the model into `2p` chunks and place them as a V: device `r` holds stages `r` and
# `2p-1-r`, so device 0 holds the first *and* the last stage. A micro-batch goes down the devices
# and comes back up; the hand-over in the middle stays on device `p-1`, and device 0 starts the
# backward of a micro-batch as soon as it has run its last stage.
#
# - **ZB-V** (Qi et al. 2024, "Pipeline Parallelism with Controllable Memory"): the zero-bubble
#   split on the V. With F = I = W, zero steady bubble at 1F1B's memory, `pA` on **every** device
#   (`2p` chunks of `A/2`): the same peak as 1F1B's first device, spread evenly.
# - **DualPipeV** (DeepSeek-V3, the "cut in half" DualPipe): pairs the forward of one chunk with
#   the backward of the other to hide expert-parallel communication under compute. Without that
#   communication a pair is just F then B; it holds `(2p+1)A/2`, half a micro-batch more than ZB-V.

# %%
zbv, dpv = run("zbv"), run("dualpipev")
table([one, h1, zbv, dpv])
show(plot_compare([one, zbv, dpv]))

# %%
for s in range(P):  # memory follows from the order alone, whatever the times
    assert close(zbv.peak_memory[s], P * A)
    assert close(dpv.peak_memory[s], (2 * P + 1) * A / 2)
if F == I == W:  # the papers' closed forms, in chunk time t = F/2 (docs/schedules.md, "Zero bubble: ZB-H1, ZB-H2, ZB-V")
    t = F / 2
    assert close(zbv.steady_step, 6 * M * t) and close(zbv.steady_bubble_fraction, 0)
    assert close(zbv.makespan, 6 * M * t + (P - 1) * t)
    assert close(dpv.makespan, 6 * M * t + (P - 1) * t)
print(f"ZB-V: steady bubble {zbv.steady_bubble_fraction:.1%} with {max(zbv.peak_memory) / A:g}A on every device; "
      f"DualPipeV: {dpv.steady_bubble_fraction:.1%} with {max(dpv.peak_memory) / A:g}A")

# %% [markdown]
# ## 4. The bubble/memory trade-off
#
# One point per schedule: the bubble of one step across, the peak activation memory of the busiest
# device up. The grey line from each point goes left to the steady bubble, what the schedule
# achieves when steps follow each other without a flush. Added here: 1F1B with at most `p/2`
# micro-batches in flight (`max_active`, SageMaker's `active_microbatches`), and the paper's
# automatic scheduler `zb-auto` at its two memory limits, `pA` (ZB-1p) and `2pA` (ZB-2p).
# Labels of points that coincide are merged.

# %%
from matplotlib.transforms import Bbox
from matplotlib.ticker import PercentFormatter

zb_costs = model_costs()
cap = max(1, P // 2)
trade = {
    "gpipe": run("gpipe"), "1f1b": one, f"1f1b max_active={cap}": run("1f1b", max_active=cap),
    label(inter): inter, label(bfs): bfs, "zb-h1": h1, "zb-h2": h2, "zbv": zbv, "dualpipev": dpv,
    "zb-auto (ZB-1p)": run("zb-auto", costs=zb_costs, memory_limit=P * A),
    "zb-auto (ZB-2p)": run("zb-auto", costs=zb_costs, memory_limit=2 * P * A),
}
family = {"gpipe": "textbook", "1f1b": "textbook", "interleaved": "interleaved", "looped": "interleaved",
          "zb-h": "zero bubble", "zbv": "V shape", "dualpipev": "V shape", "zb-auto": "automatic"}
colours = {"textbook": "tab:grey", "interleaved": "tab:blue", "zero bubble": "tab:orange",
           "V shape": "tab:green", "automatic": "tab:purple"}


def place_labels(ax, points, texts, fontsize=9):
    """Write texts[k] next to points[k] (data coordinates), inside the axes, overlapping no other
    label, point or line; points within 3 pixels of each other share one label."""
    fig = ax.figure
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    taken = [line.get_window_extent(renderer) for line in ax.lines]  # whiskers and their points
    groups = []  # [x, y, texts] in pixels
    for (x, y), text in zip(ax.transData.transform(points), texts):
        near = [g for g in groups if abs(g[0] - x) < 3 and abs(g[1] - y) < 3]
        near[0][2].append(text) if near else groups.append([x, y, [text]])
    steps = [(dx * r, dy * r) for r in (6, 14, 26) for dx, dy in
             ((1, 0), (-1, 0), (0, 1), (0, -1), (1, 1), (-1, 1), (1, -1), (-1, -1))]
    for x, y, group in groups:
        for dx, dy in steps:
            text = ax.annotate(", ".join(group), ax.transData.inverted().transform((x, y)), xytext=(dx, dy),
                               textcoords="offset points", fontsize=fontsize,
                               ha={1: "left", -1: "right", 0: "center"}[(dx > 0) - (dx < 0)],
                               va={1: "bottom", -1: "top", 0: "center"}[(dy > 0) - (dy < 0)])
            box = text.get_window_extent(renderer).padded(2)
            inside = frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1
            if inside and not any(box.overlaps(other) for other in taken):
                taken.append(box)
                break
            text.remove()
        else:
            raise RuntimeError(f"no room for the label {group}: widen the figure or its margins")


fig, ax = plt.subplots(figsize=(9, 5.5))
for name, r in trade.items():
    y = max(r.peak_memory) / GiB
    kind = next(v for k, v in family.items() if name.startswith(k))
    ax.plot([r.steady_bubble_fraction, r.bubble_fraction], [y, y], "-", color="grey", lw=1, zorder=1)
    ring = kind == "automatic"  # a ring, so that a schedule it coincides with shows through
    ax.plot(r.bubble_fraction, y, "o", ms=13 if ring else 8, color=colours[kind], mfc="none" if ring else None,
            mew=2 if ring else 1, zorder=3 if ring else 2,
            label=kind if kind not in ax.get_legend_handles_labels()[1] else None)
ax.set(xlabel="bubble of one step (the line goes left to the steady bubble)",
       ylabel="peak activation memory, busiest device (GiB)",
       title=f"{P} devices, {M} micro-batches, F:I:W = {F:g}:{I:g}:{W:g}, GPT-3 6.7B activations")
ax.xaxis.set_major_formatter(PercentFormatter(1.0))
right = max(r.bubble_fraction for r in trade.values())
ax.set_xlim(-0.06 * right, 1.3 * right)
ax.margins(y=0.15)
ax.grid(alpha=0.3)
ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), title="family")
fig.tight_layout()
place_labels(ax, [(r.bubble_fraction, max(r.peak_memory) / GiB) for r in trade.values()], list(trade))
plt.show()
table(trade.values(), list(trade))

# %%
# zb-auto is never worse than ZB-H1 at the same limit, and more memory never makes it slower
assert trade["zb-auto (ZB-1p)"].makespan <= h1.makespan + 1e-9
assert trade["zb-auto (ZB-2p)"].makespan <= trade["zb-auto (ZB-1p)"].makespan + 1e-9
assert max(trade["zb-auto (ZB-1p)"].peak_memory) <= P * A + 1e-6
assert max(trade[f"1f1b max_active={cap}"].peak_memory) <= cap * A + 1e-6

# %% [markdown]
# **Reading the figure.** Down and to the left is better. GPipe and looped BFS pay for their bubble
# with `m` micro-batches of memory. Interleaving shrinks the bubble by `V` for a little more memory
# (and `V` times the transfers, free here). ZB-H1 cuts the bubble at 1F1B's memory; ZB-H2 and
# ZB-2p remove it for about twice the memory; ZB-V removes it at 1F1B's memory, which is why it is
# the default choice where its V placement is possible. Capping the micro-batches in flight goes
# the other way: less memory, more bubble.

# %% [markdown]
# ## 5. Explore
#
# `explore` draws 1F1B and a schedule of your choice for any `p`, `m`, `V` (for the interleaved
# and looped schedules) and F:I:W, with the peak memory of each device in GiB for the model above.
# A size a schedule refuses (ZB-H2 needs `m ≥ 2p-1`, DualPipeV `m ≥ 2p`) prints its one-line
# reason. With `ipywidgets` installed (`pip install -e ".[notebooks]"`), sliders appear above the
# figure and redraw it; without them, or in a headless run, the figure for the parameters at the
# top is all you get.

# %%
def explore(schedule="zbv", p=P, m=M, v=V, f=F, i=I, w=W):
    options = {"costs": model_costs(p, 1, f, i, w)} if schedule == "zb-auto" else {}
    try:
        rs = [run("1f1b", p, m, f=f, i=i, w=w),
              run(schedule, p, m, v if schedule in LOOPED else None, f=f, i=i, w=w, **options)]
    except sim.ScheduleError as e:
        print(e)
        return
    table(rs)
    show(plot_compare(rs))


# sliders that redraw it, first with the parameters at the top; without ipywidgets, that one figure
ratio = {"low": 0.25, "high": 3.0, "step": 0.25}
sliders(explore, schedule=Choice("zbv", [n for n in sim.SCHEDULES if n != "naive"]),
        p=Int(P, 2, 8), m=Int(M, 1, 32), v=Int(V, 1, 4), f=Float(F, **ratio), i=Float(I, **ratio), w=Float(W, **ratio))

# %% [markdown]
# ## 6. A real run on 2 CPU ranks
#
# `exec` runs the very same schedule objects on real processes (notebook 3). Here the schedule puts
# two model stages on each rank: `REAL_RANKS` processes, `2 × REAL_RANKS` stages of a small MLP.
# With `calibrate=1` the ranks measure, in the same processes and minute, the `Costs` the simulator
# needs; `compare` simulates the schedule under them. The gradients must equal single-process
# training, and the memory must match the simulation to the byte; the time is as good as the
# costs on a shared CPU (notebook 3 explains the difference).

# %%
import time

import torch  # exec needs it: pip install -e ".[exec]"
from exec import ModelSpec, compare, run_pipeline

spec = ModelSpec(model="mlp", layers=REAL_LAYERS, hidden=REAL_HIDDEN, batch_size=REAL_BATCH)
real_schedule = sim.make_schedule(REAL_SCHEDULE, REAL_RANKS, REAL_MICRO)
assert real_schedule.stages == 2 * REAL_RANKS, "two model stages on each rank"
t = time.perf_counter()
real = run_pipeline(spec, real_schedule, steps=3, warmup=1, calibrate=1)
print(f"{REAL_SCHEDULE}: {real_schedule.stages} stages on {REAL_RANKS} ranks, ran in {time.perf_counter() - t:.1f} s; "
      f"gradients match single-process training: {real.grad_match} (largest difference {real.max_grad_diff:.1e})")
assert real.grad_match, "the pipelined gradients differ from single-process training"
cmp = compare(real.result, real.costs, grad_match=real.grad_match)
print(cmp.table())
show(plot_overlay(cmp.simulated, cmp.measured))
assert cmp.measured.peak_activations == cmp.simulated.peak_activations  # memory follows the order exactly,
assert cmp.measured.peak_memory == cmp.simulated.peak_memory            # to the byte

# %% [markdown]
# ## 7. Is it worth it? Llama 2 70B on 256 H100s
#
# The sections above price schedules in units of `F` and `A`. Whether one is worth its price
# depends on a real model's numbers: how much memory the GPU has left after the weights, what
# recompute costs, and how big W is next to I. The planner's estimate (`sim.estimate`, notebook 5)
# times every layer of a real model on a real GPU and simulates the step, so we can ask it. The
# layout: Llama 2 70B on 256 H100-80GB (32 nodes), tensor parallel 2 with sequence parallelism,
# 8 pipeline devices, 16 replicas with ZeRO-1, one sequence of 4096 tokens per micro-batch and
# 16 micro-batches per replica (`m = 2p`: the regime where the bubble matters). The same layout,
# seven schedules, three recompute settings:

# %%
REAL_MODEL, REAL_GPU = "llama2-70b", "h100-80gb"
LAYOUT = dict(tp=2, pp=8, dp=16, micro_batch=1, global_batch=256, sequence_parallel=True, zero=1)
CONTENDERS = ["1f1b", "interleaved-1f1b", "zb-h1", "zbv", "v-half", "v-min", "dualpipev"]
RECOMPUTE = ["none", "selective", "full"]

grid = {(name, rc): sim.estimate(REAL_MODEL, REAL_GPU, schedule=name, recompute=rc, **LAYOUT)
        for rc in RECOMPUTE for name in CONTENDERS}
usable = grid["1f1b", "none"].usable_memory  # the 80 GiB less the headroom kept for CUDA, NCCL, fragmentation
print(f"{'schedule':17s}" + "".join(f"{rc:>24s}" for rc in RECOMPUTE) + "    (step s, peak GiB of the busiest device)")
for name in CONTENDERS:
    cells = [grid[name, rc] for rc in RECOMPUTE]
    print(f"{name:17s}" + "".join(f"{e.step_time:10.2f} s {max(e.peak_memory) / GiB:5.1f} GiB {'  ' if e.fits else ' x'}"
                                  for e in cells))
print(f"x: does not fit the {usable / GiB:.1f} GiB usable of an 80 GiB H100")

# %% [markdown]
# **Memory.** The grid says which schedule wins for each amount of memory: the fastest
# (schedule, recompute) whose peak fits. Going down the budgets (as if the weights or a longer
# sequence took more of the GPU):

# %%
def fastest(budget):
    fits = [(e.step_time, key) for key, e in grid.items() if max(e.peak_memory) <= budget]
    return min(fits) if fits else (None, None)


budgets = [usable] + [b * GiB for b in (68, 54, 45, 34)]
winners = {}
for budget in budgets:
    step, key = fastest(budget)
    winners[round(budget / GiB)] = key
    print(f"up to {budget / GiB:4.1f} GiB: {key[0]:17s} recompute {key[1]:9s} {step:5.2f} s "
          f"({step / grid['1f1b', 'none'].step_time - 1:+.0%} against 1F1B without recompute)")

# %% [markdown]
# **W's size.** The zero-bubble schedules fill the bubble with Ws, so they gain as much as there
# is W to move. The estimate's own chunk times (read off its simulated step) give W's share of the
# backward for this model: large without recompute, smaller with full recompute, whose I also
# recomputes the forward. Holding F and the whole backward `I + W` fixed and moving the share, on
# the same 8 devices and 16 micro-batches (communication free, as in sections 1 to 4):

# %%
def chunk_times(e):
    """F, I, W of one chunk in the middle of the pipeline, read off the estimate's simulated step."""
    middle = e.result.schedule.stages // 2 - 1
    seen = {ev.action.kind.name: ev.end - ev.start for ev in e.result.compute_events() if ev.action.stage == middle}
    return seen["F"], seen["I"], seen["W"]


def w_share(e):
    f, i, w = chunk_times(e)
    return w / (i + w)


f0, i0, w0 = chunk_times(grid["zbv", "none"])
shares = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
pipe = LAYOUT["pp"], LAYOUT["global_batch"] // LAYOUT["dp"]  # (p, m)
relative = {}
for name in CONTENDERS:
    schedule = sim.make_schedule(name, *pipe)
    v = schedule.stages // pipe[0]
    times = []
    for share in shares:  # a device's F, and its backward split share : 1 - share, over v chunks
        f, b = 2 * f0, 2 * (i0 + w0)
        costs = sim.Costs(forward=f / v, backward=b / v, backward_input=(1 - share) * b / v,
                          backward_weight=share * b / v, transport="ideal")
        times.append(sim.simulate(schedule, costs).makespan)
    relative[name] = times
relative = {name: [t / one_t for t, one_t in zip(ts, relative["1f1b"])] for name, ts in relative.items()}

fig, ax = plt.subplots(figsize=(8, 4.5))
for name, ys in relative.items():
    ax.plot(shares, ys, "o-", label=name)
for rc, style in (("none", "--"), ("full", ":")):
    ax.axvline(w_share(grid["zbv", rc]), color="grey", ls=style, label=f"this model's W share, recompute {rc}")
ax.set(xlabel="W's share of the backward, W / (I + W)", ylabel="pipeline time / 1F1B's",
       title=f"{REAL_MODEL}, p={pipe[0]}, m={pipe[1]}: who gains from W")
ax.xaxis.set_major_formatter(PercentFormatter(1.0))
ax.grid(alpha=0.3)
ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
fig.tight_layout()
plt.show()
best = {share: min(CONTENDERS, key=lambda n: relative[n][k]) for k, share in enumerate(shares)}
print("fastest at each W share:", ", ".join(f"{s:.0%} {n}" for s, n in best.items()))
print(f"this model: W is {w_share(grid['zbv', 'none']):.0%} of the backward without recompute, "
      f"{w_share(grid['zbv', 'full']):.0%} with full recompute")

# %%
# the conclusions below, checked: if the planner's numbers move, this cell says which claim broke
e = {key: (g.step_time, max(g.peak_memory)) for key, g in grid.items()}
assert winners[round(usable / GiB)] == ("zbv", "none") and not grid["dualpipev", "none"].fits
assert not grid["interleaved-1f1b", "none"].fits and e["zbv", "none"][0] < e["interleaved-1f1b", "none"][0]
assert winners[68] == ("v-half", "none") and winners[54] == ("v-min", "none")
assert winners[45] == ("interleaved-1f1b", "full") and winners[34] == ("1f1b", "full")
assert e["v-min", "none"][0] < min(e[n, "full"][0] for n in CONTENDERS)     # V-Min beats any full recompute
for name in ("zb-h1", "zbv"):  # full recompute saves the zero-bubble schedules little memory ...
    assert e[name, "full"][1] > 0.9 * e[name, "none"][1]
assert e["1f1b", "full"][1] < 0.5 * e["1f1b", "none"][1]                    # ... and 1F1B half of it
assert all(abs(e[n, "selective"][1] / e[n, "none"][1] - 1) < 0.01 for n in CONTENDERS)  # selective: next to nothing
assert best[0.0] == best[0.1] == "interleaved-1f1b" and best[0.3] == best[0.4] == "zbv" and best[0.6] == "dualpipev"
assert relative["v-min"][shares.index(0.4)] > 1 > relative["v-min"][shares.index(0.5)]
assert relative["v-half"][shares.index(0.1)] > 1 > relative["v-half"][shares.index(0.2)]
gain = {n: 1 - e[n, "none"][0] / e["1f1b", "none"][0] for n in CONTENDERS}
assert 0.5 < gain["zb-h1"] / gain["zbv"] < 0.7 and abs(gain["v-min"]) < 0.05 and 0.2 < gain["zbv"] < 0.3
assert 0.4 < w_share(grid["zbv", "none"]) < 0.5 and 0.25 < w_share(grid["zbv", "full"]) < 0.35

# %% [markdown]
# **What the numbers say**, for this model and cluster (the cell above asserts each claim):
#
# - **With memory to spare, ZB-V.** In the 71.7 GiB an H100-80GB leaves after its headroom, ZB-V
#   without recompute is the fastest layout, about a quarter faster than 1F1B, at 1F1B's memory.
#   DualPipeV is as fast but holds half a micro-batch more and misses the headroom; interleaved
#   1F1B would be slower and needs more than the GPU has. ZB-H1, where the V placement is not
#   possible, gains about 60% of what ZB-V gains over 1F1B, at the same memory.
# - **Memory tight: V-Half, then V-Min, before any recompute.** A few GiB less and ZB-V no longer
#   fits; V-Half (half of 1F1B's activations) is then the fastest, and below it V-Min (a third).
#   V-Min, at about 1F1B's speed, still beats every schedule with full recompute: the
#   controllable-memory schedules are worth it exactly where the alternative is recompute.
# - **Recompute.** Selective recompute changes nothing here (the attention is fused: no s² scores
#   to drop). Full recompute halves 1F1B's memory but saves the zero-bubble schedules almost
#   nothing: what W needs (the inputs of the weight matmuls) is restored in I and kept until the
#   W that was put off. When only full recompute fits, the schedule to pair it with is interleaved
#   1F1B, and at the tightest budget plain 1F1B.
# - **W's size.** With W under a tenth of the backward there is nothing to fill the bubble with
#   and interleaved 1F1B wins; from about a fifth ZB-V does, and DualPipeV ties it or edges it
#   once W reaches half. V-Half breaks even with 1F1B at about a fifth, V-Min only from about
#   45%. This model's W, about 44% of the backward without recompute and 29% with full
#   recompute, is in ZB-V's range either way.
#
# What this leaves out: DualPipeV's real reason, hiding expert-parallel all-to-all under its F&B
# pairs, has no all-to-all to hide in a dense model; and torch's runtime holds a split-backward
# micro-batch until W (docs/schedules.md, "Memory beside torch's"), which raises ZB-H1's and
# interleaved zero bubble's memory above what is counted here.

# %% [markdown]
# ## Summary
#
# - Interleaving divides 1F1B's idle time by `V` for `V` times the transfers and a little more
#   memory on the first device.
# - Splitting the backward into I and W lets the Ws fill the bubble: ZB-H1 at 1F1B's memory,
#   ZB-H2 with no steady bubble for about twice the memory.
# - The V shapes put the first and last stage on one device: ZB-V has no steady bubble at 1F1B's
#   peak memory, spread evenly over the devices; DualPipeV holds half a micro-batch more, and
#   pays off where its F&B pairs hide expert-parallel communication.
# - Whether a schedule is worth it depends on the model and the GPU: for Llama 2 70B on H100s,
#   ZB-V where memory allows, V-Half and then V-Min before any recompute, interleaved 1F1B with
#   full recompute when memory is tightest, and W's share of the backward decides how much the
#   zero-bubble schedules gain.
# - The bubble of one step and the steady bubble differ by the fill: for schedules that run back to
#   back without a flush, the steady one is what you get.
#
# More in [docs/schedules.md](../docs/schedules.md): [zero bubble](../docs/schedules.md#zero-bubble-zb-h1-zb-h2-zb-v)
# and [zb-auto](../docs/schedules.md#zb-auto-the-automatic-zero-bubble-scheduler).
