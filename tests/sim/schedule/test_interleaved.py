"""Interleaved 1F1B, looped BFS and the cap on micro-batches in flight: their closed forms
with equal costs, the engine against the independent reference model on random costs,
what the cap guarantees, and the one-line errors for sizes they refuse."""
from __future__ import annotations

import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import sim
from sim import Costs, Kind, ScheduleError
from helpers import assert_matches_reference

times = st.floats(0.1, 3.0, allow_nan=False)


def ideal(F: float, B: float) -> Costs:
    return Costs(forward=F, backward=B, transport="ideal")


# ---------------------------------------------------------------- closed forms, equal costs, free communication

@settings(max_examples=60, deadline=None)
@given(st.integers(1, 5), st.integers(1, 3), st.integers(1, 3), times, times)
def test_interleaved_makespan_is_work_plus_p_minus_1_chunk_steps(P, rounds, V, F, B):
    """Narayanan et al. 2021, Sec. 2.2.1: with M a multiple of P, each device works
    M V (F+B) and idles (P-1)(F+B), F and B being one chunk's costs (1/V of 1F1B's)."""
    M = rounds * P
    r = sim.simulate(sim.make_schedule("interleaved-1f1b", P, M, V), ideal(F, B))
    assert r.makespan == pytest.approx((M * V + P - 1) * (F + B), rel=1e-9)
    assert r.busy() == pytest.approx([M * V * (F + B)] * P, rel=1e-9)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 5), st.integers(1, 9), st.integers(1, 3), times, times)
def test_looped_bfs_makespan(P, M, V, F, B):
    """Looped BFS runs its forwards back to back once the first micro-batch has crossed the
    devices when M >= P (chunk c+1's first input is ready when chunk c's M forwards end);
    when M < P each chunk waits for the previous one's last output, so the forward phase is
    a GPipe over P V stages. The backward phase mirrors it: makespan
    (V max(M, P) + min(M, P) - 1)(F + B); at V = 1, GPipe's (M + P - 1)(F + B)."""
    r = sim.simulate(sim.make_schedule("looped-bfs", P, M, V), ideal(F, B))
    assert r.makespan == pytest.approx((V * max(M, P) + min(M, P) - 1) * (F + B), rel=1e-9)
    assert r.peak_activations == [M * V] * P  # every chunk of every micro-batch, as GPipe


@pytest.mark.parametrize("P", [2, 3, 4])
@pytest.mark.parametrize("V", [2, 3])
def test_interleaved_holds_fewer_than_looped_bfs_in_the_same_time(P, V):
    """Same makespan as looped BFS for M a multiple of P, but rank r holds only its warm-up
    plus one: (V-1)P + 2(P-1-r) + 1 chunk activations instead of M V."""
    M = 2 * P
    inter = sim.simulate(sim.make_schedule("interleaved-1f1b", P, M, V), ideal(1, 2))
    bfs = sim.simulate(sim.make_schedule("looped-bfs", P, M, V), ideal(1, 2))
    assert inter.makespan == bfs.makespan
    assert inter.peak_activations == [min((V - 1) * P + 2 * (P - 1 - r) + 1, M * V) for r in range(P)]


@pytest.mark.parametrize("P", [1, 2, 3, 5])
@pytest.mark.parametrize("M", [1, 2, 3, 7, 10])
def test_interleaved_with_one_chunk_is_1f1b(P, M):
    assert sim.make_schedule("interleaved-1f1b", P, M, 1).programs == sim.make_schedule("1f1b", P, M).programs


def test_looped_placement():
    s = sim.make_schedule("interleaved-1f1b", 3, 6)  # V = 2 unless told
    assert s.stages == 6 and s.placement == (0, 1, 2, 0, 1, 2)
    assert sim.make_schedule("looped-bfs", 2, 4, 3).placement == (0, 1, 0, 1, 0, 1)


