"""Overlapped forward-backward pairs (OVERLAP_F_B, docs/rules.md rule 18) as the engine runs them.

A pair is an F and a backward (B or I) of another micro-batch run as one: it starts once
both have their inputs, and takes the two computes with each one's expert all-to-all
hidden under the other's compute (`sim.engine.costs.pair_times`). Checked: the closed
form on one device, the rule on every pair of DualPipe, DualPipeV and Megatron's
overlapped interleaved 1F1B, equality with the unpaired schedule where nothing is hidden
and no pair waits, and the checks and deadlocks of ill-placed marks.
"""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings, strategies as st

import sim
from sim.engine.costs import pair_times
from sim.passes.dependencies import compute_set, waits_for
from sim.schedule.ir import Action, Kind, Schedule, ScheduleError
from sim.schedule.kinds import grad_kind
from helpers import assert_matches_reference

times = st.floats(0.0, 5.0, allow_nan=False)


@settings(max_examples=60, deadline=None)
@given(f=times.filter(lambda x: x > 0), b=times.filter(lambda x: x > 0), af=times, ab=times)
def test_a_pair_hides_the_smaller_of_each_all_to_all_and_the_other_compute(f, b, af, ab):
    """One device, two micro-batches: F0, then F1 paired with B0, then B1. The pair saves
    min(a2a_forward, backward) + min(a2a_backward, forward) on the unpaired step."""
    plain = Schedule([["0F0", "0F1", "0B0", "0B1"]])
    paired = Schedule([["0F0", "0OVERLAP_F_B0", "0F1", "0B0", "0B1"]])
    costs = sim.Costs(forward=f, backward=b, a2a_forward=af, a2a_backward=ab)
    alone = 2 * (f + af) + 2 * (b + ab)
    assert sim.simulate(plain, costs).makespan == pytest.approx(alone)
    assert sim.simulate(paired, costs).makespan == pytest.approx(alone - min(af, b) - min(ab, f))
    assert sum(pair_times(f, af, b, ab)) == pytest.approx(f + b + max(0, af - b) + max(0, ab - f))


@pytest.mark.parametrize("P, M, V", [(2, 4, 2), (4, 8, 2), (4, 16, 2), (4, 8, 3), (8, 16, 2)])
def test_with_nothing_to_hide_overlapped_interleaved_1f1b_takes_as_long(P, M, V):
    """Megatron's overlapped 1F1B at a2a = 0 and free transfers: each steady backward's
    input is in before its pair's F could start, so pairing changes nothing."""
    costs = sim.Costs(forward=1.0, backward=2.0)
    plain = sim.simulate(sim.make_schedule("interleaved-1f1b", P, M, V), costs)
    paired = sim.simulate(sim.make_schedule("interleaved-1f1b", P, M, V, overlap=True), costs)
    assert paired.makespan == pytest.approx(plain.makespan)


@pytest.mark.parametrize("name, P, M", [("dualpipe", 4, 10), ("dualpipev", 3, 8), ("interleaved-1f1b", 4, 8)])
def test_every_pair_waits_for_both_inputs_and_takes_its_pair_time(name, P, M):
    costs = sim.Costs(forward=1.1, backward=2.3, backward_input=1.3, backward_weight=1.0, a2a_forward=0.6,
                      a2a_backward=0.9, latency=0.2)
    result = sim.simulate(sim.make_schedule(name, P, M, overlap=True), costs)
    low, at = result.schedule, {e.action: e for e in result.events}
    computes = compute_set(low)
    pairs = 0
    for prog in low.programs:
        ran = [a for a in prog if a.kind.is_compute]
        for i, mark in enumerate(prog):
            if mark.kind is not Kind.OVERLAP_F_B:
                continue
            f = next(a for a in prog[i:] if a.kind.is_compute)
            b = Action(mark.stage, grad_kind(computes, mark.stage, mark.micro), mark.micro)
            assert ran[ran.index(f) + 1] == b
            inputs = [at[r].end for a in (f, b) for r in waits_for(a, low, computes)]
            inputs += [at[d].end for a in (f, b) for d in sim.dependencies(a, low.chain, computes)
                       if low.rank_of(d.stage) == low.rank_of(f.stage) and d != f]
            before = at[ran[ran.index(f) - 1]].end if ran.index(f) else 0.0
            assert at[f].start == pytest.approx(max([before, *inputs]))
            assert at[b].start == pytest.approx(at[f].end)
            back = costs.backward_input if b.kind is Kind.I else costs.backward
            assert at[b].end - at[f].start == pytest.approx(sum(pair_times(1.1, 0.6, back, 0.9)))
            pairs += 1
    assert pairs > 0


