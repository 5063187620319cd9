"""Where a run's GPUs sit on the nodes, and which link each of its communicating groups uses.

Ranks are numbered as Megatron-LM numbers them: tensor parallelism fastest, then context
parallelism, then data parallelism, then the pipeline (megatron/core/parallel_state.py,
`initialize_model_parallel`, default `order="tp-cp-ep-dp-pp"`, with no expert parallelism;
DeepSpeed's `PipeModelDataParallelTopology` orders tp, dp and pp the same way). The rank of
tensor-parallel index t, context-parallel index c, replica d and pipeline device p is

    rank = t + tp * (c + cp * (d + dp * p))

and rank r sits on node r // gpus_per_node. A group of an axis is the ranks that differ only in
that axis's index: "tp" (Megatron's tensor-parallel group: t varies), "cp" (a context-parallel
group, which splits the sequence: c varies), "dp" (d varies), "dp_cp" (c and d vary: the
group the gradients are reduced over, Megatron's data-parallel group "with context parallel",
`get_data_parallel_group(with_context_parallel=True)`; "dp" itself where cp = 1), "pp" (a
pipeline: p varies) and "embedding" (the first and last device of each pipeline, which
all-reduce the tied word embedding's gradient: Megatron's embedding group).

What a collective over a group costs depends on how the group sits on the nodes (`Group`):
its size n, the nodes it spans N, and k, the fewest of its GPUs on one of those nodes. One
node: NVLink (through the NVSwitch every GPU has its own links, so concurrent groups do not
share them). More than one: NCCL builds one ring (or tree) per channel and sends each
channel's node-to-node traffic through a different NIC, the one nearest the GPU that sends it,
so the k GPUs of a group on a node drive k NICs at once (NVIDIA/nccl `src/graph/search.cc`
and `tuning.cc`: a ring's bus bandwidth is its channels times the bandwidth of each). But
every group of an axis communicates at the same time (all dp groups reduce their gradients
together; all tp groups of a stage run the same layer), so the groups with GPUs on one node
share its NICs: gpus_per_node / k groups on the node, nics_per_node NICs in all, so a group's
k GPUs get

    nic_share = k * nics_per_node / gpus_per_node    NICs (at most nics_per_node)

(`sim.hardware.network` caps the product with NVLink's bandwidth: the ring also runs through NVLink
inside the node). With one NIC a GPU (DGX A100 / H100: `nics_per_node = gpus_per_node`, the
default) that is k NICs; with 4 NICs for 8 GPUs, k/2. A pipeline send from one GPU to the next
stage's is a group of two; every GPU of a stage sends at once, so each gets the GPU's share,
nics_per_node / gpus_per_node NICs.

Where an axis's groups sit differently (sizes that do not divide the node), `Topology.group`
answers with the slowest: one that crosses nodes before one that does not, then the fewest
GPUs on a node (the smallest NIC share), then the most nodes.

    >>> t = Topology(tp=16, pp=1, dp=2, gpus_per_node=8, nics_per_node=4)
    >>> t.group("tp")
    Group(size=16, per_node=8, nodes=2, nic_share=4.0)
    >>> t.group("dp")     # rank r and r + 16: one GPU of the group on each of two nodes
    Group(size=2, per_node=1, nodes=2, nic_share=0.5)

The same object answers which ranks form a group, as DeepSpeed's `ProcessTopology` and
Megatron-LM's `RankGenerator` do: exec lays out its pp x dp ranks with it (`exec.runtime.dp`).

    >>> t = Topology(tp=1, pp=2, dp=2)
    >>> t.coords(3), t.group_of("dp", 3), t.group_of("pp", 3)   # (t, replica, pipeline device)
    ((0, 1, 1), (2, 3), (1, 3))
    >>> t = Topology(tp=2, pp=1, dp=2, cp=2)
    >>> t.groups("cp"), t.context(2), t.group_of("dp_cp", 0)    # cp next to tp; c of rank 2
    ([(0, 2), (1, 3), (4, 6), (5, 7)], 1, (0, 2, 4, 6))

`coords` keeps its (t, replica, pipeline device) answer, the one exec's pp x dp ranks read;
`context` gives a rank's context-parallel index c.

Experts fold onto the same ranks (Megatron-Core's MoE parallel folding: parallel_state.py builds a
second `RankGenerator` for the expert layers, expert_tp x ep x edp with cp = 1, in the same
order, whose pipeline groups must equal the first's). Each stage's tp x cp x dp ranks are
numbered again, expert tensor parallelism fastest, then expert parallelism, then the expert
data-parallel replicas: a rank's stage-local index i = t + tp (c + cp d) is

    i = et + expert_tp * (e + ep * ed)          (edp = tp cp dp / (expert_tp ep))

so "ep" (an all-to-all group of the experts: e varies), "expert_tp" (et varies) and "edp" (ed
varies: the group expert gradients are reduced over) are groups like the others:

    >>> t = Topology(tp=4, pp=1, dp=4, ep=8)
    >>> t.groups("ep")[:2], t.group_of("edp", 0), t.group("ep")
    ([(0, 1, 2, 3, 4, 5, 6, 7), (8, 9, 10, 11, 12, 13, 14, 15)], (0, 8), Group(size=8, per_node=8, nodes=1, nic_share=0.0))
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from functools import lru_cache

AXES = ("tp", "cp", "dp", "dp_cp", "pp", "embedding", "ep", "expert_tp", "edp")


@dataclass(frozen=True)
class Group:
    """How one communicating group sits on the nodes: its GPUs, the fewest of them on one node
    it spans (k), the nodes it spans, and the NICs its k GPUs on a node get while every group
    of its axis communicates (see the module's docstring)."""
    size: int
    per_node: int
    nodes: int
    nic_share: float

    @property
    def network(self) -> bool:
        """Whether the group spans nodes (its traffic goes through the NICs)."""
        return self.nodes > 1


def one_node(size: int) -> Group:
    """A group of `size` GPUs inside one node (NVLink only: no NIC share)."""
    return Group(size, size, 1, 0.0)


@dataclass(frozen=True)
class Topology:
    """tp x cp x dp x pp GPUs in Megatron-LM's rank order on nodes of `gpus_per_node` GPUs and
    `nics_per_node` network cards (default: one a GPU), the experts folded onto each stage's
    ranks as expert_tp x ep x edp (see the module's docstring)."""
    tp: int
    pp: int
    dp: int
    gpus_per_node: int = 8
    nics_per_node: int | None = None
    cp: int = 1
    ep: int = 1
    expert_tp: int = 1

    def __post_init__(self):
        if self.nics_per_node is None:
            object.__setattr__(self, "nics_per_node", self.gpus_per_node)
        for name in ("tp", "pp", "dp", "gpus_per_node", "nics_per_node", "cp", "ep", "expert_tp"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if (self.tp * self.cp * self.dp) % (self.expert_tp * self.ep):
            raise ValueError(f"expert_tp x ep = {self.expert_tp} x {self.ep} does not divide the tp x cp x dp = "
                             f"{self.tp * self.cp * self.dp} ranks of a stage the experts fold onto")

    @property
    def edp(self) -> int:
        """The expert data-parallel size: tp cp dp / (expert_tp ep)."""
        return self.tp * self.cp * self.dp // (self.expert_tp * self.ep)

    @property
    def gpus(self) -> int:
        return self.tp * self.cp * self.dp * self.pp

    def rank(self, t: int, d: int, p: int, c: int = 0) -> int:
        """The global rank of tensor-parallel index t, replica d, pipeline device p and
        context-parallel index c."""
        return t + self.tp * (c + self.cp * (d + self.dp * p))

    def coords(self, rank: int) -> tuple[int, int, int]:
        """The (tensor-parallel index, replica, pipeline device) of global rank `rank`: with
        `context`, `rank`'s inverse."""
        t, _, d, p = self._indices(rank)
        return t, d, p

    def context(self, rank: int) -> int:
        """The context-parallel index c of global rank `rank` (0 where cp = 1)."""
        return self._indices(rank)[1]

    def _indices(self, rank: int) -> tuple[int, int, int, int]:
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.gpus:
            raise ValueError(f"ranks are 0..{self.gpus - 1}; got {rank!r}")
        rest, t = divmod(rank, self.tp)
        rest, c = divmod(rest, self.cp)
        p, d = divmod(rest, self.dp)
        return t, c, d, p

    def node(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def groups(self, axis: str) -> list[tuple[int, ...]]:
        """Every group of `axis` (`AXES`), each as its ranks in order."""
        r, tp, cp, dp, pp = self.rank, self.tp, self.cp, self.dp, self.pp
        if axis == "tp":
            return [tuple(r(t, d, p, c) for t in range(tp)) for p in range(pp) for d in range(dp) for c in range(cp)]
        if axis == "cp":
            return [tuple(r(t, d, p, c) for c in range(cp)) for p in range(pp) for d in range(dp) for t in range(tp)]
        if axis == "dp":
            return [tuple(r(t, d, p, c) for d in range(dp)) for p in range(pp) for c in range(cp) for t in range(tp)]
        if axis == "dp_cp":
            return [tuple(r(t, d, p, c) for d in range(dp) for c in range(cp)) for p in range(pp) for t in range(tp)]
        if axis == "pp":
            return [tuple(r(t, d, p, c) for p in range(pp)) for d in range(dp) for c in range(cp) for t in range(tp)]
        if axis == "embedding":
            return [(g[0], g[-1]) if pp > 1 else g for g in self.groups("pp")]
        if axis in ("ep", "expert_tp", "edp"):
            return _expert_groups(self, axis)
        raise ValueError(f"axis must be one of {', '.join(AXES)}; got {axis!r}")

    def group_of(self, axis: str, rank: int) -> tuple[int, ...]:
        """The group of `axis` that holds `rank` (a rank in no embedding group: ValueError)."""
        self.coords(rank)  # a rank out of range: its own error
        group = next((g for g in self.groups(axis) if rank in g), None)
        if group is None:
            raise ValueError(f"rank {rank} is in no {axis} group: only the first and last device of a pipeline are")
        return group

    def placed(self, ranks) -> Group:
        """How the group of `ranks` sits on the nodes, its axis's groups all communicating."""
        counts = Counter(self.node(r) for r in ranks).values()
        if len(counts) == 1:
            return one_node(len(ranks))
        k = min(counts)
        share = min(float(self.nics_per_node), k * self.nics_per_node / self.gpus_per_node)
        return Group(len(ranks), k, len(counts), share)

    def group(self, axis: str) -> Group:
        """The slowest group of `axis` (see the module's docstring)."""
        return _slowest(self, axis)

    def mirrored(self, axis: str) -> Group:
        """The slowest group of `axis` joined with its mirror image on pipeline device pp-1-p
        (the same offsets, the other device): the replicas of a stage that DualPipe holds twice,
        its copies on devices p and pp-1-p, reduce over it (docs/rules.md, rule 13). With
        pp > 1 it spans two pipeline devices, so nodes unless both fit one."""
        return _mirrored(self, axis)

    def slowest(self, groups) -> Group:
        """The slowest of `groups` (each its ranks), all communicating at once: for groups
        no axis names, such as HSDP's shard and replica groups inside "dp"."""
        return min((self.placed(g) for g in groups), key=_slowness)

    def send(self, a: int, b: int) -> Group:
        """A pipeline send from device a to device b: the slowest of its tp*cp*dp pairs (a group of
        two, one send per GPU of the stage at once: each GPU's share of the NICs)."""
        return _send(self, a, b)

    def ring_send(self, axis: str = "cp") -> Group:
        """The slowest send between neighbours of `axis`'s rings (index c to c + 1, the last to
        the first: ring attention's exchange of K and V), every GPU sending at once (each its
        share of the NICs, as `send`); a one-GPU group where the rings have one rank."""
        return _ring_send(self, axis)

    def pipeline_send(self, placement) -> Group:
        """The slowest send between consecutive stages of a schedule (stage s on device
        placement[s]); a one-GPU group where no two consecutive stages are on two devices."""
        sends = [self.send(a, b) for a, b in zip(placement, placement[1:]) if a != b]
        return min(sends, key=_slowness, default=one_node(1))


def _expert_groups(topo: Topology, axis: str) -> list[tuple[int, ...]]:
    """The groups of an expert axis: within each stage's tp cp dp ranks, stage-local index
    i = et + expert_tp (e + ep ed), the index of `axis` varying (a stride of 1, expert_tp or
    expert_tp ep), each group from the rank where it is 0."""
    etp, ep, stage = topo.expert_tp, topo.ep, topo.tp * topo.cp * topo.dp
    stride, size = {"expert_tp": (1, etp), "ep": (etp, ep), "edp": (etp * ep, topo.edp)}[axis]
    starts = [i for i in range(stage) if (i // stride) % size == 0]
    return [tuple(p * stage + i + stride * k for k in range(size)) for p in range(topo.pp) for i in starts]


def _slowness(g: Group) -> tuple:
    return (not g.network, g.per_node, -g.nodes)


def _residues(terms, n: int) -> list[int]:
    """The sums of stride x k (k < size) over `terms` (stride, size), modulo n."""
    out = {0}
    for stride, size in terms:
        out = {(x + stride * k) % n for x in out for k in range(min(size, n))}
    return sorted(out)


def _pattern(topo: Topology, axis: str) -> tuple[list[int], list[tuple[int, int]], bool]:
    """A group of `axis` as its first rank plus offsets, the same for every group: the offsets,
    the (stride, size) terms whose sums are the first ranks within a pipeline device, and whether
    the axis varies the pipeline device itself (else the first ranks repeat on every device)."""
    tp, cp, dp, pp = topo.tp, topo.cp, topo.dp, topo.pp
    axes = {"t": (1, tp), "c": (tp, cp), "d": (tp * cp, dp), "p": (tp * cp * dp, pp)}
    if axis in ("ep", "expert_tp", "edp"):
        stage, etp, ep = tp * cp * dp, topo.expert_tp, topo.ep
        stride, size = {"expert_tp": (1, etp), "ep": (etp, ep), "edp": (etp * ep, topo.edp)}[axis]
        return [stride * k for k in range(size)], [(1, stride), (stride * size, stage // (stride * size))], False
    if axis == "embedding":
        return ([0, (pp - 1) * axes["p"][0]] if pp > 1 else [0]), [axes[a] for a in "tcd"], True
    varying = {"tp": "t", "cp": "c", "dp": "d", "dp_cp": "dc", "pp": "p"}[axis]
    return _residues_exact([axes[a] for a in varying]), [axes[a] for a in "tcd" if a not in varying], "p" in varying


def _representatives(topo: Topology, axis: str) -> list[tuple[int, ...]]:
    """Groups of `axis` that sit on the nodes as all of its groups do: shifting every rank of a
    group by a node's GPUs moves it one node on without changing how it sits, so one group for
    each first rank modulo gpus_per_node (at most gpus_per_node groups, whatever the GPUs)."""
    if axis not in AXES:
        return topo.groups(axis)  # its own error
    offsets, terms, along = _pattern(topo, axis)
    if not along:
        terms = [*terms, (topo.tp * topo.cp * topo.dp, topo.pp)]
    return [tuple(b + o for o in offsets) for b in _residues(terms, topo.gpus_per_node)]


def _residues_exact(terms) -> list[int]:
    """Every sum of stride x k (k < size) over `terms`: a group's offsets."""
    out = [0]
    for stride, size in terms:
        out = [x + stride * k for x in out for k in range(size)]
    return out


@lru_cache(maxsize=4096)
def _slowest(topo: Topology, axis: str) -> Group:
    return min((topo.placed(g) for g in _representatives(topo, axis)), key=_slowness)


@lru_cache(maxsize=4096)
def _mirrored(topo: Topology, axis: str) -> Group:
    stride = topo.gpus // topo.pp  # the ranks of one pipeline device
    offsets, terms, along = _pattern(topo, axis) if axis in AXES else (None, None, True)
    if along:
        groups = [g + tuple(r + (topo.pp - 1 - 2 * (g[0] // stride)) * stride for r in g)
                  for g in topo.groups(axis) if 2 * (g[0] // stride) < topo.pp - 1]
    else:  # on each device p, one group per first rank modulo a node (`_representatives`), and its mirror
        groups = [tuple(p * stride + b + o + m * (topo.pp - 1 - 2 * p) * stride for m in (0, 1) for o in offsets)
                  for p in range(topo.pp) if 2 * p < topo.pp - 1 for b in _residues(terms, topo.gpus_per_node)]
    return topo.slowest(groups) if groups else topo.group(axis)


@lru_cache(maxsize=65536)
def _send(topo: Topology, a: int, b: int) -> Group:
    for p in (a, b):
        if not (isinstance(p, int) and 0 <= p < topo.pp):
            raise ValueError(f"pipeline devices are 0..{topo.pp - 1}; got {p!r}")
    stage = topo.tp * topo.cp * topo.dp  # a stage's ranks, one per first rank modulo a node (`_representatives`)
    firsts = [a * stage + x for x in _residues([(1, topo.tp), (topo.tp, topo.cp), (topo.tp * topo.cp, topo.dp)],
                                               topo.gpus_per_node)]
    crosses = any(topo.node(r) != topo.node(r + (b - a) * stage) for r in firsts)
    return _network_send(topo) if crosses else one_node(2)


@lru_cache(maxsize=4096)
def _ring_send(topo: Topology, axis: str) -> Group:
    groups = _representatives(topo, axis)
    if len(groups[0]) == 1:
        return one_node(1)
    crosses = any(topo.node(a) != topo.node(b) for g in groups for a, b in zip(g, g[1:] + g[:1]))
    return _network_send(topo) if crosses else one_node(2)


def _network_send(topo: Topology) -> Group:
    """One GPU's send to another node while every GPU sends: its share of the node's NICs."""
    return Group(2, 1, 2, min(float(topo.nics_per_node), topo.nics_per_node / topo.gpus_per_node))
