"""The H100 development set's loader (sim.plan.h100_dev), its MAPE, and the calibrated H100 profile."""
from __future__ import annotations

import dataclasses
import json

import pytest

import sim
from sim.hardware.gpus import gpu as datasheet
from sim.hardware.profile import PRESETS
from sim.model.layer_layout import parse_layer_layout
from sim.plan import h100_dev

RUNS = h100_dev.runs()
EXPRESSED = [r for r in RUNS if r.reason is None]
CALIBRATED = ("h100-80gb-dgxc", "h200-dgxc")


def test_every_row_is_expressed_or_refused_with_a_known_reason():
    assert len(RUNS) == len(h100_dev.read_rows()) == 169
    assert len({r.row_id for r in RUNS}) == len(RUNS)
    for r in RUNS:
        assert (r.reason is None) == (r.model is not None) == bool(r.keywords)
        assert r.reason is None or r.reason in h100_dev.REASONS
    assert sum(h100_dev.refused_counts(RUNS).values()) == len(RUNS) - len(EXPRESSED)


def test_each_reason_matches_what_the_row_says():
    for r in RUNS:
        row = r.row
        if "JAX" in row["software"]:
            assert r.reason == "stack"
        elif int(row["cp"] or 1) > 1 and not h100_dev.planner_takes_cp():
            assert r.reason == "cp"
        elif int(row["n_layers"]) < int(row["pp"]) * int(row["vp"] or 1) != int(row["n_layers"]) + 2:
            assert r.reason == "layout"
        elif row["precision"].startswith("fp8") and not h100_dev.planner_takes_fp8():
            assert r.reason == "fp8"
        else:
            assert r.reason is None, (r.row_id, r.reason)


def test_expressed_rows_carry_their_layout():
    assert EXPRESSED
    for r in EXPRESSED:
        k, row = r.keywords, r.row
        assert k["tp"] * k["pp"] * k["dp"] * k.get("cp", 1) == int(row["n_gpus"])
        assert k["global_batch"] == int(row["gbs"]) and k["micro_batch"] == int(row["mbs"])
        assert k["global_batch"] == k["micro_batch"] * k["dp"] * int(row["grad_accum"])
        assert (k["virtual"] or 1) == int(row["vp"] or 1)
        assert (k["schedule"] == "interleaved-1f1b") == (int(row["vp"] or 1) > 1)
        assert r.model.layers == int(row["n_layers"]) and r.model.seq == int(row["seq_len"])
        assert r.model.vocab % (128 * k["tp"]) == 0
        assert not row["vocab"] or 0 <= r.model.vocab - int(row["vocab"]) < 128 * k["tp"]  # Grok-1's: not stated


@pytest.mark.parametrize("row_id", [149, 154])
def test_the_405b_proxy_splits_30_layers_and_the_embedding_and_loss_over_32_stages(row_id):
    """Rows 149 and 154 (30 layers at pp 4 x vp 8): the embedding and the loss a stage each, as
    Megatron-Core's account_for_embedding/loss_in_pipeline_split cut them, and the step simulated
    on those 32 stages: 8 a device, the first holding only the embedding, the last only the loss."""
    run = next(r for r in RUNS if r.row_id == row_id)
    assert run.reason is None and run.keywords["partition"] == "E|(t|)*30L"
    layout = parse_layer_layout(run.keywords["partition"])
    assert len(layout.stages) == 32 == run.keywords["pp"] * run.keywords["virtual"]
    assert layout.holds("E")[0] == layout.holds("L")[-1] == 1 and layout.layers == [0] + [1] * 30 + [0]
    e = h100_dev.estimate_run(run)
    assert e.layers_per_stage == layout.layers and e.result.schedule.stages == 32 and e.layer_layout == "E|(t|)*30L"
    assert e.step_time == pytest.approx(run.step_time, rel=0.10)


def test_a_split_layout_is_one_only_where_the_stages_are_the_layers_and_two():
    row = dict(n_layers="6", pp="2", vp="4")
    assert h100_dev.split_layout(row) == "E|(t|)*6L"
    assert h100_dev.split_layout(dict(row, vp="2")) is None and h100_dev.split_layout(dict(row, vp="5")) is None


@pytest.mark.parametrize("model, preset", [("GPT-3 175B", "gpt3-175b"), ("Nemotron4 15B", "nemotron4-15b"),
                                           ("Nemotron4 340B", "nemotron4-340b")])
def test_the_rows_models_are_the_presets_with_fused_attention(model, preset):
    run = next(r for r in EXPRESSED if r.row["model"] == model)
    want = dataclasses.replace(sim.MODELS[preset], attention="flash")
    assert run.model.params().total == want.params().total
    assert run.model.flops_per_iteration(8) == want.flops_per_iteration(8)


def test_one_expressed_row_per_model_estimates_and_a_refused_one_says_why():
    for model in sorted({r.row["model"] for r in EXPRESSED}):
        run = next(r for r in EXPRESSED if r.row["model"] == model)
        assert h100_dev.estimate_run(run, "h100-80gb-best-case").step_time > 0
    refused = next(r for r in RUNS if r.reason == "stack")
    with pytest.raises(ValueError, match="JAX"):
        h100_dev.estimate_run(refused)