def test_marks_survive_lowering_before_their_f_after_the_backwards_recv():
    s = sim.make_schedule("dualpipe", 4, 8, overlap=True)
    low = sim.lower(s)
    assert low.compute_only().programs == s.programs
    for prog in low.programs:
        for i, a in enumerate(prog):
            if a.kind is Kind.OVERLAP_F_B:
                assert prog[i + 1].kind is Kind.F
                b = next(x for x in prog[i + 1:] if x.kind.is_backward)
                assert (b.stage, b.micro) == (a.stage, a.micro)
                recv = [x for x in prog[:i] if x.kind is Kind.RECV_B and (x.stage, x.micro) == (a.stage, a.micro)]
                last = a.stage % low.chain == low.chain - 1   # its gradient is its own loss's
                assert recv or last or low.rank_of(a.stage + 1) == low.rank_of(a.stage)
    assert sim.compile(low, "nccl").lowered().compute_only().programs == s.programs


@pytest.mark.parametrize("program, why", [
    (["0OVERLAP_F_B0", "0F0", "0B0", "0F1", "0B1"], "pairs 0F0 with a backward of its own micro-batch"),
    (["0F0", "0OVERLAP_F_B0", "0F1", "0B1", "0B0"], "followed by an F and then 0B0"),
    (["0F0", "0F1", "0OVERLAP_F_B0", "0B0", "0B1"], "followed by an F and then 0B0"),
])
def test_a_mark_must_stand_before_an_f_and_its_backward(program, why):
    with pytest.raises(ScheduleError, match=why):
        sim.simulate(Schedule([program]))


def test_a_pair_waits_for_its_backwards_input_before_its_forward():
    """Unpaired, rank 0 runs 0F1 and then waits for 0B0's gradient; paired, 0F1 waits for
    it, but rank 1 makes it only after 1F1, which needs 0F1."""
    other = ["1F1", "1B1", "1F0", "1B0"]
    sim.check_deadlock(Schedule([["0F0", "0F1", "0B0", "0B1"], other]))
    paired = Schedule([["0F0", "0OVERLAP_F_B0", "0F1", "0B0", "0B1"], other])
    with pytest.raises(ScheduleError, match="deadlocks: rank 0 waits at 0OVERLAP_F_B0 for 1SEND_B0 on rank 1"):
        sim.check_deadlock(paired)
    with pytest.raises(ScheduleError, match="deadlocks"):
        sim.simulate(paired)


@pytest.mark.parametrize("name, P, M", [("dualpipe", 4, 10), ("dualpipev", 2, 6), ("interleaved-1f1b", 2, 4)])
@pytest.mark.parametrize("costs", [
    sim.Costs(forward=1.0, backward=2.0, a2a_forward=0.5, a2a_backward=1.5, transport="ideal", latency=0.3),
    sim.Costs(forward=(1.0, 1.3, 0.7, 1.1) * 2, backward=2.0, backward_input=1.2, backward_weight=0.8,
              a2a_forward=0.4, a2a_backward=0.9, latency=0.1, recv_overhead=0.05, send_overhead=0.02,
              arrive_overhead=0.03, before_compute=0.01, after_compute=0.02, io_tick=0.5),
], ids=["ideal", "gloo-cpu"])
def test_the_engine_runs_pairs_as_the_independent_rules_do(name, P, M, costs):
    """`tests/helpers.py`'s model of the rules, without SimPy, agrees on every action."""
    schedule = sim.make_schedule(name, P, M, overlap=True)
    if isinstance(costs.forward, tuple):  # one per stage
        costs = dataclasses.replace(costs, forward=costs.forward[:schedule.stages])
    assert_matches_reference(schedule, costs)
