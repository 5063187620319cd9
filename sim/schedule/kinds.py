"""The action kinds: one table that says everything about each kind of action.

Each `KindSpec` entry says what an action of that kind depends on, which cost it takes,
what it does to memory, how it is drawn, and which handler of `exec`'s interpreter runs
it. Lowering (`sim.passes`), the engine (`sim.engine`), the independent reference model
in the tests, and `exec` (its interpreter, comparison and calibration) all read this
table; none of them lists the kinds again. docs/rules.md, "How to add a kind", says what
a new kind takes: a member of `Kind`, an entry in `KINDS`, and its handler in `exec`.

The dependencies are written once here, as functions of (stage, micro-batch):

- F(s, m) needs F(s-1, m): the previous stage's output activation.
- B(s, m) and I(s, m) need F(s, m) (the activations it saved) and, except on the last
  stage, the input gradient of stage s+1, made by B(s+1, m) or I(s+1, m).
- W(s, m) needs I(s, m) (the output gradient it saw).
- REDUCE_GRAD(s), once per stage per step, the data-parallel reduction of stage s's
  gradients, needs every backward of stage s that makes weight gradients (B, or W where
  the backward is split): all of them run on its own rank, before it in program order.
- OFFLOAD(s, m), the copy of the activations F(s, m) keeps to host memory, needs F(s, m);
  RELOAD(s, m), their copy back, needs OFFLOAD(s, m), and the backward of (s, m) that
  consumes them (B, or I) waits for its end (`sim.passes.offload`, docs/rules.md rule 14).
- OVERLAP_F_B(s, m) stands right before an F and names the backward (B or I) of (s, m)
  that is the next compute after that F: the two run as one overlapped pair, which waits
  for what that backward needs before the F starts (docs/rules.md rule 18).
- UNSHARD(s), FSDP's all-gather of stage s's parameters, needs nothing but its rank's
  all-gather stream; the computes of stage s that follow it on its rank, up to the next
  RESHARD(s) that gives the gathered parameters back, wait for its end. Their micro-batch
  counts a stage's gathers in the step (`sim.passes.fsdp`, docs/rules.md rule 16).

Where a schedule holds several copies of the model (`Schedule.pipelines`, DualPipe), the
`stages` the dependency functions take is the chain one micro-batch runs through
(`Schedule.chain`): stage s is the first of its chain where s mod chain = 0.

A result that another rank consumes travels as a transfer: the producer's kind names its
SEND (on the producer's rank) and its RECV (on the consumer's rank, one compute early).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable, Container, Mapping


class Kind(str, enum.Enum):
    """What an action does. The value is its spelling in the text form."""

    F = "F"            # forward
    B = "B"            # full backward (input and weight gradients at once)
    I = "I"            # backward for the input gradient only (zero-bubble split)
    W = "W"            # backward for the weight gradient only
    SEND_F = "SEND_F"  # send this stage's output activation to the next stage
    RECV_F = "RECV_F"  # receive this stage's input activation from the previous stage
    SEND_B = "SEND_B"  # send this stage's input gradient to the previous stage
    RECV_B = "RECV_B"  # receive this stage's output gradient from the next stage
    REDUCE_GRAD = "REDUCE_GRAD"  # reduce this stage's gradients over its data-parallel group (once per step)
    OFFLOAD = "OFFLOAD"  # copy the activations this stage keeps for a micro-batch to host memory
    RELOAD = "RELOAD"    # copy them back from host memory, before the backward that needs them
    # the F that follows and this stage's backward (B or I) of this micro-batch, the compute
    # after that F, run as one overlapped pair (torch's OVERLAP_F_B; docs/rules.md rule 18)
    OVERLAP_F_B = "OVERLAP_F_B"
    UNSHARD = "UNSHARD"  # all-gather this stage's sharded parameters (FSDP), before its computes
    RESHARD = "RESHARD"  # give the gathered parameters back, keeping this rank's shard

    @property
    def spec(self) -> "KindSpec":
        """This kind's entry in `KINDS`."""
        return KINDS[self]

    @property
    def is_compute(self) -> bool:
        return KINDS[self].role is Role.COMPUTE

    @property
    def is_backward(self) -> bool:
        return self in (Kind.B, Kind.I, Kind.W)

    def __str__(self) -> str:
        return self.value


