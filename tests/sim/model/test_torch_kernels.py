"""kernels="torch" (sim.cost.layer, docs/profiles.md): the compute-bound classes of a profile,
the roofline of an elementwise kernel, memory classes looked up by size, and torch's layer
(erf GeLU, flash attention that recomputes its scores) as closed forms over a made-up profile."""
import copy
import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sim
from sim.hardware.kernels import elementwise_time, gemm_time, memory_time
from sim.hardware.profile import COMPUTE_CLASSES, ProfileError, from_dict
from sim.cost.layer import Slice, gemm_shapes, layer_times

FIXTURE = {"source": "datasheet", "citation": "test fixture: a round made-up number"}
GPT = sim.Transformer(layers=2, hidden=64, heads=4, seq=32, vocab=128, attention="flash", dropout=False,
                      tied=False, kernels="torch")
RATES = {"gelu": 2e9, "gelu_backward": 1e9, "exp": 1.5e9}


def _num(value, **extra):
    return {"value": value, **FIXTURE, **extra}


def _cpu(compute=RATES, memory_points=None) -> dict:
    """A CPU-like profile: fp32 matmuls by efficiency, one memory bandwidth, the compute classes given."""
    classes = {"elementwise": _num(5e10, **({"points": memory_points} if memory_points else {}))}
    out = {
        "schema": "pipeline-workbench/device-profile/1", "name": "test-cpu", "description": "a test CPU",
        "datasheet": {"name": "test-cpu", "memory": _num(64 * 2**30), "peak_flops": {"fp32": _num(1e11)},
                      "hbm_bandwidth": _num(5e10), "sms": _num(2)},
        "stack": {"name": "test", "description": "a test stack", "attention_kernel": "measured", "elementwise": "eager"},
        "fingerprint": {"device": "test cpu", "backend": "gloo", "date": "2026-11-24"},
        "matmul": {"efficiency": _num(0.5)},
        "memory_bound": {"bandwidth": _num(5e10), "classes": classes},
        "collectives": {"node": {"bus_bandwidth": _num(1e9), "hop_latency": _num(1e-5), "base_latency": _num(2e-5)}},
        "p2p": {"node": {"bandwidth": _num(1e9), "latency": _num(1e-5)}},
        "launch": {"per_kernel": _num(2e-6), "host_runs_ahead": False},
        "step_overhead": _num(1e-4),
    }
    if compute:
        out["compute_bound"] = {"classes": {k: _num(v) for k, v in compute.items()}}
    return out


def _slowed(kind: str, factor: float):
    """The test CPU with compute class `kind` `factor` times slower."""
    return from_dict(_cpu({**RATES, kind: RATES[kind] / factor}), "test")


# ---------------------------------------------------------------------------- the profile

def test_compute_classes_are_read_with_their_source_and_refused_when_wrong():
    p = from_dict(_cpu(), "test")
    assert dict(p.compute_classes) == RATES and p.source("compute_bound.classes.exp")["source"] == "datasheet"
    assert p.compute_class_time("gelu", 4e9) == pytest.approx(2.0)
    assert from_dict(_cpu(compute=None), "test").compute_class_time("gelu", 1e6) is None  # a GPU's: none
    with pytest.raises(ValueError, match="compute-bound kernel class must be one of"):
        p.compute_class_time("tanh", 1.0)
    bad = _cpu()
    bad["compute_bound"]["classes"]["tanh"] = _num(1e9)
    with pytest.raises(ProfileError, match="compute_bound.classes must be among"):
        from_dict(bad, "test")
    unsourced = _cpu()
    del unsourced["compute_bound"]["classes"]["exp"]["citation"]
    with pytest.raises(ProfileError, match="compute_bound.classes.exp"):
        from_dict(unsourced, "test")
    points = _cpu()
    points["compute_bound"]["classes"]["exp"]["points"] = [[1e3, -1.0]]
    with pytest.raises(ProfileError, match="points"):
        from_dict(points, "test")
    assert set(COMPUTE_CLASSES) == set(RATES)


