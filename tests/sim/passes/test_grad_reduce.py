"""REDUCE_GRAD, the data-parallel reduction of a stage's gradients: its text form, the pass
that adds it (`sim.add_grad_reduce`), the checks, lowering, and the engine's timing of it
(closed forms, and random schedules against the reference model of tests/helpers.py)."""
import math

import pytest
from hypothesis import given, settings, strategies as st

import sim
import sim.passes.order
from sim import Action, Costs, Kind, Schedule, ScheduleError

from sim.schedule.textbook import gpipe_on
from helpers import assert_matches_reference

RG = Kind.REDUCE_GRAD


def reductions(result):
    """Stage -> (start, end) of its REDUCE_GRAD."""
    return {e.action.stage: (e.start, e.end) for e in result.events if e.action.kind is RG}


# ---------------------------------------------------------------- text form and checks

def test_text_form_has_no_micro_batch_and_round_trips():
    a = Action.parse("3REDUCE_GRAD")
    assert a == Action(3, RG, 0) and str(a) == "3REDUCE_GRAD"
    for bad in ("3REDUCE_GRAD0", "REDUCE_GRAD", "3REDUCE_GRAD1"):
        with pytest.raises(ScheduleError, match="or <stage><kind> with kind in REDUCE_GRAD"):
            Action.parse(bad)
    s = sim.add_grad_reduce(sim.make_schedule("interleaved-1f1b", 2, 4, 2), overlap=True)
    back = Schedule.from_csv(s.to_csv())
    assert back.programs == s.programs and back.placement == s.placement
    assert "0REDUCE_GRAD" in s.to_csv().split("\n")[0].split(",")


def test_a_reduction_with_a_micro_batch_is_refused():
    progs = [list(sim.make_schedule("1f1b", 1, 2).programs[0]) + [Action(0, RG, 1)]]
    with pytest.raises(ScheduleError, match=r"0REDUCE_GRAD\(micro=1\) at rank 0 step 4: .* write it 0REDUCE_GRAD"):
        Schedule(progs)


def test_a_reduction_before_its_stages_last_backward_is_refused():
    progs = [list(p) for p in sim.make_schedule("1f1b", 2, 3).programs]
    progs[1].insert(len(progs[1]) - 1, Action(1, RG, 0))  # before 1B2
    s = Schedule(progs)
    for check in (sim.validate, sim.simulate, sim.lower, sim.check_deadlock):
        with pytest.raises(ScheduleError, match=r"rank 1 step 5 \(1REDUCE_GRAD\) comes before 1 of the backwards"):
            check(s)


def test_a_reduction_on_another_rank_is_refused():
    progs = [list(p) for p in sim.make_schedule("1f1b", 2, 2).programs]
    progs[0].append(Action(1, RG, 0))
    with pytest.raises(ScheduleError, match=r"1REDUCE_GRAD\): stage 1 lives on rank 1, not 0"):
        sim.validate(Schedule(progs))


def test_add_grad_reduce_refuses_what_it_cannot_take():
    s = sim.make_schedule("1f1b", 2, 2)
    with pytest.raises(ScheduleError, match="compute actions only"):
        sim.add_grad_reduce(sim.lower(s), overlap=True)
    with pytest.raises(ScheduleError, match="compute actions only"):
        sim.add_grad_reduce(sim.add_grad_reduce(s, overlap=True), overlap=True)


# ---------------------------------------------------------------- where the pass puts them

@pytest.mark.parametrize("name,V", [("1f1b", 1), ("gpipe", 1), ("interleaved-1f1b", 2), ("zbv", 2), ("zb-h1", 1)])
def test_one_reduction_per_stage_after_its_last_backward(name, V):
    base = sim.make_schedule(name, 3, 6, V) if V > 1 else sim.make_schedule(name, 3, 6)
    for overlap in (True, False):
        s = sim.add_grad_reduce(base, overlap)
        assert s.compute_only().programs == s.programs  # no transfer: still compute-only
        for r, prog in enumerate(s.programs):
            computes = [a for a in prog if a.kind is not RG]
            assert computes == list(base.programs[r])
            stages = [s_ for s_, rank in enumerate(s.placement) if rank == r]
            assert sorted(a.stage for a in prog if a.kind is RG) == stages
            for st_ in stages:
                i = prog.index(Action(st_, RG, 0))
                last = max(j for j, a in enumerate(prog) if a.stage == st_ and a.kind in (Kind.B, Kind.W))
                if overlap:  # right after it (after the other stages' reductions that end there)
                    assert all(a.kind is RG for a in prog[last + 1:i + 1])
                else:        # after the rank's last compute
                    assert all(a.kind is RG for a in prog[i:])
    if V == 1:  # one stage per rank: the same schedule either way
        assert sim.add_grad_reduce(base, True).programs == sim.add_grad_reduce(base, False).programs


