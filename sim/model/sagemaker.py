"""SageMaker's reference configurations: three GPT-2-style models and how they were split.

The SageMaker model parallelism library (v1) documents, in "Best practices", section
"Reference configurations" (docs.aws.amazon.com/sagemaker/latest/dg/model-parallel-best-practices.html;
awsdocs/amazon-sagemaker-developer-guide, doc_source/model-parallel-best-practices.md):
"reference points based on experiments with the GPT-2 model, the sequence length of 512, and
the vocabulary size of 50,000":

| parameters | instances | pipeline | tensor | optimizer state sharding | activation checkpointing | prescaled batch | batch |
|---|---|---|---|---|---|---|---|
| 10 billion | 16 ml.p4d.24xlarge | 1 | 4 | True | each transformer layer | True | batch_size=40 |
| 30 billion | 16 ml.p4d.24xlarge | 1 | 8 | True | each transformer layer | True | batch_size=32 |
| 60 billion | 32 ml.p4d.24xlarge | 2 | 8 | True | each transformer layer | True | batch_size=56, microbatches=4, active_microbatches=2 |

An ml.p4d.24xlarge has 8 A100 40GB GPUs: 128, 128 and 256 GPUs. The page gives no shapes.
The 30B shape is SageMaker's own: its GPT-2 example (aws/amazon-sagemaker-examples,
training/distributed_training/pytorch/model_parallel/gpt2/smp-train-gpt-simple.ipynb,
model_config "gpt2-30b") sets max_context_width 512, hidden_width 7168, num_layers 48,
num_heads 64, tensor_parallel_degree 8, pipeline_parallel_degree 1. For 10B and 60B we keep
its 48 layers (GPT-2 XL's depth too: Radford et al. 2019, Table 2) and take the width, a
multiple of 128 with heads 128 wide, whose Narayanan et al. 2021 Eq. 2 count is nearest
10B and 60B with heads divisible by the table's tp: h = 4096 (32 heads, 9.87B; 4224 gives
10.5B) and h = 10240 (80 heads, 60.9B; 10112 gives 59.4B but its 79 heads do not split over
tp = 8). The 30B shape counts 29.96B.

How a row maps onto `sim.estimate` (our reading, stated once here):
- tp and pp as given; dp = GPUs / (tp * pp), SageMaker's "reduced data parallel" degree.
- Optimizer state sharding over the dp ranks: zero=1. Checkpointing each transformer layer:
  recompute="full". Its examples train in fp16 ("fp16": 1, fp16_params): precision="fp16".
- Prescaled batch: "the batch size set in the training script becomes tp_size times the
  batch size set for each rank without prescaled_batch", i.e. batch_size is what one
  tensor-parallel group processes per step. The global batch is batch_size * dp, the
  micro-batch batch_size / microbatches (microbatches defaults to 1).
- active_microbatches=2: at most 2 micro-batches in flight, 1F1B with max_active=2
  (SageMaker's default pipeline, "interleaved", runs a backward as soon as it can).
- Sequence parallelism off: Megatron-style tensor parallelism, activations outside the
  tensor-parallel matmuls whole on every rank.
"""
from __future__ import annotations

from dataclasses import dataclass

from .transformer import Transformer

_GPT2 = dict(seq=512, vocab=50000)  # the page: "the sequence length of 512, and the vocabulary size of 50,000"
MODELS: dict[str, Transformer] = {
    "sagemaker-gpt2-10b": Transformer(layers=48, hidden=4096, heads=32, **_GPT2),
    "sagemaker-gpt2-30b": Transformer(layers=48, hidden=7168, heads=64, **_GPT2),  # SageMaker's gpt2-30b
    "sagemaker-gpt2-60b": Transformer(layers=48, hidden=10240, heads=80, **_GPT2),
}
GPU = "a100-40gb"      # ml.p4d.24xlarge: 8 x A100 40GB
GPUS_PER_NODE = 8


@dataclass(frozen=True)
class Reference:
    """One row of the table, as the arguments of `sim.estimate` (see the module's docstring);
    `micro_batches` and `active_micro_batches` are SageMaker's `microbatches` and
    `active_microbatches`."""
    model: str
    nodes: int
    pp: int
    tp: int
    batch_size: int
    micro_batches: int = 1
    active_micro_batches: int | None = None

    @property
    def gpus(self) -> int:
        return self.nodes * GPUS_PER_NODE

    @property
    def dp(self) -> int:
        return self.gpus // (self.tp * self.pp)

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.dp

    def kwargs(self, **overrides) -> dict:
        """`sim.estimate`'s keyword arguments for this row; `overrides` change any (e.g.
        recompute="none" or zero=0 to see what breaks)."""
        options = {} if self.active_micro_batches is None else {"max_active": self.active_micro_batches}
        return {"tp": self.tp, "pp": self.pp, "dp": self.dp, "micro_batch": self.batch_size // self.micro_batches,
                "global_batch": self.global_batch, "schedule": "1f1b", "recompute": "full", "zero": 1,
                "precision": "fp16", "sequence_parallel": False, "gpus_per_node": GPUS_PER_NODE,
                **options, **overrides}


REFERENCES: dict[str, Reference] = {
    "10b": Reference("sagemaker-gpt2-10b", nodes=16, pp=1, tp=4, batch_size=40),
    "30b": Reference("sagemaker-gpt2-30b", nodes=16, pp=1, tp=8, batch_size=32),
    "60b": Reference("sagemaker-gpt2-60b", nodes=32, pp=2, tp=8, batch_size=56, micro_batches=4,
                     active_micro_batches=2),
}
