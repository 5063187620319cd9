"""Calibration: measure on this machine what the simulator needs, and build `sim.Costs`.

    >>> from exec.models import ModelSpec
    >>> costs, details = profile_costs(ModelSpec(), "1f1b", micro=4)     # doctest: +SKIP
    >>> save_costs(costs, "costs.json"); costs = load_costs("costs.json")   # doctest: +SKIP

Everything is measured *inside* the rank processes, under the conditions of a real step:

- the same processes, threads per rank and backend as `exec.runtime` (`exec.launch.launch`);
- every rank runs its own program's compute actions, in the schedule's order, at the
  same time as the others (two ranks on two cores compete for the cores and the memory
  bus as they do in a real step), with the runtime's own handlers
  (`exec.runtime.RankInterpreter`), every input from another rank already received: a
  compute is timed between the very marks a step records;
- a compute action's time is the mean over several steps (the first one warms up): a
  step adds them up, so their expected value is what predicts it;
- the runtime's own time around each compute, from entering its handler to the start
  mark and from the end mark to leaving it: `before_compute` and `after_compute`
  (rule 11);
- the CPU time of an `isend` and of an `irecv` post inside a step (the peer computing,
  the receive already posted): `send_overhead` and `recv_overhead`; and what taking in a
  message that arrived during a compute costs the receiving core: `arrive_overhead`;
- how long a send whose receive is posted after it waits for the sending rank's transport
  thread while that rank computes (gloo's I/O thread runs at the rank's next yield or at
  the scheduler's tick): `io_tick`, measured as a difference of two timings;
- transfers: ping-pong between ranks 0 and 1 with `isend`/`irecv` over message sizes
  from 4 bytes to beyond the activation size; the one-way time fitted by least squares to
  `latency + bytes / bandwidth` (the simulator's rule 6);
- activation bytes: what autograd saves during a stage's F (`saved_tensors_hooks`, each
  storage counted once, parameters excluded), as `exec.runtime` counts them;
- static bytes: the stage's parameters and their gradients.

`details` keeps the raw measurements (per-action samples, ping-pong points, the cost of
posting a send or a receive, ...) so that a difference between a simulated and a
measured step can be traced to the rule that causes it.
"""
from __future__ import annotations

import json
import math
import os
import statistics
import time
from typing import Any, Sequence

import sim
from sim.files import atomic_write
from sim.ir import Kind

__all__ = ["profile_costs", "calibrate_rank", "costs_from_reports", "message_sizes", "fit_latency_bandwidth", "save_costs", "load_costs", "costs_to_dict", "costs_from_dict"]

_COST_FIELDS = ("forward", "backward", "latency", "bandwidth", "activation_bytes_sent", "activation_bytes",
                "static_bytes", "backward_input", "backward_weight", "send_overhead", "recv_overhead",
                "arrive_overhead", "io_tick", "before_compute", "after_compute")


# ---------------------------------------------------------------------------- the transfer fit

def fit_latency_bandwidth(sizes: Sequence[float], times: Sequence[float]) -> tuple[float, float]:
    """Least-squares fit of one-way transfer times to `latency + bytes / bandwidth`.

    Returns (latency seconds, bandwidth bytes/s). A latency that fits below zero is
    clamped to 0 (and the slope refitted through the origin); a slope <= 0 (size does not
    matter) gives bandwidth = inf and latency = the mean time."""
    if len(sizes) != len(times) or len(sizes) < 2:
        raise ValueError(f"need at least two (size, time) points of equal count, got {len(sizes)} sizes and {len(times)} times")
    n = len(sizes)
    mx, my = math.fsum(sizes) / n, math.fsum(times) / n
    sxx = math.fsum((x - mx) ** 2 for x in sizes)
    if sxx == 0:
        raise ValueError("need at least two different message sizes to fit a bandwidth")
    slope = math.fsum((x - mx) * (y - my) for x, y in zip(sizes, times)) / sxx
    latency = my - slope * mx
    if slope <= 0:
        return max(my, 0.0), math.inf
    if latency < 0:  # through the origin
        slope = math.fsum(x * y for x, y in zip(sizes, times)) / math.fsum(x * x for x in sizes)
        return 0.0, 1.0 / slope
    return latency, 1.0 / slope


