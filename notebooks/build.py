"""Build the tutorial notebooks (notebooks/0*.ipynb, which git ignores) from their sources (notebooks/sources/0*.py).

    python notebooks/build.py             # writes 01_why_pipelines.ipynb ... from sources/01_why_pipelines.py ...
    python notebooks/build.py --check     # exit 1, naming them, if a notebook's cells are not its source's
    python notebooks/build.py --sources   # the other way: after editing a notebook in Jupyter (outputs dropped)
    python notebooks/build.py --html DIR  # each tutorial, executed, as a web page with its figures, in DIR

Git tracks the sources only: running a notebook in JupyterLab (its outputs autosaved, its
checkpoints in .ipynb_checkpoints/) leaves `git status` clean. Building overwrites the
notebooks, outputs and edits in Jupyter included (carry edits back with --sources first).

A source is in jupytext's "percent" format: `# %%` starts a code cell, `# %% [markdown]` a
markdown cell whose lines are comments (`# text`, `#` for an empty line), and in a code cell
`# %matplotlib inline` stands for the line magic. Blank lines around a cell are dropped, so one
blank line separates cells. Needs nbformat only (pip install -e ".[notebooks]"); --html also
executes the notebooks (nbclient, ipykernel; torch for 03 and 06: the exec extra) and writes
them with nbconvert.
"""
from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SOURCES = HERE / "sources"
MARKER = re.compile(r"# %%(?:\s+(.*))?$")  # a cell's first line; the rest: "[markdown]" or a code cell's title
MAGIC = re.compile(r"# (%[A-Za-z]\w*.*)$")  # a line magic, commented out in the source
CELL_TIMEOUT = 300  # seconds a cell may run when executed (--html, the tests)
STATIC = "NBHELP_STATIC_PAGE"  # set in the kernel's environment: nbhelp draws once, for a page without sliders
USAGE = "use --check, --sources or --html DIR, or none"


def sources() -> list[Path]:
    """The notebook sources: notebooks/sources/<two digits>_<name>.py."""
    return sorted(SOURCES.glob("[0-9][0-9]_*.py"))


def target(source: Path) -> Path:
    """The notebook that `source` builds: notebooks/<its name>.ipynb, beside nbhelp.py."""
    return HERE / f"{source.stem}.ipynb"


def read_percent(text: str, name: str = "<source>") -> list[nbformat.NotebookNode]:
    """The cells of a percent-format source. Raises ValueError naming the line of anything else."""
    cells, kind, lines = [], None, []
    for number, line in enumerate(text.splitlines(), 1):
        marker = MARKER.match(line)
        if marker:
            cells.append(_cell(kind, lines))
            kind = "markdown" if (marker.group(1) or "").startswith("[markdown]") else "code"
            if (marker.group(1) or "").startswith("[") and kind != "markdown":
                raise ValueError(f"{name}:{number}: unknown cell kind {marker.group(1)!r} (code: '# %%', "
                                 f"markdown: '# %% [markdown]')")
            lines = []
        elif kind is None:
            if line.strip():
                raise ValueError(f"{name}:{number}: text before the first cell marker '# %%'")
        elif kind == "markdown":
            if line not in ("", "#") and not line.startswith("# "):
                raise ValueError(f"{name}:{number}: a markdown line must be a comment ('# text' or '#')")
            lines.append(line[2:])
        else:
            magic = MAGIC.match(line)
            lines.append(magic.group(1) if magic else line)
    cells.append(_cell(kind, lines))
    return [c for c in cells if c is not None]


def _cell(kind: str | None, lines: list[str]) -> nbformat.NotebookNode | None:
    if kind is None:
        return None
    text = "\n".join(lines).strip("\n")
    return new_markdown_cell(text) if kind == "markdown" else new_code_cell(text)


def write_percent(cells) -> str:
    """The percent-format source of `cells` (read_percent's inverse; code outputs are dropped)."""
    parts = []
    for cell in cells:
        if cell.cell_type == "markdown":
            if any(MARKER.match(f"# {s}") for s in cell.source.splitlines()):
                raise ValueError("a markdown line that begins with '%%' would read as a cell marker")
            parts.append("# %% [markdown]\n" + "\n".join(f"# {s}" if s else "#" for s in cell.source.splitlines()))
        elif cell.cell_type == "code":
            ambiguous = [s for s in cell.source.splitlines() if s.startswith("%%") or MARKER.match(s) or MAGIC.match(s)]
            if ambiguous:
                raise ValueError(f"code line {ambiguous[0]!r} has no percent form here (cell magics, and comments "
                                 f"that read as a cell marker or a magic)")
            parts.append("# %%\n" + "\n".join(f"# {s}" if MAGIC.match(f"# {s}") else s for s in cell.source.splitlines()))
        else:
            raise ValueError(f"a {cell.cell_type} cell has no percent form here")
    return "\n\n".join(parts) + "\n"


