"""The planner's search space: every layout of a run's GPUs and batch, and the schedules, chunks, recompute, ZeRO and FSDP choices over it."""
from __future__ import annotations

import itertools
from collections import Counter
from typing import Sequence

from sim.model.footprint import ZERO_STAGES
from sim.model.transformer import RECOMPUTE, Transformer
from sim.schedule.registry import SCHEDULES, lookup

from .layout import Layout, check_tp, divides_model

MAX_MICRO_BATCH = 16   # largest micro-batch tried by default (Megatron-LM's Table 1 runs use 1 to 16)
MAX_VIRTUAL = 4        # most chunks per device tried for a schedule that takes V > 1 (`takes_virtual`)
MAX_CONFIGS = 200_000  # most configurations a search enumerates before it refuses
TOP = 10
# Context parallelism is searched where the sequence is long (Megatron-Core's context parallel
# docs: for long-context training; NeMo's long-context recipes start cp at 8K tokens): cp = 1
# below CP_MIN_SEQ; from it, the powers of two that keep at least CP_MIN_TOKENS of the sequence
# on each rank and divide the GPUs left over by tp (8K: cp 1, 2; 32K: up to 8; 128K: up to 32),
# with ring attention (cp_comm="p2p", Megatron-Core's default). Given `cp=`: those sizes.
CP_MIN_SEQ = 8192
CP_MIN_TOKENS = 4096
# The search's schedules unless told: all but zb-auto, whose own search simulates dozens of
# candidate steps for each one it builds (minutes for pp=64 and hundreds of micro-batches),
# and the memory-controlled V shapes (v-min, v-half): building their orders is the search's
# largest cost (GPT-3 on 1024 A100s: 9 s -> 20 s with them), and they win only where 1F1B's
# memory does not fit; name them with `schedules=` / `--schedules` when memory binds.
# DualPipe (two copies of the model, `sim.plan.copies`) is searched: it adds 2-4 % of the
# configurations and about 0.8 s (user) to the dense searches of docs/planner.md (measured 2026-11-25,
# docs/validation.md, "DualPipe in the search").
OPT_IN_SCHEDULES = ("zb-auto", "v-min", "v-half")
DEFAULT_SCHEDULES = tuple(name for name in SCHEDULES if name not in OPT_IN_SCHEDULES)
# Where it is named, the planner's zb-auto runs its heuristic at most this many times per
# configuration (`sim.search.zbauto.zb_auto(max_runs=)`: the likeliest fastest runs first), so that
# one configuration of hundreds of micro-batches takes seconds, not minutes.
ZB_AUTO_RUNS = 4
# What `configurations` leaves out before a configuration is made: these count layouts and
# (schedule, V) pairs, not configurations (`Plan.not_enumerated`).
NOT_ENUMERATED = ("dp does not divide the global batch (tp x pp layouts)",
                  "batch does not split into micro-batches (layouts)", "more stages than layers",
                  "the schedule refuses these sizes")


# The fields of `Layout` the search chooses (the rest are the run's, the same for every layout
# it makes): a row's summary names them (`sim.plan.planner.Row.summary`)
SEARCHED = ("tp", "pp", "dp", "cp", "micro_batch", "schedule", "virtual", "recompute", "zero", "sequence_parallel",
            "ep", "expert_tp", "reshard_after_forward")


def searched(lay: Layout) -> dict:
    """The fields of `lay` the search chose (`SEARCHED`)."""
    return {name: getattr(lay, name) for name in SEARCHED}


def schedule_options(lay: Layout) -> dict:
    """The schedule's options the planner adds to a layout (zb-auto: its budget of runs, `ZB_AUTO_RUNS`)."""
    return {"max_runs": ZB_AUTO_RUNS} if lay.schedule == "zb-auto" else {}


def _divisors(n: int, most: int | None = None) -> list[int]:
    """The divisors of `n`, those up to `most` only where it is given (a global batch of 10^8:
    16 tried, not 10^8)."""
    return [d for d in range(1, min(n, n if most is None else most) + 1) if n % d == 0]


def _choices(name: str, given, default: Sequence) -> list:
    """The user's values for a searched dimension (one value or several), else the default."""
    if given is None:
        return list(default)
    values = list(given) if isinstance(given, (list, tuple, set, frozenset, range)) else [given]
    if not values:
        raise ValueError(f"{name}: give at least one value")
    return values


def positive(name: str, v) -> int:
    """`v` if it is a positive int, else ValueError naming `name`."""
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{name} must be a positive int, got {v!r}")
    return v


