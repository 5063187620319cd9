"""Lower bounds on a planned configuration's peak memory and step time, for `sim.plan`.

Neither can exceed what `sim.estimate` predicts (docs/planner.md, "Planner", says why;
tests/test_plan.py checks them against the estimate of every configuration of an exhaustive
search): `sim.plan` drops a configuration whose memory bound exceeds the GPU's memory, and
stops simulating once the step-time bound exceeds the best steps it keeps.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from .costs import Costs
from .engine import simulate
from .estimate import stage_params
from .footprint import optimizer_step_bytes, state_bytes_per_param
from .gpus import GPU
from .ir import Schedule
from .kernels import memory_time, precision_bytes
from .kinds import Kind, program_peak
from .layer import Slice, layer_times
from .partition import even
from .schedules import make_schedule
from .transformer import Transformer

if TYPE_CHECKING:
    from .plan import Config


def held(schedule: Schedule) -> list[int]:
    """Per device, the most micro-batch chunks whose activations it holds at once. Memory
    follows each device's program order (`sim.kinds`: from the start of F to the end of B
    or I), not the timing, so no simulation is needed: one byte per micro-batch of a stage."""
    unit = Costs(activation_bytes=1.0, w_activation_bytes=0.0).for_stages(schedule.stages)
    return [round(program_peak(prog, unit)) for prog in schedule.programs]


@dataclass(frozen=True)
class _Shape:
    """What the bounds need of a schedule: its placement, layers per stage (the even
    split), the stages of each device, micro-batch chunks held per device, and whether it
    splits the backward."""
    schedule: Schedule
    layers: list[int]
    stages_of: list[list[int]]
    held: list[int]
    split: bool

    def per_device(self, per_stage: Sequence[float], pick=sum) -> list[float]:
        return [pick([per_stage[s] for s in stages]) for stages in self.stages_of]


class Bounds:
    """Lower bounds on a configuration's peak memory and step time (see the module's
    docstring and docs/planner.md, "Planner"), cached by what they depend on. They take
    the layers of each stage from `sim.partition.even`, as `sim.estimate` does; with another
    partition, only the averages over the devices."""

    def __init__(self, m: Transformer, g: GPU, global_batch: int, precision: str, gpus_per_node: int,
                 partition="even"):
        self.m, self.g, self.batch, self.precision, self.gpn = m, g, global_batch, precision, gpus_per_node
        self.even = partition == "even"
        self.params = m.params()
        self._layer, self._shape, self._unit = {}, {}, {}

    def layer(self, c: Config):
        key = (c.micro_batch, c.tp, c.sequence_parallel, c.recompute)
        if key not in self._layer:
            x = Slice(c.micro_batch, c.tp, c.sequence_parallel, self.precision, tp_network=c.tp > self.gpn)
            self._layer[key] = layer_times(self.m, self.g, x, c.recompute)
        return self._layer[key]

    def _key(self, c: Config) -> tuple:
        return c.schedule, c.pp, self.batch // (c.dp * c.micro_batch), c.virtual

    def shape(self, c: Config) -> _Shape:
        key = self._key(c)
        if key not in self._shape:
            sched = make_schedule(*key)
            split = any(a.kind is Kind.I for prog in sched.programs for a in prog)
            stages_of = [[s for s, r in enumerate(sched.placement) if r == d] for d in range(sched.ranks)]
            self._shape[key] = _Shape(sched, even(self.m.layers, sched.stages), stages_of, held(sched), split)
        return self._shape[key]

    def memory(self, c: Config) -> float:
        """The fullest device holds at least its stages' weights, gradients and optimizer
        state (`sim.estimate.stage_params`, `sim.footprint`) and, at its peak, its most
        chunks held times its smallest chunk's activations."""
        per = sum(state_bytes_per_param(self.precision, c.zero, c.dp).values())
        average = self.params.total / (c.tp * c.pp) * per  # the stages' parameters sum to the model's over tp
        if not self.even or average > self.g.memory:
            return average
        sh = self.shape(c)
        act = self.m.activation_bytes_per_layer(c.micro_batch, c.tp, c.sequence_parallel, c.recompute) \
            * precision_bytes(self.precision) / 2
        static = sh.per_device([p * per for p in stage_params(self.m, sh.layers, c.tp, sh.schedule.placement)])
        smallest = sh.per_device([n * act for n in sh.layers], min)
        return max(s + h * a for s, h, a in zip(static, sh.held, smallest))

    def _optimizer(self, c: Config) -> float:
        share = c.dp if c.zero >= 1 else 1
        return memory_time(self.g, self.params.total / (c.tp * c.pp * share) * optimizer_step_bytes(self.precision))

    def time(self, c: Config) -> float:
        """The busiest device's computes one after another (F + B of its layers for every
        micro-batch), then the optimizer step."""
        lt = self.layer(c)
        micro = self.batch // (c.dp * c.micro_batch)
        most = max(self.shape(c).per_device(self.shape(c).layers)) if self.even else self.m.layers / c.pp
        return micro * most * (lt.forward + lt.backward) + self._optimizer(c)

    def schedule_time(self, c: Config) -> float:
        """The schedule's makespan with each stage's F, B, I, W at (1, 2, 1, 1) per layer
        and free transfers, times the smallest ratio of a layer's real times to those: a
        makespan is a longest path through the programs' order and the dependencies, so it
        grows with every duration and scales with them all. A simulation per schedule,
        pp, micro-batches and V: asked only of configurations about to be simulated."""
        if not self.even:
            return self.time(c)
        key, sh, lt = self._key(c), self.shape(c), self.layer(c)
        if key not in self._unit:
            n = [float(k) for k in sh.layers]
            unit = Costs(forward=n, backward=[2 * k for k in n], backward_input=n, backward_weight=n,
                         transport="ideal")
            self._unit[key] = simulate(sh.schedule, unit).makespan
        ratio = min(lt.forward, lt.backward_input, lt.backward_weight) if sh.split else min(lt.forward, lt.backward / 2)
        return max(self.time(c), ratio * self._unit[key] + self._optimizer(c))
