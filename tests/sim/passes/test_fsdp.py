"""UNSHARD and RESHARD, FSDP's gathers as actions: their text form, the pass that adds them
(`sim.add_fsdp`), the checks, the engine's timing and memory (closed forms, and random
schedules against the reference model of tests/helpers.py and without FSDP), torch's own
`_add_unshard_reshard` where the two are comparable, and the figures (exec runs them:
tests/exec/runtime/test_fsdp.py)."""
import pytest
from hypothesis import given, settings, strategies as st

import sim
from sim import Action, Costs, Kind, Schedule, ScheduleError
from sim.passes.fsdp import add_fsdp
from sim.schedule.kinds import GATHERS
from helpers import assert_matches_reference, reference_peak_memory

UN, RE = Kind.UNSHARD, Kind.RESHARD


def layers(S: int, m: int = 1) -> Schedule:
    """One device running S stages (FSDP's units, layers) for m micro-batches, each
    micro-batch forward through all of them and back: FSDP with pp = 1."""
    prog = [Action(s, Kind.F, j) for j in range(m) for s in range(S)]
    prog += [Action(s, Kind.B, j) for j in range(m) for s in reversed(range(S))]
    return Schedule([prog], [0] * S, m, "layers")


def compute_times(result):
    return {e.action: (e.start, e.end) for e in result.events if e.is_compute}


def test_text_form_round_trips_and_reads_torchs():
    """torch writes `0UNSHARD` (no micro-batch); the k-th gather of a stage is `0UNSHARDk`,
    which torch's own parser reads."""
    s = sim.add_grad_reduce(add_fsdp(sim.make_schedule("interleaved-1f1b", devices=2, micro_batches=4, virtual=2)),
                            overlap=True)
    text = s.to_csv()
    assert text.startswith("0UNSHARD,0F0,") and "0UNSHARD1," in text and "2RESHARD3" in text
    back = Schedule.from_csv(text, s.placement)
    assert back.programs == s.programs and back.micro_batches == s.micro_batches == 4
    assert Action.parse("3RESHARD") == Action(3, RE, 0) and str(Action(3, UN, 2)) == "3UNSHARD2"
    torch_schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    for a in (Action(0, UN, 0), Action(5, RE, 0), Action(2, UN, 3)):
        theirs = torch_schedules._Action.from_str(str(a))
        assert (theirs.stage_index, theirs.computation_type.value) == (a.stage, a.kind.value)
        assert theirs.microbatch_index == (a.micro or None)
        if not a.micro:
            assert str(theirs) == str(a)


def test_every_compute_is_gathered_and_each_hold_released():
    for name, p, v in (("1f1b", 4, 1), ("interleaved-1f1b", 2, 2), ("zbv", 2, 2), ("zb-h1", 3, 1)):
        for raf in (True, False):
            for lookahead in (0, 1, 3):
                s = add_fsdp(sim.make_schedule(name, devices=p, micro_batches=4, virtual=v), lookahead, raf)
                sim.passes.checks.check_gathers(s)  # raises if not
                for prog in s.programs:
                    unshards = [a for a in prog if a.kind is UN]
                    assert sorted(unshards) == sorted(Action(a.stage, UN, a.micro) for a in prog if a.kind is RE)


def test_misplaced_gathers_are_refused():
    bad = {
        "0F0,0UNSHARD,0B0,0RESHARD": "sharded parameters",
        "0UNSHARD,0F0,0UNSHARD1,0B0,0RESHARD,0RESHARD1": "still gathered",
        "0UNSHARD,0F0,0B0,0RESHARD,0RESHARD1": "not gathered",
        "0UNSHARD,0F0,0B0": "never resharded",
    }
    for text, words in bad.items():
        with pytest.raises(ScheduleError, match=words):
            sim.compile(Schedule([text.split(",")]))
    with pytest.raises(ScheduleError, match="lives on rank"):
        sim.compile(Schedule([["0UNSHARD", "0F0", "0B0", "0RESHARD", "1UNSHARD1"],
                              ["1UNSHARD", "1F0", "1B0", "1RESHARD"]], [0, 1]))


def test_add_fsdp_refuses_what_it_cannot_take():
    s = sim.make_schedule("1f1b", devices=2, micro_batches=2)
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="lookahead"):
            add_fsdp(s, bad)
    with pytest.raises(ScheduleError, match="add_fsdp takes"):
        add_fsdp(add_fsdp(s))
    with pytest.raises(ScheduleError, match="add_fsdp takes"):
        add_fsdp(sim.lower(s))


