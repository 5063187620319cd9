"""Megatron-Core's pipeline layout strings (`--pipeline-model-parallel-layout`): which layers each virtual stage holds.

A layout such as `"Et|(tt|)*30mL"` lists the model's virtual stages in order, separated by
`|`: `E` the embedding, `t` a transformer layer, `m` a multi-token-prediction layer, `L` the
loss (with the output layer); `(...)*n` repeats what the parentheses hold n times, `x*n`
one symbol, and commas are cosmetic. Stage s of P devices with V = stages / P chunks each is
on device s mod P (Megatron-Core's interleaved order). Megatron-Core's rules
(`PipelineParallelLayerLayout`, megatron/core/transformer/pipeline_parallel_layer_layout.py,
read; no code copied): the first symbol is the embedding and the last the loss, each once; no
transformer layer after the first MTP layer; the stage count a multiple of P.

`parse_layer_layout` reads one (`LayoutError`, one line, naming the place, on bad text),
`str()` writes it back in short form, `LayerLayout.check` applies the rules, `from_counts`
writes the layout of per-stage layer counts (what the planner's partition proposes);
`sim.plan.stage_costs.priced` gives each stage the sum of the costs of what it holds.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass


SYMBOLS = {"E": "embedding", "t": "transformer layer", "m": "MTP layer", "L": "loss"}


class LayoutError(ValueError):
    """A layout string that is not Megatron-Core's grammar, or breaks its rules."""


@dataclass(frozen=True)
class LayerLayout:
    """The virtual stages in order, each the string of symbols it holds (`SYMBOLS`)."""

    stages: tuple[str, ...]

    def __str__(self) -> str:
        """The short form: a run of k > 1 equal stages before the last as `(S|)*k`, a run of
        n > 2 equal symbols as `x*n` (`parse_layer_layout` reads it back to this layout)."""
        parts = []
        runs = [(stage, len(list(group))) for stage, group in itertools.groupby(self.stages)]
        for i, (stage, k) in enumerate(runs):
            if i == len(runs) - 1:  # the last stage has no `|` after it
                parts.append(f"({_short(stage)}|)*{k - 1}" if k > 2 else f"{_short(stage)}|" * (k - 1))
                parts.append(_short(stage))
            else:
                parts.append(f"({_short(stage)}|)*{k}" if k > 1 else f"{_short(stage)}|")
        return "".join(parts)

    @property
    def layers(self) -> list[int]:
        """Transformer layers per stage."""
        return [stage.count("t") for stage in self.stages]

    @property
    def mtp(self) -> list[int]:
        """MTP layers per stage."""
        return [stage.count("m") for stage in self.stages]

    def holds(self, symbol: str) -> list[int]:
        """How many of `symbol` each stage holds."""
        return [stage.count(symbol) for stage in self.stages]

    def virtual(self, devices: int) -> int:
        """Chunks per device: the stages over `devices`, which must divide them (`check`)."""
        self.check(devices)
        return len(self.stages) // devices

    def check(self, devices: int | None = None, layers: int | None = None) -> "LayerLayout":
        """Megatron-Core's rules, for `devices` pipeline devices and `layers` transformer
        layers where given; returns the layout, or raises `LayoutError` naming the rule."""
        flat = "".join(self.stages)
        for symbol, where in (("E", 0), ("L", -1)):
            if flat.count(symbol) != 1 or not flat or flat[where] != symbol:
                first = "first" if where == 0 else "last"
                raise LayoutError(f"layout {self}: the {SYMBOLS[symbol]} {symbol} must be the {first} symbol, once; "
                                  f"found {flat.count(symbol)}")
        if "m" in flat and "t" in flat[flat.index("m"):]:
            raise LayoutError(f"layout {self}: a transformer layer t after an MTP layer m; Megatron-Core places "
                              f"every t before the first m")
        if devices is not None and len(self.stages) % devices:
            raise LayoutError(f"layout {self}: {len(self.stages)} stages do not split over {devices} devices; "
                              f"give a multiple of {devices} (V stages a device)")
        if layers is not None and flat.count("t") != layers:
            raise LayoutError(f"layout {self}: {flat.count('t')} transformer layers t, the model has {layers}")
        return self


def _short(stage: str) -> str:
    return "".join(f"{s}*{n}" if n > 2 else s * n
                   for s, n in ((s, len(list(g))) for s, g in itertools.groupby(stage)))


def parse_layer_layout(text: str) -> LayerLayout:
    """Read a layout string in Megatron-Core's grammar (module docstring); `LayoutError`
    naming the position of what is wrong."""
    if not isinstance(text, str):
        raise LayoutError(f"a layout is a string such as 'Et|(tt|)*3tL', got {text!r}")
    stages = _expand(text.replace(",", ""), text).split("|")
    for s, stage in enumerate(stages):
        bad = next((c for c in stage if c not in SYMBOLS), None)
        if bad is not None:
            known = ", ".join(f"{k} ({v})" for k, v in SYMBOLS.items())
            raise LayoutError(f"layout {text!r}: stage {s} holds {bad!r}, not a layer; known: {known}")
    return LayerLayout(tuple(stages))


def _expand(text: str, whole: str) -> str:
    """`text` with every `(...)*n` and `x*n` written out."""
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c == "(":
            close = text.find(")", i)
            if close < 0:
                raise LayoutError(f"layout {whole!r}: '(' at {i} is never closed")
            inner = text[i + 1:close]
            if "(" in inner:
                raise LayoutError(f"layout {whole!r}: '(' inside '(' at {i}; Megatron-Core's grammar does not nest them")
            n, i = _count(text, close + 1, whole)
            out.append(_expand(inner, whole) * n)
        elif c in ")*":
            raise LayoutError(f"layout {whole!r}: {c!r} at {i} follows no '(' or symbol; write (...)*n or x*n")
        elif text[i + 1:i + 2] == "*":
            n, i = _count(text, i + 1, whole)
            out.append(c * n)
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _count(text: str, at: int, whole: str) -> tuple[int, int]:
    """The n of `*n` starting at `at`, and where the text goes on."""
    end = at + 1
    while end < len(text) and text[end].isdigit():
        end += 1
    if text[at:at + 1] != "*":
        raise LayoutError(f"layout {whole!r}: ')' at {at - 1} needs a count '*n' after it, got {text[at:at + 1]!r}")
    if end == at + 1:
        raise LayoutError(f"layout {whole!r}: '*' at {at} needs a count n, got {text[at + 1:at + 2]!r}")
    return int(text[at + 1:end]), end


def from_counts(layers: list[int]) -> LayerLayout:
    """The layout of `layers[s]` transformer layers on stage s, the embedding on the first
    stage and the loss on the last (as `sim.estimate` prices a partition)."""
    stages = ["t" * n for n in layers]
    stages[0] = "E" + stages[0]
    stages[-1] += "L"  # after: with one stage, the same one
    return LayerLayout(tuple(stages)).check()
