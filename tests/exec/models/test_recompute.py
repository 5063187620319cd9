"""Activation recomputation in exec (`ModelSpec.recompute`): it changes what a stage keeps
and when it computes, never a number.

In this process: the bytes a stage keeps per micro-batch under full recompute against their
closed form (the blocks' inputs, b*s*h*4 bytes each, plus what the embedding and the head
keep, layer by layer from the tensors aten saves) and against Korthikanti et al. 2022,
Table 2 (sim.model.transformer); what selective recompute drops; the runtime's count of the same
bytes; a block's output and gradients with and without recompute, bitwise; how often a
split backward recomputes. On two gloo ranks: every mode trains as no recompute does and as
one process does, and calibrated costs predict the measured peak memory to the byte.
"""
from __future__ import annotations

from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")

import sim  # noqa: E402
from exec.measure.calibrate import activation_bytes, stage_inputs, w_activation_bytes  # noqa: E402
from exec.runtime.check import compare_grads, reference_step, split_micro_batches  # noqa: E402
from exec.runtime.interpreter import RankInterpreter  # noqa: E402
from exec.launch.processes import RankContext, launch  # noqa: E402
from exec.models.layers import Block, MLPBlock  # noqa: E402
from exec.models.spec import ModelSpec  # noqa: E402
from exec.pipeline.config import RunConfig  # noqa: E402
from exec.pipeline.runner import run_pipeline  # noqa: E402
from exec.pipeline.worker import pipeline_worker  # noqa: E402
from exec.runtime.split_backward import backward_input, backward_weight  # noqa: E402

TIMEOUT = 180  # seconds for any one launch
MLP = ModelSpec("mlp", layers=4, hidden=16, seq=4, batch_size=8)
GPT = ModelSpec("gpt", layers=2, hidden=16, seq=4, vocab=32, heads=2, batch_size=8)
MICRO = 2


def full_recompute_bytes(spec: ModelSpec, bounds, s: int, micro: int) -> int:
    """What stage s keeps per micro-batch under full recompute, in closed form: each block
    its input, b*s*h elements; the layers never recomputed what aten saves for them."""
    b, t, h, e = spec.batch_size // micro, spec.seq, spec.hidden, torch.empty((), dtype=spec.torch_dtype).element_size()
    first, last = bounds[s], bounds[s + 1]
    gpt = spec.model == "gpt"
    blocks = sum(1 for i in range(first, last) if not gpt or 0 < i < spec.num_layers - 1)
    n = blocks * b * t * h * e
    if not gpt and last == spec.num_layers:
        n += 2 * b * t * h * e                  # mse_loss saves its input and the targets
    if gpt and first == 0:
        n += b * t * 8                          # the token ids (int64); the positions are a slice of their table
    if gpt and last == spec.num_layers:
        n += (b * t * h * e + 2 * b * t * 4     # LayerNorm: its input, mean and rstd (float32)
              + b * t * h * e                   # the LM head's input
              + b * t * spec.vocab * e          # cross entropy: the log-softmax output,
              + b * t * 8 + 4)                  # the int64 targets and nll_loss's total weight
    return n


def _stage_bytes(spec: ModelSpec, micro: int = MICRO):
    bounds = spec.partition(2)
    layers, stages = spec.build_layers(), spec.build_stages(2, bounds=bounds)
    out = []
    for s in (0, 1):
        x, y = stage_inputs(spec, layers, bounds, s, micro)[0]
        act, _ = activation_bytes(stages[s], x, s == 1, spec.loss, y, micro)
        w = w_activation_bytes(stages[s], x, s == 0, s == 1, spec.loss, y, micro)
        out.append((act, w))
    return bounds, out


@pytest.mark.parametrize("base", [MLP, GPT, replace(GPT, layers=4, seq=8, hidden=32)], ids=["mlp", "gpt", "gpt-wider"])
def test_full_recompute_keeps_the_block_inputs(base):
    spec = replace(base, recompute="full")
    bounds, got = _stage_bytes(spec)
    for s, (act, w) in enumerate(got):
        assert act == full_recompute_bytes(spec, bounds, s, MICRO), (s, act)
    _, none = _stage_bytes(base)
    assert all(f[0] < n[0] for f, n in zip(got, none))
    # W's recompute needs the block inputs only: a stage whose input needs a gradient keeps
    # no more than them (and what W needs of the head) from I to W; the first stage keeps all
    assert got[0][1] == got[0][0] and got[1][1] < got[1][0]


