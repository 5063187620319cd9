"""The tutorials in notebooks/ run top to bottom, and are committed without outputs.

Each notebook is executed with nbclient in a fresh python3 kernel, in memory (the file on
disk is not touched), with notebooks/ as the working directory. A failing assertion in a
notebook (it checks the closed forms against the simulator) fails the test.
"""
from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = ROOT / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
NEEDS_TORCH = {"03_real_runs.ipynb", "04_modern_schedules.ipynb", "06_closing_the_loop.ipynb"}
CELL_TIMEOUT = 300  # seconds per cell

nbformat = pytest.importorskip("nbformat")


def test_there_are_tutorials():
    names = [p.name for p in NOTEBOOKS]
    for expected in ("01_why_pipelines.ipynb", "02_memory.ipynb", "03_real_runs.ipynb", "04_modern_schedules.ipynb",
                     "05_planning_a_real_run.ipynb", "06_closing_the_loop.ipynb"):
        assert expected in names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_is_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [], f"{path.name} cell {i} has outputs; run python notebooks/build.py"
            assert cell.execution_count is None, f"{path.name} cell {i} has an execution count"


def _quiet_manager():
    """A kernel manager that does not interrupt the kernel when it shuts it down.
    jupyter_client (8.x) interrupts before every shutdown, and ipykernel then logs
    "KeyboardInterrupt caught in kernel" although the notebook has finished."""
    from jupyter_client.manager import AsyncKernelManager

    class QuietShutdown(AsyncKernelManager):
        async def _async_interrupt_kernel(self) -> None:
            if not self.shutting_down:
                await super()._async_interrupt_kernel()
    return QuietShutdown


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path, monkeypatch):
    pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    if path.name in NEEDS_TORCH and importlib.util.find_spec("torch") is None:
        pytest.skip("needs torch: pip install -e '.[exec]'")
    from nbclient import NotebookClient

    # the kernel finds `sim` and `exec` even where the repo is not installed
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=CELL_TIMEOUT, kernel_name="python3", kernel_manager_class=_quiet_manager(),
                            resources={"metadata": {"path": str(NOTEBOOK_DIR)}})
    t = time.perf_counter()
    client.execute()  # raises CellExecutionError, with the cell and its traceback, if a cell fails
    print(f"{path.name}: {time.perf_counter() - t:.1f} s")
    images = sum("image/png" in out.get("data", {}) for c in nb.cells if c.cell_type == "code" for out in c.outputs)
    assert images >= 2, f"{path.name} drew {images} inline figures"
