"""`python -m sim.plot` as a new user meets it: large steps draw in bounded time and size,
steps too large are refused at once, units everywhere, `--help` shows the defaults.

Each test runs the command in a subprocess with a time limit; the limits are generous
(the machine is shared), the times measured are in docs/measurements.md."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sim.plot import DPI, MAX_HEIGHT, WIDTH

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sim.plot", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) in pixels, from the PNG's header."""
    data = path.read_bytes()[:24]
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


# ---------------------------------------------------------------- 1. large figures

def test_large_step_draws_in_bounded_time_and_size(tmp_path):
    """64 stages x 512 micro-batches: about 10 s here (it took 13 minutes, 4.3 GB and a
    4212-pixel-tall figure with a patch per bar); the limit leaves room for a loaded machine."""
    proc = run_cli("--stages", "64", "--micro", "512", "--out", str(tmp_path), timeout=240)
    assert proc.returncode == 0, proc.stderr
    pngs = sorted(tmp_path.glob("*.png"))
    assert [p.name for p in pngs] == ["1f1b_p64_m512.png", "compare_p64_m512.png", "gpipe_p64_m512.png",
                                      "naive_p64_m512.png"]
    for png in pngs:
        width, height = png_size(png)
        assert width <= WIDTH * DPI and height <= MAX_HEIGHT * DPI, png
    # progress on stderr: a line per figure, before it is drawn
    progress = [line for line in proc.stderr.splitlines() if " writing " in line]
    assert len(progress) == 4 and all(line.startswith("sim.plot: [") for line in progress)
    assert "heat map" in progress[0]
