"""Write the tutorial notebooks (notebooks/*.ipynb) from the cells below, without outputs.

    python notebooks/_build.py          # rewrites every notebook: 01_why_pipelines.ipynb ... 06_closing_the_loop.ipynb

Edit the cells here rather than in Jupyter, so that the committed notebooks stay small and
free of outputs (tests/test_notebooks.py checks that, and executes every notebook).
"""
from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent

# The first code cell of every notebook: import `sim` whether or not the repo is installed,
# inline figures, and `show` for the figures of sim.plot (built without pyplot).
SETUP = '''\
%matplotlib inline
import io
import sys
from pathlib import Path

try:
    import sim
except ModuleNotFoundError:  # the repo is not installed (pip install -e .): find it above this notebook
    here = Path.cwd().resolve()
    sys.path.insert(0, str(next(d for d in (here, *here.parents) if (d / "sim" / "__init__.py").is_file())))
    import sim

import matplotlib.pyplot as plt
from IPython.display import Image, display
from sim.plot.gantt import fit_labels, format_table, plot_compare, plot_overlay, plot_result


def show(fig, dpi=100):
    """Display a figure of sim.plot inline (they are drawn without pyplot)."""
    fit_labels(fig)  # hide the micro-batch numbers that do not fit their bars
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    display(Image(buf.getvalue()))
'''

WIDGETS_NOTE = ("With `ipywidgets` installed (`pip install -e \".[notebooks]\"`), sliders appear below the "
                "figure and redraw it; without them, or in a headless run, the figure for the parameters at "
                "the top is all you get.")


def md(text: str):
    return new_markdown_cell(text.strip("\n"))


def code(text: str):
    return new_code_cell(text.strip("\n"))


# ============================================================================ 01 why pipelines

WHY = [
    md("""
# 1. Why pipelines: naive model parallelism, GPipe and 1F1B

A model too large for one device is cut into **stages**: the first layers on device 0, the next
ones on device 1, and so on. This notebook shows, with the simulator `sim` alone (a few seconds
on a laptop), why cutting the model is not enough and what pipelining buys:

1. the three schedules on Gantt charts: naive model parallelism, GPipe, 1F1B;
2. where the **bubble**, the share of time the devices sit idle, comes from, and its closed
   form `(p-1)/(m+p-1)`;
3. the bubble over many stage counts `p` and micro-batch counts `m`, against the simulator;
4. what communication latency does to it;
5. what one slow stage does to it;
6. an `explore` cell to try your own `p`, `m`, latency and slow stage.

Change the parameters in the next cell and run all cells again (*Run > Run All Cells*).
"""),
    code('''
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
'''),
    code(SETUP),
    md("""
## 1. Three schedules on one time axis

Each row below is a device; a blue bar is the forward (F) of one micro-batch, an orange bar its
backward (B), the number on the bar is the micro-batch. The light grey track that shows through
is time the device sits **idle**.

- **naive** model parallelism sends micro-batch 0 forward through every stage and back, and only
  then starts micro-batch 1. Exactly one device computes at any moment.
- **GPipe** lets the micro-batches follow each other: while device 1 runs the forward of
  micro-batch 0, device 0 already runs micro-batch 1. All forwards first, then all backwards.
- **1F1B** (PipeDream-Flush, used by Megatron-LM) starts each backward as early as it can and
  then alternates one forward, one backward.
"""),
    code('''
costs = sim.Costs(forward=FORWARD, backward=BACKWARD)
results = {name: sim.simulate(sim.make_schedule(name, P, M), costs) for name in ("naive", "gpipe", "1f1b")}
print(format_table(results.values()))
show(plot_compare(list(results.values()), shared_time=True))
'''),
    md("""
## 2. Where the bubble comes from, and its closed form

The **bubble fraction** is the idle share of device-time: `1 - busy / (p * makespan)`.

*Naive.* Every micro-batch takes `p(F+B)` from its first forward to its last backward, and they run
one after the other: the step lasts `m·p(F+B)`. Each device computes `m(F+B)` of it, so it idles
`(p-1)/p` of the step: 75% with 4 devices. Adding devices adds memory, not speed.

*GPipe and 1F1B.* Each device still computes `m(F+B)`, but now the step lasts only
`(m+p-1)(F+B)`: the last micro-batch reaches the last stage `p-1` forward-slots after the
first one (the **fill**, the triangle at the top left), and its gradient needs `p-1`
backward-slots to travel back to stage 0 (the **drain**, at the end). Every device idles
`(p-1)(F+B)` in total, so

$$\\text{bubble} = \\frac{(p-1)(F+B)}{(m+p-1)(F+B)} = \\frac{p-1}{m+p-1}.$$

It depends only on `p` and `m`, not on `F` and `B`. 1F1B reorders the same work inside the same
fill and drain, so its bubble is the same; what it saves is memory (notebook 2).

The cell below checks these formulas against the simulator: if the simulator ever drifts from
them, this notebook fails here.
"""),
    code('''
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
'''),
    md("""
## 3. The bubble over `p` and `m`

Lines are the closed form, dots the simulator, for GPipe and 1F1B (they coincide), dotted
horizontal lines naive model parallelism's `(p-1)/p`. The sweep runs a few hundred simulations
and asserts every one against the formula.
"""),
    code('''
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
'''),
    md("""
**What to take away.** The bubble falls like `1/m`: about `(p-1)/m` once `m` is large. A rule of
thumb is `m ≥ 4p`, which keeps the bubble under 20%. Deeper pipelines need proportionally more
micro-batches. But the micro-batches cut one batch: more of them means smaller ones, which use a
device less efficiently, and GPipe must keep the activations of all of them (notebook 2).
"""),
    md("""
## 4. Communication latency

Every activation sent forward and every gradient sent back crosses a link and arrives `L` later
(`Costs.latency`). Where does that show?

- **GPipe** pays it in the fill and the drain: each crosses `p-1` links, so the step grows by
  `2(p-1)L`. During the long runs of forwards and backwards the latency is hidden: each receive
  is posted one compute ahead (rule 3 of [docs/rules.md](../docs/rules.md)), so a transfer
  shorter than a compute arrives before it is needed. That holds while `L ≤ F`; beyond it the
  transfers cannot keep up and the pipeline runs at the pace of the links.
- **1F1B** also pays it in its steady state: a stage alternates forward and backward, and each
  backward waits for a gradient that has just crossed a link from the next stage, whose own
  forward waited for an activation crossing the other way. The latency sits on the critical path
  again and again, so its cost grows with `m`.
"""),
    code('''
lat_costs = sim.Costs(forward=FORWARD, backward=BACKWARD, latency=LATENCY)
lat = [sim.simulate(sim.make_schedule(name, P, M), lat_costs) for name in ("gpipe", "1f1b")]
show(plot_compare(lat))
if LATENCY <= FORWARD:
    assert abs(lat[0].makespan - ((M + P - 1) * T + 2 * (P - 1) * LATENCY)) < 1e-9
for r in lat:
    print(f"{r.schedule.name:5s}: makespan {r.makespan:.3g} (without latency {(M + P - 1) * T:g}), "
          f"bubble {r.bubble_fraction:.1%}")
'''),
    code('''
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
'''),
    md("""
GPipe follows the dashed line until `L = F`, then the links set the pace. 1F1B, the schedule
everybody uses for its memory, is the one that suffers most from latency. This is why real
systems overlap communication with compute, and why a micro-batch should be large enough that its
compute dwarfs the latency of a transfer.
"""),
    md("""
## 5. Uneven stages: the slowest stage sets the pace

Stages rarely cost the same: an embedding or a loss head is heavier than a transformer block, and
layers do not always divide evenly. A pipeline is an assembly line: in the steady state the
micro-batches leave at the pace of the **slowest** stage, and the faster stages wait for it.

For GPipe this is exact (it is a flow shop with identical jobs): with `t_s = F_s + B_s`,

$$\\text{makespan} = \\sum_s t_s + (m-1)\\max_s t_s .$$

For any schedule the slow stage alone computes for `m·max t_s`, a lower bound on the step.
"""),
    code('''
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
'''),
    code('''
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
'''),
    md("""
The bubble grows although the devices have *more* work: the fast stages idle while they wait for
the slow one. Balancing the stages (cutting the model by measured time rather than by layer count,
as `exec.models.spec.ModelSpec.partition(..., balance="time")` does) is as important as choosing `m`.
1F1B suffers a little less than GPipe when the slow stage is early in the pipeline, since its
backwards start before all forwards are done.
"""),
    md(f"""
## 6. Explore

`explore` draws the three schedules for any `p`, `m`, latency and slow-stage factor and prints
their bubble next to the closed form for free, even stages. {WIDGETS_NOTE}
"""),
    code('''
def explore(p=P, m=M, latency=LATENCY, slow_factor=SLOW_FACTOR):
    fw, bw = [FORWARD] * p, [BACKWARD] * p
    fw[min(SLOW_STAGE, p - 1)] *= slow_factor
    bw[min(SLOW_STAGE, p - 1)] *= slow_factor
    c = sim.Costs(forward=fw, backward=bw, latency=latency)
    rs = [sim.simulate(sim.make_schedule(name, p, m), c) for name in ("naive", "gpipe", "1f1b")]
    print(format_table(rs))
    print(f"closed form for even stages and no latency: bubble {(p - 1) / (m + p - 1):.1%} (naive {(p - 1) / p:.1%})")
    show(plot_compare(rs))


try:
    from ipywidgets import FloatSlider, IntSlider, interact
except ImportError:  # no sliders: draw the parameters at the top once
    print("pip install ipywidgets for sliders")
    explore()
else:  # the sliders draw it, first with the parameters at the top
    interact(explore,
             p=IntSlider(value=P, min=1, max=8, continuous_update=False),
             m=IntSlider(value=M, min=1, max=32, continuous_update=False),
             latency=FloatSlider(value=LATENCY, min=0.0, max=2 * FORWARD, step=0.05, continuous_update=False),
             slow_factor=FloatSlider(value=SLOW_FACTOR, min=1.0, max=3.0, step=0.1, continuous_update=False))
'''),
    md("""
## Summary

- Cutting a model into `p` stages without pipelining leaves each device idle `(p-1)/p` of the time.
- Splitting the batch into `m` micro-batches lets the stages work at once: the bubble falls to
  `(p-1)/(m+p-1)` for both GPipe and 1F1B.
- Latency is paid in the fill and drain by GPipe, and throughout the steady state by 1F1B.
- The slowest stage sets the pace: balance the stages.

Next: [02_memory.ipynb](02_memory.ipynb), where GPipe and 1F1B differ.
"""),
]

