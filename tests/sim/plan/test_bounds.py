"""sim.plan.bounds: the planner's bounds on a configuration's memory and time, read without
searching zb-auto's order or simulating."""
from __future__ import annotations

import pytest

import sim
from sim.plan.layout import Layout
from helpers import counting_calls


def test_planner_bounds_do_not_search_zb_auto():
    """The bounds read zb-auto's shape from the split 1F1B: a configuration of 768
    micro-batches on 64 devices is bounded without searching zb-auto's order or simulating
    (it took minutes)."""
    from sim.plan.bounds import Bounds
    from sim.hardware.gpus import gpu
    from sim.model.registry import find_model as model
    b = Bounds(model("gpt3-175b"), gpu("a100-80gb"))
    c = Layout(tp=8, pp=64, dp=2, schedule="zb-auto", virtual=1, recompute="full", zero=1, sequence_parallel=True,
               global_batch=1536)
    search = sim.SCHEDULES["zb-auto"].make
    with counting_calls(search, sim.simulate) as calls:
        assert b.memory(c) > 0 and b.time(c) > 0
    assert calls[search] == 0 and calls[sim.simulate] == 0
    with counting_calls(search) as calls:  # the count sees the search where it runs
        sim.make_schedule("zb-auto", 2, 2)
    assert calls[search] == 1


# ----------------------------------------------------------------------------- closed forms, not built

from hypothesis import event, given, settings, strategies as st  # noqa: E402

from sim.plan.bounds import HELD_EXACT, Bounds, least_held  # noqa: E402
from sim.plan.layout import check_layout  # noqa: E402
from sim.schedule.liveness import held  # noqa: E402

_CLOSED = [name for name in sim.SCHEDULES if least_held(name, 2, 4, 2) is not None]


def _sizes(draw, names):
    """A schedule of `names`, P, M, V and overlap that its generator takes (`Generator.refusal`)."""
    name = draw(st.sampled_from(names))
    generator = sim.SCHEDULES[name]
    p, m = draw(st.integers(1, 12)), draw(st.integers(1, 64))
    v = draw(st.integers(1, 4)) if generator.takes_virtual else generator.virtual
    overlap = "overlap" in generator.options and draw(st.booleans())
    options = {"overlap": True} if overlap else {}
    return name, p, m, v, options, generator.refusal(p, m, v, **options) is None


@st.composite
def _taken(draw, names=tuple(_CLOSED)):
    name, p, m, v, options, taken = _sizes(draw, list(names))
    return name, p, m, v, options, taken


def test_every_default_schedule_has_a_closed_form_held():
    """What the planner searches by default has a `least_held` (v-min, v-half and zb-auto need not)."""
    assert set(_CLOSED) >= set(sim.SCHEDULES) - {"v-min", "v-half", "zb-auto"}
    assert set(HELD_EXACT) <= set(_CLOSED)


@settings(max_examples=400, deadline=None)
@given(_taken())
def test_least_held_is_at_most_what_the_schedule_holds(case):
    """`least_held` is a lower bound of the built schedule's held chunks on every device, and
    the peak itself for the schedules of `HELD_EXACT`; the generator's placement and copies
    of the model are the schedule's (what the memory bound reads without building it)."""
    name, p, m, v, options, taken = case
    if not taken:
        return
    schedule = sim.make_schedule(name, p, m, v, **options)
    least, most = least_held(name, p, m, v), held(schedule)
    assert len(least) == len(most) and all(a <= b for a, b in zip(least, most)), (least, most)
    if name in HELD_EXACT:
        assert least == most
    generator = sim.SCHEDULES[name]
    assert tuple(generator.placement(p, v)) == schedule.placement and generator.pipelines == schedule.pipelines


