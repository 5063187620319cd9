"""A MoE layer's time in sim.cost.moe and sim.cost.layer: the experts' GEMMs are Experts.flops
split over ep, one expert is a dense MLP bit for bit, the all-to-alls are all_to_all_time's and
outside the passes, MLA's and head_dim's matmuls are the model's FLOPs."""
import dataclasses
import json

import pytest
from hypothesis import given, settings, strategies as st

from sim.cost.attention import fused_attention_times
from sim.cost.layer import Slice, check_timed, gemm_shapes, layer_times
from sim.cost.shapes import gemm_products
from sim.cost.moe import dense_width, expert_gemm_shapes, layer_kinds, received_copies, routed_parts, routed_times
from sim.hardware.kernels import gemm_flops, gemm_time
from sim.hardware.network import all_to_all_time, links_of
from sim.hardware.profile import from_dict, profile
from sim.hardware.topology import Group, one_node
from sim.model.attention import MLA
from sim.model.registry import find_model
from sim.model.transformer import Transformer

H100 = profile("h100-80gb-best-case")
SMALL = Transformer(layers=4, hidden=1024, heads=16, seq=512, vocab=1000, arch="llama", experts=8, top_k=2,
                    expert_ffn=1024, shared_experts=1)
MOE_FIELDS = dict(experts=None, top_k=None, expert_ffn=None, shared_experts=None, dense_layers=None,
                  load_imbalance=None, capacity_factor=None)


def _with_grouped(p, efficiency):
    data = json.loads(json.dumps(p.data))
    data["matmul"]["grouped_gemm_efficiency"] = {"value": efficiency, "source": "published", "citation": "test"}
    return from_dict(data, "test")


@pytest.mark.parametrize("ep,etp", [(1, 1), (2, 1), (4, 2), (8, 4)])
def test_balanced_expert_gemm_flops_are_experts_flops_split_over_ep(ep, etp):
    """The ep ranks route ep*T tokens; each rank's grouped GEMMs (all its copies, F/etp wide,
    gathered over etp) compute 1/ep of the layer's expert FLOPs of those tokens, its router
    the router's FLOPs of its own T."""
    m, x = SMALL, Slice(2, tp=2, sequence_parallel=True, ep=ep, expert_tp=etp)
    shapes = expert_gemm_shapes(m, x)
    t = x.tokens(m) // x.tp
    flops = m.moe.flops(ep * t, m.hidden)
    per_rank = sum(gemm_flops(*shapes[n]) for n in ("fc1", "fc2"))
    assert per_rank == (flops["experts_in"] + flops["experts_out"]) / ep
    assert gemm_flops(*shapes["router"]) == m.moe.flops(t, m.hidden)["router"]


@pytest.mark.parametrize("x", [Slice(1), Slice(2, tp=4, sequence_parallel=True), Slice(2, tp=4),
                               Slice(1, tp=2, sequence_parallel=True, precision="fp8")])
@pytest.mark.parametrize("shared", [0, 2])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_one_expert_is_the_dense_layer_of_its_width(x, shared, recompute):
    """E=1: nothing routed, no router, no all-to-all: the layer is a dense one whose MLP is its
    (1 + S) experts' width, to the bit."""
    m = Transformer(layers=4, hidden=1024, heads=16, seq=512, vocab=1000, arch="llama", experts=1,
                    expert_ffn=768, shared_experts=shared)
    dense = dataclasses.replace(m, ffn=(1 + shared) * 768, **MOE_FIELDS)
    assert dense_width(m) == (1 + shared) * 768 and routed_times(m, H100, x) is None
    assert layer_times(m, H100, x, recompute, moe=True) == layer_times(dense, H100, x, recompute)


def test_the_dense_layers_of_a_moe_model_are_the_dense_models():
    dense = dataclasses.replace(SMALL, **MOE_FIELDS)
    x = Slice(2, tp=2, sequence_parallel=True, ep=4)
    assert layer_times(SMALL, H100, x, moe=False) == layer_times(dense, H100, x)


