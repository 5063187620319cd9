"""The shape of the code: every module of sim and exec imports without a cycle and without
another module's private names, says what it is, and stays small; every folder stays
readable. Reads the sources only (no torch, nothing imported).

The size limits count lines of code (`code_lines`): docstrings, comments and blank lines
are free, so no module trades an explanation for room."""
from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("sim", "exec")
MAX_MODULE_LINES = 400  # lines of code
MAX_FUNCTION_LINES = 60  # lines of code, from its `def` line to its last
MAX_FOLDER_MODULES = 15  # modules in one folder, its __init__ and __main__ aside


def modules(packages=PACKAGES) -> dict[str, Path]:
    """Every module of `packages`, by dotted name (a package by its own name, for its __init__)."""
    out = {}
    for pkg in packages:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _package_of(name: str, path: Path) -> str:
    return name if path.name == "__init__.py" else name.rsplit(".", 1)[0]


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of `known` that `name` imports anywhere in it: at the top, inside functions,
    under TYPE_CHECKING. `from a import b` counts `a.b` where that is a module, else `a`."""
    package = _package_of(name, path)
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        out |= {t for t in targets if t in known and t != name}
    return out


def import_graph(packages=PACKAGES) -> dict[str, set[str]]:
    """module -> the modules of sim and exec it imports."""
    mods = modules(packages)
    known = set(mods)
    return {name: imports_of(name, path, known) for name, path in mods.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of `graph` as a list of nodes (first == last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        path.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return path[path.index(m):] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        path.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_the_graph_is_read():
    graph = import_graph()
    assert "sim.simulation" in graph["sim"] and "exec.runtime.step" in graph["exec.pipeline.worker"]
    assert {"sim.schedule.ir"} <= graph["sim.engine.core"]


def test_no_import_cycle_in_sim_or_exec():
    cycle = find_cycle(import_graph())
    assert cycle is None, "imports in a cycle: " + " -> ".join(cycle)


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The import graph between packages (sim.plan, exec.runtime, ...; a top-level module
    stands for itself): an edge where a module of one imports a module of another."""
    def pkg(name: str) -> str:
        return ".".join(name.split(".")[:2])
    out: dict[str, set[str]] = {pkg(n): set() for n in graph}
    for n, deps in graph.items():
        out[pkg(n)] |= {pkg(d) for d in deps if pkg(d) != pkg(n)}
    return out


def test_packages_are_layers():
    """Each package of sim and exec builds on others without a loop between packages (the
    README's map lists them in an order in which each imports only those above it)."""
    graph = package_graph(import_graph())
    assert "sim.schedule" in graph["sim.passes"] and "exec.runtime" in graph["exec.pipeline"]  # read
    cycle = find_cycle(graph)
    assert cycle is None, "packages import each other in a cycle: " + " -> ".join(cycle)


# The planner's stack, bottom up: the machine (sim.hardware) and what a model is (sim.model)
# know nothing of each other, of the engine or of the planner; the cost layer (sim.cost: how
# long a piece of the model takes on a device) builds on those two alone; the planner
# (sim.plan) composes the cost layer with the engine. Each package of the stack may import
# only these.
COST_STACK = {"sim.hardware": set(), "sim.model": set(), "sim.cost": {"sim.hardware", "sim.model"}}


def test_the_cost_layer_sits_between_the_hardware_and_the_planner():
    graph = package_graph(import_graph())
    assert {"sim.cost", "sim.engine"} <= graph["sim.plan"] and "sim.hardware" in graph["sim.cost"]  # read
    wrong = {p: sorted(graph[p] - allowed) for p, allowed in COST_STACK.items() if graph[p] - allowed}
    assert not wrong, f"packages of the planner's stack import above their place: {wrong}"


def test_the_engine_sits_below_the_passes():
    """The engine runs a compiled `Program` and compiles nothing: `sim.engine` imports
    nothing of `sim.passes`; the passes build on the engine's `Program`, and what compiles
    and then runs (`sim.simulation`) stands above both."""
    graph = package_graph(import_graph())
    assert "sim.passes" not in graph["sim.engine"]
    assert "sim.engine" in graph["sim.passes"] and {"sim.engine", "sim.passes"} <= graph["sim.simulation"]


