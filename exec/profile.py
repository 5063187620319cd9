"""Calibration: measure on this machine what the simulator needs, and build `sim.Costs`.

    >>> from exec.models import ModelSpec
    >>> costs, details = profile_costs(ModelSpec(), "1f1b", micro=4)     # doctest: +SKIP
    >>> save_costs(costs, "costs.json"); costs = load_costs("costs.json")   # doctest: +SKIP

Everything is measured *inside* the rank processes, under the conditions of a real step:

- the same processes, threads per rank and backend as `exec.runtime` (`exec.launch.launch`);
- every rank runs its own program's compute actions, in the schedule's order, at the
  same time as the others (two ranks on two cores compete for the cores and the memory
  bus as they do in a real step), as the runtime does them: the input is a fresh tensor
  with `requires_grad` (as a received one), the last stage computes the loss inside its
  F, and a backward is `torch.autograd.backward(output, grad)` (the loss alone on the
  last stage), accumulating into the weights' `.grad`;
- a compute action's time is the median over several steps (the first one warms up);
- transfers: ping-pong between ranks 0 and 1 with `isend`/`irecv` over message sizes
  from 4 bytes to beyond the activation size; the one-way time fitted by least squares to
  `latency + bytes / bandwidth` (the simulator's rule 6);
- activation bytes: what autograd saves during a stage's F (`saved_tensors_hooks`, each
  storage counted once, parameters excluded), plus the stage's output kept for its B;
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

__all__ = ["profile_costs", "fit_latency_bandwidth", "save_costs", "load_costs", "costs_to_dict", "costs_from_dict"]

_COST_FIELDS = ("forward", "backward", "latency", "bandwidth", "activation_bytes_sent", "activation_bytes",
                "static_bytes", "backward_input", "backward_weight")


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


def _activation_bytes(module, x, last: bool, loss_fn, y) -> tuple[int, int]:
    """Bytes autograd keeps from one forward of `module` on `x` (each storage once,
    parameters excluded, the output included), and the bytes of the output."""
    import torch
    params = {p.data_ptr() for p in module.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        if t.data_ptr() not in params:
            st = t.untyped_storage()
            seen[st.data_ptr()] = st.nbytes()
        return t

    inp = x.detach().requires_grad_(x.is_floating_point())
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = module(inp)
        if last:
            loss_fn(out, y)
    seen.setdefault(out.untyped_storage().data_ptr(), out.untyped_storage().nbytes())
    return sum(seen.values()), out.numel() * out.element_size()


def _compute_times(ctx, spec, bounds, schedule, micro: int, steps: int, alone: bool) -> dict:
    """Run this rank's compute actions in program order, `steps` times, timing each.

    If `alone`, the ranks take turns (the others wait in a barrier), else they all run
    at once. Returns {(stage, kind): [seconds...]} without the first (warm-up) step."""
    import torch
    import torch.distributed as dist

    layers = spec.build_layers()
    mine = [s for s, r in enumerate(schedule.placement) if r == ctx.rank]
    stages = {s: torch.nn.Sequential(*layers[bounds[s]:bounds[s + 1]]) for s in mine}
    inputs = {s: _stage_inputs(spec, layers, bounds, s, micro) for s in mine}
    last = schedule.stages - 1
    program = [a for a in schedule.programs[ctx.rank] if a.kind.is_compute]
    grads = {}
    for s in mine:
        if s != last:
            with torch.no_grad():
                shape = stages[s](inputs[s][0][0]).shape
            grads[s] = torch.randn(shape, generator=torch.Generator().manual_seed(s))
    samples: dict[tuple[int, str], list[float]] = {}

    def one_step(record: bool) -> None:
        saved = {}
        for a in program:
            s, m, k = a.stage, a.micro, a.kind.value
            t = time.perf_counter()
            if k == "F":
                x, y = inputs[s][m]
                x = x.detach().clone().requires_grad_(x.is_floating_point())  # a received tensor
                out = stages[s](x)
                if s == last:
                    out = spec.loss(out, y) / micro
                saved[m] = out
            elif k == "B":
                out = saved.pop(m)
                if s == last:
                    torch.autograd.backward(out)
                else:
                    torch.autograd.backward(out, grads[s])
            else:
                raise ValueError(f"the profiler runs F and B actions, not {a}; split backwards are not profiled yet")
            if record:
                samples.setdefault((s, k), []).append(time.perf_counter() - t)
        for mod in stages.values():
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
    return samples


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


def _rank_profile(ctx, spec, bounds, schedule, micro: int, steps: int, sizes: Sequence[int], repeats: int) -> dict:
    """What one rank measures: compute times (concurrent and alone), memory, ping-pong."""
    import torch

    layers = spec.build_layers()
    mine = [s for s, r in enumerate(schedule.placement) if r == ctx.rank]
    memory = {}
    for s in mine:
        module = torch.nn.Sequential(*layers[bounds[s]:bounds[s + 1]])
        x, y = _stage_inputs(spec, layers, bounds, s, micro)[0]
        act, sent = _activation_bytes(module, x, s == schedule.stages - 1, spec.loss, y)
        params = sum(p.numel() * p.element_size() for p in module.parameters())
        memory[s] = {"activation_bytes": act, "activation_bytes_sent": sent, "static_bytes": 2 * params}
    concurrent = _compute_times(ctx, spec, bounds, schedule, micro, steps, alone=False)
    alone = _compute_times(ctx, spec, bounds, schedule, micro, max(2, steps // 2), alone=True)
    comm = _pingpong(ctx, sizes, repeats) if ctx.world_size > 1 else None
    return {"rank": ctx.rank, "memory": memory, "concurrent": {f"{s}{k}": v for (s, k), v in concurrent.items()},
            "alone": {f"{s}{k}": v for (s, k), v in alone.items()}, "comm": comm,
            "threads": torch.get_num_threads()}


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
                  use: str = "concurrent") -> tuple[sim.Costs, dict]:
    """Measure `sim.Costs` for `spec` cut into the stages of `schedule_or_stages`.

    `schedule_or_stages`: a `sim.Schedule` (its placement and compute order are used), a
    schedule name (2 stages), or a stage count (GPipe order). One process per rank via
    `exec.launch.launch` (same `backend` and `threads` as the real run). Stage
    boundaries: `bounds` if given, else `spec.partition(stages, balance, micro)`.
    `use` picks the compute times: "concurrent" (all ranks compute at once, as in a
    step's steady state) or "alone" (one rank at a time). Returns (costs, details)."""
    from exec.launch import launch

    if use not in ("concurrent", "alone"):
        raise ValueError(f"use must be 'concurrent' or 'alone', got {use!r}")
    schedule = _as_schedule(schedule_or_stages, micro)
    stages = schedule.stages
    bounds = list(bounds) if bounds is not None else spec.partition(stages, balance, micro)
    act_guess = spec.micro_batches(micro)[0][0].numel() * 4 * (spec.hidden if spec.model == "gpt" else 1)
    sizes = sorted({4, 1 << 10, 1 << 14, 1 << 16, 1 << 18, 1 << 20, 1 << 22, act_guess})
    ranks = launch(_rank_profile, schedule.ranks, spec, bounds, schedule, micro, steps, sizes, repeats,
                   backend=backend, timeout=timeout, threads=threads)

    memory = {s: m for r in ranks for s, m in r["memory"].items()}
    times = {kind: {k: v for r in ranks for k, v in r[kind].items()} for kind in ("concurrent", "alone")}
    med = {kind: {k: statistics.median(v) for k, v in d.items()} for kind, d in times.items()}
    forward = [med[use][f"{s}F"] for s in range(stages)]
    backward = [med[use][f"{s}B"] for s in range(stages)]
    comm = ranks[0]["comm"]
    if comm is not None:
        latency, bandwidth = fit_latency_bandwidth(comm["sizes"], comm["one_way"])
    else:
        latency, bandwidth = 0.0, math.inf
    for r in ranks[1:2]:
        if comm is not None and r["comm"] is not None:
            comm["irecv_post"] = r["comm"]["irecv_post"]
            comm["wait_ready"] = r["comm"]["wait_ready"]
    costs = sim.Costs(
        forward=forward, backward=backward, latency=latency, bandwidth=bandwidth,
        activation_bytes_sent=[memory[s]["activation_bytes_sent"] for s in range(stages)],
        activation_bytes=[memory[s]["activation_bytes"] for s in range(stages)],
        static_bytes=[memory[s]["static_bytes"] for s in range(stages)],
    )
    details = {
        "spec": {k: getattr(spec, k) for k in spec.__dataclass_fields__},
        "schedule": schedule.name, "stages": stages, "micro": micro, "bounds": bounds,
        "backend": backend, "threads": [r["threads"] for r in ranks], "use": use,
        "compute_samples": times, "compute_median": med, "memory": memory, "comm": comm,
    }
    return costs, details