def test_shipped_gpu_profiles_have_no_compute_classes_nor_memory_points():
    """The GPU presets are untouched: their elementwise kernels stay memory-bound at one bandwidth."""
    for name in sim.hardware.profile.presets():
        p = sim.profile(name)
        assert not p.compute_classes and not p.memory_points


@settings(max_examples=60, deadline=None)
@given(nbytes=st.floats(0, 1e9), elements=st.floats(0, 1e9), kind=st.sampled_from(sorted(RATES)))
def test_an_elementwise_kernel_takes_the_longer_of_its_bytes_and_its_arithmetic(nbytes, elements, kind):
    p = from_dict(_cpu(), "test")
    assert elementwise_time(p, nbytes, "elementwise", elements, kind) == pytest.approx(
        max(nbytes / 5e10, elements / RATES[kind]), rel=1e-12, abs=1e-300)
    gpu = from_dict(_cpu(compute=None), "test")
    assert elementwise_time(gpu, nbytes, "elementwise", elements, kind) == pytest.approx(nbytes / 5e10, abs=1e-300)


def test_a_memory_class_with_measured_points_is_looked_up_by_size():
    """Interpolated between points (a CPU's cache), the last point's bandwidth above them, the
    first point's time below; without points, bytes over the class's bandwidth."""
    pts = [[1e4, 1e-6], [1e6, 1e-5], [1e8, 4e-3]]
    p = from_dict(_cpu(memory_points=pts), "test")
    assert memory_time(p, 1e6) == pytest.approx(1e-5)
    assert memory_time(p, 5.05e5) == pytest.approx(5.5e-6)
    assert memory_time(p, 2e8) == pytest.approx(8e-3)
    assert memory_time(p, 10.0) == pytest.approx(1e-6)
    assert memory_time(p, 1e6, "norm") == pytest.approx(1e6 / 5e10)   # no points for norm: its bandwidth


# ---------------------------------------------------------------------------- torch's layer

def _elements(b: int) -> dict:
    s, h, a, f = GPT.seq, GPT.hidden, GPT.heads, GPT.ffn
    return {"sbf": s * b * f, "as2b": a * s * s * b}


@pytest.mark.parametrize("b", [1, 4])
def test_gelu_is_compute_bound_once_each_way(b):
    """Slowing the GeLU class by 10x adds sbf elements at the slower rate to F (its forward),
    and the backward class to I and B; W is untouched."""
    x, base = Slice(b, precision="fp32"), from_dict(_cpu(), "test")
    t0 = layer_times(GPT, base, x)
    sbf = _elements(b)["sbf"]
    for kind, passes in (("gelu", ("forward",)), ("gelu_backward", ("backward", "backward_input"))):
        t1 = layer_times(GPT, _slowed(kind, 10), x)
        for field in ("forward", "backward", "backward_input", "backward_weight"):
            added = 9 * sbf / RATES[kind] if field in passes else 0.0
            assert getattr(t1, field) - getattr(t0, field) == pytest.approx(added, rel=1e-9, abs=1e-15), (kind, field)


@pytest.mark.parametrize("b", [1, 4])
def test_flash_attention_exponentiates_its_scores_each_way_and_recomputes_them(b):
    """The exponentials: as2b elements in F and again in the backward; the backward's matmuls:
    the four gradients and the scores once more (Dao et al. 2022, Alg. 2)."""
    x, base = Slice(b, precision="fp32"), from_dict(_cpu(), "test")
    t0, t1 = layer_times(GPT, base, x), layer_times(GPT, _slowed("exp", 2), x)
    added = _elements(b)["as2b"] / RATES["exp"]
    assert t1.forward - t0.forward == pytest.approx(added, rel=1e-9)
    assert t1.backward_input - t0.backward_input == pytest.approx(added, rel=1e-9)
    megatron = layer_times(dataclasses.replace(GPT, kernels="megatron"), base, x)
    m, n, k, nb = gemm_shapes(GPT, x)["scores"]
    assert t0.parts["gemm"] - megatron.parts["gemm"] == pytest.approx(gemm_time(base, "fp32", m, n, k, nb), rel=1e-9)


