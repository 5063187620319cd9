"""`sim` and `exec` stay light: importing them must not pull in torch (or, for sim, exec); exec's front door names resolve.

Each import is a fresh one in this process (`helpers.fresh_import`), as a new interpreter
would make it, with torch refused: an import of torch anywhere on the way is seen."""
import importlib
import pkgutil
from pathlib import Path

from helpers import fresh_import

ROOT = Path(__file__).resolve().parents[2]


def test_a_fresh_import_sees_what_it_pulls_in():
    """The check itself: sim builds on SimPy, so refusing simpy is seen; a refused module
    is put back afterwards."""
    import simpy
    assert fresh_import("sim", refuse=("simpy",)) == {"simpy"}
    assert importlib.import_module("simpy") is simpy


def test_import_sim_does_not_import_torch():
    assert fresh_import("sim", "sim.plot", refuse=("torch", "exec")) == set()


def test_import_exec_does_not_import_torch_and_every_exported_name_resolves():
    """`import exec` imports no torch; each name of `exec.__all__` is then the object its
    module defines under that name (PEP 562: imported on first use)."""
    assert fresh_import("exec") == set(), "import exec imported torch"
    import exec
    bad = [n for n in exec.__all__ if getattr(exec, n) is not getattr(importlib.import_module(exec.EXPORTS[n]), n)]
    assert not bad


def test_no_exported_name_is_also_a_module_of_exec():
    """`import exec.X` sets the attribute `exec.X` to the module: an exported name X would
    then mean the module or the function depending on what was imported first."""
    import exec
    modules = {m.name for m in pkgutil.iter_modules([str(ROOT / "exec")])}
    assert not modules & set(exec.__all__)
    assert set(exec.__all__) == set(exec.EXPORTS) and "run_pipeline" in dir(exec)
