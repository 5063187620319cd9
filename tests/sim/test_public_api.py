"""The Python API as a new user meets it: a schedule with an action missing or twice is
refused where it is made, naming the cell; check_deadlock takes what the generators
write; Costs refuses a bad per-stage value at once; a Result says what it is."""
from __future__ import annotations

import math

import pytest

import sim
from sim import Schedule, ScheduleError
from helpers import counting_calls


# ---------------------------------------------------------------- Schedule: missing and duplicated actions

def test_a_missing_backward_is_refused_by_the_constructor_naming_the_rank():
    with pytest.raises(ScheduleError, match=r"^1B0 is missing: 1F0 is at rank 1 step 0, but rank 1 has no backward"):
        Schedule([["0F0", "0B0"], ["1F0"]])


def test_a_missing_forward_is_named_with_the_rank_that_hosts_its_stage():
    with pytest.raises(ScheduleError, match=r"^0F1 is missing: rank 0, which hosts stage 0, has no forward of "
                                            r"micro-batch 1 \(its 0B1 is at rank 0 step 2\)"):
        Schedule([["0F0", "0B0", "0B1"], ["1F0", "1B0", "1F1", "1B1"]])


def test_half_a_split_backward_is_named():
    with pytest.raises(ScheduleError, match=r"^0W0 is missing: 0I0 is at rank 0 step 1, half of a split backward"):
        Schedule([["0F0", "0I0"]])


def test_a_duplicated_action_is_refused_naming_both_cells():
    with pytest.raises(ScheduleError, match=r"^1F0 appears 2 times, at rank 1 step 0 and rank 1 step 2;"):
        Schedule([["0F0", "0B0"], ["1F0", "1B0", "1F0"]])


def test_from_csv_names_the_row_and_column_of_the_cell():
    # an empty cell is an idle step: the column is not the step
    with pytest.raises(ScheduleError, match=r"1F1 appears 2 times, at row 1 column 3 \(rank 1 step 2\) and "
                                            r"row 1 column 6 \(rank 1 step 4\)"):
        Schedule.from_csv("0F0,,0B0,0F1,0B1\n1F0,1B0,,1F1,1B1,,1F1\n")
    with pytest.raises(ScheduleError, match=r"0B1 is missing: 0F1 is at row 0 column 3 \(rank 0 step 2\), "
                                            r"but row 0 \(rank 0\) has no backward"):
        Schedule.from_csv("0F0,,0B0,0F1\n1F0,1B0,,1F1,1B1\n")


def test_complete_schedules_are_accepted_as_before():
    for name in sim.SCHEDULES:
        s = sim.make_schedule(name, 4, 8)  # M = 2P, P even: a size every schedule takes
        assert Schedule.from_csv(s.to_csv(), name=name).programs == s.programs
        sim.lower(s)  # lowered (SEND/RECV added) and checked again
    # a zero-bubble split backward, and an action on the wrong rank: that is validate's to say
    Schedule([["0F0", "0I0", "0W0"]])
    with pytest.raises(ScheduleError, match="stage 1 lives on rank 1, not 0"):
        sim.validate(Schedule([["0F0", "1F0", "0B0"], ["1B0"]]))


# ---------------------------------------------------------------- check_deadlock

def test_check_deadlock_takes_a_schedule_of_computes_only():
    """It said "communication does not match the data dependencies: missing 0RECV_B0"."""
    sim.check_deadlock(sim.make_schedule("1f1b", 4, 8))
    sim.check_deadlock(sim.lower(sim.make_schedule("1f1b", 4, 8)))
    with pytest.raises(ScheduleError, match="rank 1 waits at 1F1 for 0SEND_F1 on rank 0"):
        sim.check_deadlock(Schedule([["0F0", "0B0", "0F1", "0B1"], ["1F1", "1B1", "1F0", "1B0"]]))


# ---------------------------------------------------------------- Costs