def test_torch_recompute_full_recomputes_once_in_b_and_again_in_w():
    x, p = Slice(2, precision="fp32"), from_dict(_cpu(), "test")
    none, full, sel = (layer_times(GPT, p, x, r) for r in ("none", "full", "selective"))
    assert full.backward == pytest.approx(none.backward + none.forward, rel=1e-12)
    assert full.backward_input == pytest.approx(none.backward_input + none.forward, rel=1e-12)
    assert full.backward_weight == pytest.approx(none.backward_weight + none.forward, rel=1e-12)
    shapes = gemm_shapes(GPT, x)
    core = sum(gemm_time(p, "fp32", *shapes[k]) for k in ("scores", "values")) + _elements(2)["as2b"] / RATES["exp"]
    assert sel.recompute == pytest.approx(core, rel=1e-12) and sel.backward_weight == none.backward_weight
    assert full.kernels["W"] == none.kernels["W"] + none.kernels["F"]
    assert full.kernels["B"] == none.kernels["B"] + none.kernels["F"]


def test_torch_kernel_counts_are_its_operators():
    """F: 4 addmm, 1 flash, 2 LayerNorms, 2 adds, GeLU; I: 4 mm, the flash backward, GeLU's and
    the norms' backward, 2 gradient adds, the cat; W: 4 mm, 4 bias sums, 12 adds into .grad."""
    n = layer_times(GPT, from_dict(_cpu(), "test"), Slice(1, precision="fp32")).kernels
    assert n == {"F": 10, "I": 11, "W": 20, "B": 31}


@pytest.mark.parametrize("change", [dict(arch="llama"), dict(attention="unfused"), dict(dropout=True)])
def test_torch_kernels_are_refused_for_a_layer_exec_does_not_build(change):
    m = dataclasses.replace(GPT, **change)
    with pytest.raises(ValueError, match="kernels='torch' lists the kernels of exec's GPT") as e:
        layer_times(m, from_dict(_cpu(), "test"), Slice(1, precision="fp32"))
    assert "\n" not in str(e.value)


def test_megatron_layers_ignore_the_compute_classes():
    """The Megatron-LM lists have no compute-bound kernel: a profile's compute classes do not
    change their times (the GPU calibration stays as it was)."""
    m = dataclasses.replace(GPT, kernels="megatron")
    x = Slice(2, precision="fp32")
    with_rates, without = from_dict(_cpu(), "test"), from_dict(_cpu(compute=None), "test")
    assert layer_times(m, with_rates, x) == layer_times(m, without, x)
    assert copy.deepcopy(_cpu())["compute_bound"]  # the fixture does have them


def _stage_costs(model, pp=2):
    """The per-stage costs `sim.estimate` simulates, by its own public steps."""
    from sim.plan.layout import Layout
    from sim.cost.ends import end_times
    from sim.plan.stage_costs import stage_costs
    g = from_dict(_cpu())
    lay = Layout(pp=pp, micro_batch=2, global_batch=8, schedule="zb-h1", precision="fp32")
    x = Slice(2, 1, False, "fp32")
    lt = layer_times(model, g, x, "none")
    return stage_costs(model, g, lay, x, lt, end_times(model, g, x), [1] * pp, list(range(pp)))[0]


@pytest.mark.parametrize("pp", [1, 2, 3])
def test_torch_first_stage_split_backward_is_w_alone(pp):
    """Rule 15 (docs/rules.md): under torch's split the first stage's I is empty and keeps the
    whole graph, and its W is the whole backward; the other stages, and a Megatron-style model's
    first stage, split B into I + W with W holding at most the micro-batch."""
    model = dataclasses.replace(GPT, layers=pp)
    c = _stage_costs(model, pp)
    assert c.backward_input[0] == 0.0 and c.backward_weight[0] == c.backward[0] > 0
    assert c.w_activation_bytes[0] == c.activation_bytes[0]
    for s in range(1, pp):
        assert 0 < c.backward_input[s] < c.backward[s] and 0 < c.backward_weight[s] < c.backward[s]
        assert c.w_activation_bytes[s] <= c.activation_bytes[s]
    meg = _stage_costs(dataclasses.replace(model, kernels="megatron", attention="unfused"), pp)
    assert 0 < meg.backward_input[0] < meg.backward[0] and meg.w_activation_bytes[0] < meg.activation_bytes[0]
