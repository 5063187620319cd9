"""Lower bounds on a planned configuration's peak memory and step time, for `sim.plan`.

None can exceed what `sim.estimate` predicts (docs/planner.md, "Planner", says why;
tests/sim/plan/test_planner.py checks them against the estimate of every configuration of an exhaustive
search, and of random small ones): `sim.plan` drops a configuration whose memory bound
exceeds the GPU's memory, and stops simulating once the step-time bound of every
configuration left exceeds the best steps it keeps. From the cheapest to the tightest:
`average` (no schedule needed), `time` (a path through the step's dependencies, one per
device) and `schedule_time` (a simulation of the schedule under unit costs).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Sequence

from sim.engine.costs import Costs, StageCosts
from sim.simulation import simulate
from sim.cost.data_parallel import fsdp_as_actions, optimizer_time, stage_params
from .experts import layer_activations, moe_optimizer_time, moe_layers, split_params, state_bytes
from .copies import repeat_costs
from .layout import Layout
from .stage_costs import partition_layers
from .steps import Steps
from sim.model.footprint import optimizer_step_bytes, state_bytes_per_param
from sim.hardware.profile import DeviceProfile
from sim.schedule.interleaved import rounds
from sim.schedule.ir import Schedule
from sim.schedule.registry import lookup
from sim.hardware.kernels import memory_time
from sim.schedule.kinds import KINDS, Kind
from sim.schedule.liveness import held
from sim.cost.layer import Slice
from sim.cost.slice import per_rank
from sim.search.partition import even
from sim.model.transformer import Transformer
from sim.schedule.zerobubble import split_1f1b


# How far a bound below the one it stands for must exceed a limit to say that one does: far above the
# rounding of the few sums between them
_CLEARLY = 1e-9
# Schedules that `sim.estimate` builds under the run's own costs (`sim.plan.estimation.build_schedule`):
# the unit-cost one built here may order their actions otherwise.
_COST_DEPENDENT = ("zb-auto",)


def least_held(name: str, devices: int, micro_batches: int, virtual: int) -> list[int] | None:
    """Per device, at least how many micro-batch chunks the named schedule's program holds at
    once (`sim.schedule.liveness.held` of it), without building it; None for a schedule without
    a closed form here (v-min, v-half, zb-auto). An F takes a chunk at its start and only a B
    or an I gives one back (rule 7): a device holds at least the Fs it has run less the B and
    I it has ended, at any point of its program; each count below is that, at the point its
    generator's own structure names. P devices, M micro-batches, V chunks, device r:

    - naive: 1 (its first F); gpipe: M and looped-bfs: M V (every F before any backward).
    - 1f1b, zb-h1: min(P-r, M): a warm-up of min(P-r-1, M) Fs, then an F before the first B or I.
    - zb-h2: min(2(P-r)-1, M): its warm-up of 2(P-1-r)+1 Fs (M >= 2P-1).
    - interleaved-1f1b, interleaved-zb: min(w+1, M V), w their warm-up of Fs (min((V-1)g + 2(P-1-r),
      M V), with P-1-r for V = 1 or for interleaved-zb; g the micro-batches of a round), then an F
      before the first backward where any is left.
    - zbv: min(2P-r-1, M) + min(r+1, M): the Fs of chunk 0 and of chunk 1 before its first I
      (of micro-batch 0, chunk 1), those of micro-batches >= M left out.
    - dualpipev: 2P+1, dualpipe: P+1 (P/2 devices a direction): the eight steps' 2P Fs, then
      step 3's I, W, F rounds (each I after an F) and step 4's first F, before its B.

    For those of `HELD_EXACT` (all of them) the count is the peak itself: after that point each F
    comes right before a backward (a B or I: the steady state; zbv's F, I rounds of chunk 1 and its
    F0 I0 W0 F1 I1 W1, DualPipe's pairs, F then B, overlapped or not), or only backwards are left, so
    the count never rises above it (zbv's actions of micro-batches >= M left out only lower it).
    tests/sim/plan/test_bounds.py checks each against the built schedules."""
    P, M, V = devices, micro_batches, virtual
    total = M * V
    if name in ("naive", "gpipe", "looped-bfs"):
        return [{"naive": 1, "gpipe": M, "looped-bfs": total}[name]] * P
    if name in ("1f1b", "zb-h1"):
        return [min(P - r, M) for r in range(P)]
    if name == "zb-h2":
        return [min(2 * (P - r) - 1, M) for r in range(P)]
    if name in ("interleaved-1f1b", "interleaved-zb"):
        g, twice = rounds(P, M)[1], name == "interleaved-1f1b" and V > 1
        return [min(min((V - 1) * g + (P - 1 - r) * (1 + twice), total) + 1, total) for r in range(P)]
    if name == "zbv":
        return [min(2 * P - r - 1, M) + min(r + 1, M) for r in range(P)]
    if name in ("dualpipev", "dualpipe"):
        return [2 * P + 1 if name == "dualpipev" else P + 1] * P
    return None


HELD_EXACT = ("naive", "gpipe", "looped-bfs", "1f1b", "zb-h1", "zb-h2", "interleaved-1f1b", "interleaved-zb", "zbv",
              "dualpipev", "dualpipe")


@dataclass(frozen=True)
class _Frame:
    """What the memory bound needs of a schedule, known before it is built: the placement and
    copies of the model (its generator's, `sim.SCHEDULES`), layers per stage (the even split),
    the stages of each device and, per device, the chunks held (at least: `least_held`)."""
    placement: tuple[int, ...]
    pipelines: int
    layers: list[int]
    stages_of: list[list[int]]
    held: list[int]

    def per_device(self, per_stage: Sequence[float], pick=sum) -> list[float]:
        return [pick([per_stage[s] for s in stages]) for stages in self.stages_of]


@dataclass(frozen=True, kw_only=True)
class _Order(_Frame):
    """A `_Frame` and what the path bound (`Bounds.time`) reads of the schedule's order: whether
    it splits the backward, its compute actions per stage by kind (in the order each kind first
    comes), those in overlapped pairs, whether it has any, and the kind of each device's last
    compute (None where the estimate may build another order, zb-auto)."""
    split: bool
    counts: list[Counter]
    last: list[Kind | None]
    paired: list[Counter]  # per stage, its computes by kind that run in an overlapped pair
    has_pairs: bool
    micro_batches: int


@dataclass(frozen=True, kw_only=True)
class _Shape(_Order):
    """An `_Order` read off the schedule built, the chunks held exactly (held 1 for zb-auto)."""
    schedule: Schedule


# The schedules whose every stage runs F then B of each micro-batch, or F, I, W (each W after its I),
# in the order `_closed_order` says; the others' (and overlapped pairs') order is read off the schedule
_WHOLE = ("naive", "gpipe", "1f1b", "interleaved-1f1b", "looped-bfs")
_SPLIT = ("zb-h1", "zb-h2", "interleaved-zb", "zbv")


def _closed_order(frame: _Frame, lay: Layout) -> _Order | None:
    """The `_Order` of the layout's schedule without building it, where its generator's programs say it
    plainly: each stage runs M of each kind of its backward, first an F (a stage's first action),
    then a B (or an I, then its W), and each device ends with a B (or a W, which follows its own I);
    no overlapped pairs; DualPipe's and DualPipeV's from their eight steps (`_copies_order`). None for
    the others (tests/sim/plan/test_bounds.py checks it against each)."""
    if lay.schedule in ("dualpipe", "dualpipev"):
        return _copies_order(frame, lay)
    if lay.overlap or lay.schedule not in _WHOLE + _SPLIT:
        return None
    split, m = lay.schedule in _SPLIT, lay.micro_batches
    kinds = (Kind.F, Kind.I, Kind.W) if split else (Kind.F, Kind.B)
    stages = len(frame.placement)
    return _Order(**vars(frame), split=split, counts=[Counter(dict.fromkeys(kinds, m)) for _ in range(stages)],
                  last=[Kind.W if split else Kind.B] * lay.pp, paired=[Counter() for _ in range(stages)],
                  has_pairs=False, micro_batches=m)


def _copies_order(frame: _Frame, lay: Layout) -> _Order:
    """The `_Order` of DualPipe and DualPipeV without building them: each device runs the eight
    steps of `sim.schedule.dualpipe` (DualPipe's at its distance from the nearer end of a pipeline of
    P/2 devices and M/2 micro-batches each way, chunk 0 the way that reaches it first; DualPipeV's
    on device r of P, chunks r and 2P-1-r), every device ending with a W (step 8)."""
    P, M, stages = lay.pp, lay.micro_batches, len(frame.placement)
    counts, paired = [Counter() for _ in range(stages)], [Counter() for _ in range(stages)]
    for r in range(P):
        if lay.schedule == "dualpipev":
            chunks, (p, m, h, middle) = (r, 2 * P - 1 - r), (P, M, r, False)
        else:
            chunks = (r, 2 * P - 1 - r) if r < P // 2 else (2 * P - 1 - r, r)
            p, m, h, middle = P // 2, M // 2, min(r, P - 1 - r), r in (P // 2 - 1, P // 2)
        for stage, (kinds, pairs) in zip(chunks, _eight_steps_counts(p, m, h, middle, lay.overlap)):
            counts[stage], paired[stage] = kinds, pairs
    return _Order(**vars(frame), split=True, counts=counts, last=[Kind.W] * P, paired=paired, has_pairs=lay.overlap,
                  micro_batches=M)


def _eight_steps_counts(P: int, M: int, r: int, middle: bool, overlap: bool) -> list[tuple[Counter, Counter]]:
    """Of the eight steps (`sim.schedule.dualpipe`) on device r of P, M micro-batches: chunk 0's and
    chunk 1's actions by kind, in the order each kind first comes (an overlapped pair's mark before
    its F), and their computes in overlapped pairs. Step 3 runs P-r-1 rounds of chunk 1's I, W, F,
    step 4 M-2P+r+1 of the pairs F0B1, F1B0 (a `middle` device's first unoverlapped), step 5 P-r-1 of
    B1 and F1B0; step 6 splits the backwards from its h-th round on (for chunk 1 the one after, r
    even) and step 7's P-r-1 B0 are split; each split one's W runs later (steps 7, 8)."""
    F, B, I, W, MARK = Kind.F, Kind.B, Kind.I, Kind.W, Kind.OVERLAP_F_B
    rounds, steady, h = P - r - 1, M - 2 * P + r + 1, (r + 1) // 2
    split1, split0 = r - h + (r % 2), r + 1 - h + rounds
    pairs01, pairs10 = (steady - middle, steady + rounds) if overlap else (0, 0)
    first = [F, MARK, B, I, W], [F, *((I, W) if rounds else ()), *((B, MARK) if middle else (MARK, B)), I, W]
    total = ({F: M, MARK: pairs10, B: steady + rounds + h, I: split0, W: split0},
             {F: M, MARK: pairs01, B: steady + rounds + r + 1 - split1, I: split1 + rounds,
              W: split1 + rounds})
    return [(Counter({k: total[c][k] for k in dict.fromkeys(first[c]) if total[c][k]}),
             Counter({k: n for k, n in ((F, (pairs01, pairs10)[c]), (B, (pairs10, pairs01)[c])) if n}))
            for c in (0, 1)]


def _placement(lay: Layout) -> tuple[tuple[int, ...], int]:
    """The placement and copies of the model of the layout's schedule, as its generator says."""
    generator = lookup(lay.schedule)[1]
    return tuple(generator.placement(lay.pp, lay.virtual)), generator.pipelines


def _frame(model: Transformer, lay: Layout, held: list[int]) -> _Frame:
    """The layout's frame, its devices holding `held` chunks each."""
    placement, copies = _placement(lay)
    stages_of = [[s for s, r in enumerate(placement) if r == d] for d in range(lay.pp)]
    return _Frame(placement, copies, even(model.layers, len(placement) // copies) * copies, stages_of, held)


def _shape(model: Transformer, steps: Steps, lay: Layout) -> _Shape:
    # zb-auto's own order is searched under the run's costs (minutes for hundreds of
    # micro-batches): what the bounds read of it (placement, the computes per stage) is
    # the I/W-split 1F1B's, one of its candidates; any other is the estimate's own (`Steps.schedule`)
    sched = split_1f1b(lay.pp, lay.micro_batches) if lay.schedule == "zb-auto" else steps.schedule(lay)
    counts, paired = [Counter() for _ in range(sched.stages)], [Counter() for _ in range(sched.stages)]
    for (stage, kind), n in Counter((a.stage, a.kind) for prog in sched.programs for a in prog).items():
        counts[stage][kind] = n
    for prog in sched.programs if sched.has_pairs else ():
        for i, a in enumerate(prog):
            if a.kind is Kind.OVERLAP_F_B:  # the F after the mark and the backward it names: a pair
                for b in prog[i + 1:i + 3]:
                    paired[b.stage][b.kind] += 1
    if lay.schedule in _COST_DEPENDENT:  # the estimate's order may differ: only what every order has
        last, most = [None] * sched.ranks, [1] * sched.ranks
    else:
        last, most = [prog[-1].kind for prog in sched.programs], held(sched)
    frame = _frame(model, lay, most)
    if (frame.placement, frame.pipelines) != (sched.placement, sched.pipelines):  # what `_frame` reads of it
        raise AssertionError(f"{lay.schedule}: its generator's placement is not its schedule's")
    split = any(count[Kind.I] for count in counts)
    return _Shape(**vars(frame), split=split, counts=counts, last=last, paired=paired, has_pairs=sched.has_pairs,
                  micro_batches=sched.micro_batches, schedule=sched)


class Bounds:
    """Lower bounds on a layout's peak memory and step time (see the module's docstring and
    docs/planner.md, "Planner"), cached by what they depend on, from the estimator's own steps
    (`steps`, shared with the estimates of a search). The memory bound and `schedule_time` take
    the layers of each stage from `sim.search.partition.even`, as `sim.estimate` does; with
    another partition, only the averages over the devices."""

    def __init__(self, model: Transformer | str, profile: DeviceProfile | str, steps: Steps | None = None):
        self.steps = Steps(model, profile) if steps is None else steps
        self.model, self.profile = self.steps.model, self.steps.profile
        self.params = self.model.params()
        self.sparse = self.model.moe is not None  # a mixture of experts (`model.moe` makes its record anew each time)
        # the routed experts' parameters, all MoE layers' (0 for a dense model)
        self.experts = self.model.moe_layers * self.model.moe.params(self.model.hidden)["routed"] if self.sparse else 0.0
        self._shape, self._frames, self._placements, self._unit, self._act, self._costs = {}, {}, {}, {}, {}, {}
        self._params, self._per, self._orders, self._statics, self._chunks, self._states = {}, {}, {}, {}, {}, {}
        self._optimizers = {}

    def layers(self, config: Layout):
        """A dense layer's and a MoE layer's times (`Steps.layers`)."""
        return self.steps.layers(config)

    def layer(self, config: Layout):
        return self.layers(config)[0]

    def _key(self, config: Layout) -> tuple:
        return config.schedule, config.pp, config.micro_batches, config.virtual, config.overlap

    def shape(self, config: Layout) -> _Shape:
        key = self._key(config)
        if key not in self._shape:
            self._shape[key] = _shape(self.model, self.steps, config)
        return self._shape[key]

    def frame(self, config: Layout) -> _Frame | None:
        """What the memory bound needs of the layout's schedule, not built (`least_held`'s chunks);
        None where `least_held` has no closed form."""
        key = self._key(config)
        if key not in self._frames:
            most = least_held(config.schedule, config.pp, config.micro_batches, config.virtual)
            self._frames[key] = None if most is None else _frame(self.model, config, most)
        return self._frames[key]

    def order(self, config: Layout) -> _Order:
        """What `time` reads of the layout's schedule: `_closed_order`'s, or where it has none, the schedule's."""
        key = self._key(config)
        if key in self._shape:
            return self._shape[key]
        if key not in self._orders:
            frame = self.frame(config)
            self._orders[key] = None if frame is None else _closed_order(frame, config)
        return self._orders[key] or self.shape(config)

    def _placement(self, config: Layout) -> tuple[tuple[int, ...], int]:
        key = config.schedule, config.pp, config.virtual
        if key not in self._placements:
            self._placements[key] = _placement(config)
        return self._placements[key]

    def _activations(self, config: Layout) -> tuple[float, float]:
        """One micro-batch's activations of one dense layer and one MoE layer (0 for a dense
        model) on one GPU (s/cp of the sequence; under FP8: BF16's less the Linears' inputs saved
        in FP8, `sim.cost.fp8`): `stage_costs`'s own count (`sim.plan.experts.layer_activations`)."""
        key = (config.micro_batch, config.tp, config.cp, config.sequence_parallel, config.recompute, config.ep,
               config.expert_tp, config.precision)  # all they depend on
        if key not in self._act:
            kept = "bf16" if config.precision == "fp8" else config.precision
            dense, _, moe = layer_activations(per_rank(self.model, Slice(config.micro_batch, cp=config.cp)), config,
                                              kept)
            self._act[key] = dense, moe
        return self._act[key]

    def _least_activations(self, config: Layout) -> float:
        """The fewer bytes of a dense and a MoE layer's activations (a dense model: its layer's)."""
        dense, moe = self._activations(config)
        return min(dense, moe) if self.sparse else dense

    def _static_average(self, config: Layout) -> float:
        """The average device's weights, gradients and optimizer state: the stages' dense
        parameters sum to the model's over tp, its experts' over ep x expert_tp, each with its
        own ZeRO shard (`sim.plan.experts`)."""
        per = self._per_param(config)
        if not self.sparse:
            return self.params.total / (config.tp * config.pp) * per
        experts = self.experts
        edp = config.tp * config.cp * config.dp // (config.ep * config.expert_tp)
        per_expert = sum(state_bytes_per_param(config.precision, config.zero, edp, config.optimizer).values())
        return ((self.params.total - experts) / config.tp * per
                + experts / (config.ep * config.expert_tp) * per_expert) / config.pp

    def _stage_params(self, config: Layout, shape: _Frame) -> list[float]:
        """`sim.cost.data_parallel.stage_params` of the layout's stages, once per what it reads."""
        key = config.tp, tuple(shape.layers), shape.placement
        if key not in self._params:
            self._params[key] = stage_params(self.model, shape.layers, config.tp, shape.placement)
        return self._params[key]

    def _per_param(self, config: Layout) -> float:
        """Bytes a parameter takes on a GPU that holds it: weights, gradients and optimizer
        state, sharded as the ZeRO stage says (`sim.model.footprint`); under FSDP (zero=3 with
        pp > 1) the gradients whole until their stage's reduce-scatter (`stage_costs.fsdp_costs`)."""
        key = (config.precision, config.zero, config.dp * config.cp, config.optimizer,
               fsdp_as_actions(config) and config.pp > 1)
        if key not in self._per:
            per = state_bytes_per_param(*key[:4])
            if key[4]:
                per = {**per, "grads": state_bytes_per_param(config.precision)["grads"]}
            self._per[key] = sum(per.values())
        return self._per[key]

    def memory_average(self, config: Layout) -> float:
        """The average device's weights, gradients and optimizer state (`_static_average`)
        and, with the even split, one micro-batch's activations of the fewest layers a stage has
        (a device holds at least the one its forward takes in). No schedule needed: the pp * V
        stages are known."""
        fewest = self.model.layers // (config.pp * config.virtual) if config.partition == "even" else 0
        return self._static_average(config) + fewest * self._least_activations(config)

    def memory(self, config: Layout) -> float:
        """The fullest device holds at least its stages' weights, gradients and optimizer
        state (`sim.cost.data_parallel.stage_params`, `sim.model.footprint`) and, at its peak, its most
        chunks held times its smallest chunk's activations (under FSDP, with its smallest
        stage's parameters gathered)."""
        if not self._by_device(config):
            return self.memory_average(config)
        return self._memory(config, self.shape(config))

    def memory_above(self, config: Layout, limit: float) -> bool:
        """Whether `memory(config)` exceeds `limit`, building the schedule only where that must be
        asked of it: first with `least_held`'s chunks, no schedule built (a bound no larger than
        `memory`'s, and `memory` itself for the schedules of `HELD_EXACT`), then, where that is within
        `limit` and not exact, with the schedule's own chunks held."""
        if not self._by_device(config):
            return self.memory_average(config) > limit
        frame = self.frame(config)
        if frame is not None and frame.pipelines > 1 and not fsdp_as_actions(config) and \
                self._memory(config, frame, self._copies_state(config, frame)) > limit * (1 + _CLEARLY):
            return True  # DualPipe's copies: over even without the bytes only their stage costs count
        least = None if frame is None else self._memory(config, frame)
        if least is not None and (least > limit or config.schedule in HELD_EXACT):  # exact: `memory` itself
            return least > limit
        shape = self.shape(config)
        if least is not None and shape.held == frame.held:  # the same bound
            return False
        return self._memory(config, shape) > limit

    def _by_device(self, config: Layout) -> bool:
        """Whether `memory` goes device by device: with the even split, where the average fits the GPU."""
        return config.partition == "even" and self.memory_average(config) <= self.profile.memory

    def _memory(self, config: Layout, shape: _Frame, static: list[float] | None = None) -> float:
        """`memory` device by device, with the chunks that `shape` holds (and each device's `static`
        bytes, where given: `_device_static`'s)."""
        static = self._device_static(config, shape) if static is None else static
        smallest = self._smallest_chunk(config, shape)
        return max(s + h * a for s, h, a in zip(static, shape.held, smallest))

    def _device_static(self, config: Layout, shape: _Frame) -> list[float]:
        """Per device, its stages' weights, gradients and optimizer state (under FSDP with its smallest
        stage's parameters gathered), once per what they read: the frame's stages (`shape`: each is
        kept, so its id names it), the estimate's own costs with DualPipe's copies, the layout's sizes
        and state."""
        copies = id(self.costs(config)[0]) if shape.pipelines > 1 else None
        key = (id(shape), copies, config.precision, config.zero, config.optimizer, config.tp, config.dp, config.cp,
               config.ep, config.expert_tp, config.fsdp_shard, config.pp)
        if key not in self._statics:
            static = shape.per_device(self._stage_static(config, shape))
            if fsdp_as_actions(config) and config.pp > 1:  # FSDP: a device computes a stage only gathered, its
                params = self._stage_params(config, shape)  # activations
                weight = state_bytes_per_param(config.precision)["weights"]  # peaking as a forward ends, before its RESHARD
                static = [s + g for s, g in zip(static, shape.per_device([p * weight for p in params], min))]
            self._statics[key] = static
        return self._statics[key]

    def _copies_state(self, config: Layout, shape: _Frame) -> list[float]:
        """With DualPipe's copies, per device the weights, gradients and optimizer state of its stages
        as `stage_costs` counts one copy's (`sim.plan.experts.split_params`, `state_bytes`), stage s
        taking its copy's stage s mod P: no more than `_device_static` (the estimate's own bytes, which
        add FP8's weight copies and the dispatcher's buffers) without its stage costs."""
        key = (id(shape), config.precision, config.zero, config.optimizer, config.tp, config.dp, config.cp,
               config.ep, config.expert_tp, config.fsdp_shard)
        if key not in self._states:
            chain = len(shape.placement) // shape.pipelines
            state = state_bytes(config, *split_params(self.model, shape.layers[:chain], config, shape.placement[:chain]))
            self._states[key] = shape.per_device([sum(parts) for parts in zip(*state.values())] * shape.pipelines)
        return self._states[key]

    def _smallest_chunk(self, config: Layout, shape: _Frame) -> list[float]:
        """Per device, one micro-batch's activations of its smallest stage, once per frame and layer activations."""
        act, moe_act = self._activations(config)
        key = id(shape), act, moe_act
        if key not in self._chunks:
            copies = shape.pipelines  # each copy's stages hold the model's MoE layers
            sparse = moe_layers(self.model, shape.layers[:len(shape.layers) // copies]) * copies
            self._chunks[key] = shape.per_device([(n - k) * act + k * moe_act for n, k in zip(shape.layers, sparse)],
                                                 min)
        return self._chunks[key]

    def _stage_static(self, config: Layout, shape: _Frame) -> list[float]:
        """Each stage's weights, gradients and optimizer state on one GPU, as `stage_costs` counts
        them (less FP8's weight copies; with DualPipe's two copies of the model, the estimate's own
        costs, FP8's copies in)."""
        if shape.pipelines > 1:  # DualPipe's copies: the estimate's own bytes (`sim.plan.copies`)
            per_stage = self.costs(config)[0]
            return [per_stage.static_total(s) - per_stage.static_bytes[s] for s in range(len(shape.placement))]
        if not self.sparse:
            per = self._per_param(config)
            return [p * per for p in self._stage_params(config, shape)]
        state = state_bytes(config, *split_params(self.model, shape.layers, config, shape.placement))
        return [sum(parts) for parts in zip(*state.values())]

    def _optimizer(self, config: Layout) -> float:
        """The optimizer step over the average device's share (once per what it reads)."""
        key = (config.tp, config.pp, config.dp, config.cp, config.zero, config.ep, config.expert_tp, config.precision,
               config.optimizer)
        if key not in self._optimizers:
            self._optimizers[key] = self._optimizer_time(config)
        return self._optimizers[key]

    def _optimizer_time(self, config: Layout) -> float:
        share = config.dp * config.cp if config.zero >= 1 else 1
        updated = self.params.total / (config.tp * config.pp * share)
        if self.sparse:  # the experts over ep x expert_tp, their state over edp
            experts = self.experts
            edp = config.tp * config.cp * config.dp // (config.ep * config.expert_tp) if config.zero >= 1 else 1
            updated += experts / config.pp * (1 / (config.ep * config.expert_tp * edp) - 1 / (config.tp * share))
        return memory_time(self.profile, updated * optimizer_step_bytes(config.precision, config.optimizer), "optimizer")

    def average(self, config: Layout) -> float:
        """The average device's computes one after another (F + B of the layers for every
        micro-batch; a split I + W is never shorter), then the optimizer step over the
        average device's share. No schedule needed."""
        layer, moe = self.layers(config)
        micro_batches = config.micro_batches
        computes = micro_batches * self.model.layers / config.pp * (layer.forward + layer.backward)
        if self.sparse:  # its MoE layers at their F + B and, unless overlapped pairs may hide them, all-to-alls
            sparse, dense = self.model.moe_layers, self.model.layers - self.model.moe_layers
            a2a = 0.0 if config.overlap else moe.a2a_forward + moe.a2a_backward
            computes = micro_batches / config.pp * (dense * (layer.forward + layer.backward)
                                                    + sparse * (moe.forward + moe.backward + a2a))
        return computes + self._optimizer(config) + self.profile.step_overhead

    def costs(self, config: Layout) -> tuple[StageCosts, list[int], Layout]:
        """The per-stage costs, layers per stage and layout that `sim.estimate` simulates `config`
        with (its own steps, `Steps.stage_costs`, so the bound follows any change to the estimate)."""
        (placement, copies), (layer, moe) = self._placement(config), self.layers(config)
        chain = len(placement) // copies  # one copy's stages, which hold the model (`sim.plan.copies`)
        layers = partition_layers(self.model.layers, chain, config.partition, moe or layer, self.steps.ends(config))
        costs, _ = self.steps.stage_costs(config, layers, placement[:chain])
        key = (id(costs), placement, copies)  # `steps` keeps `costs`: its id names it
        if key not in self._costs:
            self._costs[key] = repeat_costs(costs, placement, copies).for_stages(len(placement)), layers * copies
        return (*self._costs[key], config)

    def time(self, config: Layout) -> float:
        """The longest of one path per device d through the step's dependencies: the
        forward of one micro-batch through the stages below d's first (on other devices,
        each hop a transfer; with two copies of the model, DualPipe, the shorter way to one of
        d's stages, each copy from its own first stage) up to d's first compute; all of d's computes one after
        another; then either the backward of d's last micro-batch down through those
        stages (where d's last compute is a B or I of its first stage) or d's gradient
        reductions, which follow its last compute on its collective stream (under FSDP,
        zero=3 with pp > 1, each follows its own stage's last backward: the shortest); then the
        optimizer step of the fullest device. With the estimate's own durations, a MoE layer's
        F, B and I each with the all-to-all it waits for where no overlapped pair hides it."""
        shape = self.order(config)
        per_stage, layers, lay = self.costs(config)
        place, n = shape.placement, len(shape.placement)
        sent = per_stage.activation_bytes_sent  # (a hop's time once per bytes sent: most stages send the same)
        hops = {b: per_stage.latency + per_stage.transfer_time(b) for b in set(sent)}
        hop = [hops[sent[s]] if place[s] != place[s + 1] else 0.0 for s in range(n - 1)]
        # the forward up to stage s, which waits for its gather where FSDP's (each on its rank's
        # all-gather stream, from the step's start); the backward down from it
        # a compute waits for its all-to-all (rule 18); in an overlapped pair for what the other's compute does
        # not hide, at least its own less the longest partner its device has (`_busy`); the paths: pairs aside
        a2a_f, a2a_b = ((0.0,) * n,) * 2 if shape.has_pairs else (per_stage.a2a_forward, per_stage.a2a_backward)
        head, tail, chain = [per_stage.unshard[0]], [0.0], n // shape.pipelines
        for s in range(n - 1):  # each copy of the model (DualPipe) from its own first stage
            first = (s + 1) % chain == 0
            head.append(max(0.0 if first else head[-1] + per_stage.forward[s] + a2a_f[s] + hop[s],
                            per_stage.unshard[s + 1]))
            tail.append(0.0 if first else
                        tail[-1] + min(per_stage.backward[s], per_stage.backward_input[s]) + a2a_b[s] + hop[s])
        micro_batches, fsdp = shape.micro_batches, fsdp_as_actions(lay)
        partners = [_longest(per_stage, stages) for stages in shape.stages_of]
        busy = [_busy(shape, per_stage, s, partners[place[s]]) if shape.last[place[s]] is not None else
                micro_batches * (per_stage.forward[s] + a2a_f[s] + a2a_b[s]
                                 + min(per_stage.backward[s], per_stage.backward_input[s] + per_stage.backward_weight[s]))
                for s in range(n)]
        longest = 0.0
        for d, stages in enumerate(shape.stages_of):
            # d's nearest stage to a copy's start (its first; DualPipe: one of each copy)
            start, after = min(head[s] for s in stages), min(tail[s] for s in stages)
            after = after if shape.last[d] in (Kind.B, Kind.I) else 0.0
            reduce = [per_stage.grad_reduce[s] for s in stages]
            # FSDP's reduce-scatters each follow their stage's last backward (`sim.add_grad_reduce`,
            # overlap=True): of d's, only the one after its last compute surely follows them all
            reduce = min(reduce) if fsdp else sum(reduce)
            longest = max(longest, start + sum(busy[s] for s in stages) + max(after, reduce))
        optimizer = (moe_optimizer_time if self.sparse else optimizer_time)(self.model, self.profile, lay,
                                                                            layers[:chain], place)
        return max(self.average(config), longest + optimizer + self.profile.step_overhead)

    def schedule_time(self, config: Layout) -> float:
        """The schedule's makespan with each stage's F, B, I, W at (1, 2, 1, 1) per layer
        and free transfers, times the smallest ratio of a layer's real times to those: a
        makespan is a longest path through the programs' order and the dependencies, so it
        grows with every duration and scales with them all. For a mixture of experts, also
        the makespan with (1, 2, 1, 1) per MoE layer (a dense layer at 0: no longer than
        its real times), times the smallest ratio of a MoE layer's, all-to-alls included:
        the tighter where the dense layers are the faster. A simulation per schedule, pp,
        micro-batches and V (two with experts): asked only of configurations about to be
        simulated."""
        if config.partition != "even" or config.schedule in _COST_DEPENDENT:
            return self.time(config)
        key, shape, (layer, moe) = self._key(config), self.shape(config), self.layers(config)
        if key not in self._unit:
            per_stage = [shape.layers] + [moe_layers(self.model, shape.layers)] * self.sparse
            self._unit[key] = [_unit_makespan(shape.schedule, n) for n in per_stage]
        waits = not shape.schedule.has_pairs  # a compute waits for its all-to-alls (rule 18): a layer's F, B, I

        def ratio(k) -> float:  # a layer's real times over its unit ones
            if shape.split:
                return min(k.forward + waits * k.a2a_forward, k.backward_input + waits * k.a2a_backward,
                           k.backward_weight)
            return min(k.forward + waits * k.a2a_forward, (k.backward + waits * k.a2a_backward) / 2)
        kinds = [layer] * (self.model.moe_layers < self.model.layers) + [moe] * bool(self.model.moe_layers)
        scaled = [min(map(ratio, kinds)) * self._unit[key][0]] + [ratio(moe) * m for m in self._unit[key][1:]]
        return max(self.time(config), max(scaled) + self._optimizer(config))


def _longest(c: StageCosts, stages: list[int]) -> dict[str, float]:
    """The longest forward and backward (B or I) of a device's `stages`."""
    return {"forward": max(c.forward[t] for t in stages),
            "backward": max(max(c.backward[t], c.backward_input[t]) for t in stages)}


def _busy(shape: _Order, c: StageCosts, s: int, longest: dict[str, float]) -> float:
    """Stage s's computes, each with the all-to-all it waits for (rule 18): alone, all of it; in an
    overlapped pair, what the partner's compute does not hide (`sim.engine.costs.pair_times`),
    at least its own less the longest compute of the partner's kind on its device (a forward's
    partner is a backward, B or I, and a backward's a forward: `longest`, its device's `_longest`)."""
    total = 0.0
    for kind, k in shape.counts[s].items():
        spec = KINDS[kind]
        if not spec.cost:  # a pair's mark: no time of its own
            continue
        a2a = getattr(c, spec.comm)[s] if spec.comm else 0.0
        pairs = shape.paired[s][kind]
        partner = longest["backward" if kind is Kind.F else "forward"]
        total += k * getattr(c, spec.cost)[s] + (k - pairs) * a2a + pairs * max(0.0, a2a - partner)
    return total


def _unit_makespan(schedule: Schedule, layers: Sequence[int]) -> float:
    """The makespan of `schedule` with each stage's F, B, I, W at (1, 2, 1, 1) per layer of `layers`
    (its stages') and free transfers."""
    n = [float(k) for k in layers]
    return simulate(schedule, Costs(forward=n, backward=[2 * k for k in n], backward_input=n, backward_weight=n,
                                    transport="ideal")).makespan
