"""sim.schedule.dualpipe: DualPipe meets the DeepSeek-V3 report's Table 2 exactly under equal costs.

Table 2 (arXiv 2412.19437): DualPipe's bubble (P/2-1)(F&B + B - 3W), parameters 2x,
activations P+1. Here under equal computes F = I = W (B = I + W the full backward) and any
expert all-to-all a per F and per B: F&B is an overlapped pair's time
(`sim.engine.costs.pair_times`), B the full backward with its all-to-all. The bubble is
the most time a device does not compute; activations count micro-batches of one stage's
activations held (a stage is 1/P of the model, the unit in which 1F1B holds P).
"""
from __future__ import annotations

import pytest

import sim
from sim.engine.costs import pair_times
from sim.schedule.dualpipe import dualpipe
from sim.schedule.ir import Action, Kind, Schedule, ScheduleError
from sim.schedule.zerobubble import v_placement

SIZES = [(P, M) for P in (4, 6, 8) for M in (2 * P, 2 * P + 2, 4 * P, 4 * P + 6)]


def _equal(c: float, a: float) -> sim.Costs:
    """F = I = W = c, B = 2c, and an all-to-all of a per F and per backward."""
    return sim.Costs(forward=c, backward=2 * c, backward_input=c, backward_weight=c, a2a_forward=a, a2a_backward=a)


@pytest.mark.parametrize("P, M", SIZES)
@pytest.mark.parametrize("c, a", [(1.0, 0.0), (1.0, 0.5), (2.0, 0.7), (1.0, 1.5)])
def test_bubble_is_table_2s(P, M, c, a):
    result = sim.simulate(dualpipe(P, M, overlap=True), _equal(c, a))
    FB = sum(pair_times(c, a, 2 * c, a))   # F&B: the overlapped pair
    B, W = 2 * c + a, c                    # the full backward as it runs alone, with its all-to-all
    idle = [result.makespan - busy for busy in result.busy()]
    assert max(idle) == pytest.approx((P // 2 - 1) * (FB + B - 3 * W))
    assert idle[P // 2 - 1] == idle[P // 2] == pytest.approx(max(idle))  # the middle devices wait longest


@pytest.mark.parametrize("P, M", SIZES)
def test_each_device_holds_p_plus_1_micro_batches_of_a_stage(P, M):
    result = sim.simulate(dualpipe(P, M), _equal(1.0, 0.0))
    assert result.peak_activations == [P + 1] * P
    assert max(sim.simulate(sim.make_schedule("1f1b", P, M)).peak_activations) == P  # 1F1B's, in the same unit


@pytest.mark.parametrize("P", [4, 6, 8])
def test_parameters_twice_two_copies_fed_from_both_ends(P):
    M = 2 * P + 4
    s = dualpipe(P, M)
    assert (s.stages, s.chain, s.pipelines, list(s.placement)) == (2 * P, P, 2, v_placement(P))
    # each device holds two stages of 1/P of the model each: twice 1F1B's parameters
    weights = sim.Costs(weight_bytes=1.0)
    assert [m[0][1] for m in sim.simulate(s, weights).memory] == [2.0] * P
    assert [m[0][1] for m in sim.simulate(sim.make_schedule("1f1b", P, M), weights).memory] == [1.0] * P
    for m in range(M):  # the first half enter at device 0 and run down, the rest at device P-1 and run up
        down = m < M // 2
        assert s.route(m) == (range(P) if down else range(P, 2 * P))
        assert s.rank_of(s.route(m)[0]) == (0 if down else P - 1)
        assert {a.stage for prog in s.programs for a in prog if a.micro == m} == set(s.route(m))


@pytest.mark.parametrize("P, M", [(4, 8), (6, 14)])
def test_runs_the_references_eight_steps_per_direction(P, M):
    """Device r runs DualPipeV's eight steps for P/2 devices and M/2 micro-batches at its
    distance from the nearer end, and both halves mirror each other."""
    s = dualpipe(P, M)
    for r in range(P // 2):
        mine, mirror = s.programs[r], s.programs[P - 1 - r]
        assert [a.kind for a in mine] == [a.kind for a in mirror]
        assert mine[0] == Action(r, Kind.F, 0) and mirror[0] == Action(P + r, Kind.F, M // 2)
    sim.check_deadlock(s)
    sim.check_deadlock(dualpipe(P, M, overlap=True))


@pytest.mark.parametrize("P, M, why", [(3, 8, "even number of devices"), (4, 9, "even number of micro-batches"),
                                       (4, 6, "at least 2P = 8")])
def test_refuses_what_the_reference_refuses(P, M, why):
    with pytest.raises(ScheduleError, match=f"dualpipe on {P} devices, {M} micro-batches: needs an? .*{why}"):
        sim.make_schedule("dualpipe", P, M)
    with pytest.raises(ScheduleError, match=why):
        dualpipe(P, M)


def test_an_action_off_its_micro_batchs_route_is_refused():
    s = dualpipe(4, 8)
    programs = [list(p) for p in s.programs]
    programs[0][programs[0].index(Action(0, Kind.F, 0))] = Action(0, Kind.F, 4)   # micro-batch 4 runs up
    with pytest.raises(ScheduleError):
        sim.validate(Schedule(programs, s.placement, 8, pipelines=2))
    with pytest.raises(ScheduleError, match="must divide"):
        Schedule(s.programs, s.placement, 8, pipelines=3)


def test_csv_keeps_the_two_copies():
    s = dualpipe(4, 8, overlap=True)
    back = Schedule.from_csv(sim.lower(s).to_csv())
    assert back.pipelines == 2 and back.compute_only().programs == sim.lower(s).compute_only().programs
