"""GPUs by name: peak dense FLOP/s per precision, memory and the links a training run uses.

Every number is from NVIDIA's datasheets and DGX user guides (cited beside it): what the vendor
states, never what software achieves on it; that is a device profile's (`sim.hardware.profile`,
docs/profiles.md). Units are SI:
FLOP/s, bytes, bytes/s per direction, seconds. Datasheets give NVLink and PCIe bandwidth as
the sum of both directions (A100: "NVLink 600 GB/s"); here it is halved to one direction, which
is what a ring all-reduce or a pipeline send uses. Tensor-core peaks are dense: the datasheets'
"with sparsity" figures are twice these. `power` is the board's power limit (TDP) in watts at
which the datasheet states its peaks: the tensor-core peak is SMs x FLOPs per SM per clock x
the clock the board holds at that power, so a lower limit lowers the clock and the peak with it
(B200: 2.25 PFLOP/s dense BF16 on the 1,000 W HGX board, 2.5 on the 1,200 W GB200 one).
FP8 ("fp8") is the datasheets' dense FP8 peak: FP8 training's Linear GEMMs run at it times a
profile's FP8 efficiency (`sim.cost.fp8`); everything else of an FP8 run at the BF16 peak.

    >>> gpu("a100-80gb").flops("bf16") / 1e12
    312.0
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

PRECISIONS = ("bf16", "fp16", "tf32", "fp32")  # a run's precision, all of it (FP8 training: `sim.cost.fp8`)
PEAK_PRECISIONS = PRECISIONS + ("fp8",)        # what a datasheet's peak table and a profile's matmul table may hold
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
    power: float | None = None  # watts: the board's power limit (TDP) the peaks are stated at

    def __post_init__(self):
        for name in ("memory", "hbm_bandwidth", "sms"):
            if not getattr(self, name) > 0:
                raise ValueError(f"GPU {self.name}: {name} must be positive, got {getattr(self, name)!r}")
        for name in ("nvlink_bandwidth", "network_bandwidth", "pcie_bandwidth", "power"):
            if getattr(self, name) is not None and not getattr(self, name) > 0:
                raise ValueError(f"GPU {self.name}: {name} must be positive or None, got {getattr(self, name)!r}")
        if not self.peak_flops or set(self.peak_flops) - set(PEAK_PRECISIONS) or not all(v > 0 for v in self.peak_flops.values()):
            raise ValueError(f"GPU {self.name}: peak_flops needs positive values for precisions among {', '.join(PEAK_PRECISIONS)}")

    def flops(self, precision: str) -> float:
        """Peak dense FLOP/s at `precision`."""
        if precision not in self.peak_flops:
            raise ValueError(f"precision must be one of {', '.join(self.peak_flops)} on {self.name}; got {precision!r}")
        return self.peak_flops[precision]


# NVIDIA A100 Tensor Core GPU datasheet (2021), SXM column: BF16/FP16 312 TFLOPS, TF32 156,
# FP32 19.5 (no tensor cores), no FP8; NVLink 600 GB/s; PCIe Gen4 64 GB/s; max TDP 400 W.
# 40GB: HBM2 1,555 GB/s; 80GB: HBM2e 2,039 GB/s. DGX A100 user guide: eight single-port ConnectX-6 200 Gb/s HDR
# InfiniBand NICs for compute traffic, one per GPU: 25 GB/s.
# SMs: NVIDIA A100 Tensor Core GPU Architecture whitepaper (2020), "108 SMs" on the A100.
_A100 = dict(sms=108, peak_flops={"bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "fp32": 19.5e12},
             nvlink_bandwidth=600 * GB / 2, network_bandwidth=200e9 / 8, pcie_bandwidth=64 * GB / 2, power=400.0)
# pcie_bandwidth (activation offloading, `sim.passes.offload`): the line rate per direction, PCIe Gen4
# x16 on the A100 SXM4 (datasheet: 64 GB/s both ways), Gen5 x16 on H100/H200 SXM (128 GB/s).
# Achieved figures exist but are not applied (docs/planner.md): nvbandwidth's SM-driven copies
# reach 25.1 GB/s host to device on an A100-SXM4-40GB (NVIDIA/nvbandwidth#42).
# NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022), Table 1, H100 SXM5: dense BF16/FP16
# 989.4 TFLOPS (1978.9 with sparsity), FP8 1978.9 (3957.8 with sparsity), TF32 494.7, FP32 66.9
# (no tensor cores); "132 SMs". H100 datasheet, SXM column: HBM3 80 GB at 3.35 TB/s; NVLink
# 900 GB/s; PCIe Gen5 128 GB/s; "Up to 700W (configurable)". DGX H100 user guide: eight
# ConnectX-7 400 Gb/s NDR InfiniBand ports for compute traffic, one per GPU.
_H100 = dict(sms=132, peak_flops={"bf16": 989.4e12, "fp16": 989.4e12, "tf32": 494.7e12, "fp32": 66.9e12,
                                  "fp8": 1978.9e12},
             nvlink_bandwidth=900 * GB / 2, network_bandwidth=400e9 / 8, pcie_bandwidth=128 * GB / 2, power=700.0)
# The H100 of 96 GB HBM2e at 500 W in Meta's Grand Teton hosts (pytorch/torchtitan,
# benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md: "96GB HBM2e with 2.4 TB/sec peak memory
# bandwidth", "400 Gb/s per GPU", "the default 500W power limit, although tuning it up to 700W TDP
# can potentially provide further speedups"; 8 GPUs a host "fully connected with NVLink").
# NOT PUBLISHED: its peak FLOP/s at 500 W. torchtitan's notes (the async-TP benchmark above):
# "non-standard ... HBM2e and are limited to a lower TDP. The actual peak TFLOPs
# should be between SXM and NVL, and we don't know the exact value"; the H100 NVL (350-400 W)
# states 835.5 dense BF16 (H100 datasheet, NVL column: 1,671 TFLOPS with sparsity). The peaks below are
# the H100 SXM5's at 700 W, an upper bound (the number torchtitan divides by for its MFU); how
# far the 500 W limit lowers the sustained clock is not published, so a profile of this GPU
# must carry it in its achieved efficiencies. Not published either: its SM count (132 assumed,
# the SXM5's), its NVLink rate (900 GB/s assumed, the SXM5's: Grand Teton is an HGX-style
# 8-GPU NVSwitch baseboard), its PCIe (Gen5 assumed), its exact capacity (96 GB as stated,
# decimal; nvidia-smi's total not found).
_H100_96GB_500W = {**_H100, "power": 500.0}
# NVIDIA B200 (HGX B200 / DGX B200 at 1,000 W a GPU). Dense peaks per GPU, as NVIDIA's Blackwell
# technical brief lists the HGX B200 (G. Klockwood's table of it, glennklockwood.com/garden/
# processors/B200): BF16/FP16 2,250 TFLOPS (4,500 with sparsity), FP8 4,500 (9,000), TF32 1,100,
# FP32 80; the GB200's B200 at 1,200 W states BF16 2,500 dense: the same chip at a higher power
# limit and clock. DGX B200 datasheet: eight GPUs, 1,440 GB HBM3e in all (180 GB each) at 64 TB/s
# (8 TB/s each), fifth-generation NVLink 1.8 TB/s a GPU (14.4 TB/s in all), eight ConnectX-7
# 400 Gb/s for compute traffic. SMs: 148 (Mirage MPK, Table 1: "B200 148 SMs"). PCIe: Gen5 x16
# assumed (the DGX B200's hosts are Gen5; Klockwood lists Gen6 for the chip). Not checked against
# a measured run here.
_B200 = dict(sms=148, peak_flops={"bf16": 2250e12, "fp16": 2250e12, "tf32": 1100e12, "fp32": 80e12, "fp8": 4500e12},
             nvlink_bandwidth=1800 * GB / 2, network_bandwidth=400e9 / 8, pcie_bandwidth=128 * GB / 2, power=1000.0)

GPUS: dict[str, GPU] = {
    # memory: nvidia-smi's totals, A100 40GB 40960 MiB, A100 80GB 81920 MiB, H100 80GB 81559 MiB
    # (modal-labs/modal-client#2797), H200 143771 MiB (NVIDIA/cuda-samples#311), B200 183359 MiB
    # (public logs of `nvidia-smi --query-gpu=name,memory.total`: "NVIDIA B200, 183359 MiB")
    "a100-40gb": GPU("a100-40gb", memory=40960 * MIB, hbm_bandwidth=1555 * GB, **_A100),
    "a100-80gb": GPU("a100-80gb", memory=81920 * MIB, hbm_bandwidth=2039 * GB, **_A100),
    "h100-80gb": GPU("h100-80gb", memory=81559 * MIB, hbm_bandwidth=3350 * GB, **_H100),
    "h100-96gb-500w": GPU("h100-96gb-500w", memory=96 * GB, hbm_bandwidth=2400 * GB, **_H100_96GB_500W),
    # NVIDIA H200 Tensor Core GPU datasheet, SXM column: the H100's compute and links, with
    # "141 GB" of HBM3e (140.4 GiB) at 4.8 TB/s, "Up to 700W (configurable)"; DGX H200 user guide:
    # eight ConnectX-7 400 Gb/s, one per GPU.
    "h200": GPU("h200", memory=143771 * MIB, hbm_bandwidth=4800 * GB, **_H100),
    "b200": GPU("b200", memory=183359 * MIB, hbm_bandwidth=8000 * GB, **_B200),
}


def gpu(name: str) -> GPU:
    """The GPU called `name` (case as you like)."""
    key = name.strip().lower().replace("_", "-")
    if key not in GPUS:
        raise ValueError(f"unknown GPU {name!r}; known: {', '.join(GPUS)}")
    return GPUS[key]
