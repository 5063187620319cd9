"""sim.plot's figures: they work on any Result, measured or simulated, small or large
(its command line is tests/sim/plot/test_cli.py)."""
from __future__ import annotations

from pathlib import Path

import pytest
from matplotlib.patches import Rectangle

import sim
from sim.plot import heatmap
from sim.schedule.registry import TEXTBOOK
from sim.plot.gantt import DPI, MAX_HEIGHT, WIDTH, counts_micro_batches, format_times, human_bytes, plot_compare, plot_overlay, \
    plot_result, save_figure, timeline_style

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, f"{path} is not a PNG"
    assert len(data) > 10_000, f"{path} is suspiciously small ({len(data)} bytes)"


def compute_bars(ax) -> list[Rectangle]:
    return [p for p in ax.patches if isinstance(p, Rectangle) and (p.get_gid() or "").startswith("compute")]


def measured_copy(result: sim.Result, offset: float = 1000.0, stretch: float = 0.1) -> sim.Result:
    """`result` as if measured: times start at `offset` and rank r runs (1 + stretch*r) slower."""
    def t(time: float, rank: int) -> float:
        return offset + time * (1 + stretch * rank)

    events = [sim.Event(e.rank, e.action, t(e.start, e.rank), t(e.end, e.rank), e.peer) for e in result.events]
    memory = [[(t(x, r), b) for x, b in series] for r, series in enumerate(result.memory)]
    activations = [[(t(x, r), n) for x, n in series] for r, series in enumerate(result.activations)]
    return sim.Result(result.schedule, events, memory, activations, source="measured")


# ---------------------------------------------------------------- the figures

@pytest.fixture(scope="module")
def one_f_one_b():
    return sim.simulate(sim.make_schedule("1f1b", devices=4, micro_batches=8), sim.Costs())


def test_plot_result_draws_one_bar_per_compute_event(one_f_one_b):
    fig = plot_result(one_f_one_b)
    gantt, memory = fig.axes[:2]
    bars = compute_bars(gantt)
    assert len(bars) == len(one_f_one_b.compute_events()) == 4 * 8 * 2
    # bars start at their event's start, relative to t0, on their rank's row
    first = next(b for b in bars if b.get_gid() == "compute 0F0")
    assert first.get_x() == 0 and first.get_width() == 1
    assert memory.get_ylabel().startswith("activations held")
    assert len(memory.get_lines()) == one_f_one_b.ranks


def test_plot_result_of_split_backward_and_bytes(tmp_path):
    # I and W bars, and byte-sized memory with static weights: the axis is in GiB
    sched = sim.Schedule([["0F0", "0F1", "0I0", "0W0", "0I1", "0W1"],
                          ["1F0", "1I0", "1F1", "1I1", "1W0", "1W1"]], name="split")
    result = sim.simulate(sched, sim.Costs(static_bytes=2 * 2**30, activation_bytes=2**29))
    assert not counts_micro_batches(result)
    fig = plot_result(result)
    assert len(compute_bars(fig.axes[0])) == 12
    assert fig.axes[1].get_ylabel() == "memory held\n(full row: 3 GiB)"  # 2 GiB static + 2 x 0.5 GiB
    save_figure(fig, tmp_path / "split.png")
    assert_png(tmp_path / "split.png")


def test_plot_overlay_of_simulated_and_measured(one_f_one_b, tmp_path):
    measured = measured_copy(one_f_one_b)
    assert measured.t0 == 1000.0 and measured.makespan > one_f_one_b.makespan
    fig = plot_overlay(one_f_one_b, measured)
    ax = fig.axes[0]
    # both runs drawn, each from its own t0
    assert len(compute_bars(ax)) == 2 * len(one_f_one_b.compute_events())
    assert min(b.get_x() for b in compute_bars(ax)) == 0
    error = (one_f_one_b.makespan - measured.makespan) / measured.makespan  # the simulator's error
    assert f"{error:+.1%}" in fig._suptitle.get_text()
    save_figure(fig, tmp_path / "overlay.png")
    assert_png(tmp_path / "overlay.png")
    # a measured result alone draws too, times relative to its t0
    fig = plot_result(measured)
    assert min(b.get_x() for b in compute_bars(fig.axes[0])) == 0


