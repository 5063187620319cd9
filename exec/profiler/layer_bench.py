"""A transformer block's passes and the model's ends as a pipeline step runs them: the profile's `layers` tables.

A block's kernels timed one by one, each in a loop of its own, run 5-30 % faster than the
same kernels inside a step, where each meets its inputs cold after the step's other passes
(docs/validation.md, "Kernels in a loop and in a step"). So the profiler also times whole
blocks as exec's calibration times a run's computes (`exec.measure.calibrate.step_compute_times`):
inside training steps on 2 ranks, every rank at once, with their transfers and the
interpreter's own handlers, each step's first compute left out (rules 11 and 19 are the
profile's `host_transport`). A rank's stage holds the embedding or the head and n blocks;
per stage and pass, the least-squares line through its median time at n = 1, 2, 3 gives a
block's time (the slope) and what the stage adds beyond its blocks (the intercept: the
embedding, or the final norm, head and loss, with the stage's fixed cost). F and B come from
a 1F1B step, I and W from a ZB-H1 step's second stage (on the first, torch's split backward
leaves I empty and W the whole backward: docs/rules.md, rule 15). A configuration whose three
stage times are off a line (`BENT`) met a slow minute in one of them: it is timed again (`_timed`).
"""
from __future__ import annotations

import statistics
from typing import Callable, Iterable

import sim
import torch.distributed as dist
from exec.measure.calibrate import step_compute_times
from exec.models.cuts import end_bounds
from exec.models.spec import ModelSpec
from sim.hardware.layer_table import BLOCK_PASSES, END_PASSES

__all__ = ["MICRO_BATCHES", "BLOCK_COUNTS", "layer_rows", "stage_medians", "fit_line", "HOW"]

MICRO_BATCHES = 4  # micro-batches of each timed step
BENT, RETRIES = 0.10, 2  # a stage's three times this far off a line are timed again, at most this many times
BLOCK_COUNTS = (1, 2, 3)  # blocks a stage: the line through the three gives a block's time and the ends'
HOW = ("blocks: a pass's slope, ends: its intercept, of the least-squares line through a stage's median compute "
       "time at 1, 2 and 3 blocks a stage: exec.measure.calibrate.step_compute_times on 2 ranks at once, F and B of a "
       "1F1B step (blocks: both stages' mean), I and W of a ZB-H1 step's second stage (exec.profiler.layer_bench)")


def stage_medians(ctx, model: sim.Transformer, micro_batch: int, recompute: str, blocks: int, schedule: str,
                   steps: int, firsts: list | None = None, optimizers: list | None = None) -> dict[tuple[int, str], float]:
    """{(stage, kind): median seconds} of the computes inside `schedule` steps of the GPT with
    `blocks` blocks on each of 2 stages (the embedding on the first, the head on the last),
    both ranks' stages. Appends to `firsts` each rank's (d, excess): its first compute's median
    duration (a forward of its stage: 1F1B and ZB-H1 start with one) and that compute's median
    excess in a step's first place (rule 19); and to `optimizers` each rank's (parameter tensors,
    parameters, median seconds) of its optimizer step (AdamW) inside those steps."""
    spec = ModelSpec("gpt", layers=2 * blocks, hidden=model.hidden, heads=model.heads, seq=model.seq,
                     vocab=model.vocab, ffn=(model.ffn,) * (2 * blocks), batch_size=micro_batch * MICRO_BATCHES,
                     recompute=recompute)
    program = sim.compile(sim.make_schedule(schedule, 2, MICRO_BATCHES), "gloo")
    opt: list = []
    samples, excess = step_compute_times(ctx, spec, end_bounds(spec, [blocks, blocks]), program, MICRO_BATCHES, steps,
                                         optimizer="adamw", optimizer_times=opt)
    mine = {key: statistics.median(v) for key, v in samples.items()}
    first = (mine[(ctx.rank, "F")], statistics.median(excess)) if excess else None
    step = (*opt[0][1:], statistics.median(t for t, *_ in opt)) if opt else None
    both: list = [None] * ctx.world_size
    dist.all_gather_object(both, (mine, first, step))  # each rank times its own stage
    if firsts is not None:
        firsts.extend(f for _, f, _ in both if f is not None)
    if optimizers is not None:
        optimizers.extend(o for _, _, o in both if o is not None)
    return {key: v for medians, _, _ in both for key, v in medians.items()}


def fit_line(points: list[tuple[int, float]]) -> tuple[float, float]:
    """(intercept, slope) of the least-squares line through (blocks, seconds) points."""
    n = len(points)
    mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    slope = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)
    return my - slope * mx, slope


def _bend(times: list[float]) -> float:
    """How far a stage's median times at 1, 2 and 3 blocks are from a line: the middle one's
    distance from the mean of the outer two, over it (0 on a line)."""
    return abs(times[1] - (times[0] + times[2]) / 2) / times[1]


