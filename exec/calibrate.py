"""Calibration inside the ranks: what each rank measures, under the conditions of a real step, for `sim.Costs`.

`calibrate_rank` runs on every rank at once (inside `exec.launch.launch`, or between the
steps of a run: `exec.pipeline`) and returns one report; `exec.profile.costs_from_reports`
merges every rank's reports into `sim.Costs`. A report holds:

- compute times: each rank runs its own program's compute actions in the schedule's
  order, all ranks at once ("concurrent": they compete for the cores and the memory bus
  as in a step) and taking turns ("alone"), with the interpreter's own handlers
  (`RankInterpreter.run_action`), every input from another rank already there
  (`RankInterpreter.deliver`): a compute is timed between the very marks a step records;
- the runtime's own time around each compute, from entering its handler to the start
  mark and from the end mark to leaving it (`before_compute`, `after_compute`, rule 11);
- the CPU time of an `isend` and an `irecv` post inside a step, and of taking in a
  message that arrived during a compute (`send_overhead`, `recv_overhead`,
  `arrive_overhead`); the wait of a late ready notice (`late_notice`, for `io_tick`);
- ping-pong transfers between ranks 0 and 1, for `latency + bytes / bandwidth` (rule 6);
- memory per stage: the activation bytes autograd saves during its F (as the runtime
  counts them, `exec.memory.SavedBytes`), the bytes it sends on, and its weights,
  gradients and optimizer state (`exec.memory.static_memory`).
"""
from __future__ import annotations

import statistics
import time
from typing import Sequence

import torch
import torch.distributed as dist

import sim
from sim import Kind
from sim.kinds import KINDS

from .interpreter import RankInterpreter, isend
from .memory import SavedBytes, param_storages, static_memory
from .optim import make_optimizer

__all__ = ["calibrate_rank", "compute_times", "activation_bytes", "stage_inputs", "late_notice",
           "activation_message_bytes", "message_sizes"]


# ---------------------------------------------------------------------------- inputs, once per process

def stage_inputs(spec, layers, bounds: Sequence[int], stage: int, micro: int):
    """Per micro-batch, the input of `stage` and the targets (the earlier stages' forward)."""
    out = []
    with torch.no_grad():
        for x, y in spec.micro_batches(micro):
            for layer in layers[:bounds[stage]]:
                x = layer(x)
            out.append((x, y))
    return out


_PREPARED: dict = {}  # this process's calibration inputs, for one configuration at a time


def _prepared(spec, bounds: Sequence[int], micro: int):
    """The model's layers, per stage the input of every micro-batch (`stage_inputs`), and
    the micro-batches, built once per process and configuration: every calibration round
    of a run reuses them, so a round allocates no new model or batch before it times the
    computes (fresh allocations between rounds grew the heap, and the timed computes then
    took page faults that a step does not)."""
    key = (spec, tuple(bounds), micro)
    if key not in _PREPARED:
        _PREPARED.clear()
        layers = spec.build_layers()
        inputs = {s: stage_inputs(spec, layers, bounds, s, micro) for s in range(len(bounds) - 1)}
        _PREPARED[key] = (layers, inputs, spec.micro_batches(micro))
    return _PREPARED[key]


# ---------------------------------------------------------------------------- memory

def activation_bytes(module, x, last: bool, loss_fn, y, micro: int) -> tuple[int, int]:
    """Bytes autograd saves during one forward of `module` on `x`, counted as the
    interpreter counts them (`SavedBytes`: each storage once, parameters excluded), and
    the bytes of the output the stage sends on."""
    inp = x.detach().clone()
    if inp.is_floating_point():
        inp.requires_grad_()
    saved = SavedBytes(param_storages(module))
    with saved.hooks():
        out = module(inp)
        if last:
            loss_fn(out, y) / micro
    return saved.nbytes, out.numel() * out.element_size()


def _memory(spec, schedule: sim.Schedule, bounds: Sequence[int], micro: int, mine: list[int],
            modules: dict | None, optimizer) -> dict[int, dict[str, int]]:
    """Per stage of this rank: its activation bytes, the bytes it sends on, and its static
    memory (`static_memory`) on `modules` and the run's `optimizer` when given, else on a
    fresh copy with a new optimizer of that name (whose state is what its first step
    will create)."""
    layers, inputs, _ = _prepared(spec, bounds, micro)
    out = {}
    for s in mine:
        fresh = torch.nn.Sequential(*layers[bounds[s]:bounds[s + 1]])
        x, y = inputs[s][0]
        act, sent = activation_bytes(fresh, x, s == schedule.stages - 1, spec.loss, y, micro)
        module = modules[s] if modules is not None else fresh
        opt = make_optimizer(optimizer, module.parameters(), lr=1e-3) if isinstance(optimizer, str) else optimizer
        out[s] = {"activation_bytes": act, "activation_bytes_sent": sent, **static_memory(module, opt).as_dict()}
    return out


