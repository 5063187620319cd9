"""From a model, a GPU cluster and a parallel layout to a simulated training step: time, memory, fit.

    >>> import sim
    >>> e = sim.estimate("gpt3-175b", "a100-80gb", tp=8, pp=8, dp=1, micro_batch=1, global_batch=64,
    ...                  schedule="interleaved-1f1b", virtual=3, recompute="selective", sequence_parallel=True)
    >>> e.step_time, e.tflops_per_gpu, e.mfu, e.fits            # doctest: +SKIP

The layout is Megatron-LM's: tp-way tensor parallelism inside each layer (within a node
unless tp exceeds it), pp pipeline devices each holding `virtual` chunks of contiguous
layers, dp data-parallel replicas; ranks are numbered tp fastest, then dp, then pp (Megatron-
LM's default order). Which link each group uses (NVLink, or the nodes' NICs and how many of
them) is `sim.topology`'s answer, and what a collective or a send over it costs is
`sim.network`'s (NCCL's model). Each stage's costs come from `sim.layer` (its layers) and the
embedding and output layer on the first and last stage; the schedule runs on `sim.simulate`
with the ideal transport (NCCL on GPUs: a send leaves when its tensor is made). What the
estimate does not model is listed in docs/planner.md.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from functools import cache

from sim.engine.costs import Costs
from .data_parallel import grad_reduce_times, optimizer_time, stage_params, zero3_times
from sim.engine.core import simulate
from sim.model.footprint import state_bytes_per_param
from sim.hardware.gpus import GPU
from sim.passes.grad_reduce import add_grad_reduce
from sim.hardware.kernels import gemm_time, memory_time, precision_bytes
from sim.schedule.kinds import Kind, program_peak
from sim.model.layer import LayerTimes, Slice, layer_times
from sim.hardware.network import collective_time, links_of, p2p_link
from sim.passes.offload import add_offload, copy_time, reload_waits
from sim.search.partition import balanced, even
from sim.hardware.profile import DeviceProfile, resolve
from sim.engine.result import Result
from sim.schedules import lookup, make_schedule
from sim.hardware.topology import Topology
from sim.model.transformer import MODELS, Transformer, check_recompute, model as model_by_name


@dataclass(frozen=True)
class Layout:
    """How a run is split: sizes of the three parallelisms and of a micro-batch, and the choices."""
    tp: int = 1
    pp: int = 1
    dp: int = 1
    micro_batch: int = 1
    global_batch: int = 1
    schedule: str = "1f1b"
    virtual: int | None = None
    recompute: str = "none"
    sequence_parallel: bool = False
    zero: int = 0
    precision: str = "bf16"
    gpus_per_node: int = 8
    overlap_grad_reduce: bool = False
    partition: str | tuple = "even"
    tp_overlap: bool = True
    offload: bool = False
    nics_per_node: int | None = None  # None: one a GPU

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp

    def topology(self) -> Topology:
        """Where the layout's GPUs sit and which links its groups use (`sim.topology`)."""
        return Topology(self.tp, self.pp, self.dp, self.gpus_per_node, self.nics_per_node)

    @property
    def micro_batches(self) -> int:
        """Micro-batches per pipeline per step: global batch / (dp * micro-batch)."""
        return self.global_batch // (self.dp * self.micro_batch)


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

    @property
    def gpu(self) -> GPU:
        return self.profile.gpu

    def __repr__(self) -> str:
        lay = self.layout
        return (f"<Estimate {_model_name(self.model)} on {lay.gpus} x {self.gpu.name} (tp={lay.tp}, pp={lay.pp}, "
                f"dp={lay.dp}, {lay.schedule}): step {self.step_time:.4g} s, {self.tflops_per_gpu:.0f} TFLOP/s/GPU, "
                f"MFU {self.mfu:.1%}, bubble {self.bubble_fraction:.1%}, peak {max(self.peak_memory) / 2**30:.1f} GiB, "
                f"fits {self.fits}; .summary() for every number, .result for the step>")

    def summary(self) -> dict:
        """The estimate as plain data (no result)."""
        lay = self.layout
        return {"model": _model_name(self.model), "gpu": self.gpu.name, "profile": self.profile.name, "gpus": lay.gpus, "tp": lay.tp, "pp": lay.pp,
                "dp": lay.dp, "micro_batch": lay.micro_batch, "global_batch": lay.global_batch,
                "micro_batches": lay.micro_batches, "schedule": lay.schedule, "virtual": self.result.schedule.stages // lay.pp,
                "recompute": lay.recompute, "sequence_parallel": lay.sequence_parallel, "zero": lay.zero,
                "precision": lay.precision, "offload": lay.offload, "step_time": self.step_time, "tflops_per_gpu": self.tflops_per_gpu,
                "mfu": self.mfu, "bubble_fraction": self.bubble_fraction, "peak_memory": max(self.peak_memory),
                "fits": self.fits, "layers_per_stage": self.layers_per_stage, "time_parts": self.time_parts,
                "warnings": self.warnings}


