"""What exec's runtime on gloo CPU ranks costs its own cores around transfers and computes: the profile's `host_transport` (docs/profiles.md).

`host_costs` runs inside every rank of `exec.profile_device`'s launch, with exec's own
calibration (`exec.measure`), so the profile's numbers are the ones `exec.measure.costs` gives
a run's `sim.Costs`:

- `exec.measure.calibrate_link.call_costs` on ranks 0 and 1: the isend, irecv and arrival
  calls (`send_overhead`, `recv_overhead`, `arrive_overhead`; docs/rules.md rules 2, 3, 9),
  for a message of one micro-batch's activation;
- `exec.measure.calibrate_link.late_notice` on ranks 0 and 1: the late notice's wait
  (`io_tick`, rule 10, by `exec.measure.costs.io_tick_from`);
- `exec.measure.calibrate.compute_times` on every rank: the runtime's own time before and
  after each compute of a 1F1B step of the GPT cut into one stage a rank (rule 11);
- `exec.measure.calibrate.step_compute_times` on every rank: how much longer a step's first
  compute takes than the rest of its kind, in training steps of the profile's model as exec
  runs them, 1F1B over the ranks (`first_compute`, rule 19). Where the profile also times
  blocks (`exec.profiler.layer_bench`), their steps give that excess at many first computes'
  durations d, and `first_compute_law` fits rule 19's recovery to them: the excess is
  most x (1 - exp(-d / tau)), `first_compute` the most and `first_compute_tau` tau.

The blocks are timed inside steps (`exec.profiler.layer_bench`), so what taking in arrived data
costs a compute is in their times: `arrive_overhead` is 0 (rule 19), though `call_costs`
still times it over small matmuls (its report keeps it).

`host_transport` merges the ranks' reports as `exec.measure.costs` does (the means).
"""
from __future__ import annotations

import math
import statistics

import sim
from exec.measure.calibrate import compute_times, step_compute_times
from exec.measure.calibrate_link import call_costs, late_notice
from exec.measure.costs import io_tick_from
from exec.models.spec import ModelSpec
from sim.engine.core import first_excess

__all__ = ["host_costs", "host_transport", "first_compute_law", "HOW", "LAW_HOW"]

HOW = {"send_overhead": "mean CPU time of exec's isend call inside a step (exec.measure.calibrate_link.call_costs), "
                        "ranks 0 and 1",
       "recv_overhead": "mean CPU time of an irecv post inside a step (exec.measure.calibrate_link.call_costs), "
                        "ranks 0 and 1",
       "arrive_overhead": "0: inside the blocks' times, which exec.profiler.layer_bench takes inside steps "
                          "(docs/rules.md, rule 19)",
       "io_tick": "twice the median extra wait of a late notice to a computing sender "
                  "(exec.measure.calibrate_link.late_notice, exec.measure.costs.io_tick_from)",
       "before_compute": "mean runtime time from a compute's handler to its start mark "
                         "(exec.measure.calibrate.compute_times, 1F1B, every rank)",
       "after_compute": "mean runtime time from a compute's end mark to leaving its handler "
                        "(exec.measure.calibrate.compute_times, 1F1B, every rank)",
       "first_compute": "mean excess of a step's first compute over the median of its stage and kind, in "
                        "training steps of the profile's model, 1F1B over the ranks, AdamW "
                        "(exec.measure.calibrate.step_compute_times, every rank)",
       "first_compute_tau": "0: the excess taken as it is, whatever the first compute's duration"}
LAW_HOW = {"first_compute": "most of rule 19's law, excess = most x (1 - exp(-d / tau)): least squares over the "
                            "layer bench's steps (per configuration and rank: the first compute's median "
                            "duration d and its median excess; exec.profiler.layer_bench, "
                            "exec.profiler.host_bench.first_compute_law)",
           "first_compute_tau": "tau of rule 19's law, excess = most x (1 - exp(-d / tau)), fitted with most "
                                "(exec.profiler.host_bench.first_compute_law)"}
TAUS = tuple(1e-4 * 1.05 ** k for k in range(190))  # 0.1 ms .. about 1 s: where the law's tau is looked for


