"""Calibration inside the ranks: what each rank measures, under the conditions of a real step, for `sim.Costs`.

`calibrate_rank` runs on every rank at once (inside `exec.launch.processes.launch`, or between the
steps of a run: `exec.pipeline.runner`), on the program the run compiled (`sim.compile`:
the actions, waits and transfers its steps run, `exec.runtime.rank_program`), and returns one report; `exec.measure.costs.costs_from_reports`
merges every rank's reports into `sim.Costs`. A report holds:

- compute times, each between the very marks a step records: inside real training steps
  of the schedule, all ranks at once, with their transfers and the step's boundary
  (`step_compute_times`, "concurrent", what the simulator takes; each rank's first compute
  of a step apart, "first": rule 19); and each rank's own program's compute actions
  alone in the program's order, all ranks at once ("compute_only") and taking turns
  ("alone"), with the interpreter's own handlers (`RankInterpreter.run_action`), every
  input from another rank already there (`RankInterpreter.deliver`);
- the runtime's own time around each compute, from entering its handler to the start
  mark and from the end mark to leaving it (`before_compute`, `after_compute`, rule 11);
- what the transport costs between ranks 0 and 1 (`exec.measure.calibrate_link`): the call
  and arrival overheads, the wait of a late ready notice, and ping-pong transfers;
- memory per stage: the activation bytes autograd saves during its F (as the runtime
  counts them, `exec.runtime.memory.SavedBytes`), the part of them that W still needs after a
  split backward's I (`w_activation_bytes`), the bytes it sends on, and its weights,
  gradients and optimizer state (`exec.runtime.memory.static_memory`);
- with data parallelism, where the schedule reduces gradients (REDUCE_GRAD): each
  stage's reduction on the rank's collective stream (`reduce_times`), as a step issues
  it, every data-parallel group at once (`grad_reduce`, rule 13).

With data parallelism (`exec.runtime.dp.ReplicaContext`) every rank of every replica times its
computes; the transport between ranks 0 and 1 is timed in replica 0 only. With expert
parallelism the replicas of an ep group take their turn alone together (their MoE layers'
all-to-all needs them all), and a MoE stage's computes include its all-to-alls.
"""
from __future__ import annotations

import copy
import statistics
from typing import Sequence

import torch
import torch.distributed as dist

import sim
from sim import Kind
from sim.engine.program import Program
from sim.schedule.kinds import KINDS

from exec.launch.host import paused_gc
from exec.measure.busy import StepLoad
from exec.measure.calibrate_link import call_costs, late_notice, pingpong
from exec.runtime.clocks import CpuClock
from exec.runtime.dp import CollectiveStream
from exec.runtime.ep import split_parameters
from exec.runtime.interpreter import RankInterpreter
from exec.runtime.shapes import infer_shapes
from exec.runtime.memory import SavedBytes, param_storages, static_memory
from exec.runtime.optim import DEFAULT_OPTIMIZER, make_optimizer
from exec.runtime.rank_program import compiled
from exec.runtime.split_backward import backward_input
from exec.runtime.step import run_step

__all__ = ["check_calibrated", "calibrate_rank", "compute_times", "step_compute_times", "reduce_times", "activation_bytes", "w_activation_bytes",
           "stage_inputs", "activation_message_bytes", "message_sizes"]


# ---------------------------------------------------------------------------- inputs, once per process

def stage_inputs(spec, layers, bounds: Sequence[int], stage: int, micro_batches: int):
    """Per micro-batch, the input of `stage` and the targets (the earlier stages' forward)."""
    out = []
    with torch.no_grad():
        for x, y in spec.micro_batches(micro_batches):
            for layer in layers[:bounds[stage]]:
                x = layer(x)
            out.append((x, y))
    return out


_PREPARED: dict = {}  # this process's calibration inputs, for one configuration at a time


def _prepared(spec, bounds: Sequence[int], micro_batches: int):
    """The model's layers, per stage the input of every micro-batch (`stage_inputs`), and
    the micro-batches, built once per process and configuration: every calibration round
    of a run reuses them, so a round allocates no new model or batch before it times the
    computes (fresh allocations between rounds grew the heap, and the timed computes then
    took page faults that a step does not)."""
    key = (spec, tuple(bounds), micro_batches)
    if key not in _PREPARED:
        _PREPARED.clear()
        layers = spec.build_layers()
        inputs = {s: stage_inputs(spec, layers, bounds, s, micro_batches) for s in range(len(bounds) - 1)}
        _PREPARED[key] = (layers, inputs, spec.micro_batches(micro_batches))
    return _PREPARED[key]


