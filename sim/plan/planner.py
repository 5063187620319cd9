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
(1-3 only where dp > 1, 2 only where pp = 1, as `sim.estimate` allows; 3 with pp > 1 is FSDP,
its gathers and reduce-scatters actions on the step, with FSDP2's reshard_after_forward on and,
where a device holds several stages, off); sequence parallelism off and on (on only where
tp > 1); for a mixture of experts, ep and expert_tp as Megatron-Core folds them
(`sim.plan.space.expert_splits`: sequence parallelism on with tp > 1, ZeRO 0 and 1). With pp = 1 every schedule is gradient
accumulation over the micro-batches, so only one is tried: 1f1b (or, where it is not named,
the first named, with V = 1 if it takes that). zb-auto is searched only when named
(`schedules`): its own search simulates dozens of steps for each one it builds.

Each configuration is then checked by `sim.estimate`, which simulates its step; the rows are
the `top` that fit with the shortest steps, in one total order (`rank_key`): step time, then
peak memory, then the configuration's fields, so that `top=1` and `top=10` name the same best.
A configuration fits when its peak is within the GPU's memory less `memory_headroom`; one
whose step is too large to simulate in seconds or in this machine's memory (`sim.plan.layout.size_problem`,
`sim.limits.most_cells`) is
counted and skipped. To keep a search of thousands of configurations within seconds,
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

import bisect
import heapq
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterator

from sim.cost.fp8 import check_fp8
from sim.cost.layer import check_timed
from sim.hardware.gpus import GPU
from sim.hardware.kernels import precision_bytes
from sim.hardware.profile import DeviceProfile, resolve
from sim.model.footprint import DEFAULT_OPTIMIZER, check_optimizer
from sim.model.transformer import Transformer
from sim.schedule.ir import ScheduleError

from sim.limits import collector_paused, most_cells

from .bounds import Bounds
from .estimation import Estimate, estimate_layout
from .layout import DEFAULT_HEADROOM, MAX_CELLS, Layout, check_layout, size_problem, usable_memory
from sim.model.registry import find_model, model_name
from .space import MAX_CONFIGS, NOT_ENUMERATED, TOP, configurations, positive, schedule_options, searched
from .steps import Steps

__all__ = ["search", "Plan", "Row", "rank_of", "rank_key"]

_MEMORY = "static memory over the GPU's usable memory (bound, not simulated)"
TOO_LARGE = "step too large to simulate on this machine (not simulated)"
LARGEST_RUN = 16_384  # GPUs of the largest published training run (Llama 3 405B's H100s)
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
    config: Layout
    micro_batches: int
    step_time: float
    tflops_per_gpu: float
    mfu: float
    bubble_fraction: float
    peak_memory: float          # bytes, the fullest pipeline device
    fits: bool
    estimate: Estimate | None = field(default=None, compare=False, repr=False)

    def summary(self) -> dict:
        return {**searched(self.config), "micro_batches": self.micro_batches, "step_time": self.step_time,
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
    usable_memory: float = math.inf  # bytes a GPU may fill: its memory less the headroom
    warnings: list = field(default_factory=list)
    precision: str = "bf16"  # every configuration's ("fp8": Transformer Engine's FP8 Linears, `sim.cost.fp8`)

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
                "global_batch": self.global_batch, "precision": self.precision, "enumerated": self.enumerated,
                "simulated": self.simulated,
                "seconds": self.seconds, "usable_memory": self.usable_memory,
                "warnings": self.warnings, "dropped": dict(self.dropped), "rows": [r.summary() for r in self.rows]}


# ----------------------------------------------------------------------------- the search

def _best_first(configs: list[Layout], bounds: Bounds, memory: float, limit: Callable[[], float],
                dropped: Counter, waiting: Callable[[int], None] = lambda n: None) -> Iterator[tuple[int, Layout, int]]:
    """Yield (index, configuration, how many still wait) in the order of their step-time
    bounds, each once its tightest bound still comes first, until the next bound exceeds
    `limit()`: then so do all the others', and they are dropped. A heap of (bound, index,
    level): a configuration enters with `Bounds.average` (if its schedule-free memory bound
    fits), and as it comes to the front its memory is bounded with its schedule and its
    step-time bound tightened, one level of `_TIGHTER` at a time. `waiting(n)` hears how many
    still wait as each is dropped (a progress bar moves while nothing is simulated)."""
    memory *= 1 + _ROUNDING
    queue = []
    for index, config in enumerate(configs):
        if bounds.memory_average(config) > memory:
            dropped[_MEMORY] += 1
            waiting(len(configs) - dropped[_MEMORY])
        else:
            queue.append((bounds.average(config), index, 0))
    heapq.heapify(queue)
    while queue:
        bound, index, level = queue[0]
        if bound > limit() * (1 + _ROUNDING):
            dropped.update(_LEFT[lv] for _, _, lv in queue)
            return
        heapq.heappop(queue)
        config = configs[index]
        if level == 0 and bounds.memory_above(config, memory):
            dropped[_MEMORY] += 1
            waiting(len(queue))
        elif level < len(_TIGHTER) and (level == 0 or limit() < math.inf):
            # (the unit-cost simulation only once there is a limit to compare it with)
            heapq.heappush(queue, (max(bound, getattr(bounds, _TIGHTER[level])(config)), index, level + 1))
        else:
            yield index, config, len(queue)