def test_without_shared_experts_the_layer_has_only_the_attention_collectives():
    m = dataclasses.replace(SMALL, shared_experts=0)
    x = Slice(2, tp=4, sequence_parallel=True, ep=1)
    shapes = gemm_shapes(m, x, dense_width(m))
    assert "mlp_in" not in shapes and "mlp_out" not in shapes
    with_shared = layer_times(SMALL, H100, x, moe=True)
    assert layer_times(m, H100, x, moe=True).parts["collectives"] < with_shared.parts["collectives"]


@pytest.mark.parametrize("group", [None, Group(16, 8, 2, 0.5), Group(64, 8, 8, 1.0)])
@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_the_all_to_alls_are_all_to_all_time_of_the_copies_outside_the_passes(group, precision):
    """Dispatch and combine each move the k*T copies, hidden-wide, BF16 under FP8 too; the
    backward the same bytes; full recompute runs F's pair again; none of it in the passes."""
    ep = 16 if group is None else group.size
    m = dataclasses.replace(SMALL, experts=64, top_k=4)
    x = Slice(2, tp=2, sequence_parallel=True, precision=precision, ep=ep, ep_group=group)
    copies = m.moe.top_k * x.tokens(m) // x.tp
    one = all_to_all_time(links_of(H100), copies * m.hidden * 2, group or one_node(ep))
    lt, full = layer_times(m, H100, x, moe=True), layer_times(m, H100, x, "full", moe=True)
    assert one > 0 and lt.a2a_forward == 2 * one and lt.a2a_backward == 2 * one
    assert full.a2a_forward == 2 * one and full.a2a_backward == 4 * one
    assert sum(lt.parts.values()) == pytest.approx(lt.forward + lt.backward, rel=1e-12)  # no all-to-all in them


def test_no_all_to_all_at_ep_1_and_none_in_a_dense_layer():
    assert layer_times(SMALL, H100, Slice(1), moe=True).a2a_forward == 0.0
    lt = layer_times(SMALL, H100, Slice(1, ep=8), moe=False)
    assert (lt.a2a_forward, lt.a2a_backward) == (0.0, 0.0)


def test_the_passes_are_the_dense_part_plus_the_routed_part():
    """F, I and W: the attention and shared experts (a dense layer of width S*F) plus the
    routed part's F, I and W; B hides nothing more than the dense part's collectives."""
    m = SMALL
    x = Slice(2, tp=2, sequence_parallel=True, ep=4)
    dense = layer_times(dataclasses.replace(m, ffn=dense_width(m), **MOE_FIELDS), H100, x)
    r, lt = routed_times(m, H100, x), layer_times(m, H100, x, moe=True)
    assert lt.forward == pytest.approx(dense.forward + sum(r.forward.values()), rel=1e-12)
    assert lt.backward_input == pytest.approx(dense.backward_input + sum(r.backward_input.values()), rel=1e-12)
    assert lt.backward_weight == pytest.approx(dense.backward_weight + r.backward_weight, rel=1e-12)
    assert lt.backward == pytest.approx(dense.backward + sum(r.backward_input.values()) + r.backward_weight,
                                        rel=1e-12)
    full = layer_times(m, H100, x, "full", moe=True)
    assert full.recompute == pytest.approx(lt.forward, rel=1e-12)


@pytest.mark.parametrize("imbalance", [1.5, 2.0, 4.0])
def test_rank_load_scales_the_expert_gemms(imbalance):
    """The busiest rank's grouped GEMMs have rank_load times the balanced rows; with a
    grouped-GEMM efficiency their time is the plain GEMM's over it."""
    m = dataclasses.replace(SMALL, experts=64, top_k=4, seq=4096)
    x = Slice(4, ep=8)
    loaded = dataclasses.replace(m, load_imbalance=imbalance)
    load = loaded.moe.rank_load(8)
    assert load > 1
    rows, rows_loaded = expert_gemm_shapes(m, x)["fc1"][0], expert_gemm_shapes(loaded, x)["fc1"][0]
    assert rows_loaded == pytest.approx(rows * load, abs=1)
    assert received_copies(loaded, x) == received_copies(m, x) * load
    base, more = routed_times(m, H100, x), routed_times(loaded, H100, x)
    assert more.forward["gemm"] > base.forward["gemm"] and more.backward_weight > base.backward_weight
    assert more.all_to_all > base.all_to_all


