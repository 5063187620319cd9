"""One registry of model names for the planner: sim.MODELS, SageMaker's and FILE.json (GPUs and profiles: `sim.hardware.profile.resolve`).

    >>> from sim.plan.names import find_model, model_name
    >>> model_name(find_model("sagemaker-gpt2-10b")), model_name(find_model("GPT3_175B"))
    ('sagemaker-gpt2-10b', 'gpt3-175b')

`sim.estimate`, `sim.plan.search` and `python -m sim.plan` all resolve names here, so a name
one of them takes, the others take too.
"""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

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
    if model.endswith(".json"):
        return model_from_file(model)
    key = model_key(model)
    known = models()
    if key not in known:
        raise ValueError(f"unknown model {model!r}; known: {', '.join(known)}, or a FILE.json of "
                         f"sim.Transformer's fields")
    return known[key]


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
    """The registry's name of `m`, or its shape."""
    return next((n for n, candidate in models().items() if candidate == model),
                f"l{model.layers}-h{model.hidden}-a{model.heads}-s{model.seq}-v{model.vocab}")
