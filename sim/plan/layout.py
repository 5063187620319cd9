"""A parallel layout of a training run (Megatron-LM's): the sizes, the choices, and the checks that refuse one that cannot run."""
from __future__ import annotations

from dataclasses import dataclass

from sim.hardware.kernels import precision_bytes
from sim.hardware.profile import DeviceProfile
from sim.hardware.topology import Topology
from sim.model.footprint import DEFAULT_OPTIMIZER, state_bytes_per_param
from sim.model.transformer import Transformer, check_recompute
from sim.schedule.registry import lookup


@dataclass(frozen=True)
class Layout:
    """How a run is split: sizes of the three parallelisms and of a micro-batch, and the choices."""
    tp: int = 1
    pp: int = 1
    dp: int = 1
    micro_batch: int = 1
    global_batch: int = 1
    schedule: str = "1f1b"
    virtual: int | None = None
    recompute: str = "none"
    sequence_parallel: bool = False
    zero: int = 0
    precision: str = "bf16"
    gpus_per_node: int = 8
    overlap_grad_reduce: bool = False
    partition: str | tuple = "even"
    tp_overlap: bool = True
    offload: bool = False
    nics_per_node: int | None = None  # None: one a GPU
    optimizer: str = DEFAULT_OPTIMIZER  # a name of sim.model.footprint.OPTIMIZERS (exec.run --optimizer)

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp

    def topology(self) -> Topology:
        """Where the layout's GPUs sit and which links its groups use (`sim.hardware.topology`)."""
        return Topology(self.tp, self.pp, self.dp, self.gpus_per_node, self.nics_per_node)

    @property
    def micro_batches(self) -> int:
        """Micro-batches per pipeline per step: global batch / (dp * micro-batch)."""
        return self.global_batch // (self.dp * self.micro_batch)


def check_layout(m: Transformer, g: DeviceProfile, lay: Layout) -> list[str]:
    """Raise ValueError (one line, naming the fix) for a layout that cannot run; return the
    warnings for one that runs badly."""
    for name in ("tp", "pp", "dp", "micro_batch", "global_batch", "gpus_per_node", "nics_per_node"):
        v = getattr(lay, name)
        if name == "nics_per_node" and v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    check_recompute(lay.recompute)
    stages = lay.pp * (lay.virtual if isinstance(lay.virtual, int) else lookup(lay.schedule)[1].virtual)
    if stages > m.layers:  # before any work (the schedule refuses a wrong V itself)
        chunks = f" x V {stages // lay.pp}" if stages != lay.pp else ""
        raise ValueError(f"pp={lay.pp}{chunks} = {stages} stages is more than the model's {m.layers} layers; "
                         f"use pp * V <= {m.layers}")
    precision_bytes(lay.precision)
    state_bytes_per_param(lay.precision, lay.zero, lay.dp, lay.optimizer)
    for what, n in (("heads", m.heads), ("kv_heads", m.kv_heads), ("ffn", m.ffn), ("vocab", m.vocab)):
        if n % lay.tp:
            ok = [d for d in (1, 2, 4, 8, 16, 32, 64) if n % d == 0 and m.heads % d == 0 and m.kv_heads % d == 0]
            raise ValueError(f"tp={lay.tp} does not divide the model's {n} {what}; use tp in {ok}")
    if lay.global_batch % (lay.dp * lay.micro_batch):
        raise ValueError(f"global batch {lay.global_batch} does not split into dp={lay.dp} replicas of "
                         f"micro-batches of {lay.micro_batch}; make it a multiple of {lay.dp * lay.micro_batch}")
    if lay.zero == 3 and lay.pp > 1:
        raise ValueError("zero=3 with pp > 1: ZeRO-3 gathers every weight for every micro-batch; "
                         "DeepSpeed and Megatron-LM do not combine it with pipelining; use zero <= 2")
    if lay.sequence_parallel and lay.tp == 1:
        raise ValueError("sequence_parallel needs tp > 1 (it splits what tensor parallelism leaves whole)")
    for name in ("overlap_grad_reduce", "tp_overlap", "offload"):
        if not isinstance(getattr(lay, name), bool):
            raise ValueError(f"{name} must be True or False, got {getattr(lay, name)!r}")
    if lay.offload and lay.recompute != "full":
        raise ValueError(f"offload=True offloads the layer inputs that full recompute keeps (SageMaker's "
                         f"offload_activations needs activation checkpointing); set recompute='full', "
                         f"not {lay.recompute!r}")
    warnings = []
    if lay.topology().group("tp").network:
        warnings.append(f"tp={lay.tp} spans nodes of {lay.gpus_per_node} GPUs: its all-reduces go over the network")
    return warnings