def test_a_block_keeps_what_korthikanti_table_2_says_under_full_recompute():
    """Table 2's full-recompute row, 2sbh bytes a layer in 16-bit, is the layer's input; here
    in float32: twice it. A middle stage of a GPT holds blocks only."""
    spec = ModelSpec("gpt", layers=3, hidden=32, seq=8, vocab=32, heads=4, batch_size=8, recompute="full")
    bounds = [0, 1, 3, 5]  # embedding | two blocks | block, head
    layers = spec.build_layers()
    x, y = stage_inputs(spec, layers, bounds, 1, MICRO)[0]
    act, _ = activation_bytes(torch.nn.Sequential(*layers[1:3]), x, False, spec.loss, y, MICRO)
    table2 = sim.Transformer(layers=3, hidden=32, heads=4, seq=8, vocab=32).activation_bytes_per_layer(
        micro_batch=spec.batch_size // MICRO, recompute="full")
    assert act == 2 * 2 * table2


def test_selective_recompute_drops_the_attention_cores_saved_tensors():
    """Selective recompute keeps what the attention core alone saved: torch's CPU flash
    attention keeps its output and its logsumexp (b x heads x s, float32) but never the s x s
    softmax, and its output, laid out (b, s, heads, d), stays saved as the projection's input
    (a view of it). So the saving is the logsumexp per block, and a GPT of this size keeps
    less under full recompute than under selective."""
    sel = replace(GPT, recompute="selective")
    _, none = _stage_bytes(GPT)
    _, got = _stage_bytes(sel)
    lse = (GPT.batch_size // MICRO) * GPT.heads * GPT.seq * 4
    assert [n[0] - g[0] for n, g in zip(none, got)] == [lse, lse]  # one block per stage
    _, full = _stage_bytes(replace(GPT, recompute="full"))
    assert all(f[0] < g[0] for f, g in zip(full, got))


@pytest.mark.parametrize("spec", [replace(MLP, recompute="full"), replace(GPT, recompute="full"),
                                  replace(GPT, recompute="selective")], ids=["mlp-full", "gpt-full", "gpt-selective"])
def test_the_runtime_holds_the_calibrated_bytes(spec):
    """One rank runs both stages in the naive order; what it holds while it holds one
    micro-batch of a stage is what calibration measures for that stage."""
    bounds = spec.partition(2)
    schedule = sim.Schedule([[f"{s}{k}{m}" for m in range(MICRO) for s, k in ((0, "F"), (1, "F"), (1, "B"), (0, "B"))]],
                            placement=[0, 0], micro_batches=MICRO)
    stages = spec.build_stages(2, bounds=bounds)
    xs, ys = split_micro_batches(*spec.batch(), MICRO)
    trace = RankInterpreter(RankContext(0, 1, 0, "gloo"), sim.compile(schedule, "gloo"), dict(enumerate(stages)), xs, ys,
                            spec.loss, {}, 0).run()
    held = [b for _, b in trace.memory]
    _, calibrated = _stage_bytes(spec)
    assert [held[1] - held[0], held[2] - held[1]] == [calibrated[0][0], calibrated[1][0]]


def _counted(block):
    """Count the calls of the block's body (the forward and each recomputation of it)."""
    calls = [0]
    body = block._forward

    def counting(*args):
        calls[0] += 1
        return body(*args)
    block._forward = counting
    return calls


@pytest.mark.parametrize("make", [lambda r: MLPBlock(16, 64, r), lambda r: Block(16, 2, r)], ids=["mlp", "gpt"])
@pytest.mark.parametrize("split", [False, True], ids=["B", "I+W"])
def test_recompute_gives_the_same_numbers_and_recomputes_once_per_backward(make, split):
    """A block with full recompute: the output, input gradient and weight gradients of one
    without, bitwise. B recomputes the forward once; I recomputes it, and W once more (not
    once per weight group): torch's checkpoint hands each recomputed tensor out once per
    backward call, and I runs the nodes whose inputs W needs."""
    torch.manual_seed(0)
    plain = make("none")
    recomputing = make("full")
    recomputing.load_state_dict(plain.state_dict())
    x = torch.randn(2, 4, 16)
    g = torch.randn(2, 4, 16)
    results = []
    for block in (plain, recomputing):
        calls = _counted(block)
        inp = x.clone().requires_grad_()
        out = block(inp)
        counts = [calls[0]]
        if split:
            dx, work = backward_input(out, g, inp, list(block.parameters()))
            counts.append(calls[0])
            del out
            backward_weight(work)
        else:
            out.backward(g)
            dx = inp.grad
        counts.append(calls[0])
        results.append((dx, [p.grad for p in block.parameters()], counts))
    (dx0, g0, c0), (dx1, g1, c1) = results
    assert torch.equal(dx0, dx1) and all(torch.equal(a, b) for a, b in zip(g0, g1))
    assert c0 == ([1, 1, 1] if split else [1, 1])
    assert c1 == ([1, 2, 3] if split else [1, 2])


def test_bad_recompute_is_refused():
    with pytest.raises(ValueError, match="recompute must be one of none, selective, full"):
        ModelSpec(recompute="some")
    with pytest.raises(ValueError, match="only model 'gpt' has; use recompute='full'"):
        ModelSpec("mlp", recompute="selective")


# ---------------------------------------------------------------------------- two gloo ranks

def _many_runs(ctx, jobs):
    return [pipeline_worker(ctx, *job) for job in jobs]


@pytest.mark.slow
def test_every_recompute_mode_trains_as_without_it():
    """On 2 ranks, 3 AdamW steps: with recompute, the first step's gradients and every
    step's loss (so the trained weights) are those without, bitwise, and the gradients are
    one process's. Plain, split (ZB-H1) and GPipe orders."""
    cases = [(replace(MLP, recompute=r), name) for name in ("1f1b", "zb-h1") for r in ("none", "full")]
    cases += [(replace(GPT, recompute=r), name) for name in ("gpipe", "zb-h1") for r in ("none", "full", "selective")]
    jobs = []
    for spec, name in cases:
        program = sim.compile(sim.make_schedule(name, 2, 4), "gloo")
        jobs.append((spec, program, spec.partition(2), RunConfig(steps=3, warmup=0, optimizer="adamw")))
    per_rank = launch(_many_runs, 2, jobs, timeout=TIMEOUT)
    base = {}
    for i, (spec, name) in enumerate(cases):
        grads = [(f"stage{s}.{n}", g) for s in (0, 1) for n, g in per_rank[s][i]["grads"][s]]
        losses = per_rank[0][i]["losses"]
        key = (spec.model, name)
        if spec.recompute == "none":
            base[key] = (grads, losses)
            ref_loss, ref_grads = reference_step(spec, 4)
            ok, worst, where = compare_grads(grads, ref_grads)
            assert ok, f"{key}: gradients differ from one process by up to {worst} at {where}"
            continue
        plain_grads, plain_losses = base[key]
        assert losses == plain_losses, (key, spec.recompute)
        assert all((g == p).all() for (_, g), (_, p) in zip(grads, plain_grads)), (key, spec.recompute)


@pytest.mark.slow
@pytest.mark.parametrize("spec, name", [(replace(GPT, recompute="full"), "1f1b"),
                                        (replace(MLP, recompute="full"), "zb-h1")], ids=["gpt-1f1b", "mlp-zb-h1"])
def test_calibrated_recompute_predicts_the_measured_peak_memory(spec, name):
    """Calibrated inside the run with full recompute and AdamW: the activation bytes are the
    closed form, W keeps the block inputs only, the static memory is weights, gradients and
    two moments as without recompute, and every step's measured peak memory per rank is the
    simulated one, to the byte."""
    run = run_pipeline(spec, name, 2, 4, steps=2, warmup=0, calibrate=1, timeout=TIMEOUT, optimizer="adamw")
    assert run.grad_match, (run.max_grad_diff, run.worst_param)
    c = run.costs.for_stages(2)
    assert c.activation_bytes == tuple(float(full_recompute_bytes(spec, run.bounds, s, 4)) for s in (0, 1))
    stages = spec.build_stages(2, bounds=run.bounds)
    weights = [float(sum(p.numel() * p.element_size() for p in st.parameters())) for st in stages]
    tensors = [len(list(st.parameters())) for st in stages]
    assert c.weight_bytes == c.grad_bytes == tuple(weights)
    assert c.optimizer_bytes == tuple(2 * w + 4 * n for w, n in zip(weights, tensors))
    if name == "zb-h1":  # the last stage keeps only its blocks' inputs for W (mse's tensors go at I)
        blocks = run.bounds[2] - run.bounds[1]
        assert c.w_activation_bytes[1] == blocks * (spec.batch_size // 4) * spec.seq * spec.hidden * 4
    simulated = sim.simulate(run.schedule, run.costs).peak_memory
    assert all(step.peak_memory == simulated for step in run.steps)
