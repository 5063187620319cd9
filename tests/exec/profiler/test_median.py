"""The median of several profiles (exec.profiler.median) and of several rounds of the plan-vs-run grid (exec.measure.plan_vs_run.median_runs): closed forms, a property over random scalings, real profiles of this project's VM, and refusals. No timing assertions."""
from __future__ import annotations

import copy
import json
import statistics
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from sim.hardware.profile import from_dict
from exec.profiler.median import median_profile, median_rows

ROOT = Path(__file__).resolve().parents[3]
LOOP = ROOT / "data" / "cpu-loop"
PROFILES = [json.loads((LOOP / f"profile-{s}.json").read_text()) for s in ("s4", "s5", "s6")]


def _values(node, path=""):
    """(path, number) of every measured or derived number, table cell and point time."""
    if isinstance(node, dict):
        if isinstance(node.get("value"), (int, float)) and not isinstance(node["value"], bool):
            yield path, node["value"]
        for k, v in node.items():
            if k == "rows":
                for i, r in enumerate(v):
                    yield from ((f"{path}.rows[{i}][{j}]", x) for j, x in enumerate(r) if isinstance(x, float))
            elif k == "points":
                yield from ((f"{path}.points[{i}]", p[1]) for i, p in enumerate(v))
            elif isinstance(v, dict):
                yield from _values(v, f"{path}.{k}")


def _scaled(profile: dict, f: float) -> dict:
    """`profile` with every number `_values` yields times f."""
    p = copy.deepcopy(profile)

    def walk(node):
        if isinstance(node, dict):
            if isinstance(node.get("value"), float):
                node["value"] *= f
            for k, v in node.items():
                if k == "rows":
                    node[k] = [[x * f if isinstance(x, float) else x for x in r] for r in v]
                elif k == "points":
                    node[k] = [[b, t * f] for b, t in v]
                elif isinstance(v, dict):
                    walk(v)
    walk(p)
    return p


@settings(max_examples=20, deadline=None)
@given(st.lists(st.floats(0.5, 2.0), min_size=2, max_size=5))
def test_a_uniform_scaling_passes_through_the_median(factors):
    """Profiles that are one profile scaled, each by its own factor: their median is that
    profile scaled by the median factor, number by number."""
    base = PROFILES[0]
    got = dict(_values(median_profile([_scaled(base, f) for f in factors])))
    want = dict(_values(_scaled(base, statistics.median(factors))))
    assert got.keys() == want.keys()
    for k, v in want.items():
        assert got[k] == pytest.approx(v, rel=1e-12), k


def test_the_median_of_three_real_profiles_is_their_middle_value_and_loads():
    med = median_profile(PROFILES)
    each = [dict(_values(p)) for p in PROFILES]
    for k, v in _values(med):
        if all(k in e for e in each):
            assert v == pytest.approx(sorted(e[k] for e in each)[1]), k
    profile = from_dict(med)
    assert len(profile.layers.blocks) == len(from_dict(PROFILES[0]).layers.blocks)
    assert [m["name"] for m in med["median_of"]] == [p["name"] for p in PROFILES]
    assert med["layers"]["blocks"]["how"].endswith("the median of 3 profiles")


def test_a_fits_residual_is_the_median_of_the_profiles_too():
    """A fitted number keeps the residual of its fit (rules 19 and 20: `first_compute`'s law,
    AdamW's cost per tensor inside a step); the median profile's residual is the median of
    theirs, its value the median of theirs, not the first profile's."""
    profiles = [copy.deepcopy(PROFILES[0]) for _ in range(3)]
    for p, (value, rms) in zip(profiles, [(3.0, 0.5), (1.0, 0.1), (2.0, 0.9)]):
        p["step_overhead"] |= {"value": value, "rms_residual": rms, "points": 24}
    got = median_profile(profiles)["step_overhead"]
    assert (got["value"], got["rms_residual"], got["points"]) == (2.0, 0.5, 24)


def test_rows_merge_by_their_key_and_a_row_one_table_lacks_is_kept():
    a = [["fp32", 64, "none", 1.0, 10.0], ["fp32", 128, "none", 2.0, 20.0]]
    b = [["fp32", 64, "none", 3.0, 30.0]]
    c = [["fp32", 64, "none", 2.0, 50.0], ["fp32", 256, "full", 7.0, 70.0]]
    assert median_rows([a, b, c]) == [["fp32", 64, "none", 2.0, 30.0], ["fp32", 128, "none", 2.0, 20.0],
                                      ["fp32", 256, "full", 7.0, 70.0]]


