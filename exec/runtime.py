"""The runtime: each rank interprets its lowered program, action by action, and times it.

One training step on one rank (`run_step`) walks `schedule.programs[rank]` in order and
hands each action to the handler for its kind (a table kind -> method, as DeepSpeed's
pipeline engine does; a new kind is one method and one entry). The rules are those of
the simulator (docs/rules.md, sim/engine.py):

- RECV posts a non-blocking `irecv` into a buffer of the right shape and keeps the work
  handle; lowering has placed it one compute early.
- A compute action (F, B, I, W) first waits for the receives whose tensors it needs,
  then computes. The last stage computes the loss inside its F (scaled by 1/micro, so the
  step's gradients are the full batch's); its B starts from that loss. Other stages run
  `torch.autograd.backward(output, received_gradient)`.
- SEND issues a non-blocking `isend` of the tensor the compute just before it produced;
  every send is waited for at the end of the step, then the optimizer steps.

Every action becomes a `sim.Event`, every rank's events are gathered, and the step comes
back as the same `sim.Result` the simulator produces (`source="measured"`), so metrics,
plots and the Chrome trace work unchanged.
"""
from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn

import sim
from sim import Action, Event, Kind, Result, Schedule
from sim.passes import compute_set, dependencies, peer

from .launch import RankContext

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

# the receive that brings the tensor a compute action needs from another rank
RECV_FOR = {Kind.F: Kind.RECV_F, Kind.B: Kind.RECV_B, Kind.I: Kind.RECV_B}


# ---------------------------------------------------------------------------- micro-batches and tags

