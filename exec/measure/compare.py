"""Measured against simulated: does the simulator predict the step that really ran?

    >>> cmp = compare(measured, costs)          # measured: a sim.Result from exec.runtime.step
    >>> print(cmp.table()); cmp.as_json()["error_pct"]

`compare` simulates `measured.schedule` under `costs` (from `exec.measure.costs`) and puts the
two steps side by side: step time and its error in percent ((sim - meas) / meas * 100),
bubble fraction, peak activations and peak memory per rank. `breakdown` goes one level
down, to explain an error: per stage, the measured F and B against their costs, and per
rank, where the measured step's time went (compute, waiting for data, and the rest:
the runtime's own time between actions: its calls and its work around each compute,
which the simulator models by rules 2, 3 and 11).
"""
from __future__ import annotations

import os
import statistics
from dataclasses import dataclass, field
from typing import Any, Sequence

import sim
from sim.schedule.kinds import KINDS, Role

from exec.runtime.rank_program import waits_of

__all__ = ["Comparison", "compare", "breakdown", "sharing_check", "replay_error", "replay_median", "overlay_figure"]


@dataclass
class Comparison:
    """A measured step and its simulation under the profiled costs."""

    measured: sim.Result
    simulated: sim.Result
    costs: sim.Costs
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. grad_match, max_grad_diff

    @property
    def measured_step_s(self) -> float:
        return self.measured.makespan

    @property
    def simulated_step_s(self) -> float:
        return self.simulated.makespan

    @property
    def error_pct(self) -> float:
        """(simulated - measured) / measured * 100: positive when the simulator is slower."""
        m = self.measured.makespan
        return (self.simulated.makespan - m) / m * 100.0 if m > 0 else 0.0

    def as_json(self) -> dict:
        """The comparison as plain JSON data."""
        s = self.measured.schedule
        return {
            "schedule": s.name, "stages": s.stages, "ranks": s.ranks, "micro_batches": s.micro_batches,
            "measured_step_s": self.measured_step_s, "simulated_step_s": self.simulated_step_s,
            "error_pct": self.error_pct,
            "measured_bubble": self.measured.bubble_fraction, "simulated_bubble": self.simulated.bubble_fraction,
            "measured_peak_activations": self.measured.peak_activations,
            "simulated_peak_activations": self.simulated.peak_activations,
            "measured_peak_memory": self.measured.peak_memory,
            "simulated_peak_memory": self.simulated.peak_memory,
            **self.extra,
        }

    def table(self) -> str:
        """A small text table: one row per quantity, measured and simulated side by side."""
        s = self.measured.schedule
        rows = [
            ("step time (ms)", f"{self.measured_step_s * 1e3:.2f}", f"{self.simulated_step_s * 1e3:.2f}"),
            ("bubble fraction", f"{self.measured.bubble_fraction:.3f}", f"{self.simulated.bubble_fraction:.3f}"),
            ("peak activations", _ints(self.measured.peak_activations), _ints(self.simulated.peak_activations)),
            ("peak memory (MiB)", _mib(self.measured.peak_memory), _mib(self.simulated.peak_memory)),
        ]
        rows += [(k, str(v), "") for k, v in self.extra.items()]
        w = max(len(r[0]) for r in rows)
        head = f"{s.name}: {s.stages} stages on {s.ranks} ranks, {s.micro_batches} micro-batches; " \
               f"error {self.error_pct:+.2f}%"
        lines = [head, f"{'':<{w}}  {'measured':>16}  {'simulated':>16}"]
        lines += [f"{a:<{w}}  {b:>16}  {c:>16}" for a, b, c in rows]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def _ints(xs) -> str:
    return " ".join(str(int(x)) for x in xs)


def _mib(xs) -> str:
    return " ".join(f"{x / 2**20:.1f}" for x in xs)


def compare(measured: sim.Result, costs: sim.Costs, **extra: Any) -> Comparison:
    """Simulate `measured.schedule` under `costs` and compare it with the measured step.
    Keyword arguments are kept in `Comparison.extra` (and in `as_json`)."""
    if not measured.events:
        raise ValueError("the measured Result has no events; expected a step recorded by exec.runtime.step.run_step")
    simulated = sim.simulate(measured.schedule, costs)
    return Comparison(measured, simulated, costs, dict(extra))


