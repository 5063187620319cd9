"""From a model, a GPU cluster and a parallel layout to a simulated training step: time, memory, fit.

    >>> import sim
    >>> e = sim.estimate("gpt3-175b", "a100-80gb", tp=8, pp=8, dp=1, micro_batch=1, global_batch=64,
    ...                  schedule="interleaved-1f1b", virtual=3, recompute="selective", sequence_parallel=True)
    >>> e.step_time, e.tflops_per_gpu, e.mfu, e.fits            # doctest: +SKIP

The layout is Megatron-LM's: tp-way tensor parallelism inside each layer (within a node
unless tp exceeds it), cp-way context parallelism (the sequence split over cp ranks), pp
pipeline devices each holding `virtual` chunks of contiguous layers, dp data-parallel
replicas; ranks are numbered tp fastest, then cp, then dp, then pp (Megatron-LM's default
order). The keywords are the fields of one record, `sim.Layout` (`sim.plan.layout`). Which link each group uses (NVLink, or the nodes' NICs and how many of
them) is `sim.hardware.topology`'s answer, and what a collective or a send over it costs is
`sim.hardware.network`'s (NCCL's model). Each stage's costs come from the cost layer, `sim.cost`:
its layers (`sim.cost.layer`), the embedding and output layer on the first and last stage
(`sim.cost.ends`) and data parallelism (`sim.cost.data_parallel`); the schedule runs on `sim.simulate`
with the ideal transport (NCCL on GPUs: a send leaves when its tensor is made). What the
estimate does not model is listed in docs/planner.md.
"""
from __future__ import annotations

import difflib
import math
from collections import Counter
from dataclasses import dataclass, field, fields

from sim.cost.data_parallel import fsdp_as_actions, optimizer_time
from sim.cost.layer import LayerTimes
from sim.simulation import simulate
from sim.engine.result import Result
from sim.hardware.gpus import GPU
from sim.hardware.profile import DeviceProfile, resolve
from sim.model.layer_layout import from_counts
from sim.model.transformer import Transformer
from sim.passes.fsdp import add_fsdp
from sim.passes.grad_reduce import add_grad_reduce
from sim.engine.result import reload_waits
from sim.schedule.ir import Schedule
from sim.schedule.kinds import Kind
from sim.schedule.registry import SCHEDULES
from sim.limits import check_cells

from .layout import Layout, cells, check_layout, usable_memory
from sim.model.registry import find_model, model_name
from .copies import repeat_costs
from .experts import moe_optimizer_time
from .stage_costs import memory_caps, memory_parts, offload_costs, partition_layers
from .steps import Steps

LAYOUT_FIELDS = tuple(f.name for f in fields(Layout))  # estimate's keywords, but the schedule's options
MODEL_FIELDS = tuple(f.name for f in fields(Transformer))  # the model's, not estimate's: refused with a hint