def test_least_held_closed_forms_on_known_cases():
    """The textbook counts: 1F1B's device r holds min(P-r, M); GPipe all M; ZB-H2 2(P-r)-1; ZB-V and
    DualPipeV as their authors' tables (2P, 2P+1 chunks); DualPipe P+1."""
    assert least_held("1f1b", 4, 6, 1) == [4, 3, 2, 1] and least_held("1f1b", 4, 2, 1) == [2, 2, 2, 1]
    assert least_held("gpipe", 4, 6, 1) == [6] * 4 and least_held("looped-bfs", 4, 6, 2) == [12] * 4
    assert least_held("zb-h2", 4, 8, 1) == [7, 5, 3, 1]
    assert least_held("zbv", 4, 16, 2) == [8] * 4 and least_held("dualpipev", 4, 8, 2) == [9] * 4
    assert least_held("dualpipe", 8, 16, 2) == [9] * 8
    assert least_held("interleaved-1f1b", 4, 8, 2) == [11, 9, 7, 5]
    assert least_held("v-min", 4, 8, 2) is None


_LAYOUTS = st.builds(lambda name, pp, m, v, recompute, zero: (name, pp, m, v, recompute, zero),
                     st.sampled_from(_CLOSED), st.sampled_from([1, 2, 4]), st.integers(1, 24), st.integers(1, 3),
                     st.sampled_from(["none", "full"]), st.sampled_from([0, 1, 3]))


@settings(max_examples=120, deadline=None)
@given(_LAYOUTS, st.floats(0.2, 1.2))
def test_memory_above_is_the_memory_bound_against_the_limit(case, share):
    """`Bounds.memory_above` answers as `memory(config) > limit` does, with or without the schedule
    built; and the path bound `time` is the same read off the closed-form order as off the schedule."""
    name, pp, m, v, recompute, zero = case
    generator = sim.SCHEDULES[name]
    v = v if generator.takes_virtual else generator.virtual
    if generator.refusal(pp, m, v) is not None or 24 % (pp * v):
        return
    config = Layout(tp=1, pp=pp, dp=2, micro_batch=1, global_batch=2 * m, schedule=name, virtual=v,
                    recompute=recompute, zero=zero)
    fresh, built = Bounds("megatron-1.7b", "a100-40gb"), Bounds("megatron-1.7b", "a100-40gb")
    try:
        check_layout(built.model, built.profile, config)
        built.shape(config)
    except ValueError:  # not a layout the planner would bound
        return
    limit = share * built.memory(config)
    event(f"checked ({'closed form' if fresh.frame(config) else 'built'})")
    assert fresh.memory_above(config, limit) == built.memory_above(config, limit) == (built.memory(config) > limit)
    assert fresh.time(config) == built.time(config)


def test_a_configuration_over_memory_is_dropped_without_building_its_schedule():
    """GPT-3 175B without recompute on 8 stages of 1F1B (and interleaved, ZB-H1) cannot fit an A100: the
    memory bound says so from `least_held`, and neither `time` of one that fits builds a schedule."""
    b = Bounds("gpt3-175b", "a100-80gb")
    over = [Layout(tp=8, pp=8, dp=2, micro_batch=4, global_batch=128, schedule=name, virtual=v, recompute="none")
            for name, v in (("1f1b", 1), ("interleaved-1f1b", 2), ("zb-h1", 1))]
    fits = Layout(tp=8, pp=8, dp=2, micro_batch=1, global_batch=128, schedule="1f1b", virtual=1, recompute="full",
                  zero=1)
    with counting_calls(sim.make_schedule) as calls:
        assert all(b.memory_above(c, 80e9) for c in over)
        assert not b.memory_above(fits, 80e9) and b.time(fits) > 0
    assert calls[sim.make_schedule] == 0


@settings(max_examples=300, deadline=None)
@given(_taken(tuple(sim.SCHEDULES)))
def test_the_order_the_path_bound_reads_is_the_schedules(case):
    """What `Bounds.order` gives `time` without building the schedule (its counts per stage by kind, in
    the order each first comes; the last compute of each device; its pairs) is what the built one says."""
    name, p, m, v, options, taken = case
    if not taken or name == "zb-auto":
        return
    config = Layout(pp=p, micro_batch=1, global_batch=m, schedule=name, virtual=v, overlap=bool(options))
    fresh, built = Bounds("megatron-1.7b", "a100-80gb"), Bounds("megatron-1.7b", "a100-80gb")
    with counting_calls(sim.make_schedule) as calls:
        order = fresh.order(config)
    event("built" if calls[sim.make_schedule] else "closed form")
    shape = built.shape(config)
    assert [list(c.items()) for c in order.counts] == [list(c.items()) for c in shape.counts]
    assert (order.last, order.paired, order.split, order.has_pairs, order.micro_batches) == \
        (shape.last, shape.paired, shape.split, shape.has_pairs, shape.micro_batches)
    assert (order.placement, order.pipelines, order.stages_of) == (shape.placement, shape.pipelines, shape.stages_of)


