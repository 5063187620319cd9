"""Activation offloading as actions: the pass that adds an OFFLOAD after each forward and a RELOAD ahead of each backward, the check of where they stand, and the copy engines the engine runs them on.

SageMaker's model-parallel library offloads the checkpointed activations of a micro-batch
to CPU memory "as soon as the forward pass for a particular checkpointed layer is
computed" and loads them back "shortly before they are needed for the backward pass",
both over PCIe while the GPU computes; `activation_loading_horizon` (default 4) sets how
early (Amazon SageMaker developer guide, "Activation Offloading",
docs.aws.amazon.com/sagemaker/latest/dg/model-parallel-extended-features-pytorch-activation-offloading.html).
Here `sOFFLOAD m` copies what stage s keeps for micro-batch m to the host and `sRELOAD m`
copies it back; each runs on one of its rank's two copy engines (device to host, host to
device) while the device goes on with its program, and the backward of (s, m) waits for
its RELOAD's end (docs/rules.md, rule 14).
"""
from __future__ import annotations

import math

from sim.schedule.ir import Action, Schedule, ScheduleError
from sim.schedule.kinds import COPIES, KINDS, Kind
from sim.schedule.liveness import memory_delta

_F, _B, _I, _OFFLOAD, _RELOAD = Kind.F, Kind.B, Kind.I, Kind.OFFLOAD, Kind.RELOAD

# SageMaker's `activation_loading_horizon` default (the guide above): how many backwards
# ahead a RELOAD is issued.
DEFAULT_HORIZON = 4


def copy_time(nbytes: float, bandwidth: float, latency: float = 0.0) -> float:
    """Seconds one copy of `nbytes` over PCIe takes: nbytes / bandwidth + latency
    (bandwidth in bytes/s in the copy's direction; math.inf = free)."""
    if not bandwidth > 0 or not latency >= 0 or not nbytes >= 0:
        raise ValueError(f"copy_time needs nbytes >= 0, bandwidth > 0 and latency >= 0, "
                         f"got {nbytes!r}, {bandwidth!r}, {latency!r}")
    return (0.0 if math.isinf(bandwidth) else nbytes / bandwidth) + latency


def add_offload(schedule: Schedule, horizon: int = DEFAULT_HORIZON) -> Schedule:
    """`schedule` (compute actions, and REDUCE_GRADs if any) with, for every (stage s,
    micro-batch m), `sOFFLOAD m` right after `sF m` and `sRELOAD m` ahead of the backward
    that needs the activations back (B, or I where the backward is split).

    A RELOAD is issued `horizon` backwards ahead on its rank: just before the rank's
    backward (B or I, of any of its stages) that comes `horizon` earlier in its program
    than its own (before the rank's first backward where there are fewer). horizon=0: just
    before its own backward, with no prefetch. A micro-batch whose RELOAD would be issued
    before the rank computes anything after its F (its backward is within `horizon` of
    its forward: the last stage of 1F1B, or a horizon as deep as the pipeline) is not
    offloaded: the copies would cost PCIe time and save no memory."""
    if isinstance(horizon, bool) or not isinstance(horizon, int) or horizon < 0:
        raise ValueError(f"horizon must be an int >= 0 (SageMaker's activation_loading_horizon, default "
                         f"{DEFAULT_HORIZON}), got {horizon!r}")
    if schedule.is_lowered or schedule.has_copies:
        raise ScheduleError(f"add_offload takes a schedule without SEND/RECV or OFFLOAD/RELOAD (as the generators "
                            f"write it, before sim.lower); {schedule.name!r} has them")
    return Schedule([_offload_program(prog, horizon) for prog in schedule.programs],
                    schedule.placement, schedule.micro_batches, schedule.name)


def _offload_program(prog, horizon: int) -> list[Action]:
    """One rank's program with its OFFLOADs and RELOADs (see `add_offload`)."""
    forward_at = {(a.stage, a.micro): i for i, a in enumerate(prog) if a.kind is _F}
    backwards = [i for i, a in enumerate(prog) if a.kind is _B or a.kind is _I]
    after: dict[int, list[Action]] = {}   # position i -> the copies issued right after prog[i]
    for k, i in enumerate(backwards):
        a = prog[i]
        f = forward_at[a.stage, a.micro]
        ahead = backwards[max(k - horizon, 0)] - 1   # right before the backward `horizon` earlier
        if not any(x.kind.is_compute for x in prog[f + 1:ahead + 1]):
            continue  # it would come back before the rank computes anything: no memory saved
        after.setdefault(f, []).insert(0, Action(a.stage, _OFFLOAD, a.micro))
        after.setdefault(ahead, []).append(Action(a.stage, _RELOAD, a.micro))
    return [x for i, a in enumerate(prog) for x in [a] + after.get(i, [])]


