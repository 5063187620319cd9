"""How long one GPU takes for the pieces of a training step: matmuls, memory-bound kernels, collectives.

Three physical models, each from its source, and nothing fitted:

- A matmul (GEMM) runs on the tensor cores tile by tile: the output is cut into tiles, each
  streaming multiprocessor (SM) computes one tile at a time, and the tiles run in waves of
  one per SM. A GEMM whose tiles do not fill the last wave wastes the rest of it (tile and
  wave quantization: NVIDIA, "Matrix Multiplication Background User's Guide", Sec. "Dimension
  quantization effects"). Its time is that of its waves at the SMs' share of the achieved
  peak, or of its bytes at the HBM bandwidth, whichever is longer (the roofline; same guide,
  "Math and memory bounds"). Small micro-batches and thin tensor-parallel slices thus run
  below peak.
- An elementwise kernel (LayerNorm, softmax, GeLU, dropout, residual add) moves its bytes at
  the HBM bandwidth: its arithmetic intensity is far below the GPU's FLOPs-to-bytes ratio
  (same guide, Table 1: ReLU 0.25 FLOP/B against A100's 139 FLOP/B).
- A collective runs as NCCL's ring (Patarasuk and Yuan 2009; NCCL's tuning model,
  src/graph/tuning.cc): an all-reduce over n ranks moves 2(n-1)/n of the bytes through each
  rank's link, a reduce-scatter or all-gather (n-1)/n; each of its 2(n-1) or (n-1) steps
  pays a hop latency, and the collective a base latency.

    >>> from sim.gpus import gpu
    >>> g = gpu("a100-80gb")
    >>> round(gemm_time(g, "bf16", 8192, 8192, 8192) * 1e3, 2)   # ms, 1.1 TFLOP
    4.06
"""
from __future__ import annotations

import math

from .gpus import GPU, NCCL_BASE_LATENCY

BYTES = {"bf16": 2, "fp16": 2, "tf32": 4, "fp32": 4}
# The CUTLASS/cuBLAS tile of a large half-precision GEMM on A100 and H100: 256 x 128 outputs
# per thread block, one block per SM at a time (NVIDIA, "Matrix Multiplication Background
# User's Guide", Sec. "Dimension quantization effects": "the 256x128 tile ... the most
# efficient"; CUTLASS's default SM80 GEMM configuration).
TILE = (256, 128)
COLLECTIVE_STEPS = {"all_reduce": 2, "reduce_scatter": 1, "all_gather": 1}


def precision_bytes(precision: str) -> int:
    """Bytes of one element at `precision`."""
    try:
        return BYTES[precision]
    except KeyError:
        raise ValueError(f"precision must be one of {', '.join(BYTES)}; got {precision!r}") from None


def gemm_time(gpu: GPU, precision: str, m: int, n: int, k: int, batch: int = 1) -> float:
    """Seconds for `batch` independent (m x k) @ (k x n) products at `precision`: the waves
    of 256x128 output tiles over the SMs at their share of the achieved peak, or the bytes
    of the operands and result at the HBM bandwidth, whichever is longer."""
    if min(m, n, k, batch) <= 0:
        raise ValueError(f"GEMM sizes must be positive, got m={m}, n={n}, k={k}, batch={batch}")
    tiles = batch * math.ceil(m / TILE[0]) * math.ceil(n / TILE[1])
    waves = math.ceil(tiles / gpu.sms)
    per_sm = gpu.flops(precision) * gpu.gemm_efficiency / gpu.sms
    compute = waves * 2 * TILE[0] * TILE[1] * k / per_sm
    memory = batch * (m * k + k * n + m * n) * precision_bytes(precision) / (gpu.hbm_bandwidth * gpu.hbm_efficiency)
    return max(compute, memory)


def gemm_flops(m: int, n: int, k: int, batch: int = 1) -> float:
    """FLOPs of `batch` (m x k) @ (k x n) products: 2mnk each (a multiply and an add)."""
    return 2 * batch * m * n * k


def memory_time(gpu: GPU, nbytes: float) -> float:
    """Seconds for a memory-bound kernel that reads and writes `nbytes` in all, at the HBM
    bandwidth a streaming kernel achieves."""
    return nbytes / (gpu.hbm_bandwidth * gpu.hbm_efficiency)


def collective_time(gpu: GPU, op: str, nbytes: float, ranks: int, network: bool) -> float:
    """Seconds for a ring `op` ("all_reduce", "reduce_scatter", "all_gather") of `nbytes`
    (the whole buffer) over `ranks` GPUs, through NVLink or, if `network`, through each GPU's
    own network card (the slowest link of the ring). 0 on one rank."""
    if op not in COLLECTIVE_STEPS:
        raise ValueError(f"collective must be one of {', '.join(COLLECTIVE_STEPS)}; got {op!r}")
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    steps = COLLECTIVE_STEPS[op] * (ranks - 1)
    bandwidth = link_bandwidth(gpu, network)
    hop = gpu.network_latency if network else gpu.nvlink_latency
    return NCCL_BASE_LATENCY + steps * hop + steps / ranks * nbytes / bandwidth


def p2p_time(gpu: GPU, nbytes: float, network: bool) -> float:
    """Seconds for a point-to-point send of `nbytes` over one link (latency + bytes / bandwidth)."""
    return (gpu.network_latency if network else gpu.nvlink_latency) + nbytes / link_bandwidth(gpu, network)


def link_bandwidth(gpu: GPU, network: bool) -> float:
    """Bytes/s NCCL moves through one GPU's link, one way: NVLink's or the network card's line
    rate times the share NCCL achieves of it (its protocol overhead; `sim.gpus`)."""
    if network:
        return gpu.network_bandwidth * gpu.network_efficiency
    return gpu.nvlink_bandwidth * gpu.nvlink_efficiency