def _model_name(m: Transformer) -> str:
    return next((name for name, x in MODELS.items() if x == m), repr(m))


def estimate(model: Transformer | str, gpu: DeviceProfile | GPU | str = "a100-80gb", *, tp: int = 1, pp: int = 1, dp: int = 1,
             micro_batch: int = 1, global_batch: int | None = None, gpus_per_node: int = 8, schedule: str = "1f1b",
             virtual: int | None = None, recompute: str = "none", sequence_parallel: bool = False, zero: int = 0,
             precision: str = "bf16", overlap_grad_reduce: bool = False, partition="even",
             tp_overlap: bool = True, offload: bool = False, nics_per_node: int | None = None,
             **schedule_options) -> Estimate:
    """Simulate one training step of `model` on `gpu`s split as given (see `Layout` and the
    module's docstring); `gpu` is a device profile (`sim.load_profile`), a profile's or GPU
    preset's name (its default profile, `sim.profile.DEFAULT_PROFILES`) or a preset `GPU`;
    `global_batch` defaults to one micro-batch per replica. Raises
    ValueError naming the fix for a layout that cannot run. `offload=True` (with
    recompute="full") copies each micro-batch's checkpointed layer inputs to host memory
    after its forward and back before its backward, SageMaker's `offload_activations`
    (`_offload`). `nics_per_node` (default `gpus_per_node`: one a GPU, as on a DGX) are the
    network cards of a node that collectives and sends between nodes share (`sim.topology`)."""
    m = model_by_name(model) if isinstance(model, str) else model
    g = resolve(gpu)
    lay = Layout(tp, pp, dp, micro_batch, dp * micro_batch if global_batch is None else global_batch,
                 lookup(schedule)[0],
                 virtual, recompute, sequence_parallel, zero, precision, gpus_per_node, overlap_grad_reduce,
                 partition if isinstance(partition, str) else tuple(partition), tp_overlap, offload,
                 gpus_per_node if nics_per_node is None else nics_per_node)
    warnings = check_layout(m, g, lay)
    x = Slice(micro_batch, tp, sequence_parallel, precision, tp_group=lay.topology().group("tp"))
    lt = layer_times(m, g, x, recompute, tp_overlap)
    ends = end_times(m, g, x)
    sched = _schedule(m, g, lay, x, lt, ends, schedule_options)
    caps = memory_caps(m, g, lay, x, lt, ends, sched) if lay.partition == "balanced" else None
    layers = _partition(m.layers, sched.stages, lay.partition, lt, ends, caps)
    costs, parts = _stage_costs(m, g, lay, x, lt, ends, layers, sched.placement)
    if lay.offload:
        sched, costs = _offload(m, g, lay, layers, sched, costs)
    if any(costs.grad_reduce):
        sched = add_grad_reduce(sched, overlap=overlap_grad_reduce)
    result = simulate(sched, costs)
    result.in_seconds = True  # the costs are seconds: figures say so
    opt = optimizer_time(m, g, lay, layers, sched.placement)
    step = result.makespan + opt + g.step_overhead
    # a split backward (I, W) cannot hide the tensor-parallel collectives under W as B does
    splits = Counter(a.stage for prog in sched.programs for a in prog if a.kind is Kind.I)
    parts["tp_collectives"] += sum(n * layers[s] for s, n in splits.items()) * (
        lt.backward_input + lt.backward_weight - lt.backward) / pp
    computed = result.compute_end  # the last compute's end
    busy = sum(result.busy()) / pp
    waits = sum(reload_waits(result)) / pp if lay.offload else 0.0  # backwards waiting for their RELOAD
    parts.update(pipeline_bubble=computed - busy - waits, grad_reduce=result.makespan - computed, optimizer=opt,
                 step_overhead=g.step_overhead)
    if lay.offload:
        parts["offload_wait"] = waits
    peak = result.peak_memory
    flops = m.flops_per_iteration(lay.global_batch, recompute)
    model_flops = m.flops_per_iteration(lay.global_batch, "none")
    return Estimate(m, g, lay, step_time=step, tflops_per_gpu=flops / step / lay.gpus / 1e12,
                    mfu=model_flops / step / lay.gpus / g.flops(precision),
                    bubble_fraction=result.pipeline_bubble_fraction,
                    peak_memory=peak, fits=max(peak) <= g.memory, result=result, layers_per_stage=layers,
                    time_parts=parts, memory_parts=_memory_parts(costs, sched, result), warnings=warnings)


