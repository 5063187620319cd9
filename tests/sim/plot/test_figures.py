"""The step's two bubbles (makespan and steady step) in closed form and against the
reference model; the figures of schedules with several stages per rank and a split
backward: a colour per kind that colour-blind readers tell apart, a hatch per chunk."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from matplotlib.patches import Rectangle

import sim
from sim.schedule.textbook import gpipe_on
from helpers import reference_times
from sim import Kind
from sim.plot.bars import COLLECTIVE_COLORS
from sim.plot.gantt import COLORS, HATCHES, plot_compare, plot_result, save_figure, timeline_style
from sim.schedule.registry import SCHEDULES, make_schedule


# ---------------------------------------------------------------- the two bubbles

@settings(max_examples=40, deadline=None)
@given(st.integers(1, 6), st.integers(1, 12), st.sampled_from([0.5, 1.0, 1.5, 2.0]),
       st.sampled_from([0.5, 1.0, 2.0, 3.0]))
def test_1f1b_both_bubbles_in_closed_form(p, m, f, b):
    """1F1B, equal stages, free communication. Rank r starts at r*F (the first micro-batch
    reaches it) and ends at makespan - r*B (the last gradient leaves it), with
    makespan = (m + p - 1)(F + B). So rank r spans (m + p - 1 - r)(F + B): rank 0 spans
    the whole step, steady step = makespan, and both bubbles are
    1 - m(F + B) / ((m + p - 1)(F + B)) = (p - 1) / (m + p - 1)."""
    r = sim.simulate(make_schedule("1f1b", p, m), sim.Costs(forward=f, backward=b))
    step = (m + p - 1) * (f + b)
    assert r.makespan == pytest.approx(step)
    assert [end - start for start, end in r.spans()] == pytest.approx([(m + p - 1 - k) * (f + b) for k in range(p)])
    assert r.steady_step == pytest.approx(step)
    assert r.bubble_fraction == pytest.approx((p - 1) / (m + p - 1))
    assert r.steady_bubble_fraction == pytest.approx((p - 1) / (m + p - 1))


def deferred_w(m: int) -> sim.Schedule:
    """Two stages: rank 0 runs its forwards, then I and W of each micro-batch in turn;
    rank 1 runs 1F1B on I and keeps every W for the end (the zero-bubble way)."""
    rank0 = [f"0F{j}" for j in range(m)] + [x for j in range(m) for x in (f"0I{j}", f"0W{j}")]
    rank1 = [x for j in range(m) for x in (f"1F{j}", f"1I{j}")] + [f"1W{j}" for j in range(m)]
    return sim.Schedule([rank0, rank1], name="deferred-w")


@pytest.mark.parametrize("m", [3, 4, 7, 16])
def test_a_parallelogram_step_has_no_steady_bubble(m):
    """F = I = W = 1, m >= 3. Rank 1 runs F_j on [2j+1, 2j+2] and I_j on [2j+2, 2j+3], then
    its m Ws up to 3m + 1. Rank 0 ends its forwards at m >= 3 = the end of 1I0, so from
    then on it never waits: I_j and W_j take [m + 2j, m + 2j + 2], ending at 3m. Both ranks
    compute 3m and span 3m (rank 1 from 1 to 3m + 1): makespan 3m + 1 with bubble
    1 - 2 x 3m / (2(3m + 1)) = 1 / (3m + 1), steady step 3m with no bubble at all."""
    r = sim.simulate(deferred_w(m), sim.Costs(forward=1, backward_input=1, backward_weight=1))
    assert r.makespan == 3 * m + 1
    assert r.spans() == [(0, 3 * m), (1, 3 * m + 1)]
    assert r.steady_step == 3 * m
    assert r.bubble_fraction == pytest.approx(1 / (3 * m + 1))
    assert r.steady_bubble_fraction == 0
    assert r.summary()["steady_step"] == 3 * m


def _schedules_to_check(costs: sim.Costs) -> list[sim.Schedule]:
    """Hand-built split schedules with several stages per rank, and every registered
    schedule that builds at P=3, M=6."""
    out = [gpipe_on([0, 1, 2, 2, 1, 0], 6, split=True), gpipe_on([0, 1, 2, 0, 1, 2], 6, split=True),
           deferred_w(5)]
    for name, gen in SCHEDULES.items():
        options = {"costs": costs} if "costs" in gen.options else {}
        try:
            out.append(make_schedule(name, 3, 6, **options))
        except sim.ScheduleError:
            pass  # sizes it refuses
    return out


@settings(max_examples=15, deadline=None)
@given(st.data())
def test_steady_step_agrees_with_the_reference_model(data):
    """Random per-stage costs and latency: each rank's span, from the reference model's
    ends (a compute starts its cost before it ends), is the engine's; steady step and
    both bubbles follow from them."""
    t = st.floats(0.1, 3.0)
    fixed = sim.Costs(latency=0.0)
    for schedule in _schedules_to_check(fixed):
        n = schedule.stages
        costs = sim.Costs(forward=tuple(data.draw(st.lists(t, min_size=n, max_size=n))),
                          backward_input=tuple(data.draw(st.lists(t, min_size=n, max_size=n))),
                          backward_weight=tuple(data.draw(st.lists(t, min_size=n, max_size=n))),
                          latency=data.draw(st.floats(0.0, 1.0)))
        c = costs.for_stages(n)
        ends = reference_times(schedule, costs)
        spans = {}
        for a, end in ends.items():
            start = end - getattr(c, sim.KINDS[a.kind].cost)[a.stage]
            lo, hi = spans.get(schedule.placement[a.stage], (np.inf, -np.inf))
            spans[schedule.placement[a.stage]] = (min(lo, start), max(hi, end))
        r = sim.simulate(schedule, costs)
        assert np.allclose(r.spans(), [spans[k] for k in range(schedule.ranks)]), schedule.name
        steady = max(hi - lo for lo, hi in spans.values())
        assert r.steady_step == pytest.approx(steady)
        assert r.steady_step <= r.makespan + 1e-9
        assert r.steady_bubble_fraction == pytest.approx(1 - sum(r.busy()) / (schedule.ranks * steady))


# ---------------------------------------------------------------- colours

# Machado, Oliveira & Fernandes, "A Physiologically-based Model for Simulation of Color
# Vision Deficiency", IEEE TVCG 15(6), 2009: the matrices of severity 1.0, on linear RGB.
DEFICIENCIES = {
    "protanopia": [[0.152286, 1.052583, -0.204868], [0.114503, 0.786281, 0.099216], [-0.003882, -0.048116, 1.051998]],
    "deuteranopia": [[0.367322, 0.860646, -0.227968], [0.280085, 0.672501, 0.047413], [-0.011820, 0.042940, 0.968881]],
    "tritanopia": [[1.255528, -0.076749, -0.178779], [-0.078411, 0.930809, 0.147602], [0.004733, 0.691367, 0.303900]],
}
JND = 2.3  # CIELAB Delta E*ab just noticeable (Mahy, Van Eycken & Oosterlinck, Color Res. Appl. 19(2), 1994)


def _lab(linear_rgb: np.ndarray) -> np.ndarray:
    """CIELAB (D65) of a linear sRGB colour (IEC 61966-2-1 matrix; CIE 15:2004 formulas)."""
    xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]) @ \
        np.clip(linear_rgb, 0, 1)
    t = xyz / np.array([0.95047, 1.0, 1.08883])
    f = np.where(t > (6 / 29) ** 3, np.cbrt(t), t / (3 * (6 / 29) ** 2) + 4 / 29)
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


def _linear(hex_colour: str) -> np.ndarray:
    c = np.array([int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5)])
    return np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)


@pytest.mark.parametrize("vision", ["normal"] + list(DEFICIENCIES))
def test_kind_colours_stay_apart_for_colour_blind_readers(vision):
    """F, B, I, W and the gradient reduction R are at least 5 just-noticeable differences
    apart, in normal vision and simulated for each full dichromacy (the Okabe-Ito colours
    of F, B, I, W reach 17 at the closest, R's vermillion 8 from them)."""
    assert set(COLORS) == {Kind.F, Kind.B, Kind.I, Kind.W} and set(COLLECTIVE_COLORS) == {Kind.REDUCE_GRAD}
    m = np.eye(3) if vision == "normal" else np.array(DEFICIENCIES[vision])
    lab = {k: _lab(m @ _linear(c)) for k, c in {**COLORS, **COLLECTIVE_COLORS}.items()}
    for a, b in itertools.combinations(lab, 2):
        assert np.linalg.norm(lab[a] - lab[b]) >= 5 * JND, (vision, a, b)


# ---------------------------------------------------------------- several stages per rank

def compute_bars(ax) -> list[Rectangle]:
    return [p for p in ax.patches if isinstance(p, Rectangle) and (p.get_gid() or "").startswith("compute")]


@pytest.fixture(scope="module")
def v_split():
    """A V-shaped placement (rank r holds stages r and 2P-1-r), split backward: P=4, M=8, V=2."""
    return sim.simulate(gpipe_on([0, 1, 2, 3, 3, 2, 1, 0], 8, split=True, name="v-split"),
                        sim.Costs(w_activation_bytes=0.5))


def test_split_schedule_with_two_stages_per_rank_draws_kinds_and_chunks(v_split, tmp_path):
    assert timeline_style(v_split) == "bars"
    fig = plot_result(v_split)
    bars = compute_bars(fig.axes[0])
    assert len(bars) == 8 * 8 * 3  # F, I, W of 8 stages x 8 micro-batches
    faces = {}
    for bar in bars:
        action = sim.Action.parse(bar.get_gid().split()[1])
        faces.setdefault(action.kind, set()).add(bar.get_facecolor())
        # a rank's first stage (s < 4) plain, its second hatched
        assert (bar.get_hatch() or None) == (HATCHES[1] if action.stage >= 4 else None), action
    assert set(faces) == {Kind.F, Kind.I, Kind.W}
    assert all(len(f) == 1 for f in faces.values())           # one colour per kind ...
    assert len({next(iter(f)) for f in faces.values()}) == 3  # ... and a different one each
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert legend == ["F forward", "I input grad", "W weight grad", "idle (bubble)",
                      "chunk 0: a rank's 1st stage", "chunk 1: a rank's 2nd stage"]
    assert fig.axes[1].get_ylabel() == "memory held\n(full row: 16 B)"  # bytes, not a count
    save_figure(fig, tmp_path / "v.png")
    shown = [t.get_text() for t in fig.axes[0].texts if t.get_visible()]
    assert len(shown) == len(bars) and set(shown) == {str(m) for m in range(8)}  # readable at P=4, M=8, V=2


def test_wide_bars_name_their_stage_and_thin_ones_show_no_label(tmp_path):
    wide = sim.simulate(gpipe_on([0, 1, 1, 0], 1, split=True))
    fig = plot_result(wide)
    save_figure(fig, tmp_path / "wide.png")
    assert sorted(t.get_text() for t in fig.axes[0].texts) == sorted(f"0 s{s}" for s in range(4) for _ in "FIW")
    thin = sim.simulate(gpipe_on([0, 1, 1, 0], 2, split=True), sim.Costs(forward=0.01))
    fig = plot_result(thin)
    save_figure(fig, tmp_path / "thin.png")
    forwards = [t for t in fig.axes[0].texts if "F" in t.sim_bar.get_gid()]
    assert forwards and not any(t.get_visible() for t in forwards)


def test_dense_bars_keep_a_collection_per_kind_and_chunk():
    result = sim.simulate(gpipe_on([0, 1, 1, 0], 60, split=True))  # 360 bars per rank, 2.5 px each
    assert timeline_style(result) == "dense"
    chart = plot_result(result).axes[0]
    bars = {c.get_gid(): c for c in chart.collections if (c.get_gid() or "").startswith("computes")}
    assert set(bars) == {f"computes {k}{c}" for k in "FIW" for c in ("", " chunk 1")}
    assert all(len(c.get_paths()) == 2 * 60 for c in bars.values())
    assert {c.get_hatch() for g, c in bars.items() if "chunk" in g} == {HATCHES[1]}
    assert not any(c.get_hatch() for g, c in bars.items() if "chunk" not in g)


def test_compare_lists_every_kind_and_chunk_of_its_schedules(v_split):
    one_f_one_b = sim.simulate(make_schedule("1f1b", 4, 8))
    fig = plot_compare([one_f_one_b, v_split])
    legend = fig.axes[0].get_legend()
    names = [t.get_text() for t in legend.get_texts()]
    assert names[:5] == ["F forward", "B backward", "I input grad", "W weight grad", "idle (bubble)"]
    assert len({tuple(h.get_facecolor()) for h in legend.legend_handles[:4]}) == 4
    assert "chunk 1: a rank's 2nd stage" in names
    assert fig._suptitle.get_text().startswith("4 devices, 8 micro-batches")
    assert "v-split (8 stages): makespan" in fig.axes[2].get_title(loc="left")
    assert "(steady " in fig.axes[0].get_title(loc="left")


# ---------------------------------------------------------------- gradient reductions

@pytest.mark.parametrize("micro", [4, 60])  # outlined bars, and dense ones
def test_gradient_reductions_are_drawn_beside_the_compute(micro, tmp_path):
    """Each REDUCE_GRAD is a thin bar in the bottom part of its rank's row, over the time
    it runs, and the legend names it; the chart spans the step up to the last one."""
    s = sim.add_grad_reduce(make_schedule("interleaved-1f1b", 2, micro, 2), overlap=True)
    result = sim.simulate(s, sim.Costs(grad_reduce=3.0))
    fig = plot_result(result)
    chart = fig.axes[0]
    bars = {p.get_gid().split()[1]: p for p in chart.patches if (p.get_gid() or "").startswith("collective")}
    events = {str(e.action): e for e in result.events if e.action.kind is Kind.REDUCE_GRAD}
    assert set(bars) == set(events) == {f"{st}REDUCE_GRAD" for st in range(4)}
    for name, bar in bars.items():
        e = events[name]
        assert (bar.get_x(), bar.get_width()) == pytest.approx((e.start - result.t0, e.end - e.start))
        assert e.rank < bar.get_y() and bar.get_y() + bar.get_height() <= e.rank + 0.45  # bottom of the row
        assert bar.get_height() < 0.4
    assert chart.get_xlim()[1] == pytest.approx(result.makespan) and result.makespan == max(e.end for e in events.values())
    assert "R reduce grads (its stream)" in [t.get_text() for t in chart.get_legend().get_texts()]
    save_figure(fig, tmp_path / "reduce.png")


def test_chrome_trace_puts_reductions_on_the_comm_thread():
    r = sim.simulate(sim.add_grad_reduce(make_schedule("1f1b", 2, 2), overlap=False), sim.Costs(grad_reduce=1.0))
    reductions = [e for e in r.chrome_trace()["traceEvents"] if e.get("cat") == "REDUCE_GRAD"]
    assert sorted((e["name"], e["tid"]) for e in reductions) == [("0REDUCE_GRAD", 1000), ("1REDUCE_GRAD", 1001)]