# ---------------------------------------------------------------------------- memory

def _saved_forward(module, x, input_grad: bool, last: bool, loss_fn, y, micro_batches: int):
    """One forward of `module` on a copy of `x` (needing a gradient if `input_grad`), with
    the loss on the last stage, under the interpreter's count of saved bytes. Returns
    (input, module output, what the backward starts from: the output or the scaled
    loss, `SavedBytes`)."""
    inp = x.detach().clone()
    if input_grad:
        inp.requires_grad_()
    saved = SavedBytes(param_storages(module))
    with saved.hooks():
        out = module(inp)
        root = loss_fn(out, y) / micro_batches if last else out
    return inp, out, root, saved


def activation_bytes(module, x, last: bool, loss_fn, y, micro_batches: int) -> tuple[int, int]:
    """Bytes autograd saves during one forward of `module` on `x`, counted as the
    interpreter counts them (`SavedBytes`: each storage once, parameters excluded), and
    the bytes of the output the stage sends on."""
    _, out, _, saved = _saved_forward(module, x, x.is_floating_point(), last, loss_fn, y, micro_batches)
    return saved.nbytes, out.numel() * out.element_size()


def w_activation_bytes(module, x, first: bool, last: bool, loss_fn, y, micro_batches: int) -> int:
    """Bytes the graph still holds for W after a split backward's I (`exec.runtime.split_backward`),
    counted as the interpreter counts them (`SavedBytes.kept_bytes`): F, then I with a
    gradient of the output's shape, on an input that needs a gradient except on the first
    stage (whose I keeps everything: its W is the whole backward)."""
    inp, out, root, saved = _saved_forward(module, x, not first and x.is_floating_point(), last, loss_fn, y, micro_batches)
    grad = None if last else torch.ones_like(out)
    _, work = backward_input(root, grad, inp, list(module.parameters()))
    del out, root, inp
    kept = saved.kept_bytes()
    del work
    return kept


def _memory(spec, stages: int, bounds: Sequence[int], micro_batches: int, mine: list[int],
            modules: dict | None, optimizer) -> dict[int, dict[str, int]]:
    """Per stage of this rank: its activation bytes, the part of them W still needs after a
    split backward's I, the bytes it sends on, and its static
    memory (`static_memory`) on `modules` and the run's `optimizer` when given, else on a
    fresh copy with a new optimizer of that name (whose state is what its first step
    will create)."""
    layers, inputs, _ = _prepared(spec, bounds, micro_batches)
    out = {}
    for s in mine:
        fresh = torch.nn.Sequential(*layers[bounds[s]:bounds[s + 1]])
        x, y = inputs[s][0]
        last = s == stages - 1
        act, sent = activation_bytes(fresh, x, last, spec.loss, y, micro_batches)
        w_act = w_activation_bytes(fresh, x, s == 0, last, spec.loss, y, micro_batches)
        module = modules[s] if modules is not None else fresh
        opt = make_optimizer(optimizer, module.parameters(), lr=1e-3) if isinstance(optimizer, str) else optimizer
        out[s] = {"activation_bytes": act, "activation_bytes_sent": sent, "w_activation_bytes": w_act,
                  **static_memory(module, opt).as_dict()}
    return out


# ---------------------------------------------------------------------------- compute times

def _timed_step(interp: RankInterpreter, computes: list, arrived, record: bool, samples: dict, own: dict) -> None:
    """Run `computes` (the rank's compute actions, in the program's order) with `interp`'s
    handlers, each input from another rank delivered first; record each compute's time
    between its marks and the runtime's own time before and after them."""
    for a in computes:  # what a step would have received: a fresh tensor each time
        for recv in interp.waits[a]:
            interp.deliver(recv, arrived(recv))
    clock = interp.clock
    clock.start()
    for a in computes:
        t0 = clock.mark()
        marks = interp.run_action(a)
        t1 = clock.mark()
        if record:
            samples.setdefault((a.stage, a.kind.value), []).append(marks.end - marks.start)
            own["before"].append(marks.start - t0)
            own["after"].append(t1 - marks.end)
    for mod in interp.modules.values():
        mod.zero_grad(set_to_none=True)


