"""exec.runtime.split_backward: I makes only the input gradient and keeps what W needs, W only the
weight gradients; together they are the full backward, in values, in work and in memory.

In this process: the gradients against a full backward, what each half touches, the bytes
kept, and the work (the matrix products' operations, counted). On two gloo ranks: split schedules with two stages per rank (the V
shape, interleaved) train as one process does, and calibration measures I, W and the bytes
W keeps so that the simulated peak memory is the measured one.
"""
from __future__ import annotations

import statistics

import pytest

torch = pytest.importorskip("torch")

import sim  # noqa: E402
from sim.schedule.registry import TEXTBOOK  # noqa: E402
from sim.schedule.textbook import gpipe_on  # noqa: E402
from exec.measure.calibrate import activation_bytes, stage_inputs, w_activation_bytes  # noqa: E402
from exec.runtime.check import compare_grads, reference_step  # noqa: E402
from exec.measure.compare import breakdown, compare  # noqa: E402
from exec.launch.processes import launch  # noqa: E402
from exec.runtime.memory import SavedBytes, param_storages  # noqa: E402
from exec.models.spec import ModelSpec  # noqa: E402
from exec.pipeline.config import RunConfig  # noqa: E402
from exec.pipeline.runner import run_pipeline  # noqa: E402
from exec.pipeline.worker import pipeline_worker  # noqa: E402
from exec.runtime.split_backward import backward_input, backward_weight  # noqa: E402

TIMEOUT = 120  # seconds for any one launch
MLP = ModelSpec("mlp", layers=4, hidden=16, seq=4, batch_size=8)
GPT = ModelSpec("gpt", layers=2, hidden=16, seq=4, vocab=32, heads=2, batch_size=8)


def _stage_step(spec, stages: int, s: int, micro_batches: int = 2):
    """Stage s of `spec` cut in `stages`, its input (needing a gradient past stage 0), and
    a function that runs its forward under the runtime's count of saved bytes and returns
    (input, what the backward starts from, the count)."""
    bounds = spec.partition(stages)
    module = spec.build_stages(stages, bounds=bounds)[s]
    x, y = stage_inputs(spec, spec.build_layers(), bounds, s, micro_batches)[0]
    last = s == stages - 1

    def forward():
        inp = x.detach().clone().requires_grad_(s > 0)
        saved = SavedBytes(param_storages(module))
        with saved.hooks():
            out = module(inp)
            root = spec.loss(out, y) / micro_batches if last else out
        return inp, root, saved
    grad = None if last else torch.randn(module(x).shape, generator=torch.Generator().manual_seed(s))
    return module, forward, grad


