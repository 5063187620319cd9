"""The order of transfers between two ranks: a check that each rank posts its receives in the order its peer sends, and a pass that makes it so.

NCCL (and gloo when every message has the same tag, as in torch's own pipelining
runtime) matches the point-to-point messages between two ranks in the order they are
posted, not by tag: the k-th send from rank a to rank b meets the k-th receive on b from
a. So for every ordered pair of ranks (a -> b), the SENDs in a's program to b and the
RECVs in b's program from a must name the same transfers in the same order
(docs/rules.md, "Transfers between two ranks are posted in matching order").

`transfer_order(schedule)` checks it and names the first mismatch. `order_transfers`
makes a lowered schedule satisfy it by posting receives earlier, never later: the RECV of
the i-th transfer a sends to b moves up to where the earliest RECV (on b, from a) of a
transfer at or after i in a's order was. Computes keep their order, every RECV still comes
before the compute that waits for it, and a RECV only posts a buffer, so the schedule
can deadlock no more than before: the data of transfer i still arrives once a has issued
SEND i (a issues its SENDs in this very order, so the ones before it are out too).
"""
from __future__ import annotations

from typing import NamedTuple

from sim.schedule.ir import Action, Schedule, ScheduleError
from sim.schedule.kinds import KINDS, Role, peer_key
from .lowering import lower

__all__ = ["Posted", "transfers_by_pair", "transfer_order", "order_mismatches", "order_transfers"]


class Posted(NamedTuple):
    """A SEND or RECV at step `step` of its rank's program."""

    step: int
    action: Action


def _lowered(schedule: Schedule) -> Schedule:
    """The schedule as it runs: lowered by `sim.lower` if it holds compute actions only."""
    return schedule if schedule.is_lowered else lower(schedule)


def transfers_by_pair(schedule: Schedule) -> dict[tuple[int, int], tuple[list[Posted], list[Posted]]]:
    """For each ordered pair of ranks (a, b) that exchange data: a's SENDs to b and b's
    RECVs from a, each in program order. `schedule` must be lowered."""
    pairs: dict[tuple[int, int], tuple[list[Posted], list[Posted]]] = {}
    for r, prog in enumerate(schedule.programs):
        for i, a in enumerate(prog):
            role = KINDS[a.kind].role
            if role is not Role.SEND and role is not Role.RECV:  # a compute or a collective
                continue
            other = schedule.rank_of(peer_key(*a)[0])
            key = (r, other) if role is Role.SEND else (other, r)
            pairs.setdefault(key, ([], []))[role is Role.RECV].append(Posted(i, a))
    return dict(sorted(pairs.items()))


def order_mismatches(schedule: Schedule) -> list[tuple[int, int, int, Posted, Posted]]:
    """Every transfer k between two ranks (a -> b) where a's k-th SEND to b and b's k-th
    RECV from a name different transfers, as (a, b, k, send, recv): the pairs an
    order-matching transport (NCCL) would make wrongly. A compute-only schedule is checked
    as `sim.lower` writes it."""
    low = _lowered(schedule)
    return [(a, b, k, s, r) for (a, b), (sends, recvs) in transfers_by_pair(low).items()
            for k, (s, r) in enumerate(zip(sends, recvs)) if peer_key(*s.action) != tuple(r.action)]


def transfer_order(schedule: Schedule) -> None:
    """Raise a `ScheduleError` at the first pair of ranks (a -> b) whose SENDs on a and
    RECVs on b name their transfers in different orders, saying which two actions meet and
    where each stands. A compute-only schedule is checked as `sim.lower` writes it."""
    low = _lowered(schedule)
    for a, b, k, s, r in order_mismatches(low)[:1]:
        raise ScheduleError(
            f"transfers rank {a} -> rank {b} are out of order at transfer {k}: rank {a} step {s.step} "
            f"sends {s.action} but rank {b} step {r.step} receives {r.action}, so an order-matching "
            f"transport (NCCL) would pair them; use sim.passes.order.order_transfers")
    for (a, b), (sends, recvs) in transfers_by_pair(low).items():
        if len(sends) != len(recvs):  # only in a schedule whose communication is broken
            raise ScheduleError(f"rank {a} sends {len(sends)} tensors to rank {b}, which receives {len(recvs)}")


def order_transfers(schedule: Schedule) -> Schedule:
    """The lowered schedule (lowering it first if needed) with each rank's RECVs from each
    peer posted in the order that peer sends them, by moving RECVs earlier only. The
    computes and SENDs keep their order; the result passes `transfer_order`."""
    low = _lowered(schedule)
    # rank -> {step of a RECV: the step before which it is posted now}, and its rank in order
    moved: list[dict[int, tuple[int, int, int]]] = [{} for _ in range(low.ranks)]
    for (a, b), (sends, recvs) in transfers_by_pair(low).items():
        at = {tuple(r.action): r.step for r in recvs}
        order = [at[peer_key(*s.action)] for s in sends]  # b's RECV steps, in a's send order
        earliest = len(low.programs[b])
        for k in reversed(range(len(order))):  # suffix minimum: before every later transfer's RECV
            earliest = min(earliest, order[k])
            moved[b][order[k]] = (earliest, a, k)
    programs = []
    for r, prog in enumerate(low.programs):
        def place(i: int, r=r) -> tuple:
            # a RECV sorts before the action it now precedes; RECVs at one place by (peer, order)
            return (*moved[r][i][:1], 0, *moved[r][i][1:]) if i in moved[r] else (i, 1, 0, 0)
        programs.append([prog[i] for i in sorted(range(len(prog)), key=place)])
    return low.with_programs(programs)
