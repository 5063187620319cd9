"""One profile, many shapes (`sim.cost.block_fit`): the in-step fit recovers its two numbers in closed form, keeps every measured block exactly, and times every other shape, the ends and the recompute modes from the kernel model under it."""
import dataclasses

import pytest
from hypothesis import given, settings, strategies as st

import sim
from sim.cost.ends import end_kernels, end_kernel_counts, end_times
from sim.cost.layer import Slice, block_fits, kernel_layer_times, layer_times
from sim.cost.block_fit import InStep, block_in_step, fit, nearest_block, recompute_cost
from sim.hardware.profile import from_dict

from tests.sim.hardware.test_layer_table import FIXTURE, GPT, _cpu

SLOWDOWN, PER_KERNEL = 1.25, 3e-5  # the synthetic device's in-step numbers
X = Slice(4, precision="fp32")


def _passes(lt) -> dict:
    return dict(F=lt.forward, B=lt.backward, I=lt.backward_input, W=lt.backward_weight)


def _synthetic(shapes=((64, 2, 32), (128, 4, 64)), micro_batches=(2, 8)) -> sim.DeviceProfile:
    """A profile whose measured blocks are exactly SLOWDOWN x the kernel model + PER_KERNEL a kernel."""
    plain = from_dict(_cpu(), "test")
    rows = []
    for hidden, heads, seq in shapes:
        m = dataclasses.replace(GPT, hidden=hidden, heads=heads, seq=seq, ffn=4 * hidden, kv_heads=None)
        for b in micro_batches:
            lt = kernel_layer_times(m, plain, Slice(b, precision="fp32"))
            times = [SLOWDOWN * _passes(lt)[p] + PER_KERNEL * lt.kernels[p] for p in "FBIW"]
            rows.append(["fp32", hidden, heads, 4 * hidden, seq, b, "none", *times])
    return from_dict(_cpu(layers={"blocks": {"rows": rows, **FIXTURE}}), "test")


@settings(max_examples=50, deadline=None)
@given(st.floats(0.5, 3.0), st.floats(0.0, 1e-4),
       st.lists(st.tuples(st.floats(1e-4, 1e-2), st.integers(1, 60)), min_size=2, max_size=6))
def test_the_fit_recovers_a_slowdown_and_a_per_kernel_cost(slowdown, per_kernel, passes):
    """Points made by t = a d + b n give back a and b wherever they can separate them."""
    points = [(d, n, slowdown * d + per_kernel * n) for d, n in passes]
    f = fit(points, launch=1e-6)
    if len({round(d / n, 12) for d, n in passes}) > 1:  # not all of one d / n: a and b are separable
        assert f.slowdown == pytest.approx(slowdown, rel=1e-6)
        assert f.per_kernel == pytest.approx(per_kernel, rel=1e-5, abs=1e-12)
        assert f.residual < 1e-6
    for d, n, t in points:
        assert f.time(d, n) == pytest.approx(t, rel=1e-6)


def test_one_point_keeps_the_profiles_launch_cost_and_fits_the_slowdown():
    f = fit([(2e-3, 10, 3e-3)], launch=1e-5)
    assert f.per_kernel == 1e-5 and f.slowdown == pytest.approx((3e-3 - 1e-4) / 2e-3)
    assert f.time(2e-3, 10) == pytest.approx(3e-3)
    assert fit([], launch=1e-5) is None


def test_a_negative_per_kernel_cost_is_refused_for_zero():
    # t = 2 d - 1e-4 n: least squares would give a per-kernel cost of -1e-4 s
    f = fit([(1e-3, 10, 1e-3), (2e-3, 10, 3e-3), (3e-3, 10, 5e-3)], launch=1e-5)
    assert f.per_kernel == 0.0 and f.slowdown > 0
    assert isinstance(f, InStep) and f.rows == 3