def test_zbv_and_dualpipe_are_bounded_without_building_their_schedules():
    """ZB-V's and DualPipe's held chunks are exact (`HELD_EXACT`) and DualPipe's order has a closed
    form: a configuration of each that fits is judged and its path bound taken without a schedule
    built, each the same as off the built schedule."""
    fits = [Layout(tp=8, pp=8, dp=2, micro_batch=1, global_batch=128, schedule=name, virtual=2, recompute="full",
                   zero=1, overlap=overlap)
            for name, overlap in (("zbv", False), ("dualpipev", False), ("dualpipev", True), ("dualpipe", False),
                                  ("dualpipe", True))]
    fresh, built = Bounds("gpt3-175b", "a100-80gb"), Bounds("gpt3-175b", "a100-80gb")
    for config in fits:
        built.shape(config)
        limit = built.memory(config)
        with counting_calls(sim.make_schedule) as calls:
            assert not fresh.memory_above(config, limit) and fresh.memory_above(config, limit * (1 - 1e-6))
            assert fresh.time(config) == built.time(config)
        assert calls[sim.make_schedule] == 0, config.schedule


@pytest.mark.parametrize("name", ["dualpipe", "dualpipev"])
def test_dualpipe_closed_order_is_the_schedules_on_a_grid(name):
    """`Bounds.order` of DualPipe and DualPipeV, with and without overlapped pairs, is the built
    schedule's (counts by kind in first-come order, pairs, last computes) on every size of a grid."""
    generator = sim.SCHEDULES[name]
    for p in range(1, 9):
        for m in range(1, 3 * p + 3):
            for overlap in (False, True):
                if generator.refusal(p, m, 2, **({"overlap": True} if overlap else {})) is not None:
                    continue
                config = Layout(pp=p, micro_batch=1, global_batch=m, schedule=name, virtual=2, overlap=overlap)
                order, shape = Bounds("megatron-1.7b", "a100-80gb").order(config), \
                    Bounds("megatron-1.7b", "a100-80gb").shape(config)
                assert [list(c.items()) for c in order.counts] == [list(c.items()) for c in shape.counts]
                assert (order.last, order.paired, order.has_pairs, order.split) == \
                    (shape.last, shape.paired, shape.has_pairs, shape.split)


@pytest.mark.parametrize("model, ep", [("mixtral-8x7b", 8), ("megatron-1.7b", 1)])
def test_dualpipe_over_memory_on_its_state_is_dropped_without_stage_costs(model, ep):
    """DualPipe's copies: a configuration whose weights, gradients and optimizer state alone exceed the
    limit is dropped without its stage costs; the state counted so is at most the estimate's own bytes,
    so `memory_above` still answers as `memory > limit` does, just below and at the bound."""
    from sim.plan.stage_costs import stage_costs
    b = Bounds(model, "h100-80gb")
    checked = 0
    for tp, pp, dp, zero, precision in ((1, 4, 8, 0, "bf16"), (2, 4, 4, 1, "bf16"), (1, 2, 16, 1, "fp8")):
        config = Layout(tp=tp, pp=pp, dp=dp, micro_batch=1, global_batch=dp * 4 * pp, schedule="dualpipe",
                        virtual=2, zero=zero, precision=precision, sequence_parallel=tp > 1, ep=ep)
        try:
            check_layout(b.model, b.profile, config)
        except ValueError:
            continue
        memory = b.memory(config)
        assert b.memory_average(config) <= b.profile.memory  # device by device: the copies' own count
        assert b.memory_above(config, memory * (1 - 1e-12)) and not b.memory_above(config, memory)
        checked += 1
    assert checked >= 2
    over = Layout(tp=1, pp=4, dp=8, micro_batch=1, global_batch=128, schedule="dualpipe", virtual=2, ep=ep)
    with counting_calls(stage_costs) as calls:
        assert Bounds(model, "h100-80gb").memory_above(over, 1e9)  # 1 GB: over on its state alone
    assert calls[stage_costs] == 0
