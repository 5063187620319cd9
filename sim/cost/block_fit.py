"""One profile, many shapes: a pass the profile did not measure, timed as its kernels run inside a step, fitted on the blocks it did measure.

A block of exec's GPT measured inside a step (`sim.hardware.layer_table`) takes longer than
the kernel model's sum of its kernels, each timed alone in a loop, plus the profile's launch
cost per kernel: on this project's 2-core CPU by 8 to 47 % over hidden 64-256, sequence
32-128 and micro-batches 4 and 8, most on the smallest shapes (docs/validation.md, "One
profile, many shapes"). Two causes, each one physical number per pass kind (F, B, I, W) and
recompute mode:

- `slowdown`: the kernels' device time inside a step over their time alone in a loop
  (inputs cold in the caches, two ranks sharing the memory bandwidth);
- `per_kernel`: the host's seconds per listed kernel inside a step (torch's autograd engine,
  exec's hooks and Python around each op), which replaces the profile's `launch.per_kernel`
  (the same kernels timed at almost no work, outside a step).

A pass then takes `slowdown x device + per_kernel x kernels` (`InStep.time`). `fit` finds the
two by least squares of the relative error over the measured blocks of one precision without
recompute, every shape and micro-batch the profile has, and the fit holds for every
recompute mode (recompute runs the same kernels again, which the kernel model lists). What
the recompute wrapper (torch.utils.checkpoint) costs a pass beyond its kernels is host work
that does not scale with the shape (`recompute_cost`, taken at the smallest block the profile
measured both ways); an unmeasured block with recompute keeps it as it is.

Two numbers per pass do not hold across shapes: the smallest shapes run slower than a line
fitted through larger ones says (hidden 64 with 2 heads, 16-23 % short under a fit on hidden
128: docs/validation.md, "One profile, many shapes"). So an unmeasured block takes the fit
times what the fit missed at the nearest block the profile measured (`nearest_block`,
log-distance over hidden, heads, FFN, sequence and micro-batch): measured over fitted, per pass. `exec.profile_device`
measures blocks at a quarter, half and twice the profiled shape for that reason. The planner uses
this only where the table has no row (a measured block keeps its own times, exactly:
`sim.cost.layer.layer_times`). The model's ends at an unmeasured shape take their kernels
under their pass kind's fit plus what a first or last stage costs a compute beyond its
kernels, the mean over the measured ends (`stage_costs`; `sim.cost.ends.end_times`).

    >>> f = fit([(1.0, 10, 1.2 + 10 * 2e-3), (2.0, 10, 2.4 + 10 * 2e-3)], launch=1e-5)
    >>> round(f.slowdown, 6), round(f.per_kernel, 6)
    (1.2, 0.002)
"""
from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, replace
from typing import Callable, Iterable

__all__ = ["InStep", "fit", "in_step_fits", "block_in_step", "recompute_cost", "nearest_block", "ends_in_step", "stage_costs"]


@dataclass(frozen=True)
class InStep:
    """How a pass of listed kernels runs inside a step: its kernels' device time times
    `slowdown`, plus `per_kernel` seconds of host work a kernel; `rows`: the measured passes
    it was fitted on, `residual`: their largest relative error under it."""
    slowdown: float
    per_kernel: float
    rows: int
    residual: float

    def time(self, device: float, kernels: float) -> float:
        """Seconds of a pass whose kernels keep the device `device` seconds, `kernels` of them."""
        return self.slowdown * device + self.per_kernel * kernels


def fit(points: Iterable[tuple[float, float, float]], launch: float) -> InStep | None:
    """The `InStep` of measured passes `points` ((device seconds, kernels, measured seconds),
    device and measured positive): least squares of (slowdown d + per_kernel n) / t - 1 over
    the points, per_kernel at least 0. Where the points cannot separate the two (one point,
    or all with the same d / n), per_kernel is `launch` (the profile's) and slowdown alone is
    fitted. None where there is no point or the slowdown would not be positive."""
    pts = [(d / t, n / t) for d, n, t in points]
    if not pts:
        return None
    sxx, sxy, syy = (sum(a * a for a, _ in pts), sum(a * b for a, b in pts), sum(b * b for _, b in pts))
    sx, sy = sum(a for a, _ in pts), sum(b for _, b in pts)
    det = sxx * syy - sxy * sxy
    if det > 1e-9 * sxx * syy:
        slowdown, per_kernel = (sx * syy - sy * sxy) / det, (sy * sxx - sx * sxy) / det
        if per_kernel < 0:
            slowdown, per_kernel = sx / sxx, 0.0
    else:
        per_kernel = launch
        slowdown = (sx - per_kernel * sxy) / sxx
    if slowdown <= 0:
        return None
    residual = max(abs(slowdown * a + per_kernel * b - 1) for a, b in pts)
    return InStep(slowdown, per_kernel, len(pts), residual)