# ---------------------------------------------------------------------------- compute times

def _timed_step(interp: RankInterpreter, program: list, arrived, record: bool, samples: dict, own: dict) -> None:
    """Run the compute actions of `program` with `interp`'s handlers, each input from
    another rank delivered first; record each compute's time between its marks and the
    runtime's own time before and after them."""
    for a in program:  # what a step would have received: a fresh tensor each time
        for recv in interp.waits[a]:
            interp.deliver(recv, arrived(recv))
    clock = interp.clock
    clock.start()
    for a in program:
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


def compute_times(ctx, spec, bounds, schedule: sim.Schedule, micro: int, steps: int, alone: bool,
                  modules: dict | None = None) -> tuple[dict, dict]:
    """Run this rank's compute actions in program order, `steps` times, with the
    interpreter's own handlers on `modules` (stage -> module; default: a fresh copy of
    this rank's stages), every tensor from another rank already there.

    If `alone`, the ranks take turns (the others wait in a barrier), else they all run at
    once. Returns, without the first (warm-up) step, {(stage, kind): [seconds...]}: each
    compute between the marks the interpreter records in a step; and {"before": [...],
    "after": [...]}: the runtime's own time per compute (rule 11), from entering the
    handler to the start mark and from the end mark to leaving it, on the same clock."""
    if ctx.device.type != "cpu":
        raise ValueError("the compute calibration times CPU ranks (gloo) only")
    layers, inputs, batches = _prepared(spec, bounds, micro)
    mine = [s for s, r in enumerate(schedule.placement) if r == ctx.rank]
    stages = dict(modules) if modules is not None else \
        {s: torch.nn.Sequential(*layers[bounds[s]:bounds[s + 1]]) for s in mine}
    xs, ys = [x for x, _ in batches], [y for _, y in batches]
    program = [a for a in schedule.programs[ctx.rank] if a.kind.is_compute]
    split = next((a for a in program if a.kind not in (Kind.F, Kind.B)), None)
    if split is not None:
        raise ValueError(f"the profiler runs F and B actions, not {split}; split backwards are not profiled yet")
    arrived = _arrivals(stages, inputs, schedule.stages - 1)
    samples: dict[tuple[int, str], list[float]] = {}
    own: dict[str, list[float]] = {"before": [], "after": []}

    def one_step(record: bool) -> None:
        interp = RankInterpreter(ctx, schedule, stages, xs, ys, spec.loss, {}, 0)
        _timed_step(interp, program, arrived, record, samples, own)

    for mod in stages.values():  # never accumulate into the gradients a step left behind
        mod.zero_grad(set_to_none=True)
    for step in range(steps + 1):
        if alone:
            for r in range(ctx.world_size):
                dist.barrier()
                if r == ctx.rank:
                    one_step(step > 0)
        else:
            dist.barrier()
            one_step(step > 0)
    dist.barrier()
    return samples, own


# ---------------------------------------------------------------------------- communication

def _work_of(seconds: float):
    """A fixed piece of compute of about `seconds` (256 x 256 matmuls), as a function."""
    x = torch.randn(256, 256)
    t = time.perf_counter()
    for _ in range(10):
        x @ x
    n = max(1, round(seconds / ((time.perf_counter() - t) / 10)))

    def compute() -> None:
        for _ in range(n):
            x @ x
    return compute