# ---------------------------------------------------------------------------- JSON

def costs_to_dict(costs: sim.Costs) -> dict:
    """`sim.Costs` as plain JSON data (infinite bandwidth as the string "inf")."""
    out = {}
    for name in _COST_FIELDS:
        v = getattr(costs, name)
        if isinstance(v, (list, tuple)):
            v = [float(x) for x in v]
        elif isinstance(v, float) and math.isinf(v):
            v = "inf"
        out[name] = v
    return out


def costs_from_dict(data: dict) -> sim.Costs:
    """Inverse of `costs_to_dict`."""
    unknown = set(data) - set(_COST_FIELDS)
    if unknown:
        raise ValueError(f"unknown Costs fields {sorted(unknown)}; expected some of {list(_COST_FIELDS)}")
    kwargs = {}
    for name, v in data.items():
        if v == "inf":
            v = math.inf
        elif isinstance(v, list):
            v = tuple(float(x) for x in v)
        kwargs[name] = v
    return sim.Costs(**kwargs)


def save_costs(costs: sim.Costs, path: str | os.PathLike, details: dict | None = None) -> None:
    """Write `costs` (and optionally the JSON-able `details`) to `path`, whole or not at all."""
    doc = {"costs": costs_to_dict(costs)}
    if details is not None:
        doc["details"] = _jsonable(details)
    with atomic_write(path) as f:
        json.dump(doc, f, indent=1, allow_nan=False)


def load_costs(path: str | os.PathLike) -> sim.Costs:
    """Read `sim.Costs` written by `save_costs`."""
    with open(path) as f:
        doc = json.load(f)
    if not isinstance(doc, dict) or "costs" not in doc:
        raise ValueError(f"{path} holds no costs; expected a JSON object with a 'costs' key as save_costs writes")
    return costs_from_dict(doc["costs"])


def _jsonable(x: Any) -> Any:
    """`x` as standard JSON data: infinities and NaN as strings, tuples as lists, keys as str."""
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if hasattr(x, "tolist"):
        return x.tolist()
    return str(x)


# ---------------------------------------------------------------------------- inside the ranks

def _stage_inputs(spec, layers, bounds: Sequence[int], stage: int, micro: int):
    """Per micro-batch, the input of `stage` and the targets (the earlier stages' forward)."""
    import torch
    out = []
    with torch.no_grad():
        for x, y in spec.micro_batches(micro):
            for layer in layers[:bounds[stage]]:
                x = layer(x)
            out.append((x, y))
    return out


_PREPARED: dict = {}  # this process's calibration inputs, for one configuration at a time


def _prepared(spec, bounds: Sequence[int], micro: int):
    """The model's layers, per stage the input of every micro-batch (`_stage_inputs`), and
    the micro-batches, built once per process and configuration: every calibration round
    of a run reuses them, so a round allocates no new model or batch before it times the
    computes (fresh allocations between rounds grew the heap, and the timed computes then
    took page faults that a step does not)."""
    key = (spec, tuple(bounds), micro)
    if key not in _PREPARED:
        _PREPARED.clear()
        layers = spec.build_layers()
        inputs = {s: _stage_inputs(spec, layers, bounds, s, micro) for s in range(len(bounds) - 1)}
        _PREPARED[key] = (layers, inputs, spec.micro_batches(micro))
    return _PREPARED[key]


