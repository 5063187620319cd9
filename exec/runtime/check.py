"""Correctness: the same step in one process, without a pipeline, and the gradients compared.

A pipeline must change when things are computed, not what. `reference_step` trains the
whole model on the whole batch in one process; `compare_grads` holds each pipelined
gradient against it. `split_micro_batches` cuts a batch the way every rank does, so that
the pipelined step and the reference see the same samples.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import torch
from torch import nn

__all__ = ["split_micro_batches", "reference_step", "param_names", "compare_grads"]


def split_micro_batches(inputs: torch.Tensor, targets: torch.Tensor, micro_batches: int
                        ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Cut a batch along dim 0 into `micro_batches` equal micro-batches. Each one is a copy with
    its own storage, so the memory it holds is measured by its own size."""
    n = inputs.shape[0]
    if isinstance(micro_batches, bool) or not isinstance(micro_batches, int) or micro_batches < 1 or n % micro_batches:
        raise ValueError(f"the batch of {n} samples does not split into {micro_batches!r} equal micro-batches; "
                         f"choose micro_batches among the divisors of {n}")
    return ([x.clone() for x in inputs.chunk(micro_batches)], [y.clone() for y in targets.chunk(micro_batches)])


def reference_step(spec, micro_batches: int) -> tuple[float, list[torch.Tensor]]:
    """The same step in one process, without a pipeline: the whole model on the whole
    batch. Returns the loss and every parameter's gradient, in model order (the order of
    the stages' parameters one after the other). `micro_batches` is checked to divide the batch.
    It never recomputes (`ModelSpec.recompute` is set to "none"), so that a pipeline that
    does is checked against one that does not."""
    inputs, targets = spec.batch()
    split_micro_batches(inputs, targets, micro_batches)  # the same error as the pipeline for a bad micro_batches
    model = nn.Sequential(*replace(spec, recompute="none").build_layers())
    loss = spec.loss(model(inputs), targets)
    loss.backward()
    return loss.item(), [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
                         for p in model.parameters()]


def param_names(spec) -> list[str]:
    """The names of the whole model's parameters, in the order of `reference_step`'s
    gradients (layer index first: "3.moe.experts.1.fc1.weight")."""
    return [n for n, _ in nn.Sequential(*spec.build_layers()).named_parameters()]


def compare_grads(pipelined: Sequence[tuple[str, torch.Tensor]], reference: Sequence[torch.Tensor],
                  rtol: float = 1e-4, atol: float = 1e-5) -> tuple[bool, float, str]:
    """Each pipelined gradient against the reference (same order). Returns (all close,
    largest absolute difference, name of the parameter where it is)."""
    if len(pipelined) != len(reference):
        raise ValueError(f"the pipeline has {len(pipelined)} parameters but the reference model "
                         f"{len(reference)}; the stages must cut the same model")
    ok, worst, where = True, 0.0, ""
    for (name, g), r in zip(pipelined, reference):
        g = torch.as_tensor(g)
        if g.shape != r.shape:
            raise ValueError(f"{name}: gradient shape {tuple(g.shape)} but reference {tuple(r.shape)}")
        diff = (g.double() - r.double()).abs().max().item() if g.numel() else 0.0
        ok = ok and torch.allclose(g.float(), r.float(), rtol=rtol, atol=atol)
        if diff >= worst:
            worst, where = diff, name
    return ok, worst, where