def test_nothing_inside_sim_imports_the_sim_facade():
    """`sim/__init__` gathers the public API from the packages; a module inside sim that
    imported it back would import everything (and close a cycle)."""
    graph = import_graph(("sim",))
    bad = sorted(n for n, deps in graph.items() if "sim" in deps and n != "sim")
    assert not bad, f"modules inside sim import `sim` itself: {bad}"


_FROM = re.compile(r"\bfrom\s+((?:sim|exec)(?:\.\w+)*)\s+import\s+(\([^)]*\)|[^\n]*)")
_ATTR = re.compile(r"\b(?:sim|exec)(?:\.[A-Za-z]\w*)*\._(?!_)\w*")
_RELATIVE = re.compile(r"^\s*from\s+(\.+\w*(?:\.\w+)*)\s+import\s+(\([^)]*\)|[^\n]*)", re.M)


def _private(module: str, names: str, shown: str) -> list[str]:
    found = []
    if any(p.startswith("_") and not p.startswith("__") for p in module.split(".")):
        found.append(shown)
    for name in names.split("#")[0].replace("\n", " ").split(","):
        name = name.strip().split(" as ")[0].strip().rstrip("\\").strip()
        if name.startswith("_") and not name.startswith("__"):
            found.append(f"from {module} import {name}")
    return found


def private_uses(text: str) -> list[str]:
    """Every use of another module's private (underscore) name in `text` (code, or code in
    strings): `from sim.x import _y`, `from ._x import y`, `sim.x._y`, `import exec._x`."""
    found = []
    for m in [*_FROM.finditer(text), *_RELATIVE.finditer(text)]:
        found += _private(m.group(1), m.group(2).strip("()"), m.group(0).strip())
    found += [m.group(0) for m in _ATTR.finditer(text)]
    return found


def test_private_uses_are_recognised():
    assert private_uses("from sim.passes import _RECV_OF, compute_set") == ["from sim.passes import _RECV_OF"]
    assert private_uses("from sim.passes import (compute_set,\n    _lower as low)") == ["from sim.passes import _lower"]
    assert private_uses("x = sim.engine._run(y)") == ["sim.engine._run"]
    assert private_uses("import exec._x") == ["exec._x"]
    assert private_uses("    from .estimation import Layout, _partition") == ["from .estimation import _partition"]
    assert private_uses("from sim.kinds import KINDS\nsim.Costs()\nsim.__version__\nfrom . import cli") == []


def _code_files() -> list[Path]:
    files = [*modules().values(), *(ROOT / "tests").rglob("*.py"), *(ROOT / "benchmarks").glob("*.py"),
             *(ROOT / "notebooks").rglob("*.py")]
    return [f for f in files if f.resolve() != Path(__file__).resolve()]


def test_no_module_uses_another_modules_private_names():
    bad = {str(f.relative_to(ROOT)): uses for f in _code_files() if (uses := private_uses(f.read_text()))}
    assert not bad, f"private names used outside their module (make them public, or move the code): {bad}"


def test_nothing_outside_the_interpreter_touches_its_private_state():
    """Calibration and the tests use the interpreter's public API (`deliver`, `run_action`,
    `waits`, `clock`), never its pending receives or its event records."""
    pattern = re.compile(r"\b_Pending\b|\._events\b|\._held\b|\._samples\b")
    bad = [str(f.relative_to(ROOT)) for f in _code_files()
           if "sim" not in f.relative_to(ROOT).parts[:1] and f.name != "interpreter.py" and pattern.search(f.read_text())]
    assert not bad, f"private state of the interpreter used in {bad}"


_NOT_CODE = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
             tokenize.ENCODING, tokenize.ENDMARKER}


