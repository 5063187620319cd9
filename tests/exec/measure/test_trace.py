"""exec.measure.trace: a torch.profiler trace read back onto the schedule's actions (a real one recorded here on gloo, and edited copies of it), a missing action reported, and exec.run --trace writing one."""
import ast
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

import sim
from sim import Action
from exec.measure import trace as trace_mod
from exec.measure.trace import read_trace, spans_of

DATA = Path(__file__).parent / "data" / "exec_1f1b_p2_m2.trace.json"
SCHEDULE = sim.make_schedule("1f1b", 2, 2)


def _edited(tmp_path, edit):
    data = json.loads(DATA.read_text())
    data["traceEvents"] = edit(data["traceEvents"])
    path = tmp_path / "edited.trace.json"
    path.write_text(json.dumps(data))
    return path


def test_a_real_trace_maps_every_action_onto_its_rank_in_program_order():
    match = read_trace(DATA, SCHEDULE)
    assert match.ok and match.missing == [] and match.misplaced == [] and match.extra == []
    assert match.steps == 1 and match.ignored > 0  # torch's ops and gloo's calls are no actions
    for r, prog in enumerate(SCHEDULE.programs):
        events = match.measured.compute_events(r)
        assert [e.action for e in events] == list(prog)  # a rank runs its program in order
        assert all(a.end <= b.start for a, b in zip(events, events[1:]))  # one at a time
    assert match.measured.in_seconds and 0 < match.measured.makespan < 60


def test_a_missing_action_is_reported(tmp_path):
    path = _edited(tmp_path, lambda evs: [e for e in evs if e.get("name") != "1B1"])
    match = read_trace(path, SCHEDULE)
    assert match.missing == [Action.parse("1B1")] and not match.ok
    assert "missing from the trace: 1B1" in match.table(sim.simulate(SCHEDULE))
    assert Action.parse("1B1") not in {d[0] for d in match.differences(sim.simulate(SCHEDULE))}


def test_a_span_on_the_wrong_rank_and_one_the_schedule_lacks(tmp_path):
    def edit(evs):
        for e in evs:
            if e.get("name") == "0F0":
                e["pid"] = 1
        extra = dict(next(e for e in evs if e.get("name") == "1F0"), name="PP:5F0")
        return evs + [extra]
    match = read_trace(_edited(tmp_path, edit), SCHEDULE)
    assert match.misplaced == [(Action.parse("0F0"), 1, 0)] and not match.ok
    assert match.extra == ["PP:5F0"] and match.missing == []


def test_several_steps_pick_one(tmp_path):
    def edit(evs):
        later = [dict(e, ts=e["ts"] + 1e7) for e in evs if e.get("ph") == "X"]
        return evs + later
    path = _edited(tmp_path, edit)
    first, last = read_trace(path, SCHEDULE, step=0), read_trace(path, SCHEDULE)
    assert first.steps == last.steps == 2
    assert last.measured.t0 == pytest.approx(first.measured.t0 + 10.0)
    assert last.measured.makespan == pytest.approx(first.measured.makespan)


def test_span_names_torch_writes():
    assert spans_of("PP:2F0") == [Action.parse("2F0")]
    assert spans_of("PP:(0F3;3B1)OVERLAP_F_B") == [Action.parse("0F3"), Action.parse("3B1")]
    assert spans_of("aten::mm") == [] and spans_of("gloo:send") == [] and spans_of("x12F0") == []
    assert spans_of("0SEND_F1") == [Action.parse("0SEND_F1")]


def test_torch_single_stage_spans_with_a_rank_per_file(tmp_path):
    # torch's PipelineScheduleSingle names spans "Forward i" / "Backward i"; its per-rank
    # files say the rank in distributedInfo
    paths = []
    for r in range(2):
        events = [{"ph": "X", "name": f"{w} {m}", "ts": 10.0 * k + r, "dur": 5.0, "pid": 7, "tid": 7}
                  for k, (w, m) in enumerate([("Forward", 0), ("Forward", 1), ("Backward", 0), ("Backward", 1)])]
        paths.append(tmp_path / f"rank{r}.json")
        paths[-1].write_text(json.dumps({"traceEvents": events, "distributedInfo": {"rank": r}}))
    match = read_trace(paths, sim.make_schedule("gpipe", 2, 2))
    assert match.ok and len(match.found) == 8


