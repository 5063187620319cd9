"""The zero-bubble schedules (ZB-H1, ZB-H2, ZB-V) and DualPipeV: the closed forms of their
papers, their memory, the engine against the independent rules, and torch's own orders.
docs/schedules.md states each formula and where it comes from."""
import math
import re

import pytest
from hypothesis import given, settings, strategies as st

import sim
from sim import Costs, Kind

from helpers import assert_matches_reference

NEW = ("zb-h1", "zb-h2", "zbv", "dualpipev")
V = {"zb-h1": 1, "zb-h2": 1, "zbv": 2, "dualpipev": 2}
MIN_MICRO = {"zb-h1": lambda p: 1, "zb-h2": lambda p: 2 * p - 1, "zbv": lambda p: 1, "dualpipev": lambda p: 2 * p}


def equal(t=1.0, **kw):
    """F = I = W = t (B = I + W), free communication."""
    return Costs(forward=t, backward=2 * t, backward_input=t, backward_weight=t, transport="ideal", **kw)


def spans(r):
    """Per device, the time from its first compute's start to its last compute's end: the
    zero-bubble paper's step time when the optimizer step does not synchronise the pipeline."""
    out = []
    for rank in range(r.ranks):
        evs = r.compute_events(rank)
        out.append(max(e.end for e in evs) - min(e.start for e in evs))
    return out


sizes = st.integers(1, 6).flatmap(lambda p: st.tuples(st.just(p), st.integers(p, 4 * p)))


@settings(max_examples=40, deadline=None)
@given(sizes, st.sampled_from([1.0, 0.5, 3.0]))
def test_zb_h1_closed_form_with_equal_costs(pm, t):
    """Qi et al. 2024, Section 2.1: ZB-H1's bubble is (p-1)(F+I-W) (their B is our I) and the
    first device holds p micro-batches, as in 1F1B; stage s holds p-s."""
    p, m = pm
    r = sim.simulate(sim.make_schedule("zb-h1", p, m), equal(t))
    assert r.makespan == pytest.approx(m * 3 * t + (p - 1) * (t + t - t), abs=1e-9)
    assert spans(r)[0] == pytest.approx(r.makespan, abs=1e-9)
    assert r.peak_activations == [p - s for s in range(p)]


@settings(max_examples=60, deadline=None)
@given(sizes, st.sampled_from([0.5, 1.0, 1.5, 2.0, 3.0]), st.sampled_from([0.5, 1.0, 1.5, 2.0, 3.0]),
       st.floats(0.1, 1.0))
def test_zb_h1_bubble_with_unequal_costs_where_w_is_the_smallest(pm, f, i, share):
    """The same closed form holds whenever W <= min(F, I) (where W is larger, Ws put off
    cannot all hide in the tail)."""
    p, m = pm
    w = share * min(f, i)
    c = Costs(forward=f, backward=i + w, backward_input=i, backward_weight=w, transport="ideal")
    r = sim.simulate(sim.make_schedule("zb-h1", p, m), c)
    assert r.makespan == pytest.approx(m * (f + i + w) + (p - 1) * (f + i - w), rel=1e-9)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 6).flatmap(lambda p: st.tuples(st.just(p), st.integers(2 * p - 1, 5 * p))),
       st.sampled_from([1.0, 0.5, 3.0]))
def test_zb_h2_closed_form_with_equal_costs(pm, t):
    """Qi et al. 2024, Section 2.2: ZB-H2's bubble is (p-1)(F+I-2W), zero with equal costs,
    for up to 2p-1 micro-batches held on the first device. The bubble is the paper's: every
    device computes without a gap from its first action to its last (a parallelogram); the
    step of one iteration alone still has the (p-1)F by which the last device starts late."""
    p, m = pm
    r = sim.simulate(sim.make_schedule("zb-h2", p, m), equal(t))
    assert spans(r) == pytest.approx([m * 3 * t + (p - 1) * (t + t - 2 * t)] * p, abs=1e-9)
    assert r.makespan == pytest.approx(m * 3 * t + (p - 1) * t, abs=1e-9)
    assert r.peak_activations == [2 * p - 1 - 2 * s for s in range(p)]


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 6).flatmap(lambda p: st.tuples(st.just(p), st.integers(2 * p - 1, 5 * p))),
       st.sampled_from([1.0, 0.5, 3.0]))
