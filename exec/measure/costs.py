"""Cost fitting: merge the ranks' calibration reports into `sim.Costs`.

    >>> costs, details = costs_from_reports(reports, schedule)          # doctest: +SKIP
    >>> sim.save_costs(costs, "costs.json", details)                   # doctest: +SKIP

The reports come from a run's calibration rounds (`exec.pipeline.runner.run_pipeline` with
`calibrate`) or from a calibration launch of their own (`exec.pipeline.profile.profile_costs`).
What each rank measures, and how, is `exec.measure.calibrate`; this module turns those numbers
into the simulator's costs:

- compute times: per stage and kind, the mean of every sample of "concurrent" (inside
  training steps, all ranks at once: rule 19) or "alone" (compute-only, one rank at a
  time): a step adds them up, so their expected value is what predicts it. F gives
  `forward`, B `backward`, and the split backward's I and W `backward_input` and
  `backward_weight` (and `backward` = I + W where a stage ran no B); under "concurrent",
  `first_compute` is the mean excess of each step's first compute (rule 19, at least 0);
- the runtime's own time around a compute (`before_compute`, `after_compute`, rule 11),
  the call costs (`send_overhead`, `recv_overhead`) and the cost of taking data in
  (`arrive_overhead`, only under "alone": the in-step computes hold it): means over every
  round of ranks 0 and 1;
- `io_tick` (rule 10): twice the median extra wait of a late notice to a sender that
  computes over one to a sender that waits (`io_tick_from`);
- transfers: the ping-pong's one-way times fitted by least squares to `latency + bytes /
  bandwidth` (`fit_latency_bandwidth`, rule 6);
- the data-parallel reduction (`grad_reduce`, rule 13): per stage, the mean time of its
  REDUCE_GRAD on the collective stream over every replica and round, where the reports
  have it (0 elsewhere);
- memory: per stage, the activation bytes, the part of them W still needs after I
  (`w_activation_bytes`), the bytes sent on, and the static memory split
  into `weight_bytes`, `grad_bytes` and `optimizer_bytes` (`static_bytes` stays 0), so
  that a simulated step's peak memory is the measured one.

`details` keeps the raw measurements (per-action samples, ping-pong points, the cost of
posting a send or a receive, ...) so that a difference between a simulated and a
measured step can be traced to the rule that causes it. Save and load costs with
`sim.save_costs` / `load_costs`.
"""
from __future__ import annotations

import math
import statistics
from typing import Sequence

import sim
from sim.schedule.kinds import COMPUTE, KINDS, Kind

__all__ = ["costs_from_reports", "fit_latency_bandwidth", "io_tick_from"]

STATIC_FIELDS = ("weight_bytes", "grad_bytes", "optimizer_bytes")  # a stage's static memory in Costs
# the per-micro-batch bytes that computes take and give back: their kinds' memory effects
HELD_FIELDS = tuple(sorted({e.field for k in COMPUTE for e in KINDS[k].memory}))


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


def io_tick_from(late: Sequence[dict]) -> float:
    """`Costs.io_tick` from `exec.measure.calibrate_link.late_notice` samples (any ranks and rounds):
    twice the median extra wait of a late notice to a busy sender over one to a free
    sender (for a tick at a uniform phase the wait is half the tick; a difference of two
    timings: it cannot come out below 0); 0 without samples."""
    if not late:
        return 0.0
    free = statistics.median(v for x in late for v in x["notice_free"])
    busy = statistics.median(v for x in late for v in x["notice_busy"])
    return max(0.0, 2 * (busy - free))


# ---------------------------------------------------------------------------- merging reports

def _pool_times(reports: Sequence[dict]) -> dict[str, dict[str, list[float]]]:
    """Every report's compute samples, pooled: {"concurrent"|"alone"|"compute_only": {"0F": [...], ...}}."""
    times: dict[str, dict[str, list[float]]] = {"concurrent": {}, "alone": {}, "compute_only": {}}
    for r in reports:
        for kind in times:
            for k, v in r.get(kind, {}).items():
                times[kind].setdefault(k, []).extend(v)
    return times


