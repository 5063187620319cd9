"""The model registry: every named model, the one table `sim.MODELS` is and `sim.estimate` resolves names in.

    >>> from sim.model.registry import MODELS, find_model, model_name
    >>> model_name(find_model("sagemaker-gpt2-10b")), model_name(find_model("GPT3_175B"))
    ('sagemaker-gpt2-10b', 'gpt3-175b')
    >>> find_model("gpt3-175b") is MODELS["gpt3-175b"]
    True

The papers' models are written here, each with its source; SageMaker's reference models
with the table they come from (`sim.model.sagemaker`). `sim.estimate`, `sim.plan.search`,
`python -m sim.plan` and `python -m exec.run --model` all look names up here, so a name one
of them takes, the others take too.
"""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from .attention import MLA
from .sagemaker import MODELS as SAGEMAKER
from .transformer import Transformer

_MEGATRON = dict(seq=2048, vocab=51200)  # Narayanan et al. 2021, Sec. 5.1 and Table 1
# Presets of 2023 on run fused attention, timed as one kernel (sim.cost.layer): Llama 1 and 2
# (Touvron et al. 2023a, Sec. 2.4, kept by Llama 2, Sec. 2.2) xformers' memory-efficient causal
# attention, which "does not store the attention weights" nor compute the masked scores.
_LLAMA2 = dict(seq=4096, vocab=32000, arch="llama", attention="flash")  # Touvron et al. 2023 (Llama 2), Sec. 2.2, Table 1
# Llama 3 and 3.1 (Llama Team 2024, "The Llama 3 Herd of Models", Table 3: layers, model dim,
# FFN dim, heads, 8 KV heads, vocabulary 128K; the releases' config.json: vocab_size 128256,
# untied), pre-trained at 8K tokens (Sec. 3.4.1) before the long-context stage; 3.1 is the same
# network. The paper does not name its attention kernel; the stacks that run it today fuse it
# (Megatron-Core/NeMo: Transformer Engine's cuDNN fused attention; torchtitan: torch's SDPA).
_LLAMA3 = dict(seq=8192, vocab=128256, arch="llama", kv_heads=8, attention="flash")
_LLAMA3_SIZES = {"8b": (32, 4096, 32, 14336), "70b": (80, 8192, 64, 28672), "405b": (126, 16384, 128, 53248)}
# Nemotron-4 (Parmar et al. 2024, 15B, Table 1 and Sec. 2: squared-ReLU MLP, rotary positions, no
# biases, no dropout, untied embeddings, grouped-query attention; NVIDIA 2024, Nemotron-4 340B
# Technical Report, Table 1); ffn 4h (the 340B release's ffn_hidden_size 73728; the 15B paper's 12.5B
# non-embedding parameters imply the same); trained with Megatron-LM on DGX H100s, whose layer runs
# Transformer Engine's fused attention. Its LayerNorm's bias (h a norm, under 0.01 %) is not counted.
_NEMOTRON4 = dict(seq=4096, vocab=256000, arch="llama", mlp="squared-relu", kv_heads=8, attention="flash")
PRESETS: dict[str, Transformer] = {
    # Brown et al. 2020, Table 2.1 (96 layers, d_model 12288, 96 heads, context 2048);
    # vocabulary 51200 as Megatron-LM pads it (Korthikanti et al. 2022, Sec. 6, Table 3)
    "gpt3-175b": Transformer(layers=96, hidden=12288, heads=96, **_MEGATRON),
    # Narayanan et al. 2021, Table 1: (heads, hidden, layers) of the ten GPT models
    **{f"megatron-{size}": Transformer(layers=l, hidden=h, heads=a, **_MEGATRON) for size, a, h, l in [
        ("1.7b", 24, 2304, 24), ("3.6b", 32, 3072, 30), ("7.5b", 32, 4096, 36), ("18.4b", 48, 6144, 40),
        ("39.1b", 64, 8192, 48), ("76.1b", 80, 10240, 60), ("145.6b", 96, 12288, 80),
        ("310.1b", 128, 16384, 96), ("529.6b", 128, 20480, 105), ("1t", 160, 25600, 128)]},
    # Korthikanti et al. 2022, Table 3: (heads, hidden, layers); seq 2048, vocabulary 51200
    **{f"korthikanti-{size}": Transformer(layers=l, hidden=h, heads=a, **_MEGATRON) for size, a, h, l in [
        ("22b", 64, 6144, 48), ("175b", 96, 12288, 96), ("530b", 128, 20480, 105), ("1t", 160, 25600, 128)]},
    # Llama 2: layers, hidden, heads as Llama 1 (Touvron et al. 2023a, Table 2) for 7B and 13B,
    # and the released 70B config (params.json: dim 8192, 80 layers, 64 heads, 8 KV heads;
    # GQA per Llama 2, Table 1); ffn by llama_ffn (multiple_of 256; 70B: 4096 and 1.3)
    "llama2-7b": Transformer(layers=32, hidden=4096, heads=32, ffn=11008, **_LLAMA2),
    "llama2-13b": Transformer(layers=40, hidden=5120, heads=40, ffn=13824, **_LLAMA2),
    "llama2-70b": Transformer(layers=80, hidden=8192, heads=64, ffn=28672, kv_heads=8, **_LLAMA2),
    **{f"llama{v}-{size}": Transformer(layers=l, hidden=h, heads=a, ffn=f, **_LLAMA3)
       for v in ("3", "3.1") for size, (l, h, a, f) in _LLAMA3_SIZES.items()},
    "nemotron4-15b": Transformer(layers=32, hidden=6144, heads=48, ffn=24576, **_NEMOTRON4),
    "nemotron4-340b": Transformer(layers=96, hidden=18432, heads=96, ffn=73728, **_NEMOTRON4),
    # Jiang et al. 2023 (Mistral 7B), Table 1: dim 4096, 32 layers, 32 heads, 8 KV heads, hidden_dim
    # 14336, context 8192, vocabulary 32000; FlashAttention and xFormers kernels (Sec. 2). Its
    # sliding window (4096) is not modelled: the attention is timed as full causal attention.
    "mistral-7b": Transformer(layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, seq=8192, vocab=32000,
                              arch="llama", attention="flash"),
    # Qwen2.5-7B's config.json (Qwen/Qwen2.5-7B): hidden_size 3584, intermediate_size 18944, 28
    # layers, 28 heads, 4 KV heads, vocab_size 152064, untied; pre-trained at 4096 tokens (Qwen
    # Team 2024, Qwen2.5 Technical Report, before its long-context stage). Its QKV biases (4608 a layer) are not
    # counted; its attention kernel is not published (flash assumed, as for every preset of 2023 on).
    "qwen2.5-7b": Transformer(layers=28, hidden=3584, heads=28, kv_heads=4, ffn=18944, seq=4096, vocab=152064,
                              arch="llama", attention="flash"),
}

