"""How a model's layers are split over pipeline stages: evenly, or balanced on the slowest stage.

The first stage also runs the embedding and the last the output layer and the loss, so an
even split of the layers leaves them slower; SageMaker's automatic partitioning and
Megatron-LM's `--decoder-first-pipeline-num-layers` / `--decoder-last-pipeline-num-layers`
move layers off them. A stage's time here is linear in its layers: `per_layer` for each,
plus its fixed `extra` (embedding, output layer). The balanced split minimises the slowest
stage exactly: for a bound T, stages greedily take as many layers as fit under T, and the
smallest T that places every layer is one of the finitely many stage times n*per_layer + extra.
Memory enters as a cap: stage s may hold at most `most[s]` layers (the most that fit its
device, which `sim.estimate` finds from the schedule's own program order), so the split is the
fastest one in which every stage fits, as SageMaker's automatic partitioning balances compute
against memory.

    >>> balanced(8, 4, per_layer=1.0, extra=[1.0, 0, 0, 2.0])
    [1, 3, 3, 1]
"""
from __future__ import annotations

from typing import Sequence


def even(layers: int, stages: int) -> list[int]:
    """`layers` split as evenly as they go; the remainder goes to the middle stages first
    (the first and last carry the embedding and the output layer)."""
    _check(layers, stages)
    counts = [layers // stages] * stages
    order = list(range(1, stages - 1)) + [s for s in (0, stages - 1) if 0 <= s < stages]
    for s in order[:layers % stages]:
        counts[s] += 1
    return counts


def balanced(layers: int, stages: int, per_layer: float, extra: Sequence[float],
             most: Sequence[int] | None = None) -> list[int]:
    """The split of `layers` over `stages` (in order, each may hold none, stage s at most
    `most[s]` if given) that minimises the slowest stage's time n * per_layer + extra[stage].
    Of the splits that do, the later stages take as many layers as fit and the first the rest:
    under 1F1B the first stage holds the most micro-batches (p), so it is where fewer layers
    save the most memory. ValueError if the caps hold fewer than `layers` in all."""
    _check(layers, stages)
    if len(extra) != stages:
        raise ValueError(f"extra has {len(extra)} values for {stages} stages")
    most = [layers] * stages if most is None else [min(max(int(n), 0), layers) for n in most]
    if len(most) != stages or sum(most) < layers:
        raise ValueError(f"the caps {list(most)} hold fewer than {layers} layers over {stages} stages")
    if per_layer <= 0:
        spread = even(layers, stages)
        if all(n <= cap for n, cap in zip(spread, most)):
            return spread
        per_layer, candidates = 0.0, [max(extra)]
    else:
        candidates = sorted({n * per_layer + e for e in extra for n in range(layers + 1)})
    lo, hi = 0, len(candidates) - 1  # the largest candidate places every layer the caps allow
    while lo < hi:
        mid = (lo + hi) // 2
        if _fill(layers, per_layer, extra, candidates[mid], most) is None:
            lo = mid + 1
        else:
            hi = mid
    return _fill(layers, per_layer, extra, candidates[lo], most)


def _fill(layers: int, per_layer: float, extra: Sequence[float], bound: float,
          most: Sequence[int]) -> list[int] | None:
    """Layers per stage when each of the later stages takes as many as fit under `bound` and
    its cap (so the first stage, which also has the embedding, keeps the rest); None if they
    do not fit."""
    counts = [0] * len(extra)
    left = layers
    for s in range(len(extra) - 1, -1, -1):
        room = bound - extra[s]
        if room < -1e-12 * max(bound, 1.0):
            return None
        n = min(left, most[s], layers if per_layer == 0 else int(room / per_layer + 1e-9))
        counts[s], left = n, left - n
    return counts if left == 0 else None


def _check(layers: int, stages: int) -> None:
    for name, v in (("layers", layers), ("stages", stages)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
