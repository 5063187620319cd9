"""Every dotted `sim.`/`exec.` name that prose names resolves: in the docstrings and comments
of sim/, exec/, tests/ and benchmarks/ (and every string of sim/ and exec/, whose messages name
modules), and in README.md and docs/*.md.

A name resolves when its longest prefix that is a module of this repository is a file
(`sim/passes/lowering.py` or a package's `__init__.py`), and the names after it are found in
that file's syntax tree, nothing imported: a module-level definition, assignment or import
(an import followed to where it comes from), a submodule, a name in `__all__` of a module with
a lazy `__getattr__`; after a class, a member of its body or a `self.` attribute its methods
set. What follows a function or a value (a call, an index, an attribute of a result) is not
checked. So `sim.passes.lowering.lower`, `sim.Costs.for_stages` and `exec.run` resolve, and a
module that moved, or a function renamed, is listed with every file:line that still names it.
"""
from __future__ import annotations

import ast
import functools
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("sim", "exec")
SOURCES = ("sim", "exec", "tests", "benchmarks")
DOCS = ("README.md", "docs/*.md")

# `sim.x.y`, not inside a path or a longer word (`tests/test_exec.py`, `bench_sim.py`, `a.sim.b`)
DOTTED = re.compile(r"(?<![\w./-])(?:sim|exec)(?:\.[A-Za-z_]\w*)+")
MADE_UP = {"x", "_x", "X", "NAME"}  # `sim.x.y` and the like: examples in the docstrings of checks like this one
FILE_TYPES = {"md", "py", "json", "ipynb", "txt", "csv", "png", "svg", "html"}  # `exec.md` is a file's name


