"""The tutorials in notebooks/ run top to bottom, and are committed without outputs, as
notebooks/build.py writes them from their percent-format sources (notebooks/0*.py).

Each notebook is executed with nbclient in a fresh python3 kernel, in memory (the file on
disk is not touched), with notebooks/ as the working directory. A failing assertion in a
notebook (it checks the closed forms against the simulator) fails the test.
"""
from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers import run_main

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK_DIR = ROOT / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
NEEDS_TORCH = {"03_real_runs.ipynb", "04_modern_schedules.ipynb", "06_closing_the_loop.ipynb"}
CELL_TIMEOUT = 300  # seconds per cell

nbformat = pytest.importorskip("nbformat")


def _load(name: str):
    """notebooks/<name>.py as a module (notebooks/ is no package; `build` is also a PyPI name)."""
    spec = importlib.util.spec_from_file_location(f"notebooks_{name}", NOTEBOOK_DIR / f"{name}.py")
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build, nbhelp = _load("build"), _load("nbhelp")


def test_there_are_tutorials_each_built_from_its_source():
    names = [p.name for p in NOTEBOOKS]
    assert names == ["01_why_pipelines.ipynb", "02_memory.ipynb", "03_real_runs.ipynb", "04_modern_schedules.ipynb",
                     "05_planning_a_real_run.ipynb", "06_closing_the_loop.ipynb", "07_dense_on_h100.ipynb",
                     "08_mixture_of_experts.ipynb", "09_your_own_schedule.ipynb"]
    assert [p.with_suffix(".ipynb").name for p in build.sources()] == names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_is_what_its_source_builds(path):
    assert path.read_text() == build.build(path.with_suffix(".py")), \
        f"{path.name} differs from {path.with_suffix('.py').name}: run python notebooks/build.py"


def test_build_check_passes_and_refuses_bad_arguments():
    """`python notebooks/build.py --check` (its `main`, in this process): every notebook is
    what its source builds; an unknown argument is one line and exit status 2."""
    check = run_main(build.main, "--check")
    assert check.returncode == 0 and check.stderr == "", check.stderr
    bad = run_main(build.main, "--force")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--force" in bad.stderr


def test_sources_read_back_as_they_are_written():
    for path in build.sources():
        cells = [(c.cell_type, c.source) for c in build.read_percent(path.read_text(), path.name)]
        text = build.write_percent(build.read_percent(path.read_text()))
        assert [(c.cell_type, c.source) for c in build.read_percent(text)] == cells


_line = st.text(st.characters(codec="utf-8", exclude_characters="\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"),
                max_size=20)
_text = st.lists(_line, min_size=1, max_size=5).map("\n".join).map(lambda t: t.strip("\n")).filter(bool)


@given(st.lists(st.tuples(st.sampled_from(["code", "markdown"]), _text), max_size=6))
def test_percent_format_round_trip(cells):
    cells = [nbformat.v4.new_code_cell(t) if kind == "code" else nbformat.v4.new_markdown_cell(t)
             for kind, t in cells]
    try:
        text = build.write_percent(cells)
    except ValueError:  # a line that would read as a cell marker or a magic: refused, never misread
        assert any(line.startswith(("%%", "# %")) if c.cell_type == "code" else line.startswith("%%")
                   for c in cells for line in c.source.splitlines())
        return
    got = build.read_percent(text)
    assert [(c.cell_type, c.source) for c in got] == [(c.cell_type, c.source) for c in cells]


@pytest.mark.parametrize("text, says", [
    ("x = 1\n# %%\ny = 2\n", "s.py:1: text before the first cell marker"),
    ("# %% [markdown]\n# fine\nnot a comment\n", "s.py:3: a markdown line must be a comment"),
    ("# %% [raw]\nx\n", "s.py:1: unknown cell kind '[raw]'"),
])
def test_a_malformed_source_is_refused_naming_the_line(text, says):
    with pytest.raises(ValueError, match=says.replace("[", r"\[").replace("]", r"\]")):
        build.read_percent(text, "s.py")


def test_magics_are_commented_in_the_source():
    cells = build.read_percent("# %%\n# %matplotlib inline\n# a comment\nx = 1\n")
    assert cells[0].source == "%matplotlib inline\n# a comment\nx = 1"


def test_sliders_without_ipywidgets_draw_once_at_the_values(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # import ipywidgets raises ImportError
    calls = []
    nbhelp.sliders(lambda p, x, s: calls.append((p, x, s)), p=nbhelp.Int(3, 1, 8), x=nbhelp.Float(0.5, 0, 1, 0.1),
                   s=nbhelp.Choice("b", ["a", "b"]))
    assert calls == [(3, 0.5, "b")]
    assert capsys.readouterr().out == nbhelp.SLIDERS_HINT + "\n"


def test_sliders_with_ipywidgets_start_at_the_values():
    pytest.importorskip("ipywidgets")
    calls = []
    nbhelp.sliders(lambda p, x, s: calls.append((p, x, s)), p=nbhelp.Int(3, 1, 8), x=nbhelp.Float(0.5, 0, 1, 0.1),
                   s=nbhelp.Choice("b", ["a", "b"]))
    assert calls == [(3, 0.5, "b")]
    assert nbhelp.widget(nbhelp.Int(3, 1, 8)).max == 8 and nbhelp.widget(nbhelp.Float(0.5, 0, 1, 0.1)).step == 0.1


def test_sliders_refuse_what_is_not_a_control():
    with pytest.raises(TypeError, match="control 'p' is an Int, Float or Choice, not int"):
        nbhelp.sliders(print, p=3)


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
