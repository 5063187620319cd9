"""exec.runtime.rank_program: the interpreter runs the compiled program as `sim.compile` made it.

For random schedules of every kind in `sim.SCHEDULES` (with and without overlapped pairs
and gradient reductions, compiled for gloo and for nccl), each rank's interpreter runs
exactly the program's order of actions, and what it reads off the program's numbers
(each compute's wait, each transfer's peer and tag) is what the schedule's dependencies
imply, worked out here a second way (`sim.passes.dependencies`) as the cross-check. No
process group: the handlers are replaced by a recorder, so this checks the order and the
reading of the program; tests/exec/test_run.py runs the same programs on real ranks.
"""
from __future__ import annotations

import pytest

pytest.importorskip("torch")

from hypothesis import HealthCheck, assume, given, settings, strategies as st  # noqa: E402
from torch import nn  # noqa: E402

import sim  # noqa: E402
from sim.passes.dependencies import compute_set, peer, waits_for  # noqa: E402
from sim.passes.order import transfer_order  # noqa: E402
from sim.schedule.kinds import KINDS, TRANSFERS, Role  # noqa: E402

from exec.launch.processes import RankContext  # noqa: E402
from exec.runtime.interpreter import RankInterpreter  # noqa: E402
from exec.runtime.rank_program import compiled, rank_program, sends_to_recvs  # noqa: E402
from exec.runtime.step import check_step_args  # noqa: E402

PAIRED = ("dualpipe", "dualpipev", "interleaved-1f1b")  # the kinds that take overlap=True


@st.composite
def programs(draw):
    """A schedule of any kind, maybe with overlapped pairs and REDUCE_GRADs, compiled for a
    backend exec runs."""
    name = draw(st.sampled_from(sorted(sim.SCHEDULES)))
    devices, micro = draw(st.integers(1, 4)), draw(st.integers(1, 8))
    overlap = name in PAIRED and draw(st.booleans())
    try:
        schedule = sim.make_schedule(name, devices, micro, overlap=overlap) if overlap else \
            sim.make_schedule(name, devices, micro)
    except sim.ScheduleError:
        assume(False)
    if draw(st.booleans()):
        schedule = sim.add_grad_reduce(schedule, draw(st.booleans()))
    return sim.compile(schedule, draw(st.sampled_from(["gloo", "nccl"])))


def _interpreter(program, r: int) -> RankInterpreter:
    stages = {s: nn.Linear(1, 1) for s, rank in enumerate(program.placement) if rank == r}
    return RankInterpreter(RankContext(r, program.ranks, r, "gloo"), program, stages, [], [], None, {}, 0)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(programs())
def test_each_rank_runs_the_compiled_programs_order_and_waits(program):
    lowered = program.lowered()  # the program written out: what the reader sees
    computes = compute_set(lowered)
    if program.target == "nccl":
        transfer_order(lowered)  # its RECVs in the order the peer sends: compiled so, not reordered by exec
    for r in range(program.ranks):
        interp = _interpreter(program, r)
        ran = []
        interp.handlers = {k: ran.append for k in interp.handlers}
        interp.run()
        assert ran == [program.action(op) for op in program.programs[r]] == list(lowered.programs[r])
        for a in ran:
            if a.kind.is_compute:  # the wait the program numbers is the one the dependencies imply
                assert interp.waits[a] == waits_for(a, lowered, computes), a
            elif a.kind in TRANSFERS:  # the peer is the other half's rank
                assert interp.routes[a].peer == lowered.rank_of(peer(a).stage), a
            elif KINDS[a.kind].role is Role.PAIR:  # the mark names the backward of its stage and micro-batch
                back = interp.pairs[a]
                assert back.kind.is_backward and (back.stage, back.micro) == (a.stage, a.micro)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(programs())
def test_both_sides_of_a_transfer_share_one_tag_of_their_own(program):
    routes = {}
    for r in range(program.ranks):
        routes |= rank_program(program, r).routes
    pairs = sends_to_recvs(program)
    assert set(pairs) | set(pairs.values()) == set(routes)
    for send, recv in pairs.items():
        assert peer(send) == recv and routes[send].tag == routes[recv].tag
    assert len({routes[s].tag for s in pairs}) == len(pairs)


def test_a_step_takes_a_program_compiled_for_its_backend():
    s = sim.make_schedule("zbv", 2, 4)
    gloo, nccl = sim.compile(s, "gloo"), sim.compile(s, "nccl")
    assert gloo.lowered().programs != nccl.lowered().programs  # NCCL's RECVs moved: the interpreter runs each as compiled
    for program in (gloo, nccl):
        assert _interpreter(program, 0).actions == list(program.lowered().programs[0])
    assert compiled(gloo, "gloo") is gloo and compiled(nccl, "gloo") is nccl and compiled(nccl, "nccl") is nccl
    with pytest.raises(TypeError, match=r"not a Schedule; pass sim.compile\(schedule, 'gloo'\)"):
        compiled(sim.lower(s), "gloo")
    with pytest.raises(ValueError, match="compiled for 'sim', not for a run on gloo"):
        compiled(sim.compile(s), "gloo")  # the simulator's: no deadlock check ran
    with pytest.raises(ValueError, match="compiled for 'gloo', not for a run on nccl"):
        check_step_args(RankContext(0, 2, 0, "nccl"), gloo, {0: None, 2: None}, [None] * 4, [None] * 4)
