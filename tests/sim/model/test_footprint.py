"""The optimizer as an input of the planner: its state in memory and its step in time, per name of `sim.model.footprint.OPTIMIZERS` (exec.run --optimizer's)."""
from __future__ import annotations

import dataclasses

import pytest

import sim
from sim.cost.data_parallel import stage_tensors
from sim.model.footprint import OPTIMIZERS, optimizer_step_bytes, state_bytes_per_param

BUFFERS = {"sgd": 0, "sgd-momentum": 1, "adam": 2, "adamw": 2}  # torch.optim's fp32 state per parameter


@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
def test_state_is_the_master_weight_and_the_buffers(optimizer):
    """fp32 keeps no master copy: 4 bytes a buffer; mixed precision adds the fp32 master weight.
    The step reads the gradient, the master weight and the buffers and writes the last two
    (and the 16-bit weight): SGD in fp32 12 bytes, AdamW 28 (ZeRO, Sec. 3.1: K = 12 in 16 bits)."""
    n = BUFFERS[optimizer]
    assert state_bytes_per_param("fp32", optimizer=optimizer)["optimizer"] == 4 * n
    assert state_bytes_per_param("bf16", optimizer=optimizer)["optimizer"] == 4 + 4 * n
    assert state_bytes_per_param("bf16", zero=1, dp=4, optimizer=optimizer)["optimizer"] == (4 + 4 * n) / 4
    assert optimizer_step_bytes("fp32", optimizer) == 4 + 2 * (4 + 4 * n)
    assert optimizer_step_bytes("bf16", optimizer) == 4 + 2 * (4 + 4 * n) + 2


def test_the_estimate_holds_each_optimizers_state_and_times_its_step():
    """Only the optimizer's state and step change: the state by 4 bytes a buffer per
    parameter each device holds, the step in proportion to the bytes it moves."""
    model = sim.Transformer(layers=4, hidden=256, heads=4, seq=128, vocab=1024)
    kw = dict(pp=2, micro_batch=2, global_batch=8, precision="fp32")
    est = {o: sim.estimate(model, "a100-80gb", optimizer=o, **kw) for o in OPTIMIZERS}
    sgd = est["sgd"]
    for o, e in est.items():
        weights = [p["weights"] for p in e.memory_parts]
        assert [p["optimizer"] for p in e.memory_parts] == [BUFFERS[o] * w for w in weights]
        assert [a - b for a, b in zip(e.peak_memory, sgd.peak_memory)] == [BUFFERS[o] * w for w in weights]
        assert e.time_parts["optimizer"] == pytest.approx(
            sgd.time_parts["optimizer"] * optimizer_step_bytes("fp32", o) / optimizer_step_bytes("fp32", "sgd"))
        assert e.summary()["optimizer"] == o
    assert est["adamw"].peak_memory == sim.estimate(model, "a100-80gb", **kw).peak_memory  # the default
    with pytest.raises(ValueError, match="optimizer must be one of adamw, adam, sgd, sgd-momentum, got 'lion'"):
        sim.estimate(model, "a100-80gb", optimizer="lion", **kw)


def test_the_step_pays_the_profiles_host_cost_per_parameter_tensor():
    """With a profile's `optimizer_per_tensor` x for AdamW, one rank's AdamW step is longer by x times
    its parameter tensors: 12 a GPT layer (fused QKV, projection, MLP in and out, their biases,
    two LayerNorms' gains and biases), the word and position embeddings, the final norm's two;
    the output layer tied to the embedding on the same rank adds none."""
    model = sim.Transformer(layers=4, hidden=256, heads=4, seq=128, vocab=1024)
    base = sim.profile("a100-80gb")
    x = 20e-6
    kw = dict(pp=1, micro_batch=2, global_batch=8, precision="fp32")
    a = sim.estimate(model, base, **kw)
    measured = dataclasses.replace(base, optimizer_per_tensor={"adamw": x, "sgd": x / 4})
    b = sim.estimate(model, measured, **kw)
    assert stage_tensors(model, [4], [0]) == [4 * 12 + 2 + 2]
    assert b.time_parts["optimizer"] - a.time_parts["optimizer"] == pytest.approx(x * 52)
    sgd = [sim.estimate(model, g, optimizer="sgd", **kw).time_parts["optimizer"] for g in (base, measured)]
    assert sgd[1] - sgd[0] == pytest.approx(x / 4 * 52)  # each optimizer its own cost
    adam = [sim.estimate(model, g, optimizer="adam", **kw).time_parts["optimizer"] for g in (base, measured)]
    assert adam[1] == adam[0]  # an optimizer the profile did not measure: none
    assert stage_tensors(model, [2, 2], [0, 1]) == [2 * 12 + 2, 2 * 12 + 2 + 1]  # the tied copy on the last
    llama = sim.Transformer(layers=2, hidden=256, heads=4, seq=128, vocab=1024, arch="llama")
    assert stage_tensors(llama, [1, 1], [0, 1]) == [4 + 2 + 1, 4 + 2 + 1 + 1]  # no biases, RMSNorm gains, untied


def test_the_planner_searches_with_the_runs_optimizer():
    """`sim.plan.search(optimizer=)`: on one GPU the one layout holds AdamW's two buffers, 8
    bytes a parameter more than SGD's state (the fp32 master weight, bf16)."""
    args = dict(gpus=1, global_batch=1, top=1, recompute="full")
    rows = {o: sim.plan.search("megatron-1.7b", "a100-80gb", optimizer=o, **args).best for o in ("adamw", "sgd")}
    params = sim.MODELS["megatron-1.7b"].params().total
    assert rows["adamw"].config.changed(optimizer="sgd") == rows["sgd"].config  # the same layout, each its optimizer
    assert rows["adamw"].peak_memory - rows["sgd"].peak_memory == 8 * params