def test_the_overlay_draws_measured_over_simulated():
    match = read_trace(DATA, SCHEDULE)
    fig = match.overlay(sim.simulate(SCHEDULE, sim.Costs(forward=0.01, backward=0.02)))
    gids = [p.get_gid() for ax in fig.axes for p in ax.patches if (p.get_gid() or "").startswith("compute ")]
    assert sorted(gids) == sorted([f"compute {a}" for p in SCHEDULE.programs for a in p] * 2)


def test_not_a_trace_is_a_value_error_naming_the_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{\"nothing\": 1}")
    with pytest.raises(ValueError, match="bad.json: not a Chrome trace"):
        read_trace(bad, SCHEDULE)
    with pytest.raises(ValueError, match="cannot read a trace"):
        read_trace(tmp_path / "none.json", SCHEDULE)


def test_the_reader_imports_no_torch_at_module_level():
    tree = ast.parse(Path(trace_mod.__file__).read_text())
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    names = [a.name for n in top for a in n.names] + [n.module or "" for n in top if isinstance(n, ast.ImportFrom)]
    assert not any(name.split(".")[0] == "torch" for name in names)


def test_run_refuses_a_trace_in_a_missing_folder(capsys):
    from exec.run import main
    with pytest.raises(SystemExit) as e:
        main(["--trace", "/no/such/folder/t.json", "--no-compare"])
    assert e.value.code == 2
    assert "--trace" in capsys.readouterr().err


def test_run_refuses_a_trace_with_data_parallelism(tmp_path, capsys):
    from exec.run import main
    with pytest.raises(SystemExit) as e:
        main(["--trace", str(tmp_path / "t.json"), "--dp", "2", "--no-compare"])
    assert e.value.code == 2 and "dp=1" in capsys.readouterr().err


@pytest.mark.slow
def test_exec_run_writes_a_trace_that_maps_onto_its_schedule(tmp_path):
    from exec.run import main
    path = tmp_path / "gpipe.trace.json"
    assert main(["--schedule", "gpipe", "--devices", "2", "--micro-batches", "3", "--layers", "2", "--hidden", "8",
                 "--seq", "4", "--batch-size", "6", "--steps", "1", "--warmup", "0", "--no-compare", "--quiet",
                 "--trace", str(path)]) == 0
    schedule = sim.make_schedule("gpipe", 2, 3)
    match = read_trace(path, schedule)
    assert match.ok and match.steps == 1
    for r, prog in enumerate(schedule.programs):
        assert [e.action for e in match.measured.compute_events(r)] == list(prog)
    assert not list(tmp_path.glob("*.rank*.json"))  # the parts are merged and gone


@pytest.mark.slow
def test_a_hand_written_schedule_runs_checked_and_traced(tmp_path):
    # 1F1B written by hand (the order sim.make_schedule('1f1b', 2, 3) has), run as a Schedule, not by name
    text = "0F0 0F1 0B0 0F2 0B1 0B2\n1F0 1B0 1F1 1B1 1F2 1B2"
    schedule = sim.check_schedule(text, max_held=2).checked()
    from exec import ModelSpec, RunConfig, run_pipeline
    path = tmp_path / "mine.trace.json"
    run = run_pipeline(ModelSpec(layers=2, hidden=8, seq=4, batch_size=6), schedule,
                       config=RunConfig(steps=1, warmup=0, optimizer="sgd", trace=str(path)))
    assert run.grad_match and run.loss_match
    assert run.result.peak_activations == [2, 1]
    match = read_trace(path, schedule)
    assert match.ok and [e.action for e in match.measured.compute_events(0)] == list(schedule.programs[0])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zbv", "dualpipev"]),
       devices=st.integers(1, 3), micro=st.integers(1, 6))
def test_the_simulators_own_trace_reads_back_as_its_step(tmp_path, name, devices, micro):
    # sim.Result.save_chrome_trace names each span as the action (`2F0`): read back, every
    # compute is there with the simulated start and duration (its times in microseconds)
    try:
        schedule = sim.make_schedule(name, devices, micro)
    except sim.ScheduleError:
        assume(False)
    simulated = sim.simulate(schedule, sim.Costs(forward=1.0, backward=2.5, latency=0.3))
    path = tmp_path / f"{name}_{devices}_{micro}.json"
    simulated.save_chrome_trace(path)
    match = read_trace(path, schedule)
    assert match.ok and match.extra == []
    for a, rank, ms, md, ss, sd in match.differences(simulated):
        assert rank == schedule.rank_of(a.stage)
        assert ms == pytest.approx(ss, abs=1e-9) and md == pytest.approx(sd, abs=1e-9)
    assert len(match.differences(simulated)) == sum(a.kind.is_compute for p in schedule.programs for a in p)