def _offload(m: Transformer, g: DeviceProfile, lay: Layout, layers: list[int], sched, costs: Costs):
    """The schedule with SageMaker's activation offloading (`sim.add_offload`, its default
    horizon) and the costs of its copies: per micro-batch, each stage offloads what full
    recompute keeps of its layers, their inputs (`Transformer.activation_bytes_per_layer`),
    over PCIe at the GPU's `pcie_bandwidth` each way; the embedding's and output layer's
    activations stay on the GPU."""
    per_layer = m.activation_bytes_per_layer(lay.micro_batch, lay.tp, lay.sequence_parallel, "full", lay.precision)
    nbytes = tuple(n * per_layer for n in layers)
    if g.gpu.pcie_bandwidth is None:
        raise ValueError(f"offload=True needs the device's PCIe bandwidth; {g.gpu.name}'s datasheet has none")
    times = tuple(copy_time(b, g.gpu.pcie_bandwidth) for b in nbytes)
    return add_offload(sched), replace(costs, offload_bytes=nbytes, offload=times, reload=times)


def _schedule(m: Transformer, g: DeviceProfile, lay: Layout, x: Slice, lt: LayerTimes, ends: dict, options: dict):
    """The layout's schedule. zb-auto searches its order under this run's own costs and the
    memory the GPU has left after the static bytes (unless the options say otherwise)."""
    options = dict(options)
    if lay.schedule == "zb-auto" and "costs" not in options:
        placement = list(range(lay.pp))
        layers = _partition(m.layers, lay.pp, lay.partition, lt, ends)
        costs, _ = _stage_costs(m, g, lay, x, lt, ends, layers, placement)
        c = costs.for_stages(lay.pp)
        room = g.memory - max(map(c.static_total, placement))
        options["costs"] = costs
        if "memory_limit" not in options and room >= max(map(max, c.activation_bytes, c.w_activation_bytes)):
            options["memory_limit"] = room
    return make_schedule(lay.schedule, lay.pp, lay.micro_batches, lay.virtual, **options)