def _arrivals(stages: dict, inputs: dict, last: int):
    """recv -> the tensor a step would have received: a stage's real input for an
    activation, a fixed random gradient of the output's shape for a gradient."""
    grads = {}
    for s, module in stages.items():
        if s != last:
            with torch.no_grad():
                shape = module(inputs[s][0][0]).shape
            grads[s] = torch.randn(shape, generator=torch.Generator().manual_seed(s))

    def arrived(recv):
        spec = KINDS[recv.kind]
        data = inputs[recv.stage][recv.micro][0] if Kind.F in spec.feeds else grads[recv.stage + spec.tensor_of]
        return data.detach().clone()
    return arrived


def _rank_stages(ctx, spec, bounds, program: Program, micro_batches: int, modules: dict | None):
    """This rank's stages (`modules`, or a fresh copy of its layers), every stage's inputs
    (`stage_inputs`), and the micro-batches' inputs and targets."""
    layers, inputs, batches = _prepared(spec, bounds, micro_batches)
    mine = [s for s, r in enumerate(program.placement) if r == ctx.rank]
    stages = dict(modules) if modules is not None else \
        {s: torch.nn.Sequential(*layers[bounds[s]:bounds[s + 1]]) for s in mine}
    return stages, inputs, [x for x, _ in batches], [y for _, y in batches]


def compute_times(ctx, spec, bounds, program: Program, micro_batches: int, steps: int, alone: bool,
                  modules: dict | None = None) -> tuple[dict, dict]:
    """Run this rank's compute actions in the order of `program` (compiled: `sim.compile`),
    `steps` times, with the interpreter's own handlers on `modules` (stage -> module; default: a fresh copy of
    this rank's stages), every tensor from another rank already there.

    If `alone`, the ranks of the world take turns (the others wait in a barrier), else
    they all run at once. Returns, without the first (warm-up) step, {(stage, kind): [seconds...]}: each
    compute between the marks the interpreter records in a step; and {"before": [...],
    "after": [...]}: the runtime's own time per compute (rule 11), from entering the
    handler to the start mark and from the end mark to leaving it, on the same clock."""
    if ctx.device.type != "cpu":
        raise ValueError("the compute calibration times CPU ranks (gloo) only")
    stages, inputs, xs, ys = _rank_stages(ctx, spec, bounds, program, micro_batches, modules)
    arrived = _arrivals(stages, inputs, program.stages - 1)
    samples: dict[tuple[int, str], list[float]] = {}
    own: dict[str, list[float]] = {"before": [], "after": []}

    def one_step(record: bool) -> None:
        interp = RankInterpreter(ctx, program, stages, xs, ys, spec.loss, {}, 0)
        computes = [a for a in interp.actions if a.kind.is_compute]
        _timed_step(interp, computes, arrived, record, samples, own)

    for mod in stages.values():  # never accumulate into the gradients a step left behind
        mod.zero_grad(set_to_none=True)
    with paused_gc():  # as in a step (`exec.pipeline.runner`): no collection inside a timed compute
        _rounds(one_step, steps, alone, *_turn(ctx))
    return samples, own


