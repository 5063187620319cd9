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

from .sagemaker import MODELS as SAGEMAKER
from .transformer import Transformer

_MEGATRON = dict(seq=2048, vocab=51200)  # Narayanan et al. 2021, Sec. 5.1 and Table 1
_LLAMA2 = dict(seq=4096, vocab=32000, arch="llama")  # Touvron et al. 2023 (Llama 2), Sec. 2.2, Table 1
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
}

MODELS: dict[str, Transformer] = {**PRESETS, **SAGEMAKER}


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
    key = model_key(model)
    if key not in MODELS:
        raise ValueError(f"unknown model {model!r}; known: {', '.join(MODELS)}")
    return MODELS[key]


def model_name(m: Transformer) -> str:
    """The registry's name of `m`, or its shape."""
    return next((n for n, x in MODELS.items() if x == m),
                f"l{m.layers}-h{m.hidden}-a{m.heads}-s{m.seq}-v{m.vocab}")
