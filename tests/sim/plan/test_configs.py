"""torchtitan's job config and Megatron-Core's arguments (`sim.plan.configs`, `python -m sim.plan
--config`, `--write-config`): a config read into the layout its keys say, a layout written back
reading to the same layout (hypothesis over layouts) and the same estimate, the refusals one
precise line, Megatron's layout string read back to the stages' layers."""
from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

import sim
from sim.hardware.profile import resolve
from sim.model.layer_layout import parse_layer_layout
from sim.plan import cli as plan_cli
from sim.plan.configs import (TITAN_SCHEDULES, ConfigError, from_torchtitan, megatron_args, normal, pinned, read_torchtitan,
                              write_torchtitan)
from sim.plan.layout import Layout
from helpers import one_line, run_main

EXAMPLE = Path(sim.__file__).parent / "plan" / "data" / "torchtitan_llama3_8b.toml"
TITAN = "h100-96gb-500w-torchtitan"
LLAMA = dataclasses.replace(sim.MODELS["llama3.1-8b"], seq=1024)  # 32 layers


def config(**sections) -> dict:
    """A config of `sections` over a minimal one: llama3 8B at seq 1024, no checkpointing."""
    base = {"model": {"name": "llama3", "flavor": "8B"}, "training": {"seq_len": 1024, "local_batch_size": 2},
            "activation_checkpoint": {"mode": "none"}}
    for name, body in sections.items():
        base[name] = {**base.get(name, {}), **body}
    return base


def test_the_example_reads_as_fsdp_over_every_gpu_with_selective_checkpointing():
    job = read_torchtitan(EXAMPLE, gpus=128, profile=resolve(TITAN))
    lay = job.layout
    assert job.model == sim.MODELS["llama3.1-8b"]  # flavor 8B at seq_len 8192
    assert (lay.tp, lay.pp, lay.cp, lay.dp, lay.zero, lay.fsdp_shard) == (1, 1, 1, 128, 3, None)
    assert (lay.micro_batch, lay.global_batch, lay.micro_batches) == (2, 256, 1)  # local batch 2 a GPU, no pp
    assert (lay.recompute, lay.precision, lay.reshard_after_forward) == ("selective", "bf16", True)
    assert any("per-op" in w for w in job.warnings)  # selective "op" priced as Megatron's selective
    assert not any("compile" in w for w in job.warnings)  # compile = true on a profile of compiled kernels


def test_degrees_make_hsdp_ddp_and_pipelined_batches():
    hsdp = from_torchtitan(config(parallelism={"data_parallel_replicate_degree": 2, "data_parallel_shard_degree": 4,
                                               "context_parallel_degree": 2}), gpus=16).layout
    assert (hsdp.dp, hsdp.cp, hsdp.zero, hsdp.fsdp_shard, hsdp.replicas) == (8, 2, 3, 8, 16)  # shard over shard x cp
    ddp = from_torchtitan(config(parallelism={"data_parallel_replicate_degree": 8, "data_parallel_shard_degree": 1}))
    assert (ddp.layout.dp, ddp.layout.zero) == (8, 0)
    pipe = from_torchtitan(config(training={"local_batch_size": 16}, parallelism={
        "pipeline_parallel_degree": 4, "pipeline_parallel_schedule": "interleaved1f1b",
        "pipeline_parallel_microbatch_size": 2, "tensor_parallel_degree": 2}), gpus=32).layout
    assert (pipe.dp, pipe.schedule, pipe.virtual, pipe.micro_batch, pipe.micro_batches) == (4, "interleaved-1f1b", 2, 2, 8)
    assert pipe.sequence_parallel and not pipe.reshard_after_forward  # torchtitan's TP and pp's FSDP default
    accumulated = from_torchtitan(config(training={"local_batch_size": 4, "global_batch_size": 64}, parallelism={
        "pipeline_parallel_degree": 2, "data_parallel_shard_degree": 4}))
    assert accumulated.layout.micro_batches == 16 and any("4 accumulation steps" in w for w in accumulated.warnings)
    split = from_torchtitan(config(parallelism={"pipeline_parallel_degree": 2, "data_parallel_shard_degree": 1,
                                                "pipeline_parallel_split_points": ["layers.10"]})).layout
    assert (split.partition, split.virtual) == ((10, 22), 1)


