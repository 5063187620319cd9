"""The tutorials run top to bottom, as notebooks/build.py builds them from their
percent-format sources (notebooks/sources/0*.py, the only form git tracks).

Each notebook is built and executed in memory (nothing on disk is read but the source, nor
written), with nbclient in a fresh python3 kernel started in notebooks/. A failing assertion
in a notebook (it checks the closed forms against the simulator) fails the test.
"""
from __future__ import annotations

import importlib.util
import shutil
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers import run_main, notebook_module

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK_DIR = ROOT / "notebooks"
NEEDS_TORCH = {"03_real_runs.py", "04_modern_schedules.py", "06_closing_the_loop.py"}

nbformat = pytest.importorskip("nbformat")




build, nbhelp = notebook_module("build"), notebook_module("nbhelp")
SOURCES = build.sources()


def test_the_tutorials_are_found_by_their_names():
    """Every notebooks/sources/<two digits>_<name>.py is a tutorial, in order (a new one needs no list)."""
    on_disk = sorted(p.name for p in build.SOURCES.iterdir() if p.suffix == ".py")
    assert [p.name for p in SOURCES] == on_disk and len(on_disk) >= 8
    assert on_disk[:2] == ["01_why_pipelines.py", "02_memory.py"]
    assert [build.target(p).name for p in SOURCES[:1]] == ["01_why_pipelines.ipynb"]
    assert build.target(SOURCES[0]).parent == NOTEBOOK_DIR  # beside nbhelp.py, which its kernel imports


@pytest.mark.parametrize("source", SOURCES, ids=[p.name for p in SOURCES])
def test_each_source_builds_a_valid_notebook_without_outputs(source):
    nb = nbformat.reads(build.build(source), as_version=4)
    nbformat.validate(nb)
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# ")  # its title
    for i, cell in enumerate(nb.cells):
        assert cell.id == f"cell-{i:02d}"  # stable: a rebuild changes nothing
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{source.name} cell {i}"


def _with_notebooks(monkeypatch, tmp_path):
    """build.py on copies of the sources in tmp_path/sources, writing its notebooks into
    tmp_path (as it does into notebooks/): the notebooks written."""
    (tmp_path / "sources").mkdir()
    copies = [Path(shutil.copy(p, tmp_path / "sources")) for p in SOURCES]
    monkeypatch.setattr(build, "sources", lambda: copies)
    monkeypatch.setattr(build, "target", lambda source: tmp_path / f"{source.stem}.ipynb")
    assert run_main(build.main).returncode == 0
    return sorted(tmp_path.glob("*.ipynb"))


def test_build_check_names_a_notebook_whose_cells_are_not_its_sources(monkeypatch, tmp_path):
    """`--check` passes on what the build writes, outputs or not (a notebook run in Jupyter),
    and names a notebook edited in Jupyter and not carried back (`--sources`)."""
    built = _with_notebooks(monkeypatch, tmp_path)
    assert [p.stem for p in built] == [p.stem for p in SOURCES]
    nb = nbformat.read(built[0], as_version=4)
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", name="stdout", text="ran\n")]
    nbformat.write(nb, built[0])
    assert run_main(build.main, "--check").returncode == 0
    nb.cells[1].source += "\nP = 6"
    nbformat.write(nb, built[0])
    check = run_main(build.main, "--check")
    assert check.returncode == 1 and check.stderr.count("\n") == 1 and built[0].name in check.stderr


def test_build_sources_carries_edits_back(monkeypatch, tmp_path):
    built = _with_notebooks(monkeypatch, tmp_path)
    nb = nbformat.read(built[0], as_version=4)
    nb.cells[1].source += "\nP = 6"
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", name="stdout", text="an output line\n")]
    nbformat.write(nb, built[0])
    built[-1].unlink()  # a notebook not built: its source is left as it is
    assert run_main(build.main, "--sources").returncode == 0
    copies = build.sources()
    assert build.read_percent(copies[0].read_text())[1].source.endswith("\nP = 6")
    assert "an output line" not in copies[0].read_text()  # outputs dropped
    cells = [[(c.cell_type, c.source) for c in build.read_percent(p.read_text())] for p in copies[1:]]
    assert cells == [[(c.cell_type, c.source) for c in build.read_percent(p.read_text())] for p in SOURCES[1:]]
    assert copies[-1].read_text() == SOURCES[-1].read_text()  # not built: left as it is


@pytest.mark.parametrize("args", [["--force"], ["--html"], ["--check", "--sources"], ["--html", "a", "b"]])
def test_build_refuses_bad_arguments(args):
    bad = run_main(build.main, *args)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and args[0] in bad.stderr


def test_sources_read_back_as_they_are_written():
    for path in SOURCES:
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


def test_sliders_on_a_static_page_draw_once_and_say_where_they_are(monkeypatch, capsys):
    """build.py --html sets nbhelp.STATIC in the kernel: one figure, at the values, even with ipywidgets."""
    monkeypatch.setenv(nbhelp.STATIC, "1")
    calls = []
    nbhelp.sliders(lambda p: calls.append(p), p=nbhelp.Int(3, 1, 8))
    assert calls == [3] and capsys.readouterr().out == nbhelp.STATIC_HINT + "\n"
    assert build.STATIC == nbhelp.STATIC


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


@pytest.mark.slow
@pytest.mark.parametrize("source", SOURCES, ids=[p.name for p in SOURCES])
def test_notebook_runs(source):
    pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    if source.name in NEEDS_TORCH and importlib.util.find_spec("torch") is None:
        pytest.skip("needs torch: pip install -e '.[exec]'")
    nb = build.notebook_of(source)
    t = time.perf_counter()
    build.execute(nb)  # raises CellExecutionError, with the cell and its traceback, if a cell fails
    print(f"{source.name}: {time.perf_counter() - t:.1f} s")
    images = sum("image/png" in out.get("data", {}) for c in nb.cells if c.cell_type == "code" for out in c.outputs)
    assert images >= 2, f"{source.name} drew {images} inline figures"
