"""exec.profile_device writes a profile sim.load_profile reads, with provenance on every number; exec.run --json and the plan-against-run grid (exec.measure.plan_vs_run) carry what the loop compares. No timing assertions."""
from __future__ import annotations

import dataclasses
import json
import math
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import one_line, run_main

torch = pytest.importorskip("torch")

import sim  # noqa: E402
from exec import profile_device as pd  # noqa: E402
from exec.launch.host import host_cores  # noqa: E402
from exec.profiler.comm_bench import p2p_fit, ring_fit  # noqa: E402
from exec.profiler.device_bench import ATTENTION_GRID, attention_call, attention_rows, attention_shapes  # noqa: E402
from exec.profiler.host_bench import TAUS, first_compute_law, host_transport  # noqa: E402
from exec.profiler.layer_bench import RETRIES  # noqa: E402
from sim.hardware.host_transport import FIELDS as HOST_FIELDS  # noqa: E402
from sim.hardware.network import OPS as COLLECTIVE_STEPS  # noqa: E402
from sim.hardware.profile import COMPUTE_CLASSES  # noqa: E402

from exec.measure import plan_report as bench  # noqa: E402  (the bench's command)
from exec.measure import plan_vs_run as pvr  # noqa: E402


# starts ranks: every test that uses it is marked slow
@pytest.fixture(scope="module")
def profile_file(tmp_path_factory):
    out = tmp_path_factory.mktemp("profile") / "cpu.json"
    pd.measure_device(out, "gloo", ranks=2, quick=True, micro_batches=(2,), timeout=120)
    return out


def _numbers(node, path=""):
    """Every {"value": ...} object in the profile, with its path."""
    if isinstance(node, dict):
        if "value" in node:
            yield path, node
        for k, v in node.items():
            yield from _numbers(v, f"{path}.{k}" if path else k)