def test_profiles_of_other_machines_or_too_few_are_refused():
    other = copy.deepcopy(PROFILES[1])
    other["fingerprint"]["threads"] = 7
    with pytest.raises(ValueError, match="fingerprint.threads differs"):
        median_profile([PROFILES[0], other])
    with pytest.raises(ValueError, match="at least two"):
        median_profile(PROFILES[:1])


def test_the_cli_writes_the_median_and_refuses_in_one_line(tmp_path, capsys):
    pd = pytest.importorskip("exec.profile_device")
    out = tmp_path / "med.json"
    paths = [str(LOOP / f"profile-{s}.json") for s in ("s4", "s5", "s6")]
    assert pd.main(["--out", str(out), *(a for p in paths for a in ("--median-of", p))]) == 0
    assert json.loads(out.read_text())["layers"] == median_profile(PROFILES)["layers"]
    capsys.readouterr()
    for argv in (["--median-of", paths[0]], ["--median-of", paths[0], "--median-of", str(tmp_path / "none.json")]):
        with pytest.raises(SystemExit) as e:
            pd.main(["--out", str(tmp_path / "x.json"), *argv])
        assert e.value.code == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith("exec.profile_device:")
    assert pd.run_path(Path("/a/cpu.json"), 2) == Path("/a/cpu.run2.json")


from exec.measure import plan_report as report  # noqa: E402
from exec.measure import plan_vs_run as pvr  # noqa: E402


def _run(measured: float, predicted: float = 1.0, model=None, schedule="1f1b") -> dict:
    return {"model": dict(model or pvr.MODEL), "case": pvr.Case(schedule, 4, "none", 1),
            "measured_s": measured, "predicted_s": predicted, "drift": 1.0, "error_pct": 0.0}


def test_median_runs_keep_the_middle_round_and_its_error():
    rounds = [[_run(1.0), _run(2.0, schedule="gpipe")], [_run(1.5), _run(1.0, schedule="gpipe")],
              [_run(1.2), _run(4.0, schedule="gpipe")]]
    got = pvr.median_runs(rounds)
    assert [r["measured_s"] for r in got] == [1.2, 2.0]
    assert got[0]["error_pct"] == pytest.approx((1 / 1.2 - 1) * 100)
    assert got[1]["round_steps_s"] == [2.0, 1.0, 4.0]
    assert [r["case"].schedule for r in got] == ["1f1b", "gpipe"]
    two = pvr.median_runs(rounds[:2])  # an even count: the mean of the middle two, the nearer run's details
    assert two[0]["measured_s"] == pytest.approx(1.25)


def _round(speed: float, shape_speed: float | None = None) -> list[dict]:
    """One round of a one-case grid: the profiled shape, another, the profiled shape again,
    each predicted right (1.0 s and 0.5 s; the other shape measured at 0.5 / 1.1 s, an
    error of +10 %) on a machine `speed` times slower (the other shape's run `shape_speed`
    times, where its minute differed)."""
    runs = [(pvr.MODEL, 1.0, 1.0, speed), (pvr.SHAPES[0], 0.5, 0.5 / 1.1, shape_speed or speed),
            (pvr.MODEL, 1.0, 1.0, speed)]
    return [_run(m * f, p) | {"model": dict(model), "error_pct": (p / (m * f) - 1) * 100} for model, p, m, f in runs]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0.7, 1.8), min_size=1, max_size=5))
def test_median_runs_pair_each_round_before_the_median(speeds):
    """Whatever speed each round's minute ran at, a shape paired with the profiled runs of its
    own round keeps its own error (+10 %), and so does the median over the rounds; its raw
    error moves with the machine."""
    got = pvr.median_runs([_round(f) for f in speeds])
    (other,) = pvr.paired(got)
    assert other["paired_error_pct"] == pytest.approx(10.0)
    assert other["round_paired_pct"] == pytest.approx([10.0] * len(speeds))
    assert other["error_pct"] == pytest.approx((1.1 / statistics.median(speeds) - 1) * 100)


