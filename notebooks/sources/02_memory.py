# %% [markdown]
# # 2. Memory: what each stage holds, and for how long
#
# To compute the backward of a micro-batch, a stage needs the activations its forward produced. So a
# stage **holds a micro-batch's activations from the start of its forward to the end of its
# backward** (rule 7 of [docs/rules.md](../docs/rules.md)). GPipe and 1F1B have the same bubble
# (notebook 1) but very different memory, and this notebook shows why:
#
# 1. activations held over time on each stage: GPipe holds `m` micro-batches, 1F1B at most `p-s`
#    on stage `s`;
# 2. peak memory against the number of micro-batches;
# 3. the trade-off: more micro-batches shrink the bubble, but GPipe must hold them all;
# 4. the same in bytes, for a fixed micro-batch size and for a fixed global batch.
#
# Only the simulator is used; the notebook runs in seconds.

# %%
# Parameters: change them and run all cells again
P = 4        # pipeline stages
M = 8        # micro-batches per step
SWEEP_M = list(range(1, 33))   # micro-batch counts for the sweeps

# section 4, in bytes (per stage; a made-up but plausible model)
GiB = 2**30
STATIC_GIB = 6.0           # weights + gradients + optimizer state of one stage
ACT_GIB_PER_SAMPLE = 0.5   # activations one stage keeps for one sample until its backward
MICRO_SIZE = 2             # samples per micro-batch (view A: the batch grows with m)
BATCH = 32                 # samples per step (view B: the batch is cut into m micro-batches)
DEVICE_GIB = 24.0          # memory of one device

# %%
# %matplotlib inline
import matplotlib.pyplot as plt
from nbhelp import Choice, Int, show, sliders  # notebooks/nbhelp.py, first: it finds an uninstalled sim

import sim
from sim.plot import plot_result

# %% [markdown]
# ## 1. Activations held over time
#
# With the default costs (one "byte" per micro-batch, no weights), the memory panel below each Gantt
# chart counts the micro-batches whose activations each device holds.

# %%
costs = sim.Costs()   # F = 1, B = 2; memory = number of micro-batches held
gpipe = sim.simulate(sim.make_schedule("gpipe", P, M), costs)
one_f_one_b = sim.simulate(sim.make_schedule("1f1b", P, M), costs)
show(plot_result(gpipe))
show(plot_result(one_f_one_b))

assert gpipe.peak_activations == [M] * P
assert one_f_one_b.peak_activations == [min(P - s, M) for s in range(P)]
print("peak micro-batches held per stage:")
print(f"  GPipe: {gpipe.peak_activations}   (= m on every stage)")
print(f"  1F1B:  {one_f_one_b.peak_activations}   (= min(p-s, m) on stage s)")

# %% [markdown]
# **Why GPipe holds `m`.** It runs all `m` forwards before the first backward, so at the end of
# its forward phase every stage holds all `m` micro-batches. Memory rises as a ramp to `m` and only
# falls during the backwards.
#
# **Why 1F1B holds at most `p-s`.** Stage `s` first runs `p-s-1` warm-up forwards, then one more
# forward, and then its first backward can start: that micro-batch's gradient has come back from
# the last stage. From then on it alternates one forward (hold one more) with one backward (free
# one), so the count stays at `p-s`. And `p-s-1` forwards ahead is exactly what is needed to keep
# the stages after it busy while the gradient travels: fewer would add bubble, more would only add
# memory.
#
# **The price.** Stage 0 holds the most (`p` micro-batches), the last stage only one: 1F1B's memory
# is uneven across devices. That is why stage 0 is often given fewer layers.

# %% [markdown]
# ## 2. Peak memory against the number of micro-batches
#
# Left: the most micro-batches any stage holds, simulated (dots) and closed form (lines). Right:
# the bubble, identical for both schedules.

# %%
from matplotlib.ticker import PercentFormatter

peaks = {"gpipe": [], "1f1b": []}
bubbles = []
for m in SWEEP_M:
    for name in peaks:
        r = sim.simulate(sim.make_schedule(name, P, m), costs)
        expected = [m] * P if name == "gpipe" else [min(P - s, m) for s in range(P)]
        assert r.peak_activations == expected, (name, m, r.peak_activations)
        peaks[name].append(max(r.peak_activations))
    assert abs(r.bubble_fraction - (P - 1) / (m + P - 1)) < 1e-12
    bubbles.append(r.bubble_fraction)

fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
left.plot(SWEEP_M, SWEEP_M, "C0-", label="GPipe: m")
left.plot(SWEEP_M, peaks["gpipe"], "C0o", ms=3.5, label="GPipe: simulated")
left.plot(SWEEP_M, [min(P, m) for m in SWEEP_M], "C1-", label="1F1B: min(p, m)")
left.plot(SWEEP_M, peaks["1f1b"], "C1o", ms=3.5, label="1F1B: simulated")
left.set(xlabel="micro-batches m", ylabel="peak micro-batches held (busiest stage)", title=f"Memory, p={P}")
right.plot(SWEEP_M, bubbles, "k-o", ms=3)
right.set(xlabel="micro-batches m", ylabel="bubble", ylim=(0, 1), title="Bubble (GPipe = 1F1B)")
right.yaxis.set_major_formatter(PercentFormatter(1.0))
for ax in (left, right):
    ax.grid(alpha=0.3)
left.legend(fontsize=8)
plt.show()

# %% [markdown]
# ## 3. The trade-off
#
# Each point below is one `m`: how idle the devices are (x) against how many micro-batches the
# busiest stage must hold (y). Moving left means a smaller bubble. GPipe pays for every step left
# with memory; 1F1B moves left at constant memory once `m ≥ p`. That is why 1F1B replaced GPipe.

# %%
fig, ax = plt.subplots(figsize=(7, 4.5))
for name, color in (("gpipe", "C0"), ("1f1b", "C1")):
    ax.plot(bubbles, peaks[name], "o-", ms=3.5, color=color, label=name)
for m in sorted({1, P, 2 * P, 4 * P, SWEEP_M[-1]} & set(SWEEP_M)):
    i = SWEEP_M.index(m)
    if peaks["gpipe"][i] == peaks["1f1b"][i]:  # m <= p: the two schedules hold the same
        ax.annotate(f"m={m}", (bubbles[i], peaks["1f1b"][i]), xytext=(0, 7), textcoords="offset points",
                    fontsize=8, color="black", ha="center")
        continue
    # GPipe's labels to the left of its rising curve, 1F1B's centred under its flat line
    ax.annotate(f"m={m}", (bubbles[i], peaks["gpipe"][i]), xytext=(-6, 0), textcoords="offset points",
                fontsize=8, color="C0", ha="right", va="center")
    ax.annotate(f"m={m}", (bubbles[i], peaks["1f1b"][i]), xytext=(0, -12), textcoords="offset points",
                fontsize=8, color="C1", ha="center")
ax.set(xlabel="bubble (idle share)", ylabel="peak micro-batches held", title=f"Bubble against memory, p={P}")
ax.xaxis.set_major_formatter(PercentFormatter(1.0))
ax.invert_xaxis()   # better to the right
ax.margins(x=0.06, y=0.1)
ax.grid(alpha=0.3)
ax.legend()
plt.show()

# %% [markdown]
# ## 4. In bytes
#
# A stage's memory is its **static** part (weights, gradients, optimizer state: held the whole step)
# plus its **activations** (`Costs.activation_bytes` per micro-batch, held from F to B). What a
# micro-batch's activations weigh depends on how many samples it has, and there are two ways to
# choose `m`:
#
# - **A. Fixed micro-batch size** (`MICRO_SIZE` samples each): more micro-batches make a bigger
#   batch. GPipe's memory grows linearly with `m` until it no longer fits the device; 1F1B's stops
#   growing at `m = p`.
# - **B. Fixed global batch** (`BATCH` samples cut into `m` micro-batches): each micro-batch has
#   `BATCH/m` samples. GPipe holds all of them, i.e. the activations of the *whole batch*, whatever
#   `m` is: pipelining saves it no activation memory at all. 1F1B holds `p-s` micro-batches of
#   shrinking size, so more micro-batches mean *less* memory *and* a smaller bubble.
#
# Both are simulated below and checked against `static + held × activation bytes`.