@pytest.mark.parametrize("spec", [MLP, GPT], ids=["mlp", "gpt"])
@pytest.mark.parametrize("s", [0, 1, 2])
def test_input_then_weight_gradients_are_the_full_backward(spec, s):
    """I gives the input gradient of a full backward and touches no weight gradient; W then
    gives every weight gradient of the full backward and no input gradient; a second
    micro-batch's I and W add to them as B does."""
    module, forward, grad = _stage_step(spec, 3, s)
    params = list(module.parameters())
    x, root, _ = forward()
    torch.autograd.backward(root, grad)
    ref_dx, ref = x.grad, [p.grad.clone() for p in params]
    module.zero_grad(set_to_none=True)
    for step in (1, 2):
        x, root, _ = forward()
        dx, work = backward_input(root, grad, x, params)
        if step == 1:
            assert all(p.grad is None for p in params)  # I made no weight gradient
        if s > 0:
            assert torch.equal(dx, ref_dx)
        else:
            assert dx is None                        # the first stage's input needs no gradient
        backward_weight(work)
        assert x.grad is None                       # W made no input gradient
        for p, r in zip(params, ref):
            torch.testing.assert_close(p.grad, step * r, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("spec", [MLP, GPT], ids=["mlp", "gpt"])
def test_i_keeps_what_w_needs_and_w_gives_it_back(spec):
    """After I, the graph holds no more than F saved (the whole of it on the first stage,
    whose W is the whole backward; less on the last, whose loss W does not need); after
    W it holds nothing. The calibration counts the same bytes as the runtime."""
    stages = 3
    for s in range(stages):
        module, forward, grad = _stage_step(spec, stages, s)
        x, root, saved = forward()
        _, work = backward_input(root, grad, x, list(module.parameters()))
        del x, root
        kept = saved.kept_bytes()
        assert 0 < kept <= saved.nbytes
        if s == 0:
            assert kept == saved.nbytes
        if s == stages - 1:
            assert kept < saved.nbytes
        backward_weight(work)
        assert saved.kept_bytes() == 0
        bounds = spec.partition(stages)
        xin, y = stage_inputs(spec, spec.build_layers(), bounds, s, 2)[0]
        assert w_activation_bytes(module, xin, s == 0, s == stages - 1, spec.loss, y, 2) == kept
        assert activation_bytes(module, xin, s == stages - 1, spec.loss, y, 2)[0] == saved.nbytes


@pytest.mark.parametrize("spec", [ModelSpec("mlp", layers=2, hidden=512, seq=256, batch_size=1), GPT],
                         ids=["mlp-512", "gpt"])
def test_w_is_cheaper_than_b_and_i_plus_w_is_b(spec):
    """W costs less than B, and I + W is B: the split computes nothing twice. Counted in the
    floating-point operations of the matrix products (`torch.utils.flop_counter`), which do
    not depend on how loaded the machine is: I and W each do half of B's."""
    from torch.utils.flop_counter import FlopCounterMode
    module, forward, grad = _stage_step(spec, 2, 1, micro_batches=1)
    params = list(module.parameters())

    def flops(fn):
        with FlopCounterMode(display=False) as counter:
            out = fn()
        return counter.get_total_flops(), out
    x, root, _ = forward()
    b, _ = flops(lambda: torch.autograd.backward(root, grad))
    x, root, _ = forward()
    i, (_, work) = flops(lambda: backward_input(root, grad, x, params))
    w, _ = flops(lambda: backward_weight(work))
    assert 0 < w < b and i + w == b, (b, i, w)


# ---------------------------------------------------------------------------- real runs on two ranks

def v_1f1b_split(micro_batches: int) -> sim.Schedule:
    """A V-shaped 1F1B-like order with split backwards on 2 ranks: rank 0 holds stages 0 and
    3, rank 1 stages 1 and 2 (the two middle stages hand over locally); each micro-batch's
    W comes after the next micro-batch's I, filling the wait for it."""
    r0, r1 = [], []
    for m in range(micro_batches):
        r0 += [f"0F{m}"]
        r1 += [f"1F{m}", f"2F{m}"]
    for m in range(micro_batches):
        r0 += [f"3F{m}", f"3I{m}"] + ([f"3W{m - 1}"] if m else [])
    r0 += [f"3W{micro_batches - 1}"]
    for m in range(micro_batches):
        r1 += [f"2I{m}", f"1I{m}"]
        r0 += [f"0I{m}"]
    for m in range(micro_batches):
        r1 += [f"2W{m}", f"1W{m}"]
        r0 += [f"0W{m}"]
    return sim.Schedule([r0, r1], placement=[0, 1, 1, 0], micro_batches=micro_batches, name="v-1f1b-split")


def _many_runs(ctx, jobs):
    return [pipeline_worker(ctx, *job) for job in jobs]


def _cases():
    cases = [("interleaved-split-mlp", MLP, gpipe_on([0, 1, 0, 1], 2, split=True, name="interleaved-split")),
             ("v-split-gpt", GPT, gpipe_on([0, 1, 1, 0], 2, split=True, name="v-split"))]
    for name in sim.SCHEDULES:  # every generator of the zoo (the textbook ones: tests/exec/test_run.py)
        if name not in TEXTBOOK:
            cases.append((name, MLP, sim.make_schedule(name, 2, 4)))
    for name in ("dualpipe", "dualpipev", "interleaved-1f1b"):  # their overlapped pairs, run as two computes
        cases.append((f"{name}-overlap", MLP, sim.make_schedule(name, 2, 4, overlap=True)))
    return cases


@pytest.mark.slow
def test_split_schedules_with_two_stages_per_rank_train_as_one_process():
    cases = _cases()
    jobs = []
    for _, spec, schedule in cases:
        jobs.append((spec, sim.compile(schedule, "gloo"), spec.partition(schedule.chain), RunConfig(steps=1, warmup=0)))
    per_rank = launch(_many_runs, 2, jobs, timeout=TIMEOUT)
    for i, (name, spec, schedule) in enumerate(cases):
        grads = [(f"stage{s}.{n}", g) for s in range(schedule.chain)  # DualPipe: each copy holds the sum
                 for n, g in per_rank[schedule.rank_of(s)][i]["grads"][s]]
        ref_loss, ref_grads = reference_step(spec, schedule.micro_batches)
        ok, worst, where = compare_grads(grads, ref_grads)
        assert ok, f"{name}: gradients differ by up to {worst} at {where}"
        assert per_rank[0][i]["losses"][0] == pytest.approx(ref_loss, rel=1e-5)
        result = per_rank[0][i]["results"][-1]
        assert [result.activations[r][-1][1] for r in range(2)] == [0, 0]  # every micro-batch given back


@pytest.mark.slow
def test_calibrated_split_schedule_predicts_its_peak_memory():
    """The hand-written V-shaped split order on 2 ranks, calibrated in the run: its
    gradients are one process's, the costs hold I, W and the bytes W keeps per stage (all
    of F's on the first stage, less on the last), the simulated peak memory is the measured
    one, and the comparison covers I and W."""
    run = run_pipeline(MLP, v_1f1b_split(4), steps=1, warmup=0, calibrate=1, timeout=TIMEOUT)
    assert run.grad_match, (run.max_grad_diff, run.worst_param)
    c = run.costs.for_stages(4)
    assert all(t > 0 for t in c.backward_input + c.backward_weight)
    assert c.backward == tuple(i + w for i, w in zip(c.backward_input, c.backward_weight))
    samples = run.calibration["compute_samples"]["concurrent"]  # each kind's own samples, to its field
    assert c.backward_input == tuple(statistics.fmean(samples[f"{s}I"]) for s in range(4))
    assert c.backward_weight == tuple(statistics.fmean(samples[f"{s}W"]) for s in range(4))
    assert c.w_activation_bytes[0] == c.activation_bytes[0]
    assert c.w_activation_bytes[3] < c.activation_bytes[3]
    assert all(w <= a for w, a in zip(c.w_activation_bytes, c.activation_bytes))
    simulated = sim.simulate(run.schedule, run.costs)
    assert simulated.peak_memory == run.result.peak_memory
    assert simulated.peak_activations == run.result.peak_activations
    js = compare(run.result, run.costs).as_json()
    assert js["simulated_peak_memory"] == js["measured_peak_memory"]
    actions = breakdown(run.result, run.costs)["actions"]
    assert actions["1I"]["cost"] == c.backward_input[1] and actions["1W"]["cost"] == c.backward_weight[1]
