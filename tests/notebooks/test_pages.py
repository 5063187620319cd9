"""`python notebooks/build.py --html DIR`: the tutorials executed, as static web pages with
their figures embedded, an index linking them; a DIR that cannot be written is refused with
one line and exit status 2 before any notebook runs."""
from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

from helpers import counting_calls, run_main, notebook_module

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK_DIR = ROOT / "notebooks"
nbformat = pytest.importorskip("nbformat")




build, nbhelp = notebook_module("build"), notebook_module("nbhelp")


@pytest.mark.parametrize("make, says", [
    (lambda tmp: tmp.joinpath("a-file").write_text("x") and tmp / "a-file", "is not a folder"),
    (lambda tmp: tmp.joinpath("a-file").write_text("x") and tmp / "a-file" / "pages", "cannot create"),
], ids=["a file", "under a file"])
def test_html_refuses_a_dir_it_cannot_write_before_any_work(tmp_path, make, says):
    directory = make(tmp_path)
    with counting_calls(build.execute, build.write_pages) as calls:
        refused = run_main(build.main, "--html", str(directory))
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and says in refused.stderr, refused.stderr
    assert refused.stderr.startswith("build.py: error: --html DIR: ") and refused.stdout == ""
    assert set(calls.values()) == {0}


def test_html_without_its_packages_says_which(monkeypatch, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "nbconvert" else real(name, *a))
    refused = run_main(build.main, "--html", str(tmp_path))
    assert refused.returncode == 2 and refused.stderr == 'build.py: error: --html needs nbconvert: pip install -e ".[notebooks]"\n'


def test_a_page_links_tutorials_to_their_pages_and_the_repository_to_its_files(tmp_path):
    pytest.importorskip("nbconvert")
    nb = build.notebook([nbformat.v4.new_markdown_cell("# T\nNext: [02_memory.ipynb](02_memory.ipynb), "
                                                       "[rules](../docs/rules.md#rule-3), [web](https://x.org)")])
    html = build.page(nb, tmp_path / "pages")
    assert 'href="02_memory.html"' in html and 'href="https://x.org"' in html
    up = re.search(r'href="([^"]*docs/rules\.md)#rule-3"', html).group(1)
    assert (tmp_path / "pages" / up).resolve() == ROOT / "docs" / "rules.md"


@pytest.mark.slow
def test_html_writes_each_tutorial_executed_with_its_figures(tmp_path, monkeypatch):
    """Two tutorials (sim only, a few seconds each; every tutorial runs in test_notebooks.py)."""
    for package in ("nbclient", "nbconvert", "ipykernel"):
        pytest.importorskip(package)
    chosen = build.sources()[:2]
    monkeypatch.setattr(build, "sources", lambda: chosen)
    out = tmp_path / "pages" / "new"  # created, parents too
    written = run_main(build.main, "--html", str(out))
    assert written.returncode == 0, written.stderr
    assert sorted(p.name for p in out.iterdir()) == sorted([f"{p.stem}.html" for p in chosen] + ["index.html"])
    for source in chosen:
        html = (out / f"{source.stem}.html").read_text()
        assert len(re.findall(r'<img[^>]+src="data:image/png;base64,', html)) >= 2, source.name  # figures inside
        assert "Traceback" not in html and nbhelp.STATIC_HINT in html
        assert nbhelp.SLIDERS_HINT not in html
        assert f'href="{source.stem}.html"' in (out / "index.html").read_text()
    assert 'href="02_memory.html"' in (out / "01_why_pipelines.html").read_text()