def test_median_runs_outvote_a_round_whose_pair_did_not_cancel():
    """Three rounds at three speeds; in the slowest the other shape's run alone fell in a
    fast minute: its paired error is off in that round only, and the median of the rounds'
    paired errors is the shape's own (+10 %). Pairing the rounds' medians instead sets the
    shape's median round against the profiled shape's, which ran in another minute."""
    rounds = [_round(1.0), _round(1.3), _round(1.6, shape_speed=1.0)]
    got = pvr.median_runs(rounds)
    (other,) = pvr.paired(got)
    assert other["round_paired_pct"] == pytest.approx([10.0, 10.0, (1.1 * 1.6 - 1) * 100])
    assert other["paired_error_pct"] == pytest.approx(10.0)
    (of_medians,) = pvr.paired([{k: v for k, v in r.items() if not k.startswith("paired_")} for r in got])
    assert of_medians["paired_error_pct"] == pytest.approx((1.1 * 1.3 - 1) * 100)


def test_median_runs_refuse_rounds_of_different_grids():
    with pytest.raises(ValueError, match="different grids"):
        pvr.median_runs([[_run(1.0)], [_run(1.0), _run(2.0)]])
    with pytest.raises(ValueError, match="different grids"):
        pvr.median_runs([[_run(1.0)], [_run(1.0, schedule="gpipe")]])


def test_the_summary_reads_rounds_from_one_file_or_several(tmp_path):
    rows = [_run(1.0) | {"round": 0}, _run(3.0) | {"round": 1}]
    for r in rows:
        r["case"] = vars(r["case"])
    one = tmp_path / "g.json"
    one.write_text(json.dumps(rows))
    assert [len(r) for r in pvr.read_rounds([one])] == [1, 1]
    single = tmp_path / "h.json"
    single.write_text(json.dumps([{k: v for k, v in rows[0].items() if k != "round"}]))
    rounds = pvr.read_rounds([one, single])
    assert len(rounds) == 3 and pvr.median_runs(rounds)[0]["measured_s"] == 1.0


def test_the_bench_runs_rounds_and_reads_each_case_by_its_median(tmp_path, capsys, monkeypatch):
    """--rounds 3 runs the grid three times (each row its round), prints the summary of the
    cases' medians, and --summary of the file it wrote reads the same medians; --rounds 0 is
    refused in one line."""
    from sim.hardware.profile import profile, save_profile
    path, out = tmp_path / "p.json", tmp_path / "grid.json"
    save_profile(profile("a100-80gb-best-case"), path)
    assert report.main(["--profile", str(path), "--rounds", "0"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    steps = iter([1.0, 2.0, 3.0, 6.0, 2.0, 4.0])  # round by round: the profiled shape, then the other
    other = dict(layers=4, hidden=64, heads=2, seq=32, vocab=256)
    monkeypatch.setattr(report, "reference", lambda: 1.0)
    monkeypatch.setattr(report, "grid", lambda *a: [(dict(pvr.MODEL), pvr.Case("1f1b", 4, "none", 1)),
                                                   (other, pvr.Case("1f1b", 4, "none", 1))])

    def compare(profile, case, model, steps_, warmup, drift):
        m = next(steps)
        return {"case": case, "model": dict(model), "measured_s": m, "predicted_s": 2.0, "drift": drift,
                "error_pct": (2.0 / m - 1) * 100, "scaled_error_pct": 0.0, "memory_error_pct": 0.0, "spread": 0.0,
                "kind_error_pct": {}, "lost_share": 0.0, "load": "", "measured_memory": [1]}
    monkeypatch.setattr(report, "compare", compare)
    monkeypatch.setattr(report, "row", lambda r: "")
    assert report.main(["--profile", str(path), "--rounds", "3", "--json", str(out)]) == 0
    assert "the median of its 3 rounds" in capsys.readouterr().out
    rows = json.loads(out.read_text())
    assert [r["round"] for r in rows] == [0, 0, 1, 1, 2, 2]
    medians = pvr.median_runs(pvr.read_rounds([out]))
    assert [r["measured_s"] for r in medians] == [2.0, 4.0]
    assert [r["error_pct"] for r in medians] == [0.0, -50.0]
    assert report.main(["--summary", str(out)]) == 0
