"""sim.check_schedule: a hand-written schedule's problems, each at its cell (rank, step, action), and a bad schedule refused with the grid."""
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import sim
from sim import ScheduleError
from sim.passes.order import order_transfers

FAST = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _cells(report, kind):
    return [(p.rank, p.step, p.action) for p in report.problems if p.kind == kind]


def test_a_deadlock_is_refused_with_the_grid_naming_its_cells():
    # rank 0 waits for 1B0 before it sends 0F1; rank 1 wants 0F1 first
    report = sim.check_schedule("0F0 0B0 0F1 0B1\n1F1 1F0 1B0 1B1")
    assert _cells(report, "deadlock") == [(0, 1, "0B0"), (1, 0, "1F1")]
    with pytest.raises(ScheduleError) as e:
        report.checked()
    grid = str(e.value).splitlines()
    assert "0B0!1" in grid[[i for i, line in enumerate(grid) if line.lstrip().startswith("step")][0] + 2]
    assert any(line.split()[:1] == ["0"] and "1F1!2" in line for line in grid)


def test_an_action_before_its_dependency_is_reported_at_its_cell():
    report = sim.check_schedule("0F0 0F1 0B0 0B1\n1F0 1B1 1F1 1B0")
    assert _cells(report, "before its dependency") == [(1, 1, "1B1")]
    assert "needs 1F1, which this rank runs later, at step 2" in report.problems[0].what
    assert not report.ok


def test_a_duplicate_a_missing_action_and_a_wrong_rank():
    report = sim.check_schedule("0F0 0B0 0F1 0B1 1F0\n1F0 1B0 1F1")
    assert _cells(report, "duplicate") == [(1, 0, "1F0")]
    assert _cells(report, "wrong rank") == [(0, 4, "1F0")]
    assert _cells(report, "missing") == [(1, None, "1B1")]
    assert report.schedule is None


def test_unreadable_cells_are_all_listed():
    report = sim.check_schedule("0F0,0Z0,0B0\n1F0,1B0,what")
    assert _cells(report, "not an action") == [(0, 1, "0Z0"), (1, 2, "what")]


def test_nccl_order_of_a_lowered_schedule():
    low = sim.lower(sim.make_schedule("1f1b", 2, 3))
    assert sim.check_schedule(low).ok
    rows = [p for p in low.programs]
    r1 = list(rows[1])
    i, j = r1.index(sim.Action.parse("1RECV_F0")), r1.index(sim.Action.parse("1RECV_F1"))
    r1[i], r1[j] = r1[j], r1[i]  # rank 1 posts micro-batch 1's receive first: NCCL pairs it with 0SEND_F0
    swapped = low.with_programs([rows[0], r1])
    report = sim.check_schedule(sim.schedule_text(swapped, csv=True))
    assert [(p.rank, p.step, p.action) for p in report.problems if p.kind == "NCCL order"][:1] == [(1, i, "1RECV_F1")]
    assert sim.check_schedule(order_transfers(swapped)).ok


@pytest.mark.parametrize("devices,micro", [(2, 4), (4, 8), (3, 7)])
def test_memory_limit_gpipe_over_1f1b_within(devices, micro):
    # GPipe holds all m micro-batches on every stage; 1F1B min(p - s, m) on stage s (docs/schedules.md)
    gpipe = sim.check_schedule(sim.make_schedule("gpipe", devices, micro), max_held=devices)
    assert _cells(gpipe, "memory") == [(r, devices, f"{r}F{devices}") for r in range(devices)]
    assert sim.check_schedule(sim.make_schedule("1f1b", devices, micro), max_held=devices).ok
    tight = sim.check_schedule(sim.make_schedule("1f1b", devices, micro), max_held=devices - 1)
    assert [p.rank for p in tight.problems] == [0]


def test_memory_limit_in_bytes_needs_costs():
    costs = sim.Costs(activation_bytes=2.0)
    report = sim.check_schedule(sim.make_schedule("gpipe", 2, 4), memory_limit=5.0, costs=costs)
    assert _cells(report, "memory") == [(0, 2, "0F2"), (1, 2, "1F2")]  # the third F holds 6 bytes
    with pytest.raises(ValueError, match="costs"):
        sim.check_schedule("0F0 0B0", memory_limit=1.0)


@FAST
@given(name=st.sampled_from(["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zbv"]), seed=st.randoms(),
       swaps=st.integers(1, 3))
def test_a_report_finds_a_deadlock_exactly_when_check_deadlock_does(name, seed, swaps):
    s = sim.make_schedule(name, 2, 4)
    programs = [list(p) for p in s.programs]
    for _ in range(swaps):  # swap two neighbours on a random rank
        prog = programs[seed.randrange(len(programs))]
        k = seed.randrange(len(prog) - 1)
        prog[k], prog[k + 1] = prog[k + 1], prog[k]
    shuffled = s.with_programs(programs)
    report = sim.check_schedule(sim.schedule_text(shuffled))
    try:
        sim.check_deadlock(shuffled)
        stuck = False
    except ScheduleError:
        stuck = True
    assert (not report.ok) == stuck
    assert all(p.kind in ("deadlock", "before its dependency") for p in report.problems)
    assert all(str(shuffled.programs[p.rank][p.step]) == p.action for p in report.problems)


def test_sim_lower_order_is_flagged_for_nccl_and_order_transfers_clears_it():
    # interleaved-zb on 2 ranks: sim.lower posts RECVs in the gloo order, which NCCL would pair wrongly
    s = sim.make_schedule("interleaved-zb", 2, 3)
    flagged = sim.check_schedule(sim.lower(s))
    assert flagged.problems and {p.kind for p in flagged.problems} == {"NCCL order"}
    assert sim.check_schedule(order_transfers(sim.lower(s))).ok
    assert sim.check_schedule(sim.compile(s, "nccl").lowered()).ok
