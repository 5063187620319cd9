"""Checks of a `Schedule` before it is lowered or run: where each action stands, and the communication of a lowered one.

Completeness (every action once; every stage's F and backward for every micro-batch) is
checked once, when a `Schedule` is made (`sim.schedule.ir.check_actions`). What the IR
cannot know alone is checked here (`check_complete`): that the placement names existing
ranks, every action names an existing stage and micro-batch on its stage's rank, and the
collectives, copies and gathers stand where rules 13, 14 and 16 (docs/rules.md) put them.
`check_communication` checks that a lowered schedule's SENDs and RECVs are exactly the
transfers its data dependencies imply.
"""
from __future__ import annotations

from operator import itemgetter

from sim.schedule.ir import Action, Schedule, ScheduleError
from sim.schedule.kinds import COLLECTIVES, COMPUTE, COPIES, GATHERS, PAIRS, TRANSFERS, Computes, Kind, peer_key
from .dependencies import compute_set, peer, transfer_keys

__all__ = ["check_complete", "check_communication", "check_collectives", "check_copies", "check_gathers",
           "check_pairs", "check_pass_input"]

_F, _B, _I, _W, _OFFLOAD, _RELOAD = Kind.F, Kind.B, Kind.I, Kind.W, Kind.OFFLOAD, Kind.RELOAD


def _at(r: int, i: int, a: Action) -> str:
    return f"rank {r} step {i} ({a})"


def check_complete(schedule: Schedule) -> None:
    """A `Schedule` (complete by construction) that can run: at least one stage and one
    micro-batch, each stage placed on an existing rank, every action naming an existing
    stage and micro-batch of a stage its rank hosts, and the collectives and copies where
    they belong. Raises `ScheduleError` naming the first problem."""
    S, M, R = schedule.stages, schedule.micro_batches, schedule.ranks
    if S < 1 or M < 1:
        raise ScheduleError(f"a schedule needs at least one stage and one micro-batch, got {S} and {M}")
    for s, r in enumerate(schedule.placement):
        if not 0 <= r < R:
            raise ScheduleError(f"stage {s} is placed on rank {r}, but there are only ranks 0..{R - 1}")
    if schedule.has_collectives:
        check_collectives(schedule)
    if schedule.has_copies:
        check_copies(schedule)
    if schedule.has_gathers:
        check_gathers(schedule)
    if schedule.has_pairs:
        check_pairs(schedule)
    if not _stages_and_micros_fit(schedule):
        _explain_misplaced(schedule)
        raise AssertionError(f"check_complete found a problem in {schedule.name!r} but could not name it")


def _stages_and_micros_fit(schedule: Schedule) -> bool:
    """Every action names a stage hosted by its rank and an existing micro-batch (a quick
    pass with C-level tools; only a schedule that fails it is walked action by action)."""
    for r, prog in enumerate(schedule.programs):
        if prog:
            stages = set(map(itemgetter(0), prog))
            micros = {a.micro for a in prog if a.kind not in GATHERS}  # a gather's micro counts its gathers
            if min(micros) < 0 or max(micros) >= schedule.micro_batches or min(stages) < 0 \
                    or max(stages) >= schedule.stages or any(schedule.placement[s] != r for s in stages):
                return False
            if schedule.pipelines > 1 and any(a.stage not in schedule.route(a.micro) for a in prog
                                              if a.kind not in GATHERS and a.kind not in COLLECTIVES):
                return False
    return True