def split_micro_batches(inputs: torch.Tensor, targets: torch.Tensor, micro: int
                        ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Cut a batch along dim 0 into `micro` equal micro-batches. Each one is a copy with
    its own storage, so the memory it holds is measured by its own size."""
    n = inputs.shape[0]
    if isinstance(micro, bool) or not isinstance(micro, int) or micro < 1 or n % micro:
        raise ValueError(f"the batch of {n} samples does not split into {micro!r} equal micro-batches; "
                         f"choose micro among the divisors of {n}")
    return ([x.clone() for x in inputs.chunk(micro)], [y.clone() for y in targets.chunk(micro)])


def transfer_tag(recv: Action, micro: int) -> int:
    """A tag unique to one transfer of the step, named by its RECV action: both sides
    compute it (the sender from `peer(send)`)."""
    direction = 0 if recv.kind is Kind.RECV_F else 1
    return 2 * (recv.stage * micro + recv.micro) + direction


def _stage_waits(schedule: Schedule) -> dict[Action, list[Action]]:
    """For each compute action, the RECVs whose data it waits for (as sim.engine does)."""
    computes = compute_set(schedule)
    waits = {}
    for prog in schedule.programs:
        for a in prog:
            if a.kind in RECV_FOR:
                waits[a] = [Action(a.stage, RECV_FOR[a.kind], a.micro)
                            for d in dependencies(a, schedule.stages, computes)
                            if schedule.rank_of(d.stage) != schedule.rank_of(a.stage)]
    return waits


# ---------------------------------------------------------------------------- shapes

@dataclass(frozen=True)
class TensorMeta:
    shape: tuple[int, ...]
    dtype: torch.dtype


_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32]
_META_LEN = 10  # dtype index, ndim, up to 8 dims


def infer_shapes(ctx: RankContext, schedule: Schedule, stage_modules: dict[int, nn.Module],
                 micro_input: torch.Tensor) -> dict[int, TensorMeta]:
    """Shape and dtype of each stage's output for one micro-batch, for the receive buffers.

    Stages are visited in order: a rank runs its stage once without gradients on a dummy
    input of the shape it got from the previous stage's rank (a blocking send of a small
    int64 header), and passes its output's shape on. Returns the metas this rank needs:
    its stages' outputs and their inputs' producers."""
    metas: dict[int, TensorMeta] = {}
    device = ctx.device
    for s in range(schedule.stages):
        here, prev = schedule.rank_of(s), schedule.rank_of(s - 1) if s > 0 else None
        if here != ctx.rank:
            if prev == ctx.rank:  # we own s-1 and must tell rank `here` its input shape
                _send_meta(metas[s - 1], here)
            continue
        if s == 0:
            x = micro_input.to(device)
        else:
            if prev != ctx.rank:
                metas[s - 1] = _recv_meta(prev)
            x = torch.zeros(metas[s - 1].shape, dtype=metas[s - 1].dtype, device=device)
        with torch.no_grad():
            y = stage_modules[s](x)
        if not isinstance(y, torch.Tensor):
            raise TypeError(f"stage {s} returned {type(y).__name__}; a stage must return one tensor")
        metas[s] = TensorMeta(tuple(y.shape), y.dtype)
    return metas


def _send_meta(meta: TensorMeta, dst: int) -> None:
    if len(meta.shape) > _META_LEN - 2 or meta.dtype not in _DTYPES:
        raise TypeError(f"cannot send a {meta.dtype} tensor of {len(meta.shape)} dims between stages "
                        f"(at most {_META_LEN - 2} dims, dtypes {', '.join(map(str, _DTYPES))})")
    header = [_DTYPES.index(meta.dtype), len(meta.shape), *meta.shape]
    header += [0] * (_META_LEN - len(header))
    dist.send(torch.tensor(header, dtype=torch.int64, device=_comm_device()), dst)


def _recv_meta(src: int) -> TensorMeta:
    header = torch.zeros(_META_LEN, dtype=torch.int64, device=_comm_device())
    dist.recv(header, src)
    h = header.tolist()
    return TensorMeta(tuple(h[2:2 + h[1]]), _DTYPES[h[0]])


def isend(tensor: torch.Tensor, dst: int, tag: int):
    """The runtime's send call. On a CPU tensor the rank first yields its core, so that
    its I/O thread handles what has arrived, such as the receiver's notice that the
    receive is posted; gloo then writes the data from inside the isend (docs/rules.md,
    rules 2 and 9). The profiler times this same call."""
    if tensor.device.type == "cpu" and hasattr(os, "sched_yield"):
        os.sched_yield()
    return dist.isend(tensor, dst=dst, tag=tag)


def _comm_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


# ---------------------------------------------------------------------------- clocks

class CpuClock:
    """Marks are `time.perf_counter()` seconds; `seconds(mark)` is relative to `start()`."""

    def start(self) -> None:
        self.base = time.perf_counter()

    def mark(self) -> float:
        return time.perf_counter()

    def seconds(self, mark: float) -> float:
        return mark - self.base

    def finish(self) -> None:
        pass


class CudaClock:
    """Marks are CUDA events on the current stream (what the GPU did, not when the host
    asked); read out after one synchronise at the end of the step."""

    def start(self) -> None:
        torch.cuda.synchronize()
        self.base = torch.cuda.Event(enable_timing=True)
        self.base.record()

    def mark(self) -> torch.cuda.Event:
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def seconds(self, mark: torch.cuda.Event) -> float:
        return self.base.elapsed_time(mark) / 1e3

    def finish(self) -> None:
        torch.cuda.synchronize()


# ---------------------------------------------------------------------------- memory

def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def static_bytes(stage_modules: dict[int, nn.Module], optimizer: torch.optim.Optimizer | None) -> int:
    """Parameters + their gradients + optimizer state (momentum buffers, Adam moments)."""
    params = [p for m in stage_modules.values() for p in m.parameters()]
    state = []
    if optimizer is not None:
        for st in optimizer.state.values():
            state += [v for v in st.values() if isinstance(v, torch.Tensor)]
    return 2 * tensor_bytes(params) + tensor_bytes(state)


def param_storages(module: nn.Module) -> frozenset[int]:
    """The addresses of the storages of `module`'s parameters (for `SavedBytes`)."""
    return frozenset(p.untyped_storage().data_ptr() for p in module.parameters())


class SavedBytes:
    """Counts the bytes autograd saves for backward during a forward (saved_tensors_hooks):
    each storage once, parameters excluded (they are static memory). `params`: the
    stage's `param_storages`, found once, not at every forward (walking a module's
    parameters costs more than many a small action)."""

    def __init__(self, params: frozenset[int]):
        self.params = params
        self.seen: set[int] = set()
        self.nbytes = 0

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in self.params and ptr not in self.seen:
            self.seen.add(ptr)
            self.nbytes += storage.nbytes()
        return t

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)


