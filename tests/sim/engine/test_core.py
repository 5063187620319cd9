"""The engine: closed forms, properties over random inputs, and a cross-check against an
independent implementation of the same timing rules (docs/rules.md) without SimPy."""
import json
import math
from dataclasses import replace

import pytest
from hypothesis import given, settings, strategies as st

import sim
from sim.schedule.registry import TEXTBOOK
from sim import Costs, Kind

from helpers import assert_matches_reference


# ---------------------------------------------------------------- closed forms
@pytest.mark.parametrize("p", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("m", [1, 2, 3, 8, 13])
@pytest.mark.parametrize("F,B", [(1.0, 2.0), (0.5, 0.75), (3.0, 1.0)])
def test_closed_forms(p, m, F, B):
    costs = Costs(forward=F, backward=B)
    for name in ("gpipe", "1f1b"):
        r = sim.simulate(sim.make_schedule(name, devices=p, micro_batches=m), costs)
        assert r.makespan == pytest.approx((m + p - 1) * (F + B), rel=1e-12)
        assert r.bubble_fraction == pytest.approx((p - 1) / (m + p - 1), rel=1e-9, abs=1e-12)
    naive = sim.simulate(sim.make_schedule("naive", devices=p, micro_batches=m), costs)
    assert naive.makespan == pytest.approx(m * p * (F + B), rel=1e-12)
    assert naive.bubble_fraction == pytest.approx(1 - 1 / p, abs=1e-12)


@pytest.mark.parametrize("p,m", [(4, 8), (4, 2), (6, 6), (1, 3), (5, 16)])
def test_peak_activations_and_memory(p, m):
    act, static = 3e6, [1e8 * (s + 1) for s in range(p)]
    costs = Costs(activation_bytes=act, static_bytes=static)
    gp = sim.simulate(sim.make_schedule("gpipe", devices=p, micro_batches=m), costs)
    ofob = sim.simulate(sim.make_schedule("1f1b", devices=p, micro_batches=m), costs)
    naive = sim.simulate(sim.make_schedule("naive", devices=p, micro_batches=m), costs)
    assert gp.peak_activations == [m] * p
    assert ofob.peak_activations == [min(p - s, m) for s in range(p)]
    assert naive.peak_activations == [1] * p
    assert ofob.peak_memory == [static[s] + min(p - s, m) * act for s in range(p)]
    assert gp.peak_memory == [static[s] + m * act for s in range(p)]


def test_issue_example_costs():
    costs = Costs(forward=1.0, backward=[2.0, 2.5, 2.0, 3.0], latency=0.1)
    r = sim.simulate(sim.make_schedule("1f1b", devices=4, micro_batches=8), costs)
    # the slowest stage (B=3) is busy 8*(1+3)=32; the step can't be shorter than that
    assert r.makespan >= 32.0
    assert r.peak_activations == [4, 3, 2, 1]


def test_costs_reject_bad_values():
    with pytest.raises(ValueError, match="3 values but the schedule has 4 stages"):
        sim.simulate(sim.make_schedule("gpipe", devices=4, micro_batches=2), Costs(forward=[1, 2, 3]))
    with pytest.raises(ValueError, match="latency"):
        Costs(latency=-1)
    with pytest.raises(ValueError, match="bandwidth"):
        Costs(bandwidth=0)
    with pytest.raises(ValueError, match="forward must be finite"):
        Costs(forward=float("nan")).for_stages(2)


def test_bandwidth_queues_transfers_on_a_link():
    # GPipe, 2 stages, compute nearly free, transfers of 1 s each. Rank 1 posts its first
    # receives at 0; their ready notices reach rank 0 at `lat`, after it issued its sends,
    # so the first leaves at lat; the others queue behind it on link 0->1 one after the
    # other (each notice is there before the link frees), so send k arrives at lat + k + 1 + lat.
    m, lat = 4, 0.5
    costs = Costs(forward=1e-9, backward=1e-9, latency=lat, bandwidth=100.0, activation_bytes_sent=100.0)
    r = sim.simulate(sim.make_schedule("gpipe", devices=2, micro_batches=m), costs)
    sends = sorted((e for e in r.events if e.action.kind is Kind.SEND_F), key=lambda e: e.end)
    assert [e.end for e in sends] == pytest.approx([lat + k + 1 + lat for k in range(m)], abs=1e-6)


def test_chrome_trace(tmp_path):
    r = sim.simulate(sim.make_schedule("1f1b", devices=3, micro_batches=4), Costs(latency=0.1))
    path = tmp_path / "trace.json"
    r.save_chrome_trace(path)
    trace = json.loads(path.read_text())
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(spans) == len(r.events)
    assert {e["name"] for e in spans if e["cat"] == "F"} == {f"{s}F{m}" for s in range(3) for m in range(4)}
    assert not list(tmp_path.glob("*.tmp"))


schedules = st.sampled_from(sorted(TEXTBOOK))  # one stage per device, any size: the costs below are per device
stage_times = st.floats(0.05, 4.0, allow_nan=False)


@st.composite
def configs(draw):
    p = draw(st.integers(1, 6))
    m = draw(st.integers(1, 10))
    costs = Costs(
        forward=draw(st.lists(stage_times, min_size=p, max_size=p)),
        backward=draw(st.lists(stage_times, min_size=p, max_size=p)),
        latency=draw(st.sampled_from([0.0, 0.01, 0.3, 2.0])),
        bandwidth=draw(st.sampled_from([math.inf, 1e3, 50.0])),
        activation_bytes_sent=draw(st.sampled_from([0.0, 10.0, 200.0])),
        activation_bytes=draw(st.lists(st.floats(0, 1e9), min_size=p, max_size=p)),
        static_bytes=draw(st.lists(st.floats(0, 1e10), min_size=p, max_size=p)),
        send_overhead=draw(st.sampled_from([0.0, 0.02, 0.5])),
        recv_overhead=draw(st.sampled_from([0.0, 0.03, 0.4])),
        arrive_overhead=draw(st.sampled_from([0.0, 0.04, 0.3])),
        io_tick=draw(st.sampled_from([0.0, 0.05, 0.7, math.inf])),
        before_compute=draw(st.sampled_from([0.0, 0.01, 0.2])),
        after_compute=draw(st.sampled_from([0.0, 0.02, 0.3])),
        first_compute=draw(st.sampled_from([0.0, 0.05, 0.6])),
        first_compute_tau=draw(st.sampled_from([0.0, 0.3, 2.0])),
    )
    return draw(schedules), p, m, costs


@settings(max_examples=150, deadline=None)
@given(configs())
def test_properties(cfg):
    name, p, m, costs = cfg
    schedule = sim.make_schedule(name, devices=p, micro_batches=m)
    r = sim.simulate(schedule, costs)
    c = costs.for_stages(p)
    # what the engine tallied while running equals what the event records say
    from_events = sim.Result(r.schedule, r.events, r.memory, r.activations)
    assert from_events.makespan == pytest.approx(r.makespan, abs=1e-9)
    assert from_events.busy() == pytest.approx(r.busy(), abs=1e-9)
    assert from_events.compute_end == r.compute_end == max(e.end for e in r.events if e.is_compute)
    # a given lowered schedule simulates exactly as the compute-only one
    again = sim.simulate(r.schedule, costs)
    assert again.makespan == r.makespan and sorted(map(tuple, again.memory)) == sorted(map(tuple, r.memory))
    # every action ran exactly once
    assert sorted(str(e.action) for e in r.events) == sorted(str(a) for prog in r.schedule.programs for a in prog)
    # memory returns to the static level, and never drops below it
    for rank in range(p):
        assert r.memory[rank][-1][1] == pytest.approx(c.static_bytes[rank], abs=1e-3)
        assert min(b for _, b in r.memory[rank]) >= c.static_bytes[rank] - 1e-3
        assert r.activations[rank][-1][1] == 0
    # the step is at least the busiest device's work, and the bubble is a fraction
    work = [m * (c.forward[s] + c.backward[s]) for s in range(p)]
    assert r.busy() == pytest.approx(work)
    assert r.makespan >= max(work) - 1e-9
    assert -1e-12 <= r.bubble_fraction < 1.0  # (busy time sums end - start: rounding)
    # each device runs its compute actions in program order, one at a time
    for rank in range(p):
        evs = sorted(r.compute_events(rank), key=lambda e: e.start)
        assert [e.action for e in evs] == list(schedule.programs[rank])
        assert all(a.end <= b.start + 1e-9 for a, b in zip(evs, evs[1:]))
    # data dependencies: a forward starts after its input arrived, which is after it was made
    ends = {e.action: e.end for e in r.events if e.is_compute}
    starts = {e.action: e.start for e in r.events if e.is_compute}
    for e in r.events:
        if e.action.kind is Kind.SEND_F:
            consumer = sim.Action(e.action.stage + 1, Kind.F, e.action.micro)
            assert e.start >= ends[sim.Action(e.action.stage, Kind.F, e.action.micro)] - 1e-9
            assert e.end >= e.start + c.latency - 1e-9
            assert starts[consumer] >= e.end - 1e-9
    # a link carries one transfer at a time (bandwidth part), in the order the SENDs were issued
    for kind, step in ((Kind.SEND_F, 1), (Kind.SEND_B, -1)):
        for s in range(p):
            xs = sorted((e for e in r.events if e.action.kind is kind and e.action.stage == s), key=lambda e: e.end)
            assert [e.start for e in xs] == sorted(e.start for e in xs)
            busy = [(e.end - c.latency - c.transfer_time(c.activation_bytes_sent[s if step == 1 else s - 1]),
                     e.end - c.latency) for e in xs]
            assert all(a[1] <= b[0] + 1e-9 for a, b in zip(busy, busy[1:]))


@settings(max_examples=150, deadline=None)
@given(configs())
def test_engine_matches_independent_rules(cfg):
    name, p, m, costs = cfg
    costs = Costs(forward=costs.forward, backward=costs.backward, latency=costs.latency,  # free bandwidth
                  send_overhead=costs.send_overhead, recv_overhead=costs.recv_overhead,
                  arrive_overhead=costs.arrive_overhead, io_tick=costs.io_tick,
                  before_compute=costs.before_compute, after_compute=costs.after_compute,
                  first_compute=costs.first_compute, first_compute_tau=costs.first_compute_tau)
    schedule = sim.make_schedule(name, devices=p, micro_batches=m)
    assert_matches_reference(schedule, costs)


@settings(max_examples=60, deadline=None)
@given(configs(), st.floats(0.01, 2.0))
def test_first_compute_delays_the_step_by_at_most_one_each_rank(cfg, extra):
    """Rule 19: a rank's first compute of the step holds it `first_compute` longer. The
    step is a longest path through the ranks' actions, and it passes each rank's first
    compute at most once, so it grows by at most `ranks x first_compute`. The step's last
    compute depends on rank 0's first one (every schedule starts its micro-batch 0 there),
    so without receive work it grows by at least `first_compute`; receive work shares the
    core (rule 9) and a later compute can move it from under a compute into idle time, so
    with `recv_overhead` the step may grow by less (gpipe 2x2, latency 2, recv_overhead 0.4:
    9.65 -> 10.5 for a first compute of 1). With free transfers and equal stage costs
    the path of GPipe and 1F1B runs micro-batch 0's forward through every rank: exactly
    `ranks x first_compute`."""
    name, p, m, costs = cfg
    schedule = sim.make_schedule(name, devices=p, micro_batches=m)
    # a late notice waits for the sender's next transport tick (rule 10): a delay moves which tick,
    # and the step by up to a tick more, so the longest-path bound holds without the tick
    costs = replace(costs, first_compute_tau=0.0, io_tick=0.0)
    base = sim.simulate(schedule, replace(costs, first_compute=0.0)).compute_end
    grown = sim.simulate(schedule, replace(costs, first_compute=extra)).compute_end
    assert grown <= base + schedule.ranks * extra + 1e-9
    quiet = replace(costs, recv_overhead=0.0)
    base = sim.simulate(schedule, replace(quiet, first_compute=0.0)).compute_end
    assert sim.simulate(schedule, replace(quiet, first_compute=extra)).compute_end >= base + extra - 1e-9
    for even in ("gpipe", "1f1b"):
        plain = Costs(forward=1.0, backward=2.0)
        t0 = sim.simulate(sim.make_schedule(even, devices=p, micro_batches=m), plain).compute_end
        t1 = sim.simulate(sim.make_schedule(even, devices=p, micro_batches=m), replace(plain, first_compute=extra))
        assert t1.compute_end == pytest.approx(t0 + p * extra, rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(configs(), st.randoms(use_true_random=False))
def test_durations_replace_the_costs_of_single_actions(cfg, rnd):
    """`durations` gives chosen computes their own time: each such compute lasts exactly
    that long, and giving every compute its stage's cost changes nothing."""
    name, p, m, costs = cfg
    schedule = sim.make_schedule(name, devices=p, micro_batches=m)
    base = sim.simulate(schedule, costs)
    same = sim.simulate(schedule, costs, durations={e.action: e.duration for e in base.events if e.is_compute})
    assert same.makespan == pytest.approx(base.makespan, rel=1e-12)
    chosen = {a: rnd.uniform(0, 3) for prog in schedule.programs for a in prog if rnd.random() < 0.5}
    r = sim.simulate(schedule, costs, durations=chosen)
    for e in r.events:
        if e.action in chosen:
            assert e.duration == pytest.approx(chosen[e.action], abs=1e-9)
    with pytest.raises(ValueError, match="durations must be finite"):
        sim.simulate(schedule, costs, durations={schedule.programs[0][0]: float("nan")})


@settings(max_examples=80, deadline=None)
@given(st.floats(0.1, 2.0), st.floats(0.05, 0.95), st.sampled_from([0.0, 0.01, 0.5, 5.0, math.inf]))
def test_late_notice_waits_for_the_senders_yield_or_tick(a, f, tick_in_a):
    """Rule 10, in closed form. GPipe on 2 stages, m = 4, forward a on stage 0 and b on
    stage 1 with 2a < b < 3a, everything else free. Rank 0 runs F0..F3 back to back and
    issues SEND_F2 at 3a; rank 1 posts RECV_F2 only after its F0, at a + b, after the
    SEND. The notice comes in while rank 0 computes F3, which has no input from another
    rank, so its transport thread runs at its next yield, the SEND of F3 at 4a, or at the
    tick: the data arrives at a + b + E[min(3a - b, U(0, tick))]."""
    b, tick = a * (2 + f), a * tick_in_a
    r = sim.simulate(sim.make_schedule("gpipe", devices=2, micro_batches=4),
                     Costs(forward=[a, b], backward=1.0, io_tick=tick))
    send = {str(e.action): e for e in r.events}["0SEND_F2"]
    assert send.start == pytest.approx(3 * a)
    x = 3 * a - b
    if tick == 0:
        expected = 0.0
    elif tick == math.inf:
        expected = x
    else:  # the mean of min(x, u) over the tick's phase, u uniform on [0, tick]
        expected = x - x * x / (2 * tick) if x < tick else tick / 2
    assert send.end == pytest.approx(a + b + expected, rel=1e-12)


@settings(max_examples=200, deadline=None)
@given(st.floats(0, 10), st.floats(0.01, 10))
def test_expected_wait_is_the_mean_over_the_ticks_phase(x, tick):
    """E[min(x, U(0, tick))] against the midpoint rule over the phase. The rule is exact on
    every cell but the one with the kink at x, where it is off by at most h/2 over a width
    h = tick/n: tick / (2 n^2) on the mean."""
    from sim.engine.transports import expected_wait
    n = 20000
    mean = sum(min(x, (i + 0.5) * tick / n) for i in range(n)) / n
    assert expected_wait(x, tick) == pytest.approx(mean, rel=0, abs=tick / (2 * n * n) + 1e-12)
    assert expected_wait(x, math.inf) == x


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 8), st.floats(0.1, 3), st.floats(0.1, 3), st.floats(0, 1), st.floats(0, 0.2), st.floats(0, 0.2),
       st.floats(0, 0.2), st.floats(0, 0.2), st.floats(0, 0.2))