def _explain_misplaced(schedule: Schedule) -> None:
    """Raise a `ScheduleError` naming the first action that names a stage or micro-batch
    that does not exist, or a stage another rank hosts."""
    S, M = schedule.stages, schedule.micro_batches
    for r, prog in enumerate(schedule.programs):
        for i, a in enumerate(prog):
            if not 0 <= a.stage < S:
                raise ScheduleError(f"{_at(r, i, a)}: stage {a.stage} does not exist (stages 0..{S - 1})")
            if not 0 <= a.micro < M and a.kind not in GATHERS:
                raise ScheduleError(f"{_at(r, i, a)}: micro-batch {a.micro} does not exist (0..{M - 1})")
            if schedule.placement[a.stage] != r:
                raise ScheduleError(f"{_at(r, i, a)}: stage {a.stage} lives on rank {schedule.placement[a.stage]}, not {r}")
            if a.kind not in GATHERS and a.kind not in COLLECTIVES and a.stage not in schedule.route(a.micro):
                way = schedule.route(a.micro)
                raise ScheduleError(f"{_at(r, i, a)}: micro-batch {a.micro} runs through stages {way[0]}..{way[-1]} "
                                    f"(one of the schedule's {schedule.pipelines} pipelines), not stage {a.stage}")


def check_communication(schedule: Schedule, computes: Computes | None = None) -> None:
    """The SENDs and RECVs of a lowered schedule are exactly those that `lower` adds
    (`computes`: its compute actions, `compute_set(schedule)` if not given)."""
    if computes is None:
        computes = compute_set(schedule)
    comm = [a for p in schedule.programs for a in p if a.kind in TRANSFERS]
    comm_set = {(a.stage, a.kind, a.micro) for a in comm}
    for a in comm:
        if peer_key(*a) not in comm_set:
            raise ScheduleError(f"{a} has no matching {peer(a)}")
    expected = {x for pair in transfer_keys(schedule, computes) for x in pair}
    if comm_set != expected:
        extra = sorted(map(str, (Action(*k) for k in comm_set - expected)))
        missing = sorted(map(str, (Action(*k) for k in expected - comm_set)))
        what = f"missing {', '.join(missing[:4])}" if missing else f"unneeded {', '.join(extra[:4])}"
        raise ScheduleError(f"communication does not match the data dependencies: {what}")


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


def check_pairs(schedule: Schedule) -> None:
    """Each OVERLAP_F_B mark names a stage of its own rank and an existing micro-batch, and
    its next two computes are an F and the backward it names (B or I), rule 18. Raises
    `ScheduleError`."""
    for r, prog in enumerate(schedule.programs):
        computes = [(i, a) for i, a in enumerate(prog) if a.kind in COMPUTE]
        after = {}  # index of a mark -> the computes that follow it
        j = 0
        for i, a in enumerate(prog):
            while j < len(computes) and computes[j][0] < i:
                j += 1
            if a.kind in PAIRS:
                after[i] = [c for _, c in computes[j:j + 2]]
        for i, pair in after.items():
            a = prog[i]
            if not (0 <= a.stage < schedule.stages and schedule.placement[a.stage] == r
                    and 0 <= a.micro < schedule.micro_batches):
                raise ScheduleError(f"{_at(r, i, a)}: names no backward of rank {r} (stage {a.stage}, micro-batch "
                                    f"{a.micro})")
            if len(pair) < 2 or pair[0].kind is not _F or pair[1][0::2] != (a.stage, a.micro) \
                    or pair[1].kind not in (_B, _I):
                got = " then ".join(map(str, pair)) or "nothing"
                raise ScheduleError(f"{_at(r, i, a)} must be followed by an F and then {a.stage}B{a.micro} (or "
                                    f"{a.stage}I{a.micro}), the pair it overlaps; its rank runs {got}")
            if pair[0].micro == a.micro:
                raise ScheduleError(f"{_at(r, i, a)} pairs {pair[0]} with a backward of its own micro-batch, which "
                                    f"needs it; a pair overlaps the computes of two micro-batches")