# ---------------------------------------------------------------------------- the interpreter

@dataclass
class StepResult:
    """One measured step: the `sim.Result` (every rank's events; None if not recorded) and
    the step's loss (mean over micro-batches), known on every rank."""

    result: Result | None
    loss: float


@dataclass
class _Pending:
    work: Any
    buffer: torch.Tensor
    posted: Any           # clock mark


@dataclass
class _RankTrace:
    """What one rank measured, in seconds since its step start (picklable, for gathering)."""

    rank: int
    events: list[Event] = field(default_factory=list)
    memory: list[tuple[float, float]] = field(default_factory=list)
    activations: list[tuple[float, int]] = field(default_factory=list)
    loss: float | None = None


class RankInterpreter:
    """Runs one rank's lowered program for one step. `handlers` maps each action kind to
    the method that runs it."""

    def __init__(self, ctx: RankContext, schedule: Schedule, stage_modules: dict[int, nn.Module],
                 micro_inputs: Sequence[torch.Tensor], micro_targets: Sequence[torch.Tensor],
                 loss_fn: LossFn, shapes: dict[int, TensorMeta], static: int):
        self.ctx, self.schedule, self.modules = ctx, schedule, stage_modules
        self.inputs, self.targets, self.loss_fn, self.shapes = micro_inputs, micro_targets, loss_fn, shapes
        self.M, self.last = schedule.micro, schedule.stages - 1
        self.device = ctx.device
        self.clock = CudaClock() if self.device.type == "cuda" else CpuClock()
        self.waits = _stage_waits(schedule)
        # What the handlers would otherwise work out inside the step, once, before it
        # starts: the runtime's own time between actions is time the rank does not compute.
        self.params = {s: param_storages(m) for s, m in stage_modules.items()}
        self.routes = {a: self._route(a) for a in schedule.programs[ctx.rank] if not a.kind.is_compute}
        self.handlers: dict[Kind, Callable[[Action], None]] = {
            Kind.RECV_F: self.recv, Kind.RECV_B: self.recv,
            Kind.SEND_F: self.send, Kind.SEND_B: self.send,
            Kind.F: self.forward, Kind.B: self.backward,
            Kind.I: self.backward_input, Kind.W: self.backward_weight,
        }
        # per step state
        self.pending: dict[Action, _Pending] = {}      # posted receives
        self.received: dict[Action, torch.Tensor] = {}  # RECV -> its data, once waited for
        self.stage_inputs: dict[tuple[int, int], torch.Tensor] = {}
        self.outputs: dict[tuple[int, int], torch.Tensor] = {}   # output, or scaled loss on the last stage
        self.input_grads: dict[tuple[int, int], torch.Tensor] = {}
        self.weight_work: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor | None]] = {}
        self.held: dict[tuple[int, int], int] = {}     # activation bytes of (stage, micro)
        self.sends: list[tuple[Any, torch.Tensor]] = []
        self.loss_sum: torch.Tensor | None = None
        self.static = static
        self.trace = _RankTrace(ctx.rank)
        self._events: list[tuple[Action, Any, Any, int]] = []  # clock marks, resolved at the end
        self._held: list[tuple[Any, int, int]] = []    # (mark, change in bytes, change in micro-batches)
        self._samples: list[tuple[Any, int]] = []      # CUDA: (mark, memory_allocated)

    def _route(self, a: Action) -> tuple[int, int]:
        """A SEND's or RECV's peer rank and the tag of its transfer."""
        other = peer(a)
        recv = other if other.kind in (Kind.RECV_F, Kind.RECV_B) else a
        return self.schedule.rank_of(other.stage), transfer_tag(recv, self.M)

    # -- the loop
    def run(self) -> _RankTrace:
        self.clock.start()
        self._sample(self.clock.mark())
        for a in self.schedule.programs[self.ctx.rank]:
            self.handlers[a.kind](a)
        for work, _ in self.sends:
            work.wait()
        self.clock.finish()
        self._resolve()
        if self.loss_sum is not None:
            self.trace.loss = float(self.loss_sum)
        return self.trace

    # -- communication
    def recv(self, a: Action) -> None:
        meta = self.shapes[a.stage - 1 if a.kind is Kind.RECV_F else a.stage]
        buf = torch.empty(meta.shape, dtype=meta.dtype, device=self.device)
        src, tag = self.routes[a]
        posted = self.clock.mark()
        self.pending[a] = _Pending(dist.irecv(buf, src=src, tag=tag), buf, posted)

    def send(self, a: Action) -> None:
        key = (a.stage, a.micro)
        tensor = self.outputs[key].detach() if a.kind is Kind.SEND_F else self.input_grads.pop(key)
        tensor = tensor.contiguous()
        dst, tag = self.routes[a]
        start = self.clock.mark()
        work = isend(tensor, dst, tag)
        self.sends.append((work, tensor))
        self._event(a, start, start, dst)  # end: the RECV's, filled in later

    def _wait(self, a: Action) -> None:
        """Wait for the receives compute `a` needs; record each RECV event."""
        for recv in self.waits.get(a, ()):
            p = self.pending.pop(recv, None)
            if p is None:
                raise RuntimeError(f"rank {self.ctx.rank}: {a} needs {recv}, which was not posted before it; "
                                   f"run a lowered schedule (sim.lower) whose RECVs come one compute early")
            p.work.wait()
            end = self.clock.mark()
            self.received[recv] = p.buffer
            self._event(recv, p.posted, end, self.schedule.rank_of(peer(recv).stage))

    # -- compute
    def forward(self, a: Action) -> None:
        s, m = a.stage, a.micro
        self._wait(a)
        if s == 0:
            x = self.inputs[m].to(self.device)
        elif (s - 1) in self.modules:  # previous stage on this rank: hand over locally
            x = self.outputs[(s - 1, m)].detach().requires_grad_()
        else:
            x = self.received.pop(Action(s, Kind.RECV_F, m)).requires_grad_()
        self.stage_inputs[(s, m)] = x
        saved = SavedBytes(self.params[s])
        start = self.clock.mark()
        self._sample(start)
        with saved.hooks():
            y = self.modules[s](x)
            if s == self.last:
                y = self.loss_fn(y, self.targets[m].to(self.device)) / self.M
        end = self.clock.mark()
        if s == self.last:
            self.loss_sum = y.detach() if self.loss_sum is None else self.loss_sum + y.detach()
        self.outputs[(s, m)] = y
        self.held[(s, m)] = saved.nbytes
        self._event(a, start, end)
        self._hold(start, saved.nbytes, +1)
        self._sample(end)

    def _output_grad(self, s: int, m: int) -> torch.Tensor | None:
        """The gradient w.r.t. stage s's output: none on the last stage (its output is the
        loss), from stage s+1 on this rank, or received."""
        if s == self.last:
            return None
        if (s + 1) in self.modules:
            return self.input_grads.pop((s + 1, m))
        return self.received.pop(Action(s, Kind.RECV_B, m))

    def backward(self, a: Action) -> None:
        s, m = a.stage, a.micro
        self._wait(a)
        grad = self._output_grad(s, m)
        start = self.clock.mark()
        self._sample(start)
        torch.autograd.backward(self.outputs.pop((s, m)), grad)
        x = self.stage_inputs.pop((s, m))
        if s > 0:
            self.input_grads[(s, m)] = x.grad
        end = self.clock.mark()
        self._event(a, start, end)
        self._hold(end, -self.held.pop((s, m)), -1)
        self._sample(end)

    def backward_input(self, a: Action) -> None:
        """I: the gradient w.r.t. the stage's input only; keeps the graph for W."""
        s, m = a.stage, a.micro
        self._wait(a)
        grad = self._output_grad(s, m)
        out = self.outputs.pop((s, m))
        start = self.clock.mark()
        self._sample(start)
        x = self.stage_inputs.pop((s, m))
        if s > 0:
            (self.input_grads[(s, m)],) = torch.autograd.grad(out, x, grad, retain_graph=True)
        end = self.clock.mark()
        self.weight_work[(s, m)] = (out, grad)
        self._event(a, start, end)
        self._sample(end)

    def backward_weight(self, a: Action) -> None:
        """W: the weight gradients, from the output gradient I saw. (It walks the graph
        again; a fused split as in zero-bubble schedules would reuse I's intermediate
        gradients.)"""
        s, m = a.stage, a.micro
        out, grad = self.weight_work.pop((s, m))
        start = self.clock.mark()
        self._sample(start)
        torch.autograd.backward(out, grad, inputs=list(self.modules[s].parameters()))
        end = self.clock.mark()
        self._event(a, start, end)
        self._hold(end, -self.held.pop((s, m)), -1)
        self._sample(end)

    # -- records
    def _event(self, a: Action, start, end, peer_rank: int = -1) -> None:
        self._events.append((a, start, end, peer_rank))

    def _hold(self, when, nbytes: int, count: int) -> None:
        """Activations of a micro-batch start (F start) or stop (end of B or W) being held."""
        self._held.append((when, nbytes, count))

    def _sample(self, when) -> None:
        """On CUDA, what the allocator holds at an action boundary."""
        if self.device.type == "cuda":
            self._samples.append((when, torch.cuda.memory_allocated(self.device)))

    def _resolve(self) -> None:
        """Turn clock marks into seconds since the step start, and changes into levels.
        CPU memory = static bytes + the activation bytes held; CUDA memory = the samples."""
        t, sec = self.trace, self.clock.seconds
        t.events = [Event(self.ctx.rank, a, sec(s), sec(e), p) for a, s, e, p in self._events]
        level, held = float(self.static), 0
        t.activations = [(0.0, 0)]
        cpu_memory = [(0.0, level)]
        for when, nbytes, count in self._held:
            level, held = level + nbytes, held + count
            cpu_memory.append((sec(when), level))
            t.activations.append((sec(when), held))
        t.memory = [(sec(w), float(b)) for w, b in self._samples] if self._samples else cpu_memory


