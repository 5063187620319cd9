"""A parallel layout of a training run (Megatron-LM's): one record of its sizes and choices, and the checks that refuse one that cannot run.

`Layout` is the one declaration of what a run is: every keyword of `sim.estimate` is one of its
fields, with its default here, and the planner's search enumerates it (`sim.plan.space`):

    >>> lay = Layout(tp=8, pp=4, dp=2, cp=2, global_batch=64)
    >>> lay.gpus, lay.replicas, lay.micro_batches, lay.nics_per_node, Layout(dp=4, micro_batch=2).global_batch
    (128, 4, 32, 8, 8)

Its fields come in three groups: the nodes (GPUs a node, NICs a node; the device profile is
`estimate`'s `gpu`); how the model and the batch are split (tp, pp, dp, cp and how cp
communicates, the experts' ep and expert_tp (`sim.plan.experts`), sequence parallelism, the
ZeRO stage and FSDP's options, the layers' partition, the overlaps); and what one step
computes and keeps (micro-batch, global batch, schedule, chunks, the schedule's overlapped
pairs, recompute, precision, attention, offloading, the memory headroom, the optimizer).
Checking a layout asks only the model and the device profile, never the machine that plans it
(`sim.limits` guards this machine's memory at the entry points).
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

from sim.cost.data_parallel import FSDP_UNITS
from sim.cost.fp8 import check_fp8
from sim.cost.layer import Slice
from sim.hardware.kernels import precision_bytes
from sim.hardware.profile import DeviceProfile
from sim.hardware.topology import Topology
from sim.model.footprint import DEFAULT_OPTIMIZER, state_bytes_per_param
from sim.model.transformer import ATTENTION, Transformer, check_recompute
from .experts import check_experts
from sim.schedule.registry import SCHEDULES, lookup


# The share of each GPU's memory a plan keeps free by default for what the estimate does not
# count: the CUDA context (about 0.3-1 GiB a process: pytorch/pytorch#28394, #107667), NCCL's
# communicator buffers, the caching allocator's fragmentation (docs/planner.md, "Memory headroom").
DEFAULT_HEADROOM = 0.10
# The most stage x micro-batches a planned step may have, for time: 65,536 take 0.94 s to
# simulate on a 2-core machine (docs/validation.md, "Simulator speed"), so this
# is about 7 s a configuration, five times the largest published layout's (pp 64 x 1,536).
MAX_CELLS = 500_000


def usable_memory(memory: float, headroom: float = DEFAULT_HEADROOM) -> float:
    """The bytes of a GPU's `memory` a configuration may fill: all but `headroom`, a
    fraction of it (0 <= headroom < 1) or bytes (headroom >= 1). ValueError otherwise."""
    if isinstance(headroom, bool) or not isinstance(headroom, (int, float)) or not 0 <= headroom < memory:
        raise ValueError(f"memory_headroom must be a fraction in [0, 1) or bytes below the GPU's "
                         f"{memory / 2**30:.1f} GiB; got {headroom!r}")
    return memory * (1 - headroom) if headroom < 1 else memory - headroom


CP_COMMS = ("p2p", "a2a")  # ring attention's K/V exchange, or Ulysses' all-to-alls (sim.cost.layer)


@dataclass(frozen=True)
class Layout:
    """How a run is split over its GPUs and what its step computes: the arguments of
    `sim.estimate`, each declared once here with its default. `nics_per_node` None is one a
    GPU (kept as gpus_per_node), `global_batch` None one micro-batch per replica, `schedule` any spelling
    `sim.make_schedule` takes (kept canonical), `partition` counts as a tuple."""
    # the nodes the GPUs sit in (`sim.hardware.topology`)
    gpus_per_node: int = 8
    nics_per_node: int | None = None    # the network cards a node's collectives and sends share (None: one a GPU)
    # how the model and the batch are split: tp x cp x pp x dp GPUs, Megatron-LM's order
    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1                         # context parallelism: the sequence split over cp ranks
    cp_comm: str = "p2p"                # "p2p" (ring attention) or "a2a" (Ulysses): CP_COMMS
    ep: int = 1                         # expert parallelism: the experts over ep of a stage's ranks
    expert_tp: int = 1                  # expert tensor parallelism (ETP): each expert over expert_tp ranks
    sequence_parallel: bool = False
    zero: int = 0                       # ZeRO stage over the dp x cp replicas
    reshard_after_forward: bool = True  # zero=3: FSDP2's option (`sim.add_fsdp`)
    fsdp_shard: int | None = None       # zero=3: HSDP's shard group (None: all dp x cp)
    fsdp_unit: str = "layer"            # zero=3: what FSDP gathers at once, "layer" or "stage" (FSDP_UNITS)
    partition: str | tuple = "even"     # the layers over the stages (`stage_costs.partition_layers`)
    overlap_grad_reduce: bool = False
    tp_overlap: bool = True
    # what one step computes and keeps
    micro_batch: int = 1
    global_batch: int | None = None
    schedule: str = "1f1b"
    virtual: int | None = None
    overlap: bool = False               # the schedule's overlapped forward-backward pairs (rule 18)
    recompute: str = "none"
    precision: str = "bf16"
    attention: str | None = None        # "flash" or "unfused" over the model's own; None: the model's
    offload: bool = False
    memory_headroom: float = DEFAULT_HEADROOM  # kept free of each GPU's memory (`usable_memory`)
    optimizer: str = DEFAULT_OPTIMIZER  # a name of sim.model.footprint.OPTIMIZERS (exec.run --optimizer)

    def __post_init__(self):
        set_ = object.__setattr__
        if self.nics_per_node is None:
            set_(self, "nics_per_node", self.gpus_per_node)
        if self.global_batch is None and all(_whole(n) for n in (self.dp, self.micro_batch)):
            set_(self, "global_batch", self.dp * self.micro_batch)
        if not (isinstance(self.schedule, str) and self.schedule in SCHEDULES):
            set_(self, "schedule", lookup(self.schedule)[0])
        if not isinstance(self.partition, (str, tuple)):
            set_(self, "partition", tuple(self.partition))

    def changed(self, **fields_) -> Layout:
        """This layout with these fields changed (`dataclasses.replace`)."""
        return replace(self, **fields_)

    def keywords(self) -> dict:
        """The layout as `sim.estimate`'s keywords: `sim.estimate(model, gpu, **lay.keywords())` estimates it."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @property
    def gpus(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def replicas(self) -> int:
        """The ranks each gradient is reduced over and ZeRO shards over: dp x cp (Megatron's
        data-parallel group with context parallel)."""
        return self.dp * self.cp

    @property
    def pipelines(self) -> int:
        """The copies of the model the schedule holds (`sim.Schedule.pipelines`; DualPipe: 2, its
        stages twice: each copy's P stages hold the whole model, each device one stage of each)."""
        generator = SCHEDULES.get(self.schedule) or lookup(self.schedule)[1]  # a canonical name: no lookup
        return generator.pipelines

    @property
    def edp(self) -> int:
        """The expert data-parallel size, tp x cp x dp / (expert_tp x ep): the replicas of each
        expert, which reduce its gradients and shard its optimizer state (`sim.plan.experts`)."""
        return self.tp * self.cp * self.dp // (self.expert_tp * self.ep)

    def topology(self) -> Topology:
        """Where the layout's GPUs sit and which links its groups use (`sim.hardware.topology`)."""
        return Topology(self.tp, self.pp, self.dp, self.gpus_per_node, self.nics_per_node, self.cp, self.ep,
                        self.expert_tp)

    @property
    def micro_batches(self) -> int:
        """Micro-batches per pipeline per step: global batch / (dp * micro-batch)."""
        return self.global_batch // (self.dp * self.micro_batch)


def layout_slice(lay: Layout) -> Slice:
    """How one GPU of the layout holds a layer (`sim.cost.slice.Slice`), its groups placed by
    the layout's topology."""
    topo = lay.topology()
    cp_group = topo.ring_send("cp") if lay.cp_comm == "p2p" else topo.group("cp")
    return Slice(lay.micro_batch, lay.tp, lay.sequence_parallel, lay.precision, tp_group=topo.group("tp"),
                 cp=lay.cp, cp_comm=lay.cp_comm, cp_group=cp_group, ep=lay.ep, expert_tp=lay.expert_tp,
                 ep_group=topo.group("ep"))


def check_layout(model: Transformer, profile: DeviceProfile, lay: Layout) -> list[str]:
    """Raise ValueError (one line, naming the fix) for a layout that cannot run; return the
    warnings for one that runs badly."""
    for name in ("tp", "pp", "dp", "cp", "micro_batch", "global_batch", "gpus_per_node", "nics_per_node"):
        if not _whole(getattr(lay, name)):
            raise ValueError(f"{name} must be a positive int, got {getattr(lay, name)!r}")
    check_recompute(lay.recompute)
    stages = lay.pp * (lay.virtual if isinstance(lay.virtual, int) else lookup(lay.schedule)[1].virtual)
    stages //= lay.pipelines  # the stages of one copy of the model, which hold its layers
    # before any work (the schedule refuses a wrong V itself); a partition that names each stage's
    # layers (counts, or a layout string whose E and L may be stages of their own) counts its own
    if stages > model.layers and lay.partition in ("even", "balanced"):
        chunks = f" x V {stages // lay.pp}" if stages != lay.pp else ""
        raise ValueError(f"pp={lay.pp}{chunks} = {stages} stages is more than the model's {model.layers} layers; "
                         f"use pp * V <= {model.layers}")
    precision_bytes(lay.precision)
    if lay.precision == "fp8":
        check_fp8(profile)
    state_bytes_per_param(lay.precision, lay.zero, lay.replicas, lay.optimizer)
    check_tp(model, lay.tp)
    check_context(model, lay)
    check_experts(model, lay)
    if lay.global_batch % (lay.dp * lay.micro_batch):
        raise ValueError(f"global batch {lay.global_batch} does not split into dp={lay.dp} replicas of "
                         f"micro-batches of {lay.micro_batch}; make it a multiple of {lay.dp * lay.micro_batch}")
    if lay.zero == 2 and lay.pp > 1:  # docs/planner.md, "ZeRO with pipelining"
        raise ValueError(f"zero={lay.zero} with pp > 1: the micro-batches of a pipeline accumulate every "
                         f"gradient until the step's end (DeepSpeed's pipeline engine refuses ZeRO-2 and -3; "
                         f"Megatron-LM's distributed optimizer shards the optimizer state only); use zero <= 1")
    if lay.zero >= 2 and lay.pipelines > 1:
        raise ValueError(f"zero={lay.zero} with schedule {lay.schedule!r} ({lay.pipelines} copies of the model) is "
                         f"not modelled: its copies' gradients are summed by one data-parallel reduction (zero <= 1)")
    if lay.fsdp_unit not in FSDP_UNITS:
        raise ValueError(f"fsdp_unit must be one of {', '.join(map(repr, FSDP_UNITS))} (what FSDP gathers at "
                         f"once: each layer, FSDP2's fully_shard per block, or the whole stage); got {lay.fsdp_unit!r}")
    if lay.fsdp_shard is not None and not (lay.zero == 3 and isinstance(lay.fsdp_shard, int)
                                           and not isinstance(lay.fsdp_shard, bool) and lay.fsdp_shard >= 1
                                           and lay.replicas % lay.fsdp_shard == 0):
        raise ValueError(f"fsdp_shard={lay.fsdp_shard!r}: HSDP shards over fsdp_shard replicas and replicates across "
                         f"them, with zero=3; give a divisor of dp x cp = {lay.replicas} (zero={lay.zero})")
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
    problem = size_problem(lay)
    if problem:
        raise ValueError(problem)
    warnings = []
    if lay.topology().group("tp").network:
        warnings.append(f"tp={lay.tp} spans nodes of {lay.gpus_per_node} GPUs: its all-reduces go over the network")
    return warnings


def check_context(model: Transformer, lay: Layout) -> None:
    """ValueError, one line, for context parallelism that cannot run (docs/planner.md, "Context
    parallelism"): cp_comm not in CP_COMMS; cp > 1 with an attention other than a fused kernel
    (Megatron-Core's own DotProductAttention refuses cp; Transformer Engine's runs it) or with
    torch's kernels; a sequence that does not split into 2 cp chunks (ring attention's causal
    balance), or, all-to-all, heads or kv heads of a tensor-parallel rank that cp does not divide."""
    if lay.cp_comm not in CP_COMMS:
        raise ValueError(f"cp_comm must be one of {', '.join(CP_COMMS)}; got {lay.cp_comm!r}")
    if lay.attention not in (None, *ATTENTION):
        raise ValueError(f"attention must be one of {', '.join(ATTENTION)} (or None: the model's); got {lay.attention!r}")
    if lay.cp == 1:
        return
    if (lay.attention or model.attention) != "flash" or model.kernels != "megatron":
        raise ValueError(f"cp={lay.cp} needs a fused attention kernel (Transformer Engine's, as Megatron-Core "
                         f"runs context parallelism); set attention='flash'")
    if lay.cp_comm == "p2p" and model.seq % (2 * lay.cp):
        raise ValueError(f"cp={lay.cp} splits the sequence into 2 x cp = {2 * lay.cp} chunks (causal load "
                         f"balance); the model's {model.seq} tokens do not divide; use seq a multiple of {2 * lay.cp}")
    heads = {"heads": model.heads // lay.tp, "kv_heads": model.kv_heads // lay.tp}
    for what, n in heads.items():
        if lay.cp_comm == "a2a" and (n % lay.cp or model.seq % lay.cp):
            raise ValueError(f"cp_comm='a2a' splits each tensor-parallel rank's {n} {what} and the {model.seq} "
                             f"tokens over cp={lay.cp}; use cp dividing both, or cp_comm='p2p'")


def _whole(n) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and n >= 1


def divides_model(model: Transformer, tp: int) -> bool:
    """Whether tensor parallelism of `tp` splits the model's heads, KV heads, MLP width and vocabulary."""
    return all(n % tp == 0 for n in (model.heads, model.kv_heads, model.ffn, model.vocab))


def check_tp(model: Transformer, tp: int) -> None:
    """ValueError, one line naming the sizes that do, where `tp` does not divide the model (`divides_model`)."""
    for what, n in (("heads", model.heads), ("kv_heads", model.kv_heads), ("ffn", model.ffn), ("vocab", model.vocab)):
        if n % tp:
            ok = [d for d in (1, 2, 4, 8, 16, 32, 64) if n % d == 0 and model.heads % d == 0 and model.kv_heads % d == 0]
            raise ValueError(f"tp={tp} does not divide the model's {n} {what}; use tp in {ok}")


def cells(lay: Layout) -> int:
    """The layout's stage x micro-batches: what simulating its step keeps a record of, each."""
    virtual = lay.virtual if isinstance(lay.virtual, int) else lookup(lay.schedule)[1].virtual
    return lay.pp * virtual * lay.micro_batches


def size_problem(lay: Layout, limit: int = MAX_CELLS) -> str | None:
    """One line saying why the layout's step is too large to simulate in seconds (more stages x
    micro-batches than `limit`, `MAX_CELLS` unless told), else None."""
    if cells(lay) <= limit:
        return None
    virtual = cells(lay) // (lay.pp * lay.micro_batches)
    return (f"step too large to simulate in seconds: pp={lay.pp} x V {virtual} x {lay.micro_batches:,} micro-batches = "
            f"{cells(lay):,} stage-micro-batches, more than {limit:,}; give a smaller global batch, a larger "
            f"micro-batch or more dp")
