"""sim.hardware.kernels, sim.cost.layer, sim.search.partition, sim.model.footprint and
sim.estimate: closed forms, cross-checks between independent counts, properties over random
shapes, and one-line errors."""
import itertools
import dataclasses
import math

import pytest
from hypothesis import given, settings, strategies as st

import sim
from sim.cost.data_parallel import stage_params
from sim.cost.ends import end_times
from sim.model.footprint import optimizer_step_bytes, state_bytes_per_param
from sim.hardware.gpus import gpu
from sim.hardware.kernels import TILE, gemm_flops, gemm_time
from sim.hardware.network import collective_time, links_of
from sim.hardware.topology import one_node
from sim.cost.layer import Slice, gemm_shapes, layer_times
from sim.search.partition import balanced, even
from sim.model.transformer import Transformer

# the tile model (no measured tables) and no launch floor: the closed forms below are sums of device times
A100 = dataclasses.replace(sim.profile("a100-80gb-best-case"), launch_per_kernel=0.0)
shapes = st.builds(lambda l, a, hd, s, v: Transformer(layers=l, hidden=a * hd, heads=a, seq=s, vocab=v),
                   st.integers(1, 8), st.sampled_from([8, 16, 32]), st.sampled_from([64, 128]),
                   st.sampled_from([256, 512, 2048]), st.sampled_from([1024, 51200]))


# ---- kernels ----------------------------------------------------------------------------------------

def test_a_gemm_of_whole_waves_runs_at_the_achieved_peak():
    """M x N a whole number of waves of 256x128 tiles, compute-bound: time = FLOPs / (peak * efficiency)."""
    m, n, k = TILE[0] * A100.gpu.sms, TILE[1] * 4, 8192
    t = gemm_time(A100, "bf16", m, n, k)
    assert t == pytest.approx(gemm_flops(m, n, k) / (312e12 * A100.matmul_efficiency), rel=1e-12)


@given(st.integers(1, 4096), st.integers(1, 4096), st.integers(1, 8192))
def test_one_tile_past_a_full_wave_costs_a_whole_wave(m, n, k):
    """Wave quantization: time is a step function of the tile count, never below the achieved peak."""
    t = gemm_time(A100, "bf16", m, n, k)
    assert t >= gemm_flops(m, n, k) / (312e12 * A100.matmul_efficiency) * (1 - 1e-12)
    tiles = math.ceil(m / TILE[0]) * math.ceil(n / TILE[1])
    waves = math.ceil(tiles / A100.gpu.sms)
    compute = waves * 2 * TILE[0] * TILE[1] * k / (312e12 * A100.matmul_efficiency / A100.gpu.sms)
    assert t == pytest.approx(max(compute, (m * k + k * n + m * n) * 2 / A100.memory_bandwidth))


def test_a_thin_gemm_is_memory_bound():
    m, n, k = 65536, 65536, 8  # 16 FLOPs per output element: far below the ridge point
    assert gemm_time(A100, "bf16", m, n, k) == pytest.approx(
        (m * k + k * n + m * n) * 2 / A100.memory_bandwidth)


# ---- layer ----------------------------------------------------------------------------------------

@settings(max_examples=40, deadline=None)
@given(shapes, st.sampled_from([1, 2, 4, 8]), st.integers(1, 8))
def test_the_layer_matmuls_are_the_papers_flops(m, tp, b):
    """The matmuls sim.cost.layer times, summed, are Narayanan et al.'s forward FLOPs split over tp, and their
    gradients Qi et al.'s I and W: two independent counts of the same thing."""
    if m.heads % tp:
        return
    shapes_ = gemm_shapes(m, Slice(b, tp))
    fwd = sum(gemm_flops(*s) for s in shapes_.values())
    p = m.pass_flops(b)
    assert fwd * tp == pytest.approx(p["F"])
    weightless = ("scores", "values")
    dx = sum(gemm_flops(mm, kk, n, nb) for mm, n, kk, nb in shapes_.values())
    dw = {k: gemm_flops(kk, n, mm, nb) for k, (mm, n, kk, nb) in shapes_.items()}
    assert (dx + sum(dw[k] for k in weightless)) * tp == pytest.approx(p["I"])
    assert sum(v for k, v in dw.items() if k not in weightless) * tp == pytest.approx(p["W"])


