"""Device profiles (sim.hardware.profile, docs/profiles.md): the shipped presets load with every
number's provenance, profiles round-trip through JSON, each malformed profile is refused in one
line naming the file and field, the table lookups follow their closed forms, the host's launch
floor is a max or a sum as the profile says, and the planner takes a loaded profile."""
import copy
import dataclasses
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sim
import sim.plan
from sim.hardware.profile import DEFAULT_PROFILES, SOURCES, from_dict, presets
from sim.hardware.kernels import gemm_time

TINY = sim.Transformer(layers=2, hidden=64, heads=2, seq=128, vocab=512)
FIXTURE = {"source": "datasheet", "citation": "test fixture: a round made-up number"}


def _num(value):
    return {"value": value, **FIXTURE}


def _base() -> dict:
    """The A100 80GB best-case preset's JSON: sourced numbers, no tables."""
    return sim.profile("a100-80gb-best-case").to_dict()


def _cpu_profile() -> dict:
    """A CPU-like profile with an inline datasheet: fp32 only, no network link, launch added."""
    return {
        "schema": "pipeline-workbench/device-profile/1", "name": "test-cpu", "description": "a test CPU",
        "datasheet": {"name": "test-cpu", "memory": _num(64 * 2**30), "peak_flops": {"fp32": _num(1e12)},
                      "hbm_bandwidth": _num(1e11), "sms": _num(16)},
        "stack": {"name": "test", "description": "a test stack", "attention_kernel": "measured", "elementwise": "eager"},
        "fingerprint": {"device": "test cpu", "backend": "gloo", "date": "2026-11-24"},
        "matmul": {"efficiency": _num(0.5)},
        "memory_bound": {"bandwidth": _num(5e10)},
        "collectives": {"node": {"bus_bandwidth": _num(1e10), "hop_latency": _num(1e-5),
                                 "base_latency": _num(2e-5)}},
        "p2p": {"node": {"bandwidth": _num(1e10), "latency": _num(1e-5)}},
        "launch": {"per_kernel": _num(1e-5), "host_runs_ahead": False},
        "step_overhead": _num(1e-3),
    }


def _numbers(node, path=""):
    """(dotted path, node) of every sourced number and table in a profile's JSON."""
    if isinstance(node, dict):
        if "value" in node or "rows" in node:
            yield path, node
            return
        for k, v in node.items():
            if k not in ("fingerprint", "schema", "name", "description"):
                yield from _numbers(v, f"{path}.{k}" if path else k)


# ---------------------------------------------------------------------------- presets and JSON

@pytest.mark.parametrize("name", presets())
def test_preset_loads_with_provenance(name):
    """Every shipped profile loads, and every number and table in it carries its source's keys."""
    p = sim.profile(name)
    found = list(_numbers(p.to_dict()))
    assert len(found) >= 10  # matmul, memory, node collectives and p2p, launch, step overhead at least
    for path, node in found:
        assert node["source"] in SOURCES, path
        for key in SOURCES[node["source"]]:
            assert node.get(key) not in (None, ""), (path, key)
        assert p.source(path)["source"] == node["source"]


def test_every_gpu_has_a_default_profile():
    for gpu, name in DEFAULT_PROFILES.items():
        assert gpu in sim.GPUS and name in presets()
        assert sim.profile(gpu).name == sim.profile(name).name and sim.profile(gpu).gpu == sim.GPUS[gpu]


def test_save_load_round_trip(tmp_path):
    """save_profile then load_profile gives back the same JSON and the same looked-up numbers."""
    for p in (sim.profile("a100-80gb-vtrain"), from_dict(_cpu_profile())):
        path = tmp_path / f"{p.name}.json"
        sim.save_profile(p, path)
        q = sim.load_profile(path)
        assert q.to_dict() == p.to_dict()
        assert (q.gpu, q.matmul_efficiency, q.memory_bandwidth, dict(q.links), q.collective_rows,
                q.launch_per_kernel, q.host_runs_ahead, q.step_overhead) == \
            (p.gpu, p.matmul_efficiency, p.memory_bandwidth, dict(p.links), p.collective_rows,
             p.launch_per_kernel, p.host_runs_ahead, p.step_overhead)