def test_naive_two_stages_with_call_overheads_closed_form(m, F, B, L, o_send, o_recv, o_arrive, o_before, o_after):
    """Naive on two stages. Each micro-batch crosses the link twice (2L), and each
    crossing is taken in on the critical path (2 o_arrive); the critical path also runs
    through every RECV post of rank 0 (one before each F, for the gradient B will need)
    and those of rank 1 that sit before a B (the next F's RECV: all micro-batches but the
    last), while the data of a SEND leaves as the call starts. All 4m computes are on it,
    each with the runtime's own time before it, and after it but for the last one, which
    ends the step. So the step takes 2m(F + B + L + o_arrive) + (2m - 1) o_recv +
    4m o_before + (4m - 1) o_after, whatever o_send is. One exception: rank 1 posts its
    first receive at 0, and its ready notice reaches rank 0 at L; if that is after rank 0
    issues the first SEND (at o_recv + o_before + F + o_after), the data leaves at L instead."""
    costs = Costs(forward=F, backward=B, latency=L, send_overhead=o_send, recv_overhead=o_recv,
                  arrive_overhead=o_arrive, before_compute=o_before, after_compute=o_after)
    r = sim.simulate(sim.make_schedule("naive", devices=2, micro_batches=m), costs)
    late_notice = max(0.0, L - (o_recv + o_before + F + o_after))
    assert r.makespan == pytest.approx(2 * m * (F + B + L + o_arrive) + (2 * m - 1) * o_recv + 4 * m * o_before
                                       + (4 * m - 1) * o_after + late_notice, rel=1e-12)
    # the calls are not compute: the busy time is still the computes' own
    assert r.busy() == pytest.approx([m * (F + B)] * 2, rel=1e-12)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["gpipe", "1f1b"]), st.integers(2, 4), st.integers(1, 6), st.floats(0.01, 2.0),
       st.floats(0.3, 5.0), st.floats(0.2, 3.0))  # f / tau at most 10: e^(-f / tau) stays above rounding