def test_zbv_closed_form_with_equal_costs(pm, t):
    """ZB-V (Qi et al., "Pipeline Parallelism with Controllable Memory", 2024, Table 1 of
    its Hugging Face summary: V-ZB, bubble rate 0, activation memory p): with F = I = W per
    chunk and M >= 2p-1, every device computes 2M(F+I+W) without a gap, and holds at most
    2p chunks (p micro-batches of its two halves: 1F1B's first device), every device alike."""
    p, m = pm
    r = sim.simulate(sim.make_schedule("zbv", p, m), equal(t))
    assert spans(r) == pytest.approx([2 * m * 3 * t] * p, abs=1e-9)
    assert r.makespan == pytest.approx(2 * m * 3 * t + (p - 1) * t, abs=1e-9)
    assert r.peak_activations == [2 * p] * p


def atomic_pair_makespan(schedule, costs):
    """The DualPipe README's model of DualPipeV: an overlapped F&B pair (an F of one chunk
    followed by the B of the other; not the first F0 B1 of the last device, which DualPipe
    runs apart) starts when the inputs of both are in and ends F + B later. Free
    communication; an independent longest-path walk, not the engine."""
    c = costs.for_stages(schedule.stages)
    cost = {Kind.F: c.forward, Kind.B: c.backward, Kind.I: c.backward_input, Kind.W: c.backward_weight}
    computes = {a for prog in schedule.programs for a in prog}
    groups = []
    for r, prog in enumerate(schedule.programs):
        gs, i, first = [], 0, r == schedule.ranks - 1
        while i < len(prog):
            a, b = prog[i], prog[i + 1] if i + 1 < len(prog) else None
            pair = b is not None and a.kind is Kind.F and b.kind is Kind.B and a.stage != b.stage
            if pair and first:
                pair = first = False
            gs.append(prog[i:i + 2] if pair else prog[i:i + 1])
            i += len(gs[-1])
        groups.append(gs)
    end, clock, pc = {}, [0.0] * schedule.ranks, [0] * schedule.ranks
    while any(pc[r] < len(g) for r, g in enumerate(groups)):
        moved = False
        for r, gs in enumerate(groups):
            while pc[r] < len(gs):
                group = gs[pc[r]]
                deps = [d for a in group for d in sim.dependencies(a, schedule.stages, computes) if d not in group]
                if any(d not in end for d in deps):
                    break
                clock[r] = max([clock[r]] + [end[d] for d in deps]) + sum(cost[a.kind][a.stage] for a in group)
                end.update((a, clock[r]) for a in group)
                pc[r] += 1
                moved = True
        assert moved, "the atomic-pair walk is stuck"
    return max(end.values())


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 6).flatmap(lambda p: st.tuples(st.just(p), st.integers(2 * p, 5 * p))),
       st.sampled_from([1.0, 0.5, 3.0]))
def test_dualpipev_closed_form_with_equal_costs(pm, t):
    """deepseek-ai/DualPipe README, "Pipeline Bubbles and Memory Usage Comparison": DualPipeV
    on PP stages (PP/2 devices) has bubble (PP/2-1)(F&B+B-3W) and PP+1 chunks' activations
    per device, with B the full backward. Here PP = 2p, B = I + W, and F&B = F + B (no
    overlap): bubble (p-1)(F+2I-W), 2(p-1)t with F = I = W = t, where a pair waits for both
    its inputs. Run one after the other, the F of a pair need not wait for the gradient its
    B needs, and the bubble is (p-1)t."""
    p, m = pm
    schedule = sim.make_schedule("dualpipev", p, m)
    readme = 2 * m * 3 * t + (p - 1) * ((t + 2 * t) + 2 * t - 3 * t)
    assert atomic_pair_makespan(schedule, equal(t)) == pytest.approx(readme, abs=1e-9)
    r = sim.simulate(schedule, equal(t))
    assert r.makespan == pytest.approx(max(spans(r)), abs=1e-9)
    assert r.makespan == pytest.approx(2 * m * 3 * t + (p - 1) * t, abs=1e-9)
    assert r.peak_activations == [2 * p + 1] * p
    # with its pairs as OVERLAP_F_B (docs/rules.md rule 18) the engine waits for both inputs too
    paired = sim.simulate(sim.make_schedule("dualpipev", p, m, overlap=True), equal(t))
    assert paired.makespan == pytest.approx(readme, abs=1e-9)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 5), st.integers(0, 6), st.integers(1, 4), st.sampled_from([512, 1024, 2048]),
       st.sampled_from([(1024, 16), (2304, 24), (4096, 32)]))
