"""exec.measure.calibrate, exec.measure.costs and exec.measure.compare: costs round-trip through JSON, the transfer
fit recovers known numbers, calibration times the interpreter's own handlers and counts the
memory a step holds, and a measured step equal to its simulation compares with error 0."""
import dataclasses
import math

import pytest

import sim
from exec.measure.costs import fit_latency_bandwidth
from sim import load_costs, save_costs


def test_costs_save_load_round_trip(tmp_path):
    """exec saves and loads costs with sim's functions: calibrated costs (static memory
    split into weights, gradients and optimizer state) come back equal."""
    costs = sim.Costs(forward=[0.01, 0.02], backward=[0.03, 0.04], latency=5e-5, bandwidth=2e9,
                      activation_bytes_sent=[1024, 0], activation_bytes=[4096, 8192], static_bytes=[10, 20],
                      weight_bytes=[400, 800], grad_bytes=[400, 800], optimizer_bytes=[808, 1608],
                      arrive_overhead=1e-4, io_tick=0.004)
    path = tmp_path / "costs.json"
    save_costs(costs, path, details={"note": "x", "inf": math.inf})
    assert load_costs(path).for_stages(2) == costs.for_stages(2)
    free = sim.Costs(io_tick=math.inf)  # infinite bandwidth and tick, scalar fields
    save_costs(free, path)
    assert load_costs(path) == free
    assert sim.Costs.from_dict(costs.to_dict()).for_stages(2) == costs.for_stages(2)
    assert not list(tmp_path.glob(".*.tmp"))
    with pytest.raises(ValueError, match="unknown Costs fields"):
        sim.Costs.from_dict({"forwards": 1.0})


def test_fit_recovers_latency_and_bandwidth():
    lat, bw = 60e-6, 1.5e9
    sizes = [4, 1 << 10, 1 << 16, 1 << 20, 1 << 22]
    times = [lat + n / bw for n in sizes]
    got_lat, got_bw = fit_latency_bandwidth(sizes, times)
    assert got_lat == pytest.approx(lat, rel=1e-9) and got_bw == pytest.approx(bw, rel=1e-9)
    # noise of +-2% still gives both within a few percent
    noisy = [t * (1.02 if i % 2 else 0.98) for i, t in enumerate(times)]
    got_lat, got_bw = fit_latency_bandwidth(sizes, noisy)
    assert got_bw == pytest.approx(bw, rel=0.05) and got_lat == pytest.approx(lat, abs=3e-5)
    assert fit_latency_bandwidth([1, 2, 3], [5.0, 5.0, 5.0]) == (5.0, math.inf)
    with pytest.raises(ValueError, match="two different message sizes"):
        fit_latency_bandwidth([8, 8], [1.0, 2.0])


def test_compare_a_step_with_its_own_simulation_gives_zero_error():
    from exec.measure.compare import breakdown, compare
    costs = sim.Costs(forward=[0.01, 0.012], backward=[0.02, 0.025], latency=1e-4, bandwidth=1e9,
                      activation_bytes_sent=[1e5, 1e5], activation_bytes=[1e6, 1e6], static_bytes=[1e7, 1e7])
    for name in ("gpipe", "1f1b"):
        ref = sim.simulate(sim.make_schedule(name, 2, 4), costs)
        # a "measured" record: the same events shifted to another clock
        shift = 1234.5
        events = [dataclasses.replace(e, start=e.start + shift, end=e.end + shift) for e in ref.events]
        measured = sim.Result(ref.schedule, events, [[(t + shift, b) for t, b in m] for m in ref.memory],
                              [[(t + shift, n) for t, n in a] for a in ref.activations], source="measured")
        cmp = compare(measured, costs, grad_match=True)
        assert cmp.error_pct == pytest.approx(0.0, abs=1e-9)
        js = cmp.as_json()
        assert js["schedule"] == name and js["stages"] == 2 and js["micro_batches"] == 4 and js["grad_match"] is True
        assert js["measured_step_s"] == pytest.approx(js["simulated_step_s"])
        assert js["measured_peak_memory"] == js["simulated_peak_memory"]
        assert "error +0.00%" in cmp.table() or "error -0.00%" in cmp.table()
        bd = breakdown(measured, costs)
        for r in bd["ranks"]:  # these costs have no runtime overhead
            assert r["overhead"] == pytest.approx(0.0, abs=1e-9)
        assert all(v["ratio"] == pytest.approx(1.0) for v in bd["actions"].values())


