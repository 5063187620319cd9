"""A parallel layout of a training run (Megatron-LM's): the sizes, the choices, and the checks that refuse one that cannot run."""
from __future__ import annotations

from dataclasses import dataclass

from sim.cli import machine_memory
from sim.cost.fp8 import check_fp8
from sim.hardware.kernels import precision_bytes
from sim.hardware.profile import DeviceProfile
from sim.hardware.topology import Topology
from sim.model.footprint import state_bytes_per_param
from sim.model.transformer import Transformer, check_recompute
from sim.schedule.registry import lookup


# The share of each GPU's memory a plan keeps free by default for what the estimate does not
# count: the CUDA context (about 0.3-1 GiB a process: pytorch/pytorch#28394, #107667), NCCL's
# communicator buffers, the caching allocator's fragmentation (docs/planner.md, "Memory headroom").
DEFAULT_HEADROOM = 0.10
# What simulating a step takes of this machine's memory, per stage x micro-batch (the engine's
# records; `sim.plot`'s measure, `sim.plot.cli.BYTES_PER_CELL["table"]`), and the share of
# the machine's memory a step may take (other work shares it).
BYTES_PER_CELL = 3_800
MEMORY_SHARE = 0.5
# The most stage x micro-batches a planned step may have, for time: 65,536 take 0.94 s to
# simulate on a 2-core machine (docs/measurements.md, "Simulator speed: large step"), so this
# is about 7 s a configuration, five times the largest published layout's (pp 64 x 1,536).
MAX_CELLS = 500_000


def usable_memory(memory: float, headroom: float = DEFAULT_HEADROOM) -> float:
    """The bytes of a GPU's `memory` a configuration may fill: all but `headroom`, a
    fraction of it (0 <= headroom < 1) or bytes (headroom >= 1). ValueError otherwise."""
    if isinstance(headroom, bool) or not isinstance(headroom, (int, float)) or not 0 <= headroom < memory:
        raise ValueError(f"memory_headroom must be a fraction in [0, 1) or bytes below the GPU's "
                         f"{memory / 2**30:.1f} GiB; got {headroom!r}")
    return memory * (1 - headroom) if headroom < 1 else memory - headroom


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
    memory_headroom: float = DEFAULT_HEADROOM  # kept free of each GPU's memory (`usable_memory`)
    reshard_after_forward: bool = True  # zero=3 with pp > 1: FSDP2's option (`sim.add_fsdp`)
    fsdp_shard: int | None = None       # zero=3 with pp > 1: HSDP's shard group (None: all of dp)

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


def check_layout(model: Transformer, profile: DeviceProfile, lay: Layout) -> list[str]:
    """Raise ValueError (one line, naming the fix) for a layout that cannot run; return the
    warnings for one that runs badly."""
    for name in ("tp", "pp", "dp", "micro_batch", "global_batch", "gpus_per_node", "nics_per_node"):
        value = getattr(lay, name)
        if name == "nics_per_node" and value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    check_recompute(lay.recompute)
    stages = lay.pp * (lay.virtual if isinstance(lay.virtual, int) else lookup(lay.schedule)[1].virtual)
    if stages > model.layers:  # before any work (the schedule refuses a wrong V itself)
        chunks = f" x V {stages // lay.pp}" if stages != lay.pp else ""
        raise ValueError(f"pp={lay.pp}{chunks} = {stages} stages is more than the model's {model.layers} layers; "
                         f"use pp * V <= {model.layers}")
    precision_bytes(lay.precision)
    if lay.precision == "fp8":
        check_fp8(profile)
    state_bytes_per_param(lay.precision, lay.zero, lay.dp)
    for what, n in (("heads", model.heads), ("kv_heads", model.kv_heads), ("ffn", model.ffn), ("vocab", model.vocab)):
        if n % lay.tp:
            ok = [d for d in (1, 2, 4, 8, 16, 32, 64) if n % d == 0 and model.heads % d == 0 and model.kv_heads % d == 0]
            raise ValueError(f"tp={lay.tp} does not divide the model's {n} {what}; use tp in {ok}")
    if lay.global_batch % (lay.dp * lay.micro_batch):
        raise ValueError(f"global batch {lay.global_batch} does not split into dp={lay.dp} replicas of "
                         f"micro-batches of {lay.micro_batch}; make it a multiple of {lay.dp * lay.micro_batch}")
    if lay.zero == 2 and lay.pp > 1:  # docs/planner.md, "ZeRO with pipelining"
        raise ValueError(f"zero={lay.zero} with pp > 1: the micro-batches of a pipeline accumulate every "
                         f"gradient until the step's end (DeepSpeed's pipeline engine refuses ZeRO-2 and -3; "
                         f"Megatron-LM's distributed optimizer shards the optimizer state only); use zero <= 1")
    if lay.fsdp_shard is not None and not (lay.zero == 3 and lay.pp > 1 and isinstance(lay.fsdp_shard, int)
                                           and not isinstance(lay.fsdp_shard, bool) and lay.fsdp_shard >= 1
                                           and lay.dp % lay.fsdp_shard == 0):
        raise ValueError(f"fsdp_shard={lay.fsdp_shard!r}: HSDP shards over fsdp_shard replicas and replicates across "
                         f"them, with zero=3 and pp > 1; give a divisor of dp={lay.dp} (zero={lay.zero}, pp={lay.pp})")
    if lay.sequence_parallel and lay.tp == 1:
        raise ValueError("sequence_parallel needs tp > 1 (it splits what tensor parallelism leaves whole)")
    for name in ("overlap_grad_reduce", "tp_overlap", "offload", "reshard_after_forward"):
        if not isinstance(getattr(lay, name), bool):
            raise ValueError(f"{name} must be True or False, got {getattr(lay, name)!r}")
    if lay.offload and lay.recompute != "full":
        raise ValueError(f"offload=True offloads the layer inputs that full recompute keeps (SageMaker's "
                         f"offload_activations needs activation checkpointing); set recompute='full', "
                         f"not {lay.recompute!r}")
    usable_memory(profile.memory, lay.memory_headroom)
    warnings = []
    if lay.topology().group("tp").network:
        warnings.append(f"tp={lay.tp} spans nodes of {lay.gpus_per_node} GPUs: its all-reduces go over the network")
    return warnings


def size_problem(lay: Layout) -> str | None:
    """One line saying why the layout's step is too large to simulate here (more stages x
    micro-batches than `MAX_CELLS`, or than `MEMORY_SHARE` of this machine's memory holds),
    else None."""
    virtual = lay.virtual if isinstance(lay.virtual, int) else lookup(lay.schedule)[1].virtual
    cells = lay.pp * virtual * lay.micro_batches
    limit = min(MAX_CELLS, int(MEMORY_SHARE * machine_memory() // BYTES_PER_CELL))
    if cells <= limit:
        return None
    return (f"step too large to simulate here: pp={lay.pp} x V {virtual} x {lay.micro_batches:,} micro-batches = "
            f"{cells:,} stage-micro-batches, more than the {limit:,} simulated in seconds within "
            f"{MEMORY_SHARE:.0%} of this machine's memory; give a smaller global batch, a larger micro-batch or more dp")


def check_size(lay: Layout) -> None:
    """Raise ValueError (`size_problem`'s line) for a step too large to simulate here."""
    problem = size_problem(lay)
    if problem:
        raise ValueError(problem)
