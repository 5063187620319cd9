"""The cost model: how long each action takes and how many bytes it moves and keeps.

Every field of `Costs` is written once, in `sim.engine.fields.COST_FIELDS`: its default,
unit, what it is, whether it is per stage, and who else reads it. The dataclasses `Costs`
and `StageCosts`, their checks, `Costs.for_stages`, the docstring and the JSON of
`save_costs` follow from it here; the flags of `python -m sim.plot` and the call costs a
transport may model (`sim.engine.transports`) there.
"""
from __future__ import annotations

import dataclasses
import json
import math
import numbers
import os
import textwrap
from dataclasses import dataclass

from sim.files import atomic_write
from .fields import COST_FIELDS, CostField, PerStage

__all__ = ["Costs", "StageCosts", "save_costs", "load_costs", "jsonable", "copy_time", "pair_times", "first_excess"]


def _per_stage(name: str, value: PerStage, stages: int) -> tuple[float, ...]:
    if isinstance(value, bool):
        raise ValueError(f"Costs.{name} must be a number or one number per stage, got {value!r}")
    if isinstance(value, (int, float)):
        values = (float(value),) * stages
    else:
        values = tuple(float(v) for v in value)
        if len(values) != stages:
            raise ValueError(f"Costs.{name} has {len(values)} values but the schedule has {stages} stages")
    for v in values:
        if not math.isfinite(v) or v < 0:
            raise ValueError(f"Costs.{name} must be finite and >= 0, got {v}")
    return values


def _check_per_stage(name: str, value, optional: bool = False) -> None:
    """A per-stage field is a number or a non-empty sequence of numbers, each finite and
    >= 0 (`None` where `optional`); how many, `for_stages` checks against the stage count."""
    if value is None and optional:
        return
    if _is_number(value):
        values = [value]
    elif isinstance(value, (str, bytes, dict)) or not hasattr(value, "__iter__"):
        values = None
    else:
        values = list(value)
    if not values or not all(map(_is_number, values)):
        what = "a number, None" if optional else "a number"
        raise ValueError(f"Costs.{name} must be {what} or a sequence of numbers (one per stage), got {value!r}")
    for i, v in enumerate(values):
        if not (math.isfinite(v) and v >= 0):
            at = "" if _is_number(value) else f"[{i}]"
            raise ValueError(f"Costs.{name}{at} must be finite and >= 0, got {v!r}")


