"""exec's front door: one options record for every entry point that starts ranks, and `ModelSpec.from_blocks`, a user's own torch blocks cut into stages and run under any schedule (2 gloo ranks against one process)."""
from __future__ import annotations

import inspect
import json
import pickle
from dataclasses import fields

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import sim  # noqa: E402
import exec  # noqa: E402
from exec.launch.processes import launch  # noqa: E402
from exec.pipeline import profile  # noqa: E402
from exec.pipeline.config import RunConfig, run_options, run_schedule  # noqa: E402
from exec.pipeline.worker import pipeline_worker  # noqa: E402
from exec.runtime.check import compare_grads, reference_step  # noqa: E402
from exec.torch_pipelining import runtime  # noqa: E402

TIMEOUT = 120  # seconds for any one launch
HIDDEN, VOCAB, SEQ, BATCH = 16, 32, 4, 8


def token_loss(output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Next-token cross entropy over (batch, seq, vocab) logits (module level: the ranks unpickle it)."""
    return F.cross_entropy(output.flatten(0, 1), targets.flatten())


def _token_model(blocks: int = 4) -> exec.ModelSpec:
    """An embedding, `blocks` LayerNorm-Linear-GELU blocks and a head, all torch's own modules."""
    torch.manual_seed(0)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ + 1))
    return exec.ModelSpec.from_blocks([nn.Sequential(nn.LayerNorm(HIDDEN), nn.Linear(HIDDEN, HIDDEN), nn.GELU())
                                       for _ in range(blocks)], ids[:, :-1], ids[:, 1:], token_loss,
                                      embedding=nn.Embedding(VOCAB, HIDDEN), head=nn.Linear(HIDDEN, VOCAB))


def _plain_model() -> exec.ModelSpec:
    """An nn.Sequential of four blocks, float inputs, mean squared error: no ends."""
    torch.manual_seed(1)
    seq = nn.Sequential(*[nn.Sequential(nn.Linear(HIDDEN, 2 * HIDDEN), nn.Tanh(), nn.Linear(2 * HIDDEN, HIDDEN))
                          for _ in range(4)])
    return exec.ModelSpec.from_blocks(seq, torch.randn(BATCH, SEQ, HIDDEN), torch.randn(BATCH, SEQ, HIDDEN))


TOKENS, PLAIN = _token_model(), _plain_model()


# ---------------------------------------------------------------------------- one options record

def test_every_entry_point_takes_the_model_the_schedule_and_one_record():
    for fn in (exec.run_pipeline, exec.run_torch_runtime, exec.profile_costs):
        assert list(inspect.signature(fn).parameters)[:5] == ["spec", "schedule", "devices", "micro_batches", "config"]
    names = {f.name for f in fields(RunConfig)}
    assert set(runtime.READS) < names and set(profile.READS) < names


@pytest.mark.parametrize("call, says", [
    (lambda: exec.run_torch_runtime(PLAIN, "1f1b", 2, 4, dp=2), r"run_torch_runtime does not take RunConfig.dp \(got 2\)"),
    (lambda: exec.run_torch_runtime(PLAIN, "1f1b", 2, 4, RunConfig(calibrate=1)), r"does not take RunConfig.calibrate"),
    (lambda: exec.profile_costs(PLAIN, "1f1b", 2, 4, warmup=0), r"profile_costs does not take RunConfig.warmup"),
    (lambda: exec.profile_costs(PLAIN, "1f1b", 2, 4, backend="nccl"), r"gloo only"),
    (lambda: exec.run_pipeline(PLAIN, sim.make_schedule("1f1b", 2, 4), 2, 8), r"micro_batches=8 but the schedule"),
    (lambda: exec.profile_costs(PLAIN, "gpipe", 2), r"a schedule name needs devices and micro_batches"),
])
def test_a_run_that_cannot_be_is_refused_before_any_rank_starts(call, says):
    with pytest.raises(ValueError, match=says):
        call()


def test_a_schedule_name_is_made_one_way():
    config = run_options("run_pipeline", None, {"dp": 2, "overlap_grad_reduce": True})
    made = run_schedule("run_pipeline", "1f1b", 2, 4, config)
    assert made.programs == sim.add_grad_reduce(sim.make_schedule("1f1b", 2, 4), True).programs
    assert run_schedule("run_pipeline", made, None, None, config) is made
    with pytest.raises(TypeError, match="schedule must be a sim.Schedule or a name"):
        run_schedule("run_pipeline", 2, 2, 4, config)
    with pytest.raises(TypeError, match="unexpected keyword argument 'step'"):
        run_options("run_pipeline", None, {"step": 1})


# ---------------------------------------------------------------------------- a user's own blocks