def test_holds_of_layers_one_by_one():
    """pp = 1, S layers: with reshard after forward each layer is gathered for its forward
    and again for its backward, but the last (whose backward follows its forward); without,
    once from its forward to its backward. Each gather is issued one compute ahead."""
    s = add_fsdp(layers(3), lookahead=1, reshard_after_forward=True)
    assert ",".join(map(str, s.programs[0])) == (
        "0UNSHARD,1UNSHARD,0F0,0RESHARD,2UNSHARD,1F0,1RESHARD,2F0,1UNSHARD1,2B0,2RESHARD,0UNSHARD1,1B0,1RESHARD1,"
        "0B0,0RESHARD1")
    s = add_fsdp(layers(3), lookahead=0, reshard_after_forward=False)
    assert ",".join(map(str, s.programs[0])) == (
        "0UNSHARD,0F0,1UNSHARD,1F0,2UNSHARD,2F0,2B0,2RESHARD,1B0,1RESHARD,0B0,0RESHARD")


@pytest.mark.parametrize("name,p,v", [("1f1b", 4, 1), ("gpipe", 3, 1), ("interleaved-1f1b", 2, 2), ("zbv", 2, 2),
                                      ("zb-h2", 3, 1), ("dualpipev", 2, 2)])
@pytest.mark.parametrize("raf", [True, False])
def test_free_gathers_change_no_time(name, p, v, raf):
    """With free all-gathers every compute starts and ends as without FSDP, and the step
    takes as long (its reduce-scatters too)."""
    base = sim.add_grad_reduce(sim.make_schedule(name, devices=p, micro_batches=2 * p, virtual=v), overlap=True)
    fsdp = sim.add_grad_reduce(add_fsdp(sim.make_schedule(name, devices=p, micro_batches=2 * p, virtual=v),
                                        lookahead=1, reshard_after_forward=raf), overlap=True)
    costs = Costs(forward=1.0, backward=2.0, latency=0.1, grad_reduce=0.5, unshard=0.0, unshard_bytes=7.0)
    a, b = sim.simulate(base, costs), sim.simulate(fsdp, costs)
    assert compute_times(a) == compute_times(b)
    assert a.makespan == pytest.approx(b.makespan)


@pytest.mark.parametrize("S", [2, 3, 5])
@pytest.mark.parametrize("f,b,g", [(1.0, 2.0, 4.0), (0.5, 1.0, 1.6)])
def test_step_bound_by_gathers(S, f, b, g):
    """One device, S layers, one micro-batch, a gather g > f + b, lookahead 1. With reshard
    after forward there are 2S-1 holds (every layer twice, the last once, its B right after
    its F). The forwards' gathers run back to back, F(s) starting at (s+1)g; the first
    backward gather is issued as the last layer's B starts (one compute ahead), at Sg + f,
    and from then on the gathers run back to back again: (2S-1)g + f + b. Without reshard
    after forward, S gathers, then the forwards' tail and every backward: Sg + f + Sb.
    With no prefetch (lookahead 0) nothing overlaps: (2S-1)g + S(f + b)."""
    costs = Costs(forward=f, backward=b, unshard=g)
    r = sim.simulate(add_fsdp(layers(S), 1, True), costs)
    assert r.makespan == pytest.approx((2 * S - 1) * g + f + b)
    r = sim.simulate(add_fsdp(layers(S), 1, False), costs)
    assert r.makespan == pytest.approx(S * g + f + S * b)
    r = sim.simulate(add_fsdp(layers(S), 0, True), costs)
    assert r.makespan == pytest.approx((2 * S - 1) * g + S * (f + b))


@pytest.mark.parametrize("S", [2, 4])
def test_peak_memory_counts_the_gathered_layers(S):
    """pp = 1, S layers of shard W, gathered u and activations a: at the last layer's
    forward every activation is held; with reshard after forward that layer and the next
    gather (lookahead 1; none with lookahead 0) are gathered, without every layer is."""
    W, u, a = 100.0, 10.0, 1.0
    costs = Costs(forward=1.0, backward=2.0, unshard=4.0, weight_bytes=W, unshard_bytes=u, activation_bytes=a)
    for lookahead, raf, gathered in ((1, True, 2), (0, True, 1), (1, False, S), (0, False, S)):
        s = add_fsdp(layers(S), lookahead, raf)
        peak = sim.simulate(s, costs).peak_memory
        assert peak == [pytest.approx(S * W + gathered * u + S * a)], (lookahead, raf)
        assert peak == pytest.approx(reference_peak_memory(s, costs))


