"""torch.distributed.pipelining's own schedule orders (`exec.torch_pipelining.orders.from_torch`): each one
validates, ours are the same order where we build the same schedule, and where they differ
ours is not worse; torch's 1F1B order is refused with the evidence (docs/schedules.md,
"torch's orders"). Skipped where torch is not installed, except the error saying so."""
from __future__ import annotations

import importlib.util
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sim
from sim import Costs, Schedule, ScheduleError
from helpers import reference_times
from exec.torch_pipelining.orders import from_torch

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")

# torch's name -> ours for the same schedule (InterleavedZeroBubble at V = 1 is ZB-H1: tests/test_zerobubble.py)
OURS = {"GPipe": "gpipe", "1F1B": "1f1b", "Interleaved1F1B": "interleaved-1f1b", "LoopedBFS": "looped-bfs",
        "InterleavedZeroBubble": "interleaved-zb", "ZBVZeroBubble": "zbv", "DualPipeV": "dualpipev"}
VALID = [n for n in OURS if n != "1F1B"]  # torch's 1F1B order is not a schedule: see below
SIZES = [(1, 2), (2, 4), (3, 6), (4, 8), (4, 12)]  # (P, M), M >= 2P as DualPipeV needs
times = st.floats(0.1, 3.0, allow_nan=False)


def ideal(**fields) -> Costs:
    return Costs(transport="ideal", **fields)


