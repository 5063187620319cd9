"""The search over FSDP with pipelines (zero=3, pp > 1, FSDP2's reshard_after_forward) and in
FP8: what it proposes simulates, its bounds stay below the estimates, and FP8 is refused in one
line where the profile does not time it."""
from __future__ import annotations

import dataclasses

import pytest

import sim
from sim.plan import bounds as plan_bounds, planner, space
from sim.plan.cli import format_report, main

SMALL = dict(model="megatron-1.7b", gpu="a100-40gb", gpus=8, global_batch=32)
LIMITS = dict(schedules=["1f1b", "interleaved-1f1b", "zbv"], recompute=["none", "full"], max_micro_batch=2)


def _estimate(plan, config):
    return sim.estimate(plan.model, plan.profile, **config.changed(precision=plan.precision).keywords())


def test_fsdp_with_pipelines_is_enumerated_with_reshard_on_and_off_where_a_device_holds_several_stages():
    m = sim.MODELS[SMALL["model"]]
    configs = space.configurations(m, 8, 32, zero=[3], **LIMITS)
    fsdp = [c for c in configs if c.zero == 3 and c.pp > 1]
    assert fsdp and all(c.dp * c.cp > 1 for c in fsdp)
    for c in fsdp:
        twin = dataclasses.replace(c, reshard_after_forward=not c.reshard_after_forward)
        assert (twin in configs) == (c.virtual > 1)  # one stage a device: held throughout either way
    assert not any(c.zero == 2 and c.pp > 1 for c in space.configurations(m, 8, 32, zero=[2], **LIMITS))


def test_the_search_proposes_fsdp_with_pipelines_that_simulate_as_sim_estimate_says():
    plan = planner.search(**SMALL, zero=3, pp=[2, 4], top=6, **LIMITS)
    assert len(plan) == 6
    for row in plan:
        c = row.config
        assert c.zero == 3 and c.pp > 1
        e = _estimate(plan, c)
        assert e.step_time == row.step_time and max(e.peak_memory) == row.peak_memory and e.fits
        assert any(ev.action.kind is sim.Kind.UNSHARD for ev in e.result.events)  # FSDP's gathers, as actions
        assert e.summary()["reshard_after_forward"] == c.reshard_after_forward


def test_bounds_stay_below_the_estimate_of_every_fsdp_configuration():
    """Every zero=3, pp > 1 configuration of a small space (interleaved chunks, V-shapes, reshard
    on and off): the memory bound (the shard, whole gradients, the smallest stage gathered) and
    each step-time bound (FSDP's reduce-scatters overlapped, each stage's first forward after
    its gather) at most what the simulated step says."""
    m = sim.MODELS[SMALL["model"]]
    b = plan_bounds.Bounds(m, sim.profile(SMALL["gpu"]))
    configs = [c for c in space.configurations(m, 8, 32, zero=[3], **LIMITS) if c.pp > 1]
    assert any(c.virtual > 1 and not c.reshard_after_forward for c in configs)
    for c in configs:
        e = sim.estimate(m, SMALL["gpu"], **c.keywords())
        assert b.memory_average(c) <= b.memory(c) <= max(e.peak_memory) * (1 + 1e-9), c
        assert b.average(c) <= b.time(c) <= b.schedule_time(c) <= e.step_time * (1 + 1e-9), c


def test_the_report_names_fsdp_kept_gathered(capsys):
    plan = planner.search(**SMALL, zero=3, pp=2, schedules=["interleaved-1f1b"], virtual=2,
                          reshard_after_forward=False, recompute="none", top=2)
    assert plan.rows and all(not r.config.reshard_after_forward for r in plan)
    report = format_report(plan)
    assert " 3 keep " in report and "reshard_after_forward off" in report
    assert main(["--model", SMALL["model"], "--gpu", SMALL["gpu"], "--gpus", "8", "--global-batch", "32", "--zero", "3",
                 "--pp", "2", "--schedules", "interleaved-1f1b", "--virtual", "2", "--recompute", "none",
                 "--reshard-after-forward", "off", "--top", "2", "--no-figures", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert out.count(" 3 keep ") == 2 and "reshard_after_forward off" in out  # the same two rows, by the CLI


def test_an_fp8_search_searches_fp8_layouts_faster_than_bf16_ones():
    kw = dict(model="llama3-8b", gpu="h100-80gb", gpus=8, global_batch=16, top=3, schedules=["1f1b"])
    fp8, bf16 = (planner.search(**kw, precision=p) for p in ("fp8", "bf16"))
    assert fp8.precision == fp8.summary()["precision"] == "fp8" and bf16.precision == "bf16"
    b = plan_bounds.Bounds(fp8.model, fp8.profile)
    for row in fp8:
        assert b.memory(row.config) <= row.peak_memory and b.schedule_time(row.config) <= row.step_time * (1 + 1e-9)
        assert row.estimate.layout.precision == "fp8" and row.estimate.summary()["precision"] == "fp8"
        assert _estimate(fp8, row.config).step_time == row.step_time
        assert row.step_time < _estimate(bf16, row.config).step_time  # the Linears' GEMMs at the FP8 rate
    assert fp8.best.step_time < bf16.best.step_time


def test_fp8_is_refused_before_any_work_where_the_profile_does_not_time_it(capsys):
    with pytest.raises(ValueError, match="a100-80gb has no FP8 tensor cores"):
        planner.search("llama3-8b", "a100-80gb", 8, 16, precision="fp8")
    h100 = sim.profile("h100-80gb")
    untimed = dataclasses.replace(h100, name="h100-no-fp8", fp8_efficiency=None,
                                  matmul_rows=tuple(r for r in h100.matmul_rows if r[0] != "fp8"))
    with pytest.raises(ValueError, match="profile 'h100-no-fp8' has no matmul.fp8_efficiency"):
        planner.search("llama3-8b", untimed, 8, 16, precision="fp8", progress=lambda *_: pytest.fail("worked"))
    with pytest.raises(SystemExit) as stop:
        main(["--model", "llama3-8b", "--gpu", "a100-80gb", "--gpus", "8", "--global-batch", "16",
              "--precision", "fp8", "--no-figures", "--quiet"])
    out, err = capsys.readouterr()
    assert stop.value.code == 2 and not out and len(err.strip().splitlines()) == 1
    assert err.startswith("sim.plan: error: precision 'fp8': a100-80gb has no FP8 tensor cores")