# Mixtures of experts, each from its release's configuration (the field names are config.json's),
# trained at the sequence length named; all SwiGLU (Grok-1's gated GeLU has the same three
# matrices), rotary, RMSNorm, no biases (GPT-OSS's attention, router and expert biases, 0.03 % of
# it, and Qwen3's q/k norms, 256 a layer, are not counted), fused attention. Their published
# parameter counts are checked in tests/sim/model/test_moe.py; sources in docs/planner.md.
_MOE = dict(arch="llama", attention="flash")
# DeepSeek-V3 and V2: deepseek-ai/DeepSeek-V3 inference/configs/config_671B.json and the
# releases' config.json (Megatron-LM's deepseek_v3.yaml and deepseek_v2.yaml have the same):
# q_lora_rank 1536, kv_lora_rank 512, qk_rope_head_dim 64, qk_nope_head_dim 128, v_head_dim 128;
# n_routed_experts, num_experts_per_tok, n_shared_experts, moe_intermediate_size,
# first_k_dense_replace (the dense layers, of intermediate_size). Pre-trained at 4K tokens
# (DeepSeek-AI 2024, V3 report Sec. 4.2; V2 report Sec. 3.1.2). The multi-token-prediction
# module of V3 (14B more, not in the 671B) is left out.
_DEEPSEEK_MLA = MLA(q_lora_rank=1536, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128)
MOE_PRESETS: dict[str, Transformer] = {
    "deepseek-v3-671b": Transformer(layers=61, hidden=7168, heads=128, seq=4096, vocab=129280, ffn=18432,
                                    mla=_DEEPSEEK_MLA, experts=256, top_k=8, expert_ffn=2048, shared_experts=1,
                                    dense_layers=3, **_MOE),
    "deepseek-v2-236b": Transformer(layers=60, hidden=5120, heads=128, seq=4096, vocab=102400, ffn=12288,
                                    mla=_DEEPSEEK_MLA, experts=160, top_k=6, expert_ffn=1536, shared_experts=2,
                                    dense_layers=1, **_MOE),
    # Mixtral 8x7B and 8x22B: mistralai/Mixtral-8x7B-v0.1 and Mixtral-8x22B-v0.1 config.json
    # (hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads,
    # num_local_experts 8, num_experts_per_tok 2, vocab_size; max_position_embeddings 32768 and
    # 65536, the context they were trained at: Jiang et al. 2024, "Mixtral of Experts", Sec. 2)
    "mixtral-8x7b": Transformer(layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, seq=32768, vocab=32000,
                                experts=8, top_k=2, **_MOE),
    "mixtral-8x22b": Transformer(layers=56, hidden=6144, heads=48, kv_heads=8, ffn=16384, seq=65536,
                                 vocab=32768, experts=8, top_k=2, **_MOE),
    # Qwen3 MoE: Qwen/Qwen3-30B-A3B and Qwen3-235B-A22B config.json (head_dim 128, num_experts 128,
    # num_experts_per_tok 8, moe_intermediate_size; every layer sparse, no shared expert); the
    # same in slime's Megatron scripts (scripts/models/qwen3-30B-A3B.sh, qwen3-235B-A22B.sh).
    # Pre-trained at 4096 tokens before the long-context stage (Qwen Team 2025, Qwen3 report, Sec. 3.2).
    "qwen3-30b-a3b": Transformer(layers=48, hidden=2048, heads=32, kv_heads=4, head_dim=128, ffn=6144, seq=4096,
                                 vocab=151936, experts=128, top_k=8, expert_ffn=768, **_MOE),
    "qwen3-235b-a22b": Transformer(layers=94, hidden=4096, heads=64, kv_heads=4, head_dim=128, ffn=12288,
                                   seq=4096, vocab=151936, experts=128, top_k=8, expert_ffn=1536, **_MOE),
    # Grok-1: xai-org/grok-1 run.py (LanguageModelConfig: vocab_size 128*1024, emb_size 48*128,
    # widening_factor 8 -> ffn 32768 by model.py's ffn_size, 48 query and 8 key/value heads, 64
    # layers, num_experts 8, num_selected_experts 2, sequence_len 8192; input and output
    # embedding shared, model.py's InOutEmbed).
    "grok-1-314b": Transformer(layers=64, hidden=6144, heads=48, kv_heads=8, ffn=32768, seq=8192, vocab=131072,
                               experts=8, top_k=2, tied=True, **_MOE),
    # GPT-OSS: openai/gpt-oss-120b and gpt-oss-20b config.json (hidden_size 2880, intermediate_size
    # 2880, head_dim 64, 64 heads, 8 KV heads, num_local_experts 128 and 32, experts_per_token 4,
    # vocab_size 201088, untied; initial_context_length 4096); 36 and 24 layers. Its alternate
    # layers' 128-token sliding window is not modelled (full causal attention).
    **{f"gpt-oss-{size}": Transformer(layers=l, hidden=2880, heads=64, kv_heads=8, head_dim=64, ffn=2880, seq=4096,
                                      vocab=201088, experts=e, top_k=4, **_MOE)
       for size, l, e in (("120b", 36, 128), ("20b", 24, 32))},
}

