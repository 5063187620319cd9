"""`sim.limits`, the one host-memory guard, at the entry points that build a step: `sim.make_schedule`
and `sim.simulate` refuse a step too large for this machine at once, with one line, before
allocating it; the limit is exact at the boundary. The machine's memory is set by each test
(monkeypatched), so the limits do not depend on the machine that runs them."""
from __future__ import annotations

import tracemalloc

import pytest

import sim
from sim import limits
from sim.limits import StepTooLarge


def allow(monkeypatch, cells: int) -> None:
    """Make this machine's memory hold exactly `cells` stage-micro-batches of one step's table."""
    memory = (limits.BASE_BYTES + cells * limits.BYTES_PER_CELL["table"]) / limits.MEMORY_SHARE
    monkeypatch.setattr(limits, "machine_memory", lambda: int(memory))
    assert limits.most_cells() == cells


def test_a_huge_schedule_is_refused_before_anything_is_allocated(monkeypatch):
    """`make_schedule("1f1b", 10**6, 10**6)` used to grow to 24 GB until it was killed (in a
    notebook: the kernel); now it is one line, and nothing of the step was built."""
    allow(monkeypatch, 1000)
    tracemalloc.start()
    try:
        with pytest.raises(StepTooLarge) as e:
            sim.make_schedule("1f1b", 10**6, 10**6)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 100_000, peak  # bytes: the message, not a step
    line = str(e.value)
    assert "\n" not in line and isinstance(e.value, ValueError)
    assert line.startswith("step too large for this machine: 1,000,000,000,000 stage-micro-batches")
    assert "the limit here is 1,000" in line and "give fewer devices or micro-batches" in line


def test_make_schedule_refuses_one_stage_micro_batch_past_the_limit(monkeypatch):
    allow(monkeypatch, 32)
    assert sim.make_schedule("1f1b", 4, 8).stages == 4                 # 32: exactly at the limit
    assert sim.make_schedule("interleaved-1f1b", 2, 8).stages == 4     # 2 devices x V 2 x 8
    with pytest.raises(StepTooLarge, match="33 stage-micro-batches"):
        sim.make_schedule("1f1b", 3, 11)
    with pytest.raises(StepTooLarge, match="36 stage-micro-batches"):
        sim.make_schedule("interleaved-1f1b", 2, 9)                    # V counts: 2 x 2 x 9


def test_simulate_refuses_a_step_past_the_limit_before_compiling_it(monkeypatch):
    schedule = sim.make_schedule("1f1b", 4, 8)
    allow(monkeypatch, 32)
    assert sim.simulate(schedule).makespan == 33.0                      # exactly at the limit
    allow(monkeypatch, 31)

    def compile_(*args, **kwargs):
        raise AssertionError("the guard comes before the step is compiled")

    monkeypatch.setattr(sim.simulation, "compile", compile_)
    with pytest.raises(StepTooLarge, match="32 stage-micro-batches .* the limit here is 31"):
        sim.simulate(schedule)


def test_the_command_lines_ask_the_same_guard():
    """`sim.cli.machine_memory` (which `exec.run` reads) is the guard's own."""
    from sim import cli
    assert cli.machine_memory is limits.machine_memory
