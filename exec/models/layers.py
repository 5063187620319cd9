"""The layers of exec's models: the MLP block, and the GPT's embedding, transformer block and head, each optionally under activation recomputation.

`recomputed` runs a function under torch.utils.checkpoint (non-reentrant): the forward
keeps only its inputs, and the backward recomputes it first. `exec.models.spec.ModelSpec`
builds its models from these.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

__all__ = ["recomputed", "MLPBlock", "Embedding", "Block", "Head"]


def recomputed(fn, *args: torch.Tensor) -> torch.Tensor:
    """`fn(*args)`, keeping for the backward only `args` (autograd saves them); the backward
    runs `fn` again first to get what it needs (torch.utils.checkpoint, non-reentrant: the
    graph is the ordinary one, its saved tensors are recomputed on first use)."""
    return checkpoint(fn, *args, use_reentrant=False)


class MLPBlock(nn.Module):
    """x + Linear(GELU(Linear(LayerNorm(x)))): a pre-LN residual MLP block. With
    `recompute="full"` it keeps only its input for the backward (`recomputed`)."""

    def __init__(self, hidden: int, ffn: int, recompute: str = "none"):
        super().__init__()
        self.recompute = recompute
        self.ln = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, ffn)
        self.fc2 = nn.Linear(ffn, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return recomputed(self._forward, x) if self.recompute == "full" else self._forward(x)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.ln(x))))


class Embedding(nn.Module):
    """Token + learned position embedding: GPT layer 0. Token ids in, (b, seq, hidden) out."""

    def __init__(self, vocab: int, seq: int, hidden: int):
        super().__init__()
        self.tok = nn.Embedding(vocab, hidden)
        self.pos = nn.Embedding(seq, hidden)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        # the positions as a slice of the table: the backward keeps nothing for them, and the
        # token lookup keeps its ids (int64), as sim.Transformer(kernels="torch") counts
        return self.tok(ids) + self.pos.weight[: ids.shape[1]]


class Block(nn.Module):
    """A pre-LN transformer block: x + attn(ln1(x)), then x + mlp(ln2(x)); causal.

    `recompute`: "full" keeps only the block's input for the backward; "selective" only
    recomputes the attention core, softmax(QK^T)V (Korthikanti et al. 2022, Sec. 4.3), and
    keeps everything else (`recomputed`). `mlp`: a module in place of the dense MLP (a MoE
    layer's, `exec.models.moe.MoE`), which then has no `fc1`, `fc2`."""

    def __init__(self, hidden: int, heads: int, recompute: str = "none", ffn: int | None = None,
                 mlp: nn.Module | None = None):
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden ({hidden}) must be a multiple of heads ({heads})")
        ffn = 4 * hidden if ffn is None else ffn
        self.heads, self.recompute = heads, recompute
        self.ln1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden)
        self.moe = mlp
        if mlp is None:
            self.fc1 = nn.Linear(hidden, ffn)
            self.fc2 = nn.Linear(ffn, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return recomputed(self._forward, x) if self.recompute == "full" else self._forward(x)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(h, dim=2)
        q, k, v = (z.view(b, t, self.heads, h // self.heads).transpose(1, 2) for z in (q, k, v))
        a = recomputed(_attention, q, k, v) if self.recompute == "selective" else _attention(q, k, v)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, h))
        y = self.ln2(x)
        return x + (self.fc2(F.gelu(self.fc1(y))) if self.moe is None else self.moe(y))


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The attention core: causal softmax(QK^T / sqrt(d)) V, torch's fused kernel (on CPU its
    flash attention, which keeps q, k, v, its output and a log-sum-exp per head and token:
    sim.Transformer(attention="flash"))."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class Head(nn.Module):
    """Final LayerNorm + LM head (no bias, as GPT-2's): the last GPT layer, (b, seq, hidden) -> logits."""

    def __init__(self, hidden: int, vocab: int):
        super().__init__()
        self.ln = nn.LayerNorm(hidden)
        self.out = nn.Linear(hidden, vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.ln(x))