# ============================================================================ 02 memory

MEMORY = [
    md("""
# 2. Memory: what each stage holds, and for how long

To compute the backward of a micro-batch, a stage needs the activations its forward produced. So a
stage **holds a micro-batch's activations from the start of its forward to the end of its
backward** (rule 7 of [docs/rules.md](../docs/rules.md)). GPipe and 1F1B have the same bubble
(notebook 1) but very different memory, and this notebook shows why:

1. activations held over time on each stage: GPipe holds `m` micro-batches, 1F1B at most `p-s`
   on stage `s`;
2. peak memory against the number of micro-batches;
3. the trade-off: more micro-batches shrink the bubble, but GPipe must hold them all;
4. the same in bytes, for a fixed micro-batch size and for a fixed global batch.

Only the simulator is used; the notebook runs in seconds.
"""),
    code('''
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
'''),
    code(SETUP),
    md("""
## 1. Activations held over time

With the default costs (one "byte" per micro-batch, no weights), the memory panel below each Gantt
chart counts the micro-batches whose activations each device holds.
"""),
    code('''
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
'''),
    md("""
**Why GPipe holds `m`.** It runs all `m` forwards before the first backward, so at the end of
its forward phase every stage holds all `m` micro-batches. Memory rises as a ramp to `m` and only
falls during the backwards.

**Why 1F1B holds at most `p-s`.** Stage `s` first runs `p-s-1` warm-up forwards, then one more
forward, and then its first backward can start: that micro-batch's gradient has come back from
the last stage. From then on it alternates one forward (hold one more) with one backward (free
one), so the count stays at `p-s`. And `p-s-1` forwards ahead is exactly what is needed to keep
the stages after it busy while the gradient travels: fewer would add bubble, more would only add
memory.

**The price.** Stage 0 holds the most (`p` micro-batches), the last stage only one: 1F1B's memory
is uneven across devices. That is why stage 0 is often given fewer layers.
"""),
    md("""
## 2. Peak memory against the number of micro-batches

Left: the most micro-batches any stage holds, simulated (dots) and closed form (lines). Right:
the bubble, identical for both schedules.
"""),
    code('''
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
'''),
    md("""
## 3. The trade-off

Each point below is one `m`: how idle the devices are (x) against how many micro-batches the
busiest stage must hold (y). Moving left means a smaller bubble. GPipe pays for every step left
with memory; 1F1B moves left at constant memory once `m ≥ p`. That is why 1F1B replaced GPipe.
"""),
    code('''
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
'''),
    md("""
## 4. In bytes

A stage's memory is its **static** part (weights, gradients, optimizer state: held the whole step)
plus its **activations** (`Costs.activation_bytes` per micro-batch, held from F to B). What a
micro-batch's activations weigh depends on how many samples it has, and there are two ways to
choose `m`:

- **A. Fixed micro-batch size** (`MICRO_SIZE` samples each): more micro-batches make a bigger
  batch. GPipe's memory grows linearly with `m` until it no longer fits the device; 1F1B's stops
  growing at `m = p`.
- **B. Fixed global batch** (`BATCH` samples cut into `m` micro-batches): each micro-batch has
  `BATCH/m` samples. GPipe holds all of them, i.e. the activations of the *whole batch*, whatever
  `m` is: pipelining saves it no activation memory at all. 1F1B holds `p-s` micro-batches of
  shrinking size, so more micro-batches mean *less* memory *and* a smaller bubble.

Both are simulated below and checked against `static + held × activation bytes`.
"""),
    code('''
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
'''),
    md("""
The same in the timeline, in bytes: the memory panel now shows GiB, with the static part as the
floor every line starts from.
"""),
    code('''
m = divisors[min(len(divisors) - 1, 3)]
byte_costs = sim.Costs(static_bytes=STATIC_GIB * GiB, activation_bytes=ACT_GIB_PER_SAMPLE * BATCH / m * GiB)
for name in ("gpipe", "1f1b"):
    show(plot_result(sim.simulate(sim.make_schedule(name, P, m), byte_costs)))
'''),
    md(f"""
## 5. Explore

{WIDGETS_NOTE}
"""),
    code('''
def explore(schedule="1f1b", p=P, m=M):
    r = sim.simulate(sim.make_schedule(schedule, p, m), sim.Costs())
    print(f"{schedule}: peak micro-batches held per stage {r.peak_activations}, bubble {r.bubble_fraction:.1%}")
    show(plot_result(r))


try:
    from ipywidgets import Dropdown, IntSlider, interact
except ImportError:  # no sliders: draw the parameters at the top once
    print("pip install ipywidgets for sliders")
    explore()
else:  # the sliders draw it, first with the parameters at the top
    interact(explore, schedule=Dropdown(options=["gpipe", "1f1b", "naive"], value="1f1b"),
             p=IntSlider(value=P, min=1, max=8, continuous_update=False),
             m=IntSlider(value=M, min=1, max=32, continuous_update=False))
'''),
    md("""
## Summary

- A stage keeps a micro-batch's activations from its forward to its backward.
- GPipe holds all `m` micro-batches on every stage; 1F1B at most `p-s` on stage `s`, because it
  starts each backward as soon as the gradient is back.
- Both have the bubble `(p-1)/(m+p-1)`, so only 1F1B can raise `m` to shrink the bubble without
  paying in memory. With a fixed batch, GPipe keeps the whole batch's activations regardless of `m`.

Next: [03_real_runs.ipynb](03_real_runs.ipynb) runs these schedules for real and checks the
simulator against the measurements.
"""),
]