def notebook(cells) -> nbformat.NotebookNode:
    """A python3 notebook of `cells`, without outputs, with stable cell ids (a rebuild churns no diff)."""
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"cell-{i:02d}"
    nbformat.validate(nb)
    return nb


def notebook_of(source: Path) -> nbformat.NotebookNode:
    """The notebook that `source` builds, in memory."""
    return notebook(read_percent(source.read_text(), source.name))


def build(source: Path) -> str:
    """The text of the notebook that `source` builds."""
    text = nbformat.writes(notebook_of(source))
    return text if text.endswith("\n") else text + "\n"  # as nbformat.write


def _inputs(nb) -> list[tuple[str, str]]:
    return [(c.cell_type, c.source) for c in nb.cells]


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


def execute(nb, static: bool = False) -> None:
    """Run `nb` top to bottom in place, in a fresh python3 kernel started in notebooks/ (so
    `import nbhelp` works) that imports this checkout's sim and exec; `static`: sliders draw
    their figure once. Raises nbclient's CellExecutionError, naming the cell, if one fails."""
    from nbclient import NotebookClient

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    env.pop(STATIC, None)
    env.update({STATIC: "1"} if static else {})
    client = NotebookClient(nb, timeout=CELL_TIMEOUT, kernel_name="python3", kernel_manager_class=_quiet_manager(),
                            resources={"metadata": {"path": str(HERE)}})
    client.execute(env=env)


def page(nb, directory: Path) -> str:
    """An executed notebook as one self-contained HTML page (figures embedded as data URIs)
    for `directory`: links to tutorials go to their pages, links into the repository to its files."""
    from nbconvert import HTMLExporter

    up = Path(os.path.relpath(ROOT, directory.resolve())).as_posix()
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = re.sub(r"\]\(([0-9][0-9]_\w+)\.ipynb", r"](\1.html", cell.source)
            cell.source = cell.source.replace("](../", f"]({up}/")
    body, _ = HTMLExporter(template_name="lab").from_notebook_node(nb)
    return body


def write_pages(directory: Path) -> list[Path]:
    """Each tutorial executed (sliders drawn once), as DIR/<name>.html, and DIR/index.html linking them."""
    written, items = [], []
    for source in sources():
        nb = notebook_of(source)
        execute(nb, static=True)
        path = directory / f"{source.stem}.html"
        path.write_text(page(nb, directory))
        title = next((c.source.splitlines()[0].lstrip("# ") for c in nb.cells if c.cell_type == "markdown"), source.stem)
        items.append(f'<li><a href="{path.name}">{title}</a></li>')
        written.append(path)
        print(f"wrote {path}")
    index = directory / "index.html"
    index.write_text("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>Tutorials</title></head>\n"
                     f"<body><h1>Pipeline-parallel training: the tutorials</h1><ol>\n{chr(10).join(items)}\n</ol></body></html>\n")
    return written + [index]


def html_refusal(directory: str) -> str | None:
    """Why `--html directory` cannot be written (one line), or None; creates the folder."""
    missing = [m for m in ("nbclient", "nbconvert", "ipykernel") if importlib.util.find_spec(m) is None]
    if missing:
        return f"--html needs {', '.join(missing)}: pip install -e \".[notebooks]\""
    path = Path(directory)
    if path.exists() and not path.is_dir():
        return f"--html DIR: {directory} is not a folder"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return f"--html DIR: cannot create {directory} ({e.strerror})"
    return None if os.access(path, os.W_OK) else f"--html DIR: {directory} is not writable"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--html"] and len(args) == 2:
        refusal = html_refusal(args[1])
        if refusal:
            print(f"build.py: error: {refusal}", file=sys.stderr)
            return 2
        write_pages(Path(args[1]))
        return 0
    if args not in ([], ["--check"], ["--sources"]):
        print(f"build.py: error: unknown arguments {' '.join(args)} ({USAGE})", file=sys.stderr)
        return 2
    stale = []
    for source in sources():
        built = target(source)
        if args == ["--sources"] and built.is_file():
            source.write_text(write_percent(nbformat.read(built, as_version=4).cells))
            print(f"wrote {source}")
        elif args == ["--check"] and built.is_file():
            stale += [built.name] if _inputs(nbformat.read(built, as_version=4)) != _inputs(notebook_of(source)) else []
        elif not args:
            built.write_text(build(source))
            print(f"wrote {built}")
    if stale:
        print(f"build.py: cells differ from their sources: {', '.join(stale)} (python notebooks/build.py --sources "
              f"carries edits back; python notebooks/build.py rebuilds)", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
