# %% [markdown]
# # 9. Your own schedule: write it, have it checked, beat GPipe's memory, run it
#
# Every schedule so far came from a generator (`sim.make_schedule`). Here you write one yourself,
# as text, one line per rank (`0F0 0F1 0B0 ...`: stage, kind, micro-batch, torch's text form), or as
# torch.distributed.pipelining's CSV. The workbench checks it cell by cell and shows what is wrong
# on the step x rank grid (`sim.check_schedule`): a deadlock, an action before its dependency,
# transfers out of NCCL's order, a memory limit exceeded. Then you:
#
# 1. write GPipe by hand and see that it holds all `m` micro-batches;
# 2. try to save memory, make the two classic mistakes, and read the grid that names them;
# 3. write a schedule that holds at most `p - s` micro-batches on stage `s`, check it under a memory
#    limit GPipe fails, and simulate it beside GPipe and the workbench's own 1F1B;
# 4. run it on real ranks with its gradients checked against one process, trace the run with
#    torch.profiler, and lay the trace over the simulation (`exec.measure.trace`).
#
# Sections 1-3 use the simulator alone and run in seconds; section 4 starts processes (torch).

# %%
# Parameters: change them and run all cells again
P = 4          # pipeline stages, one per rank
M = 8          # micro-batches per step
RUN_P, RUN_M = 2, 4   # section 4: the real run (each rank is a process on this machine's cores)

# %%
# %matplotlib inline
from nbhelp import show  # notebooks/nbhelp.py, first: it finds an uninstalled sim

import sim
from sim.plot import plot_compare
from sim.plot.grid import plot_grid

# %% [markdown]
# ## 1. GPipe, by hand
#
# GPipe runs every forward, then every backward. Rank `s` hosts stage `s`; its line lists its actions
# in the order it runs them. The simulator works out *when* each runs: the text says only the order.

# %%
def gpipe_text(p: int, m: int) -> str:
    return "\n".join(" ".join([f"{s}F{i}" for i in range(m)] + [f"{s}B{i}" for i in range(m)]) for s in range(p))


text = gpipe_text(P, M)
print(text)
report = sim.check_schedule(text)
print(report.ok)
gpipe = report.checked()          # the Schedule, or a ScheduleError with the problems and the grid
assert gpipe.programs == sim.make_schedule("gpipe", P, M).programs
assert sim.simulate(gpipe).peak_activations == [M] * P   # every stage holds all m micro-batches

# %% [markdown]
# ## 2. Saving memory: a slow try, two mistakes, and the grid that names them
#
# To hold fewer micro-batches, a stage must run a backward before it has run every forward. A first
# try: every rank alternates forward and backward from the start, `sF0 sB0 sF1 sB1 ...`. It checks
# clean and holds one micro-batch, but it is naive model parallelism: micro-batch 1 enters the
# pipeline only once micro-batch 0 is all the way back, and the bubble is `(p-1)/p`.

# %%
alternating = "\n".join(" ".join(f"{s}F{i} {s}B{i}" for i in range(M)) for s in range(P))
slow = sim.simulate(sim.check_schedule(alternating).checked())
naive = sim.simulate(sim.make_schedule("naive", P, M))
print(f"alternating from the start: bubble {slow.bubble_fraction:.2f}, peak held {slow.peak_activations}")
assert slow.makespan == naive.makespan and slow.peak_activations == [1] * P

# %% [markdown]
# So a stage must run some forwards ahead, a *warm-up*. Mistake 1: the warm-up the wrong way round,
# `s + 1` forwards on stage `s` (the last stage warms up most). Stage 0 runs `0F0` and waits for the
# gradient of micro-batch 0; stage 1 wants `0F1` before its first backward. Nobody moves: the check
# runs the schedule abstractly and marks the cell where each rank gets stuck.

# %%
def warmup_text(p: int, m: int, warm) -> str:
    """Stage s: warm(s) forwards, then one backward and one forward in turn, then the backwards left."""
    lines = []
    for s in range(p):
        w = min(warm(s), m)
        order = [f"{s}F{i}" for i in range(w)]
        for i in range(m):
            order.append(f"{s}B{i}")
            if w + i < m:
                order.append(f"{s}F{w + i}")
        lines.append(" ".join(order))
    return "\n".join(lines)


report = sim.check_schedule(warmup_text(P, M, lambda s: s + 1))
print(report)
show(plot_grid(report))
assert {p.kind for p in report.problems} == {"deadlock"}
assert (0, 1, "0B0") in [(p.rank, p.step, p.action) for p in report.problems]

# %% [markdown]
# Second mistake: a backward written before its own forward (here on the last rank, `B0` before
# `F0`). The check says which action it needs and where that action stands.

