"""sim.model.transformer: parameters, FLOPs and activation bytes against the papers' closed forms,
tables and worked numbers (Narayanan et al. 2021; Korthikanti et al. 2022; Qi et al. 2024)."""
import dataclasses

import pytest
from hypothesis import given, settings, strategies as st

import sim
from sim.model.registry import MODELS, find_model as model
from sim.model.transformer import Transformer, llama_ffn

V, S = 51200, 2048


@st.composite
def gpt_shapes(draw):
    """A GPT-style shape as the papers' closed forms take it: ffn=4h, no grouped-query attention."""
    heads = draw(st.integers(1, 64))
    return Transformer(layers=draw(st.integers(1, 128)), hidden=heads * draw(st.integers(1, 256)), heads=heads,
                       seq=draw(st.integers(1, 8192)), vocab=draw(st.integers(1, 256000)))


@st.composite
def any_shapes(draw):
    """Any shape: either arch, any MLP width, grouped-query attention."""
    kv = draw(st.integers(1, 16))
    heads = kv * draw(st.integers(1, 8))
    return Transformer(layers=draw(st.integers(1, 96)), hidden=heads * draw(st.integers(1, 128)), heads=heads,
                       seq=draw(st.integers(1, 8192)), vocab=draw(st.integers(1, 256000)),
                       ffn=draw(st.integers(1, 65536)), kv_heads=kv, arch=draw(st.sampled_from(["gpt", "llama"])))


# ---- parameters ------------------------------------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(gpt_shapes())
def test_parameters_are_megatrons_closed_form(m):
    """Narayanan et al. 2021, Eq. 2: P = 12lh^2(1 + 13/(12h) + (V+s)/(12lh)), which is
    embedding + layers; the final LayerNorm (2h) is outside it and the output layer is tied."""
    l, h, p = m.layers, m.hidden, m.params()
    assert p.embedding + l * p.per_layer == 12 * l * h * h + 13 * l * h + (m.vocab + m.seq) * h
    assert p.embedding + l * p.per_layer == pytest.approx(
        12 * l * h ** 2 * (1 + 13 / (12 * h) + (m.vocab + m.seq) / (12 * l * h)), rel=1e-12)
    assert p.tied and p.output == 0 and p.final_norm == 2 * h
    assert p.total == p.embedding + l * p.per_layer + 2 * h


# Narayanan et al. 2021, Table 1: "Number of parameters (billion)", one decimal.
NARAYANAN_TABLE_1 = {"1.7b": 1.7, "3.6b": 3.6, "7.5b": 7.5, "18.4b": 18.4, "39.1b": 39.1, "76.1b": 76.1,
                     "145.6b": 145.6, "310.1b": 310.1, "529.6b": 529.6, "1t": 1008.0}


@pytest.mark.parametrize("size,billions", NARAYANAN_TABLE_1.items())
def test_narayanan_table_1_parameter_counts(size, billions):
    p = model(f"megatron-{size}").params()
    eq2 = p.embedding + p.layers * p.per_layer  # what the paper counts
    assert abs(eq2 / 1e9 - billions) <= 0.05 + 1e-9, eq2 / 1e9


@pytest.mark.parametrize("name,billions", [("korthikanti-22b", 22), ("korthikanti-175b", 175),
                                           ("korthikanti-530b", 530), ("korthikanti-1t", 1000),
                                           ("gpt3-175b", 175)])
def test_korthikanti_table_3_and_gpt3_sizes(name, billions):
    """Korthikanti et al. 2022, Table 3 and Brown et al. 2020 name the sizes to two or three digits."""
    assert model(name).params().total / 1e9 == pytest.approx(billions, rel=0.01)


# Elements in the released Llama 2 checkpoints (transformers' num_parameters() of meta-llama/Llama-2-*-hf);
# the Llama 2 paper, Table 1, rounds them to 7B, 13B and 70B.
@pytest.mark.parametrize("name,count", [("llama2-7b", 6_738_415_616), ("llama2-13b", 13_015_864_320),
                                        ("llama2-70b", 68_976_648_192)])
