"""The engine: closed forms, properties over random inputs, and a cross-check against an
independent implementation of the same timing rules (docs/rules.md) without SimPy."""
import json
import math

import pytest
from hypothesis import given, settings, strategies as st

import sim
from sim import Costs, Kind
from sim.passes import peer


# ---------------------------------------------------------------- closed forms
@pytest.mark.parametrize("p", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("m", [1, 2, 3, 8, 13])
@pytest.mark.parametrize("F,B", [(1.0, 2.0), (0.5, 0.75), (3.0, 1.0)])
def test_closed_forms(p, m, F, B):
    costs = Costs(forward=F, backward=B)
    for name in ("gpipe", "1f1b"):
        r = sim.simulate(sim.make_schedule(name, stages=p, micro=m), costs)
        assert r.makespan == pytest.approx((m + p - 1) * (F + B), rel=1e-12)
        assert r.bubble_fraction == pytest.approx((p - 1) / (m + p - 1), rel=1e-9, abs=1e-12)
    naive = sim.simulate(sim.make_schedule("naive", stages=p, micro=m), costs)
    assert naive.makespan == pytest.approx(m * p * (F + B), rel=1e-12)
    assert naive.bubble_fraction == pytest.approx(1 - 1 / p, abs=1e-12)


@pytest.mark.parametrize("p,m", [(4, 8), (4, 2), (6, 6), (1, 3), (5, 16)])
def test_peak_activations_and_memory(p, m):
    act, static = 3e6, [1e8 * (s + 1) for s in range(p)]
    costs = Costs(activation_bytes=act, static_bytes=static)
    gp = sim.simulate(sim.make_schedule("gpipe", stages=p, micro=m), costs)
    ofob = sim.simulate(sim.make_schedule("1f1b", stages=p, micro=m), costs)
    naive = sim.simulate(sim.make_schedule("naive", stages=p, micro=m), costs)
    assert gp.peak_activations == [m] * p
    assert ofob.peak_activations == [min(p - s, m) for s in range(p)]
    assert naive.peak_activations == [1] * p
    assert ofob.peak_memory == [static[s] + min(p - s, m) * act for s in range(p)]
    assert gp.peak_memory == [static[s] + m * act for s in range(p)]


def test_issue_example_costs():
    costs = Costs(forward=1.0, backward=[2.0, 2.5, 2.0, 3.0], latency=0.1)
    r = sim.simulate(sim.make_schedule("1f1b", stages=4, micro=8), costs)
    # the slowest stage (B=3) is busy 8*(1+3)=32; the step can't be shorter than that
    assert r.makespan >= 32.0
    assert r.peak_activations == [4, 3, 2, 1]


def test_costs_reject_bad_values():
    with pytest.raises(ValueError, match="3 values but the schedule has 4 stages"):
        sim.simulate(sim.make_schedule("gpipe", stages=4, micro=2), Costs(forward=[1, 2, 3]))
    with pytest.raises(ValueError, match="latency"):
        Costs(latency=-1)
    with pytest.raises(ValueError, match="bandwidth"):
        Costs(bandwidth=0)
    with pytest.raises(ValueError, match="forward must be finite"):
        Costs(forward=float("nan")).for_stages(2)


def test_bandwidth_queues_transfers_on_a_link():
    # GPipe, 2 stages, compute nearly free, transfers of 1 s each: the forwards' sends queue
    # on link 0->1 one behind the other, so the last one arrives at m*1 + latency.
    m, lat = 4, 0.5
    costs = Costs(forward=1e-9, backward=1e-9, latency=lat, bandwidth=100.0, activation_bytes_sent=100.0)
    r = sim.simulate(sim.make_schedule("gpipe", stages=2, micro=m), costs)
    sends = sorted((e for e in r.events if e.action.kind is Kind.SEND_F), key=lambda e: e.end)
    assert [e.end for e in sends] == pytest.approx([k + 1 + lat for k in range(m)], abs=1e-6)


def test_chrome_trace(tmp_path):
    r = sim.simulate(sim.make_schedule("1f1b", stages=3, micro=4), Costs(latency=0.1))
    path = tmp_path / "trace.json"
    r.save_chrome_trace(path)
    trace = json.loads(path.read_text())
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(spans) == len(r.events)
    assert {e["name"] for e in spans if e["cat"] == "F"} == {f"{s}F{m}" for s in range(3) for m in range(4)}
    assert not list(tmp_path.glob("*.tmp"))


# ---------------------------------------------------------------- an independent model
def reference_times(schedule, costs):
    """The rules of docs/rules.md computed directly, without SimPy, for infinite bandwidth:
    walk every rank's lowered program, advancing whichever rank can advance. Returns the
    end of every compute."""
    low = sim.lower(schedule) if not schedule.is_lowered else schedule
    c = costs.for_stages(low.stages)
    dur = {Kind.F: c.forward, Kind.B: c.backward, Kind.I: c.backward_input, Kind.W: c.backward_weight}
    clock = [0.0] * low.ranks           # when each rank is free
    sent, posted, arrived, end = {}, {}, {}, {}
    pc = [0] * low.ranks
    changed = True
    while changed:
        changed = False
        for r, prog in enumerate(low.programs):
            while pc[r] < len(prog):
                a = prog[pc[r]]
                if a.kind in (Kind.SEND_F, Kind.SEND_B):
                    sent[peer(a)] = clock[r]
                    clock[r] += c.send_overhead
                elif a.kind in (Kind.RECV_F, Kind.RECV_B):
                    posted[a] = clock[r]
                    clock[r] += c.recv_overhead
                else:
                    recvs = [x for x in posted if x.stage == a.stage and x.micro == a.micro and x not in arrived
                             and (x.kind is Kind.RECV_F) == (a.kind is Kind.F)]
                    if any(x not in sent for x in recvs):
                        break
                    for x in recvs:
                        arrived[x] = max(sent[x], posted[x]) + c.latency
                    start = max([clock[r]] + [arrived[x] for x in recvs]) + c.arrive_overhead * len(recvs)
                    clock[r] = end[a] = start + dur[a.kind][a.stage]
                pc[r] += 1
                changed = True
    assert all(pc[r] == len(p) for r, p in enumerate(low.programs))
    return end


schedules = st.sampled_from(sorted(sim.SCHEDULES))
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
    )
    return draw(schedules), p, m, costs