def _comm(reports: Sequence[dict]) -> dict | None:
    """Rank 0's communication measurements, with rank 1's posts and waits beside them, and
    the fit of the isend call's CPU time to the message size."""
    comm = next((r["comm"] for r in reports if r["rank"] == 0 and r["comm"]), None)
    comm1 = next((r["comm"] for r in reports if r["rank"] == 1 and r["comm"]), None)
    if comm is not None and comm1 is not None:
        comm = {**comm, "irecv_post": comm1.get("irecv_post"), "wait_ready": comm1.get("wait_ready"),
                "busy_rank1": comm1.get("busy")}
    if comm is not None and comm.get("isend_post") and all(t is not None for t in comm["isend_post"]):
        # the CPU time of the isend call itself grows with the message: gloo writes the
        # data to the socket inside isend when the receive is already posted
        fixed, rate = fit_latency_bandwidth(comm["sizes"], comm["isend_post"])
        comm = {**comm, "isend_post_fit": {"fixed_s": fixed, "bytes_per_s": rate}}
    return comm


def _call_costs(reports: Sequence[dict]) -> dict[str, float]:
    """The CPU time of the isend and irecv calls inside a step, of taking data in, and the
    I/O thread's tick: means over every round of ranks 0 and 1 (a step's length adds them
    up, so the expected value is what counts)."""
    busy = [r["comm"]["busy"] for r in reports if r["comm"] and r["comm"].get("busy")]
    return {
        "send_overhead": statistics.fmean(b["isend_busy_mean"] for b in busy) if busy else 0.0,
        "recv_overhead": statistics.fmean(b["irecv_busy_mean"] for b in busy) if busy else 0.0,
        # a difference of two timings: below the noise it can come out negative; the cost cannot
        "arrive_overhead": max(0.0, statistics.fmean(b["arrive_busy_mean"] for b in busy)) if busy else 0.0,
        # rule 10: a late ready notice waits for a computing sender's transport thread
        "io_tick": io_tick_from([r["comm"]["late"] for r in reports if r["comm"] and r["comm"].get("late")]),
    }


def _grad_reduce(reports: Sequence[dict], stages: int) -> dict[str, list[float]]:
    """`grad_reduce` per stage: the mean of every report's samples for it (every replica,
    every round; `exec.measure.calibrate.reduce_times`), 0 for a stage without any; nothing
    where no report timed a reduction."""
    samples: dict[int, list[float]] = {}
    for r in reports:
        for s, v in (r.get("grad_reduce") or {}).items():
            samples.setdefault(int(s), []).extend(v)
    if not samples:
        return {}
    return {"grad_reduce": [statistics.fmean(samples[s]) if samples.get(s) else 0.0 for s in range(stages)]}


def _memory_costs(memory: dict[int, dict], stages: int) -> dict[str, list[float]]:
    """The per-stage memory fields of `sim.Costs` from the reports' memory."""
    fields = ("activation_bytes_sent",) + HELD_FIELDS + STATIC_FIELDS
    return {f: [memory[s][f] for s in range(stages)] for f in fields}


def _compute_costs(mean: dict[str, float], stages: int) -> dict[str, list[float]]:
    """The compute-time fields of `sim.Costs` from the mean times ("0F", "1B", ...): each
    kind's per-stage times go to the field its `cost` in `sim.schedule.kinds.KINDS` names.
    The split backward's I and W are B in two: a stage that ran no B gets B = I + W; where
    the schedule splits the backward, a stage that ran only B gets half of it each (the
    default of `sim.Costs`). A kind that no stage ran has no field."""
    times = {k: [mean.get(f"{s}{k.value}") for s in range(stages)] for k in COMPUTE}
    i, w = times[Kind.I], times[Kind.W]
    b = times[Kind.B] = [x if x is not None else i[s] + w[s] for s, x in enumerate(times[Kind.B])]
    if any(x is not None for x in i):
        for k in (Kind.I, Kind.W):
            times[k] = [x if x is not None else b[s] / 2 for s, x in enumerate(times[k])]
    return {KINDS[k].cost: v for k, v in times.items() if all(x is not None for x in v)}