MODELS: dict[str, Transformer] = {**PRESETS, **MOE_PRESETS, **SAGEMAKER}


def model_key(name: str) -> str:
    """A model's name as the registry keys it: case and underscores as you like."""
    return name.strip().lower().replace("_", "-")


def find_model(model: Transformer | str) -> Transformer:
    """`model` itself, or the named model (case and underscores as you like); ValueError
    naming the known ones."""
    if isinstance(model, Transformer):
        return model
    if not isinstance(model, str):
        raise TypeError(f"model must be a sim.Transformer or a model name; got {type(model).__name__}")
    if model.endswith(".json"):
        return model_from_file(model)
    key = model_key(model)
    if key not in MODELS:
        raise ValueError(f"unknown model {model!r}; known: {', '.join(MODELS)}, or a FILE.json of "
                         f"sim.Transformer's fields")
    return MODELS[key]


def model_from_file(path: str | os.PathLike) -> Transformer:
    """A model without a preset: a JSON object of `sim.Transformer`'s fields, e.g.
    `{"layers": 32, "hidden": 4096, "heads": 32, "seq": 4096, "vocab": 32000, "arch": "llama"}`.
    ValueError (one line) naming the file and what is wrong."""
    try:
        fields = json.loads(Path(path).read_text())
    except OSError as e:
        raise ValueError(f"cannot read model file {path}: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"model file {path} is not JSON: {e.msg} at line {e.lineno}") from None
    known = [f.name for f in dataclasses.fields(Transformer)]
    if not isinstance(fields, dict) or set(fields) - set(known):
        extra = sorted(set(fields) - set(known)) if isinstance(fields, dict) else fields
        raise ValueError(f"model file {path}: unknown fields {extra}; give a JSON object of {', '.join(known)}")
    try:
        return Transformer(**fields)
    except TypeError as e:
        raise ValueError(f"model file {path}: {e}; the fields are {', '.join(known)}") from None
    except ValueError as e:
        raise ValueError(f"model file {path}: {e}") from None


def model_name(model: Transformer) -> str:
    """The registry's name of `model`, or its shape."""
    return next((n for n, candidate in MODELS.items() if candidate == model),
                f"l{model.layers}-h{model.hidden}-a{model.heads}-s{model.seq}-v{model.vocab}")
