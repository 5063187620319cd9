"""A user's own model as exec runs it: `Blocks`, a sequence of torch modules (with an embedding and a head where the model has them), its batch and its loss.

torch.distributed.pipelining takes a user's modules and cuts them into stages; so does exec:

    >>> from torch import nn
    >>> import torch.nn.functional as F
    >>> blocks = [nn.Sequential(nn.LayerNorm(16), nn.Linear(16, 16)) for _ in range(4)]
    >>> user = Blocks.of(blocks, torch.randn(8, 16), torch.randn(8, 16), F.mse_loss)
    >>> len(user.layers()), [type(m).__name__ for m in user.build()][:1]
    (4, ['Sequential'])

`exec.models.spec.ModelSpec.from_blocks` makes a `ModelSpec` of them, which every entry point
takes. A block takes one tensor and returns one (as the members of an `nn.Sequential`);
the embedding, if given, is the first layer and takes the inputs (token ids, say), the
head, if given, the last, whose output the loss takes with the targets. The loss is a
mean over the samples (the pipeline adds the micro-batches' losses divided by their
count) and must be picklable by reference, a module-level function such as
`torch.nn.functional.mse_loss`, as must the modules' classes: every rank process gets the
modules, the batch and the loss pickled (`exec.launch.processes`), so that every rank holds
the same weights. A record of them compares and hashes by identity.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch import nn

__all__ = ["Blocks"]


@dataclass(frozen=True, eq=False)
class Blocks:
    """A user's modules, batch and loss (see the module docstring)."""

    blocks: tuple[nn.Module, ...]
    inputs: torch.Tensor
    targets: torch.Tensor
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    embedding: nn.Module | None = None
    head: nn.Module | None = None

    @classmethod
    def of(cls, blocks: "nn.Sequential | Sequence[nn.Module]", inputs: torch.Tensor, targets: torch.Tensor,
           loss: Callable, embedding: nn.Module | None = None, head: nn.Module | None = None) -> "Blocks":
        """The record, checked: `blocks` an `nn.Sequential` (its children) or a non-empty
        sequence of modules; `inputs` and `targets` tensors with the same number of samples
        (dim 0); `loss` callable. TypeError or ValueError naming what is wrong."""
        blocks = tuple(blocks.children()) if isinstance(blocks, nn.Sequential) else tuple(blocks)
        if not blocks:
            raise ValueError("blocks must hold at least one torch module")
        ends = [(what, m) for what, m in (("embedding", embedding), ("head", head)) if m is not None]
        for what, m in [(f"blocks[{i}]", b) for i, b in enumerate(blocks)] + ends:
            if not isinstance(m, nn.Module):
                raise TypeError(f"{what} must be a torch.nn.Module, got {type(m).__name__}")
        for what, t in (("inputs", inputs), ("targets", targets)):
            if not isinstance(t, torch.Tensor) or t.dim() == 0:
                raise TypeError(f"{what} must be a tensor whose dim 0 counts the samples, got {type(t).__name__}")
        if inputs.shape[0] != targets.shape[0]:
            raise ValueError(f"inputs hold {inputs.shape[0]} samples but targets {targets.shape[0]}")
        if not callable(loss):
            raise TypeError(f"loss must be a function (output, targets) -> scalar, got {type(loss).__name__}")
        return cls(blocks, inputs, targets, loss, embedding, head)

    @property
    def ends(self) -> tuple[int, int]:
        """(1 if there is an embedding, 1 if there is a head): the layers that stay with the first and last stage."""
        return int(self.embedding is not None), int(self.head is not None)

    def layers(self) -> list[nn.Module]:
        """The model as layers: the embedding, the blocks, the head (these very modules)."""
        return [m for m in (self.embedding, *self.blocks, self.head) if m is not None]

    def build(self) -> list[nn.Module]:
        """Fresh copies of `layers()`, with the same weights (every call, every process)."""
        return copy.deepcopy(self.layers())

    def describe(self) -> dict:
        """What the model is, as JSON can hold it: the layers' types, the batch's shapes, the loss's name."""
        return {"layers": [type(m).__name__ for m in self.layers()], "ends": list(self.ends),
                "inputs": list(self.inputs.shape), "targets": list(self.targets.shape),
                "loss": getattr(self.loss, "__qualname__", repr(self.loss))}
