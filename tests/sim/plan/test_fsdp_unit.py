"""FSDP's unit (`fsdp_unit`): the layer, gathered one ahead of use on its own stream as FSDP2
and Megatron-FSDP wrap a model, against the whole stage. The closed form of the prefetched
gathers against a small event simulation of the two streams, and of the backward's gathers
and reduce-scatters against one of them sharing a link; the bytes held, the step's bounds,
and the refusal of an unknown unit."""
import pytest
import simpy
from hypothesis import given, settings, strategies as st

import sim
from sim.cost.data_parallel import prefetched, stage_params
from sim.cost.layer import layer_times
from sim.hardware.network import collective_time, links_of
from sim.hardware.profile import profile
from sim.model.registry import find_model as model
from sim.plan.layout import Layout, layout_slice
from sim.plan.stage_costs import stage_costs
from sim.cost.ends import end_times

H100 = profile("h100-80gb")
seconds = st.floats(0.0, 10.0, allow_nan=False)


def _simulated(c: float, a: float, r: float, n: int) -> float:
    """A pass over n units of c seconds of compute, simulated: a gather stream gathers unit i
    (a seconds) once fewer than two units are held, the compute stream computes it once
    gathered, frees it and hands its reduce-scatter (r seconds) to the link, which the gathers
    share, one at a time in the order asked. How long after n c the last reduce-scatter ends
    (r = 0: the gathers alone, on a stream of their own)."""
    env = simpy.Environment()
    link, slots = simpy.Resource(env, capacity=1), simpy.Container(env, capacity=2, init=2)
    ready, ends = [env.event() for _ in range(n)], []

    def gathers():
        for i in range(n):
            yield slots.get(1)
            with link.request() as turn:
                yield turn
                yield env.timeout(a)
            ready[i].succeed()

    def reduce():
        with link.request() as turn:
            yield turn
            yield env.timeout(r)
            ends.append(env.now)

    def computes():
        for i in range(n):
            yield ready[i]
            yield env.timeout(c)
            yield slots.put(1)
            env.process(reduce())

    env.process(gathers())
    env.process(computes())
    env.run()
    return max(ends) - n * c


@settings(max_examples=200, deadline=None)
@given(seconds, seconds, st.integers(1, 40))
def test_the_prefetched_gathers_closed_form_is_the_two_streams_simulated(c, a, n):
    assert prefetched(c, a, n) == pytest.approx(_simulated(c, a, 0.0, n), rel=1e-9, abs=1e-9)


@settings(max_examples=200, deadline=None)
@given(seconds, seconds, seconds, st.integers(1, 30))
def test_the_backward_on_one_link_is_within_one_gather_below_its_closed_form(c, a, r, n):
    simulated, closed = _simulated(c, a, r, n), prefetched(c, a + r, n)
    assert simulated - 1e-9 <= closed <= simulated + a + 1e-9
    assert prefetched(c, r, n) == pytest.approx(_simulated(c, 0.0, r, n), rel=1e-9, abs=1e-9)  # no gathers: exact


PP1 = dict(tp=8, pp=1, dp=4, micro_batch=1, global_batch=8, sequence_parallel=True, recompute="selective", zero=3)


def test_pp1_forward_adds_the_first_layers_gather_with_the_ends_then_what_each_next_one_outlasts():
    m, lay = model("llama3-8b"), Layout(**PP1)
    x = layout_slice(lay)
    lt, ends = layer_times(m, H100, x, "selective"), end_times(m, H100, x)
    layered = stage_costs(m, H100, lay, x, lt, ends, [m.layers], [0])[0]
    plain = stage_costs(m, H100, Layout(**{**PP1, "zero": 1}), x, lt, ends, [m.layers], [0])[0]
    links, dp = links_of(H100), lay.topology().group("dp")
    layer = m.params().per_layer / 8
    ends_params = stage_params(m, [m.layers], 8, [0])[0] - m.layers * layer
    a = collective_time(links, "all_gather", layer * 2, dp)
    first = collective_time(links, "all_gather", (layer + ends_params) * 2, dp)
    expected = first + (m.layers - 1) * max(0.0, a - lt.forward)
    assert layered.forward[0] - plain.forward[0] == pytest.approx(expected, rel=1e-9)
    assert layered.unshard == (0.0,) and layered.grad_reduce == (0.0,)


def _peak(**kw):
    return max(sim.estimate("llama3-8b", H100, **{**PP1, **kw}).peak_memory)


def test_memory_falls_from_the_stage_to_the_layer_by_the_layers_not_held():
    m = model("llama3-8b")
    layer = m.params().per_layer / 8
    whole = stage_params(m, [m.layers], 8, [0])[0]
    stage, held, kept = _peak(fsdp_unit="stage"), _peak(), _peak(reshard_after_forward=False)
    # the stage holds all its weights and gradients; the layer two layers, the ends and one layer's gradients
    assert stage - held == pytest.approx((m.layers - 2) * layer * 2 + (whole - layer) * 4, rel=1e-9)
    assert kept - held == pytest.approx((m.layers - 2) * layer * 2, rel=1e-9)  # kept from forward to backward


def test_with_pp_the_layer_and_the_stage_are_one_and_not_resharding_holds_the_stage():
    kw = dict(PP1, pp=2, global_batch=16)
    stage = sim.estimate("llama3-8b", H100, fsdp_unit="stage", **kw)
    for layer in (sim.estimate("llama3-8b", H100, **kw),
                  sim.estimate("llama3-8b", H100, reshard_after_forward=False, **kw)):
        assert layer.peak_memory == stage.peak_memory and layer.step_time == stage.step_time


@pytest.mark.parametrize("name, kw", [
    ("llama3-8b", dict(tp=1, dp=32, micro_batch=1, global_batch=64, recompute="full")),
    ("llama3-8b", dict(tp=8, dp=4, micro_batch=2, global_batch=32, sequence_parallel=True)),
    ("llama3-70b", dict(tp=8, dp=32, micro_batch=1, global_batch=256, sequence_parallel=True, recompute="full")),
    ("llama3-70b", dict(tp=4, dp=16, micro_batch=1, global_batch=64, sequence_parallel=True, recompute="full",
                        fsdp_shard=8)),
])
def test_pp1_fsdp_is_never_longer_than_the_stage_unexposed_nor_shorter_than_its_computes(name, kw):
    layer, stage = (sim.estimate(name, H100, pp=1, zero=3, fsdp_unit=u, **kw) for u in ("layer", "stage"))
    zero1 = sim.estimate(name, H100, pp=1, zero=1, **{k: v for k, v in kw.items() if k != "fsdp_shard"})
    assert layer.step_time <= stage.step_time
    assert layer.step_time >= zero1.step_time - zero1.time_parts["grad_reduce"] - 1e-12
    assert layer.time_parts["zero_collectives"] > 0


@pytest.mark.parametrize("unit", ["block", None, "Layer"])
def test_an_unknown_unit_is_refused(unit):
    with pytest.raises(ValueError, match="fsdp_unit must be one of 'layer', 'stage'"):
        sim.estimate("llama3-8b", H100, fsdp_unit=unit, **PP1)
