"""The examples in `sim`'s docstrings run as written and print what they show (doctest)."""
import doctest
import importlib
import pkgutil

import pytest

import sim

MODULES = sorted(m.name for m in pkgutil.walk_packages(sim.__path__, "sim.") if not m.name.endswith("__main__"))


def test_there_are_examples():
    assert sum(len(doctest.DocTestFinder().find(importlib.import_module(n))) for n in MODULES) > 0


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
                             verbose=False, report=True)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples in {name} failed (printed above)"