def _docstring_starts(tree: ast.AST) -> set[tuple[int, int]]:
    """Where each docstring (of the module, a class, a function) begins: (line, column)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                out.add((first.lineno, first.col_offset))
    return out


def code_lines(source: str) -> set[int]:
    """The numbers of the lines of `source` that hold code: not blank, not only a comment,
    not part of a docstring. A string that is not a docstring is code, every line of it."""
    docstrings = _docstring_starts(ast.parse(source))
    lines, in_docstring = set(), False
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        # a docstring is one STRING token, or several side by side ("a" "b")
        in_docstring = tok.type == tokenize.STRING and (in_docstring or tok.start in docstrings)
        if tok.type not in _NOT_CODE and not in_docstring:
            lines.update(range(tok.start[0], tok.end[0] + 1))
    return lines


def function_lengths(source: str) -> list[tuple[str, int]]:
    """(name, lines of code from its `def` line to its last) for every function of `source`,
    nested ones too (whose lines count in the function around them as well)."""
    code = code_lines(source)
    return [(node.name, sum(node.lineno <= n <= node.end_lineno for n in code))
            for node in ast.walk(ast.parse(source)) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]


SOURCE = '''"""A module.

It says what it is."""
import os  # a comment after code: a line of code


# a comment alone
def f(x):
    """What f does,

    on three lines."""
    text = """a string that is
not a docstring"""
    return text
def g(): "g's docstring"; return 1
class C:
    "a docstring" " in two pieces"
    x = [1,
         # inside brackets
         2]
'''


@pytest.mark.parametrize("source, lines", [
    (SOURCE, {4, 8, 12, 13, 14, 15, 16, 18, 20}),
    ("", set()),
    ("\n\n# nothing\n", set()),
    ('"""only a docstring"""\n', set()),
    ('x = 1\n"""a string after code is code"""\n', {1, 2}),
    ("def f():\n    'doc'\n\n    # note\n    return 1\n", {1, 5}),
    ("async def f():\n    'doc'\n    await g()\n", {1, 3}),
])
def test_code_lines_leave_out_docstrings_comments_and_blank_lines(source, lines):
    assert code_lines(source) == lines


def test_function_lengths_count_code_from_the_def_line():
    assert dict(function_lengths(SOURCE)) == {"f": 4, "g": 1}
    nested = "def outer():\n    'doc'\n    def inner():\n        'doc'\n        return 1\n    return inner\n"
    assert dict(function_lengths(nested)) == {"outer": 4, "inner": 2}


_STATEMENTS = st.sampled_from(["x = 1", "# a comment", "", "    ", "y = [1,  # one\n     2]", "s = '''two\nlines'''",
                               "z = 3\n\"\"\"a string after code\"\"\"", "def h():\n    'doc'\n    return 2"])


@given(st.lists(_STATEMENTS, max_size=10), st.text(alphabet="ab \n", max_size=30), st.integers(0, 10))
def test_docstrings_comments_and_blank_lines_never_change_the_count(body, doc, at):
    """A module docstring put first, or a comment line and a blank line put between two
    statements, leaves the number of lines of code as it was."""
    plain = len(code_lines("\n".join(body) + "\n"))
    assert len(code_lines(f'"""{doc}."""\n' + "\n".join(body) + "\n")) == plain
    noted = body[:at] + ["# a note", ""] + body[at:]
    assert len(code_lines("\n".join(noted) + "\n")) == plain


@pytest.mark.parametrize("name", sorted(modules()))
def test_each_module_says_what_it_is_and_stays_small(name):
    path = modules()[name]
    text = path.read_text()
    doc = ast.get_docstring(ast.parse(text))
    assert doc and doc.splitlines()[0].strip(), f"{name} has no docstring saying what it is"
    code = len(code_lines(text))
    assert code <= MAX_MODULE_LINES, f"{name} has {code} lines of code (over {MAX_MODULE_LINES})"
    long = [f"{fn} ({n} lines)" for fn, n in function_lengths(text) if n > MAX_FUNCTION_LINES]
    assert not long, f"{name}: functions over {MAX_FUNCTION_LINES} lines of code: {long}"


@pytest.mark.parametrize("folder", sorted({p.parent for p in modules().values()}), ids=lambda p: str(p.relative_to(ROOT)))
def test_each_folder_stays_readable(folder):
    mods = [p for p in folder.glob("*.py") if p.name not in ("__init__.py", "__main__.py")]
    assert len(mods) <= MAX_FOLDER_MODULES, f"{folder.relative_to(ROOT)} holds {len(mods)} modules"
