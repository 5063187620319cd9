"""One registry of model names for the planner: sim.MODELS and SageMaker's (GPUs and profiles: `sim.hardware.profile.resolve`).

    >>> from sim.plan.names import find_model, model_name
    >>> model_name(find_model("sagemaker-gpt2-10b")), model_name(find_model("GPT3_175B"))
    ('sagemaker-gpt2-10b', 'gpt3-175b')

`sim.estimate`, `sim.plan.search` and `python -m sim.plan` all resolve names here, so a name
one of them takes, the others take too.
"""
from __future__ import annotations

from sim.model.sagemaker import MODELS as SAGEMAKER
from sim.model.transformer import MODELS, Transformer, model_key


def models() -> dict[str, Transformer]:
    """Every named model: the presets (`sim.MODELS`) and SageMaker's GPT-2 models."""
    return {**MODELS, **SAGEMAKER}


def find_model(model: Transformer | str) -> Transformer:
    """`model` itself, or the named model (case and underscores as you like); ValueError
    naming the known ones."""
    if isinstance(model, Transformer):
        return model
    if not isinstance(model, str):
        raise TypeError(f"model must be a sim.Transformer or a model name; got {type(model).__name__}")
    key = model_key(model)
    known = models()
    if key not in known:
        raise ValueError(f"unknown model {model!r}; known: {', '.join(known)}")
    return known[key]


def model_name(m: Transformer) -> str:
    """The registry's name of `m`, or its shape."""
    return next((n for n, x in models().items() if x == m),
                f"l{m.layers}-h{m.hidden}-a{m.heads}-s{m.seq}-v{m.vocab}")
