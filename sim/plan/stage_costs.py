"""What each pipeline stage of a layout costs one GPU: the cost layer's layers and ends summed per stage under the host's launch floor, memory, and the collectives around it."""
from __future__ import annotations

from dataclasses import replace
from functools import cache

from sim.engine.costs import Costs
from sim.engine.fields import PER_STAGE
from sim.engine.result import Result
from sim.cost.data_parallel import (fsdp_as_actions, fsdp_held_bytes, fsdp_layer_exposure, fsdp_times,
                                    grad_reduce_times, zero3_times)
from sim.cost.ends import end_kernel_counts
from sim.cost.layer import LayerTimes, Slice, check_timed, layer_times
from sim.cost.slice import per_rank
from sim.hardware.kernels import precision_bytes
from sim.hardware.network import collective_time, links_of, p2p_link
from sim.hardware.profile import DeviceProfile
from sim.model.footprint import state_bytes_per_param
from sim.model.layer_layout import LayerLayout, LayoutError, parse_layer_layout
from sim.model.transformer import Transformer
from sim.engine.costs import copy_time
from sim.passes.offload import add_offload
from sim.schedule.liveness import program_peak
from sim.search.partition import balanced, even

from .experts import dispatch_buffers, expert_all_to_alls, expert_reduce_times, fp8_copy_bytes, layer_activations, moe_layers, split_params, state_bytes
from .layout import Layout, usable_memory


def partition_layers(layers: int, stages: int, partition, lt: LayerTimes, ends: dict, caps=None) -> list[int]:
    if partition == "even":
        return even(layers, stages)
    if partition == "balanced":
        extra = [0.0] * stages
        extra[0] += ends["first_F"] + ends["first_B"]
        extra[-1] += ends["last_F"] + ends["last_B"]
        fitting = caps if caps is not None and sum(caps) >= layers else None  # none fits: time alone
        return balanced(layers, stages, lt.forward + lt.backward, extra, fitting)
    if isinstance(partition, str):
        return layout_layers(partition, layers, stages)
    counts = list(partition)
    if not counts or len(counts) != stages or sum(counts) != layers or min(counts) < 0 \
            or not all(isinstance(n, int) for n in counts):
        raise ValueError(f"partition must be 'even', 'balanced' or {stages} layer counts summing to {layers} "
                         f"(or a layout string such as 'Et|tt|tL'), got {partition!r}")
    return counts


def layout_layers(text: str, layers: int, stages: int) -> list[int]:
    """The layers per stage of a Megatron-Core layout string (`sim.model.layer_layout`), for a
    model of `layers` transformer layers cut into `stages` stages; the embedding on the first
    stage and the loss on the last, as `stage_costs` prices them, and no MTP layers."""
    layout = parse_layer_layout(text).check(layers=layers)
    if len(layout.stages) != stages:
        raise LayoutError(f"layout {layout}: {len(layout.stages)} stages, the schedule has {stages} (P x V)")
    if layout.holds("E")[0] != 1 or layout.holds("L")[-1] != 1 or any(layout.mtp):
        raise LayoutError(f"layout {layout}: the planner prices the embedding E on the first stage, the loss L on "
                          f"the last and no MTP layer m")
    return layout.layers


def layer_times_of_kinds(m: Transformer, g: DeviceProfile, x: Slice, recompute: str,
                tp_overlap: bool = True) -> tuple[LayerTimes, LayerTimes | None]:
    """The times of one dense layer and, for a mixture of experts, of one MoE layer
    (`sim.cost.layer.layer_times`, moe=True; None for a dense model)."""
    check_timed(m, moe_layers=True)
    dense = layer_times(m, g, x, recompute, tp_overlap)
    return dense, layer_times(m, g, x, recompute, tp_overlap, moe=True) if m.moe else None