# ============================================================================ 03 real runs

REAL = [
    md("""
# 3. Real runs: the same schedules on real processes

`exec` runs the **very same** `sim.Schedule` objects on real devices with `torch.distributed`: one
process per device ("rank"), activations and gradients sent between them, every action timed into
the same `sim.Result` record the simulator produces. Here the devices are CPU processes talking
over gloo, so it runs on any laptop (about a minute on 2 cores). This notebook:

1. runs a small model with 1F1B on 2 ranks, and measures as it runs what the simulator needs
   (`exec.measure.calibrate`, merged by `exec.measure.costs`): its `Costs`;
2. checks that the pipelined gradients equal single-process training;
3. overlays the measured and simulated timelines and reads off where and why they differ;
4. compares GPipe with 1F1B, measured on real tensors.

It needs torch: `pip install -e ".[exec,notebooks]"`.
"""),
    code('''
# Parameters: change them and run all cells again
SCHEDULE = "1f1b"  # the schedule to study: "1f1b", "gpipe" or "naive"
STAGES = 2         # one process per stage; keep it at most the number of CPU cores
MICRO = 4          # micro-batches per step; must divide BATCH_SIZE
LAYERS = 8         # MLP blocks of the model, cut into STAGES stages
HIDDEN = 128       # width of the model
BATCH_SIZE = 32    # samples per step
STEPS = 3          # measured steps per run (the median one is shown) ...
WARMUP = 1         # ... after this many unmeasured ones
'''),
    code(SETUP),
    code('''
import time

import torch  # exec needs it: pip install -e ".[exec]"
from exec.measure.compare import breakdown, compare
from exec.models.spec import ModelSpec
from exec.pipeline.runner import run_pipeline

spec = ModelSpec(model="mlp", layers=LAYERS, hidden=HIDDEN, batch_size=BATCH_SIZE)
schedule = sim.make_schedule(SCHEDULE, STAGES, MICRO)
print(schedule)
'''),
    md("""
## 1. Run the schedule, and measure its costs as it runs

`run_pipeline` starts one process per rank, builds each rank's stages, runs `WARMUP + STEPS`
training steps by interpreting the schedule action by action, and returns the median measured
step as a `sim.Result`. It also trains the same model in a single process and compares the
gradients of the first step (section 2).

The simulator needs to know how long each stage's forward and backward take, how long a transfer
takes, and how many bytes each stage keeps. With `calibrate=1`, before each measured step the ranks
measure exactly that (`exec.measure.calibrate.calibrate_rank`), on the very modules, processes and cores the
steps use: they time each stage's F and B (all ranks computing at once, and each alone), fit
latency and bandwidth to ping-pong transfers of several sizes, and count the bytes. Measuring in
the same minute as the steps matters on a shared machine, where a core's speed changes from
second to second.
"""),
    code('''
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
'''),
    md("""
## 2. Do the gradients equal single-process training?

A pipeline must not change *what* is computed, only *where and when*. The loss of each micro-batch
is scaled by `1/m`, so summing the micro-batches' gradients gives exactly the gradient of the whole
batch. `run_pipeline` computed the same step in one process (the whole model on the whole batch)
and compared every parameter's gradient. They agree up to float rounding: summing `m` partial
gradients adds in a different order than one big matrix product.
"""),
    code('''
print(f"loss: pipelined {run.losses[0]:.6f}, single process {run.reference_loss:.6f}")
print(f"gradients match: {run.grad_match}; largest difference {run.max_grad_diff:.2e} (in {run.worst_param})")
assert run.loss_match, "the pipelined loss differs from single-process training"
assert run.grad_match and run.max_grad_diff < 1e-4, "the pipelined gradients differ from single-process training"
'''),
    md("""
## 3. Measured against simulated

`exec.measure.compare.compare` simulates the same schedule under the profiled costs and puts both steps
side by side. In the overlay, the wide hatched bars are the simulation and the narrow solid bars
the measurement, on the same rows. The `error`, in the table and in the figure's title, is
`(simulated - measured) / measured`: positive when the simulator predicts a longer step.
"""),
    code('''
cmp = compare(run.result, costs, grad_match=run.grad_match)
print(cmp.table())
show(plot_overlay(cmp.simulated, cmp.measured))
assert cmp.measured.peak_activations == cmp.simulated.peak_activations  # memory follows the rules exactly,
assert cmp.measured.peak_memory == cmp.simulated.peak_memory            # to the byte
'''),
    md("""
**Reading the difference.** The *shape* should match: the same order of actions, the same fill and
drain, the same number of micro-batches held (asserted above: memory follows directly from the
schedule). The *length* can differ, and `breakdown` says why, per rank:

- `compute`: time spent in F and B. If a measured F or B is far from its profiled cost
  (`ratio` below), the step differs because the *costs* are off, not the rules: on a shared
  2-core machine two ranks computing at once slow each other down (the profile measured each
  action both alone and concurrently, and uses the concurrent time, although in a real step a
  rank often computes while the other waits), caches are warm or cold, and other programs
  steal the cores.
- `wait`: time a rank waited for an activation or a gradient from the other rank. The
  simulator predicts these waits from the rules.
- `overhead`: the runtime's own time between actions: posting sends and receives, and its
  Python work around each compute, which the simulator models as `send_overhead`,
  `recv_overhead` and `before_compute` + `after_compute` (rules 2, 3 and 11), all measured by
  the profile.
"""),
    code('''
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
'''),
    md("""
To separate the two sources of error, simulate again with other compute times: those the
profile measured with each rank computing *alone*, and those *measured in this run* (the medians
above). With this run's own times, what remains is what the rules do not model, and the spread
of each action around its median. On a CPU host much of that spread is
sharing: an action runs at its *alone* speed while the other rank waits and at its *concurrent*
speed while both compute, which one fixed cost per action cannot express. Last, the *replay*:
every compute takes exactly the time it took in this step (`sim.simulate(..., durations=)`,
`exec.measure.compare.replay_error`), so only the rules of communication and of the runtime are left to
be wrong.
"""),
    code('''
import dataclasses
from exec.measure.compare import replay_error

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
'''),
    md("""
## 4. GPipe against 1F1B, measured

Notebook 2 predicted that GPipe holds all `m` micro-batches on every stage and 1F1B at most
`p-s`. The runtime records the activations each rank really keeps, so we can check it on real
tensors (and that both schedules compute the same gradients).
"""),
    code('''
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
'''),
    md("""
## Summary

- `exec` runs the simulator's schedules unchanged, and its measured steps are `sim.Result`s: the
  same metrics, figures and traces (`run.result.save_chrome_trace("step.json")`, open it in
  [Perfetto](https://ui.perfetto.dev)).
- The pipelined gradients equal single-process training: pipelining changes when things are
  computed, not what.
- The simulator predicts the order and the memory exactly; its time is as good as its costs.
  When a prediction is off, look at the breakdown first (costs or rules?), and fix the rule in
  both places ([docs/rules.md](../docs/rules.md)) rather than scaling a number.

Try `SCHEDULE = "naive"`, or `MICRO = 8`, and run all cells again.
"""),
]