def test_llama2_parameter_counts_are_the_checkpoints(name, count):
    assert model(name).params().total == count


def test_llama2_70b_layer_is_its_checkpoints_tensors():
    """One layer of Llama 2 70B, tensor by tensor (wq, wk, wv, wo, w1, w2, w3, two RMSNorm gains)."""
    h, kv, f = 8192, 8 * 128, 28672
    shapes = [(h, h), (kv, h), (kv, h), (h, h), (f, h), (h, f), (f, h), (h, 1), (h, 1)]
    assert model("llama2-70b").params().per_layer == sum(r * c for r, c in shapes)
    assert not model("llama2-70b").params().tied


@pytest.mark.parametrize("name,hidden,multiple_of,multiplier", [
    ("llama2-7b", 4096, 256, 1.0), ("llama2-13b", 5120, 256, 1.0), ("llama2-70b", 8192, 4096, 1.3)])
def test_llama2_mlp_widths_follow_llamas_rule(name, hidden, multiple_of, multiplier):
    assert model(name).ffn == llama_ffn(hidden, multiple_of, multiplier)


# ---- FLOPs -----------------------------------------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(gpt_shapes(), st.integers(1, 4096))
def test_flops_per_iteration_is_narayanan_eq_3(m, batch):
    B, s, l, h, v = batch, m.seq, m.layers, m.hidden, m.vocab
    full = 96 * B * s * l * h ** 2 * (1 + s / (6 * h) + v / (16 * l * h))   # Eq. 3, full recompute
    none = 72 * B * s * l * h ** 2 * (1 + s / (6 * h) + v / (12 * l * h))   # the same without it
    assert m.flops_per_iteration(batch, "full") == pytest.approx(full, rel=1e-12)
    assert m.flops_per_iteration(batch, "none") == pytest.approx(none, rel=1e-12)
    logits = 6 * B * s * h * v  # forward and backward of the logit layer, never recomputed
    layers_full, layers_none = (m.flops_per_iteration(batch, r) - logits for r in ("full", "none"))
    assert layers_full / layers_none == pytest.approx(4 / 3, rel=1e-12)
    selective = m.flops_per_iteration(batch, "selective")
    assert selective - m.flops_per_iteration(batch, "none") == pytest.approx(l * 4 * B * s * s * h, rel=1e-12)


@settings(max_examples=200, deadline=None)
@given(gpt_shapes(), st.integers(1, 64))
def test_layer_flops_are_narayanans_parts_and_qi_table_1(m, b):
    s, h = m.seq, m.hidden
    parts = m.layer_flops(b)
    assert parts["qkv"] == 6 * b * s * h * h and parts["projection"] == 2 * b * s * h * h
    assert parts["mlp_in"] + parts["mlp_out"] == 16 * b * s * h * h
    assert parts["scores"] == parts["values"] == 2 * b * s * s * h
    assert sum(parts.values()) == 24 * b * s * h * h + 4 * b * s * s * h
    p = m.pass_flops(b)  # Qi et al. 2024, Table 1
    assert (p["F"], p["I"], p["W"]) == (s * b * h * (24 * h + 4 * s), s * b * h * (24 * h + 8 * s), 24 * s * b * h * h)


@settings(max_examples=300, deadline=None)
@given(any_shapes(), st.integers(1, 64))
def test_a_layers_backward_is_twice_its_forward_for_any_shape(m, b):
    p = m.pass_flops(b)
    assert p["F"] + p["I"] + p["W"] == pytest.approx(3 * sum(m.layer_flops(b).values()), rel=1e-12)
    assert p["W"] <= p["F"] <= p["I"]
    assert m.recompute_flops(b, "full") == p["F"] and m.recompute_flops(b, "none") == 0


# ---- activations -----------------------------------------------------------------------------

