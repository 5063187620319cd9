"""What a training run holds in GPU memory besides activations: weights, gradients, optimizer state.

The optimizer is one of `OPTIMIZERS` (the names `exec.run --optimizer` takes), each with the
buffers it keeps per parameter in the master precision (fp32): SGD without momentum none,
SGD with momentum one (torch's `momentum_buffer`), Adam and AdamW two (`exp_avg`,
`exp_avg_sq`). Mixed-precision Adam keeps, per parameter, the 16-bit weight and its gradient and the fp32
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
# fp32 buffers each optimizer keeps per parameter (torch.optim's state); the first is the default
OPTIMIZERS = {"adamw": 2, "adam": 2, "sgd": 0, "sgd-momentum": 1}
DEFAULT_OPTIMIZER = "adamw"
_MASTER = 4  # fp32: the master weight (mixed precision) and each buffer
# bytes per parameter: (weight, gradient, master weight); sources in the module docstring
_STATES = {"bf16": (2, 4, _MASTER), "fp8": (2, 4, _MASTER), "fp16": (2, 2, _MASTER), "tf32": (4, 4, 0), "fp32": (4, 4, 0)}


def check_optimizer(optimizer: str) -> str:
    """`optimizer` if it is one of `OPTIMIZERS`, else ValueError naming them."""
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {optimizer!r}")
    return optimizer


def _optimizer_state(precision: str, optimizer: str) -> int:
    """Bytes of optimizer state per parameter: the master weight (mixed precision) and the buffers."""
    return _STATES[precision][2] + _MASTER * OPTIMIZERS[check_optimizer(optimizer)]


def state_bytes_per_param(precision: str, zero: int = 0, dp: int = 1,
                          optimizer: str = DEFAULT_OPTIMIZER) -> dict[str, float]:
    """Bytes per parameter of the weights, gradients and `optimizer`'s state on one GPU."""
    if precision not in _STATES:
        raise ValueError(f"precision must be one of {', '.join(_STATES)}; got {precision!r}")
    if zero not in ZERO_STAGES:
        raise ValueError(f"zero must be one of 0, 1, 2, 3 (ZeRO stage); got {zero!r}")
    if isinstance(dp, bool) or not isinstance(dp, int) or dp < 1:
        raise ValueError(f"dp must be a positive int, got {dp!r}")
    weight, grad = _STATES[precision][:2]
    opt = _optimizer_state(precision, optimizer)
    return {"weights": weight / (dp if zero >= 3 else 1), "grads": grad / (dp if zero >= 2 else 1),
            "optimizer": opt / (dp if zero >= 1 else 1)}


def optimizer_step_bytes(precision: str, optimizer: str = DEFAULT_OPTIMIZER) -> int:
    """Bytes a step of `optimizer` reads and writes per parameter it updates (one fused
    memory-bound kernel): it reads the gradient, the master weight and its buffers, and
    writes the master weight and the buffers, and the 16-bit weight (mixed precision); in
    fp32 and tf32 the weight is the master. AdamW in fp32: 4 + 2 (4 + 8) = 28; SGD: 4 + 2 x 4 = 12."""
    weight, grad = _STATES[precision][:2]
    opt = _optimizer_state(precision, optimizer)
    if precision in ("fp32", "tf32"):
        return grad + 2 * (weight + opt)          # read g, w, buffers; write w, buffers
    return grad + 2 * opt + weight                # read g, w32, buffers; write w32, buffers, w16