@pytest.mark.parametrize("efficiency", [0.5, 0.8])
def test_grouped_gemm_efficiency_divides_the_expert_gemms_only(efficiency):
    m, x = SMALL, Slice(2, ep=4)
    slow = _with_grouped(H100, efficiency)
    assert slow.grouped_gemm_efficiency == efficiency and H100.grouped_gemm_efficiency is None
    a, b = routed_times(m, H100, x), routed_times(m, slow, x)
    router = gemm_time(H100, "bf16", *gemm_products(*expert_gemm_shapes(m, x)["router"])[0])  # a plain GEMM
    assert b.forward["gemm"] - router == pytest.approx((a.forward["gemm"] - router) / efficiency, rel=1e-12)
    dense = dataclasses.replace(m, **MOE_FIELDS)
    assert layer_times(dense, slow, x) == layer_times(dense, H100, x)


def test_tensor_parallelism_without_sequence_parallelism_is_refused_for_a_moe_layer():
    with pytest.raises(ValueError, match="needs sequence_parallel=True"):
        layer_times(SMALL, H100, Slice(1, tp=2, ep=2), moe=True)
    with pytest.raises(ValueError, match="moe=True on a dense model"):
        layer_times(dataclasses.replace(SMALL, **MOE_FIELDS), H100, Slice(1), moe=True)
    with pytest.raises(ValueError, match="does not divide"):
        layer_times(SMALL, H100, Slice(1, ep=3), moe=True)
    with pytest.raises(ValueError, match="expert_tp=3 does not divide"):
        layer_times(SMALL, H100, Slice(1, expert_tp=3), moe=True)


def test_slice_checks_its_expert_fields():
    with pytest.raises(ValueError, match="ep_group has 8 GPUs, ep is 4"):
        Slice(1, ep=4, ep_group=one_node(8))
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="must be a positive int"):
            Slice(1, ep=bad)
        with pytest.raises(ValueError, match="must be a positive int"):
            Slice(1, expert_tp=bad)
    assert Slice(1, ep=4).expert_group == one_node(4)


def test_check_timed_refuses_experts_unless_the_caller_times_moe_layers():
    check_timed(find_model("deepseek-v3-671b"), moe_layers=True)
    check_timed(dataclasses.replace(find_model("deepseek-v3-671b"), **MOE_FIELDS))  # MLA alone is timed
    with pytest.raises(ValueError, match="^expert parallelism is not modelled yet"):
        check_timed(SMALL)


@pytest.mark.parametrize("tp", [1, 2, 8])
@pytest.mark.parametrize("q_lora", [1536, None])
def test_mla_gemm_flops_are_the_models(tp, q_lora):
    """MLA's projections and core on one GPU: its FLOPs are Transformer.layer_flops', the
    down-projections whole on each tensor-parallel rank (duplicated), the rest split by tp."""
    mla = MLA(q_lora, 512, 64, 128, 128)
    m = Transformer(layers=4, hidden=7168, heads=128, seq=1024, vocab=1000, arch="llama", mla=mla)
    b = 2
    shapes, model = gemm_shapes(m, Slice(b, tp=tp)), m.layer_flops(b)
    duplicated = {"q_down", "kv_down"}
    for name, flops in model.items():
        per_gpu = flops if name in duplicated else flops / tp
        assert gemm_flops(*shapes[name]) == per_gpu, name