def check_collectives(schedule: Schedule) -> None:
    """Each REDUCE_GRAD names an existing stage, on the rank that hosts it, at most once,
    and comes after every backward of its stage that makes weight gradients (B, or W): one
    per micro-batch the stage runs (with k copies of the model, `Schedule.pipelines`, M/k)."""
    runs = schedule.micro_batches // schedule.pipelines  # micro-batches each stage runs
    done = [0] * schedule.stages   # backwards (B or W) of each stage passed so far
    seen = set()
    for r, prog in enumerate(schedule.programs):
        for i, a in enumerate(prog):
            if a.kind is _B or a.kind is _W:
                if 0 <= a.stage < schedule.stages:
                    done[a.stage] += 1
            elif a.kind in COLLECTIVES:
                if not 0 <= a.stage < schedule.stages or schedule.placement[a.stage] != r:
                    where = "does not exist" if not 0 <= a.stage < schedule.stages else \
                        f"lives on rank {schedule.placement[a.stage]}, not {r}"
                    raise ScheduleError(f"{_at(r, i, a)}: stage {a.stage} {where}")
                if a in seen:
                    raise ScheduleError(f"{a} appears twice; a stage reduces its gradients once per step")
                seen.add(a)
                if done[a.stage] < runs:
                    raise ScheduleError(f"{_at(r, i, a)} comes before {runs - done[a.stage]} of the "
                                        f"backwards (B or W) of stage {a.stage}; put it after its stage's last "
                                        f"backward (sim.passes.grad_reduce.add_grad_reduce does)")


def check_gathers(schedule: Schedule) -> None:
    """FSDP's gathers (rule 16): on every rank, each compute of a stage comes between an
    UNSHARD of that stage and its RESHARD; a stage is not gathered again before its
    RESHARD, nor resharded where it is not gathered, and every stage is resharded by the
    end of its rank's program. Raises `ScheduleError` naming the first action at fault."""
    for r, prog in enumerate(schedule.programs):
        gathered: dict[int, Action] = {}  # stage -> its UNSHARD not resharded yet
        for i, a in enumerate(prog):
            if a.kind in GATHERS and (not 0 <= a.stage < schedule.stages or schedule.placement[a.stage] != r):
                where = "does not exist" if not 0 <= a.stage < schedule.stages else \
                    f"lives on rank {schedule.placement[a.stage]}, not {r}"
                raise ScheduleError(f"{_at(r, i, a)}: stage {a.stage} {where}")
            if a.kind is Kind.UNSHARD:
                if a.stage in gathered:
                    raise ScheduleError(f"{_at(r, i, a)}: stage {a.stage} is still gathered by {gathered[a.stage]}; "
                                        f"put {a.stage}RESHARD before it (sim.add_fsdp does)")
                gathered[a.stage] = a
            elif a.kind is Kind.RESHARD:
                if gathered.pop(a.stage, None) is None:
                    raise ScheduleError(f"{_at(r, i, a)}: stage {a.stage} is not gathered here; an UNSHARD of it "
                                        f"comes first")
            elif a.kind in COMPUTE and a.stage not in gathered:
                raise ScheduleError(f"{_at(r, i, a)} computes on stage {a.stage}'s sharded parameters; gather them "
                                    f"first with an UNSHARD of it (sim.add_fsdp adds them)")
        if gathered:
            a = next(iter(gathered.values()))
            raise ScheduleError(f"rank {r}: {a} is never resharded; end its program with {a.stage}RESHARD")


def check_pass_input(schedule: Schedule, pass_name: str, added: str, has_them: bool,
                     option: str, value, meaning: str) -> None:
    """What a pass that adds actions (`sim.add_offload`, `sim.add_fsdp`) takes: its count
    `option` an int >= 0 (`meaning`: what it counts, and its default), and an unlowered
    schedule without the actions it adds (`added`, `has_them`)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{option} must be an int >= 0 ({meaning}), got {value!r}")
    if schedule.is_lowered or has_them:
        raise ScheduleError(f"{pass_name} takes a schedule without SEND/RECV or {added} (as the generators "
                            f"write it, before sim.lower); {schedule.name!r} has them")