def test_measured_blocks_are_kept_exactly_and_other_shapes_follow_the_fit():
    p, plain = _synthetic(), from_dict(_cpu(), "test")
    for (_, hidden, heads, ffn, seq, b, _), row in p.layers.blocks.items():  # exact where measured
        m = dataclasses.replace(GPT, hidden=hidden, heads=heads, seq=seq, ffn=ffn, kv_heads=None)
        assert _passes(layer_times(m, p, Slice(b, precision="fp32"))) == row
    for hidden, heads, seq, b, recompute in ((96, 4, 48, 4, "none"), (256, 8, 128, 1, "full"), (64, 2, 32, 4, "full")):
        m = dataclasses.replace(GPT, hidden=hidden, heads=heads, seq=seq, ffn=None, kv_heads=None)
        x = Slice(b, precision="fp32")
        got, model = layer_times(m, p, x, recompute), kernel_layer_times(m, plain, x, recompute)
        assert set(got.kernels.values()) == {0}  # the fit holds the host's cost
        for k, t in _passes(got).items():
            assert t == pytest.approx(SLOWDOWN * _passes(model)[k] + PER_KERNEL * model.kernels[k], rel=1e-6)


def test_the_fitted_blocks_grow_with_the_shape():
    p = _synthetic()
    for field, values in (("hidden", (64, 96, 128, 192, 256, 512)), ("seq", (16, 32, 64, 128, 256))):
        forward = [layer_times(dataclasses.replace(GPT, ffn=None, **{field: v}), p, X).forward for v in values]
        assert forward == sorted(forward), field


def test_unmeasured_ends_follow_the_fit_without_a_launch_floor():
    p, plain = _synthetic(), from_dict(_cpu(), "test")
    m = dataclasses.replace(GPT, vocab=1000)
    kernels = end_kernels(m, plain, X)
    ends = end_times(m, p, X)
    for key in ("first_F", "last_F", "last_I", "last_W"):
        assert ends[key] == pytest.approx(SLOWDOWN * sum(kernels[key]) + PER_KERNEL * len(kernels[key]), rel=1e-6)
    assert ends["last_B"] == ends["last_I"] + ends["last_W"]
    assert set(end_kernel_counts(m, p, X).values()) == {0}
    # a model the blocks do not stand for (tensor parallelism): the kernel model
    assert end_times(m, p, Slice(4, tp=2, precision="fp32")) == end_times(m, plain, Slice(4, tp=2, precision="fp32"))


def test_the_estimate_uses_the_fit_on_a_model_of_another_shape():
    """A model the profile did not measure: each stage's F is its blocks under the fit plus its
    end under the fit, cross-checked on the simulated step."""
    p = _synthetic()
    m = dataclasses.replace(GPT, hidden=96, heads=4, seq=48, ffn=None, kv_heads=None, layers=4)
    e = sim.estimate(m, gpu=p, gpus_per_node=2, pp=2, micro_batch=4, global_batch=8, schedule="1f1b",
                     precision="fp32")
    block, ends = layer_times(m, p, X), end_times(m, p, X)
    f = {ev.action.stage: ev.duration for ev in e.result.events if ev.action.kind.name == "F"}
    assert f[0] == pytest.approx(2 * block.forward + ends["first_F"], rel=1e-9)
    assert f[1] == pytest.approx(2 * block.forward + ends["last_F"], rel=1e-9)


def _scaled(factors: dict) -> sim.DeviceProfile:
    """`_synthetic`'s profile with each shape's measured passes times its factor {(hidden, heads, seq): k}."""
    p = _synthetic()
    rows = [["fp32", *k[1:7], *(factors[(k[1], k[2], k[4])] * row[q] for q in "FBIW")] for k, row in p.layers.blocks.items()]
    return from_dict(_cpu(layers={"blocks": {"rows": rows, **FIXTURE}}), "test")


@settings(max_examples=25, deadline=None)
@given(st.floats(0.5, 2.0))
def test_blocks_all_slower_by_one_factor_scale_every_other_shape_by_it(k):
    """Every measured block k times the synthetic device's: the fit takes k, the nearest
    block's residual is 1, and an unmeasured block is k times the closed form."""
    p, plain = _scaled({(64, 2, 32): k, (128, 4, 64): k}), from_dict(_cpu(), "test")
    for hidden, heads, seq, b, recompute in ((96, 4, 48, 4, "none"), (256, 8, 128, 1, "full"), (48, 2, 16, 3, "none")):
        m = dataclasses.replace(GPT, hidden=hidden, heads=heads, seq=seq, ffn=None, kv_heads=None)
        x = Slice(b, precision="fp32")
        got, model = _passes(layer_times(m, p, x, recompute)), kernel_layer_times(m, plain, x, recompute)
        for q, t in got.items():
            assert t == pytest.approx(k * (SLOWDOWN * _passes(model)[q] + PER_KERNEL * model.kernels[q]), rel=1e-6)