def step_compute_times(ctx, spec, bounds, program: Program, micro_batches: int, steps: int,
                       modules: dict | None = None, optimizer: "str | torch.optim.Optimizer" = DEFAULT_OPTIMIZER,
                       optimizer_times: list | None = None) -> tuple[dict, list[float]]:
    """Time this rank's computes inside real training steps of `program` (compiled:
    `sim.compile`; `exec.runtime.step.run_step`: its SENDs and RECVs move the data, `optimizer` closes
    each step, every rank's records are gathered), all ranks at once: a compute between the
    marks the step records, so that what the transport and the runtime do between computes,
    and the step's boundary before its first compute, are in their times (rule 19). On
    `modules` (stage -> module) with the run's own `optimizer`, whose weights and state are
    put back afterwards, or on a fresh copy with a fresh optimizer of that name. Returns,
    without the first (warm-up) step, {(stage, kind): [seconds...]} of every compute but a
    step's first, and each step's first compute's excess over the median of its stage and kind;
    each of those steps' optimizer step on this rank goes to `optimizer_times` as (seconds,
    parameter tensors, parameters)."""
    if ctx.device.type != "cpu":
        raise ValueError("the compute calibration times CPU ranks (gloo) only")
    stages, _, xs, ys = _rank_stages(ctx, spec, bounds, program, micro_batches, modules)
    params = [p for m in stages.values() for p in m.parameters()]
    opt = make_optimizer(optimizer, params, lr=1e-3) if isinstance(optimizer, str) else optimizer
    kept = ([p.detach().clone() for p in params], copy.deepcopy(opt.state_dict()))
    shapes = infer_shapes(ctx, program.schedule, stages, xs[0])
    samples: dict[tuple[int, str], list[float]] = {}
    firsts: list[tuple[tuple[int, str], float]] = []
    for step in range(steps + 1):
        with paused_gc(), StepLoad():  # each step as `exec.pipeline.worker` runs it: a collection, the load probe
            done = run_step(ctx, program, stages, xs, ys, spec.loss, opt, shapes=shapes)
        computes = sorted((e for e in done.result.events if e.rank == ctx.rank and e.is_compute), key=lambda e: e.start)
        if step == 0 or not computes:
            continue
        if optimizer_times is not None:
            optimizer_times.append((done.optimizer_s, len(params), sum(p.numel() for p in params)))
        first, *rest = computes
        firsts.append(((first.action.stage, first.action.kind.value), first.duration))
        for e in rest:
            samples.setdefault((e.action.stage, e.action.kind.value), []).append(e.duration)
    with torch.no_grad():  # the run goes on from the weights and state it had
        for p, was in zip(params, kept[0]):
            p.copy_(was)
    opt.load_state_dict(kept[1])
    opt.zero_grad(set_to_none=True)
    excess = [t - statistics.median(samples[k]) for k, t in firsts if k in samples]
    return samples, excess


def _turn(ctx) -> tuple[int, int]:
    """(this rank's turn, the number of turns) where the ranks compute alone: every rank of
    every replica its own, but the replicas of an ep group together, as their MoE layers'
    all-to-all needs them all (`exec.runtime.ep`)."""
    ep = getattr(ctx, "ep", 1)
    if ep == 1:
        return dist.get_rank(), dist.get_world_size()
    groups = ctx.dp // ep
    return ctx.rank * groups + ctx.replica // ep, ctx.world_size * groups


def _rounds(one_step, steps: int, alone: bool, turn: int, turns: int) -> None:
    """`steps` + 1 runs of `one_step` (the first not recorded), all ranks at once or in
    `turns` turns, this rank's being `turn`."""
    for step in range(steps + 1):
        if alone:
            for t in range(turns):  # every replica's ranks
                dist.barrier()
                if t == turn:
                    one_step(step > 0)
        else:
            dist.barrier()
            one_step(step > 0)
    dist.barrier()


# ---------------------------------------------------------------------------- communication

def reduce_times(ctx, modules: dict, repeats: int) -> dict[int, list[float]]:
    """Per stage of this rank, the time of its REDUCE_GRAD on the collective stream
    (`exec.runtime.dp.CollectiveStream`, as the interpreter issues it: the gradients flattened,
    averaged over `ctx.dp_group`, the routed experts' over `ctx.edp_group` where ep > 1), from its start to its end, `repeats` times after a
    warm-up. Every rank of the world issues at once (after a barrier), so that every
    data-parallel group reduces at the same time; the ranks do not compute meanwhile.
    The gradients are zeros of the stage's parameters' shapes: the run's stay untouched."""
    stream = CollectiveStream(ctx.dp_group, dist.get_world_size(ctx.dp_group), CpuClock(),
                              getattr(ctx, "edp_group", None))
    ep = getattr(ctx, "ep", 1)  # the dense parameters, and the routed experts' where ep > 1
    params = {s: [[torch.nn.Parameter(torch.zeros_like(p)) for p in part] for part in split_parameters(m, ep)]
              for s, m in modules.items()}
    out: dict[int, list[float]] = {s: [] for s in modules}
    for i in range(repeats + 1):
        for s in sorted(modules):
            dist.barrier()
            r = stream.issue(sim.Action(s, Kind.REDUCE_GRAD, 0), *params[s])
            stream.finish_all()
            if i > 0:
                out[s].append(r.end - r.start)
    return out


def activation_message_bytes(spec, micro_batches: int) -> int:
    """Bytes of the activation passed between stages for one micro-batch (b, seq, hidden);
    for a user's blocks, of what their first layer outputs."""
    x = spec.micro_batches(micro_batches)[0][0]
    if spec.model == "blocks":
        with torch.no_grad():
            x = spec.build_layers()[0](x)
        return x.numel() * x.element_size()
    return x.numel() * 4 * (spec.hidden if spec.model == "gpt" else 1)