def _assemble(schedule: Schedule, traces: Sequence[_RankTrace]) -> Result:
    """Every rank's trace -> one `sim.Result`. A SEND ends when its data was there on the
    receiving rank: when the matching RECV's wait returned. (gloo cannot tell earlier: its
    `is_completed()` stays False until `wait()`.)"""
    recv_end = {e.action: e.end for t in traces for e in t.events if e.action.kind in (Kind.RECV_F, Kind.RECV_B)}
    events = []
    for t in traces:
        for e in t.events:
            if e.action.kind in (Kind.SEND_F, Kind.SEND_B):
                e = Event(e.rank, e.action, e.start, max(e.start, recv_end[peer(e.action)]), e.peer)
            events.append(e)
    memory = [sorted(t.memory, key=lambda x: x[0]) for t in traces]
    activations = [sorted(t.activations, key=lambda x: x[0]) for t in traces]
    return Result(schedule, events, memory, activations, source="measured")


def run_step(ctx: RankContext, schedule_lowered: Schedule, stage_modules: dict[int, nn.Module],
             micro_inputs: Sequence[torch.Tensor], micro_targets: Sequence[torch.Tensor], loss_fn: LossFn,
             optimizer: torch.optim.Optimizer | None, record: bool = True,
             shapes: dict[int, TensorMeta] | None = None) -> StepResult:
    """One training step of this rank's program; call it on every rank at once.

    `stage_modules` holds this rank's stages; `micro_inputs`/`micro_targets` the
    micro-batches (stage 0 reads the inputs, the last stage the targets). Gradients are
    zeroed first, accumulate over micro-batches, and `optimizer.step()` closes the step.
    `shapes` (from `infer_shapes`) saves a setup pass when given. With `record`, every
    rank's events are gathered and each rank gets the whole `sim.Result`.
    """
    if not schedule_lowered.is_lowered and schedule_lowered.ranks > 1:
        raise ValueError(f"schedule {schedule_lowered.name!r} has no SEND/RECV actions; pass sim.lower(schedule)")
    if schedule_lowered.ranks != ctx.world_size:
        raise ValueError(f"schedule {schedule_lowered.name!r} has {schedule_lowered.ranks} ranks but "
                         f"the process group has {ctx.world_size}; launch one process per rank")
    mine = {s for s, r in enumerate(schedule_lowered.placement) if r == ctx.rank}
    if set(stage_modules) != mine:
        raise ValueError(f"rank {ctx.rank} hosts stages {sorted(mine)} but was given modules for {sorted(stage_modules)}")
    if len(micro_inputs) != schedule_lowered.micro or len(micro_targets) != schedule_lowered.micro:
        raise ValueError(f"schedule has {schedule_lowered.micro} micro-batches but got {len(micro_inputs)} "
                         f"inputs and {len(micro_targets)} targets")
    if shapes is None:
        shapes = infer_shapes(ctx, schedule_lowered, stage_modules, micro_inputs[0])
    if optimizer is not None:
        optimizer.zero_grad(set_to_none=True)
    else:
        for mod in stage_modules.values():
            mod.zero_grad(set_to_none=True)
    interp = RankInterpreter(ctx, schedule_lowered, stage_modules, micro_inputs, micro_targets, loss_fn,
                             shapes, static_bytes(stage_modules, optimizer))
    dist.barrier()  # all ranks start together: each rank's clock starts at the barrier exit
    trace = interp.run()
    if optimizer is not None:
        optimizer.step()
    traces: list[_RankTrace | None] = [None] * ctx.world_size
    dist.all_gather_object(traces, trace if record else _RankTrace(ctx.rank, loss=trace.loss))
    loss = next(t.loss for t in traces if t.loss is not None)
    return StepResult(_assemble(schedule_lowered, traces) if record else None, loss)


