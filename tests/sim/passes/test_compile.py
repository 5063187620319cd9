"""The compile pipeline (`sim.compile`), the engine that runs what it makes, the table of roles beside the device, and the liveness module, checked against the passes they gather and against runs."""
from __future__ import annotations

import pytest

import sim
from sim import Kind, Role, Schedule, ScheduleError
from sim.engine.resources import RESOURCES
from sim.passes.order import order_transfers, transfer_order
from sim.passes.validation import check_deadlock
from sim.schedule import liveness
from sim.schedule.kinds import BESIDE, KINDS

NAMED = [(name, 4, 8) for name in sim.SCHEDULES if name != "zb-auto"]
CROSSED = Schedule([["0F0", "0B0", "0F1", "0B1"], ["1F1", "1B1", "1F0", "1B0"]])  # a cross-rank deadlock


@pytest.mark.parametrize("name, devices, micro_batches", NAMED)
def test_each_target_lowers_as_the_passes_do(name, devices, micro_batches):
    s = sim.make_schedule(name, devices, micro_batches)
    assert sim.compile(s).lowered() == sim.lower(s) == sim.compile(s, "gloo").lowered()
    nccl = sim.compile(s, "nccl").lowered()
    assert nccl == order_transfers(sim.lower(s))
    transfer_order(nccl)  # NCCL pairs them by order: they are in order


@pytest.mark.parametrize("name, devices, micro_batches", NAMED[:4])
def test_a_result_holds_the_compiled_program(name, devices, micro_batches):
    s = sim.make_schedule(name, devices, micro_batches)
    r = sim.simulate(s, sim.Costs(latency=0.1))
    assert r.program is not None and r.program.schedule is s
    assert r.schedule == sim.lower(s)  # written out from the program's numbers
    lowered = sim.simulate(sim.lower(s), sim.Costs(latency=0.1))
    assert lowered.schedule == r.schedule and lowered.makespan == r.makespan


def test_a_deadlock_is_found_before_exec_starts_and_by_the_simulators_run():
    with pytest.raises(ScheduleError) as before:
        sim.compile(CROSSED, "gloo")
    program = sim.compile(CROSSED)  # the simulator's run is its own check
    assert program.schedule is CROSSED
    with pytest.raises(ScheduleError) as ran:
        sim.simulate(CROSSED)
    with pytest.raises(ScheduleError) as checked:
        check_deadlock(CROSSED)
    assert str(before.value) == str(ran.value) == str(checked.value)
    assert "rank 1 waits at 1F1 for 0SEND_F1 on rank 0" in str(ran.value)


def test_an_unknown_target_is_refused():
    with pytest.raises(ValueError, match="unknown target 'mpi'; choose one of sim, gloo, nccl"):
        sim.compile(sim.make_schedule("1f1b", 2, 2), "mpi")


def test_every_role_beside_the_device_has_its_resource():
    roles = {KINDS[k].role for k in BESIDE}
    assert roles == set(RESOURCES) and Role.COMPUTE not in roles
    assert all(cls.role is role for role, cls in RESOURCES.items())


@pytest.mark.parametrize("name, devices, micro_batches", NAMED)
def test_liveness_from_the_order_is_what_a_run_holds(name, devices, micro_batches):
    s = sim.make_schedule(name, devices, micro_batches)
    costs = sim.Costs(activation_bytes=[1.0, 2.0, 3.0, 5.0] * (s.stages // 4), w_activation_bytes=0.5)
    r = sim.simulate(s, costs)
    assert liveness.held(s) == r.peak_activations
    c = costs.for_stages(s.stages)
    peaks = [liveness.program_peak(prog, c) for prog in s.programs]
    static = [sum(c.static_total(st) for st, rank in enumerate(s.placement) if rank == d) for d in range(s.ranks)]
    assert [p + st for p, st in zip(peaks, static)] == pytest.approx(r.peak_memory)
    assert liveness.schedule_peak(s, c) == max(peaks)


def test_held_after_counts_each_kinds_effects():
    c = sim.Costs(activation_bytes=3.0, w_activation_bytes=1.0).for_stages(1)
    assert liveness.held_after({Kind.F: 4, Kind.I: 2, Kind.W: 1}, c, 0) == pytest.approx((4 - 2) * 3.0 + (2 - 1) * 1.0)
    assert liveness.change(Kind.F, "start", c, 0) == (3.0, 1) and liveness.change(Kind.F, "end", c, 0) is None
