"""The planner (`sim.plan`, `python -m sim.plan`): its answers against an exhaustive loop over
`sim.estimate`, its bounds against the estimates they bound, its command line, and SageMaker's
reference configurations."""
from __future__ import annotations

import dataclasses
import itertools
import json

import pytest
from hypothesis import assume, given, settings, strategies as st

import sim
import sim.plan.planner as plan
from sim.hardware.profile import DEFAULT_PROFILES
from sim.model import sagemaker
from sim.plan import bounds as plan_bounds, published, space as plan_space
from sim.plan.layout import Layout
from sim.plan.planner import same_time
from sim.plan.cli import main
from sim.plan.figures import write_figures
from sim.model.transformer import RECOMPUTE

SMALL = dict(model="megatron-1.7b", gpu="a100-40gb", gpus=8, global_batch=32)
SMALL_SPACE = dict(schedules=["1f1b", "gpipe", "zb-h1", "zbv", "interleaved-1f1b", "dualpipe"], recompute=["none", "full"],
                   zero=[0, 1, 3])


def divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def exhaustive(model, gpu, gpus, global_batch, schedules, recompute, zero):
    """Every configuration of the documented space, by plain loops, each estimated; the
    space's rules written again here: tp a power of two within a node dividing the heads,
    pp up to the layers, pp*V dividing the layers for interleaved 1F1B (V = 2, 3, 4),
    pp = 1 only 1F1B, ZeRO > 0 only with dp > 1, sequence parallelism only with tp > 1, ZeRO-3
    with pp > 1 (FSDP) with reshard_after_forward on, and off too where a device holds V > 1 stages;
    what `sim.estimate` refuses (DualPipe's odd pp, too few micro-batches, ZeRO 2-3) left out."""
    m = sim.MODELS[model]
    out = []
    for tp in (1, 2, 4, 8):
        if gpus % tp or m.heads % tp:
            continue
        for pp in divisors(gpus // tp):
            dp = gpus // (tp * pp)
            if pp > m.layers or global_batch % dp:
                continue
            for b in [d for d in divisors(global_batch // dp) if d <= plan_space.MAX_MICRO_BATCH]:
                for name in (["1f1b"] if pp == 1 else schedules):
                    vs = [v for v in (2, 3, 4) if m.layers % (pp * v) == 0] if name == "interleaved-1f1b" else [None]
                    for v, r, z, sp, raf in itertools.product(vs, recompute, zero, (False, True), (True, False)):
                        if (z and dp == 1) or (sp and tp == 1):
                            continue
                        if not raf and (z != 3 or pp == 1 or (v or sim.SCHEDULES[name].virtual) == 1):
                            continue  # reshard_after_forward off differs only under FSDP with V > 1
                        try:
                            e = sim.estimate(m, gpu, tp=tp, pp=pp, dp=dp, micro_batch=b, global_batch=global_batch,
                                             schedule=name, virtual=v, recompute=r, zero=z, sequence_parallel=sp,
                                             reshard_after_forward=raf)
                        except (ValueError, sim.ScheduleError):
                            continue
                        out.append(e)
    return out


@pytest.fixture(scope="module")
def estimates():
    return exhaustive(**SMALL, **SMALL_SPACE)


@pytest.fixture(scope="module")
def small_plan():
    return plan.search(**SMALL, top=5, **SMALL_SPACE)


def test_top_rows_equal_the_exhaustive_best(estimates, small_plan):
    fitting = sorted(e.step_time for e in estimates if e.fits)
    assert len(fitting) > 5 and any(not e.fits for e in estimates)  # the memory limit bites
    assert [r.step_time for r in small_plan] == pytest.approx(fitting[:5], rel=1e-12)
    assert small_plan.simulated < len(estimates)  # the bounds spared some simulations


def test_every_configuration_is_enumerated_once(estimates):
    configs = plan_space.configurations(sim.MODELS[SMALL["model"]], SMALL["gpus"], SMALL["global_batch"], **SMALL_SPACE)
    assert len(set(configs)) == len(configs)
    found = {(e.layout.tp, e.layout.pp, e.layout.micro_batch, e.layout.schedule, e.result.schedule.stages // e.layout.pp,
              e.layout.recompute, e.layout.zero, e.layout.sequence_parallel, e.layout.reshard_after_forward)
             for e in estimates}
    mine = {(c.tp, c.pp, c.micro_batch, c.schedule, c.virtual, c.recompute, c.zero, c.sequence_parallel,
             c.reshard_after_forward) for c in configs}
    assert any(c.zero == 3 and c.pp > 1 and not c.reshard_after_forward for c in configs)  # FSDP with pipelines
    assert found == mine and len(estimates) == len(configs)  # the same space, every point of it valid


def test_bounds_never_exceed_the_estimate(estimates):
    """The memory bound and both step-time bounds are lower bounds of every estimate."""
    m, g = sim.MODELS[SMALL["model"]], sim.GPUS[SMALL["gpu"]]
    bounds = plan_bounds.Bounds(m, g)
    for e in estimates:
        c = e.layout.changed(virtual=e.result.schedule.stages // e.layout.pp)
        assert bounds.memory_average(c) <= bounds.memory(c) <= max(e.peak_memory) * (1 + 1e-9), c
        assert bounds.average(c) <= bounds.time(c) <= bounds.schedule_time(c) <= e.step_time * (1 + 1e-9), c


@pytest.mark.parametrize("schedule, pp, dp, v", [("naive", 8, 2, None), ("gpipe", 8, 2, None), ("1f1b", 16, 1, None),
                                                 ("interleaved-1f1b", 8, 2, 3), ("zbv", 8, 2, None),
                                                 ("zb-h2", 8, 1, None), ("dualpipev", 4, 2, None),
                                                 ("dualpipe", 4, 2, None), ("dualpipe", 8, 1, None)])
def test_bounds_hold_for_gpt3(schedule, pp, dp, v):
    """The same on GPT-3 175B (uneven stages where 96 layers do not split evenly), FSDP (zero=3,
    its gathers and reduce-scatters actions on the step) with reshard after forward on and off;
    DualPipe's two copies of the model (zero <= 1)."""
    m, g = sim.MODELS["gpt3-175b"], sim.GPUS["a100-80gb"]
    bounds = plan_bounds.Bounds(m, g)
    for r, z, raf in (("selective", 1, True), ("full", 0, True), ("selective", 3, True), ("full", 3, False)):
        if z == 3 and (dp == 1 or sim.SCHEDULES[schedule].pipelines > 1):  # nothing to shard; not modelled
            continue
        c = Layout(tp=8, pp=pp, dp=dp, schedule=schedule, virtual=v or sim.SCHEDULES[schedule].virtual, recompute=r,
                   zero=z, sequence_parallel=True, reshard_after_forward=raf, global_batch=32)
        e = sim.estimate(m, g, **c.keywords())
        assert bounds.memory_average(c) <= bounds.memory(c) <= max(e.peak_memory) * (1 + 1e-9)
        assert bounds.average(c) <= bounds.time(c) <= bounds.schedule_time(c) <= e.step_time * (1 + 1e-9)


@st.composite
def problems(draw):
    """A small random model, GPU and cluster: (model, gpu, gpus, global batch, gpus per node)."""
    heads = draw(st.sampled_from([2, 4, 8]))
    arch = draw(st.sampled_from(["gpt", "llama"]))
    m = sim.Transformer(layers=draw(st.integers(2, 12)), hidden=heads * draw(st.sampled_from([16, 32, 64])),
                        heads=heads, seq=draw(st.sampled_from([64, 256])), vocab=draw(st.sampled_from([512, 1000])),
                        kv_heads=heads // draw(st.sampled_from([1, 2])) if arch == "llama" else None, arch=arch,
                        attention=draw(st.sampled_from(["unfused", "flash"])),
                        mlp=draw(st.sampled_from([None, "squared-relu"])))
    gpus = draw(st.sampled_from([2, 4, 8, 16]))
    return m, draw(st.sampled_from(sorted(DEFAULT_PROFILES))), gpus, gpus * draw(st.integers(1, 4)), \
        draw(st.sampled_from([2, 4, 8]))


@settings(max_examples=100, deadline=None)
@given(problems(), st.sampled_from(["bf16", "fp16"]), st.sampled_from(["even", "balanced"]),
       st.sampled_from([None, 1, 4]), st.randoms(use_true_random=False))
def test_bounds_never_exceed_the_estimate_of_random_layouts(problem, precision, partition, nics, rnd):
    """Each bound, on a few configurations of a random problem's space (zb-auto, built
    under the run's own costs, included): the memory bounds at most the estimate's peak,
    each step-time bound at least the one before it and at most the estimate's step; the
    path bound the step itself where there is one device."""
    m, gpu, gpus, batch, per_node = problem
    run = Layout(precision=precision, gpus_per_node=per_node, nics_per_node=nics, partition=partition)
    configs = [c for c in plan_space.configurations(m, gpus, batch, schedules=list(sim.SCHEDULES), run=run,
                                                    max_micro_batch=4)
               if c.schedule != "zb-auto" or (c.pp <= 4 and batch // (c.dp * c.micro_batch) <= 6)]  # its search: seconds
    bounds = plan_bounds.Bounds(m, sim.GPUS[gpu])
    for c in rnd.sample(configs, min(4, len(configs))):
        try:
            e = sim.estimate(m, gpu, **c.keywords())
        except (ValueError, sim.ScheduleError):
            continue
        assert bounds.memory_average(c) <= bounds.memory(c) <= max(e.peak_memory) * (1 + 1e-9), c
        assert bounds.average(c) <= bounds.time(c) <= bounds.schedule_time(c) <= e.step_time * (1 + 1e-9), c
        if c.pp == 1:  # one device: the path is all its computes, then its reduction: the step itself
            assert bounds.time(c) == pytest.approx(e.step_time, rel=1e-9), c


@settings(max_examples=25, deadline=None)
@given(problems(), st.integers(1, 6), st.floats(0.2, 1.0), st.randoms(use_true_random=False))
def test_pruned_search_ranks_as_an_exhaustive_loop(problem, top, room, rnd):
    """On a random problem (a random part of the space, a GPU memory that leaves some
    configurations out), the search's rows are the `top` fastest that fit by an estimate
    of every configuration, in `rank_key`'s order (step time, peak memory, the configuration's
    fields); with top=None and max_step_time, every fitting one at least that fast."""
    m, gpu, gpus, batch, per_node = problem
    space = dict(schedules=rnd.sample(plan_space.DEFAULT_SCHEDULES, 4), recompute=rnd.sample(RECOMPUTE, 2),
                 max_micro_batch=2, gpus_per_node=per_node)
    configs = plan_space.configurations(m, gpus, batch, run=Layout(memory_headroom=0, gpus_per_node=per_node), **space)
    everything = []
    for i, c in enumerate(configs):
        try:
            e = sim.estimate(m, gpu, **c.keywords(), **plan_space.schedule_options(c))
        except (ValueError, sim.ScheduleError):
            continue
        everything.append((e.step_time, i, max(e.peak_memory), c))
    assume(everything)
    peaks = sorted(p for _, _, p, _ in everything)
    g = dataclasses.replace(sim.profile(gpu), gpu=dataclasses.replace(sim.GPUS[gpu], memory=int(peaks[int(room * (len(peaks) - 1))])))
    fitting = sorted(x for x in everything if x[2] <= g.memory)
    ranked = sorted(fitting, key=lambda x: (same_time(x[0]), x[2], *(getattr(x[3], k) for k in RANKED),
                                            not x[3].reshard_after_forward, x[3].overlap))[:top]  # rank_key: FSDP2's default first
    found = plan.search(m, g, gpus, batch, top=top, memory_headroom=0, **space)
    assert [(r.config, r.step_time) for r in found] == [(c, t) for t, _, _, c in ranked]
    assert found.simulated <= len(everything)
    limit = fitting[len(fitting) // 2][0]
    every = plan.search(m, g, gpus, batch, top=None, max_step_time=limit, memory_headroom=0, **space)
    assert {r.config for r in every} == {c for t, _, _, c in fitting if t <= limit} and len(every) == len({r.config for r in every})


RANKED = ("tp", "pp", "dp", "micro_batch", "schedule", "virtual", "recompute", "zero", "sequence_parallel", "cp", "ep",
          "expert_tp")  # `rank_key`'s order of the fields, after step time and peak memory


def test_held_counts_follow_the_closed_forms():
    """Micro-batches held at once: GPipe all m on every device, 1F1B min(p - r, m)."""
    s = sim.make_schedule
    assert plan_bounds.held(s("gpipe", 4, 6)) == [6] * 4
    assert plan_bounds.held(s("1f1b", 4, 6)) == [4, 3, 2, 1]
    assert plan_bounds.held(s("1f1b", 4, 2)) == [2, 2, 2, 1]
    assert plan_bounds.held(s("naive", 4, 6)) == [1] * 4


def run(argv, capsys):
    """`python -m sim.plan` in this process: (exit status, stdout, stderr)."""
    try:
        status = main(argv)
    except SystemExit as e:
        status = e.code
    out, err = capsys.readouterr()
    return status, out, err


BASE = ["--model", "gpt3-175b", "--gpu", "a100-80gb", "--gpus", "1024", "--global-batch", "1536", "--no-figures"]


@pytest.mark.parametrize("change, words", [
    ({"--model": "gpt5"}, "unknown model 'gpt5'; known:"),
    ({"--gpu": "v100"}, "unknown GPU or profile 'v100'; known GPUs:"),
    ({"--tp": "5"}, "tp=5 does not divide the model's 96 heads"),
    ({"--tp": "8", "--pp": "3"}, "1024 GPUs are not a multiple of tp*pp = 8*3 = 24"),
    ({"--gpus": "12", "--tp": "8"}, "12 GPUs do not split into tensor-parallel groups of 8"),
    ({"--global-batch": "1000", "--micro-batch": "3"}, "does not split"),
    ({"--top": "0"}, "need an integer >= 1"),
    ({"--nics-per-node": "0"}, "need an integer >= 1"),
    ({"--nics-per-node": "four"}, "'four' is not a whole number"),
])
def test_bad_input_is_one_line_and_status_2(change, words, capsys):
    argv = list(BASE)
    for flag, value in change.items():
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, value]
    status, out, err = run(argv, capsys)
    assert status == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("sim.plan: error: ") and words in err, err


def test_json_is_ranked_and_every_row_splits_the_gpus_and_the_batch(capsys):
    argv = ["--model", "megatron-1.7b", "--gpu", "a100-40gb", "--gpus", "16", "--global-batch", "48", "--json",
            "--no-figures", "--top", "8", "--recompute", "none,full", "--schedules", "1f1b,zb-h1,interleaved-1f1b"]
    status, out, err = run(argv, capsys)
    assert status == 0, err
    data = json.loads(out)
    rows = data["rows"]
    assert len(rows) == 8 and data["enumerated"] > data["simulated"] > 0
    assert [r["step_time"] for r in rows] == sorted(r["step_time"] for r in rows)
    for r in rows:
        assert r["tp"] * r["pp"] * r["dp"] == 16 and r["fits"]
        assert r["dp"] * r["micro_batch"] * r["micro_batches"] == 48
    assert sum(data["dropped"].values()) + data["simulated"] >= data["enumerated"] - 1


def test_progress_bar_on_request_plain_lines_otherwise(capsys):
    argv = ["--model", "megatron-1.7b", "--gpu", "a100-80gb", "--gpus", "8", "--global-batch", "8", "--no-figures",
            "--schedules", "1f1b", "--recompute", "none"]
    err = run(argv, capsys)[2]                       # not a terminal: plain lines, no bar
    assert err and "\r" not in err and all(line.startswith("sim.plan: ") and " settled, " in line
                                           for line in err.splitlines())
    assert run(argv + ["--quiet"], capsys)[2] == ""
    status, out, err = run(argv + ["--progress"], capsys)
    assert status == 0 and "settled" in err and "\r" in err and err.endswith("\n")
    assert "rank" in out and "dropped (of the" in out


def test_figures_are_written(small_plan, tmp_path):
    paths = write_figures(small_plan, tmp_path)
    assert [p.name.rsplit("_", 1)[1] for p in paths] == ["best.png", "scatter.png"]
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(tmp_path.glob(".*.tmp"))  # written whole: no temporary left


# ---------------------------------------------------------------- SageMaker's reference configurations

def test_sagemaker_shapes_count_their_names():
    counts = {k: m.params().total / 1e9 for k, m in sagemaker.MODELS.items()}
    assert counts["sagemaker-gpt2-10b"] == pytest.approx(10, rel=0.02)
    assert counts["sagemaker-gpt2-30b"] == pytest.approx(30, rel=0.02)
    assert counts["sagemaker-gpt2-60b"] == pytest.approx(60, rel=0.02)
    for r in sagemaker.REFERENCES.values():
        assert r.tp * r.pp * r.dp == r.gpus and sagemaker.MODELS[r.model].heads % r.tp == 0


@pytest.mark.parametrize("row", sorted(sagemaker.REFERENCES))
def test_sagemaker_rows_fit_and_break_without_checkpointing_or_sharding(row):
    """Each row fits in 40 GB as documented; without activation checkpointing or without
    optimizer state sharding it does not."""
    assert published.sagemaker_estimate(row).fits
    assert not published.sagemaker_estimate(row, recompute="none").fits
    assert not published.sagemaker_estimate(row, zero=0).fits


@pytest.mark.parametrize("row", ["10b", "30b"])
def test_planner_finds_the_sagemaker_row_and_no_slower_best(row):
    """Restricted to the row's own choices, the planner's one configuration is the row
    (same predicted step); with the recompute and ZeRO choices open, its best is no slower."""
    r = sagemaker.REFERENCES[row]
    ref = published.sagemaker_estimate(row)
    same = dict(tp=r.tp, pp=r.pp, micro_batch=r.batch_size // r.micro_batches, precision="fp16",
                sequence_parallel=[False], schedules=["1f1b"])
    only = plan.search(r.model, sagemaker.GPU, r.gpus, r.global_batch, recompute="full", zero=1, **same)
    assert len(only) == 1 and only[0].step_time == pytest.approx(ref.step_time, rel=1e-12)
    wider = plan.search(r.model, sagemaker.GPU, r.gpus, r.global_batch, top=1, **same)
    assert same_time(wider[0].step_time) <= same_time(ref.step_time)  # as rank_key ranks


def test_plan_counts_add_up_when_some_fit():
    found = plan.search("megatron-1.7b", "a100-80gb", 16, 64, top=3)
    fit = found.simulated - found.dropped_configs["does not fit (simulated)"]
    assert sum(found.dropped_configs.values()) + fit == found.enumerated