def test_compile_and_float8_against_the_profile():
    megatron = resolve("h100-80gb")  # fused (Transformer Engine) kernels, delayed FP8 scaling
    job = from_torchtitan(config(model={"converters": ["float8"]}, training={"compile": True}), gpus=8, profile=megatron)
    assert job.layout.precision == "fp8"
    assert any("compile on" in w for w in job.warnings) and any("delayed scaling" in w for w in job.warnings)
    assert any("stack megatron" in w for w in job.warnings)
    assert not from_torchtitan(config(model={"converters": ["float8"]}, training={"compile": True}), gpus=8,
                               profile=resolve(TITAN)).warnings


@pytest.mark.parametrize("sections, gpus, words", [
    ({"parallelizm": {}}, 8, ["unknown section [parallelizm]", "did you mean [parallelism]"]),
    ({"parallelism": {"tensor_paralel_degree": 2}}, 8, ["unknown key [parallelism] tensor_paralel_degree",
                                                        "tensor_parallel_degree"]),
    ({"parallelism": {"tensor_parallel_degree": 2, "data_parallel_shard_degree": 3}}, 8, ["multiply to", "6", "8 GPUs"]),
    ({"parallelism": {"tensor_parallel_degree": 3}}, 8, ["does not divide the 8 GPUs"]),
    ({}, None, ["-1", "--gpus"]),
    ({"parallelism": {"pipeline_parallel_schedule": "ZeroBubbleV"}}, 8, ["'ZeroBubbleV'", "ZBVZeroBubble"]),
    ({"activation_checkpoint": {"mode": "selective", "selective_ac_option": "2"}}, 8, ["every N-th layer", "\"op\""]),
    ({"float8": {"recipe_name": "rowwise"}, "model": {"converters": ["float8"]}}, 8, ["'rowwise'", "tensorwise"]),
    ({"model": {"name": "llama3", "flavor": "3B"}}, 8, ["flavor '3B'", "llama3 8B"]),
    ({"training": {"seq_len": "long"}}, 8, ["seq_len must be int"]),
])
def test_a_bad_config_is_one_precise_error(sections, gpus, words):
    with pytest.raises(ConfigError) as e:
        from_torchtitan(config(**sections), gpus=gpus)
    assert all(w in str(e.value) for w in words) and "\n" not in str(e.value), str(e.value)


def test_the_cli_refuses_a_bad_config_in_one_line(tmp_path):
    bad = tmp_path / "job.toml"
    bad.write_text('[model]\nflavor = "8B"\n[parallelism]\npipeline_parallel_degree = 2\npipeline_parallel_schedule = "Chimera"\n')
    one_line(run_main(plan_cli.main, "--config", str(bad), "--gpu", TITAN, "--gpus", "8"), 2, "'Chimera'")
    bad.write_text("[training\nseq_len = 4")
    one_line(run_main(plan_cli.main, "--config", str(bad), "--gpu", TITAN, "--gpus", "8"), 2, "is not TOML")
    one_line(run_main(plan_cli.main, "--config", str(EXAMPLE), "--gpu", TITAN, "--tp", "2"), 2, "drop --tp")
    one_line(run_main(plan_cli.main, "--gpu", TITAN, "--gpus", "8"), 2, "--model", "--global-batch", "--config")


