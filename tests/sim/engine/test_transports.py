"""Transports as models (sim.engine.transports): the ideal transport against closed forms and the
independent model of the rules, the gloo-cpu rendezvous against the ideal one, the
engine's two ways of running (a device on its own clock, or every step through SimPy)
against each other, and the checks on `Costs.transport`."""
import dataclasses
import math

import pytest
from hypothesis import assume, given, settings, strategies as st

import sim
from sim import Costs

from sim.schedule.textbook import gpipe_on
from helpers import reference_times

stage_times = st.floats(0.05, 4.0, allow_nan=False)


@st.composite
def schedules(draw):
    """A named schedule, or several stages per rank with split backwards."""
    if draw(st.booleans()):
        p, m = draw(st.integers(1, 6)), draw(st.integers(1, 8))
        name = draw(st.sampled_from(sorted(sim.SCHEDULES)))
        assume(sim.SCHEDULES[name].refusal(p, m, sim.SCHEDULES[name].virtual) is None)  # sizes it refuses
        return sim.make_schedule(name, devices=p, micro_batches=m)
    placement = draw(st.sampled_from([[0, 1, 0, 1], [0, 1, 1, 0], [0, 0, 1], [1, 0, 2, 2, 0, 1]]))
    return gpipe_on(placement, draw(st.integers(1, 5)), split=draw(st.booleans()))


def stage_costs(draw, p: int, **fields) -> Costs:
    return Costs(forward=draw(st.lists(stage_times, min_size=p, max_size=p)),
                 backward=draw(st.lists(stage_times, min_size=p, max_size=p)),
                 backward_input=draw(st.lists(stage_times, min_size=p, max_size=p)),
                 backward_weight=draw(st.lists(stage_times, min_size=p, max_size=p)),
                 latency=draw(st.sampled_from([0.0, 0.01, 0.3, 2.0])), **fields)


@pytest.mark.parametrize("p", [1, 2, 3, 5])
@pytest.mark.parametrize("m", [1, 2, 7])
@pytest.mark.parametrize("L", [0.0, 0.25, 3.0])
def test_ideal_naive_closed_form(p, m, L):
    """Naive model parallelism over the ideal transport: each micro-batch crosses the p-1
    links forward and back, L each, whatever L is (no rendezvous: no notice comes late)."""
    F, B = 1.5, 2.25
    r = sim.simulate(sim.make_schedule("naive", p, m), Costs(forward=F, backward=B, latency=L, transport="ideal"))
    assert r.makespan == pytest.approx(m * (p * (F + B) + 2 * (p - 1) * L), rel=1e-12)


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_ideal_transport_matches_independent_rules(data):
    schedule = data.draw(schedules())
    costs = stage_costs(data.draw, schedule.stages, transport="ideal",
                        before_compute=data.draw(st.sampled_from([0.0, 0.1])))
    r = sim.simulate(schedule, costs)
    ref = reference_times(schedule, costs)
    for e in r.events:
        if e.is_compute:
            assert e.end == pytest.approx(ref[e.action], rel=1e-9, abs=1e-9), str(e.action)


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_rendezvous_is_never_faster_than_ideal(data):
    """The ideal transport lets data leave as the SEND is issued; the rendezvous waits for
    the receiver's notice as well. With free links every time is a max of sums of the
    same costs, so no action ends earlier over the ideal transport."""
    schedule = data.draw(schedules())
    costs = stage_costs(data.draw, schedule.stages)
    ideal = sim.simulate(schedule, dataclasses.replace(costs, transport="ideal"))
    rdv = sim.simulate(schedule, costs)
    ends = {e.action: e.end for e in rdv.events if e.is_compute}
    for e in ideal.events:
        if e.is_compute:
            assert e.end <= ends[e.action] + 1e-9
    if costs.latency == 0:  # then the notice is there as the RECV is posted: nothing waits on it
        assert ideal.makespan == pytest.approx(rdv.makespan, rel=1e-12)


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_running_ahead_equals_running_in_step(data):
    """With free links and no device watching, a device runs on its own clock, without
    SimPy (`sim.engine.devices.run_ahead`); with busy links every action goes through
    SimPy in time order. Links so fast that they add nothing must give the same step."""
    schedule = data.draw(schedules())
    transport = data.draw(st.sampled_from(["ideal", "gloo-cpu"]))
    calls = {} if transport == "ideal" else dict(
        send_overhead=data.draw(st.sampled_from([0.0, 0.02])), recv_overhead=data.draw(st.sampled_from([0.0, 0.03])),
        arrive_overhead=data.draw(st.sampled_from([0.0, 0.04])))
    costs = stage_costs(data.draw, schedule.stages, transport=transport, activation_bytes=1.0, **calls)
    ahead = sim.simulate(schedule, costs)
    in_step = sim.simulate(schedule, dataclasses.replace(costs, bandwidth=1e300, activation_bytes_sent=1e-300))
    assert in_step.makespan == pytest.approx(ahead.makespan, rel=1e-9)
    key = lambda r: sorted((e.rank, str(e.action), round(e.start, 9), round(e.end, 9)) for e in r.events)  # noqa: E731
    assert key(in_step) == key(ahead)
    assert in_step.memory == ahead.memory and in_step.activations == ahead.activations


