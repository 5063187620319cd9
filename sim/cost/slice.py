"""How one GPU holds a transformer layer (`Slice`): its micro-batch, splits, precision and links."""
from __future__ import annotations

from dataclasses import dataclass, replace

from sim.hardware.topology import Group, one_node
from sim.model.transformer import Transformer


@dataclass(frozen=True)
class Slice:
    """How one GPU holds a layer: its micro-batch, tensor-parallel size, sequence parallelism
    and precision, and how its tensor-parallel group sits on the nodes (`sim.hardware.topology`;
    None: inside one node); its context-parallel size, how that group exchanges ("p2p": ring
    attention, "a2a": Ulysses) and over which link (`cp_group`: the ring's slowest send,
    `Topology.ring_send`, for "p2p"; the group, `Topology.group("cp")`, for "a2a"; None: one node);
    for a MoE layer (`sim.cost.moe`), its expert-parallel size `ep`, expert tensor parallelism
    `expert_tp` (Megatron-Core's ETP) and the group the expert all-to-alls run over (`ep_group`;
    None: inside one node)."""
    micro_batch: int
    tp: int = 1
    sequence_parallel: bool = False
    precision: str = "bf16"
    tp_group: Group | None = None
    cp: int = 1
    cp_comm: str = "p2p"
    cp_group: Group | None = None
    ep: int = 1
    expert_tp: int = 1
    ep_group: Group | None = None

    def __post_init__(self):
        if self.tp_group is not None and self.tp_group.size != self.tp:
            raise ValueError(f"tp_group has {self.tp_group.size} GPUs, tp is {self.tp}; give the group of tp={self.tp}")
        for name in ("ep", "expert_tp"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"Slice: {name} must be a positive int, got {v!r}")
        if self.ep_group is not None and self.ep_group.size != self.ep:
            raise ValueError(f"ep_group has {self.ep_group.size} GPUs, ep is {self.ep}; give the group of ep={self.ep}")

    def tokens(self, m: Transformer) -> int:
        """Tokens of a micro-batch this GPU holds: b s/cp."""
        return self.micro_batch * m.seq // self.cp

    @property
    def context_group(self) -> Group:
        """The link context parallelism's exchanges use (`cp_group`; one node if None)."""
        if self.cp_group is not None:
            return self.cp_group
        return one_node(min(self.cp, 2) if self.cp_comm == "p2p" else self.cp)

    @property
    def activation_precision(self) -> str:
        """The precision of all but FP8's Linear GEMMs: BF16 under "fp8" (`sim.cost.fp8`)."""
        return "bf16" if self.precision == "fp8" else self.precision

    @property
    def tensor_group(self) -> Group:
        """The tensor-parallel group its collectives run over."""
        return one_node(self.tp) if self.tp_group is None else self.tp_group

    @property
    def expert_group(self) -> Group:
        """The expert-parallel group the dispatch and combine all-to-alls run over."""
        return one_node(self.ep) if self.ep_group is None else self.ep_group


def per_rank(m: Transformer, x: Slice) -> Transformer:
    """The model as one GPU of a context-parallel group holds it, for what scales with the
    tokens alone (activations): the sequence s/cp."""
    return m if x.cp == 1 else replace(m, seq=m.seq // x.cp)