# ---------------------------------------------------------------------------- a whole run: steps, correctness

FAULTS = ("raise", "exit", "hang")


def parse_fault(text: str | None) -> tuple[str, int] | None:
    """'raise:1' / 'exit:1' / 'hang:1' -> (what, rank): make that rank fail on purpose
    (before its first measured step), to test how a run ends. None -> None."""
    if not text:
        return None
    what, _, rank = text.partition(":")
    if what not in FAULTS or not rank.isdigit():
        raise ValueError(f"fault must be KIND:RANK with KIND in {', '.join(FAULTS)}, e.g. 'raise:1'; got {text!r}")
    return what, int(rank)


def _inject(fault: tuple[str, int] | None, rank: int) -> None:
    if fault is None or fault[1] != rank:
        return
    what = fault[0]
    if what == "raise":
        raise RuntimeError(f"fault injected on rank {rank} (--fault raise:{rank})")
    if what == "exit":
        os._exit(3)
    while True:  # hang
        time.sleep(1.0)


def pipeline_worker(ctx: RankContext, spec, schedule: Schedule, steps: int, warmup: int,
                    bounds: Sequence[int], lr: float, fault: tuple[str, int] | None, progress: bool,
                    calibrate: int = 0) -> dict:
    """The function every rank runs (via `exec.launch.launch`): build this rank's stages,
    run `warmup + steps` steps, and return what the parent needs.

    Every rank returns the gradients of its stages after the first step (numpy arrays,
    before the optimizer moved the weights, so they compare with `reference_step`) and
    the step losses; rank 0 also returns the measured steps' `sim.Result`s.

    With `calibrate` = k > 0, the run also measures what the simulator needs: before
    every k measured steps, the ranks calibrate (`exec.profile.calibrate_rank`) on these
    very modules, so that calibration and measurement share the same processes, cores
    and time window (the first round also bounces messages for the transfer fit). Every
    rank returns its reports, one per round, for `exec.profile.costs_from_reports`."""
    mine = [s for s, r in enumerate(schedule.placement) if r == ctx.rank]
    all_stages = spec.build_stages(schedule.stages, bounds=bounds)
    modules = {s: all_stages[s].to(ctx.device) for s in mine}
    del all_stages
    params = [p for s in mine for p in modules[s].parameters()]
    optimizer = torch.optim.SGD(params, lr=lr)
    inputs, targets = spec.batch()
    micro_inputs, micro_targets = split_micro_batches(inputs, targets, schedule.micro)
    shapes = infer_shapes(ctx, schedule, modules, micro_inputs[0])
    out: dict[str, Any] = {"rank": ctx.rank, "losses": [], "results": [], "grads": {}, "reports": []}
    say = progress and ctx.rank == 0
    for i in range(warmup + steps):
        if i == warmup:
            _inject(fault, ctx.rank)
        measured = i >= warmup
        if calibrate and measured and (i - warmup) % calibrate == 0:
            from .profile import calibrate_rank, message_sizes
            rnd, rounds = (i - warmup) // calibrate, -(-steps // calibrate)
            if say:
                print(f"exec: calibrating {rnd + 1}/{rounds}", file=sys.stderr, flush=True)
            sizes = message_sizes(spec, schedule.micro) if rnd == 0 else None
            out["reports"].append(calibrate_rank(ctx, spec, schedule, schedule.micro, bounds, steps=3,
                                                 sizes=sizes, modules=modules))
        t = time.perf_counter()
        step = run_step(ctx, schedule, modules, micro_inputs, micro_targets, spec.loss, optimizer,
                        record=measured, shapes=shapes)
        out["losses"].append(step.loss)
        if i == 0:
            # copies: numpy() of a CPU tensor shares its memory, and the gradient tensors live on
            out["grads"] = {s: [(n, (p.grad if p.grad is not None else torch.zeros_like(p)).detach().cpu().numpy().copy())
                                for n, p in modules[s].named_parameters()] for s in mine}
        if measured and ctx.rank == 0:
            out["results"].append(step.result)
        if say:
            what = f"step {i - warmup + 1}/{steps}" if measured else f"warm-up {i + 1}/{warmup}"
            span = f"{step.result.makespan * 1e3:.2f} ms" if measured else f"{(time.perf_counter() - t) * 1e3:.0f} ms wall"
            print(f"exec: {what}: loss {step.loss:.5f}, {span}", file=sys.stderr, flush=True)
    return out


