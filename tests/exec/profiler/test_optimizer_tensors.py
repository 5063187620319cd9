"""The optimizer step's host cost per parameter tensor: the planner counts the tensors exec's GPT holds on each stage (`sim.cost.data_parallel.stage_tensors`), cross-checked against the torch modules exec builds. No timing assertions."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

torch = pytest.importorskip("torch")

from exec.models.spec import ModelSpec  # noqa: E402
from exec.profiler.device_bench import in_step_per_tensor, optimizer_tensor_seconds  # noqa: E402
from sim.model.footprint import optimizer_step_bytes  # noqa: E402
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
    its size is the machine's, docs/validation.md, "Rules 19 and 20", not a test's), and a profile holding it
    reads back with that optimizer's cost; a bad name is refused."""
    t = optimizer_tensor_seconds(torch.device("cpu"), lambda: None, name, loops=2, tensors=4)
    assert 0 <= t < float("inf")
    data = profile("a100-80gb").to_dict() | {"optimizer_per_tensor": {name: {"value": t, "source": "measured",
                                                                             "command": "test", "machine": "this", "date": "today"}}}
    save_profile(data, tmp_path / "p.json")
    assert load_profile(tmp_path / "p.json").optimizer_per_tensor == {name: t}
    with pytest.raises(ValueError, match="optimizer must be one of"):
        optimizer_tensor_seconds(torch.device("cpu"), lambda: None, "lion", loops=1, tensors=1)


@settings(max_examples=40, deadline=None)
@given(per=st.floats(1e-6, 1e-4), rate=st.floats(1e8, 1e11),
       stages=st.lists(st.tuples(st.integers(3, 60), st.integers(10, 10**7)), min_size=1, max_size=20))
def test_the_cost_per_tensor_in_a_step_is_what_the_steps_took_beyond_their_bytes(per, rate, stages):
    """Rule 20: steps that took `per` a tensor beyond their memory-bound part (their bytes at
    `rate`) give back `per`, with no residual; and the AdamW step counted on exec's GPT stages
    is the count `stage_tensors` gives (above)."""
    def memory(nbytes):
        return nbytes / rate
    points = [(n, p, per * n + memory(p * optimizer_step_bytes("fp32", "adamw"))) for n, p in stages]
    got, rms = in_step_per_tensor(points, memory)
    assert got == pytest.approx(per, rel=1e-9) and rms < per * 1e-6
    with pytest.raises(ValueError, match="needs points"):
        in_step_per_tensor([], memory)


@pytest.mark.slow
def test_a_step_times_its_optimizer_on_each_rank():
    """run_step reports this rank's optimizer step (between two marks of its clock: inside the
    train step, after the pipeline), and none without an optimizer; step_compute_times hands each
    timed step's on with the rank's parameter tensors and parameters."""
    from exec.launch.processes import launch
    out = launch(_optimizer_steps, 2, timeout=120)
    for rank, (with_opt, without, counts) in enumerate(out):
        assert without is None and all(0 < t for t, _, _ in with_opt) and len(with_opt) == 2
        assert {(n, p) for _, n, p in with_opt} == {counts}


def _optimizer_steps(ctx):
    import sim
    from exec.measure.calibrate import step_compute_times
    from exec.runtime.shapes import infer_shapes
    from exec.runtime.step import run_step
    spec = ModelSpec("gpt", layers=2, hidden=8, heads=2, seq=4, vocab=11, batch_size=4)
    bounds = spec.partition(2)
    times: list = []
    step_compute_times(ctx, spec, bounds, sim.compile(sim.make_schedule("1f1b", 2, 2), "gloo"), 2, 2, optimizer="adamw",
                       optimizer_times=times)
    layers = spec.build_layers()
    stage = {ctx.rank: torch.nn.Sequential(*layers[bounds[ctx.rank]:bounds[ctx.rank + 1]])}
    params = list(stage[ctx.rank].parameters())
    (x, y), = spec.micro_batches(1)
    program = sim.compile(sim.make_schedule("1f1b", 2, 1), "gloo")
    plain = run_step(ctx, program, stage, [x], [y], spec.loss, None)
    return times, plain.optimizer_s, (len(params), sum(p.numel() for p in params))