@pytest.fixture(scope="module")
def p8_m32():
    return [sim.simulate(sim.make_schedule(n, 8, 32)) for n in TEXTBOOK]


def chart_axes(fig) -> list:
    """The axes of a figure that hold a chart or a memory panel (not colour bars)."""
    return [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]


def test_compare_shares_one_time_axis_when_asked_or_when_steps_are_alike():
    results = [sim.simulate(sim.make_schedule(n, 3, 4)) for n in TEXTBOOK]  # 36, 18, 18
    for fig in (plot_compare(results), plot_compare(results, shared_time=True)):
        assert {ax.get_xlim()[1] for ax in fig.axes} == {max(r.makespan for r in results)}
        assert "on one time axis" in fig._suptitle.get_text()


def test_compare_gives_each_schedule_its_own_time_axis_when_one_is_much_longer(p8_m32):
    """At p=8, m=32 naive takes 768 and GPipe 117: on one axis GPipe would get 15 % of it."""
    fig = plot_compare(p8_m32)
    axes = chart_axes(fig)
    assert len(axes) == 6  # a chart and a memory panel per schedule
    for i, r in enumerate(p8_m32):
        assert axes[2 * i].get_xlim() == axes[2 * i + 1].get_xlim() == (0, r.makespan)
    assert "each on its own time axis (the longest step is 6.6x the shortest)" in fig._suptitle.get_text()


def peak_heights(ax) -> list[float]:
    """Per row of a memory panel, the height of its highest point as a share of the row."""
    return [(r + 0.42 - line.get_ydata().min()) / 0.84 for r, line in enumerate(ax.get_lines())]


def test_compare_draws_memory_on_one_scale(p8_m32):
    naive, gpipe, one_f_one_b = chart_axes(plot_compare(p8_m32))[1::2]
    assert naive.get_ylabel() == gpipe.get_ylabel() == one_f_one_b.get_ylabel() == \
        "activations held\n(full row: 32 micro-batches)"
    assert peak_heights(gpipe) == pytest.approx([1.0] * 8)                            # 32 of 32
    assert peak_heights(one_f_one_b) == pytest.approx([(8 - s) / 32 for s in range(8)])  # p - s of 32
    assert peak_heights(naive) == pytest.approx([1 / 32] * 8)


def test_memory_has_a_row_per_device_that_can_be_followed():
    """Naive's devices all hold 0 or 1 micro-batch: as lines on one axis they hid each
    other; each is now in its own row, and the rows do not overlap."""
    result = sim.simulate(sim.make_schedule("naive", 4, 8))
    memory = plot_result(result).axes[1]
    for r, line in enumerate(memory.get_lines()):
        assert line.get_gid() == f"memory rank {r}"
        y = line.get_ydata()
        assert r - 0.42 - 1e-9 <= y.min() and y.max() <= r + 0.42 + 1e-9
        assert y.min() == pytest.approx(r - 0.42)  # its own peak fills its row
    assert [t.get_text() for t in memory.texts] == ["peak 1 micro-batch"] * 4


def test_save_figure_hides_labels_that_do_not_fit(tmp_path):
    # forward 100x shorter than backward: its bars are far too narrow for a number
    result = sim.simulate(sim.make_schedule("gpipe", 2, 2), sim.Costs(forward=0.02, backward=2.0))
    fig = plot_result(result)
    save_figure(fig, tmp_path / "narrow.png")
    shown = {t.get_text() for t in fig.axes[0].texts if t.get_visible()}
    assert len([t for t in fig.axes[0].texts if t.get_visible()]) == 4  # the four B bars
    assert shown == {"0", "1"}


def test_human_bytes():
    assert human_bytes(0) == "0 B"
    assert human_bytes(1536) == "1.5 KiB"
    assert human_bytes(3 * 2**30) == "3 GiB"


# ---------------------------------------------------------------- large steps

def png_size(path: Path) -> tuple[int, int]:
    """(width, height) in pixels, from the PNG's header."""
    data = path.read_bytes()[:24]
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


@pytest.fixture(scope="module")
def large():
    return sim.simulate(sim.make_schedule("1f1b", devices=64, micro_batches=512))


