"""FP8 training in sim.cost.fp8 (Transformer Engine's): the Linear GEMMs at the FP8 peak x the
profile's FP8 efficiency, the rest of the layer as in BF16 plus the casts, FP8 all-gathers and
BF16 reduce-scatters, and exactly the stated FP8 copies in memory."""
import dataclasses
import json

import pytest
from hypothesis import given, settings, strategies as st

import sim
from sim.cost import fp8
from sim.cost.ends import end_times
from sim.cost.layer import Slice, gemm_products, gemm_shapes, layer_times, pass_kernels
from sim.hardware.kernels import gemm_time, memory_time
from sim.hardware.network import collective_time, links_of
from sim.hardware.profile import from_dict, profile
from sim.model.registry import find_model as model
from sim.plan.layout import Layout
from sim.plan.stage_costs import stage_costs

H100 = profile("h100-80gb-best-case")
LINEARS = ("qkv", "projection", "mlp_in", "mlp_out")


def _with_fp8(p, efficiency, scaling="delayed"):
    """The profile `p` with its FP8 efficiency set to `efficiency` (None: taken out)."""
    data = json.loads(json.dumps(p.data))
    data["matmul"].pop("fp8_efficiency", None)
    if efficiency is not None:
        data["matmul"]["fp8_efficiency"] = {"value": efficiency, "source": "datasheet", "citation": "test",
                                            "scaling": scaling}
    return from_dict(data, "test")


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 16384), st.integers(1, 16384), st.integers(1, 16384), st.floats(0.2, 0.9))
def test_an_fp8_gemm_is_the_bf16_one_scaled_by_the_peaks_and_the_efficiencies(m, n, k, eff):
    dev = _with_fp8(H100, eff)
    expected = gemm_time(dev, "bf16", m, n, k) * dev.flops("bf16") / dev.flops("fp8") * dev.matmul_efficiency / eff
    assert fp8.linear_gemm_time(dev, m, n, k) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("name", ["llama3-8b", "gpt3-175b", "nemotron4-15b"])
def test_the_layer_differs_from_bf16_by_its_linear_gemms_and_the_casts_only(name):
    """tp = 1 (no collectives): F under FP8 = F under BF16 - the four Linear GEMMs in BF16 + the
    same in FP8 + the casts of the four inputs (4 bytes an element: cast and transpose); the
    attention core and every other kernel are BF16's."""
    m, dev = model(name), _with_fp8(H100, 0.6)
    bf16, f8 = (layer_times(m, dev, Slice(2, precision=p)) for p in ("bf16", "fp8"))
    shapes = gemm_shapes(m, Slice(2))
    gemms = sum(fp8.linear_gemm_time(dev, *gemm_products(*shapes[n])[0]) - gemm_time(dev, "bf16", *gemm_products(
        *shapes[n])[0]) for n in LINEARS)
    sb = m.seq * 2
    casts = sum(memory_time(dev, 4 * elements) for elements in (sb * m.hidden, sb * m.hidden, sb * m.hidden,
                                                                sb * m.ffn))
    assert f8.forward - bf16.forward == pytest.approx(gemms + casts, rel=1e-9)
    assert f8.parts["memory"] > bf16.parts["memory"] and f8.parts["gemm"] < bf16.parts["gemm"]


def test_current_scaling_reads_each_cast_tensor_once_more_and_launches_its_amax_kernel():
    m, x = model("llama3-8b"), Slice(1, precision="fp8")
    delayed, current = (layer_times(m, _with_fp8(H100, 0.6, s), x) for s in ("delayed", "current"))
    sb = m.seq
    extra = sum(memory_time(H100, 2 * e) for e in (sb * m.hidden, sb * m.hidden, sb * m.hidden, sb * m.ffn))
    assert current.forward - delayed.forward == pytest.approx(extra, rel=1e-9)
    casts = len(fp8.cast_kernels(m)["F"])
    assert pass_kernels(m, x, scaling="current")["F"] - pass_kernels(m, x)["F"] == casts


