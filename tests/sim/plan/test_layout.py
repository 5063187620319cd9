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
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'tpp' \(did you mean 'tp'\?\): not a field of "
                                        r"sim.Layout \(.*tp, pp"):
        sim.estimate("megatron-1.7b", "a100-80gb", tpp=2)
    # a schedule's own options pass to it; another schedule's are refused by name
    with pytest.raises(TypeError, match=r"'max_runs' \(an option of zb-auto, not of '1f1b'.*nor an option of "
                                        r"schedule '1f1b' \(max_active\)"):
        sim.estimate("megatron-1.7b", "a100-80gb", max_runs=2)


@pytest.mark.parametrize("keyword", ["seq", "layers", "vocab"])
def test_a_field_of_the_model_is_refused_as_the_model_s_not_passed_to_the_schedule(keyword):
    """`seq=4096` is the model's: refused as an unknown keyword that says so, never handed to
    the schedule (whose refusal would name only the schedule's options)."""
    with pytest.raises(TypeError) as refused:
        sim.estimate("megatron-1.7b", "a100-80gb", **{keyword: 4096})
    text = str(refused.value)
    assert text.startswith(f"estimate() got an unexpected keyword argument {keyword!r} (a field of the model")
    assert f"dataclasses.replace(sim.MODELS[name], {keyword}=...)" in text and "\n" not in text
    assert "micro_batch" in text and "max_active" in text  # the real keywords, and the schedule's
    # the fix it names works
    model = dataclasses.replace(sim.MODELS["megatron-1.7b"], **{keyword: 4096})
    assert getattr(sim.estimate(model, "a100-80gb", global_batch=1).model, keyword) == 4096


def test_a_schedule_option_reaches_only_the_schedule_that_takes_it():
    e = sim.estimate("megatron-1.7b", "a100-80gb", pp=2, micro_batch=1, global_batch=8, max_active=1)
    assert e.result.schedule.name == "1f1b"
    with pytest.raises(TypeError, match=r"'max_active' \(an option of gpipe, 1f1b, not of 'zb-h1'"):
        sim.estimate("megatron-1.7b", "a100-80gb", pp=2, schedule="zb-h1", global_batch=8, max_active=1)


def test_positional_layout_arguments_are_refused():
    """The layout is keywords only: `sim.estimate(model, gpu, tp, pp)` would guess an order."""
    with pytest.raises(TypeError):
        sim.estimate("megatron-1.7b", "a100-80gb", 2)
