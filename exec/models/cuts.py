"""Cutting a model whose layers differ (exec's uneven MLP) into stages: each layer's profiled time, and the contiguous cuts that minimise the slowest stage.

The GPT's layers are equal but for its ends, and it is cut as the planner cuts it
(`sim.partition`, `exec.models.spec.ModelSpec.partition`); an MLP whose blocks have their own
widths needs a split of unequal layers, which `sim.partition` does not make.
"""
from __future__ import annotations

import math
import statistics
import time
from typing import Sequence

import torch

__all__ = ["layer_times", "balanced_cuts"]


def layer_times(spec, micro: int = 1, repeats: int = 5) -> tuple[list[float], list[int]]:
    """Per layer, the median seconds of forward + backward on one micro-batch (the last
    layer includes the loss), and the bytes of each layer's output."""
    layers = spec.build_layers()
    x, y = spec.micro_batches(micro)[0]
    times, out_bytes = [], []
    for i, layer in enumerate(layers):
        last = i == len(layers) - 1
        inp = x.detach().requires_grad_(x.is_floating_point())
        samples = []
        for _ in range(repeats + 1):  # the first run warms up
            t = time.perf_counter()
            out = layer(inp)
            if last:
                spec.loss(out, y).backward()
            else:
                out.backward(torch.ones_like(out))
            samples.append(time.perf_counter() - t)
        times.append(statistics.median(samples[1:]))
        out_bytes.append(out.numel() * out.element_size())
        x = out.detach()
    return times, out_bytes


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

