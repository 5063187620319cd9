"""The fused attention kernels a stack may run, each with its achieved rate by sequence, head width and direction from published kernel benchmarks (kind "published"), for `sim.cost.attention`.

A stack names its kernel (`sim.hardware.profile.Stack.attention_kernel`); the cost layer reads
the kernel's rate here where the profile gives no `attention.efficiency` of its own (a profile's
own figure, calibrated or published, comes first: the Megatron profiles keep theirs).

Every rate is the benchmark's TFLOP/s (FlashAttention's count: 4 s^2 d heads b a forward, the
backward 2.5 times it, halved when causal) as a share of the peak it ran against (H100 SXM5:
989.4 TFLOP/s BF16 dense), so that `rate` can be applied to any datasheet of the same die.
`rate` reads a kernel's points: piecewise linear in log sequence between measured ones (the
end values beyond), the nearest measured head width; where the kernel has no causal points,
the non-causal ones times its forward's causal/non-causal ratio where another kernel of the
same figure has both (FlashAttention-3's, the only causal panel transcribed), else 1.

Kernels: "flash-attention-3" (Hopper), "cudnn-sdpa" (cuDNN's fused attention, torch's
`SDPBackend.CUDNN_ATTENTION` and Transformer Engine's), "flash-attention-2" (torch's
`SDPBackend.FLASH_ATTENTION`), "triton-flash-2023" (the Triton flash attention of
flash-attn 1.x's `flash_attn_triton`, llm-foundry's 2023 `attn_impl: triton`: no published H100
benchmark, a profile calibrates its rate), "unfused" (scores, softmax and values as their own
kernels: `sim.cost.layer`'s unfused lists), "measured" (the profile's `attention.table`).

    >>> round(rate("flash-attention-3", "forward", False, 128, 8192) * H100_PEAK / 1e12)
    646
"""
from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["DIES", "H100_PEAK", "KERNELS", "Kernel", "rate"]

H100_PEAK = 989.4e12  # H100 SXM5 BF16 dense (NVIDIA H100 datasheet), the peak the figures ran against
# the datasheets of the die the figures were measured on (sim.hardware.gpus: the H100's compute die)
DIES = ("h100-80gb", "h100-96gb-500w", "h200")
_FA3 = ("J. Shah, G. Bikshandi, Y. Zhang, V. Thakkar, P. Ramani, T. Dao, FlashAttention-3 (arXiv:2407.08608, "
        "2024), Fig. 5-6: BF16 on H100 80GB SXM5, batch x sequence 16k tokens, hidden 2,048; bar labels as "
        "transcribed at subtext.edge.nugit.net/image/{}")
_SEQ = (1024, 2048, 4096, 8192, 16384)  # the figures' 1k-16k (their 512 bars differ between transcriptions)


@dataclass(frozen=True)
class Kernel:
    """One attention kernel: {(direction, causal, head_dim): ((seq, TFLOP/s), ...)} and where
    each series is from; no points: its rate comes from a profile (`attention.efficiency`)."""
    name: str
    what: str
    points: dict
    citations: dict


def _series(values, *, start=_SEQ):
    return tuple(zip(start, values))