@pytest.mark.parametrize("name", ["naive", "gpipe", "1f1b"])
def test_replay_takes_the_compute_times_from_the_step(name):
    """A step simulated under costs A and replayed under costs B that differ from A only in
    F and B: the replay takes every compute's time from the step's own events, so it
    reproduces the step exactly; the plain comparison under B does not."""
    from exec.measure.compare import compare, replay_error
    stages = 4
    a = sim.Costs(forward=[0.010, 0.012, 0.009, 0.011], backward=[0.020, 0.026, 0.018, 0.021], latency=1e-4,
                  arrive_overhead=5e-5, recv_overhead=2e-5, send_overhead=3e-5, io_tick=0.004)
    b = dataclasses.replace(a, forward=0.01, backward=0.03)
    step = sim.simulate(sim.make_schedule(name, stages, 8), a)
    measured = sim.Result(step.schedule, step.events, step.memory, step.activations, source="measured")
    assert replay_error(measured, b) == pytest.approx(0.0, abs=1e-9)
    assert abs(compare(measured, b).error_pct) > 1.0


def test_overlay_figure_is_written(tmp_path):
    from exec.measure.compare import compare, overlay_figure
    costs = sim.Costs(forward=0.01, backward=0.02, latency=1e-4)
    ref = sim.simulate(sim.make_schedule("1f1b", 2, 4), costs)
    measured = sim.Result(ref.schedule, list(ref.events), ref.memory, ref.activations, source="measured")
    overlay_figure(compare(measured, costs), tmp_path / "overlay.png")
    assert (tmp_path / "overlay.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_profile_costs_on_two_ranks():
    from exec.models.spec import ModelSpec
    from exec.pipeline.profile import profile_costs
    spec = ModelSpec("mlp", layers=2, hidden=16, seq=4, batch_size=4)
    costs, details = profile_costs(spec, "gpipe", 2, 2, steps=1, repeats=2, timeout=120, optimizer="sgd")
    c = costs.for_stages(2)
    assert all(t > 0 for t in c.forward + c.backward)
    assert c.latency >= 0 and c.bandwidth > 0
    assert c.activation_bytes_sent == (2 * 4 * 16 * 4.0,) * 2       # (b/micro, seq, hidden) float32
    params = sum(p.numel() for p in spec.build_layers()[0].parameters())
    assert c.weight_bytes == c.grad_bytes == (4.0 * params,) * 2       # float32 weights, their gradients
    assert c.optimizer_bytes == (0.0, 0.0) and c.static_bytes == (0.0, 0.0)  # SGD keeps no state
    assert details["optimizer"] == "sgd"
    assert set(details["compute_median"]["alone"]) == {"0F", "0B", "1F", "1B"}
    assert len(details["comm"]["one_way"]) == len(details["comm"]["sizes"])
    # rule 10's wait: rank 0 received 4 late notices with its peer free and 4 with it busy
    late = details["comm"]["late"]
    assert len(late["notice_free"]) == len(late["notice_busy"]) == 4
    assert math.isfinite(c.io_tick) and c.io_tick >= 0
    # rule 11: the runtime's own time around each of the 2 x 4 computes of the timed step
    # (wall time: how much a loaded machine adds is not bounded here; the split itself is
    # exact on a moved clock, test_calibration_times_the_runtimes_own_work_around_a_compute)
    assert len(details["runtime"]["before"]) == len(details["runtime"]["after"]) == 8
    assert 0 < c.before_compute < math.inf and 0 < c.after_compute < math.inf


@pytest.mark.slow
def test_a_run_calibrates_between_its_steps_without_changing_them():
    """`run_pipeline(calibrate=k)` calibrates before every k measured steps on the very
    modules the steps train: the steps' losses and the first step's gradients are those
    of the same run without calibration, each round holds every rank's report (the first
    one with the ping-pong), and the pooled costs predict the measured peak memory exactly."""
    from exec.models.spec import ModelSpec
    from exec.pipeline.runner import run_pipeline
    spec = ModelSpec("mlp", layers=4, hidden=16, seq=4, batch_size=8)
    plain = run_pipeline(spec, "1f1b", 2, 4, steps=3, warmup=1, timeout=120, optimizer="sgd")
    run = run_pipeline(spec, "1f1b", 2, 4, steps=3, warmup=1, calibrate=2, timeout=120, optimizer="sgd")
    assert plain.costs is None and plain.reports == []
    # the gradients checked are the warm-up step's, with a calibration right after it
    assert run.grad_match and run.max_grad_diff == plain.max_grad_diff and run.losses == plain.losses
    assert [[r["rank"] for r in rnd] for rnd in run.reports] == [[0, 1], [0, 1]]   # before measured steps 1 and 3
    assert run.reports[0][0]["comm"]["sizes"] and "sizes" not in run.reports[1][0]["comm"]
    samples = run.calibration["compute_samples"]
    assert len(samples["compute_only"]["0F"]) == 2 * 3 * 4  # rounds x steps x micro
    # inside real steps (rule 19), each rank's first compute (rank 0's first F) comes apart
    assert len(samples["concurrent"]["0F"]) == 2 * 3 * 3 and len(samples["concurrent"]["1B"]) == 2 * 3 * 4
    assert len(run.calibration["first_compute"]) == 2 * 3 * 2  # rounds x steps x ranks
    firsts = run.calibration["first_compute"]
    assert run.costs.first_compute == pytest.approx(max(0.0, sum(firsts) / len(firsts)), rel=1e-12)
    assert run.costs.arrive_overhead == 0.0  # inside the in-step computes' times
    c = run.costs.for_stages(2)
    assert all(t > 0 for t in c.forward + c.backward) and c.bandwidth > 0
    assert sim.simulate(run.schedule, run.costs).peak_memory == run.result.peak_memory
    assert c.optimizer_bytes == (0.0, 0.0) and c.static_bytes == (0.0, 0.0) and run.optimizer == "sgd"
    with pytest.raises(ValueError, match="gloo"):
        run_pipeline(spec, "1f1b", 2, 4, calibrate=1, backend="nccl")
    with pytest.raises(ValueError, match="calibrate must be an integer >= 0"):
        run_pipeline(spec, "1f1b", 2, 4, calibrate=-1)
    with pytest.raises(ValueError, match="optimizer must be one of adamw, adam, sgd, sgd-momentum"):
        run_pipeline(spec, "1f1b", 2, 4, optimizer="lion")


@pytest.mark.slow
def test_with_adamw_the_simulated_peak_memory_is_the_measured_one():
    """AdamW keeps two moments of every parameter and a float32 step tensor per parameter;
    the run counts them in every rank's static memory, and calibration reports them per
    stage as `optimizer_bytes`, so the simulated peak memory equals the measured one. No
    warm-up: the first round calibrates before the optimizer has stepped (it counts the
    state the first step will create), the second after (the state torch holds); both
    count the same bytes, and so do the steps before and after it."""
    from exec.models.spec import ModelSpec
    from exec.pipeline.runner import run_pipeline
    spec = ModelSpec("mlp", layers=4, hidden=16, seq=4, batch_size=8)
    sgd = run_pipeline(spec, "1f1b", 2, 4, steps=1, warmup=0, timeout=120, optimizer="sgd")
    run = run_pipeline(spec, "1f1b", 2, 4, steps=2, warmup=0, calibrate=1, timeout=120, optimizer="adamw")
    assert run.grad_match and run.losses[0] == sgd.losses[0] and run.optimizer == "adamw"
    assert run.reports[0][0]["memory"] == run.reports[1][0]["memory"]
    assert run.reports[0][1]["memory"] == run.reports[1][1]["memory"]
    stages = spec.build_stages(2, bounds=run.bounds)
    weights = [float(sum(p.numel() * p.element_size() for p in st.parameters())) for st in stages]
    tensors = [len(list(st.parameters())) for st in stages]
    c = run.costs.for_stages(2)
    assert c.weight_bytes == c.grad_bytes == tuple(weights) and c.static_bytes == (0.0, 0.0)
    assert c.optimizer_bytes == tuple(2 * w + 4 * n for w, n in zip(weights, tensors))
    simulated = sim.simulate(run.schedule, run.costs).peak_memory
    assert all(step.peak_memory == simulated for step in run.steps)
    # on top of SGD's weights and gradients, the same activations, AdamW's state
    assert [a - s for a, s in zip(run.result.peak_memory, sgd.result.peak_memory)] == list(c.optimizer_bytes)


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["adamw", "adam", "sgd", "sgd-momentum"])
def test_each_optimizers_memory_in_the_estimate_is_the_measured_one(optimizer):
    """`sim.estimate(optimizer=)` holds on every rank what exec measures with that optimizer:
    the same weights, gradients, activations and state, to the byte, except the Adam
    family's float32 `step` scalar per parameter tensor (the planner counts bytes per
    parameter element): measured - predicted = 4 bytes x the rank's parameter tensors."""
    from exec.models.spec import ModelSpec
    from exec.pipeline.runner import run_pipeline
    spec = ModelSpec("gpt", layers=4, hidden=32, heads=2, seq=16, vocab=64, batch_size=8)
    run = run_pipeline(spec, "1f1b", 2, 4, steps=1, warmup=1, timeout=120, optimizer=optimizer)
    e = sim.estimate(spec.transformer(), "a100-80gb", pp=2, micro_batch=2, global_batch=8, precision="fp32",
                     schedule="1f1b", optimizer=optimizer)
    tensors = [len(list(st.parameters())) for st in spec.build_stages(2, bounds=run.bounds)]
    scalars = [4 * n if optimizer.startswith("adam") else 0 for n in tensors]
    assert [m - p for m, p in zip(run.result.peak_memory, e.peak_memory)] == scalars


