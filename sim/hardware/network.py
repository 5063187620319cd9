"""NCCL's cost model of a collective over a group of GPUs, and of a point-to-point send.

From NVIDIA/nccl `src/graph/tuning.cc` (`ncclTopoTuneModel`, `ncclTopoGetAlgoTime`; the
NCCL 2.19-2.20 copy, whose network hop is 14 us), for the Simple protocol, the one NCCL runs
large buffers with (LL and LL128 win only below about a megabyte; not modelled). A collective
of `nbytes` (the whole buffer) over n ranks on N nodes, k of them on each:

- Ring (every op): 2(n-1) steps for an all-reduce, n-1 for a reduce-scatter or all-gather;
  each moves 1/n of the buffer through every rank's link at the bus bandwidth B:
      time = latency + steps / n * nbytes / B
      latency = base + (steps - inter) * node hop + inter * network hop
  with inter = 0 on one node, else min(steps, 2N) for an all-reduce and N - 1 for the others
  (tuning.cc's `nInterSteps`); a multi-node ring all-reduce's latency is taken 1.4x ("Plateau
  effect of ring", compute capability 8.0 and later; 1.9 before).
- Tree (all-reduce only; NCCL's double binary tree): latency 2((n/N - 1) * 28 us + floor(log2
  N) * 28 us) (its Simple hop latencies over NVLink and the network; base 0), bandwidth
  0.92 * B / 2, times tuning.cc's correction for the buffer's size (`treeCorrectionFactor`,
  Simple row, 64 B to 256 MB).
- NCCL picks the faster of the two for an all-reduce (as `ncclTopoGetAlgoTime` is used to);
  on one node the ring always wins (lower latency, higher bandwidth), so a one-node all-reduce
  is the plain NVLink ring.

The bus bandwidth B: inside one node NVLink's (`ClusterLinks.node`); across nodes the NICs the
group's k GPUs on a node share (`sim.hardware.topology`: `Group.nic_share` NICs) at one NIC's bus
bandwidth each (`ClusterLinks.network`), at most NVLink's: each channel also crosses NVLink inside
the node. Not modelled: NCCL's per-channel bandwidth caps (`perChMaxTreeBws` and the like:
the channel count is not modelled), its network post overhead (`getNetOverhead`: 1 us on Intel,
2 on AMD hosts, times 3 for Simple, a floor on the intra-node hop of a multi-node ring), and
the network latency of the graph (`latencyInter`, 0 for InfiniBand).

The links are plain records (the profile's `Link`s in `ClusterLinks`; `P2PLink`, one send's path), taken as
arguments; `links_of` builds them from a device profile (`sim.hardware.profile`, docs/profiles.md). Where the profile has a
measured table of a collective over this many ranks on this link (`collectives.table`), or
of sends (`p2p.table`), the table's time is taken instead of the model's.

    >>> from sim.hardware.profile import profile
    >>> from sim.hardware.topology import Topology
    >>> links, t = links_of(profile("a100-80gb-best-case")), Topology(tp=16, pp=1, dp=1, nics_per_node=4)
    >>> round(bus_bandwidth(links, t.group("tp")) / 1e9)   # 4 HDR NICs at 24 GB/s each
    96
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cache
from typing import Callable, Optional

from .profile import DeviceProfile, Link
from .topology import Group

OPS = {"all_reduce": 2, "reduce_scatter": 1, "all_gather": 1}  # ring steps per rank, times n - 1

# tuning.cc, NCCL 2.19-2.20 copy: ring all-reduce's "Plateau effect" on multi-node latency
# (compute capability >= 8.0: 1.4; below: 1.9); Tree/Simple: baseLat 0, hwLat 28 us over
# NVLink and 28 us over the network (50 us in the 2020 copy), busBw * .92, algorithm bandwidth
# half the bus bandwidth.
RING_PLATEAU = 1.4
TREE_BASE_LATENCY, TREE_NODE_HOP, TREE_NETWORK_HOP = 0.0, 28e-6, 28e-6
TREE_EFFICIENCY = 0.92
# treeCorrectionFactor[Simple], by log2(nbytes / 64): 64 B, 128 B, ... 256 MB; 1 above.
TREE_CORRECTION = (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9)


@dataclass(frozen=True)
class P2PLink:
    """One point-to-point send over a link: bytes/s (the network's: one NIC's) and latency."""
    bandwidth: float
    latency: float


@dataclass(frozen=True)
class ClusterLinks:
    """The links of a cluster: collectives and sends inside a node and between nodes; `tree`:
    whether the library has NCCL's tree all-reduce."""
    node: Link       # the profile's record of the link: NCCL's ring over it and one send's figures
    network: Link
    tree: bool = True
    # measured times: (op, link, ranks, nbytes) -> seconds or None; (link, nbytes) -> seconds or None
    measured: Optional[Callable] = field(default=None, compare=False)
    measured_p2p: Optional[Callable] = field(default=None, compare=False)


@cache
def links_of(dev: DeviceProfile) -> ClusterLinks:
    """The links of a node of devices from their profile (`DeviceProfile.link`: NCCL's ring
    model of each link and its sends) and the profile's measured tables; NCCL's tree where
    the profile was measured with NCCL (gloo has none). A device without a network link (one
    host) gets its node link for both: nothing leaves its node."""
    node = dev.link("node")
    return ClusterLinks(node, dev.links.get("network", node), tree=dev.fingerprint.get("backend", "nccl") == "nccl",
                 measured=dev.collective_lookup if dev.collective_rows else None,
                 measured_p2p=dev.p2p_lookup if dev.p2p_rows else None)