def _tensor_sizes(model: Transformer, gpus: int, tp, gpus_per_node: int) -> list[int]:
    """The tensor-parallel sizes to try: the given ones (each checked, one line naming the fix;
    beyond a node they run, as `sim.estimate` runs them, with its warning), else the powers
    of two within a node that divide the GPUs and the model."""
    powers = [2 ** k for k in range(gpus_per_node.bit_length()) if 2 ** k <= gpus_per_node]
    if tp is None:
        return [size for size in powers if gpus % size == 0 and divides_model(model, size)]
    sizes = _choices("tp", tp, powers)
    for size in sizes:
        positive("tp", size)
        check_tp(model, size)
        if gpus % size:
            raise ValueError(f"{gpus} GPUs do not split into tensor-parallel groups of {size}; "
                             f"give a GPU count that is a multiple of {size}")
    return sorted(set(sizes))


def _context_sizes(model: Transformer, gpus: int, cp) -> list[int]:
    """The context-parallel sizes to try over `gpus` GPUs (those left by tp): the given ones
    that divide them (each checked: one line naming the fix), else `CP_MIN_SEQ`'s rule."""
    if cp is None:
        if model.seq < CP_MIN_SEQ or model.attention != "flash" or model.kernels != "megatron":
            return [1]
        return [2 ** k for k in range(gpus.bit_length())
                if gpus % 2 ** k == 0 and model.seq // 2 ** k >= CP_MIN_TOKENS and model.seq % 2 ** (k + 1) == 0]
    sizes = [positive("cp", size) for size in _choices("cp", cp, [])]
    for size in sizes:
        if size > 1 and model.attention != "flash":
            raise ValueError(f"cp={size} needs a fused attention kernel; the model has {model.attention} attention")
        if model.seq % (2 * size):
            raise ValueError(f"cp={size} splits the sequence into 2 x cp = {2 * size} chunks; the model's "
                             f"{model.seq} tokens do not divide")
    return [size for size in sorted(set(sizes)) if gpus % size == 0]


def _pipeline_sizes(model: Transformer, gpus: int, tp: int, pp, tp_given: bool, strict: bool = True) -> list[int]:
    """The pipeline sizes to try with tensor-parallel size `tp`: the given ones (more stages
    than layers refused by name; one that does not divide the GPUs left over by `tp` refused
    only where the user gave that tp, else that tp is skipped for it; skipped too where not
    `strict`: a context-parallel size the search chose left those GPUs), else every divisor
    of gpus/tp up to the layers."""
    if pp is None:
        return [size for size in _divisors(gpus // tp) if size <= model.layers]
    out = []
    for size in _choices("pp", pp, []):
        positive("pp", size)
        if size > model.layers:
            raise ValueError(f"pp={size} is more stages than the model's {model.layers} layers; "
                             f"use pp <= {model.layers}")
        if (gpus // tp) % size == 0:
            out.append(size)
        elif not strict:
            continue
        elif tp_given:
            raise ValueError(f"{gpus} GPUs are not a multiple of tp*pp = {tp}*{size} = {tp * size}; give a GPU "
                             f"count that is a multiple of {tp * size} or another pp")
        elif gpus % size:
            raise ValueError(f"{gpus} GPUs are not a multiple of pp={size}; give a GPU count that is a multiple "
                             f"of {size} or another pp")
    return out


def expert_splits(model: Transformer, tp: int, ranks: int, ep=None, expert_tp=None) -> list[tuple[int, int]]:
    """The (ep, expert_tp) to try on a stage of `ranks` = tp x cp x dp GPUs: for a mixture of
    experts, each ep dividing the experts (or each given) with expert_tp 1 or tp (or each given),
    where expert_tp divides an expert's width and expert_tp x ep the ranks, as Megatron-Core folds
    them (`sim.plan.experts`); (1, 1) for a dense model, which takes no other (ValueError)."""
    if model.moe is None:
        given = {"ep": _choices("ep", ep, [1]), "expert_tp": _choices("expert_tp", expert_tp, [1])}
        if {*given["ep"], *given["expert_tp"]} != {1}:
            named = ", ".join(f"{k}={','.join(map(str, v))}" for k, v in given.items())
            raise ValueError(f"{named} split the experts of a mixture of experts; the model is dense (experts=None)")
        return [(1, 1)]
    eps = [positive("ep", e) for e in _choices("ep", ep, _divisors(model.experts))]
    etps = [positive("expert_tp", t) for t in _choices("expert_tp", expert_tp, sorted({1, tp}))]
    for e in eps:
        if model.experts % e:
            raise ValueError(f"ep={e} does not divide the model's {model.experts} experts; use ep in "
                             f"{_divisors(model.experts)}")
    return [(e, t) for e in eps for t in etps if ranks % (e * t) == 0 and model.expert_ffn % t == 0]


def layouts(model: Transformer, gpus: int, global_batch: int, *, tp=None, pp=None, micro_batch=None, cp=None,
            gpus_per_node: int = 8, max_micro_batch: int = MAX_MICRO_BATCH,
            dropped: Counter | None = None) -> list[tuple[int, int, int, int, int]]:
    """Every (tp, pp, dp, micro_batch, cp) with tp*cp*pp*dp = gpus and global_batch = dp * b * m
    for a whole number m of micro-batches. Raises ValueError naming the fix when the given
    sizes leave none."""
    dropped = Counter() if dropped is None else dropped
    out = []
    for tensor, context in ((t, c) for t in _tensor_sizes(model, gpus, tp, gpus_per_node)
                            for c in _context_sizes(model, gpus // t, cp)):
        strict = context == 1 or cp is not None  # a cp the search chose may leave too few GPUs
        for pipeline in _pipeline_sizes(model, gpus // context, tensor, pp, tp is not None, strict):
            replicas = gpus // (tensor * context * pipeline)
            if global_batch % replicas:
                dropped["dp does not divide the global batch (tp x pp layouts)"] += 1
                continue
            per_replica = global_batch // replicas
            sizes = _divisors(per_replica, max_micro_batch) if micro_batch is None \
                else [positive("micro_batch", b) for b in _choices("micro_batch", micro_batch, [])]
            for size in sizes:
                if per_replica % size:
                    dropped["batch does not split into micro-batches (layouts)"] += 1
                    continue
                out.append((tensor, pipeline, replicas, size, context))
    if not out:
        sizes = "" if micro_batch is None else f" of {','.join(map(str, _choices('micro_batch', micro_batch, [])))}"
        raise ValueError(f"global batch {global_batch} does not split into whole micro-batches{sizes} over the dp "
                         f"replicas of any layout of {gpus} GPUs; make it a multiple of dp * micro_batch "
                         f"(dp = gpus / (tp * cp * pp))")
    return out


def _schedule_chunks(model: Transformer, pp: int, micro_batches: int, names: Sequence[str], max_virtual: int,
                     virtual, dropped: Counter) -> list[tuple[str, int]]:
    """(schedule, V) pairs that the schedule accepts for pp devices and `micro_batches` micro-batches."""
    if pp == 1:  # gradient accumulation whatever the schedule: one of them, V = 1 (if it takes that)
        names = ["1f1b"] if "1f1b" in names or not names else names[:1]
    out = []
    for name in names:
        generator = SCHEDULES[name]
        if pp == 1:
            chunk_counts = [1]
        elif virtual is not None:
            chunk_counts = _choices("virtual", virtual, [])
        elif generator.takes_virtual:
            chunk_counts = [v for v in range(2, max_virtual + 1) if model.layers % (pp * v) == 0]
        else:
            chunk_counts = [generator.virtual]
        for chunks in chunk_counts:
            if pp * chunks > model.layers * generator.pipelines:  # each copy's stages hold the model's layers
                dropped["more stages than layers"] += 1
            elif generator.refusal(pp, micro_batches, chunks):
                dropped["the schedule refuses these sizes"] += 1
            else:
                out.append((name, chunks))
    return out


def configurations(model: Transformer, gpus: int, global_batch: int, *, schedules=None, recompute=None, zero=None,
                   sequence_parallel=None, virtual=None, reshard_after_forward=None, max_virtual: int = MAX_VIRTUAL,
                   ep=None, expert_tp=None, run: Layout | None = None,
                   dropped: Counter | None = None, **layout_limits) -> list[Layout]:
    """Every configuration of the search space (see the module's docstring): `run` with the
    `SEARCHED` fields of each, and `global_batch` (without `run`: the defaults, on nodes of
    `gpus_per_node`)."""
    if run is None:
        run = Layout(gpus_per_node=layout_limits.pop("gpus_per_node", 8))
    elif layout_limits.pop("gpus_per_node", run.gpus_per_node) != run.gpus_per_node:
        raise ValueError(f"gpus_per_node is the run's, {run.gpus_per_node}; give it once")
    run = run.changed(global_batch=global_batch).keywords()  # each configuration: these, and its own
    dropped = Counter() if dropped is None else dropped
    names = [lookup(name)[0] for name in _choices("schedules", schedules, DEFAULT_SCHEDULES)]
    recomputes = _choices("recompute", recompute, RECOMPUTE)
    for mode in recomputes:
        if mode not in RECOMPUTE:
            raise ValueError(f"recompute must be one of {', '.join(RECOMPUTE)}; got {mode!r}")
    zeros = _choices("zero", zero, ZERO_STAGES)
    for stage in zeros:
        if stage not in ZERO_STAGES:
            raise ValueError(f"zero must be one of 0, 1, 2, 3 (ZeRO stage); got {stage!r}")
    sequence_parallels = _choices("sequence_parallel", sequence_parallel, (False, True))
    reshards = _choices("reshard_after_forward", reshard_after_forward, (True, False))
    if any(not isinstance(on, bool) for on in reshards):
        raise ValueError(f"reshard_after_forward must be True or False (or both); got {reshard_after_forward!r}")
    out = []
    for tp, pp, dp, micro_batch, cp in layouts(model, gpus, global_batch, dropped=dropped,
                                               gpus_per_node=run["gpus_per_node"], **layout_limits):
        micro_batches = global_batch // (dp * micro_batch)
        # ZeRO 1-3 shard over the replicas; 2 only without pipelining (`layout.check_layout`); 3 with
        # pp > 1 is FSDP's gathers and reduce-scatters as actions on the step (`sim.add_fsdp`)
        zero_stages = [stage for stage in zeros if (stage == 0 or dp * cp > 1) and (stage != 2 or pp == 1)] or [0]
        sps = [on for on in sequence_parallels if tp > 1 or not on] or [False]
        splits = expert_splits(model, tp, tp * cp * dp, ep, expert_tp)
        if model.moe is not None:  # Megatron-Core: MoE with tp > 1 needs sequence parallelism; experts' state zero <= 1
            sps, zero_stages = [on for on in sps if on or tp == 1] or [True], [z for z in zero_stages if z < 2] or [0]
        for (name, chunks), mode, stage, sp, (ep_, etp) in itertools.product(
                _schedule_chunks(model, pp, micro_batches, names, max_virtual, virtual, dropped), recomputes,
                zero_stages, sps, splits):
            if stage >= 2 and SCHEDULES[name].pipelines > 1:  # DualPipe's copies: zero <= 1 (`layout.check_layout`)
                continue
            for reshard, overlap in itertools.product(_reshards(stage, pp, chunks, reshards), _overlaps(model, name)):
                out.append(Layout(**{**run, "tp": tp, "pp": pp, "dp": dp, "micro_batch": micro_batch, "schedule": name,
                                     "virtual": chunks, "recompute": mode, "zero": stage, "sequence_parallel": sp,
                                     "cp": cp, "ep": ep_, "expert_tp": etp, "reshard_after_forward": reshard,
                                     "overlap": overlap}))
    if not out and (ep is not None or expert_tp is not None):
        raise ValueError(f"the given ep and expert_tp fold onto no layout of {gpus} GPUs: expert_tp x ep must "
                         f"divide the tp x cp x dp GPUs of a stage and expert_tp an expert's width {model.expert_ffn}")
    return out


def _overlaps(model: Transformer, schedule: str) -> tuple[bool, ...]:
    """Whether to run the schedule's overlapped forward-backward pairs: both ways for a mixture of
    experts on a schedule that has them (DualPipe, DualPipeV, interleaved 1F1B as Megatron-Core's
    `--overlap-moe-expert-parallel-comm`: a pair hides each one's all-to-all under the other's
    compute, rule 18); a dense model has no all-to-all to hide, only the pairs' constraint: off."""
    # (`model.experts`: `model.moe` is None exactly where it is, and makes its record anew each time)
    return (False, True) if model.experts is not None and "overlap" in SCHEDULES[schedule].options else (False,)


def _reshards(zero: int, pp: int, chunks: int, allowed: list[bool]) -> list[bool]:
    """FSDP2's reshard_after_forward choices (of `allowed`) that differ: both where zero=3 runs as
    FSDP's actions (pp > 1) and a device holds several stages; where it holds one, each stage
    stays gathered from its first forward to its last backward either way (`sim.add_fsdp`), and
    without FSDP the option does nothing: one, on unless only off is allowed."""
    if zero == 3 and pp > 1 and chunks > 1:
        return allowed
    return [True] if True in allowed else [False]
