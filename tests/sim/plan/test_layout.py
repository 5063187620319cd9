"""sim.plan.layout's record: `sim.estimate` builds one `Layout` from its keywords, every keyword a
field and every field a keyword, with the field's default; anything else is refused by name."""
import dataclasses

import pytest
from hypothesis import given, settings, strategies as st

import sim
from sim.plan.layout import Layout

FIELDS = [f.name for f in dataclasses.fields(Layout)]


def test_every_field_is_a_keyword_of_estimate_with_its_default():
    """Each field given to `sim.estimate` as its default leaves the estimate's layout the default one."""
    plain = sim.estimate("megatron-1.7b", "a100-80gb")
    for name in FIELDS:
        default = getattr(Layout(), name)
        e = sim.estimate("megatron-1.7b", "a100-80gb", **{name: default})
        assert e.layout == plain.layout == Layout() and e.step_time == plain.step_time, name


@given(st.sampled_from([1, 2, 4]), st.sampled_from([1, 2, 4]), st.sampled_from([1, 2]), st.sampled_from([1, 2]),
       st.sampled_from(["1f1b", "interleaved-1f1b", "Interleaved_1F1B", "gpipe"]), st.sampled_from([True, False]))
@settings(max_examples=20, deadline=None)
def test_estimate_keeps_the_layout_it_was_given(tp, pp, dp, micro_batch, schedule, sp):
    """The estimate's layout is the record of its keywords: the schedule's name canonical, the
    global batch one micro-batch a replica where not given."""
    keywords = dict(tp=tp, pp=pp, dp=dp, micro_batch=micro_batch, schedule=schedule, sequence_parallel=sp and tp > 1)
    if "nterleaved" in schedule and pp == 1:
        schedule = keywords["schedule"] = "1f1b"
    e = sim.estimate("megatron-1.7b", "a100-80gb", **keywords)
    assert e.layout == Layout(**keywords) and e.layout.schedule == sim.schedule.registry.lookup(schedule)[0]
    assert e.layout.global_batch == dp * micro_batch and e.layout.gpus == tp * pp * dp
    assert sim.estimate("megatron-1.7b", "a100-80gb", **e.layout.keywords()).step_time == e.step_time


def test_an_unknown_keyword_is_a_type_error_naming_it():
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'tpp': not a field of sim.Layout \(.*tp, pp"):
        sim.estimate("megatron-1.7b", "a100-80gb", tpp=2)
    # a schedule's own options pass to it; another schedule's are refused by name
    with pytest.raises(TypeError, match=r"'max_runs'.*nor an option of schedule '1f1b'"):
        sim.estimate("megatron-1.7b", "a100-80gb", max_runs=2)


def test_positional_layout_arguments_are_refused():
    """The layout is keywords only: `sim.estimate(model, gpu, tp, pp)` would guess an order."""
    with pytest.raises(TypeError):
        sim.estimate("megatron-1.7b", "a100-80gb", 2)
