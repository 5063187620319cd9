"""A run's configuration: `RunConfig`, everything a pipelined run takes besides the model and the schedule, checked when made; `step_schedule`, the schedule it steps through.

    >>> RunConfig(steps=3, optimizer="adamw").warmup
    2
    >>> RunConfig(steps=0)
    Traceback (most recent call last):
    ...
    ValueError: steps must be an integer >= 1, got 0

One record for every entry point that starts ranks: `exec.pipeline.runner.run_pipeline`,
`exec.torch_pipelining.runtime.run_torch_runtime` and `exec.pipeline.profile.profile_costs` each
take `(spec, schedule, devices, micro_batches, config, **options)`, the keyword `options`
setting fields of `config` (`run_options`), and a schedule name made into a `sim.Schedule`
the one way (`run_schedule`). Each reads the fields it names; one it does not read, set
away from its default, is refused rather than ignored:

    >>> run_options("run_torch_runtime", None, {"dp": 2}, reads=("steps", "warmup"))
    Traceback (most recent call last):
    ...
    ValueError: run_torch_runtime does not take RunConfig.dp (got 2); it reads steps, warmup

A new option is one field here; `run_pipeline` hands the record to every rank
(`exec.pipeline.worker`), and `python -m exec.run` builds one from its flags. Imports no torch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Sequence

import sim
from exec.runtime.optim import DEFAULT_OPTIMIZER, OPTIMIZERS

__all__ = ["RunConfig", "run_options", "run_schedule", "step_schedule", "model_spec", "parse_fault", "FAULTS",
           "NCCL_NOT_YET", "DEFAULT_LR"]

FAULTS = ("raise", "exit", "hang")
BALANCES = ("layers", "time")
BACKENDS = ("gloo", "nccl")
NCCL_NOT_YET = "is not supported on NCCL yet (exec on GPUs checks the gradients and times the steps only)"
MODELS = ("mlp", "gpt")  # the models a name stands for: ModelSpec(name)
# torch.optim.Adam's and AdamW's own default. Every step trains on the same batch: at 0.01
# AdamW moved each weight of the default MLP by about 0.01 a step and its loss went 2.32 ->
# 1.32 -> 55.8 in 7 steps (one process, ModelSpec("mlp"), 2-core VM, 2026-12-02); at 1e-3 it
# falls every step (tests/exec/test_entry_points.py).
DEFAULT_LR = 1e-3


def parse_fault(text: str | None) -> tuple[str, int] | None:
    """'raise:1' / 'exit:1' / 'hang:1' -> (what, rank): make that rank fail on purpose
    (before its first measured step), to test how a run ends. None -> None."""
    if not text:
        return None
    what, _, rank = text.partition(":")
    if what not in FAULTS or not rank.isdigit():
        raise ValueError(f"fault must be KIND:RANK with KIND in {', '.join(FAULTS)}, e.g. 'raise:1'; got {text!r}")
    return what, int(rank)


@dataclass(frozen=True)
class RunConfig:
    """How a pipelined run runs. ValueError, naming the field, for a value it cannot take."""

    steps: int = 5                    # measured steps
    warmup: int = 2                   # steps before them, not measured
    lr: float = DEFAULT_LR            # learning rate, finite and >= 0
    optimizer: str = DEFAULT_OPTIMIZER  # a name of `exec.runtime.optim.OPTIMIZERS` (adamw)
    dp: int = 1                       # pipeline replicas (data parallelism, `exec.runtime.dp`)
    ep: int = 1                       # replicas a MoE layer's experts are spread over (`exec.runtime.ep`)
    overlap_grad_reduce: bool = False  # a schedule name with dp > 1: where its REDUCE_GRADs go (`sim.add_grad_reduce`)
    calibrate: int = 0                # k > 0: a calibration round before every k measured steps (gloo only)
    balance: str = "layers"           # how the model is cut: by layer count or profiled time
    bounds: tuple[int, ...] | None = None  # the cut itself (stage s = layers bounds[s] .. bounds[s+1]-1), else `balance`
    backend: str = "gloo"             # gloo: CPU processes; nccl: one GPU per rank
    timeout: float = 300.0            # seconds for the whole run
    threads: int | None = None        # torch threads per rank (default: its cores)
    fault: str | None = None          # "raise:R", "exit:R" or "hang:R": rank R fails on purpose
    progress: bool = False            # rank 0's progress lines on stderr
    progress_every: float = 5.0       # seconds without one before a "still running" line
    trace: str | None = None          # a path: one more step after the measured ones, traced by torch.profiler
    rtol: float = 1e-4                # the gradient check's tolerances
    atol: float = 1e-5

    def __post_init__(self):
        for what, least in (("steps", 1), ("warmup", 0), ("calibrate", 0), ("dp", 1), ("ep", 1)):
            n = getattr(self, what)
            if isinstance(n, bool) or not isinstance(n, int) or n < least:
                raise ValueError(f"{what} must be an integer >= {least}, got {n!r}")
        for what in ("lr", "timeout", "progress_every", "rtol", "atol"):
            x = getattr(self, what)
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not (math.isfinite(x) and x >= 0):
                raise ValueError(f"{what} must be a finite number >= 0, got {x!r}")
        for what in ("timeout", "progress_every"):
            if not getattr(self, what) > 0:
                raise ValueError(f"{what} must be > 0 seconds, got {getattr(self, what)!r}")
        for what, allowed in (("optimizer", OPTIMIZERS), ("balance", BALANCES), ("backend", BACKENDS)):
            if getattr(self, what) not in allowed:
                raise ValueError(f"{what} must be one of {', '.join(allowed)}, got {getattr(self, what)!r}")
        if self.calibrate and self.backend != "gloo":
            raise ValueError(f"calibrate={self.calibrate}: calibration {NCCL_NOT_YET}: it times CPU ranks (gloo) only; "
                             f"simulate an NCCL run with costs written by sim.save_costs (calibrate=0)")
        if self.trace is not None and (not isinstance(self.trace, str) or self.dp != 1):
            raise ValueError(f"trace must be a path (str) of a run with dp=1, got {self.trace!r} with dp={self.dp}")
        if self.bounds is not None:
            object.__setattr__(self, "bounds", tuple(self.bounds))
        parse_fault(self.fault)

    @property
    def injected(self) -> tuple[str, int] | None:
        """The fault as (what, world rank), or None."""
        return parse_fault(self.fault)


def step_schedule(schedule: sim.Schedule | str, devices: int | None, micro_batches: int | None, dp: int = 1,
                  overlap_grad_reduce: bool = False, virtual: int | None = None) -> sim.Schedule:
    """The schedule a run steps through: `schedule`, or the one `sim.make_schedule` makes of
    a name with `devices`, `micro_batches` (and `virtual`), which with `dp` > 1 replicas
    gets a REDUCE_GRAD per stage (`sim.add_grad_reduce(schedule, overlap_grad_reduce)`)."""
    if not isinstance(schedule, str):
        return schedule
    if devices is None or micro_batches is None:
        raise ValueError("a schedule name needs devices and micro_batches, e.g. run_pipeline(spec, '1f1b', 2, 8)")
    made = sim.make_schedule(schedule, devices, micro_batches, virtual)
    return sim.add_grad_reduce(made, overlap_grad_reduce) if dp > 1 else made


def run_options(entry: str, config: RunConfig | None, options: dict, reads: Sequence[str] | None = None) -> RunConfig:
    """`config` (default `RunConfig()`) with the keyword `options` as its fields. `reads`: the
    fields `entry` reads (None: all); another one set away from its default is a ValueError."""
    config = replace(config or RunConfig(), **options)
    if reads is not None:
        for f in fields(RunConfig):
            value = getattr(config, f.name)
            if f.name not in reads and value != f.default:
                raise ValueError(f"{entry} does not take RunConfig.{f.name} (got {value!r}); it reads {', '.join(reads)}")
    return config


def run_schedule(entry: str, schedule: "sim.Schedule | str", devices: int | None, micro_batches: int | None,
                 config: RunConfig) -> sim.Schedule:
    """The `sim.Schedule` a run of `entry` runs: `schedule` itself, or the one its name makes
    with `devices` and `micro_batches` (given REDUCE_GRAD actions where `config.dp` > 1,
    placed as `config.overlap_grad_reduce` says: `sim.add_grad_reduce`)."""
    if isinstance(schedule, sim.Schedule):
        for what, n, has in (("devices", devices, schedule.ranks), ("micro_batches", micro_batches, schedule.micro_batches)):
            if n is not None and n != has:
                raise ValueError(f"{what}={n} but the schedule {schedule.name!r} has {has}; give the schedule alone")
        return schedule
    if not isinstance(schedule, str):
        raise TypeError(f"schedule must be a sim.Schedule or a name of sim.SCHEDULES, got {type(schedule).__name__}")
    if devices is None or micro_batches is None:
        raise ValueError(f"a schedule name needs devices and micro_batches, e.g. {entry}(spec, {schedule!r}, 2, 8)")
    return step_schedule(schedule, devices, micro_batches, config.dp, config.overlap_grad_reduce)


def model_spec(entry: str, spec):
    """The `exec.models.spec.ModelSpec` a run of `entry` trains: `spec` itself, or a name of
    `MODELS` as `ModelSpec(name)` (its default sizes). ValueError naming the choices for
    another name, TypeError for anything else."""
    from exec.models.spec import ModelSpec
    if isinstance(spec, ModelSpec):
        return spec
    if isinstance(spec, str):
        if spec not in MODELS:
            raise ValueError(f"{entry}: unknown model {spec!r}; give one of {', '.join(map(repr, MODELS))} "
                             f"or a ModelSpec (your own torch blocks: ModelSpec.from_blocks)")
        return ModelSpec(spec)
    raise TypeError(f"{entry}: spec must be an exec.ModelSpec or a model name ({', '.join(MODELS)}), "
                    f"got {type(spec).__name__}")