def breakdown(result: sim.Result, costs: sim.Costs | None = None) -> dict:
    """Where a step's time went, per rank and per stage.

    Per rank: `compute` (sum of F/B/I/W), `wait` (time between two computes during which
    the next compute's input had not arrived yet), `overhead` (the rest of the gaps
    before and between computes: time the runtime spends on itself, posting sends and
    receives, python; in a simulation, the calls and the time around each compute of
    rule 11, zero where those costs are), `tail` (from the rank's last compute to the
    end of the step), the number of actions, and `free_gap_median`: the median gap between
    two computes where the second had nothing to wait for (the runtime's cost per action
    between computes, measured directly). Per stage and kind: the median duration, and with `costs` its
    ratio to the cost the simulator uses. What each compute waits for is the program's
    (`Result.program`, the step's compiled program; `sim.compile` of a step read back without one)."""
    sched = result.schedule
    t0, t1 = result.t0, result.t0 + result.makespan
    arrivals = {e.action: e.end for e in result.events if KINDS[e.action.kind].role is Role.RECV}
    waits = _waits(result)
    ranks = []
    for r in range(sched.ranks):
        comp = result.compute_events(r)
        busy = sum(e.duration for e in comp)
        wait, prev_end, free_gaps = 0.0, t0, []
        for i, e in enumerate(comp):
            remote = waits[e.action]
            ready = max([prev_end] + [arrivals[x] for x in remote if x in arrivals])
            wait += max(0.0, min(ready, e.start) - prev_end)
            if i > 0 and ready <= prev_end:  # nothing to wait for: the gap is the runtime's own time
                free_gaps.append(e.start - prev_end)
            prev_end = e.end
        tail = t1 - prev_end
        overhead = (t1 - t0) - busy - wait - tail
        ranks.append({"rank": r, "compute": busy, "wait": wait, "overhead": overhead, "tail": tail,
                      "free_gap_median": statistics.median(free_gaps) if free_gaps else None,
                      "free_gaps": len(free_gaps),
                      "actions": len(sched.programs[r]), "computes": len(comp)})
    per_action: dict[str, dict] = {}
    by_key: dict[tuple[int, str], list[float]] = {}
    for e in result.events:
        if e.action.kind.is_compute:
            by_key.setdefault((e.action.stage, e.action.kind.value), []).append(e.duration)
    c = costs.for_stages(sched.stages) if costs is not None else None
    for (s, k), ds in sorted(by_key.items()):
        entry = {"median": statistics.median(ds), "min": min(ds), "max": max(ds), "n": len(ds)}
        if c is not None:
            entry["cost"] = getattr(c, KINDS[sim.Kind(k)].cost)[s]
            entry["ratio"] = entry["median"] / entry["cost"] if entry["cost"] > 0 else float("nan")
        per_action[f"{s}{k}"] = entry
    return {"makespan": result.makespan, "ranks": ranks, "actions": per_action}


def _waits(result: sim.Result) -> dict[sim.Action, list[sim.Action]]:
    """Compute action -> the RECVs it waits for, as the step's program numbers them: its
    one transfer, where its input comes from another rank."""
    program = result.program if result.program is not None else sim.compile(result.schedule)
    return {a: waits_of(program, i) for i, a in enumerate(program.actions)}


def overlay_figure(comparison: Comparison, path: str | os.PathLike | None = None):
    """The measured step drawn over the simulated one (`sim.plot.plot_overlay`); saved
    as PNG to `path` if given (`sim.plot.save_figure`), else returned."""
    from sim.plot.gantt import plot_overlay, save_figure
    fig = plot_overlay(comparison.simulated, comparison.measured)
    if path is None:
        return fig
    save_figure(fig, path)
    return None


def sharing_check(result: sim.Result, alone: sim.Costs, concurrent: sim.Costs) -> dict:
    """Test the rule "ranks on one host share it: a compute runs at its *alone* speed
    while no other rank computes, and at its *concurrent* speed while another does"
    (processor sharing) on a measured step, action by action.

    For each compute, `o` = the time another rank computed during it (from the measured
    events); under the rule, its duration is `d = alone + o * (1 - alone / concurrent)`
    (the work done alone plus the work done shared adds up to one action). Returns the
    median relative error of three predictions of the measured durations: a fixed
    concurrent cost, a fixed alone cost (the simulator's rule today, with either
    calibration), and the sharing rule; and the median share of each compute overlapped."""
    sched = result.schedule
    a, c = alone.for_stages(sched.stages), concurrent.for_stages(sched.stages)
    comp = [e for e in result.events if e.action.kind.is_compute]
    err = {"concurrent": [], "alone": [], "sharing": []}
    shares = []
    for e in comp:
        if e.duration <= 0:
            continue
        o = sum(max(0.0, min(e.end, x.end) - max(e.start, x.start)) for x in comp if x.rank != e.rank)
        o = min(o, e.duration)
        field = KINDS[e.action.kind].cost
        ta, tc = getattr(a, field)[e.action.stage], getattr(c, field)[e.action.stage]
        pred = ta + o * (1 - ta / tc) if tc > 0 else ta
        for name, p in (("concurrent", tc), ("alone", ta), ("sharing", pred)):
            err[name].append(abs(p - e.duration) / e.duration)
        shares.append(o / e.duration)
    out = {f"{k}_median_abs_err": statistics.median(v) if v else None for k, v in err.items()}
    out["overlap_share_median"] = statistics.median(shares) if shares else None
    return out


def replay_error(result: sim.Result, costs: sim.Costs) -> float:
    """The rules alone against a measured step, in % of it: simulate the step's schedule
    with `costs`, but every compute action taking the time it took in this very step
    (`sim.simulate(..., durations=)`). What is left is what the communication and runtime
    rules (docs/rules.md) miss or add, free of the compute times drifting between
    calibration and step (which the plain error also contains)."""
    durations = {e.action: e.duration for e in result.events if e.action.kind.is_compute}
    return (sim.simulate(result.schedule, costs, durations=durations).makespan - result.makespan) / result.makespan * 100


def replay_median(results: Sequence[sim.Result], costs: sim.Costs) -> float:
    """The median over measured steps of `replay_error`: the statistic that stays put when
    other processes take part of the machine (docs/exec.md, "Which statistic"), since each
    step is simulated with the compute times it had itself, not ones taken seconds apart."""
    if not results:
        raise ValueError("no measured steps to replay")
    return statistics.median(replay_error(r, costs) for r in results)