def _row(config: Layout, est: Estimate, keep: bool) -> Row:
    return Row(config, est.layout.micro_batches, est.step_time, est.tflops_per_gpu, est.mfu, est.bubble_fraction,
               max(est.peak_memory), est.fits, est if keep else None)


def same_time(seconds: float) -> float:
    """`seconds` to 12 significant digits: what `rank_key` compares."""
    return float(f"{seconds:.12g}")


def rank_key(row: Row) -> tuple:
    """The total order of the rows: step time, then peak memory, then the configuration's
    searched fields (tp, pp, dp, micro-batch, schedule, V, recompute, ZeRO,
    sequence parallelism, cp, ep, expert_tp; FSDP's reshard after forward on, its default, before
    off; a schedule without overlapped pairs before with), so that any `top` ranks the same rows first. Step times are
    compared to 12 significant digits: two layouts that differ only in the last bits of a
    float sum (a reduction timed in another order) tie, and memory decides."""
    config = row.config
    return (same_time(row.step_time), row.peak_memory, config.tp, config.pp, config.dp, config.micro_batch, config.schedule,
            config.virtual, config.recompute, config.zero, config.sequence_parallel, config.cp,
            config.ep, config.expert_tp, not config.reshard_after_forward, config.overlap)


def _too_large(configs: list[Layout], dropped: Counter) -> list[Layout]:
    """The configurations whose steps can be simulated in seconds (`layout.size_problem`) within
    this machine's memory (`sim.limits.most_cells`: asked once, here); the others are counted
    in `dropped`."""
    limit, kept = min(MAX_CELLS, most_cells()), []
    for config in configs:
        if size_problem(config, limit):
            dropped[TOO_LARGE] += 1
        else:
            kept.append(config)
    return kept


def _estimate(steps: Steps, config: Layout) -> Estimate:
    """`sim.estimate` of a configuration of the search, on the search's `steps`."""
    return estimate_layout(steps, config, check_layout(steps.model, steps.profile, config), **schedule_options(config))


def search(model: Transformer | str, gpu: DeviceProfile | GPU | str, gpus: int, global_batch: int, *, top: int | None = TOP,
           max_step_time: float | None = None, precision: str = "bf16", gpus_per_node: int = 8,
           nics_per_node: int | None = None, partition="even", max_configs: int = MAX_CONFIGS,
           memory_headroom: float = DEFAULT_HEADROOM, progress: Callable[[int, int], None] | None = None,
           optimizer: str = DEFAULT_OPTIMIZER,
           **limits) -> Plan:
    """Search the layouts of `gpus` GPUs for a step of `global_batch` sequences of `model`
    (see the module's docstring); return the `top` fastest that fit (all with top=None),
    only those at most `max_step_time` if it is given; `nics_per_node` defaults to gpus_per_node;
    `memory_headroom` is kept free of each GPU's memory (`sim.estimate`'s). `optimizer`
    (`sim.model.footprint.OPTIMIZERS`) is the run's, for every configuration, and so is `precision`
    ("fp8": Transformer Engine's FP8 Linears, searched on a profile that times them, refused by
    `sim.cost.fp8.check_fp8` before any work on one that does not).
    `limits` narrow the space: tp, cp, pp, micro_batch, schedules, virtual, recompute, zero,
    sequence_parallel, ep, expert_tp (each one value or a list), max_micro_batch, max_virtual. `progress(done,
    total)` is called as configurations are settled. Raises ValueError naming the fix."""
    start = time.perf_counter()
    model, profile = find_model(model), resolve(gpu)
    nics_per_node = _check_request(model, profile, gpus, global_batch, gpus_per_node, nics_per_node, top, precision,
                                   optimizer)
    usable = usable_memory(profile.memory, memory_headroom)
    dropped = Counter()
    run = Layout(global_batch=global_batch, precision=precision, gpus_per_node=gpus_per_node, nics_per_node=nics_per_node,
                 partition=partition, memory_headroom=memory_headroom, optimizer=optimizer)
    configs = configurations(model, gpus, global_batch, run=run, dropped=dropped, **limits)
    if len(configs) > max_configs:
        raise ValueError(f"the search has {len(configs)} configurations, more than max_configs={max_configs}; "
                         f"narrow it (tp, pp, micro_batch, schedules, recompute, zero) or raise max_configs")
    enumerated = len(configs)
    configs = _too_large(configs, dropped)
    cap = math.inf if max_step_time is None else max_step_time
    with collector_paused():  # the bounds' schedules and costs live until `_settle` returns: nothing to collect
        rows, points = _settle(model, profile, configs, usable, top, cap, dropped, progress)
    return Plan(model, profile, gpus, global_batch, rows, points, dropped, enumerated, len(points),
                time.perf_counter() - start, usable, _warnings(gpus), precision)


