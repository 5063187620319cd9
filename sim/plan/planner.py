"""The planner: search the parallel layouts of a training run for the fastest that fits.

    >>> import sim.plan
    >>> plan = sim.plan.search("megatron-1.7b", "a100-80gb", gpus=16, global_batch=64, top=3)  # doctest: +SKIP
    >>> [(r.config.tp, r.config.pp, r.config.schedule, round(r.step_time, 3)) for r in plan]  # doctest: +SKIP

What is searched (each can be narrowed): tp, powers of two within a node that divide the
model's heads, KV heads, MLP width and vocabulary; pp, every divisor of gpus/tp up to the
layers; dp = gpus / (tp*pp), which must divide the global batch; the micro-batch b, every
divisor of global_batch/dp up to `max_micro_batch`; every schedule of `sim.SCHEDULES` with
the chunks V it takes (a schedule whose `takes_virtual` is true, interleaved-1f1b and looped-bfs: each V of 2..`max_virtual` with
pp*V dividing the layers, as Megatron-LM requires); recompute none, selective, full; ZeRO 0-3
(1-3 only where dp > 1, 3 only where pp = 1, as `sim.estimate` allows); sequence
parallelism off and on (on only where tp > 1). With pp = 1 every schedule is gradient
accumulation over the micro-batches, so only one is tried: 1f1b (or, where it is not named,
the first named, with V = 1 if it takes that). zb-auto is searched only when named
(`schedules`): its own search simulates dozens of steps for each one it builds.

Each configuration is then checked by `sim.estimate`, which simulates its step; the rows are
the `top` that fit with the shortest steps (the first enumerated on a tie), shown by step
time, then peak memory. To keep a search of thousands of configurations within seconds,
lower bounds (`sim.plan.bounds`) drop configurations before they are simulated; none can
drop one that would have ranked (tests check each against the estimate, and the search
against an exhaustive loop):

- memory: the average device's weights, gradients and optimizer state plus one stage's
  activations, then, with the schedule, each device's stages' and its most micro-batches
  held at once; a configuration whose bound exceeds the GPU's memory cannot fit.
- time, from the cheapest to the tightest: the average device's computes one after another;
  a path per device through the step's dependencies (the forward up to its first stage,
  all its computes, then the backward down or its gradient reductions); the schedule's
  makespan under unit costs. The search is best first: configurations wait in a heap by
  their bound, a bound is tightened as its configuration comes to the front, and it is
  simulated when its tightest bound still comes first. Once the front's bound exceeds the
  `top`-th best step found (or `max_step_time`), so do all the others', and the search stops.
"""
from __future__ import annotations

import heapq
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterator

from sim.hardware.gpus import GPU
from sim.hardware.kernels import precision_bytes
from sim.hardware.profile import DeviceProfile, resolve
from sim.model.footprint import DEFAULT_OPTIMIZER, check_optimizer
from sim.model.transformer import Transformer
from sim.schedule.ir import ScheduleError

from .bounds import Bounds
from .estimation import Estimate, estimate
from sim.model.registry import find_model, model_name
from .space import MAX_CONFIGS, NOT_ENUMERATED, TOP, Config, configurations, positive

__all__ = ["search", "Plan", "Row", "rank_of"]

_MEMORY = "static memory over the GPU's (bound, not simulated)"
# The bounds add the estimate's own numbers in another order than the simulation does, and
# some (pp = 1) are exact: one may come out above the value it bounds by a rounding error.
_ROUNDING = 1e-9
_TIGHTER = ("time", "schedule_time")  # the `Bounds` asked in turn after `average`
_LEFT = ("step-time bound (average device) above the top's (not simulated)",  # by the level they reached
         "step-time bound (path per device) above the top's (not simulated)",
         "schedule's step-time bound above the top's (not simulated)")


@dataclass(frozen=True)
class Row:
    """A simulated configuration: what its estimate predicts. `estimate` is kept for the
    ranked rows only (it holds the simulated step)."""
    config: Config
    micro_batches: int
    step_time: float
    tflops_per_gpu: float
    mfu: float
    bubble_fraction: float
    peak_memory: float          # bytes, the fullest pipeline device
    fits: bool
    estimate: Estimate | None = field(default=None, compare=False, repr=False)

    def summary(self) -> dict:
        return {**self.config.kwargs(), "micro_batches": self.micro_batches, "step_time": self.step_time,
                "tflops_per_gpu": self.tflops_per_gpu, "mfu": self.mfu, "bubble_fraction": self.bubble_fraction,
                "peak_memory": self.peak_memory, "fits": self.fits}


