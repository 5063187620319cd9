"""torchtitan's job config and Megatron-Core's arguments both ways: a config read into a layout, a layout written as either.

The keys are torchtitan's at pytorch/torchtitan 000204a4a8bf3d0f31adc44fc29855fbb6ea13d8
(torchtitan/config/job_config.py: `Training`, `Parallelism`, `ActivationCheckpoint`,
`Float8`; read, no code copied) and the older spellings its train configs still carry
(train_configs/llama3_8b.toml at f3534d7: `training.batch_size`, `[float8]` without a recipe).
What each becomes (`read_torchtitan`), torchtitan's defaults where a key is absent:

- degrees: tp, pp, cp, ep (and `expert_tensor_parallel_degree`) as they are; dp is
  replicate x shard, shard -1 the GPUs left over. Parameters are sharded (zero 3, FSDP2) over
  shard x cp ranks whenever that is more than 1, as torchtitan applies `fully_shard`; with
  replicate > 1 too that is HSDP (`fsdp_shard`); replicate alone is DDP (zero 0).
  `fsdp_reshard_after_forward` "default" is on without pipelining and off with it.
- the schedule by torch's class name, any case (`TITAN_SCHEDULES`); V from
  `pipeline_parallel_layers_per_stage` (transformer layers a stage, the embedding and output
  layer on the first and last stage uncounted, as at 000204a; later torchtitan counts them as
  `pipeline_parallel_first/last_stage_less_layers`, keys refused here: give split points), which
  must divide the layers; the stage counts from `pipeline_parallel_split_points` ("layers.N");
  else the schedule's own V (torch's single-stage schedules 1, the others 2), layers even.
- batch: with pp, `local_batch_size` is split into micro-batches of
  `pipeline_parallel_microbatch_size`; without it the local batch is the micro-batch. The
  global batch is `global_batch_size`, else local x dp; without pp each accumulation step is
  one micro-batch a replica, with pp their micro-batches run as one schedule (a warning: torch
  runs one a step of accumulation, each with its bubble). `write_torchtitan` writes pp's in one step.
- tensor parallelism shards the norms too (torchtitan's SequenceParallel): sequence parallel.
  `enable_async_tensor_parallel` is `tp_overlap` (without tp, the layout's default).
- `activation_checkpoint.mode` none and full as they are; selective "op" (torchtitan's per-op
  policy: saves every other matmul's output) is priced as the planner's selective (attention
  recomputed, Korthikanti et al. 2022), with a warning; selective "1" is full; every N-th layer
  (torchtitan's default "2") is refused: the layout has no such mode yet (issue 48).
- float8 ("float8" in `model.converters`, or `float8.enable_float8_linear`): precision fp8,
  tensorwise scaling (current scaling: an amax, then a cast, `sim.cost.fp8`); rowwise refused.
- `training.compile` or `[compile] enable` against the profile's `stack.elementwise`: a
  warning where they disagree (the profile prices the kernels it says, not the flag).

A key of a section the step depends on that torchtitan at that commit does not have is
refused (`ConfigError`, one line, the nearest key named); sections that change no step
(logging, checkpoints, the learning rate) are skipped. `write_torchtitan` writes a layout back
and refuses one that would read back different; `pinned` and `normal` say an estimate's layout in fields a
config reads back (the same estimate); `megatron_args` writes Megatron-Core's
arguments (megatron/training/arguments.py; Megatron-FSDP's `--data-parallel-sharding-strategy`
from megatron/core/distributed/fsdp's README), the stages as `--pipeline-model-parallel-layout`
(`sim.model.layer_layout`) where they are uneven.
"""
from __future__ import annotations

import dataclasses
import difflib
import json
import tomllib
from dataclasses import dataclass
from pathlib import Path

from sim.hardware.profile import DeviceProfile
from sim.model.layer_layout import from_counts
from sim.model.registry import MODELS, find_model, model_key
from sim.model.transformer import Transformer
from .layout import Layout

TORCHTITAN_COMMIT = "000204a4a8bf3d0f31adc44fc29855fbb6ea13d8"
# torch.distributed.pipelining's schedule classes -> the planner's schedules
TITAN_SCHEDULES = {"GPipe": "gpipe", "1F1B": "1f1b", "Interleaved1F1B": "interleaved-1f1b", "LoopedBFS": "looped-bfs",
                   "InterleavedZeroBubble": "interleaved-zb", "ZBVZeroBubble": "zbv", "DualPipeV": "dualpipev"}
