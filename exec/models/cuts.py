"""Cutting a model into stages: by layer count, or by each layer's profiled time with sim's partitioners.

"layers" gives every stage as equal a number of layers as possible; for a model with ends
(the GPT's embedding and head, a user's where given: `ModelSpec.ends`) that is the planner's
split (`sim.search.partition.even` over the blocks, the embedding on the first stage and the
head on the last). "time" profiles each layer's forward + backward on one
micro-batch (`measure_layer_times`, a measurement; `sim.cost.layer.layer_times` is the
planner's model of one layer); the GPT's stages are then the planner's
`sim.search.partition.balanced` (equal blocks, the embedding's and head's times as the end
stages' extra), the MLP's (whose blocks may differ in width) `sim.search.partition.balanced_cuts`:
the contiguous cuts that minimise the slowest stage, preferring, within 2% of it
(`TIME_TOLERANCE`), cuts where the tensor passed between stages is small.

    >>> partition(ModelSpec("mlp", layers=4), 2)                        # doctest: +SKIP
    [0, 2, 4]
"""
from __future__ import annotations

import itertools
import statistics
import time
from typing import Sequence

import torch

from sim.model.layer_layout import parse_layer_layout
from sim.search.partition import balanced, balanced_cuts, even

__all__ = ["partition", "measure_layer_times", "stage_bounds", "layout_bounds", "TIME_TOLERANCE"]

TIME_TOLERANCE = 0.02  # a split this much slower than the fastest may be taken for fewer bytes at its cuts (a choice)


def partition(spec, stages: int, balance: str = "layers", micro_batches: int = 1, repeats: int = 5) -> list[int]:
    """Stage boundaries of `spec` (an `exec.models.spec.ModelSpec`): a list of `stages + 1`
    layer indices, stage s = layers [b[s], b[s+1]). "time" profiles on a micro-batch of
    `batch_size // micro_batches`, `repeats` times. Under torch.distributed, rank 0 decides and
    broadcasts, so that every rank cuts the model the same way despite timing noise."""
    n = spec.num_layers
    if isinstance(stages, bool) or not isinstance(stages, int) or stages < 1:
        raise ValueError(f"stages must be a positive integer, got {stages!r}")
    if stages > n:
        raise ValueError(f"cannot cut {n} layers into {stages} stages; every stage needs at least one layer "
                         f"(use stages <= {n} or a model with more layers)")
    if balance == "layers" and any(spec.ends):
        return end_bounds(spec, even(spec.layers, stages))
    if balance == "layers":
        return stage_bounds(n, [round(n * s / stages) for s in range(1, stages)])
    if balance != "time":
        raise ValueError(f"balance must be 'layers' or 'time', got {balance!r}")
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        box = [None]
        if dist.get_rank() == 0:
            box[0] = _time_bounds(spec, stages, micro_batches, repeats)
        dist.broadcast_object_list(box, src=0)
        return list(box[0])
    return _time_bounds(spec, stages, micro_batches, repeats)


def _time_bounds(spec, stages: int, micro_batches: int, repeats: int) -> list[int]:
    times, out_bytes = measure_layer_times(spec, micro_batches, repeats)
    if spec.model == "gpt":  # the planner's split: equal blocks, the embedding and head as extras
        extra = [0.0] * stages
        extra[0] += times[0]
        extra[-1] += times[-1]
        return end_bounds(spec, balanced(spec.layers, stages, statistics.median(times[1:-1]), extra))
    return stage_bounds(spec.num_layers, balanced_cuts(times, stages, out_bytes[:-1], tolerance=TIME_TOLERANCE))


def end_bounds(spec, blocks: Sequence[int]) -> list[int]:
    """Stage boundaries of `spec` with `blocks[s]` blocks on stage s, the layers before the
    blocks (`spec.ends[0]`: the GPT's embedding) on the first and those after them (its
    head) on the last."""
    if any(n == 0 for n in blocks[1:-1]):
        raise ValueError(f"the split {list(blocks)} of {spec.layers} blocks leaves a middle stage without one; "
                         f"use fewer stages or more layers")
    bounds = [0]
    for s, n in enumerate(blocks):
        bounds.append(bounds[-1] + n + (spec.ends[0] if s == 0 else 0))
    bounds[-1] = spec.num_layers
    return bounds


def layout_bounds(spec, text: str) -> list[int]:
    """Stage boundaries of the GPT `spec` cut by a Megatron-Core layout string
    (`sim.model.layer_layout`): stage s holds the embedding (layer 0) if the layout puts `E`
    there, its `t` blocks, and the head with the loss (the last layer) for `L`. A stage of
    nothing cannot run here: every stage needs a layer."""
    if spec.model != "gpt":
        raise ValueError(f"a layout string cuts a gpt model (its E, t and L), not {spec.model!r}")
    layout = parse_layer_layout(text).check(layers=spec.layers)
    if any(layout.mtp):
        raise ValueError(f"layout {layout}: exec's gpt has no MTP layers m")
    sizes = [len(stage) for stage in layout.stages]
    if 0 in sizes:
        raise ValueError(f"layout {layout}: stage {sizes.index(0)} holds nothing; every stage needs a layer here")
    return [0, *itertools.accumulate(sizes)]


def stage_bounds(n: int, cuts: Sequence[int]) -> list[int]:
    """Cut points -> boundaries: cuts (1..n-1, rising) become [0, *cuts, n]."""
    return [0, *cuts, n]


def measure_layer_times(spec, micro_batches: int = 1, repeats: int = 5) -> tuple[list[float], list[int]]:
    """Per layer, the median seconds of forward + backward on one micro-batch (the last
    layer includes the loss), and the bytes of each layer's output."""
    layers = spec.build_layers()
    x, y = spec.micro_batches(micro_batches)[0]
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
