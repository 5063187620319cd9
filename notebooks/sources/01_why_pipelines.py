# %% [markdown]
# # 1. Why pipelines: naive model parallelism, GPipe and 1F1B
#
# A model too large for one device is cut into **stages**: the first layers on device 0, the next
# ones on device 1, and so on. This notebook shows, with the simulator `sim` alone (a few seconds
# on a laptop), why cutting the model is not enough and what pipelining buys:
#
# 1. the three schedules on Gantt charts: naive model parallelism, GPipe, 1F1B;
# 2. where the **bubble**, the share of time the devices sit idle, comes from, and its closed
#    form `(p-1)/(m+p-1)`;
# 3. the bubble over many stage counts `p` and micro-batch counts `m`, against the simulator;
# 4. what communication latency does to it;
# 5. what one slow stage does to it;
# 6. an `explore` cell to try your own `p`, `m`, latency and slow stage.
#
# Change the parameters in the next cell and run all cells again (*Run > Run All Cells*).

# %%
# Parameters: change them and run all cells again
P = 4              # pipeline stages (= devices, one stage on each)
M = 8              # micro-batches per training step
FORWARD = 1.0      # time of one micro-batch's forward on one stage (any unit)
BACKWARD = 2.0     # time of its backward: about twice the forward in real models
LATENCY = 0.25     # delay of every transfer between two stages (section 4)
SLOW_STAGE = 1     # the stage that is slower than the others (section 5)
SLOW_FACTOR = 1.5  # ... and by how much
SWEEP_P = [2, 4, 8]            # stage counts of the bubble sweep (section 3)
SWEEP_M = list(range(1, 33))   # micro-batch counts of the bubble sweep

# %%
# %matplotlib inline
import matplotlib.pyplot as plt
from nbhelp import Float, Int, show, sliders  # notebooks/nbhelp.py, first: it finds an uninstalled sim

import sim
from sim.plot import plot_compare
from sim.plot.cli import format_table

# %% [markdown]
# ## 1. Three schedules on one time axis
#
# Each row below is a device; a blue bar is the forward (F) of one micro-batch, an orange bar its
# backward (B), the number on the bar is the micro-batch. The light grey track that shows through
# is time the device sits **idle**.
#
# - **naive** model parallelism sends micro-batch 0 forward through every stage and back, and only
#   then starts micro-batch 1. Exactly one device computes at any moment.
# - **GPipe** lets the micro-batches follow each other: while device 1 runs the forward of
#   micro-batch 0, device 0 already runs micro-batch 1. All forwards first, then all backwards.
# - **1F1B** (PipeDream-Flush, used by Megatron-LM) starts each backward as early as it can and
#   then alternates one forward, one backward.

# %%
costs = sim.Costs(forward=FORWARD, backward=BACKWARD)
results = {name: sim.simulate(sim.make_schedule(name, P, M), costs) for name in ("naive", "gpipe", "1f1b")}
print(format_table(results.values()))
show(plot_compare(list(results.values()), shared_time=True))

# %% [markdown]
# ## 2. Where the bubble comes from, and its closed form
#
# The **bubble fraction** is the idle share of device-time: `1 - busy / (p * makespan)`.
#
# *Naive.* Every micro-batch takes `p(F+B)` from its first forward to its last backward, and they run
# one after the other: the step lasts `m·p(F+B)`. Each device computes `m(F+B)` of it, so it idles
# `(p-1)/p` of the step: 75% with 4 devices. Adding devices adds memory, not speed.
#
# *GPipe and 1F1B.* Each device still computes `m(F+B)`, but now the step lasts only
# `(m+p-1)(F+B)`: the last micro-batch reaches the last stage `p-1` forward-slots after the
# first one (the **fill**, the triangle at the top left), and its gradient needs `p-1`
# backward-slots to travel back to stage 0 (the **drain**, at the end). Every device idles
# `(p-1)(F+B)` in total, so
#
# $$\text{bubble} = \frac{(p-1)(F+B)}{(m+p-1)(F+B)} = \frac{p-1}{m+p-1}.$$
#
# It depends only on `p` and `m`, not on `F` and `B`. 1F1B reorders the same work inside the same
# fill and drain, so its bubble is the same; what it saves is memory (notebook 2).
#
# The cell below checks these formulas against the simulator: if the simulator ever drifts from
# them, this notebook fails here.