def test_user_blocks_are_layers_with_their_ends_on_the_first_and_last_stage():
    assert TOKENS.num_layers == 6 and TOKENS.ends == (1, 1) and PLAIN.ends == (0, 0)
    assert TOKENS.partition(2) == [0, 3, 6] and TOKENS.partition(4) == [0, 2, 3, 4, 6]
    assert PLAIN.partition(2) == [0, 2, 4] and PLAIN.batch_size == BATCH
    layers = TOKENS.build_layers()
    assert isinstance(layers[0], nn.Embedding) and isinstance(layers[-1], nn.Linear)
    mine = TOKENS.user.layers()
    for built, given in zip(layers, mine):   # fresh copies of the very weights
        for p, q in zip(built.parameters(), given.parameters()):
            assert p is not q and torch.equal(p, q)


@pytest.mark.parametrize("spec", [TOKENS, PLAIN], ids=["tokens", "plain"])
def test_stages_of_user_blocks_compute_the_whole_model(spec):
    """The stages, one after the other, give the loss of the model in one piece, and the
    spec survives the pickling that carries it to every rank."""
    x, y = spec.batch()
    whole = spec.loss(nn.Sequential(*spec.user.layers())(x), y).item()
    out = x
    for stage in spec.build_stages(3 if spec is PLAIN else 4):
        out = stage(out)
    assert spec.loss(out, y).item() == pytest.approx(whole, rel=1e-6)
    again = pickle.loads(pickle.dumps(spec))
    assert reference_step(again, 4)[0] == pytest.approx(whole, rel=1e-6)
    assert {spec: 0}[spec] == 0  # hashable: a rank's calibration keeps its inputs by spec
    json.dumps(spec.describe())  # profile_costs keeps it in its details


@pytest.mark.parametrize("make, says", [
    (lambda: exec.ModelSpec.from_blocks([], torch.zeros(2, 1), torch.zeros(2, 1)), "at least one torch module"),
    (lambda: exec.ModelSpec.from_blocks([nn.Linear(1, 1), "x"], torch.zeros(2, 1), torch.zeros(2, 1)),
     r"blocks\[1\] must be a torch.nn.Module"),
    (lambda: exec.ModelSpec.from_blocks([nn.Linear(1, 1)], torch.zeros(2, 1), torch.zeros(3, 1)),
     "inputs hold 2 samples but targets 3"),
    (lambda: exec.ModelSpec.from_blocks([nn.Linear(1, 1)], torch.zeros(2, 1), torch.zeros(2, 1), recompute="full"),
     "recompute your own blocks"),
    (lambda: exec.ModelSpec(model="blocks"), r"ModelSpec.from_blocks"),
])
def test_bad_user_blocks_are_refused_naming_what_is_wrong(make, says):
    with pytest.raises((TypeError, ValueError), match=says):
        make()


# ---------------------------------------------------------------------------- real ranks

CASES = [  # (id, spec, schedule): one and two stages per rank, fused and split backwards
    ("1f1b-tokens", TOKENS, sim.make_schedule("1f1b", 2, 4)),
    ("interleaved-tokens", TOKENS, sim.make_schedule("interleaved-1f1b", 2, 4, 2)),
    ("zb-h1-tokens", TOKENS, sim.make_schedule("zb-h1", 2, 4)),
    ("gpipe-plain", PLAIN, sim.make_schedule("gpipe", 2, 2)),
]


def _many_runs(ctx, jobs):
    """Several pipeline runs in the same two processes: one start-up for all of them."""
    return [pipeline_worker(ctx, *job) for job in jobs]


@pytest.mark.slow
def test_user_blocks_train_as_one_process_under_any_schedule():
    """Each case's first step on 2 gloo ranks: the loss and every gradient of one process
    on the whole batch (`exec.runtime.check.reference_step`), as tests/test_exec.py checks
    the built-in models; the second step's loss is lower (the optimizer stepped)."""
    jobs = [(spec, sim.compile(s, "gloo"), spec.partition(s.stages), RunConfig(steps=2, warmup=0)) for _, spec, s in CASES]
    per_rank = launch(_many_runs, 2, jobs, timeout=TIMEOUT)
    for i, (name, spec, s) in enumerate(CASES):
        grads = [(f"stage{st}.{n}", g) for st in range(s.stages)
                 for n, g in per_rank[s.rank_of(st)][i]["grads"][st]]
        ref_loss, ref_grads = reference_step(spec, s.micro_batches)
        ok, worst, where = compare_grads(grads, ref_grads)
        assert ok, f"{name}: gradients differ by up to {worst} at {where}"
        losses = per_rank[0][i]["losses"]
        assert losses[0] == pytest.approx(ref_loss, rel=1e-5) and losses[1] < losses[0], name


@pytest.mark.slow
def test_run_pipeline_takes_user_blocks_through_the_front_door():
    run = exec.run_pipeline(TOKENS, "1f1b", 2, 4, exec.RunConfig(steps=1, warmup=0, timeout=TIMEOUT))
    assert run.grad_match and run.loss_match, (run.max_grad_diff, run.worst_param)
    assert run.bounds == [0, 3, 6]