def memory_caps(m: Transformer, g: DeviceProfile, lay: Layout, x: Slice, lt: LayerTimes, ends: dict, sched,
                moe: LayerTimes | None = None) -> list[int] | None:
    """The most layers each stage can hold with its device still fitting the GPU (less the headroom), from the
    static bytes and the program-order peak of its activations (`sim.schedule.liveness.program_peak`,
    the schedule's own count of micro-batches held); None unless every device holds one stage
    (with several, their layers share one memory and no cap is a stage's own)."""
    if sched.stages != lay.pp or sorted(sched.placement) != list(range(lay.pp)):
        return None

    @cache
    def fits(n: int) -> tuple[bool, ...]:  # per stage: does its device fit with n layers on every stage?
        c = stage_costs(m, g, lay, x, lt, ends, [n] * lay.pp, sched.placement, moe)[0].for_stages(lay.pp)
        usable = usable_memory(g.memory, lay.memory_headroom)
        return tuple(c.static_total(s) + program_peak(sched.programs[sched.placement[s]], c) <= usable
                     for s in range(lay.pp))

    def cap(s: int) -> int:
        lo, hi = -1, m.layers + 1  # fits with lo layers (or -1: not even with none), not with hi
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid)[s] else (lo, mid)
        return max(lo, 0)

    return [cap(s) for s in range(lay.pp)]


def pass_times(m: Transformer, g: DeviceProfile, x: Slice, lt: LayerTimes, ends: dict,
               layers: list[int], moe: LayerTimes | None = None) -> tuple[list[float], list[float], list[float], list[float], float]:
    """Per stage, the seconds of its F, B, I and W for one micro-batch: its layers' and ends'
    device times under the host's launch floor (`DeviceProfile.pass_time`: the kernels of the
    pass, from the same lists that time it, times the launch cost); and what the floor adds to
    one micro-batch's F + B over all stages. Under torch's split backward (`kernels="torch"`)
    the first stage's I is empty and its W the whole backward (docs/rules.md, rule 15). A
    mixture of experts' MoE layers (`sim.plan.experts.moe_layers`) take `moe`'s times, its
    dense layers `lt`'s."""
    stages = len(layers)
    counts = end_kernel_counts(m, g, x)
    sparse = moe_layers(m, layers) if moe is not None else [0] * stages
    out, added = [], 0.0
    for key, attr in (("F", "forward"), ("B", "backward"), ("I", "backward_input"), ("W", "backward_weight")):
        times, seen = [], {}  # a stage like one seen (its layers, MoE layers and ends) times the same
        for s, (n, k) in enumerate(zip(layers, sparse)):
            like = (n, k, s == 0, s == stages - 1)
            if like not in seen:
                sides = ["first"] * like[2] + ["last"] * like[3]
                device = (n - k) * getattr(lt, attr) + sum(ends[f"{side}_{key}"] for side in sides)
                kernels = (n - k) * lt.kernels[key] + sum(counts[f"{side}_{key}"] for side in sides)
                if k:
                    device, kernels = device + k * getattr(moe, attr), kernels + k * moe.kernels[key]
                seen[like] = g.pass_time(device, kernels), device
            seconds, device = seen[like]
            times.append(seconds)
            added += (seconds - device) if key in ("F", "B") else 0.0
        out.append(times)
    if m.kernels == "torch":  # rule 15 (docs/rules.md): the first stage's input takes no gradient
        out[2][0], out[3][0] = 0.0, out[1][0]  # I does nothing; W is the whole backward
    return (*out, added)


