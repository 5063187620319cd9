"""The optimizer step's host cost per parameter tensor: the planner counts the tensors exec's GPT holds on each stage (`sim.cost.data_parallel.stage_tensors`), cross-checked against the torch modules exec builds. No timing assertions."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

torch = pytest.importorskip("torch")

from exec.models.spec import ModelSpec  # noqa: E402
from exec.profiler.device_bench import optimizer_tensor_seconds  # noqa: E402
from sim.cost.data_parallel import stage_tensors  # noqa: E402


@settings(max_examples=15, deadline=None)
@given(layers=st.integers(2, 6), heads=st.integers(1, 3), head_dim=st.sampled_from([4, 8]), seq=st.integers(2, 9),
       vocab=st.integers(3, 40), data=st.data())
def test_the_planner_counts_the_tensors_exec_builds_on_each_stage(layers, heads, head_dim, seq, vocab, data):
    """exec's GPT cut into two stages anywhere: the parameters torch's optimizer steps on each
    (the embedding and the first blocks; the other blocks and the head) are the planner's count."""
    spec = ModelSpec("gpt", layers=layers, hidden=heads * head_dim, heads=heads, seq=seq, vocab=vocab)
    modules = spec.build_layers()  # the embedding, the blocks, the head
    cut = data.draw(st.integers(1, layers - 1))
    stages = [modules[:1 + cut], modules[1 + cut:]]
    counts = [sum(len(list(m.parameters())) for m in stage) for stage in stages]
    assert stage_tensors(spec.transformer(), [cut, layers - cut], [0, 1]) == counts
    one = sum(len(list(m.parameters())) for m in modules)
    assert stage_tensors(spec.transformer(), [layers], [0]) == [one]


def test_the_profiler_measures_a_cost_per_tensor_it_can_use():
    """A number the planner can take (non-negative and finite); its size is the machine's
    (docs/measurements.md), not a test's."""
    t = optimizer_tensor_seconds(torch.device("cpu"), lambda: None, loops=2, tensors=4)
    assert t >= 0 and t < float("inf")