@settings(max_examples=25, deadline=None)
@given(st.floats(0.6, 1.6), st.floats(0.6, 1.6))
def test_an_unmeasured_block_carries_the_nearest_measured_blocks_residual(small, large):
    """Two measured shapes off the fit by different factors: a shape nearer the small one
    takes the fit times the small block's measured-over-fitted, per pass; nearer the large one,
    the large block's; and at a measured shape the rule gives back its measured row."""
    p = _scaled({(64, 2, 32): small, (128, 4, 64): large})
    fits = block_fits(GPT, p)
    x = Slice(8, precision="fp32")

    def fitted(m, xx):
        lt = kernel_layer_times(m, p, xx)
        return {q: fits[q].time(_passes(lt)[q], lt.kernels[q]) for q in "FBIW"}

    for (hidden, heads, seq), near in (((56, 2, 28), (64, 2, 32)), ((160, 4, 80), (128, 4, 64))):
        m = dataclasses.replace(GPT, hidden=hidden, heads=heads, seq=seq, ffn=None, kv_heads=None)
        anchor = dataclasses.replace(GPT, hidden=near[0], heads=near[1], seq=near[2], ffn=4 * near[0], kv_heads=None)
        row = p.layers.block("fp32", near[0], near[1], 4 * near[0], near[2], 8, "none")
        got, mine, at = _passes(layer_times(m, p, x)), fitted(m, x), fitted(anchor, x)
        for q in "FBIW":
            assert got[q] == pytest.approx(mine[q] * row[q] / at[q], rel=1e-9)
        assert block_in_step(anchor, p, x, "none", kernel_layer_times(anchor, p, x), kernel_layer_times) == \
            pytest.approx(dict(row), rel=1e-9)


def test_the_nearest_block_is_by_shape_and_micro_batch_and_falls_back_to_no_recompute():
    p = _synthetic()
    key, _ = nearest_block(p, "fp32", "none", (60, 2, 240, 30, 3))
    assert key[1:6] in {(64, 2, 256, 32, 2)}
    key, _ = nearest_block(p, "fp32", "full", (200, 8, 800, 100, 7))  # no full rows: the "none" ones
    assert key[1:7] == (128, 4, 512, 64, 8, "none")
    assert nearest_block(p, "bf16", "none", (64, 2, 256, 32, 2)) is None


@settings(max_examples=20, deadline=None)
@given(st.lists(st.floats(1e-4, 5e-4), min_size=5, max_size=5), st.floats(0.0, 9e-5))
def test_unmeasured_ends_add_the_stages_own_cost_the_measured_ends_hold(costs, scatter):
    """Measured ends = their kernels under the fit + a stage's own cost a pass, each row off by
    +-scatter (half one way, half the other): an end the profile did not measure takes its
    kernels under the fit plus that cost (the scatter cancels in the mean)."""
    first_f, first_w, last_f, last_i, last_w = costs
    p0 = _synthetic()
    rows = []
    for i, (hidden, seq, vocab, b) in enumerate(((64, 32, 512, 2), (64, 32, 512, 8), (128, 64, 512, 2), (128, 64, 512, 8))):
        m, x = dataclasses.replace(GPT, hidden=hidden, seq=seq, vocab=vocab), Slice(b, precision="fp32")
        k = {key: SLOWDOWN * sum(v) + PER_KERNEL * len(v) for key, v in end_kernels(m, p0, x).items()}
        off = scatter if i % 2 else -scatter
        fw, li, lw = k["first_W"] + first_w + off, k["last_I"] + last_i + off, k["last_W"] + last_w + off
        rows.append(["fp32", hidden, seq, vocab, b, k["first_F"] + first_f + off, fw, k["last_F"] + last_f + off,
                     li + lw, li, lw])
    data = _cpu(layers={"blocks": {"rows": [["fp32", *k[1:7], *(v[q] for q in "FBIW")] for k, v in p0.layers.blocks.items()],
                                   **FIXTURE}, "ends": {"rows": rows, **FIXTURE}})
    p, plain = from_dict(data, "test"), from_dict(_cpu(), "test")
    m = dataclasses.replace(GPT, hidden=96, seq=48, vocab=1000, heads=4, ffn=None, kv_heads=None)
    kernels = end_kernels(m, plain, X)
    ends = end_times(m, p, X)
    for key, cost in (("first_F", first_f), ("first_W", first_w), ("last_F", last_f), ("last_I", last_i), ("last_W", last_w)):
        want = SLOWDOWN * sum(kernels[key]) + PER_KERNEL * len(kernels[key]) + cost
        assert ends[key] == pytest.approx(want, rel=1e-6, abs=1e-12)
    assert ends["last_B"] == pytest.approx(ends["last_I"] + ends["last_W"])


