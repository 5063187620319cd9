"""The matmul shapes of a layer's attention on one GPU and the widths of its tensors: MHA and GQA, a head width other than hidden/heads, and multi-head latent attention.

A head's query and key are `d_qk` wide and its value `d_v`: hidden/heads each by default,
`head_dim` where the model gives one (Qwen3, GPT-OSS: heads x head_dim != hidden), and
MLA's `qk_head_dim` (nope + rope) and `v_head_dim` (`sim.model.attention.MLA`). The residual
stream, and so the tensor-parallel collectives and the norms, stay `hidden` wide.

MLA as Megatron-Core's `MLASelfAttention` runs it (megatron/core/transformer/
multi_latent_attention.py): the down-projections W^DQ (h -> q_lora_rank) and W^DKV with the
shared rotary key W^KR (h -> kv_lora_rank + qk_rope_head_dim) are TE `Linear`s with
`parallel_mode="duplicated"`: whole on every tensor-parallel rank; the up-projections (W^UQ
with W^QR; W^UK with W^UV) are column-parallel and the output projection W^O row-parallel,
split over the heads like the QKV and projection of a dense layer.
"""
from __future__ import annotations

from sim.model.transformer import Transformer

from .slice import Slice


def gemm_products(m: int, n: int, k: int, batch: int = 1) -> tuple[tuple, tuple, tuple]:
    """The three products of a forward (m x k) @ (k x n) as (m, n, k, batch, layout), each as
    torch runs a linear layer's (`sim.hardware.kernels.LAYOUTS`): the forward X W^T, the
    input gradient dY W (m, k, n) and the weight gradient, (k, n, m) as dY^T X."""
    return (m, n, k, batch, "nt"), (m, k, n, batch, "nn"), (k, n, m, batch, "tn")


def head_widths(m: Transformer) -> tuple[int, int]:
    """A head's query/key width d_qk and value width d_v."""
    if m.mla is not None:
        return m.mla.qk_head_dim, m.mla.v_head_dim
    head = m.hidden // m.heads if m.head_dim is None else m.head_dim
    return head, head


def width_ratios(m: Transformer) -> dict[str, float]:
    """Widths of the attention's tensors a token, over `hidden`, whole (before tensor
    parallelism splits the heads): "qkv" Q, K and V together, "out" the projection's input (the
    heads' outputs), "rope" the parts of Q and K the rotary embedding turns, "core" the attention
    core's (d_qk + d_v) heads / 2h (1 for MHA), and "latent" MLA's two latents (0 without)."""
    h, a, kv = m.hidden, m.heads, m.kv_heads
    if m.mla is not None:
        x = m.mla
        return {"qkv": a * (2 * x.qk_head_dim + x.v_head_dim) / h, "out": a * x.v_head_dim / h,
                "rope": (a + 1) * x.qk_rope_head_dim / h, "core": a * (x.qk_head_dim + x.v_head_dim) / 2 / h,
                "latent": (x.kv_lora_rank + (x.q_lora_rank or 0)) / h}
    if m.head_dim is None:  # as the dense layer always computed them (bit for bit)
        return {"qkv": 1 + 2 * kv / a, "out": 1, "rope": 1 + kv / a, "core": 1, "latent": 0}
    d = m.head_dim
    return {"qkv": (a + 2 * kv) * d / h, "out": a * d / h, "rope": (a + kv) * d / h, "core": a * d / h, "latent": 0}


def attention_shapes(m: Transformer, x: Slice) -> dict[str, tuple[int, int, int, int]]:
    """Forward matmuls of the attention on one GPU as (m, n, k, batch), M = bs/cp tokens (the
    scores: s/cp queries by all s keys, the whole s^2 / cp with no causal saving): "qkv", or
    MLA's "q_down", "q_up" (or one "q" without a query latent), "kv_down" and "kv_up"; "scores",
    "values" and "projection"."""
    b, s, h, t, a = x.micro_batch, m.seq, m.hidden, x.tp, m.heads
    tokens, queries = x.tokens(m), s // x.cp
    qk, v = head_widths(m)
    core = {"scores": (queries, s, qk, b * a // t), "values": (queries, v, s, b * a // t)}
    if m.mla is None:
        qkv = h * (a + 2 * m.kv_heads) // a // t if m.head_dim is None else (a + 2 * m.kv_heads) * qk // t
        return {"qkv": (tokens, qkv, h, 1), **core, "projection": (tokens, h, a * v // t, 1)}
    mla = m.mla
    duplicated = {"q_down", "kv_down"}  # whole on each tensor-parallel rank
    out = {}
    for name, (k_in, n_out) in mla.matrices(h, a).items():
        split = 1 if name in duplicated else t
        out[name] = (tokens, h, k_in // t, 1) if name == "projection" else (tokens, n_out // split, k_in, 1)
    projection = out.pop("projection")
    return {**out, **core, "projection": projection}