@settings(max_examples=30, deadline=None)
@given(shapes, st.sampled_from([1, 2, 8]), st.integers(1, 4), st.booleans())
def test_recompute_adds_what_it_redoes(m, tp, b, sp):
    """Full recompute adds exactly the forward to B and to I; selective adds less; W never changes."""
    if m.heads % tp or (sp and tp == 1):
        return
    x = Slice(b, tp, sp)
    none, sel, full = (layer_times(m, A100, x, r) for r in ("none", "selective", "full"))
    assert full.backward - none.backward == pytest.approx(none.forward)
    assert full.backward_input - none.backward_input == pytest.approx(none.forward)
    assert 0 < sel.recompute < full.recompute == pytest.approx(none.forward)
    assert none.backward_weight == sel.backward_weight == full.backward_weight
    for t in (none, sel, full):
        assert t.forward == none.forward
        # B hides some of I's collectives under the weight gradients, never more than all of them
        assert t.backward_input + t.backward_weight - t.parts["collectives"] <= t.backward + 1e-15
        assert t.backward <= t.backward_input + t.backward_weight
        assert sum(t.parts.values()) == pytest.approx(t.forward + t.backward)


@settings(max_examples=30, deadline=None)
@given(shapes, st.sampled_from([1, 2, 8]), st.integers(1, 4), st.booleans(), st.sampled_from(["none", "full"]))
def test_without_the_overlap_b_waits_for_every_collective(m, tp, b, sp, recompute):
    """tp_overlap=False: B is I then W (nothing hidden); F, I and W are those of the overlapped run,
    which hides no more than the collectives it has."""
    if m.heads % tp or (sp and tp == 1):
        return
    x = Slice(b, tp, sp)
    on, off = layer_times(m, A100, x, recompute), layer_times(m, A100, x, recompute, tp_overlap=False)
    assert off.backward == pytest.approx(off.backward_input + off.backward_weight)
    assert (off.forward, off.backward_input, off.backward_weight) == (on.forward, on.backward_input, on.backward_weight)
    assert on.backward <= off.backward <= on.backward + on.parts["collectives"]
    assert sum(off.parts.values()) == pytest.approx(off.forward + off.backward)
    if tp == 1:
        assert off.backward == on.backward


@pytest.mark.parametrize("sp", [False, True])
def test_the_receiver_gathers_the_scattered_activation(sp):
    """Narayanan et al. 2021, Sec. 4.1: each of the t ranks sends bsh/t and the receiver
    all-gathers bsh before computing, except under sequence parallelism. Two stages of 12
    layers: each F and B lasts its layers, its end layer and, where it receives, that gather."""
    m, b = sim.MODELS["megatron-1.7b"], 2
    e = sim.estimate(m, A100, tp=8, pp=2, micro_batch=b, global_batch=4, sequence_parallel=sp)
    x = Slice(b, 8, sp, "bf16")
    lt, ends = layer_times(m, A100, x), end_times(m, A100, x)
    g = 0.0 if sp else collective_time(links_of(A100), "all_gather", b * m.seq * m.hidden * 2, one_node(8))
    assert g > 0 or sp
    want = {(0, "F"): 12 * lt.forward + ends["first_F"], (1, "F"): 12 * lt.forward + ends["last_F"] + g,
            (0, "B"): 12 * lt.backward + ends["first_I"] + ends["first_W"] + g,
            (1, "B"): 12 * lt.backward + ends["last_I"] + ends["last_W"]}
    got = {(ev.action.stage, ev.action.kind.value): ev.end - ev.start for ev in e.result.events
           if ev.action.kind.value in "FB"}
    assert got == pytest.approx(want)


def test_no_tensor_parallelism_no_collectives():
    t = layer_times(sim.MODELS["megatron-1.7b"], A100, Slice(4, 1))
    assert t.parts["collectives"] == 0.0 and t.backward == pytest.approx(t.backward_input + t.backward_weight)


def test_korthikanti_table_4_ordering():
    """The 22B layer (t=8, b=4): sequence parallelism shortens F; recompute lengthens B, full most."""
    m = sim.MODELS["korthikanti-22b"]
    base, spar = layer_times(m, A100, Slice(4, 8)), layer_times(m, A100, Slice(4, 8, True))
    sel, full = layer_times(m, A100, Slice(4, 8), "selective"), layer_times(m, A100, Slice(4, 8), "full")
    assert spar.forward < base.forward
    assert base.backward < sel.backward < full.backward


# ---- partition ------------------------------------------------------------------------------------