class CopyEngines:
    """The copies of a run (OFFLOAD, RELOAD; docs/rules.md, rule 14): each rank's two copy engines,
    when each copy starts and ends, when each backward may start (its RELOAD's end), and
    what the copies do to each rank's memory, merged into its series after the run."""

    def __init__(self, p, c, durations, ranks: int):
        self.after, self.feeds = p.copy_after, p.copy_feeds
        self.dur = [getattr(c, KINDS[a.kind].cost)[a.stage] for a in p.copies]
        if durations:
            self.dur = [durations.get(a, d) for a, d in zip(p.copies, self.dur)]
        self.engine = [0 if KINDS[a.kind].stream == "to host" else 1 for a in p.copies]
        self.effect = [(memory_delta(a.kind, "start", c, a.stage), memory_delta(a.kind, "end", c, a.stage))
                       for a in p.copies]
        self.start, self.end = [0.0] * len(p.copies), [0.0] * len(p.copies)
        self.ready = [0.0] * len(p.actions)     # per compute: the end of the RELOAD it waits for
        self.free = [[0.0, 0.0] for _ in range(ranks)]  # per rank: when each copy engine is free
        self.changes: list[list] = [[] for _ in range(ranks)]

    def issue(self, r: int, y: int, now: float) -> None:
        """Rank r issues copy y at `now`: it runs on its engine once that is free (and, for a
        RELOAD, its OFFLOAD has ended)."""
        free, k = self.free[r], self.engine[y]
        begin = max(now, free[k], self.end[self.after[y]] if self.after[y] >= 0 else 0.0)
        end = free[k] = begin + self.dur[y]
        self.start[y], self.end[y] = begin, end
        if self.feeds[y] >= 0:
            self.ready[self.feeds[y]] = end
        take, give = self.effect[y]
        if take:
            self.changes[r].append((begin, 2, take))   # at one time: after the computes' changes
        if give:
            self.changes[r].append((end, 0, give))     # before them

    def merge(self, r: int, series: list) -> list:
        """Rank r's memory series with its copies' changes: the computes' changes keep their
        order; at one time a copy gives back before them and takes after them."""
        if not self.changes[r]:
            return series
        steps = [(series[0][0], -1, series[0][1])]
        steps += [(t, 1, b - prev) for (_, prev), (t, b) in zip(series, series[1:])]
        merged = sorted(steps + self.changes[r], key=lambda x: x[:2])
        held, out = 0.0, []
        for t, _, change in merged:
            held += change
            out.append((t, held))
        return out


def _at(r: int, i: int, a: Action) -> str:
    return f"rank {r} step {i} ({a})"


def check_copies(schedule: Schedule) -> None:
    """Each OFFLOAD and RELOAD names a stage on its own rank and an existing micro-batch
    (`Schedule` refuses an action twice); `sOFFLOAD m` comes after `sF m`, `sRELOAD m` after `sOFFLOAD m` and before the
    backward that needs it (B or I), so an OFFLOAD has its RELOAD. Raises `ScheduleError`."""
    S, M = schedule.stages, schedule.micro_batches
    for r, prog in enumerate(schedule.programs):
        done: set[Action] = set()
        for i, a in enumerate(prog):
            if a.kind in COPIES:
                if not 0 <= a.stage < S:
                    raise ScheduleError(f"{_at(r, i, a)}: stage {a.stage} does not exist (stages 0..{S - 1})")
                if schedule.placement[a.stage] != r:
                    raise ScheduleError(f"{_at(r, i, a)}: stage {a.stage} lives on rank "
                                        f"{schedule.placement[a.stage]}, not {r}")
                if not 0 <= a.micro < M:
                    raise ScheduleError(f"{_at(r, i, a)}: micro-batch {a.micro} does not exist (0..{M - 1})")
                need = Action(a.stage, _F if a.kind is _OFFLOAD else _OFFLOAD, a.micro)
                if need not in done:
                    raise ScheduleError(f"{_at(r, i, a)} comes before {need}; put it after (sim.add_offload does)")
            elif (a.kind is _B or a.kind is _I) and Action(a.stage, _OFFLOAD, a.micro) in done \
                    and Action(a.stage, _RELOAD, a.micro) not in done:
                raise ScheduleError(f"{_at(r, i, a)} comes before {Action(a.stage, _RELOAD, a.micro)}, which "
                                    f"brings back its activations; put the RELOAD before it (sim.add_offload does)")
            done.add(a)


def reload_waits(result) -> list[float]:
    """Per rank, how long its backwards waited for their RELOADs in `result` (a simulated
    step): for each backward with a RELOAD, how much later than the end of the rank's
    compute before it (and the arrival of its input from another rank) its RELOAD ended,
    as the `ideal` transport runs them (no call overheads). Zero where the copies were on time."""
    events = result.events
    reload_end = {(e.action.stage, e.action.micro): e.end for e in events if e.action.kind is _RELOAD}
    arrived = {(e.action.stage, e.action.micro): e.end for e in events
               if e.action.kind is Kind.RECV_B}   # a backward's input from another rank
    out = [0.0] * result.ranks
    last = [0.0] * result.ranks     # the end of each rank's compute before
    for e in sorted((e for e in events if e.is_compute), key=lambda e: (e.start, e.end)):
        key = (e.action.stage, e.action.micro)
        if (e.action.kind is _B or e.action.kind is _I) and key in reload_end:
            ready = max(last[e.rank], arrived.get(key, 0.0))
            out[e.rank] += max(0.0, min(e.start, reload_end[key]) - ready)
        last[e.rank] = e.end
    return out
