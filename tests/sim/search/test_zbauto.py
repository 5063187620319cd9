"""The automatic zero-bubble scheduler (sim.search.zbauto, "zb-auto"): it validates, fits its
memory limit, is never slower than the I/W-split 1F1B or ZB-H1, reaches the lower bound
of the makespan at the ZB-2p limit with equal costs, and more memory never hurts."""
import math

import pytest
from hypothesis import given, settings, strategies as st

import sim
from sim import Costs, ScheduleError
from sim.search import zbauto
from sim.schedule.liveness import schedule_peak, simulated_peak
from sim.schedule.zerobubble import split_1f1b
from sim.search.zbauto import device_bubble, zb_auto

EQUAL_FREE = Costs(backward_input=1.0, backward_weight=1.0, transport="ideal")  # F = I = W = 1, free transfers
times = st.sampled_from([0.25, 0.5, 1.0, 1.5, 2.0, 3.0])


@st.composite
def problems(draw):
    """Random P, M and per-stage costs, and a limit from one micro-batch up to 3P."""
    p, m = draw(st.integers(1, 5)), draw(st.integers(1, 8))
    act = draw(st.lists(st.floats(1.0, 100.0), min_size=p, max_size=p))
    share = draw(st.sampled_from([1.0, 32 / 34, 0.5, 0.0]))  # W's part of F's bytes (Qi et al. Table 1: 32sbh of ~34sbh)
    costs = Costs(forward=draw(st.lists(times, min_size=p, max_size=p)),
                  backward_input=draw(st.lists(times, min_size=p, max_size=p)),
                  backward_weight=draw(st.lists(times, min_size=p, max_size=p)),
                  latency=draw(st.sampled_from([0.0, 0.1, 1.0])),
                  activation_bytes=tuple(act), w_activation_bytes=tuple(a * share for a in act),
                  weight_bytes=draw(st.sampled_from([0.0, 1e6])),  # static: not counted in the limit
                  transport=draw(st.sampled_from(["ideal", "gloo-cpu"])))
    limit = max(act) * draw(st.floats(1.0, 3.0 * p))
    return p, m, costs, limit


def _makespan(schedule, costs):
    return sim.simulate(schedule, costs).makespan


@settings(max_examples=25, deadline=None)
@given(problems())
def test_it_validates_fits_its_limit_and_is_never_slower_than_the_split_1f1b(problem):
    p, m, costs, limit = problem
    s = sim.make_schedule("zb-auto", p, m, costs=costs, memory_limit=limit)
    sim.validate(s)
    assert {str(a)[len(str(a.stage))] for prog in s.programs for a in prog} == {"F", "I", "W"}
    r, c = sim.simulate(s, costs), costs.for_stages(p)
    assert simulated_peak(r, c) <= limit + 1e-9 * max(c.weight_bytes)  # the static bytes, rounded in and out
    assert math.isclose(simulated_peak(r, c), schedule_peak(s, c), rel_tol=1e-9, abs_tol=1e-9 * max(c.weight_bytes))
    if schedule_peak(split_1f1b(p, m), c) <= limit:
        assert r.makespan <= _makespan(split_1f1b(p, m), costs)


@settings(max_examples=15, deadline=None)
@given(problems())
def test_it_is_never_slower_than_zb_h1_where_that_fits(problem):
    p, m, costs, limit = problem
    try:
        h1 = sim.make_schedule("zb-h1", p, m)
    except ScheduleError:
        return  # sizes ZB-H1 refuses
    if schedule_peak(h1, costs.for_stages(p)) <= limit:
        assert _makespan(zb_auto(p, m, costs=costs, memory_limit=limit), costs) <= _makespan(h1, costs)


@settings(max_examples=15, deadline=None)
@given(problems(), st.floats(1.0, 2.0))
def test_more_memory_never_makes_it_slower(problem, more):
    p, m, costs, limit = problem
    tight = _makespan(zb_auto(p, m, costs=costs, memory_limit=limit), costs)
    assert _makespan(zb_auto(p, m, costs=costs, memory_limit=limit * more), costs) <= tight


@pytest.mark.parametrize("p,m", [(1, 3), (2, 2), (3, 5), (4, 4), (4, 9), (5, 12)])
def test_zb_2p_reaches_the_lower_bounds_with_equal_costs(p, m):
    """F = I = W = 1, free transfers, M >= P, a limit of 2P-1 micro-batches (ZB-H2's peak,
    Qi et al. 2024 Sec. 2.2; ZB-2p has 2P). Two lower bounds hold for any schedule:
    - makespan >= (P-1)F + M(F+I+W): the last device gets its first input after P-1
      forwards and then has M(F+I+W) of work;
    - the paper's bubble of device 0 >= (2P-1-M)F: its first I cannot start before the
      forward has crossed P devices and the input gradient P-1 of them back, 2P-1, and
      it has only M forwards to fill that time.
    zb-auto reaches both: the paper's ZB-H2 bubble (P-1)(F+I-2W) = 0 where M >= 2P-1."""
    s = zb_auto(p, m, costs=EQUAL_FREE, memory_limit=2 * p - 1)
    r = sim.simulate(s, EQUAL_FREE)
    assert r.makespan == (p - 1) + 3 * m
    assert device_bubble(r) == max(0, 2 * p - 1 - m)
    assert max(r.peak_activations) <= 2 * p - 1
    more = sim.simulate(zb_auto(p, m, costs=EQUAL_FREE, memory_limit=3 * p), EQUAL_FREE)
    assert (more.makespan, device_bubble(more)) == (r.makespan, device_bubble(r))