def message_sizes(spec, micro_batches: int) -> list[int]:
    """Ping-pong message sizes: powers of 4 from 4 bytes to 4 MiB, and the activation size."""
    return sorted({4, 1 << 10, 1 << 14, 1 << 16, 1 << 18, 1 << 20, 1 << 22, activation_message_bytes(spec, micro_batches)})


# ---------------------------------------------------------------------------- one report

def check_calibrated(schedule: sim.Schedule) -> None:
    """Raise ValueError for a schedule calibration cannot measure yet: two copies of the
    model (DualPipe), whose stages are cut from one copy's bounds."""
    if schedule.pipelines > 1:
        raise ValueError(f"calibration does not measure schedule {schedule.name!r} of {schedule.pipelines} copies of "
                         f"the model (DualPipe) yet; calibrate the same model under dualpipev or 1f1b, whose stage "
                         f"costs it shares")


def calibrate_rank(ctx, spec, program: Program, micro_batches: int, bounds: Sequence[int], steps: int = 5,
                   sizes: Sequence[int] | None = None, repeats: int = 20, modules: dict | None = None,
                   optimizer: "str | torch.optim.Optimizer" = DEFAULT_OPTIMIZER) -> dict:
    """Run on every rank at once (inside `exec.launch.processes.launch`): what this rank measures.

    Its stages' memory (static memory with `optimizer`: the run's optimizer, or the name
    of one from `exec.runtime.optim`); the time of each of its compute actions over `steps` steps
    of its program: inside real steps of `program` (what `sim.compile(schedule, "gloo")`
    made, as the run's steps run it), every rank at once
    ("concurrent", what the simulator takes, with each step's first compute's excess apart:
    "first"; rule 19), in compute-only steps with every rank at once ("compute_only", with
    the runtime's own time around each compute, rule 11) and with the ranks taking turns
    ("alone"), on `modules` (stage -> module) when the caller will run those
    very modules (same weights in the same memory), else on a fresh copy; and, on ranks 0
    and 1 if `sizes` is given, the ping-pong. Merge every rank's report (one or several
    rounds) with `exec.measure.costs.costs_from_reports`. With a data-parallel group
    (`exec.runtime.dp.ReplicaContext`) and REDUCE_GRAD actions in `program`, also the time of
    each of its stages' reductions (`reduce_times`, on `modules` or the fresh copy)."""
    program = compiled(program, "gloo")
    reduces = program.schedule.has_collectives and getattr(ctx, "dp_group", None) is not None
    mine = [s for s, r in enumerate(program.placement) if r == ctx.rank]
    memory = _memory(spec, program.stages, bounds, micro_batches, mine, modules, optimizer)
    concurrent, firsts = step_compute_times(ctx, spec, bounds, program, micro_batches, steps, modules, optimizer)
    compute_only, own = compute_times(ctx, spec, bounds, program, micro_batches, steps, alone=False, modules=modules)
    alone, own_alone = compute_times(ctx, spec, bounds, program, micro_batches, steps, alone=True, modules=modules)
    grad_reduce = None
    if reduces:
        layers = _prepared(spec, bounds, micro_batches)[0]
        stages = modules if modules is not None else \
            {s: torch.nn.Sequential(*layers[bounds[s]:bounds[s + 1]]) for s in mine}
        grad_reduce = {str(s): v for s, v in reduce_times(ctx, stages, repeats).items()}
    comm = None
    if ctx.world_size > 1 and getattr(ctx, "replica", 0) == 0:  # call costs every time: they move with the load
        comm = pingpong(ctx, sizes, repeats) if sizes else {}
        comm["busy"] = call_costs(ctx, activation_message_bytes(spec, micro_batches), repeats)
        comm["late"] = late_notice(ctx, max(4, repeats // 2))
    return {"rank": ctx.rank, "memory": memory, "concurrent": {f"{s}{k}": v for (s, k), v in concurrent.items()},
            "first": firsts, "compute_only": {f"{s}{k}": v for (s, k), v in compute_only.items()},
            "alone": {f"{s}{k}": v for (s, k), v in alone.items()}, "comm": comm,
            "runtime": {"concurrent": own, "alone": own_alone}, "grad_reduce": grad_reduce,
            "threads": torch.get_num_threads()}
