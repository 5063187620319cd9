"""Schedule generators: each writes, per device, the order of its compute actions.

They only say *what runs where and in which order*; timing comes from `sim.simulate`
and communication from `sim.passes.lower`. One stage per device here (stage s on rank s).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Generator:
    """A named schedule generator and what it accepts.

    - make(stages, micro, virtual, **options) -> Schedule: `stages` pipeline devices (P),
      `micro` micro-batches (M), `virtual` model chunks per device (V); P*V model stages.
    - virtual: V when the caller gives none.
    - check(stages, micro, virtual) -> a one-line reason the generator refuses these
      sizes, or None.
    - options: the keyword options `make` takes beyond those three (e.g. `max_active`).
    - summary: one line for listings (`python -m sim.plot --help`)."""

    make: Callable[..., Schedule]
    summary: str
    virtual: int = 1
    check: Callable[[int, int, int], str | None] = lambda p, m, v: None if v == 1 else \
        f"V={v}: this schedule holds one stage per device (V=1)"
    options: tuple[str, ...] = ()


def _textbook(fn: Callable[[int, int], Schedule], summary: str) -> Generator:
    return Generator(lambda stages, micro, virtual: fn(stages, micro), summary)


SCHEDULES: dict[str, Generator] = {
    "naive": _textbook(naive, "one micro-batch at a time through every stage (no pipelining)"),
    "gpipe": _textbook(gpipe, "all forwards, then all backwards (Huang et al. 2019)"),
    "1f1b": _textbook(one_f_one_b, "warm-up, one forward one backward, cool-down (PipeDream-Flush)"),
}


TEXTBOOK = ("naive", "gpipe", "1f1b")  # the three that `python -m sim.plot` draws by default

from .zbauto import zb_auto  # noqa: E402 (it reads SCHEDULES at call time, for zb-h1)

SCHEDULES["zb-auto"] = Generator(zb_auto, "the zero-bubble paper's automatic scheduler: best found under costs "
                                 "and memory_limit (Qi et al. 2024, Sec. 3)", options=("costs", "memory_limit"))


def _key(name: str) -> str:
    return name.lower().replace("-", "").replace("_", "")


def lookup(name: str) -> tuple[str, Generator]:
    """The canonical name and the generator of `name` (dashes and case optional), or a
    `ScheduleError` listing the known names."""
    by_key = {_key(n): n for n in SCHEDULES}
    if not isinstance(name, str) or _key(name) not in by_key:
        raise ScheduleError(f"unknown schedule {name!r}; choose one of {', '.join(SCHEDULES)}")
    canonical = by_key[_key(name)]
    return canonical, SCHEDULES[canonical]


def make_schedule(name: str, stages: int, micro: int, virtual: int | None = None, **options) -> Schedule:
    """Build the named schedule (`sim.SCHEDULES` lists them) for `stages` pipeline devices,
    `micro` micro-batches and `virtual` model chunks per device (default: the schedule's
    own, 1 or 2); some take options (`SCHEDULES[name].options`). Raises `ScheduleError`
    with a one-line reason for sizes or options the schedule does not allow."""
    canonical, gen = lookup(name)
    virtual = gen.virtual if virtual is None else virtual
    for what, n in (("stages", stages), ("micro", micro), ("virtual", virtual)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ScheduleError(f"{what} must be a positive integer, got {n!r}")
    unknown = sorted(set(options) - set(gen.options))
    if unknown:
        takes = f"takes {', '.join(gen.options)}" if gen.options else "takes no options"
        raise ScheduleError(f"{canonical} {takes}, not {', '.join(unknown)}")
    reason = gen.check(stages, micro, virtual)
    if reason:
        raise ScheduleError(f"{canonical} on {stages} devices, {micro} micro-batches: {reason}")
    return gen.make(stages, micro, virtual, **options)