@dataclass
class Plan:
    """What a search found: `rows`, the configurations that fit, fastest first (iterating
    the plan walks them); `points`, every simulated one (for the scatter); `dropped`,
    how many configurations were left out, by reason."""
    model: Transformer
    profile: DeviceProfile  # the device profile it was timed with; `gpu` is its datasheet
    gpus: int
    global_batch: int
    rows: list[Row]
    points: list[Row]
    dropped: Counter
    enumerated: int
    simulated: int
    seconds: float

    @property
    def gpu(self) -> GPU:
        return self.profile.gpu

    def __iter__(self) -> Iterator[Row]:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]

    @property
    def best(self) -> Row | None:
        return self.rows[0] if self.rows else None

    @property
    def not_enumerated(self) -> Counter:
        """What was left out before the configurations were made (layouts, schedule sizes)."""
        return Counter({k: n for k, n in self.dropped.items() if k in NOT_ENUMERATED})

    @property
    def dropped_configs(self) -> Counter:
        """Enumerated configurations left out, by reason: with the rows that fit among the
        simulated ones, they add up to `enumerated`."""
        return Counter({k: n for k, n in self.dropped.items() if k not in NOT_ENUMERATED})

    def summary(self) -> dict:
        """The plan as plain data (JSON-ready)."""
        return {"model": model_name(self.model), "gpu": self.gpu.name, "profile": self.profile.name, "gpus": self.gpus,
                "global_batch": self.global_batch, "enumerated": self.enumerated, "simulated": self.simulated,
                "seconds": self.seconds, "dropped": dict(self.dropped), "rows": [r.summary() for r in self.rows]}


# ----------------------------------------------------------------------------- the search

def _best_first(configs: list[Config], bounds: Bounds, memory: float, limit: Callable[[], float],
                dropped: Counter) -> Iterator[tuple[int, Config, int]]:
    """Yield (index, configuration, how many still wait) in the order of their step-time
    bounds, each once its tightest bound still comes first, until the next bound exceeds
    `limit()`: then so do all the others', and they are dropped. A heap of (bound, index,
    level): a configuration enters with `Bounds.average` (if its schedule-free memory bound
    fits), and as it comes to the front its memory is bounded with its schedule and its
    step-time bound tightened, one level of `_TIGHTER` at a time."""
    memory *= 1 + _ROUNDING
    queue = []
    for i, c in enumerate(configs):
        if bounds.memory_average(c) > memory:
            dropped[_MEMORY] += 1
        else:
            queue.append((bounds.average(c), i, 0))
    heapq.heapify(queue)
    while queue:
        bound, i, level = queue[0]
        if bound > limit() * (1 + _ROUNDING):
            dropped.update(_LEFT[lv] for _, _, lv in queue)
            return
        heapq.heappop(queue)
        c = configs[i]
        if level == 0 and bounds.memory(c) > memory:
            dropped[_MEMORY] += 1
        elif level < len(_TIGHTER) and (level == 0 or limit() < math.inf):
            # (the unit-cost simulation only once there is a limit to compare it with)
            heapq.heappush(queue, (max(bound, getattr(bounds, _TIGHTER[level])(c)), i, level + 1))
        else:
            yield i, c, len(queue)


def _row(c: Config, e: Estimate, keep: bool) -> Row:
    return Row(c, e.layout.micro_batches, e.step_time, e.tflops_per_gpu, e.mfu, e.bubble_fraction,
               max(e.peak_memory), e.fits, e if keep else None)