def test_release_is_the_software_name_and_version():
    assert h100_dev.release({"software": "NeMo 24.12 container (NeMo Framework Launcher)"}) == "NeMo 24.12"
    assert h100_dev.release({"software": "NeMo 25.02.01 container (NeMo 2.0)"}) == "NeMo 25.02.01"


def test_mape_and_mape_by_against_a_hand_computation():
    assert h100_dev.mape([0.1, -0.2, 0.0, 0.5]) == pytest.approx((0.1 + 0.2 + 0.0 + 0.5) / 4)
    rows = [dict(model="a", software="NeMo 24.12 container"), dict(model="b", software="NeMo 24.12"),
            dict(model="a", software="NeMo 25.02.01 container")]
    runs = [h100_dev.DevRun(row, None, {}, "stack") for row in rows]
    errors = [-0.1, 0.3, 0.2]
    assert h100_dev.mape_by(runs, errors, "model") == {"a": (pytest.approx(0.15), 2), "b": (pytest.approx(0.3), 1)}
    assert h100_dev.mape_by(runs, errors, "release") == {"NeMo 24.12": (pytest.approx(0.2), 2),
                                                        "NeMo 25.02.01": (pytest.approx(0.2), 1)}


def _numbers(node, path=""):
    if isinstance(node, dict) and "value" in node and "source" in node:
        yield path, node
    elif isinstance(node, dict):
        for k, v in node.items():
            yield from _numbers(v, f"{path}.{k}" if path else k)


@pytest.mark.parametrize("name", CALIBRATED)
def test_the_calibrated_profiles_load_within_physical_bounds(name):
    p = sim.profile(name)
    ds = p.gpu
    assert 0 < p.matmul_efficiency <= 1 and 0 < p.attention_efficiency <= 1
    assert 0 < p.memory_bandwidth <= ds.hbm_bandwidth
    assert 0 < p.link("node").bus_bandwidth <= ds.nvlink_bandwidth
    assert 0 < p.link("network").bus_bandwidth <= ds.network_bandwidth
    assert p.step_overhead >= 0 and p.launch_per_kernel > 0


def test_the_fitted_numbers_say_where_they_come_from():
    data = json.loads((PRESETS / "h100-80gb-dgxc.json").read_text())
    fitted = [(path, n) for path, n in _numbers(data) if n["source"] == "calibrated"]
    assert any(path == "matmul.efficiency" for path, _ in fitted)
    for path, n in fitted:
        assert "h100-dev" in n["dataset"] and "row_id" in n["rows"] and n["standard_error"] >= 0, path
    derived = json.loads((PRESETS / "h200-dgxc.json").read_text())
    assert derived["datasheet"] == "h200"
    h100, h200 = datasheet("h100-80gb"), datasheet("h200")
    assert derived["memory_bound"]["bandwidth"]["value"] == pytest.approx(
        data["memory_bound"]["bandwidth"]["value"] * h200.hbm_bandwidth / h100.hbm_bandwidth)


@pytest.mark.parametrize("name", CALIBRATED)
def test_the_calibrated_fp8_efficiency_is_a_share_of_the_peak_that_names_its_rows(name):
    p = sim.profile(name)
    assert 0 < p.fp8_efficiency <= 1 and p.fp8_scaling == "delayed"
    fitted = json.loads((PRESETS / f"{name}.json").read_text())["matmul"]["fp8_efficiency"]
    assert fitted["source"] == "calibrated" and "FP8" in fitted["rows"] and "row_id" in fitted["rows"]
    # dense (the MoE rows have their own fit), and the 405B proxy's rows split over layers + 2 stages
    # (`h100_dev.split_layout`), expressed after the fit: held out
    fp8_ids = {r.row_id for r in EXPRESSED if r.row["precision"].startswith("fp8") and r.row["moe"] == "0"
               and "partition" not in r.keywords}
    assert fp8_ids and all(str(i) in fitted["rows"] for i in fp8_ids) and "154" not in fitted["rows"]
    assert fitted["value"] == pytest.approx(sim.profile("h100-80gb-dgxc").fp8_efficiency)


def test_fp8_rows_are_expressed_once_the_default_profile_times_fp8():
    assert h100_dev.planner_takes_fp8()
    fp8 = [r for r in EXPRESSED if r.row["precision"].startswith("fp8")]
    assert fp8 and all(r.keywords["precision"] == "fp8" for r in fp8)
    assert not any(r.reason == "fp8" for r in RUNS)
    run = fp8[0]
    bf16 = h100_dev.estimate(run.model, h100_dev.GPU, **dict(run.keywords, precision="bf16"))
    assert h100_dev.estimate_run(run).step_time < bf16.step_time


def test_pairs_share_model_release_and_layout_in_both_precisions():
    pairs = h100_dev.pairs(EXPRESSED)
    assert pairs
    for b, f in pairs:
        assert b.row["precision"] == "bf16" and f.row["precision"].startswith("fp8")
        assert h100_dev.release(b.row) == h100_dev.release(f.row) and b.row["model"] == f.row["model"]
        assert all(b.row[c] == f.row[c] for c in h100_dev.LAYOUT)
    assert len({f.row_id for _, f in pairs}) == len(pairs)
