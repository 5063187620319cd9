"""The `slow` marker (tests/conftest.py) selects what it says: the tests that start ranks or
run a notebook, every one of them, and nothing else; `-m "not slow"` keeps all the others.

The suite is collected in this process (pytest.main --collect-only: the test modules are
imported already, so it takes seconds); nothing is run, and nothing is timed.
"""
from __future__ import annotations

import ast
import multiprocessing
from pathlib import Path

import pytest

import conftest

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"


class Collected:
    """A plugin that keeps the ids of the items a session selects, and those marked slow."""

    def __init__(self):
        self.selected: list[str] = []
        self.slow: set[str] = set()
        self.fixtures: dict[str, set[str]] = {}

    def pytest_collection_finish(self, session):
        self.selected = [item.nodeid for item in session.items]
        self.slow = {item.nodeid for item in session.items if item.get_closest_marker("slow")}
        self.fixtures = {item.nodeid: set(getattr(item, "fixturenames", ())) for item in session.items}


def collect(*args: str) -> Collected:
    got = Collected()
    code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "--rootdir", str(ROOT), str(TESTS), *args],
                       plugins=[got])
    assert code in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED), f"collection failed: {code}"
    return got


@pytest.fixture(scope="module")
def everything() -> Collected:
    return collect()


def defined(file: str) -> set[str]:
    """The functions (tests, fixtures, helpers) defined at the top of tests/`file`."""
    tree = ast.parse((TESTS / file).read_text())
    return {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def test_not_slow_selects_exactly_the_tests_not_marked_slow(everything):
    fast = collect("-m", "not slow").selected
    slow = collect("-m", "slow").selected
    assert set(fast) == set(everything.selected) - everything.slow and len(fast) == len(set(fast))
    assert set(slow) == everything.slow
    assert len(fast) + len(slow) == len(everything.selected) and fast and slow


@pytest.mark.parametrize("file", sorted(conftest.SLOW))
def test_every_name_in_slow_is_a_function_of_its_file(file):
    assert (TESTS / file).is_file(), f"tests/conftest.py SLOW names {file}, which is gone"
    stale = conftest.SLOW[file] - defined(file)
    assert not stale, f"tests/conftest.py SLOW names {sorted(stale)}, not in tests/{file}"


def test_slow_marks_every_test_it_names_and_every_user_of_a_fixture_it_names(everything):
    for nodeid in everything.selected:
        file, rest = nodeid.split("::", 1)
        name = rest.split("[")[0]
        named = conftest.SLOW.get(Path(file).name, frozenset())
        if name in named or named & everything.fixtures[nodeid]:
            assert nodeid in everything.slow, nodeid


def test_only_rank_launches_and_notebook_runs_are_slow(everything):
    files = {Path(nodeid.split("::")[0]).name for nodeid in everything.slow}
    assert files <= set(conftest.SLOW) | {"test_notebooks.py"}
    notebook_runs = {n for n in everything.selected if n.startswith("tests/test_notebooks.py::test_notebook_runs[")}
    assert notebook_runs and notebook_runs <= everything.slow
    assert not {n for n in everything.slow if n.startswith("tests/test_notebooks.py::")} - notebook_runs


def test_a_test_not_marked_slow_cannot_start_a_process():
    process = multiprocessing.get_context("spawn").Process(target=print)
    with pytest.raises(RuntimeError, match="not marked slow: name it in SLOW in tests/conftest.py"):
        process.start()
