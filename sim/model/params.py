"""A model's parameter count by part: its dense and MoE layers, the total the optimizer holds and what one token uses."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Params:
    """A model's parameter count by part; `total` is what the optimizer holds."""
    embedding: int      # token embedding V*h, plus the learned positions s*h where there are some
    per_layer: int      # one dense layer: attention, MLP, their norms (and biases)
    layers: int
    final_norm: int     # the LayerNorm/RMSNorm before the output layer
    output: int         # the output (logit) layer: 0 when tied to the embedding
    tied: bool
    moe_layers: int = 0            # of the `layers`, those (the last) whose MLP is a mixture of experts
    per_moe_layer: int = 0         # one of them: attention, norms, router, every expert
    active_per_moe_layer: int = 0  # what one token uses of it: all but the k-of-E experts it is not routed to

    @property
    def total(self) -> int:
        return (self.embedding + (self.layers - self.moe_layers) * self.per_layer
                + self.moe_layers * self.per_moe_layer + self.final_norm + self.output)

    @property
    def active(self) -> int:
        """The parameters one token's forward uses, the embedding table counted whole as in
        `total` (Mistral's 12.9B of Mixtral, Qwen3's counts); `active - embedding` leaves out
        the input embedding, a lookup (OpenAI's count of GPT-OSS). `total` for a dense model."""
        return self.total - self.moe_layers * (self.per_moe_layer - self.active_per_moe_layer)
