"""Schedule generators: each writes, per device, the order of its compute actions.

They only say *what runs where and in which order*; timing comes from `sim.simulate`
and communication from `sim.passes.lower`. One stage per device here (stage s on rank s).
"""
from __future__ import annotations

import itertools
from functools import partial
from typing import Callable, Iterable

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


def naive(stages: int, micro: int) -> Schedule:
    """Naive model parallelism: each micro-batch goes forward through every stage and
    back before the next one starts, so only one device computes at a time."""
    programs = [[x for m in range(micro) for x in (F(s, m), B(s, m))] for s in range(stages)]
    return Schedule(programs, micro=micro, name="naive")


def gpipe(stages: int, micro: int) -> Schedule:
    """GPipe: every stage runs all its forwards, then all its backwards."""
    programs = [run_of(s, Kind.F, range(micro)) + run_of(s, Kind.B, range(micro)) for s in range(stages)]
    return Schedule(programs, micro=micro, name="gpipe")


def one_f_one_b(stages: int, micro: int) -> Schedule:
    """1F1B (PipeDream-Flush, as in Megatron-LM): stage s warms up with min(p-s-1, m)
    forwards, then alternates one forward and one backward, then cools down with the
    backwards left. Stage s never holds more than min(p-s, m) micro-batches."""
    programs = []
    for s in range(stages):
        warmup = min(stages - s - 1, micro)
        forwards, backwards = run_of(s, Kind.F, range(micro)), run_of(s, Kind.B, range(micro))
        prog = forwards[:warmup]
        # steady state: forward i + warmup, then backward i (zip stops at the last forward)
        prog += itertools.chain.from_iterable(zip(forwards[warmup:], backwards))
        prog += backwards[micro - warmup:]
        programs.append(prog)
    return Schedule(programs, micro=micro, name="1f1b")


SCHEDULES: dict[str, Callable[[int, int], Schedule]] = {
    "naive": naive,
    "gpipe": gpipe,
    "1f1b": one_f_one_b,
}


def make_schedule(name: str, stages: int, micro: int) -> Schedule:
    """Build a named schedule (`naive`, `gpipe`, `1f1b`) for `stages` stages and `micro`
    micro-batches."""
    key = name.lower().replace("-", "").replace("_", "")
    if key not in SCHEDULES:
        raise ScheduleError(f"unknown schedule {name!r}; choose one of {', '.join(SCHEDULES)}")
    for what, n in (("stages", stages), ("micro", micro)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ScheduleError(f"{what} must be a positive integer, got {n!r}")
    return SCHEDULES[key](stages, micro)
