"""The `slow` marker: the tests that start a process (torch.distributed ranks, a command in a fresh Python) or execute a notebook; Hypothesis without its clock.

    python -m pytest -m "not slow"   # the fast loop: sim, the planner, exec within one process
    python -m pytest                 # everything

A test is slow when it, or a fixture it uses, starts ranks: `exec.launch.processes.launch` and what
calls it (`run_pipeline`, `run_torch_runtime`, `profile_costs`, `profile_device`), torchrun;
when it runs a command in a fresh Python because that is the point (the command line end
to end, a process whose state this one has changed); or when it executes a notebook.
Such a test carries `@pytest.mark.slow` (a whole slow module, `pytestmark`); a
fixture cannot carry a mark, so each test using a fixture that starts ranks carries it.

The fast loop runs in this one process: a test not marked slow that starts a process fails,
naming the marker, whether through `multiprocessing` (as `exec.launch` does) or `subprocess`
(`run`, `Popen`, `check_output`: a command line is tested by calling its `main(argv)`). A
library's own look at the system (matplotlib asking `fc-list` for fonts) is not the test's
and passes.

Hypothesis runs without its clock: no deadline per example and no health check on how slow
the data is to draw, so a loaded machine slows a property test down but cannot fail it.
"""
from __future__ import annotations

import contextlib
import multiprocessing.process
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

SLOW_HELP = "starts a process (ranks, a fresh Python) or executes a notebook (deselect with -m \"not slow\")"


settings.register_profile("no-clock", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("no-clock")


def pytest_configure(config):
    config.addinivalue_line("markers", f"slow: {SLOW_HELP}")


ROOT = Path(__file__).resolve().parents[1]


def _started_here(frame) -> bool:
    """Whether the code that called into `subprocess` (the first frame outside it) is this
    repository's: a test, sim, exec, a notebook or a script, not a library."""
    while frame is not None and Path(frame.f_code.co_filename).resolve() == Path(subprocess.__file__).resolve():
        frame = frame.f_back
    return frame is not None and Path(frame.f_code.co_filename).resolve().is_relative_to(ROOT)


@contextlib.contextmanager
def no_processes(item):
    """Within a test not marked slow, starting a process (`multiprocessing`, or `subprocess`
    from this repository's code) raises."""
    if item.get_closest_marker("slow") is not None:
        yield
        return
    start, popen = multiprocessing.process.BaseProcess.start, subprocess.Popen.__init__
    message = f"{item.nodeid} starts a process but is not marked slow: call the command's main(argv) " \
              f"in this process, or mark it @pytest.mark.slow"

    def refuse(self):
        raise RuntimeError(message)

    def refuse_ours(self, *args, **kwargs):
        if _started_here(sys._getframe(1)):
            raise RuntimeError(message)
        popen(self, *args, **kwargs)
    multiprocessing.process.BaseProcess.start, subprocess.Popen.__init__ = refuse, refuse_ours
    try:
        yield
    finally:
        multiprocessing.process.BaseProcess.start, subprocess.Popen.__init__ = start, popen


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    with no_processes(item):  # fixtures included: a module fixture that launches ranks is set up here
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    with no_processes(item):
        yield