# ============================================================================ 04 modern schedules

MODERN = [
    md("""
# 4. Modern schedules: interleaving, zero bubble and V shapes

Notebooks 1 and 2 left 1F1B with a bubble of `(p-1)/(m+p-1)` and `p` micro-batches of
activations on its first device. The schedules people choose between today attack that bubble
in three ways, each at some price in memory or communication. This notebook draws them with the
simulator (`sim.make_schedule`, names in `sim.SCHEDULES`), sizes their memory in bytes for a real
model, and runs one of them for real:

1. **interleaving**: each device holds `V` model chunks (`interleaved-1f1b`, `looped-bfs`);
2. **zero bubble**: the backward split into input and weight gradients (`zb-h1`, `zb-h2`);
3. **V shapes**: two chunks per device, placed as a V (`zbv`, `dualpipev`);
4. the **bubble/memory trade-off** of every schedule, in one figure;
5. an `explore` cell to move `p`, `m`, `V` and the F:I:W ratio;
6. **a real run** on 2 CPU ranks, 2 model stages on each, compared with its simulation.

Every schedule is drawn with two bubbles: the **bubble** of one step (idle share of
`p × makespan`), and the **steady** bubble of the zero-bubble paper: the longest time one device
takes from its first compute to its last, which is the step time when steps follow each other
without a flush (docs/zero_bubble.md). Communication is free here (`transport="ideal"`), as in
the papers' closed forms; notebook 1 shows what latency does.

It needs torch for section 6 only: `pip install -e ".[exec,notebooks]"`.
"""),
    code('''
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
'''),
    code(SETUP),
    md("""
**Memory in bytes.** Per transformer layer and micro-batch, the forward saves `sb(34h + 5as)`
bytes that the backward needs (s sequence, b micro-batch, h hidden, a heads; Korthikanti et al.
2022, and Table 1 of Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024). Where the
backward is split, I frees all but the `32sbh` bytes that W still needs (same table). For the
model above that is 0.89 GiB and 0.25 GiB per layer. Cut into `p` stages, a device's `32/p`
layers hold `A` bytes per micro-batch (7.1 GiB at p=4), `A_W` of them until W; a schedule with
`V` chunks per device cuts the same layers into `pV` stages of `A/V` each, and its chunk
costs are the device's F, I, W divided by `V`. The weights, gradients and optimizer state are
the same for every schedule (the same layers on every device) and are left out: memory below is
activations only.
"""),
    code('''
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
'''),
    md("""
## 1. Interleaving: V chunks per device

Megatron-LM's **interleaved 1F1B** (Narayanan et al., SC'21) gives each device `V` smaller
chunks of the model, stage `s` on device `s mod p`: device 0 holds stages 0 and p, device 1
stages 1 and p+1, and so on. A micro-batch loops through the devices `V` times. The fill and
the drain still cross `p-1` devices, but each crossing now costs a chunk, `(F+B)/V`, so with `m`
a multiple of `p`

$$\\text{makespan} = (mV + p - 1)\\,\\frac{F+B}{V}, \\qquad \\text{bubble} = \\frac{p-1}{mV+p-1}:$$

1F1B's idle time divided by `V`. The price: `V` times as many transfers, and more activations on
the first device (its warm-up runs `(V-1)g + 2(p-1)` chunk forwards, `g` micro-batches a round).
**Looped BFS** (Lamy-Poirier, MLSys 2023) uses the same placement breadth first: all `m` forwards
of one chunk, then the next, like GPipe; the same makespan here, GPipe's memory.
"""),
    code('''
one = run("1f1b")
inter = run("interleaved-1f1b", v=V)
bfs = run("looped-bfs", v=V)
table([one, inter, bfs])
show(plot_compare([one, inter, bfs]))
'''),
    md("""
The closed forms against the simulator (if the generators drift, this notebook fails here):
"""),
    code('''
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
'''),
    md("""
## 2. Zero bubble: splitting the backward

The backward of a layer computes two things: the gradient with respect to its **input** (I),
which the previous stage is waiting for, and the gradient with respect to its **weights** (W),
which nobody waits for until the optimizer step. Qi et al. ("Zero Bubble Pipeline Parallelism",
ICLR 2024, Figure 3) run I at once and put the Ws off into what would be idle time:

- **ZB-H1**: 1F1B's order with each B split; a device puts off `s` Ws and runs them in the
  drain. Same peak memory as 1F1B on device 0; the bubble drops from `(p-1)(F+B)` to
  `(p-1)(F+I-W)`: a third of it when F = I = W.
- **ZB-H2**: a longer warm-up (`2(p-1-s)+1` forwards) so that the Ws fill the drain entirely:
  every device busy from its first compute to its last, the steady bubble `(p-1)(F+I-2W)` is 0
  at F = I = W, for `2p-1` micro-batches on device 0.

The Gantt charts colour F, I, W and B apart. Between its I and its W a micro-batch still holds
`A_W` bytes, so the later devices, which put off more Ws, hold more than in 1F1B.
"""),
    code('''
h1, h2 = run("zb-h1"), run("zb-h2")
table([one, h1, h2])
show(plot_compare([one, h1, h2]))
'''),
    code('''
if W <= min(F, I):  # the Ws put off fit into the drain (docs/zero_bubble.md)
    assert close(h1.makespan, M * (F + I + W) + (P - 1) * (F + I - W))
    assert close(h2.steady_step, M * (F + I + W) + (P - 1) * (F + I - 2 * W))
for s in range(P):  # peak bytes on device s (docs/zero_bubble.md, Memory)
    assert close(h1.peak_memory[s], (P - s) * A + s * A_W)
    assert close(h2.peak_memory[s], (2 * P - 1 - 2 * s) * A + 2 * s * A_W)
print(f"idle per device in one step: 1F1B {(P - 1) * (F + B):g}, ZB-H1 {(P - 1) * (F + I - W):g} = (p-1)(F+I-W); "
      f"ZB-H2 steady step {h2.steady_step:g} = m(F+I+W) + (p-1)(F+I-2W)")
print(f"device 0 holds {h1.peak_memory[0] / A:g}A (ZB-H1) and {h2.peak_memory[0] / A:g}A (ZB-H2, 2p-1)")
'''),
    md("""
## 3. V shapes: ZB-V and DualPipeV

Both cut the model into `2p` chunks and place them as a V: device `r` holds stages `r` and
`2p-1-r`, so device 0 holds the first *and* the last stage. A micro-batch goes down the devices
and comes back up; the hand-over in the middle stays on device `p-1`, and device 0 starts the
backward of a micro-batch as soon as it has run its last stage.

- **ZB-V** (Qi et al. 2024, "Pipeline Parallelism with Controllable Memory"): the zero-bubble
  split on the V. With F = I = W, zero steady bubble at 1F1B's memory, `pA` on **every** device
  (`2p` chunks of `A/2`): the same peak as 1F1B's first device, spread evenly.
- **DualPipeV** (DeepSeek-V3, the "cut in half" DualPipe): pairs the forward of one chunk with
  the backward of the other to hide expert-parallel communication under compute. Without that
  communication a pair is just F then B; it holds `(2p+1)A/2`, half a micro-batch more than ZB-V.
"""),
    code('''
zbv, dpv = run("zbv"), run("dualpipev")
table([one, h1, zbv, dpv])
show(plot_compare([one, zbv, dpv]))
'''),
    code('''
for s in range(P):  # memory follows from the order alone, whatever the times
    assert close(zbv.peak_memory[s], P * A)
    assert close(dpv.peak_memory[s], (2 * P + 1) * A / 2)
if F == I == W:  # the papers' closed forms, in chunk time t = F/2 (docs/zero_bubble.md)
    t = F / 2
    assert close(zbv.steady_step, 6 * M * t) and close(zbv.steady_bubble_fraction, 0)
    assert close(zbv.makespan, 6 * M * t + (P - 1) * t)
    assert close(dpv.makespan, 6 * M * t + (P - 1) * t)
print(f"ZB-V: steady bubble {zbv.steady_bubble_fraction:.1%} with {max(zbv.peak_memory) / A:g}A on every device; "
      f"DualPipeV: {dpv.steady_bubble_fraction:.1%} with {max(dpv.peak_memory) / A:g}A")
'''),
    md("""
## 4. The bubble/memory trade-off

One point per schedule: the bubble of one step across, the peak activation memory of the busiest
device up. The grey line from each point goes left to the steady bubble, what the schedule
achieves when steps follow each other without a flush. Added here: 1F1B with at most `p/2`
micro-batches in flight (`max_active`, SageMaker's `active_microbatches`), and the paper's
automatic scheduler `zb-auto` at its two memory limits, `pA` (ZB-1p) and `2pA` (ZB-2p).
Labels of points that coincide are merged.
"""),
    code('''
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
'''),
    code('''
# zb-auto is never worse than ZB-H1 at the same limit, and more memory never makes it slower
assert trade["zb-auto (ZB-1p)"].makespan <= h1.makespan + 1e-9
assert trade["zb-auto (ZB-2p)"].makespan <= trade["zb-auto (ZB-1p)"].makespan + 1e-9
assert max(trade["zb-auto (ZB-1p)"].peak_memory) <= P * A + 1e-6
assert max(trade[f"1f1b max_active={cap}"].peak_memory) <= cap * A + 1e-6
'''),
    md("""
**Reading the figure.** Down and to the left is better. GPipe and looped BFS pay for their bubble
with `m` micro-batches of memory. Interleaving shrinks the bubble by `V` for a little more memory
(and `V` times the transfers, free here). ZB-H1 cuts the bubble at 1F1B's memory; ZB-H2 and
ZB-2p remove it for about twice the memory; ZB-V removes it at 1F1B's memory, which is why it is
the default choice where its V placement is possible. Capping the micro-batches in flight goes
the other way: less memory, more bubble.
"""),
    md(f"""
## 5. Explore

`explore` draws 1F1B and a schedule of your choice for any `p`, `m`, `V` (for the interleaved
and looped schedules) and F:I:W, with the peak memory of each device in GiB for the model above.
A size a schedule refuses (ZB-H2 needs `m ≥ 2p-1`, DualPipeV `m ≥ 2p`) prints its one-line
reason. {WIDGETS_NOTE}
"""),
    code('''
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


try:
    from ipywidgets import Dropdown, FloatSlider, IntSlider, interact
except ImportError:  # no sliders: draw the parameters at the top once
    print("pip install ipywidgets for sliders")
    explore()
else:  # the sliders draw it, first with the parameters at the top
    ratio = {"min": 0.25, "max": 3.0, "step": 0.25, "continuous_update": False}
    interact(explore,
             schedule=Dropdown(options=[n for n in sim.SCHEDULES if n != "naive"], value="zbv"),
             p=IntSlider(value=P, min=2, max=8, continuous_update=False),
             m=IntSlider(value=M, min=1, max=32, continuous_update=False),
             v=IntSlider(value=V, min=1, max=4, continuous_update=False),
             f=FloatSlider(value=F, **ratio), i=FloatSlider(value=I, **ratio), w=FloatSlider(value=W, **ratio))
'''),
    md("""
## 6. A real run on 2 CPU ranks

`exec` runs the very same schedule objects on real processes (notebook 3). Here the schedule puts
two model stages on each rank: `REAL_RANKS` processes, `2 × REAL_RANKS` stages of a small MLP.
With `calibrate=1` the ranks measure, in the same processes and minute, the `Costs` the simulator
needs; `compare` simulates the schedule under them. The gradients must equal single-process
training, and the memory must match the simulation to the byte; the time is as good as the
costs on a shared CPU (notebook 3 explains the difference).
"""),
    code('''
import time

import torch  # exec needs it: pip install -e ".[exec]"
from exec.measure.compare import compare
from exec.models.spec import ModelSpec
from exec.pipeline.runner import run_pipeline

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
'''),
    md("""
## Summary

- Interleaving divides 1F1B's idle time by `V` for `V` times the transfers and a little more
  memory on the first device.
- Splitting the backward into I and W lets the Ws fill the bubble: ZB-H1 at 1F1B's memory,
  ZB-H2 with no steady bubble for about twice the memory.
- The V shapes put the first and last stage on one device: ZB-V has no steady bubble at 1F1B's
  peak memory, spread evenly over the devices; DualPipeV holds half a micro-batch more, and
  pays off where its F&B pairs hide expert-parallel communication.
- The bubble of one step and the steady bubble differ by the fill: for schedules that run back to
  back without a flush, the steady one is what you get.

More in [docs/schedules.md](../docs/schedules.md), [docs/zero_bubble.md](../docs/zero_bubble.md)
and [docs/zb_auto.md](../docs/zb_auto.md).
"""),
]

