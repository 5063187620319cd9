"""Micro-batch counts that are not a multiple of the pipeline size in the interleaved schedules
(sim.schedule.groups): torch's rounds by default, Megatron-Core's groups of `group_size`, and
a one-line refusal naming the rule where neither allows the count (docs/schedules.md,
"Micro-batch counts that are not a multiple of P")."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sim
from sim.schedule.groups import check_group_size, group_table
from sim.schedule.interleaved import rounds

EQUAL = sim.Costs(forward=1, backward=2, backward_input=1, backward_weight=1, transport="ideal")
INTERLEAVED = {"interleaved-1f1b": (3, lambda P, r: 2 * (P - 1 - r) + 1),  # bubble in t, held beyond (V-1)N
               "interleaved-zb": (1, lambda P, r: P - r)}


def megatron_refuses(P: int, M: int, N: int) -> bool:
    """Megatron-Core's rules, written out: P <= N <= M, and a last group of 0 or >= P."""
    return not P <= N <= M or 0 < M % N < P


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(sorted(INTERLEAVED)), P=st.integers(1, 6), V=st.integers(2, 4), M=st.integers(1, 24),
       N=st.integers(1, 26))
def test_megatron_groups_run_any_count_they_allow_and_refuse_the_rest(name, P, V, M, N):
    """Where Megatron-Core's rules allow N, the schedule runs M micro-batches, any M, with
    the closed forms of M a multiple of P: makespan 3MVt + (P-1)(F+B) for interleaved 1F1B
    (3(P-1)t) and 3MVt + (P-1)t for interleaved zero bubble, device r holding
    min((V-1)N + 2(P-1-r) + 1, MV) or min((V-1)N + P-r, MV) chunk micro-batches; where
    they do not, a one-line ScheduleError says which rule."""
    if megatron_refuses(P, M, N):
        with pytest.raises(sim.ScheduleError, match=rf"^{name} on {P} devices, {M} micro-batches: group_size={N} "
                                                    r"(is outside \[P, M\]|leaves a last group of)") as e:
            sim.make_schedule(name, P, M, V, group_size=N)
        assert "\n" not in str(e.value) and "Megatron-Core" in str(e.value)
        return
    s = sim.validate(sim.make_schedule(name, P, M, V, group_size=N))
    forwards = [(a.micro, a.stage // P) for a in s.programs[P - 1] if a.kind is sim.Kind.F]
    assert forwards == group_table(M, V, N)  # Megatron-Core's get_schedule_table
    r = sim.simulate(s, EQUAL)
    bubble, held = INTERLEAVED[name]
    assert r.makespan == 3 * M * V + bubble * (P - 1)
    assert r.peak_activations == [min((V - 1) * N + held(P, d), M * V) for d in range(P)]


@settings(max_examples=30, deadline=None)
@given(name=st.sampled_from(sorted(INTERLEAVED)), P=st.integers(1, 6), V=st.integers(2, 4), M=st.integers(1, 24))
def test_torchs_rounds_are_megatrons_groups_of_a_round(name, P, V, M):
    """Without group_size, torch's rounds: the same schedule as groups of M / max(1, M // P)."""
    reason = sim.SCHEDULES[name].refusal(P, M, V)
    n, g = rounds(P, M)
    assert (reason is None) == (M % n == 0)
    if reason is None:
        assert sim.make_schedule(name, P, M, V).programs == sim.SCHEDULES[name].make(P, M, V, group_size=g).programs


def test_a_count_torch_refuses_runs_with_a_group_megatron_allows():
    """M = 7 on 3 devices: torch's 2 rounds do not divide it; Megatron-Core takes N = 4
    (groups of 4 and 3) or N = 7 (one group), and refuses N = 5 (a last group of 2 < P)."""
    with pytest.raises(sim.ScheduleError, match="not a multiple of max"):
        sim.make_schedule("interleaved-1f1b", 3, 7)
    assert check_group_size(3, 7, 4) is None and check_group_size(3, 7, 7) is None
    assert "last group of M % N = 1" in check_group_size(3, 7, 3)
    sim.validate(sim.make_schedule("interleaved-1f1b", 3, 7, group_size=4))
    with pytest.raises(sim.ScheduleError, match=r"group_size=5 leaves a last group of M % N = 2 micro-batches, "
                                                r"fewer than P=3"):
        sim.make_schedule("interleaved-1f1b", 3, 7, group_size=5)


@pytest.mark.parametrize("name", sorted(INTERLEAVED))
def test_group_size_needs_chunks_and_a_positive_integer(name):
    with pytest.raises(sim.ScheduleError, match="group_size groups the chunks of V > 1; with V=1 there are none"):
        sim.make_schedule(name, 2, 4, 1, group_size=2)
    with pytest.raises(sim.ScheduleError, match=r"group_size must be a positive integer .* got 2\.5"):
        sim.make_schedule(name, 2, 4, 2, group_size=2.5)
