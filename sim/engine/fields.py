"""The fields of `sim.Costs`, each written once: default, unit, meaning, and who reads it.

`sim.engine.costs` builds `Costs` and `StageCosts`, their checks, `for_stages` and the
docstring from `COST_FIELDS`; `python -m sim.plot` makes its flags from it (`flag`,
`chunked`), and a transport may model the call costs (`CALL_FIELDS`, `sim.engine.transports`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence, Union

__all__ = ["CostField", "COST_FIELDS", "PER_STAGE", "CALL_FIELDS", "CHUNKED", "PerStage"]

PerStage = Union[float, Sequence[float]]


@dataclass(frozen=True)
class CostField:
    """One field of `Costs`.

    - unit: "time" (seconds, or any unit used consistently), "bytes", "bandwidth" (bytes per
      time unit) or "name".
    - help: what it is, one line (the docstring's and `python -m sim.plot --help`'s);
      doc: more, for the docstring only.
    - per_stage: one number for every stage, or one per stage (`for_stages` expands it).
    - fallback (field, factor): the field may be None, and then takes factor x that
      field's expanded values.
    - chunked: a device's share of the model, which V chunks per device split 1/V each
      (`python -m sim.plot` compares schedules of different V on one model this way).
    - call: a cost of the transport's calls (`sim.engine.transports`).
    - inf: math.inf allowed; positive: must be > 0 (else >= 0).
    - flag: `python -m sim.plot` has an option for it."""

    name: str
    default: object
    unit: str
    help: str
    doc: str = ""
    per_stage: bool = False
    fallback: tuple[str, float] | None = None
    chunked: bool = False
    call: bool = False
    inf: bool = False
    positive: bool = False
    flag: bool = True

    def default_text(self, name=str) -> str:
        """The default in words: its value, or what the field takes when None (`name`
        spells the other field, e.g. as a command-line flag)."""
        if self.fallback is None:
            return f"{self.default:g}" if isinstance(self.default, float) else str(self.default)
        field, factor = self.fallback
        return f"{'all' if factor == 1 else 'half' if factor == 0.5 else f'{factor:g} x'} of {name(field)}"

    @property
    def annotation(self) -> str:
        kind = "PerStage" if self.per_stage else {"name": "str"}.get(self.unit, "float")
        return f"{kind} | None" if self.fallback else kind


_f = CostField  # short, for the table below


TIME, BYTES = "time", "bytes"
COST_FIELDS: tuple[CostField, ...] = (
    _f("forward", 1.0, TIME, "forward time per micro-batch", per_stage=True, chunked=True),
    _f("backward", 2.0, TIME, "backward time per micro-batch (a full backward B)", per_stage=True, chunked=True),
    _f("latency", 0.0, TIME, "fixed delay of every transfer", doc="It does not occupy the link."),
    _f("bandwidth", math.inf, "bandwidth", "bytes per time unit of each link (inf: transfers are free)",
       doc="One link per direction between two devices.", inf=True, positive=True),
    _f("activation_bytes_sent", 0.0, BYTES, "bytes a stage sends forward per micro-batch",
       doc="Its gradient of the same size goes back.", per_stage=True),
    _f("activation_bytes", 1.0, BYTES, "bytes a stage keeps per micro-batch until its backward",
       doc="From its F until its backward (B, or I where the backward is split).", per_stage=True, chunked=True),
    _f("w_activation_bytes", None, BYTES, "of those, the bytes W still needs from the end of I until W", doc="Per transformer layer, 32sbh of the sb(34h+5as) that F saves: Qi et al., "
       "\"Zero Bubble Pipeline Parallelism\", ICLR 2024, Table 1.", per_stage=True, fallback=("activation_bytes", 1.0),
       chunked=True),
    _f("static_bytes", 0.0, BYTES, "bytes a stage holds for the whole step (weights, gradients, optimizer state "
       "and the rest together)", doc="Where weight_bytes, grad_bytes and optimizer_bytes are given, the rest only "
       "(buffers, workspace): a rank's static memory is the sum of the four over its stages.", per_stage=True,
       chunked=True),
    _f("weight_bytes", 0.0, BYTES, "bytes of a stage's parameters, held for the whole step", per_stage=True,
       chunked=True, flag=False),
    _f("grad_bytes", 0.0, BYTES, "bytes of a stage's gradients, held for the whole step", per_stage=True,
       chunked=True, flag=False),
    _f("optimizer_bytes", 0.0, BYTES, "bytes of a stage's optimizer state, held for the whole step",
       doc="SGD without momentum: none; AdamW: two moments.", per_stage=True, chunked=True, flag=False),
    _f("backward_input", None, TIME, "time of I, the input-gradient half of a split backward", per_stage=True, fallback=("backward", 0.5), chunked=True),
    _f("backward_weight", None, TIME, "time of W, the weight-gradient half of a split backward", per_stage=True, fallback=("backward", 0.5), chunked=True),
    _f("send_overhead", 0.0, TIME, "time issuing a SEND holds its device (the isend call)",
       doc="LogP's overhead o (rule 2 of docs/rules.md).", call=True),
    _f("recv_overhead", 0.0, TIME, "time posting a RECV holds its device (the irecv call)", doc="Rule 3.", call=True),
    _f("arrive_overhead", 0.0, TIME, "time taking in an arrived tensor holds the receiving device",
       doc="Before the compute that needs it: the transport's receive work on the device's own core (reading "
       "the socket, waking the waiting thread; LogP's o at the receiver; rule 3).", call=True),
    _f("io_tick", 0.0, TIME, "longest a late ready notice waits for a computing sender's transport thread "
       "(the scheduler tick; 0: at once; inf: only at the sender's yields)",
       doc="Rule 10: a send issued before the receiver's ready notice came in leaves only when the sender's I/O "
       "thread runs: at the sender's next yield (a SEND call, a wait for data, the end of its program) or at the "
       "scheduler's next tick, uniformly within `io_tick` of the notice (a CPU rank whose I/O thread does not "
       "preempt the compute: about 1/HZ).", call=True, inf=True),
    _f("before_compute", 0.0, TIME, "the runtime's own time before each compute starts, holding its device",
       doc="Rule 11: once its inputs are in (handing them to the stage, setting up the memory count)."),
    _f("after_compute", 0.0, TIME, "the runtime's own time after each compute ends, holding its device",
       doc="Rule 11: keeping its output, recording it."),
    _f("transport", "gloo-cpu", "name", "the model of how transfers move (`sim.engine.transports.TRANSPORTS`)",
       doc="\"gloo-cpu\": the rendezvous of rule 5 with the call costs and the I/O-thread tick of the gloo CPU "
       "runtime (rules 2, 3, 9, 10); \"ideal\": latency + bytes / bandwidth from the moment the tensor is made.",
       flag=False),
    _f("grad_reduce", 0.0, TIME, "time of the data-parallel reduction of a stage's gradients (REDUCE_GRAD)",
       doc="On its rank's collective stream (rule 13; `sim.passes.grad_reduce.add_grad_reduce`); the caller's "
       "cost model (message size, algorithm, the group's links) gives it.", per_stage=True, flag=False),
    _f("offload_bytes", 0.0, BYTES, "bytes of a micro-batch's activations a stage copies to host memory and back",
       doc="OFFLOAD after its F, RELOAD before its backward (rule 14; `sim.passes.offload.add_offload`); at most "
       "its `activation_bytes`.", per_stage=True, flag=False),
    _f("offload", 0.0, TIME, "time of an OFFLOAD on its rank's copy engine", doc="bytes / PCIe bandwidth + "
       "latency: `sim.engine.costs.copy_time`.", per_stage=True, flag=False),
    _f("reload", 0.0, TIME, "time of a RELOAD on its rank's copy engine", per_stage=True, flag=False),
    _f("unshard", 0.0, TIME, "time of an UNSHARD (FSDP's all-gather of a stage's parameters) on its rank's "
       "all-gather stream", doc="Rule 16; `sim.passes.fsdp.add_fsdp`. Under FSDP, `weight_bytes` is the rank's "
       "shard and `grad_reduce` the gradients' reduce-scatter.", per_stage=True, chunked=True, flag=False),
    _f("unshard_bytes", 0.0, BYTES, "bytes of a stage's gathered (unsharded) parameters, held from its UNSHARD's "
       "start to its RESHARD", per_stage=True, chunked=True, flag=False),
    _f("a2a_forward", 0.0, TIME, "time of a forward's expert all-to-all (dispatch and combine) per micro-batch",
       doc="On top of `forward`: an F waits for it, unless it runs in an overlapped pair (OVERLAP_F_B), where it "
       "hides under the backward's compute (rule 18).", per_stage=True, chunked=True, flag=False),
    _f("a2a_backward", 0.0, TIME, "time of a backward's expert all-to-all per micro-batch (B, or I)",
       doc="On top of `backward` (or `backward_input`); in a pair it hides under the forward's compute (rule 18).",
       per_stage=True, chunked=True, flag=False),
    _f("first_compute", 0.0, TIME, "the extra time a rank's first compute of a step holds its device (with "
       "`first_compute_tau`: the most it can take)",
       doc="Rule 19: the compute after the step's boundary (the last step's optimizer, the barrier) meets a "
       "cold core; computes are timed inside a step, each but the first, so this is the first's excess."),
    _f("first_compute_tau", 0.0, TIME, "how fast the core recovers from the step's boundary: a first compute "
       "of duration d then takes first_compute x (1 - exp(-d / tau)) more; 0: `first_compute` whatever d",
       doc="Rule 19: the core starts the step at first_compute / tau below its speed, and the deficit decays "
       "with time constant tau (`sim.engine.costs.first_excess`)."),
)
PER_STAGE = tuple(f.name for f in COST_FIELDS if f.per_stage)
CALL_FIELDS = tuple(f.name for f in COST_FIELDS if f.call)  # the transports' (`sim.engine.transports`)
CHUNKED = tuple(f.name for f in COST_FIELDS if f.chunked)
