"""sim.model.moe and sim.model.attention through sim.Transformer: mixture-of-experts and MLA parameters, FLOPs and activation bytes against the releases' published counts, closed forms and properties."""
import dataclasses

import pytest
from hypothesis import given, settings, strategies as st

import sim
from sim.model.attention import MLA
from sim.model.moe import Experts
from sim.model.registry import MODELS, MOE_PRESETS
from sim.model.transformer import Transformer

# ---- the presets against their published parameter counts -------------------------------------

# (name, total, active, whether the active count includes the input embedding, source). The
# sources count "active" two ways: with the whole embedding table (Mistral, Qwen) or without the
# input embedding, a lookup (OpenAI's model card, Table 1; DeepSeek's README_WEIGHTS.md: "36.6B
# activated, including 0.9B for the output head"). Grok-1 publishes its total only.
PUBLISHED = [
    ("mixtral-8x7b", "46.7", "12.9", True, "Mistral AI 2023, 'Mixtral of experts' (release post)"),
    ("mixtral-8x22b", "141", "39", True, "Mistral AI 2024, 'Cheaper, Better, Faster, Stronger' (release post)"),
    ("deepseek-v3-671b", "671", "36.6", False, "DeepSeek-V3 report, abstract; README_WEIGHTS.md"),
    ("deepseek-v2-236b", "236", "21", False, "DeepSeek-V2 report, abstract"),
    ("qwen3-30b-a3b", "30.5", "3.3", True, "Qwen/Qwen3-30B-A3B model card"),
    ("qwen3-235b-a22b", "235", "22", True, "Qwen/Qwen3-235B-A22B model card"),
    ("grok-1-314b", "314", None, True, "xai-org/grok-1 README.md"),
    ("gpt-oss-120b", "116.83", "5.13", False, "OpenAI 2025, gpt-oss model card, Table 1"),
    ("gpt-oss-20b", "20.91", "3.61", False, "OpenAI 2025, gpt-oss model card, Table 1"),
]


def tolerance(published: str) -> float:
    """Half a unit in the figure's last digit (its own rounding: 1.5 % of "3.3", 0.16 % of "314")
    plus 0.5 % for what the presets leave out (GPT-OSS's biases, Qwen3's q/k norms: under 0.1 %),
    at most 2 %."""
    decimals = len(published.split(".")[1]) if "." in published else 0
    return min(0.5 * 10 ** -decimals / float(published) + 0.005, 0.02)


@pytest.mark.parametrize("name,total,active,with_embedding,source", PUBLISHED, ids=[p[0] for p in PUBLISHED])
def test_presets_have_their_published_total_and_active_parameters(name, total, active, with_embedding, source):
    p = MODELS[name].params()
    assert p.total / 1e9 == pytest.approx(float(total), rel=tolerance(total)), source
    if active is not None:
        counted = p.active - (0 if with_embedding else p.embedding)
        assert counted / 1e9 == pytest.approx(float(active), rel=tolerance(active)), source


@pytest.mark.parametrize("name,billions", [("qwen3-30b-a3b", 29.9), ("qwen3-235b-a22b", 234)])
def test_qwen3_non_embedding_parameters_are_the_model_cards(name, billions):
    p = MODELS[name].params()
    assert (p.total - p.embedding - p.output) / 1e9 == pytest.approx(billions, rel=0.005)


def test_every_moe_preset_is_in_the_registry_and_estimated():
    """The planner times every MoE preset (its MoE layers with sim.cost.moe); at ep = 1 nothing is
    routed to another rank: no all-to-all."""
    assert set(MOE_PRESETS) <= set(MODELS) and len(MOE_PRESETS) == 9
    for name in MOE_PRESETS:
        e = sim.estimate(name, "h100-80gb", tp=1, pp=1, dp=1, micro_batch=1, global_batch=1)
        assert e.step_time > 0 and e.time_parts["expert_all_to_all"] == 0


def test_the_planner_searches_a_moe_model_over_ep_and_times_mla():
    from sim.plan.planner import search
    plan = search("qwen3-30b-a3b", "h100-80gb", 16, 64, tp=1, pp=4, micro_batch=1, schedules="1f1b",
                  recompute="full", zero=1, top=None)
    assert {p.config.ep for p in plan.points} == {1, 2, 4}  # the divisors of 128 experts that fold onto dp 4
    mla_only = Transformer(layers=4, hidden=512, heads=8, seq=128, vocab=1000, arch="llama",
                           mla=MLA(None, 64, 16, 32, 32))
    sim.cost.layer.layer_times(mla_only, "h100-80gb", sim.cost.layer.Slice(1))  # MLA's layer is timed
    assert sim.estimate(mla_only, "h100-80gb", tp=1, pp=1, dp=1, micro_batch=1, global_batch=1).step_time > 0
    from sim.plan.experts import layer_activations
    from sim.plan.layout import Layout
    act, w, _ = layer_activations(mla_only, Layout(), "bf16")
    assert w == act  # W keeps all of an MLA layer's activations (an upper bound: not counted yet)


