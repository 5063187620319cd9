"""Small synthetic models to run pipeline schedules on: `ModelSpec`, a model and its batch, determined by its fields.

A `ModelSpec` names a model and its sizes; everything else follows from it and its seed,
so every process that holds the same spec builds the same weights and the same batch:

    >>> spec = ModelSpec("mlp", layers=4, hidden=32, seq=8, batch_size=8)
    >>> stages = spec.build_stages(2)                 # two nn.Sequential, 2 layers each
    >>> x, y = spec.batch()
    >>> loss = spec.loss(stages[1](stages[0](x)), y)

Two built-in models, and the user's own:

- "mlp": `layers` residual MLP blocks (pre-LayerNorm, Linear-GELU-Linear + residual) on
  float inputs of shape (batch, seq, hidden); regression targets, mean squared error.
- "gpt": a small GPT, the one `ModelSpec.transformer()` describes to the planner
  (`sim.Transformer(arch="gpt", attention="flash", dropout=False, tied=False,
  kernels="torch")`). Layer 0 is the token + position embedding, then `layers`
  transformer blocks (pre-LN causal self-attention through torch's fused
  scaled_dot_product_attention + GeLU MLP of width `ffn`, biases, no dropout), and the
  last layer is the final LayerNorm + the LM head (no bias, not tied to the embedding);
  random token ids, next-token targets, cross entropy. Llama's arch is not built here.
- "blocks": a user's own torch modules, batch and loss (`exec.models.blocks.Blocks`), made
  with `ModelSpec.from_blocks(blocks, inputs, targets, loss, embedding=None, head=None)`,
  as torch.distributed.pipelining takes a user's modules; exec cuts them into stages and
  runs any schedule on them. `layers` counts the blocks, `batch_size` the samples; the
  size fields that describe the built-in models keep their defaults and mean nothing here.

A "gpt" with `experts` is a mixture of experts as `sim.Transformer` describes it (the same
fields: `experts`, `top_k`, `expert_ffn`, `shared_experts`, `dense_layers`, their defaults
sim's): its first `dense_layers` blocks have the dense MLP, the others a MoE MLP
(`exec.models.moe.MoE`); `ModelSpec.transformer()` then names Megatron-Core's kernels
(sim counts MoE layers only for those), with the same parameters.

`ModelSpec.recompute` ("full", or "selective" for the GPT's attention core) runs the blocks
under activation recomputation (`exec.models.layers.recomputed`, torch.utils.checkpoint).
`ModelSpec.partition` cuts the model into stages (`exec.models.cuts`).
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from sim.model.transformer import MOE_FIELDS, RECOMPUTE, Transformer

from exec.models.blocks import Blocks
from exec.models.cuts import partition
from exec.models.layers import Block, Embedding, Head, MLPBlock
from exec.models.moe import MoE

__all__ = ["ModelSpec", "RECOMPUTE"]


@dataclass(frozen=True)
class ModelSpec:
    """A synthetic model and batch, fully determined by these fields.

    `layers` counts the MLP blocks ("mlp") or the transformer blocks ("gpt"; the model
    then has `layers + 2` layers with the embedding and the head). `ffn` optionally gives
    each block its own inner width (default 4 * hidden): uneven MLP models; the GPT's
    blocks all have the same (`ModelSpec.from_transformer` sets it from `sim.Transformer.ffn`).
    `recompute` (activation recomputation, one of `RECOMPUTE`): "full" runs every block
    under `torch.utils.checkpoint`, so that it keeps only its input from its forward to
    its backward, which recomputes the forward first; "selective" ("gpt" only) recomputes
    the attention core alone. The embedding and the head are never recomputed. It
    changes what is kept and when it is computed, never a number.
    The defaults run a step on 2 CPU ranks in a fraction of a second, with enough
    compute per micro-batch (milliseconds per stage) that it dominates python overhead.
    """

    model: str = "mlp"
    layers: int = 8
    hidden: int = 128
    seq: int = 64
    vocab: int = 512
    heads: int = 4
    batch_size: int = 32
    seed: int = 0
    dtype: str = "float32"
    ffn: tuple[int, ...] | None = None
    recompute: str = "none"
    user: Blocks | None = None  # model "blocks": the user's modules, batch and loss
    experts: int | None = None         # "gpt": routed experts of its MoE layers (sim.Transformer's); None: dense
    top_k: int | None = None           # experts a token goes to; sim's default (1)
    expert_ffn: int | None = None      # one expert's width; sim's default (ffn)
    shared_experts: int | None = None  # experts every token passes through; sim's default (0)
    dense_layers: int | None = None    # the first blocks, with the dense MLP; sim's default (0)

    def __post_init__(self):
        if self.model not in ("mlp", "gpt", "blocks"):
            raise ValueError(f"ModelSpec.model must be 'mlp', 'gpt' or 'blocks', got {self.model!r}")
        if (self.model == "blocks") != isinstance(self.user, Blocks):
            raise ValueError("ModelSpec: model 'blocks' and the user's Blocks go together; make it with "
                             "ModelSpec.from_blocks(blocks, inputs, targets, loss)")
        for name in ("layers", "hidden", "seq", "vocab", "heads", "batch_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"ModelSpec.{name} must be a positive integer, got {v!r}")
        if not isinstance(getattr(torch, self.dtype, None), torch.dtype):
            raise ValueError(f"ModelSpec.dtype must name a torch dtype such as 'float32', got {self.dtype!r}")
        if self.ffn is not None:
            object.__setattr__(self, "ffn", tuple(int(w) for w in self.ffn))
            if len(self.ffn) != self.layers or min(self.ffn) < 1:
                raise ValueError(f"ModelSpec.ffn gives one positive inner width per block: {self.layers} values, "
                                 f"got {list(self.ffn)}")
            if self.model == "gpt" and len(set(self.ffn)) > 1:
                raise ValueError(f"ModelSpec.ffn: the GPT's blocks share one inner width, got {list(self.ffn)}")
        if self.model == "gpt" and self.hidden % self.heads:
            raise ValueError(f"ModelSpec: hidden {self.hidden} is not divisible by heads {self.heads}")
        if self.recompute not in RECOMPUTE:
            raise ValueError(f"ModelSpec.recompute must be one of {', '.join(RECOMPUTE)}, got {self.recompute!r}")
        if self.recompute != "none" and self.model == "blocks":
            raise ValueError("ModelSpec.recompute is for the built-in models; recompute your own blocks "
                             "inside them (torch.utils.checkpoint)")
        if self.recompute == "selective" and self.model != "gpt":
            raise ValueError("ModelSpec.recompute='selective' recomputes the attention core, which only model 'gpt' "
                             "has; use recompute='full' for model 'mlp'")
        self._resolve_experts()

    def _resolve_experts(self) -> None:
        """The MoE fields as sim.Transformer checks and completes them (one definition)."""
        named = {n: getattr(self, n) for n in MOE_FIELDS if hasattr(self, n)}
        if self.experts is None and all(v is None for v in named.values()):
            return
        if self.model != "gpt":
            raise ValueError(f"ModelSpec: experts and their fields are for model 'gpt', not {self.model!r}")
        t = self.transformer()
        for n in named:
            object.__setattr__(self, n, getattr(t, n))

    @classmethod
    def from_blocks(cls, blocks: "nn.Sequential | Sequence[nn.Module]", inputs: torch.Tensor, targets: torch.Tensor,
                    loss: Callable = F.mse_loss, embedding: nn.Module | None = None, head: nn.Module | None = None,
                    **options) -> "ModelSpec":
        """A model of the user's own torch modules (`exec.models.blocks.Blocks.of`): `blocks`
        (an `nn.Sequential` or a list of modules), the whole batch `inputs` and `targets`,
        the mean `loss(output, targets)`, and an `embedding` first and a `head` last where
        the model has them (the cut by layer count keeps them with the first and last stage)."""
        user = Blocks.of(blocks, inputs, targets, loss, embedding, head)
        return cls(model="blocks", layers=len(user.blocks), batch_size=int(inputs.shape[0]), user=user, **options)

    def describe(self) -> dict:
        """The fields, as JSON can hold them (the user's blocks by `Blocks.describe`)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["user"] = self.user.describe() if self.user is not None else None
        return out

    @property
    def ends(self) -> tuple[int, int]:
        """How many layers before the blocks and after them stay with the first and last
        stage: the GPT's embedding and head, the user's where given; none for the MLP."""
        return self.user.ends if self.user is not None else (1, 1) if self.model == "gpt" else (0, 0)

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    @classmethod
    def from_transformer(cls, t: Transformer, batch_size: int, **fields) -> "ModelSpec":
        """The GPT that `t` describes (see `transformer`); one clear ValueError for what the
        torch module does not build (llama's arch, grouped-query attention, dropout, a tied
        output layer, unfused attention)."""
        moe = {n: getattr(t, n) for n in ("experts", "top_k", "expert_ffn", "shared_experts", "dense_layers")}
        built = cls(model="gpt", layers=t.layers, hidden=t.hidden, heads=t.heads, seq=t.seq, vocab=t.vocab,
                    batch_size=batch_size, ffn=(t.ffn,) * t.layers, **moe, **fields)
        if built.transformer() != t:
            raise ValueError(f"exec builds the GPT of {built.transformer()!r} (arch 'gpt', no grouped-query "
                             f"attention, flash attention, no dropout, untied, torch kernels); it cannot build {t!r}")
        return built

    def transformer(self) -> Transformer:
        """The planner's description of this GPT (`sim.Transformer`): what its blocks compute
        and keep for their backward, exactly (tests/exec/runtime/test_saved_bytes.py)."""
        if self.model != "gpt":
            raise ValueError("ModelSpec.transformer(): only model 'gpt' is a transformer")
        moe = dict(experts=self.experts, top_k=self.top_k, expert_ffn=self.expert_ffn,
                   shared_experts=self.shared_experts, dense_layers=self.dense_layers)
        return Transformer(layers=self.layers, hidden=self.hidden, heads=self.heads, seq=self.seq, vocab=self.vocab,
                           ffn=self.ffn[0] if self.ffn else None, arch="gpt", attention="flash", dropout=False,
                           tied=False, kernels="torch" if self.experts is None else "megatron", **moe)

    @property
    def precision(self) -> str:
        """The planner's name of `dtype` (sim.estimate's `precision`)."""
        names = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
        if self.dtype not in names:
            raise ValueError(f"the planner has no precision for dtype {self.dtype!r}; use one of {', '.join(names)}")
        return names[self.dtype]

    @property
    def num_layers(self) -> int:
        """Number of modules `build_layers` returns (the unit that stages are cut in)."""
        return self.layers + sum(self.ends)

    def build_layers(self) -> list[nn.Module]:
        """The model as a list of layers, with weights drawn from `seed` (same everywhere);
        the user's: fresh copies of their modules."""
        if self.user is not None:
            return self.user.build()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            if self.model == "mlp":
                widths = self.ffn or (4 * self.hidden,) * self.layers
                layers: list[nn.Module] = [MLPBlock(self.hidden, w, self.recompute) for w in widths]
            else:
                widths = self.ffn or (4 * self.hidden,) * self.layers
                layers = [Embedding(self.vocab, self.seq, self.hidden)]
                layers += [Block(self.hidden, self.heads, self.recompute, w, self.moe_mlp(i)) for i, w in enumerate(widths)]
                layers.append(Head(self.hidden, self.vocab))
        return [layer.to(self.torch_dtype) for layer in layers]

    def moe_mlp(self, block: int) -> MoE | None:
        """Block `block`'s MoE MLP (all its experts), or None where it is dense."""
        if self.experts is None or block < self.dense_layers:
            return None
        return MoE(self.hidden, self.experts, self.top_k, self.expert_ffn, self.shared_experts)

    def batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The full synthetic batch (inputs, targets), the same on every call and process.

        mlp: inputs and regression targets of shape (batch, seq, hidden).
        gpt: token ids (batch, seq) and the next token of each position (batch, seq).
        blocks: the user's."""
        if self.user is not None:
            return self.user.inputs, self.user.targets
        g = torch.Generator().manual_seed(self.seed + 1)
        b, t = self.batch_size, self.seq
        if self.model == "mlp":
            x = torch.randn(b, t, self.hidden, generator=g, dtype=self.torch_dtype)
            y = torch.randn(b, t, self.hidden, generator=g, dtype=self.torch_dtype)
            return x, y
        ids = torch.randint(0, self.vocab, (b, t + 1), generator=g)
        return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()

    def micro_batches(self, count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """`batch()` cut along the batch dimension into `count` equal micro-batches. Each is
        a copy with its own storage, as the runtime's (`exec.runtime.check.split_micro_batches`):
        a view would keep the whole batch's storage, and autograd's saved bytes (the loss
        saves its targets) would count all of it."""
        if isinstance(count, bool) or not isinstance(count, int) or count < 1 or self.batch_size % count:
            raise ValueError(f"count must be a positive divisor of batch_size={self.batch_size}, got {count!r}")
        x, y = self.batch()
        return [(a.clone(), b.clone()) for a, b in zip(x.chunk(count), y.chunk(count))]

    def loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Scalar mean loss: MSE for "mlp", next-token cross entropy for "gpt", the user's for "blocks"."""
        if self.user is not None:
            return self.user.loss(output, targets)
        if self.model == "mlp":
            return F.mse_loss(output, targets)
        return F.cross_entropy(output.reshape(-1, output.shape[-1]), targets.reshape(-1))

    def partition(self, stages: int, balance: str = "layers", micro_batches: int = 1, repeats: int = 5) -> list[int]:
        """Stage boundaries: a list of `stages + 1` layer indices, stage s = layers
        [b[s], b[s+1]). "layers" balances layer counts; "time" balances each layer's
        profiled forward + backward time on a micro-batch of `batch_size // micro_batches`
        (`exec.models.cuts.partition`)."""
        return partition(self, stages, balance, micro_batches, repeats)

    def build_stages(self, stages: int, balance: str = "layers", micro_batches: int = 1,
                     bounds: Sequence[int] | None = None) -> list[nn.Module]:
        """The model cut into `stages` nn.Sequential of consecutive layers (see
        `partition`; pass `bounds` to reuse a partition already made)."""
        bounds = list(bounds) if bounds is not None else self.partition(stages, balance, micro_batches)
        if len(bounds) != stages + 1 or bounds[0] != 0 or bounds[-1] != self.num_layers or \
                any(a >= b for a, b in zip(bounds, bounds[1:])):
            raise ValueError(f"bounds must rise strictly from 0 to {self.num_layers} in {stages + 1} steps, got {bounds}")
        layers = self.build_layers()
        return [nn.Sequential(*layers[a:b]) for a, b in zip(bounds, bounds[1:])]
