"""Activation offloading as actions: the pass that adds an OFFLOAD after each forward and a RELOAD ahead of each backward.

SageMaker's model-parallel library offloads the checkpointed activations of a micro-batch
to CPU memory "as soon as the forward pass for a particular checkpointed layer is
computed" and loads them back "shortly before they are needed for the backward pass",
both over PCIe while the GPU computes; `activation_loading_horizon` (default 4) sets how
early (Amazon SageMaker developer guide, "Activation Offloading",
docs.aws.amazon.com/sagemaker/latest/dg/model-parallel-extended-features-pytorch-activation-offloading.html).
Here `sOFFLOAD m` copies what stage s keeps for micro-batch m to the host and `sRELOAD m`
copies it back; each runs on one of its rank's two copy engines (device to host, host to
device) while the device goes on with its program, and the backward of (s, m) waits for
its RELOAD's end (docs/rules.md, rule 14). Where they may stand is checked with the other
checks (`sim.passes.checks.check_copies`), the copy engines run them in the engine
(`sim.engine.resources.CopyEngines`), a copy's time is `sim.engine.costs.copy_time`, and
how long backwards waited for their copies `sim.engine.result.reload_waits`.
"""
from __future__ import annotations

from sim.schedule.ir import Action, Schedule
from sim.schedule.kinds import Kind
from .checks import check_pass_input

_F, _B, _I, _OFFLOAD, _RELOAD = Kind.F, Kind.B, Kind.I, Kind.OFFLOAD, Kind.RELOAD

# SageMaker's `activation_loading_horizon` default (the guide above): how many backwards
# ahead a RELOAD is issued.
DEFAULT_HORIZON = 4


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
    check_pass_input(schedule, "add_offload", "OFFLOAD/RELOAD", schedule.has_copies, "horizon", horizon,
                     f"SageMaker's activation_loading_horizon, default {DEFAULT_HORIZON}")
    return schedule.with_programs(_offload_program(prog, horizon) for prog in schedule.programs)


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
