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

Layers that differ (a model whose blocks have their own widths, each layer's time profiled)
are cut by `balanced_cuts`: the same least slowest stage, found exactly by dynamic
programming over every contiguous split, and among the splits within a tolerance of it the
one that sends the fewest bytes across its cuts.

    >>> balanced_cuts([1.0, 1.0, 1.0, 1.0], 2, cut_bytes=[9, 1, 9], tolerance=0.5)
    [2]
"""
from __future__ import annotations

import math
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


def balanced_cuts(costs: Sequence[float], stages: int, cut_bytes: Sequence[float] | None = None,
                  tolerance: float = 0.0) -> list[int]:
    """Contiguous split of layers with `costs` into `stages` non-empty stages.

    Returns the stages - 1 cut points c (1 <= c < n; stage boundaries [0, *cuts, n]).
    First the smallest possible slowest stage T* is found exactly; then, among the splits
    whose every stage costs at most T* * (1 + tolerance), the one with the fewest bytes
    crossing cuts (`cut_bytes[i]` = bytes sent when cutting after layer i, n - 1 values;
    all zero if None), then with the smallest slowest stage. Dynamic programming,
    O(stages * n^2)."""
    n = len(costs)
    if stages < 1 or stages > n:
        raise ValueError(f"cannot cut {n} layers into {stages} stages; need 1 <= stages <= {n}")
    if cut_bytes is None:
        cut_bytes = [0.0] * (n - 1)
    if len(cut_bytes) != n - 1:
        raise ValueError(f"cut_bytes needs one value per gap between layers ({n - 1}), got {len(cut_bytes)}")

    def cost(a: int, b: int) -> float:  # layers [a, b)
        return math.fsum(costs[a:b])

    # best[k][i]: objective of splitting layers [0, i) into k stages, and the last cut
    inf = (math.inf, math.inf)

    def solve(bound: float, objective) -> tuple[tuple[float, float], list[int]]:
        best = [[inf] * (n + 1) for _ in range(stages + 1)]
        back = [[0] * (n + 1) for _ in range(stages + 1)]
        best[0][0] = (0.0, 0.0)
        for k in range(1, stages + 1):
            for i in range(k, n - (stages - k) + 1):
                for j in range(k - 1, i):
                    if best[k - 1][j] == inf:
                        continue
                    c = cost(j, i)
                    if c > bound:
                        continue
                    cand = objective(best[k - 1][j], c, j)
                    if cand < best[k][i]:
                        best[k][i], back[k][i] = cand, j
        cuts, i = [], n
        for k in range(stages, 0, -1):
            i = back[k][i]
            cuts.append(i)
        return best[stages][n], sorted(cuts)[1:]

    # pass 1: minimise the slowest stage (objective (max, 0))
    (t_star, _), _ = solve(math.inf, lambda prev, c, j: (max(prev[0], c), 0.0))
    # pass 2: minimise (bytes at cuts, slowest stage) among splits within the bound
    bound = t_star * (1 + tolerance)
    _, cuts = solve(bound, lambda prev, c, j: (prev[0] + (cut_bytes[j - 1] if j > 0 else 0.0), max(prev[1], c)))
    return cuts


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