def test_sequence_parallel_gathers_move_fp8_and_reduce_scatters_bf16():
    m, dev = model("llama3-70b"), _with_fp8(H100, 0.6)
    x = Slice(1, tp=8, sequence_parallel=True, precision="fp8")
    buf = m.seq * m.hidden * 2
    links, group = links_of(dev), x.tensor_group
    ag = collective_time(links, "all_gather", buf / 2, group)
    bf16_ag = collective_time(links, "all_gather", buf, group)
    f8, bf16 = (layer_times(m, dev, dataclasses.replace(x, precision=p)) for p in ("fp8", "bf16"))
    # F: two all-gathers (FP8: half the bytes) and two reduce-scatters (BF16: the same), none hidden
    assert f8.forward - bf16.forward == pytest.approx(
        sum(fp8.linear_gemm_time(dev, *gemm_products(*gemm_shapes(m, x)[n])[0])
            - gemm_time(dev, "bf16", *gemm_products(*gemm_shapes(m, x)[n])[0]) for n in LINEARS)
        + sum(memory_time(dev, 4 * e) for e in (m.seq * m.hidden / 8, m.seq * m.hidden / 8, m.seq * m.hidden / 8,
                                                 m.seq * m.ffn / 8))
        + 2 * (ag - bf16_ag), rel=1e-9)


def test_refusals_name_the_fix():
    with pytest.raises(ValueError, match="no FP8 tensor cores"):
        sim.estimate("gpt3-175b", "a100-80gb", tp=8, pp=8, global_batch=64, precision="fp8")
    with pytest.raises(ValueError, match="fp8_efficiency"):
        sim.estimate("llama3-8b", _with_fp8(H100, None), tp=8, global_batch=8, precision="fp8")
    with pytest.raises(ValueError, match="kernels='megatron'"):
        layer_times(dataclasses.replace(model("llama3-8b"), kernels="torch", arch="gpt", mlp="gelu",
                                        positions="learned", dropout=False, attention="flash"),
                    H100, Slice(1, precision="fp8"))


def _stage_costs(m, precision, recompute, layers):
    lay = Layout(tp=8, pp=len(layers), micro_batch=1, global_batch=16, sequence_parallel=True, recompute=recompute,
                 precision=precision)
    x = Slice(1, 8, True, precision)
    lt, ends = layer_times(m, H100, x, recompute), end_times(m, H100, x)
    return stage_costs(m, H100, lay, x, lt, ends, layers, list(range(len(layers))))[0]


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_memory_adds_exactly_the_fp8_copies_and_saves_the_fp8_inputs(recompute):
    """Per stage: weights + 2 bytes a Linear parameter (the FP8 weight and its transpose);
    activations - 1 byte an element of each Linear's saved input (none under full recompute);
    gradients and optimizer state as BF16's."""
    m, layers = model("llama3-70b"), [21, 20, 20, 19]
    c16, c8 = (_stage_costs(m, p, recompute, layers) for p in ("bf16", "fp8"))
    for s, n in enumerate(layers):
        assert c8.weight_bytes[s] - c16.weight_bytes[s] == pytest.approx(2 * n * fp8.linear_params_per_layer(m, 8))
        saved = n * fp8.saved_bytes_saving(m, 1, 8, True, recompute)
        assert c16.activation_bytes[s] - c8.activation_bytes[s] == pytest.approx(saved)
        assert (saved == 0) is (recompute == "full")
    assert c8.grad_bytes == c16.grad_bytes and c8.optimizer_bytes == c16.optimizer_bytes
    assert c8.activation_bytes_sent == c16.activation_bytes_sent


def test_an_fp8_step_is_faster_and_its_mfu_is_against_the_bf16_peak():
    kw = dict(tp=8, pp=4, micro_batch=1, global_batch=16, sequence_parallel=True, recompute="selective")
    bf16, f8 = (sim.estimate("llama3-70b", H100, precision=p, **kw) for p in ("bf16", "fp8"))
    assert f8.step_time < bf16.step_time
    assert f8.mfu / bf16.mfu == pytest.approx(bf16.step_time / f8.step_time)


def test_linear_params_are_the_models_layer_params_less_norms_and_biases():
    for name in ("llama3-8b", "gpt3-175b", "nemotron4-15b"):
        m = model(name)
        p = m.params()
        h, f = m.hidden, m.ffn
        norms = 2 * (2 if m.arch == "gpt" else 1) * h
        biases = (m.hidden * (m.heads + 2 * m.kv_heads) // m.heads + h + (m.mlp_matrices - 1) * f + h
                  if m.arch == "gpt" else 0)
        assert fp8.linear_params_per_layer(m) == p.per_layer - norms - biases