# %%
T = FORWARD + BACKWARD
naive, gpipe, one_f_one_b = results["naive"], results["gpipe"], results["1f1b"]
assert abs(naive.makespan - M * P * T) < 1e-9
assert abs(naive.bubble_fraction - (P - 1) / P) < 1e-12
for r in (gpipe, one_f_one_b):
    assert abs(r.makespan - (M + P - 1) * T) < 1e-9
    assert abs(r.bubble_fraction - (P - 1) / (M + P - 1)) < 1e-12
print(f"naive:      makespan {naive.makespan:g} = m*p*(F+B),     bubble {naive.bubble_fraction:.1%} = (p-1)/p")
print(f"GPipe/1F1B: makespan {gpipe.makespan:g} = (m+p-1)*(F+B), bubble {gpipe.bubble_fraction:.1%} = (p-1)/(m+p-1)")
print(f"speed-up of pipelining over naive: {naive.makespan / gpipe.makespan:.2f}x")

# %% [markdown]
# ## 3. The bubble over `p` and `m`
#
# Lines are the closed form, dots the simulator, for GPipe and 1F1B (they coincide), dotted
# horizontal lines naive model parallelism's `(p-1)/p`. The sweep runs a few hundred simulations
# and asserts every one against the formula.

# %%
import math
from matplotlib.ticker import PercentFormatter

fig, ax = plt.subplots(figsize=(8, 4.5))
for p in SWEEP_P:
    simulated = []
    for m in SWEEP_M:
        for name in ("gpipe", "1f1b"):
            r = sim.simulate(sim.make_schedule(name, p, m), costs)
            assert abs(r.bubble_fraction - (p - 1) / (m + p - 1)) < 1e-12, (name, p, m)
        simulated.append(r.bubble_fraction)
    line, = ax.plot(SWEEP_M, [(p - 1) / (m + p - 1) for m in SWEEP_M], label=f"p={p}: (p-1)/(m+p-1)")
    ax.plot(SWEEP_M, simulated, "o", ms=3.5, color=line.get_color(), label=f"p={p}: simulated")
    ax.axhline((p - 1) / p, color=line.get_color(), ls=":", lw=1)
ax.set(xlabel="micro-batches m", ylabel="bubble (idle share of device-time)", ylim=(0, 1),
       title="Bubble of GPipe and 1F1B; dotted: naive model parallelism")
ax.yaxis.set_major_formatter(PercentFormatter(1.0))
ax.grid(alpha=0.3)
ax.legend(ncol=2, fontsize=8)
plt.show()

for p in SWEEP_P:
    # (p-1)/(m+p-1) <= 10%  <=>  m >= 9(p-1)
    print(f"p={p}: bubble {(p - 1) / (4 * p + p - 1):.0%} at m=4p={4 * p}; m >= {9 * (p - 1)} for a bubble <= 10%")

# %% [markdown]
# **What to take away.** The bubble falls like `1/m`: about `(p-1)/m` once `m` is large. A rule of
# thumb is `m ≥ 4p`, which keeps the bubble under 20%. Deeper pipelines need proportionally more
# micro-batches. But the micro-batches cut one batch: more of them means smaller ones, which use a
# device less efficiently, and GPipe must keep the activations of all of them (notebook 2).

