"""Fused (flash) attention in sim.cost.layer: one kernel at the profile's attention efficiency,
FlashAttention-2's causal FLOP count, a backward of 2.5x, no s^2 memory traffic; unfused as before."""
import dataclasses
import json

import pytest
from hypothesis import given, settings, strategies as st

import sim
from sim.cost.attention import BACKWARD_OVER_FORWARD, CAUSAL_SHARE
from sim.cost.layer import Slice, layer_times, pass_kernels
from sim.hardware.profile import from_dict, profile
from sim.model.registry import find_model as model

H100 = profile("h100-80gb-best-case")


def _with_attention(p, efficiency):
    """The profile `p` with its attention efficiency set to `efficiency` (None: taken out)."""
    data = json.loads(json.dumps(p.data))
    data.pop("attention", None)
    if efficiency is not None:
        data["attention"] = {"efficiency": {"value": efficiency, "source": "datasheet", "citation": "test"}}
    return from_dict(data, "test")


def _flash(m):
    return dataclasses.replace(m, attention="flash")


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["llama3-8b", "llama3-70b", "nemotron4-15b", "gpt3-175b"]), st.sampled_from([1, 2, 4]),
       st.sampled_from([1, 2, 8]), st.sampled_from([1024, 8192, 32768]))
def test_the_kernel_is_flashattention2s_causal_count_at_the_efficiency(name, b, tp, seq):
    """Halving the efficiency adds the kernel's time once more: F by 2bs^2h/t FLOPs (4bs^2h,
    FlashAttention-2's count, halved by the causal mask) at the peak times the efficiency, I and B
    2.5 times that; W is untouched."""
    m = dataclasses.replace(_flash(model(name)), seq=seq)
    x = Slice(b, tp=tp)
    e = 0.5
    t1, t2 = (layer_times(m, _with_attention(H100, eff), x) for eff in (e, e / 2))
    forward = CAUSAL_SHARE * 4 * b * seq ** 2 * m.hidden / tp / (H100.flops("bf16") * e)
    assert CAUSAL_SHARE == 0.5 and BACKWARD_OVER_FORWARD == 2.5
    assert t2.forward - t1.forward == pytest.approx(forward, rel=1e-9)
    assert t2.backward_input - t1.backward_input == pytest.approx(2.5 * forward, rel=1e-9)
    assert t2.backward - t1.backward == pytest.approx(2.5 * forward, rel=1e-9)
    assert t2.backward_weight == t1.backward_weight


@pytest.mark.parametrize("name", ["llama3-8b", "gpt3-175b"])
def test_no_memory_traffic_grows_with_s_squared(name):
    """Fused: the memory-bound kernels scale with s (no scores written); unfused: faster than s."""
    m, x = model(name), Slice(1, tp=8)
    for attention, linear in (("flash", True), ("unfused", False)):
        a, b = (layer_times(dataclasses.replace(m, attention=attention, seq=s), H100, x).parts["memory"]
                for s in (2048, 4096))
        assert (b == pytest.approx(2 * a, rel=1e-9)) is linear


def test_selective_recompute_recomputes_the_fused_forward():
    m, x = model("llama3-70b"), Slice(1, tp=8)
    e = H100.attention_efficiency
    forward = CAUSAL_SHARE * 4 * m.seq ** 2 * m.hidden / 8 / (H100.flops("bf16") * e)
    assert layer_times(m, H100, x, "selective").recompute == pytest.approx(forward, rel=1e-12)


def test_a_profile_without_an_attention_efficiency_times_the_kernel_as_its_matmuls():
    """The documented default: the scores and values as GEMMs at the profile's matmul rate (the
    whole s^2, their four gradients backward), without the unfused kernels' memory traffic (a
    stack whose kernel has no published rates: sim.hardware.attention_kernels)."""
    m, x = model("llama3-8b"), Slice(2)
    data = _with_attention(H100, None).to_dict()
    bare = from_dict({**data, "stack": {**data["stack"], "attention_kernel": "triton-flash-2023"}}, "test")
    flash, unfused = layer_times(m, bare, x), layer_times(dataclasses.replace(m, attention="unfused"), bare, x)
    assert flash.parts["gemm"] == pytest.approx(unfused.parts["gemm"], rel=1e-12)
    assert flash.parts["memory"] < unfused.parts["memory"]
    assert sim.profile("a100-80gb-vtrain").attention_efficiency is None  # fitted on unfused runs


def test_fused_attention_is_one_kernel_each_way():
    """F: the four weight matmuls and the kernel, not the scores and values matmuls, softmax and
    dropout; I: four input-gradient matmuls and the kernel's backward, not six matmuls, softmax's
    and dropout's backward."""
    m, x = model("gpt3-175b"), Slice(1, tp=8)
    fused, unfused = pass_kernels(_flash(m), x), pass_kernels(m, x)
    assert unfused["F"] - fused["F"] == (2 + 2) - 1
    assert unfused["I"] - fused["I"] == (4 + 2) - 1
    assert unfused["W"] == fused["W"]


def test_flash_is_faster_the_longer_the_sequence():
    """At s = 8192 the unfused softmax over a s^2 b elements dominates; fused is faster, and the
    gap grows with s."""
    m, x = model("llama3-70b"), Slice(1, tp=8)
    ratio = [layer_times(dataclasses.replace(m, attention="unfused", seq=s), H100, x).forward
             / layer_times(dataclasses.replace(m, seq=s), H100, x).forward for s in (2048, 8192, 32768)]
    assert 1 < ratio[0] < ratio[1] < ratio[2]


def test_shipped_gpu_profiles_cite_their_attention_efficiency():
    for name in ("a100-40gb-best-case", "a100-80gb-best-case", "h100-80gb-best-case", "h200-best-case"):
        p = profile(name)
        assert 0.5 < p.attention_efficiency < 0.8
        assert p.source("attention.efficiency")["source"] in ("published", "derived")
    assert profile("h200-best-case").attention_efficiency == H100.attention_efficiency