class Role(enum.Enum):
    """What part an action plays in the step: the engine and the runtime treat each role
    alike, whatever the kind."""

    COMPUTE = "compute"  # occupies its device for a cost; may need tensors from other ranks
    SEND = "send"        # issues the transfer of a tensor made on this rank
    RECV = "recv"        # posts the receive of a tensor a later compute on this rank needs
    # issued in program order, runs on the rank's one collective stream (FIFO) while the
    # device goes on with its program; one per stage, with no micro-batch (`ONCE_PER_STAGE`)
    COLLECTIVE = "collective"
    # issued in program order, runs on one of the rank's two copy engines (device to host,
    # host to device; FIFO each) while the device goes on; a RELOAD's backward waits for it
    COPY = "copy"
    # marks the next two computes of its rank, an F and the backward it names, as one
    # overlapped pair: the pair starts once both have their inputs, and each one's expert
    # all-to-all hides under the other's compute (rule 18); it runs nothing itself
    PAIR = "pair"
    # issued in program order: an UNSHARD runs on the rank's all-gather stream (FIFO, FSDP2's
    # own stream) and the computes of its stage wait for its end; a RESHARD gives the
    # gathered parameters back when the device reaches it (`sim.engine.resources.Gathers`)
    GATHER = "gather"


Key = tuple  # (stage, Kind, micro): a compute action as a plain tuple (an `Action` is one)
# `computes`: the compute actions of a schedule, as any container that answers
# `(stage, kind, micro) in computes` (a set of its `Action`s does, and so does a dict keyed by them).
Computes = Container[Key]


@dataclass(frozen=True)
class MemoryEffect:
    """A compute takes (`sign` +1) or gives back (-1) the bytes of the per-stage `Costs`
    field `field` for its micro-batch, at its `at` ("start" or "end")."""

    field: str
    sign: int
    at: str


@dataclass(frozen=True)
class KindSpec:
    """Everything about one kind of action.

    - role: compute, send, recv, collective, copy or gather.
    - label, colour: how figures name and draw it.
    - handler: the name of the method of `exec`'s interpreter that runs it.
    Compute kinds:
    - cost: the per-stage `Costs` field with its time.
    - needs(stage, micro, stages, computes): the compute actions whose results it consumes.
    - memory: what it does to its rank's memory. The count of micro-batches whose
      activations a rank holds follows the `activation_bytes` effects (+1 from the start
      of F, -1 at the end of B or I); what W still needs after I is counted in bytes
      (`w_activation_bytes`), not as a micro-batch held.
    - send, recv: the SEND and RECV kinds that carry its result to a compute on another rank.
    Collective kinds (REDUCE_GRAD):
    - cost: the per-stage `Costs` field with its time on the collective stream.
    - needs(stage, micro, stages, computes): the computes that must end before it starts.
    Copy kinds (OFFLOAD, RELOAD):
    - cost: the per-stage `Costs` field with its time on its copy engine.
    - needs: the action of its rank whose end it waits for (OFFLOAD: the F whose
      activations it copies; RELOAD: the OFFLOAD that put them on the host).
    - stream: which of the rank's copy engines runs it ("to host" or "from host").
    - memory: as for a compute, at the copy's own start or end.
    - feeds: on a RELOAD, the compute kinds that wait for it (B or I).
    - comm: the per-stage `Costs` field of the communication the compute waits for (the
      expert all-to-all), unless an overlapped pair hides it (rule 18).
    Pair kinds (OVERLAP_F_B):
    - needs: what the backward it names needs (the pair waits for both computes' inputs).
    Gather kinds (UNSHARD, RESHARD):
    - cost: UNSHARD's per-stage `Costs` field with its time on the all-gather stream;
      RESHARD takes no time (None).
    - memory: the gathered parameters (`unshard_bytes`), taken at UNSHARD's start and
      given back at RESHARD's end.
    Transfer kinds (SEND, RECV):
    - peer: (stage offset, kind) of the other half of the transfer.
    - tensor_of: the stage offset whose output has the tensor's shape (the gradient with
      respect to a stage's output has that output's shape).
    - feeds: on a RECV, the compute kinds that may consume what it receives.
    """

    role: Role
    label: str
    handler: str
    colour: str = "#999999"
    cost: str | None = None
    needs: Callable[[int, int, int, Computes], list[Key]] | None = None
    memory: tuple[MemoryEffect, ...] = ()
    send: Kind | None = None
    recv: Kind | None = None
    peer: tuple[int, Kind] | None = None
    tensor_of: int = 0
    feeds: tuple[Kind, ...] = ()
    stream: str = ""
    comm: str | None = None


