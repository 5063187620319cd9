"""exec.models.spec: stage splits compose to the full model, balanced cuts are optimal, batches are deterministic."""
import itertools
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from exec.models.cuts import measure_layer_times
from exec.models.spec import ModelSpec
from sim.search.partition import balanced_cuts

SMALL = dict(layers=4, hidden=32, seq=8, vocab=64, heads=2, batch_size=4)


@pytest.mark.parametrize("model", ["mlp", "gpt"])
@pytest.mark.parametrize("stages", [1, 2, 3])
def test_stages_compose_to_full_model(model, stages):
    spec = ModelSpec(model, **SMALL)
    x, y = spec.batch()
    full = torch.nn.Sequential(*spec.build_layers())
    want = full(x)
    parts = spec.build_stages(stages)
    assert len(parts) == stages and all(len(p) >= 1 for p in parts)
    out = x
    for p in parts:
        out = p(out)
    assert torch.equal(out, want)
    assert spec.loss(out, y).ndim == 0


def test_layers_balance_counts_and_errors():
    spec = ModelSpec("mlp", **{**SMALL, "layers": 7})
    assert spec.partition(3) == [0, 2, 5, 7]
    gpt = ModelSpec("gpt", **SMALL)
    assert gpt.num_layers == 6 and len(gpt.build_layers()) == 6
    with pytest.raises(ValueError, match="every stage needs at least one layer"):
        spec.partition(8)
    with pytest.raises(ValueError, match="balance must be"):
        spec.partition(2, balance="flops")
    with pytest.raises(ValueError, match="bounds must rise"):
        spec.build_stages(2, bounds=[0, 7, 7])


def test_batch_and_weights_are_deterministic():
    for model in ("mlp", "gpt"):
        a, b = ModelSpec(model, **SMALL), ModelSpec(model, **SMALL)
        for t1, t2 in zip(a.batch(), b.batch()):
            assert torch.equal(t1, t2)
        for l1, l2 in zip(a.build_layers(), b.build_layers()):
            for p1, p2 in zip(l1.parameters(), l2.parameters()):
                assert torch.equal(p1, p2)
    x, y = ModelSpec("gpt", **SMALL).batch()
    assert x.dtype == torch.long and torch.equal(x[:, 1:], y[:, :-1])  # next-token targets
    other = ModelSpec("mlp", **{**SMALL, "seed": 1}).batch()[0]
    assert not torch.equal(other, ModelSpec("mlp", **SMALL).batch()[0])
    mbs = ModelSpec("mlp", **SMALL).micro_batches(2)
    assert len(mbs) == 2 and mbs[0][0].shape[0] == 2
    with pytest.raises(ValueError, match="divisor"):
        ModelSpec("mlp", **SMALL).micro_batches(3)


def _brute(costs, stages, cut_bytes, tolerance):
    n = len(costs)
    splits = []
    for cuts in itertools.combinations(range(1, n), stages - 1):
        b = [0, *cuts, n]
        slowest = max(math.fsum(costs[x:y]) for x, y in zip(b, b[1:]))
        splits.append((slowest, sum(cut_bytes[c - 1] for c in cuts), cuts))
    t_star = min(s for s, _, _ in splits)
    ok = [(by, s) for s, by, _ in splits if s <= t_star * (1 + tolerance)]
    return t_star, min(ok)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_balanced_cuts_matches_brute_force(data):
    n = data.draw(st.integers(1, 9))
    costs = data.draw(st.lists(st.integers(0, 20), min_size=n, max_size=n))
    stages = data.draw(st.integers(1, n))
    cut_bytes = data.draw(st.lists(st.integers(0, 5), min_size=n - 1, max_size=n - 1))
    tolerance = data.draw(st.sampled_from([0.0, 0.25]))
    cuts = balanced_cuts(costs, stages, cut_bytes, tolerance)
    assert len(cuts) == stages - 1 and list(cuts) == sorted(set(cuts)) and all(0 < c < n for c in cuts)
    b = [0, *cuts, n]
    slowest = max(math.fsum(costs[x:y]) for x, y in zip(b, b[1:]))
    got = (sum(cut_bytes[c - 1] for c in cuts), slowest)
    t_star, want = _brute(costs, stages, cut_bytes, tolerance)
    assert got == want
    if tolerance == 0:
        assert slowest == t_star


def test_time_balance_beats_layer_balance_on_uneven_costs():
    costs = [8.0, 1, 1, 1, 1, 1, 1, 1]           # one much wider layer
    by_time = [0, *balanced_cuts(costs, 2), 8]
    by_layers = ModelSpec("mlp", **{**SMALL, "layers": 8}).partition(2)
    slow = lambda b: max(sum(costs[x:y]) for x, y in zip(b, b[1:]))
    assert slow(by_time) == 8 < slow(by_layers) == 11
    # ties go to the cut that sends fewer bytes
    assert balanced_cuts([1, 1, 1, 1], 2, [9, 1, 9], tolerance=0.5) == [2]
    assert balanced_cuts([2, 1, 1, 1], 2, [1, 9, 9], tolerance=0.5) == [1]


def test_time_balance_on_a_really_uneven_model():
    # layers 0 and 1 each do ~250x the work of layers 2 and 3: far beyond timing noise on a
    # busy machine. Halving by layer count puts both heavy layers on stage 0 (~500 units
    # against ~2); the time split [0, 1, 4] (~250 against ~252) is the only one within the
    # partitioner's 2 % tolerance of the best, so it is chosen whatever the noise. (With a
    # single heavy layer, [0, 1, 4] and [0, 2, 4] differ by less than the tolerance and
    # either is right.)
    # One torch thread, as a rank on a 2-core host has: with two, every op waits for the
    # pool's other thread, and on a loaded machine that thread loses its core for up to
    # ~100 ms, so that a light layer could measure as slow as a heavy one.
    spec = ModelSpec("mlp", layers=4, hidden=64, seq=16, batch_size=8, ffn=(16384, 16384, 64, 64))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        times, out_bytes = measure_layer_times(spec, micro_batches=1, repeats=3)
        got = spec.partition(2, "time")
    finally:
        torch.set_num_threads(threads)
    assert out_bytes == [8 * 16 * 64 * 4] * 4
    assert got == [0, 1, 4], f"time split {got} with layer times {times}"
    assert spec.partition(2, "layers") == [0, 2, 4]