@settings(max_examples=300, deadline=None)
@given(gpt_shapes(), st.integers(1, 16), st.sampled_from([1, 2, 4, 8, 16]))
def test_activations_are_korthikanti_table_2(m, b, t):
    s, h, a = m.seq, m.hidden, m.heads
    sbh = s * b * h
    act = m.activation_bytes_per_layer
    rows = {  # Korthikanti et al. 2022, Table 2
        (False, "none"): sbh * (10 + 24 / t + 5 * a * s / (h * t)),
        (True, "none"): sbh * (34 / t + 5 * a * s / (h * t)),
        (False, "selective"): sbh * (10 + 24 / t),
        (True, "selective"): sbh * 34 / t,
        (False, "full"): 2 * sbh, (True, "full"): 2 * sbh,
    }
    for (sp, recompute), want in rows.items():
        assert act(b, tp=t, sequence_parallel=sp, recompute=recompute) == pytest.approx(want, rel=1e-12)
    assert act(b) == pytest.approx(sbh * (34 + 5 * a * s / h), rel=1e-12)  # no parallelism


@settings(max_examples=200, deadline=None)
@given(gpt_shapes(), st.integers(1, 16), st.sampled_from([1, 2, 4, 8, 16]))
def test_w_activations_are_qi_table_1_split_as_korthikanti_splits(m, b, t):
    sbh = m.seq * b * m.hidden
    w = m.w_activation_bytes_per_layer
    assert w(b) == 32 * sbh  # Qi et al. 2024, Table 1
    assert w(b, tp=t) == pytest.approx(sbh * (8 + 24 / t), rel=1e-12)
    assert w(b, tp=t, sequence_parallel=True) == pytest.approx(32 * sbh / t, rel=1e-12)
    # what W needs is part of what the backward needs: never more than the layer keeps without recompute
    assert w(b, tp=t) <= m.activation_bytes_per_layer(b, tp=t)


@pytest.mark.parametrize("name,attention_term,reduction", [("gpt3-175b", 80, 0.70), ("korthikanti-530b", 64, 0.65)])
def test_korthikantis_worked_numbers(name, attention_term, reduction):
    """Korthikanti et al. 2022, Sec. 4.3: 5as/h is 80 for GPT-3 and 64 for MT-NLG, and with
    tensor and sequence parallelism selective recompute saves 70% and 65% of the activations."""
    m, t = model(name), 8
    full = m.activation_bytes_per_layer(1, tp=t, sequence_parallel=True)
    selective = m.activation_bytes_per_layer(1, tp=t, sequence_parallel=True, recompute="selective")
    assert (full - selective) * t / (m.seq * m.hidden) == pytest.approx(attention_term)
    assert 1 - selective / full == pytest.approx(reduction, abs=0.005)


@pytest.mark.parametrize("name", ["gpt3-175b", "korthikanti-530b", "korthikanti-1t"])
def test_sequence_parallel_and_selective_recompute_save_5x(name):
    """Korthikanti et al. 2022, abstract: the two together reduce activation memory by 5x
    against tensor parallelism alone (t=8 as in Table 3)."""
    m = model(name)
    baseline = m.activation_bytes_per_layer(1, tp=8)
    both = m.activation_bytes_per_layer(1, tp=8, sequence_parallel=True, recompute="selective")
    assert round(baseline / both) == 5


def test_grouped_query_attention_and_swiglu_change_what_is_stored():
    """K and V shrink by kv_heads/heads; the SwiGLU MLP keeps three ffn-wide tensors, no dropout
    (unfused attention here: the preset's flash keeps a log-sum-exp instead of the as^2 scores)."""
    m = dataclasses.replace(model("llama2-70b"), attention="unfused")
    s, h, f, a = m.seq, m.hidden, m.ffn, m.heads
    replicated, split = 8 * s * h, (2 + 4 / 8 + 2) * s * h + 6 * s * f + 2 * a * s * s
    assert m.activation_bytes_per_layer(1) == replicated + split
    assert m.w_activation_bytes_per_layer(1) == 8 * s * h + 2 * (1 + 2 / 8) * s * h + 2 * s * h + 6 * s * f


# ---- presets and bad input -------------------------------------------------------------------