def _refusals():
    def drop(*path):
        def f(d):
            node = d
            for part in path[:-1]:
                node = node[part]
            del node[path[-1]]
        return f

    def setter(value, *path):
        def f(d):
            node = d
            for part in path[:-1]:
                node = node[part]
            node[path[-1]] = value
        return f

    calibrated = {"value": 0.7, "source": "calibrated", "dataset": "d", "method": "m", "residual": "r"}
    measured = {"value": 0.7, "source": "measured", "command": "c", "date": "2026-11-24"}
    return [
        ("missing schema", drop("schema"), "schema"),
        ("number without source", setter({"value": 0.7}, "matmul", "efficiency"), "matmul.efficiency"),
        ("calibrated without rows", setter(calibrated, "matmul", "efficiency"), "matmul.efficiency.*rows"),
        ("calibrated without method", setter({**calibrated, "rows": "x", "method": ""}, "matmul", "efficiency"),
         "matmul.efficiency.*method"),
        ("calibrated without residual",
         setter({k: v for k, v in {**calibrated, "rows": "x"}.items() if k != "residual"}, "matmul", "efficiency"),
         "matmul.efficiency.*residual"),
        ("measured without machine", setter(measured, "memory_bound", "bandwidth"), "memory_bound.bandwidth.*machine"),
        ("measured without command or date", setter({"value": 1e12, "source": "measured", "machine": "m"},
                                                      "memory_bound", "bandwidth"), "command, date"),
        ("negative matmul row", setter({"rows": [["bf16", 1024, -1, 1024, 1, 1e-3]], **FIXTURE}, "matmul", "table"),
         "matmul.table.*row 0"),
        ("unknown precision row", setter({"rows": [["fp4", 1024, 1024, 1024, 1, 1e-3]], **FIXTURE},
                                         "matmul", "table"), "matmul.table.*row 0"),
        ("short collective row", setter({"rows": [["all_reduce", "node", 1e6, 1e-4]], **FIXTURE},
                                        "collectives", "table"), "collectives.table.*row 0"),
        ("unknown collective op", setter({"rows": [["broadcast", "node", 2, 1e6, 1e-4]], **FIXTURE},
                                         "collectives", "table"), "collectives.table.*row 0"),
        ("empty p2p table", setter({"rows": [], **FIXTURE}, "p2p", "table"), "p2p.table"),
        ("unknown memory class", setter({"gemm": _num(1e12)}, "memory_bound", "classes"), "memory_bound.classes"),
        ("no node link", drop("collectives", "node"), "collectives.node"),
        ("no stack", drop("stack"), "missing 'stack'"),
        ("stack without name", setter("", "stack", "name"), "stack.name"),
        ("unknown attention kernel", setter("flash-attention-9", "stack", "attention_kernel"),
         "stack.attention_kernel"),
        ("unknown elementwise kind", setter("jit", "stack", "elementwise"), "stack.elementwise"),
    ]


@pytest.mark.parametrize("what, edit, field", _refusals(), ids=[r[0] for r in _refusals()])
def test_refusals_name_file_and_field(tmp_path, what, edit, field):
    data = _base()
    edit(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(sim.ProfileError, match=rf"bad\.json: .*{field}") as e:
        sim.load_profile(path)
    assert "\n" not in str(e.value)
    with pytest.raises(sim.ProfileError, match=field):  # and save_profile checks before it writes
        sim.save_profile(data, tmp_path / "out.json")
    assert not (tmp_path / "out.json").exists()


def test_unreadable_and_non_json_files(tmp_path):
    with pytest.raises(sim.ProfileError, match=r"missing\.json: cannot read") as e:
        sim.load_profile(tmp_path / "missing.json")
    assert "\n" not in str(e.value)
    bad = tmp_path / "garbage.json"
    bad.write_text("{not json\n")
    with pytest.raises(sim.ProfileError, match=r"garbage\.json: not JSON") as e:
        sim.load_profile(bad)
    assert "\n" not in str(e.value)
    assert issubclass(sim.ProfileError, ValueError)


def test_a_profile_under_the_home_folder_loads_by_its_tilde_path(tmp_path, monkeypatch):
    """The docs keep profiles outside the checkout, in ~/.cache/exec/: `load_profile` and
    `--gpu` read "~/..." as the shell would."""
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".cache" / "exec").mkdir(parents=True)
    sim.save_profile(sim.profile("h100-80gb-best-case"), tmp_path / ".cache" / "exec" / "mine.json")
    assert sim.load_profile("~/.cache/exec/mine.json").to_dict() == sim.profile("h100-80gb-best-case").to_dict()