def _with_recompute(wrapper: dict, k: float = 1.0) -> sim.DeviceProfile:
    """The synthetic device's blocks, and the same blocks with full recompute: k x the
    closed form of the recomputing kernels plus `wrapper` seconds a pass (the recompute
    wrapper's own host cost)."""
    p, plain = _synthetic(), from_dict(_cpu(), "test")
    rows = [["fp32", *key[1:7], *(row[q] for q in "FBIW")] for key, row in p.layers.blocks.items()]
    for key in list(p.layers.blocks):
        _, hidden, heads, ffn, seq, b, _ = key
        m = dataclasses.replace(GPT, hidden=hidden, heads=heads, seq=seq, ffn=ffn, kv_heads=None)
        lt = kernel_layer_times(m, plain, Slice(b, precision="fp32"), "full")
        rows.append(["fp32", hidden, heads, ffn, seq, b, "full",
                     *(k * (SLOWDOWN * _passes(lt)[q] + PER_KERNEL * lt.kernels[q]) + wrapper[q] for q in "FBIW")])
    return from_dict(_cpu(layers={"blocks": {"rows": rows, **FIXTURE}}), "test")


@settings(max_examples=20, deadline=None)
@given(st.lists(st.floats(0.0, 5e-4), min_size=4, max_size=4), st.floats(0.7, 1.3))
def test_full_recompute_keeps_its_wrappers_cost_at_any_shape(costs, k):
    """Blocks with full recompute measured as their kernels plus a cost a pass (k = 1):
    `recompute_cost` finds that cost, and a block of any other shape takes its kernels under
    the fit plus it, not the cost scaled with the kernels. With the kernels also off by a
    factor k, a measured block still comes out exactly as measured."""
    wrapper = dict(zip("FBIW", costs))
    plain = from_dict(_cpu(), "test")
    exact = _with_recompute(wrapper)
    assert recompute_cost(GPT, exact, Slice(1, precision="fp32"), "full", kernel_layer_times) == \
        pytest.approx(wrapper, rel=1e-6, abs=1e-12)
    for hidden, heads, seq, b in ((32, 1, 16, 8), (96, 4, 48, 4), (256, 8, 128, 2)):
        m = dataclasses.replace(GPT, hidden=hidden, heads=heads, seq=seq, ffn=None, kv_heads=None)
        x = Slice(b, precision="fp32")
        model = kernel_layer_times(m, plain, x, "full")
        got = _passes(layer_times(m, exact, x, "full"))
        for q in "FBIW":
            assert got[q] == pytest.approx(SLOWDOWN * _passes(model)[q] + PER_KERNEL * model.kernels[q] + wrapper[q],
                                           rel=1e-6)
    off = _with_recompute(wrapper, k)
    for key, row in off.layers.blocks.items():
        if key[6] == "full":
            m = dataclasses.replace(GPT, hidden=key[1], heads=key[2], seq=key[4], ffn=key[3], kv_heads=None)
            x = Slice(key[5], precision="fp32")
            assert block_in_step(m, off, x, "full", kernel_layer_times(m, off, x, "full"), kernel_layer_times) == \
                pytest.approx(dict(row), rel=1e-9)