# ---- closed forms: the router, the dense-layer split, Megatron's and DeepSeek's FLOPs ------------

def test_router_flops_and_parameters_are_their_closed_forms():
    """The router is one h x E matrix: 2bshE FLOPs forward, 6bshE a step (a weight matmul:
    F, I and W each), hE parameters, used by every token."""
    m, b = MODELS["mixtral-8x7b"], 3
    s, h, e = m.seq, m.hidden, m.experts
    assert m.layer_flops(b, moe=True)["router"] == 2 * b * s * h * e
    bare = dataclasses.replace(m, experts=1, top_k=1)  # one expert: no router, and one expert active
    parts, one = m.layer_flops(b, moe=True), bare.layer_flops(b, moe=True)
    assert parts["experts_in"] == 2 * one["experts_in"] and one["router"] == 0
    p = m.params()
    assert p.per_moe_layer - p.active_per_moe_layer == (e - m.top_k) * 3 * h * m.expert_ffn


def test_a_moe_step_is_three_forwards_of_its_matmuls_layer_by_layer():
    """Mixtral (every layer MoE): flops_per_iteration = 3 * layers * forward + 3 * logits, the
    forward a GQA attention (QKV 2bsh(h + 2h kv/a), scores and values 2bs^2h each, projection
    2bsh^2), the router 2bshE and k SwiGLU experts 6bshFk."""
    m, b = MODELS["mixtral-8x7b"], 2
    s, h, f, k, e = m.seq, m.hidden, m.expert_ffn, m.top_k, m.experts
    kv = h * m.kv_heads // m.heads
    forward = 2 * b * s * (h * (h + 2 * kv) + 2 * s * h + h * h + h * e + 3 * h * f * k)
    assert m.flops_per_iteration(b) == 3 * m.layers * forward + 3 * 2 * b * s * h * m.vocab


def test_deepseek_v3_has_three_dense_layers_then_58_moe_layers():
    m = MODELS["deepseek-v3-671b"]
    p, h = m.params(), m.hidden
    assert (m.dense_layers, m.moe_layers, p.moe_layers) == (3, 58, 58)
    attention = p.per_moe_layer - sum(m.moe.params(h).values()) - 2 * h   # two RMSNorm gains
    assert p.per_layer == attention + 3 * h * 18432 + 2 * h                  # the dense layers' MLP
    assert m.moe.params(h) == {"router": h * 256, "routed": 256 * 3 * h * 2048, "shared": 3 * h * 2048}
    assert p.total == p.embedding + 3 * p.per_layer + 58 * p.per_moe_layer + h + p.output
    dense, moe = (sum(m.pass_flops(1, x).values()) for x in (False, True))
    assert m.flops_per_iteration(1) == 3 * dense + 58 * moe + 3 * m.logit_flops(1)


@pytest.mark.parametrize("name,gflops", [("deepseek-v3-671b", 250), ("deepseek-v2-236b", 155)])
def test_model_flops_per_token_are_deepseeks(name, gflops):
    """Zhao et al. 2025 ("Insights into DeepSeek-V3", ISCA), Table 2: training GFLOPs a token at
    a 4096-token sequence, which Megatron's count (causal attention, no router) meets."""
    assert MODELS[name].model_flops_per_token() / 1e9 == pytest.approx(gflops, rel=0.005)


def test_model_flops_per_token_without_the_mask_is_the_iteration_count_less_the_router():
    for name in ("gpt3-175b", "llama3-8b", "mixtral-8x7b", "deepseek-v3-671b"):
        m = MODELS[name]
        router = 6 * m.moe_layers * m.hidden * (m.experts or 0) if m.experts and m.experts > 1 else 0
        assert m.model_flops_per_token(causal=False) == pytest.approx(m.flops_per_iteration(1) / m.seq - router,
                                                                      rel=1e-12)


# ---- multi-head latent attention ---------------------------------------------------------------

def test_mla_parameters_are_deepseek_v2s_formula():
    """DeepSeek-V2, Sec. 2.1.2-2.1.3: W^DKV d_c x d, W^UK and W^UV d_h n_h x d_c, W^DQ d'_c x d,
    W^UQ d_h n_h x d'_c, W^QR d^R_h n_h x d'_c, W^KR d^R_h x d, W^O d x d_h n_h; and the
    release's two latent RMSNorms (d_c + d'_c)."""
    m = MODELS["deepseek-v2-236b"]
    d, n_h, d_h, d_c, d_q, d_r = m.hidden, m.heads, 128, 512, 1536, 64
    formula = (d_c * d + 2 * d_h * n_h * d_c + d_q * d + d_h * n_h * d_q + d_r * n_h * d_q + d_r * d
               + d * d_h * n_h)
    assert m.mla.params(d, n_h, 1) == formula + d_c + d_q
    p = m.params()
    assert p.per_layer == formula + d_c + d_q + 3 * d * 12288 + 2 * d


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 64), st.sampled_from([None, 64, 1536]), st.integers(1, 1024), st.integers(1, 128),
       st.integers(1, 256), st.integers(1, 256), st.integers(1, 8192))