@settings(max_examples=150, deadline=None)
@given(configs())
def test_properties(cfg):
    name, p, m, costs = cfg
    schedule = sim.make_schedule(name, stages=p, micro=m)
    r = sim.simulate(schedule, costs)
    c = costs.for_stages(p)
    # what the engine tallied while running equals what the event records say
    from_events = sim.Result(r.schedule, r.events, r.memory, r.activations)
    assert from_events.makespan == pytest.approx(r.makespan, abs=1e-9)
    assert from_events.busy() == pytest.approx(r.busy(), abs=1e-9)
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
    assert 0.0 <= r.bubble_fraction < 1.0
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
    # a link carries one transfer at a time (bandwidth part), FIFO
    for kind, step in ((Kind.SEND_F, 1), (Kind.SEND_B, -1)):
        for s in range(p):
            xs = sorted((e for e in r.events if e.action.kind is kind and e.action.stage == s), key=lambda e: e.end)
            busy = [(e.end - c.latency - c.transfer_time(c.activation_bytes_sent[s if step == 1 else s - 1]),
                     e.end - c.latency) for e in xs]
            assert all(a[1] <= b[0] + 1e-9 for a, b in zip(busy, busy[1:]))


@settings(max_examples=150, deadline=None)
@given(configs())
def test_engine_matches_independent_rules(cfg):
    name, p, m, costs = cfg
    costs = Costs(forward=costs.forward, backward=costs.backward, latency=costs.latency,  # free bandwidth
                  send_overhead=costs.send_overhead, recv_overhead=costs.recv_overhead,
                  arrive_overhead=costs.arrive_overhead)
    schedule = sim.make_schedule(name, stages=p, micro=m)
    r = sim.simulate(schedule, costs)
    ref = reference_times(schedule, costs)
    for e in r.events:
        if e.is_compute:
            assert e.end == pytest.approx(ref[e.action], rel=1e-9, abs=1e-9), str(e.action)
    assert r.makespan == pytest.approx(max(ref.values()))


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 8), st.floats(0.1, 3), st.floats(0.1, 3), st.floats(0, 1), st.floats(0, 0.2), st.floats(0, 0.2),
       st.floats(0, 0.2))
def test_naive_two_stages_with_call_overheads_closed_form(m, F, B, L, o_send, o_recv, o_arrive):
    """Naive on two stages. Each micro-batch crosses the link twice (2L), and each
    crossing is taken in on the critical path (2 o_arrive); the critical path also runs
    through every RECV post of rank 0 (one before each F, for the gradient B will need)
    and those of rank 1 that sit before a B (the next F's RECV: all micro-batches but the
    last), while the data of a SEND leaves as the call starts. So the step takes
    2m(F + B + L + o_arrive) + (2m - 1) o_recv, whatever o_send is."""
    costs = Costs(forward=F, backward=B, latency=L, send_overhead=o_send, recv_overhead=o_recv,
                  arrive_overhead=o_arrive)
    r = sim.simulate(sim.make_schedule("naive", stages=2, micro=m), costs)
    assert r.makespan == pytest.approx(2 * m * (F + B + L + o_arrive) + (2 * m - 1) * o_recv, rel=1e-12)
    # the calls are not compute: the busy time is still the computes' own
    assert r.busy() == pytest.approx([m * (F + B)] * 2, rel=1e-12)
