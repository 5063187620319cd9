"""Context parallelism (`cp=`): ring attention's and Ulysses' closed forms on hand-counted small
cases, the causal balance of chunk pairs, what scales 1/cp per rank, gradients over dp x cp,
the search's cp rule, and the one-line refusals."""
import dataclasses

import pytest
from hypothesis import given, settings, strategies as st

import sim
from sim.cost.data_parallel import grad_reduce_times, stage_params
from sim.cost.ends import end_times
from sim.cost.context import context_attention
from sim.cost.attention import BACKWARD_OVER_FORWARD, fused_attention_times
from sim.cost.layer import Slice, gemm_shapes, layer_times
from sim.cost.slice import per_rank
from sim.hardware.network import all_to_all_time, bus_bandwidth, links_of, p2p_time
from sim.hardware.topology import Group, one_node
from sim.model.transformer import Transformer
from sim.plan.bounds import Bounds
from sim.plan.layout import Layout
from sim.plan.space import CP_MIN_SEQ, configurations, layouts

H100 = dataclasses.replace(sim.profile("h100-80gb-best-case"), launch_per_kernel=0.0)
# 2 heads of 4, 2 KV heads, 16 tokens: K and V of 8 tokens (cp = 2) are 2 x 8 x 8 x 2 bytes
SMALL = Transformer(layers=2, hidden=8, heads=2, seq=16, vocab=64, arch="llama", attention="flash")
LLAMA = sim.MODELS["llama3-70b"]