def stage_costs(m: Transformer, g: DeviceProfile, lay: Layout, x: Slice, lt: LayerTimes, ends: dict, layers: list[int],
                placement, moe: LayerTimes | None = None, passes: tuple | None = None) -> tuple[Costs, dict]:
    """Per-stage `Costs` (seconds and bytes on one GPU) and the step's time by part; a mixture
    of experts' MoE layers take `moe`'s times (`pass_times`, or `passes` where the caller has them)
    and hold and reduce their experts as Megatron-Core folds them (`sim.plan.experts`)."""
    stages = len(placement)
    fwd, bwd, bi, bw, floor = pass_times(m, g, x, lt, ends, layers, moe) if passes is None else passes
    kept = x.activation_precision  # under FP8 the activations are BF16, but for the Linears' saved inputs
    e = precision_bytes(kept)
    full, m = m, per_rank(m, x)  # what scales with the tokens: s/cp of the sequence
    sbh = m.seq * lay.micro_batch * m.hidden
    sparse = moe_layers(full, layers)
    act, w_act = stage_activations(m, lay, layers, sparse, kept)
    params, expert = split_params(full, layers, lay, placement)  # dense and expert parameters a GPU holds
    state = state_bytes(lay, params, expert)
    fp8_copies = [fp8_copy_bytes(full, lay, n, k) if lay.precision == "fp8" else 0.0 for n, k in zip(layers, sparse)]
    links = links_of(g)
    pipe = p2p_link(links, lay.topology().pipeline_send(placement))  # the slowest of its links
    sent = sbh * e / lay.tp  # Narayanan et al. 2021, Sec. 4.1: scatter/gather across the tp ranks' links
    # Sec. 4.1 again: the receiver all-gathers the t pieces over its tensor-parallel group
    # before the compute that takes them (none under sequence parallelism: the piece is its own)
    regather = 0.0 if lay.sequence_parallel else collective_time(links, "all_gather", sbh * e, x.tensor_group)
    into_f = [regather if s and placement[s - 1] != placement[s] else 0.0 for s in range(stages)]
    into_b = [regather if s < stages - 1 and placement[s + 1] != placement[s] else 0.0 for s in range(stages)]
    # with one stage a device and overlap_grad_reduce, the reduction overlaps the last backward bucket by bucket
    # (DualPipe: `placement` is one copy's, a device holding a stage of each copy)
    bucketed = lay.overlap_grad_reduce and sorted(placement) == list(range(lay.pp)) and lay.pipelines == 1
    reduce = grad_reduce_times(full, g, lay, params, placement, bwd if bucketed else None)
    if any(expert):  # the experts' own reduction over edp, after the dense one
        dense = grad_reduce_times(full, g, lay, params, placement) if bucketed else reduce
        reduce = [r + t for r, t in zip(reduce, expert_reduce_times(g, lay, expert, bwd if bucketed else None, dense))]
    gather, regather, scatter = zero_exposure(full, g, lay, lt, layers, params)
    fwd = [t + a + r for t, a, r in zip(fwd, gather, into_f)]
    bwd = [t + a + r + q for t, a, r, q in zip(bwd, regather, scatter, into_b)]
    bi = [t + a + q for t, a, q in zip(bi, regather, into_b)]
    bw = [t + r for t, r in zip(bw, scatter)]
    # a profile of CPU ranks over gloo gives its runtime's own costs (docs/rules.md rules 2, 3, 9:
    # the isend, irecv and arrival calls; 10: a late notice's wait for the sender's I/O thread;
    # 11: the runtime's time around each compute): the step exec runs, not the links' ideal
    transport = dict(g.host_transport) if g.host_transport else {"transport": "ideal"}
    fields = dict(forward=tuple(fwd), backward=tuple(bwd), backward_input=tuple(bi), backward_weight=tuple(bw),
                  activation_bytes=tuple(act), w_activation_bytes=tuple(w_act), activation_bytes_sent=sent,
                  weight_bytes=tuple(w + copies for w, copies in zip(state["weights"], fp8_copies)),
                  grad_bytes=tuple(state["grads"]), optimizer_bytes=tuple(state["optimizer"]),
                  latency=pipe.latency, bandwidth=pipe.bandwidth, **transport,
                  grad_reduce=tuple(reduce), **expert_all_to_alls(moe, sparse),
                  static_bytes=dispatch_buffers(m, lay, placement, sparse, kept))
    if fsdp_as_actions(lay):
        fields |= fsdp_costs(full, g, lay, layers, params)
    costs = Costs(**fields)
    # per device on average: the compute by part (the rest of the step: `estimate`)
    mb, names = lay.micro_batches, {"gemm": "gemm", "memory": "memory_bound", "collectives": "tp_collectives"}
    count = sum(sparse)
    parts = {names[k]: mb * (sum(layers) - count) * v / lay.pp + (mb * count * moe.parts[k] / lay.pp if count else 0.0)
             for k, v in lt.parts.items()}
    parts["embedding_and_output"] = mb * sum(ends[f"{side}_{p}"] for side in ("first", "last") for p in "FB") / lay.pp
    parts["launch_floor"] = mb * floor / lay.pp
    if count:  # as the engine adds them to unpaired computes (an overlapped pair hides some: rule 18)
        parts["expert_all_to_all"] = mb * count * (moe.a2a_forward + moe.a2a_backward) / lay.pp
    parts["zero_collectives"] = mb * (sum(gather) + sum(regather) + sum(scatter)) / lay.pp
    parts["tp_collectives"] += mb * (sum(into_f) + sum(into_b)) / lay.pp
    return costs, parts


