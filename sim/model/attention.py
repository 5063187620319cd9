"""Multi-head latent attention (DeepSeek-V2/V3) as the planner sees it: its low-rank projections' parameters, FLOPs and activation bytes.

MLA (DeepSeek-AI 2024, "DeepSeek-V2", Sec. 2.1.2-2.1.3, Eq. 9-19) compresses the keys and
values of a token into a latent c^KV of `kv_lora_rank` d_c (W^DKV: d -> d_c), and the query
into one of `q_lora_rank` d'_c (W^DQ; none: a full h -> n_h*d_qk projection, as
DeepSeek-V2-Lite); the heads' keys and values come back up from the latent (W^UK, W^UV), and a
decoupled rotary key of `qk_rope_head_dim` d^R is shared by the heads (W^KR: d -> d^R) while
each head's query has its own (W^QR). A head's query and key are d_qk = `qk_nope_head_dim` +
d^R wide, its value `v_head_dim`. Each latent is normalised (an RMSNorm of d_c or d'_c gains:
the released models, not the paper's equations).

    >>> v3 = MLA(q_lora_rank=1536, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128)
    >>> v3.params(hidden=7168, heads=128, norm_params=1) / 1e6   # one DeepSeek-V3 layer's attention
    187.107328
"""
from __future__ import annotations

from dataclasses import dataclass


def check_mla(mla, head_dim: int | None, kv_heads: int, heads: int) -> None:
    """ValueError unless `mla` is None or an MLA of a `sim.Transformer` that leaves the heads'
    widths to it and shares no keys between heads."""
    if mla is None:
        return
    if not isinstance(mla, MLA):
        raise ValueError(f"Transformer: mla must be a sim.model.attention.MLA or None; got {mla!r}")
    if head_dim is not None or kv_heads != heads:
        raise ValueError("Transformer: mla gives the heads' widths and shares no keys between heads; "
                         "leave head_dim and kv_heads out")


@dataclass(frozen=True)
class MLA:
    """Multi-head latent attention's ranks and head widths (DeepSeek's config.json names)."""
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int

    def __post_init__(self):
        for name in ("q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"):
            v = getattr(self, name)
            if name == "q_lora_rank" and v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"MLA: {name} must be a positive int{' or None' * (name == 'q_lora_rank')}, "
                                 f"got {v!r}")

    @property
    def qk_head_dim(self) -> int:
        """A head's query and key width: d_qk = qk_nope_head_dim + qk_rope_head_dim."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def matrices(self, hidden: int, heads: int) -> dict[str, tuple[int, int]]:
        """Its weight matrices as (in, out): q_down (W^DQ) and q_up (W^UQ with W^QR), or one
        q without a query latent; kv_down (W^DKV with W^KR), kv_up (W^UK with W^UV); projection (W^O)."""
        q = ({"q_down": (hidden, self.q_lora_rank), "q_up": (self.q_lora_rank, heads * self.qk_head_dim)}
             if self.q_lora_rank else {"q": (hidden, heads * self.qk_head_dim)})
        return {**q, "kv_down": (hidden, self.kv_lora_rank + self.qk_rope_head_dim),
                "kv_up": (self.kv_lora_rank, heads * (self.qk_nope_head_dim + self.v_head_dim)),
                "projection": (heads * self.v_head_dim, hidden)}

    def params(self, hidden: int, heads: int, norm_params: int) -> int:
        """Its matrices and the latents' norms (`norm_params` a feature: 1 for an RMSNorm)."""
        latents = self.kv_lora_rank + (self.q_lora_rank or 0)
        return sum(i * o for i, o in self.matrices(hidden, heads).values()) + norm_params * latents

    def flops(self, micro_batch: int, seq: int, hidden: int, heads: int) -> dict[str, float]:
        """Forward FLOPs over b sequences of s tokens (2 a multiply-add): each matrix 2bs(in)(out);
        the scores 2bs^2 n_h d_qk and the values 2bs^2 n_h d_v (the whole s^2, as the dense
        layer's count; Megatron's model FLOPs halve them for the causal mask)."""
        b, s = micro_batch, seq
        out = {name: 2 * b * s * i * o for name, (i, o) in self.matrices(hidden, heads).items()}
        return {**out, "scores": 2 * b * s * s * heads * self.qk_head_dim,
                "values": 2 * b * s * s * heads * self.v_head_dim}

    def activation_elements(self, tokens: int, heads: int) -> tuple[int, int]:
        """Elements its backward keeps per `tokens` tokens besides the layer input and the
        attention core's own (scores or log-sum-exp), as (replicated, split): "replicated" the
        latents, each norm's input and output (the up-projection's input), whole on every
        tensor-parallel rank (Megatron-Core's down-projections are duplicated there) unless
        sequence parallel; "split" over the heads: Q, K (d_qk each), V and the output
        projection's input (d_v each)."""
        latents = self.kv_lora_rank + (self.q_lora_rank or 0)
        return 2 * tokens * latents, tokens * heads * 2 * (self.qk_head_dim + self.v_head_dim)