def _settle(model: Transformer, profile: DeviceProfile, configs: list[Layout], usable: float, top: int | None,
            cap: float, dropped: Counter, progress: Callable[[int, int], None] | None) -> tuple[list[Row], list[Row]]:
    """Simulate `configs` best first (`_best_first`) on the estimator's steps, shared by the bounds
    and the estimates; return the rows that fit, fastest first (the best holding its step), and every
    simulated point. The steps and bounds (schedules, stage costs) die as it returns, before `search`
    lets the collector run again: it has none of their objects to walk."""
    steps = Steps(model, profile)
    bounds = Bounds(model, profile, steps)
    best: list[tuple[tuple, Row]] = []   # the `top` first that fit, in `rank_key` order
    points: list[Row] = []

    def limit() -> float:
        """The step time a configuration must not exceed to enter the rows."""
        return min(best[-1][1].step_time if top is not None and len(best) == top else math.inf, cap)

    total = len(configs)
    if progress is not None:
        progress(0, total)
    def settled(waiting: int) -> None:  # what no longer waits: dropped or simulated
        if progress is not None:
            progress(total - waiting, total)

    for _, config, waiting in _best_first(configs, bounds, usable, limit, dropped, settled):
        try:
            est = _estimate(steps, config)
        except (ValueError, ScheduleError) as err:
            dropped[f"refused by the estimate: {str(err).splitlines()[0][:60]}"] += 1
            continue
        finally:
            if progress is not None:
                progress(total - waiting, total)
        row = _row(config, est, keep=False)
        points.append(row)
        if not row.fits:
            dropped["does not fit (simulated)"] += 1
            continue
        bisect.insort(best, (rank_key(row), _row(config, est, keep=top is not None)))  # top=None: rows keep no step
        del best[top if top is not None else len(best):]
    if progress is not None:
        progress(total, total)
    rows = [row for _, row in best if row.step_time <= cap]
    if rows and rows[0].estimate is None:  # the best keeps its step, for the figures
        rows[0] = _row(rows[0].config, _estimate(steps, rows[0].config), keep=True)
    return rows, points


def _check_request(model: Transformer, profile: DeviceProfile, gpus: int, global_batch: int, gpus_per_node: int,
                   nics_per_node: int | None, top: int | None, precision: str, optimizer: str) -> int:
    """`search`'s checks before any work (ValueError, one line naming the fix); returns the NICs a
    node (default: one a GPU)."""
    check_timed(model, moe_layers=True)  # what the cost layer cannot time is refused before the search
    positive("gpus", gpus), positive("global_batch", global_batch), positive("gpus_per_node", gpus_per_node)
    if top is not None:
        positive("top", top)
    precision_bytes(precision), check_optimizer(optimizer)
    if precision == "fp8":  # the profile must time FP8's GEMMs
        check_fp8(profile)
    return positive("nics_per_node", gpus_per_node if nics_per_node is None else nics_per_node)


def _warnings(gpus: int) -> list[str]:
    """What is unusual about the request itself."""
    if gpus > LARGEST_RUN:
        return [f"{gpus:,} GPUs: more than the {LARGEST_RUN:,} of the largest published training run "
                f"(Llama 3 405B; Dubey et al. 2024, Sec. 3.3); its network is not modelled at that scale"]
    return []


def rank_of(plan: Plan, step_time: float) -> int:
    """Where a configuration of `step_time` would rank among the plan's rows (1 = fastest);
    the plan must hold every row at least as fast (search with top=None and max_step_time)."""
    return 1 + sum(r.step_time < step_time for r in plan.rows)