def test_mla_parameters_are_megatrons_count(heads, q_rank, kv_rank, rope, nope, v, h):
    """Megatron-LM's compute_weight_and_optimizer_memory (theoretical_memory_usage.py), RMSNorm."""
    mla = MLA(q_rank, kv_rank, rope, nope, v)
    q = h * heads * (nope + rope) if q_rank is None else q_rank * (h + heads * (nope + rope) + 1)
    megatron = q + kv_rank * (h + heads * (nope + v) + 1) + h * rope + heads * v * h
    assert mla.params(h, heads, 1) == megatron


def test_mla_flops_and_activations_are_their_matmuls_and_tensors():
    m, b = MODELS["deepseek-v3-671b"], 1
    s, h, a, t = m.seq, m.hidden, m.heads, m.seq * b
    f = m.layer_flops(b)
    assert f["q_down"] == 2 * t * h * 1536 and f["q_up"] == 2 * t * 1536 * a * 192
    assert f["kv_down"] == 2 * t * h * (512 + 64) and f["kv_up"] == 2 * t * 512 * a * (128 + 128)
    assert f["scores"] == 2 * b * s * s * a * 192 and f["values"] == 2 * b * s * s * a * 128
    dense_mlp = 2 * t * m.ffn * 3
    replicated, split = 4 * 2 * t * h + 2 * 2 * (1536 + 512) * t, 2 * t * a * (192 * 2 + 128 * 2)
    assert m.activation_bytes_per_layer(b) == replicated + split + dense_mlp + a * t * 4  # flash: fp32 LSE


# ---- a MoE layer's activations -----------------------------------------------------------------

def test_balanced_moe_activations_are_the_routers_the_permuted_tokens_and_the_experts():
    m, b = MODELS["deepseek-v3-671b"], 2
    t, h, e, k, f = m.seq * b, m.hidden, 256, 8, 2048
    assert m.moe_activation_bytes(b) == {"router": 5 * t * e, "permuted": 2 * k * t * h,
                                         "experts": k * t * (2 * 3 * f + 4), "shared": 2 * t * 3 * f}
    layer = m.activation_bytes_per_layer(b, moe=True)
    assert layer == m.activation_bytes_per_layer(b) - 2 * t * 3 * m.ffn + sum(m.moe_activation_bytes(b).values())
    with pytest.raises(ValueError, match="a MoE layer's bytes are counted at tp=1"):
        m.activation_bytes_per_layer(b, tp=2, moe=True)


def test_imbalance_and_capacity_set_the_busiest_ranks_tokens():
    x = Experts(experts=8, top_k=2, expert_ffn=64, shared_experts=0, matrices=3, load_imbalance=3.0)
    assert x.rank_load(1) == 1 and x.rank_load(8) == 3.0 and x.rank_load(4) == (1 + 3.0) / 2
    capped = dataclasses.replace(x, capacity_factor=1.25)
    assert capped.rank_load(8) == 1.25 and capped.rank_load(1) == 1
    dropping = dataclasses.replace(x, load_imbalance=1.0, capacity_factor=0.5)
    assert dropping.rank_load(1) == dropping.rank_load(8) == 0.5
    m = dataclasses.replace(MODELS["mixtral-8x7b"], load_imbalance=2.0)
    assert m.moe_activation_bytes(1, ep=8)["permuted"] == 2 * m.moe_activation_bytes(1, ep=1)["permuted"]
    with pytest.raises(ValueError, match=r"ep=3 does not divide the 8 experts; use ep in \[1, 2, 4, 8\]"):
        m.moe_activation_bytes(1, ep=3)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 64), st.integers(1, 8), st.floats(1, 8), st.one_of(st.none(), st.floats(0.1, 4)),
       st.integers(0, 6))
def test_the_busiest_rank_never_gets_more_than_its_bounds(experts, top_k, imbalance, capacity, ep_power):
    top_k, ep = min(top_k, experts), 2 ** ep_power
    imbalance = min(imbalance, experts / top_k)
    if experts % ep:
        return
    x = Experts(experts, top_k, 16, 0, 3, imbalance, capacity)
    load = x.rank_load(ep)
    assert load <= min(imbalance, ep, capacity or imbalance) + 1e-12
    assert load >= min(1.0, capacity or 1.0) - 1e-12


