"""How long one device takes for the pieces of a training step: matmuls, memory-bound kernels, collectives.

Three physical models, each from its source, whose achieved rates come from a device profile
(`sim.device_profile`, docs/profiles.md): measured tables where the profile has them, else these.

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
- A collective runs as NCCL's ring (Patarasuk and Yuan 2009; NCCL's tuning model,
  src/graph/tuning.cc): an all-reduce over n ranks moves 2(n-1)/n of the bytes through each
  rank's link, a reduce-scatter or all-gather (n-1)/n; each of its 2(n-1) or (n-1) steps
  pays the link's hop latency, and the collective a base latency.

    >>> from sim.device_profile import profile
    >>> p = profile("a100-80gb-best-case")
    >>> round(gemm_time(p, "bf16", 8192, 8192, 8192) * 1e3, 2)   # ms, 1.1 TFLOP
    4.06
"""
from __future__ import annotations

import math

from .device_profile import DeviceProfile

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


def gemm_time(dev: DeviceProfile, precision: str, m: int, n: int, k: int, batch: int = 1) -> float:
    """Seconds for `batch` independent (m x k) @ (k x n) products at `precision`: the profile's
    measured table where it has the precision, else the waves of 256x128 output tiles over the
    SMs at their share of the achieved peak, or the bytes of the operands and result at the
    memory-bound bandwidth, whichever is longer."""
    if min(m, n, k, batch) <= 0:
        raise ValueError(f"GEMM sizes must be positive, got m={m}, n={n}, k={k}, batch={batch}")
    measured = dev.matmul_lookup(precision, m, n, k, batch)
    if measured is not None:
        return measured
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
    at the bandwidth the profile gives that class."""
    return nbytes / dev.memory_class_bandwidth(kind)


def collective_time(dev: DeviceProfile, op: str, nbytes: float, ranks: int, network: bool) -> float:
    """Seconds for a ring `op` ("all_reduce", "reduce_scatter", "all_gather") of `nbytes`
    (the whole buffer) over `ranks` devices, through the node's link or, if `network`, the
    network's (the slowest link of the ring): the profile's measured table where it has this
    (op, link, ranks), else NCCL's ring model. 0 on one rank."""
    if op not in COLLECTIVE_STEPS:
        raise ValueError(f"collective must be one of {', '.join(COLLECTIVE_STEPS)}; got {op!r}")
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    name = "network" if network else "node"
    measured = dev.collective_lookup(op, name, ranks, nbytes)
    if measured is not None:
        return measured
    link = dev.link(name)
    steps = COLLECTIVE_STEPS[op] * (ranks - 1)
    return link.base_latency + steps * link.hop_latency + steps / ranks * nbytes / link.bus_bandwidth


def p2p_time(dev: DeviceProfile, nbytes: float, network: bool) -> float:
    """Seconds for a point-to-point send of `nbytes` over one link: the profile's measured
    table, else latency + bytes / bandwidth."""
    name = "network" if network else "node"
    measured = dev.p2p_lookup(name, nbytes)
    if measured is not None:
        return measured
    link = dev.link(name)
    return link.p2p_latency + nbytes / link.p2p_bandwidth


def link_bandwidth(dev: DeviceProfile, network: bool) -> float:
    """Bytes/s of one send through a device's link, one way (the profile's p2p bandwidth)."""
    return dev.link("network" if network else "node").p2p_bandwidth


def link_latency(dev: DeviceProfile, network: bool) -> float:
    """Seconds of latency of one send through a device's link."""
    return dev.link("network" if network else "node").p2p_latency
