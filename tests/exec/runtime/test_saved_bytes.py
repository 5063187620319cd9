"""The planner's activation bytes are what autograd saves in exec's GPT: per layer, at each end, and what a split backward keeps for W.

exec builds its GPT from the same `sim.Transformer` the planner reads
(`exec.models.spec.ModelSpec.transformer`); these tests count, with saved-tensor hooks (each
storage once, parameters excluded: `exec.runtime.memory.SavedBytes`), the bytes one forward keeps
and compare them with `Transformer.activation_bytes_per_layer`,
`w_activation_bytes_per_layer` and `end_activation_bytes`, exactly, for every recompute mode.
"""
from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")
from hypothesis import given, settings, strategies as st  # noqa: E402

import sim  # noqa: E402
from exec.measure.calibrate import activation_bytes, w_activation_bytes  # noqa: E402
from exec.runtime.memory import SavedBytes, param_storages  # noqa: E402
from exec.models.spec import ModelSpec  # noqa: E402
from sim.model.transformer import RECOMPUTE  # noqa: E402


@st.composite
def gpts(draw):
    heads = draw(st.integers(1, 4))
    return ModelSpec("gpt", layers=2, hidden=heads * draw(st.sampled_from([4, 8, 16])), heads=heads,
                     seq=draw(st.integers(1, 12)), vocab=draw(st.integers(2, 40)),
                     batch_size=draw(st.integers(1, 3)), recompute=draw(st.sampled_from(RECOMPUTE)),
                     ffn=(draw(st.integers(1, 48)),) * 2)


def _saved(layer, x, loss=None) -> int:
    """Bytes autograd saves in one forward of `layer` on `x` (and the loss, if given)."""
    counter = SavedBytes(param_storages(layer))
    with counter.hooks():
        out = layer(x)
        if loss is not None:
            loss(out)
    return counter.nbytes


@settings(max_examples=12, deadline=None)
@given(gpts())
def test_each_layer_saves_what_the_planner_counts(spec):
    t, b = spec.transformer(), spec.batch_size
    layers = spec.build_layers()
    ids, targets = spec.micro_batches(1)[0]  # copies, as the runtime holds them
    hidden = layers[0](ids).detach()
    ends = t.end_activation_bytes(b, precision="fp32")
    assert _saved(layers[0], ids) == ends["first"]
    for block in layers[1:-1]:
        x = hidden.requires_grad_()
        assert _saved(block, x) == t.activation_bytes_per_layer(b, recompute=spec.recompute, precision="fp32")
        hidden = block(x).detach()
    assert _saved(layers[-1], hidden.requires_grad_(), lambda out: spec.loss(out, targets)) == ends["last"]


@settings(max_examples=6, deadline=None)
@given(gpts())
def test_a_split_backward_keeps_what_the_planner_counts_for_w(spec):
    t, b = spec.transformer(), spec.batch_size
    layers = spec.build_layers()
    ids, targets = spec.micro_batches(1)[0]  # copies, as the runtime holds them
    ends = t.end_activation_bytes(b, precision="fp32")
    per_layer = t.w_activation_bytes_per_layer(b, precision="fp32", recompute=spec.recompute)
    first = torch.nn.Sequential(*layers[:2])
    assert w_activation_bytes(first, ids, True, False, spec.loss, targets, 1) == ends["first_w"] + per_layer
    hidden = first(ids).detach()
    last = torch.nn.Sequential(*layers[2:])
    assert w_activation_bytes(last, hidden, False, True, spec.loss, targets, 1) == ends["last_w"] + per_layer
    kept, _ = activation_bytes(last, hidden, True, spec.loss, targets, 1)
    assert kept == ends["last"] + t.activation_bytes_per_layer(b, recompute=spec.recompute, precision="fp32")


@st.composite
def blocks(draw):
    """A GPT block's shape over a wider range than `gpts`: head dims that are not powers of
    two, longer sequences, more heads."""
    heads = draw(st.integers(1, 8))
    return ModelSpec("gpt", layers=1, hidden=heads * draw(st.sampled_from([1, 3, 8, 16, 24])), heads=heads,
                     seq=draw(st.integers(1, 48)), vocab=8, batch_size=draw(st.integers(1, 4)),
                     recompute=draw(st.sampled_from(RECOMPUTE)))