@dataclass
class Estimate:
    """A predicted training step. Times in seconds, memory in bytes (one value per pipeline device)."""
    model: Transformer
    profile: DeviceProfile     # the device profile it was timed with; `gpu` is its datasheet
    layout: Layout
    step_time: float
    tflops_per_gpu: float      # FLOPs executed (recompute included; Narayanan et al. 2021, Eq. 3) / s / GPU
    mfu: float                 # model FLOPs (no recompute; Korthikanti et al. 2022, Eq. 7) / (s * peak)
    bubble_fraction: float     # the pipeline's: idle share of device-time until the last compute ends
    peak_memory: list[float]
    fits: bool
    result: Result
    layers_per_stage: list[int]
    time_parts: dict = field(default_factory=dict)    # where the step's time goes, seconds
    memory_parts: list = field(default_factory=list)  # per pipeline device: weights, grads, optimizer, activations
    warnings: list = field(default_factory=list)
    usable_memory: float = math.inf  # bytes a device may fill: its memory less the headroom

    @property
    def gpu(self) -> GPU:
        return self.profile.gpu

    @property
    def layer_layout(self) -> str:
        """`layers_per_stage` as a Megatron-Core layout string (`--pipeline-model-parallel-layout`,
        `sim.model.layer_layout`), e.g. the balanced partition's 'Et*3|t*4|t*4|t*3L'; with two copies
        of the model (DualPipe), one copy's, each copy holding the model."""
        chain = len(self.layers_per_stage) // self.result.schedule.pipelines
        return str(from_counts(self.layers_per_stage[:chain]))

    def __repr__(self) -> str:
        lay = self.layout
        cp = f"cp={lay.cp}, " if lay.cp > 1 else ""
        cp += f"ep={lay.ep}, expert_tp={lay.expert_tp}, " if self.model.moe else ""
        return (f"<Estimate {model_name(self.model)} on {lay.gpus} x {self.gpu.name}, {self.profile.stack.name} "
                f"(tp={lay.tp}, {cp}pp={lay.pp}, "
                f"dp={lay.dp}, {lay.schedule}): step {self.step_time:.4g} s, {self.tflops_per_gpu:.0f} TFLOP/s/GPU, "
                f"MFU {self.mfu:.1%}, bubble {self.bubble_fraction:.1%}, peak {max(self.peak_memory) / 2**30:.1f} GiB, "
                f"fits {self.fits}; .summary() for every number, .result for the step>")

    def summary(self) -> dict:
        """The estimate as plain data (no result): the run, its layout (each choice that acts on
        it: cp_comm where cp > 1, FSDP's reshard_after_forward and fsdp_shard where zero=3 runs
        as FSDP's actions, with pp > 1), the layers of each stage and the predictions."""
        lay = self.layout
        fsdp = {"reshard_after_forward": lay.reshard_after_forward, "fsdp_shard": lay.fsdp_shard} \
            if fsdp_as_actions(lay) else {}
        return {"model": model_name(self.model), "gpu": self.gpu.name, "profile": self.profile.name, "stack": self.profile.stack.name, "gpus": lay.gpus,
                "gpus_per_node": lay.gpus_per_node, "nics_per_node": lay.nics_per_node or lay.gpus_per_node,
                "tp": lay.tp, "pp": lay.pp, "dp": lay.dp, "cp": lay.cp, "ep": lay.ep, "expert_tp": lay.expert_tp, **({"cp_comm": lay.cp_comm} if lay.cp > 1 else {}),
                "attention": self.model.attention, "micro_batch": lay.micro_batch, "global_batch": lay.global_batch,
                "micro_batches": lay.micro_batches, "schedule": lay.schedule, "virtual": self.result.schedule.stages // lay.pp,
                "recompute": lay.recompute, "sequence_parallel": lay.sequence_parallel, "tp_overlap": lay.tp_overlap,
                "zero": lay.zero, **fsdp, "fsdp_unit": lay.fsdp_unit, "overlap_grad_reduce": lay.overlap_grad_reduce, "precision": lay.precision,
                "optimizer": lay.optimizer, "offload": lay.offload, "memory_headroom": lay.memory_headroom,
                "usable_memory": self.usable_memory, "step_time": self.step_time, "tflops_per_gpu": self.tflops_per_gpu,
                "mfu": self.mfu, "bubble_fraction": self.bubble_fraction, "peak_memory": max(self.peak_memory),
                "fits": self.fits, "layers_per_stage": self.layers_per_stage, "layer_layout": self.layer_layout,
                "time_parts": self.time_parts, "warnings": self.warnings}


def estimate(model: Transformer | str, gpu: DeviceProfile | GPU | str = "a100-80gb", **keywords) -> Estimate:
    """Simulate one training step of `model` on `gpu`s split as the keywords say: each a field
    of `sim.Layout` (what each means, and its default, is there; see also the module's
    docstring), or an option of the layout's schedule (`sim.SCHEDULES[name].options`).
    `gpu` is a device profile (`sim.load_profile`), a profile's or GPU preset's name (its
    default profile, `sim.hardware.profile.DEFAULT_PROFILES`) or a preset `GPU`. Raises
    TypeError for a keyword that is neither, ValueError naming the fix for a layout that cannot
    run, and `sim.limits.StepTooLarge` (a ValueError) for a step too large for this machine's
    memory. `offload=True` (with recompute="full") copies each micro-batch's checkpointed
    layer inputs to host memory after its forward and back before its backward, SageMaker's
    `offload_activations` (`stage_costs.offload_costs`). `memory_headroom` is what each GPU
    keeps free (`fits` compares the peak with the rest: `layout.usable_memory`). `cp` splits the
    sequence over cp ranks, their attention exchanging K and V in a ring (`cp_comm="p2p"`) or by
    all-to-alls ("a2a"; `sim.cost.context.context_attention`). With zero=3 the gathers are FSDP's
    actions on the step (`sim.add_fsdp`): `reshard_after_forward` is FSDP2's option, `fsdp_unit`
    what it gathers at once ("layer": each layer, prefetched one ahead, as FSDP2 and
    Megatron-FSDP wrap a model; "stage": the whole stage, as exec's runtime does), and
    `fsdp_shard` makes it HSDP (docs/planner.md, "ZeRO with pipelining"). `ep` and `expert_tp`
    split a mixture of experts' routed experts over a stage's tp x cp x dp ranks as
    Megatron-Core folds them, the expert data-parallel size edp = tp cp dp / (expert_tp ep)
    following (`sim.plan.experts`)."""
    lay, options = layout_of(keywords)
    model, profile = find_model(model), resolve(gpu)
    warnings = check_layout(model, profile, lay)
    check_cells(cells(lay), hint="give a smaller global batch, a larger micro-batch or more dp")
    return estimate_layout(Steps(model, profile), lay, warnings, **options)