@pytest.mark.parametrize("p,m", [(4, 8), (3, 2)])
def test_peak_memory_1f1b_one_stage_per_rank(p, m):
    """pp > 1, one stage per rank: the rank never leaves its stage, which is gathered the
    whole step: stage s peaks at W + u + min(p-s, m) a."""
    W, u, a = 50.0, 20.0, 3.0
    costs = Costs(unshard=0.5, weight_bytes=W, unshard_bytes=u, activation_bytes=a)
    s = add_fsdp(sim.make_schedule("1f1b", devices=p, micro_batches=m))
    assert all(sum(x.kind is UN for x in prog) == 1 for prog in s.programs)
    assert sim.simulate(s, costs).peak_memory == pytest.approx([W + u + min(p - r, m) * a for r in range(p)])


@st.composite
def fsdp_cases(draw):
    name = draw(st.sampled_from(["1f1b", "gpipe", "interleaved-1f1b", "zb-h1", "zbv", "looped-bfs"]))
    p = draw(st.integers(1, 4))
    v = 2 if name in ("zbv", "interleaved-1f1b", "looped-bfs") else 1
    m = draw(st.integers(1, 6))
    if name == "interleaved-1f1b" and m % p:
        m = p * draw(st.integers(1, 2))
    if name == "zbv":
        m = max(m, p)
    schedule = sim.make_schedule(name, devices=p, micro_batches=m, virtual=v)
    schedule = add_fsdp(schedule, draw(st.integers(0, 4)), draw(st.booleans()))
    if draw(st.booleans()):
        schedule = sim.add_grad_reduce(schedule, overlap=draw(st.booleans()))
    per = st.floats(0.0, 3.0, allow_nan=False)
    costs = Costs(forward=draw(st.floats(0.1, 2.0)), backward=draw(st.floats(0.1, 3.0)), unshard=draw(per),
                  grad_reduce=draw(per), latency=draw(st.floats(0.0, 0.5)), unshard_bytes=draw(per),
                  activation_bytes=draw(per))
    return schedule, costs


@settings(max_examples=60, deadline=None)
@given(fsdp_cases())
def test_fsdp_never_deadlocks_and_matches_reference(case):
    """compile (every target) accepts any schedule with FSDP's gathers, its ranks finish,
    and the engine's times and peak memory are the reference model's."""
    schedule, costs = case
    for target in sim.passes.compile.TARGETS:
        sim.compile(schedule, target)
    r = assert_matches_reference(schedule, costs)
    assert r.peak_memory == pytest.approx(reference_peak_memory(schedule, costs))
    unshards = [e for e in r.events if e.action.kind is UN]
    assert len(unshards) == sum(a.kind is UN for prog in schedule.programs for a in prog)


@pytest.mark.parametrize("name, kw", [("dualpipe", {}), ("dualpipe", {"overlap": True}),
                                      ("dualpipev", {"overlap": True}),
                                      ("interleaved-1f1b", {"overlap": True, "group_size": 4})])
def test_gathers_in_two_copies_and_in_overlapped_pairs_match_reference(name, kw):
    """add_fsdp on DualPipe's two copies (a gather's micro-batch counts gathers, it runs
    through no copy) and on overlapped pairs (rule 18): the engine is the reference model."""
    s = add_fsdp(sim.make_schedule(name, devices=4, micro_batches=8, **kw))
    assert s.pipelines == sim.SCHEDULES[name].pipelines and s.has_pairs == bool(kw)
    costs = Costs(forward=1.0, backward=2.0, backward_input=1.0, backward_weight=1.0, a2a_forward=0.3,
                  a2a_backward=0.4, unshard=0.7, unshard_bytes=5.0, activation_bytes=1.0, latency=0.05)
    r = assert_matches_reference(s, costs)
    assert r.peak_memory == pytest.approx(reference_peak_memory(s, costs))


def test_lowering_keeps_the_gathers_where_they_are():
    s = add_fsdp(sim.make_schedule("interleaved-1f1b", devices=2, micro_batches=4, virtual=2))
    low = sim.lower(s)
    assert [[a for a in prog if a.kind in GATHERS or a.kind.is_compute] for prog in low.programs] == \
        [list(prog) for prog in s.programs]
    costs = Costs(unshard=0.7, unshard_bytes=3.0)
    assert sim.simulate(low, costs).makespan == pytest.approx(sim.simulate(s, costs).makespan)