def test_ring_attention_adds_the_sends_it_cannot_hide():
    """p2p: F is c + (cp - 1) max(c, k), c = its compute / cp, k one send of K and V of s/cp
    tokens (hand-counted: 256 bytes at cp 2); the backward 2 max(c, k) + (cp - 2) max(c, 2k)."""
    for cp, group in ((2, one_node(2)), (4, Group(2, 1, 2, 1.0))):
        x = Slice(1, cp=cp, cp_comm="p2p", cp_group=group)
        kv = 2 * (16 // cp) * 8 * 2
        assert kv == {2: 256, 4: 128}[cp]
        links = links_of(H100)
        for core in (1e-9, 1e-3):  # the sends exposed, or hidden under the compute
            f, b = context_attention(SMALL, H100, x, core, 2.5 * core)
            k_f, k_b = p2p_time(links, kv, group), p2p_time(links, 2 * kv, group)
            assert core + f == pytest.approx(core / cp + (cp - 1) * max(core / cp, k_f), rel=1e-12)
            c = 2.5 * core / cp
            assert 2.5 * core + b == pytest.approx(2 * max(c, k_f) + (cp - 2) * max(c, k_b), rel=1e-12)
            assert (f == 0) == (core == 1e-3)


def test_ulysses_is_two_all_to_alls_each_way():
    """a2a: Q, K, V (3 x 8 tokens x 8 x 2 bytes = 384) and the output (128 bytes) each way, not
    overlapped; an all-to-all is one send's latency + (n - 1)/n of its bytes at the bus bandwidth."""
    links, group = links_of(H100), one_node(2)
    f, b = context_attention(SMALL, H100, Slice(1, cp=2, cp_comm="a2a", cp_group=group), 1.0, 2.5)
    def a2a(nbytes):
        return links.node.p2p_latency + nbytes / 2 / bus_bandwidth(links, group)
    assert f == b == pytest.approx(a2a(384) + a2a(128), rel=1e-12)
    assert all_to_all_time(links, 384, group) == pytest.approx(a2a(384), rel=1e-12)


def test_ring_against_ulysses_on_one_case():
    """Where the compute hides the ring's sends, the ring adds nothing and Ulysses its
    all-to-alls; where nothing hides them (no compute), the ring's cp - 1 sends against
    Ulysses' two all-to-alls."""
    for cp in (2, 4):
        ring = Slice(1, cp=cp, cp_comm="p2p")
        ulysses = Slice(1, cp=cp, cp_comm="a2a")
        assert context_attention(SMALL, H100, ring, 1.0, 2.5) == (0.0, 0.0)
        assert context_attention(SMALL, H100, ulysses, 1.0, 2.5)[0] > 0
        k = p2p_time(links_of(H100), 2 * (16 // cp) * 8 * 2, one_node(2))
        assert context_attention(SMALL, H100, ring, 0.0, 0.0)[0] == pytest.approx((cp - 1) * k, rel=1e-12)


@given(st.integers(1, 16), st.integers(1, 8))
def test_chunk_pairs_balance_the_causal_work(cp, chunk):
    """Rank i holding chunks i and 2cp-1-i of 2cp: every rank's query-key pairs under the causal
    mask are the same, 1/cp of all of them: why `fused_attention_times` divides by cp."""
    s = 2 * cp * chunk
    work = [sum(q + 1 for j in (i, 2 * cp - 1 - i) for q in range(j * chunk, (j + 1) * chunk)) for i in range(cp)]
    assert len(set(work)) == 1 and work[0] * cp == s * (s + 1) // 2


def test_attention_flops_and_every_other_matmul_per_rank():
    """The attention core: 1/cp of the causal FLOPs; every other matmul's M (and the scores'
    queries) s/cp of the tokens, the keys all s."""
    m = LLAMA
    for cp in (2, 4, 8):
        one, many = Slice(1, tp=8), Slice(1, tp=8, cp=cp)
        assert fused_attention_times(m, H100, many)[0] == pytest.approx(fused_attention_times(m, H100, one)[0] / cp)
        assert fused_attention_times(m, H100, many)[1] == pytest.approx(
            BACKWARD_OVER_FORWARD * fused_attention_times(m, H100, many)[0])
        a, b = gemm_shapes(m, one), gemm_shapes(m, many)
        for name in ("qkv", "projection", "mlp_in", "mlp_out"):
            assert b[name] == (a[name][0] // cp, *a[name][1:])
        assert b["scores"] == (m.seq // cp, m.seq, *a["scores"][2:])


def test_activations_and_token_work_scale_one_over_cp():
    """Per rank: activations (flash attention: all linear in the tokens) exactly 1/cp; the
    ends' work is the model's at s/cp."""
    m = LLAMA
    for cp in (2, 4):
        x = Slice(1, tp=8, sequence_parallel=True, cp=cp)
        local = per_rank(m, x)
        for recompute in ("none", "selective", "full"):
            assert local.activation_bytes_per_layer(1, 8, True, recompute) == pytest.approx(
                m.activation_bytes_per_layer(1, 8, True, recompute) / cp, rel=1e-12)
        assert end_times(m, H100, x) == end_times(local, H100, Slice(1, tp=8, sequence_parallel=True))


def test_estimate_with_cp_memory_and_gradient_group():
    """tp x cp x pp x dp GPUs; each rank's activations 1/cp of cp = 1's (the same schedule); the
    gradients reduced over dp x cp: dp=1, cp=2 reduces as dp=2, cp=1 does (a group of two)."""
    kw = dict(tp=8, pp=2, micro_batch=1, recompute="selective", sequence_parallel=True)
    one = sim.estimate(LLAMA, H100, dp=2, global_batch=4, **kw)
    two = sim.estimate(LLAMA, H100, dp=1, cp=2, global_batch=2, **kw)
    assert two.layout.gpus == one.layout.gpus == 32 and two.layout.replicas == 2
    for a, b in zip(one.memory_parts, two.memory_parts):
        assert b["activations"] == pytest.approx(a["activations"] / 2, rel=1e-9)
        assert b["weights"] == a["weights"]
    params = stage_params(LLAMA, [40, 40], 8, [0, 1])
    assert grad_reduce_times(LLAMA, H100, two.layout, params, [0, 1]) == \
        grad_reduce_times(LLAMA, H100, one.layout, params, [0, 1])
    assert two.summary()["cp"] == 2 and "cp=2" in repr(two)


def test_cp_one_is_the_layout_without_cp():
    """cp = 1 (either exchange) times a layer as before cp existed."""
    for comm in ("p2p", "a2a"):
        assert layer_times(LLAMA, H100, Slice(1, tp=8, cp=1, cp_comm=comm)) == layer_times(LLAMA, H100, Slice(1, tp=8))


@pytest.mark.parametrize("kw, words", [
    (dict(cp=0), "cp must be a positive int"),
    (dict(cp=2, cp_comm="ring"), "cp_comm must be one of p2p, a2a"),
    (dict(cp=2, attention="unfused"), "needs a fused attention kernel"),
    (dict(cp=2, attention="paged"), "attention must be one of"),
    (dict(cp=3), "2 x cp = 6 chunks"),
    (dict(cp=2, cp_comm="a2a"), "1 kv_heads"),
])
def test_refusals_are_one_line(kw, words):
    with pytest.raises(ValueError, match=words) as err:
        sim.estimate(LLAMA, H100, tp=8, **kw)
    assert "\n" not in str(err.value)


def test_attention_keyword_overrides_the_models():
    gpt = sim.MODELS["gpt3-175b"]
    assert gpt.attention == "unfused"
    e = sim.estimate(gpt, H100, tp=8, pp=8, attention="flash", recompute="selective")
    assert e.model.attention == "flash" and e.summary()["attention"] == "flash"


def test_search_tries_cp_only_for_long_sequences():
    """cp = 1 below CP_MIN_SEQ; from it powers of two keeping 4096 tokens a rank; `cp=` narrows."""
    short = dataclasses.replace(LLAMA, seq=4096)
    assert {lay[4] for lay in layouts(short, 64, 64)} == {1}
    assert {lay[4] for lay in layouts(LLAMA, 64, 64)} == {1, 2} and LLAMA.seq == CP_MIN_SEQ
    assert {lay[4] for lay in layouts(dataclasses.replace(LLAMA, seq=32768), 64, 64)} == {1, 2, 4, 8}
    for lay in layouts(LLAMA, 64, 64, cp=[2]):
        tp, pp, dp, b, cp = lay
        assert cp == 2 and tp * cp * pp * dp == 64
    assert {c.cp for c in configurations(LLAMA, 64, 64, tp=8, pp=4, cp=[1, 2], recompute="none")} == {1, 2}
    with pytest.raises(ValueError, match="needs a fused attention kernel"):
        layouts(sim.MODELS["gpt3-175b"], 64, 64, cp=2)
    with pytest.raises(ValueError, match="6 chunks"):
        layouts(LLAMA, 64, 64, cp=3)


def test_cli_takes_cp(tmp_path):
    from sim.plan.cli import main
    assert main(["--model", "llama3-8b", "--gpu", "h100-80gb", "--gpus", "16", "--global-batch", "16",
                 "--cp", "2", "--tp", "8", "--top", "1", "--no-figures"]) in (0, None)


@pytest.mark.parametrize("schedule, pp, dp, cp, comm", [("1f1b", 4, 1, 2, "p2p"), ("interleaved-1f1b", 2, 2, 2, "p2p"),
                                                       ("zb-h1", 2, 1, 4, "p2p"), ("1f1b", 2, 2, 2, "a2a")])
def test_bounds_hold_with_cp(schedule, pp, dp, cp, comm):
    """The planner's lower bounds stay below the estimate with context parallelism."""
    m = dataclasses.replace(LLAMA, layers=8, seq=16384)
    bounds = Bounds(m, H100)
    for recompute, zero in (("selective", 1), ("none", 0)):
        c = Layout(tp=8 // cp if comm == "a2a" else 8, pp=pp, dp=dp, schedule=schedule,
                   virtual=2 if schedule.startswith("inter") else 1, recompute=recompute, zero=zero,
                   sequence_parallel=True, cp=cp, cp_comm=comm, global_batch=16)
        e = sim.estimate(m, H100, **c.keywords())
        assert bounds.memory_average(c) <= bounds.memory(c) <= max(e.peak_memory) * (1 + 1e-9)
        assert bounds.average(c) <= bounds.time(c) <= bounds.schedule_time(c) <= e.step_time * (1 + 1e-9)


def test_a_given_pp_skips_the_cp_sizes_it_does_not_fit_rather_than_refusing():
    """At 32K tokens the search tries cp up to 8; with pp=4 given on 16 GPUs, cp=8 leaves 2
    GPUs, which pp=4 does not divide: that cp is skipped, not the whole request refused."""
    model = dataclasses.replace(sim.MODELS["llama3-8b"], seq=32768)
    plan = sim.plan.search(model, "h100-80gb", 16, 64, tp=1, pp=4, micro_batch=1, schedules="1f1b", top=None)
    cps = {row.config.cp for row in plan.rows}
    assert cps and 8 not in cps and all(r.config.pp == 4 for r in plan.rows)
    assert all(r.config.tp * r.config.cp * r.config.pp * r.config.dp == 16 for r in plan.rows)
