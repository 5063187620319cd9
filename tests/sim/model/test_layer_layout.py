"""Megatron-Core's layout strings (sim.model.layer_layout): read and written, its rules, each stage
priced from what it holds, and the planner reading and proposing them (docs/schedules.md,
"Flexible layouts")."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sim
from helpers import reference_times
from sim.model.layer_layout import LayoutError, LayerLayout, from_counts, parse_layer_layout
from sim.plan.stage_costs import priced


@pytest.mark.parametrize("text,stages", [
    ("Et|(tt|)*30mL", ["Et"] + ["tt"] * 30 + ["mL"]),
    ("Ettt|(tt|)*29,m|L", ["Ettt"] + ["tt"] * 29 + ["m", "L"]),  # Megatron-Core's own docstring example
    ("E|t*4|(tt|)*2|L", ["E", "tttt", "tt", "tt", "", "L"]),
    ("(Et|)*1tL", ["Et", "tL"]),
    ("E|||tL", ["E", "", "", "tL"]),
])
def test_megatron_strings_read_and_write_back(text, stages):
    layout = parse_layer_layout(text)
    assert list(layout.stages) == stages
    assert parse_layer_layout(str(layout)) == layout
    assert str(parse_layer_layout("Et|(tt|)*30mL")) == "Et|(tt|)*30mL"  # the short form is Megatron's


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(alphabet="tm", max_size=7), min_size=1, max_size=12))
def test_any_layout_round_trips(middle):
    layout = LayerLayout(tuple(["E" + middle[0]] + middle[1:-1] + [middle[-1] + "L"] if len(middle) > 1
                               else ["E" + middle[0] + "L"]))
    assert parse_layer_layout(str(layout)) == layout


@pytest.mark.parametrize("text,message", [
    ("Et|tX", r"stage 1 holds 'X', not a layer; known: E \(embedding\), t"),
    ("E(t|t", r"'\(' at 1 is never closed"),
    ("E)t", r"'\)' at 1 follows no '\(' or symbol"),
    ("E(t)L", r"'\)' at 3 needs a count '\*n' after it, got 'L'"),
    ("E(t|(t)*2)*2L", r"'\(' inside '\(' at 1; Megatron-Core's grammar does not nest them"),
    ("E|t*xL", r"'\*' at 3 needs a count n, got 'x'"),
])
def test_bad_text_is_named_in_one_line(text, message):
    with pytest.raises(LayoutError, match=message) as e:
        parse_layer_layout(text)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("text,args,message", [
    ("tEL", {}, r"the embedding E must be the first symbol, once; found 1"),
    ("Et|tt", {}, r"the loss L must be the last symbol, once; found 0"),
    ("EtL|EL", {}, r"the embedding E must be the first symbol, once; found 2"),
    ("Etm|tL", {}, r"a transformer layer t after an MTP layer m"),
    ("Et|t|tL", {"devices": 2}, r"3 stages do not split over 2 devices"),
    ("Et|tL", {"layers": 3}, r"2 transformer layers t, the model has 3"),
])
def test_megatrons_rules(text, args, message):
    with pytest.raises(LayoutError, match=message):
        parse_layer_layout(text).check(**args)


def test_one_stage_holds_the_embedding_the_layers_and_the_loss():
    assert str(from_counts([4])) == "Et*4L" and str(from_counts([0, 2, 0])) == "E|tt|L"


def test_stages_over_devices_are_chunks():
    layout = parse_layer_layout("E|(tt|)*6L").check(devices=4, layers=12)
    assert layout.virtual(4) == 2 and layout.layers == [0] + [2] * 6 + [0]


@settings(max_examples=25, deadline=None)
@given(counts=st.lists(st.integers(0, 3), min_size=2, max_size=4), M=st.integers(1, 6),
       latency=st.sampled_from([0.0, 0.2]), e=st.floats(0.1, 2.0), loss=st.floats(0.1, 2.0))
def test_embedding_and_loss_as_stages_of_their_own_simulate_as_the_rules_say(counts, M, latency, e, loss):
    """'E|t..|..|L': every stage priced from what it holds (a stage of nothing is free), and
    the engine's step is the independent reference model's."""
    layout = parse_layer_layout("E|" + "|".join("t" * n for n in counts) + "|L").check()
    layer = sim.Costs(forward=1.0, backward=2.0, activation_bytes=3.0, latency=latency, transport="ideal")
    costs = priced(layout, layer, embedding=sim.Costs(forward=e, backward=e, activation_bytes=1.0),
                   loss=sim.Costs(forward=loss, backward=2 * loss, activation_bytes=5.0))
    assert costs.forward == (e, *(1.0 * n for n in counts), loss)
    assert costs.activation_bytes == (1.0, *(3.0 * n for n in counts), 5.0)
    schedule = sim.make_schedule("1f1b", len(layout.stages), M)
    r = sim.simulate(schedule, costs)
    assert r.busy() == pytest.approx([M * (f + b) for f, b in zip(costs.forward, costs.backward)])
    assert r.t0 + r.makespan == pytest.approx(max(reference_times(schedule, costs).values()))


def test_the_planner_reads_a_layout_and_proposes_its_balanced_one():
    kw = dict(tp=1, pp=4, dp=1, micro_batch=1, global_batch=16)
    balanced = sim.estimate("megatron-1.7b", "a100-80gb", partition="balanced", **kw)
    text = balanced.layer_layout
    assert parse_layer_layout(text) == from_counts(balanced.layers_per_stage)
    again = sim.estimate("megatron-1.7b", "a100-80gb", partition=text, **kw)
    assert again.layers_per_stage == balanced.layers_per_stage and again.step_time == balanced.step_time
    with pytest.raises(LayoutError, match=r"5 stages, the schedule has 4 \(P x V\)"):
        sim.estimate("megatron-1.7b", "a100-80gb", partition="Et*5|(t*7|)*2t*5|L", **kw)
    with pytest.raises(LayoutError, match=r"the planner prices the embedding E on the first stage"):
        sim.estimate("megatron-1.7b", "a100-80gb", partition="|Et*8|t*8|t*8L", **kw)


def _gpt():
    from exec.models.spec import ModelSpec

    return ModelSpec("gpt", layers=4, hidden=16, seq=4, vocab=32, heads=2, batch_size=8)


def test_exec_cuts_its_gpt_by_a_layout():
    """'E|tt|tt|L': the embedding alone, two blocks, two blocks, the head and loss alone; the
    stages run one after the other are the whole model."""
    torch = pytest.importorskip("torch")
    from exec.models.cuts import layout_bounds

    spec = _gpt()
    bounds = layout_bounds(spec, "E|tt|tt|L")
    assert bounds == [0, 1, 3, 5, 6]
    x, _ = spec.batch()
    out = x
    for stage in spec.build_stages(4, bounds=bounds):
        out = stage(out)
    assert torch.equal(out, torch.nn.Sequential(*spec.build_layers())(x))
    with pytest.raises(ValueError, match=r"stage 1 holds nothing; every stage needs a layer here"):
        layout_bounds(spec, "E||t*4|L")


@pytest.mark.parametrize("name", ["interleaved-1f1b", "interleaved-zb"])
@pytest.mark.slow
def test_embedding_and_loss_as_stages_of_their_own_train_as_one_process(name):
    """Two gloo ranks, V = 2: the four stages of 'E|tt|tt|L' give one process's gradients."""
    pytest.importorskip("torch")
    from exec.models.cuts import layout_bounds
    from exec.pipeline.runner import run_pipeline

    spec = _gpt()
    run = run_pipeline(spec, name, 2, 4, bounds=layout_bounds(spec, "E|tt|tt|L"), steps=1, warmup=0, timeout=120)
    assert run.grad_match, (run.max_grad_diff, run.worst_param)