@pytest.mark.slow
def test_the_profile_loads_and_every_number_says_where_it_comes_from(profile_file):
    p = sim.load_profile(profile_file)
    raw = json.loads(profile_file.read_text())
    assert raw["schema"] == pd.SCHEMA and raw["fingerprint"]["backend"] == "gloo"
    assert raw["fingerprint"]["threads"] == max(1, len(host_cores()) // 2)
    assert raw["launch"]["host_runs_ahead"] is False
    for path, n in _numbers(raw):
        assert n["source"] in ("measured", "derived"), path
        need = ("command", "machine", "date") if n["source"] == "measured" else ("from", "how")
        assert all(k in n for k in need), path
    ops = {r[0] for r in raw["collectives"]["table"]["rows"]}
    assert ops <= set(COLLECTIVE_STEPS) and "all_reduce" in ops
    # the compute-bound classes and the memory classes, each with its points by size, which the planner reads
    compute = raw["compute_bound"]["classes"]
    assert set(compute) == set(p.compute_classes) == set(COMPUTE_CLASSES) == set(p.compute_points)
    assert all(len(c["points"]) == len(pd.QUICK["memory"]) for c in compute.values())
    assert set(p.memory_points) == set(raw["memory_bound"]["classes"])
    # whole blocks and the ends, measured as a step runs them, at the profiled micro-batch (2)
    blocks, ends = raw["layers"]["blocks"]["rows"], raw["layers"]["ends"]["rows"]
    assert {(r[5], r[6]) for r in blocks} == {(2, "none"), (2, "full")} and [r[4] for r in ends] == [2]
    gpt = pd_gpt()
    assert p.layers.block("fp32", gpt.hidden, gpt.heads, gpt.ffn, gpt.seq, 2, "full")["B"] == blocks[1][8]
    assert p.layers.end("fp32", gpt.hidden, gpt.seq, gpt.vocab, 2)["last_F"] == ends[0][7]
    shapes = {(*r[1:5], r[6]) for r in raw["matmul"]["table"]["rows"]}
    assert set(pd_gemms()) == shapes  # the planner's products, each measured in its layout
    assert p.gpu.peak_flops["fp32"] == max(2 * m * n * k * b / t for _, m, n, k, b, t, _ in raw["matmul"]["table"]["rows"])
    # torch's attention call at the model's own head width and sequence (--quick), read back as measured
    attention = raw["attention"]["table"]["rows"]
    assert {tuple(r[1:4]) for r in attention} == set(attention_shapes([gpt], quick=True))
    assert all(p.attention.time("fp32", *r[1:4]) == pytest.approx((r[4], r[5])) for r in attention)
    # gloo's CPU ranks: exec's own costs around transfers and computes, for the planner's gloo-cpu transport
    host = raw["host_transport"]
    fields = (*HOST_FIELDS, "first_compute", "first_compute_tau")  # rule 19
    assert host["name"] == "gloo-cpu" and set(host) == {"name", *fields}
    assert p.host_transport == {"transport": "gloo-cpu", **{f: host[f]["value"] for f in fields}}
    assert all(host[f]["source"] == "measured" and host[f]["value"] >= 0 for f in fields)
    assert host["arrive_overhead"]["value"] == 0.0  # inside the blocks' in-step times
    # rule 19's law, fitted to the layer bench's first computes: 2 schedules x 3 block counts x 2
    # ranks a try, each of 2 recompute modes tried once and, where its stages were off a line, again
    tries = host["first_compute"]["points"] / (2 * 3 * 2)
    assert tries == int(tries) and 2 <= tries <= 2 * (1 + RETRIES) and host["first_compute_tau"]["value"] > 0
    assert host["first_compute"]["rms_residual"] >= 0
    # rule 20: AdamW's cost per tensor taken inside the same steps; the other optimizers' in a loop
    adamw = raw["optimizer_per_tensor"]["adamw"]
    assert adamw["points"] == host["first_compute"]["points"] and "inside training steps" in adamw["how"]
    assert p.optimizer_per_tensor["adamw"] == adamw["value"] >= 0
    assert all("points" not in v for k, v in raw["optimizer_per_tensor"].items() if k != "adamw")


def test_the_host_transport_is_the_means_exec_calibration_takes():
    """Ranks 0 and 1 report their calls (the others nothing); every rank its computes' marks
    and its steps' first computes' excess. The arrival is inside the blocks' in-step times
    (rule 19): 0 whatever call_costs timed."""
    busy = [{"isend_busy_mean": 1e-5, "irecv_busy_mean": 2e-6, "arrive_busy_mean": 3e-5},
            {"isend_busy_mean": 3e-5, "irecv_busy_mean": 4e-6, "arrive_busy_mean": 5e-5}]
    late = [{"notice_free": [1e-4, 2e-4, 3e-4], "notice_busy": [4e-3, 5e-3, 6e-3]}, {"notice_free": [], "notice_busy": []}]
    reports = [{"busy": busy[0], "late": late[0], "before": [1e-5, 3e-5], "after": [2e-5], "first": [4e-4, 6e-4]},
               {"busy": busy[1], "late": late[1], "before": [2e-5], "after": [4e-5, 6e-5], "first": [-1e-4]},
               {"busy": {}, "late": {}, "before": [6e-5], "after": [0.0], "first": [3e-4]}]
    got = host_transport(reports)
    assert got == pytest.approx({"send_overhead": 2e-5, "recv_overhead": 3e-6, "arrive_overhead": 0.0,
                                 "io_tick": 2 * (5e-3 - 2e-4), "before_compute": 3e-5, "after_compute": 3e-5,
                                 "first_compute": 3e-4, "first_compute_tau": 0.0})
    for r in reports:  # a mean below 0 is noise: the cost cannot be
        r["first"] = [-1e-5]
    assert host_transport(reports)["first_compute"] == 0.0
    with pytest.raises(ValueError, match="ranks 0 and 1"):
        host_transport(reports[2:])


def pd_gpt():
    from exec.models.spec import ModelSpec
    return ModelSpec("gpt").transformer()


def pd_gemms():
    from exec.profiler.device_bench import planner_gemms
    from exec.models.spec import ModelSpec
    return planner_gemms(ModelSpec("gpt").transformer(), (2,))


@settings(max_examples=50, deadline=None)
@given(st.integers(0, len(TAUS) - 1), st.floats(1e-5, 1e-2), st.lists(st.floats(0.1, 5.0), min_size=3, max_size=12,
                                                                      unique=True))
def test_the_first_computes_law_recovers_the_law_it_fits(k, most, durations):
    """Rule 19's law, excess = most x (1 - exp(-d / tau)), fitted to points on it at durations of
    0.1 to 5 tau (where the curve still bends): the same most and tau (tau on the grid it
    searches), no residual."""
    tau = TAUS[k]
    got = first_compute_law([(f * tau, most * -math.expm1(-f)) for f in durations])
    assert got[1] == tau and got[0] == pytest.approx(most, rel=1e-9) and got[2] < most * 1e-9


def test_the_first_computes_law_needs_points_at_two_durations():
    with pytest.raises(ValueError, match="3 points or more at 2 durations"):
        first_compute_law([(1e-3, 1e-4), (2e-3, 2e-4)])
    with pytest.raises(ValueError, match="3 points or more at 2 durations"):
        first_compute_law([(1e-3, 1e-4)] * 4)


def test_a_bent_line_of_stage_times_is_timed_again_and_the_straightest_kept(monkeypatch):
    """Three stage times on a line have no bend; a configuration off a line by more than BENT is
    timed again (at most RETRIES times), and the straightest try is kept."""
    from exec.profiler import layer_bench as lb
    assert lb._bend([1.0, 2.0, 3.0]) == 0.0 and lb._bend([1.0, 2.6, 3.0]) == pytest.approx(0.6 / 2.6)
    ends = dict.fromkeys(("first_F", "last_F"), 1e-4)
    tries = iter([({"F": 1.0}, ends, 0.5), ({"F": 2.0}, ends, 0.15), ({"F": 3.0}, ends, 0.2)])
    monkeypatch.setattr(lb, "_passes", lambda *a, **k: next(tries))
    said = []
    assert lb._timed(None, None, 8, "none", 3, [], [], said.append)[0] == {"F": 2.0}  # every try bent: the least
    assert len(said) == 1 + lb.RETRIES
    tries = iter([({"F": 1.0}, ends, 0.05), ({"F": 2.0}, ends, 0.0)])
    assert lb._timed(None, None, 8, "none", 3, [], [], said.append)[0] == {"F": 1.0}  # straight at once


def test_the_ring_fit_recovers_the_model_it_fits():
    base, hop, bw = 1e-4, 2e-5, 3e9
    rows = [[op, "node", n, b, base + COLLECTIVE_STEPS[op] * (n - 1) * hop + COLLECTIVE_STEPS[op] * (n - 1) / n * b / bw]
            for op in COLLECTIVE_STEPS for n in (2, 3, 4) for b in (1e3, 1e6, 1e8)]
    fit = ring_fit(rows)
    assert fit["base_latency"] == pytest.approx(base) and fit["hop_latency"] == pytest.approx(hop)
    assert fit["bus_bandwidth"] == pytest.approx(bw)
    send = p2p_fit([["node", b, 5e-5 + b / 2e9] for b in (1e3, 1e5, 1e7)])
    assert send == pytest.approx({"latency": 5e-5, "bandwidth": 2e9})


def test_a_device_it_cannot_measure_is_refused_in_one_line(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    one_line(run_main(pd.main, "--out", str(tmp_path / "x.json"), "--backend", "nccl"), 2, "CUDA")
    assert not (tmp_path / "x.json").exists()


@pytest.mark.slow
def test_sim_plan_takes_the_file_it_writes(profile_file, tmp_path):
    """`python -m sim.plan --gpu FILE.json` plans on the profile this machine's ranks wrote
    (a CPU's: fp32, its inline datasheet), and `sim.estimate` takes the same path."""
    from sim.plan import cli as plan_cli
    model = tmp_path / "tiny.json"
    model.write_text(json.dumps(dict(layers=2, hidden=16, heads=2, seq=8, vocab=32)))
    proc = run_main(plan_cli.main, "--model", str(model), "--gpu", str(profile_file), "--gpus", "2",
                    "--global-batch", "4", "--precision", "fp32", "--no-figures", "--quiet")
    assert proc.returncode == 0, proc.stderr
    name = sim.load_profile(profile_file).name
    assert f"measured (profile {name})" in proc.stdout  # the header: GPU, stack, kind, then the profile
    e = sim.estimate(str(model), str(profile_file), pp=2, dp=1, micro_batch=1, global_batch=4, precision="fp32")
    assert e.profile.name == name and e.step_time > 0


@pytest.mark.slow
def test_the_planner_predicts_from_the_profile_and_the_bench_measures(profile_file):
    p = sim.load_profile(profile_file)
    case = pvr.Case("1f1b", 2, "none", 1, pp=2, batch=4)
    model = dict(layers=2, hidden=16, heads=2, seq=8, vocab=32)
    got = pvr.compare(p, case, model, steps=1, warmup=0)
    assert len(got["predicted_memory"]) == len(got["measured_memory"]) == 2
    assert got["predicted_s"] > 0 and got["measured_s"] > 0 and got["load"]
    # memory: the planner counts what exec holds (weights, grads, AdamW state, saved tensors);
    # AdamW's per-tensor step counters (4 bytes each) are all it leaves out
    assert got["memory_error_pct"] < 0.5
    assert all(c.pp * c.dp <= 2 for _, c in pvr.grid(2))
    assert {c.schedule for _, c in pvr.grid(2)} == set(pvr.GRID_SCHEDULES)


def test_a_latency_bound_send_table_gives_a_bandwidth_lower_bound():
    """Times that do not grow with size (noise): the fastest time is the latency, the largest
    send's bytes over its time a lower bound on the bandwidth."""
    send = p2p_fit([["node", 1e3, 3e-4], ["node", 1e5, 2e-4], ["node", 1e6, 2.5e-4]])
    assert send == {"latency": 2e-4, "bandwidth": 1e6 / 2.5e-4}


def test_a_latency_bound_collective_table_gives_a_bandwidth_lower_bound():
    """Collective times that do not grow with their traffic: the fastest is the base latency,
    no hop latency, and the largest traffic over its time a lower bound on the bus bandwidth."""
    rows = [["all_reduce", "node", 2, 1e3, 4e-4], ["all_reduce", "node", 2, 1e6, 3e-4]]
    fit = ring_fit(rows)
    assert fit == {"base_latency": 3e-4, "hop_latency": 0.0, "bus_bandwidth": (2 * 1 / 2 * 1e6) / 3e-4}


def test_the_bench_pairs_each_shape_with_the_profiled_runs_around_it():
    """The paired error cancels a slowdown common to a shape's run and the profiled shape's
    runs around it: (1 + e) / sqrt((1 + e_before)(1 + e_after)) - 1."""
    case = pvr.Case("1f1b", 4, "none", 1)
    other = dict(pvr.SHAPES[0])
    rows = [{"model": dict(pvr.MODEL), "case": case, "error_pct": -50.0, "kind_error_pct": {"F": [-50.0]}},
            {"model": other, "case": case, "error_pct": -55.0, "kind_error_pct": {"F": [-40.0]}},
            {"model": dict(pvr.MODEL), "case": case, "error_pct": -50.0, "kind_error_pct": {"F": [-50.0]}}]
    rows = [r | {"compute_error_pct": pvr.compute_error(r)} for r in rows]
    (got,) = pvr.paired(rows)
    assert got["paired_error_pct"] == pytest.approx((0.45 / 0.5 - 1) * 100)
    assert got["paired_compute_pct"] == pytest.approx((0.6 / 0.5 - 1) * 100)
    order = pvr.grid(2, quick=True)
    assert [m == pvr.MODEL for m, _ in order] == [True, False, True] * 2  # each shape between two profiled runs


def test_layer_shapes_are_read_and_a_bad_one_refused(capsys):
    from exec.profile_device import build_parser
    args = build_parser().parse_args(["--out", "x.json", "--layer-shape", "64,2,32", "--layer-shape", "256,8,64"])
    assert args.layer_shape == [(64, 2, 32), (256, 8, 64)]
    for bad in ("64,3,32", "64,2", "a,b,c"):
        with pytest.raises(SystemExit) as e:
            build_parser().parse_args(["--out", "x.json", "--layer-shape", bad])
        assert e.value.code == 2 and len(capsys.readouterr().err.strip().splitlines()) == 1


def test_the_attention_timed_is_exec_s_causal_attention_and_its_backward():
    """The call the profile times (`attention_call`) computes causal softmax(q k^T / sqrt(d)) v
    written out, and its backward the same gradients of q, k and v; the rows cover the grid
    with each model's own head width and sequence, one row a shape, every time positive."""
    torch.manual_seed(0)
    forward, backward, views = attention_call(8, 12, 3, torch.device("cpu"), torch.float64)
    out = forward()
    q, k, v = (t.detach().requires_grad_() for t in views)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(8)
    scores = scores.masked_fill(torch.ones(12, 12, dtype=torch.bool).triu(1), float("-inf"))
    ref = torch.softmax(scores, dim=-1) @ v
    assert torch.allclose(out, ref, atol=1e-10)
    torch.manual_seed(0)
    torch.randn(3, 12, 24, dtype=torch.float64)  # the inputs the call drew, then its output gradient
    grad = torch.randn_like(ref)
    assert all(torch.allclose(a, b, atol=1e-9) for a, b in zip(backward(), torch.autograd.grad(ref, (q, k, v), grad)))
    m = sim.Transformer(layers=1, hidden=96, heads=4, seq=48, vocab=64)  # head width 24, sequence 48
    shapes = attention_shapes([m])
    dims, seqs, counts = ATTENTION_GRID
    assert set(shapes) == {(d, s, n) for d in {*dims, 24} for s in {*seqs, 48} for n in counts}
    assert attention_shapes([m], quick=True) == [(24, 48, n) for n in counts]
    rows = attention_rows([(8, 16, 2), (16, 8, 3)], torch.device("cpu"), torch.float32, "fp32", lambda: None,
                          lambda text: None, loops=1)
    assert [r[:4] for r in rows] == [["fp32", 8, 16, 2], ["fp32", 16, 8, 3]] and all(t > 0 for r in rows for t in r[4:])


def test_the_default_anchor_shapes_are_a_quarter_half_and_twice_the_model():
    """Every anchor a valid block (heads divide hidden), the smaller ones a quarter and half of
    the model where it can be divided, distinct and growing, the double always; --layer-shape
    replaces them, --quick and --no-anchors drop them."""
    from hypothesis import given, settings, strategies as st

    @settings(max_examples=100, deadline=None)
    @given(st.integers(1, 64), st.integers(1, 64), st.integers(1, 512))
    def check(head_dim, heads, seq):
        m = sim.Transformer(layers=1, hidden=head_dim * heads, heads=heads, seq=seq, vocab=64)
        shapes = pd.anchor_shapes(m)
        assert all(h % a == 0 for h, a, _ in shapes)
        assert shapes[-1] == (2 * m.hidden, 2 * m.heads, 2 * m.seq)
        smaller = shapes[:-1]
        assert len(set(smaller)) == len(smaller) and (m.hidden, m.heads, m.seq) not in smaller
        assert [h for h, _, _ in smaller] == sorted(h for h, _, _ in smaller)
        for h, a, s in smaller:
            assert (h, s) in {(max(1, m.hidden // k), max(1, m.seq // k)) for k in (4, 2)} and a <= m.heads
        if m.hidden % 4 == 0 and m.heads % 4 == 0 and m.seq >= 4:
            assert len(smaller) == 2
    check()
    m = sim.Transformer(layers=1, hidden=128, heads=4, seq=64, vocab=64)
    parse = pd.build_parser().parse_args
    assert pd.layer_shapes(parse(["--out", "x.json"]), m) == pd.anchor_shapes(m)
    assert pd.layer_shapes(parse(["--out", "x.json", "--quick"]), m) == []
    assert pd.layer_shapes(parse(["--out", "x.json", "--no-anchors"]), m) == []
    assert pd.layer_shapes(parse(["--out", "x.json", "--no-anchors", "--layer-shape", "96,3,48"]), m) == [(96, 3, 48)]
    assert pd.anchor_shapes(m) == [(32, 1, 16), (64, 2, 32), (256, 8, 128)]
    # the smaller shapes (a 64th and an eighth of the work) are timed over 4 times the steps, the
    # model's and the double once
    quarter, half, big = (dataclasses.replace(m, hidden=h, heads=a, seq=s, ffn=None, kv_heads=None)
                          for h, a, s in pd.anchor_shapes(m))
    assert [pd.repeats(m, x) for x in (quarter, half, m, big)] == [4, 4, 1, 1]


def test_the_bench_reads_its_shapes_and_refuses_a_bad_one_in_one_line(tmp_path, capsys, monkeypatch):
    from sim.hardware.profile import profile, save_profile
    path = tmp_path / "p.json"
    save_profile(profile("a100-80gb-best-case"), path)
    assert bench.main(["--profile", str(path), "--shape", "1,2"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    seen = []
    monkeypatch.setattr(bench, "reference", lambda: 1.0)
    monkeypatch.setattr(bench, "grid", lambda cores, pp, quick, schedules, recomputes, shapes: seen.append(shapes) or [])
    bench.main(["--profile", str(path), "--shape", "6,96,3,48,768"])
    assert seen == [[dict(layers=6, hidden=96, heads=3, seq=48, vocab=768)]]


@pytest.mark.parametrize("out, words", [("/proc/x.json", "cannot write to /proc"),
                                        ("{file}/x.json", "is a file, not a folder"),
                                        ("{tmp}", "is a folder; give a file name")])
def test_the_profiler_checks_its_output_before_measuring(out, words, tmp_path):
    (tmp_path / "f").write_text("")
    one_line(run_main(pd.main, "--out", out.format(file=tmp_path / "f", tmp=tmp_path)), 2, words)