# ============================================================================ 05 planning a real run

PLANNING = [
    md("""
# 5. Planning a real run: from a model and a cluster to a plan

Notebooks 1 to 4 used made-up costs. Here the costs come from a model and a GPU: `sim.estimate`
times each layer's matmuls, memory-bound kernels and tensor-parallel collectives on the GPU
(`sim.layer`, `sim.kernels`), puts them on the pipeline stages, runs the schedule on the
simulator and adds the memory of weights, gradients and optimizer state. The run to plan:

- **GPT-3 175B** (96 layers, hidden 12288, 96 heads, sequence 2048; Brown et al. 2020), trained on
  **1024 A100-80GB** with a batch of **1536 sequences**: the example Narayanan et al. 2021
  (Sec. 5.1, Eq. 4) use to estimate a training time (140 TFLOP/s per GPU, 34 days for 300
  billion tokens);
- Megatron-LM's layout: tensor parallelism inside a node, pipeline stages across nodes, data
  parallelism over the rest.

The sections:

1. one estimate, its Gantt chart and memory;
2. where the time goes and where the memory goes;
3. what recompute, interleaving, zero-bubble schedules and ZeRO each buy;
4. how close the estimate is to published measurements;
5. the planner (a search over layouts).

Everything runs on the simulator, in well under a minute. What the estimate leaves out is listed
in [docs/planner.md](../docs/planner.md); the formulas and their sources are there too.
"""),
    code('''
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
'''),
    code(SETUP),
    md("""
## 1. One estimate

`sim.estimate` returns an `Estimate`: the step time, the throughput (FLOPs actually computed,
recompute included, per GPU: Narayanan et al. 2021, Eq. 3), the MFU (model FLOPs without
recompute over the GPU's peak: Korthikanti et al. 2022, Eq. 7), the bubble, the peak memory of
each pipeline device and whether it fits, and `result`, the simulated step itself.
"""),
    code('''
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
'''),
    md("""
The simulated step: each row a pipeline device, each bar one chunk's forward (F) or backward (B)
of one micro-batch (interleaving puts `VIRTUAL` chunks on each device; the second and third are
hatched), the memory of each device below. The fill at the start and the drain at the end are
the bubble.
"""),
    code('''
show(plot_result(est.result))
'''),
    md("""
With a hundred micro-batches the chart shows how busy each device is (dark: computing). The
same layout with 16 micro-batches per pipeline (a smaller global batch), bar by bar, shows the
interleaved order: the chunks, the fill and the drain.
"""),
    code('''
small = sim.estimate(MODEL, GPU, **{**layout, "global_batch": DP * MICRO_BATCH * 16})
show(plot_result(small.result))
'''),
    md("""
## 2. Where the time goes, where the memory goes

`est.time_parts` splits the step of one pipeline device (the mean over the devices): the
layers' matmuls (`gemm`), their memory-bound kernels (LayerNorm, softmax, GeLU, dropout:
`memory_bound`), the tensor-parallel collectives the layers wait for (`tp_collectives`), the
embedding and output layer, the pipeline's idle time until the last compute ends
(`pipeline_bubble`), the data-parallel gradient reduction the step still waits for after it
(`grad_reduce`), the optimizer step. They add up to the step.

`est.memory_parts` gives, per pipeline device, the bytes of weights, gradients, optimizer
state (mixed-precision Adam: 2 + 4 + 12 bytes a parameter, divided by ZeRO) and the peak of
activations the schedule holds.
"""),
    code('''
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
'''),
    md("""
The first device holds the most activations: in 1F1B and its interleaved form, device 0 starts
`p` micro-batches (and a bit more when interleaved) before the first backward frees one
(notebook 2). The other parts of the memory are the same on every device except for the
embedding on the first and the output layer on the last. Most of it is the optimizer state:
that is what ZeRO divides over the data-parallel ranks (section 3).

## 3. What each choice buys

One knob at a time, the rest as above:

- **recompute**: keep every activation (`none`), recompute only the attention core (`selective`,
  Korthikanti et al. 2022), or the whole layer from its input (`full`); sequence parallelism
  splits what tensor parallelism leaves whole;
- **interleaving**: `v` chunks per device divide the bubble by `v` (notebook 4);
- **zero-bubble schedules**: split the backward into I and W and fill the bubble with Ws (ZB-H1,
  ZB-H2, ZB-V; Qi et al. 2024);
- **ZeRO**: divide optimizer state (1), gradients too (2), weights too (3) over the `d`
  data-parallel ranks (Rajbhandari et al. 2020);
- **partition**: the same number of layers on every stage (`even`), or the fastest split in
  which every stage fits its GPU (`balanced`: fewer layers where more micro-batches wait).
"""),
    code('''
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
print("refused:", *refused, sep="\\n  ")
'''),
    code('''
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
'''),
    md("""
What to read from it:

- **Recompute** is a memory knob: without it the activations of `p` micro-batches do not fit
  unless sequence parallelism splits them; full recompute fits easily and costs a whole extra
  forward (about a third more time). Selective recompute with sequence parallelism costs a few
  percent (Korthikanti et al. 2022, Table 4: 4 %).
- **Interleaving** shrinks the bubble for a little more memory on the first device and `v` times
  the pipeline transfers.
- **Zero-bubble schedules** shrink the bubble without more devices or micro-batches; ZB-H2 pays
  for it in memory, ZB-V does not.
- **ZeRO** leaves the time nearly alone (its reduce-scatter and all-gather move the bytes of an
  all-reduce) and frees most of the optimizer state; ZeRO-3 would gather the weights for every
  micro-batch, which no pipeline-parallel framework does: the estimate refuses it, with the fix.
- **Partition**: without recompute the first device, which holds the most micro-batches, does
  not fit with an even split; the balanced one moves layers to the later stages until every
  device fits, for a longer step (the slowest stage has more layers). Recompute is the cheaper
  way here.

## 4. How close the estimate is to published measurements

`sim.published` holds the published tables and runs the estimate on each row:
Narayanan et al. 2021, Table 1 (ten GPT models from 1.7B to 1T parameters on 32 to 3072
A100s, TFLOP/s per GPU) and Korthikanti et al. 2022, Table 5 (iteration times of four models
with full recompute and with selective recompute + sequence parallelism). The full tables,
with the per-layer times of Table 4, are printed by `python benchmarks/bench_published.py`
and recorded in [docs/measurements.md](../docs/measurements.md).
"""),
    code('''
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
'''),
    md("""
The estimate is optimistic: it predicts 10 to 23 % more throughput than Table 1 and
9-17 % shorter iterations than Table 5. Its orders agree with the papers (sequence
parallelism shortens the forward; full recompute costs more than selective; the bigger models
reach the higher MFU), and the MFU computed from the published times with our FLOP count equals
the published MFU (tests/test_published.py). Where it is off, and by how much, is recorded in
[docs/measurements.md](../docs/measurements.md); nothing was fitted to make it closer.

## 5. The planner

The planner searches the layouts (t, p, d, micro-batch, schedule, recompute, ZeRO) of a model on
a cluster, keeps those that fit, and ranks them by step time: `sim.plan.search(...)`, and from
the shell `python -m sim.plan`. The SageMaker model parallel library's best practices give
reference configurations to compare with (GPT-2 shapes, sequence 512, on 8 x A100-40GB nodes;
the page gives no hidden size or layers: `sim.sagemaker` picks GPT-2-style shapes of those sizes):
"""),
    code('''
print("params  instances  GPUs  pipeline  tensor  optimizer sharding  checkpointing           batch  micro-batches")
for billions, nodes, pp, tp, sharding, checkpointing, batch, micro in published.SAGEMAKER_REFERENCE:
    print(f"{billions:>5}B  {nodes:>9}  {8 * nodes:>4}  {pp:>8}  {tp:>6}  {str(sharding):>18}  {checkpointing:<22}  "
          f"{batch:>5}  {micro or '-':>13}")

import sim.plan
import sim.model.sagemaker

# sim.sagemaker chooses GPT-2-style shapes of those sizes (its docstring says which and why) and
# reads each row as sim.estimate's arguments: does it fit in 40 GB, and what breaks without
# checkpointing (recompute="none") or optimizer-state sharding (zero=0)?
print("\\nrow   as published          no checkpointing      no sharding")
for key in sim.model.sagemaker.REFERENCES:
    cells = []
    for overrides in ({}, {"recompute": "none"}, {"zero": 0}):
        e = sim.plan.published.sagemaker_estimate(key, **overrides)
        cells.append(f"{max(e.peak_memory) / GiB:5.1f} GiB {'fits' if e.fits else 'OOM ':4}")
    print(f"{key:>4}  " + "     ".join(cells))

# the planner over a narrowed space (the whole space: python -m sim.plan, about ten seconds)
plan = sim.plan.search(MODEL, GPU, gpus=1024, global_batch=1536, top=5, tp=8, recompute="selective", zero=1,
                       sequence_parallel=True, schedules=["1f1b", "interleaved-1f1b", "zbv"])
print(f"\\n{plan.enumerated} configurations, {plan.simulated} simulated; the fastest that fit:")
for r in plan:
    c = r.config
    print(f"t={c.tp} p={c.pp} d={c.dp} b={c.micro_batch} {c.schedule:<16} V={c.virtual}  "
          f"{r.step_time:6.2f} s  MFU {r.mfu:.1%}  peak {r.peak_memory / GiB:5.1f} GiB")
'''),
]


