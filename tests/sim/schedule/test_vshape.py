"""V-Min and V-Half (sim.schedule.vshape): the authors' memory and bubble figures under F = I = W,
their order as the reference code lays it, and how they sit between ZB-V and 1F1B
(docs/schedules.md, "V-Min and V-Half")."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sim

EQUAL = sim.Costs(forward=1, backward_input=1, backward_weight=1, transport="ideal")  # t = 1, one chunk
# the authors' table (Qi et al. 2024b; huggingface.co/spaces/sail/pipeline-parallelism-with-controllable-memory):
# activation memory in micro-batches of a whole device's activations A (a 1F1B stage's), bubble rate
# 1 - m(F+B+W) / longest device time, "~" in the table
MEMORY = {"v-min": lambda p: (p + 4) // 3, "v-half": lambda p: (p + 2) // 2}
RATE = {"v-min": lambda p, m: 2 * p / (3 * m), "v-half": lambda p, m: p / (2 * m)}


def span_bubble(name: str, p: int) -> int:
    """The idle time of the longest device, in t, for M >= P+1 (V-Min) or P+2 (V-Half):
    ours, measured; the authors give only the rate's order (`RATE`)."""
    if name == "v-min":
        return 4 * p - 7 if p % 3 == 0 else 4 * p - 5
    return 1 if p == 2 else (3 * p - 4 if p % 2 else 3 * p - 7)


@pytest.mark.parametrize("name", sorted(MEMORY))
@settings(max_examples=25, deadline=None)
@given(p=st.integers(1, 9), m=st.integers(1, 36))
def test_peak_memory_is_the_authors_figure(name, p, m):
    """(P+4)//3 and (P+2)//2 micro-batches of A on the device that holds the most (fewer
    where there are fewer micro-batches), against 1F1B's P: in bytes, with a chunk's
    activations A/2 held from its F's start to its W's end (`Costs` keeps them all for W)."""
    s = sim.validate(sim.make_schedule(name, p, m))
    half = sim.Costs(forward=1, backward_input=1, backward_weight=1, activation_bytes=0.5, transport="ideal")
    assert max(sim.simulate(s, half).peak_memory) == min(m, MEMORY[name](p))


@pytest.mark.parametrize("name", sorted(MEMORY))
@pytest.mark.parametrize("p", [2, 3, 4, 5, 6, 8])
def test_bubble_is_within_the_authors_rate_and_its_closed_form(name, p):
    """Bubble rate 1 - 6Mt / (longest device time) (`steady_bubble_fraction`) below 2P/3M
    (V-Min) and P/2M (V-Half) for every M; the idle time of the longest device is
    `span_bubble` from M = P+1 (V-Min) or P+2 (V-Half) on."""
    for m in range(1, 4 * p + 1):
        r = sim.simulate(sim.make_schedule(name, p, m), EQUAL)
        assert r.steady_bubble_fraction <= RATE[name](p, m)
        if m >= p + (2 if name == "v-half" else 1):
            assert r.steady_step == 6 * m + span_bubble(name, p), m
            assert r.makespan == r.steady_step  # the longest device is the one that starts first


@pytest.mark.parametrize("p", [2, 3, 4, 6, 8])
def test_between_zbv_and_1f1b_on_the_same_model(p):
    """A model of 2P chunks (t each way) or P stages (2t): memory V-Min <= V-Half <= ZB-V =
    1F1B's first device, idle time ZB-V <= V-Half <= V-Min <= 1F1B's (P-1)(F+B+W)."""
    m = 3 * p
    chunk = sim.Costs(forward=1, backward_input=1, backward_weight=1, activation_bytes=0.5, transport="ideal")
    runs = {n: sim.simulate(sim.make_schedule(n, p, m), chunk) for n in ("v-min", "v-half", "zbv")}
    runs["1f1b"] = sim.simulate(sim.make_schedule("1f1b", p, m),
                                sim.Costs(forward=2, backward=4, activation_bytes=1, transport="ideal"))
    peak = {n: max(r.peak_memory) for n, r in runs.items()}
    idle = {n: r.steady_step - 6 * m for n, r in runs.items()}
    assert peak["v-min"] <= peak["v-half"] <= peak["zbv"] == peak["1f1b"] == p
    assert idle["zbv"] <= idle["v-half"] <= idle["v-min"] <= idle["1f1b"] == 6 * (p - 1)


# the reference's order (zbv_greedy.py of sail-sg/zero-bubble-pipeline-parallelism, run with
# F = B = W = 1: its stage_order), kept as data; ours equals it for P <= 8, M <= 3P+2
REFERENCE = {
    "v-min": """\
0F0,0F1,0F2,5F0,5I0,5W0,5F1,0I0,5I1,5W1,0W0,5F2,0F3,0I1,5I2,5W2,0W1,5F3,5I3,0I2,5W3,0W2,0I3,0W3
1F0,1F1,4F0,4F1,4I0,4W0,1I0,1F2,1W0,4I1,4F2,4W1,1I1,1F3,1W1,4I2,4F3,4W2,1I2,4I3,4W3,1W2,1I3,1W3
2F0,3F0,2F1,3F1,3I0,2I0,3W0,2W0,2F2,3F2,3I1,2I1,3W1,2W1,2F3,3F3,3I2,2I2,3W2,2W2,3I3,2I3,3W3,2W3
""",
    "v-half": """\
0F0,0F1,0F2,5F0,5I0,5W0,5F1,5I1,5W1,0I0,0W0,0F3,5F2,5I2,5W2,0I1,0W1,5F3,5I3,0I2,5W3,0W2,0I3,0W3
1F0,1F1,4F0,4F1,4I0,4W0,1F2,1I0,4I1,4W1,4F2,1W0,1F3,1I1,4I2,4W2,4F3,1W1,1I2,4I3,4W3,1W2,1I3,1W3
2F0,3F0,2F1,3F1,3I0,3W0,2I0,2W0,2F2,3F2,3I1,2I1,3W1,2F3,2W1,3F3,3I2,2I2,3W2,2W2,3I3,2I3,3W3,2W3
""",
}


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_order_is_the_reference_codes(name):
    assert sim.make_schedule(name, 3, 4).to_csv() == REFERENCE[name]


def test_they_take_two_chunks_a_device_on_the_v():
    for name in MEMORY:
        assert sim.SCHEDULES[name].virtual == 2 and not sim.SCHEDULES[name].takes_virtual
        assert sim.make_schedule(name, 3, 6).placement == (0, 1, 2, 2, 1, 0)
        with pytest.raises(sim.ScheduleError, match=r"V=3: this schedule holds 2 stages per device"):
            sim.make_schedule(name, 3, 6, 3)