def _activation_bytes(module, x, last: bool, loss_fn, y, micro: int) -> tuple[int, int]:
    """Bytes autograd saves during one forward of `module` on `x`, counted as
    `exec.runtime` counts them (`SavedBytes`: each storage once, parameters excluded),
    and the bytes of the output the stage sends on."""
    from exec.runtime import SavedBytes, param_storages
    inp = x.detach().clone()
    if inp.is_floating_point():
        inp.requires_grad_()
    saved = SavedBytes(param_storages(module))
    with saved.hooks():
        out = module(inp)
        if last:
            loss_fn(out, y) / micro
    return saved.nbytes, out.numel() * out.element_size()


class _Arrived:
    """A receive whose data is already there (calibration runs no transport)."""

    def wait(self) -> bool:
        return True


def _compute_times(ctx, spec, bounds, schedule, micro: int, steps: int, alone: bool,
                   modules: dict | None = None) -> tuple[dict, dict]:
    """Run this rank's compute actions in program order, `steps` times, with the runtime's
    own handlers (`exec.runtime.RankInterpreter`) on `modules` (stage -> module; default:
    a fresh copy of this rank's stages), every tensor from another rank already there.

    If `alone`, the ranks take turns (the others wait in a barrier), else they all run at
    once. Returns, without the first (warm-up) step, {(stage, kind): [seconds...]}: each
    compute between the marks the runtime records in a step; and {"before": [...],
    "after": [...]}: the runtime's own time per compute (rule 11), from entering the
    handler to the start mark and from the end mark to leaving it."""
    import torch
    import torch.distributed as dist
    from exec.runtime import RankInterpreter, _Pending

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
    grads = {}
    for s in mine:
        if s != schedule.stages - 1:
            with torch.no_grad():
                shape = stages[s](inputs[s][0][0]).shape
            grads[s] = torch.randn(shape, generator=torch.Generator().manual_seed(s))
    samples: dict[tuple[int, str], list[float]] = {}
    own: dict[str, list[float]] = {"before": [], "after": []}

    def one_step(record: bool) -> None:
        interp = RankInterpreter(ctx, schedule, stages, xs, ys, spec.loss, {}, 0)
        for a in program:  # what a step would have received: a fresh tensor each time
            for recv in interp.waits.get(a, ()):
                data = inputs[recv.stage][recv.micro][0] if recv.kind is Kind.RECV_F else grads[recv.stage]
                interp.pending[recv] = _Pending(_Arrived(), data.detach().clone(), 0.0)
        interp.clock.start()
        for a in program:
            t0 = time.perf_counter()
            interp.handlers[a.kind](a)
            t1 = time.perf_counter()
            done, start, end, _ = interp._events[-1]  # CPU clock marks: perf_counter seconds
            assert done == a
            if record:
                samples.setdefault((a.stage, a.kind.value), []).append(end - start)
                own["before"].append(start - t0)
                own["after"].append(t1 - end)
        for mod in stages.values():
            mod.zero_grad(set_to_none=True)

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


def _post_costs_busy(ctx, nbytes: int, repeats: int) -> dict:
    """What the transport costs the ranks' own cores inside a step, for a message of
    `nbytes`. Ranks 0 and 1 take turns as the poster, while the other computes:

    - the poster times posting an `irecv` into a buffer it allocates first (as the
      runtime's RECV does) and issuing an `isend` (the runtime's call,
      `exec.runtime.isend`) into a receive the peer has already posted (RECVs are posted
      one compute early), so gloo writes the data from inside the call: `send_overhead`
      and `recv_overhead` (rules 2 and 3);
    - the peer computes a fixed piece of work during which the message arrives, then
      waits for it, and does the same work again with nothing arriving: the difference is
      what taking the message in cost its core (the transport's receive work runs on the
      rank's own core, rule 9): `arrive_overhead`. The two pieces run back to back on the
      same core, so a change of the machine's speed cancels out.

    Returns this rank's medians and means in seconds, and the largest call seen; the
    simulator's costs are the means (a step adds them up)."""
    import torch
    import torch.distributed as dist
    from exec.runtime import isend

    out: dict[str, list[float]] = {"isend_busy": [], "irecv_busy": [], "arrive_busy": []}
    if ctx.rank > 1:
        return {}
    peer = 1 - ctx.rank
    x = torch.randn(256, 256)
    t = time.perf_counter()
    for _ in range(10):
        x @ x
    work = max(1, round(0.004 / ((time.perf_counter() - t) / 10)))  # about 4 ms of matmuls

    def compute() -> None:
        for _ in range(work):
            x @ x

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
                t2 = time.perf_counter()
                out["arrive_busy"].append((t1 - t) - (t2 - t1))
                dist.send(buf_in, peer, tag=7)
    res = {k: statistics.median(v) for k, v in out.items() if v}
    res.update({f"{k}_mean": statistics.fmean(v) for k, v in out.items() if v})
    res.update({f"{k}_max": max(v) for k, v in out.items() if v})
    return res


