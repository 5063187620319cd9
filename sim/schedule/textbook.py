"""The textbook schedules, one model stage per device: naive, GPipe and 1F1B (and GPipe over any placement).

Each writes, per device, the order of its compute actions only: timing comes from
`sim.simulate` and communication from `sim.lower`. `sim.schedule.registry` names them.
"""
from __future__ import annotations

import itertools
from functools import partial
from typing import Iterable, Sequence

from .ir import Action, Kind, Schedule, ScheduleError


def F(s: int, m: int) -> Action:
    return Action(s, Kind.F, m)


def B(s: int, m: int) -> Action:
    return Action(s, Kind.B, m)


_new_action = partial(tuple.__new__, Action)  # Action(*t) without a Python call per action


def run_of(stage: int, kind: Kind, micros: Iterable[int]) -> list[Action]:
    """[Action(stage, kind, m) for m in micros], built in bulk: a 1F1B step of 64 stages
    and 1024 micro-batches has 131,072 actions, and this builds them twice as fast."""
    return list(map(_new_action, zip(itertools.repeat(stage), itertools.repeat(kind), micros)))


def naive(devices: int, micro_batches: int) -> Schedule:
    """Naive model parallelism: each micro-batch goes forward through every stage and
    back before the next one starts, so only one device computes at a time."""
    programs = [[x for m in range(micro_batches) for x in (F(s, m), B(s, m))] for s in range(devices)]
    return Schedule(programs, range(devices), micro_batches, name="naive")


def gpipe(devices: int, micro_batches: int, max_active: int | None = None) -> Schedule:
    """GPipe: every stage runs all its forwards, then all its backwards. With `max_active`
    = c (SageMaker model parallel's `active_microbatches`), in waves of c micro-batches (as
    gradient accumulation over GPipe steps): a wave enters stage 0 once the last one has
    left it, so at most c are in flight. A rolling window (micro-batch m entering once m-c
    has left) would cost a round trip per micro-batch: a forwards-first last stage runs
    F(m) before B(m-c+1), and F(m) waits for B(m-c) on stage 0."""
    cap = micro_batches if max_active is None else _check_cap(max_active)
    waves = [range(w, min(w + cap, micro_batches)) for w in range(0, micro_batches, cap)]
    programs = []
    for s in range(devices):
        prog = []
        for wave in waves:
            prog += run_of(s, Kind.F, wave) + run_of(s, Kind.B, wave)
        programs.append(prog)
    return Schedule(programs, range(devices), micro_batches, name="gpipe")


def one_f_one_b(devices: int, micro_batches: int, max_active: int | None = None) -> Schedule:
    """1F1B (PipeDream-Flush, as in Megatron-LM): stage s warms up with min(p-s-1, m)
    forwards, then alternates one forward and one backward, then cools down with the
    backwards left. Stage s never holds more than min(p-s, m) micro-batches. With
    `max_active` = c the warm-up is at most c-1: no stage holds more than c, and micro-batch
    m enters stage 0 only once micro-batch m-c has left it."""
    p, m = devices, micro_batches
    cap = p if max_active is None else _check_cap(max_active)
    programs = []
    for s in range(p):
        w = min(p - s - 1, cap - 1, m)
        forwards, backwards = run_of(s, Kind.F, range(m)), run_of(s, Kind.B, range(m))
        prog = forwards[:w]
        # steady state: forward i + w, then backward i (zip stops at the last forward)
        prog += itertools.chain.from_iterable(zip(forwards[w:], backwards))
        prog += backwards[m - w:]
        programs.append(prog)
    return Schedule(programs, range(p), m, name="1f1b")  # (stage s on device s: no need to look)


def _check_cap(max_active) -> int:
    if isinstance(max_active, bool) or not isinstance(max_active, int) or max_active < 1:
        raise ScheduleError(f"max_active must be a positive integer (micro-batches in flight), got {max_active!r}")
    return max_active


def gpipe_on(placement: Sequence[int], micro_batches: int, split: bool = False, name: str = "gpipe-on") -> Schedule:
    """GPipe over any placement (stage s on device placement[s], several stages a device
    allowed): every forward of each stage in stage order, then the backwards from the last
    stage to the first; with `split`, each backward as its I, and all the Ws at the end in
    the same order. The tests' schedule of many placements, and `benchmarks/check_engine_against.py`'s."""
    programs: list[list[Action]] = [[] for _ in range(max(placement) + 1)]
    for s, device in enumerate(placement):
        programs[device] += run_of(s, Kind.F, range(micro_batches))
    backwards = (Kind.I, Kind.W) if split else (Kind.B,)
    for kind in backwards:
        for s in reversed(range(len(placement))):
            programs[placement[s]] += run_of(s, kind, range(micro_batches))
    return Schedule(programs, placement, micro_batches, name=name)