@pytest.mark.parametrize("field,value,message", [
    ("forward", -1, r"Costs.forward must be finite and >= 0, got -1"),
    ("backward", [1.0, math.nan], r"Costs.backward\[1\] must be finite and >= 0, got nan"),
    ("activation_bytes", (1, math.inf), r"Costs.activation_bytes\[1\] must be finite"),
    ("static_bytes", "1", r"Costs.static_bytes must be a number or a sequence of numbers"),
    ("weight_bytes", [], r"Costs.weight_bytes must be a number or a sequence"),
    ("forward", None, r"Costs.forward must be a number or a sequence"),
    ("backward_input", [1, "x"], r"Costs.backward_input must be a number, None or a sequence"),
    ("grad_bytes", True, r"Costs.grad_bytes must be a number"),
])
def test_costs_check_every_per_stage_field_at_construction(field, value, message):
    with pytest.raises(ValueError, match=message):
        sim.Costs(**{field: value})


def test_costs_check_the_count_against_the_stages_later():
    costs = sim.Costs(forward=[1, 2, 3], backward_input=None, optimizer_bytes=(0, 2**30, 0))
    assert costs.for_stages(3).forward == (1.0, 2.0, 3.0)
    with pytest.raises(ValueError, match="Costs.forward has 3 values but the schedule has 4 stages"):
        costs.for_stages(4)


# ---------------------------------------------------------------- Result

def test_result_repr_says_what_it_is():
    r = sim.simulate(sim.make_schedule("1f1b", 4, 8))
    assert repr(r) == "<Result '1f1b' (simulated): 4 stages on 4 ranks, 8 micro-batches, makespan 33, bubble 27.3%>"
    one = sim.simulate(sim.make_schedule("gpipe", 1, 1), sim.Costs(forward=0.5))
    assert repr(one) == "<Result 'gpipe' (simulated): 1 stage on 1 rank, 1 micro-batch, makespan 2.5, bubble 0.0%>"
    events = [sim.Event(e.rank, e.action, e.start + 7, e.end + 7, e.peer) for e in one.events]
    measured = sim.Result(one.schedule, events, one.memory, one.activations, source="measured")
    assert "(measured)" in repr(measured) and "makespan 2.5 s," in repr(measured)



# ---------------------------------------------------------------- Costs: one field spec

# A costs file as save_costs wrote it before the fields were written once (commit 6124855):
# the format stays the same.
OLD_COSTS_FILE = """{"costs": {"forward": [1.0, 2.0], "backward": 2.0, "latency": 0.1, "bandwidth": "inf",
 "activation_bytes_sent": 0.0, "activation_bytes": 1.0, "w_activation_bytes": null, "static_bytes": 0.0,
 "weight_bytes": 0.0, "grad_bytes": 0.0, "optimizer_bytes": 0.0, "backward_input": null, "backward_weight": [0.5, 0.25],
 "send_overhead": 0.0, "recv_overhead": 0.0, "arrive_overhead": 0.0, "io_tick": "inf", "before_compute": 0.0,
 "after_compute": 0.0, "transport": "gloo-cpu", "grad_reduce": 0.0, "offload_bytes": 0.0, "offload": 0.0,
 "reload": 0.0}}"""


def test_costs_files_keep_their_format(tmp_path):
    path = tmp_path / "old.json"
    path.write_text(OLD_COSTS_FILE)
    c = sim.load_costs(path)
    assert c == sim.Costs(forward=(1.0, 2.0), latency=0.1, backward_weight=(0.5, 0.25), io_tick=math.inf)
    sim.save_costs(c, tmp_path / "new.json")
    import json
    # fields added since, written with their defaults (FSDP, rule 16; the expert all-to-all, rule 18;
    # the step's first compute and its recovery, rule 19)
    added = {"unshard": 0.0, "unshard_bytes": 0.0, "a2a_forward": 0.0, "a2a_backward": 0.0, "first_compute": 0.0,
             "first_compute_tau": 0.0}
    new, old = json.loads((tmp_path / "new.json").read_text()), json.loads(OLD_COSTS_FILE)
    assert new == {"costs": {**old["costs"], **added}}
    assert list(new["costs"]) == list(old["costs"]) + list(added)


