"""The planner: search the parallel layouts of a training run for the fastest that fits.

    >>> import sim.plan
    >>> plan = sim.plan.search("megatron-1.7b", "a100-80gb", gpus=16, global_batch=64, top=3)  # doctest: +SKIP
    >>> [(r.config.tp, r.config.pp, r.config.schedule, round(r.step_time, 3)) for r in plan]  # doctest: +SKIP

What is searched (each can be narrowed): tp, powers of two within a node that divide the
model's heads, KV heads, MLP width and vocabulary; pp, every divisor of gpus/tp up to the
layers; dp = gpus / (tp*pp), which must divide the global batch; the micro-batch b, every
divisor of global_batch/dp up to `max_micro_batch`; every schedule of `sim.SCHEDULES` with
the chunks V it takes (interleaved-1f1b and looped-bfs: each V of 2..`max_virtual` with
pp*V dividing the layers, as Megatron-LM requires); recompute none, selective, full; ZeRO 0-3
(1-3 only where dp > 1, 3 only where pp = 1, as `sim.estimate` allows); sequence
parallelism off and on (on only where tp > 1). With pp = 1 every schedule is gradient
accumulation over the micro-batches, so only one is tried: 1f1b (or, where it is not named,
the first named, with V = 1 if it takes that). zb-auto is searched only when named
(`schedules`): its own search simulates dozens of steps for each one it builds.

Each configuration is then checked by `sim.estimate`, which simulates its step; the rows are
the `top` that fit with the shortest steps (the first enumerated on a tie), shown by step
time, then peak memory. To keep a search of thousands of configurations within seconds,
lower bounds (`sim.plan_bounds`) drop configurations before they are simulated; none can
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
import itertools
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

from .estimation import Estimate, estimate
from sim.model.footprint import ZERO_STAGES
from sim.hardware.gpus import GPU
from sim.hardware.profile import DeviceProfile, resolve
from sim.schedule.ir import ScheduleError
from sim.hardware.kernels import precision_bytes
from .bounds import Bounds, held
from sim.schedules import SCHEDULES, lookup
from sim.model.transformer import RECOMPUTE, Transformer, model as model_by_name

__all__ = ["search", "Plan", "Row", "Config", "configurations", "layouts", "rank_of", "find_model", "model_name",
           "Bounds", "held"]

MAX_MICRO_BATCH = 16   # largest micro-batch tried by default (Megatron-LM's Table 1 runs use 1 to 16)
MAX_VIRTUAL = 4        # most chunks per device tried for interleaved-1f1b and looped-bfs
MAX_CONFIGS = 200_000  # most configurations a search enumerates before it refuses
TOP = 10
# Every schedule but zb-auto, whose own search simulates dozens of candidate steps for each
# one it builds (minutes for pp=64 and hundreds of micro-batches); name it to include it.
DEFAULT_SCHEDULES = tuple(name for name in SCHEDULES if name != "zb-auto")
# Where it is named, the planner's zb-auto runs its heuristic at most this many times per
# configuration (`sim.search.zbauto.zb_auto(max_runs=)`: the likeliest fastest runs first), so that
# one configuration of hundreds of micro-batches takes seconds, not minutes.
ZB_AUTO_RUNS = 4
_MEMORY = "static memory over the GPU's (bound, not simulated)"
# What `configurations` leaves out before a configuration is made: these count layouts and
# (schedule, V) pairs, not configurations (`Plan.not_enumerated`).
NOT_ENUMERATED = ("dp does not divide the global batch (tp x pp layouts)",
                  "batch does not split into micro-batches (layouts)", "more stages than layers",
                  "the schedule refuses these sizes")
# The bounds add the estimate's own numbers in another order than the simulation does, and
# some (pp = 1) are exact: one may come out above the value it bounds by a rounding error.
_ROUNDING = 1e-9
_TIGHTER = ("time", "schedule_time")  # the `Bounds` asked in turn after `average`
_LEFT = ("step-time bound (average device) above the top's (not simulated)",  # by the level they reached
         "step-time bound (path per device) above the top's (not simulated)",
         "schedule's step-time bound above the top's (not simulated)")


@dataclass(frozen=True)
class Config:
    """One point of the search: how the run is split (the arguments of `sim.estimate`)."""
    tp: int
    pp: int
    dp: int
    micro_batch: int
    schedule: str
    virtual: int
    recompute: str
    zero: int
    sequence_parallel: bool

    def kwargs(self) -> dict:
        """Keyword arguments of `sim.estimate` for this configuration."""
        return dict(tp=self.tp, pp=self.pp, dp=self.dp, micro_batch=self.micro_batch, schedule=self.schedule,
                    virtual=self.virtual, recompute=self.recompute, zero=self.zero,
                    sequence_parallel=self.sequence_parallel)

    def options(self) -> dict:
        """The schedule's options the planner adds to `kwargs` (zb-auto: its budget of runs,
        `ZB_AUTO_RUNS`)."""
        return {"max_runs": ZB_AUTO_RUNS} if self.schedule == "zb-auto" else {}


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


# ----------------------------------------------------------------------------- the space

def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _tp_ok(m: Transformer, tp: int) -> bool:
    return all(n % tp == 0 for n in (m.heads, m.kv_heads, m.ffn, m.vocab))


def _choices(name: str, given, default: Sequence) -> list:
    """The user's values for a searched dimension (one value or several), else the default."""
    if given is None:
        return list(default)
    values = list(given) if isinstance(given, (list, tuple, set, frozenset, range)) else [given]
    if not values:
        raise ValueError(f"{name}: give at least one value")
    return values