def check_layout(m: Transformer, g: DeviceProfile, lay: Layout) -> list[str]:
    """Raise ValueError (one line, naming the fix) for a layout that cannot run; return the
    warnings for one that runs badly."""
    for name in ("tp", "pp", "dp", "micro_batch", "global_batch", "gpus_per_node", "nics_per_node"):
        v = getattr(lay, name)
        if name == "nics_per_node" and v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    check_recompute(lay.recompute)
    stages = lay.pp * (lay.virtual if isinstance(lay.virtual, int) else lookup(lay.schedule)[1].virtual)
    if stages > m.layers:  # before any work (the schedule refuses a wrong V itself)
        chunks = f" x V {stages // lay.pp}" if stages != lay.pp else ""
        raise ValueError(f"pp={lay.pp}{chunks} = {stages} stages is more than the model's {m.layers} layers; "
                         f"use pp * V <= {m.layers}")
    precision_bytes(lay.precision)
    state_bytes_per_param(lay.precision, lay.zero, lay.dp)
    for what, n in (("heads", m.heads), ("kv_heads", m.kv_heads), ("ffn", m.ffn), ("vocab", m.vocab)):
        if n % lay.tp:
            ok = [d for d in (1, 2, 4, 8, 16, 32, 64) if n % d == 0 and m.heads % d == 0 and m.kv_heads % d == 0]
            raise ValueError(f"tp={lay.tp} does not divide the model's {n} {what}; use tp in {ok}")
    if lay.global_batch % (lay.dp * lay.micro_batch):
        raise ValueError(f"global batch {lay.global_batch} does not split into dp={lay.dp} replicas of "
                         f"micro-batches of {lay.micro_batch}; make it a multiple of {lay.dp * lay.micro_batch}")
    if lay.zero == 3 and lay.pp > 1:
        raise ValueError("zero=3 with pp > 1: ZeRO-3 gathers every weight for every micro-batch; "
                         "DeepSpeed and Megatron-LM do not combine it with pipelining; use zero <= 2")
    if lay.sequence_parallel and lay.tp == 1:
        raise ValueError("sequence_parallel needs tp > 1 (it splits what tensor parallelism leaves whole)")
    for name in ("overlap_grad_reduce", "tp_overlap", "offload"):
        if not isinstance(getattr(lay, name), bool):
            raise ValueError(f"{name} must be True or False, got {getattr(lay, name)!r}")
    if lay.offload and lay.recompute != "full":
        raise ValueError(f"offload=True offloads the layer inputs that full recompute keeps (SageMaker's "
                         f"offload_activations needs activation checkpointing); set recompute='full', "
                         f"not {lay.recompute!r}")
    warnings = []
    if lay.topology().group("tp").network:
        warnings.append(f"tp={lay.tp} spans nodes of {lay.gpus_per_node} GPUs: its all-reduces go over the network")
    return warnings


