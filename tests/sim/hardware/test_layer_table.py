"""A device profile's measured tables as the planner reads them: matmuls by operand layout, and whole blocks and the model's ends measured inside a step (`layers`), which replace the kernel model exactly where the profile has them and nowhere else."""
import copy
import dataclasses

import pytest

import sim
from sim.hardware.kernels import gemm_time
from sim.hardware.profile import from_dict
from sim.cost.layer import Slice, gemm_products, layer_times

FIXTURE = {"source": "datasheet", "citation": "test fixture: a round made-up number"}
# exec's GPT as the planner describes it (`exec.models.spec.ModelSpec.transformer`)
GPT = sim.Transformer(layers=4, hidden=64, heads=2, seq=32, vocab=256, arch="gpt", attention="flash", dropout=False,
                      tied=False, kernels="torch")
PASSES = {"F": 3e-3, "B": 7e-3, "I": 4e-3, "W": 5e-3}


def _num(value):
    return {"value": value, **FIXTURE}


def _cpu(**sections) -> dict:
    """A CPU-like profile (fp32, launch added to the device time) with `sections` added."""
    data = {
        "schema": "pipeline-workbench/device-profile/1", "name": "test-cpu", "description": "a test CPU",
        "datasheet": {"name": "test-cpu", "memory": _num(64 * 2**30), "peak_flops": {"fp32": _num(1e11)},
                      "hbm_bandwidth": _num(1e10), "sms": _num(2)},
        "stack": {"name": "test", "description": "a test stack", "attention_kernel": "measured", "elementwise": "eager"},
        "fingerprint": {"device": "test cpu", "backend": "gloo", "date": "2026-11-24"},
        "matmul": {"efficiency": _num(0.5)}, "memory_bound": {"bandwidth": _num(1e10)},
        "collectives": {"node": {"bus_bandwidth": _num(1e9), "hop_latency": _num(1e-5), "base_latency": _num(2e-5)}},
        "p2p": {"node": {"bandwidth": _num(1e9), "latency": _num(1e-5)}},
        "launch": {"per_kernel": _num(1e-5), "host_runs_ahead": False}, "step_overhead": _num(1e-4)}
    data.update(copy.deepcopy(sections))
    return data


ENDS = {"first_F": 1e-3, "first_B": 2e-3, "last_F": 4e-3, "last_B": 6e-3, "last_I": 3.5e-3, "last_W": 3e-3}


def _layers(micro_batch: int = 4, recompute: str = "none", model=GPT, passes=PASSES, ends=None) -> dict:
    row = ["fp32", model.hidden, model.heads, model.ffn, model.seq, micro_batch, recompute,
           *(passes[k] for k in "FBIW")]
    out = {"blocks": {"rows": [row], **FIXTURE}}
    if ends is not None:
        out["ends"] = {"rows": [["fp32", model.hidden, model.seq, model.vocab, micro_batch, *ends.values()]], **FIXTURE}
    return {"layers": out}


# ---------------------------------------------------------------------------- matmuls by layout

def test_matmul_rows_by_layout():
    rows = [["fp32", 512, 512, 128, 1, 1e-3, "nn"], ["fp32", 512, 512, 128, 1, 6e-4, "nt"],
            ["fp32", 512, 512, 128, 1, 8e-4]]  # no layout: "nn"
    p = from_dict(_cpu(matmul={"table": {"rows": rows, **FIXTURE}}), "test")
    assert gemm_time(p, "fp32", 512, 512, 128, 1, "nt") == 6e-4
    assert gemm_time(p, "fp32", 512, 512, 128) in (1e-3, 8e-4)  # the two "nn" rows of that shape
    # "tn" is not in the table: a nearest row of any layout (all three are as near), scaled by the FLOPs
    assert gemm_time(p, "fp32", 512, 512, 256, 1, "tn") / 2 in {r[5] for r in rows}
    with pytest.raises(ValueError, match="layout must be one of nn, nt, tn"):
        gemm_time(p, "fp32", 512, 512, 128, 1, "tt")
    bad = _cpu(matmul={"table": {"rows": [["fp32", 512, 512, 128, 1, 1e-3, "tt"]], **FIXTURE}})
    with pytest.raises(sim.ProfileError, match=r"matmul\.table.*row 0"):
        from_dict(bad, "test")


