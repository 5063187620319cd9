"""A schedule written by hand (sim.schedule.text): every schedule of the zoo written out as text or torch's CSV reads back equal and checks clean; torch's own CSVs (compute-only and with communication, its composite OVERLAP_F_B cells) read as the same schedule."""
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

import sim
from sim import Action, Kind, ScheduleError
from sim.passes.order import order_transfers
from sim.schedule.text import read_cells, read_schedule, scan_cells, schedule_text

DATA = Path(__file__).parent / "data"
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ZOO = sorted(n for n in sim.SCHEDULES if n != "zb-auto")  # zb-auto tunes by simulating: slow per example


def _same(a: sim.Schedule, b: sim.Schedule) -> bool:
    return (a.programs, a.placement, a.micro_batches, a.pipelines) == (b.programs, b.placement, b.micro_batches,
                                                                         b.pipelines)


@FAST
@given(name=st.sampled_from(ZOO), devices=st.integers(1, 4), micro=st.integers(1, 8), csv=st.booleans(),
       overlap=st.booleans(), extra=st.sampled_from(["none", "lowered", "grad_reduce", "fsdp"]))
def test_every_schedule_of_the_zoo_reads_back_equal_and_checks_clean(name, devices, micro, csv, overlap, extra):
    options = {"overlap": True} if overlap and "overlap" in sim.SCHEDULES[name].options else {}
    try:
        s = sim.make_schedule(name, devices, micro, **options)
    except ScheduleError:
        assume(False)
    if extra == "lowered":  # as it runs on NCCL: RECVs in the order the peer sends (sim.lower's may not be)
        s = order_transfers(sim.lower(s))
    elif extra == "grad_reduce":
        s = sim.add_grad_reduce(s, overlap=True)
    elif extra == "fsdp" and not s.has_pairs:
        s = sim.add_fsdp(s)
    text = schedule_text(s, csv=csv)
    assert ("," in text) == (csv and any(len(p) > 1 for p in s.programs))
    back = read_schedule(text)
    assert _same(back, s)
    report = sim.check_schedule(text)
    assert report.ok, str(report)
    assert _same(report.schedule, s)


def test_a_pair_is_written_as_torch_writes_it():
    s = sim.make_schedule("dualpipev", 2, 4, overlap=True)
    assert s.has_pairs
    text = schedule_text(s, csv=True)
    assert not re.search(r"\dOVERLAP_F_B", text)  # no bare mark: every pair is one composite cell
    cells = [c for c in text.replace("\n", ",").split(",") if "OVERLAP_F_B" in c]
    assert cells and all(c.startswith("(") and c.endswith(")OVERLAP_F_B") for c in cells)


def test_torch_composite_cell_is_the_mark_its_forward_and_its_backward():
    [[mark, f, b]] = read_cells("(0F3;3B1)OVERLAP_F_B")
    assert [mark.action, f.action, b.action] == [Action(3, Kind.OVERLAP_F_B, 1), Action.parse("0F3"),
                                                 Action.parse("3B1")]
    assert {mark.column, f.column, b.column} == {0}


def test_torch_dualpipev_csvs_read_as_one_schedule():
    # written by torch 2.13's ScheduleDualPipeV (P=2, M=4, V=2): pipeline_order and
    # pipeline_order_with_comms, as _dump_csv writes them (command in data/README.md)
    compute = read_schedule((DATA / "torch_dualpipev_p2_m4.csv").read_text())
    comms = sim.check_schedule((DATA / "torch_dualpipev_p2_m4_comms.csv").read_text())
    assert comms.ok, str(comms)
    low = comms.schedule
    assert low.is_lowered and low.has_pairs and low.has_gathers and low.has_collectives
    assert compute.has_pairs and compute.placement == low.placement == (0, 1, 1, 0)
    # the same computes in the same order on every rank
    computes = [[a for a in p if a.kind.is_compute] for p in low.programs]
    assert computes == [[a for a in p if a.kind.is_compute] for p in compute.programs]
    assert sim.simulate(low).makespan == sim.simulate(compute).makespan


def test_comments_blank_lines_and_idle_cells_are_no_actions():
    s = read_schedule("# my 1F1B\n\n0F0 0F1 0B0 0B1   # rank 0\n1F0 1B0 1F1 1B1\n")
    assert s.ranks == 2 and [str(a) for a in s.programs[0]] == ["0F0", "0F1", "0B0", "0B1"]
    assert _same(read_schedule("0F0,,0F1,0B0,,0B1\n,1F0,1B0,1F1,1B1"), s)


def test_a_cell_that_is_no_action_is_named_by_row_and_column():
    with pytest.raises(ScheduleError, match=r"row 1 \(rank 1\) column 2: not an action: '1X1'"):
        read_cells("0F0 0B0\n1F0 1B0 1X1")
    [[ok, bad]] = scan_cells("0F0,,0Q")
    assert bad.action is None and (bad.step, bad.column) == (1, 2) and "not an action" in bad.why
    with pytest.raises(ScheduleError, match="forward;backward"):
        read_cells("(0B1;0F3)OVERLAP_F_B")