def host_costs(ctx, model: sim.Transformer, micro_batch: int, repeats: int, steps: int) -> dict:
    """This rank's samples (call on every rank at once): the call costs and late notices
    (ranks 0 and 1; {} on the others) and the runtime's time around its computes."""
    ranks = ctx.world_size
    layers = max(1, ranks - 2)  # the GPT's embedding, blocks and head: a stage a rank
    spec = ModelSpec("gpt", layers=layers, hidden=model.hidden, heads=model.heads, seq=model.seq,
                     vocab=model.vocab, ffn=(model.ffn,) * layers, batch_size=micro_batch * ranks)
    program = sim.compile(sim.make_schedule("1f1b", ranks, ranks), "gloo")  # its computes, in 1F1B order
    _, own = compute_times(ctx, spec, spec.partition(ranks), program, ranks, steps, alone=False)
    whole = ModelSpec("gpt", layers=model.layers, hidden=model.hidden, heads=model.heads, seq=model.seq,
                      vocab=model.vocab, ffn=(model.ffn,) * model.layers, batch_size=micro_batch * 2 * ranks)
    steps_program = sim.compile(sim.make_schedule("1f1b", ranks, 2 * ranks), "gloo")
    _, firsts = step_compute_times(ctx, whole, whole.partition(ranks), steps_program,
                                   2 * ranks, steps, optimizer="adamw")
    activation = micro_batch * model.seq * model.hidden * 4  # fp32 (exec.measure.calibrate.activation_message_bytes)
    return {"busy": call_costs(ctx, activation, repeats), "late": late_notice(ctx, max(4, repeats // 2)), **own,
            "first": firsts}


def host_transport(reports: list[dict]) -> dict[str, float]:
    """The eight `sim.Costs` fields from every rank's `host_costs` report: means over ranks 0
    and 1 of their calls' means, `io_tick_from` their late notices, means over every
    compute of the runtime's own time and over every step's first compute's excess (at
    least 0, whatever the first compute's duration: `first_compute_tau` 0; arrive_overhead 0:
    rule 19)."""
    busy = [r["busy"] for r in reports if r.get("busy")]
    late = [r["late"] for r in reports if r.get("late")]
    if not busy or not late:
        raise ValueError("host_transport needs the reports of ranks 0 and 1")
    return {"send_overhead": statistics.fmean(b["isend_busy_mean"] for b in busy),
            "recv_overhead": statistics.fmean(b["irecv_busy_mean"] for b in busy),
            "arrive_overhead": 0.0,  # inside the blocks' in-step times (rule 19)
            "io_tick": io_tick_from(late),
            "before_compute": statistics.fmean(v for r in reports for v in r["before"]),
            "after_compute": statistics.fmean(v for r in reports for v in r["after"]),
            # a difference of two timings: below the noise it can come out negative; the cost cannot
            "first_compute": max(0.0, statistics.fmean(v for r in reports for v in r["first"])),
            "first_compute_tau": 0.0}


def first_compute_law(points: list[tuple[float, float]]) -> tuple[float, float, float]:
    """(most, tau, rms residual), seconds: rule 19's recovery, excess = most x (1 - exp(-d / tau)),
    fitted to (d, excess) points by least squares: for each tau of `TAUS` the best `most` has a
    closed form (a line through 0 in 1 - exp(-d / tau)); the tau with the least residual wins.
    ValueError with fewer than 3 points or all at one duration (tau is then not determined)."""
    if len(points) < 3 or len({d for d, _ in points}) < 2:
        raise ValueError("the first compute's law needs 3 points or more at 2 durations or more")
    best = None
    for tau in TAUS:
        g = [first_excess(1.0, tau, d) for d, _ in points]  # the engine's law (sim.engine.core), per unit of most
        most = max(0.0, sum(gi * y for gi, (_, y) in zip(g, points)) / sum(gi * gi for gi in g))
        sq = sum((y - most * gi) ** 2 for gi, (_, y) in zip(g, points))
        if best is None or sq < best[0]:
            best = (sq, most, tau)
    sq, most, tau = best
    return most, tau, math.sqrt(sq / len(points))
