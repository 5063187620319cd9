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
from typing import TYPE_CHECKING, Sequence

from sim.engine.costs import Costs, StageCosts
from sim.simulation import simulate
from sim.cost.data_parallel import optimizer_time, stage_params
from sim.cost.ends import end_times
from .layout import Layout
from .stage_costs import partition_layers, stage_costs
from sim.model.footprint import DEFAULT_OPTIMIZER, optimizer_step_bytes, state_bytes_per_param
from sim.hardware.profile import DeviceProfile, resolve
from sim.schedule.ir import Schedule
from sim.hardware.kernels import memory_time, precision_bytes
from sim.schedule.kinds import KINDS, Kind
from sim.schedule.liveness import held
from sim.cost.layer import Slice, layer_times
from sim.search.partition import even
from sim.schedule.registry import make_schedule
from sim.hardware.topology import Topology
from sim.model.transformer import Transformer
from sim.schedule.zerobubble import split_1f1b

if TYPE_CHECKING:
    from .space import Config

# Schedules that `sim.estimate` builds under the run's own costs (`sim.plan.estimation.build_schedule`):
# the unit-cost one built here may order their actions otherwise.
_COST_DEPENDENT = ("zb-auto",)


@dataclass(frozen=True)
class _Shape:
    """What the bounds need of a schedule: its placement, layers per stage (the even
    split), the stages of each device, micro-batch chunks held per device, whether it
    splits the backward, its compute actions per stage by kind, and the kind of each
    device's last compute. Where the estimate may build another order (zb-auto), held is 1
    and the last kind None."""
    schedule: Schedule
    layers: list[int]
    stages_of: list[list[int]]
    held: list[int]
    split: bool
    counts: list[Counter]
    last: list[Kind | None]

    def per_device(self, per_stage: Sequence[float], pick=sum) -> list[float]:
        return [pick([per_stage[s] for s in stages]) for stages in self.stages_of]


def _shape(m: Transformer, key: tuple) -> _Shape:
    # zb-auto's own order is searched under the run's costs (minutes for hundreds of
    # micro-batches): what the bounds read of it (placement, the computes per stage) is
    # the I/W-split 1F1B's, one of its candidates
    sched = split_1f1b(*key[1:3]) if key[0] == "zb-auto" else make_schedule(*key)
    counts = [Counter() for _ in range(sched.stages)]
    for prog in sched.programs:
        for a in prog:
            counts[a.stage][a.kind] += 1
    stages_of = [[s for s, r in enumerate(sched.placement) if r == d] for d in range(sched.ranks)]
    if key[0] in _COST_DEPENDENT:  # the estimate's order may differ: only what every order has
        last, most = [None] * sched.ranks, [1] * sched.ranks
    else:
        last, most = [prog[-1].kind for prog in sched.programs], held(sched)
    return _Shape(sched, even(m.layers, sched.stages), stages_of, most, bool(any(c[Kind.I] for c in counts)),
                  counts, last)