def test_sim_models_is_the_one_registry_that_estimate_resolves_names_in():
    """Every model `sim.estimate` takes by name is in `sim.MODELS`, the same object, and a
    name outside it is refused naming them all (SageMaker's were once missing)."""
    from sim.model import sagemaker
    assert sim.MODELS is MODELS and set(sagemaker.MODELS) <= set(MODELS)
    for name, m in MODELS.items():
        assert model(name.upper().replace("-", "_")) is m
    e = sim.estimate("sagemaker-gpt2-10b", "a100-40gb", tp=4, pp=1, dp=32, micro_batch=5, global_batch=1280)
    assert e.model is MODELS["sagemaker-gpt2-10b"]
    with pytest.raises(ValueError, match=r"unknown model 'gpt5'; known: gpt3-175b, .*sagemaker-gpt2-60b"):
        sim.estimate("gpt5", "a100-40gb", tp=1, pp=1, dp=1, micro_batch=1, global_batch=1)


def test_presets_are_the_papers_models():
    assert {"gpt3-175b", "llama2-7b", "llama2-13b", "llama2-70b"} <= set(MODELS)
    assert {n for n in MODELS if n.startswith("megatron-")} == {f"megatron-{k}" for k in NARAYANAN_TABLE_1}
    assert len([n for n in MODELS if n.startswith("korthikanti-")]) == 4
    assert model("GPT3_175B") is MODELS["gpt3-175b"] is sim.MODELS["gpt3-175b"]
    assert model("gpt3-175b") == model("korthikanti-175b")
    assert all(m.seq == S and m.vocab == V for n, m in MODELS.items() if n.startswith(("gpt3", "megatron", "korth")))
    assert all(m.seq == 4096 and m.vocab == 32000 for n, m in MODELS.items() if n.startswith("llama2"))


def test_unknown_model_lists_the_names():
    with pytest.raises(ValueError) as e:
        model("gpt5")
    assert "gpt3-175b" in str(e.value) and "llama2-70b" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("kwargs,message", [
    (dict(hidden=100, heads=3), "hidden 100 is not divisible by heads 3"),
    (dict(layers=0), "layers must be a positive int"),
    (dict(layers=True), "layers must be a positive int"),
    (dict(seq=2.0), "seq must be a positive int"),
    (dict(ffn=-1), "ffn must be a positive int"),
    (dict(kv_heads=3), "heads 4 is not divisible by kv_heads 3"),
    (dict(arch="bert"), "arch must be one of gpt, llama"),
])
def test_bad_shapes_are_refused_in_one_line(kwargs, message):
    shape = dict(layers=2, hidden=64, heads=4, seq=16, vocab=100) | kwargs
    with pytest.raises(ValueError, match=message) as e:
        Transformer(**shape)
    assert "\n" not in str(e.value)


def test_bad_arguments_are_refused_in_one_line():
    m = model("megatron-1.7b")
    with pytest.raises(ValueError, match="recompute must be one of none, selective, full"):
        m.flops_per_iteration(8, "partial")
    with pytest.raises(ValueError, match="recompute must be one of"):
        m.activation_bytes_per_layer(1, recompute=True)
    with pytest.raises(ValueError, match="tp must be a positive int"):
        m.activation_bytes_per_layer(1, tp=0)
    with pytest.raises(ValueError, match="micro_batch must be a positive int"):
        m.w_activation_bytes_per_layer(0)


# ---- the parts of a layer, and the presets of models trained since 2023 ------------------------

# Published totals: Llama 3 8B, 70B, 405B (the releases' model cards: 8.03B, 70.6B, 405.9B);
# Nemotron-4 340B (Technical Report: 9.4B embedding + 331.6B non-embedding = 341B) and 15B (Parmar
# et al. 2024, Sec. 2: 3.2B embedding, 12.5B non-embedding); Mistral 7B (model card: 7.24B);
# Qwen2.5-7B (model card: 7.61B, non-embedding 6.53B).
@pytest.mark.parametrize("name,billions", [("llama3-8b", 8.03), ("llama3-70b", 70.6), ("llama3-405b", 405.9),
                                           ("llama3.1-8b", 8.03), ("llama3.1-70b", 70.6), ("llama3.1-405b", 405.9),
                                           ("nemotron4-340b", 341), ("nemotron4-15b", 15.7), ("mistral-7b", 7.24),
                                           ("qwen2.5-7b", 7.61)])