def test_every_costs_field_is_written_once_and_drives_the_rest():
    import dataclasses
    from sim.engine.fields import CALL_FIELDS, COST_FIELDS, PER_STAGE
    from sim.engine.transports import GlooCpu
    names = [f.name for f in COST_FIELDS]
    assert [f.name for f in dataclasses.fields(sim.Costs)] == names == [f.name for f in dataclasses.fields(sim.StageCosts)]
    assert all(getattr(sim.Costs(), f.name) == f.default for f in COST_FIELDS)
    assert GlooCpu.fields == CALL_FIELDS and set(CALL_FIELDS) <= set(names)
    expanded = sim.Costs(backward=[4.0, 6.0], activation_bytes=[3.0, 5.0]).for_stages(2)
    for f in COST_FIELDS:
        value = getattr(expanded, f.name)
        assert (isinstance(value, tuple) and len(value) == 2) == (f.name in PER_STAGE)
        if f.fallback:  # a field left at None takes factor x its fallback field
            field, factor = f.fallback
            assert value == tuple(factor * v for v in getattr(expanded, field))
        assert f.name in sim.Costs.__doc__


@pytest.mark.parametrize("field, value, message", [
    ("latency", -0.5, r"^Costs.latency must be a finite number >= 0, got -0.5$"),
    ("latency", math.inf, r"^Costs.latency must be a finite number >= 0, got inf$"),
    ("io_tick", math.nan, r"^Costs.io_tick must be a number >= 0 \(math.inf allowed\), got nan$"),
    ("bandwidth", 0, r"^Costs.bandwidth must be a number > 0 \(math.inf allowed\), got 0$"),
    ("before_compute", True, r"^Costs.before_compute must be a finite number >= 0, got True$"),
])
def test_costs_check_every_scalar_field_by_its_spec(field, value, message):
    with pytest.raises(ValueError, match=message):
        sim.Costs(**{field: value})


# ---------------------------------------------------------------- names: devices and micro_batches

def test_make_schedule_takes_devices_and_micro_batches_and_a_schedules_stages_are_model_stages():
    s = sim.make_schedule("interleaved-1f1b", devices=4, micro_batches=8, virtual=2)
    assert (s.ranks, s.stages, s.micro_batches) == (4, 8, 8)
    assert sim.make_schedule("interleaved-1f1b", 4, 8, 2).programs == s.programs  # positionally as before


def test_the_registry_holds_every_generator_once_zb_auto_added_from_above_the_engine():
    """`sim.schedule.registry` names the generators of `sim.schedule`; zb-auto, a search that
    simulates, adds itself from `sim.search.zbauto`, and a name is never taken twice."""
    from sim.schedule.registry import SCHEDULES, Generator
    from sim.search.zbauto import zb_auto
    assert sim.SCHEDULES is SCHEDULES and SCHEDULES["zb-auto"].make is zb_auto
    assert list(SCHEDULES)[:3] == ["naive", "gpipe", "1f1b"]
    with pytest.raises(ValueError, match=r"a schedule named 'ZB_Auto' is already registered"):
        SCHEDULES.add("ZB_Auto", Generator(zb_auto, "again"))


def test_the_old_keywords_are_gone_and_a_size_is_required():
    """`stages=` and `micro=` for devices and a count were renamed (docs/schedules.md, "Names")
    and the shim that took them is gone: Python itself refuses them."""
    with pytest.raises(TypeError, match=r"missing 2 required positional arguments: 'devices' and 'micro_batches'"):
        sim.make_schedule("1f1b", stages=4, micro=8)
    with pytest.raises(TypeError, match=r"missing 1 required positional argument: 'micro_batches'"):
        sim.make_schedule("1f1b", 4)


