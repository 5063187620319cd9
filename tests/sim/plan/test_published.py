"""The estimate held to what it can assert about published measurements without timing noise:
orders, ratios within the published numbers' own spread, FLOP counts, and the pipeline bubble
against its closed form. The times themselves are compared, not asserted, by
benchmarks/bench_published.py (docs/validation.md, "The planner against published runs"). Korthikanti et al. 2022's Table 2
(activation bytes) is tested in tests/sim/model/test_transformer.py."""
from __future__ import annotations

import pytest

import sim
from sim.plan import published
from sim.hardware.kernels import precision_bytes
from sim.hardware.network import links_of
from sim.cost.layer import Slice, layer_times


@pytest.fixture(scope="module")
def layer():
    """Table 4's five techniques on one 22B layer: name -> sim.cost.layer.LayerTimes."""
    return {name: published.korthikanti_layer(sp, rc) for name, sp, rc, _, _ in published.KORTHIKANTI_TABLE_4}


def test_table_4_sequence_parallelism_shortens_the_forward(layer):
    """Korthikanti et al. 2022, Table 4: 7.2 ms against 7.7 ms, "the layer-norm and dropout
    layers being performed on 1/t of the data" (Sec. 6.2), with and without selective recompute."""
    assert layer["sequence parallelism"].forward < layer["baseline, no recompute"].forward
    assert layer["selective + sequence"].forward < layer["selective recompute"].forward


def test_table_4_recompute_orders_the_backward(layer):
    """Table 4: backward 19.5 (full recompute) > 13.2 (selective) > 11.9 ms (none); the gaps
    (7.6 and 1.3 ms) are far above the table's 0.05 ms rounding."""
    full, selective, none = (layer[n].backward for n in ("baseline, full recompute", "selective recompute",
                                                          "baseline, no recompute"))
    assert full > selective > none
    # recompute leaves the forward alone: Table 4's forward is 7.7 ms in all three rows
    assert layer["baseline, full recompute"].forward == layer["selective recompute"].forward \
        == layer["baseline, no recompute"].forward


@pytest.fixture(scope="module")
def table_5():
    return published.korthikanti_table_5()


# Table 5's throughput increase of the present work over full recompute is "between 29.0% and
# 32.1%" (Sec. 6.3) over four models that differ 45x in size: the ratio full / present is
# 1.291, 1.319, 1.297, 1.321. The paper reads it as one effect of about 30%; its scatter over
# the models, 0.031 (max - min), is how far its own measurements stray from that. A prediction
# further than that from a row's ratio, beyond the row's rounding (times to 0.01 s), is off by
# more than the measurements vary.
PUBLISHED_RATIOS = [full / present for *_, full, present, _, _ in published.KORTHIKANTI_TABLE_5]
RATIO_BAND = max(PUBLISHED_RATIOS) - min(PUBLISHED_RATIOS)


def _rounding(full: float, present: float) -> float:
    """How far the ratio of two times printed to 0.01 s can be from the ratio of the true ones."""
    return max(abs((full + d1) / (present + d2) - full / present) for d1 in (-0.005, 0.005) for d2 in (-0.005, 0.005))


@pytest.mark.xfail(strict=True, reason="the estimate's full/present ratio is 1.34-1.37 against the published "
                   "1.29-1.32 (2026-11-22: 22B 1.353 vs 1.291, 175B 1.372 vs 1.319, 530B 1.355 vs 1.297): it "
                   "makes the present work gain more over full recompute than published; docs/validation.md")
def test_table_5_full_over_present_is_within_the_published_spread(table_5):
    off = {r["model"]: (round(r["ratio"], 3), round(r["ratio_published"], 3)) for r in table_5
           if abs(r["ratio"] - r["ratio_published"]) > RATIO_BAND + _rounding(r["full_published"], r["present_published"])}
    assert not off, f"full/present ratio (predicted, published) off by more than {RATIO_BAND:.3f}: {off}"


def test_table_5_ratio_is_at_most_the_layers_ratio(table_5):
    """The whole step gains less from the present work than one layer does: the embedding, the
    output layer and the optimizer do not recompute. Published: the 22B's step gains 1.42/1.10 =
    1.291, its layer (Table 4) 27.2/20.3 = 1.340."""
    table_4 = {name: fwd + bwd for name, _, _, fwd, bwd in published.KORTHIKANTI_TABLE_4}
    layer_ratio = table_4["baseline, full recompute"] / table_4["selective + sequence"]
    step_22b = next(row for row in published.KORTHIKANTI_TABLE_5 if row[0] == published.KORTHIKANTI_22B_LAYER["model"])
    assert step_22b[6] / step_22b[7] < layer_ratio  # the paper's own tables: 1.291 < 1.340
    x = published.KORTHIKANTI_22B_LAYER
    g = sim.GPUS[published.A100]
    for r, row in zip(table_5, published.KORTHIKANTI_TABLE_5):
        m = sim.MODELS[row[0]]
        prec = published.KORTHIKANTI_PRECISION
        full = layer_times(m, g, Slice(row[4], x["tp"], False, prec), "full")
        present = layer_times(m, g, Slice(row[4], x["tp"], True, prec), "selective")
        assert 1.0 < r["ratio"] <= (full.forward + full.backward) / (present.forward + present.backward), r["model"]