def _block_saved(spec, backend=None, dtype=torch.float32) -> int:
    """Bytes one block of `spec` saves in a forward, its attention on torch's SDPA `backend`
    (None: the one torch picks, as exec runs it)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    block = spec.build_layers()[1].to(dtype)
    x = torch.randn(spec.batch_size, spec.seq, spec.hidden, dtype=dtype, requires_grad=True)
    if backend is None:
        return _saved(block, x)
    with sdpa_kernel([getattr(SDPBackend, backend)]):
        return _saved(block, x)


@settings(max_examples=15, deadline=None)
@given(blocks())
def test_each_attention_kernel_saves_what_rule_16_says(spec):
    """docs/rules.md, rule 17: torch picks its flash kernel on CPU for exec's block (the
    planner's attention="flash"), and its math backend, pinned, saves the s^2 softmax and
    scaled copies of Q and K (attention="unfused" with kernels="torch"), to the byte."""
    flash = spec.transformer()
    math_ = dataclasses.replace(flash, attention="unfused")
    b, rec = spec.batch_size, spec.recompute
    assert _block_saved(spec) == _block_saved(spec, "FLASH_ATTENTION") == \
        flash.activation_bytes_per_layer(b, recompute=rec, precision="fp32")
    assert _block_saved(spec, "MATH") == math_.activation_bytes_per_layer(b, recompute=rec, precision="fp32")


@settings(max_examples=6, deadline=None)
@given(blocks())
def test_in_16_bits_a_cpu_layernorm_keeps_its_statistics_in_16_bits(spec):
    """Rule 16's one gap: on CPU, LayerNorm keeps its mean and 1/std in its parameters'
    dtype (bf16: 2 bytes), where the planner counts CUDA's fp32: 2 norms x 2 statistics x
    2 bytes a token fewer than `activation_bytes_per_layer`, without full recompute."""
    t, b, rec = spec.transformer(), spec.batch_size, spec.recompute
    gap = 0 if rec == "full" else 2 * 2 * 2 * b * spec.seq
    assert _block_saved(spec, dtype=torch.bfloat16) == t.activation_bytes_per_layer(b, recompute=rec,
                                                                                     precision="bf16") - gap


def test_the_estimate_holds_the_stage_bytes_exec_measures():
    """The planner's per-stage activation bytes (sim.estimate's costs) are the sums above."""
    spec = ModelSpec("gpt", layers=4, hidden=16, heads=2, seq=8, vocab=24, batch_size=4)
    t = spec.transformer()
    e = sim.estimate(t, "a100-80gb", pp=2, micro_batch=2, global_batch=4, precision="fp32", schedule="gpipe")
    layers = spec.build_layers()
    x, y = spec.micro_batches(2)[0]
    bounds = spec.partition(2)
    stages = [torch.nn.Sequential(*layers[a:z]) for a, z in zip(bounds, bounds[1:])]
    act0, _ = activation_bytes(stages[0], x, False, spec.loss, y, 1)
    act1, _ = activation_bytes(stages[1], stages[0](x).detach(), True, spec.loss, y, 1)
    assert [p["activations"] for p in e.memory_parts] == [2 * act0, 2 * act1]  # GPipe holds both micro-batches
    assert e.layers_per_stage == [bounds[1] - 1, bounds[2] - bounds[1] - 1]


def test_exec_refuses_a_transformer_it_does_not_build():
    llama = sim.Transformer(layers=2, hidden=16, heads=2, seq=8, vocab=32, arch="llama")
    with pytest.raises(ValueError, match="cannot build"):
        ModelSpec.from_transformer(llama, batch_size=2)
    t = ModelSpec("gpt", layers=2, hidden=16, heads=2, seq=8, vocab=32).transformer()
    assert ModelSpec.from_transformer(t, batch_size=2).transformer() == t


def test_defaults_keep_the_papers_count():
    """The new fields' defaults are Megatron-LM's GPT as Korthikanti et al. 2022 count it:
    sbh(34 + 5as/h) bytes a layer in 16 bits, in fp32 the 32 16-bit elements of the 34 take 4 bytes (the two 1-byte masks stay): 66 + 9as/h."""
    m = sim.Transformer(layers=2, hidden=64, heads=4, seq=32, vocab=100)
    s, b, h, a = 32, 1, 64, 4
    assert m.activation_bytes_per_layer(b) == s * b * h * (34 + 5 * a * s / h)
    assert m.activation_bytes_per_layer(b, precision="fp32") == s * b * h * (66 + 9 * a * s / h)
