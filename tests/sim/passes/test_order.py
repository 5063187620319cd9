"""Transfers between two ranks are posted in matching order (sim.passes.order): the check names
the first mismatch, and the pass fixes any schedule by posting receives earlier only."""
import random

import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

import sim
from sim import Action, Kind, Schedule, ScheduleError
from sim.schedule.kinds import COMPUTE, KINDS, NEEDS, Role
from sim.passes.order import order_transfers, transfer_order, transfers_by_pair
from sim.schedule.textbook import gpipe_on

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def random_schedule(placement, micro, seed, split=False):
    """A random complete schedule that cannot deadlock: one random run of the whole step on
    one processor (each time, some rank runs one of its computes whose inputs are done),
    cut into the ranks' programs."""
    rng = random.Random(seed)
    S, R = len(placement), max(placement) + 1
    backward = (Kind.I, Kind.W) if split else (Kind.B,)
    todo = {Action(s, k, m) for s in range(S) for m in range(micro) for k in (Kind.F, *backward)}
    done, progs = set(), [[] for _ in range(R)]
    while todo:
        ready = sorted(a for a in todo if all(d in done for d in NEEDS[a.kind](a.stage, a.micro, S, todo | done)))
        a = rng.choice(ready)
        todo.remove(a)
        done.add(a)
        progs[placement[a.stage]].append(a)
    return Schedule(progs, placement, micro, name="random")


def inversions(low):
    """Independent of sim.passes.order: every two transfers a -> b that a sends in one order and b
    receives in the other, found by comparing positions pair by pair."""
    out = []
    for (a, b), _ in transfers_by_pair(low).items():
        send_at = {x: i for i, x in enumerate(low.programs[a]) if KINDS[x.kind].role is Role.SEND
                   and low.rank_of(sim.passes.dependencies.peer(x).stage) == b}
        recv_at = {sim.passes.dependencies.peer(x): i for i, x in enumerate(low.programs[b]) if KINDS[x.kind].role is Role.RECV
                   and low.rank_of(sim.passes.dependencies.peer(x).stage) == a}
        out += [(x, y) for x in send_at for y in send_at if send_at[x] < send_at[y] and recv_at[y] < recv_at[x]]
    return out


def assert_reordered_only_recvs_earlier(before, after):
    """Same actions; computes and SENDs keep their order; each RECV has at most as many
    computes before it as it had."""
    assert sorted(map(str, sum(map(list, before.programs), []))) == sorted(map(str, sum(map(list, after.programs), [])))
    for p, q in zip(before.programs, after.programs):
        assert [a for a in p if KINDS[a.kind].role is not Role.RECV] == [a for a in q if KINDS[a.kind].role is not Role.RECV]

        def computes_before(prog):
            n, out = 0, {}
            for a in prog:
                if a.kind in COMPUTE:
                    n += 1
                elif KINDS[a.kind].role is Role.RECV:
                    out[a] = n
            return out
        old, new = computes_before(p), computes_before(q)
        assert all(new[a] <= old[a] for a in old)


@pytest.mark.parametrize("name", sorted(sim.SCHEDULES))
@FAST
@given(P=st.integers(1, 5), M=st.integers(1, 10), data=st.data())
def test_every_generator_lowered_for_nccl_posts_in_order(name, P, M, data):
    gen = sim.SCHEDULES[name]
    try:
        s = sim.make_schedule(name, P, M)
    except ScheduleError:
        assume(False)
    low = sim.lower(s)
    ordered = order_transfers(s)
    transfer_order(ordered)
    sim.validate(ordered)
    assert_reordered_only_recvs_earlier(low, ordered)
    assert (not inversions(low)) == (order_transfers(low).programs == low.programs), gen.summary


@FAST
@given(M=st.integers(1, 8), split=st.booleans(), placement=st.sampled_from(
    [[0, 1, 1, 0], [0, 1, 0, 1], [0, 1, 2, 2, 1, 0], [0, 1, 2, 0, 1, 2], [0, 1, 0, 1, 0, 1]]))
def test_hand_made_v_shaped_and_interleaved_pass(M, split, placement):
    s = gpipe_on(placement, M, split=split)
    transfer_order(s)          # all forwards then all backwards: already in order
    assert not inversions(sim.lower(s))
    assert order_transfers(s).programs == sim.lower(s).programs


