"""sim.hardware.topology: Megatron-LM's rank order against a brute-force enumeration, how each group
sits on the nodes (closed forms for aligned sizes, brute force for any), the NIC share rule,
and the estimate and planner taking `nics_per_node`."""
from __future__ import annotations

import itertools
import math
from collections import Counter

import pytest
from hypothesis import given, settings, strategies as st

import sim
import sim.plan
from sim.hardware.topology import AXES, Group, Topology, one_node

sizes = st.integers(1, 6)


@st.composite
def layouts(draw):
    """A topology of any sizes, its experts folded as any expert_tp x ep dividing a stage's ranks."""
    tp, pp, dp, node, nics, cp = (draw(s) for s in (sizes, sizes, sizes, st.integers(1, 12), st.integers(1, 12),
                                                  st.integers(1, 4)))
    stage = tp * cp * dp
    ep = draw(st.sampled_from([d for d in range(1, stage + 1) if stage % d == 0]))
    etp = draw(st.sampled_from([d for d in range(1, stage // ep + 1) if (stage // ep) % d == 0]))
    return Topology(tp, pp, dp, node, nics, cp, ep, etp)


EXPERT_AXES = ("expert_tp", "ep", "edp")


def brute_expert_groups(topo: Topology, axis: str) -> set[tuple[int, ...]]:
    """Expert groups by enumerating ranks in the order of Megatron-Core's expert RankGenerator
    (tp=expert_tp, ep, dp=edp, cp=1 in order "tp-cp-ep-dp-pp": a counter over pp, edp, ep, expert_tp)."""
    ranges = (range(topo.pp), range(topo.edp), range(topo.ep), range(topo.expert_tp))
    out: dict[tuple, list[int]] = {}
    for rank, coords in enumerate(itertools.product(*ranges)):
        named = dict(zip(("pp", "edp", "ep", "expert_tp"), coords))
        out.setdefault(tuple(v for k, v in named.items() if k != axis), []).append(rank)
    return {tuple(g) for g in out.values()}
powers = st.sampled_from([1, 2, 4, 8, 16])


def brute_groups(topo: Topology, axis: str) -> set[tuple[int, ...]]:
    """Groups by enumerating ranks in Megatron's order (a counter over pp, dp, cp, tp nested, tp
    innermost: RankGenerator's "tp-cp-dp-pp") and collecting those that differ only in `axis`
    ("dp_cp": in dp and cp)."""
    coords = {}
    ranges = (range(topo.pp), range(topo.dp), range(topo.cp), range(topo.tp))
    for rank, (p, d, c, t) in enumerate(itertools.product(*ranges)):
        coords[rank] = {"tp": t, "cp": c, "dp": d, "pp": p}
    varying = {"embedding": ("pp",), "dp_cp": ("dp", "cp")}.get(axis, (axis,))
    out: dict[tuple, list[int]] = {}
    for rank in sorted(coords, key=lambda r: tuple(coords[r][k] for k in varying)):
        rest = tuple(v for k, v in coords[rank].items() if k not in varying)
        out.setdefault(rest, []).append(rank)
    if axis == "embedding":
        return {(g[0], g[-1]) if len(g) > 1 else tuple(g) for g in out.values()}
    return {tuple(g) for g in out.values()}


@settings(max_examples=200, deadline=None)
@given(layouts())
def test_groups_are_megatrons_by_brute_force(topo):
    for axis in AXES:
        groups = topo.groups(axis)
        brute = brute_expert_groups(topo, axis) if axis in EXPERT_AXES else brute_groups(topo, axis)
        assert len(groups) == len(set(groups)) and set(groups) == brute, axis
    # every rank in exactly one group of each axis (the embedding's: only the pipeline's ends)
    for axis in ("tp", "cp", "dp", "dp_cp", "pp", *EXPERT_AXES):
        assert sorted(r for g in topo.groups(axis) for r in g) == list(range(topo.gpus))
    # tp innermost: a tp group is tp consecutive ranks; a cp group's ranks are tp apart
    assert all(g == tuple(range(g[0], g[0] + topo.tp)) for g in topo.groups("tp"))
    assert all(b - a == topo.tp for g in topo.groups("cp") for a, b in zip(g, g[1:]))


def test_megatrons_own_example():
    """Megatron-LM's `initialize_model_parallel` docstring: 16 GPUs, tp 2, pp 4 (so dp 2):
    tensor groups [g0, g1], [g2, g3], ...; pipeline groups [g0, g4, g8, g12], [g1, g5, g9, g13],
    ...; data-parallel groups [g0, g2], [g1, g3], [g4, g6], ..."""
    t = Topology(tp=2, pp=4, dp=2)
    assert t.groups("tp")[:2] == [(0, 1), (2, 3)]
    assert sorted(t.groups("pp"))[:2] == [(0, 4, 8, 12), (1, 5, 9, 13)]
    assert sorted(t.groups("dp"))[:3] == [(0, 2), (1, 3), (4, 6)]
    assert sorted(t.groups("embedding"))[:2] == [(0, 12), (1, 13)]


@settings(max_examples=200, deadline=None)
@given(layouts())
def test_coords_and_group_of_answer_for_every_rank(topo):
    """`coords` inverts `rank`; `group_of` is the one group of its axis that holds the rank."""
    for rank in range(topo.gpus):
        (t, d, p), c = topo.coords(rank), topo.context(rank)
        assert topo.rank(t, d, p, c) == rank and 0 <= t < topo.tp and 0 <= d < topo.dp and 0 <= p < topo.pp
        assert 0 <= c < topo.cp
        for axis in ("tp", "cp", "dp", "dp_cp", "pp"):
            group = topo.group_of(axis, rank)
            assert rank in group and [g for g in topo.groups(axis) if rank in g] == [group]
    with pytest.raises(ValueError, match=r"ranks are 0\.\."):
        topo.coords(topo.gpus)


@given(st.integers(1, 6), st.integers(1, 6))
def test_exec_layout_numbers_replicas_fastest_then_pipeline_devices(pp, dp):
    """exec's pp x dp ranks (tp = 1): the replica runs fastest, then the pipeline device;
    the data-parallel groups and the pipelines each cut the world into disjoint sets that
    cover it, and one of each meet in exactly one rank."""
    topo = Topology(tp=1, pp=pp, dp=dp)
    for p in range(pp):
        for d in range(dp):
            r = topo.rank(0, d, p)
            assert r == p * dp + d and topo.coords(r) == (0, d, p)
            assert set(topo.group_of("dp", r)) & set(topo.group_of("pp", r)) == {r}
            assert topo.group_of("pp", r) == tuple(topo.rank(0, d, q) for q in range(pp))


def test_a_middle_device_is_in_no_embedding_group():
    topo = Topology(tp=1, pp=3, dp=1)
    assert topo.group_of("embedding", 2) == (0, 2)
    with pytest.raises(ValueError, match="rank 1 is in no embedding group"):
        topo.group_of("embedding", 1)


def brute_placed(topo: Topology, ranks) -> Group:
    per_node = Counter(r // topo.gpus_per_node for r in ranks)
    k = min(per_node.values())
    share = min(topo.nics_per_node, k * topo.nics_per_node / topo.gpus_per_node) if len(per_node) > 1 else 0.0
    return Group(len(ranks), k, len(per_node), share)


@settings(max_examples=200, deadline=None)
@given(layouts())
def test_the_slowest_group_by_brute_force(topo):
    """group(axis) is one of the axis's groups, and none is slower: none crosses nodes where
    it does not, none that crosses has fewer GPUs on a node (a smaller NIC share)."""
    for axis in AXES:
        placed = [brute_placed(topo, g) for g in topo.groups(axis)]
        slowest = topo.group(axis)
        assert slowest in placed
        assert slowest.network == any(g.network for g in placed)
        crossing = [g for g in placed if g.network]
        if crossing:
            assert slowest.per_node == min(g.per_node for g in crossing)
            assert slowest.nic_share == min(g.nic_share for g in crossing)


@settings(max_examples=200, deadline=None)
@given(powers, powers, powers, st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2, 4, 8, 16]))
def test_aligned_sizes_closed_forms(tp, pp, dp, gpn, nics):
    """Powers of two: an axis of size n whose ranks are `stride` apart has k = min(n,
    gpn/stride) (at least 1) of them on each of n/k nodes; the NIC share is k nics/gpn."""
    topo = Topology(tp, pp, dp, gpn, nics)
    for axis, n, stride in (("tp", tp, 1), ("dp", dp, tp), ("pp", pp, tp * dp)):
        k = max(1, min(n, gpn // stride))
        assert topo.group(axis) == Group(n, k, n // k, min(nics, k * nics / gpn) if k < n else 0.0), axis
    # the tied embedding's pair (first and last stage) crosses nodes iff the run spans nodes
    crosses = pp > 1 and tp * dp * pp > gpn
    assert topo.group("embedding").network == crosses
    assert topo.pipeline_send(list(range(pp))).network == crosses
    if crosses:
        assert topo.group("embedding").per_node == 1
    # a send between neighbours crosses iff they are in different aligned blocks of a node
    for p in range(pp - 1):
        assert topo.send(p, p + 1).network == (tp * dp >= gpn or (p + 1) * tp * dp % gpn == 0)


@settings(max_examples=100, deadline=None)
@given(layouts(), st.data())
def test_send_crosses_iff_some_pair_does(topo, data):
    a = data.draw(st.integers(0, topo.pp - 1))
    b = data.draw(st.integers(0, topo.pp - 1))
    pairs = [(topo.rank(t, d, a, c), topo.rank(t, d, b, c))
             for t in range(topo.tp) for d in range(topo.dp) for c in range(topo.cp)]
    crosses = any(x // topo.gpus_per_node != y // topo.gpus_per_node for x, y in pairs)
    s = topo.send(a, b)
    assert s.network == crosses
    if crosses:
        assert s.nic_share == min(topo.nics_per_node, topo.nics_per_node / topo.gpus_per_node)


@settings(max_examples=100, deadline=None)
@given(layouts())
def test_ring_send_crosses_iff_some_neighbours_do(topo):
    """The cp ring's send crosses nodes iff two neighbours of some ring (the last and the
    first included) sit on two nodes; cp = 1 has no send."""
    hops = [(g[i], g[(i + 1) % len(g)]) for g in topo.groups("cp") for i in range(len(g))]
    crosses = any(x // topo.gpus_per_node != y // topo.gpus_per_node for x, y in hops)
    s = topo.ring_send("cp")
    assert s.network == crosses and s.size == min(topo.cp, 2)


def test_nic_share_rule():
    """DGX (one NIC a GPU): the k GPUs of a group on a node use k NICs; 4 NICs for 8 GPUs: half."""
    assert Topology(16, 1, 1).group("tp") == Group(16, 8, 2, 8.0)
    assert Topology(16, 1, 1, nics_per_node=4).group("tp") == Group(16, 8, 2, 4.0)
    assert Topology(1, 1, 32).group("dp") == Group(32, 8, 4, 8.0)
    assert Topology(8, 1, 32, nics_per_node=4).group("dp") == Group(32, 1, 32, 0.5)
    assert Topology(2, 1, 2).group("dp") == one_node(2)  # inside a node: no NIC


@pytest.mark.parametrize("args, words", [
    ((0, 1, 1), "tp must be a positive int"),
    ((1, 1, 1, 8, 0), "nics_per_node must be a positive int"),
    ((1, 2, 1, True), "gpus_per_node must be a positive int"),
])
def test_bad_sizes_raise(args, words):
    with pytest.raises(ValueError, match=words):
        Topology(*args)


def test_bad_axis_and_device_raise():
    t = Topology(2, 2, 2)
    with pytest.raises(ValueError, match="axis must be one of tp, cp, dp, dp_cp, pp, embedding, ep"):
        t.group("etp")
    with pytest.raises(ValueError, match="pipeline devices are 0..1"):
        t.send(0, 2)


def test_estimate_takes_nics_per_node():
    """Fewer NICs slow what crosses nodes and nothing else; the default is one a GPU; a bad
    value is one ValueError."""
    kw = dict(tp=8, pp=2, dp=4, micro_batch=1, global_batch=16, recompute="full")
    default, eight, four = (sim.estimate("megatron-1.7b", "a100-80gb", **kw, **extra)
                            for extra in ({}, {"nics_per_node": 8}, {"nics_per_node": 4}))
    assert default.step_time == eight.step_time and default.layout.nics_per_node == 8
    assert four.time_parts["grad_reduce"] > eight.time_parts["grad_reduce"]
    assert four.time_parts["gemm"] == eight.time_parts["gemm"]
    with pytest.raises(ValueError, match="nics_per_node must be a positive int"):
        sim.estimate("megatron-1.7b", "a100-80gb", nics_per_node=0, **kw)


def test_estimate_runs_tp_across_nodes_and_warns():
    e = sim.estimate("gpt3-175b", "a100-80gb", tp=16, pp=8, micro_batch=1, global_batch=16,
                     recompute="selective", sequence_parallel=True)
    assert e.layout.topology().group("tp").nodes == 2
    assert any("spans nodes" in w for w in e.warnings)


def test_plan_search_takes_nics_per_node():
    space = dict(tp=[8], pp=[1, 2], micro_batch=[1], schedules=["1f1b"], recompute=["full"], zero=[0],
                 sequence_parallel=[False])
    eight, four = (sim.plan.search("megatron-1.7b", "a100-80gb", 32, 64, nics_per_node=n, **space) for n in (8, 4))
    assert four.best.step_time > eight.best.step_time  # dp = 4 or 2 replicas reduce through the NICs
    with pytest.raises(ValueError, match="nics_per_node must be a positive int"):
        sim.plan.search("megatron-1.7b", "a100-80gb", 32, 64, nics_per_node=0, **space)
    assert math.isfinite(four.best.step_time)


@given(sizes, sizes, sizes, st.integers(1, 4), st.data())
def test_expert_folding_closed_forms(tp, pp, dp, cp, data):
    """edp = tp cp dp / (expert_tp ep); the expert groups of each axis have its size, and there are
    gpus / size of them; the pipeline groups are the dense layout's (Megatron-Core asserts the same)."""
    stage = tp * cp * dp
    ep = data.draw(st.sampled_from([d for d in range(1, stage + 1) if stage % d == 0]))
    etp = data.draw(st.sampled_from([d for d in range(1, stage // ep + 1) if (stage // ep) % d == 0]))
    topo = Topology(tp, pp, dp, cp=cp, ep=ep, expert_tp=etp)
    assert topo.edp * etp * ep == stage
    for axis, size in (("ep", ep), ("expert_tp", etp), ("edp", topo.edp)):
        groups = topo.groups(axis)
        assert {len(g) for g in groups} == {size} and len(groups) == topo.gpus // size
    assert topo.groups("pp") == Topology(tp, pp, dp, cp=cp).groups("pp")


def test_an_expert_group_that_does_not_fold_is_refused():
    with pytest.raises(ValueError, match="does not divide the tp x cp x dp = 8 ranks"):
        Topology(tp=4, pp=1, dp=2, ep=16)


def test_deepseek_v3_rows_all_to_all_crosses_nodes():
    """The H100 rows' DeepSeek-V3 (tp 2, dp 32, ep 64): an ep group is 64 consecutive ranks, 8 nodes;
    Grok-1's ep 8 of tp 4 x cp 2 x dp 8 is one node."""
    assert Topology(tp=2, pp=8, dp=32, ep=64).group("ep") == Group(64, 8, 8, 8.0)
    assert not Topology(tp=4, pp=8, dp=8, cp=2, ep=8).group("ep").network


@given(st.sampled_from([1, 2, 3, 4, 6, 8]), st.sampled_from([1, 2, 3, 4]), st.sampled_from([1, 2, 3, 4, 6]),
       st.sampled_from([1, 2, 3, 5]), st.sampled_from([1, 2, 3, 4, 6, 8]), st.sampled_from([None, 1, 2, 4]),
       st.data())
@settings(max_examples=200, deadline=None)
def test_the_slowest_group_is_the_slowest_of_every_group(tp, cp, dp, pp, per_node, nics, data):
    """`group`, `ring_send`, `send` and `mirrored` read one group per first rank modulo a node;
    the answer is the one every group of the axis gives (node sizes that divide nothing included)."""
    stage = tp * cp * dp
    ep, etp = data.draw(st.sampled_from([(e, t) for e in range(1, stage + 1) for t in range(1, stage + 1)
                                         if stage % (e * t) == 0]))
    topo = Topology(tp, pp, dp, per_node, nics, cp, ep, etp)
    slowest = lambda groups: min((topo.placed(g) for g in groups), key=lambda g: (not g.network, g.per_node, -g.nodes))
    for axis in ("tp", "cp", "dp", "dp_cp", "pp", "embedding", "ep", "expert_tp", "edp"):
        assert topo.group(axis) == slowest(topo.groups(axis)), axis
    crosses = any(topo.node(a) != topo.node(b) for g in topo.groups("cp") for a, b in zip(g, g[1:] + g[:1]))
    assert topo.ring_send("cp").network == (crosses and cp > 1)
    for a in range(pp):
        b = data.draw(st.integers(0, pp - 1))
        pairs = [(topo.rank(t, d, a, c), topo.rank(t, d, b, c)) for t in range(tp) for d in range(dp) for c in range(cp)]
        assert topo.send(a, b).network == any(topo.node(x) != topo.node(y) for x, y in pairs)
    stride = stage
    joined = [g + tuple(r + (pp - 1 - 2 * (g[0] // stride)) * stride for r in g)
              for g in topo.groups("dp") if 2 * (g[0] // stride) < pp - 1]
    assert topo.mirrored("dp") == (slowest(joined) if joined else topo.group("dp"))