def layout_of(keywords: dict) -> tuple[Layout, dict]:
    """`estimate`'s keywords as a `Layout` and its schedule's options; TypeError, one line, for
    a keyword that is neither a field of `Layout` nor an option of the layout's schedule: it
    names the real ones, and says what the keyword is where it is something else (a field of
    the model, another schedule's option) or which real one it is close to."""
    lay = Layout(**{k: v for k, v in keywords.items() if k in LAYOUT_FIELDS})
    options = {k: v for k, v in keywords.items() if k not in LAYOUT_FIELDS}
    unknown = sorted(set(options) - set(SCHEDULES[lay.schedule].options))
    if unknown:
        takes = ", ".join(SCHEDULES[lay.schedule].options) or "none"
        raise TypeError(f"estimate() got an unexpected keyword argument {unknown[0]!r}{_hint(unknown[0], lay)}: "
                        f"not a field of sim.Layout ({', '.join(LAYOUT_FIELDS)}) nor an option of schedule "
                        f"{lay.schedule!r} ({takes})")
    return lay, options


def _hint(name: str, lay: Layout) -> str:
    """What the unknown keyword `name` is, in parentheses: a field of the model, another
    schedule's option, or the closest real keyword; "" if none of these."""
    if name in MODEL_FIELDS:
        return (f" (a field of the model, sim.Transformer: give the model with it, "
                f"dataclasses.replace(sim.MODELS[name], {name}=...))")
    takers = [n for n, g in SCHEDULES.items() if name in g.options]
    if takers:
        return f" (an option of {', '.join(takers)}, not of {lay.schedule!r}: give schedule=...)"
    close = difflib.get_close_matches(name, LAYOUT_FIELDS + SCHEDULES[lay.schedule].options, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def estimate_layout(steps: Steps, lay: Layout, warnings: list[str], **schedule_options) -> Estimate:
    """`estimate`'s steps on a layout `check_layout` passed (with its `warnings`), each taken
    from `steps`: time one layer and the ends (`sim.cost.layer`, `sim.cost.ends.end_times`);
    build the schedule; split the layers over its stages; cost each stage; add offloading and
    the gradient reduction; simulate the step."""
    model, profile, warnings = steps.model_of(lay), steps.profile, list(warnings)
    piece, (layer, moe), ends = steps.slice(lay), steps.layers(lay), steps.ends(lay)
    sched = build_schedule(steps, lay, schedule_options)
    caps = memory_caps(model, profile, lay, piece, layer, ends, sched, moe) if lay.partition == "balanced" else None
    chain = sched.stages // sched.pipelines  # one copy's stages, which hold the model (`sim.plan.copies`)
    layers = partition_layers(model.layers, chain, lay.partition, moe or layer, ends, caps)
    costs, parts = steps.stage_costs(lay, layers, sched.placement[:chain])
    costs = repeat_costs(costs, sched.placement, sched.pipelines)
    if lay.offload:
        sched, costs = offload_costs(model, profile, lay, layers * sched.pipelines, sched, costs)
    fsdp = fsdp_as_actions(lay)
    if fsdp:  # FSDP's gathers, then (pp > 1) its reduce-scatters after each stage's last backward
        sched = add_fsdp(sched, reshard_after_forward=lay.reshard_after_forward)
    if any(costs.grad_reduce):
        sched = add_grad_reduce(sched, overlap=lay.overlap_grad_reduce or fsdp)
    result = simulate(sched, costs)
    result.in_seconds = True  # the costs are seconds: figures say so
    optimizer = (moe_optimizer_time if model.moe else optimizer_time)(model, profile, lay, layers, sched.placement)
    step = result.makespan + optimizer + profile.step_overhead
    parts |= step_parts(lay, layer, layers * sched.pipelines, result, optimizer, profile.step_overhead,
                        parts["tp_collectives"], sched)
    peak = result.peak_memory
    usable = usable_memory(profile.memory, lay.memory_headroom)
    if usable < max(peak) <= profile.memory:
        warnings.append(f"peak {max(peak) / 2**30:.1f} GiB fits the GPU's {profile.memory / 2**30:.1f} GiB only "
                        f"in the headroom kept for CUDA, NCCL and fragmentation (memory_headroom="
                        f"{lay.memory_headroom:g}): counted as not fitting")
    flops = model.flops_per_iteration(lay.global_batch, lay.recompute)
    model_flops = model.flops_per_iteration(lay.global_batch, "none")
    return Estimate(model, profile, lay, step_time=step, tflops_per_gpu=flops / step / lay.gpus / 1e12,
                    mfu=model_flops / step / lay.gpus / profile.flops(piece.activation_precision),
                    bubble_fraction=result.pipeline_bubble_fraction,
                    peak_memory=peak, fits=max(peak) <= usable, result=result, layers_per_stage=layers * sched.pipelines,
                    time_parts=parts, memory_parts=memory_parts(costs, sched, result), warnings=warnings,
                    usable_memory=usable)


def step_parts(lay: Layout, layer: LayerTimes, layers: list[int], result: Result, optimizer: float,
               overhead: float, tp_collectives: float, sched: Schedule) -> dict[str, float]:
    """Where the step's time goes beyond the computes (`stage_costs` gives those), per device
    on average: the pipeline bubble, the gradient reduction left after the last compute, the
    optimizer, the step's overhead, offloading's waits; and what a split backward (I, W) costs
    beyond B (`split_backward`: the tensor-parallel collectives B hides under W and I + W
    cannot, and the split's own work, rule 15). `sched`: the schedule simulated, unlowered (its
    computes are the lowered one's, without writing the sends out)."""
    pp = lay.pp
    splits = Counter(a.stage for prog in sched.programs for a in prog if a.kind is Kind.I)
    split = sum(n * layers[s] for s, n in splits.items()) * (
        layer.backward_input + layer.backward_weight - layer.backward) / pp
    computed = result.compute_end  # the last compute's end
    busy = sum(result.busy()) / pp
    waits = sum(reload_waits(result)) / pp if lay.offload else 0.0  # backwards waiting for their RELOAD
    parts = dict(tp_collectives=tp_collectives, split_backward=split, pipeline_bubble=computed - busy - waits,
                 grad_reduce=result.makespan - computed, optimizer=optimizer, step_overhead=overhead)
    if lay.offload:
        parts["offload_wait"] = waits
    return parts


def build_schedule(steps: Steps, lay: Layout, options: dict) -> Schedule:
    """The layout's schedule (`Steps.schedule`). zb-auto searches its order under this run's own
    costs and the memory the GPU has left after the static bytes and the headroom (unless the
    options say otherwise)."""
    options = dict(options)
    if lay.schedule == "zb-auto" and "costs" not in options:
        layer, moe = steps.layers(lay)
        layers = partition_layers(steps.model.layers, lay.pp, lay.partition, moe or layer, steps.ends(lay))
        placement = list(range(lay.pp))
        costs, _ = steps.stage_costs(lay, layers, placement)
        per_stage = costs.for_stages(lay.pp)
        room = usable_memory(steps.profile.memory, lay.memory_headroom) - max(map(per_stage.static_total, placement))
        options["costs"] = costs
        if "memory_limit" not in options and room >= max(map(max, per_stage.activation_bytes,
                                                               per_stage.w_activation_bytes)):
            options["memory_limit"] = room
    return steps.schedule(lay, **options)