# %% [markdown]
# ## 4. Communication latency
#
# Every activation sent forward and every gradient sent back crosses a link and arrives `L` later
# (`Costs.latency`). Where does that show?
#
# - **GPipe** pays it in the fill and the drain: each crosses `p-1` links, so the step grows by
#   `2(p-1)L`. During the long runs of forwards and backwards the latency is hidden: each receive
#   is posted one compute ahead (rule 3 of [docs/rules.md](../docs/rules.md)), so a transfer
#   shorter than a compute arrives before it is needed. That holds while `L ≤ F`; beyond it the
#   transfers cannot keep up and the pipeline runs at the pace of the links.
# - **1F1B** also pays it in its steady state: a stage alternates forward and backward, and each
#   backward waits for a gradient that has just crossed a link from the next stage, whose own
#   forward waited for an activation crossing the other way. The latency sits on the critical path
#   again and again, so its cost grows with `m`.

# %%
lat_costs = sim.Costs(forward=FORWARD, backward=BACKWARD, latency=LATENCY)
lat = [sim.simulate(sim.make_schedule(name, P, M), lat_costs) for name in ("gpipe", "1f1b")]
show(plot_compare(lat))
if LATENCY <= FORWARD:
    assert abs(lat[0].makespan - ((M + P - 1) * T + 2 * (P - 1) * LATENCY)) < 1e-9
for r in lat:
    print(f"{r.schedule.name:5s}: makespan {r.makespan:.3g} (without latency {(M + P - 1) * T:g}), "
          f"bubble {r.bubble_fraction:.1%}")

# %%
latencies = [FORWARD * k / 20 for k in range(41)]   # 0 .. 2F
fig, ax = plt.subplots(figsize=(8, 4))
for name in ("gpipe", "1f1b"):
    spans = [sim.simulate(sim.make_schedule(name, P, M), sim.Costs(forward=FORWARD, backward=BACKWARD, latency=L)).makespan
             for L in latencies]
    ax.plot(latencies, spans, "o-", ms=3, label=f"{name}: simulated")
ax.plot(latencies, [(M + P - 1) * T + 2 * (P - 1) * L for L in latencies], "k--", lw=1,
        label="(m+p-1)(F+B) + 2(p-1)L")
ax.axvline(FORWARD, color="grey", ls=":", lw=1)
ax.annotate("L = F", (FORWARD, ax.get_ylim()[0]), xytext=(4, 6), textcoords="offset points", color="grey")
ax.set(xlabel="latency L of every transfer", ylabel="makespan", title=f"Latency, p={P}, m={M}")
ax.grid(alpha=0.3)
ax.legend()
plt.show()

# %% [markdown]
# GPipe follows the dashed line until `L = F`, then the links set the pace. 1F1B, the schedule
# everybody uses for its memory, is the one that suffers most from latency. This is why real
# systems overlap communication with compute, and why a micro-batch should be large enough that its
# compute dwarfs the latency of a transfer.

# %% [markdown]
# ## 5. Uneven stages: the slowest stage sets the pace
#
# Stages rarely cost the same: an embedding or a loss head is heavier than a transformer block, and
# layers do not always divide evenly. A pipeline is an assembly line: in the steady state the
# micro-batches leave at the pace of the **slowest** stage, and the faster stages wait for it.
#
# For GPipe this is exact (it is a flow shop with identical jobs): with `t_s = F_s + B_s`,
#
# $$\text{makespan} = \sum_s t_s + (m-1)\max_s t_s .$$
#
# For any schedule the slow stage alone computes for `m·max t_s`, a lower bound on the step.

# %%
forward = [FORWARD] * P
backward = [BACKWARD] * P
forward[SLOW_STAGE] *= SLOW_FACTOR
backward[SLOW_STAGE] *= SLOW_FACTOR
uneven_costs = sim.Costs(forward=forward, backward=backward)
uneven = [sim.simulate(sim.make_schedule(name, P, M), uneven_costs) for name in ("gpipe", "1f1b")]
show(plot_compare(uneven))

t = [f + b for f, b in zip(forward, backward)]
assert abs(uneven[0].makespan - (sum(t) + (M - 1) * max(t))) < 1e-9
balanced = (M + P - 1) * sum(t) / P   # the same total work spread evenly over the stages
for r in uneven:
    assert r.makespan >= M * max(t) - 1e-9
    print(f"{r.schedule.name:5s}: makespan {r.makespan:.3g}, bubble {r.bubble_fraction:.1%}, "
          f"busy per device {[round(b, 2) for b in r.busy()]}")
