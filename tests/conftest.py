"""The `slow` marker: the tests that start torch.distributed ranks or execute a notebook.

    python -m pytest -m "not slow"   # the fast loop: sim, the planner, exec within one process
    python -m pytest                 # everything

A test is slow when it, or a fixture it uses, starts ranks: `exec.launch.launch` and what
calls it (`run_pipeline`, `run_torch_runtime`, `profile_costs`, `profile_device`), the
`exec.run` and `exec.profile_device` commands in a subprocess, torchrun; or when it executes
a notebook. The exec test files are edited by others, so their slow tests are named here
(SLOW) rather than marked in them; tests/test_notebooks.py marks its own. The names are
checked: tests/test_markers.py fails on a name here that no longer names a test, and a test
not marked slow that starts a process of `multiprocessing` (as `exec.launch` does) fails,
pointing here.
"""
from __future__ import annotations

import contextlib
import multiprocessing.process

import pytest

# file -> the test functions (or fixtures: every test that uses one is slow) that start ranks
SLOW: dict[str, frozenset[str]] = {
    "test_exec.py": frozenset({
        "test_launch_returns_each_ranks_value", "test_a_failing_rank_ends_the_run_naming_it",
        "test_a_hung_rank_hits_the_timeout", "test_under_torchrun_launch_runs_this_process_as_its_rank",
        "test_each_rank_and_its_threads_keep_to_their_own_cores",
        "runs",  # fixture: test_loss_and_gradients_match_one_process, test_every_action_..., test_memory_...
        "test_cli_json_is_all_of_stdout", "test_cli_calibrates_in_the_run_and_keeps_the_costs",
        "test_cli_under_torchrun_reports_once", "test_more_ranks_than_cores_calibrate_with_a_warning",
        "test_a_silent_rank_gets_a_progress_line_every_few_seconds", "test_cli_rank_failure_is_one_line_and_exit_1",
        "test_nccl_run_matches_one_process"}),
    "test_exec_dp.py": frozenset({"dp_runs", "test_the_run_leaves_no_rank_process_behind"}),
    "test_layer_layout.py": frozenset({"test_embedding_and_loss_as_stages_of_their_own_train_as_one_process"}),
    "test_new_user.py": frozenset({"test_exec_run_non_finite_loss_exits_1_naming_the_step"}),
    "test_profile.py": frozenset({
        "test_profile_costs_on_two_ranks", "test_a_run_calibrates_between_its_steps_without_changing_them",
        "test_with_adamw_the_simulated_peak_memory_is_the_measured_one"}),
    "test_profile_device.py": frozenset({"profile_file"}),
    "test_recompute.py": frozenset({
        "test_every_recompute_mode_trains_as_without_it", "test_calibrated_recompute_predicts_the_measured_peak_memory"}),
    "test_split_backward.py": frozenset({
        "test_split_schedules_with_two_stages_per_rank_train_as_one_process",
        "test_calibrated_split_schedule_predicts_its_peak_memory"}),
    "test_torch_runtime.py": frozenset({
        "test_torch_runtime_runs_our_1f1b_with_the_gradients_of_one_process",
        "test_torch_runtime_needs_receives_in_send_order"}),
}
SLOW_HELP = "starts torch.distributed ranks or executes a notebook (deselect with -m \"not slow\")"


def is_slow(file: str, function: str, fixtures) -> bool:
    """Whether SLOW names the test `function` of `file`, or a fixture it uses."""
    named = SLOW.get(file, frozenset())
    return function in named or any(f in named for f in fixtures)


def pytest_configure(config):
    config.addinivalue_line("markers", f"slow: {SLOW_HELP}")


def pytest_collection_modifyitems(config, items):
    for item in items:
        function = getattr(item, "originalname", item.name)
        if is_slow(item.path.name, function, getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@contextlib.contextmanager
def no_processes(item):
    """Within a test not marked slow, starting a process of `multiprocessing` raises."""
    if item.get_closest_marker("slow") is not None:
        yield
        return
    start = multiprocessing.process.BaseProcess.start

    def refuse(self):
        raise RuntimeError(f"{item.nodeid} starts a process (ranks?) but is not marked slow: "
                           f"name it in SLOW in tests/conftest.py")
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