# ============================================================================ 06 closing the loop

LOOP = [
    md("""
# 06 · Closing the loop: profile this machine, predict a run, measure it

The planner (`sim.estimate`) has so far predicted GPUs from datasheets and published tables.
Here it meets a run we can measure. Three steps, all on this machine:

1. **Profile** the device as exec's ranks use it (`exec.profile_device`, docs/exec.md):
   matmuls of the shapes the planner asks for, memory-bound kernels by class, the host's
   cost per op, gloo's collectives and sends. `--quick` takes about ten seconds.
2. **Predict** a step of exec's small GPT with `sim.estimate(..., gpu=sim.load_profile(...))`:
   the model is the same object, `ModelSpec.transformer()`, so the planner's activation bytes
   are what autograd saves (tests/test_saved_bytes.py).
3. **Run** it with `exec.pipeline.runner.run_pipeline` and overlay the predicted and measured timelines.

A shared, loaded machine measures slower than the profile says (read the load average
printed beside the numbers; docs/rules.md, rule 9); the memory does not depend on the load.
"""),
    code(SETUP),
    code(r"""
import os
import tempfile
from pathlib import Path

from exec.profile_device import profile_device
from exec.models.spec import ModelSpec

PROFILE = Path(tempfile.mkdtemp()) / "this-machine.json"
profile_device(PROFILE, "gloo", ranks=2, quick=True, micro_batches=(2,), timeout=120)
profile = sim.load_profile(PROFILE)
print(profile.name, "| load average:", open("/proc/loadavg").read().split()[:3])
print(f"peak fp32 {profile.gpu.peak_flops['fp32'] / 1e9:.0f} GFLOP/s, copy {profile.gpu.hbm_bandwidth / 1e9:.0f} GB/s")
"""),
    code(r"""
SPEC = ModelSpec("gpt", layers=2, hidden=64, heads=4, seq=32, vocab=128, batch_size=8)
MICRO = 4
e = sim.estimate(SPEC.transformer(), gpu=profile, gpus_per_node=2, tp=1, pp=2, dp=1,
                 micro_batch=SPEC.batch_size // MICRO, global_batch=SPEC.batch_size, schedule="1f1b",
                 recompute="none", precision="fp32")
print(f"predicted step {e.step_time * 1e3:.1f} ms, peak memory per rank {[int(b) for b in e.peak_memory]} bytes")
print({k: f"{v * 1e3:.2f} ms" for k, v in e.time_parts.items() if v})
show(plot_result(e.result))  # the predicted step
"""),
    code(r"""
from exec.pipeline.runner import run_pipeline

run = run_pipeline(SPEC, "1f1b", 2, MICRO, steps=3, warmup=1, optimizer="adamw")
measured = sorted(run.train_step_times)[len(run.train_step_times) // 2]
print(f"measured step {measured * 1e3:.1f} ms (error {(e.step_time / measured - 1) * 100:+.0f} %), "
      f"load {open('/proc/loadavg').read().split()[:3]}")
print("peak memory per rank, measured:", [int(b) for b in run.result.peak_memory])
assert [round(b) for b in e.peak_memory] == [round(b) for b in run.result.peak_memory] or \
    max(abs(p / m - 1) for p, m in zip(e.peak_memory, run.result.peak_memory)) < 0.005
show(plot_overlay(e.result, run.result))
"""),
    md("""
The bars drawn light and hatched are the planner's, the narrow solid ones exec's. The peak
memory agrees to AdamW's per-tensor step counters (a few bytes); the step time agrees as
well as the machine is quiet. `benchmarks/bench_plan_vs_run.py` runs the whole grid.
"""),
]


NOTEBOOKS = {
    "01_why_pipelines.ipynb": WHY,
    "02_memory.ipynb": MEMORY,
    "03_real_runs.ipynb": REAL,
    "04_modern_schedules.ipynb": MODERN,
    "05_planning_a_real_run.ipynb": PLANNING,
    "06_closing_the_loop.ipynb": LOOP,
}


def build(cells) -> nbformat.NotebookNode:
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"cell-{i:02d}"  # stable ids: rebuilding does not churn the diff
    nbformat.validate(nb)
    return nb


def main() -> None:
    for name, cells in NOTEBOOKS.items():
        nbformat.write(build(cells), HERE / name)
        print(f"wrote {HERE / name}")


if __name__ == "__main__":
    main()