def test_a_schedule_counts_micro_batches_and_an_action_keeps_its_index():
    s = sim.make_schedule("gpipe", 2, 3)
    assert s.micro_batches == 3 and not hasattr(s, "micro")
    with pytest.raises(AttributeError):
        s.micro_batches = 4  # read-only, as every field of the frozen Schedule
    assert sorted({a.micro for a in s.programs[0]}) == [0, 1, 2]  # an action's micro is its index
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'micro'"):
        Schedule(s.programs, micro=3)
    assert Schedule(s.programs, micro_batches=3, name="gpipe") == s


# ---------------------------------------------------------------- refusals, reprs and one bubble

def test_simulate_refuses_a_schedule_name():
    with pytest.raises(TypeError, match=r"simulate needs a sim.Schedule, got str '1f1b'.*make_schedule\('1f1b'"):
        sim.simulate("1f1b", sim.Costs())
    with pytest.raises(TypeError, match="costs must be a sim.Costs, got dict"):
        sim.simulate(sim.make_schedule("1f1b", 2, 2), {"forward": 1})


def test_estimate_refuses_more_stages_than_layers_at_once():
    """Refused before any simulation (it took 15-31 s): the simulator is never called."""
    with counting_calls(sim.simulate) as calls:
        with pytest.raises(ValueError, match=r"^pp=200 = 200 stages is more than the model's 96 layers"):
            sim.estimate("gpt3-175b", "a100-80gb", tp=8, pp=200, global_batch=1536)
        with pytest.raises(ValueError, match=r"^pp=64 x V 2 = 128 stages"):
            sim.estimate("gpt3-175b", "a100-80gb", tp=8, pp=64, schedule="interleaved-1f1b", virtual=2)
    assert calls[sim.simulate] == 0


def test_trace_path_in_a_missing_folder_is_an_error_and_creates_nothing(tmp_path):
    r = sim.simulate(sim.make_schedule("1f1b", 2, 2), sim.Costs())
    with pytest.raises(FileNotFoundError, match="does not exist"):
        r.save_chrome_trace(tmp_path / "no" / "dir" / "x.json")
    assert not (tmp_path / "no").exists()
    with pytest.raises(IsADirectoryError, match=f"cannot write {tmp_path}: it is a directory"):
        r.save_chrome_trace(tmp_path)
    assert list(tmp_path.iterdir()) == []  # no temporary file left either


def test_reprs_are_readable():
    text = repr(sim.SCHEDULES)
    assert "Generator(" not in text and "function" not in text
    assert all(f"  {name} " in text for name in sim.SCHEDULES)
    assert len(text.splitlines()) == len(sim.SCHEDULES) + 1
    e = sim.estimate("gpt3-175b", "a100-80gb", tp=8, pp=8, dp=16, global_batch=1536)
    assert repr(e).startswith("<Estimate gpt3-175b on 1024 x a100-80gb") and "summary()" in repr(e)
    assert len(repr(e)) < 300


def test_one_bubble_per_planned_step():
    """The estimate's bubble is its step's pipeline bubble (to the last compute), and the
    figure's title says that number; the whole step's idle share is larger by the tail."""
    e = sim.estimate("gpt3-175b", "a100-80gb", tp=8, pp=8, dp=16, global_batch=1536)
    r = e.result
    assert e.bubble_fraction == pytest.approx(r.pipeline_bubble_fraction)
    assert r.makespan > r.compute_end - r.t0  # a gradient reduction runs after the last compute
    assert r.bubble_fraction > r.pipeline_bubble_fraction
    from sim.plot.gantt import plot_result
    fig = plot_result(r)
    assert f"pipeline bubble {e.bubble_fraction:.1%}" in fig._suptitle.get_text()
    assert r.in_seconds and fig.axes[-1].get_xlabel() == "time (s)"