def reference_step(spec, micro: int) -> tuple[float, list[torch.Tensor]]:
    """The same step in one process, without a pipeline: the whole model on the whole
    batch. Returns the loss and every parameter's gradient, in model order (the order of
    the stages' parameters one after the other). `micro` is checked to divide the batch."""
    inputs, targets = spec.batch()
    split_micro_batches(inputs, targets, micro)  # the same error as the pipeline for a bad micro
    model = nn.Sequential(*spec.build_layers())
    loss = spec.loss(model(inputs), targets)
    loss.backward()
    return loss.item(), [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
                         for p in model.parameters()]


def compare_grads(pipelined: Sequence[tuple[str, torch.Tensor]], reference: Sequence[torch.Tensor],
                  rtol: float = 1e-4, atol: float = 1e-5) -> tuple[bool, float, str]:
    """Each pipelined gradient against the reference (same order). Returns (all close,
    largest absolute difference, name of the parameter where it is)."""
    if len(pipelined) != len(reference):
        raise ValueError(f"the pipeline has {len(pipelined)} parameters but the reference model "
                         f"{len(reference)}; the stages must cut the same model")
    ok, worst, where = True, 0.0, ""
    for (name, g), r in zip(pipelined, reference):
        g = torch.as_tensor(g)
        if g.shape != r.shape:
            raise ValueError(f"{name}: gradient shape {tuple(g.shape)} but reference {tuple(r.shape)}")
        diff = (g.double() - r.double()).abs().max().item() if g.numel() else 0.0
        ok = ok and torch.allclose(g.float(), r.float(), rtol=rtol, atol=atol)
        if diff >= worst:
            worst, where = diff, name
    return ok, worst, where