# %%
swapped = gpipe_text(P, M).splitlines()
last = swapped[-1].split()
last[0], last[M] = last[M], last[0]          # 3B0 first, 3F0 where 3B0 was
swapped[-1] = " ".join(last)
report = sim.check_schedule("\n".join(swapped))
print(report.problems[0])
show(plot_grid(report))
assert report.problems[0].kind == "before its dependency" and report.problems[0].action == f"{P - 1}B0"

# %% [markdown]
# ## 3. A schedule that beats GPipe's memory
#
# The fix: stage `s` warms up with `p - s` forwards, `p - s - 1` more than the last stage, so
# that the gradient of micro-batch 0 is on its way back by the time it runs out of work; then it
# alternates one forward and one backward; then it drains the backwards. That is 1F1B
# (PipeDream-Flush), and here you write it yourself. The memory check takes a limit: at most
# `p` micro-batches held at once, which GPipe (holding `m`) fails.

# %%
def my_schedule_text(p: int, m: int) -> str:
    return warmup_text(p, m, lambda s: p - s)      # the last stage warms up least: 1 forward


mine_text = my_schedule_text(P, M)
print(mine_text)
report = sim.check_schedule(mine_text, max_held=P)
print(report)
mine = report.checked()
over = sim.check_schedule(text, max_held=P)     # GPipe under the same limit
show(plot_grid(over, title=f"GPipe under a limit of {P} micro-batches held"))
assert not over.ok and {p.kind for p in over.problems} == {"memory"}

# %% [markdown]
# Simulated beside GPipe and the workbench's own 1F1B, memory on one scale: the same bubble as
# GPipe, and stage `s` holds `min(p - s, m)` micro-batches instead of `m`.

# %%
costs = sim.Costs(forward=1.0, backward=2.0)
results = [sim.simulate(s, costs) for s in (gpipe, mine, sim.make_schedule("1f1b", P, M))]
show(plot_compare(results))
g, me, ref = results
print("peak micro-batches held:", "GPipe", g.peak_activations, " yours", me.peak_activations)
assert me.peak_activations == [min(P - s, M) for s in range(P)] == ref.peak_activations
assert me.makespan == g.makespan == ref.makespan   # the same (m + p - 1)(F + B): memory saved for free
assert max(me.peak_activations) < max(g.peak_activations)

# %% [markdown]
# The same schedule as torch.distributed.pipelining's CSV (one row a rank; torch writes an
# overlapped pair as one cell, `(0F3;3B1)OVERLAP_F_B`, and the reader takes both), read back equal:

# %%
csv = sim.schedule_text(mine, csv=True)
print(csv)
assert sim.read_schedule(csv).programs == mine.programs

# %% [markdown]
# ## 4. On real ranks, its gradients checked, its trace over the simulation
#
# `exec.run_pipeline` runs any `Schedule` on one process per rank (gloo on CPU) and checks the
# first step's gradients against the same step in one process. With `trace=FILE` it runs one more
# step under torch.profiler, each action a span named as in the text (`1B0`); `read_trace` maps the
# spans back onto the schedule, says which actions are missing, and lays them over the simulation.
# The costs of that simulation are the trace's own medians of F and B (one number each, measured
# in this run), so what differs is the order and the waits, not the speed. A compute's span
# includes its wait for the data it receives, as torch's runtime's own spans do.

# %%
import os
import statistics
import tempfile

import torch  # exec needs it: pip install -e ".[exec]"
from exec import ModelSpec, RunConfig, run_pipeline
from exec.measure.trace import read_trace

small = sim.check_schedule(my_schedule_text(RUN_P, RUN_M), max_held=RUN_P).checked()
trace_file = os.path.join(tempfile.mkdtemp(), "mine.trace.json")
run = run_pipeline(ModelSpec(layers=4, hidden=32, batch_size=8), small,
                   config=RunConfig(steps=1, warmup=1, optimizer="sgd", trace=trace_file))
print("gradients match one process:", run.grad_match, f"(max difference {run.max_grad_diff:.2g})")
assert run.grad_match

match = read_trace(trace_file, small)
assert match.ok, match.missing
F = statistics.median(e.duration for e in match.measured.events if e.action.kind is sim.Kind.F)   # seconds
B = statistics.median(e.duration for e in match.measured.events if e.action.kind is sim.Kind.B)
simulated = sim.simulate(small, sim.Costs(forward=F * 1e3, backward=B * 1e3))   # in ms
print(match.table(simulated))
show(match.overlay(sim.simulate(small, sim.Costs(forward=F, backward=B))))

# %% [markdown]
# **Try it.** Write a schedule of your own in the text cell above section 3 (keep the forwards of a
# stage in micro-batch order, as the runtime expects): can you hold even less than `p - s` on stage
# `s` without adding bubble? (Hint: not with full backwards; notebook 4's zero-bubble schedules split
# the backward into `I` and `W`, and `sim.check_schedule` reads those too.)
