"""sim.hardware.gpus: the datasheets' numbers, and one-line errors for what is not there."""
import pytest

import sim
from sim.hardware.gpus import GIB, GPU, GPUS, MIB, PRECISIONS, gpu


@pytest.mark.parametrize("name", sorted(GPUS))
def test_every_number_is_positive_and_the_tensor_cores_are_faster(name):
    g = gpu(name)
    assert g.name == name and sim.GPUS[name] is g
    assert all(g.flops(p) > 0 for p in PRECISIONS)
    assert g.flops("bf16") == g.flops("fp16") > g.flops("tf32") > g.flops("fp32")
    assert g.flops("tf32") in (g.flops("bf16") / 2, 1100e12)  # B200: 1,100 of 2,250
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
    with pytest.raises(ValueError, match="unknown GPU 'v100'; known: a100-40gb, a100-80gb, h100-80gb, h100-96gb-500w, "
                                         "h200, b200"):
        gpu("v100")
    with pytest.raises(ValueError, match="precision must be one of bf16, fp16, tf32, fp32 on a100-80gb; got 'fp8'"):
        gpu("A100-80GB").flops("fp8")
    with pytest.raises(ValueError, match="memory must be positive"):
        GPU("x", peak_flops=dict.fromkeys(PRECISIONS, 1.0), memory=0, hbm_bandwidth=1, nvlink_bandwidth=1,
            network_bandwidth=1, pcie_bandwidth=1)
    with pytest.raises(ValueError, match="peak_flops needs positive values"):
        GPU("x", peak_flops={"bf16": 0.0}, memory=1, hbm_bandwidth=1)
    with pytest.raises(ValueError, match="peak_flops needs positive values"):
        GPU("x", peak_flops={"fp4": 1.0}, memory=1, hbm_bandwidth=1)
    with pytest.raises(ValueError, match="nvlink_bandwidth must be positive or None"):
        GPU("x", peak_flops={"fp32": 1.0}, memory=1, hbm_bandwidth=1, nvlink_bandwidth=0)


def test_fp8_peaks_are_twice_bf16_where_the_gpu_has_fp8():
    """H100 whitepaper, Table 1: FP8 1,978.9 dense against BF16 989.4; B200 (HGX, 1,000 W): 4,500 and
    2,250. The A100 has no FP8 tensor cores."""
    for name in ("h100-80gb", "h100-96gb-500w", "h200", "b200"):
        assert gpu(name).flops("fp8") == pytest.approx(2 * gpu(name).flops("bf16"), rel=1e-4)  # the tables round
    assert "fp8" not in gpu("a100-80gb").peak_flops


def test_power_limits_are_the_datasheets():
    """A100 SXM 400 W, H100 and H200 SXM 700 W, B200 1,000 W (HGX), the Grand Teton H100 500 W
    (torchtitan's benchmark notes)."""
    assert {n: g.power for n, g in GPUS.items()} == {"a100-40gb": 400, "a100-80gb": 400, "h100-80gb": 700,
                                                     "h100-96gb-500w": 500, "h200": 700, "b200": 1000}


def test_the_500w_h100_is_the_h100_with_hbm2e():
    """96 GB of HBM2e at 2.4 TB/s (torchtitan); its peak at 500 W is not published, so it carries the
    SXM5's as an upper bound, and its links are the SXM5's."""
    h, v = gpu("h100-80gb"), gpu("h100-96gb-500w")
    assert v.memory == 96e9 and v.hbm_bandwidth == 2.4e12 < h.hbm_bandwidth
    assert v.peak_flops == h.peak_flops and v.nvlink_bandwidth == h.nvlink_bandwidth and v.sms == h.sms


def test_b200_per_gpu_is_the_dgx_b200_over_eight():
    """DGX B200: 1,440 GB and 64 TB/s of HBM3e over eight GPUs, NVLink 1.8 TB/s a GPU both ways."""
    b = gpu("b200")
    assert b.hbm_bandwidth == 64e12 / 8 and b.nvlink_bandwidth == 1.8e12 / 2
    assert b.memory == 183359 * MIB and 179 * GIB < b.memory < 180 * GIB  # the DGX's "180 GB" a GPU, as GiB


def test_a_gpu_without_a_profile_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="GPU 'b200' has a datasheet but no device profile yet: give sim.load_profile"):
        sim.profile("b200")