@dataclass
class PipelineRun:
    """What `run_pipeline` measured and checked."""

    schedule: Schedule                # lowered
    bounds: list[int]                 # stage s = layers bounds[s] .. bounds[s+1]-1
    result: Result                    # the median measured step
    steps: list[Result]               # every measured step
    losses: list[float]               # per step, warm-up included
    reference_loss: float
    grad_match: bool
    max_grad_diff: float
    worst_param: str
    costs: sim.Costs | None = None    # calibrated inside the run (`calibrate` > 0), else None
    calibration: dict | None = None   # its details (`exec.profile.costs_from_reports`)
    reports: list[list[dict]] = field(default_factory=list)  # per round, every rank's report

    @property
    def step_times(self) -> list[float]:
        return [r.makespan for r in self.steps]

    @property
    def measured_step_s(self) -> float:
        return self.result.makespan

    @property
    def loss_match(self) -> bool:
        return math.isclose(self.losses[0], self.reference_loss, rel_tol=1e-5, abs_tol=1e-6)

    def summary(self) -> dict:
        s = self.schedule
        return {
            "schedule": s.name, "stages": s.stages, "ranks": s.ranks, "micro": s.micro, "bounds": self.bounds,
            "measured_step_s": self.measured_step_s, "step_times_s": self.step_times,
            "bubble_fraction": self.result.bubble_fraction, "peak_activations": self.result.peak_activations,
            "peak_memory": self.result.peak_memory,
            "loss": self.losses[0], "reference_loss": self.reference_loss, "loss_match": self.loss_match,
            "grad_match": self.grad_match, "max_grad_diff": self.max_grad_diff, "worst_param": self.worst_param,
        }


