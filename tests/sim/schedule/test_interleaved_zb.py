"""Interleaved zero bubble (sim.schedule.interleaved_zb, torch's ScheduleInterleavedZeroBubble): its
closed form with F = I = W, its memory, and ZB-H1 at one chunk (docs/schedules.md, "Interleaved zero
bubble"; torch's own order is compared action by action in tests/test_from_torch.py)."""
from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import sim
from sim.schedule.interleaved import rounds

EQUAL = sim.Costs(forward=1, backward_input=1, backward_weight=1, backward=2, transport="ideal")


@settings(max_examples=40, deadline=None)
@given(P=st.integers(1, 6), extra=st.integers(0, 12), V=st.integers(2, 4))
def test_closed_form_with_equal_costs(P, extra, V):
    """M >= P (any M whose rounds divide it): makespan 3MVt + (P-1)t, a third of
    interleaved 1F1B's (P-1)(F+B) = 3(P-1)t; device r holds min((V-1)g + P-r, MV) chunk
    micro-batches, g the micro-batches of a round, where interleaved 1F1B holds
    min((V-1)g + 2(P-1-r) + 1, MV)."""
    M = P + extra
    assume(sim.SCHEDULES["interleaved-zb"].refusal(P, M, V) is None)
    _, g = rounds(P, M)
    r = sim.simulate(sim.make_schedule("interleaved-zb", P, M, V), EQUAL)
    assert r.makespan == 3 * M * V + P - 1
    assert r.peak_activations == [min((V - 1) * g + P - d, M * V) for d in range(P)]
    one_f_one_b = sim.simulate(sim.make_schedule("interleaved-1f1b", P, M, V), EQUAL)
    assert one_f_one_b.makespan == 3 * M * V + 3 * (P - 1)
    assert one_f_one_b.peak_activations == [min((V - 1) * g + 2 * (P - 1 - d) + 1, M * V) for d in range(P)]


@given(P=st.integers(1, 6), M=st.integers(1, 20))
def test_with_one_chunk_it_is_zb_h1(P, M):
    ours = sim.make_schedule("interleaved-zb", P, M, 1)
    assert ours.programs == sim.make_schedule("zb-h1", P, M).programs


def test_it_refuses_what_torch_refuses():
    with pytest.raises(sim.ScheduleError, match=r"M=7 is not a multiple of max\(1, M // P\) = 2"):
        sim.make_schedule("interleaved-zb", 3, 7, 2)