def _late_notice(ctx, repeats: int, hold: float = 0.012) -> dict:
    """How long the data of a send whose receive is posted after it waits for the sending
    rank's transport thread while that rank computes (docs/rules.md, rule 10). Ranks 0
    and 1 take turns as the sender. It issues a send (`exec.runtime.isend`) before the
    peer has posted the receive, and then either waits for the send at once (its transport
    thread is free when the ready notice comes in) or first computes for `hold` seconds
    without a yield (the thread must wait for the core). The peer posts the receive 1 ms
    after the send and times it to the data's arrival. The two cases alternate on the same
    cores; the difference of their medians is the wait alone, which for a tick at a
    uniform phase is half the tick, so `io_tick` = 2 x that difference. `hold` exceeds the
    notice's arrival by more than one tick up to HZ = 100 (10 ms)."""
    import torch
    import torch.distributed as dist
    from exec.runtime import isend

    out: dict[str, list[float]] = {"notice_free": [], "notice_busy": []}
    if ctx.rank > 1:
        return {}
    peer = 1 - ctx.rank
    x, buf = torch.randn(128, 128), torch.zeros(1024)
    for sender in (0, 1):
        for i in range(2 * repeats):
            busy = i % 2 == 1
            dist.barrier()
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


def io_tick_from(late: Sequence[dict]) -> float:
    """`Costs.io_tick` from `_late_notice` samples (any ranks and rounds): twice the median
    extra wait of a late notice to a busy sender over one to a free sender (a difference
    of two timings: it cannot come out below 0); 0 without samples."""
    if not late:
        return 0.0
    free = statistics.median(v for x in late for v in x["notice_free"])
    busy = statistics.median(v for x in late for v in x["notice_busy"])
    return max(0.0, 2 * (busy - free))


