"""The cost model: how long each action takes and how many bytes it moves and keeps."""
from __future__ import annotations

import dataclasses
import json
import math
import numbers
import os
from dataclasses import dataclass
from typing import Sequence, Union

from sim.files import atomic_write

PerStage = Union[float, Sequence[float]]
PER_STAGE = ("forward", "backward", "backward_input", "backward_weight", "activation_bytes_sent", "activation_bytes",
             "w_activation_bytes", "static_bytes", "weight_bytes", "grad_bytes", "optimizer_bytes", "grad_reduce",
             "offload_bytes", "offload", "reload")


def _per_stage(name: str, value: PerStage, stages: int) -> tuple[float, ...]:
    if isinstance(value, bool):
        raise ValueError(f"Costs.{name} must be a number or one number per stage, got {value!r}")
    if isinstance(value, (int, float)):
        values = (float(value),) * stages
    else:
        values = tuple(float(v) for v in value)
        if len(values) != stages:
            raise ValueError(f"Costs.{name} has {len(values)} values but the schedule has {stages} stages")
    for v in values:
        if not math.isfinite(v) or v < 0:
            raise ValueError(f"Costs.{name} must be finite and >= 0, got {v}")
    return values


def _check_per_stage(name: str, value, optional: bool = False) -> None:
    """A per-stage field is a number or a non-empty sequence of numbers, each finite and
    >= 0 (`None` where `optional`); how many, `for_stages` checks against the stage count."""
    if value is None and optional:
        return
    if _is_number(value):
        values = [value]
    elif isinstance(value, (str, bytes, dict)) or not hasattr(value, "__iter__"):
        values = None
    else:
        values = list(value)
    if not values or not all(map(_is_number, values)):
        what = "a number, None" if optional else "a number"
        raise ValueError(f"Costs.{name} must be {what} or a sequence of numbers (one per stage), got {value!r}")
    for i, v in enumerate(values):
        if not (math.isfinite(v) and v >= 0):
            at = "" if _is_number(value) else f"[{i}]"
            raise ValueError(f"Costs.{name}{at} must be finite and >= 0, got {v!r}")