def bus_bandwidth(links: ClusterLinks, group: Group) -> float:
    """Bytes/s each rank of `group` moves: NVLink's inside a node, else its NICs' (at most NVLink's)."""
    if not group.network:
        return links.node.bus_bandwidth
    return min(links.node.bus_bandwidth, group.nic_share * links.network.bus_bandwidth)


def _check(op: str) -> None:
    if op not in OPS:
        raise ValueError(f"collective must be one of {', '.join(OPS)}; got {op!r}")


def ring_time(links: ClusterLinks, op: str, nbytes: float, group: Group) -> float:
    """Seconds for NCCL's ring `op` of `nbytes` over `group` (see the module's docstring)."""
    _check(op)
    n = group.size
    if n <= 1 or nbytes <= 0:
        return 0.0
    steps = OPS[op] * (n - 1)
    if not group.network:
        latency = links.node.base_latency + steps * links.node.hop_latency
    else:
        inter = min(steps, 2 * group.nodes) if op == "all_reduce" else group.nodes - 1
        latency = links.network.base_latency + (steps - inter) * links.node.hop_latency \
            + inter * links.network.hop_latency
        latency *= RING_PLATEAU if op == "all_reduce" else 1.0
    return latency + steps / n * nbytes / bus_bandwidth(links, group)


def tree_time(links: ClusterLinks, nbytes: float, group: Group) -> float:
    """Seconds for NCCL's tree all-reduce of `nbytes` over `group`; inf where the links have no tree."""
    if group.size <= 1 or nbytes <= 0:
        return 0.0
    if not links.tree:
        return math.inf
    per_node = group.size // group.nodes
    latency = TREE_BASE_LATENCY + 2 * ((per_node - 1) * TREE_NODE_HOP + int(math.log2(group.nodes)) * TREE_NETWORK_HOP)
    size = int(math.log2(max(int(nbytes) >> 6, 1)))
    correction = TREE_CORRECTION[size] if size < len(TREE_CORRECTION) else 1.0
    return latency + nbytes / (TREE_EFFICIENCY * bus_bandwidth(links, group) / 2 * correction)


def algorithm(links: ClusterLinks, op: str, nbytes: float, group: Group) -> str:
    """"ring" or "tree": the one NCCL's model picks (the faster; the ring on a tie, and for
    every op but the all-reduce)."""
    _check(op)
    if op != "all_reduce" or ring_time(links, op, nbytes, group) <= tree_time(links, nbytes, group):
        return "ring"
    return "tree"


def collective_time(links: ClusterLinks, op: str, nbytes: float, group: Group) -> float:
    """Seconds for `op` ("all_reduce", "reduce_scatter", "all_gather") of `nbytes` (the whole
    buffer) over `group`, by the algorithm NCCL picks, or as measured. 0 on one rank."""
    if links.measured is not None and group.size > 1 and nbytes > 0:
        t = links.measured(op, "network" if group.network else "node", group.size, nbytes)
        if t is not None:
            return t
    if algorithm(links, op, nbytes, group) == "tree":
        return tree_time(links, nbytes, group)
    return ring_time(links, op, nbytes, group)


def all_to_all_time(links: ClusterLinks, nbytes: float, group: Group) -> float:
    """Seconds for an all-to-all of `nbytes` a rank over `group` (NCCL's: every rank sends
    1/n of its buffer to each other rank at once), after one send's latency. Inside a node:
    (n - 1)/n of the buffer at NVLink's bus bandwidth (nccl-tests' bus bandwidth of alltoall,
    `busBw = algBw * (n - 1)/n`, doc/PERFORMANCE.md). Across nodes every rank's traffic is its
    own, not a ring's passing through: (n - k)/n of its buffer goes to the other nodes' ranks
    through its own share of the NICs (the group's k GPUs on a node share `nic_share` NICs,
    nic_share/k each, at most NVLink's bandwidth) while (k - 1)/n goes to its node's ranks over
    NVLink; the slower of the two. 0 on one rank."""
    n = group.size
    if n <= 1 or nbytes <= 0:
        return 0.0
    if not group.network:
        return links.node.p2p_latency + (n - 1) / n * nbytes / bus_bandwidth(links, group)
    k = group.per_node
    nic = min(links.node.bus_bandwidth, group.nic_share / k * links.network.bus_bandwidth)
    return links.network.p2p_latency + max((n - k) / n * nbytes / nic, (k - 1) / n * nbytes / links.node.bus_bandwidth)


def p2p_link(links: ClusterLinks, send: Group) -> P2PLink:
    """The link of a send (`sim.hardware.topology.Topology.send`): NVLink's inside a node; across
    nodes the sending GPU's share of the NICs, at most NVLink's bandwidth."""
    if not send.network:
        return P2PLink(links.node.p2p_bandwidth, links.node.p2p_latency)
    bandwidth = min(links.node.p2p_bandwidth, send.nic_share * links.network.p2p_bandwidth)
    return P2PLink(bandwidth, links.network.p2p_latency)


def p2p_time(links: ClusterLinks, nbytes: float, send: Group) -> float:
    """Seconds for one send of `nbytes` (latency + bytes / bandwidth), or as measured."""
    if links.measured_p2p is not None:
        t = links.measured_p2p("network" if send.network else "node", nbytes)
        if t is not None:
            return t
    link = p2p_link(links, send)
    return link.latency + nbytes / link.bandwidth
