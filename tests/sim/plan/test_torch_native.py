"""The torch-native development set and its calibrated profiles: the rows read as the set's README says, and each fitted parameter's residual reproduced from the data (a cross-check of the shipped profiles, not a stored number)."""
import csv
import math
import re

import pytest

import sim
from sim.hardware.profile import from_dict
from sim.plan import published

CALIBRATED = ["h100-80gb-llm-foundry", "h100-96gb-500w-torchtitan"]
FITTED = (("matmul", "efficiency"), ("attention", "efficiency"), ("matmul", "fp8_efficiency"))


def test_every_row_is_read_with_its_step_time_from_its_throughput():
    """Step time = global batch x sequence / (tokens/s/GPU x GPUs); where the row states a step
    time (llm-foundry's, from its total throughput) that one, within 0.1 % of the first."""
    runs = published.torch_native_runs()
    with published.TORCH_NATIVE.open() as f:
        assert len(runs) == sum(1 for _ in csv.DictReader(f)) == 50
    stated = [r for r in runs if r.row["step_time_s"]]
    assert len(stated) == 32
    for r in stated:
        assert r.step_time == float(r.row["step_time_s"])
        assert published.throughput_step(r.row, r.seq) == pytest.approx(r.step_time, rel=1e-3)
    for r in (r for r in runs if not r.row["step_time_s"]):
        assert r.step_time == published.throughput_step(r.row, r.seq)
    assert {r.reason for r in runs} == {None, "micro_batch"}
    assert all(not r.row["mbs"] for r in runs if r.reason == "micro_batch")


def _rows_of(note: str) -> list:
    ids = set(re.search(r"row_id ([\d, ]+)\)", note).group(1).replace(" ", "").split(","))
    return [r for r in published.torch_native_runs() if r.row["row_id"] in ids]


@pytest.mark.parametrize("name", CALIBRATED)
def test_each_fitted_parameter_reproduces_its_residual_from_the_rows(name):
    """The shipped profile on the rows its `rows` field lists gives the MAPE and by-model MAPEs
    its `residual` field states (to the printed 0.1 point)."""
    p = sim.profile(name)
    checked = 0
    for section, key in FITTED:
        src = p.data.get(section, {}).get(key)
        if src is None or src["source"] != "calibrated":
            continue
        checked += 1
        runs = _rows_of(src["rows"])
        errors = [abs(published.torch_native_estimate(r, p).step_time / r.step_time - 1) for r in runs]
        stated = float(re.match(r"MAPE ([\d.]+)%", src["residual"]).group(1))
        assert 100 * sum(errors) / len(errors) == pytest.approx(stated, abs=0.051)
        for model in {r.row["model"] for r in runs}:
            mine = [e for r, e in zip(runs, errors) if r.row["model"] == model]
            stated = float(re.search(rf"{re.escape(model)} ([\d.]+)%", src["residual"]).group(1))
            assert 100 * sum(mine) / len(mine) == pytest.approx(stated, abs=0.051)
    assert checked >= 2


@pytest.mark.parametrize("name", CALIBRATED)
def test_each_fitted_parameter_is_a_least_squares_minimum(name):
    """Moving a fitted value 3 % either way raises the sum of squared log errors on its rows."""
    p = sim.profile(name)
    for section, key in FITTED:
        if p.data.get(section, {}).get(key, {}).get("source") != "calibrated":
            continue
        runs = _rows_of(p.data[section][key]["rows"])

        def sse(scale):
            data = p.to_dict()
            data[section][key]["value"] *= scale
            dev = from_dict(data, "test")
            return sum(math.log(published.torch_native_estimate(r, dev).step_time / r.step_time) ** 2 for r in runs)
        assert sse(1.0) < sse(0.97) and sse(1.0) < sse(1.03)


def test_the_rates_kernel_benchmarks_give_are_not_fitted():
    """torchtitan's attention is its kernel's published rates: no attention efficiency of its own;
    llm-foundry's Triton kernel has no published H100 rates, so its profile fits one."""
    tt, lf = sim.profile("h100-96gb-500w-torchtitan"), sim.profile("h100-80gb-llm-foundry")
    assert tt.attention_efficiency is None and tt.stack.attention_kernel == "flash-attention-2"
    assert sim.hardware.attention_kernels.rate(lf.stack.attention_kernel, "forward", True, 128, 2048) is None
    assert lf.source("attention.efficiency")["source"] == "calibrated"


def test_an_estimate_names_the_stack_it_was_priced_for():
    run = next(r for r in published.torch_native_runs() if r.reason is None and r.row["model"] == "Llama 3.1 8B")
    e = published.torch_native_estimate(run)
    assert "x h100-96gb-500w, torchtitan (" in repr(e) and e.summary()["stack"] == "torchtitan"
    mpt = published.torch_native_estimate(next(r for r in published.torch_native_runs() if r.row["model"] == "MPT-1B"))
    assert "x h100-80gb, llm-foundry (" in repr(mpt)