# forward, no causal mask, head dim 128: e27582d2...; backward, no mask, head dim 128: f60142e2...;
# forward, head dim 64: 55f47a10...; forward, head dim 256: 662fef77...; forward head dim 128 with
# standard attention at 26-35 TFLOP/s (a third of the unmasked panel's): 4ec66909..., read as the
# causal panel (the paper's Fig. 5 pairs each head width with and without the causal mask; the
# transcription's title does not say it).
_PANELS = {
    ("forward", False, 128): ("e27582d2db385c9bac87ebc92343d2452b7c01d5d934e596c90172b346d00d42",
                              {"flash-attention-2": (350, 362, 368, 370, 370), "cudnn-sdpa": (574, 617, 609, 600, 595),
                               "flash-attention-3": (565, 625, 638, 646, 648)}),
    ("backward", False, 128): ("f60142e2221e7ea9f80b7017987fabedaaa04df4adeb1a9e7b0a3defac28a701",
                               {"flash-attention-2": (260, 291, 310, 318, 322), "cudnn-sdpa": (408, 465, 499, 518, 516),
                                "flash-attention-3": (424, 501, 542, 559, 561)}),
    ("forward", False, 64): ("55f47a106c25f22983b2741a7e8bcdbaec8521b6a583d130c6f92b94e0f65924",
                             {"flash-attention-2": (306, 318, 321, 322, 324), "cudnn-sdpa": (373, 395, 408, 412, 413),
                              "flash-attention-3": (392, 460, 476, 496, 497)}),
    ("forward", False, 256): ("662fef77d03ef90933e0bf349be79e2e8ba39c73aa1f09020aee8016df309aba",
                              {"flash-attention-2": (251, 278, 293, 297, 298), "cudnn-sdpa": (391, 450, 483, 497, 509),
                               "flash-attention-3": (427, 537, 612, 628, 642)}),
    ("forward", True, 128): ("4ec6690918d4df7a49f27715412cc425602eb075dfe3f7821cddc4a74f058ca1",
                             {"flash-attention-2": (260, 298, 319, 333, 335), "cudnn-sdpa": (410, 484, 518, 529, 539),
                              "flash-attention-3": (423, 521, 579, 602, 616)}),
}
_WHAT = {"flash-attention-3": "FlashAttention-3 (Hopper: warp-specialised, asynchronous)",
         "cudnn-sdpa": "cuDNN's fused attention (torch SDPBackend.CUDNN_ATTENTION, Transformer Engine)",
         "flash-attention-2": "FlashAttention-2 (torch SDPBackend.FLASH_ATTENTION)",
         "triton-flash-2023": "flash-attn 1.x's Triton kernel (llm-foundry attn_impl: triton, 2023)",
         "unfused": "scores, softmax and values as separate kernels",
         "measured": "the profile's own measured calls (`attention.table`: exec.profile_device)"}


def _kernels() -> dict[str, Kernel]:
    out = {}
    for name, what in _WHAT.items():
        pts = {key: _series(series[name]) for key, (_, series) in _PANELS.items() if name in series}
        cites = {key: _FA3.format(img) for key, (img, series) in _PANELS.items() if name in series}
        out[name] = Kernel(name, what, pts, cites)
    return out


KERNELS = _kernels()


def _along(points: tuple, seq: float) -> float:
    """TFLOP/s at `seq`: piecewise linear in log sequence, the ends' values beyond."""
    if seq <= points[0][0]:
        return points[0][1]
    for (s0, r0), (s1, r1) in zip(points, points[1:]):
        if seq <= s1:
            return r0 + (r1 - r0) * (math.log(seq) - math.log(s0)) / (math.log(s1) - math.log(s0))
    return points[-1][1]


def rate(kernel: str, direction: str, causal: bool, head_dim: float, seq: float) -> float | None:
    """The kernel's achieved share of the H100 peak at this shape (see the module's docstring);
    None where the kernel has no published points (its rate is a profile's)."""
    if kernel not in KERNELS:
        raise ValueError(f"attention kernel must be one of {', '.join(KERNELS)}; got {kernel!r}")
    if direction not in ("forward", "backward"):
        raise ValueError(f"direction must be 'forward' or 'backward'; got {direction!r}")
    pts = KERNELS[kernel].points
    widths = sorted({d for dd, _, d in pts if dd == direction})
    if not widths:
        return None
    d = min(widths, key=lambda w: (abs(math.log(w) - math.log(head_dim)), w))
    key = (direction, causal, d)
    if key in pts:
        return _along(pts[key], seq) * 1e12 / H100_PEAK
    plain = _along(pts[(direction, False, d)], seq)
    if causal and ("forward", True, 128) in pts and ("forward", False, 128) in pts:
        plain *= _along(pts[("forward", True, 128)], seq) / _along(pts[("forward", False, 128)], seq)
    return plain * 1e12 / H100_PEAK