@functools.cache
def module_file(dotted: str) -> Path | None:
    """The file of the repository's module `dotted` (a package's __init__.py), or None."""
    base = ROOT.joinpath(*dotted.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _top_level(body):
    """The statements of a module's or class's body, those under `if` and `try` included."""
    for node in body:
        if isinstance(node, ast.If):
            yield from _top_level(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            yield from _top_level(node.body + node.orelse + node.finalbody + [s for h in node.handlers for s in h.body])
        else:
            yield node


def _targets(node) -> list[str]:
    out = []
    for target in getattr(node, "targets", [getattr(node, "target", None)]):
        for n in ast.walk(target) if target is not None else ():
            if isinstance(n, ast.Name):
                out.append(n.id)
    return out


@functools.cache
def module_names(dotted: str) -> dict:
    """What module `dotted` defines at its top: name -> ("class", node) | ("value", None) |
    ("import", (module, name or None)); and "__all__", "__getattr__" where it has them."""
    path = module_file(dotted)
    tree = ast.parse(path.read_text())
    package = dotted if path.name == "__init__.py" else dotted.rpartition(".")[0]
    names: dict = {}
    for node in _top_level(tree.body):
        if isinstance(node, ast.ClassDef):
            names[node.name] = ("class", node)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names[node.name] = ("value", None)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for name in _targets(node):
                names[name] = ("value", None)
            if "__all__" in _targets(node) and isinstance(node.value, (ast.List, ast.Tuple)):
                names["__all__"] = ("all", {e.value for e in node.value.elts if isinstance(e, ast.Constant)})
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    names[alias.asname] = ("import", (alias.name, None))
                else:
                    top = alias.name.split(".")[0]
                    names[top] = ("import", (top, None))
        elif isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                names[alias.asname or alias.name] = ("import", (source, alias.name))
    return names


def _class_members(node: ast.ClassDef) -> set[str]:
    members = set()
    for stmt in _top_level(node.body):
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            members.add(stmt.name)
            for n in ast.walk(stmt):
                if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self":
                    members.add(n.attr)
        else:
            members.update(_targets(stmt))
    return members


def _members_of(node: ast.ClassDef) -> set[str] | _Anything:
    """The class's own members, and an enum's `name` and `value`; anything where it has
    another base (an inherited member is not looked for)."""
    bases = [b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases]
    if any(b.endswith("Enum") for b in bases):
        return _class_members(node) | {"name", "value"}
    return _Anything() if bases else _class_members(node)


class _Anything:
    def __contains__(self, name) -> bool:
        return True


def _strings_of(module: str) -> set[str]:
    """Every string constant in `module`'s source."""
    tree = ast.parse(module_file(module).read_text())
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def lookup(module: str, name: str, depth: int = 0):
    """What `module`.`name` is: ("module", dotted), ("class", node), ("value", None), ("external",
    None) for what lies outside the repository; None where it is not there."""
    if module.split(".")[0] not in PACKAGES or module_file(module) is None:
        return ("external", None)
    if module_file(f"{module}.{name}") is not None:
        return ("module", f"{module}.{name}")
    names = module_names(module)
    kind, what = names.get(name, (None, None))
    if kind == "import" and depth < 10:
        source, original = what
        return ("module", source) if original is None and module_file(source) else \
            ("external", None) if original is None else lookup(source, original, depth + 1)
    if kind is None and "__getattr__" in names and name in _strings_of(module):
        return ("value", None)  # a lazy module (PEP 562) names what it exports as strings
    return (kind, what) if kind else None


def resolves(dotted: str) -> bool:
    """Whether the dotted name `dotted` (see the module's docstring) resolves."""
    parts = dotted.split(".")
    i = max(i for i in range(1, len(parts) + 1) if module_file(".".join(parts[:i])) is not None)
    found = ("module", ".".join(parts[:i]))
    for name in parts[i:]:
        kind, what = found
        if kind == "module":
            found = lookup(what, name)
        elif kind == "class":
            if name not in _members_of(what):
                return False
            found = ("value", None)  # a member's own members are not checked, nor inherited ones
        else:
            return True
        if found is None:
            return False
    return True


def _prose_of_python(path: Path, every_string: bool):
    """(line, text) of each comment and docstring of a Python file, and of each string where
    `every_string` (sim's and exec's messages name modules; tests' strings are test data)."""
    source = path.read_text()
    docstrings = {(n.lineno, n.col_offset) for n in ast.walk(ast.parse(source))
                  if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT or tok.type == tokenize.STRING and (every_string or tok.start in docstrings):
            yield tok.start[0], tok.string


def prose() -> list[tuple[Path, int, str]]:
    """(file, line, text) of every piece of prose that is checked."""
    out = []
    for folder in SOURCES:
        for path in sorted((ROOT / folder).rglob("*.py")):
            out += [(path, line, text) for line, text in _prose_of_python(path, folder in PACKAGES)]
    for pattern in DOCS:
        for path in sorted(ROOT.glob(pattern)):
            out += [(path, 1, path.read_text())]
    return out


def unresolved() -> list[str]:
    """`file:line: name` for each dotted name that does not resolve."""
    out = []
    for path, first, text in prose():
        for match in DOTTED.finditer(text):
            name = match.group()
            if name.split(".")[1] not in MADE_UP and name.rpartition(".")[2] not in FILE_TYPES and not resolves(name):
                line = first + text.count("\n", 0, match.start())
                out.append(f"{path.relative_to(ROOT)}:{line}: {name}")
    return out


def test_every_dotted_name_in_prose_resolves():
    stale = unresolved()
    assert not stale, f"{len(stale)} dotted names name nothing (a module moved? a name renamed?):\n" + "\n".join(stale)


def test_the_check_tells_names_that_resolve_from_names_that_do_not():
    for good in ("sim", "sim.passes.lowering.lower", "sim.Costs.for_stages", "sim.Kind.REDUCE_GRAD", "exec.run",
                 "sim.simulate", "sim.engine.core", "sim.MODELS", "sim.plan.Layout"):
        assert resolves(good), good
    for bad in ("sim.nothing", "sim.passes.lowering.nothing", "sim.passes.nothing.lower", "sim.Kind.NOTHING",
                "exec.nothing"):
        assert not resolves(bad), bad
    text = "see `sim.passes.lowering.lower`, tests/test_exec.py, bench_sim.py and sim/plan/cli.py."
    assert [m.group() for m in DOTTED.finditer(text)] == ["sim.passes.lowering.lower"]


if __name__ == "__main__":  # python tests/repo/test_dotted_names.py: the list alone, one file:line a name
    print("\n".join(unresolved()) or "every dotted name resolves")