def _check_scalar(f: CostField, v) -> None:
    """A field of one number: finite (or math.inf where `f.inf`), >= 0 (> 0 where `f.positive`)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v) or (math.isinf(v) and not f.inf) \
            or v < 0 or (f.positive and v == 0):
        need = ("a number" if f.inf else "a finite number") + (" > 0" if f.positive else " >= 0")
        raise ValueError(f"Costs.{f.name} must be {need}{' (math.inf allowed)' if f.inf else ''}, got {v!r}")


_PLAIN_NUMBERS = frozenset((float, int))  # asked first: the ABC's isinstance is ten times slower


def _is_number(v) -> bool:
    return type(v) in _PLAIN_NUMBERS or (isinstance(v, numbers.Real) and not isinstance(v, bool))


def _with_fields(expanded: bool):
    """A class decorator: the fields of `COST_FIELDS`, as a frozen dataclass. `expanded`:
    per-stage fields as tuples, one value per stage, and no defaults (`StageCosts`)."""
    def make(cls):
        cls.__annotations__ = {f.name: ("tuple[float, ...]" if f.per_stage else f.annotation.split(" |")[0])
                               if expanded else f.annotation for f in COST_FIELDS}
        if not expanded:
            for f in COST_FIELDS:
                setattr(cls, f.name, f.default)
        return dataclass(frozen=True)(cls)
    return make


def _doc(head: str) -> str:
    """`head`, then a bullet per field of `COST_FIELDS`: its unit, default and meaning."""
    def line(f: CostField) -> str:
        what = f"{f.unit}{', per stage' if f.per_stage else ''}"
        text = f"- {f.name} ({what}; default {f.default_text()}): {f.help}.{' ' + f.doc if f.doc else ''}"
        return textwrap.fill(text, 92, initial_indent="    ", subsequent_indent="      ", break_on_hyphens=False)
    return head + "\n\n" + "\n".join(map(line, COST_FIELDS)) + "\n"


@_with_fields(expanded=False)
class Costs:
    def __post_init__(self):
        for f in COST_FIELDS:
            if f.per_stage:
                _check_per_stage(f.name, getattr(self, f.name), optional=f.fallback is not None)
            elif f.unit != "name":
                _check_scalar(f, getattr(self, f.name))
        from .transports import transport_class
        transport_class(self.transport).check(self)

    def for_stages(self, stages: int) -> "StageCosts":
        """Expand every per-stage field to one value per stage, checking the lengths."""
        out = {f.name: _per_stage(f.name, getattr(self, f.name), stages) if f.per_stage else getattr(self, f.name)
               for f in COST_FIELDS if f.fallback is None or getattr(self, f.name) is not None}
        for f in COST_FIELDS:
            if f.name not in out:
                field, factor = f.fallback
                out[f.name] = out[field] if factor == 1 else tuple(factor * v for v in out[field])
        for f in COST_FIELDS:
            if not f.per_stage and f.unit != "name":
                out[f.name] = float(out[f.name])
        off, act = out["offload_bytes"], out["activation_bytes"]
        if any(o > a for o, a in zip(off, act)):
            s = next(s for s, (o, a) in enumerate(zip(off, act)) if o > a)
            raise ValueError(f"Costs.offload_bytes of stage {s} ({off[s]:g}) exceeds its activation_bytes "
                             f"({act[s]:g}); a stage offloads at most the activations it keeps")
        return StageCosts(**out)

    def to_dict(self) -> dict:
        """The costs as plain JSON data (an infinity as the string "inf")."""
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, (list, tuple)):
                v = [float(x) for x in v]
            elif isinstance(v, float) and math.isinf(v):
                v = "inf"
            out[f.name] = v
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "Costs":
        """Inverse of `to_dict`; fields left out take their defaults."""
        if not isinstance(data, dict):
            raise ValueError(f"costs must be a JSON object of Costs fields, got {type(data).__name__}")
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = set(data) - set(known)
        if unknown:
            raise ValueError(f"unknown Costs fields {sorted(unknown)}; expected some of {known}")
        kwargs = {}
        for name, v in data.items():
            if v == "inf":
                v = math.inf
            elif isinstance(v, list):
                v = tuple(float(x) for x in v)
            kwargs[name] = v
        return cls(**kwargs)


Costs.__doc__ = _doc("""What the simulator needs to know about the model and the machine.

    Times in seconds (or any unit, used consistently), sizes in bytes. Per-stage fields
    take one number for every stage or one value per stage. The fields (`COST_FIELDS`):""")


@_with_fields(expanded=True)
class StageCosts:
    """`Costs` with every per-stage field expanded to a tuple of length `stages`."""

    def static_total(self, stage: int) -> float:
        """Bytes stage `stage` holds for the whole step: weights, gradients, optimizer
        state and the rest."""
        return self.weight_bytes[stage] + self.grad_bytes[stage] + self.optimizer_bytes[stage] + self.static_bytes[stage]

    def transfer_time(self, nbytes: float) -> float:
        """Time a transfer of `nbytes` occupies its link (the latency comes on top)."""
        return 0.0 if math.isinf(self.bandwidth) else nbytes / self.bandwidth


def save_costs(costs: Costs, path: str | os.PathLike, details: dict | None = None) -> None:
    """Write `costs` (and the JSON-able `details`, if given) to `path`, whole or not at all."""
    doc = {"costs": costs.to_dict()}
    if details is not None:
        doc["details"] = jsonable(details)
    with atomic_write(path) as f:
        json.dump(doc, f, indent=1, allow_nan=False)


def load_costs(path: str | os.PathLike) -> Costs:
    """Read `Costs` written by `save_costs`. A file that is missing, a folder, unreadable,
    not JSON, not costs or with costs `Costs` refuses (a negative time, a list of the
    wrong type) raises ValueError naming the file."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file; write one with sim.save_costs") from None
    except IsADirectoryError:
        raise ValueError(f"{path} is a directory; give the costs file (sim.save_costs writes one)") from None
    except OSError as e:
        raise ValueError(f"{path} cannot be read: {e.strerror or e}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not JSON ({e}); expected the costs file that sim.save_costs writes") from None
    if not isinstance(doc, dict) or "costs" not in doc:
        raise ValueError(f"{path} holds no costs; expected a JSON object with a 'costs' key as save_costs writes")
    try:
        return Costs.from_dict(doc["costs"])
    except (ValueError, TypeError, AttributeError) as e:
        raise ValueError(f"{path}: {str(e).splitlines()[0]}") from None


def jsonable(x):
    """`x` as standard JSON data: infinities and NaN as strings, tuples as lists, keys as str."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if hasattr(x, "tolist"):
        return x.tolist()
    return str(x)


def copy_time(nbytes: float, bandwidth: float, latency: float = 0.0) -> float:
    """Seconds one copy of `nbytes` over PCIe takes: nbytes / bandwidth + latency
    (bandwidth in bytes/s in the copy's direction; math.inf = free)."""
    if not bandwidth > 0 or not latency >= 0 or not nbytes >= 0:
        raise ValueError(f"copy_time needs nbytes >= 0, bandwidth > 0 and latency >= 0, "
                         f"got {nbytes!r}, {bandwidth!r}, {latency!r}")
    return (0.0 if math.isinf(bandwidth) else nbytes / bandwidth) + latency


def pair_times(forward: float, a2a_forward: float, backward: float, a2a_backward: float) -> tuple[float, float]:
    """The shares of an overlapped forward-backward pair's time (docs/rules.md, rule 18):
    each compute with what of its all-to-all the other's compute does not hide,
    (forward + max(0, a2a_forward - backward), backward + max(0, a2a_backward - forward)).
    Their sum, the pair's time, is the two computes and the two all-to-alls less
    min(a2a_forward, backward) + min(a2a_backward, forward)."""
    return forward + max(0.0, a2a_forward - backward), backward + max(0.0, a2a_backward - forward)


def first_excess(most: float, tau: float, d: float) -> float:
    """Rule 19: what a rank's first compute of a step, of duration `d`, takes more. The core
    starts the step `most` / `tau` below its speed and recovers with time constant `tau`: the
    compute loses the integral of that deficit over its duration, most x (1 - exp(-d / tau)).
    `tau` 0: `most`, whatever `d`."""
    return -most * math.expm1(-d / tau) if tau > 0 else most
