"""One vocabulary in every public signature of sim and exec: `devices` (ranks), `micro_batches`
(a count), `stages` (model stages, devices x chunks), `micro` (a micro-batch's index only).

The rule, checked on the sources (nothing imported but sim, no torch):

1. `micro` is an index. A public parameter named `micro` is allowed only in a signature that
   also takes a `stage` (an action's coordinates, as `Action(stage, kind, micro)`); there it is
   the index of a micro-batch. Anywhere else it would be a count, which is `micro_batches`. The
   count spellings `micro_count`, `n_micro`, `num_micro`, `microbatches`, `num_microbatches`
   and `n_microbatches` are never used (`micros`, several indices, is fine).
2. `stages` never means devices. A signature that takes the chunks per device (`virtual` or
   `chunks`) names its device count `devices`, never `stages`: there the stages are the
   product of the two. `num_stages` and `n_stages` are never used (torch's `num_stages` is a
   keyword of torch's own classes, not ours).
3. Every generator of `sim.SCHEDULES` takes `(devices, micro_batches, virtual)`, its
   `check` the same, and its `placement` `(devices, virtual)`.

A public signature is that of a function or class (its `__init__`, or the fields of a
dataclass) whose name and module path have no leading underscore, and of the public methods
of such a class.
"""
from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import sim

ROOT = Path(__file__).resolve().parents[2]
MICRO_COUNTS = {"micro_count", "n_micro", "num_micro", "microbatches", "num_microbatches", "n_microbatches"}
STAGE_COUNTS = {"num_stages", "n_stages"}
CHUNKS = {"virtual", "chunks"}


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    a = fn.args
    return [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs) if p.arg not in ("self", "cls")]


def _is_dataclass(cls: ast.ClassDef) -> bool:
    return any("dataclass" in ast.unparse(d) for d in cls.decorator_list)


def _fields(cls: ast.ClassDef) -> list[str]:
    return [n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
            and "ClassVar" not in ast.unparse(n.annotation)]


def public_signatures(source: str) -> list[tuple[str, list[str]]]:
    """(qualified name, parameter names) of each public signature in one module's source."""
    out = []
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
            out.append((node.name, _params(node)))
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            if _is_dataclass(node):
                out.append((node.name, _fields(node)))
            for fn in node.body:
                if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                        (fn.name == "__init__" or not fn.name.startswith("_")):
                    out.append((f"{node.name}.{fn.name}", _params(fn)))
    return out


def breaks(params: list[str]) -> list[str]:
    """What in one signature breaks rules 1 and 2 (empty: nothing)."""
    found = [f"{p} (a count is micro_batches)" for p in params if p in MICRO_COUNTS]
    found += [f"{p} (stages are model stages)" for p in params if p in STAGE_COUNTS]
    if "micro" in params and "stage" not in params:
        found.append("micro without a stage: a count (micro_batches), not an index")
    if "stages" in params and CHUNKS & set(params):
        found.append(f"stages beside {sorted(CHUNKS & set(params))[0]}: the device count is devices")
    return found


def test_the_rule_reads_signatures_as_the_docstring_says():
    src = '''
def gen(stages, micro, virtual=1): ...
def needs(stage, kind, micro, stages): ...
def _private(micro): ...
class Run:
    def __init__(self, micro_count): ...
    def _hidden(self, micro): ...
@dataclass
class Config:
    micro: int
    devices: int
'''
    sigs = dict(public_signatures(src))
    assert set(sigs) == {"gen", "needs", "Run.__init__", "Config"}
    assert breaks(sigs["gen"]) == ["micro without a stage: a count (micro_batches), not an index",
                                   "stages beside virtual: the device count is devices"]
    assert breaks(sigs["needs"]) == []  # an action's index beside its stage; stages is the model's
    assert breaks(sigs["Run.__init__"]) == ["micro_count (a count is micro_batches)"]
    assert breaks(sigs["Config"]) == ["micro without a stage: a count (micro_batches), not an index"]


def _modules() -> list[Path]:
    return [p for pkg in ("sim", "exec") for p in sorted((ROOT / pkg).rglob("*.py"))
            if not any(part.startswith("_") and part not in ("__init__.py", "__main__.py")
                       for part in p.relative_to(ROOT).parts)]


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_public_signature_uses_micro_for_a_count_or_stages_for_devices(path):
    bad = {name: found for name, params in public_signatures(path.read_text()) if (found := breaks(params))}
    assert not bad, f"{path.relative_to(ROOT)}: {bad}"


@pytest.mark.parametrize("name", sorted(sim.SCHEDULES))
def test_every_generator_takes_devices_micro_batches_and_virtual(name):
    gen = sim.SCHEDULES[name]
    make = list(inspect.signature(gen.make).parameters)
    assert make[:3] == ["devices", "micro_batches", "virtual"], make
    for fn, want in ((gen.check, ["devices", "micro_batches", "virtual"]), (gen.placement, ["devices", "virtual"])):
        assert list(inspect.signature(fn).parameters)[:len(want)] == want, fn
