"""A device profile's host transport (sim.hardware.host_transport, docs/profiles.md): it round-trips and is refused
when malformed; the planner's costs under it are the ideal ones with exactly its six fields and the gloo-cpu
transport, its step no shorter, and the same as a direct simulation of the same schedule and costs."""
import dataclasses

import pytest

import sim
from sim.engine.fields import CALL_FIELDS
from sim.engine.transports import TRANSPORTS
from sim.hardware.host_transport import FIELDS, NAMES, OPTIONAL
from sim.hardware.profile import ProfileError, from_dict, load_profile, presets, save_profile
from sim.cost.layer import Slice, layer_times
from sim.plan.layout import Layout
from sim.cost.ends import end_times
from sim.plan.stage_costs import stage_costs

SOURCE = {"source": "measured", "command": "python -m exec.profile_device --out x.json", "machine": "test host",
          "date": "2026-11-24"}
HOST = dict(send_overhead=2e-5, recv_overhead=5e-6, arrive_overhead=1e-5, io_tick=4e-3, before_compute=3e-5,
            after_compute=2e-5)
MODEL = sim.Transformer(layers=4, hidden=128, heads=4, seq=64, vocab=512)


def _with_host(host=HOST, name="gloo-cpu") -> dict:
    data = sim.profile("a100-80gb-best-case").to_dict()
    data["host_transport"] = {"name": name, **{k: {"value": v, **SOURCE} for k, v in host.items()}}
    return data


def test_the_sections_names_are_the_engines():
    """Hardware imports nothing of the engine, so it spells the fields itself: they must be the
    engine's call costs (rules 2, 3, 9, 10) and the runtime's time around a compute (rule 11),
    and the transports it names the engine's."""
    assert FIELDS == (*CALL_FIELDS, "before_compute", "after_compute")
    assert OPTIONAL == ("first_compute", "first_compute_tau")  # rule 19
    assert set(NAMES) <= set(TRANSPORTS)
    assert set(FIELDS) | set(OPTIONAL) <= {f.name for f in dataclasses.fields(sim.Costs)}


def test_shipped_profiles_have_no_host_transport():
    assert all(sim.profile(n).host_transport is None for n in presets())


def test_the_section_round_trips(tmp_path):
    p = from_dict(_with_host())
    assert p.host_transport == {"transport": "gloo-cpu", **HOST}
    save_profile(p, tmp_path / "p.json")
    assert load_profile(tmp_path / "p.json").host_transport == p.host_transport
    assert p.source("host_transport.io_tick") == SOURCE


def test_first_compute_is_optional_and_reaches_the_steps_first_computes(tmp_path):
    """Rule 19: a profile may give `first_compute`; one from before it has none, and its
    steps get none. Where given it round-trips, and the planner's step grows by at least
    it and at most once per rank."""
    p = from_dict(_with_host({**HOST, "first_compute": 4e-4}))
    assert p.host_transport == {"transport": "gloo-cpu", **HOST, "first_compute": 4e-4}
    save_profile(p, tmp_path / "p.json")
    assert load_profile(tmp_path / "p.json").host_transport == p.host_transport
    kw = dict(pp=2, micro_batch=1, global_batch=8, precision="fp32")
    without = sim.estimate(MODEL, gpu=from_dict(_with_host()), **kw).step_time
    assert without + 4e-4 - 1e-12 <= sim.estimate(MODEL, gpu=p, **kw).step_time <= without + 2 * 4e-4 + 1e-12
    # with its recovery time the first compute takes less of it, the less the shorter it is than tau
    fast = from_dict(_with_host({**HOST, "first_compute": 4e-4, "first_compute_tau": 1e-6}))
    slow = from_dict(_with_host({**HOST, "first_compute": 4e-4, "first_compute_tau": 1.0}))
    assert fast.host_transport["first_compute_tau"] == 1e-6
    t_fast, t_slow = (sim.estimate(MODEL, gpu=q, **kw).step_time for q in (fast, slow))
    assert t_fast == pytest.approx(sim.estimate(MODEL, gpu=p, **kw).step_time, rel=1e-12)
    assert without < t_slow < without + 4e-4


@pytest.mark.parametrize("edit, message", [
    (lambda h: h.update(name="nccl"), "host_transport.name must be one of gloo-cpu"),
    (lambda h: h.pop("name"), "host_transport.name must be one of gloo-cpu"),
    (lambda h: h.update(extra={"value": 1.0, **SOURCE}), "unknown fields extra"),
    (lambda h: h.pop("io_tick"), "missing 'host_transport.io_tick'"),
    (lambda h: h["send_overhead"].update(value=-1e-6), "'host_transport.send_overhead' value must be a non-negative"),
    (lambda h: h["after_compute"].pop("source"), "'host_transport.after_compute' needs a source"),
    (lambda h: h["recv_overhead"].pop("machine"), "is measured but says no machine"),
])
def test_a_malformed_section_is_refused_in_one_line(edit, message):
    data = _with_host()
    edit(data["host_transport"])
    with pytest.raises(ProfileError, match=message) as e:
        from_dict(data, "p.json")
    assert str(e.value).startswith("p.json: ") and "\n" not in str(e.value)


def _costs(g, lay: Layout, sched):
    """`stage_costs` as `sim.plan.estimation.estimate_layout` calls it (even partition)."""
    x = Slice(lay.micro_batch, lay.tp, lay.sequence_parallel, lay.precision, tp_group=lay.topology().group("tp"))
    layers = [MODEL.layers // sched.stages] * sched.stages
    return stage_costs(MODEL, g, lay, x, layer_times(MODEL, g, x, lay.recompute, lay.tp_overlap),
                       end_times(MODEL, g, x), layers, sched.placement)[0]


@pytest.mark.parametrize("schedule, virtual", [("1f1b", None), ("gpipe", None), ("zb-h1", None),
                                               ("interleaved-1f1b", 2)])
def test_the_planner_runs_the_host_transport(schedule, virtual):
    ideal, host = sim.profile("a100-80gb-best-case"), from_dict(_with_host())
    kw = dict(pp=2, micro_batch=1, global_batch=8, schedule=schedule, virtual=virtual, precision="fp32")
    e_ideal, e_host = (sim.estimate(MODEL, gpu=g, **kw) for g in (ideal, host))
    assert e_host.step_time >= e_ideal.step_time
    assert e_host.step_time > e_ideal.step_time  # 8 micro-batches of sends: the calls cost something
    lay = Layout(pp=2, micro_batch=1, global_batch=8, schedule=schedule, virtual=virtual, precision="fp32")
    sched = e_host.result.schedule
    want = dataclasses.replace(_costs(ideal, lay, sched), transport="gloo-cpu", **HOST)
    assert _costs(host, lay, sched) == want
    assert sim.simulate(sched, want).makespan == e_host.result.makespan


def test_zero_host_costs_are_the_plain_rendezvous():
    """All six at 0: the gloo-cpu transport's rendezvous, which never lets data leave before the ideal's."""
    zero = from_dict(_with_host({k: 0.0 for k in HOST}))
    kw = dict(pp=2, micro_batch=1, global_batch=8, precision="fp32")
    assert sim.estimate(MODEL, gpu=zero, **kw).step_time >= sim.estimate(MODEL, gpu="a100-80gb-best-case",
                                                                          **kw).step_time