def test_a_layer_times_each_product_in_its_layout():
    """F runs X W^T, the input gradient dY W, the weight gradient dY^T X: with a table that
    gives each layout its own time, the layer's matmul times follow the layouts."""
    x = Slice(4, precision="fp32")
    rows = []
    for name, shape in sim.cost.layer.gemm_shapes(GPT, x).items():
        for (m, n, k, b, layout), t in zip(gemm_products(*shape), (1e-3, 2e-3, 4e-3)):
            rows.append(["fp32", m, n, k, b, t, layout])
    p = from_dict(_cpu(matmul={"table": {"rows": rows, **FIXTURE}}), "test")
    products = gemm_products(*sim.cost.layer.gemm_shapes(GPT, x)["mlp_in"])
    assert [p.matmul_lookup("fp32", *q[:4], q[4]) for q in products] == [1e-3, 2e-3, 4e-3]


# ---------------------------------------------------------------------------- measured blocks

def test_a_measured_block_replaces_the_kernel_model_exactly_there():
    plain = from_dict(_cpu(), "test")
    p = from_dict(_cpu(**_layers()), "test")
    lt = layer_times(GPT, p, Slice(4, precision="fp32"))
    assert (lt.forward, lt.backward, lt.backward_input, lt.backward_weight) == tuple(PASSES[k] for k in "FBIW")
    assert set(lt.kernels.values()) == {0}  # the host's cost is inside the measured passes
    assert sum(lt.parts.values()) == pytest.approx(PASSES["F"] + PASSES["B"])
    model = layer_times(GPT, plain, Slice(4, precision="fp32"))
    assert lt.parts.keys() == model.parts.keys() and lt.recompute == model.recompute == 0
    # blocks that do not stand for the measured one (tensor parallelism, other kernels): the kernel model
    for args in ((GPT, Slice(4, tp=2, precision="fp32"), "none"),
                 (dataclasses.replace(GPT, kernels="megatron", attention="flash"), Slice(4, precision="fp32"), "none")):
        assert layer_times(*args[:1], p, *args[1:]) == layer_times(*args[:1], plain, *args[1:])
    # another micro-batch or recompute mode: the kernel model under the in-step fit (tests/sim/cost/test_shapes.py)
    for b, recompute in ((2, "none"), (4, "full")):
        assert layer_times(GPT, p, Slice(b, precision="fp32"), recompute) != \
            layer_times(GPT, plain, Slice(b, precision="fp32"), recompute)


def test_full_recompute_row_keeps_the_models_share_of_recompute():
    p = from_dict(_cpu(**_layers(recompute="full")), "test")
    lt = layer_times(GPT, p, Slice(4, precision="fp32"), "full")
    model = layer_times(GPT, from_dict(_cpu(), "test"), Slice(4, precision="fp32"), "full")
    assert lt.recompute == pytest.approx(model.recompute * PASSES["F"] / model.forward)


def test_the_estimate_adds_measured_blocks_per_layer():
    """Two more blocks on a stage add twice the measured F, B, I and W to its passes (the ends
    and the launch floor of their kernels stay the same), cross-checked on the simulated step."""
    p = from_dict(_cpu(**_layers()), "test")

    def durations(layers: int) -> dict:
        e = sim.estimate(dataclasses.replace(GPT, layers=layers), gpu=p, gpus_per_node=1, pp=1, micro_batch=4,
                         global_batch=8, schedule="1f1b", precision="fp32")
        out = {}
        for ev in e.result.events:
            if ev.action.kind.is_compute:
                out.setdefault(ev.action.kind.name, set()).add(round(ev.duration, 12))
        return {k: v.pop() for k, v in out.items() if len(v) == 1}

    two, four = durations(2), durations(4)
    assert set(two) == set(four) and "F" in two
    for kind in two:
        assert four[kind] - two[kind] == pytest.approx(2 * PASSES[kind], rel=1e-9), kind


