"""The optimizer step's host cost per parameter tensor: the planner counts the tensors exec's GPT holds on each stage (`sim.cost.data_parallel.stage_tensors`), cross-checked against the torch modules exec builds. No timing assertions."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

torch = pytest.importorskip("torch")

from exec.models.spec import ModelSpec  # noqa: E402
from exec.profiler.device_bench import optimizer_tensor_seconds  # noqa: E402
from exec.runtime.optim import OPTIMIZERS  # noqa: E402
from sim.hardware.profile import load_profile, profile, save_profile  # noqa: E402
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


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_the_profiler_measures_each_optimizers_cost_per_tensor_and_the_planner_reads_it(name, tmp_path):
    """Each optimizer exec runs gets a number the planner can take (non-negative and finite;
    its size is the machine's, docs/measurements.md, not a test's), and a profile holding it
    reads back with that optimizer's cost; a bad name is refused."""
    t = optimizer_tensor_seconds(torch.device("cpu"), lambda: None, name, loops=2, tensors=4)
    assert 0 <= t < float("inf")
    data = profile("a100-80gb").to_dict() | {"optimizer_per_tensor": {name: {"value": t, "source": "measured",
                                                                             "command": "test", "machine": "this", "date": "today"}}}
    save_profile(data, tmp_path / "p.json")
    assert load_profile(tmp_path / "p.json").optimizer_per_tensor == {name: t}
    with pytest.raises(ValueError, match="optimizer must be one of"):
        optimizer_tensor_seconds(torch.device("cpu"), lambda: None, "lion", loops=1, tensors=1)
