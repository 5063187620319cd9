"""Running the tutorials leaves the checkout as it was: git tracks the sources
(notebooks/sources/*.py) only, the notebooks that notebooks/build.py writes from them and
JupyterLab's checkpoints are ignored, the tests never read a built notebook, and every
relative link in a tutorial points to a file (and heading) that exists.

The slow test plays a student on a fresh copy of this checkout: build the notebooks, run
them in JupyterLab (its autosave writes outputs into each notebook and a checkpoint beside
it), then `git status` and the notebook tests.
"""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import notebook_module

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK_DIR = ROOT / "notebooks"
nbformat = pytest.importorskip("nbformat")




build = notebook_module("build")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")  # a markdown link's target


def heading_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a document's headings: lower case, punctuation but `-` and `_`
    dropped, spaces made `-`, a repeated one numbered (`-1`, `-2`)."""
    anchors, seen, fenced = set(), {}, False
    for line in markdown.splitlines():
        fenced ^= line.startswith("```")
        heading = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading and not fenced:
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-")
            anchors.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
            seen[slug] = seen.get(slug, 0) + 1
    return anchors


def test_heading_anchors_are_githubs():
    text = "# Schedules\n## Zero bubble: ZB-H1, ZB-H2, ZB-V\n```\n# not a heading\n```\n## Step x rank\n## Step x rank\n"
    assert heading_anchors(text) == {"schedules", "zero-bubble-zb-h1-zb-h2-zb-v", "step-x-rank", "step-x-rank-1"}


def broken_links(text: str) -> list[str]:
    """The relative links of a tutorial source's markdown cells that point to no file, or to
    no heading of the file (a link is relative to notebooks/, where the notebook is built; a
    link to a notebook counts when its source exists)."""
    markdown = "\n".join(c.source for c in build.read_percent(text) if c.cell_type == "markdown")
    broken = []
    for target in LINK.findall(markdown):
        if re.match(r"[a-z]+:", target):  # https:, mailto: ...
            continue
        path, _, anchor = target.partition("#")
        file = (NOTEBOOK_DIR / path).resolve()
        if path and file.suffix == ".ipynb" and file.parent == NOTEBOOK_DIR:  # built by build.py from its source
            file = build.SOURCES / f"{file.stem}.py"
        if path and not file.is_file():
            broken.append(f"{target} (no file {file})")
        elif anchor and (path == "" or file.suffix == ".md"):
            if anchor not in heading_anchors(file.read_text() if path else markdown):
                broken.append(f"{target} (no heading #{anchor})")
    return broken


def test_broken_links_are_found():
    text = ("# %% [markdown]\n# ## Explore\n# [ok](../docs/schedules.md#zero-bubble-zb-h1-zb-h2-zb-v), "
            "[web](https://x.org/a.md), [here](#explore)\n"
            "# [gone](../docs/zero_bubble.md), [no heading](../docs/schedules.md#zero-bubble), [not here](#sumary)\n"
            "# [next](01_why_pipelines.ipynb), [no such](99_none.ipynb)\n"
            "# %%\nx = '[code](is_not_a_link.md)'\n")
    assert [b.split(" ")[0] for b in broken_links(text)] == [
        "../docs/zero_bubble.md", "../docs/schedules.md#zero-bubble", "#sumary", "99_none.ipynb"]


@pytest.mark.parametrize("source", build.sources(), ids=[p.name for p in build.sources()])
def test_every_relative_link_of_a_tutorial_exists(source):
    assert broken_links(source.read_text()) == []


def test_tutorial_sources_live_in_notebooks_sources():
    """A tutorial source dropped beside the notebooks would show twice in JupyterLab's file
    browser (its .py and the .ipynb built from it) and would not be built: it belongs in
    notebooks/sources/."""
    stray = sorted(p.name for p in NOTEBOOK_DIR.glob("[0-9][0-9]_*.py"))
    assert stray == [], f"move {', '.join(stray)} to notebooks/sources/ (python notebooks/build.py builds from there)"


def _git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True, timeout=60).stdout


def _fresh_copy(into: Path) -> Path:
    """This checkout's files as a fresh clone has them (tracked, and new files git does not
    ignore), committed in a repository of their own."""
    listed = _git("ls-files", "-z", "--cached", "--others", "--exclude-standard", cwd=ROOT).split("\0")
    for name in filter(None, listed):
        if (ROOT / name).is_file():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, into / name)
    _git("init", "-q", cwd=into)
    _git("add", "-A", cwd=into)
    _git("-c", "user.name=test", "-c", "user.email=test@localhost", "commit", "-q", "-m", "copy", cwd=into)
    return into


def autosave(path: Path) -> None:
    """What JupyterLab leaves after Run All Cells: the notebook saved with its outputs,
    execution counts and the kernel's language_info, a checkpoint beside it, and the
    kernel's bytecode of nbhelp."""
    nb = nbformat.read(path, as_version=4)
    for count, cell in enumerate(c for c in nb.cells if c.cell_type == "code"):
        cell.execution_count = count + 1
        cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="1f1b  bubble 27.3%\n"),
                        nbformat.v4.new_output("display_data", data={"image/png": "iVBORw0KGgo="})]
    nb.metadata.language_info = {"name": "python", "version": "3.11.7", "mimetype": "text/x-python",
                                 "file_extension": ".py", "pygments_lexer": "ipython3"}
    nbformat.write(nb, path)
    (path.parent / ".ipynb_checkpoints").mkdir(exist_ok=True)
    shutil.copy(path, path.parent / ".ipynb_checkpoints" / f"{path.stem}-checkpoint.ipynb")
    (path.parent / "__pycache__").mkdir(exist_ok=True)
    (path.parent / "__pycache__" / "nbhelp.cpython-311.pyc").write_bytes(b"\0")


@pytest.mark.slow
def test_running_the_tutorials_leaves_git_status_clean_and_the_tests_green(tmp_path):
    repo = _fresh_copy(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(repo)}
    subprocess.run([sys.executable, "notebooks/build.py"], cwd=repo, env=env, check=True, timeout=120,
                   capture_output=True)
    built = sorted((repo / "notebooks").glob("*.ipynb"))
    assert [p.stem for p in built] == [p.stem for p in build.sources()]
    for path in built:
        autosave(path)
    assert _git("status", "--porcelain", "--untracked-files=all", cwd=repo) == ""
    browser = [p.name for p in (repo / "notebooks").iterdir() if not p.name.startswith(".")]  # what JupyterLab lists
    for path in built:
        assert [n for n in browser if n.startswith(path.stem)] == [path.name], sorted(browser)
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "not slow", "-p", "no:cacheprovider",
                            "tests/notebooks"], cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    assert tests.returncode == 0, tests.stdout[-3000:]
    assert _git("status", "--porcelain", "--untracked-files=all", cwd=repo) == ""


def test_the_tutorials_put_the_sliders_above_the_figure():
    """ipywidgets' `interact`, which nbhelp.sliders calls, shows its sliders above the figure
    they redraw (tests/notebooks/test_browser.py measures it in JupyterLab); the text says so."""
    said = {p.name: re.findall(r"sliders\s+appear\s+(\w+)", " ".join(p.read_text().replace("#", " ").split()))
            for p in build.sources()}
    assert {name: where for name, where in said.items() if where and set(where) != {"above"}} == {}
    assert sum(bool(where) for where in said.values()) >= 3
