"""GPUs by name: peak dense FLOP/s per precision, memory and the links a training run uses.

Every number is from NVIDIA's datasheets and DGX user guides (cited beside it). Units are SI:
FLOP/s, bytes, bytes/s per direction, seconds. Datasheets give NVLink and PCIe bandwidth as
the sum of both directions (A100: "NVLink 600 GB/s"); here it is halved to one direction, which
is what a ring all-reduce or a pipeline send uses. Tensor-core peaks are dense: the datasheets'
"with sparsity" figures are twice these.

    >>> gpu("a100-80gb").flops("bf16") / 1e12
    312.0
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

PRECISIONS = ("bf16", "fp16", "tf32", "fp32")
GB = 10 ** 9          # bandwidths: datasheets' GB/s are decimal
MIB = 2 ** 20         # capacities: as nvidia-smi totals them, in MiB (the datasheets' "80GB" is rounded)
GIB = 2 ** 30

# NCCL's own cost model (NVIDIA/nccl, src/graph/tuning.cc, Ring algorithm, Simple protocol):
# hwLat per hop 3.4 us over NVLink and 14.0 us over the network (NCCL 2.20 on; 9.6 us in the
# 2020 copy, NCCL 2.7/2.8), plus baseLat 8.4 us per collective (the same in both copies).
NCCL_BASE_LATENCY = 8.4e-6
_NVLINK_HOP, _NETWORK_HOP = 3.4e-6, 14.0e-6


@dataclass(frozen=True)
class GPU:
    """One GPU of a DGX-style node: what the planner needs to turn FLOPs and bytes into time."""
    name: str
    peak_flops: Mapping[str, float] = field(hash=False)  # dense tensor-core FLOP/s per precision
    memory: int                 # bytes of HBM
    hbm_bandwidth: float        # bytes/s
    nvlink_bandwidth: float     # bytes/s per direction, from this GPU to the others of its node
    network_bandwidth: float    # bytes/s per direction, from this GPU to other nodes (its own NIC)
    pcie_bandwidth: float       # bytes/s per direction to host memory (activation offloading)
    sms: int = 108              # streaming multiprocessors (A100: 108; H100 SXM5: 132)
    gemm_efficiency: float = 1.0  # achieved share of peak of the best-shaped large GEMM (see _A100, _H100)
    hbm_efficiency: float = 1.0   # achieved share of hbm_bandwidth of a streaming kernel
    nvlink_efficiency: float = 1.0   # NCCL's achieved bus bandwidth over NVLink / the line rate
    network_efficiency: float = 1.0  # the same over the network card
    nvlink_latency: float = _NVLINK_HOP
    network_latency: float = _NETWORK_HOP

    def __post_init__(self):
        for name in ("memory", "hbm_bandwidth", "nvlink_bandwidth", "network_bandwidth", "pcie_bandwidth",
                     "nvlink_latency", "network_latency", "sms", "gemm_efficiency", "hbm_efficiency",
                     "nvlink_efficiency", "network_efficiency"):
            if not getattr(self, name) > 0:
                raise ValueError(f"GPU {self.name}: {name} must be positive, got {getattr(self, name)!r}")
        if set(self.peak_flops) != set(PRECISIONS) or not all(v > 0 for v in self.peak_flops.values()):
            raise ValueError(f"GPU {self.name}: peak_flops needs a positive value for each of {', '.join(PRECISIONS)}")

    def flops(self, precision: str) -> float:
        """Peak dense FLOP/s at `precision`."""
        if precision not in self.peak_flops:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}; got {precision!r}")
        return self.peak_flops[precision]


# NVIDIA A100 Tensor Core GPU datasheet (2021), SXM column: BF16/FP16 312 TFLOPS, TF32 156,
# FP32 19.5 (no tensor cores); NVLink 600 GB/s; PCIe Gen4 64 GB/s. 40GB: HBM2 1,555 GB/s;
# 80GB: HBM2e 2,039 GB/s. DGX A100 user guide: eight single-port ConnectX-6 200 Gb/s HDR
# InfiniBand NICs for compute traffic, one per GPU: 25 GB/s.
# SMs: NVIDIA A100 Tensor Core GPU Architecture whitepaper (2020), "108 SMs" on the A100.
# gemm_efficiency: the Maximum Achievable Matmul FLOPS of a bf16 torch.matmul over a search of
# shapes, 271.2 of 312 TFLOP/s on an A100 SXM (S. Bekman, "Machine Learning Engineering",
# compute/accelerator/README.md, MAMF table: mean of 100 iterations, torch 2.6 + CUDA 12.6).
# hbm_efficiency: a streaming read kernel on an A100 80GB SXM reaches 1.80 of 2.04 TB/s, "88% of
# peak bandwidth" by Nsight Compute, and "the maximum memory bandwidth achieved by any kernel was
# around 90%" (forums.developer.nvidia.com/t/trouble-to-reach-peak-bandwidth-of-a100/339083).
# nvlink_efficiency: NCCL all-reduce bus bandwidth on 8 A100s "~230GB/s" of 300 GB/s line rate
# (S. Jeaugey, NCCL maintainer, NVIDIA/nccl-tests#149); network_efficiency: "24GB/s inter-node"
# per 200 Gb/s HDR NIC, line rate 25 GB/s (S. Jeaugey, NVIDIA/nccl#412).
_A100 = dict(sms=108, gemm_efficiency=271.2 / 312, hbm_efficiency=1.80 / 2.04, nvlink_efficiency=230 / 300,
             network_efficiency=24 / 25,
             peak_flops={"bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "fp32": 19.5e12},
             nvlink_bandwidth=600 * GB / 2, network_bandwidth=200e9 / 8, pcie_bandwidth=64 * GB / 2)
# pcie_bandwidth (activation offloading, `sim.offload`): the line rate per direction, PCIe Gen4
# x16 on the A100 SXM4 (datasheet: 64 GB/s both ways), Gen5 x16 on H100/H200 SXM (128 GB/s).
# Achieved figures exist but are not applied: nvbandwidth's SM-driven copies reach 25.1 GB/s
# host to device on an A100-SXM4-40GB (NVIDIA/nvbandwidth#42) and, on an H100 cluster, 35.2 host
# to device but 52.8 device to host (NVIDIA/nvbandwidth#24); they are SM copies, not the copy
# engines that cudaMemcpyAsync uses, and differ by direction, so the copies' times here are
# lower bounds.
# NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022), Table 1, H100 SXM5: dense BF16/FP16
# 989.4 TFLOPS (1978.9 with sparsity), TF32 494.7, FP32 66.9 (no tensor cores). H100 datasheet,
# SXM column: HBM3 80 GB at 3.35 TB/s; NVLink 900 GB/s; PCIe Gen5 128 GB/s. DGX H100 user
# guide: eight ConnectX-7 400 Gb/s NDR InfiniBand ports for compute traffic, one per GPU.
# SMs: the same whitepaper, "132 SMs" on the H100 SXM5. gemm_efficiency: MAMF on an H100 SXM,
# 794.5 of 989 TFLOP/s (Bekman, the same table; torch 2.7 + CUDA 12.6).
# hbm_efficiency: coalesced matrix loads at 2.8 of 3.35 TB/s, 84% (mikamirai.com/blog/gpu-memory-
# bandwidth, Nsight Compute on an H100 SXM5). nvlink_efficiency: "NCCL can get an effective NVLink
# bandwidth of 370GB/s" of the 450 GB/s line rate with the ring (S. Jeaugey, NVIDIA/nccl-tests#212);
# network_efficiency: CX-7 at NDR "should achieve up to 48-49GB/s per NIC" of 50 (NVIDIA/nccl-tests#267).
_H100 = dict(sms=132, gemm_efficiency=794.5 / 989, hbm_efficiency=2.8 / 3.35, nvlink_efficiency=370 / 450,
             network_efficiency=48 / 50,
             peak_flops={"bf16": 989.4e12, "fp16": 989.4e12, "tf32": 494.7e12, "fp32": 66.9e12},
             nvlink_bandwidth=900 * GB / 2, network_bandwidth=400e9 / 8, pcie_bandwidth=128 * GB / 2)

GPUS: dict[str, GPU] = {
    # memory: nvidia-smi's totals, A100 40GB 40960 MiB, A100 80GB 81920 MiB, H100 80GB 81559 MiB
    # (modal-labs/modal-client#2797), H200 143771 MiB (NVIDIA/cuda-samples#311)
    "a100-40gb": GPU("a100-40gb", memory=40960 * MIB, hbm_bandwidth=1555 * GB, **_A100),
    "a100-80gb": GPU("a100-80gb", memory=81920 * MIB, hbm_bandwidth=2039 * GB, **_A100),
    "h100-80gb": GPU("h100-80gb", memory=81559 * MIB, hbm_bandwidth=3350 * GB, **_H100),
    # NVIDIA H200 Tensor Core GPU datasheet, SXM column: the H100's compute and links, with
    # "141 GB" of HBM3e (140.4 GiB) at 4.8 TB/s; DGX H200 user guide: eight ConnectX-7 400 Gb/s,
    # one per GPU.
    "h200": GPU("h200", memory=143771 * MIB, hbm_bandwidth=4800 * GB, **_H100),
}


def gpu(name: str) -> GPU:
    """The GPU called `name` (case as you like)."""
    key = name.strip().lower().replace("_", "-")
    if key not in GPUS:
        raise ValueError(f"unknown GPU {name!r}; known: {', '.join(GPUS)}")
    return GPUS[key]
