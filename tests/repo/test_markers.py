"""The guard behind the `slow` marker (tests/conftest.py): a test not marked slow cannot start a process."""
from __future__ import annotations

import multiprocessing
import subprocess
import sys

import pytest

REFUSED = "not marked slow: call the command's main"


def test_a_test_not_marked_slow_cannot_start_a_process():
    process = multiprocessing.get_context("spawn").Process(target=print)
    with pytest.raises(RuntimeError, match=REFUSED):
        process.start()


@pytest.mark.parametrize("start", [
    lambda: subprocess.run([sys.executable, "-c", "pass"]),
    lambda: subprocess.check_output(["true"]),
    lambda: subprocess.Popen(["true"]),
], ids=["run", "check_output", "Popen"])
def test_nor_a_subprocess(start):
    with pytest.raises(RuntimeError, match=REFUSED):
        start()


def test_a_librarys_own_look_at_the_system_is_not_the_tests():
    """The guard refuses the processes this repository's code starts; a library's (here
    the standard library's `ctypes.util`, which asks ldconfig where libraries are) passes."""
    import ctypes.util
    ctypes.util.find_library("c")


@pytest.mark.slow
def test_a_slow_test_may_start_one():
    assert subprocess.run([sys.executable, "-c", "print(2)"], capture_output=True, text=True).stdout == "2\n"
