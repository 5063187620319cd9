"""A device profile's optional attention table: the fused attention kernel a framework runs (torch's scaled_dot_product_attention), timed by head width, sequence and count of heads.

The kernel model times torch's fused attention core as its two matmuls (the scores and the
values, `sim.cost.layer.kernel_layer_times`), and on a CPU that is far from it: torch's CPU
flash attention walks the causal triangle in blocks of queries and keys, with its own
softmax, and takes 0.7 to 7 times what the kernel model gives it (the two matmuls and its own
elementwise kernels), most at small head widths and short sequences (docs/validation.md,
"torch's attention call"). No one ratio holds across
shapes, so a profile measures the kernel itself (`exec.profiler.device_bench.attention_rows`).

The section `attention.table` of a profile (docs/profiles.md) holds rows [precision,
head_dim, seq, batch_heads, forward, backward]: the seconds of one causal attention call over
`batch_heads` independent (micro-batch x heads) problems of `seq` tokens and head width
`head_dim`, and of its backward (the gradients of q, k and v). `AttentionTable.time` reads
it at any shape:

- in `batch_heads`, piecewise linear through the rows of one (head_dim, seq), at least the
  fewest problems' time below them and in proportion beyond the most: the problems are
  independent, their count only multiplies the work, above the call's fixed cost;
- between measured sequences and head widths, piecewise linear in log time over log size
  (a power law between neighbours), beyond them the nearest segment's power, never
  decreasing; an axis with a single measured value scales as the FLOPs do (seq^2, head_dim).

    >>> t = read([("fp32", 32, 64, 8, 8e-5, 2e-4), ("fp32", 32, 64, 32, 2.9e-4, 7e-4),
    ...           ("fp32", 32, 128, 8, 2.4e-4, 5.4e-4), ("fp32", 32, 128, 32, 9.6e-4, 2.4e-3)])
    >>> [round(v * 1e6, 1) for v in t.time("fp32", 32, 64, 16)]
    [150.0, 366.7]
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from .gpus import PRECISIONS
from .points import interpolate

__all__ = ["ROWS", "AttentionTable", "read"]

ROWS = ((str, PRECISIONS), (int, None), (int, None), (int, None), (float, None), (float, None))
# how a single measured value along an axis scales to others: as the kernel's FLOPs do
_POWER = {"seq": 2.0, "head_dim": 1.0}


@dataclass(frozen=True)
class AttentionTable:
    """The measured rows by precision: {precision: {(head_dim, seq): ((batch_heads, F, B), ...)}}."""
    rows: Mapping[str, Mapping[tuple[int, int], tuple]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.rows)

    def time(self, precision: str, head_dim: float, seq: float, batch_heads: float) -> tuple[float, float] | None:
        """(forward, backward) seconds of one call at this shape, read as the module says; None
        where the table has no row of `precision`."""
        grid = self.rows.get(precision)
        if not grid:
            return None
        out = []
        for p in (0, 1):
            along_d = []
            for d in sorted({d for d, _ in grid}):
                pts = [(s, _line(grid[(d, s)], batch_heads, p)) for s in sorted(s for dd, s in grid if dd == d)]
                along_d.append((d, _power_law(pts, seq, _POWER["seq"])))
            out.append(_power_law(along_d, head_dim, _POWER["head_dim"]))
        return out[0], out[1]


def _line(points: tuple, x: float, p: int) -> float:
    """Seconds at `x` problems through `points` ((x, F, B), column `p` of F, B): piecewise
    linear between them, the fewest's time below them (the call's fixed cost), in proportion
    beyond the most (`sim.hardware.points.interpolate`)."""
    return interpolate([(q[0], q[1 + p]) for q in points], x)


def _power_law(points: list, x: float, power: float) -> float:
    """`points` ((size, seconds), sorted by size) read at `x`: a power law between the two
    neighbours, beyond the ends the nearest segment's (at least 0: never faster when larger);
    one point: `power`."""
    if len(points) == 1:
        (x0, y0), = points
        return y0 * (x / x0) ** power
    i = next((i for i in range(len(points) - 1) if x <= points[i + 1][0]), len(points) - 2)
    (x0, y0), (x1, y1) = points[i], points[i + 1]
    slope = (math.log(y1) - math.log(y0)) / (math.log(x1) - math.log(x0))
    if not x0 <= x <= x1:
        slope = max(slope, 0.0)
    return y0 * math.exp(slope * (math.log(x) - math.log(x0)))


def read(rows: Iterable[tuple]) -> AttentionTable:
    """An `AttentionTable` from checked rows (`ROWS`)."""
    out: dict = {}
    for precision, head_dim, seq, batch_heads, f, b in rows:
        out.setdefault(precision, {}).setdefault((head_dim, seq), []).append((batch_heads, f, b))
    return AttentionTable({p: {k: tuple(sorted(v)) for k, v in g.items()} for p, g in out.items()})