def _pingpong(ctx, sizes: Sequence[int], repeats: int) -> dict:
    """Ranks 0 and 1 bounce float32 messages of each size with isend/irecv; rank 0 times
    round trips, and both time what posting and waiting cost on the CPU."""
    import torch
    import torch.distributed as dist

    out = {"sizes": [], "one_way": [], "isend_post": [], "irecv_post": [], "wait_ready": []}
    if ctx.rank > 1:
        return out
    peer = 1 - ctx.rank
    for nbytes in sizes:
        buf = torch.zeros(max(1, nbytes // 4))
        rtts, posts_s, posts_r, waits = [], [], [], []
        for i in range(repeats + 2):
            if ctx.rank == 0:
                t0 = time.perf_counter()
                w = dist.isend(buf, peer)
                t1 = time.perf_counter()
                w.wait()
                r = dist.irecv(buf, peer)
                r.wait()
                t2 = time.perf_counter()
                if i >= 2:
                    rtts.append(t2 - t0)
                    posts_s.append(t1 - t0)
            else:
                t0 = time.perf_counter()
                r = dist.irecv(buf, peer)
                t1 = time.perf_counter()
                r.wait()
                w = dist.isend(buf, peer)
                w.wait()
                if i >= 2:
                    posts_r.append(t1 - t0)
        # a wait that finds its data already there
        for i in range(repeats):
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
        out["sizes"].append(nbytes)
        out["one_way"].append(statistics.median(rtts) / 2 if rtts else None)
        out["isend_post"].append(statistics.median(posts_s) if posts_s else None)
        out["irecv_post"].append(statistics.median(posts_r) if posts_r else None)
        out["wait_ready"].append(statistics.median(waits) if waits else None)
    return out


def calibrate_rank(ctx, spec, schedule: sim.Schedule, micro: int, bounds: Sequence[int], steps: int = 5,
                   sizes: Sequence[int] | None = None, repeats: int = 20, modules: dict | None = None) -> dict:
    """Run on every rank at once (inside `exec.launch.launch`): what this rank measures.

    Its stages' memory; the time of each of its compute actions over `steps` steps of
    its program with all ranks computing at once ("concurrent") and with the ranks taking
    turns ("alone"), on `modules` (stage -> module) when the caller will run those very
    modules (same weights in the same memory), else on a fresh copy; and, on ranks 0 and
    1 if `sizes` is given, the ping-pong. Merge every rank's report (one or several
    rounds) with `costs_from_reports`."""
    import torch

    schedule = schedule.compute_only()
    layers, inputs, _ = _prepared(spec, bounds, micro)
    mine = [s for s, r in enumerate(schedule.placement) if r == ctx.rank]
    memory = {}
    for s in mine:
        module = torch.nn.Sequential(*layers[bounds[s]:bounds[s + 1]])
        x, y = inputs[s][0]
        act, sent = _activation_bytes(module, x, s == schedule.stages - 1, spec.loss, y, micro)
        params = sum(p.numel() * p.element_size() for p in module.parameters())
        memory[s] = {"activation_bytes": act, "activation_bytes_sent": sent, "static_bytes": 2 * params}
    concurrent, own = _compute_times(ctx, spec, bounds, schedule, micro, steps, alone=False, modules=modules)
    alone, own_alone = _compute_times(ctx, spec, bounds, schedule, micro, steps, alone=True, modules=modules)
    comm = None
    if ctx.world_size > 1:  # the call costs are measured every time: they move with the load
        comm = _pingpong(ctx, sizes, repeats) if sizes else {}
        comm["busy"] = _post_costs_busy(ctx, activation_message_bytes(spec, micro), repeats)
        comm["late"] = _late_notice(ctx, max(4, repeats // 2))
    return {"rank": ctx.rank, "memory": memory, "concurrent": {f"{s}{k}": v for (s, k), v in concurrent.items()},
            "alone": {f"{s}{k}": v for (s, k), v in alone.items()}, "comm": comm,
            "runtime": {"concurrent": own, "alone": own_alone},
            "threads": torch.get_num_threads()}


def activation_message_bytes(spec, micro: int) -> int:
    """Bytes of the activation passed between stages for one micro-batch (b, seq, hidden)."""
    x = spec.micro_batches(micro)[0][0]
    return x.numel() * 4 * (spec.hidden if spec.model == "gpt" else 1)


def message_sizes(spec, micro: int) -> list[int]:
    """Ping-pong message sizes: powers of 4 from 4 bytes to 4 MiB, and the activation size."""
    return sorted({4, 1 << 10, 1 << 14, 1 << 16, 1 << 18, 1 << 20, 1 << 22, activation_message_bytes(spec, micro)})


def costs_from_reports(reports: Sequence[dict], schedule: sim.Schedule, use: str = "concurrent",
                       transfer: tuple[float, float] | None = None) -> tuple[sim.Costs, dict]:
    """Merge `calibrate_rank` reports (every rank's, from one or several rounds) into
    `sim.Costs` and a details dict. Compute times: the mean of all samples of `use`
    ("concurrent" or "alone"); transfers: `transfer` = (latency, bandwidth) if given, else
    the least-squares fit of the ping-pong (free transfers if there was none)."""
    if use not in ("concurrent", "alone"):
        raise ValueError(f"use must be 'concurrent' or 'alone', got {use!r}")
    stages = schedule.stages
    memory = {int(s): m for r in reports for s, m in r["memory"].items()}
    times: dict[str, dict[str, list[float]]] = {"concurrent": {}, "alone": {}}
    for r in reports:
        for kind in times:
            for k, v in r[kind].items():
                times[kind].setdefault(k, []).extend(v)
    med = {kind: {k: statistics.median(v) for k, v in d.items()} for kind, d in times.items()}
    mean = {kind: {k: statistics.fmean(v) for k, v in d.items()} for kind, d in times.items()}
    missing = [f"{s}{k}" for s in range(stages) for k in "FB" if f"{s}{k}" not in med[use]]
    if missing or set(memory) != set(range(stages)):
        raise ValueError(f"the reports lack stages' measurements ({', '.join(missing) or 'memory'}); "
                         f"pass every rank's calibrate_rank report")
    comm = next((r["comm"] for r in reports if r["rank"] == 0 and r["comm"]), None)
    comm1 = next((r["comm"] for r in reports if r["rank"] == 1 and r["comm"]), None)
    if comm is not None and comm1 is not None:
        comm = {**comm, "irecv_post": comm1.get("irecv_post"), "wait_ready": comm1.get("wait_ready"),
                "busy_rank1": comm1.get("busy")}
    # the CPU time of the isend and irecv calls inside a step: the mean over every round
    # of ranks 0 and 1 (a step's length adds them up, so the expected value is what counts)
    busy = [r["comm"]["busy"] for r in reports if r["comm"] and r["comm"].get("busy")]
    send_overhead = statistics.fmean(b["isend_busy_mean"] for b in busy) if busy else 0.0
    recv_overhead = statistics.fmean(b["irecv_busy_mean"] for b in busy) if busy else 0.0
    # a difference of two timings: below the noise it can come out negative; the cost cannot
    arrive_overhead = max(0.0, statistics.fmean(b["arrive_busy_mean"] for b in busy)) if busy else 0.0
    # rule 10: a late ready notice waits for a computing sender's transport thread, half a
    # tick in the median (a difference of two timings: it cannot come out below 0)
    io_tick = io_tick_from([r["comm"]["late"] for r in reports if r["comm"] and r["comm"].get("late")])
    # rule 11: the runtime's own time around a compute, the mean over every compute timed
    own = {k: [v for r in reports for v in r.get("runtime", {}).get(use, {}).get(k, [])] for k in ("before", "after")}
    before, after = (statistics.fmean(own[k]) if own[k] else 0.0 for k in ("before", "after"))
    if comm is not None and comm.get("isend_post") and all(t is not None for t in comm["isend_post"]):
        # the CPU time of the isend call itself grows with the message: gloo writes the
        # data to the socket inside isend when the receive is already posted
        fixed, rate = fit_latency_bandwidth(comm["sizes"], comm["isend_post"])
        comm = {**comm, "isend_post_fit": {"fixed_s": fixed, "bytes_per_s": rate}}
    if transfer is not None:
        latency, bandwidth = transfer
    elif comm is not None and comm.get("sizes"):
        latency, bandwidth = fit_latency_bandwidth(comm["sizes"], comm["one_way"])
    else:
        latency, bandwidth = 0.0, math.inf
    # a step's length adds compute times up: the simulator takes their expected value (the
    # mean, stalls included), not the median
    costs = sim.Costs(
        forward=[mean[use][f"{s}F"] for s in range(stages)],
        backward=[mean[use][f"{s}B"] for s in range(stages)],
        latency=latency, bandwidth=bandwidth, send_overhead=send_overhead, recv_overhead=recv_overhead,
        arrive_overhead=arrive_overhead, io_tick=io_tick, before_compute=before, after_compute=after,
        activation_bytes_sent=[memory[s]["activation_bytes_sent"] for s in range(stages)],
        activation_bytes=[memory[s]["activation_bytes"] for s in range(stages)],
        static_bytes=[memory[s]["static_bytes"] for s in range(stages)],
    )
    # how much slower a compute runs while every rank computes than while it runs alone
    slowdown = {k: med["concurrent"][k] / med["alone"][k] for k in med["alone"] if k in med["concurrent"]}
    details = {
        "schedule": schedule.name, "stages": stages, "micro": schedule.micro, "use": use,
        "threads": sorted({r["threads"] for r in reports}),
        "compute_samples": times, "compute_median": med, "compute_mean": mean, "slowdown": slowdown,
        "slowdown_median": statistics.median(slowdown.values()) if slowdown else None,
        "memory": memory, "comm": comm, "latency": latency, "bandwidth": bandwidth,
        "runtime": own, "runtime_median": {k: statistics.median(v) if v else None for k, v in own.items()},
    }
    return costs, details


# ---------------------------------------------------------------------------- the API

def _as_schedule(schedule_or_stages, micro: int) -> sim.Schedule:
    if isinstance(schedule_or_stages, sim.Schedule):
        if schedule_or_stages.micro != micro:
            raise ValueError(f"the schedule has {schedule_or_stages.micro} micro-batches but micro={micro}")
        return schedule_or_stages.compute_only()
    if isinstance(schedule_or_stages, str):
        return sim.make_schedule(schedule_or_stages, 2, micro)
    if isinstance(schedule_or_stages, int) and not isinstance(schedule_or_stages, bool):
        return sim.make_schedule("gpipe", schedule_or_stages, micro)
    raise TypeError(f"schedule_or_stages must be a sim.Schedule, a schedule name or a stage count, "
                    f"got {type(schedule_or_stages).__name__}")


def profile_costs(spec, schedule_or_stages: "sim.Schedule | str | int", micro: int, backend: str = "gloo",
                  balance: str = "layers", bounds: Sequence[int] | None = None, steps: int = 5,
                  repeats: int = 20, threads: int | None = None, timeout: float = 300.0,
                  use: str = "concurrent", transfer: tuple[float, float] | None = None
                  ) -> tuple[sim.Costs, dict]:
    """Measure `sim.Costs` for `spec` cut into the stages of `schedule_or_stages`.

    `schedule_or_stages`: a `sim.Schedule` (its placement and compute order are used), a
    schedule name (2 stages), or a stage count (GPipe order). One process per rank via
    `exec.launch.launch` (same `backend` and `threads` as the real run). Stage
    boundaries: `bounds` if given, else `spec.partition(stages, balance, micro)`.
    `use` picks the compute times: "concurrent" (all ranks compute at once, as in a
    step's steady state) or "alone" (one rank at a time). `transfer` = (latency,
    bandwidth) reuses a transfer fit instead of measuring it again. Returns (costs, details)."""
    from exec.launch import launch

    if backend != "gloo":
        raise ValueError(f"profile_costs measures CPU ranks over gloo only, not backend={backend!r}: its "
                         f"compute timing has no CUDA synchronisation and its messages are CPU tensors; "
                         f"for an NCCL run, simulate with costs written by save_costs (exec.run --costs)")
    schedule = _as_schedule(schedule_or_stages, micro)
    bounds = list(bounds) if bounds is not None else spec.partition(schedule.stages, balance, micro)
    sizes = None if transfer else message_sizes(spec, micro)
    reports = launch(calibrate_rank, schedule.ranks, spec, schedule, micro, bounds, steps, sizes, repeats,
                     backend=backend, timeout=timeout, threads=threads)
    costs, details = costs_from_reports(reports, schedule, use, transfer)
    details.update(spec={k: getattr(spec, k) for k in spec.__dataclass_fields__}, bounds=bounds, backend=backend)
    return costs, details