def _call_costs(ctx, nbytes: int, repeats: int) -> dict:
    """What the transport costs the ranks' own cores inside a step, for a message of
    `nbytes`. Ranks 0 and 1 take turns as the poster, while the other computes:

    - the poster times posting an `irecv` into a buffer it allocates first (as the
      interpreter's RECV does) and issuing an `isend` (the interpreter's call,
      `exec.interpreter.isend`) into a receive the peer has already posted (RECVs are
      posted one compute early), so gloo writes the data from inside the call:
      `send_overhead` and `recv_overhead` (rules 2 and 3);
    - the peer computes a fixed piece of work during which the message arrives, then
      waits for it, and does the same work again with nothing arriving: the difference is
      what taking the message in cost its core (the transport's receive work runs on the
      rank's own core, rule 9): `arrive_overhead`. The two pieces run back to back on the
      same core, so a change of the machine's speed cancels out.

    Returns this rank's medians, means and largest calls, in seconds; the simulator's
    costs are the means (a step adds them up)."""
    out: dict[str, list[float]] = {"isend_busy": [], "irecv_busy": [], "arrive_busy": []}
    if ctx.rank > 1:
        return {}
    peer, compute = 1 - ctx.rank, _work_of(0.004)
    buf_in, buf_out = torch.zeros(max(1, nbytes // 4)), torch.zeros(max(1, nbytes // 4))
    for poster in (0, 1):
        for _ in range(repeats):
            if ctx.rank == poster:
                time.sleep(0.001)  # the peer has posted its receive and computes by now
                t = time.perf_counter()
                r = dist.irecv(torch.empty(buf_in.shape), peer, tag=7)
                t1 = time.perf_counter()
                w = isend(buf_out, peer, tag=8)
                t2 = time.perf_counter()
                out["irecv_busy"].append(t1 - t)
                out["isend_busy"].append(t2 - t1)
                r.wait()
                w.wait()
            else:
                r = dist.irecv(buf_out, peer, tag=8)
                t = time.perf_counter()
                compute()  # the message arrives meanwhile
                r.wait()
                t1 = time.perf_counter()
                compute()  # nothing arrives
                out["arrive_busy"].append((t1 - t) - (time.perf_counter() - t1))
                dist.send(buf_in, peer, tag=7)
    res = {k: statistics.median(v) for k, v in out.items() if v}
    res.update({f"{k}_mean": statistics.fmean(v) for k, v in out.items() if v})
    res.update({f"{k}_max": max(v) for k, v in out.items() if v})
    return res


def _pair_barrier(peer: int) -> None:
    """Ranks 0 and 1 both reach this point before either leaves it (the other ranks do
    not take part: a `dist.barrier()` here would wait for them for ever)."""
    token = torch.zeros(1)
    if peer == 1:
        dist.send(token, peer, tag=11)
        dist.recv(token, peer, tag=11)
    else:
        dist.recv(token, peer, tag=11)
        dist.send(token, peer, tag=11)


def late_notice(ctx, repeats: int, hold: float = 0.012) -> dict:
    """How long the data of a send whose receive is posted after it waits for the sending
    rank's transport thread while that rank computes (docs/rules.md, rule 10). Ranks 0
    and 1 take turns as the sender. It issues a send (`exec.interpreter.isend`) before the
    peer has posted the receive, and then either waits for the send at once (its transport
    thread is free when the ready notice comes in) or first computes for `hold` seconds
    without a yield (the thread must wait for the core). The peer posts the receive 1 ms
    after the send and times it to the data's arrival. The two cases alternate on the same
    cores; `exec.profile.io_tick_from` turns the samples into `io_tick`. `hold` exceeds the
    notice's arrival by more than one tick up to HZ = 100 (10 ms)."""
    out: dict[str, list[float]] = {"notice_free": [], "notice_busy": []}
    if ctx.rank > 1:
        return {}
    peer = 1 - ctx.rank
    x, buf = torch.randn(128, 128), torch.zeros(1024)
    for sender in (0, 1):
        for i in range(2 * repeats):
            busy = i % 2 == 1
            _pair_barrier(peer)
            if ctx.rank == sender:
                w = isend(buf, peer, tag=9)
                if busy:
                    until = time.perf_counter() + hold
                    while time.perf_counter() < until:
                        x @ x
                w.wait()
            else:
                time.sleep(0.001)
                t = time.perf_counter()
                dist.irecv(buf, peer, tag=9).wait()
                out["notice_busy" if busy else "notice_free"].append(time.perf_counter() - t)
    return out


def _pingpong_size(ctx, buf: torch.Tensor, repeats: int) -> tuple[list, list, list]:
    """Round trips of `buf` between ranks 0 and 1: rank 0's round trips and isend posts,
    rank 1's irecv posts (two warm-up trips first)."""
    peer, rtts, posts_s, posts_r = 1 - ctx.rank, [], [], []
    for i in range(repeats + 2):
        if ctx.rank == 0:
            t0 = time.perf_counter()
            w = dist.isend(buf, peer)
            t1 = time.perf_counter()
            w.wait()
            dist.irecv(buf, peer).wait()
            t2 = time.perf_counter()
            if i >= 2:
                rtts.append(t2 - t0)
                posts_s.append(t1 - t0)
        else:
            t0 = time.perf_counter()
            r = dist.irecv(buf, peer)
            t1 = time.perf_counter()
            r.wait()
            dist.isend(buf, peer).wait()
            if i >= 2:
                posts_r.append(t1 - t0)
    return rtts, posts_s, posts_r


def _wait_ready(ctx, buf: torch.Tensor, nbytes: int, repeats: int) -> list[float]:
    """Rank 1 times a wait that finds its data already there."""
    peer, waits = 1 - ctx.rank, []
    for _ in range(repeats):
        if ctx.rank == 0:
            dist.isend(buf, peer).wait()
            dist.recv(torch.zeros(1), peer)  # the peer says it has its data
        else:
            r = dist.irecv(buf, peer)
            time.sleep(0.002 + nbytes / 1e9)   # the data arrives meanwhile
            t = time.perf_counter()
            r.wait()
            waits.append(time.perf_counter() - t)
            dist.send(torch.zeros(1), peer)
    return waits


def _pingpong(ctx, sizes: Sequence[int], repeats: int) -> dict:
    """Ranks 0 and 1 bounce float32 messages of each size with isend/irecv; rank 0 times
    round trips, and both time what posting and waiting cost on the CPU."""
    out = {"sizes": [], "one_way": [], "isend_post": [], "irecv_post": [], "wait_ready": []}
    if ctx.rank > 1:
        return out

    def median(v, scale=1.0):
        return statistics.median(v) * scale if v else None

    for nbytes in sizes:
        buf = torch.zeros(max(1, nbytes // 4))
        rtts, posts_s, posts_r = _pingpong_size(ctx, buf, repeats)
        waits = _wait_ready(ctx, buf, nbytes, repeats)
        out["sizes"].append(nbytes)
        out["one_way"].append(median(rtts, 0.5))
        out["isend_post"].append(median(posts_s))
        out["irecv_post"].append(median(posts_r))
        out["wait_ready"].append(median(waits))
    return out


def activation_message_bytes(spec, micro: int) -> int:
    """Bytes of the activation passed between stages for one micro-batch (b, seq, hidden)."""
    x = spec.micro_batches(micro)[0][0]
    return x.numel() * 4 * (spec.hidden if spec.model == "gpt" else 1)


def message_sizes(spec, micro: int) -> list[int]:
    """Ping-pong message sizes: powers of 4 from 4 bytes to 4 MiB, and the activation size."""
    return sorted({4, 1 << 10, 1 << 14, 1 << 16, 1 << 18, 1 << 20, 1 << 22, activation_message_bytes(spec, micro)})


# ---------------------------------------------------------------------------- one report

def calibrate_rank(ctx, spec, schedule: sim.Schedule, micro: int, bounds: Sequence[int], steps: int = 5,
                   sizes: Sequence[int] | None = None, repeats: int = 20, modules: dict | None = None,
                   optimizer: "str | torch.optim.Optimizer" = "sgd") -> dict:
    """Run on every rank at once (inside `exec.launch.launch`): what this rank measures.

    Its stages' memory (static memory with `optimizer`: the run's optimizer, or the name
    of one from `exec.optim`); the time of each of its compute actions over `steps` steps
    of its program with all ranks computing at once ("concurrent") and with the ranks
    taking turns ("alone"), on `modules` (stage -> module) when the caller will run those
    very modules (same weights in the same memory), else on a fresh copy; and, on ranks 0
    and 1 if `sizes` is given, the ping-pong. Merge every rank's report (one or several
    rounds) with `exec.profile.costs_from_reports`."""
    schedule = schedule.compute_only()
    mine = [s for s, r in enumerate(schedule.placement) if r == ctx.rank]
    memory = _memory(spec, schedule, bounds, micro, mine, modules, optimizer)
    concurrent, own = compute_times(ctx, spec, bounds, schedule, micro, steps, alone=False, modules=modules)
    alone, own_alone = compute_times(ctx, spec, bounds, schedule, micro, steps, alone=True, modules=modules)
    comm = None
    if ctx.world_size > 1:  # the call costs are measured every time: they move with the load
        comm = _pingpong(ctx, sizes, repeats) if sizes else {}
        comm["busy"] = _call_costs(ctx, activation_message_bytes(spec, micro), repeats)
        comm["late"] = late_notice(ctx, max(4, repeats // 2))
    return {"rank": ctx.rank, "memory": memory, "concurrent": {f"{s}{k}": v for (s, k), v in concurrent.items()},
            "alone": {f"{s}{k}": v for (s, k), v in alone.items()}, "comm": comm,
            "runtime": {"concurrent": own, "alone": own_alone},
            "threads": torch.get_num_threads()}
