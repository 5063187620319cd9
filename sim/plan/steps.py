"""The estimator's steps for one model and device profile, each computed once per what it depends on: a layout's slice, layer times, ends, stage costs and schedule.

`sim.estimate` takes them in order (`sim.plan.estimation`); the planner's lower bounds
(`sim.plan.bounds`) take the same ones from the same `Steps`, so that a search times each layer,
costs each split of the layers and builds each schedule once, and a bound follows any change
to the estimate:

    >>> from sim.plan.layout import Layout
    >>> steps = Steps(find_model("megatron-1.7b"), resolve("a100-80gb"))
    >>> lay = Layout(tp=2, pp=4, dp=2, global_batch=16)
    >>> steps.schedule(lay) is steps.schedule(lay.changed(recompute="full"))  # the same sizes: one schedule
    True
"""
from __future__ import annotations

from dataclasses import fields, replace
from operator import attrgetter

from sim.cost.ends import end_times
from sim.cost.layer import LayerTimes, Slice
from sim.engine.costs import Costs
from sim.hardware.profile import DeviceProfile, resolve
from sim.model.registry import find_model
from sim.model.transformer import Transformer
from sim.schedule.ir import Schedule
from sim.schedule.registry import make_schedule

from .layout import Layout, layout_slice
from .stage_costs import layer_times_of_kinds, pass_times, stage_costs

# What a layout's stage costs do not read of its schedule but its copies of the model (`Layout.pipelines`)
_NOT_COSTED = ("schedule", "virtual", "overlap")
_COSTED = tuple(f.name for f in fields(Layout) if f.name not in _NOT_COSTED)
# What places a layout's groups and sizes its slice of a layer (`layout.layout_slice`)
_SLICED = ("tp", "pp", "dp", "cp", "cp_comm", "micro_batch", "sequence_parallel", "precision", "gpus_per_node",
           "nics_per_node", "ep", "expert_tp")
_costed, _sliced = attrgetter(*_COSTED), attrgetter(*_SLICED)  # a layout's values of those fields, as a tuple


class Steps:
    """The estimator's steps on `model` and `profile` (a name or the record), cached: each is a
    pure function of the layout fields its key names."""

    def __init__(self, model: Transformer | str, profile: DeviceProfile | str):
        self.model, self.profile = find_model(model), resolve(profile)
        self._slices, self._layers, self._ends, self._costs, self._schedules, self._models = {}, {}, {}, {}, {}, {}
        self._passes = {}

    def model_of(self, lay: Layout) -> Transformer:
        """The model as the layout runs it: its attention kernel the layout's, where it names one."""
        if lay.attention is None:
            return self.model
        if lay.attention not in self._models:
            self._models[lay.attention] = replace(self.model, attention=lay.attention)
        return self._models[lay.attention]

    def slice(self, lay: Layout) -> Slice:
        """How one GPU of the layout holds a layer (`layout.layout_slice`)."""
        key = _sliced(lay)
        x = self._slices.get(key)
        if x is None:
            x = self._slices[key] = layout_slice(lay)
        return x

    def layers(self, lay: Layout) -> tuple[LayerTimes, LayerTimes | None]:
        """A dense and (a mixture of experts) a MoE layer's times (`stage_costs.layer_times_of_kinds`)."""
        key = (self.slice(lay), lay.recompute, lay.tp_overlap, lay.attention)
        times = self._layers.get(key)  # (hashing the slice once)
        if times is None:
            times = self._layers[key] = layer_times_of_kinds(self.model_of(lay), self.profile, key[0], lay.recompute,
                                                             lay.tp_overlap)
        return times

    def ends(self, lay: Layout) -> dict:
        """What the embedding and the output layer add to the first and last stage (`sim.cost.ends.end_times`)."""
        key = (self.slice(lay), lay.attention)
        ends = self._ends.get(key)
        if ends is None:
            ends = self._ends[key] = end_times(self.model_of(lay), self.profile, key[0])
        return ends

    def stage_costs(self, lay: Layout, layers, placement) -> tuple[Costs, dict]:
        """`stage_costs.stage_costs` of the layout with `layers` on stages placed by `placement`:
        the costs, and a copy of the step's time by part (the caller may add to it)."""
        key = (_costed(lay), lay.pipelines, tuple(layers), tuple(placement))
        if key not in self._costs:
            dense, moe = self.layers(lay)
            self._costs[key] = stage_costs(self.model_of(lay), self.profile, lay, self.slice(lay), dense,
                                           self.ends(lay), list(layers), list(placement), moe,
                                           self.pass_times(lay, key[2]))
        costs, parts = self._costs[key]
        return costs, dict(parts)

    def pass_times(self, lay: Layout, layers: tuple[int, ...]) -> tuple:
        """`stage_costs.pass_times` of the layout's layers, `layers` a stage (its lists copied: the
        caller may change them)."""
        key = (self.slice(lay), lay.recompute, lay.tp_overlap, lay.attention), layers
        if key not in self._passes:
            dense, moe = self.layers(lay)
            self._passes[key] = pass_times(self.model_of(lay), self.profile, key[0][0], dense, self.ends(lay),
                                           list(layers), moe)
        *times, floor = self._passes[key]
        return (*map(list, times), floor)

    def schedule(self, lay: Layout, **options) -> Schedule:
        """The layout's schedule (`sim.make_schedule`; with the schedule's overlapped pairs where
        `lay.overlap`); built once per sizes where no other option is given."""
        pairs = {"overlap": True} if lay.overlap else {}
        if options:
            return make_schedule(lay.schedule, lay.pp, lay.micro_batches, lay.virtual, **pairs, **options)
        key = (lay.schedule, lay.pp, lay.micro_batches, lay.virtual, lay.overlap)
        if key not in self._schedules:
            self._schedules[key] = make_schedule(*key[:4], **pairs)
        return self._schedules[key]
