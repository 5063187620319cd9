"""The cost model: how long each action takes and how many bytes it moves and keeps."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence, Union

PerStage = Union[float, Sequence[float]]


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
    - activation_bytes: bytes a stage keeps per micro-batch from its F until its backward.
    - static_bytes: weights, gradients and optimizer state of a stage.
    """

    forward: PerStage = 1.0
    backward: PerStage = 2.0
    latency: float = 0.0
    bandwidth: float = math.inf
    activation_bytes_sent: PerStage = 0.0
    activation_bytes: PerStage = 1.0
    static_bytes: PerStage = 0.0
    backward_input: PerStage | None = None
    backward_weight: PerStage | None = None
    send_overhead: float = 0.0
    recv_overhead: float = 0.0
    arrive_overhead: float = 0.0
    io_tick: float = 0.0
    before_compute: float = 0.0
    after_compute: float = 0.0

    def __post_init__(self):
        for name in ("latency", "send_overhead", "recv_overhead", "arrive_overhead", "before_compute",
                     "after_compute"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v >= 0):
                raise ValueError(f"Costs.{name} must be a finite number >= 0, got {v!r}")
        if isinstance(self.io_tick, bool) or not isinstance(self.io_tick, (int, float)) or not self.io_tick >= 0:
            raise ValueError(f"Costs.io_tick must be a number >= 0 (math.inf allowed), got {self.io_tick!r}")
        if not self.bandwidth > 0:
            raise ValueError(f"Costs.bandwidth must be > 0 bytes/s, got {self.bandwidth}")

    def for_stages(self, stages: int) -> "StageCosts":
        """Expand every per-stage field to one value per stage, checking the lengths."""
        bwd = _per_stage("backward", self.backward, stages)
        half = tuple(b / 2 for b in bwd)
        return StageCosts(
            forward=_per_stage("forward", self.forward, stages),
            backward=bwd,
            backward_input=half if self.backward_input is None else _per_stage("backward_input", self.backward_input, stages),
            backward_weight=half if self.backward_weight is None else _per_stage("backward_weight", self.backward_weight, stages),
            activation_bytes_sent=_per_stage("activation_bytes_sent", self.activation_bytes_sent, stages),
            activation_bytes=_per_stage("activation_bytes", self.activation_bytes, stages),
            static_bytes=_per_stage("static_bytes", self.static_bytes, stages),
            latency=float(self.latency),
            bandwidth=float(self.bandwidth),
            send_overhead=float(self.send_overhead),
            recv_overhead=float(self.recv_overhead),
            arrive_overhead=float(self.arrive_overhead),
            io_tick=float(self.io_tick),
            before_compute=float(self.before_compute),
            after_compute=float(self.after_compute),
        )


@dataclass(frozen=True)
class StageCosts:
    """`Costs` with every per-stage field expanded to a tuple of length `stages`."""

    forward: tuple[float, ...]
    backward: tuple[float, ...]
    backward_input: tuple[float, ...]
    backward_weight: tuple[float, ...]
    activation_bytes_sent: tuple[float, ...]
    activation_bytes: tuple[float, ...]
    static_bytes: tuple[float, ...]
    latency: float
    bandwidth: float
    send_overhead: float = 0.0
    recv_overhead: float = 0.0
    arrive_overhead: float = 0.0
    io_tick: float = 0.0
    before_compute: float = 0.0
    after_compute: float = 0.0

    def transfer_time(self, nbytes: float) -> float:
        """Time a transfer of `nbytes` occupies its link (the latency comes on top)."""
        return 0.0 if math.isinf(self.bandwidth) else nbytes / self.bandwidth