class Bounds:
    """Lower bounds on a configuration's peak memory and step time (see the module's
    docstring and docs/planner.md, "Planner"), cached by what they depend on. The memory
    bound and `schedule_time` take the layers of each stage from `sim.search.partition.even`, as
    `sim.estimate` does; with another partition, only the averages over the devices."""

    def __init__(self, m: Transformer, g: DeviceProfile, global_batch: int, precision: str, gpus_per_node: int,
                 partition="even", nics_per_node: int | None = None, optimizer: str = DEFAULT_OPTIMIZER):
        self.optimizer = optimizer
        self.m, self.g, self.batch, self.precision, self.gpn = m, resolve(g), global_batch, precision, gpus_per_node
        self.nics = gpus_per_node if nics_per_node is None else nics_per_node
        self.partition = partition if isinstance(partition, str) else tuple(partition)
        self.even = partition == "even"
        self.params = m.params()
        self._layer, self._ends, self._shape, self._unit = {}, {}, {}, {}

    def _slice(self, c: Config) -> Slice:
        group = Topology(c.tp, c.pp, c.dp, self.gpn, self.nics).group("tp")
        return Slice(c.micro_batch, c.tp, c.sequence_parallel, self.precision, tp_group=group)

    def layer(self, c: Config):
        x = self._slice(c)
        key = (x, c.recompute)
        if key not in self._layer:
            self._layer[key] = layer_times(self.m, self.g, x, c.recompute)
        return self._layer[key]

    def _key(self, c: Config) -> tuple:
        return c.schedule, c.pp, self.batch // (c.dp * c.micro_batch), c.virtual

    def shape(self, c: Config) -> _Shape:
        key = self._key(c)
        if key not in self._shape:
            self._shape[key] = _shape(self.m, key)
        return self._shape[key]

    def _activations(self, c: Config) -> float:
        """One micro-batch's activations of one layer on one GPU."""
        return self.m.activation_bytes_per_layer(c.micro_batch, c.tp, c.sequence_parallel, c.recompute,
                                                 self.precision)

    def memory_average(self, c: Config) -> float:
        """The average device's weights, gradients and optimizer state (the stages'
        parameters sum to the model's over tp) and, with the even split, one micro-batch's
        activations of the fewest layers a stage has (a device holds at least the one its
        forward takes in). No schedule needed: the pp * V stages are known."""
        per = sum(state_bytes_per_param(self.precision, c.zero, c.dp, self.optimizer).values())
        fewest = self.m.layers // (c.pp * c.virtual) if self.even else 0
        return self.params.total / (c.tp * c.pp) * per + fewest * self._activations(c)

    def memory(self, c: Config) -> float:
        """The fullest device holds at least its stages' weights, gradients and optimizer
        state (`sim.cost.data_parallel.stage_params`, `sim.model.footprint`) and, at its peak, its most
        chunks held times its smallest chunk's activations."""
        average = self.memory_average(c)
        if not self.even or average > self.g.memory:
            return average
        per = sum(state_bytes_per_param(self.precision, c.zero, c.dp, self.optimizer).values())
        sh, act = self.shape(c), self._activations(c)
        static = sh.per_device([p * per for p in stage_params(self.m, sh.layers, c.tp, sh.schedule.placement)])
        smallest = sh.per_device([n * act for n in sh.layers], min)
        return max(s + h * a for s, h, a in zip(static, sh.held, smallest))

    def _optimizer(self, c: Config) -> float:
        share = c.dp if c.zero >= 1 else 1
        return memory_time(self.g, self.params.total / (c.tp * c.pp * share) * optimizer_step_bytes(self.precision, self.optimizer), "optimizer")

    def average(self, c: Config) -> float:
        """The average device's computes one after another (F + B of the layers for every
        micro-batch; a split I + W is never shorter), then the optimizer step over the
        average device's share. No schedule needed."""
        lt = self.layer(c)
        micro = self.batch // (c.dp * c.micro_batch)
        return micro * self.m.layers / c.pp * (lt.forward + lt.backward) + self._optimizer(c) + self.g.step_overhead

    def costs(self, c: Config) -> tuple[StageCosts, list[int], Layout]:
        """The per-stage costs, layers per stage and layout that `sim.estimate` simulates `c`
        with (its own functions, so the bound follows any change to the estimate)."""
        sh, lt, x = self.shape(c), self.layer(c), self._slice(c)
        if x not in self._ends:
            self._ends[x] = end_times(self.m, self.g, x)
        ends = self._ends[x]
        lay = Layout(global_batch=self.batch, precision=self.precision, gpus_per_node=self.gpn,
                     partition=self.partition, nics_per_node=self.nics, optimizer=self.optimizer, **c.kwargs())
        layers = partition_layers(self.m.layers, sh.schedule.stages, self.partition, lt, ends)
        costs, _ = stage_costs(self.m, self.g, lay, x, lt, ends, layers, sh.schedule.placement)
        return costs.for_stages(sh.schedule.stages), layers, lay

    def time(self, c: Config) -> float:
        """The longest of one path per device d through the step's dependencies: the
        forward of one micro-batch through the stages below d's first (on other devices,
        each hop a transfer) up to d's first compute; all of d's computes one after
        another; then either the backward of d's last micro-batch down through those
        stages (where d's last compute is a B or I of its first stage) or d's gradient
        reductions, which follow its last compute on its collective stream; then the
        optimizer step of the fullest device. With the estimate's own durations."""
        sh = self.shape(c)
        sc, layers, lay = self.costs(c)
        place, n = sh.schedule.placement, sh.schedule.stages
        hop = [sc.latency + sc.transfer_time(sc.activation_bytes_sent[s]) if place[s] != place[s + 1] else 0.0
               for s in range(n - 1)]
        head, tail = [0.0], [0.0]  # the forward up to stage s; the backward down from it
        for s in range(n - 1):
            head.append(head[-1] + sc.forward[s] + hop[s])
            tail.append(tail[-1] + min(sc.backward[s], sc.backward_input[s]) + hop[s])
        micro = sh.schedule.micro_batches
        busy = [sum(k * getattr(sc, KINDS[kind].cost)[s] for kind, k in sh.counts[s].items())
                if sh.last[place[s]] is not None else
                micro * (sc.forward[s] + min(sc.backward[s], sc.backward_input[s] + sc.backward_weight[s]))
                for s in range(n)]
        longest = 0.0
        for d, stages in enumerate(sh.stages_of):
            first = stages[0]
            after = tail[first] if sh.last[d] in (Kind.B, Kind.I) else 0.0
            reduce = sum(sc.grad_reduce[s] for s in stages)
            longest = max(longest, head[first] + sum(busy[s] for s in stages) + max(after, reduce))
        return max(self.average(c), longest + optimizer_time(self.m, self.g, lay, layers, place) + self.g.step_overhead)

    def schedule_time(self, c: Config) -> float:
        """The schedule's makespan with each stage's F, B, I, W at (1, 2, 1, 1) per layer
        and free transfers, times the smallest ratio of a layer's real times to those: a
        makespan is a longest path through the programs' order and the dependencies, so it
        grows with every duration and scales with them all. A simulation per schedule,
        pp, micro-batches and V: asked only of configurations about to be simulated."""
        if not self.even or c.schedule in _COST_DEPENDENT:
            return self.time(c)
        key, sh, lt = self._key(c), self.shape(c), self.layer(c)
        if key not in self._unit:
            n = [float(k) for k in sh.layers]
            unit = Costs(forward=n, backward=[2 * k for k in n], backward_input=n, backward_weight=n,
                         transport="ideal")
            self._unit[key] = simulate(sh.schedule, unit).makespan
        ratio = min(lt.forward, lt.backward_input, lt.backward_weight) if sh.split else min(lt.forward, lt.backward / 2)
        return max(self.time(c), ratio * self._unit[key] + self._optimizer(c))