@given(st.integers(1, 60), st.integers(1, 12))
def test_even_split(layers, stages):
    c = even(layers, stages)
    assert sum(c) == layers and max(c) - min(c) <= 1 and len(c) == stages
    if stages > 2 and layers % stages:
        assert c[0] == c[-1] == layers // stages or layers % stages > stages - 2


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 9), st.integers(1, 4), st.floats(0.1, 5), st.floats(0, 10), st.floats(0, 10),
       st.lists(st.integers(0, 9), min_size=4, max_size=4) | st.none())
def test_balanced_is_optimal_by_brute_force(layers, stages, per_layer, first, last, caps):
    """The fastest split, among those that keep every stage within its cap (memory), if any."""
    extra = [0.0] * stages
    extra[0] += first
    extra[-1] += last
    most = None if caps is None else caps[:stages]
    allowed = [split for split in itertools.product(range(layers + 1), repeat=stages)
               if sum(split) == layers and (most is None or all(n <= c for n, c in zip(split, most)))]
    if not allowed:
        with pytest.raises(ValueError, match="hold fewer than"):
            balanced(layers, stages, per_layer, extra, most)
        return
    c = balanced(layers, stages, per_layer, extra, most)
    slowest = max(n * per_layer + e for n, e in zip(c, extra))
    best = min(max(n * per_layer + e for n, e in zip(split, extra)) for split in allowed)
    assert tuple(c) in allowed
    assert slowest == pytest.approx(best)


# ---- footprint ------------------------------------------------------------------------------------

def test_mixed_precision_adam_bytes():
    """16 bytes a parameter (ZeRO, Sec. 3.1), 18 with Megatron-LM's fp32 gradients; ZeRO divides them by stage."""
    assert sum(state_bytes_per_param("fp16").values()) == 16
    assert sum(state_bytes_per_param("bf16").values()) == 18
    assert sum(state_bytes_per_param("fp32").values()) == 16
    for zero, expect in ((1, 2 + 4 + 12 / 8), (2, 2 + 4 / 8 + 12 / 8), (3, 18 / 8)):
        assert sum(state_bytes_per_param("bf16", zero, 8).values()) == pytest.approx(expect)
    assert optimizer_step_bytes("bf16") == 30 and optimizer_step_bytes("fp32") == 28


# ---- estimate -------------------------------------------------------------------------------------

def test_one_device_one_micro_batch_is_a_sum():
    """No pipeline, no data parallelism, one micro-batch: the step is F + B of the whole model plus the optimizer."""
    m = sim.MODELS["megatron-1.7b"]
    e = sim.estimate(m, A100, micro_batch=2, global_batch=2)
    c = e.result
    lt = layer_times(m, A100, Slice(2))
    assert e.step_time == pytest.approx(c.makespan + e.time_parts["optimizer"])
    assert c.makespan > m.layers * (lt.forward + lt.backward)
    assert e.tflops_per_gpu * 1e12 * e.step_time == pytest.approx(m.flops_per_iteration(2, "none"))
    assert e.mfu == pytest.approx(e.tflops_per_gpu * 1e12 / 312e12)
    params = m.params().total
    assert e.memory_parts[0]["weights"] + e.memory_parts[0]["grads"] + e.memory_parts[0]["optimizer"] == \
        pytest.approx(18 * params)


def test_tflops_count_the_recomputed_forward_and_mfu_does_not():
    e = sim.estimate("megatron-1.7b", "a100-80gb", micro_batch=4, global_batch=8, dp=2, recompute="full")
    m = e.model
    assert e.tflops_per_gpu * 1e12 * e.step_time * 2 == pytest.approx(m.flops_per_iteration(8, "full"))
    assert e.mfu * 312e12 * e.step_time * 2 == pytest.approx(m.flops_per_iteration(8, "none"))


def test_1f1b_first_stage_holds_p_micro_batches():
    """Memory comes from the simulation: under 1F1B stage s holds p - s micro-batches at its peak."""
    e = sim.estimate("megatron-39.1b", "a100-80gb", tp=8, pp=4, dp=1, micro_batch=1, global_batch=16)
    assert e.result.peak_activations == [4, 3, 2, 1]
    e2 = sim.estimate("megatron-39.1b", "a100-80gb", tp=8, pp=4, dp=1, micro_batch=1, global_batch=16,
                      schedule="gpipe")
    assert e2.result.peak_activations == [16] * 4 and max(e2.peak_memory) > max(e.peak_memory)


