"""sim.hardware.network: NCCL's ring and tree model (src/graph/tuning.cc) over the groups of
sim.hardware.topology: closed forms, the old one-node ring, linearity in bytes, NCCL's choice between
ring and tree, NIC count and the NVLink cap; the all-to-all across nodes; and the tensor-parallel layer
across two nodes."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings, strategies as st

import sim
import sim.plan
from sim.hardware import network
from sim.cost.data_parallel import grad_reduce_times, stage_params
from sim.model.footprint import state_bytes_per_param
from sim.cost.layer import Slice, layer_times
from sim.hardware.network import Group, OPS, algorithm, all_to_all_time, bus_bandwidth, collective_time, links_of, ring_time, tree_time
from sim.hardware.topology import Topology, one_node

A100 = sim.profile("a100-80gb-best-case")
LINKS = links_of(A100)
NCCL_BASE_LATENCY = A100.link("node").base_latency
NVLINK_HOP, NETWORK_HOP = A100.link("node").hop_latency, A100.link("network").hop_latency
ops = st.sampled_from(sorted(OPS))
nbytes = st.floats(1e3, 1e10)
# groups that span nodes: k GPUs on each of N nodes, any NIC share
crossing = st.builds(lambda k, n, share: Group(k * n, k, n, share),
                     st.integers(1, 8), st.integers(2, 64), st.sampled_from([0.5, 1.0, 2.0, 4.0, 8.0, 16.0]))


def test_links_are_the_profiles():
    node, net = A100.link("node"), A100.link("network")
    assert LINKS.node == node and LINKS.network == net
    assert (LINKS.network.p2p_bandwidth, LINKS.network.p2p_latency) == (24e9, NETWORK_HOP)
    assert LINKS.tree and LINKS.measured is None  # measured with NCCL; no tables in a best-case profile


@given(st.integers(1, 64), nbytes, ops)
def test_one_node_is_the_nvlink_ring(n, size, op):
    """Inside a node: base + steps hops + steps/n of the buffer at NVLink's bus bandwidth."""
    steps = OPS[op] * (n - 1)
    ring = 0.0 if n == 1 else NCCL_BASE_LATENCY + steps * NVLINK_HOP + steps / n * size / LINKS.node.bus_bandwidth
    assert collective_time(LINKS, op, size, one_node(n)) == pytest.approx(ring, rel=1e-12)
    assert algorithm(LINKS, op, size, one_node(n)) == "ring"


@given(crossing, nbytes, ops)
def test_ring_is_linear_in_bytes_and_all_reduce_is_twice_a_reduce_scatter(g, size, op):
    t1, t2, t3 = (ring_time(LINKS, op, i * size, g) for i in (1, 2, 3))
    assert t3 - t2 == pytest.approx(t2 - t1, rel=1e-9)
    slope = (t2 - t1) / size
    assert slope == pytest.approx(OPS[op] * (g.size - 1) / g.size / bus_bandwidth(LINKS, g), rel=1e-9)
    ar, rs, ag = (ring_time(LINKS, o, size, g) for o in ("all_reduce", "reduce_scatter", "all_gather"))
    assert rs == ag
    assert ar - ar_latency(g) == pytest.approx(2 * (rs - rs_latency(g)), rel=1e-9)


def ar_latency(g: Group) -> float:
    """tuning.cc, Ring/Simple all-reduce across nodes: base + intra-node hops + 2N network hops
    (no more than the steps), times the ring's plateau factor."""
    steps = 2 * (g.size - 1)
    inter = min(steps, 2 * g.nodes)
    return network.RING_PLATEAU * (NCCL_BASE_LATENCY + (steps - inter) * NVLINK_HOP
                                   + inter * NETWORK_HOP)


def rs_latency(g: Group) -> float:
    steps = g.size - 1
    return NCCL_BASE_LATENCY + (steps - g.nodes + 1) * NVLINK_HOP + (g.nodes - 1) * NETWORK_HOP


