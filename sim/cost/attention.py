"""The attention core as one fused kernel: timed from its FLOPs at the profile's attention efficiency, or read off the profile's measured calls of torch's kernel.

Two ways a profile times a fused attention kernel, which never writes the s^2 scores:

- `fused_attention_times`: FlashAttention-2's causal FLOP count at the profile's attention
  efficiency of the datasheet peak (a GPU profile's `attention.efficiency`, calibrated on
  measured runs; Megatron-LM's kernels, `Transformer(kernels="megatron")`);
- `measured_attention_times`: torch's `scaled_dot_product_attention` as the profile measured
  it at the shapes it has (`sim.hardware.attention_table`: exec's GPT, `kernels="torch"`).
  Its own work inside the call (the exponentials, the zeroed gradient buffers, the rows' dO.O:
  `SDPA_INSIDE`) is in the measured time, so the kernel model leaves those kernels out.

- `kernel_attention_times`: where the profile has no efficiency of its own, the kernel its stack
  runs (`Stack.attention_kernel`) at its published rates by sequence, head width and direction
  (`sim.hardware.attention_kernels`), on the die they were measured on.

Without any, `sim.cost.layer` times the core as its two matmuls (scores and values).
"""
from __future__ import annotations

from sim.hardware import attention_kernels
from sim.hardware.profile import DeviceProfile
from sim.model.transformer import Transformer

from .shapes import head_widths, width_ratios
from .slice import Slice

__all__ = ["CAUSAL_SHARE", "BACKWARD_OVER_FORWARD", "SDPA_INSIDE", "fused_attention_times", "kernel_attention_times",
           "measured_attention_times"]

# FlashAttention-2's benchmark count (Dao-AILab/flash-attention, benchmarks/benchmark_flash_attention.py,
# `flops`): a forward of 4 s^2 (heads x head dim) b FLOPs (the scores and values matmuls), halved
# when causal ("// (2 if causal else 1)"), and a backward of 2.5 times the forward's (it recomputes
# the scores: five matmuls of the forward's size less the causal half, "2.5 * f").
CAUSAL_SHARE = 0.5
BACKWARD_OVER_FORWARD = 2.5


def fused_attention_times(m: Transformer, dev: DeviceProfile, x: Slice) -> tuple[float, float]:
    """Seconds of one GPU's fused causal attention kernel (FlashAttention-2/3, cuDNN's fused
    attention) in F and in the backward: its FLOPs (FlashAttention-2's count above, the heads of
    this GPU's tensor-parallel slice) at the profile's attention efficiency of the datasheet peak;
    the backward runs BACKWARD_OVER_FORWARD times the forward's FLOPs at the same rate. It never
    writes the s^2 scores: the layer has no memory-bound kernel of them. (A profile without an
    attention efficiency times the kernel as its matmuls alone: `layer_times`.)"""
    forward = forward_flops(m, x) / (dev.flops(x.activation_precision) * dev.attention_efficiency)
    return forward, BACKWARD_OVER_FORWARD * forward


def forward_flops(m: Transformer, x: Slice) -> float:
    """FlashAttention-2's causal forward count for one GPU's heads of one micro-batch."""
    core = width_ratios(m)["core"]  # (d_qk + d_v) heads / 2h: 1 for MHA, other widths for head_dim and MLA
    return CAUSAL_SHARE * 4 * x.micro_batch * m.seq ** 2 * m.hidden * core / x.tp / x.cp  # cp: balanced, below


def kernel_attention_times(m: Transformer, dev: DeviceProfile, x: Slice) -> tuple[float, float] | None:
    """Seconds of the stack's causal attention kernel in F and in the backward: the FLOPs of
    `fused_attention_times` at the kernel's published forward and backward rates at the model's
    sequence and head width (`sim.hardware.attention_kernels.rate`) of the datasheet peak; None
    where the profile has an attention efficiency of its own, the datasheet is not of the die the
    rates were measured on, or the kernel has no published rates."""
    kernel = dev.stack.attention_kernel
    if dev.attention_efficiency is not None or dev.gpu.name not in attention_kernels.DIES:
        return None
    d = head_widths(m)[0]
    f, b = (attention_kernels.rate(kernel, way, True, d, m.seq) for way in ("forward", "backward"))
    if f is None or b is None:
        return None
    peak, flops = dev.flops(x.activation_precision), forward_flops(m, x)
    return flops / (peak * f), BACKWARD_OVER_FORWARD * flops / (peak * b)


# the kernel model's kernels that run inside torch's flash call (sim.cost.layer's torch lists)
SDPA_INSIDE = ("attention_exp", "attention_grad_fill", "attention_delta")


def measured_attention_times(m: Transformer, dev: DeviceProfile, x: Slice) -> tuple[float, float] | None:
    """Seconds of torch's causal `scaled_dot_product_attention` call in F and its backward for
    one micro-batch of this slice (micro-batch x heads / tp problems of the model's sequence and
    head width), read off the profile's attention table; None where the model does not run
    torch's kernels, the table has no row of its precision, or the slice splits the sequence
    (context parallelism: the core is `sim.cost.context`'s)."""
    if m.kernels != "torch" or x.cp != 1 or not dev.attention:
        return None
    return dev.attention.time(x.activation_precision, head_widths(m)[0], m.seq, x.micro_batch * m.heads / x.tp)