def test_table_5_mfu_follows_from_its_times_and_our_flops():
    """Model FLOPs (Korthikanti et al. 2022, Eq. 7, our `flops_per_iteration(..., "none")`) over
    Table 5's present-work time, GPUs and the A100's 312 TFLOP/s give Table 5's MFU to 0.5
    points (the table prints one decimal; 0.2 points is the largest difference found): a check
    of the FLOP formulas against the paper's own arithmetic."""
    for row in published.KORTHIKANTI_TABLE_5:
        assert published.published_mfu(row) == pytest.approx(row[8], abs=0.005), row[0]


def test_table_1_percent_of_peak_is_its_throughput_over_312():
    """Narayanan et al. 2021, Table 1: "% of theoretical peak" is the TFLOP/s per GPU over the
    A100's 312 (Sec. 5), the peak `sim.GPUS` holds for 16-bit."""
    peak = sim.GPUS[published.A100].flops(published.NARAYANAN_PRECISION) / 1e12
    for row in published.NARAYANAN_TABLE_1:
        assert round(100 * row[7] / peak) == row[8], row[0]


# The bubble against its closed form. With every chunk (model stage) taking f + b per
# micro-batch and free transfers, 1F1B over p devices and m micro-batches takes (m + p - 1)(f + b)
# and interleaved 1F1B with v chunks a device (m a multiple of p) (vm + p - 1)(f + b) (Narayanan
# et al. 2021, Sec. 2.2; docs/schedules.md): the bubble is (p - 1) / (vm + p - 1). The estimate
# adds, per micro-batch, the embedding on the first chunk and the output layer on the last (E in
# all, time_parts["embedding_and_output"] = m E / p), and a transfer of at most d between chunks.
# Bounds, for a schedule whose order per device is fixed (start = the latest of its inputs):
#   lower: shortening operations and removing delays cannot lengthen it, so makespan >= T(tau),
#          tau = the layers' f + b of a chunk;
#   upper: lengthening every operation by E (it covers either end) and by d for each of its
#          two passes (every path crosses fewer devices than it has operations) cannot shorten
#          it, so makespan <= T(tau + E + 2d), provided no transfer queues behind another on its
#          link (each is shorter than the operation that sends it: asserted).
# Its busy time is m(v p tau + E) in all, so the bubble lies in
#   [b0 - m E / (p T(tau)),  1 - (1 - b0) tau / (tau + E + 2d)],  b0 = (p - 1) / (vm + p - 1).
@pytest.mark.parametrize("name,pp,batch,virtual", [("korthikanti-175b", 8, 64, None), ("korthikanti-175b", 8, 64, 3),
                                                   ("korthikanti-530b", 35, 280, 3)])
def test_bubble_is_the_closed_form_within_what_the_ends_and_transfers_explain(name, pp, batch, virtual):
    e = sim.estimate(name, published.A100, tp=8, pp=pp, dp=1, micro_batch=1, global_batch=batch,
                     schedule="interleaved-1f1b" if virtual else "1f1b", virtual=virtual, recompute="selective",
                     sequence_parallel=True)
    m, p, v = e.layout.micro_batches, pp, virtual or 1
    assert len(set(e.layers_per_stage)) == 1, "the closed form is for equal chunks"
    model, g = sim.MODELS[name], e.profile
    lt = layer_times(model, g, Slice(1, 8, True, "bf16"), "selective")
    links = links_of(g)
    latency = max(links.node.p2p_latency, links.network.p2p_latency)
    bandwidth = min(links.node.p2p_bandwidth, links.network.p2p_bandwidth)
    f, tau = e.layers_per_stage[0] * lt.forward, e.layers_per_stage[0] * (lt.forward + lt.backward)
    ends = e.time_parts["embedding_and_output"] * p / m
    sent = model.seq * model.hidden * precision_bytes("bf16") / 8   # b s h / t (scatter/gather)
    d = latency + sent / bandwidth
    assert sent / bandwidth < f, "transfers would queue"

    def closed(chunk):
        return (v * m + p - 1) * chunk

    assert closed(tau) <= e.result.makespan * (1 + 1e-12)
    assert e.result.makespan <= closed(tau + ends + 2 * d)
    b0 = (p - 1) / (v * m + p - 1)
    assert b0 - m * ends / (p * closed(tau)) - 1e-12 <= e.bubble_fraction <= 1 - (1 - b0) * tau / (tau + ends + 2 * d)
