"""sim.hardware.gpus: the datasheets' numbers, and one-line errors for what is not there."""
import pytest

import sim
from sim.hardware.gpus import GIB, GPU, GPUS, MIB, PRECISIONS, gpu


@pytest.mark.parametrize("name", sorted(GPUS))
def test_every_number_is_positive_and_the_tensor_cores_are_faster(name):
    g = gpu(name)
    assert g.name == name and sim.GPUS[name] is g
    assert all(g.flops(p) > 0 for p in PRECISIONS)
    assert g.flops("bf16") == g.flops("fp16") == 2 * g.flops("tf32") > g.flops("fp32")
    assert g.memory > 0 and g.hbm_bandwidth > 0 and g.pcie_bandwidth > 0
    assert g.nvlink_bandwidth > g.network_bandwidth > 0  # NVLink is the faster link


def test_peaks_are_the_datasheets():
    assert gpu("a100-40gb").flops("bf16") == gpu("a100-80gb").flops("bf16") == 312e12
    assert round(gpu("h100-80gb").flops("bf16") / 1e12) == 989
    assert gpu("h200").flops("bf16") == gpu("h100-80gb").flops("bf16")


# nvidia-smi's totals: modal-labs/modal-client#2797 (A100s, H100), NVIDIA/cuda-samples#311 (H200)
@pytest.mark.parametrize("name,mib", [("a100-40gb", 40960), ("a100-80gb", 81920), ("h100-80gb", 81559),
                                      ("h200", 143771)])
def test_memory_is_what_nvidia_smi_reports(name, mib):
    assert gpu(name).memory == mib * MIB


def test_memory_rounds_to_the_name():
    """The A100s hold exactly the GiB they are named for; the H100 and H200 a little less than
    their "80GB" and "141GB" read as GiB (79.6 and 140.4), so the names round up."""
    assert gpu("a100-40gb").memory == 40 * GIB and gpu("a100-80gb").memory == 80 * GIB
    assert 79.5 * GIB < gpu("h100-80gb").memory < 80 * GIB
    assert 140 * GIB < gpu("h200").memory < 141 * GIB


def test_nccl_latencies_are_tuning_cc_ring_simple():
    """NVIDIA/nccl src/graph/tuning.cc (2.20 on), Ring/Simple: hwLat NVLink 3.4 us, network 14.0 us;
    baseLat 8.4 us, in every best-case profile. A hop over the network is slower than one over NVLink."""
    for name in ("a100-80gb-best-case", "h100-80gb-best-case"):
        p = sim.profile(name)
        node, net = p.link("node"), p.link("network")
        assert (node.hop_latency, net.hop_latency, node.base_latency, net.base_latency) == (3.4e-6, 14.0e-6, 8.4e-6, 8.4e-6)


def test_links_per_gpu_per_direction():
    """DGX A100: a 200 Gb/s HDR NIC per GPU; DGX H100: 400 Gb/s NDR; NVLink 600 and 900 GB/s both ways."""
    assert gpu("a100-80gb").network_bandwidth == 25e9 and gpu("h100-80gb").network_bandwidth == 50e9
    assert gpu("a100-80gb").nvlink_bandwidth == 300e9 and gpu("h100-80gb").nvlink_bandwidth == 450e9


def test_unknown_names_are_refused_in_one_line():
    with pytest.raises(ValueError, match="unknown GPU 'v100'; known: a100-40gb, a100-80gb, h100-80gb, h200"):
        gpu("v100")
    with pytest.raises(ValueError, match="precision must be one of bf16, fp16, tf32, fp32 on h100-80gb; got 'fp8'"):
        gpu("H100-80GB").flops("fp8")
    with pytest.raises(ValueError, match="memory must be positive"):
        GPU("x", peak_flops=dict.fromkeys(PRECISIONS, 1.0), memory=0, hbm_bandwidth=1, nvlink_bandwidth=1,
            network_bandwidth=1, pcie_bandwidth=1)
    with pytest.raises(ValueError, match="peak_flops needs positive values"):
        GPU("x", peak_flops={"bf16": 0.0}, memory=1, hbm_bandwidth=1)
    with pytest.raises(ValueError, match="peak_flops needs positive values"):
        GPU("x", peak_flops={"fp8": 1.0}, memory=1, hbm_bandwidth=1)
    with pytest.raises(ValueError, match="nvlink_bandwidth must be positive or None"):
        GPU("x", peak_flops={"fp32": 1.0}, memory=1, hbm_bandwidth=1, nvlink_bandwidth=0)