_CACHE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # profile -> {model key: fits}
PASSES = ("F", "B", "I", "W")


def in_step_fits(m, dev, x, kernel_times: Callable) -> dict[str, InStep]:
    """{pass: `InStep`} fitted on the profile `dev`'s measured blocks of `x`'s precision
    without recompute (each row's kernel model, `kernel_times(model, dev, slice, "none")` -> a
    `sim.cost.layer.LayerTimes`, against its measured passes: every shape and micro-batch the
    table has), {} where it has none; fitted once per profile and model. Recompute runs the
    same kernels again, which the kernel model lists: the fit holds for every mode (the
    measured full-recompute rows, two-block differences of passes twice as long, scatter more:
    docs/validation.md, "One profile, many shapes")."""
    rows = [(k, v) for k, v in dev.layers.blocks.items() if k[0] == x.precision and k[6] == "none"]
    if not rows:
        return {}
    (_, hidden, heads, ffn, seq, *_), _ = rows[0]
    key = (x, replace(m, layers=1, hidden=hidden, heads=heads, ffn=ffn, seq=seq, kv_heads=None))

    def make() -> dict:
        points: dict = {p: [] for p in PASSES}
        for (_, hidden, heads, ffn, seq, b, _), passes in rows:
            shaped = replace(m, layers=1, hidden=hidden, heads=heads, ffn=ffn, seq=seq, kv_heads=None)
            lt = kernel_times(shaped, dev, replace(x, micro_batch=b), "none")
            for p, device in zip(PASSES, (lt.forward, lt.backward, lt.backward_input, lt.backward_weight)):
                points[p].append((device, lt.kernels[p], passes[p]))
        fits = {p: fit(v, dev.launch_per_kernel) for p, v in points.items()}
        return {p: f for p, f in fits.items() if f is not None}

    per = _CACHE.setdefault(dev, {})
    if key not in per:
        per[key] = make()
    return per[key]


def block_in_step(m, dev, x, recompute: str, lt, kernel_times: Callable) -> dict[str, float] | None:
    """{"F", "B", "I", "W": seconds} of a block the profile did not measure: its kernel model
    `lt` (of `recompute`'s kernels) under `in_step_fits`, times what the fit missed at the
    nearest block the profile measured (`nearest_block`: its measured over its fitted passes);
    None where the profile has no fit of every pass. With recompute, where the profile also
    measured that nearest block without it: the kernels times what the fit missed there
    without recompute, plus what the recomputing block took beyond that (the wrapper's own
    host cost, kept as it is at any shape); a measured block comes out as measured."""
    fits = in_step_fits(m, dev, replace(x, micro_batch=1), kernel_times)
    if set(fits) != set(PASSES):
        return None
    fitted = _fitted(fits, lt)
    near = nearest_block(dev, x.precision, recompute, (m.hidden, m.heads, m.ffn, m.seq, x.micro_batch))
    if near is None:
        return fitted
    (_, hidden, heads, ffn, seq, b, mode), row = near
    shaped = replace(m, layers=1, hidden=hidden, heads=heads, ffn=ffn, seq=seq, kv_heads=None)
    at = _fitted(fits, kernel_times(shaped, dev, replace(x, micro_batch=b), mode))
    wrapper = recompute_cost(m, dev, x, mode, kernel_times) if mode != "none" else None
    if not wrapper:
        return {p: fitted[p] * row[p] / at[p] for p in PASSES}
    # the recompute wrapper's own cost stays as it is; the kernels take the nearest block's ratio without it
    return {p: fitted[p] * (row[p] - wrapper[p]) / at[p] + wrapper[p] for p in PASSES}


