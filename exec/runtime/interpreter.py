"""The interpreter: one rank runs its part of the compiled program for one step, action by action, and times it.

The program is what `sim.compile(schedule, backend)` made (`sim.engine.program.Program`):
the interpreter runs the rank's actions in its order, each compute waiting for the
receive the program numbers by it, each transfer tagged by its number, all read off the
program (`exec.runtime.rank_program`); nothing of the schedule is worked out again here.

Each action goes to the method that its kind names in `sim.schedule.kinds.KINDS[kind].handler` (a
table kind -> method built from the kinds table, as DeepSpeed's pipeline engine
dispatches its instructions; a new kind is an entry there and a method here). The rules
are the simulator's (docs/rules.md):

- `recv` (RECV) posts a non-blocking `irecv` into a buffer of the right shape
  (`exec.runtime.shapes`) and keeps the handle; the program has placed it one compute early.
- `forward`, `backward`, `backward_input`, `backward_weight` (F, B, I, W) first wait for
  the receive whose data they need (the program's `waits`), then compute between two
  clock marks. The last stage computes the loss inside its F (scaled by 1/micro_batches, so the
  step's gradients are the full batch's) and its B starts from that loss; other stages
  run `torch.autograd.backward(output, received_gradient)`. I and W split that backward
  in two (`exec.runtime.split_backward`): I makes the input gradient only and keeps what W needs
  (its bytes stay counted until W's end), W makes the weight gradients from it.
- `send` (SEND) issues a non-blocking `isend` of the tensor the compute before it made;
  `run` waits for every send at the end of the step.
- `reduce_grad` (REDUCE_GRAD, the data-parallel gradient reduction) flattens the stage's
  gradients into one buffer and issues its average over the rank's data-parallel group
  (`ctx.dp_group`, `exec.runtime.dp.ReplicaContext`) on the rank's collective stream
  (`exec.runtime.dp.CollectiveStream`: asynchronous, one at a time, in issue order), and goes
  on; `run` waits for every reduction at the end of the step, before the optimizer, and
  the gradients become views of the averaged buffer. Its record spans its time on the
  stream (docs/rules.md, rule 13).
- `unshard`, `reshard` (UNSHARD, RESHARD: FSDP) all-gather a stage's flat parameters from
  its data-parallel group's shards, and free them (`exec.runtime.fsdp.Shards`).
- `overlap` (OVERLAP_F_B, an overlapped forward-backward pair) waits for the receives of
  the backward it names; the pair's F and backward then run in order, as their own
  actions: a CPU rank has no second stream to overlap them on (docs/rules.md, rule 18).
- `offload`, `reload` (OFFLOAD, RELOAD, activation offloading to host memory) are refused:
  on a CPU rank the host memory is the device's memory (`refuse_offload`).

Point-to-point calls name world ranks: `ctx.global_rank(r)` of the schedule's rank r (the
same rank without data parallelism); the events name the schedule's ranks.

Every action leaves a record of clock marks (`Marks`), turned into `sim.Event`s in
seconds when the step ends, together with the rank's memory over time: its static bytes
plus the bytes its actions take and give back as their kinds' `memory` effects in
`sim.schedule.kinds.KINDS` say (the handler measures what an effect takes:
`exec.runtime.memory`), or, on CUDA, what the allocator holds.

Calibration (`exec.measure.calibrate`) times these very handlers through two public methods:
`deliver(recv, tensor)` places a tensor that has already arrived, and `run_action(a)`
runs one action and returns its marks; `actions` and `waits` say which, in what order.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn

from sim import Action, Event, Kind, Schedule
from sim.engine.program import Program
from sim.schedule.kinds import KINDS, Role

from exec.runtime import split_backward
from exec.runtime.clocks import clock_for
from exec.runtime.records import Marks, RankTrace
from exec.runtime.dp import CollectiveStream
from exec.runtime.ep import split_parameters
from exec.runtime.fsdp import Shards
from exec.runtime.memory import SavedBytes, param_storages
from exec.runtime.rank_program import rank_program
from exec.runtime.shapes import TensorMeta

__all__ = ["RankInterpreter", "RankTrace", "Marks", "LossFn", "isend", "refuse_offload"]

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

# the Costs field whose effects also count the micro-batches a rank holds (`KindSpec.memory`)
HELD_FIELD = "activation_bytes"


def isend(tensor: torch.Tensor, dst: int, tag: int):
    """The runtime's send call. On a CPU tensor the rank first yields its core, so that
    its I/O thread handles what has arrived, such as the receiver's notice that the
    receive is posted; gloo then writes the data from inside the isend (docs/rules.md,
    rules 2 and 9). Calibration times this same call."""
    if tensor.device.type == "cpu" and hasattr(os, "sched_yield"):
        os.sched_yield()
    return dist.isend(tensor, dst=dst, tag=tag)


def refuse_offload(schedule: Schedule) -> None:
    """Raise ValueError if `schedule` holds an OFFLOAD or RELOAD: on CPU ranks host memory is device memory."""
    if schedule.has_copies:
        raise ValueError(f"schedule {schedule.name!r} has OFFLOAD/RELOAD actions (activation offloading to host "
                         f"memory), but exec runs on CPU ranks, whose host memory is their device memory; simulate "
                         f"it (sim.simulate), or run it without sim.add_offload")


class _Arrived:
    """The handle of a receive whose data is already there (`RankInterpreter.deliver`)."""

    def wait(self) -> bool:
        return True


_ARRIVED = _Arrived()


@dataclass
class _Pending:
    work: Any             # the irecv's handle
    buffer: torch.Tensor
    posted: Any           # clock mark


class RankInterpreter:
    """Runs one rank's part of a compiled program for one step (`run`). `handlers` maps
    each action kind to the method that runs it, as `sim.schedule.kinds.KINDS` names it.
    `static`: the bytes the rank holds for the whole step
    (`exec.runtime.memory.static_memory` over its stages).

    Besides `run`, its public face (what calibration uses): `run_action(a)`,
    `deliver(recv, tensor)`, `actions` (the rank's actions in the program's order),
    `waits[a]` (the RECVs compute `a` waits for, as the program numbers them), `clock`
    (whose marks `run_action` returns) and `modules`."""

    def __init__(self, ctx, program: Program, stage_modules: dict[int, nn.Module],
                 micro_inputs: Sequence[torch.Tensor], micro_targets: Sequence[torch.Tensor],
                 loss_fn: LossFn, shapes: dict[int, TensorMeta], static: int):
        self.ctx, self.program, self.schedule, self.modules = ctx, program, program.schedule, stage_modules
        self.inputs, self.targets, self.loss_fn, self.shapes = micro_inputs, micro_targets, loss_fn, shapes
        self.M = program.schedule.micro_batches
        self.chain = program.schedule.chain  # a micro-batch's stages: s mod chain = 0 .. chain-1
        self.device = ctx.device
        self.clock = clock_for(self.device)
        self.static = static
        # What the handlers would otherwise look up inside the step, once, before it
        # starts: the runtime's own time between actions is time the rank does not compute.
        mine = rank_program(program, ctx.rank)
        self.actions, self.waits, self.routes, self.pairs = mine.actions, mine.waits, mine.routes, mine.pairs
        self.handlers: dict[Kind, Callable[[Action], Marks | None]] = {
            k: getattr(self, spec.handler) for k, spec in KINDS.items()}
        self._stage_state(ctx, stage_modules)
        self._step_state(ctx)

    def _stage_state(self, ctx, stage_modules: dict[int, nn.Module]) -> None:
        """What the rank keeps of its stages for the whole step: FSDP's shards, the
        parameters' storages (left out of the saved bytes), the parameter lists (for a
        split backward) and the parameters each REDUCE_GRAD reduces."""
        dp_group = getattr(ctx, "dp_group", None)
        self.shards = Shards(stage_modules, dp_group) if self.schedule.has_gathers else None
        self.params = {s: param_storages(m) for s, m in stage_modules.items()}
        self.param_lists = {s: list(m.parameters()) for s, m in stage_modules.items()}
        ep = getattr(ctx, "ep", 1)  # with ep > 1 REDUCE_GRAD reduces the routed experts apart (`exec.runtime.ep`)
        self.reduced = {s: split_parameters(m, ep) for s, m in stage_modules.items()}
        self.stream = CollectiveStream(dp_group, dist.get_world_size(dp_group) if dp_group is not None else 1,
                                       self.clock, getattr(ctx, "edp_group", None))

    def _step_state(self, ctx) -> None:
        """What the step fills in as it runs, and its records."""
        self.pending: dict[Action, _Pending] = {}      # posted receives
        self.stage_inputs: dict[tuple[int, int], torch.Tensor] = {}
        self.outputs: dict[tuple[int, int], torch.Tensor] = {}   # output, or scaled loss on the last stage
        self.input_grads: dict[tuple[int, int], torch.Tensor] = {}
        self.weight_work: dict[tuple[int, int], split_backward.WeightWork] = {}  # I's, for W
        self.holding: dict[tuple[str, int, int], int] = {}  # (Costs field, stage, micro) -> bytes taken
        self.saved: dict[tuple[int, int], SavedBytes] = {}  # their count, until B or I
        self.sends: list[tuple[Any, torch.Tensor]] = []  # (work, tensor kept alive until waited)
        self.loss_sum: torch.Tensor | None = None
        self.trace = RankTrace(ctx.rank)
        self._events: list[Marks] = []                  # clock marks, resolved at the end
        self._held: list[tuple[Any, int, int]] = []    # (mark, change in bytes, change in micro-batches)
        self._samples: list[tuple[Any, int]] = []      # CUDA: (mark, memory_allocated)

    # -- the loop, and the public API that calibration uses
    def run(self) -> RankTrace:
        """Run the rank's program for one step; return its trace."""
        self.clock.start()
        self._sample(self.clock.mark())
        if torch.autograd._profiler_enabled():  # a torch.profiler trace: a span per action, named `2F0`
            for a in self.actions:
                with torch.profiler.record_function(str(a)):
                    self.run_action(a)
        else:
            for a in self.actions:
                self.run_action(a)
        for work, _ in self.sends:
            work.wait()
        for r in self.stream.finish_all():  # before the optimizer: the gradients are the average
            self._event(r.action, r.start, r.end)
        if self.shards is not None:  # the optimizer steps whole parameters
            self.shards.restore()
        self.clock.finish()
        self._resolve()
        if self.loss_sum is not None:
            self.trace.loss = float(self.loss_sum)
        return self.trace

    def run_action(self, a: Action) -> Marks | None:
        """Run one action with its kind's handler, as `run` does; return its marks (None
        for a RECV: its record comes when the compute that needs it waits for it)."""
        return self.handlers[a.kind](a)

    def deliver(self, recv: Action, tensor: torch.Tensor) -> None:
        """Place `tensor` as the data of the RECV `recv`, already arrived: the compute that
        needs it waits for it, takes it in and records the RECV as if the receive had been
        posted and the data were in (calibration runs the compute handlers so, without a
        transport)."""
        if KINDS[recv.kind].role is not Role.RECV:
            raise ValueError(f"deliver takes a RECV action, not {recv}")
        self.pending[recv] = _Pending(_ARRIVED, tensor, self.clock.mark())

    # -- communication
    def recv(self, a: Action) -> None:
        meta = self.shapes[a.stage + KINDS[a.kind].tensor_of]
        buf = torch.empty(meta.shape, dtype=meta.dtype, device=self.device)
        src, tag = self.routes[a]
        posted = self.clock.mark()
        self.pending[a] = _Pending(dist.irecv(buf, src=self.ctx.global_rank(src), tag=tag), buf, posted)

    def send(self, a: Action) -> Marks:
        """SEND_F sends the stage's output, SEND_B the gradient w.r.t. its input."""
        key = (a.stage, a.micro)
        tensor = self.outputs[key].detach() if a.kind is Kind.SEND_F else self.input_grads.pop(key)
        tensor = tensor.contiguous()
        dst, tag = self.routes[a]
        start = self.clock.mark()
        work = isend(tensor, self.ctx.global_rank(dst), tag)
        self.sends.append((work, tensor))
        return self._event(a, start, start, dst)  # end: the RECV's, filled in by `exec.runtime.step`

    def _wait(self, a: Action) -> torch.Tensor | None:
        """Wait for the receives compute `a` needs and record each RECV event; return what
        arrived (a compute takes at most one tensor from another rank), or None."""
        got = None
        for recv in self.waits[a]:
            p = self.pending.pop(recv, None)
            if p is None:
                raise RuntimeError(f"rank {self.ctx.rank}: {a} needs {recv}, which was not posted before it; "
                                   f"run the program sim.compile made, whose RECVs come one compute early")
            p.work.wait()
            end = self.clock.mark()
            got = p.buffer
            self._event(recv, p.posted, end, self.routes[recv].peer)
        return got

    def reduce_grad(self, a: Action) -> None:
        """REDUCE_GRAD: issue the average of stage `a.stage`'s gradients over the
        data-parallel group on the collective stream, and go on; `run` waits for it and
        records it (its marks: `exec.runtime.dp.CollectiveStream`)."""
        self.stream.issue(a, *self.reduced[a.stage])

    def overlap(self, a: Action) -> None:
        """OVERLAP_F_B: the pair waits for both its computes' inputs (rule 18), so this waits
        for the receives of the backward it names (`pairs`, from the program); the F and
        that backward then run one after the other as their own actions. A CPU rank has
        no second stream to overlap them on (nor an expert all-to-all to hide)."""
        for recv in self.waits[self.pairs[a]]:
            p = self.pending[recv]
            p.work.wait()
            p.work = _ARRIVED  # a gloo work is waited for once: the backward finds it here

    def offload(self, a: Action) -> None:
        """OFFLOAD: refused (`refuse_offload`); a run never gets here."""
        refuse_offload(self.schedule)

    def reload(self, a: Action) -> None:
        """RELOAD: refused (`refuse_offload`); a run never gets here."""
        refuse_offload(self.schedule)

    def unshard(self, a: Action) -> Marks:
        """UNSHARD: all-gather the stage's parameters (`exec.runtime.fsdp`); they take their bytes."""
        start = self.clock.mark()
        self._memory(a, start, start, unshard_bytes=self.shards.unshard(a.stage))
        self.params[a.stage] = param_storages(self.modules[a.stage])  # a new storage: SavedBytes leaves it out
        return self._event(a, start, self.clock.mark())

    def reshard(self, a: Action) -> Marks:
        """RESHARD: free the stage's gathered parameters, its shard staying."""
        start = self.clock.mark()
        self.shards.reshard(a.stage)
        self._memory(a, start, start)
        return self._event(a, start, start)

    # -- compute
    def _last(self, s: int) -> bool:
        """Whether stage s ends its copy of the model (DualPipe holds two: `Schedule.chain`)."""
        return s % self.chain == self.chain - 1

    def forward(self, a: Action) -> Marks:
        s, m = a.stage, a.micro
        received = self._wait(a)
        if s % self.chain == 0:  # the first stage of its micro-batch's copy of the model
            x = self.inputs[m].to(self.device)
        elif received is None:  # previous stage on this rank: hand over locally
            x = self.outputs[(s - 1, m)].detach().requires_grad_()
        else:
            x = received.requires_grad_()
        self.stage_inputs[(s, m)] = x
        saved = SavedBytes(self.params[s])
        start = self.clock.mark()
        self._sample(start)
        with saved.hooks():
            y = self.modules[s](x)
            if self._last(s):
                y = self.loss_fn(y, self.targets[m].to(self.device)) / self.M
        end = self.clock.mark()
        if self._last(s):
            self.loss_sum = y.detach() if self.loss_sum is None else self.loss_sum + y.detach()
        self.outputs[(s, m)] = y
        self.saved[(s, m)] = saved
        marks = self._event(a, start, end)
        self._memory(a, start, end, activation_bytes=saved.nbytes)
        self._sample(end)
        return marks

    def _output_grad(self, s: int, m: int, received: torch.Tensor | None) -> torch.Tensor | None:
        """The gradient w.r.t. stage s's output: none on the last stage (its output is the
        loss), from stage s+1 on this rank, or received."""
        if self._last(s):
            return None
        if (s + 1) in self.modules:
            return self.input_grads.pop((s + 1, m))
        return received

    def backward(self, a: Action) -> Marks:
        s, m = a.stage, a.micro
        grad = self._output_grad(s, m, self._wait(a))
        start = self.clock.mark()
        self._sample(start)
        torch.autograd.backward(self.outputs.pop((s, m)), grad)
        self.saved.pop((s, m))
        x = self.stage_inputs.pop((s, m))
        if s % self.chain:
            self.input_grads[(s, m)] = x.grad
        end = self.clock.mark()
        marks = self._event(a, start, end)
        self._memory(a, start, end)
        self._sample(end)
        return marks

    def backward_input(self, a: Action) -> Marks:
        """I: the gradient w.r.t. the stage's input only (`exec.runtime.split_backward`); what W
        needs stays held, counted as the bytes of the saved tensors the graph still holds."""
        s, m = a.stage, a.micro
        grad = self._output_grad(s, m, self._wait(a))
        out = self.outputs.pop((s, m))
        start = self.clock.mark()
        self._sample(start)
        x = self.stage_inputs.pop((s, m))
        dx, self.weight_work[(s, m)] = split_backward.backward_input(out, grad, x, self.param_lists[s])
        if s % self.chain:
            self.input_grads[(s, m)] = dx
        end = self.clock.mark()
        del out, x, grad
        kept = self.saved.pop((s, m)).kept_bytes()
        marks = self._event(a, start, end)
        self._memory(a, start, end, w_activation_bytes=kept)
        self._sample(end)
        return marks

    def backward_weight(self, a: Action) -> Marks:
        """W: the weight gradients from what I kept (`exec.runtime.split_backward`); gives it back."""
        s, m = a.stage, a.micro
        self._wait(a)  # W takes nothing from another rank (sim.schedule.kinds): this finds nothing
        work = self.weight_work.pop((s, m))
        start = self.clock.mark()
        self._sample(start)
        split_backward.backward_weight(work)
        end = self.clock.mark()
        marks = self._event(a, start, end)
        self._memory(a, start, end)
        self._sample(end)
        return marks

    # -- records
    def _event(self, a: Action, start, end, peer_rank: int = -1) -> Marks:
        marks = Marks(a, start, end, peer_rank)
        self._events.append(marks)
        return marks

    def _memory(self, a: Action, start, end, **taken: int) -> None:
        """What `a` does to its rank's memory, as its kind's `memory` effects in
        `sim.schedule.kinds.KINDS` say: an effect with sign +1 takes the bytes of its field
        that the handler measured (`taken`), one with sign -1 gives back what an earlier
        action took for the same stage and micro-batch; each at the action's start or end.
        A change of `HELD_FIELD` is also a micro-batch held or let go. The effects of one
        moment are one change."""
        change = {"start": [start, 0, 0], "end": [end, 0, 0]}  # when, bytes, micro-batches
        for e in KINDS[a.kind].memory:
            key = (e.field, a.stage, a.micro)
            if e.sign < 0:
                nbytes = -self.holding.pop(key)
            elif e.field in taken:
                nbytes = self.holding[key] = taken[e.field]
            else:
                raise RuntimeError(f"{a} takes {e.field} (sim.schedule.kinds.KINDS) but its handler measured none")
            change[e.at][1] += nbytes
            change[e.at][2] += e.sign if e.field == HELD_FIELD else 0
        for at in ("start", "end"):
            if any(e.at == at for e in KINDS[a.kind].memory):
                self._held.append(tuple(change[at]))

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
