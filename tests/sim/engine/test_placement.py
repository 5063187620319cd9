"""Several stages per device and split backwards (I/W): the IR and engine support them even
though the built-in generators place one stage per device and use full backwards."""
import pytest
from hypothesis import given, settings, strategies as st

import sim
from sim import Costs

from sim.schedule.textbook import gpipe_on
from helpers import reference_times


def test_v_shape_has_no_transfer_between_stages_on_one_device():
    s = gpipe_on([0, 1, 1, 0], micro_batches=3)
    low = sim.lower(s)
    comm = {str(a) for p in low.programs for a in p if not a.kind.is_compute}
    assert "1SEND_F0" not in comm and "2RECV_F0" not in comm  # stages 1 and 2 share rank 1
    assert {"0SEND_F0", "2SEND_F0", "3SEND_B0", "2RECV_B0"} <= comm
    r = sim.simulate(s)
    assert r.ranks == 2 and r.busy() == pytest.approx([2 * 3 * 3.0, 2 * 3 * 3.0])
    assert r.peak_activations == [6, 6]  # two stages x three micro-batches each


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([[0, 1, 0, 1], [0, 1, 1, 0], [0, 0, 1], [1, 0, 2, 2, 0, 1]]),
       st.integers(1, 5), st.booleans(), st.floats(0, 1.0))
def test_multi_stage_placement_matches_independent_rules(placement, micro, split, latency):
    s = gpipe_on(placement, micro, split)
    S = len(placement)
    costs = Costs(forward=[1.0 + 0.1 * i for i in range(S)], backward=2.0, latency=latency,
                  backward_input=[1.2] * S, backward_weight=[0.7] * S)
    r = sim.simulate(s, costs)
    ref = reference_times(s, costs)
    for e in r.events:
        if e.is_compute:
            assert e.end == pytest.approx(ref[e.action], abs=1e-9)
    for series in r.activations:
        assert series[-1][1] == 0


def test_split_backward_frees_activations_at_i_but_what_w_needs_at_w():
    s = gpipe_on([0, 1], micro_batches=2, split=True)
    r = sim.simulate(s, Costs(backward_input=1.0, backward_weight=0.5, activation_bytes=10, w_activation_bytes=4))
    ends = {str(e.action): e.end for e in r.events if e.is_compute}

    def at(series, t):  # the level just after time t
        return [v for when, v in series if when <= t][-1]
    # rank 1 runs 1F0 1F1 1I0 1I1 1W0 1W1: a micro-batch counts as held until its I ends,
    # and W's part (4 of the 10 bytes) stays until its W ends
    assert at(r.activations[1], ends["1I0"]) == 1 and at(r.activations[1], ends["1I1"]) == 0
    assert [at(r.memory[1], ends[a]) for a in ("1F1", "1I0", "1I1", "1W0", "1W1")] == [20, 14, 8, 4, 0]
    assert r.peak_memory[1] == 20 and max(n for _, n in r.activations[1]) == 2
    assert r.busy() == pytest.approx([2 * (1 + 1 + 0.5)] * 2)
    # by default W needs all of it: nothing is given back before W
    r = sim.simulate(s, Costs(backward_input=1.0, backward_weight=0.5, activation_bytes=10))
    assert at(r.memory[1], ends["1I1"]) == 20