def zero_exposure(m: Transformer, g: DeviceProfile, lay: Layout, lt: LayerTimes, layers: list[int],
                  params: list[float]) -> tuple[list[float], list[float], list[float]]:
    """Per stage, what ZeRO's gathers and reduce-scatters add to one micro-batch's forward, to
    its backward before them, and after it: with the layer as FSDP's unit at pp = 1, FSDP2's
    prefetched per-layer ones (`sim.cost.data_parallel.fsdp_layer_exposure`); else
    DeepSpeed's whole-stage ones, the gather before the forward and again before the backward
    (`sim.cost.data_parallel.zero3_times`; none with pp > 1, where FSDP's are actions)."""
    if lay.zero == 3 and lay.pp == 1 and lay.fsdp_unit == "layer":
        return fsdp_layer_exposure(m, g, lay, layers, params, lt.forward, lt.backward)
    gather, scatter = zero3_times(g, lay, params)
    return gather, gather, scatter


def stage_activations(m: Transformer, lay: Layout, layers: list[int], sparse: list[int],
                      kept: str) -> tuple[list[float], list[float]]:
    """Per stage, the bytes one micro-batch keeps on one GPU for its backward and those its W
    still needs after I: its dense and MoE layers' (`sparse` of them MoE; `sim.plan.experts.layer_activations`
    of `m`, the model as a GPU of its context-parallel group holds it) and the ends' on the
    first and last stage."""
    stages = len(layers)
    first, last = [s == 0 for s in range(stages)], [s == stages - 1 for s in range(stages)]
    act_layer, w_layer, act_moe = layer_activations(m, lay, kept)
    ends_b = m.end_activation_bytes(lay.micro_batch, lay.tp, lay.sequence_parallel, kept)
    act = [(n - k) * act_layer + k * act_moe + (ends_b["first"] if f else 0.0) + (ends_b["last"] if la else 0.0)
           for n, k, f, la in zip(layers, sparse, first, last)]
    w_act = [(n - k) * w_layer + k * act_moe + (ends_b["first_w"] if f else 0.0) + (ends_b["last_w"] if la else 0.0)
             for n, k, f, la in zip(layers, sparse, first, last)]
    if m.kernels == "torch":  # rule 15: the first stage's I keeps its whole graph for W (the head's too, pp = 1)
        w_act[0] = act[0]
    return act, w_act