def end_kernels(m: Transformer, g: DeviceProfile, x: Slice) -> dict[str, list[float]]:
    """The kernels of the embedding (first stage) and of the final norm, output layer and loss
    (last stage), per micro-batch and pass (F, I, W), as a list of their times. The embedding
    lookup writes bsh elements and, split over tp (vocabulary-parallel), all-reduces them
    (Shoeybi et al. 2019, Sec. 3); its backward adds the gradient rows into the table. The
    output layer is a (bs, V/t, h) matmul; the vocabulary-parallel cross entropy reads the
    logits and keeps fp32 softmax (6 bytes a logit each way); the final LayerNorm moves 4 and
    6 bytes a hidden element."""
    b, s, h, t, e = x.micro_batch, m.seq, m.hidden, x.tp, precision_bytes(x.precision)
    tokens = b * s
    sbh = tokens * h * e / (t if x.sequence_parallel else 1)
    ar = [collective_time(links_of(g), "all_reduce", tokens * h * e, x.tensor_group)] if t > 1 else []
    logits = tokens * m.vocab / t
    head = dict(F=[gemm_time(g, x.precision, tokens, m.vocab // t, h), memory_time(g, 2 * sbh, "norm"),
                   memory_time(g, 6 * logits)] + ar,
                I=[gemm_time(g, x.precision, tokens, h, m.vocab // t), memory_time(g, 6 * logits),
                   memory_time(g, 3 * sbh, "norm")] + ar,
                W=[gemm_time(g, x.precision, h, m.vocab // t, tokens)])
    embed = dict(F=[memory_time(g, 2 * tokens * h * e, "embedding")] + ar, I=[],
                 W=[memory_time(g, 3 * tokens * h * e, "embedding")])
    return {f"first_{k}": v for k, v in embed.items()} | {f"last_{k}": v for k, v in head.items()}


def end_times(m: Transformer, g: DeviceProfile, x: Slice) -> dict[str, float]:
    """The seconds of `end_kernels`, per end and pass."""
    return {k: sum(v) for k, v in end_kernels(m, g, x).items()}


def _partition(layers: int, stages: int, partition, lt: LayerTimes, ends: dict, caps=None) -> list[int]:
    if partition == "even":
        return even(layers, stages)
    if partition == "balanced":
        extra = [0.0] * stages
        extra[0] += ends["first_F"] + ends["first_I"] + ends["first_W"]
        extra[-1] += ends["last_F"] + ends["last_I"] + ends["last_W"]
        fitting = caps if caps is not None and sum(caps) >= layers else None  # none fits: time alone
        return balanced(layers, stages, lt.forward + lt.backward, extra, fitting)
    counts = list(partition) if not isinstance(partition, str) else None
    if not counts or len(counts) != stages or sum(counts) != layers or min(counts) < 0 \
            or not all(isinstance(n, int) for n in counts):
        raise ValueError(f"partition must be 'even', 'balanced' or {stages} layer counts summing to {layers}, "
                         f"got {partition!r}")
    return counts


def memory_caps(m: Transformer, g: DeviceProfile, lay: Layout, x: Slice, lt: LayerTimes, ends: dict, sched) -> list[int] | None:
    """The most layers each stage can hold with its device still fitting the GPU, from the
    static bytes and the program-order peak of its activations (`sim.schedule.kinds.program_peak`,
    the schedule's own count of micro-batches held); None unless every device holds one stage
    (with several, their layers share one memory and no cap is a stage's own)."""
    if sched.stages != lay.pp or sorted(sched.placement) != list(range(lay.pp)):
        return None

    @cache
    def fits(n: int) -> tuple[bool, ...]:  # per stage: does its device fit with n layers on every stage?
        c = _stage_costs(m, g, lay, x, lt, ends, [n] * lay.pp, sched.placement)[0].for_stages(lay.pp)
        return tuple(c.static_total(s) + program_peak(sched.programs[sched.placement[s]], c) <= g.memory
                     for s in range(lay.pp))

    def cap(s: int) -> int:
        lo, hi = -1, m.layers + 1  # fits with lo layers (or -1: not even with none), not with hi
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid)[s] else (lo, mid)
        return max(lo, 0)

    return [cap(s) for s in range(lay.pp)]


def pass_times(m: Transformer, g: DeviceProfile, x: Slice, lt: LayerTimes, ends: dict,
               layers: list[int]) -> tuple[list[float], list[float], list[float], list[float], float]:
    """Per stage, the seconds of its F, B, I and W for one micro-batch: its layers' and ends'
    device times under the host's launch floor (`DeviceProfile.pass_time`: the kernels of the
    pass, from the same lists that time it, times the launch cost); and what the floor adds to
    one micro-batch's F + B over all stages."""
    stages = len(layers)
    counts = {k: len(v) for k, v in end_kernels(m, g, x).items()}
    out, added = [], 0.0
    for key, ends_of, layer_time in (("F", ("F",), lt.forward), ("B", ("I", "W"), lt.backward),
                                     ("I", ("I",), lt.backward_input), ("W", ("W",), lt.backward_weight)):
        times = []
        for s, n in enumerate(layers):
            sides = (["first"] if s == 0 else []) + (["last"] if s == stages - 1 else [])
            device = n * layer_time + sum(ends[f"{side}_{p}"] for side in sides for p in ends_of)
            kernels = n * lt.kernels[key] + sum(counts[f"{side}_{p}"] for side in sides for p in ends_of)
            times.append(g.pass_time(device, kernels))
            added += (times[-1] - device) if key in ("F", "B") else 0.0
        out.append(times)
    return (*out, added)


def _stage_costs(m: Transformer, g: DeviceProfile, lay: Layout, x: Slice, lt: LayerTimes, ends: dict, layers: list[int],
                 placement) -> tuple[Costs, dict]:
    """Per-stage `Costs` (seconds and bytes on one GPU) and the step's time by part."""
    stages = len(placement)
    first, last = [s == 0 for s in range(stages)], [s == stages - 1 for s in range(stages)]
    fwd, bwd, bi, bw, floor = pass_times(m, g, x, lt, ends, layers)
    e = precision_bytes(lay.precision)
    sbh = m.seq * lay.micro_batch * m.hidden
    act_layer = m.activation_bytes_per_layer(lay.micro_batch, lay.tp, lay.sequence_parallel, lay.recompute,
                                             lay.precision)
    w_layer = m.w_activation_bytes_per_layer(lay.micro_batch, lay.tp, lay.sequence_parallel, lay.precision,
                                             lay.recompute)
    ends_b = m.end_activation_bytes(lay.micro_batch, lay.tp, lay.sequence_parallel, lay.precision)
    act = [n * act_layer + (ends_b["first"] if f else 0.0) + (ends_b["last"] if la else 0.0)
           for n, f, la in zip(layers, first, last)]
    w_act = [n * w_layer + (ends_b["first_w"] if f else 0.0) + (ends_b["last_w"] if la else 0.0)
             for n, f, la in zip(layers, first, last)]
    per = state_bytes_per_param(lay.precision, lay.zero, lay.dp)
    params = stage_params(m, layers, lay.tp, placement)
    links = links_of(g)
    pipe = p2p_link(links, lay.topology().pipeline_send(placement))  # the slowest of its links
    sent = sbh * e / lay.tp  # Narayanan et al. 2021, Sec. 4.1: scatter/gather across the tp ranks' links
    # Sec. 4.1 again: the receiver all-gathers the t pieces over its tensor-parallel group
    # before the compute that takes them (none under sequence parallelism: the piece is its own)
    regather = 0.0 if lay.sequence_parallel else collective_time(links, "all_gather", sbh * e, x.tensor_group)
    into_f = [regather if s and placement[s - 1] != placement[s] else 0.0 for s in range(stages)]
    into_b = [regather if s < stages - 1 and placement[s + 1] != placement[s] else 0.0 for s in range(stages)]
    reduce = grad_reduce_times(m, g, lay, params, placement)
    gather, scatter = zero3_times(g, lay, params)
    fwd = [t + a + r for t, a, r in zip(fwd, gather, into_f)]
    bwd = [t + a + r + q for t, a, r, q in zip(bwd, gather, scatter, into_b)]
    bi = [t + a + q for t, a, q in zip(bi, gather, into_b)]
    bw = [t + r for t, r in zip(bw, scatter)]
    costs = Costs(forward=tuple(fwd), backward=tuple(bwd), backward_input=tuple(bi), backward_weight=tuple(bw),
                  activation_bytes=tuple(act), w_activation_bytes=tuple(w_act), activation_bytes_sent=sent,
                  weight_bytes=tuple(p * per["weights"] for p in params),
                  grad_bytes=tuple(p * per["grads"] for p in params),
                  optimizer_bytes=tuple(p * per["optimizer"] for p in params),
                  latency=pipe.latency, bandwidth=pipe.bandwidth, transport="ideal",
                  grad_reduce=tuple(reduce))
    # per device on average: the compute by part (the rest of the step: `estimate`)
    mb, names = lay.micro_batches, {"gemm": "gemm", "memory": "memory_bound", "collectives": "tp_collectives"}
    parts = {names[k]: mb * sum(layers) * v / lay.pp for k, v in lt.parts.items()}
    parts["embedding_and_output"] = mb * sum(ends.values()) / lay.pp
    parts["launch_floor"] = mb * floor / lay.pp
    parts["zero3_collectives"] = mb * (2 * sum(gather) + sum(scatter)) / lay.pp
    parts["tp_collectives"] += mb * (sum(into_f) + sum(into_b)) / lay.pp
    return costs, parts


def _memory_parts(costs: Costs, sched, result: Result) -> list[dict]:
    """Per pipeline device: bytes of weights, gradients and optimizer state, and the peak of activations."""
    c = costs.for_stages(sched.stages)
    out = [dict(weights=0.0, grads=0.0, optimizer=0.0) for _ in range(sched.ranks)]
    for s, r in enumerate(sched.placement):
        out[r]["weights"] += c.weight_bytes[s]
        out[r]["grads"] += c.grad_bytes[s]
        out[r]["optimizer"] += c.optimizer_bytes[s]
    for r, peak in enumerate(result.peak_memory):
        out[r]["activations"] = peak - out[r]["weights"] - out[r]["grads"] - out[r]["optimizer"]
    return out