print(f"the same work balanced over the stages would take {balanced:.3g}")

# %%
factors = [1 + k / 10 for k in range(21)]   # the slow stage 1x .. 3x slower
fig, ax = plt.subplots(figsize=(8, 4))
for name in ("gpipe", "1f1b"):
    bubbles = []
    for f in factors:
        fw, bw = [FORWARD] * P, [BACKWARD] * P
        fw[SLOW_STAGE] *= f
        bw[SLOW_STAGE] *= f
        bubbles.append(sim.simulate(sim.make_schedule(name, P, M), sim.Costs(forward=fw, backward=bw)).bubble_fraction)
    ax.plot(factors, bubbles, "o-", ms=3, label=f"{name}: simulated")
# GPipe's closed form: work m*sum(t) over p devices for sum(t) + (m-1)*max(t)
closed = []
for f in factors:
    ts = [FORWARD + BACKWARD] * P
    ts[SLOW_STAGE] *= f
    closed.append(1 - M * sum(ts) / (P * (sum(ts) + (M - 1) * max(ts))))
ax.plot(factors, closed, "k--", lw=1, label="GPipe, closed form")
ax.set(xlabel=f"stage {SLOW_STAGE} is this many times slower", ylabel="bubble", ylim=(0, 1),
       title=f"One slow stage, p={P}, m={M}")
ax.yaxis.set_major_formatter(PercentFormatter(1.0))
ax.grid(alpha=0.3)
ax.legend()
plt.show()

# %% [markdown]
# The bubble grows although the devices have *more* work: the fast stages idle while they wait for
# the slow one. Balancing the stages (cutting the model by measured time rather than by layer count,
# as `exec.models.spec.ModelSpec.partition(..., balance="time")` does) is as important as choosing `m`.
# 1F1B suffers a little less than GPipe when the slow stage is early in the pipeline, since its
# backwards start before all forwards are done.

# %% [markdown]
# ## 6. Explore
#
# `explore` draws the three schedules for any `p`, `m`, latency and slow-stage factor and prints
# their bubble next to the closed form for free, even stages. With `ipywidgets` installed
# (`pip install -e ".[notebooks]"`), sliders appear above the figure and redraw it; without them, or in
# a headless run, the figure for the parameters at the top is all you get.

# %%
def explore(p=P, m=M, latency=LATENCY, slow_factor=SLOW_FACTOR):
    fw, bw = [FORWARD] * p, [BACKWARD] * p
    fw[min(SLOW_STAGE, p - 1)] *= slow_factor
    bw[min(SLOW_STAGE, p - 1)] *= slow_factor
    c = sim.Costs(forward=fw, backward=bw, latency=latency)
    rs = [sim.simulate(sim.make_schedule(name, p, m), c) for name in ("naive", "gpipe", "1f1b")]
    print(format_table(rs))
    print(f"closed form for even stages and no latency: bubble {(p - 1) / (m + p - 1):.1%} (naive {(p - 1) / p:.1%})")
    show(plot_compare(rs))


# sliders that redraw it, first with the parameters at the top; without ipywidgets, that one figure
sliders(explore, p=Int(P, 1, 8), m=Int(M, 1, 32), latency=Float(LATENCY, 0.0, 2 * FORWARD, 0.05),
        slow_factor=Float(SLOW_FACTOR, 1.0, 3.0, 0.1))

# %% [markdown]
# ## Summary
#
# - Cutting a model into `p` stages without pipelining leaves each device idle `(p-1)/p` of the time.
# - Splitting the batch into `m` micro-batches lets the stages work at once: the bubble falls to
#   `(p-1)/(m+p-1)` for both GPipe and 1F1B.
# - Latency is paid in the fill and drain by GPipe, and throughout the steady state by 1F1B.
# - The slowest stage sets the pace: balance the stages.
#
# Next: [02_memory.ipynb](02_memory.ipynb), where GPipe and 1F1B differ.