def test_large_step_is_a_heat_map_of_bounded_size(large, tmp_path):
    assert timeline_style(large) == "heat"
    fig = plot_result(large)
    chart, memory = fig.axes[:2]
    assert not chart.patches and not memory.get_lines()   # no patch per bar, no line per rank
    assert chart.images[0].get_array().shape == (64, heatmap.BINS)
    assert memory.images[0].get_array().shape == (64, heatmap.BINS)
    assert chart.get_legend() is None and memory.get_legend() is None
    save_figure(fig, tmp_path / "large.png")
    width, height = png_size(tmp_path / "large.png")
    assert width <= WIDTH * DPI and height <= MAX_HEIGHT * DPI


def test_compare_of_large_steps_is_bounded(large, tmp_path):
    gpipe = sim.simulate(sim.make_schedule("gpipe", devices=64, micro_batches=512))
    fig = plot_compare([gpipe, large])
    assert fig.get_size_inches()[1] <= MAX_HEIGHT
    memory_scales = {ax.images[0].get_clim() for ax in fig.axes[1::2] if ax.images}
    assert memory_scales == {(0.0, 512.0)}  # GPipe's peak, for both


def test_dense_bars_are_one_collection_per_kind_without_outlines():
    result = sim.simulate(sim.make_schedule("gpipe", devices=4, micro_batches=128))  # 256 bars per rank, ~4 px each
    assert timeline_style(result) == "dense"
    fig = plot_result(result)
    chart = fig.axes[0]
    assert not compute_bars(chart) and not chart.texts
    bars = {c.get_gid(): c for c in chart.collections if (c.get_gid() or "").startswith("computes")}
    assert set(bars) == {"computes F", "computes B"}
    assert all(len(c.get_paths()) == 4 * 128 and not c.get_linewidth().any() for c in bars.values())
    assert len(chart.get_legend().get_texts()) == 3  # F, B, idle


def test_many_devices_show_a_sample():
    result = sim.simulate(sim.make_schedule("gpipe", devices=600, micro_batches=1))
    rows = heatmap.shown_ranks(result.ranks)
    assert rows == list(range(0, 600, 3))
    fig = plot_result(result)
    assert fig.axes[0].images[0].get_array().shape == (200, heatmap.BINS)
    assert fig.axes[0].get_ylabel() == "one rank in 3 of 600"


def test_busy_share_is_the_busy_time_per_bin():
    # one rank: F on [0, 1], B on [1, 3], idle to the end of rank 1's work at 4
    result = sim.simulate(sim.make_schedule("gpipe", devices=2, micro_batches=1))
    assert result.makespan == 6
    share = heatmap.busy_share(result, [0, 1], bins=12)
    w = result.makespan / 12
    assert share.sum(axis=1) * w == pytest.approx(result.busy())
    assert share[0].tolist() == [1, 1] + [0] * 6 + [1, 1, 1, 1]      # 0F0, idle, 0B0
    assert share[1].tolist() == [0, 0, 1, 1, 1, 1, 1, 1] + [0] * 4   # 1F0 1B0


def test_binned_max_keeps_peaks_and_the_last_change_at_an_instant():
    series = [(0.0, 0.0), (1.0, 5.0), (1.2, 2.0), (2.0, 3.0), (2.0, 1.0), (3.5, 0.0)]
    # bins [0, 1), [1, 2) with the spike to 5, [2, 3) from 1 (3 and 1 at one instant), [3, 4)
    assert heatmap.binned_max(series, t0=0.0, end=4.0, bins=4).tolist() == [0.0, 5.0, 1.0, 1.0]
    assert heatmap.binned_max([], 0.0, 1.0, bins=3).tolist() == [0.0, 0.0, 0.0]


def test_titles_give_units_and_singulars():
    result = sim.simulate(sim.make_schedule("gpipe", devices=1, micro_batches=1))
    fig = plot_result(result)
    assert fig._suptitle.get_text() == \
        "gpipe: 1 stage, 1 micro-batch  |  makespan 3 time units, bubble 0.0% (steady 0.0%)"
    assert fig.axes[0].get_xlabel() == "" and fig.axes[1].get_xlabel() == "time (time units)"
    assert str(result.schedule).startswith("Schedule 'gpipe': 1 stage on 1 device, 1 micro-batch\n")
    assert format_times([98304.0, 1725.0]) == ["98304", "1725"]
    assert format_times([19.3, 13.15]) == ["19.30", "13.15"]
    assert format_times([0.012345]) == ["0.01235"]
