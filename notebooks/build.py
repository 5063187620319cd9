"""Build the tutorial notebooks (notebooks/0*.ipynb) from their sources (notebooks/0*.py), without outputs.

    python notebooks/build.py            # writes 01_why_pipelines.ipynb ... from 01_why_pipelines.py ...
    python notebooks/build.py --check    # exit 1, naming them, if a notebook is not what its source builds
    python notebooks/build.py --sources  # the other way: after editing a notebook in Jupyter (outputs dropped)

A source is in jupytext's "percent" format: `# %%` starts a code cell, `# %% [markdown]` a
markdown cell whose lines are comments (`# text`, `#` for an empty line), and in a code cell
`# %matplotlib inline` stands for the line magic. Blank lines around a cell are dropped, so one
blank line separates cells. Needs nbformat only (pip install -e ".[notebooks]").
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent
MARKER = re.compile(r"# %%(?:\s+(.*))?$")  # a cell's first line; the rest: "[markdown]" or a code cell's title
MAGIC = re.compile(r"# (%[A-Za-z]\w*.*)$")  # a line magic, commented out in the source


def sources() -> list[Path]:
    """The notebook sources: notebooks/<two digits>_<name>.py."""
    return sorted(p for p in HERE.glob("[0-9][0-9]_*.py"))


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


def build(source: Path) -> str:
    """The text of the notebook that `source` builds."""
    text = nbformat.writes(notebook(read_percent(source.read_text(), source.name)))
    return text if text.endswith("\n") else text + "\n"  # as nbformat.write


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args not in ([], ["--check"], ["--sources"]):
        print(f"build.py: error: unknown arguments {' '.join(args)} (use --check or --sources, or none)",
              file=sys.stderr)
        return 2
    stale = []
    for source in sources():
        target = source.with_suffix(".ipynb")
        if args == ["--sources"]:
            source.write_text(write_percent(nbformat.read(target, as_version=4).cells))
            print(f"wrote {source}")
        elif args == ["--check"]:
            stale += [target.name] if not target.is_file() or target.read_text() != build(source) else []
        else:
            target.write_text(build(source))
            print(f"wrote {target}")
    if stale:
        print(f"build.py: not what their sources build: {', '.join(stale)} (run python notebooks/build.py)",
              file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
