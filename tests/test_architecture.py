"""The shape of the code: exec's modules import each other without a cycle, nothing outside
sim reaches for sim's private names, nothing outside the interpreter for its private state,
and every exec module says what it is and stays small. Reads the sources only (no torch)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXEC = ROOT / "exec"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60  # without its docstring


def _exec_modules() -> dict[str, Path]:
    return {f"exec.{p.stem}": p for p in sorted(EXEC.glob("*.py"))}


def _imported_exec_modules(name: str, path: Path, modules: set[str]) -> set[str]:
    """The exec modules that module `name` imports, anywhere in it (inside functions too)."""
    package = name.rsplit(".", 1)[0] if not path.name == "__init__.py" else name
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        out |= {t for t in targets if t in modules and t != name}
    return out


def import_graph() -> dict[str, set[str]]:
    """exec module -> the exec modules it imports."""
    mods = _exec_modules()
    names = set(mods)
    return {name: _imported_exec_modules(name, path, names) for name, path in mods.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of `graph` as a list of nodes (first == last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        path.append(n)
        for m in sorted(graph[n]):
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


def test_exec_modules_import_each_other_without_a_cycle():
    graph = import_graph()
    assert graph["exec.pipeline"] >= {"exec.step", "exec.calibrate", "exec.launch"}  # the graph is read
    cycle = find_cycle(graph)
    assert cycle is None, "exec imports in a cycle: " + " -> ".join(cycle)


_SIM_FROM = re.compile(r"\bfrom\s+(sim(?:\.\w+)*)\s+import\s+(\([^)]*\)|[^\n]*)")
_SIM_ATTR = re.compile(r"\bsim(?:\.[A-Za-z]\w*)*\._(?!_)\w*")


def private_sim_uses(text: str) -> list[str]:
    """Every use of a private (underscore) name of sim in `text` (code, or code in strings):
    `from sim.x import _y`, `from sim._x import y`, `sim.x._y`, `import sim._x`."""
    found = []
    for m in _SIM_FROM.finditer(text):
        module, names = m.group(1), m.group(2).strip("()")
        if any(part.startswith("_") for part in module.split(".")):
            found.append(m.group(0).strip())
        for name in names.split("#")[0].replace("\n", " ").split(","):
            name = name.strip().split(" as ")[0].strip().rstrip("\\").strip()
            if name.startswith("_") and not name.startswith("__"):
                found.append(f"from {module} import {name}")
    found += [m.group(0) for m in _SIM_ATTR.finditer(text)]
    return found


def test_private_sim_uses_are_recognised():
    assert private_sim_uses("from sim.passes.lowering import _RECV_OF, compute_set") == ["from sim.passes.lowering import _RECV_OF"]
    assert private_sim_uses("from sim.passes.lowering import (compute_set,\n    _lower as low)") == ["from sim.passes.lowering import _lower"]
    assert private_sim_uses("x = sim.engine.core._run(y)") == ["sim.engine.core._run"]
    assert private_sim_uses("import sim._x") == ["sim._x"]
    assert private_sim_uses("from sim.schedule.kinds import KINDS\nsim.Costs()\nsim.__version__") == []


def _outside_sim() -> list[Path]:
    files = [*EXEC.glob("*.py"), *(ROOT / "tests").glob("*.py"), *(ROOT / "benchmarks").glob("*.py"),
             ROOT / "notebooks" / "_build.py"]
    return [f for f in files if f.resolve() != Path(__file__).resolve()]


def test_nothing_outside_sim_uses_a_private_name_of_sim():
    bad = {str(f.relative_to(ROOT)): uses for f in _outside_sim() if (uses := private_sim_uses(f.read_text()))}
    assert not bad, f"private names of sim used outside it (ask for a public one): {bad}"


def test_nothing_outside_the_interpreter_touches_its_private_state():
    """Calibration and the tests use the interpreter's public API (`deliver`, `run_action`,
    `waits`, `clock`), never its pending receives or its event records."""
    pattern = re.compile(r"\b_Pending\b|\._events\b|\._held\b|\._samples\b")
    bad = [str(f.relative_to(ROOT)) for f in _outside_sim()
           if f != EXEC / "interpreter.py" and pattern.search(f.read_text())]
    assert not bad, f"private state of exec.interpreter used in {bad}"


@pytest.mark.parametrize("name", sorted(_exec_modules()))
def test_each_exec_module_says_what_it_is_and_stays_small(name):
    path = _exec_modules()[name]
    text = path.read_text()
    tree = ast.parse(text)
    doc = ast.get_docstring(tree)
    if path.name != "__main__.py":
        assert doc and doc.splitlines()[0].strip(), f"{name} has no docstring saying what it is"
    assert len(text.splitlines()) <= MAX_MODULE_LINES, f"{name} has {len(text.splitlines())} lines"
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = node.end_lineno - node.lineno + 1
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                lines -= body[0].end_lineno - body[0].lineno + 1
            assert lines <= MAX_FUNCTION_LINES, f"{name}.{node.name} has {lines} lines (docstring aside)"