def _positive(name: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{name} must be a positive int, got {v!r}")
    return v


def _tensor_sizes(m: Transformer, gpus: int, tp, gpus_per_node: int) -> list[int]:
    powers = [2 ** k for k in range(gpus_per_node.bit_length()) if 2 ** k <= gpus_per_node]
    if tp is None:
        return [t for t in powers if gpus % t == 0 and _tp_ok(m, t)]
    sizes = _choices("tp", tp, powers)
    ok = [t for t in powers if _tp_ok(m, t)]
    for t in sizes:
        _positive("tp", t)
        if not _tp_ok(m, t):
            raise ValueError(f"tp={t} does not divide the model's {m.heads} heads, {m.kv_heads} KV heads, "
                             f"{m.ffn} MLP width and {m.vocab} vocabulary; use tp in {ok}")
        if t > gpus_per_node:
            raise ValueError(f"tp={t} spans nodes of {gpus_per_node} GPUs; use tp <= {gpus_per_node} "
                             f"(or set gpus_per_node)")
        if gpus % t:
            raise ValueError(f"{gpus} GPUs do not split into tensor-parallel groups of {t}; "
                             f"give a GPU count that is a multiple of {t}")
    return sorted(set(sizes))


def layouts(m: Transformer, gpus: int, global_batch: int, *, tp=None, pp=None, micro_batch=None,
            gpus_per_node: int = 8, max_micro_batch: int = MAX_MICRO_BATCH,
            dropped: Counter | None = None) -> list[tuple[int, int, int, int]]:
    """Every (tp, pp, dp, micro_batch) with tp*pp*dp = gpus and global_batch = dp * b * m
    for a whole number m of micro-batches. Raises ValueError naming the fix when the given
    sizes leave none."""
    dropped = Counter() if dropped is None else dropped
    out = []
    for t in _tensor_sizes(m, gpus, tp, gpus_per_node):
        pps = [p for p in _divisors(gpus // t) if p <= m.layers] if pp is None else _choices("pp", pp, [])
        for p in pps:
            _positive("pp", p)
            if (gpus // t) % p:
                raise ValueError(f"{gpus} GPUs are not a multiple of tp*pp = {t}*{p} = {t * p}; give a GPU "
                                 f"count that is a multiple of {t * p} or another pp")
            d = gpus // (t * p)
            if global_batch % d:
                dropped["dp does not divide the global batch (tp x pp layouts)"] += 1
                continue
            per = global_batch // d
            bs = [b for b in _divisors(per) if b <= max_micro_batch] if micro_batch is None \
                else [_positive("micro_batch", b) for b in _choices("micro_batch", micro_batch, [])]
            for b in bs:
                if per % b:
                    dropped["batch does not split into micro-batches (layouts)"] += 1
                    continue
                out.append((t, p, d, b))
    if not out:
        sizes = "" if micro_batch is None else f" of {','.join(map(str, _choices('micro_batch', micro_batch, [])))}"
        raise ValueError(f"global batch {global_batch} does not split into whole micro-batches{sizes} over the dp "
                         f"replicas of any layout of {gpus} GPUs; make it a multiple of dp * micro_batch "
                         f"(dp = gpus / (tp * pp))")
    return out


def _schedule_chunks(m: Transformer, pp: int, micro: int, names: Sequence[str], max_virtual: int,
                     virtual, dropped: Counter) -> list[tuple[str, int]]:
    """(schedule, V) pairs that the schedule accepts for pp devices and `micro` micro-batches."""
    if pp == 1:  # gradient accumulation whatever the schedule: one of them, V = 1 (if it takes that)
        names = ["1f1b"] if "1f1b" in names or not names else names[:1]
    out = []
    for name in names:
        gen = SCHEDULES[name]
        if pp == 1:
            vs = [1]
        elif virtual is not None:
            vs = _choices("virtual", virtual, [])
        elif name in ("interleaved-1f1b", "looped-bfs"):
            vs = [v for v in range(2, max_virtual + 1) if m.layers % (pp * v) == 0]
        else:
            vs = [gen.virtual]
        for v in vs:
            if pp * v > m.layers:
                dropped["more stages than layers"] += 1
            elif gen.refusal(pp, micro, v):
                dropped["the schedule refuses these sizes"] += 1
            else:
                out.append((name, v))
    return out


def configurations(m: Transformer, gpus: int, global_batch: int, *, schedules=None, recompute=None, zero=None,
                   sequence_parallel=None, virtual=None, max_virtual: int = MAX_VIRTUAL,
                   dropped: Counter | None = None, **layout_limits) -> list[Config]:
    """Every configuration of the search space (see the module's docstring)."""
    dropped = Counter() if dropped is None else dropped
    names = [lookup(s)[0] for s in _choices("schedules", schedules, DEFAULT_SCHEDULES)]
    recomputes = _choices("recompute", recompute, RECOMPUTE)
    for r in recomputes:
        if r not in RECOMPUTE:
            raise ValueError(f"recompute must be one of {', '.join(RECOMPUTE)}; got {r!r}")
    zeros = _choices("zero", zero, ZERO_STAGES)
    for z in zeros:
        if z not in ZERO_STAGES:
            raise ValueError(f"zero must be one of 0, 1, 2, 3 (ZeRO stage); got {z!r}")
    sps = _choices("sequence_parallel", sequence_parallel, (False, True))
    out = []
    for t, p, d, b in layouts(m, gpus, global_batch, dropped=dropped, **layout_limits):
        micro = global_batch // (d * b)
        zs = [z for z in zeros if (z == 0 or d > 1) and (z < 3 or p == 1)] or [0]
        for (name, v), r, z, sp in itertools.product(
                _schedule_chunks(m, p, micro, names, max_virtual, virtual, dropped), recomputes, zs,
                [s for s in sps if t > 1 or not s] or [False]):
            out.append(Config(t, p, d, b, name, v, r, z, sp))
    return out


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
           progress: Callable[[int, int], None] | None = None, **limits) -> Plan:
    """Search the layouts of `gpus` GPUs for a step of `global_batch` sequences of `model`
    (see the module's docstring); return the `top` fastest that fit (all with top=None),
    only those at most `max_step_time` if it is given; `nics_per_node` defaults to gpus_per_node.
    `limits` narrow the space: tp, pp, micro_batch, schedules, virtual, recompute, zero,
    sequence_parallel (each one value or a list), max_micro_batch, max_virtual. `progress(done,
    total)` is called as configurations are settled. Raises ValueError naming the fix."""
    start = time.perf_counter()
    m = find_model(model) if isinstance(model, str) else model
    g = resolve(gpu)
    _positive("gpus", gpus), _positive("global_batch", global_batch), _positive("gpus_per_node", gpus_per_node)
    nics_per_node = _positive("nics_per_node", gpus_per_node if nics_per_node is None else nics_per_node)
    if top is not None:
        _positive("top", top)
    precision_bytes(precision)
    dropped = Counter()
    configs = configurations(m, gpus, global_batch, gpus_per_node=gpus_per_node, dropped=dropped, **limits)
    if len(configs) > max_configs:
        raise ValueError(f"the search has {len(configs)} configurations, more than max_configs={max_configs}; "
                         f"narrow it (tp, pp, micro_batch, schedules, recompute, zero) or raise max_configs")
    bounds = Bounds(m, g, global_batch, precision, gpus_per_node, partition, nics_per_node)
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
                         partition=partition, global_batch=global_batch, **c.kwargs(), **c.options())
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
                       partition=partition, global_batch=global_batch, **rows[0].config.kwargs(),
                       **rows[0].config.options())
        rows[0] = _row(rows[0].config, estimate(m, g, **best_kw), keep=True)
    return Plan(m, g, gpus, global_batch, rows, points, dropped, len(configs), len(points),
                time.perf_counter() - start)


def find_model(name: str) -> Transformer:
    """A preset by name: `sim.MODELS`, or SageMaker's GPT-2 models (`sim.model.sagemaker.MODELS`)."""
    from sim.model.sagemaker import MODELS as SAGEMAKER
    from sim.model.transformer import MODELS
    key = name.strip().lower().replace("_", "-") if isinstance(name, str) else name
    if key in SAGEMAKER:
        return SAGEMAKER[key]
    if key not in MODELS:
        raise ValueError(f"unknown model {name!r}; known: {', '.join([*MODELS, *SAGEMAKER])}")
    return model_by_name(key)


def model_name(m: Transformer) -> str:
    """The preset's name of `m`, or its shape."""
    from sim.model.sagemaker import MODELS as SAGEMAKER
    from sim.model.transformer import MODELS
    return next((n for n, x in {**MODELS, **SAGEMAKER}.items() if x == m),
                f"l{m.layers}-h{m.hidden}-a{m.heads}-s{m.seq}-v{m.vocab}")


def rank_of(plan: Plan, step_time: float) -> int:
    """Where a configuration of `step_time` would rank among the plan's rows (1 = fastest);
    the plan must hold every row at least as fast (search with top=None and max_step_time)."""
    return 1 + sum(r.step_time < step_time for r in plan.rows)