@pytest.mark.parametrize("name,p,m", [("1f1b", 4, 8), ("gpipe", 2, 4), ("zb-h1", 3, 6)])
def test_torchs_order_with_one_stage_per_rank(name, p, m):
    """torch's `_add_unshard_reshard` then `_add_reduce_grad` on one stage per rank gathers
    it first and releases it last, after its reduce-scatter: `add_fsdp` then
    `add_grad_reduce(overlap=True)` writes the same programs."""
    torch_schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    ours = sim.add_grad_reduce(add_fsdp(sim.make_schedule(name, devices=p, micro_batches=m)), overlap=True)
    for r, prog in enumerate(sim.make_schedule(name, devices=p, micro_batches=m).programs):
        theirs = torch_schedules._add_unshard_reshard([torch_schedules._Action.from_str(str(a)) for a in prog])
        theirs = torch_schedules._add_reduce_grad(theirs, m)
        assert list(map(str, theirs)) == list(map(str, ours.programs[r]))


@pytest.mark.parametrize("name,p,m,v", [("interleaved-1f1b", 2, 4, 2), ("interleaved-1f1b", 2, 4, 3),
                                         ("zbv", 2, 4, 2), ("looped-bfs", 2, 3, 3), ("dualpipev", 2, 4, 2)])
def test_torchs_order_with_up_to_three_stages_per_rank(name, p, m, v):
    """torch keeps up to three stages gathered (`max_active_stages=3`), prefetching the
    next stages its rank will compute and releasing a stage once none of its computes is
    ahead: with at most three stages per rank, every stage is gathered before the rank's
    first compute and released after its last. `add_fsdp` without reshard after forward
    and a lookahead over the whole program writes the same programs."""
    torch_schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    base = sim.make_schedule(name, devices=p, micro_batches=m, virtual=v)
    ours = add_fsdp(base, lookahead=len(max(base.programs, key=len)), reshard_after_forward=False)
    for r, prog in enumerate(base.programs):
        theirs = torch_schedules._add_unshard_reshard([torch_schedules._Action.from_str(str(a)) for a in prog])
        assert list(map(str, theirs)) == list(map(str, ours.programs[r]))


def test_gathers_are_drawn_dotted_along_the_top_of_their_row(tmp_path):
    from matplotlib.patches import Rectangle
    from sim.plot.gantt import plot_result, save_figure
    result = sim.simulate(add_fsdp(layers(3, 2)), Costs(unshard=0.4, unshard_bytes=2.0))
    fig = plot_result(result)
    chart = fig.axes[0]
    bars = {p.get_gid().split()[1]: p for p in chart.patches
            if isinstance(p, Rectangle) and (p.get_gid() or "").startswith("gather")}
    events = {str(e.action): e for e in result.events if e.action.kind is UN}
    assert set(bars) == set(events) and events
    for name, bar in bars.items():
        e = events[name]
        assert (bar.get_x(), bar.get_width()) == pytest.approx((e.start - result.t0, e.end - e.start))
        assert e.rank - 0.45 <= bar.get_y() and bar.get_y() + bar.get_height() < e.rank and bar.get_hatch()
    assert "U unshard (all-gather) (its stream)" in [t.get_text() for t in chart.get_legend().get_texts()]
    save_figure(fig, tmp_path / "fsdp.png")


@pytest.mark.parametrize("vision", ["normal", "protanopia", "deuteranopia", "tritanopia"])
def test_gather_colour_stays_apart_from_the_drawn_kinds(vision):
    """UNSHARD's wine is at least 5 just-noticeable differences from every other drawn
    kind's colour (RESHARD takes no time and is not drawn), in normal vision and simulated
    for each full dichromacy (the measure of tests/sim/plot/test_figures.py)."""
    import numpy as np
    from tests.sim.plot.test_figures import DEFICIENCIES, JND, _lab, _linear
    drawn = {k: spec.colour for k, spec in sim.KINDS.items()
             if spec.role not in (sim.Role.SEND, sim.Role.RECV) and k is not RE}
    m = np.eye(3) if vision == "normal" else np.array(DEFICIENCIES[vision])
    lab = {k: _lab(m @ _linear(c)) for k, c in drawn.items()}
    for k in lab:
        if k is not UN:
            assert np.linalg.norm(lab[UN] - lab[k]) >= 5 * JND, (vision, k)