@pytest.mark.parametrize("p,m", [(2, 2), (3, 6), (4, 8), (5, 7)])
def test_zb_1p_is_no_slower_than_the_split_1f1b_closed_form(p, m):
    """At P micro-batches (1F1B's peak, the paper's ZB-1p), equal costs, free transfers:
    the split 1F1B takes M(F+I+W) + (P-1)(F+I) (1F1B's M(F+B) + (P-1)(F+B), less the W
    that no longer holds back the gradient), and zb-auto is no slower."""
    assert _makespan(split_1f1b(p, m), EQUAL_FREE) == 3 * m + 2 * (p - 1)
    r = sim.simulate(zb_auto(p, m, costs=EQUAL_FREE, memory_limit=p), EQUAL_FREE)
    assert r.makespan <= 3 * m + 2 * (p - 1)
    assert max(r.peak_memory) <= p


@pytest.mark.parametrize("p,m", [(2, 2), (3, 6), (4, 8), (5, 7)])
def test_zb_1p_reaches_zb_h1_with_equal_costs(p, m):
    """ZB-H1 (Qi et al. 2024, Sec. 2.1) at equal costs and free transfers: makespan
    (P-1)F + M(F+I+W), the lower bound, and a bubble of one device of (P-1)(F+I-W), at
    P micro-batches; zb-auto at that limit does at least as well."""
    r = sim.simulate(zb_auto(p, m, costs=EQUAL_FREE, memory_limit=p), EQUAL_FREE)
    assert r.makespan == (p - 1) + 3 * m
    assert device_bubble(r) <= p - 1


def test_without_costs_it_takes_equal_f_i_w_and_p_micro_batches():
    s = sim.make_schedule("zb-auto", 4, 8)
    assert s == zb_auto(4, 8, costs=Costs(backward_input=1, backward_weight=1), memory_limit=4.0)
    r = sim.simulate(s, Costs(backward_input=1, backward_weight=1))
    assert max(r.peak_activations) <= 4


def test_it_tries_zb_h1_among_its_candidates(monkeypatch):
    asked = []

    def fake(devices, micro_batches):
        asked.append((devices, micro_batches))
        return split_1f1b(devices, micro_batches)

    monkeypatch.setattr(zbauto, "zb_h1", fake)
    zb_auto(3, 7, costs=Costs(forward=1.3, backward_input=0.7, backward_weight=0.4), memory_limit=2.0)
    assert asked == [(3, 7)]


@pytest.mark.parametrize("options, message", [
    (dict(memory_limit=0.5), r"^zb-auto memory_limit 0.5 is below one micro-batch's activations \(1 bytes\)$"),
    (dict(virtual=2), r"^zb-auto on 3 devices, 4 micro-batches: V=2: this schedule holds one stage per device"),
    (dict(costs="fast"), r"^zb-auto costs must be a sim.Costs, got str$"),
    (dict(costs=Costs(forward=[1, 2])), r"^zb-auto: Costs.forward has 2 values but the schedule has 3 stages$"),
    (dict(memory_limit=math.nan), r"^zb-auto memory_limit nan is below"),
])
def test_bad_input_gets_a_one_line_schedule_error(options, message):
    with pytest.raises(ScheduleError, match=message) as e:
        sim.make_schedule("zb-auto", 3, 4, **options)
    assert "\n" not in str(e.value)
    with pytest.raises(ScheduleError, match="V=2"):
        zb_auto(3, 4, virtual=2)


@pytest.mark.parametrize("p", [4, 5, 6])
def test_bytes_that_are_not_exact_in_floating_point_do_not_stall_it(p):
    """GPT-3 6.7B's activations per micro-batch (Qi et al. Table 1, s=2048, b=1, 32 layers
    over 4 devices): adding and taking back such bytes leaves rounding behind, which must
    not make a device look fuller than it is."""
    a = 2048 * (34 * 4096 + 5 * 32 * 2048) * 8 * 2.0 / 1.6  # not a whole number of bytes
    c = sim.Costs(backward_input=1, backward_weight=1, activation_bytes=a, w_activation_bytes=a * 0.28,
                  transport="ideal")
    for limit in (p * a, 2 * p * a):
        r = sim.simulate(sim.make_schedule("zb-auto", p, 2 * p, costs=c, memory_limit=limit), c)
        assert max(r.peak_memory) <= limit * (1 + 1e-12)


@pytest.mark.parametrize("p, m, limit", [(4, 12, 4.0), (4, 12, 7.0), (3, 9, 2.0), (5, 10, 9.0)])
def test_zb_auto_with_a_budget_fits_and_beats_split_1f1b(p, m, limit):
    costs = sim.Costs(forward=1.0, backward_input=1.1, backward_weight=0.7)
    c = costs.for_stages(p)
    full = sim.simulate(zb_auto(p, m, costs=costs, memory_limit=limit), costs).makespan
    for runs in (2, 3, 8):
        s = zb_auto(p, m, costs=costs, memory_limit=limit, max_runs=runs)
        assert schedule_peak(s, c) <= limit * (1 + 1e-9)
        span = sim.simulate(s, costs).makespan
        assert full <= span + 1e-9  # the whole family is never worse
        if schedule_peak(split_1f1b(p, m), c) <= limit:  # a candidate it always tries
            assert span <= sim.simulate(split_1f1b(p, m), costs).makespan + 1e-9
    with pytest.raises(sim.ScheduleError, match="max_runs must be an integer >= 2"):
        zb_auto(p, m, costs=costs, memory_limit=limit, max_runs=1)