# Layouts as torchtitan's degrees make them, and one field in three set beyond them (ZeRO 1 and 2,
# a schedule torch has not, sequence parallelism off, Ulysses, SGD): what writes must read back
# the same; the rest is refused in one line.
POISON = {"zero": [1, 2], "schedule": ["zb-h1", "dualpipe"], "sequence_parallel": [False], "cp_comm": ["a2a"],
          "optimizer": ["sgd"], "precision": ["fp16"], "fsdp_shard": [2], "partition": ["balanced"], "virtual": [3]}


@st.composite
def layouts(draw) -> Layout:
    tp, pp, cp, replicate, shard = (draw(st.sampled_from(s)) for s in ([1, 2, 4], [1, 2, 4], [1, 2], [1, 2], [1, 2, 4]))
    schedule = draw(st.sampled_from(list(TITAN_SCHEDULES.values())))
    virtual = 1 if schedule in ("gpipe", "1f1b") else draw(st.sampled_from([None, 2] + [4] * (pp < 4)))
    stages = pp * (virtual or 2)
    uneven = tuple([32 // stages] * (stages - 2) + [32 // stages - 1, 32 // stages + 1])  # split points
    partition = draw(st.sampled_from(["even", uneven])) if pp > 1 else "even"
    sharded = shard * cp > 1
    lay = Layout(tp=tp, pp=pp, dp=replicate * shard, cp=cp, zero=3 if sharded else 0,
                 fsdp_shard=shard * cp if sharded and replicate > 1 else None, sequence_parallel=tp > 1,
                 reshard_after_forward=draw(st.booleans()), tp_overlap=draw(st.booleans()),
                 micro_batch=draw(st.sampled_from([1, 2])), schedule=schedule, virtual=virtual, partition=partition,
                 global_batch=replicate * shard * draw(st.sampled_from([2, 4, 8])),
                 recompute=draw(st.sampled_from(["none", "selective", "full"])),
                 precision=draw(st.sampled_from(["bf16", "fp8", "fp32"])), optimizer=draw(st.sampled_from(["adamw", "adam"])))
    if draw(st.integers(0, 2)) == 0:
        field = draw(st.sampled_from(sorted(POISON)))
        lay = lay.changed(**{field: draw(st.sampled_from(POISON[field]))})
    return lay


@settings(max_examples=300, deadline=None)
@given(layouts())
def test_a_written_config_reads_back_to_its_layout(lay):
    try:
        text = write_torchtitan(LLAMA, lay)
    except ConfigError as e:
        assert "\n" not in str(e)
        return
    job = from_torchtitan(tomllib.loads(text), gpus=lay.gpus)  # the written text, as torchtitan reads TOML
    assert job.model == LLAMA and job.layout == normal(lay)


@pytest.mark.parametrize("lay", [
    Layout(dp=8, zero=3, micro_batch=2, global_batch=32),
    Layout(tp=2, pp=4, dp=2, sequence_parallel=True, zero=0, schedule="interleaved-1f1b", virtual=2, global_batch=16,
           reshard_after_forward=False, tp_overlap=False),
    Layout(pp=2, dp=4, cp=2, zero=3, fsdp_shard=4, schedule="zbv", virtual=2, reshard_after_forward=False,
           global_batch=32, recompute="full", precision="fp8"),
])
def test_these_layouts_write_and_estimate_the_same_read_back(lay):
    profile = resolve(TITAN)
    before = sim.estimate(LLAMA, profile, **lay.keywords())
    after = from_torchtitan(tomllib.loads(write_torchtitan(LLAMA, lay, profile)), gpus=lay.gpus).estimate(profile)
    assert after.summary()["step_time"] == before.step_time and after.peak_memory == before.peak_memory


def test_a_balanced_partition_is_written_as_split_points_of_the_same_estimate():
    lay = Layout(pp=4, dp=2, zero=0, partition="balanced", global_batch=16, reshard_after_forward=False)
    before = sim.estimate(LLAMA, TITAN, **lay.keywords())
    with pytest.raises(ConfigError, match="partition='balanced'"):
        write_torchtitan(LLAMA, lay)
    text = write_torchtitan(LLAMA, pinned(before))
    assert "pipeline_parallel_split_points" in text
    after = from_torchtitan(tomllib.loads(text), gpus=8).estimate(TITAN)
    assert (after.layers_per_stage, after.step_time) == (before.layers_per_stage, before.step_time)


def test_megatron_arguments_say_the_layout():
    lay = Layout(tp=2, pp=4, dp=2, sequence_parallel=True, zero=1, schedule="interleaved-1f1b", virtual=2,
                 global_batch=64, recompute="full")
    args = megatron_args(LLAMA, lay)
    value = {a: b for a, b in zip(args, args[1:])}
    assert (value["--tensor-model-parallel-size"], value["--pipeline-model-parallel-size"],
            value["--num-layers-per-virtual-pipeline-stage"], value["--global-batch-size"]) == ("2", "4", "4", "64")
    assert {"--sequence-parallel", "--use-distributed-optimizer"} <= set(args) and value["--recompute-granularity"] == "full"
    uneven = megatron_args(LLAMA, lay.changed(virtual=1, schedule="1f1b"), layers_per_stage=[7, 9, 9, 7])
    layout = parse_layer_layout(uneven[uneven.index("--pipeline-model-parallel-layout") + 1])
    assert layout.layers == [7, 9, 9, 7] and layout.holds("E")[0] == 1 and layout.holds("L")[-1] == 1
    default_v = megatron_args(LLAMA, lay.changed(virtual=None))  # interleaved's own V, 2
    assert default_v[default_v.index("--num-layers-per-virtual-pipeline-stage") + 1] == "4"
    with pytest.raises(ConfigError, match="does not divide the 32 layers"):
        megatron_args(LLAMA, lay.changed(pp=3, dp=1, virtual=2))
    with pytest.raises(ConfigError, match="zb-h1"):
        megatron_args(LLAMA, lay.changed(schedule="zb-h1", virtual=1))


def test_the_cli_writes_the_configs_run_as_the_next_runs_config(tmp_path):
    proc = run_main(plan_cli.main, "--config", str(EXAMPLE), "--gpu", TITAN, "--gpus", "128",
                    "--write-config", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "tokens/s/GPU" in proc.stdout and "per-op" in proc.stdout and "caveat" not in proc.stdout  # calibrated
    best_case = run_main(plan_cli.main, "--config", str(EXAMPLE), "--gpu", "h100-80gb-torchtitan", "--gpus", "128")
    assert "caveat: a best-case profile" in best_case.stdout
    again = read_torchtitan(tmp_path / "torchtitan.toml", gpus=128)
    assert again.layout == read_torchtitan(EXAMPLE, gpus=128).layout
    args = (tmp_path / "megatron.args").read_text().split()
    assert args[args.index("--data-parallel-sharding-strategy") + 1] == "optim_grads_params"


def test_a_search_writes_its_best_row_that_each_can_say(tmp_path):
    proc = run_main(plan_cli.main, "--model", "llama3.1-8b", "--seq", "2048", "--gpu", "h100-80gb", "--gpus", "16",
                    "--global-batch", "32", "--tp", "1,2", "--pp", "1,2", "--no-figures", "--quiet",
                    "--write-config", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    best = proc.stdout.split("\n")[3].split()  # the table's first row: rank tp cp pp dp b ...
    job = read_torchtitan(tmp_path / "torchtitan.toml", gpus=16)
    assert (job.layout.tp, job.layout.cp, job.layout.pp, job.layout.dp, job.layout.micro_batch) == \
        tuple(int(v) for v in best[1:6])  # rank 1 is one torchtitan says (FSDP, 1F1B)
    args = (tmp_path / "megatron.args").read_text().split()
    assert args[args.index("--tensor-model-parallel-size") + 1] == best[1]