def costs_from_reports(reports: Sequence[dict], schedule: sim.Schedule, use: str = "concurrent",
                       transfer: tuple[float, float] | None = None) -> tuple[sim.Costs, dict]:
    """Merge `exec.measure.calibrate.calibrate_rank` reports (every rank's, from one or several
    rounds) into `sim.Costs` and a details dict. Compute times: the mean of all samples
    of `use` ("concurrent" or "alone"); transfers: `transfer` = (latency, bandwidth) if
    given, else the least-squares fit of the ping-pong (free transfers if there was none)."""
    if use not in ("concurrent", "alone"):
        raise ValueError(f"use must be 'concurrent' or 'alone', got {use!r}")
    stages = schedule.stages
    memory = {int(s): m for r in reports for s, m in r["memory"].items()}
    times = _pool_times(reports)
    med = {kind: {k: statistics.median(v) for k, v in d.items()} for kind, d in times.items()}
    mean = {kind: {k: statistics.fmean(v) for k, v in d.items()} for kind, d in times.items()}
    missing = [f"{s}{k}" for s in range(stages) for k in ("F", "B" if f"{s}I" not in med[use] else "W")
               if f"{s}{k}" not in med[use]]
    if missing or set(memory) != set(range(stages)):
        raise ValueError(f"the reports lack stages' measurements ({', '.join(missing) or 'memory'}); "
                         f"pass every rank's calibrate_rank report")
    comm = _comm(reports)
    if transfer is not None:
        latency, bandwidth = transfer
    elif comm is not None and comm.get("sizes"):
        latency, bandwidth = fit_latency_bandwidth(comm["sizes"], comm["one_way"])
    else:
        latency, bandwidth = 0.0, math.inf
    # rule 11: the runtime's own time around a compute, the mean over every compute timed
    own = {k: [v for r in reports for v in r.get("runtime", {}).get(use, {}).get(k, [])] for k in ("before", "after")}
    before, after = (statistics.fmean(own[k]) if own[k] else 0.0 for k in ("before", "after"))
    # a step's length adds compute times up: the simulator takes their expected value (the
    # mean, stalls included), not the median
    # rule 19: "concurrent" computes are timed inside real steps, so they hold what taking in
    # the data that arrives during them costs (no arrive_overhead on top), and each step's
    # first compute's excess comes apart (`first_compute`); "alone" ones run compute-only
    calls, firsts = _call_costs(reports), [x for r in reports for x in r.get("first", [])]
    in_step = use == "concurrent"
    costs = sim.Costs(
        **_compute_costs(mean[use], stages), latency=latency, bandwidth=bandwidth, before_compute=before,
        after_compute=after, **{**calls, "arrive_overhead": 0.0 if in_step else calls["arrive_overhead"]},
        first_compute=max(0.0, statistics.fmean(firsts)) if in_step and firsts else 0.0,  # (a difference: noise)
        **_memory_costs(memory, stages), **_grad_reduce(reports, stages))
    # how much slower a compute runs while every rank computes than while it runs alone
    slowdown = {k: med["concurrent"][k] / med["alone"][k] for k in med["alone"] if k in med["concurrent"]}
    details = {
        "schedule": schedule.name, "stages": stages, "micro_batches": schedule.micro_batches, "use": use,
        "threads": sorted({r["threads"] for r in reports}),
        "compute_samples": times, "compute_median": med, "compute_mean": mean, "slowdown": slowdown,
        "slowdown_median": statistics.median(slowdown.values()) if slowdown else None,
        "memory": memory, "comm": comm, "latency": latency, "bandwidth": bandwidth,
        "runtime": own, "runtime_median": {k: statistics.median(v) if v else None for k, v in own.items()},
        "first_compute": firsts, "arrive_overhead_measured": calls["arrive_overhead"],
    }
    return costs, details