@needs_torch
@pytest.mark.parametrize("name", VALID)
@pytest.mark.parametrize("P,M", SIZES)
def test_torch_orders_validate(name, P, M):
    s = from_torch(name, devices=P, micro_batches=M)
    sim.validate(s)
    assert s.micro_batches == M and s.ranks == P and s.stages == P * (1 if name == "GPipe" else 2)
    assert sorted(s.placement) == sorted(list(range(P)) * (s.stages // P))
    r = sim.simulate(s, ideal())
    assert r.busy() == pytest.approx([3.0 * M * s.stages / P] * P)  # every action ran once: F=1, B=I+W=2


@needs_torch
def test_v_shaped_orders_use_torchs_v_placement():
    assert from_torch("zbv", 3, 6).placement == (0, 1, 2, 2, 1, 0)
    assert from_torch("DualPipeV", 2, 4).placement == (0, 1, 1, 0)
    assert from_torch("interleaved-1f1b", 3, 6).placement == (0, 1, 2, 0, 1, 2)


@needs_torch
@pytest.mark.parametrize("P,M", [(2, 2), (2, 4), (4, 8)])
def test_torch_1f1b_order_skips_the_first_forward_of_the_last_rank(P, M):
    """torch 2.13's Schedule1F1B._get_pipeline_order: on the last rank (no warm-up) the
    forward counter is bumped before its first use, so the order runs F1..FM, not F0..F(M-1)
    (its _step_microbatches, which runs the step, is right; the order is what
    get_schedule_ops draws and what its CSV export writes)."""
    from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops

    last = [str(a) for a in get_schedule_ops("1F1B", P, M)[P - 1] if a is not None and str(a)[-1].isdigit()]
    assert [a for a in last if "F" in a] == [f"{P - 1}F{m}" for m in range(1, M + 1)]
    with pytest.raises(ScheduleError, match=rf"^torch's 1F1B order for P={P}, M={M}, V=1 is not a valid schedule: "
                                            rf".*\({P - 1}F{M}\): micro-batch {M} does not exist"):
        from_torch("1f1b", P, M)


@needs_torch
@pytest.mark.parametrize("name", ["GPipe", "LoopedBFS", "Interleaved1F1B", "InterleavedZeroBubble"])
def test_ours_is_torchs_order_where_we_build_the_same_schedule(name):
    """Interleaved 1F1B and interleaved zero bubble for V >= 2, and where M is not a multiple
    of P too (torch's rounds): torch refuses exactly the sizes we refuse."""
    for P in range(1, 5):
        for M in range(1, 11):
            for V in ((1,) if name == "GPipe" else (2, 3)):
                try:
                    theirs = from_torch(name, P, M, V)
                except ScheduleError as e:
                    assert "refuses" in str(e)
                    with pytest.raises(ScheduleError, match="not a multiple of"):
                        sim.make_schedule(OURS[name], P, M, V)
                    continue
                assert sim.make_schedule(OURS[name], P, M, V).programs == theirs.programs, (P, M, V)


@needs_torch
@pytest.mark.parametrize("P,M", [(2, 3), (3, 6), (4, 8), (5, 12)])
def test_torchs_interleaved_with_one_chunk_holds_more_than_1f1b(P, M):
    """With V = 1 torch's Interleaved1F1B keeps the interleaved warm-up 2(P-1-r), where 1F1B
    (ours at V = 1) needs P-1-r: the same step, up to 2P-1 micro-batches held instead of P."""
    theirs = sim.simulate(from_torch("Interleaved1F1B", P, M, 1), ideal())
    ours = sim.simulate(sim.make_schedule("interleaved-1f1b", P, M, 1), ideal())
    assert ours.makespan == theirs.makespan == (M + P - 1) * 3
    assert theirs.peak_activations == [min(2 * (P - 1 - r) + 1, M) for r in range(P)]
    assert ours.peak_activations == [min(P - r, M) for r in range(P)]


@needs_torch
def test_torch_keeps_its_rounds_rule_with_one_chunk_where_we_need_none():
    with pytest.raises(ScheduleError, match="refuses P=3, M=7, V=1"):
        from_torch("Interleaved1F1B", 3, 7, 1)
    assert sim.make_schedule("interleaved-1f1b", 3, 7, 1).programs == sim.make_schedule("1f1b", 3, 7).programs


def shared(names=OURS):
    """The torch names whose schedule we also generate (other parts of the project add
    theirs: a name not in sim.SCHEDULES yet is skipped)."""
    return [n for n in names if n != "1F1B" and OURS[n] in sim.SCHEDULES]


def both(name: str, P: int, M: int) -> tuple[Schedule, Schedule] | None:
    """Ours and torch's at our default V, or None where either refuses the sizes."""
    ours_name = OURS[name]
    V = sim.SCHEDULES[ours_name].virtual
    try:
        return sim.make_schedule(ours_name, P, M, V), from_torch(name, P, M, V)
    except ScheduleError:
        return None


@needs_torch
@pytest.mark.parametrize("name", shared())
@pytest.mark.parametrize("P,M", SIZES)
def test_ours_is_not_worse_than_torchs_with_equal_costs(name, P, M):
    pair = both(name, P, M)
    if pair is None:
        pytest.skip(f"{name} refuses P={P}, M={M}")
    ours, theirs = (sim.simulate(s, ideal(forward=1, backward=2, backward_input=1, backward_weight=1)) for s in pair)
    assert ours.makespan <= theirs.makespan + 1e-9
    assert max(ours.peak_memory) <= max(theirs.peak_memory) + 1e-9


@st.composite
def random_case(draw, names):
    name = draw(st.sampled_from(names))
    P, k = draw(st.integers(1, 4)), draw(st.integers(2, 3))
    S = P * (1 if name in ("GPipe", "1F1B") else 2)
    lists = {f: draw(st.lists(times, min_size=S, max_size=S))
             for f in ("forward", "backward", "backward_input", "backward_weight", "activation_bytes")}
    return name, P, k * P, Costs(**lists, latency=draw(st.sampled_from([0.0, 0.1, 1.0])), transport="ideal")


@needs_torch
@settings(max_examples=40, deadline=None)
@given(random_case(VALID))
def test_the_engine_runs_torchs_orders_as_the_reference_model_does(case):
    name, P, M, costs = case
    s = from_torch(name, P, M)
    r = sim.simulate(s, costs)
    ref = reference_times(s, costs)
    assert r.t0 + r.makespan == pytest.approx(max(ref.values()))


@needs_torch
@settings(max_examples=40, deadline=None)
@given(random_case(["GPipe", "LoopedBFS", "Interleaved1F1B", "InterleavedZeroBubble"]))
def test_ours_is_not_worse_than_torchs_with_random_costs(case):
    """Where we build torch's very order, the same step on any costs; the zero-bubble
    schedules are compared with equal costs above and in docs/schedules.md."""
    name, P, M, costs = case
    pair = both(name, P, M)
    if pair is None:
        return
    ours, theirs = (sim.simulate(s, costs) for s in pair)
    assert ours.makespan <= theirs.makespan * (1 + 1e-9)
    assert max(ours.peak_memory) <= max(theirs.peak_memory) * (1 + 1e-9)


@needs_torch
@pytest.mark.parametrize("call,message", [
    (lambda: from_torch("PipeDream", 2, 4), r"^torch has no schedule 'PipeDream'; choose one of GPipe, 1F1B"),
    (lambda: from_torch("gpipe", 2, 4, 2), r"^torch's GPipe holds one stage per rank \(V=1\), not V=2$"),
    (lambda: from_torch("zbv", 2, 4, 1), r"^torch's ZBVZeroBubble refuses P=2, M=4, V=1: ZBV requires exactly 2"),
    (lambda: from_torch("DualPipeV", 4, 6), r"^torch's DualPipeV refuses P=4, M=6, V=2: DualPipeV requires at"),
    (lambda: from_torch("Interleaved1F1B", 3, 7), r"^torch's Interleaved1F1B refuses P=3, M=7, V=2: Interleaved"),
])
def test_bad_input_gives_a_one_line_schedule_error(call, message):
    with pytest.raises(ScheduleError, match=message) as e:
        call()
    assert "\n" not in str(e.value)


def test_without_torch_from_torch_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.distributed.pipelining", None)  # import fails as if absent
    with pytest.raises(ScheduleError, match=r"^from_torch needs torch.distributed.pipelining"):
        from_torch("GPipe", 2, 4)