def test_peak_memory_in_bytes_with_the_papers_per_layer_activations(p, extra, b, s, ha):
    """Qi et al. 2024, Table 1, per transformer layer: F saves sb(34h+5as) bytes, of which W
    still needs 32sbh after I. With L layers cut into p stages (or 2p chunks for the V
    shapes), A the bytes a 1F1B stage holds per micro-batch and A_W what its W needs:
    1F1B holds pA on device 0. ZB-H1: (p-s)A + sA_W on device s, at most pA (Section 2.1);
    ZB-H2: (2p-1-2s)A + 2sA_W, (2p-1)A on device 0 (Section 2.2); ZB-V: pA on every device
    (1F1B's peak); DualPipeV: (2p+1) chunks, (p + 1/2)A on every device (README: PP+1)."""
    h, a = ha
    layers = 4 * p                              # divisible into p stages and 2p chunks
    act, w_act = s * b * (34 * h + 5 * a * s), 32 * s * b * h

    def costs(per):
        return Costs(activation_bytes=per * act, w_activation_bytes=per * w_act, transport="ideal",
                     backward_input=1.0, backward_weight=1.0)

    A, A_W = layers // p * act, layers // p * w_act
    m = 2 * p + extra
    peak = {n: sim.simulate(sim.make_schedule(n, p, m), costs(layers // (p * V.get(n, 1)))).peak_memory
            for n in ("1f1b",) + NEW}
    assert peak["1f1b"][0] == pytest.approx(p * A)
    assert peak["zb-h1"] == pytest.approx([(p - s_) * A + s_ * A_W for s_ in range(p)])
    assert max(peak["zb-h1"]) == pytest.approx(peak["1f1b"][0])
    assert peak["zb-h2"] == pytest.approx([(2 * p - 1 - 2 * s_) * A + 2 * s_ * A_W for s_ in range(p)])
    assert peak["zbv"] == pytest.approx([p * A] * p)
    assert peak["dualpipev"] == pytest.approx([(2 * p + 1) * A / 2] * p)


stage_times = st.floats(0.1, 3.0)


@st.composite
def configs(draw):
    name = draw(st.sampled_from(NEW))
    p = draw(st.integers(1, 4))
    m = draw(st.integers(MIN_MICRO[name](p), MIN_MICRO[name](p) + 4))
    n = p * V[name]
    gloo = draw(st.booleans())   # the call overheads and the I/O tick are the gloo-cpu transport's

    def overhead(values):
        return draw(st.sampled_from(values)) if gloo else 0.0
    costs = Costs(
        forward=draw(st.lists(stage_times, min_size=n, max_size=n)),
        backward=draw(st.lists(stage_times, min_size=n, max_size=n)),
        backward_input=draw(st.lists(stage_times, min_size=n, max_size=n)),
        backward_weight=draw(st.lists(stage_times, min_size=n, max_size=n)),
        latency=draw(st.sampled_from([0.0, 0.01, 0.3, 2.0])),
        send_overhead=overhead([0.0, 0.02]),
        recv_overhead=overhead([0.0, 0.03]),
        arrive_overhead=overhead([0.0, 0.04]),
        io_tick=overhead([0.0, 0.05, math.inf]),
        before_compute=draw(st.sampled_from([0.0, 0.01])),
        after_compute=draw(st.sampled_from([0.0, 0.02])),
        transport="gloo-cpu" if gloo else "ideal",
    )
    return name, p, m, costs


@settings(max_examples=80, deadline=None)
@given(configs())
def test_engine_matches_independent_rules(cfg):
    name, p, m, costs = cfg
    schedule = sim.make_schedule(name, devices=p, micro_batches=m)
    r = assert_matches_reference(schedule, costs)
    for series in r.activations:
        assert series[-1][1] == 0


TORCH_FORM = re.compile(r"\d+[FIWB]\d+")


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(NEW), st.integers(1, 7), st.integers(0, 12))
def test_every_schedule_validates_and_writes_torch_csv(name, p, extra):
    m = MIN_MICRO[name](p) + extra
    schedule = sim.make_schedule(name, p, m)
    sim.validate(schedule)
    assert schedule.stages == p * V[name] and schedule.ranks == p
    csv = schedule.to_csv()
    cells = [c for row in csv.splitlines() for c in row.split(",")]
    assert all(TORCH_FORM.fullmatch(c) for c in cells)
    kinds = {re.sub(r"\d", "", c) for c in cells}
    # the zero-bubble schedules split every backward; DualPipeV splits only those near the end
    assert kinds == ({"F", "B", "I", "W"} if name == "dualpipev" else {"F", "I", "W"})
    again = sim.Schedule.from_csv(csv)  # the V placement is read back from the rows
    assert again.programs == schedule.programs and again.placement == schedule.placement


def test_v_shape_places_stages_r_and_2p_minus_1_minus_r_on_device_r():
    for name in ("zbv", "dualpipev"):
        s = sim.make_schedule(name, 4, 8)
        assert s.placement == (0, 1, 2, 3, 3, 2, 1, 0)
        # stages 3 and 4 meet on device 3: their hand-over is local, no transfer
        comm = {str(a) for prog in sim.lower(s).programs for a in prog if not a.kind.is_compute}
        assert "3SEND_F0" not in comm and "4RECV_F0" not in comm and "4SEND_B0" not in comm
        assert "2SEND_F0" in comm and "4SEND_F0" in comm


@pytest.mark.parametrize("name, p, m, v, message", [
    ("zb-h2", 3, 4, None, "needs at least 5 micro-batches"),
    ("dualpipev", 3, 5, None, "needs at least 6 micro-batches"),
    ("zbv", 2, 4, 1, "V=1: this schedule holds 2 stages per device"),
    ("dualpipev", 2, 4, 3, "V=3"),
    ("zb-h1", 2, 4, 2, "V=2: this schedule holds one stage per device"),
])
def test_sizes_a_schedule_does_not_allow_get_one_line(name, p, m, v, message):
    with pytest.raises(sim.ScheduleError, match=message) as e:
        sim.make_schedule(name, p, m, virtual=v)
    assert "\n" not in str(e.value)


def _torch_order(cls, p, m, **attrs):
    """What torch's schedule class computes for each rank, expanded to our text form (an
    OVERLAP_F_B becomes its F and B), without building stages or a process group."""
    o = cls.__new__(cls)
    o.pp_group_size, o._n_microbatches = p, m
    for k, v in attrs.items():
        setattr(o, k, v)
    rows = []
    for r in range(p):
        ops = [a for a in o._calculate_single_rank_operations(r) if a is not None]
        rows.append([str(x) for a in ops for x in (a.sub_actions or (a,))])
    return rows


@pytest.mark.parametrize("p", [1, 2, 3, 4])
def test_same_order_as_torch(p):
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")

    def ours(name, m):
        return [[str(a) for a in prog] for prog in sim.make_schedule(name, p, m).programs]

    for m in range(1, 3 * p + 3):
        assert ours("zbv", m) == _torch_order(schedules.ScheduleZBVZeroBubble, p, m, num_stages=2 * p)
        if m >= 2 * p:
            assert ours("dualpipev", m) == _torch_order(schedules.ScheduleDualPipeV, p, m, num_stages=2 * p)
        rounds = max(1, m // p)
        if m % rounds == 0:  # torch's InterleavedZeroBubble with one stage per rank is ZB-H1
            assert ours("zb-h1", m) == _torch_order(schedules.ScheduleInterleavedZeroBubble, p, m, n_local_stages=1,
                                                    number_of_rounds=rounds, microbatches_per_round=m // rounds)