# ---------------------------------------------------------------------------- table lookups

def _with(section: str, key: str, rows: list) -> sim.DeviceProfile:
    data = _base()
    data[section][key] = {"rows": rows, **FIXTURE}
    return from_dict(data, "test")


def test_matmul_table_exact_near_and_missing_precision():
    t = 1.5e-4
    p = _with("matmul", "table", [["bf16", 1024, 1024, 1024, 1, t], ["bf16", 8192, 8192, 8192, 1, 1.1e-2]])
    plain = sim.profile("a100-80gb-best-case")
    assert gemm_time(p, "bf16", 1024, 1024, 1024) == t                    # the row itself
    # near (1024,1024,1024): the same achieved FLOP/s times this query's FLOPs
    assert gemm_time(p, "bf16", 2048, 1024, 1024) == pytest.approx(2 * t, rel=1e-12)
    assert gemm_time(p, "bf16", 1024, 768, 1536, 2) == pytest.approx(t * 768 * 1536 * 2 / 1024**2, rel=1e-12)
    # fp16 is not in the table: the tile model, the same as the profile without a table
    assert p.matmul_lookup("fp16", 1024, 1024, 1024, 1) is None
    assert gemm_time(p, "fp16", 1024, 1024, 1024) == gemm_time(plain, "fp16", 1024, 1024, 1024)
    waves = math.ceil(4 * 8 / plain.gpu.sms)   # (1024/256) x (1024/128) tiles over the SMs
    tile = waves * 2 * 256 * 128 * 1024 / (plain.flops("fp16") * plain.matmul_efficiency / plain.gpu.sms)
    assert gemm_time(p, "fp16", 1024, 1024, 1024) == pytest.approx(tile, rel=1e-12)


@st.composite
def _monotone_table(draw):
    n = draw(st.integers(2, 6))
    xs = sorted(draw(st.sets(st.integers(1, 2**30), min_size=n, max_size=n)))
    steps = draw(st.lists(st.floats(1e-7, 1e-2), min_size=n, max_size=n))
    ys = [sum(steps[:i + 1]) for i in range(n)]
    return list(zip(map(float, xs), ys))