def median_step(results: Sequence[Result]) -> Result:
    """The step whose makespan is the median (the lower one of the middle two)."""
    if not results:
        raise ValueError("no measured steps; run at least one step")
    ordered = sorted(results, key=lambda r: r.makespan)
    return ordered[(len(ordered) - 1) // 2]


def run_pipeline(spec, schedule: Schedule | str, stages: int | None = None, micro: int | None = None, *,
                 steps: int = 5, warmup: int = 2, balance: str = "layers", bounds: Sequence[int] | None = None,
                 backend: str = "gloo", timeout: float = 300.0, threads: int | None = None, lr: float = 0.01,
                 fault: str | None = None, progress: bool = False, rtol: float = 1e-4, atol: float = 1e-5,
                 calibrate: int = 0) -> PipelineRun:
    """Run `schedule` (a `sim.Schedule`, or a name from `sim.SCHEDULES` with `stages` and
    `micro`) on one process per rank, `warmup` + `steps` training steps of `spec`, and
    check the first step's loss and gradients against `reference_step`.

    `calibrate` = k > 0 also measures the simulator's costs in the same processes: a
    calibration round before every k measured steps (`pipeline_worker`); the run's
    `costs` pool every round (`exec.profile.costs_from_reports`). CPU ranks (gloo) only.

    Raises `exec.launch.RankError` / `TimeoutError` if a rank fails or the run is too slow."""
    from .launch import launch

    if isinstance(schedule, str):
        if stages is None or micro is None:
            raise ValueError("a schedule name needs stages and micro, e.g. run_pipeline(spec, '1f1b', 2, 8)")
        schedule = sim.make_schedule(schedule, stages, micro)
    for what, n, least in (("steps", steps, 1), ("warmup", warmup, 0), ("calibrate", calibrate, 0)):
        if isinstance(n, bool) or not isinstance(n, int) or n < least:
            raise ValueError(f"{what} must be an integer >= {least}, got {n!r}")
    if calibrate and backend != "gloo":
        raise ValueError(f"calibrate times CPU ranks (gloo) only, not backend={backend!r}; "
                         f"simulate an NCCL run with costs written by exec.profile.save_costs")
    lowered = sim.validate(schedule)
    split_micro_batches(torch.empty(spec.batch_size, 0), torch.empty(spec.batch_size, 0), lowered.micro)
    injected = parse_fault(fault)
    if injected is not None and injected[1] >= lowered.ranks:
        raise ValueError(f"fault {fault!r} names rank {injected[1]} but the run has ranks 0..{lowered.ranks - 1}")
    bounds = list(bounds) if bounds is not None else spec.partition(lowered.stages, balance, lowered.micro)
    per_rank = launch(pipeline_worker, lowered.ranks, spec, lowered, steps, warmup, bounds, lr,
                      injected, progress, calibrate, backend=backend, timeout=timeout, threads=threads)
    grads = [(f"stage{s}.{n}", g) for s in range(lowered.stages)
             for n, g in per_rank[lowered.rank_of(s)]["grads"][s]]
    ref_loss, ref_grads = reference_step(spec, lowered.micro)
    match, worst, where = compare_grads(grads, ref_grads, rtol, atol)
    results = per_rank[0]["results"]
    run = PipelineRun(lowered, bounds, median_step(results), results, per_rank[0]["losses"],
                      ref_loss, match, worst, where)
    if calibrate:
        from .profile import costs_from_reports
        run.reports = [list(rnd) for rnd in zip(*(r["reports"] for r in per_rank))]
        run.costs, run.calibration = costs_from_reports([rep for rnd in run.reports for rep in rnd], lowered)
        run.calibration.update(bounds=bounds, backend=backend, calibrate_every=calibrate)
    return run