def test_transport_is_checked_at_construction():
    with pytest.raises(ValueError, match="unknown transport 'nccl2'; choose one of ideal, gloo-cpu"):
        Costs(transport="nccl2")
    with pytest.raises(ValueError, match="io_tick is a cost of the gloo-cpu transport, not of 'ideal'"):
        Costs(transport="ideal", io_tick=0.004)
    with pytest.raises(ValueError, match="send_overhead"):
        Costs(transport="ideal", send_overhead=1e-5)
    Costs(transport="ideal", before_compute=1e-5, latency=1e-6, bandwidth=1e9)  # the runtime's own time is not the transport's


def test_io_tick_waits_only_over_gloo():
    """Rule 10 is a property of the gloo-cpu transport: the same late notice costs a tick's
    wait there and nothing over the ideal transport."""
    s = sim.make_schedule("gpipe", 2, 4)
    a, b = 1.0, 2.5
    late = sim.simulate(s, Costs(forward=[a, b], backward=1.0, io_tick=0.7))
    ideal = sim.simulate(s, Costs(forward=[a, b], backward=1.0, transport="ideal"))
    sends = lambda r: {str(e.action): e for e in r.events}["0SEND_F2"]  # noqa: E731
    x, tick = 3 * a - b, 0.7
    assert sends(late).end == pytest.approx(a + b + x - x * x / (2 * tick))
    assert sends(ideal).end == pytest.approx(3 * a)  # it left as it was sent


def test_static_memory_is_weights_gradients_optimizer_and_the_rest():
    w, g, o, rest, act = [4e6, 2e6], [4e6, 2e6], [8e6, 4e6], [1e5, 0.0], 3e5
    r = sim.simulate(sim.make_schedule("1f1b", 2, 4), Costs(weight_bytes=w, grad_bytes=g, optimizer_bytes=o,
                                                          static_bytes=rest, activation_bytes=act))
    assert r.peak_memory == [w[s] + g[s] + o[s] + rest[s] + (2 - s) * act for s in range(2)]
    assert [series[0][1] for series in r.memory] == [w[s] + g[s] + o[s] + rest[s] for s in range(2)]


def test_costs_save_and_load_every_field(tmp_path):
    c = Costs(forward=[1, 2], backward=3, bandwidth=math.inf, weight_bytes=[5, 6], optimizer_bytes=7,
              backward_input=[0.5, 0.25], io_tick=math.inf, transport="gloo-cpu")
    assert Costs.from_dict(c.to_dict()) == Costs(**{**c.__dict__, "forward": (1.0, 2.0), "weight_bytes": (5.0, 6.0),
                                                     "backward_input": (0.5, 0.25)})
    sim.save_costs(c, tmp_path / "c.json", details={"x": math.nan})
    assert sim.load_costs(tmp_path / "c.json").for_stages(2) == c.for_stages(2)
    assert sim.load_costs(tmp_path / "c.json").to_dict() == c.to_dict()
    (tmp_path / "bad.json").write_text("forward: 1")
    with pytest.raises(ValueError, match=r"bad.json is not JSON"):
        sim.load_costs(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="no such file"):
        sim.load_costs(tmp_path / "missing.json")
    with pytest.raises(ValueError, match=r"unknown Costs fields \['speed'\]"):
        Costs.from_dict({"speed": 1})