def _passes(ctx, model: sim.Transformer, micro_batch: int, recompute: str, steps: int,
            firsts: list | None = None, optimizers: list | None = None) -> tuple[dict, dict, float]:
    """({"F", "B", "I", "W": s} of one block, {"first_F", "first_B", "last_F", "last_B",
    "last_I", "last_W": s} of the ends, the largest `_bend`), the same on both ranks: per stage
    and kind, the line through its median time at `BLOCK_COUNTS` blocks a stage, its slope the
    block's, its intercept what the stage adds beyond its blocks. Each step's first computes go
    to `firsts`, its optimizer steps to `optimizers` (`stage_medians`)."""
    block, ends, bend = {}, {}, 0.0
    for schedule, kinds, stages in (("1f1b", ("F", "B"), (0, 1)), ("zb-h1", ("I", "W"), (1,))):
        medians = {n: stage_medians(ctx, model, micro_batch, recompute, n, schedule, steps, firsts, optimizers)
                   for n in BLOCK_COUNTS}
        for kind in kinds:
            lines = {s: fit_line([(n, medians[n][(s, kind)]) for n in BLOCK_COUNTS]) for s in stages}
            block[kind] = statistics.fmean(slope for _, slope in lines.values())
            ends |= {f"{'first' if s == 0 else 'last'}_{kind}": a for s, (a, _) in lines.items()}
            bend = max([bend] + [_bend([medians[n][(s, kind)] for n in BLOCK_COUNTS]) for s in stages])
    return block, ends, bend


def _timed(ctx, model: sim.Transformer, micro_batch: int, recompute: str, steps: int, firsts: list,
           optimizers: list, say: Callable[[str], None]) -> tuple[dict, dict]:
    """`_passes`, timed again (up to `RETRIES` times) where a stage's three times are off a line
    by more than `BENT`: one of the three stage sizes met a slow minute of the VM, and the line
    through them would take it as a steeper block and a cheaper end (docs/validation.md,
    "One profile, many shapes"). Keeps the straightest of the tries; both ranks decide alike (they share
    the medians). (An end at 0 is no sign: some ends are that small, and their intercepts
    scatter around 0 on a straight line.)"""
    tries = []
    for _ in range(1 + RETRIES):
        block, ends, bend = _passes(ctx, model, micro_batch, recompute, steps, firsts, optimizers)
        tries.append((bend, block, ends))
        if bend <= BENT:
            break
        say(f"block at micro-batch {micro_batch}, recompute {recompute}: its stages are off a line by "
            f"{bend * 100:.0f} %; timing it again")
    _, block, ends = min(tries, key=lambda t: t[0])
    return block, ends


def layer_rows(ctx, model: sim.Transformer, micro_batches: Iterable[int], recomputes=("none", "full"),
               steps: int = 3, say: Callable[[str], None] = lambda text: None) -> dict[str, list[list]]:
    """{"blocks": [[precision, hidden, heads, ffn, seq, micro_batch, recompute, F, B, I, W]],
    "ends": [[precision, hidden, seq, vocab, micro_batch, first_F, first_B, last_F, last_B,
    last_I, last_W]], "first": [[d, excess]], "optimizer": [[tensors, parameters, seconds]]}
    (seconds; call on both ranks of a world of 2 at once): one block of
    `model` (a `sim.Transformer` of exec's GPT) at each micro-batch size and recompute mode,
    and its ends at each micro-batch size (from the runs without recompute: the ends are
    never recomputed). A time below the clock's resolution is kept at 1 ns (the tables hold
    positive times), and every configuration's first computes, per rank: their median duration
    and their median excess as a step's first (rule 19; `exec.profiler.host_bench.first_compute_law`
    fits its law to them), and every configuration's AdamW step, per rank, inside those steps
    (`exec.profiler.assemble` takes its cost per parameter tensor from them). One untimed step
    runs first (a cold first measurement is slower)."""
    if ctx.world_size != 2:
        raise ValueError(f"the layer table times a 2-stage step: run it on 2 ranks, not {ctx.world_size}")
    out = {"blocks": [], "ends": [], "first": [], "optimizer": []}
    micro_batches = list(micro_batches)
    # the process's first steps run cold (the allocator's pools, torch's threads, the caches):
    # one untimed step first, or the first row's F comes out slower than the same block's later
    stage_medians(ctx, model, micro_batches[0], recomputes[0], max(BLOCK_COUNTS), "1f1b", 1)
    for b in micro_batches:
        for recompute in recomputes:
            t, ends = _timed(ctx, model, b, recompute, steps, out["first"], out["optimizer"], say)
            out["blocks"].append(["fp32", model.hidden, model.heads, model.ffn, model.seq, b, recompute,
                                  *(max(t[k], 1e-9) for k in BLOCK_PASSES)])
            if recompute == "none":
                out["ends"].append(["fp32", model.hidden, model.seq, model.vocab, b,
                                    *(max(ends[k], 1e-9) for k in END_PASSES)])
            say(f"block at micro-batch {b}, recompute {recompute}: F {t['F'] * 1e3:.2f} ms, B {t['B'] * 1e3:.2f} ms, "
                f"I {t['I'] * 1e3:.2f} ms, W {t['W'] * 1e3:.2f} ms")
    return out
