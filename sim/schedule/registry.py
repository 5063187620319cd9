"""The schedule registry: `SCHEDULES` names every generator with what it accepts, and `make_schedule` builds one by name.

The generators live beside it in `sim.schedule`: `textbook` (naive, GPipe, 1F1B),
`interleaved`, `zerobubble`, `dualpipe`; `zb-auto`, a search that simulates its candidates,
lives above the engine (`sim.search.zbauto`) and adds its entry there. Each entry is a
`Generator`: what it makes, which sizes it takes and where it places the stages.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .dualpipe import check_dualpipe, dualpipe, dualpipev
from .interleaved import check_interleaved, interleaved_1f1b, looped_bfs, looped_placement
from .interleaved_zb import interleaved_zb
from .ir import Schedule, ScheduleError
from .textbook import gpipe, naive, one_f_one_b
from .vshape import v_half, v_min
from .zerobubble import v_placement, zb_h1, zb_h2, zbv
from sim.limits import check_cells, collector_paused


def one_per_device(devices: int, virtual: int = 1) -> list[int]:
    """Stage s on device s (one model stage per device)."""
    return list(range(devices))


def v_shape(devices: int, virtual: int = 2) -> list[int]:
    """The V shape of 2P model stages: device r holds stages r and 2P-1-r
    (`sim.schedule.zerobubble.v_placement`)."""
    return v_placement(devices)


@dataclass(frozen=True)
class Generator:
    """A named schedule generator and what it accepts.

    - make(devices, micro_batches, virtual, **options) -> Schedule: `devices` pipeline
      devices (P), `micro_batches` micro-batches (M), `virtual` model chunks per device (V);
      P*V model stages. `make_schedule` calls it with the three positionally.
    - virtual: V when the caller gives none.
    - takes_virtual: whether V is the caller's choice (any V >= 1; `check` may refuse some
      sizes); if not, the generator takes its `virtual` only.
    - placement(devices, virtual) -> the device of each of the P*V model stages, as the
      schedules it makes place them (`one_per_device`, `looped_placement`: stage s on
      device s mod P, `v_shape`).
    - check(devices, micro_batches, virtual, **options) -> a one-line reason the generator
      refuses these sizes (with these options), or None; `refusal` adds the rule of `takes_virtual`.
    - options: the keyword options `make` takes beyond those three (e.g. `max_active`).
    - pipelines: the copies of the model its schedules hold (`Schedule.pipelines`; DualPipe: 2).
    - summary: one line for listings (`python -m sim.plot --help`)."""

    make: Callable[..., Schedule]
    summary: str
    virtual: int = 1
    takes_virtual: bool = False
    placement: Callable[[int, int], list[int]] = one_per_device
    check: Callable[..., str | None] = lambda devices, micro_batches, virtual, **options: None
    options: tuple[str, ...] = ()
    pipelines: int = 1

    def refusal(self, devices: int, micro_batches: int, virtual: int, **options) -> str | None:
        """Why the generator refuses these sizes (with these options; one line), or None."""
        if not self.takes_virtual and virtual != self.virtual:
            held = "one stage" if self.virtual == 1 else f"{self.virtual} stages"
            return f"V={virtual}: this schedule holds {held} per device (V={self.virtual})"
        return self.check(devices, micro_batches, virtual, **options)

    def __repr__(self) -> str:
        return f"<Generator V={self.virtual}{' (any)' * self.takes_virtual}: {self.summary}>"


def _textbook(fn: Callable[..., Schedule], summary: str, options: tuple[str, ...] = ()) -> Generator:
    """The entry of a generator of one stage per device, which takes no `virtual`."""
    def make(devices: int, micro_batches: int, virtual: int, **chosen) -> Schedule:
        return fn(devices, micro_batches, **chosen)
    return Generator(make, summary, options=options)


def _at_least(fewest: Callable[[int], int], why: str) -> Callable:
    """A `check` for a schedule that takes at least fewest(devices) micro-batches."""
    def check(devices: int, micro_batches: int, virtual: int, **options) -> str | None:
        least = fewest(devices)
        return f"needs at least {least} micro-batches ({why}), got {micro_batches}" if micro_batches < least else None
    return check


class Registry(dict):
    """The schedules by name (a dict of `Generator`s) whose repr lists them, one a line."""

    def __repr__(self) -> str:
        width = max(map(len, self), default=0)
        lines = [f"  {name:<{width}}  {f'V={g.virtual}' + (' (any)' if g.takes_virtual else ''):<11}  {g.summary}"
                 + (f" [options: {', '.join(g.options)}]" if g.options else "") for name, g in self.items()]
        return f"sim.SCHEDULES ({len(self)} schedules; make one with sim.make_schedule(name, devices, micro_batches)):\n" + \
            "\n".join(lines)

    def add(self, name: str, generator: Generator) -> None:
        """Name one more generator (one defined above the engine, as `zb-auto`); ValueError
        where the name is taken."""
        if name_key(name) in map(name_key, self):
            raise ValueError(f"a schedule named {name!r} is already registered")
        self[name] = generator


SCHEDULES: Registry = Registry({
    "naive": _textbook(naive, "one micro-batch at a time through every stage (no pipelining)"),
    "gpipe": _textbook(gpipe, "all forwards, then all backwards (Huang et al. 2019)", ("max_active",)),
    "1f1b": _textbook(one_f_one_b, "warm-up, one forward one backward, cool-down (PipeDream-Flush)", ("max_active",)),
    "interleaved-1f1b": Generator(interleaved_1f1b, "1F1B over V chunks per device, stage s on device s mod P "
                                  "(Megatron-LM, Narayanan et al. 2021)", virtual=2, takes_virtual=True,
                                  placement=looped_placement, check=check_interleaved,
                                  options=("group_size", "overlap")),
    "looped-bfs": Generator(looped_bfs, "all forwards of each chunk in turn, then the backwards in reverse "
                            "(torch's LoopedBFS)", virtual=2, takes_virtual=True, placement=looped_placement),
    # the zero-bubble family (sim/schedule/zerobubble.py, sim/schedule/dualpipe.py): backward split into I and W
    "zb-h1": Generator(zb_h1, "1F1B with I/W split, Ws put off to fill the tail (Qi et al. 2024, ZB-H1)"),
    "zb-h2": Generator(zb_h2, "2p-1 micro-batches in flight, zero bubble with F=I=W (Qi et al. 2024, ZB-H2)",
                       check=_at_least(lambda p: 2 * p - 1, "its warm-up runs 2P-1 forwards on device 0")),
    "interleaved-zb": Generator(interleaved_zb, "ZB-H1 over V chunks per device, stage s on device s mod P "
                                "(torch's InterleavedZeroBubble)", virtual=2, takes_virtual=True,
                                placement=looped_placement, check=check_interleaved, options=("group_size",)),
    "zbv": Generator(zbv, "V-shaped, 2 stages per device, zero bubble at 1F1B's memory (Qi et al. 2024, ZB-V)",
                     virtual=2, placement=v_shape),
    "dualpipev": Generator(dualpipev, "DeepSeek's DualPipe cut in half: V-shaped, F/B pairs (DualPipeV)",
                           virtual=2, placement=v_shape, check=_at_least(lambda p: 2 * p, "DualPipeV's steady "
                                                                         "state starts after 2P forwards of each chunk"),
                           options=("overlap",)),
    "dualpipe": Generator(dualpipe, "bidirectional, micro-batches fed from both ends through two copies of the "
                          "model, F/B pairs (DeepSeek-V3's DualPipe)", virtual=2, placement=v_shape,
                          check=check_dualpipe, options=("overlap",), pipelines=2),
    "v-min": Generator(v_min, "V-shaped, the least memory: (P+4)//3 micro-batches (Qi et al. 2024b, V-Min)",
                       virtual=2, placement=v_shape),
    "v-half": Generator(v_half, "V-shaped, half of 1F1B's memory: (P+2)//2 micro-batches (Qi et al. 2024b, "
                        "V-Half)", virtual=2, placement=v_shape),
})

TEXTBOOK = ("naive", "gpipe", "1f1b")  # the three that `python -m sim.plot` draws by default


def name_key(name: str) -> str:
    """A schedule name as looked up: lower case, without dashes and underscores."""
    return name.lower().replace("-", "").replace("_", "")


def lookup(name: str) -> tuple[str, Generator]:
    """The canonical name and the generator of `name` (dashes and case optional), or a
    `ScheduleError` listing the known names."""
    by_key = {name_key(n): n for n in SCHEDULES}
    if not isinstance(name, str) or name_key(name) not in by_key:
        raise ScheduleError(f"unknown schedule {name!r}; choose one of {', '.join(SCHEDULES)}")
    canonical = by_key[name_key(name)]
    return canonical, SCHEDULES[canonical]


def make_schedule(name: str, devices: int, micro_batches: int, virtual: int | None = None, **options) -> Schedule:
    """Build the named schedule (`sim.SCHEDULES` lists them) for `devices` pipeline devices (P),
    `micro_batches` micro-batches (M) and `virtual` model chunks per device (V, default: the
    schedule's own, 1 or 2): P*V model stages (`Schedule.stages`). Some take options
    (`SCHEDULES[name].options`). Raises `ScheduleError` with a one-line reason for sizes or options the
    schedule does not allow, and `sim.limits.StepTooLarge` (a ValueError), before building
    anything, for a step too large for this machine's memory."""
    canonical, gen = lookup(name)
    virtual = gen.virtual if virtual is None else virtual
    for what, n in (("devices", devices), ("micro_batches", micro_batches), ("virtual", virtual)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ScheduleError(f"{what} must be a positive integer, got {n!r}")
    unknown = sorted(set(options) - set(gen.options))
    if unknown:
        takes = f"takes {', '.join(gen.options)}" if gen.options else "takes no options"
        raise ScheduleError(f"{canonical} {takes}, not {', '.join(unknown)}")
    check_cells(devices * virtual * micro_batches, hint="give fewer devices or micro-batches")
    reason = gen.refusal(devices, micro_batches, virtual, **options)
    if reason:
        raise ScheduleError(f"{canonical} on {devices} devices, {micro_batches} micro-batches: {reason}")
    with collector_paused():  # a big step's actions all live on (`sim.limits.collector_paused`)
        return gen.make(devices, micro_batches, virtual, **options)
