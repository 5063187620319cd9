"""What a new user trips over in the planner (issue 36): ZeRO-2 with pipelining, the memory headroom, size guards, ties, a warning past the published scale (the command lines' checks are in tests/sim/plan/test_cli.py, tests/sim/test_cli.py, tests/exec/test_run_cli.py)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

import sim
import sim.model.registry
import sim.limits
import sim.plan
from sim.hardware.network import collective_time, links_of
from sim.plan import layout as plan_layout
from sim.plan.layout import DEFAULT_HEADROOM, usable_memory
from sim.plan.planner import TOO_LARGE, rank_key

ROOT = Path(__file__).resolve().parents[3]
SMALL = sim.Transformer(layers=4, hidden=256, heads=4, seq=128, vocab=1024)  # gpt: tied, learned positions, biases


def hand_params(model: sim.Transformer) -> int:
    """Narayanan et al. 2021, Eq. 2 for a GPT (12h^2 + 13h a layer, (V + s)h of embedding),
    plus the final LayerNorm's 2h."""
    h = model.hidden
    return model.layers * (12 * h * h + 13 * h) + (model.vocab + model.seq) * h + 2 * h


# ---------------------------------------------------------------- 1. ZeRO-2 and pipelining

def test_zero2_with_pipelining_is_refused_in_one_line():
    """DeepSpeed's pipeline engine refuses ZeRO-2 and -3; Megatron's distributed optimizer is ZeRO-1."""
    with pytest.raises(ValueError, match=r"zero=2 with pp > 1.*use zero <= 1") as err:
        sim.estimate("megatron-1.7b", tp=1, pp=2, dp=2, global_batch=16, zero=2)
    assert "\n" not in str(err.value)


def test_no_searched_row_with_pipelining_is_zero2_and_its_zero3_rows_are_fsdp():
    """With pp > 1 the search never proposes ZeRO-2 (each micro-batch's gradients reduce-scattered:
    refused), and ZeRO-3 is FSDP: gathers as actions, the gradients held whole until the stage's
    reduce-scatter."""
    plan = sim.plan.search("megatron-1.7b", "a100-80gb", gpus=16, global_batch=64, top=None, max_step_time=10.0)
    assert plan.rows and any(r.config.pp > 1 for r in plan.rows)
    assert all(r.config.zero != 2 for r in plan.rows if r.config.pp > 1)
    fsdp = next(r.config for r in plan.rows if r.config.pp > 1 and r.config.zero == 3)
    e = sim.estimate("megatron-1.7b", "a100-80gb", **fsdp.keywords())
    assert any(ev.action.kind is sim.Kind.UNSHARD for ev in e.result.events)
    assert e.memory_parts[0]["grads"] == pytest.approx(4 * e.memory_parts[0]["weights"] * fsdp.dp * fsdp.cp / 2)


@pytest.mark.parametrize("micro_batches", [1, 4, 8])
def test_zero2_holds_a_dp_share_of_the_gradients_and_reduces_each_micro_batch(micro_batches):
    """Hand count, pp = 1, dp = 4, m micro-batches: ZeRO-1 holds every fp32 gradient (4 bytes a
    parameter) through the m micro-batches; ZeRO-2 a quarter, because it reduce-scatters the
    gradients after each micro-batch's backward (DeepSpeed's stage 2): m reduce-scatters of
    the whole gradient in the step, where ZeRO-1 does one, after the last."""
    dp, params = 4, hand_params(SMALL)
    kw = dict(tp=1, pp=1, dp=dp, micro_batch=1, global_batch=dp * micro_batches)
    one, two = (sim.estimate(SMALL, zero=z, **kw) for z in (1, 2))
    assert one.memory_parts[0]["grads"] == pytest.approx(4 * params)
    assert two.memory_parts[0]["grads"] == pytest.approx(4 * params / dp)
    assert one.memory_parts[0]["optimizer"] == two.memory_parts[0]["optimizer"] == pytest.approx(12 * params / dp)
    scatter = collective_time(links_of(two.profile), "reduce_scatter", 4 * params, two.layout.topology().group("dp"))
    assert two.time_parts["zero_collectives"] == pytest.approx(micro_batches * scatter)
    assert one.time_parts["zero_collectives"] == 0.0


# ---------------------------------------------------------------- 2. memory headroom

def test_headroom_is_a_fraction_or_bytes():
    assert usable_memory(100.0, 0.1) == pytest.approx(90.0)
    assert usable_memory(100.0, 0) == 100.0
    assert usable_memory(100.0, 30.0) == 70.0
    for bad in (-0.1, 100.0, float("nan"), True, "10%"):
        with pytest.raises(ValueError, match="memory_headroom"):
            usable_memory(100.0, bad)
    assert DEFAULT_HEADROOM == 0.10


def test_a_peak_within_the_headroom_does_not_fit_and_says_why():
    """A layout whose peak lies between the usable memory and the GPU's fits only with no headroom."""
    kw = dict(tp=1, pp=1, dp=1, micro_batch=1, global_batch=1)
    bare = sim.estimate("megatron-1.7b", "a100-80gb", memory_headroom=0, **kw)
    peak, memory = max(bare.peak_memory), bare.profile.memory
    assert bare.fits and not bare.warnings
    room = (memory - peak) + 2**30  # a headroom that the peak reaches into
    kept = sim.estimate("megatron-1.7b", "a100-80gb", memory_headroom=room, **kw)
    assert not kept.fits and kept.usable_memory == memory - room
    assert any("headroom" in w for w in kept.warnings)
    assert kept.summary()["usable_memory"] == memory - room