@FAST
@given(placement=st.lists(st.integers(0, 2), min_size=2, max_size=6), M=st.integers(1, 5),
       split=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_random_schedules_check_agrees_with_inversions_and_pass_fixes(placement, M, split, seed):
    assume(set(placement) == set(range(max(placement) + 1)))
    s = random_schedule(placement, M, seed, split)
    low = sim.lower(s)
    bad = inversions(low)
    if bad:
        with pytest.raises(ScheduleError, match="out of order"):
            transfer_order(low)
    else:
        transfer_order(low)
    ordered = order_transfers(low)
    transfer_order(ordered)
    assert not inversions(ordered)
    sim.validate(ordered)       # posting earlier never deadlocks
    assert_reordered_only_recvs_earlier(low, ordered)
    assert order_transfers(ordered).programs == ordered.programs  # a fixed point


def interleaved_mismatch():
    """Interleaved by hand (stages 0, 2 on rank 0; 1, 3 on rank 1): rank 0 sends 0SEND_F0,
    0SEND_F1, 2SEND_F0, while rank 1 posts 3RECV_F0 (for 3F0, its second compute) before
    1RECV_F1; and rank 0 sends 0SEND_F1 before 2SEND_B0 while rank 1 runs 1B0 before 1F1."""
    r0 = "0F0 0F1 2F0 2B0 2F1 2B1 0B0 0B1".split()
    r1 = "1F0 3F0 3B0 1B0 1F1 3F1 3B1 1B1".split()
    return Schedule([r0, r1], [0, 1, 0, 1], 2, name="interleaved-by-hand")


def test_mismatch_is_named_with_its_cells():
    s = interleaved_mismatch()
    low = sim.lower(s)
    steps0, steps1 = [str(a) for a in low.programs[0]], [str(a) for a in low.programs[1]]
    with pytest.raises(ScheduleError) as e:
        transfer_order(s)
    msg = str(e.value)
    send, recv = steps0.index("0SEND_F1"), steps1.index("3RECV_F0")
    assert f"rank 0 -> rank 1 are out of order at transfer 1: rank 0 step {send} sends 0SEND_F1 " \
           f"but rank 1 step {recv} receives 3RECV_F0" in msg
    # both directions: rank 1 also sends 1SEND_B0 before 1SEND_F1, received the other way
    assert {(str(x), str(y)) for x, y in inversions(low)} == {
        ("0SEND_F1", "2SEND_F0"), ("0SEND_F1", "2SEND_B0"), ("1SEND_B0", "1SEND_F1"), ("1SEND_B0", "3SEND_B1")}
    ordered = order_transfers(s)
    transfer_order(ordered)
    prog1 = [str(a) for a in ordered.programs[1]]
    assert prog1.index("1RECV_F0") < prog1.index("1RECV_F1") < prog1.index("3RECV_F0") < prog1.index("1F0")
    assert prog1.index("1RECV_B0") < prog1.index("1B0")


def test_a_lowered_schedule_with_two_recvs_swapped_is_caught():
    low = sim.lower(sim.make_schedule("gpipe", 2, 3))
    prog = list(low.programs[1])
    i, j = prog.index(Action.parse("1RECV_F1")), prog.index(Action.parse("1RECV_F2"))
    prog[i], prog[j] = prog[j], prog[i]
    swapped = Schedule([low.programs[0], prog], low.placement, low.micro_batches)
    with pytest.raises(ScheduleError, match=rf"rank 0 step \d+ sends 0SEND_F1 but rank 1 step {i} receives 1RECV_F2"):
        transfer_order(swapped)


def test_exec_posts_in_order_for_nccl_and_leaves_gloo_as_lowered(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # as on a machine with 2 GPUs:
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)      # check_run compiles, it starts nothing
    from exec.launch.processes import RankContext
    from exec.models.spec import ModelSpec
    from exec.pipeline.config import RunConfig
    from exec.pipeline.runner import check_run
    from exec.runtime.step import check_step_args
    s = interleaved_mismatch()
    gloo = check_run(ModelSpec(), s, RunConfig(backend="gloo"))
    nccl = check_run(ModelSpec(), s, RunConfig(backend="nccl"))
    assert gloo.lowered().programs == sim.lower(s).programs       # gloo matches by tag: unchanged
    assert nccl.lowered().programs == order_transfers(s).programs
    mine, xs = {0: None, 2: None}, [None, None]
    check_step_args(RankContext(0, 2, 0, "nccl"), nccl, mine, xs, xs)
    check_step_args(RankContext(0, 2, 0, "gloo"), gloo, mine, xs, xs)
    with pytest.raises(ValueError, match="compiled for 'gloo', not for a run on nccl"):
        check_step_args(RankContext(0, 2, 0, "nccl"), gloo, mine, xs, xs)