def _is_number(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


@dataclass(frozen=True)
class Costs:
    """What the simulator needs to know about the model and the machine.

    Times in seconds (or any unit, used consistently), sizes in bytes. Per-stage fields
    take one number for every stage or one value per stage.

    - forward, backward: compute time of F and of a full backward B per micro-batch.
      `backward_input` / `backward_weight` time the split I and W (default: half of B each).
    - latency: fixed delay of every transfer between devices; it does not occupy the link.
    - send_overhead, recv_overhead: how long issuing a SEND / posting a RECV holds its
      device (the CPU time of the isend / irecv call: LogP's overhead o). Default 0.
    - arrive_overhead: how long taking in an arrived tensor holds the receiving device
      before the compute that needs it (the transport's receive work on the device's own
      core: reading the socket, waking the waiting thread; LogP's o at the receiver). Default 0.
    - before_compute, after_compute: the runtime's own time around each compute action,
      holding its device (rule 11): before the compute starts, once its inputs are in
      (handing them to the stage, setting up the memory count), and after it ends (keeping
      its output, recording it). Default 0.
    - io_tick: how long a message may wait for the transport's I/O thread of a rank that
      is computing (rule 10 of docs/rules.md). A send issued before the receiver's ready
      notice came in leaves only when the sender's I/O thread runs: at the sender's next
      yield (a SEND call, a wait for data, the end of its program) or, at the latest, at
      the scheduler's next tick, uniformly within `io_tick` of the notice (a CPU rank whose
      I/O thread does not preempt the compute: about 1/HZ). 0 (default): the thread runs at
      once (a spare core, a GPU's transport); math.inf: only at the rank's yields.
    - bandwidth: bytes/s of each link (one per direction between two devices); math.inf = free.
    - activation_bytes_sent: bytes of the activation a stage sends forward per micro-batch
      (its gradient of the same size goes back).
    - activation_bytes: bytes a stage keeps per micro-batch from its F until its backward
      (B, or I where the backward is split).
    - w_activation_bytes: where the backward is split, the part of them that W still needs
      from the end of I until the end of W (per transformer layer, 32sbh of the sb(34h+5as)
      that F saves: Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, Table 1).
      Default: all of `activation_bytes` (I frees nothing).
    - weight_bytes, grad_bytes, optimizer_bytes: a stage's parameters, their gradients and
      its optimizer's state (SGD without momentum: none; AdamW: two moments), held for the
      whole step; static_bytes: any other memory held for the whole step (buffers,
      workspace). A rank's static memory is the sum of the four over its stages.
    - transport: the model of how transfers move, by name (`sim.engine.transports.TRANSPORTS`):
      "gloo-cpu" (default: the rendezvous of rule 5, with the call and arrival overheads
      and the I/O-thread tick of the gloo CPU runtime, rules 2, 3, 9 and 10) or "ideal"
      (latency + bytes / bandwidth from the moment the tensor is made; no overheads).
    - grad_reduce: how long the data-parallel reduction of a stage's gradients (a
      REDUCE_GRAD action: all-reduce, or reduce-scatter under ZeRO) takes on its rank's
      collective stream, per stage; the caller's cost model (message size, algorithm,
      the data-parallel group's links) gives it. Default 0. Only a schedule with
      REDUCE_GRAD actions (`sim.passes.grad_reduce.add_grad_reduce`) uses it.
    - offload_bytes: bytes of a micro-batch's activations that a stage copies to host
      memory after its F and back before its backward (OFFLOAD, RELOAD: `sim.add_offload`,
      rule 14); at most its `activation_bytes`. offload, reload: how long each copy takes
      on its rank's copy engine, per stage (bytes / PCIe bandwidth + latency:
      `sim.passes.offload.copy_time`). Default 0; only a schedule with OFFLOAD/RELOAD uses them.
    """

    forward: PerStage = 1.0
    backward: PerStage = 2.0
    latency: float = 0.0
    bandwidth: float = math.inf
    activation_bytes_sent: PerStage = 0.0
    activation_bytes: PerStage = 1.0
    w_activation_bytes: PerStage | None = None
    static_bytes: PerStage = 0.0
    weight_bytes: PerStage = 0.0
    grad_bytes: PerStage = 0.0
    optimizer_bytes: PerStage = 0.0
    backward_input: PerStage | None = None
    backward_weight: PerStage | None = None
    send_overhead: float = 0.0
    recv_overhead: float = 0.0
    arrive_overhead: float = 0.0
    io_tick: float = 0.0
    before_compute: float = 0.0
    after_compute: float = 0.0
    transport: str = "gloo-cpu"
    grad_reduce: PerStage = 0.0
    offload_bytes: PerStage = 0.0
    offload: PerStage = 0.0
    reload: PerStage = 0.0

    def __post_init__(self):
        for name in PER_STAGE:
            _check_per_stage(name, getattr(self, name), optional=name in ("backward_input", "backward_weight",
                                                                              "w_activation_bytes"))
        for name in ("latency", "send_overhead", "recv_overhead", "arrive_overhead", "before_compute",
                     "after_compute"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v >= 0):
                raise ValueError(f"Costs.{name} must be a finite number >= 0, got {v!r}")
        if isinstance(self.io_tick, bool) or not isinstance(self.io_tick, (int, float)) or not self.io_tick >= 0:
            raise ValueError(f"Costs.io_tick must be a number >= 0 (math.inf allowed), got {self.io_tick!r}")
        if not self.bandwidth > 0:
            raise ValueError(f"Costs.bandwidth must be > 0 bytes/s, got {self.bandwidth}")
        from .transports import transport_class
        transport_class(self.transport).check(self)

    def for_stages(self, stages: int) -> "StageCosts":
        """Expand every per-stage field to one value per stage, checking the lengths."""
        bwd = _per_stage("backward", self.backward, stages)
        half = tuple(b / 2 for b in bwd)
        act = _per_stage("activation_bytes", self.activation_bytes, stages)
        off = _per_stage("offload_bytes", self.offload_bytes, stages)
        if any(o > a for o, a in zip(off, act)):
            s = next(s for s, (o, a) in enumerate(zip(off, act)) if o > a)
            raise ValueError(f"Costs.offload_bytes of stage {s} ({off[s]:g}) exceeds its activation_bytes "
                             f"({act[s]:g}); a stage offloads at most the activations it keeps")
        return StageCosts(
            forward=_per_stage("forward", self.forward, stages),
            backward=bwd,
            backward_input=half if self.backward_input is None else _per_stage("backward_input", self.backward_input, stages),
            backward_weight=half if self.backward_weight is None else _per_stage("backward_weight", self.backward_weight, stages),
            activation_bytes_sent=_per_stage("activation_bytes_sent", self.activation_bytes_sent, stages),
            activation_bytes=act,
            w_activation_bytes=act if self.w_activation_bytes is None else
            _per_stage("w_activation_bytes", self.w_activation_bytes, stages),
            static_bytes=_per_stage("static_bytes", self.static_bytes, stages),
            weight_bytes=_per_stage("weight_bytes", self.weight_bytes, stages),
            grad_bytes=_per_stage("grad_bytes", self.grad_bytes, stages),
            optimizer_bytes=_per_stage("optimizer_bytes", self.optimizer_bytes, stages),
            latency=float(self.latency),
            bandwidth=float(self.bandwidth),
            send_overhead=float(self.send_overhead),
            recv_overhead=float(self.recv_overhead),
            arrive_overhead=float(self.arrive_overhead),
            io_tick=float(self.io_tick),
            before_compute=float(self.before_compute),
            after_compute=float(self.after_compute),
            transport=self.transport,
            grad_reduce=_per_stage("grad_reduce", self.grad_reduce, stages),
            offload_bytes=off,
            offload=_per_stage("offload", self.offload, stages),
            reload=_per_stage("reload", self.reload, stages),
        )

    def to_dict(self) -> dict:
        """The costs as plain JSON data (an infinity as the string "inf")."""
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, (list, tuple)):
                v = [float(x) for x in v]
            elif isinstance(v, float) and math.isinf(v):
                v = "inf"
            out[f.name] = v
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "Costs":
        """Inverse of `to_dict`; fields left out take their defaults."""
        if not isinstance(data, dict):
            raise ValueError(f"costs must be a JSON object of Costs fields, got {type(data).__name__}")
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = set(data) - set(known)
        if unknown:
            raise ValueError(f"unknown Costs fields {sorted(unknown)}; expected some of {known}")
        kwargs = {}
        for name, v in data.items():
            if v == "inf":
                v = math.inf
            elif isinstance(v, list):
                v = tuple(float(x) for x in v)
            kwargs[name] = v
        return cls(**kwargs)


