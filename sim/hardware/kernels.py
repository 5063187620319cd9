"""How long one device takes for the compute of a training step: matmuls and memory-bound kernels.

Two physical models, each from its source, whose achieved rates come from a device profile
(`sim.hardware.profile`, docs/profiles.md): measured tables where the profile has them, else these.

- A matmul (GEMM) runs on the tensor cores tile by tile: the output is cut into tiles, each
  streaming multiprocessor (SM) computes one tile at a time, and the tiles run in waves of
  one per SM. A GEMM whose tiles do not fill the last wave wastes the rest of it (tile and
  wave quantization: NVIDIA, "Matrix Multiplication Background User's Guide", Sec. "Dimension
  quantization effects"). Its time is that of its waves at the SMs' share of the profile's
  matmul efficiency times the datasheet peak, or of its bytes at the profile's memory-bound
  bandwidth, whichever is longer (the roofline; same guide, "Math and memory bounds").
- An elementwise kernel (LayerNorm, softmax, GeLU, dropout, residual add) moves its bytes at
  the profile's memory-bound bandwidth of its class: its arithmetic intensity is far below the
  GPU's FLOPs-to-bytes ratio (same guide, Table 1: ReLU 0.25 FLOP/B against A100's 139 FLOP/B).
  On a CPU a kernel that evaluates a transcendental function per element (torch's erf GeLU, the
  exponentials of a softmax) is bound by that arithmetic instead: where the profile measured
  its compute-bound class, the kernel takes the longer of its bytes' time and its elements'
  time at that class's rate (`elementwise_time`, the roofline again).
- Collectives and sends: `sim.hardware.network` (NCCL's model over the cluster's links, `sim.hardware.topology`).

    >>> from sim.hardware.profile import profile
    >>> p = profile("a100-80gb-best-case")
    >>> round(gemm_time(p, "bf16", 8192, 8192, 8192) * 1e3, 2)   # ms, 1.1 TFLOP
    4.06
"""
from __future__ import annotations

import math

from .profile import LAYOUTS, DeviceProfile

BYTES = {"bf16": 2, "fp16": 2, "tf32": 4, "fp32": 4, "fp8": 1}

# The CUTLASS/cuBLAS tile of a large half-precision GEMM on A100 and H100: 256 x 128 outputs
# per thread block, one block per SM at a time (NVIDIA, "Matrix Multiplication Background
# User's Guide", Sec. "Dimension quantization effects": "the 256x128 tile ... the most
# efficient"; CUTLASS's default SM80 GEMM configuration).
TILE = (256, 128)


def precision_bytes(precision: str) -> int:
    """Bytes of one element at `precision` (an FP8 element: 1; what FP8 training keeps in
    which precision is `sim.cost.fp8`'s)."""
    try:
        return BYTES[precision]
    except KeyError:
        raise ValueError(f"precision must be one of {', '.join(BYTES)}; got {precision!r}") from None


def gemm_time(dev: DeviceProfile, precision: str, m: int, n: int, k: int, batch: int = 1,
              layout: str = "nn") -> float:
    """Seconds for `batch` independent (m x k) @ (k x n) products at `precision`, the operands
    read as `layout` says (`LAYOUTS`): the profile's measured table where it has the precision,
    else the waves of 256x128 output tiles over the SMs at their share of the achieved peak,
    or the bytes of the operands and result at the memory-bound bandwidth, whichever is longer."""
    if min(m, n, k, batch) <= 0:
        raise ValueError(f"GEMM sizes must be positive, got m={m}, n={n}, k={k}, batch={batch}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}; got {layout!r}")
    measured = dev.matmul_lookup(precision, m, n, k, batch, layout)
    if measured is not None:
        return measured
    if precision == "fp8":  # its efficiency is the profile's FP8 one, applied by the cost layer
        raise ValueError("an FP8 GEMM without the profile's fp8 matmul table is timed by sim.cost.fp8.linear_gemm_time")
    if dev.matmul_efficiency is None:
        raise ValueError(f"profile {dev.name!r} has no {precision} matmuls and no matmul efficiency")
    tiles = batch * math.ceil(m / TILE[0]) * math.ceil(n / TILE[1])
    waves = math.ceil(tiles / dev.gpu.sms)
    per_sm = dev.flops(precision) * dev.matmul_efficiency / dev.gpu.sms
    compute = waves * 2 * TILE[0] * TILE[1] * k / per_sm
    memory = batch * (m * k + k * n + m * n) * precision_bytes(precision) / dev.memory_bandwidth
    return max(compute, memory)


def gemm_flops(m: int, n: int, k: int, batch: int = 1) -> float:
    """FLOPs of `batch` (m x k) @ (k x n) products: 2mnk each (a multiply and an add)."""
    return 2 * batch * m * n * k


def memory_time(dev: DeviceProfile, nbytes: float, kind: str = "elementwise") -> float:
    """Seconds for a memory-bound kernel of class `kind` that reads and writes `nbytes` in all,
    at the bandwidth the profile gives that class (at those bytes, where it measured several)."""
    return dev.memory_class_time(kind, nbytes)


def elementwise_time(dev: DeviceProfile, nbytes: float, kind: str = "elementwise", elements: float = 0.0,
                     compute: str | None = None) -> float:
    """Seconds for an elementwise kernel that moves `nbytes` (class `kind`) and, if `compute`
    names a compute-bound class, evaluates its function on `elements`: the longer of the two
    (the roofline). A profile without that compute class leaves the memory time alone."""
    moved = memory_time(dev, nbytes, kind) if nbytes > 0 else 0.0
    done = dev.compute_class_time(compute, elements) if compute is not None else None
    return moved if done is None else max(moved, done)