@pytest.mark.parametrize("model", ["mlp", "gpt"])
def test_calibrated_activation_bytes_are_what_the_runtime_holds(model):
    """The activation bytes the calibration measures for each stage (the last one saves its
    targets for the loss) equal what the runtime counts while it holds a micro-batch in a
    step: both on micro-batches with storage of their own. One rank, both stages on it,
    no process group needed."""
    from exec.measure.calibrate import activation_bytes, stage_inputs
    from exec.runtime.check import split_micro_batches
    from exec.runtime.interpreter import RankInterpreter
    from exec.launch.processes import RankContext
    from exec.models.spec import ModelSpec
    spec = ModelSpec(model, layers=2, hidden=16, seq=4, batch_size=8)
    micro = 4
    bounds = [0, spec.num_layers // 2, spec.num_layers]
    # naive order, both stages on rank 0: 0F m, 1F m, 1B m, 0B m for each micro-batch m
    schedule = sim.Schedule([[f"{s}{k}{m}" for m in range(micro) for s, k in ((0, "F"), (1, "F"), (1, "B"), (0, "B"))]],
                            placement=[0, 0])
    stages = spec.build_stages(2, bounds=bounds)
    layers = spec.build_layers()
    xs, ys = split_micro_batches(*spec.batch(), micro)
    interp = RankInterpreter(RankContext(0, 1, 0, "gloo"), sim.compile(schedule, "gloo"), dict(enumerate(stages)),
                             xs, ys, spec.loss, {}, 0)
    trace = interp.run()
    held = [b for _, b in trace.memory]  # static (0), after 0F0, after 1F0, ...
    runtime = {0: held[1] - held[0], 1: held[2] - held[1]}
    for s in (0, 1):
        x, y = stage_inputs(spec, layers, bounds, s, micro)[0]
        act, _ = activation_bytes(stages[s], x, s == 1, spec.loss, y, micro)
        assert act == runtime[s], (s, act, runtime[s])


def test_calibration_times_the_runtimes_own_work_around_a_compute(monkeypatch):
    """The calibration runs the interpreter's handlers and splits their time at the marks a
    step records: work the runtime does before a forward's start mark (here: setting up the
    count of saved bytes, made slower) shows in `before`, work after a compute's end mark
    (recording its activations, made slower) in `after`, and neither in the compute times.
    One rank, in this process.

    No bound here depends on how loaded the machine is. On the real clock the injected
    sleeps are lower bounds only (a sleep never ends early). Then on a clock that moves
    only while the injected work runs, every split is exact: the work before the start
    mark in `before`, the work after the end mark in `after`, nothing in the computes."""
    import time
    import torch.distributed as dist
    from exec.measure.calibrate import compute_times
    from exec.runtime.clocks import CpuClock
    from exec.runtime.interpreter import RankInterpreter
    from exec.launch.processes import RankContext
    from exec.runtime.memory import SavedBytes
    from exec.models.spec import ModelSpec
    spec = ModelSpec("mlp", layers=2, hidden=16, seq=4, batch_size=4)
    program = sim.compile(sim.make_schedule("gpipe", 1, 2), "gloo")  # F0 F1 B0 B1
    forward = [i % 4 < 2 for i in range(2 * 4)]            # 2 timed steps x (F0 F1 B0 B1)
    before, after = 2.0 ** -8, 2.0 ** -9                   # about 4 and 2 ms, exact in binary
    saved_init, memory = SavedBytes.__init__, RankInterpreter._memory

    def inject(spend):
        monkeypatch.setattr(SavedBytes, "__init__", lambda self, p: (spend(before), saved_init(self, p))[1])
        monkeypatch.setattr(RankInterpreter, "_memory", lambda self, *a, **kw: (spend(after), memory(self, *a, **kw))[1])

    now = [0.0]

    def work(seconds):  # the only thing that moves the clock below
        now[0] += seconds

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        ctx = RankContext(0, 1, 0, "gloo")
        inject(time.sleep)
        _, real = compute_times(ctx, spec, [0, 2], program, 2, steps=2, alone=False)
        monkeypatch.setattr(CpuClock, "mark", lambda self: now[0])
        inject(work)
        times, own = compute_times(ctx, spec, [0, 2], program, 2, steps=2, alone=False)
    finally:
        dist.destroy_process_group()
    assert len(real["before"]) == len(real["after"]) == 2 * 2 * 2   # 2 steps x (2 F + 2 B)
    assert all(b >= before for b, f in zip(real["before"], forward) if f)
    assert all(a >= after for a in real["after"])                   # F and B both record
    assert own["before"] == [before if f else 0.0 for f in forward]
    assert own["after"] == [after] * 8
    assert set(times) == {(0, "F"), (0, "B")} and all(t == 0.0 for ts in times.values() for t in ts)


def test_profile_costs_refuses_a_backend_it_cannot_time():
    from exec.models.spec import ModelSpec
    from exec.pipeline.profile import profile_costs
    with pytest.raises(ValueError, match="gloo only"):
        profile_costs(ModelSpec("mlp", layers=2, hidden=16, seq=4, batch_size=4), "gpipe", 2, 2, backend="nccl")


def test_sharing_check_recognises_processor_sharing():
    from exec.measure.compare import sharing_check
    # alone an F takes 1 s, with the other rank computing 2 s: rank 0 runs alone for 0.5 s,
    # shares for 1 s (0.5 s of work), ends at 1.5; rank 1 shares 0.5..1.5, ends alone at 2.0
    sched = sim.make_schedule("gpipe", 2, 1)
    events = [sim.Event(0, sim.Action.parse("0F0"), 0.0, 1.5), sim.Event(1, sim.Action.parse("1F0"), 0.5, 2.0)]
    measured = sim.Result(sched, events, [[(0.0, 0.0)]] * 2, [[(0.0, 0)]] * 2, source="measured")
    got = sharing_check(measured, sim.Costs(forward=1.0), sim.Costs(forward=2.0))
    assert got["sharing_median_abs_err"] == pytest.approx(0.0)
    assert got["alone_median_abs_err"] == pytest.approx(1 / 3) and got["concurrent_median_abs_err"] == pytest.approx(1 / 3)
    assert got["overlap_share_median"] == pytest.approx(2 / 3)