def fsdp_costs(m: Transformer, g: DeviceProfile, lay: Layout, layers: list[int], params: list[float]) -> dict:
    """The `Costs` fields of FSDP's actions (zero=3: `sim.cost.data_parallel.fsdp_as_actions`):
    each stage's UNSHARD, its time (pp > 1: the whole stage's all-gather; pp = 1: none, the
    gathers' exposed time being in the passes) and the bytes it holds until its RESHARD
    (`sim.cost.data_parallel.fsdp_held_bytes`). With pp > 1 its gradients are whole until its
    REDUCE_GRAD, the reduce-scatter: torch.distributed.pipelining turns FSDP's gradient sync off
    until the stage's last backward (`set_requires_gradient_sync(False)`), so each micro-batch
    adds into unsharded gradients."""
    held = tuple(fsdp_held_bytes(m, lay, layers, params))
    if lay.pp == 1:
        return dict(unshard=(0.0,) * len(params), unshard_bytes=held)
    grads = state_bytes_per_param(lay.precision)["grads"]
    return dict(unshard=tuple(fsdp_times(g, lay, params)), unshard_bytes=held,
                grad_bytes=tuple(p * grads for p in params))


def memory_parts(costs: Costs, sched, result: Result) -> list[dict]:
    """Per pipeline device: bytes of weights, gradients and optimizer state, the MoE dispatcher's
    buffers where there are some (`static_bytes`), and the peak of activations."""
    c = costs.for_stages(sched.stages)
    out = [dict(weights=0.0, grads=0.0, optimizer=0.0) for _ in range(sched.ranks)]
    for s, r in enumerate(sched.placement):
        out[r]["weights"] += c.weight_bytes[s]
        out[r]["grads"] += c.grad_bytes[s]
        out[r]["optimizer"] += c.optimizer_bytes[s]
        if c.static_bytes[s]:
            out[r]["dispatch_buffers"] = out[r].get("dispatch_buffers", 0.0) + c.static_bytes[s]
    for r, peak in enumerate(result.peak_memory):
        out[r]["activations"] = peak - out[r]["weights"] - out[r]["grads"] - out[r]["optimizer"] \
            - out[r].get("dispatch_buffers", 0.0)
    return out


def offload_costs(m: Transformer, g: DeviceProfile, lay: Layout, layers: list[int], sched, costs: Costs):
    """The schedule with SageMaker's activation offloading (`sim.add_offload`, its default
    horizon) and the costs of its copies: per micro-batch, each stage offloads what full
    recompute keeps of its layers, their inputs (`Transformer.activation_bytes_per_layer`),
    over PCIe at the GPU's `pcie_bandwidth` each way; the embedding's and output layer's
    activations stay on the GPU."""
    m = per_rank(m, Slice(lay.micro_batch, cp=lay.cp))  # s/cp of the sequence
    per_layer = m.activation_bytes_per_layer(lay.micro_batch, lay.tp, lay.sequence_parallel, "full",
                                             "bf16" if lay.precision == "fp8" else lay.precision)
    nbytes = tuple(n * per_layer for n in layers)
    if g.gpu.pcie_bandwidth is None:
        raise ValueError(f"offload=True needs the device's PCIe bandwidth; {g.gpu.name}'s datasheet has none")
    times = tuple(copy_time(b, g.gpu.pcie_bandwidth) for b in nbytes)
    return add_offload(sched), replace(costs, offload_bytes=nbytes, offload=times, reload=times)


def priced(layout: LayerLayout, layer: Costs, embedding: Costs | None = None, loss: Costs | None = None,
           mtp: Costs | None = None) -> Costs:
    """`layer`'s costs with every per-stage field (times, bytes) of stage s the sum over what
    it holds: its transformer layers' (`layer`), the embedding's, the loss's and the MTP
    layers' (none: free). The other fields (latency, bandwidth, transport) are `layer`'s."""
    parts = {"t": layer, "E": embedding, "L": loss, "m": mtp}
    one = {k: c.for_stages(1) for k, c in parts.items() if c is not None}
    fields = {}
    for name in PER_STAGE:
        fields[name] = tuple(sum(n * getattr(one[k], name)[0] for k, n in zip(parts, counts) if k in one)
                             for counts in zip(*(layout.holds(k) for k in parts)))
    return replace(layer, **fields)
