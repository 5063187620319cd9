"""The schedule IR: text form, CSV, validation and deadlock errors."""
import pytest

import sim
from sim import Action, Kind, Schedule, ScheduleError


@pytest.mark.parametrize("text,stage,kind,micro", [
    ("2F0", 2, Kind.F, 0), ("1B3", 1, Kind.B, 3), ("0SEND_F1", 0, Kind.SEND_F, 1),
    ("3RECV_B12", 3, Kind.RECV_B, 12), ("10I7", 10, Kind.I, 7), ("0W0", 0, Kind.W, 0),
])
def test_action_text_round_trips(text, stage, kind, micro):
    a = Action.parse(text)
    assert (a.stage, a.kind, a.micro) == (stage, kind, micro)
    assert str(a) == text


@pytest.mark.parametrize("bad", ["", "F0", "2F", "2X0", "2F0x", "x2F0", "2 F0", "2SEND0", "-1F0", "2f0", "2F0,1B0"])
def test_bad_action_strings_are_rejected(bad):
    with pytest.raises(ScheduleError, match="not an action"):
        Action.parse(bad)


@pytest.mark.parametrize("name", sorted(sim.SCHEDULES))
@pytest.mark.parametrize("lowered", [False, True])
def test_csv_round_trips(name, lowered):
    s = sim.make_schedule(name, devices=4, micro_batches=8)  # M = 2P: a size every schedule takes
    if lowered:
        s = sim.lower(s)
    back = Schedule.from_csv(s.to_csv(), name=name)
    assert back.programs == s.programs
    assert back.placement == s.placement and back.micro_batches == s.micro_batches


def test_csv_in_torch_form_with_idle_cells():
    # torch pads idle steps with empty cells; they carry no meaning for us
    text = "0F0,0F1,,0B0,,0B1\n,1F0,1B0,1F1,1B1,\n"
    s = Schedule.from_csv(text)
    assert [str(a) for a in s.programs[0]] == ["0F0", "0F1", "0B0", "0B1"]
    assert sim.simulate(s).makespan == pytest.approx(2 * 1 + 2 * 2 + 1 + 2)  # (m+p-1)(F+B) = 9


def test_csv_error_names_the_row():
    with pytest.raises(ScheduleError, match=r"row 1 \(rank 1\).*'1Q0'"):
        Schedule.from_csv("0F0,0B0\n1F0,1Q0\n")


def test_missing_backward_is_named():
    with pytest.raises(ScheduleError, match="1B0 is missing"):
        sim.validate(Schedule([["0F0", "0B0"], ["1F0"]]))


def test_duplicate_action_is_named():
    """Completeness is checked once, as the `Schedule` is made."""
    with pytest.raises(ScheduleError, match="0F0 appears 2 times"):
        Schedule([["0F0", "0F0", "0B0"], ["1F0", "1B0"]])


def test_action_on_wrong_rank_is_named():
    with pytest.raises(ScheduleError, match="stage 1 lives on rank 1, not 0"):
        sim.validate(Schedule([["0F0", "1F0", "0B0"], ["1B0"]]))


def test_mixed_full_and_split_backward_is_rejected():
    with pytest.raises(ScheduleError, match="both B and I/W"):
        sim.validate(Schedule([["0F0", "0B0", "0I0", "0W0"]]))


def test_local_deadlock_shows_where():
    with pytest.raises(ScheduleError) as e:
        sim.validate(Schedule([["0B0", "0F0"], ["1F0", "1B0"]]))
    msg = str(e.value)
    assert "rank 0 waits at 0B0 for 0F0 on rank 0" in msg
    assert "0B0*" in msg  # the grid marks the stuck cell


def test_cross_rank_deadlock_shows_every_stuck_rank():
    # rank 1 wants micro-batch 1 first, rank 0 sends it only after micro-batch 0 came back
    s = Schedule([["0F0", "0B0", "0F1", "0B1"], ["1F1", "1B1", "1F0", "1B0"]])
    with pytest.raises(ScheduleError) as e:
        sim.validate(s)
    msg = str(e.value)
    assert "deadlocks" in msg
    assert "rank 0 waits at 0B0 for 1SEND_B0 on rank 1" in msg
    assert "rank 1 waits at 1F1 for 0SEND_F1 on rank 0" in msg


def test_hand_lowered_schedule_with_late_recv_is_rejected():
    good = sim.lower(sim.make_schedule("gpipe", devices=2, micro_batches=1))
    prog1 = [a for a in good.programs[1] if a.kind is not Kind.RECV_F] + [Action(1, Kind.RECV_F, 0)]
    bad = Schedule([good.programs[0], prog1])
    with pytest.raises(ScheduleError, match=r"rank 1 waits at 1F0 for 1RECV_F0 \(not posted before it\)"):
        sim.validate(bad)


def test_hand_lowered_schedule_missing_a_send_is_rejected():
    good = sim.lower(sim.make_schedule("1f1b", devices=2, micro_batches=2))
    prog0 = [a for a in good.programs[0] if str(a) != "0SEND_F1"]
    with pytest.raises(ScheduleError, match="1RECV_F1 has no matching 0SEND_F1"):
        sim.validate(Schedule([prog0, good.programs[1]]))


def test_lowering_adds_exactly_the_transfers_the_dependencies_imply():
    p, m = 4, 5
    low = sim.lower(sim.make_schedule("1f1b", devices=p, micro_batches=m))
    comm = [a for prog in low.programs for a in prog if not a.kind.is_compute]
    # forward: p-1 boundaries x m micro-batches, both ways, send + recv
    assert len(comm) == 2 * 2 * (p - 1) * m
    for r, prog in enumerate(low.programs):
        assert [a for a in prog if a.kind.is_compute] == list(sim.make_schedule("1f1b", devices=p, micro_batches=m).programs[r])
    with pytest.raises(ScheduleError, match="already lowered"):
        sim.lower(low)


@pytest.mark.parametrize("name,devices,micro_batches", [("gpipe", 0, 4), ("1f1b", 4, 0), ("1f1b", -1, 2), ("bogus", 2, 2)])
def test_make_schedule_rejects_bad_arguments(name, devices, micro_batches):
    with pytest.raises(ScheduleError):
        sim.make_schedule(name, devices=devices, micro_batches=micro_batches)


@pytest.mark.parametrize("programs", [
    [["0B0", "0F0"], ["1F0", "1B0"]],
    [["0F0", "0B0", "0F1", "0B1"], ["1F1", "1B1", "1F0", "1B0"]],
])
def test_simulate_rejects_a_deadlock_as_validate_does(programs):
    with pytest.raises(ScheduleError) as by_validate:
        sim.validate(Schedule(programs))
    with pytest.raises(ScheduleError) as by_simulate:
        sim.simulate(Schedule(programs))
    assert str(by_simulate.value) == str(by_validate.value)


def test_simulate_rejects_a_late_recv_as_validate_does():
    good = sim.lower(sim.make_schedule("gpipe", devices=2, micro_batches=2))
    prog1 = [a for a in good.programs[1] if str(a) != "1RECV_F1"]
    prog1.insert(prog1.index(Action.parse("1F1")) + 1, Action.parse("1RECV_F1"))
    bad = Schedule([good.programs[0], prog1])
    with pytest.raises(ScheduleError, match=r"rank 1 waits at 1F1 for 1RECV_F1 \(not posted before it\)"):
        sim.simulate(bad)
