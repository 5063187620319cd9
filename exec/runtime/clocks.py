"""Clocks: how a rank marks the moments of its actions and turns the marks into seconds.

A mark is cheap to take inside a step; `seconds(mark)` reads it out afterwards, relative
to the step's `start()`. On CPU a mark is the time itself; on a GPU it is an event on the
stream, which says when the device got there, not when the host asked.
"""
from __future__ import annotations

import time

import torch

__all__ = ["CpuClock", "CudaClock", "clock_for"]


class CpuClock:
    """Marks are `time.perf_counter()` seconds; `seconds(mark)` is relative to `start()`."""

    def start(self) -> None:
        self.base = time.perf_counter()

    def mark(self) -> float:
        return time.perf_counter()

    def seconds(self, mark: float) -> float:
        return mark - self.base

    def finish(self) -> None:
        pass


class CudaClock:
    """Marks are CUDA events on the current stream (what the GPU did, not when the host
    asked); read out after one synchronise at the end of the step."""

    def start(self) -> None:
        torch.cuda.synchronize()
        self.base = torch.cuda.Event(enable_timing=True)
        self.base.record()

    def mark(self) -> torch.cuda.Event:
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def seconds(self, mark: torch.cuda.Event) -> float:
        return self.base.elapsed_time(mark) / 1e3

    def finish(self) -> None:
        torch.cuda.synchronize()


def clock_for(device: torch.device) -> CpuClock | CudaClock:
    """The clock of a rank whose tensors live on `device`."""
    return CudaClock() if device.type == "cuda" else CpuClock()