def test_first_compute_recovers_with_time_constant_tau(name, p, m, most, tau, f):
    """Rule 19 with a recovery time: the core starts the step most / tau below its speed and
    recovers as e^(-t / tau), so a first compute of duration d takes most (1 - e^(-d / tau))
    more. Under GPipe and 1F1B with free transfers and equal stage costs, every rank's first
    compute, a forward of duration f, lies on the step's path: the step grows by exactly
    p x most (1 - e^(-f / tau)), less than p x most, and more the shorter tau."""
    schedule = sim.make_schedule(name, devices=p, micro_batches=m)
    plain = Costs(forward=f, backward=2 * f)
    t0 = sim.simulate(schedule, plain).compute_end
    t1 = sim.simulate(schedule, replace(plain, first_compute=most, first_compute_tau=tau)).compute_end
    assert t1 - t0 == pytest.approx(p * most * (1 - math.exp(-f / tau)), rel=1e-9, abs=1e-12)
    assert t1 - t0 < p * most
    faster = sim.simulate(schedule, replace(plain, first_compute=most, first_compute_tau=tau / 2)).compute_end
    assert faster > t1


def test_notices_that_wait_for_one_yield_leave_together_in_send_order():
    """Rule 10 with no tick (io_tick inf): two notices that come in while their sender
    computes both wait for its next yield, and leave at that one instant; rule 6 then gives
    the link to the SEND issued first. (Found by hypothesis in CI, 2026-11-28: the engine
    worked out the yield's time once per notice, from where the sender then was, and the
    two sums differed in their last bit, so a re-run with the very same durations swapped
    the two transfers.)"""
    costs = Costs(forward=[0.5313521400632476, 1, 1, 1, 1, 1], backward=1.0, latency=2.0, bandwidth=1000.0,
                  activation_bytes_sent=10.0, send_overhead=0.5, recv_overhead=0.4, io_tick=math.inf,
                  before_compute=0.01, transport="gloo-cpu")
    schedule = sim.make_schedule("1f1b", devices=6, micro_batches=3)
    base = sim.simulate(schedule, costs)
    link = sorted((e for e in base.events if e.action.kind is Kind.SEND_F and e.action.stage == 0),
                  key=lambda e: e.action.micro)
    assert link[0].start < link[1].start and link[0].end < link[1].end  # F0's data first, then F1's
    assert link[1].end - link[0].end == pytest.approx(10.0 / 1000.0, rel=1e-9)  # F1 waits for the link
    same = sim.simulate(schedule, costs, durations={e.action: e.duration for e in base.events if e.is_compute})
    assert same.makespan == pytest.approx(base.makespan, rel=1e-12)
