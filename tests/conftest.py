"""The `slow` marker: the tests that start torch.distributed ranks or execute a notebook; Hypothesis without its clock.

    python -m pytest -m "not slow"   # the fast loop: sim, the planner, exec within one process
    python -m pytest                 # everything

A test is slow when it, or a fixture it uses, starts ranks: `exec.launch.processes.launch` and what
calls it (`run_pipeline`, `run_torch_runtime`, `profile_costs`, `profile_device`), the
`exec.run` and `exec.profile_device` commands in a subprocess, torchrun; or when it executes
a notebook. Such a test carries `@pytest.mark.slow` (a whole slow module, `pytestmark`); a
fixture cannot carry a mark, so each test using a fixture that starts ranks carries it. A
test not marked slow that starts a process of `multiprocessing` (as `exec.launch` does)
fails, naming the marker.

Hypothesis runs without its clock: no deadline per example and no health check on how slow
the data is to draw, so a loaded machine slows a property test down but cannot fail it.
"""
from __future__ import annotations

import contextlib
import multiprocessing.process

import pytest
from hypothesis import HealthCheck, settings

SLOW_HELP = "starts torch.distributed ranks or executes a notebook (deselect with -m \"not slow\")"


settings.register_profile("no-clock", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("no-clock")


def pytest_configure(config):
    config.addinivalue_line("markers", f"slow: {SLOW_HELP}")


@contextlib.contextmanager
def no_processes(item):
    """Within a test not marked slow, starting a process of `multiprocessing` raises."""
    if item.get_closest_marker("slow") is not None:
        yield
        return
    start = multiprocessing.process.BaseProcess.start

    def refuse(self):
        raise RuntimeError(f"{item.nodeid} starts a process (ranks?) but is not marked slow: "
                           f"mark it @pytest.mark.slow")
    multiprocessing.process.BaseProcess.start = refuse
    try:
        yield
    finally:
        multiprocessing.process.BaseProcess.start = start


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    with no_processes(item):  # fixtures included: a module fixture that launches ranks is set up here
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    with no_processes(item):
        yield