# The dependency functions run once per compute of a schedule (millions of times in a
# sweep): they name the kinds by module globals, as `Kind.F` is an attribute lookup on an
# Enum class, several times slower.
_F, _B, _I = Kind.F, Kind.B, Kind.I


def grad_kind(computes: Computes, stage: int, micro: int) -> Kind:
    """Which backward of (stage, micro) produces its input gradient: I if the schedule
    splits the backward, else B."""
    return _I if (stage, _I, micro) in computes else _B


def _forward_needs(s: int, m: int, stages: int, computes: Computes) -> list[Key]:
    return [(s - 1, _F, m)] if s % stages else []


def _backward_needs(s: int, m: int, stages: int, computes: Computes) -> list[Key]:
    if s % stages == stages - 1:
        return [(s, _F, m)]
    return [(s, _F, m), (s + 1, _I if (s + 1, _I, m) in computes else _B, m)]


def _weight_needs(s: int, m: int, stages: int, computes: Computes) -> list[Key]:
    return [(s, _I, m)]


def _reduce_needs(s: int, m: int, stages: int, computes: Computes) -> list[Key]:
    """Every backward of stage s that makes weight gradients, micro-batch 0, 1, ... as
    long as `computes` has one (a complete schedule has them all)."""
    out, m = [], 0
    while True:
        if (s, _B, m) in computes:
            out.append((s, _B, m))
        elif (s, Kind.W, m) in computes:
            out.append((s, Kind.W, m))
        else:
            return out
        m += 1


def _offload_needs(s: int, m: int, stages: int, computes: Computes) -> list[Key]:
    return [(s, _F, m)]


def _reload_needs(s: int, m: int, stages: int, computes: Computes) -> list[Key]:
    return [(s, Kind.OFFLOAD, m)]


_TAKE = MemoryEffect("activation_bytes", +1, "start")
_GIVE_BACK = MemoryEffect("activation_bytes", -1, "end")
_KEEP_FOR_W = MemoryEffect("w_activation_bytes", +1, "end")     # I: what W still needs stays
_GIVE_BACK_W = MemoryEffect("w_activation_bytes", -1, "end")
_TO_HOST = MemoryEffect("offload_bytes", -1, "end")      # OFFLOAD: the device's copy is freed once on the host
_FROM_HOST = MemoryEffect("offload_bytes", +1, "start")  # RELOAD: the device's copy is allocated first
_GATHERED = MemoryEffect("unshard_bytes", +1, "start")   # UNSHARD: the all-gather's output buffer
_RESHARDED = MemoryEffect("unshard_bytes", -1, "end")    # RESHARD: freed, the rank's shard stays

KINDS: Mapping[Kind, KindSpec] = {
    Kind.F: KindSpec(Role.COMPUTE, "F forward", "forward", "#0072B2", cost="forward", needs=_forward_needs,
                     memory=(_TAKE,), send=Kind.SEND_F, recv=Kind.RECV_F, comm="a2a_forward"),
    Kind.B: KindSpec(Role.COMPUTE, "B backward", "backward", "#E69F00", cost="backward", needs=_backward_needs,
                     memory=(_GIVE_BACK,), send=Kind.SEND_B, recv=Kind.RECV_B, comm="a2a_backward"),
    Kind.I: KindSpec(Role.COMPUTE, "I input grad", "backward_input", "#009E73", cost="backward_input",
                     needs=_backward_needs, memory=(_GIVE_BACK, _KEEP_FOR_W), send=Kind.SEND_B, recv=Kind.RECV_B,
                     comm="a2a_backward"),
    Kind.W: KindSpec(Role.COMPUTE, "W weight grad", "backward_weight", "#CC79A7", cost="backward_weight",
                     needs=_weight_needs, memory=(_GIVE_BACK_W,)),
    Kind.SEND_F: KindSpec(Role.SEND, "send activation", "send", peer=(+1, Kind.RECV_F), tensor_of=0),
    Kind.RECV_F: KindSpec(Role.RECV, "receive activation", "recv", peer=(-1, Kind.SEND_F), tensor_of=-1,
                          feeds=(Kind.F,)),
    Kind.SEND_B: KindSpec(Role.SEND, "send gradient", "send", peer=(-1, Kind.RECV_B), tensor_of=-1),
    Kind.RECV_B: KindSpec(Role.RECV, "receive gradient", "recv", peer=(+1, Kind.SEND_B), tensor_of=0,
                          feeds=(Kind.B, Kind.I)),
    Kind.REDUCE_GRAD: KindSpec(Role.COLLECTIVE, "R reduce grads", "reduce_grad", "#D55E00", cost="grad_reduce",
                               needs=_reduce_needs),
    Kind.OFFLOAD: KindSpec(Role.COPY, "O offload", "offload", "#56B4E9", cost="offload", needs=_offload_needs,
                           memory=(_TO_HOST,), stream="to host"),
    Kind.RELOAD: KindSpec(Role.COPY, "L reload", "reload", "#F0E442", cost="reload", needs=_reload_needs,
                          memory=(_FROM_HOST,), stream="from host", feeds=(Kind.B, Kind.I)),
    Kind.OVERLAP_F_B: KindSpec(Role.PAIR, "F&B overlapped pair", "overlap", needs=_backward_needs),
    Kind.UNSHARD: KindSpec(Role.GATHER, "U unshard (all-gather)", "unshard", "#882255", cost="unshard",
                           memory=(_GATHERED,)),
    Kind.RESHARD: KindSpec(Role.GATHER, "X reshard", "reshard", "#AA4499", memory=(_RESHARDED,)),
}

