"""`sim` stays light: importing it must not pull in torch (or exec)."""
import subprocess
import sys


def test_import_sim_does_not_import_torch():
    code = "import sim, sim.plot, sys; bad = [m for m in ('torch', 'exec') if m in sys.modules]; print(bad); sys.exit(bool(bad))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