def test_measured_ends_replace_the_end_kernels():
    """With measured ends, each stage's passes are its blocks plus the measured ends (no
    launch floor on either), the first stage's I empty and its W the whole backward (rule 15),
    checked on the simulated step of 2 stages under ZB-H1 and 1F1B."""
    from sim.cost.ends import end_times
    p = from_dict(_cpu(**_layers(ends=ENDS)), "test")
    ends = end_times(GPT, p, Slice(4, precision="fp32"))
    assert ends == dict(ENDS, first_I=0.0, first_W=ENDS["first_B"])
    plain = end_times(GPT, from_dict(_cpu(), "test"), Slice(4, precision="fp32"))
    assert plain["last_B"] == plain["last_I"] + plain["last_W"]  # the kernel model's B is I + W
    assert end_times(GPT, p, Slice(2, precision="fp32")) != end_times(GPT, p, Slice(4, precision="fp32"))
    blocks = GPT.layers // 2

    def durations(schedule: str) -> dict:
        e = sim.estimate(GPT, gpu=p, gpus_per_node=2, pp=2, micro_batch=4, global_batch=8, schedule=schedule,
                         precision="fp32")
        return {(ev.action.stage, ev.action.kind.name): round(ev.duration, 12) for ev in e.result.events
                if ev.action.kind.is_compute}

    one = durations("1f1b")
    assert one[(0, "F")] == pytest.approx(blocks * PASSES["F"] + ENDS["first_F"])
    assert one[(1, "F")] == pytest.approx(blocks * PASSES["F"] + ENDS["last_F"])
    assert one[(0, "B")] == pytest.approx(blocks * PASSES["B"] + ENDS["first_B"])
    assert one[(1, "B")] == pytest.approx(blocks * PASSES["B"] + ENDS["last_B"])
    zb = durations("zb-h1")
    assert (0, "I") not in zb or zb[(0, "I")] == 0.0
    assert zb[(0, "W")] == pytest.approx(blocks * PASSES["B"] + ENDS["first_B"])
    assert zb[(1, "I")] == pytest.approx(blocks * PASSES["I"] + ENDS["last_I"])
    assert zb[(1, "W")] == pytest.approx(blocks * PASSES["W"] + ENDS["last_W"])


def test_a_malformed_layers_table_is_refused():
    for row in (["fp32", 64, 2, 256, 32, 4, "none", 1e-3, 1e-3, 1e-3],           # a pass short
                ["fp32", 64, 2, 256, 32, 4, "none", 1e-3, -1e-3, 1e-3, 1e-3],    # a negative time
                ["fp8", 64, 2, 256, 32, 4, "none", 1e-3, 1e-3, 1e-3, 1e-3]):     # no such precision
        with pytest.raises(sim.ProfileError, match=r"'layers\.blocks' row 0"):
            from_dict(_cpu(layers={"blocks": {"rows": [row], **FIXTURE}}), "test")
    with pytest.raises(sim.ProfileError, match=r"'layers\.ends' row 0"):
        from_dict(_cpu(layers={"ends": {"rows": [["fp32", 64, 32, 256, 4, 1e-3]], **FIXTURE}}), "test")


def test_a_profile_says_which_shapes_it_measured_and_how_far_it_was_checked():
    checked = {"rows": [[4, 128, 4, 64, 512, 6, 5.1, 10.2], [4, 256, 8, 64, 512, 6, 7.0, 12.5]], **FIXTURE}
    data = _cpu(**_layers())
    data["layers"]["checked"] = checked
    p = from_dict(data, "test")
    assert p.layers.shapes() == [("fp32", GPT.hidden, GPT.heads, GPT.ffn, GPT.seq)]
    assert p.layers.checked == tuple(tuple(r) for r in checked["rows"])
    data["layers"]["checked"] = {"rows": [[4, 128, 4, 64, 512, 6, 5.1]], **FIXTURE}  # a column short
    with pytest.raises(sim.ProfileError, match=r"layers\.checked.*row 0"):
        from_dict(data, "test")