def test_lowering_keeps_each_reduction_after_its_compute_and_send():
    s = sim.add_grad_reduce(sim.make_schedule("interleaved-1f1b", 2, 4, 2), overlap=True)
    low = sim.lower(s)
    assert low.is_lowered and low.has_collectives
    assert low.compute_only().programs == s.programs
    for prog in low.programs:
        for i, a in enumerate(prog):
            if a.kind is RG:
                before = [x for x in prog[:i] if x.kind.is_compute][-1]
                assert before in s.programs[low.rank_of(a.stage)][:s.programs[low.rank_of(a.stage)].index(a)]
                assert all(x.kind is RG or sim.KINDS[x.kind].role is sim.Role.SEND for x in prog[prog.index(before) + 1:i])
    sim.check_deadlock(low)
    assert sim.validate(low) is low
    sim.passes.order.transfer_order(sim.passes.order.order_transfers(low))
    # a lowered schedule runs as the compute-only one it came from
    costs = Costs(grad_reduce=[1.0, 2.0, 3.0, 4.0], latency=0.1)
    a, b = sim.simulate(s, costs), sim.simulate(low, costs)
    assert a.makespan == b.makespan and reductions(a) == reductions(b)


# ---------------------------------------------------------------- closed forms

@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", [(1, 1), (2, 3), (4, 8), (5, 2)])
@pytest.mark.parametrize("F,B,g", [(1.0, 2.0, 0.5), (0.5, 0.75, 7.0), (3.0, 1.0, 0.0)])
def test_closed_forms_one_stage_per_rank(name, p, m, F, B, g):
    """Equal stages, free communication: stage s's last backward ends s*B before the end
    T = (m+p-1)(F+B) of the step without reductions, and its reduction follows at once
    (each rank's stream holds one): it spans [T - sB, T - sB + g]. The step ends with
    stage 0's: T + g. Compute is as without reductions."""
    T = (m + p - 1) * (F + B)
    s = sim.add_grad_reduce(sim.make_schedule(name, p, m), overlap=True)
    r = sim.simulate(s, Costs(forward=F, backward=B, grad_reduce=g))
    assert r.makespan == pytest.approx(T + g, rel=1e-12)
    assert r.compute_end == pytest.approx(T, rel=1e-12)  # the last compute, before the reductions end
    for stage, (lo, hi) in reductions(r).items():
        assert (lo, hi) == pytest.approx((T - stage * B, T - stage * B + g), rel=1e-12)
    assert r.busy() == pytest.approx([m * (F + B)] * p)
    assert r.collective_time() == pytest.approx([g] * p)
    assert r.bubble_fraction == pytest.approx(1 - m * (F + B) / (T + g))
    assert r.steady_step == pytest.approx(T + g)  # rank 0's span now ends with its reduction


def _compute_ends(result):
    return {e.action: (e.start, e.end) for e in result.events if e.is_compute}


@pytest.mark.parametrize("P,M,g", [(2, 4, 5.0), (4, 8, 0.5), (4, 8, 3.0), (3, 6, 12.0)])
def test_interleaved_overlap_against_after_the_whole_backward(P, M, g):
    """Interleaved 1F1B, two chunks per rank, equal stages. Reductions never move a
    compute. Without overlap both of a rank's reductions start at its last compute's end
    L_r, one after the other: the rank ends at L_r + 2g. With overlap, the chunk that
    finishes first (its last backward ends at e_r) starts at e_r, and the other at
    max(L_r, e_r + g): the rank ends at max(L_r, e_r + g) + g, never later and, as
    e_r < L_r, earlier by min(g, L_r - e_r)."""
    base = sim.make_schedule("interleaved-1f1b", P, M, 2)
    costs = Costs(forward=1.0, backward=2.0, grad_reduce=g)
    plain = sim.simulate(base, costs)
    after = sim.simulate(sim.add_grad_reduce(base, overlap=False), costs)
    overlapped = sim.simulate(sim.add_grad_reduce(base, overlap=True), costs)
    assert _compute_ends(after) == _compute_ends(plain) == _compute_ends(overlapped)
    ends = {}
    for e in plain.compute_events():
        if e.action.kind is Kind.B:
            ends[e.action.stage] = max(ends.get(e.action.stage, 0.0), e.end)
    expect_after, expect_overlap = [], []
    for r in range(P):
        L = max(e.end for e in plain.compute_events(r))
        first = min(r, r + P, key=ends.get)  # the chunk whose backward ends first
        e_r = ends[first]
        assert e_r < L
        assert reductions(after)[first][1] <= L + 2 * g + 1e-9
        assert max(reductions(after)[s][1] for s in (r, r + P)) == pytest.approx(L + 2 * g)
        assert reductions(overlapped)[first] == pytest.approx((e_r, e_r + g))
        assert max(reductions(overlapped)[s][1] for s in (r, r + P)) == pytest.approx(max(L, e_r + g) + g)
        expect_after.append(L + 2 * g)
        expect_overlap.append(max(L, e_r + g) + g)
    assert after.makespan == pytest.approx(max(expect_after))
    assert overlapped.makespan == pytest.approx(max(expect_overlap))
    assert overlapped.makespan < after.makespan