# torchtitan's (model.name, model.flavor) -> sim.MODELS: its llama3 flavors are Llama 3.1's shapes
TITAN_MODELS = {("llama3", "8B"): "llama3.1-8b", ("llama3", "70B"): "llama3.1-70b", ("llama3", "405B"): "llama3.1-405b",
                ("llama2", "7B"): "llama2-7b", ("llama2", "13B"): "llama2-13b", ("llama2", "70B"): "llama2-70b",
                ("deepseek_v3", "671B"): "deepseek-v3-671b"}
# per section: the keys read, then the keys torchtitan has that change no step (skipped)
READ = {
    "model": ({"name", "flavor", "converters"}, {"tokenizer_path", "hf_assets_path", "print_after_conversion"}),
    "training": ({"local_batch_size", "batch_size", "global_batch_size", "seq_len", "compile", "mixed_precision_param",
                  "enable_cpu_offload"},
                 {"dataset", "dataset_path", "max_norm", "steps", "gc_freq", "gc_debug", "seed", "deterministic",
                  "mixed_precision_reduce", "warmup_steps"}),
    "parallelism": ({"data_parallel_replicate_degree", "data_parallel_shard_degree", "tensor_parallel_degree",
                     "pipeline_parallel_degree", "context_parallel_degree", "expert_parallel_degree",
                     "expert_tensor_parallel_degree", "fsdp_reshard_after_forward", "pipeline_parallel_schedule",
                     "pipeline_parallel_schedule_csv", "pipeline_parallel_microbatch_size",
                     "pipeline_parallel_layers_per_stage", "pipeline_parallel_split_points",
                     "context_parallel_rotate_method", "enable_async_tensor_parallel"},
                    {"enable_compiled_autograd", "disable_loss_parallel"}),
    "activation_checkpoint": ({"mode", "selective_ac_option"}, {"per_op_sac_force_recompute_mm_shapes_by_fqns"}),
    "float8": ({"recipe_name", "enable_float8_linear"},
               {"enable_fsdp_float8_all_gather", "precompute_float8_dynamic_scale_for_fsdp",
                "force_recompute_fp8_weight_in_bwd", "filter_fqns", "emulate", "moe_fqns_prototype"}),
    "optimizer": ({"name"}, {"lr", "beta1", "beta2", "eps", "weight_decay", "implementation", "early_step_in_backward"}),
    "compile": ({"enable"}, {"components", "backend"}),
}
SKIPPED = {"job", "profiling", "metrics", "lr_scheduler", "checkpoint", "mx", "comm", "memory_estimation",
           "fault_tolerance", "experimental", "validation"}
OPTIMIZER_NAMES = {"adamw": "AdamW", "adam": "Adam"}
PARAM_DTYPES = {"bfloat16": "bf16", "float32": "fp32"}


class ConfigError(ValueError):
    """A config that cannot be read, or a layout that cannot be written: one line naming the key."""


@dataclass(frozen=True)
class Job:
    """What a torchtitan config runs: the model at its sequence length, the layout, and what
    the reading warned of (options priced as something near them)."""
    model: Transformer
    layout: Layout
    warnings: tuple[str, ...] = ()

    def estimate(self, profile):
        """`sim.estimate` of the job on `profile`, its warnings first among the estimate's."""
        from .estimation import estimate
        e = estimate(self.model, profile, **self.layout.keywords())
        e.warnings[:0] = list(self.warnings)
        return e