@settings(max_examples=40, deadline=None)
@given(pts=_monotone_table(), where=st.floats(0, 1), beyond=st.floats(0, 4))
def test_collective_and_p2p_tables_interpolate(pts, where, beyond):
    """Linear between rows, the last row's bandwidth above it, the first row's time below."""
    coll = _with("collectives", "table", [["all_reduce", "node", 4, x, y] for x, y in pts])
    p2p = _with("p2p", "table", [["network", x, y] for x, y in pts])

    def both(nbytes):
        a, b = coll.collective_lookup("all_reduce", "node", 4, nbytes), p2p.p2p_lookup("network", nbytes)
        assert a == pytest.approx(b, rel=1e-12)
        return a

    for x, y in pts:
        assert both(x) == pytest.approx(y, rel=1e-9)
    (x0, y0), (x1, y1) = pts[len(pts) // 2 - 1], pts[len(pts) // 2]
    x = x0 + where * (x1 - x0)
    assert both(x) == pytest.approx(y0 + where * (y1 - y0), rel=1e-9, abs=1e-15)
    (xa, ya), (xb, yb) = pts[-2], pts[-1]
    far = xb + beyond * (xb - xa)
    assert both(far) == pytest.approx(yb * far / xb, rel=1e-9)  # the last row's bandwidth
    assert both(pts[0][0] / 2) == pts[0][1]
    assert coll.collective_lookup("all_reduce", "node", 8, x) is None      # no rows of 8 ranks: the model
    assert coll.collective_lookup("all_gather", "node", 4, x) is None
    assert p2p.p2p_lookup("node", x) is None


# ---------------------------------------------------------------------------- the launch floor

@settings(max_examples=40, deadline=None)
@given(device=st.floats(0, 1), kernels=st.integers(0, 10**5), launch=st.floats(0, 1e-4))
def test_pass_time_is_max_or_sum(device, kernels, launch):
    p = sim.profile("a100-80gb-vtrain")
    ahead = dataclasses.replace(p, launch_per_kernel=launch, host_runs_ahead=True)
    inline = dataclasses.replace(p, launch_per_kernel=launch, host_runs_ahead=False)
    assert ahead.pass_time(device, kernels) == max(device, kernels * launch)
    assert inline.pass_time(device, kernels) == device + kernels * launch


def test_launch_floor_in_estimate():
    """On the calibrated A100 profile the floor is hidden under a huge layer's kernels and shows
    under a tiny model's; the step is never shorter than the device time alone."""
    p = sim.profile("a100-80gb-vtrain")
    huge = sim.estimate("gpt3-175b", gpu=p, tp=8, pp=16, dp=1, micro_batch=1, global_batch=16)
    assert huge.time_parts["launch_floor"] == 0
    tiny = sim.estimate(TINY, gpu=p, pp=2, global_batch=4)
    assert tiny.time_parts["launch_floor"] > 0
    free = sim.estimate(TINY, gpu=dataclasses.replace(p, launch_per_kernel=0.0), pp=2, global_batch=4)
    assert free.time_parts["launch_floor"] == 0 and free.step_time < tiny.step_time


# ---------------------------------------------------------------------------- the planner takes profiles

def test_cpu_like_profile_runs_fp32_and_refuses_bf16():
    cpu = from_dict(_cpu_profile(), "test-cpu")
    assert "network" not in cpu.links and cpu.gpu.peak_flops.keys() == {"fp32"}
    e = sim.estimate(TINY, gpu=cpu, pp=2, global_batch=4, precision="fp32")
    assert e.step_time > 0 and e.profile is cpu
    # launch added, not hidden: the step is longer than the same profile running ahead of the device
    ahead = sim.estimate(TINY, gpu=dataclasses.replace(cpu, host_runs_ahead=True), pp=2, global_batch=4,
                         precision="fp32")
    assert e.step_time > ahead.step_time
    with pytest.raises(ValueError, match="bf16") as err:
        sim.estimate(TINY, gpu=cpu, pp=2, global_batch=4, precision="bf16")
    assert "\n" not in str(err.value)


def test_estimate_and_search_accept_a_loaded_profile(tmp_path):
    path = tmp_path / "a100.json"
    sim.save_profile(sim.profile("a100-80gb-best-case"), path)
    p = sim.load_profile(path)
    by_profile = sim.estimate(TINY, gpu=p, pp=2, global_batch=4)
    by_name = sim.estimate(TINY, gpu="a100-80gb-best-case", pp=2, global_batch=4)
    assert by_profile.profile is p and by_profile.step_time == by_name.step_time
    plan = sim.plan.search(TINY, gpu=p, gpus=2, global_batch=4, tp=1, micro_batch=1)
    assert len(plan) > 0 and all(row.estimate.profile is p for row in plan)


def test_calibrated_a100_below_best_case():
    """The calibrated (what Megatron achieved) A100 is no faster than the best case published."""
    cal, best = sim.profile("a100-80gb-vtrain"), sim.profile("a100-80gb-best-case")
    assert cal.gpu == best.gpu
    assert cal.matmul_efficiency < best.matmul_efficiency
    assert cal.launch_per_kernel >= best.launch_per_kernel and cal.step_overhead >= best.step_overhead


@pytest.mark.parametrize("name", sim.hardware.profile.presets())
def test_every_preset_names_its_gpu_its_stack_and_its_kind_in_its_header(name):
    """The header is "<datasheet>, <stack>: <what the stack is>, <kind>", the kind the one
    the profile's sources say (a fitted number makes it calibrated)."""
    p = sim.profile(name)
    sources = json.dumps(p.data)
    kind = "calibrated" if '"source": "calibrated"' in sources else \
        "measured" if '"source": "measured"' in sources else "best case"
    assert p.header == f"{p.gpu.name}, {p.stack.name}: {p.stack.description}, {kind}"
    assert p.stack.elementwise in sim.hardware.profile.ELEMENTWISE
