"""Measured (size, seconds) points read at any size: piecewise linear between them, a floor below, in proportion above."""
from __future__ import annotations

__all__ = ["interpolate"]


def interpolate(pts: list[tuple[float, float]], x: float) -> float:
    """Piecewise linear through `pts` (sorted by x); the first point's y below it (a latency
    floor), the last point's rate above it (time in proportion to bytes: bandwidth-bound)."""
    if x <= pts[0][0]:
        return pts[0][1]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return pts[-1][1] * x / pts[-1][0]