def read_torchtitan(path: str | Path, gpus: int | None = None, profile: DeviceProfile | None = None,
                    **layout) -> Job:
    """The job of the TOML file at `path` (`from_torchtitan`); ConfigError for a file that is not TOML."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except OSError as e:
        raise ConfigError(f"cannot read config {path}: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config {path} is not TOML: {e}") from None
    return from_torchtitan(data, gpus, profile, **layout)


def _get(data: dict, section: str, key: str, default, kind=int):
    value = data.get(section, {}).get(key, default)
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)) or \
            kind is not int and not isinstance(value, kind):
        need = " or ".join(k.__name__ for k in kind) if isinstance(kind, tuple) else kind.__name__
        raise ConfigError(f"[{section}] {key} must be {need}, got {value!r}")
    return value


def _check_keys(data: dict) -> None:
    for section, body in data.items():
        if section in SKIPPED:
            continue
        if section not in READ or not isinstance(body, dict):
            near = difflib.get_close_matches(section, [*READ, *SKIPPED], 1)
            raise ConfigError(f"unknown section [{section}] (torchtitan {TORCHTITAN_COMMIT[:7]}'s job config)"
                              + (f"; did you mean [{near[0]}]?" if near else ""))
        read, skipped = READ[section]
        for key in sorted(set(body) - read - skipped):
            near = difflib.get_close_matches(key, sorted(read | skipped), 1)
            raise ConfigError(f"unknown key [{section}] {key} (torchtitan {TORCHTITAN_COMMIT[:7]}'s job config)"
                              + (f"; did you mean {near[0]}?" if near else ""))


def titan_model(data: dict) -> Transformer:
    """The model `[model] name, flavor` name (`TITAN_MODELS`, or a sim.MODELS name without a
    flavor) at `training.seq_len` (torchtitan's default 2048)."""
    name, flavor = _get(data, "model", "name", "llama3", str), _get(data, "model", "flavor", "debugmodel", str)
    if (name, flavor) in TITAN_MODELS:
        model = MODELS[TITAN_MODELS[name, flavor]]
    elif model_key(name) in MODELS and not flavor.strip():
        model = find_model(name)
    else:
        known = ", ".join(f"{n} {f}" for n, f in TITAN_MODELS)
        raise ConfigError(f"[model] name {name!r} flavor {flavor!r} is not a model the planner knows; use one of "
                          f"{known}, or a sim.MODELS name with flavor = \"\"")
    return dataclasses.replace(model, seq=_get(data, "training", "seq_len", 2048))


def _schedule(data: dict) -> str:
    name = _get(data, "parallelism", "pipeline_parallel_schedule", "1F1B", str)
    by_lower = {k.lower(): v for k, v in TITAN_SCHEDULES.items()}
    if name.lower() not in by_lower:
        raise ConfigError(f"[parallelism] pipeline_parallel_schedule {name!r} is not one the planner prices; "
                          f"use one of {', '.join(TITAN_SCHEDULES)}")
    if _get(data, "parallelism", "pipeline_parallel_schedule_csv", "", (str, type(None))):
        raise ConfigError("[parallelism] pipeline_parallel_schedule_csv: a schedule read from a CSV is not priced "
                          "here; name one of torch's schedules instead")
    return by_lower[name.lower()]


def _degrees(data: dict, gpus: int | None) -> dict:
    """tp, pp, cp, ep, expert_tp and dp, the replicate and shard degrees; shard -1 the rest."""
    sizes = {k: _get(data, "parallelism", f"{w}_degree", 1) for k, w in
             (("tp", "tensor_parallel"), ("pp", "pipeline_parallel"), ("cp", "context_parallel"),
              ("ep", "expert_parallel"), ("expert_tp", "expert_tensor_parallel"), ("replicate", "data_parallel_replicate"))}
    shard = _get(data, "parallelism", "data_parallel_shard_degree", -1)
    for key, n in (*sizes.items(), ("shard", shard)):
        if n < 1 and not (key == "shard" and n == -1):
            raise ConfigError(f"[parallelism] {key} degree must be a positive integer (shard: or -1), got {n}")
    fixed = sizes["tp"] * sizes["pp"] * sizes["cp"] * sizes["replicate"]
    if shard == -1:
        if gpus is None:
            raise ConfigError("[parallelism] data_parallel_shard_degree = -1 takes the GPUs left over: give the "
                              "GPU count (--gpus)")
        if gpus % fixed:
            raise ConfigError(f"tp x pp x cp x replicate = {fixed} does not divide the {gpus} GPUs "
                              f"(data_parallel_shard_degree -1 takes the rest)")
        shard = gpus // fixed
    elif gpus is not None and fixed * shard != gpus:
        raise ConfigError(f"the degrees multiply to tp x pp x cp x replicate x shard = {fixed * shard}, not the "
                          f"{gpus} GPUs; make them multiply to {gpus} or set data_parallel_shard_degree = -1")
    return {**sizes, "shard": shard, "dp": sizes["replicate"] * shard}


def _stages(data: dict, model: Transformer, pp: int, schedule: str) -> dict:
    """virtual and partition from the layers a stage or the split points; else the schedule's V."""
    from sim.schedule.registry import SCHEDULES
    per_stage = data.get("parallelism", {}).get("pipeline_parallel_layers_per_stage")
    points = _get(data, "parallelism", "pipeline_parallel_split_points", [], list)
    if points:
        try:
            cuts = [int(p.removeprefix("layers.")) for p in points]
        except (ValueError, AttributeError):
            raise ConfigError(f"[parallelism] pipeline_parallel_split_points must be \"layers.N\" names; got "
                              f"{points!r}") from None
        counts = tuple(b - a for a, b in zip([0, *cuts], [*cuts, model.layers]))
        if min(counts) < 1 or len(counts) % pp:
            raise ConfigError(f"[parallelism] pipeline_parallel_split_points {points} make stages of {list(counts)} "
                              f"layers; give increasing layers in 1..{model.layers - 1}, {pp} x V stages")
        return {"virtual": len(counts) // pp, "partition": counts}
    if per_stage is not None:
        per_stage = _get(data, "parallelism", "pipeline_parallel_layers_per_stage", None)
        if model.layers % per_stage or (model.layers // per_stage) % pp:
            raise ConfigError(f"[parallelism] pipeline_parallel_layers_per_stage {per_stage}: the {model.layers} "
                              f"layers do not make pp={pp} x V stages of it")
        return {"virtual": model.layers // per_stage // pp, "partition": "even"}
    return {"virtual": SCHEDULES[schedule].virtual, "partition": "even"}


def _recompute(data: dict, warn: list) -> str:
    mode = _get(data, "activation_checkpoint", "mode", "selective", str)
    option = str(data.get("activation_checkpoint", {}).get("selective_ac_option", "2"))
    if mode in ("none", "full"):
        return mode
    if mode != "selective":
        raise ConfigError(f"[activation_checkpoint] mode must be none, selective or full; got {mode!r}")
    if option == "op":
        warn.append("activation_checkpoint selective 'op' (torchtitan's per-op policy: every other matmul's output "
                    "saved) priced as the planner's selective (the attention core recomputed)")
        return "selective"
    if option == "1":
        return "full"
    raise ConfigError(f"[activation_checkpoint] selective_ac_option {option!r} (every N-th layer checkpointed; "
                      f"torchtitan's default when absent is \"2\") has no counterpart in the planner yet; use mode "
                      f"\"full\", \"none\", or selective_ac_option \"op\"")


def _precision(data: dict, profile: DeviceProfile | None, warn: list) -> str:
    converters = _get(data, "model", "converters", [], list)
    if "mx" in converters:
        raise ConfigError("[model] converters \"mx\" (MXFP8) is not priced; use \"float8\" or none")
    if "float8" in converters or _get(data, "float8", "enable_float8_linear", False, bool):
        recipe = _get(data, "float8", "recipe_name", "tensorwise", str)
        if recipe != "tensorwise":
            raise ConfigError(f"[float8] recipe_name {recipe!r}: only tensorwise scaling (current scaling, an amax "
                              f"then a cast) is priced; use \"tensorwise\" or bf16")
        if profile is not None and profile.fp8_scaling != "current":
            warn.append(f"float8 tensorwise scales currently; profile {profile.name} times FP8 with "
                        f"{profile.fp8_scaling} scaling (Transformer Engine's)")
        return "fp8"
    dtype = _get(data, "training", "mixed_precision_param", "bfloat16", str)
    if dtype not in PARAM_DTYPES:
        raise ConfigError(f"[training] mixed_precision_param must be one of {', '.join(PARAM_DTYPES)}; got {dtype!r}")
    return PARAM_DTYPES[dtype]


def _compile(data: dict, profile: DeviceProfile | None, warn: list) -> None:
    on = _get(data, "training", "compile", False, bool) or _get(data, "compile", "enable", False, bool)
    if profile is None:
        return
    kernels = profile.stack.elementwise
    if on != (kernels == "compiled"):
        warn.append(f"compile {'on' if on else 'off'}, but profile {profile.name} times {kernels} elementwise kernels "
                    f"(its stack.elementwise): priced as the profile's")
    if profile.stack.name != "torchtitan":
        warn.append(f"a torchtitan config priced on profile {profile.name}, of stack {profile.stack.name}")


def from_torchtitan(data: dict, gpus: int | None = None, profile: DeviceProfile | None = None, **layout) -> Job:
    """The job of a parsed torchtitan config (the module's docstring says each key's meaning)
    on `gpus` GPUs (needed where data_parallel_shard_degree is -1, checked against the degrees
    otherwise); `profile` for the warnings of what it prices otherwise; `layout`: the fields
    torchtitan does not say (gpus_per_node, nics_per_node, memory_headroom). ConfigError (one
    line) for what is refused."""
    _check_keys(data)
    model, warn = titan_model(data), []
    if _get(data, "training", "enable_cpu_offload", False, bool):
        raise ConfigError("[training] enable_cpu_offload (FSDP's parameter, gradient and optimizer offload) is "
                          "not priced; set it false")
    d = _degrees(data, gpus)
    pp, schedule = d["pp"], _schedule(data)
    local = _get(data, "training", "local_batch_size", _get(data, "training", "batch_size", 8))
    micro = _get(data, "parallelism", "pipeline_parallel_microbatch_size", 1) if pp > 1 else local
    given = _get(data, "training", "global_batch_size", -1)
    if local % micro:
        raise ConfigError(f"[training] local_batch_size {local} does not split into pipeline micro-batches of {micro}")
    if pp > 1 and given > local * d["dp"]:
        warn.append(f"global_batch_size {given} is {given / (local * d['dp']):g} accumulation steps of local batch "
                    f"{local} x dp {d['dp']}: torchtitan runs the pipeline once a step of them, priced as one "
                    f"schedule of all their micro-batches (one bubble, not one each)")
    if d["cp"] > 1:
        method = _get(data, "parallelism", "context_parallel_rotate_method", "allgather", str)
        warn.append(f"context parallelism's K/V {method} rotation priced as ring attention's point-to-point sends")
    reshard = _get(data, "parallelism", "fsdp_reshard_after_forward", "default", str)
    if reshard not in ("default", "always", "never"):
        raise ConfigError(f"[parallelism] fsdp_reshard_after_forward must be default, always or never; got {reshard!r}")
    sharded = d["shard"] * d["cp"] > 1
    name = _get(data, "optimizer", "name", "AdamW", str)
    if name.lower() not in OPTIMIZER_NAMES:
        raise ConfigError(f"[optimizer] name {name!r} is not priced; use {' or '.join(OPTIMIZER_NAMES.values())}")
    lay = Layout(tp=d["tp"], pp=pp, dp=d["dp"], cp=d["cp"], ep=d["ep"], expert_tp=d["expert_tp"],
                 sequence_parallel=d["tp"] > 1, zero=3 if sharded else 0,
                 reshard_after_forward=pp == 1 if reshard == "default" else reshard == "always",
                 fsdp_shard=d["shard"] * d["cp"] if sharded and d["replicate"] > 1 else None,
                 tp_overlap=_get(data, "parallelism", "enable_async_tensor_parallel", False, bool) or d["tp"] == 1,
                 micro_batch=micro, global_batch=given if given > 0 else local * d["dp"], schedule=schedule,
                 **_stages(data, model, pp, schedule), recompute=_recompute(data, warn),
                 precision=_precision(data, profile, warn), optimizer=name.lower(), **layout)
    _compile(data, profile, warn)
    return Job(model, lay, tuple(warn))


def titan_name(model: Transformer) -> tuple[str, str]:
    """The `[model] name, flavor` of `model` at any sequence length (a sim.MODELS name and an
    empty flavor where torchtitan has no flavor of it); ConfigError for a model of no name."""
    for (name, flavor), ours in TITAN_MODELS.items():
        if MODELS[ours] == dataclasses.replace(model, seq=MODELS[ours].seq):
            return name, flavor
    ours = next((n for n, m in MODELS.items() if m == dataclasses.replace(model, seq=m.seq)), None)
    if ours is None:
        raise ConfigError("the model is not a sim.MODELS preset: torchtitan's config names its model; "
                          "write it for a preset")
    return ours, ""


def torchtitan_config(model: Transformer, lay: Layout, compile_: bool = False) -> dict:
    """The torchtitan sections that say `lay` (`write_torchtitan` checks they read back to it)."""
    shard = (lay.fsdp_shard or lay.replicas) // lay.cp if lay.zero == 3 else 1
    par = {"data_parallel_replicate_degree": lay.dp // shard if shard else lay.dp, "data_parallel_shard_degree": shard,
           "tensor_parallel_degree": lay.tp, "pipeline_parallel_degree": lay.pp, "context_parallel_degree": lay.cp,
           "fsdp_reshard_after_forward": "default" if lay.reshard_after_forward == (lay.pp == 1) else
           "always" if lay.reshard_after_forward else "never",
           "pipeline_parallel_schedule": next((k for k, v in TITAN_SCHEDULES.items() if v == lay.schedule), lay.schedule)}
    if lay.tp > 1:
        par["enable_async_tensor_parallel"] = lay.tp_overlap
    if lay.pp > 1:
        par["pipeline_parallel_microbatch_size"] = lay.micro_batch
    if lay.ep > 1 or lay.expert_tp > 1:  # expert_tensor_parallel_degree: torchtitan's after 000204a
        par.update(expert_parallel_degree=lay.ep, **({"expert_tensor_parallel_degree": lay.expert_tp}
                                                       if lay.expert_tp > 1 else {}))
    if lay.pp > 1 and isinstance(lay.partition, tuple):
        par["pipeline_parallel_split_points"] = [f"layers.{n}" for n in _cuts(lay.partition)]
    elif lay.pp > 1:
        par["pipeline_parallel_layers_per_stage"] = model.layers // (lay.pp * (lay.virtual or 1))
    local = lay.global_batch // lay.dp if lay.pp > 1 else lay.micro_batch
    name, flavor = titan_name(model)
    ac = {"none": {"mode": "none"}, "full": {"mode": "full"}}.get(lay.recompute, {"mode": "selective",
                                                                                  "selective_ac_option": "op"})
    return {"model": {"name": name, "flavor": flavor, "converters": ["float8"] if lay.precision == "fp8" else []},
            "optimizer": {"name": OPTIMIZER_NAMES.get(lay.optimizer, lay.optimizer)},
            "training": {"local_batch_size": local, "global_batch_size": lay.global_batch, "seq_len": model.seq,
                         "compile": compile_, "mixed_precision_param": "float32" if lay.precision == "fp32" else "bfloat16"},
            "parallelism": par, "activation_checkpoint": ac,
            **({"float8": {"recipe_name": "tensorwise"}} if lay.precision == "fp8" else {})}


def _cuts(counts) -> list[int]:
    out, total = [], 0
    for n in counts[:-1]:
        total += n
        out.append(total)
    return out


def pinned(e) -> Layout:
    """An estimate's layout with its partition as the stages' layer counts where torchtitan's
    `pipeline_parallel_layers_per_stage` cannot say it (a balanced partition, or layers that
    pp x V does not divide): the same estimate, in split points."""
    lay, per_stage = e.layout, e.layers_per_stage
    if lay.pp == 1 or isinstance(lay.partition, tuple) or (lay.partition == "even" and len(set(per_stage)) == 1):
        return lay
    return lay.changed(partition=tuple(per_stage))


def normal(lay: Layout) -> Layout:
    """`lay` with the fields that act on nothing as a config reads them: V the schedule's own
    where None, tp_overlap on without tp (nothing to overlap). The same estimate."""
    from sim.schedule.registry import SCHEDULES
    return lay.changed(virtual=lay.virtual or SCHEDULES[lay.schedule].virtual, tp_overlap=lay.tp_overlap or lay.tp == 1)


def write_torchtitan(model: Transformer, lay: Layout, profile: DeviceProfile | None = None) -> str:
    """`lay` as a torchtitan TOML job config (its compile as `profile`'s stack prices it) that
    reads back to `normal(lay)`; ConfigError, one line, for a layout that would read back different (a schedule, ZeRO stage
    or option torchtitan does not have), naming the first field that differs."""
    compile_ = profile is not None and profile.stack.elementwise == "compiled"
    lay = normal(lay)
    data = torchtitan_config(model, lay, compile_)
    keep = {k: getattr(lay, k) for k in ("gpus_per_node", "nics_per_node", "memory_headroom")}
    try:
        back = from_torchtitan(data, lay.gpus, **keep).layout
    except ConfigError as e:
        raise ConfigError(f"this layout has no torchtitan config: {e}") from None
    for f in dataclasses.fields(Layout):
        if getattr(back, f.name) != getattr(lay, f.name):
            raise ConfigError(f"{f.name}={getattr(lay, f.name)!r} has no torchtitan counterpart (its config reads back "
                              f"as {getattr(back, f.name)!r})")
    head = (f"# torchtitan job config (keys of pytorch/torchtitan {TORCHTITAN_COMMIT[:7]}), written by sim.plan\n"
            f"# run on {lay.gpus} GPUs: NGPU x nodes = {lay.gpus}\n")
    return head + dump_toml(data)


def dump_toml(data: dict) -> str:
    """TOML of a dict of sections, each a dict of strings, numbers, booleans and lists of them."""
    out = []
    for section, body in data.items():
        out.append(f"\n[{section}]")
        out += [f"{key} = {_toml_value(value)}" for key, value in body.items()]
    return "\n".join(out).lstrip("\n") + "\n"


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string: JSON's escapes are TOML's
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} as TOML")


MEGATRON_SCHEDULES = ("1f1b", "interleaved-1f1b")  # Megatron-Core's pipeline schedules (interleaved: V > 1)
FP8_RECIPES = {"delayed": "delayed", "current": "tensorwise"}  # profile.fp8_scaling -> --fp8-recipe


def megatron_args(model: Transformer, lay: Layout, layers_per_stage: list[int] | None = None,
                  profile: DeviceProfile | None = None) -> list[str]:
    """`lay` as Megatron-Core's command-line arguments (megatron/training/arguments.py): the
    parallel sizes, the batch, the sequence, the stages (V as --num-layers-per-virtual-pipeline-stage
    where the layers split evenly, else `layers_per_stage`, an estimate's, as
    --pipeline-model-parallel-layout), recompute, ZeRO (the distributed optimizer, Megatron-FSDP),
    FP8 (the recipe `profile` measured). ConfigError, one line, for what Megatron-Core does not run."""
    lay = normal(lay)
    if lay.pp > 1 and lay.schedule not in MEGATRON_SCHEDULES:
        raise ConfigError(f"schedule {lay.schedule!r} is not one of Megatron-Core's ({', '.join(MEGATRON_SCHEDULES)})")
    if lay.fsdp_shard is not None or lay.precision in ("tf32", "fp32") or lay.offload:
        raise ConfigError("HSDP (fsdp_shard), tf32/fp32 training and activation offload are not written as "
                          "Megatron-Core arguments")
    args = ["--tensor-model-parallel-size", lay.tp, "--pipeline-model-parallel-size", lay.pp,
            "--context-parallel-size", lay.cp, "--micro-batch-size", lay.micro_batch,
            "--global-batch-size", lay.global_batch, "--seq-length", model.seq]
    if model.moe is not None:
        args += ["--expert-model-parallel-size", lay.ep, "--expert-tensor-parallel-size", lay.expert_tp]
    if lay.cp > 1:
        args += ["--cp-comm-type", lay.cp_comm]
    stages = layers_per_stage or (list(lay.partition) if isinstance(lay.partition, tuple) else None)
    virtual = lay.virtual or 1
    if lay.pp > 1 and stages is not None and len(set(stages)) > 1:
        args += ["--pipeline-model-parallel-layout", str(from_counts(stages))]
    elif lay.pp > 1 and virtual > 1:
        if model.layers % (lay.pp * virtual):
            raise ConfigError(f"pp={lay.pp} x V {virtual} does not divide the {model.layers} layers; give the "
                              f"stages' layers (an estimate's layers_per_stage) for a layout string")
        args += ["--num-layers-per-virtual-pipeline-stage", model.layers // (lay.pp * virtual)]
    if lay.sequence_parallel:
        args.append("--sequence-parallel")
    if lay.recompute == "full":
        args += ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", 1]
    elif lay.recompute == "selective":
        args += ["--recompute-granularity", "selective"]
    args += {1: ["--use-distributed-optimizer"],
             2: ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads"],
             3: ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads_params"]}.get(lay.zero, [])
    args += ["--fp16"] if lay.precision == "fp16" else ["--bf16"]
    if lay.precision == "fp8":
        args += ["--fp8-format", "hybrid", "--fp8-recipe", FP8_RECIPES[profile.fp8_scaling if profile else "delayed"]]
    if lay.overlap_grad_reduce:
        args.append("--overlap-grad-reduce")
    if lay.tp_overlap and lay.tp > 1:
        args.append("--tp-comm-overlap")
    return [str(a) for a in args]
