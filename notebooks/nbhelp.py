"""What the tutorial notebooks share: `sim` found, sim.plot's figures shown inline, sliders or one figure.

Each notebook's setup cell runs `from nbhelp import Choice, Float, Int, show, sliders` (the
kernel starts in notebooks/, beside this file). Importing it puts the repository on the path
where it is not installed (pip install -e .), so that `import sim` and `import exec` work.
"""
from __future__ import annotations

import importlib.util
import io
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

ROOT = Path(__file__).resolve().parents[1]
if importlib.util.find_spec("sim") is None:  # the repo is not installed: it is the folder above this one
    sys.path.insert(0, str(ROOT))

SLIDERS_HINT = "pip install ipywidgets for sliders"
STATIC = "NBHELP_STATIC_PAGE"  # set (by build.py --html) where the notebook becomes a page: no sliders
STATIC_HINT = "(in the notebook, sliders above this figure redraw it)"


@dataclass(frozen=True)
class Int:
    """An integer slider from `low` to `high`, starting at `value`."""
    value: int
    low: int
    high: int


@dataclass(frozen=True)
class Float:
    """A slider over floats from `low` to `high` in steps of `step`, starting at `value`."""
    value: float
    low: float
    high: float
    step: float


@dataclass(frozen=True)
class Choice:
    """A drop-down list of `options`, starting at `value`."""
    value: Any
    options: Sequence[Any]


def show(fig, dpi: int = 100) -> None:
    """Display a figure of sim.plot inline (they are drawn without pyplot)."""
    from IPython.display import Image, display
    from sim.plot.bars import fit_labels

    fit_labels(fig)  # hide the micro-batch numbers that do not fit their bars
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    display(Image(buf.getvalue()))


def widget(control):
    """The ipywidgets widget of an Int, Float or Choice."""
    from ipywidgets import Dropdown, FloatSlider, IntSlider

    if isinstance(control, Int):
        return IntSlider(value=control.value, min=control.low, max=control.high, continuous_update=False)
    if isinstance(control, Float):
        return FloatSlider(value=control.value, min=control.low, max=control.high, step=control.step,
                           continuous_update=False)
    if isinstance(control, Choice):
        return Dropdown(options=list(control.options), value=control.value)
    raise TypeError(f"a control is an Int, Float or Choice, not {type(control).__name__}")


def sliders(fn: Callable[..., Any], **controls) -> None:
    """Call `fn` with one keyword argument per control: with ipywidgets installed, under
    sliders that call it again when moved (first at each control's value); without them,
    once, at each control's value, after a line saying how to get them (or, for a static
    page, build.py --html, where they are)."""
    for name, control in controls.items():
        if not isinstance(control, (Int, Float, Choice)):
            raise TypeError(f"control {name!r} is an Int, Float or Choice, not {type(control).__name__}")
    values = {name: control.value for name, control in controls.items()}
    if os.environ.get(STATIC):  # a static page: the figure at the values given, once
        print(STATIC_HINT)
        fn(**values)
        return
    try:
        from ipywidgets import interact
    except ImportError:  # no sliders: draw the values given once
        print(SLIDERS_HINT)
        fn(**values)
    else:
        interact(fn, **{name: widget(control) for name, control in controls.items()})
