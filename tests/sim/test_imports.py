"""`sim` and `exec` stay light: importing them must not pull in torch (or, for sim, exec); exec's front door names resolve."""
import pkgutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_import_sim_does_not_import_torch():
    code = "import sim, sim.plot, sys; bad = [m for m in ('torch', 'exec') if m in sys.modules]; print(bad); sys.exit(bool(bad))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


def test_import_exec_does_not_import_torch_and_every_exported_name_resolves():
    """`import exec` imports no torch; each name of `exec.__all__` is then the object its
    module defines under that name (PEP 562: imported on first use)."""
    code = ("import sys, importlib, exec; assert 'torch' not in sys.modules, 'import exec imported torch'; "
            "bad = [n for n in exec.__all__ if getattr(exec, n) is not "
            "getattr(importlib.import_module(exec.EXPORTS[n]), n)]; print(bad); sys.exit(bool(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr


def test_no_exported_name_is_also_a_module_of_exec():
    """`import exec.X` sets the attribute `exec.X` to the module: an exported name X would
    then mean the module or the function depending on what was imported first."""
    import exec
    modules = {m.name for m in pkgutil.iter_modules([str(ROOT / "exec")])}
    assert not modules & set(exec.__all__)
    assert set(exec.__all__) == set(exec.EXPORTS) and "run_pipeline" in dir(exec)