def test_the_search_ranks_only_rows_within_the_usable_memory():
    plan = sim.plan.search("megatron-1.7b", "a100-80gb", gpus=8, global_batch=32, top=None, max_step_time=10.0,
                           memory_headroom=0.3)
    assert plan.usable_memory == pytest.approx(0.7 * plan.gpu.memory)
    assert plan.rows and all(r.peak_memory <= plan.usable_memory for r in plan.rows)


# ---------------------------------------------------------------- 5. size guards

def test_a_step_too_large_to_simulate_is_refused_before_any_work():
    with pytest.raises(ValueError, match="step too large to simulate in seconds") as err:
        sim.estimate("gpt3-175b", tp=1, pp=64, global_batch=100_000)
    assert "\n" not in str(err.value) and "6,400,000 stage-micro-batches" in str(err.value)


def test_a_step_too_large_for_this_machine_is_refused_by_the_host_guard(monkeypatch):
    """Within `MAX_CELLS` but beyond what this machine's memory holds: `sim.limits`' one line, at
    `sim.estimate`'s entry; the layout itself stays valid (its check never asks the host)."""
    monkeypatch.setattr(sim.limits, "machine_memory", lambda: 2 * sim.limits.BASE_BYTES)
    with pytest.raises(sim.limits.StepTooLarge, match="step too large for this machine: 64 stage-micro-batches"):
        sim.estimate("megatron-1.7b", pp=8, global_batch=8)
    lay = plan_layout.Layout(pp=8, global_batch=8)
    assert plan_layout.check_layout(sim.MODELS["megatron-1.7b"], sim.profile("a100-80gb"), lay) == []


def test_the_search_skips_and_counts_steps_too_large(monkeypatch):
    """On a machine that can simulate 100 stage-micro-batches, 200 micro-batches of 1 are
    skipped and counted; 100 of 2 are simulated."""
    monkeypatch.setattr(sim.plan.planner, "most_cells", lambda: 100)  # asked once, at the search's entry
    plan = sim.plan.search("megatron-1.7b", "a100-80gb", gpus=8, global_batch=8 * 200, pp=[1], tp=[1],
                           micro_batch=[1, 2], recompute="none", zero=[0])
    assert plan.dropped[TOO_LARGE] == 1
    assert [(r.config.micro_batch, r.micro_batches) for r in plan.rows] == [(2, 100)]


# ---------------------------------------------------------------- 8. the errors say the real reason

@pytest.mark.parametrize("kw, words", [
    (dict(pp=[128]), "more stages than the model's 24 layers"),
    (dict(pp=[3]), "not a multiple of pp=3"),
    (dict(tp=[2], pp=[16]), "tp*pp = 2*16 = 32"),
])
def test_sizes_given_are_refused_by_their_real_reason(kw, words):
    with pytest.raises(ValueError, match=words.replace("*", r"\*")):
        sim.plan.search("megatron-1.7b", "a100-80gb", gpus=16, global_batch=64, **kw)


def test_a_pp_given_alone_skips_the_tp_sizes_it_does_not_divide():
    plan = sim.plan.search("megatron-1.7b", "a100-80gb", gpus=16, global_batch=64, pp=[16], top=None,
                           max_step_time=100.0)
    assert {r.config.tp for r in plan.points} == {1}


def test_a_tp_beyond_a_node_runs_in_the_search_as_in_the_estimate():
    plan = sim.plan.search("gpt3-175b", "a100-80gb", gpus=256, global_batch=64, tp=[16], pp=[16], top=1,
                           recompute="full", zero=[1])
    assert plan.best is not None and plan.best.config.tp == 16


# ---------------------------------------------------------------- 9. ties

def test_ties_break_by_memory_then_the_configuration_so_any_top_agrees():
    """megatron-1.7b on 16 GPUs has rows of equal step time (ZeRO-1 and -2 at one micro-batch):
    every `top` ranks the same rows first."""
    full = sim.plan.search("megatron-1.7b", "a100-80gb", gpus=16, global_batch=64, top=10)
    times = [rank_key(r)[0] for r in full]  # to 12 significant digits
    tied = next(i for i in range(len(times) - 1) if times[i] == times[i + 1])
    assert [rank_key(r) for r in full] == sorted(rank_key(r) for r in full)
    assert full[tied].peak_memory <= full[tied + 1].peak_memory
    for top in (1, tied + 1):
        assert [r.config for r in sim.plan.search("megatron-1.7b", "a100-80gb", gpus=16, global_batch=64,
                                                  top=top)] == [r.config for r in full[:top]]





# ---------------------------------------------------------------- 10. more GPUs than any published run


def test_more_gpus_than_any_published_run_says_so():
    plan = sim.plan.search("megatron-1.7b", "a100-80gb", gpus=32_768, global_batch=32_768, tp=[1], pp=[1],
                           micro_batch=[1], recompute="none", zero=[0])
    assert plan.rows and len(plan.warnings) == 1 and "32,768 GPUs: more than the 16,384" in plan.warnings[0]
    assert plan.summary()["warnings"] == plan.warnings
    assert not sim.plan.search("megatron-1.7b", "a100-80gb", gpus=8, global_batch=8, tp=[1], pp=[1],
                               micro_batch=[1], recompute="none", zero=[0]).warnings