# %%
def peak_gib(name, m, samples_per_micro):
    c = sim.Costs(static_bytes=STATIC_GIB * GiB, activation_bytes=ACT_GIB_PER_SAMPLE * samples_per_micro * GiB)
    r = sim.simulate(sim.make_schedule(name, P, m), c)
    held = m if name == "gpipe" else min(P, m)   # on stage 0, the busiest
    expected = STATIC_GIB + held * ACT_GIB_PER_SAMPLE * samples_per_micro
    assert abs(r.peak_memory[0] / GiB - expected) < 1e-9, (name, m, r.peak_memory[0] / GiB, expected)
    return max(r.peak_memory) / GiB


divisors = [m for m in SWEEP_M if BATCH % m == 0]
fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
for name, color in (("gpipe", "C0"), ("1f1b", "C1")):
    a.plot(SWEEP_M, [peak_gib(name, m, MICRO_SIZE) for m in SWEEP_M], "o-", ms=3, color=color, label=name)
    b.plot(divisors, [peak_gib(name, m, BATCH / m) for m in divisors], "o-", ms=4, color=color, label=name)
a.set(title=f"A. {MICRO_SIZE} samples per micro-batch", xlabel="micro-batches m (batch = m x micro-batch)",
      ylabel="peak memory of the busiest device (GiB)")
b.set(title=f"B. a batch of {BATCH} cut into m micro-batches", xlabel="micro-batches m")
b.set_xscale("log", base=2)
b.set_xticks(divisors, [str(m) for m in divisors])
for ax in (a, b):
    ax.axhline(DEVICE_GIB, color="red", ls="--", lw=1, label=f"device memory {DEVICE_GIB:g} GiB")
    ax.axhline(STATIC_GIB, color="grey", ls=":", lw=1, label="static (weights, grads, optimizer)")
    ax.grid(alpha=0.3)
    ax.set_ylim(bottom=0)
a.legend(fontsize=8)
plt.show()

m_fit = int((DEVICE_GIB - STATIC_GIB) // (ACT_GIB_PER_SAMPLE * MICRO_SIZE))
print(f"A: GPipe fits the device up to m = {m_fit} micro-batches "
      f"(bubble at least {(P - 1) / (m_fit + P - 1):.1%}); 1F1B fits any m and its bubble keeps falling")
print(f"B: GPipe holds the whole batch's activations, {BATCH * ACT_GIB_PER_SAMPLE:g} GiB, for every m; "
      f"1F1B at m={divisors[-1]} holds {P * BATCH / divisors[-1] * ACT_GIB_PER_SAMPLE:g} GiB")

# %% [markdown]
# The same in the timeline, in bytes: the memory panel now shows GiB, with the static part as the
# floor every line starts from.

# %%
m = divisors[min(len(divisors) - 1, 3)]
byte_costs = sim.Costs(static_bytes=STATIC_GIB * GiB, activation_bytes=ACT_GIB_PER_SAMPLE * BATCH / m * GiB)
for name in ("gpipe", "1f1b"):
    show(plot_result(sim.simulate(sim.make_schedule(name, P, m), byte_costs)))

# %% [markdown]
# ## 5. Explore
#
# With `ipywidgets` installed (`pip install -e ".[notebooks]"`), sliders appear above the figure
# and redraw it; without them, or in a headless run, the figure for the parameters at the top is
# all you get.

# %%
def explore(schedule="1f1b", p=P, m=M):
    r = sim.simulate(sim.make_schedule(schedule, p, m), sim.Costs())
    print(f"{schedule}: peak micro-batches held per stage {r.peak_activations}, bubble {r.bubble_fraction:.1%}")
    show(plot_result(r))


# sliders that redraw it, first with the parameters at the top; without ipywidgets, that one figure
sliders(explore, schedule=Choice("1f1b", ["gpipe", "1f1b", "naive"]), p=Int(P, 1, 8), m=Int(M, 1, 32))

# %% [markdown]
# ## Summary
#
# - A stage keeps a micro-batch's activations from its forward to its backward.
# - GPipe holds all `m` micro-batches on every stage; 1F1B at most `p-s` on stage `s`, because it
#   starts each backward as soon as the gradient is back.
# - Both have the bubble `(p-1)/(m+p-1)`, so only 1F1B can raise `m` to shrink the bubble without
#   paying in memory. With a fixed batch, GPipe keeps the whole batch's activations regardless of `m`.
#
# Next: [03_real_runs.ipynb](03_real_runs.ipynb) runs these schedules for real and checks the
# simulator against the measurements.