@pytest.mark.parametrize("P,M", [(4, 10), (4, 3), (3, 5), (2, 6)])
def test_m_not_a_multiple_of_p_runs_in_rounds_as_torch_does(P, M):
    """max(1, M // P) rounds of equal size: M = 10 on 4 devices runs 2 rounds of 5."""
    s = sim.validate(sim.make_schedule("interleaved-1f1b", P, M)).compute_only()
    rounds = max(1, M // P)
    g = M // rounds
    # rank 0 starts with g forwards of its first chunk, then g of its second
    assert [str(a) for a in s.programs[0][:2 * g]] == [f"0F{m}" for m in range(g)] + [f"{P}F{m}" for m in range(g)]


# ---------------------------------------------------------------- the engine against the reference model

@st.composite
def configs(draw):
    name = draw(st.sampled_from(["interleaved-1f1b", "looped-bfs", "gpipe", "1f1b"]))
    P, M = draw(st.integers(1, 4)), draw(st.integers(1, 8))
    V = draw(st.integers(1, 3)) if name in ("interleaved-1f1b", "looped-bfs") else 1
    options = {"max_active": draw(st.integers(1, M + 1))} if V == 1 and name in ("gpipe", "1f1b") else {}
    S = P * V
    per_stage = dict(forward=draw(st.lists(times, min_size=S, max_size=S)),
                     backward=draw(st.lists(times, min_size=S, max_size=S)),
                     latency=draw(st.sampled_from([0.0, 0.01, 0.3, 2.0])))
    if draw(st.booleans()):
        costs = Costs(**per_stage, transport="ideal")
    else:  # the gloo-cpu transport, with its overheads and the I/O thread's tick
        costs = Costs(**per_stage, send_overhead=draw(st.sampled_from([0.0, 0.02])),
                      recv_overhead=draw(st.sampled_from([0.0, 0.03])),
                      arrive_overhead=draw(st.sampled_from([0.0, 0.04])),
                      io_tick=draw(st.sampled_from([0.0, 0.05, 0.7, math.inf])))
    return name, P, M, V, options, costs


@settings(max_examples=80, deadline=None)
@given(configs())
def test_engine_matches_the_reference_model(cfg):
    name, P, M, V, options, costs = cfg
    assume(sim.SCHEDULES[name].refusal(P, M, V) is None)
    schedule = sim.make_schedule(name, P, M, V, **options)
    assert_matches_reference(schedule, costs)


# ---------------------------------------------------------------- max_active

def in_flight(r: sim.Result) -> int:
    """The most micro-batches ever between the start of their first forward (stage 0) and
    the end of their last backward (stage 0), from the events."""
    span = {}
    for e in r.events:
        if e.is_compute and e.action.stage == 0:
            lo, hi = span.get(e.action.micro, (math.inf, -math.inf))
            span[e.action.micro] = (min(lo, e.start), max(hi, e.end))
    return max(sum(lo <= t < hi for lo, hi in span.values()) for t, _ in span.values())


def test_gpipe_waves_with_latency_are_not_monotone_in_the_cap():
    """Hypothesis's counterexample (2026-11-24), kept: under a latency, GPipe's waves of 3 + 1
    take longer than waves of 2 + 2 on 3 devices (the wave of one micro-batch pays a whole
    fill and drain with its hops), though they hold more; without latency they tie."""
    def span(cap, latency):
        costs = Costs(forward=[1.0] * 3, backward=[0.25] * 3, latency=latency)
        return sim.simulate(sim.make_schedule("gpipe", 3, 4, max_active=cap), costs).makespan
    assert span(3, 0.2) > span(2, 0.2)
    assert span(3, 0.0) == span(2, 0.0) == (2 * 2 + 4) * 1.25   # (ceil(M/c)(P-1) + M)(F+B)


@settings(max_examples=50, deadline=None)
@given(st.sampled_from(["gpipe", "1f1b"]), st.integers(1, 5), st.integers(1, 9), st.data())
def test_the_cap_bounds_micro_batches_in_flight_and_costs_time_monotonically(name, P, M, data):
    F = data.draw(st.lists(times, min_size=P, max_size=P))
    B = data.draw(st.lists(times, min_size=P, max_size=P))
    costs = Costs(forward=F, backward=B, latency=data.draw(st.sampled_from([0.0, 0.2])))
    uncapped = sim.simulate(sim.make_schedule(name, P, M), costs)
    before = math.inf
    for cap in range(1, M + 2):
        s = sim.validate(sim.make_schedule(name, P, M, max_active=cap))  # deadlock-free
        r = sim.simulate(s, costs)
        assert max(r.peak_activations) <= cap
        assert in_flight(r) <= cap
        if name == "1f1b" or costs.latency == 0:  # a larger cap never makes the step longer
            assert r.makespan <= before + 1e-9   # (GPipe's waves with latency can: see below)
        before = r.makespan
        if cap >= max(uncapped.peak_activations):
            assert r.schedule.compute_only().programs == uncapped.schedule.compute_only().programs
            assert r.makespan == uncapped.makespan


@pytest.mark.parametrize("P,M", [(1, 3), (3, 4), (4, 2)])
def test_gpipe_with_one_micro_batch_in_flight_is_naive(P, M):
    """A cap of 1 lets a micro-batch in only when the last one has left: P M (F + B)."""
    s = sim.make_schedule("gpipe", P, M, max_active=1)
    assert s.programs == sim.make_schedule("naive", P, M).programs
    assert sim.simulate(s, ideal(1, 2)).makespan == P * M * 3


@pytest.mark.parametrize("P", [1, 2, 4])
@pytest.mark.parametrize("M", [1, 5, 8])
@pytest.mark.parametrize("cap", [1, 2, 3, 8])
def test_gpipe_with_a_cap_runs_waves(P, M, cap):
    """Waves of `cap` micro-batches, each a GPipe step of its own: with equal costs
    (ceil(M / cap)(P - 1) + M)(F + B), every device holding min(cap, M)."""
    r = sim.simulate(sim.make_schedule("gpipe", P, M, max_active=cap), ideal(1, 2))
    assert r.makespan == (-(-M // cap) * (P - 1) + M) * 3
    assert r.peak_activations == [min(cap, M)] * P


def test_1f1b_cap_holds_min_of_cap_and_p_minus_s():
    r = sim.simulate(sim.make_schedule("1f1b", 5, 10, max_active=3), ideal(1, 2))
    assert r.peak_activations == [3, 3, 3, 2, 1]


# ---------------------------------------------------------------- bad input: one line each

@pytest.mark.parametrize("call,message", [
    (lambda: sim.make_schedule("interleaved-1f1b", 3, 7), r"on 3 devices, 7 micro-batches: M=7 is not a multiple of max\(1, M // P\) = 2"),
    (lambda: sim.make_schedule("interleaved-1f1b", 4, 8, 0), r"virtual must be a positive integer, got 0"),
    (lambda: sim.make_schedule("looped-bfs", 4, 0), r"micro_batches must be a positive integer, got 0"),
    (lambda: sim.make_schedule("gpipe", 4, 8, 2), r"V=2: this schedule holds one stage per device"),
    (lambda: sim.make_schedule("gpipe", 4, 8, max_active=0), r"max_active must be a positive integer"),
    (lambda: sim.make_schedule("1f1b", 4, 8, max_active=True), r"max_active must be a positive integer"),
    (lambda: sim.make_schedule("1f1b", 4, 8, max_active=2.5), r"max_active must be a positive integer"),
    (lambda: sim.make_schedule("looped-bfs", 4, 8, max_active=2), r"looped-bfs takes no options, not max_active"),
])
def test_bad_input_gives_a_one_line_schedule_error(call, message):
    with pytest.raises(ScheduleError, match=message) as e:
        call()
    assert "\n" not in str(e.value)


def test_new_schedules_are_registered_with_their_defaults():
    assert sim.SCHEDULES["interleaved-1f1b"].virtual == sim.SCHEDULES["looped-bfs"].virtual == 2
    assert "max_active" in sim.SCHEDULES["gpipe"].options and "max_active" in sim.SCHEDULES["1f1b"].options
    s = sim.make_schedule("Interleaved_1F1B", 2, 4)  # dashes and case optional
    assert {a.kind for p in s.programs for a in p} == {Kind.F, Kind.B}


@pytest.mark.parametrize("name", sorted(sim.SCHEDULES))
@settings(max_examples=15, deadline=None)
@given(P=st.integers(1, 5), M=st.integers(1, 10), V=st.integers(1, 4))
def test_the_registry_says_which_v_each_takes_and_where_its_stages_go(name, P, M, V):
    """`takes_virtual` and `placement` of a registry entry (what the planner reads) agree
    with the schedules the generator makes: a V it does not take is refused, and every
    schedule it makes places its P x V stages as `placement` says."""
    gen = sim.SCHEDULES[name]
    reason = gen.refusal(P, M, V)
    if not gen.takes_virtual and V != gen.virtual:
        assert reason is not None and reason.startswith(f"V={V}: ")
        with pytest.raises(ScheduleError, match=f"V={V}: "):
            sim.make_schedule(name, P, M, V)
        return
    assume(reason is None)
    s = sim.make_schedule(name, P, M, V)
    assert s.stages == P * V and s.placement == tuple(gen.placement(P, V))