# ---- properties --------------------------------------------------------------------------------

@st.composite
def moe_shapes(draw):
    kv = draw(st.integers(1, 8))
    heads = kv * draw(st.integers(1, 4))
    experts = draw(st.integers(1, 64))
    return dict(layers=draw(st.integers(2, 48)), hidden=heads * draw(st.integers(1, 64)), heads=heads, kv_heads=kv,
                seq=draw(st.integers(1, 4096)), vocab=draw(st.integers(1, 200000)), ffn=draw(st.integers(1, 8192)),
                arch=draw(st.sampled_from(["gpt", "llama"])), experts=experts,
                top_k=draw(st.integers(1, experts)), expert_ffn=draw(st.integers(1, 4096)),
                shared_experts=draw(st.integers(0, 2)))


@settings(max_examples=150, deadline=None)
@given(moe_shapes())
def test_one_expert_of_the_dense_width_is_the_dense_model(shape):
    moe = Transformer(**shape | dict(experts=1, top_k=1, shared_experts=0, expert_ffn=shape["ffn"]))
    dense = Transformer(**{k: v for k, v in shape.items()
                           if k not in ("experts", "top_k", "expert_ffn", "shared_experts")})
    assert moe.params().total == moe.params().active == dense.params().total
    for recompute in ("none", "selective", "full"):
        assert moe.flops_per_iteration(2, recompute) == dense.flops_per_iteration(2, recompute)
        assert moe.activation_bytes_per_layer(1, recompute=recompute, moe=True) == pytest.approx(
            dense.activation_bytes_per_layer(1, recompute=recompute), rel=1e-12)
    assert moe.model_flops_per_token() == dense.model_flops_per_token()


@settings(max_examples=150, deadline=None)
@given(moe_shapes(), st.integers(1, 64))
def test_more_experts_grow_the_total_not_what_a_token_computes(shape, more):
    """At fixed k: total grows by the added experts (and their router columns), a token's
    FLOPs do not change, and its active parameters grow by the router's h a new expert only
    (the router reads every expert's logit); active <= total always."""
    m = Transformer(**shape)
    bigger = Transformer(**shape | dict(experts=shape["experts"] + more))
    p, q, h, n = m.params(), bigger.params(), m.hidden, m.moe_layers
    assert p.active <= p.total and q.active <= q.total
    router = h * more if m.experts > 1 else h * (shape["experts"] + more)
    assert q.total - p.total == n * (more * m.moe.expert_params(h) + router)
    assert q.active - p.active == n * router
    assert bigger.model_flops_per_token() == m.model_flops_per_token()


# ---- bad input ---------------------------------------------------------------------------------

BASE = dict(layers=4, hidden=64, heads=4, seq=16, vocab=100, arch="llama")


@pytest.mark.parametrize("kwargs,message", [
    (dict(top_k=2), "top_k describe a mixture of experts; give experts= too"),
    (dict(experts=0), "experts must be a positive int, got 0"),
    (dict(experts=4, top_k=5), "top_k 5 is more than the 4 experts"),
    (dict(experts=4, expert_ffn=0), "expert_ffn must be a positive int"),
    (dict(experts=4, shared_experts=-1), "shared_experts must be an int >= 0"),
    (dict(experts=4, dense_layers=4), "dense_layers must be an int from 0 to layers-1 = 3"),
    (dict(experts=8, top_k=2, load_imbalance=5.0), "load_imbalance .* between 1 and experts/top_k = 4"),
    (dict(experts=8, load_imbalance=0.5), "load_imbalance"),
    (dict(experts=8, capacity_factor=0), "capacity_factor must be a positive number"),
    (dict(experts=8, kernels="torch", arch="gpt", attention="flash"), "kernels='torch' lists exec's GPT"),
    (dict(head_dim=0), "head_dim must be a positive int"),
    (dict(mla=MLA(None, 8, 4, 8, 8), kv_heads=2), "mla gives the heads' widths"),
    (dict(mla="mla"), "mla must be a sim.model.attention.MLA or None"),
])
def test_bad_moe_fields_are_refused_in_one_line(kwargs, message):
    with pytest.raises(ValueError, match=message) as e:
        Transformer(**BASE | kwargs)
    assert "\n" not in str(e.value)


def test_bad_mla_ranks_and_dense_questions_are_refused():
    with pytest.raises(ValueError, match="MLA: kv_lora_rank must be a positive int, got 0"):
        MLA(None, 0, 4, 8, 8)
    with pytest.raises(ValueError, match="moe=True on a dense model"):
        MODELS["gpt3-175b"].layer_flops(1, moe=True)
    with pytest.raises(ValueError, match="a dense model .* has no MoE layer"):
        MODELS["gpt3-175b"].moe_activation_bytes(1)
