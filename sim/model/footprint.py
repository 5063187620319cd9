"""What a training run holds in GPU memory besides activations: weights, gradients, optimizer state.

Mixed-precision Adam keeps, per parameter, the 16-bit weight and its gradient and the fp32
master weight and the two fp32 Adam moments: 2 + 2 + 12 = 16 bytes (Rajbhandari et al. 2020,
"ZeRO", Sec. 3.1, K = 12). Megatron-LM accumulates bf16 gradients in fp32
(`--accumulate-allreduce-grads-in-fp32`, required with --bf16), so its gradient takes 4: 18
bytes. In fp32 the weight and gradient are 4 bytes each and no master copy is kept: 16; tf32
is fp32 storage with TF32 matmuls (NVIDIA's Ampere whitepaper), so it keeps the same 16.
FP8 training (Transformer Engine under Megatron-LM) keeps bf16's 18; its FP8 weight copies,
Linear weights only, are `sim.cost.fp8.weight_copy_bytes`.

ZeRO (Rajbhandari et al. 2020, Sec. 5) divides over the d data-parallel ranks the optimizer
state (stage 1), also the gradients (stage 2), also the weights (stage 3).

    >>> state_bytes_per_param("bf16", zero=0, dp=8)
    {'weights': 2.0, 'grads': 4.0, 'optimizer': 12.0}
    >>> state_bytes_per_param("fp16", zero=1, dp=4)["optimizer"]
    3.0
"""
from __future__ import annotations

ZERO_STAGES = (0, 1, 2, 3)
# bytes per parameter: (weight, gradient, optimizer state); sources in the module docstring
_STATES = {"bf16": (2, 4, 12), "fp8": (2, 4, 12), "fp16": (2, 2, 12), "tf32": (4, 4, 8), "fp32": (4, 4, 8)}


def state_bytes_per_param(precision: str, zero: int = 0, dp: int = 1) -> dict[str, float]:
    """Bytes per parameter of the weights, gradients and AdamW state on one GPU."""
    if precision not in _STATES:
        raise ValueError(f"precision must be one of {', '.join(_STATES)}; got {precision!r}")
    if zero not in ZERO_STAGES:
        raise ValueError(f"zero must be one of 0, 1, 2, 3 (ZeRO stage); got {zero!r}")
    if isinstance(dp, bool) or not isinstance(dp, int) or dp < 1:
        raise ValueError(f"dp must be a positive int, got {dp!r}")
    weight, grad, opt = _STATES[precision]
    return {"weights": weight / (dp if zero >= 3 else 1), "grads": grad / (dp if zero >= 2 else 1),
            "optimizer": opt / (dp if zero >= 1 else 1)}


def optimizer_step_bytes(precision: str) -> int:
    """Bytes an AdamW step reads and writes per parameter it updates (a memory-bound kernel):
    it reads the gradient, the master weight and both moments, and writes the three and the
    16-bit weight (mixed precision) or two fewer (fp32 and tf32: the weight is the master)."""
    weight, grad, opt = _STATES[precision]
    if precision in ("fp32", "tf32"):
        return grad + 2 * (weight + opt)          # read g, w, m, v; write w, m, v
    return grad + 2 * opt + weight                # read g, w32, m, v; write w32, m, v, w16