@pytest.mark.parametrize("name", ["qwen3-30b-a3b", "gpt-oss-20b", "deepseek-v3-671b"])
def test_head_dim_and_mla_widths_follow_the_model(name):
    """Qwen3 and GPT-OSS have heads x head_dim != hidden: the QKV, core and projection follow
    head_dim, the fused attention's FLOPs too; the dense MLP matmuls are the model's."""
    m = dataclasses.replace(find_model(name), **MOE_FIELDS)
    shapes, flops = gemm_shapes(m, Slice(1)), m.layer_flops(1)
    assert {n: gemm_flops(*s) for n, s in shapes.items()} == pytest.approx(flops, rel=1e-12)
    flash = dataclasses.replace(m, attention="flash")
    core = (flops["scores"] + flops["values"]) / 2  # the causal half
    expected = core / (H100.flops("bf16") * H100.attention_efficiency)
    assert fused_attention_times(flash, H100, Slice(1))[0] == pytest.approx(expected, rel=1e-12)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 8), st.sampled_from([1, 2, 4, 8, 16]), st.sampled_from([1.0, 1.5, 3.0]))
def test_the_routed_part_grows_with_the_tokens_and_the_busiest_rank_with_ep(b, ep, imbalance):
    m = dataclasses.replace(SMALL, experts=16, top_k=2, load_imbalance=imbalance)
    x, more = Slice(b, ep=ep), Slice(b + 1, ep=ep)
    one, two = routed_times(m, H100, x), routed_times(m, H100, more)
    assert sum(two.forward.values()) > sum(one.forward.values())
    assert sum(two.backward_input.values()) > sum(one.backward_input.values())
    assert two.all_to_all >= one.all_to_all
    if ep < 16:
        wider = routed_times(m, H100, Slice(b, ep=2 * ep))
        assert wider.forward["gemm"] >= one.forward["gemm"]  # fewer local experts: the busiest one weighs more
        assert wider.all_to_all > one.all_to_all              # more of the copies leave the rank


def test_layer_kinds_counts_the_dense_layers_first():
    v3 = find_model("deepseek-v3-671b")  # 61 layers, the first 3 dense
    assert layer_kinds(v3, 0, 61) == (3, 58) and layer_kinds(v3, 0, 2) == (2, 0)
    assert layer_kinds(v3, 2, 4) == (1, 3) and layer_kinds(v3, 30, 31) == (0, 31)
    assert layer_kinds(dataclasses.replace(SMALL, **MOE_FIELDS), 1, 3) == (3, 0)
    with pytest.raises(ValueError, match="not among the model's 61"):
        layer_kinds(v3, 60, 2)


@pytest.mark.parametrize("precision,ep,etp", [("bf16", 1, 1), ("bf16", 4, 1), ("fp8", 8, 2), ("bf16", 2, 4)])
def test_routed_parts_sum_to_the_routed_passes(precision, ep, etp):
    """routed_parts splits routed_times: F's and I's parts but the all-to-all sum to its passes,
    W's to its backward_weight; the router's GEMM is the T x h by h x E matmul; nothing routed,
    no parts."""
    x = Slice(2, tp=2, sequence_parallel=True, precision=precision, ep=ep, expert_tp=etp)
    r, parts = routed_times(SMALL, H100, x), routed_parts(SMALL, H100, x)
    for p, whole in (("F", sum(r.forward.values())), ("I", sum(r.backward_input.values())), ("W", r.backward_weight)):
        assert sum(v for k, v in parts[p].items() if k != "all_to_all") == pytest.approx(whole, rel=1e-12)
    assert parts["F"]["all_to_all"] == parts["I"]["all_to_all"] == r.all_to_all and parts["W"]["all_to_all"] == 0
    assert parts["F"]["router"] > gemm_time(H100, "bf16", *gemm_products(*expert_gemm_shapes(SMALL, x)["router"])[0])
    assert (parts["F"]["expert_tp"] > 0) == (etp > 1) and (parts["F"]["permutation"] > 0)
    assert routed_parts(dataclasses.replace(SMALL, experts=1, top_k=1), H100, x) == {}