def test_presets_since_2023_have_their_published_parameter_counts(name, billions):
    assert model(name).params().total / 1e9 == pytest.approx(billions, rel=0.01)


@pytest.mark.parametrize("name,embedding,rest", [("nemotron4-15b", 3.2, 12.5), ("nemotron4-340b", 9.4, 331.6),
                                                 ("qwen2.5-7b", None, 6.53)])
def test_embedding_and_non_embedding_parameters_are_the_published_split(name, embedding, rest):
    p = model(name).params()
    if embedding is not None:
        assert (p.embedding + p.output) / 1e9 == pytest.approx(embedding, rel=0.02)  # 3.2 has two digits
    assert (p.layers * p.per_layer + p.final_norm) / 1e9 == pytest.approx(rest, rel=0.01)


def test_presets_say_what_attention_their_stacks_ran():
    """2021-22 tables: Megatron-LM's unfused softmax; 2023 on: a fused (flash) kernel."""
    old = [n for n in MODELS if n.startswith(("gpt3", "megatron-", "korthikanti-"))]
    new = [n for n in MODELS if n not in old and not n.startswith("sagemaker")]  # SageMaker: its own table
    assert old and all(MODELS[n].attention == "unfused" for n in old)
    assert len(new) >= 12 and all(MODELS[n].attention == "flash" for n in new)


def test_nemotron4_is_squared_relu_rotary_untied():
    m = model("nemotron4-340b")
    assert (m.mlp, m.mlp_matrices, m.positions, m.tied, m.kv_heads) == ("squared-relu", 2, "rotary", False, 8)
    h, f = m.hidden, m.ffn
    assert m.params().per_layer == h * h * (1 + 2 * 8 / 96) + h * h + 2 * h * f + 2 * h  # two RMSNorm-style gains


def test_arch_sets_defaults_and_each_part_can_be_given_apart():
    base = dict(layers=2, hidden=64, heads=4, seq=16, vocab=100)
    gpt, llama = Transformer(**base), Transformer(**base, arch="llama")
    assert (gpt.mlp, gpt.positions, gpt.tied) == ("gelu", "learned", True)
    assert (llama.mlp, llama.positions, llama.tied) == ("swiglu", "rotary", False)
    h, f, s = 64, 256, 16
    # swiglu adds one h x f matrix (and, with biases, f of them); rotary drops the s x h positions
    assert Transformer(**base, mlp="swiglu").params().per_layer - gpt.params().per_layer == h * f + f
    assert gpt.params().embedding - Transformer(**base, positions="rotary").params().embedding == s * h
    assert Transformer(**base, arch="llama", mlp="gelu").params().per_layer == llama.params().per_layer - h * f
    sq = Transformer(**base, mlp="squared-relu")
    assert sq.params() == gpt.params() and sq.layer_flops(1) == gpt.layer_flops(1)
    # what the backward keeps: one sbf tensor a matrix
    assert Transformer(**base, mlp="swiglu").activation_bytes_per_layer(1) - gpt.activation_bytes_per_layer(1) \
        == 2 * s * f


@pytest.mark.parametrize("kwargs,message", [
    (dict(mlp="relu"), "mlp must be one of gelu, swiglu, squared-relu; got 'relu'"),
    (dict(positions="alibi"), "positions must be one of learned, rotary; got 'alibi'"),
])
def test_unknown_parts_are_refused_in_one_line(kwargs, message):
    with pytest.raises(ValueError, match=message) as e:
        Transformer(layers=2, hidden=64, heads=4, seq=16, vocab=100, **kwargs)
    assert "\n" not in str(e.value)