@given(crossing, st.floats(2 ** 30, 2 ** 34))
def test_tree_above_its_correction_table_is_linear(g, size):
    """Above 256 MB the tree's size correction is 1: latency + bytes / (0.92 B / 2)."""
    t1, t2 = tree_time(LINKS, size, g), tree_time(LINKS, 2 * size, g)
    assert t2 - t1 == pytest.approx(size / (network.TREE_EFFICIENCY * bus_bandwidth(LINKS, g) / 2), rel=1e-9)
    latency = 2 * ((g.size // g.nodes - 1) * network.TREE_NODE_HOP + int(math.log2(g.nodes)) * network.TREE_NETWORK_HOP)
    assert t1 - size / (network.TREE_EFFICIENCY * bus_bandwidth(LINKS, g) / 2) == pytest.approx(latency, rel=1e-9)


@given(crossing, nbytes, ops)
def test_nccl_picks_the_faster_and_tree_only_for_all_reduce(g, size, op):
    ring, tree = ring_time(LINKS, op, size, g), tree_time(LINKS, size, g)
    t = collective_time(LINKS, op, size, g)
    if op == "all_reduce":
        assert t == min(ring, tree)
        assert algorithm(LINKS, op, size, g) == ("ring" if ring <= tree else "tree")
    else:
        assert t == ring and algorithm(LINKS, op, size, g) == "ring"
    no_tree = network.ClusterLinks(LINKS.node, LINKS.network, tree=False)
    assert collective_time(no_tree, op, size, g) == ring


def test_tree_wins_small_all_reduces_over_many_nodes_and_the_ring_large_ones():
    """Ring latency grows with the ranks, the tree's with log2 of the nodes; the ring's bytes
    are 2(n-1)/n of the buffer at B, the tree's the buffer at 0.92 B / 2."""
    g = Group(128, 1, 128, 1.0)
    assert algorithm(LINKS, "all_reduce", 1e5, g) == "tree"
    assert algorithm(LINKS, "all_reduce", 1e10, g) == "ring"


@settings(max_examples=50)
@given(st.sampled_from([(16, 1, 1), (8, 1, 4), (1, 1, 32), (2, 2, 16), (4, 1, 8)]), st.sampled_from([8, 16]),
       nbytes, ops)
def test_more_nics_never_slower_and_nvlink_caps_them(sizes, gpn, size, op):
    tp, pp, dp = sizes
    axis = "tp" if tp > gpn else "dp"
    groups = [Topology(tp, pp, dp, gpn, nics).group(axis) for nics in range(1, 2 * gpn + 1)]
    times = [collective_time(LINKS, op, size, g) for g in groups]
    assert all(a >= b for a, b in zip(times, times[1:]))
    assert all(bus_bandwidth(LINKS, g) <= LINKS.node.bus_bandwidth for g in groups)
    if groups[0].network:  # enough NICs: NVLink's bandwidth, the network's latency
        many = Topology(tp, pp, dp, gpn, 10 ** 6).group(axis)
        assert bus_bandwidth(LINKS, many) == LINKS.node.bus_bandwidth
        assert collective_time(LINKS, op, size, many) >= collective_time(LINKS, op, size, one_node(many.size))


def test_p2p_inside_a_node_is_nvlink_and_across_it_the_gpus_nic_share():
    inside, across = Topology(2, 4, 1).send(0, 1), Topology(8, 2, 1, nics_per_node=4).send(0, 1)
    assert network.p2p_link(LINKS, inside) == network.P2PLink(LINKS.node.p2p_bandwidth, LINKS.node.p2p_latency)
    link = network.p2p_link(LINKS, across)
    assert link.bandwidth == pytest.approx(0.5 * 24e9) and link.latency == NETWORK_HOP
    assert network.p2p_time(LINKS, 1e6, across) == pytest.approx(NETWORK_HOP + 1e6 / 12e9)
    # the estimate's pipeline link (the costs it simulates, as the planner's bounds take them)
    bounds = sim.plan.bounds.Bounds(sim.MODELS["megatron-1.7b"], A100)
    costs, _, _ = bounds.costs(sim.plan.Layout(tp=8, pp=2, virtual=1, nics_per_node=4, global_batch=4))
    assert (costs.bandwidth, costs.latency) == (link.bandwidth, link.latency)


def test_collectives_refuse_an_unknown_op():
    with pytest.raises(ValueError, match="collective must be one of all_reduce, reduce_scatter, all_gather"):
        collective_time(LINKS, "broadcast", 1e6, one_node(8))


def one_nic(op: str, nbytes: float, n: int) -> float:
    """The previous model: the whole ring through each GPU's own network card."""
    steps = OPS[op] * (n - 1)
    return NCCL_BASE_LATENCY + steps * NETWORK_HOP + steps / n * nbytes / LINKS.network.bus_bandwidth


def test_data_parallel_reduction_with_tp_below_a_node_uses_its_gpus_nics():
    """Narayanan et al. 2021, Table 1's first row: tp 1, dp 32 on 4 nodes: the 8 GPUs of each
    node in one ring, 8 NICs at once (not each GPU's own card, as before)."""
    m = sim.MODELS["megatron-1.7b"]
    lay = sim.estimate(m, "a100-80gb", tp=1, pp=1, dp=32, micro_batch=16, global_batch=512,
                       recompute="full", precision="fp16").layout
    params = stage_params(m, [m.layers], 1, [0])
    grad = state_bytes_per_param("fp16")["grads"]
    (t,) = grad_reduce_times(m, A100, lay, params, [0])
    assert t == collective_time(LINKS, "all_reduce", params[0] * grad, Group(32, 8, 4, 8.0))
    assert t < one_nic("all_reduce", params[0] * grad, 32) / 4


def test_tensor_parallel_layer_across_two_nodes_is_much_faster_than_through_one_nic():
    """A GPT-3 175B layer as Korthikanti et al. 2022 run it (b 1, selective recompute,
    sequence parallelism) with tp = 16 over two DGX nodes: its 8 GPUs on a node drive their 8
    NICs at once, so the collectives' bytes take 1/8 of the time the old model gave them
    through one NIC; only the collectives differ from the same layer inside one node."""
    m = sim.MODELS["gpt3-175b"]
    group = Topology(16, 1, 1).group("tp")
    across = layer_times(m, A100, Slice(1, 16, True, "bf16", tp_group=group), "selective")
    inside = layer_times(m, A100, Slice(1, 16, True, "bf16"), "selective")
    buf = m.seq * m.hidden * 2

    def fwd_collectives(time):  # F: an all-gather and a reduce-scatter per sub-layer
        return 2 * (time("all_gather") + time("reduce_scatter"))

    new = fwd_collectives(lambda op: collective_time(LINKS, op, buf, group))
    old = fwd_collectives(lambda op: one_nic(op, buf, 16))
    nvlink = fwd_collectives(lambda op: collective_time(LINKS, op, buf, one_node(16)))
    assert across.forward == pytest.approx(inside.forward - nvlink + new, rel=1e-12)
    latency = 4 * (rs_latency(group))
    old_latency = 4 * (NCCL_BASE_LATENCY + 15 * NETWORK_HOP)
    assert (new - latency) * 8 == pytest.approx(old - old_latency, rel=1e-9)
    assert inside.forward < across.forward < across.forward - new + old
    # end to end: 16-way tensor parallelism on twice the GPUs now shortens the step
    kw = dict(pp=8, micro_batch=1, global_batch=64, recompute="selective", sequence_parallel=True)
    tp8, tp16 = (sim.estimate(m, "a100-80gb", tp=t, **kw) for t in (8, 16))
    assert tp16.step_time < tp8.step_time


@given(st.sampled_from([1, 2, 4, 8]), st.integers(2, 16), st.floats(1e6, 1e9))
def test_an_all_to_all_across_nodes_sends_each_ranks_own_bytes_through_its_nic(k, nodes, size):
    """An all-to-all of n = k x nodes ranks, k a node (one NIC a GPU): each rank's (n - k)/n of its
    buffer leaves through its own NIC, however many of its group share the node (a ring's bus
    bandwidth would grow with k; an all-to-all's does not), and (k - 1)/n goes over NVLink at once."""
    links = links_of(sim.profile("h100-80gb-best-case"))
    n = k * nodes
    group = Topology(tp=1, pp=1, dp=n).group("dp") if k == 8 else Group(n, k, nodes, float(k))
    off = (n - k) / n * size / links.network.bus_bandwidth
    on = (k - 1) / n * size / links.node.bus_bandwidth
    assert all_to_all_time(links, size, group) == pytest.approx(links.network.p2p_latency + max(off, on), rel=1e-12)
    alone = all_to_all_time(links, size, Group(nodes, 1, nodes, 1.0))  # one rank a node: (nodes - 1)/nodes of it
    assert alone == pytest.approx(links.network.p2p_latency + (nodes - 1) / nodes * size / links.network.bus_bandwidth)