@dataclass(frozen=True)
class StageCosts:
    """`Costs` with every per-stage field expanded to a tuple of length `stages`."""

    forward: tuple[float, ...]
    backward: tuple[float, ...]
    backward_input: tuple[float, ...]
    backward_weight: tuple[float, ...]
    activation_bytes_sent: tuple[float, ...]
    activation_bytes: tuple[float, ...]
    w_activation_bytes: tuple[float, ...]
    static_bytes: tuple[float, ...]
    weight_bytes: tuple[float, ...]
    grad_bytes: tuple[float, ...]
    optimizer_bytes: tuple[float, ...]
    latency: float
    bandwidth: float
    send_overhead: float = 0.0
    recv_overhead: float = 0.0
    arrive_overhead: float = 0.0
    io_tick: float = 0.0
    before_compute: float = 0.0
    after_compute: float = 0.0
    transport: str = "gloo-cpu"
    grad_reduce: tuple[float, ...] = ()
    offload_bytes: tuple[float, ...] = ()
    offload: tuple[float, ...] = ()
    reload: tuple[float, ...] = ()

    def static_total(self, stage: int) -> float:
        """Bytes stage `stage` holds for the whole step: weights, gradients, optimizer
        state and the rest."""
        return self.weight_bytes[stage] + self.grad_bytes[stage] + self.optimizer_bytes[stage] + self.static_bytes[stage]

    def transfer_time(self, nbytes: float) -> float:
        """Time a transfer of `nbytes` occupies its link (the latency comes on top)."""
        return 0.0 if math.isinf(self.bandwidth) else nbytes / self.bandwidth


def save_costs(costs: Costs, path: str | os.PathLike, details: dict | None = None) -> None:
    """Write `costs` (and the JSON-able `details`, if given) to `path`, whole or not at all."""
    doc = {"costs": costs.to_dict()}
    if details is not None:
        doc["details"] = jsonable(details)
    with atomic_write(path) as f:
        json.dump(doc, f, indent=1, allow_nan=False)


def load_costs(path: str | os.PathLike) -> Costs:
    """Read `Costs` written by `save_costs`. A file that is missing, a folder, unreadable,
    not JSON, not costs or with costs `Costs` refuses (a negative time, a list of the
    wrong type) raises ValueError naming the file."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file; write one with sim.save_costs") from None
    except IsADirectoryError:
        raise ValueError(f"{path} is a directory; give the costs file (sim.save_costs writes one)") from None
    except OSError as e:
        raise ValueError(f"{path} cannot be read: {e.strerror or e}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not JSON ({e}); expected the costs file that sim.save_costs writes") from None
    if not isinstance(doc, dict) or "costs" not in doc:
        raise ValueError(f"{path} holds no costs; expected a JSON object with a 'costs' key as save_costs writes")
    try:
        return Costs.from_dict(doc["costs"])
    except (ValueError, TypeError, AttributeError) as e:
        raise ValueError(f"{path}: {str(e).splitlines()[0]}") from None


def jsonable(x):
    """`x` as standard JSON data: infinities and NaN as strings, tuples as lists, keys as str."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if hasattr(x, "tolist"):
        return x.tolist()
    return str(x)