def test_stage_params_sum_to_the_model():
    m = sim.MODELS["gpt3-175b"]
    layers = even(m.layers, 8)
    p = m.params()
    one = stage_params(m, [m.layers], 1, [0])
    assert one[0] == p.total
    # a tied output layer on another device is a second copy of the word embedding
    assert sum(stage_params(m, layers, 1, list(range(8)))) == pytest.approx(p.total + m.vocab * m.hidden)
    assert sum(stage_params(m, layers, 8, list(range(8)))) * 8 == pytest.approx(p.total + m.vocab * m.hidden + 7 * p.final_norm)
    # (the final norm is whole on every tensor-parallel rank)


def test_balanced_partition_is_no_slower_than_even():
    kw = dict(tp=1, pp=4, dp=1, micro_batch=4, global_batch=32)
    ev = sim.estimate("megatron-1.7b", "a100-80gb", **kw)
    ba = sim.estimate("megatron-1.7b", "a100-80gb", partition="balanced", **kw)
    assert ba.step_time <= ev.step_time * (1 + 1e-9)
    assert sum(ba.layers_per_stage) == 24 and ba.layers_per_stage != ev.layers_per_stage


def test_balanced_partition_keeps_every_stage_within_memory():
    """GPT-3 on 8 A100-80GB stages without recompute: the even split does not fit (the first
    stage holds 8 micro-batches); the balanced one moves layers back until each fits. Each
    stage's cap, found from the schedule's program order, is checked against the simulation:
    that many layers on the stage fit its device, one more does not (all of its memory: no headroom)."""
    from sim.plan.stage_costs import memory_caps
    kw = dict(tp=8, pp=8, micro_batch=1, global_batch=16, memory_headroom=0)
    ev = sim.estimate("gpt3-175b", "a100-80gb", **kw)
    ba = sim.estimate("gpt3-175b", "a100-80gb", partition="balanced", **kw)
    assert not ev.fits and ba.fits and sum(ba.layers_per_stage) == 96
    x = Slice(1, 8, False, "bf16")
    caps = memory_caps(ev.model, A100, ev.layout, x, layer_times(ev.model, A100, x), end_times(ev.model, A100, x),
                        ev.result.schedule)
    assert all(n <= c for n, c in zip(ba.layers_per_stage, caps))
    for s in (0, 3, 7):
        for n, fits in ((caps[s], True), (caps[s] + 1, False)):
            counts = [0] * 8
            counts[s], counts[(s + 1) % 8] = n, 96 - n
            e = sim.estimate("gpt3-175b", "a100-80gb", partition=counts, **kw)
            assert (e.peak_memory[s] <= A100.memory) is fits, (s, n)


