"""sim.hardware.attention_kernels: the kernels' published rates, read back at their cited points and between them."""
import re

import pytest

import sim
from sim.cost.attention import BACKWARD_OVER_FORWARD, forward_flops, kernel_attention_times
from sim.cost.slice import Slice
from sim.hardware import attention_kernels as ak
from sim.hardware.profile import from_dict
from sim.model.registry import find_model


@pytest.mark.parametrize("name", ["flash-attention-2", "cudnn-sdpa", "flash-attention-3"])
def test_every_cited_point_reads_back_as_its_tflops(name):
    """At each measured (direction, causality, head width, sequence) `rate` gives the figure's
    TFLOP/s over the H100's 989.4 peak, and every series names the paper and its transcription."""
    k = ak.KERNELS[name]
    assert k.points and set(k.points) == set(k.citations)
    for (direction, causal, d), series in k.points.items():
        assert "FlashAttention-3 (arXiv:2407.08608" in k.citations[(direction, causal, d)]
        for seq, tflops in series:
            assert ak.rate(name, direction, causal, d, seq) * ak.H100_PEAK / 1e12 == pytest.approx(tflops)


def test_between_points_the_rate_is_linear_in_log_sequence_and_flat_beyond():
    pts = dict(ak.KERNELS["flash-attention-2"].points[("forward", False, 128)])
    mid = ak.rate("flash-attention-2", "forward", False, 128, (1024 * 2048) ** 0.5) * ak.H100_PEAK / 1e12
    assert mid == pytest.approx((pts[1024] + pts[2048]) / 2)
    assert ak.rate("flash-attention-2", "forward", False, 128, 262144) == ak.rate("flash-attention-2", "forward",
                                                                                  False, 128, 16384)


def test_causal_backward_scales_by_the_forwards_causal_ratio():
    """No causal backward panel: the unmasked backward times the forward's causal/unmasked ratio."""
    r = lambda *a: ak.rate("cudnn-sdpa", *a)  # noqa: E731
    assert r("backward", True, 128, 4096) == pytest.approx(
        r("backward", False, 128, 4096) * r("forward", True, 128, 4096) / r("forward", False, 128, 4096))


def test_a_kernel_without_published_points_and_a_bad_name():
    assert ak.rate("triton-flash-2023", "forward", True, 128, 2048) is None
    with pytest.raises(ValueError, match=re.escape("attention kernel must be one of")):
        ak.rate("flash-9", "forward", True, 128, 2048)


def _stack_profile(kernel, gpu="h100-80gb"):
    data = sim.profile("h100-80gb-best-case").to_dict()
    data.pop("attention")
    data["datasheet"], data["stack"] = gpu, dict(data["stack"], attention_kernel=kernel)
    return from_dict(data, "test")


@pytest.mark.parametrize("kernel", ["flash-attention-2", "cudnn-sdpa", "flash-attention-3"])
def test_the_layer_times_the_core_at_the_kernels_rate(kernel):
    """kernel_attention_times: FlashAttention's causal count at the kernel's forward and
    backward rates; a profile with its own efficiency keeps it (None here); a datasheet off the
    H100 die gets None."""
    m, x, dev = find_model("llama3-8b"), Slice(2, tp=1), _stack_profile(kernel)
    f, b = kernel_attention_times(m, dev, x)
    peak = dev.flops("bf16")
    assert f == pytest.approx(forward_flops(m, x) / (peak * ak.rate(kernel, "forward", True, 128, m.seq)))
    assert b == pytest.approx(BACKWARD_OVER_FORWARD * forward_flops(m, x) /
                              (peak * ak.rate(kernel, "backward", True, 128, m.seq)))
    assert kernel_attention_times(m, sim.profile("h100-80gb-best-case"), x) is None
    assert kernel_attention_times(m, _stack_profile(kernel, "a100-80gb"), x) is None
    faster = sim.cost.layer.layer_times(m, _stack_profile("flash-attention-3"), x)
    assert sim.cost.layer.layer_times(m, _stack_profile("flash-attention-2"), x).forward > faster.forward
