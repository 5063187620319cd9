"""sim.gpus: the datasheets' numbers, and one-line errors for what is not there."""
import pytest

import sim
from sim.gpus import GIB, GPU, GPUS, PRECISIONS, gpu


@pytest.mark.parametrize("name", sorted(GPUS))
def test_every_number_is_positive_and_the_tensor_cores_are_faster(name):
    g = gpu(name)
    assert g.name == name and sim.GPUS[name] is g
    assert all(g.flops(p) > 0 for p in PRECISIONS)
    assert g.flops("bf16") == g.flops("fp16") == 2 * g.flops("tf32") > g.flops("fp32")
    assert g.memory > 0 and g.hbm_bandwidth > 0 and g.pcie_bandwidth > 0
    assert g.nvlink_bandwidth > g.network_bandwidth > 0  # NVLink is the faster link
    assert 0 < g.nvlink_latency <= g.network_latency < 1e-4


def test_peaks_are_the_datasheets():
    assert gpu("a100-40gb").flops("bf16") == gpu("a100-80gb").flops("bf16") == 312e12
    assert round(gpu("h100-80gb").flops("bf16") / 1e12) == 989
    assert gpu("h200").flops("bf16") == gpu("h100-80gb").flops("bf16")


@pytest.mark.parametrize("name,gib", [("a100-40gb", 40), ("a100-80gb", 80), ("h100-80gb", 80), ("h200", 141)])
def test_memory_is_as_named(name, gib):
    assert gpu(name).memory == gib * GIB


def test_links_per_gpu_per_direction():
    """DGX A100: a 200 Gb/s HDR NIC per GPU; DGX H100: 400 Gb/s NDR; NVLink 600 and 900 GB/s both ways."""
    assert gpu("a100-80gb").network_bandwidth == 25e9 and gpu("h100-80gb").network_bandwidth == 50e9
    assert gpu("a100-80gb").nvlink_bandwidth == 300e9 and gpu("h100-80gb").nvlink_bandwidth == 450e9


def test_unknown_names_are_refused_in_one_line():
    with pytest.raises(ValueError, match="unknown GPU 'v100'; known: a100-40gb, a100-80gb, h100-80gb, h200"):
        gpu("v100")
    with pytest.raises(ValueError, match="precision must be one of bf16, fp16, tf32, fp32; got 'fp8'"):
        gpu("H100-80GB").flops("fp8")
    with pytest.raises(ValueError, match="memory must be positive"):
        GPU("x", peak_flops=dict.fromkeys(PRECISIONS, 1.0), memory=0, hbm_bandwidth=1, nvlink_bandwidth=1,
            network_bandwidth=1, pcie_bandwidth=1)
    with pytest.raises(ValueError, match="peak_flops needs a positive value"):
        GPU("x", peak_flops={"bf16": 1.0}, memory=1, hbm_bandwidth=1, nvlink_bandwidth=1,
            network_bandwidth=1, pcie_bandwidth=1)