def search(model: Transformer | str, gpu: DeviceProfile | GPU | str, gpus: int, global_batch: int, *, top: int | None = TOP,
           max_step_time: float | None = None, precision: str = "bf16", gpus_per_node: int = 8,
           nics_per_node: int | None = None, partition="even", max_configs: int = MAX_CONFIGS,
           progress: Callable[[int, int], None] | None = None, optimizer: str = DEFAULT_OPTIMIZER,
           **limits) -> Plan:
    """Search the layouts of `gpus` GPUs for a step of `global_batch` sequences of `model`
    (see the module's docstring); return the `top` fastest that fit (all with top=None),
    only those at most `max_step_time` if it is given; `nics_per_node` defaults to gpus_per_node;
    `optimizer` (`sim.model.footprint.OPTIMIZERS`) is the run's, for every configuration.
    `limits` narrow the space: tp, pp, micro_batch, schedules, virtual, recompute, zero,
    sequence_parallel (each one value or a list), max_micro_batch, max_virtual. `progress(done,
    total)` is called as configurations are settled. Raises ValueError naming the fix."""
    start = time.perf_counter()
    m = find_model(model)
    g = resolve(gpu)
    positive("gpus", gpus), positive("global_batch", global_batch), positive("gpus_per_node", gpus_per_node)
    nics_per_node = positive("nics_per_node", gpus_per_node if nics_per_node is None else nics_per_node)
    if top is not None:
        positive("top", top)
    precision_bytes(precision), check_optimizer(optimizer)
    dropped = Counter()
    configs = configurations(m, gpus, global_batch, gpus_per_node=gpus_per_node, dropped=dropped, **limits)
    if len(configs) > max_configs:
        raise ValueError(f"the search has {len(configs)} configurations, more than max_configs={max_configs}; "
                         f"narrow it (tp, pp, micro_batch, schedules, recompute, zero) or raise max_configs")
    bounds = Bounds(m, g, global_batch, precision, gpus_per_node, partition, nics_per_node, optimizer)
    cap = math.inf if max_step_time is None else max_step_time
    best: list[tuple[float, int, Row]] = []   # a max-heap of the `top` fastest that fit, by (step time, index)
    points: list[Row] = []

    def limit() -> float:
        """The step time a configuration must not exceed to enter the rows."""
        return min(-best[0][0] if top is not None and len(best) == top else math.inf, cap)

    total = len(configs)
    if progress is not None:
        progress(0, total)
    for i, c, waiting in _best_first(configs, bounds, g.memory, limit, dropped):
        try:
            e = estimate(m, g, precision=precision, gpus_per_node=gpus_per_node, nics_per_node=nics_per_node,
                         partition=partition, optimizer=optimizer, global_batch=global_batch, **c.kwargs(), **c.options())
        except (ValueError, ScheduleError) as err:
            dropped[f"refused by the estimate: {str(err).splitlines()[0][:60]}"] += 1
            continue
        finally:
            if progress is not None:
                progress(total - waiting, total)
        row = _row(c, e, keep=False)
        points.append(row)
        if not row.fits:
            dropped["does not fit (simulated)"] += 1
            continue
        kept = _row(c, e, keep=top is not None)  # with top=None the rows do not keep their steps
        if top is None or len(best) < top:
            heapq.heappush(best, (-row.step_time, -i, kept))
        elif (-row.step_time, -i) > best[0][:2]:  # faster, or as fast and enumerated first
            heapq.heapreplace(best, (-row.step_time, -i, kept))
    if progress is not None:
        progress(total, total)
    rows = [r for _, _, r in sorted(best, key=lambda b: (-b[0], b[2].peak_memory, -b[1])) if r.step_time <= cap]
    if rows and rows[0].estimate is None:  # the best keeps its step, for the figures
        best_kw = dict(precision=precision, gpus_per_node=gpus_per_node, nics_per_node=nics_per_node,
                       partition=partition, optimizer=optimizer, global_batch=global_batch, **rows[0].config.kwargs(),
                       **rows[0].config.options())
        rows[0] = _row(rows[0].config, estimate(m, g, **best_kw), keep=True)
    return Plan(m, g, gpus, global_batch, rows, points, dropped, len(configs), len(points),
                time.perf_counter() - start)


def rank_of(plan: Plan, step_time: float) -> int:
    """Where a configuration of `step_time` would rank among the plan's rows (1 = fastest);
    the plan must hold every row at least as fast (search with top=None and max_step_time)."""
    return 1 + sum(r.step_time < step_time for r in plan.rows)
