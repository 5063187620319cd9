"""Dependencies of a `Schedule`: what each action consumes, and from which rank.

The one place that turns the action-kind table (`sim.schedule.kinds`: each kind's `needs`)
into questions about a schedule: which computes an action consumes (`dependencies`), which
RECVs a compute waits for (`waits_for`), the other half of a transfer (`peer`) and every
transfer the data dependencies imply (`transfer_keys`).
"""
from __future__ import annotations

from sim.schedule.ir import Action, Schedule
from sim.schedule.kinds import COMPUTE, KINDS, NEEDS, TRANSFERS, Computes, needs, peer_key, remote_inputs

__all__ = ["dependencies", "waits_for", "compute_set", "peer", "transfer_keys"]


def dependencies(a: Action, stages: int, computes: Computes) -> list[Action]:
    """The compute actions whose results `a` consumes (`sim.schedule.kinds`: each kind's `needs`)."""
    return [Action(*d) for d in needs(a.stage, a.kind, a.micro, stages, computes)]


def waits_for(a: Action, schedule: Schedule, computes: Computes) -> list[Action]:
    """The RECV actions whose data compute `a` waits for before it starts: one for each of
    its inputs made on another rank (`sim.schedule.kinds.remote_inputs`)."""
    return [Action(*k) for k in remote_inputs(a.stage, a.kind, a.micro, schedule.chain, computes,
                                              schedule.placement)]


def compute_set(schedule: Schedule) -> set[Action]:
    """The compute actions of a schedule, as a set."""
    return {a for p in schedule.programs for a in p if a.kind in COMPUTE}


def peer(a: Action) -> Action:
    """The other half of the transfer that a SEND or RECV action belongs to."""
    if a.kind not in TRANSFERS:
        raise ValueError(f"{a} is a {KINDS[a.kind].role.value} action; only SEND/RECV have a peer")
    return Action(*peer_key(*a))


def transfer_keys(schedule: Schedule, computes: Computes) -> list[tuple[tuple, tuple]]:
    """The transfers that the data dependencies imply, as (send key, recv key) pairs of
    (stage, kind, micro) tuples: one for each input a compute takes from another rank,
    named by its producer's kinds."""
    pairs = []
    placement, stages = schedule.placement, schedule.chain
    for prog in schedule.programs:
        for s, k, m in prog:
            if k not in COMPUTE:
                continue
            for d in NEEDS[k](s, m, stages, computes):
                if placement[d[0]] != placement[s]:
                    spec = KINDS[d[1]]
                    pairs.append(((d[0], spec.send, m), (s, spec.recv, m)))
    return pairs