def recompute_cost(m, dev, x, recompute: str, kernel_times: Callable) -> dict[str, float] | None:
    """{"F", "B", "I", "W": seconds} the recompute wrapper (torch.utils.checkpoint: its
    saved-tensor hooks, the RNG state it keeps and restores) costs a block's pass beyond its
    kernels, the same at any shape: at the smallest block the profile measured with and
    without `recompute` (least work: the host's cost shows most, as `launch.per_kernel` is
    taken at almost no work), the block with recompute less its kernels under the fit, each
    scaled by what the fit missed on the same block without recompute. None where the
    profile measured no such pair."""
    fits = in_step_fits(m, dev, replace(x, micro_batch=1), kernel_times)
    pairs = [(k, v) for k, v in dev.layers.blocks.items()
             if k[0] == x.precision and k[6] == recompute and (*k[:6], "none") in dev.layers.blocks]
    if not pairs or set(fits) != set(PASSES):
        return None
    (_, hidden, heads, ffn, seq, b, _), row = min(pairs, key=lambda r: (r[0][1] * r[0][4] * r[0][5], r[0]))
    shaped, at_b = replace(m, layers=1, hidden=hidden, heads=heads, ffn=ffn, seq=seq, kv_heads=None), replace(x, micro_batch=b)
    plain = dev.layers.blocks[(x.precision, hidden, heads, ffn, seq, b, "none")]
    bare, full = (_fitted(fits, kernel_times(shaped, dev, at_b, mode)) for mode in ("none", recompute))
    return {p: row[p] - full[p] * plain[p] / bare[p] for p in PASSES}


def _fitted(fits: dict, lt) -> dict[str, float]:
    device = dict(F=lt.forward, B=lt.backward, I=lt.backward_input, W=lt.backward_weight)
    return {p: fits[p].time(device[p], lt.kernels[p]) for p in PASSES}


def nearest_block(dev, precision: str, recompute: str, shape: tuple) -> tuple | None:
    """(key, passes) of the profile's measured block nearest `shape` (hidden, heads, ffn, seq,
    micro-batch; log-distance), among its rows of `precision` and `recompute` where it has
    any, else of recompute "none"; None where it has neither."""
    rows = [(k, v) for k, v in dev.layers.blocks.items() if k[0] == precision]
    rows = [r for r in rows if r[0][6] == recompute] or [r for r in rows if r[0][6] == "none"]
    if not rows:
        return None
    return min(rows, key=lambda r: (sum((math.log(a) - math.log(b)) ** 2 for a, b in zip(r[0][1:6], shape)), r[0]))


def ends_in_step(m, dev, x, kernels: dict[str, list[float]], kernel_times: Callable,
                 end_kernels: Callable) -> dict[str, float] | None:
    """{"first_F", "first_I", "first_W", "last_F", ...: seconds} of the ends the profile did
    not measure: each end's pass, its `kernels` (`sim.cost.ends.end_kernels`), under the fit
    of its kind, plus the stage's own cost a compute that the measured ends hold beyond their
    kernels (`stage_costs`); None without a fit."""
    fits = in_step_fits(m, dev, replace(x, micro_batch=1), kernel_times)
    if not {"F", "I", "W"} <= set(fits):
        return None
    fixed = stage_costs(m, dev, x, kernel_times, end_kernels)
    return {k: fits[k.split("_")[1]].time(sum(v), len(v)) + fixed.get(k, 0.0) if v else 0.0
            for k, v in kernels.items()}


def stage_costs(m, dev, x, kernel_times: Callable, end_kernels: Callable) -> dict[str, float]:
    """{"first_F", "first_W", "last_F", "last_I", "last_W": seconds}: what a first or last
    stage's compute costs beyond its blocks and its end's kernels (exec's own work around a
    compute: the received input, the loss, the hooks), the mean over the profile's measured
    ends of `x`'s precision (`sim.hardware.layer_table`: every shape and micro-batch) of the
    measured end less its kernels under the fit, at least 0; {} where it measured none. A
    host's cost, the same at any shape: each measured end is an intercept that scatters by
    0.1-0.6 ms (docs/validation.md, "One profile, many shapes"), their mean does not."""
    fits = in_step_fits(m, dev, replace(x, micro_batch=1), kernel_times)
    rows = [(k, v) for k, v in dev.layers.ends.items() if k[0] == x.precision]
    if not rows or not {"F", "I", "W"} <= set(fits):
        return {}
    gaps: dict = {}
    for (_, hidden, seq, vocab, b), row in rows:
        shaped = replace(m, hidden=hidden, heads=1, kv_heads=None, ffn=None, seq=seq, vocab=vocab)
        kernels = end_kernels(shaped, dev, replace(x, micro_batch=b))
        measured = dict(row, first_W=row["first_B"])
        for k in ("first_F", "first_W", "last_F", "last_I", "last_W"):
            gaps.setdefault(k, []).append(measured[k] - fits[k.split("_")[1]].time(sum(kernels[k]), len(kernels[k])))
    return {k: max(0.0, sum(v) / len(v)) for k, v in gaps.items()}