@pytest.mark.parametrize("kwargs, message", [
    (dict(tp=5), "tp=5 does not divide the model's 24 heads; use tp in"),
    (dict(dp=2, micro_batch=3, global_batch=8), "global batch 8 does not split into dp=2 replicas of micro-batches of 3"),
    (dict(zero=2, pp=2, global_batch=2), "zero=2 with pp > 1"),
    (dict(zero=4), "zero must be one of 0, 1, 2, 3"),
    (dict(recompute="some"), "recompute must be one of none, selective, full"),
    (dict(precision="fp4"), "precision must be one of"),
    (dict(precision="fp8"), "precision 'fp8': a100-80gb has no FP8 tensor cores"),
    (dict(sequence_parallel=True), "sequence_parallel needs tp > 1"),
    (dict(tp_overlap=1), "tp_overlap must be True or False"),
    (dict(tp=0), "tp must be a positive int"),
    (dict(partition=[1, 2]), "partition must be 'even', 'balanced' or 1 layer counts summing to 24"),
])
def test_bad_layouts_are_refused_in_one_line(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")) as e:
        sim.estimate("megatron-1.7b", "a100-80gb", **kwargs)
    assert "\n" not in str(e.value)


def test_unknown_names():
    with pytest.raises(ValueError, match="unknown model 'gpt5'"):
        sim.estimate("gpt5")
    with pytest.raises(ValueError, match="unknown GPU or profile 'v100'"):
        sim.estimate("megatron-1.7b", "v100")


@pytest.mark.parametrize("kwargs", [
    dict(),
    dict(tp=2, pp=4, dp=2, micro_batch=2, global_batch=32, schedule="interleaved-1f1b", recompute="selective",
         sequence_parallel=True),
    dict(tp=8, pp=2, dp=4, micro_batch=1, global_batch=32, schedule="zbv", zero=1, overlap_grad_reduce=True),
    dict(tp=4, pp=4, dp=2, micro_batch=1, global_batch=16, schedule="interleaved-1f1b", recompute="full",
         tp_overlap=False),
])
def test_time_parts_add_up_to_the_step(kwargs):
    e = sim.estimate("megatron-3.6b", "a100-40gb", **kwargs)
    assert sum(e.time_parts.values()) == pytest.approx(e.step_time)
    assert min(e.time_parts.values()) >= 0 and 0 <= e.bubble_fraction < 1


@pytest.mark.parametrize("schedule", ["zb-h1", "zbv", "1f1b"])
def test_a_split_backwards_cost_is_its_own_part_and_no_tensor_parallel_collective(schedule):
    """What I + W cost beyond B is `split_backward`. On this project's CPU profile torch's split
    backward costs more than B (rule 15's split, measured blocks), with no tensor parallelism and
    so no tensor-parallel collective; under tensor parallelism on a GPU, overlapped, the split's
    cost is the collectives B hides under W. A schedule without I has none. On the GPU the parts
    add up to the step."""
    from pathlib import Path
    cpu = sim.load_profile(Path(__file__).resolve().parents[3] / "data" / "cpu-loop" / "profile-s9.json")
    gpt = sim.Transformer(layers=4, hidden=128, heads=4, seq=64, vocab=512, attention="flash", dropout=False,
                          kernels="torch")  # exec's GPT (exec.models.spec.ModelSpec.transformer)
    on_cpu = sim.estimate(gpt, cpu, pp=2, micro_batch=8, global_batch=32, precision="fp32", schedule=schedule)
    on_gpu = sim.estimate("megatron-3.6b", "a100-40gb", tp=2, pp=2, micro_batch=1, global_batch=8, schedule=schedule,
                          tp_overlap=True)
    assert on_cpu.time_parts["tp_collectives"] == 0.0
    for e in (on_cpu, on_gpu):
        assert (e.time_parts["split_backward"] > 0) == (schedule != "1f1b")
    assert sum(on_gpu.time_parts.values()) == pytest.approx(on_gpu.step_time)


def test_the_data_parallel_reduction_ends_the_step():
    """pp = 1: the stage's gradients are all-reduced after its last backward, so doubling the replicas
    (and the batch) lengthens the step by exactly that all-reduce; the figure's schedule has one R."""
    from sim.cost.data_parallel import grad_reduce_times
    one = sim.estimate("megatron-1.7b", A100, micro_batch=4, global_batch=8)
    two = sim.estimate("megatron-1.7b", A100, micro_batch=4, global_batch=16, dp=2)
    reduce = grad_reduce_times(two.model, A100, two.layout, stage_params(two.model, [24], 1, [0]), [0])
    assert two.step_time - one.step_time == pytest.approx(reduce[0])
    assert two.time_parts["grad_reduce"] == pytest.approx(reduce[0]) and one.time_parts["grad_reduce"] == 0
    assert [str(a) for a in two.result.schedule.programs[0] if a.kind.value == "REDUCE_GRAD"] == ["0REDUCE_GRAD"]


@pytest.mark.parametrize("model, keywords", [
    ("megatron-1.7b", dict(tp=2, pp=4, dp=2, micro_batch=2, recompute="selective", zero=1)),
    ("megatron-1.7b", dict(tp=1, pp=2, dp=4, micro_batch=1, zero=3, precision="fp8")),
    ("mixtral-8x7b", dict(tp=2, pp=4, dp=4, micro_batch=1, ep=4, sequence_parallel=True, schedule="dualpipe",
                          virtual=2)),
])
def test_steps_stage_costs_share_pass_times_and_cost_the_same(model, keywords):
    """`Steps.stage_costs` times each stage's passes once per layer times and split (`Steps.pass_times`),
    and its costs and parts are `stage_costs`' own, computed afresh, for layouts that share those passes."""
    from sim.plan.layout import Layout
    from sim.plan.stage_costs import pass_times, stage_costs
    from sim.plan.steps import Steps
    from helpers import counting_calls
    steps = Steps(model, "h100-80gb")
    for i, zero in enumerate((keywords.get("zero", 0), 1 if keywords.get("zero") == 0 else 0)):
        lay = Layout(global_batch=64, **{**keywords, "zero": zero})
        layers, placement = even(steps.model.layers, lay.pp), list(range(lay.pp))
        dense, moe = steps.layers(lay)
        fresh = stage_costs(steps.model_of(lay), steps.profile, lay, steps.slice(lay), dense, steps.ends(lay),
                            layers, placement, moe)
        with counting_calls(pass_times) as calls:
            assert steps.stage_costs(lay, layers, placement) == fresh
        assert calls[pass_times] == (i == 0)  # the second layout (another ZeRO stage): the first's passes