COMPUTE = frozenset(k for k, spec in KINDS.items() if spec.role is Role.COMPUTE)
SENDS = frozenset(k for k, spec in KINDS.items() if spec.role is Role.SEND)
RECVS = frozenset(k for k, spec in KINDS.items() if spec.role is Role.RECV)
TRANSFERS = SENDS | RECVS  # what `sim.lower` adds: a schedule with any of these is lowered
COLLECTIVES = frozenset(k for k, spec in KINDS.items() if spec.role is Role.COLLECTIVE)
COPIES = frozenset(k for k, spec in KINDS.items() if spec.role is Role.COPY)
# Kinds the device issues and goes on: each runs on a resource beside it (a collective
# stream, a copy engine), one per role (`sim.engine.resources.RESOURCES`).
BESIDE = frozenset(k for k, spec in KINDS.items()
                   if spec.role not in (Role.COMPUTE, Role.SEND, Role.RECV, Role.PAIR))
PAIRS = frozenset(k for k, spec in KINDS.items() if spec.role is Role.PAIR)  # marks, beside nothing
# Kinds done once per stage per step: an action of one has micro-batch 0, and its text form
# omits it (`0REDUCE_GRAD`, as torch.distributed.pipelining writes it).
ONCE_PER_STAGE = COLLECTIVES
# FSDP's gathers and releases (UNSHARD, RESHARD): a stage may be gathered several times a
# step; the micro-batch of one counts them (0, 1, ...), and the text form omits a 0
# (`0UNSHARD`, as torch writes it; `0UNSHARD1` for the stage's second gather).
GATHERS = frozenset(k for k, spec in KINDS.items() if spec.role is Role.GATHER)
# kind -> its dependency function, for hot loops (an OVERLAP_F_B mark waits as its backward does)
NEEDS = {k: KINDS[k].needs for k in COMPUTE | PAIRS}


def needs(stage: int, kind: Kind, micro: int, stages: int, computes: Computes) -> list[Key]:
    """The compute actions (as keys) whose results (stage, kind, micro) consumes."""
    try:
        return NEEDS[kind](stage, micro, stages, computes)
    except KeyError:
        raise ValueError(f"needs() takes compute actions, not {stage}{kind.value}{micro}") from None


def peer_key(stage: int, kind: Kind, micro: int) -> Key:
    """The other half of a transfer: SEND_F(s) <-> RECV_F(s+1), SEND_B(s) <-> RECV_B(s-1)."""
    step, other = KINDS[kind].peer
    return (stage + step, other, micro)


def remote_inputs(stage: int, kind: Kind, micro: int, stages: int, computes: Computes,
                  placement) -> list[Key]:
    """The RECVs (as keys) whose data compute (stage, kind, micro) waits for: one for each
    of its dependencies hosted on another rank, named by the producer's `recv` kind."""
    here = placement[stage]
    return [(stage, KINDS[d[1]].recv, micro) for d in NEEDS[kind](stage, micro, stages, computes)
            if placement[d[0]] != here]


def recv_consumer(stage: int, kind: Kind, micro: int, computes: Computes) -> Key:
    """The compute that consumes what the RECV (stage, kind, micro) receives."""
    feeds = KINDS[kind].feeds
    for k in feeds:
        if (stage, k, micro) in computes:
            return (stage, k, micro)
    return (stage, feeds[-1], micro)  # none is in the schedule: name the last candidate
