"""The guard behind the `slow` marker (tests/conftest.py): a test not marked slow cannot start a process."""
from __future__ import annotations

import multiprocessing

import pytest


def test_a_test_not_marked_slow_cannot_start_a_process():
    process = multiprocessing.get_context("spawn").Process(target=print)
    with pytest.raises(RuntimeError, match="not marked slow: mark it @pytest.mark.slow"):
        process.start()
