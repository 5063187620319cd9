"""GPUs by name: peak dense FLOP/s per precision, memory and the links a training run uses.

Every number is from NVIDIA's datasheets and DGX user guides (cited beside it): what the vendor
states, never what software achieves on it; that is a device profile's (`sim.hardware.profile`,
docs/profiles.md). Units are SI:
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

@dataclass(frozen=True)
class GPU:
    """One GPU of a DGX-style node: what the planner needs to turn FLOPs and bytes into time."""
    name: str
    peak_flops: Mapping[str, float] = field(hash=False)  # dense tensor-core FLOP/s per precision
    memory: int                 # bytes of HBM
    hbm_bandwidth: float        # bytes/s
    nvlink_bandwidth: float | None = None   # bytes/s per direction, from this GPU to the others of its node
    network_bandwidth: float | None = None  # bytes/s per direction, from this GPU to other nodes (its own NIC)
    pcie_bandwidth: float | None = None     # bytes/s per direction to host memory (activation offloading)
    sms: int = 108              # streaming multiprocessors (A100: 108; H100 SXM5: 132), or a CPU's cores

    def __post_init__(self):
        for name in ("memory", "hbm_bandwidth", "sms"):
            if not getattr(self, name) > 0:
                raise ValueError(f"GPU {self.name}: {name} must be positive, got {getattr(self, name)!r}")
        for name in ("nvlink_bandwidth", "network_bandwidth", "pcie_bandwidth"):
            if getattr(self, name) is not None and not getattr(self, name) > 0:
                raise ValueError(f"GPU {self.name}: {name} must be positive or None, got {getattr(self, name)!r}")
        if not self.peak_flops or set(self.peak_flops) - set(PRECISIONS) or not all(v > 0 for v in self.peak_flops.values()):
            raise ValueError(f"GPU {self.name}: peak_flops needs positive values for precisions among {', '.join(PRECISIONS)}")

    def flops(self, precision: str) -> float:
        """Peak dense FLOP/s at `precision`."""
        if precision not in self.peak_flops:
            raise ValueError(f"precision must be one of {', '.join(self.peak_flops)} on {self.name}; got {precision!r}")
        return self.peak_flops[precision]


# NVIDIA A100 Tensor Core GPU datasheet (2021), SXM column: BF16/FP16 312 TFLOPS, TF32 156,
# FP32 19.5 (no tensor cores); NVLink 600 GB/s; PCIe Gen4 64 GB/s. 40GB: HBM2 1,555 GB/s;
# 80GB: HBM2e 2,039 GB/s. DGX A100 user guide: eight single-port ConnectX-6 200 Gb/s HDR
# InfiniBand NICs for compute traffic, one per GPU: 25 GB/s.
# SMs: NVIDIA A100 Tensor Core GPU Architecture whitepaper (2020), "108 SMs" on the A100.
_A100 = dict(sms=108, peak_flops={"bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "fp32": 19.5e12},
             nvlink_bandwidth=600 * GB / 2, network_bandwidth=200e9 / 8, pcie_bandwidth=64 * GB / 2)
# pcie_bandwidth (activation offloading, `sim.passes.offload`): the line rate per direction, PCIe Gen4
# x16 on the A100 SXM4 (datasheet: 64 GB/s both ways), Gen5 x16 on H100/H200 SXM (128 GB/s).
# Achieved figures exist but are not applied (docs/planner.md): nvbandwidth's SM-driven copies
# reach 25.1 GB/s host to device on an A100-SXM4-40GB (NVIDIA/nvbandwidth#42).
# NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022), Table 1, H100 SXM5: dense BF16/FP16
# 989.4 TFLOPS (1978.9 with sparsity), TF32 494.7, FP32 66.9 (no tensor cores). H100 datasheet,
# SXM column: HBM3 80 GB at 3.35 TB/s; NVLink 900 GB/s; PCIe Gen5 128 GB/s. DGX H100 user
# guide: eight ConnectX-7 400 Gb/s NDR InfiniBand ports for compute traffic, one per GPU.
# SMs: the same whitepaper, "132 SMs" on the H100 SXM5.
_H100 = dict(sms=132, peak_flops={"bf16": 989.4e12, "fp16": 989.4e12, "tf32": 494.7e12, "fp32": 66.9e12},
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