# ---------------------------------------------------------------- against the reference model

stage_times = st.floats(0.05, 4.0, allow_nan=False)


@st.composite
def reduced_schedules(draw):
    """A random schedule (textbook ones, interleaved, zero-bubble, or all forwards then all
    backwards on a random placement, split or not) with reductions, and random costs."""
    kind = draw(st.sampled_from(["textbook", "interleaved", "zb", "placed"]))
    m = draw(st.integers(1, 6))
    if kind == "textbook":
        s = sim.make_schedule(draw(st.sampled_from(["naive", "gpipe", "1f1b"])), draw(st.integers(1, 4)), m)
    elif kind == "interleaved":
        p = draw(st.integers(1, 3))
        s = sim.make_schedule("interleaved-1f1b", p, p * draw(st.integers(1, 2)), 2)
    elif kind == "zb":
        p = draw(st.integers(2, 4))
        s = sim.make_schedule(draw(st.sampled_from(["zb-h1", "zb-h2"])), p, 2 * p - 1 + m)
    else:
        ranks = draw(st.integers(1, 3))
        placement = draw(st.lists(st.integers(0, ranks - 1), min_size=ranks, max_size=5))
        placement = list(range(ranks)) + placement[ranks:]  # every rank hosts a stage
        s = gpipe_on(placement, m, split=draw(st.booleans()))
    n = s.stages
    costs = Costs(
        forward=draw(st.lists(stage_times, min_size=n, max_size=n)),
        backward=draw(st.lists(stage_times, min_size=n, max_size=n)),
        latency=draw(st.sampled_from([0.0, 0.01, 0.3, 2.0])),
        send_overhead=draw(st.sampled_from([0.0, 0.02, 0.5])),
        recv_overhead=draw(st.sampled_from([0.0, 0.03, 0.4])),
        arrive_overhead=draw(st.sampled_from([0.0, 0.04])),
        io_tick=draw(st.sampled_from([0.0, 0.05, 0.7, math.inf])),
        before_compute=draw(st.sampled_from([0.0, 0.01])),
        after_compute=draw(st.sampled_from([0.0, 0.02, 0.3])),
        grad_reduce=draw(st.lists(st.floats(0.0, 10.0), min_size=n, max_size=n)),
    )
    return s, draw(st.booleans()), costs


@settings(max_examples=120, deadline=None)
@given(reduced_schedules())
def test_engine_matches_the_reference_model_with_reductions(case):
    base, overlap, costs = case
    s = sim.add_grad_reduce(base, overlap)
    r = assert_matches_reference(s, costs)
    plain = sim.simulate(base, costs)
    # the reductions hold no device: every compute runs as without them
    assert _compute_ends(r) == _compute_ends(plain)
    assert r.busy() == pytest.approx(plain.busy())
    assert r.makespan >= plain.makespan - 1e-9
    # each stage's reduction runs once, for its cost, after its stage's backwards
    c = costs.for_stages(s.stages)
    red = reductions(r)
    assert sorted(red) == list(range(s.stages))
    for stage, (lo, hi) in red.items():
        assert hi - lo == pytest.approx(c.grad_reduce[stage])
        assert all(lo >= e.end - 1e-9 for e in r.events if e.is_compute and e.action.stage == stage
                   and e.action.kind in (Kind.B, Kind.W))
    # one at a time on each rank's stream
    for rank in range(s.ranks):
        spans = sorted(v for k, v in red.items() if s.placement[k] == rank)
        assert all(a[1] <= b[0] + 1e-9 for a, b in zip(spans, spans[1:]))
    assert sum(r.collective_time()) == pytest.approx(sum(c.grad_reduce))
    # the event record gives what the engine tallied
    again = sim.Result(r.schedule, r.events, r.memory, r.activations)
    assert again.makespan == pytest.approx(r.makespan) and again.busy() == pytest.approx(r.busy())
