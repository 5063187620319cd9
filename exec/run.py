"""Run a schedule on real ranks, check it, and compare it with the simulator.

    python -m exec.run --schedule 1f1b --devices 2 --micro-batches 8   # --stages 2 --micro 8: the old spelling
    python -m exec.run --schedule gpipe --devices 2 --micro-batches 4 --model gpt --json
    python -m exec.run --schedule 1f1b --devices 2 --micro-batches 8 --out runs/1f1b   # trace + figures
    python -m exec.run --schedule interleaved-1f1b --devices 2 --virtual 2 --micro-batches 4   # 2 stages per rank
    python -m exec.run --schedule 1f1b --devices 2 --micro-batches 4 --dp 2   # 2 pipeline replicas: 4 ranks

One process per rank (gloo on CPU, or nccl with one GPU per rank) runs `--warmup` steps,
then `--steps` measured ones; the median step is reported. The first step's loss and
gradients are checked against the same step in a single process. Unless `--no-compare`,
the step is simulated and compared with the measured one (`exec.measure.compare`) under the costs
the simulator needs: read with `--costs FILE`, or calibrated inside the run, on the very
modules, processes and cores of the steps, a round before each measured step
(`exec.pipeline.runner.run_pipeline(calibrate=1)`); `--out` keeps them as `costs.json`
(`sim.save_costs`). `--optimizer` picks AdamW (default), Adam, SGD or SGD with momentum; its state counts in
every rank's static memory, measured and simulated. `--recompute full` (or `selective`,
gpt only) recomputes activations (`exec.models.spec.ModelSpec.recompute`). `--dp N` runs N
pipeline replicas (stages x N ranks, gloo), each on its 1/N of the batch, with one
gradient reduction per stage (`sim.add_grad_reduce`, after the rank's last compute, or
after each stage's last backward with `--overlap-grad-reduce`). `--model gpt --experts E
--top-k K --dp N --ep N` trains a mixture of experts, its experts spread over the N replicas.

Exit status: 0 ok (even if the gradients do not match: read `grad_match`), 1 a rank
failed or the run timed out, 2 bad arguments.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import NoReturn, Sequence

from sim.cli import OneLineParser, folder_problem, machine_memory, missing_extra, number, whole

from exec.runtime.optim import DEFAULT_OPTIMIZER, OPTIMIZERS  # torch is imported only once the arguments are read
from exec.pipeline.config import DEFAULT_LR
from sim.model.transformer import RECOMPUTE

PROG = "exec.run"
LOSSES = {"mlp": "mean squared error to random targets", "gpt": "cross entropy of random tokens"}  # exec.models.spec
MOE_FLAGS = ("experts", "top_k", "expert_ffn", "shared_experts", "dense_layers")  # ModelSpec's fields of the same names


def _seconds(text: str) -> float:
    return number(text, minimum=0.0, strict=True)


def build_parser() -> argparse.ArgumentParser:
    import sim
    p = OneLineParser(error_prog=PROG, prog=PROG, description="Run a pipeline schedule on real ranks with torch.distributed, check its "
                                       "gradients against one process, and compare it with the simulator.")
    p.add_argument("--schedule", default="1f1b", help=f"one of {', '.join(sim.SCHEDULES)} (default 1f1b)")
    p.add_argument("--devices", "--stages", dest="devices", type=whole, default=2, metavar="P",
                   help="pipeline devices P = ranks (default 2; --stages: alias of --devices)")
    p.add_argument("--micro-batches", "--micro", dest="micro_batches", type=whole, default=8, metavar="M",
                   help="micro-batches per step (default 8; --micro: alias of --micro-batches)")
    p.add_argument("--virtual", type=whole, metavar="V",
                   help="model stages (chunks) per rank: P x V stages (default: the schedule's own, 1 or 2)")
    p.add_argument("--dp", type=whole, default=1, metavar="N",
                   help="data-parallel pipeline replicas: P x N ranks, each replica on 1/N of the batch (default 1)")
    p.add_argument("--ep", type=whole, default=1, metavar="N",
                   help="expert parallelism: each MoE layer's experts spread over N of the --dp replicas, tokens "
                        "sent to them by all-to-all (N divides --dp and --experts) (default 1)")
    p.add_argument("--overlap-grad-reduce", action="store_true",
                   help="with --dp: reduce each stage's gradients right after its last backward, not after the "
                        "rank's last compute (Megatron-LM's flag; the same with one stage per rank)")
    _model_flags(p)
    r = p.add_argument_group("run")
    r.add_argument("--backend", choices=["gloo", "nccl"], default="gloo",
                   help="gloo: CPU processes; nccl: one GPU per rank, which checks the gradients and times the "
                        "steps only: no calibration and no --dp on NCCL yet (default gloo)")
    r.add_argument("--steps", type=whole, default=5, help="measured steps (default 5)")
    r.add_argument("--warmup", type=lambda t: whole(t, minimum=0), default=2, help="warm-up steps, not measured (default 2)")
    r.add_argument("--timeout", type=_seconds, default=300.0, help="seconds for the whole run (default 300)")
    r.add_argument("--threads", type=whole, help="torch threads per rank (default cores / ranks)")
    r.add_argument("--optimizer", choices=list(OPTIMIZERS), default=DEFAULT_OPTIMIZER,
                   help="torch.optim's AdamW, Adam, SGD (no momentum) or SGD with momentum 0.9; the names of "
                        "sim.estimate(optimizer=) and python -m sim.plan --optimizer (default adamw)")
    r.add_argument("--lr", type=number, default=DEFAULT_LR,
                   help=f"learning rate, a finite number >= 0 (default {DEFAULT_LR:g}, torch's AdamW default)")
    c = p.add_argument_group("comparison and output")
    c.add_argument("--costs", type=Path, help="costs JSON (sim.save_costs) instead of profiling")
    c.add_argument("--no-compare", action="store_true", help="skip profiling and the simulated step")
    c.add_argument("--out", type=Path, help="directory for the Chrome trace and figures")
    c.add_argument("--trace", type=Path, metavar="FILE",
                   help="after the measured steps, trace one more with torch.profiler into FILE (Chrome/Kineto "
                        "JSON, a span per action named 2F0, each rank a process: exec.measure.trace)")
    c.add_argument("--json", action="store_true", help="print one JSON object on stdout, and the table on stderr (for | jq)")
    c.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    c.add_argument("--progress-every", type=_seconds, default=5.0, metavar="S",
                   help="seconds without a progress line before a 'still running' one (default 5)")
    c.add_argument("--fault", metavar="KIND:RANK",
                   help="make a rank fail on purpose before its first measured step, to test how a run "
                        "ends: raise:R, exit:R or hang:R")
    return p


def _model_flags(p: argparse.ArgumentParser) -> None:
    """The model's flags: `exec.models.spec.ModelSpec`'s fields."""
    m = p.add_argument_group("model (exec.models.spec.ModelSpec)")
    m.add_argument("--model", default="mlp", metavar="MODEL",
                   help="mlp, gpt (a small GPT) or a GPT preset of sim.MODELS (its sizes; the flags below "
                        "override them) (default mlp)")
    m.add_argument("--balance", choices=["layers", "time"], default="layers",
                   help="cut stages by layer count or by profiled time (default layers)")
    m.add_argument("--layers", type=whole, help="MLP or transformer blocks")
    m.add_argument("--hidden", type=whole, help="hidden width")
    m.add_argument("--seq", type=whole, help="sequence length")
    m.add_argument("--heads", type=whole, help="attention heads (gpt)")
    m.add_argument("--vocab", type=whole, help="vocabulary size (gpt)")
    m.add_argument("--ffn", type=whole, help="MLP width of every block (default 4 x hidden)")
    m.add_argument("--batch-size", type=whole, help="samples per step (a multiple of --dp x --micro-batches)")
    m.add_argument("--seed", type=int, help="weights and batch seed")
    m.add_argument("--experts", type=whole, metavar="E",
                   help="gpt: a mixture of experts, E routed experts in each MoE layer (sim.Transformer's experts)")
    m.add_argument("--top-k", type=whole, metavar="K", help="with --experts: experts a token goes to (default 1)")
    m.add_argument("--expert-ffn", type=whole, metavar="F", help="with --experts: one expert's width (default --ffn)")
    m.add_argument("--shared-experts", type=lambda t: whole(t, minimum=0), metavar="S",
                   help="with --experts: experts every token passes through (default 0)")
    m.add_argument("--dense-layers", type=lambda t: whole(t, minimum=0), metavar="N",
                   help="with --experts: the first N blocks keep the dense MLP (default 0)")
    m.add_argument("--recompute", choices=list(RECOMPUTE), default="none",
                   help="activation recomputation: full = every block keeps only its input and recomputes "
                        "its forward before its backward; selective (gpt) = the attention core only (default none)")


def _progress(args, text: str) -> None:
    if not args.quiet:
        print(f"exec: {text}", file=sys.stderr, flush=True)


def _fail(message: str) -> NoReturn:
    print(f"{PROG}: {message}", file=sys.stderr)
    raise SystemExit(1)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    schedule, spec, costs, config = _check(parser, args)
    from exec.launch.processes import under_torchrun

    t0 = time.perf_counter()
    run = _run(args, schedule, spec, config)
    if under_torchrun() and os.environ["RANK"] != "0":
        return 0  # every rank holds the same results: rank 0 reports them, once
    _progress(args, f"done in {time.perf_counter() - t0:.1f} s")
    comparison = None
    if not args.no_compare:
        from exec.measure.compare import compare
        comparison = compare(run.result, costs if costs is not None else run.costs, grad_match=run.grad_match,
                             max_grad_diff=run.max_grad_diff)
    summary = run.summary()
    summary.update(simulated_step_s=None, error_pct=None, model=spec.model, backend=args.backend,
                   balance=args.balance, recompute=spec.recompute, cores=_cores(args, run),
                   measured_peak_memory=summary["peak_memory"], sizes=_sizes(spec))
    summary.update(run.load_json())
    if comparison is not None:
        from exec.measure.compare import replay_median
        cj = comparison.as_json()
        summary.update({k: v for k, v in cj.items() if k not in summary or k in ("simulated_step_s", "error_pct")})
        summary["replay_error_pct"] = replay_median(run.steps, comparison.costs)
        summary["costs"] = comparison.costs.to_dict()  # what the simulation ran on
    human = sys.stderr if args.json else sys.stdout  # with --json, stdout is the JSON alone
    print(_table(summary), file=human)
    status = 0
    if args.out is not None:
        try:
            _save(args.out, run, comparison)
            print(f"wrote {args.out}/", file=human)
        except OSError as e:
            print(f"{PROG}: error: cannot write to {args.out}: {e.strerror or e}", file=sys.stderr)
            status = 1
    if args.trace is not None:
        print(f"wrote {args.trace} (torch.profiler, one step after the measured ones)", file=human)
    if args.json:
        print(json.dumps(_jsonable(summary)))
    bad = run.nonfinite_step
    if bad is not None:
        print(f"{PROG}: error: the loss became {run.losses[bad]} at step {bad + 1} of {len(run.losses)} "
              f"({args.warmup} warm-up + {args.steps} measured); lower --lr", file=sys.stderr)
        return 1
    return status


def _check(parser: argparse.ArgumentParser, args):
    """The schedule, the model, the given costs (or None) and the run's configuration, or
    exit 2 with one line before anything runs."""
    import sim
    from exec.pipeline.config import step_schedule
    try:
        schedule = step_schedule(args.schedule, args.devices, args.micro_batches, args.dp, args.overlap_grad_reduce,
                                 args.virtual)
    except sim.ScheduleError as e:
        parser.error(str(e))
    if args.overlap_grad_reduce and args.dp == 1:
        parser.error("--overlap-grad-reduce places the data-parallel gradient reduction; give --dp 2 or more")
    if args.backend == "nccl" and args.costs is None and not args.no_compare:
        from exec.pipeline.config import NCCL_NOT_YET
        parser.error(f"--backend nccl: calibration {NCCL_NOT_YET}; pass --costs FILE (sim.save_costs) or --no-compare")
    costs = _given_costs(parser, args, schedule)  # before torch: a bad file is refused at once
    problem = folder_problem(args.out) if args.out is not None else None
    if problem:
        parser.error(f"--out {problem}")
    if args.trace is not None and not args.trace.resolve().parent.is_dir():
        parser.error(f"--trace {args.trace}: its folder {args.trace.resolve().parent} does not exist")
    if missing_extra():
        parser.error(missing_extra())
    try:
        spec = model_spec(args)
        config = run_config(args)
    except ValueError as e:
        parser.error(str(e))
    too_big = memory_problem(spec, args.optimizer, args.model)
    if too_big:
        parser.error(too_big)
    from exec.pipeline.runner import check_run
    try:  # the checks run_pipeline makes (the replicas, the batch, the fault, the schedule), before torch starts ranks
        check_run(spec, schedule, config)
    except ValueError as e:
        parser.error(str(e))
    if schedule.stages > spec.num_layers:
        v = f" x V {schedule.stages // args.devices}" if schedule.stages != args.devices else ""
        parser.error(f"--devices {args.devices}{v} = {schedule.stages} model stages is more than the model's "
                     f"{spec.num_layers} layers; use fewer stages or more --layers")
    return schedule, spec, costs, config


def memory_problem(spec, optimizer: str, name: str) -> str | None:
    """One line if the model cannot fit this machine's memory, else None: its fp32 weights,
    gradients and optimizer state (AdamW: two moments) held twice, by the ranks and by the
    single process that checks their gradients (activations aside: a lower bound)."""
    if spec.model != "gpt":
        return None
    params = spec.transformer().params().total
    need = 2 * params * (4 + 4 + (8 if optimizer == "adamw" else 0))
    if need <= machine_memory():
        return None
    return (f"--model {name} of {params / 1e9:.1f} B parameters needs at least {need / 2**30:,.0f} GiB "
            f"(weights, gradients and optimizer state, on the ranks and in the checking process), more than this "
            f"machine's {machine_memory() / 2**30:.0f} GiB; exec runs small models: give fewer --layers or a "
            f"smaller --hidden")


def model_spec(args):
    """The `exec.models.spec.ModelSpec` the flags ask for: --model mlp or gpt with their defaults,
    or a GPT preset's sizes (sim.MODELS), each overridden by the size flags. ValueError (one
    line) for a preset exec does not build or a flag the model does not take."""
    from exec.models.spec import ModelSpec
    sizes = {k: getattr(args, k) for k in ("layers", "hidden", "seq", "heads", "vocab", "batch_size", "seed",
                                           "recompute", *MOE_FLAGS) if getattr(args, k) is not None}
    name = args.model
    if name not in ("mlp", "gpt"):
        from sim.model.registry import MODELS, model_key
        t = MODELS.get(model_key(name))
        if t is None:
            raise ValueError(f"--model must be mlp, gpt or a model of sim.MODELS ({', '.join(MODELS)}); got {name!r}")
        if t.arch != "gpt" or t.kv_heads != t.heads:
            raise ValueError(f"--model {name}: exec builds GPT-style models only (arch 'gpt', no grouped-query "
                             f"attention), not arch {t.arch!r}")
        sizes = dict(layers=t.layers, hidden=t.hidden, heads=t.heads, seq=t.seq, vocab=t.vocab,
                     ffn=t.ffn if args.ffn is None else args.ffn) | sizes
        name = "gpt"
    elif args.ffn is not None:
        sizes["ffn"] = args.ffn
    if "ffn" in sizes:
        sizes["ffn"] = (sizes["ffn"],) * sizes.get("layers", ModelSpec.layers)
    if name == "mlp" and ({"heads", "vocab", *MOE_FLAGS} & set(sizes)):
        raise ValueError("--heads, --vocab and --experts with its flags size the GPT; give --model gpt")
    return ModelSpec(model=name, **sizes)


def _given_costs(parser: argparse.ArgumentParser, args, schedule):
    """The costs of `--costs FILE`, checked against the schedule (None without it). A file
    that is missing, not JSON, not costs or not for this schedule exits 2 with one line
    naming it."""
    if args.costs is None:
        return None
    import sim
    from sim import load_costs
    try:
        costs = load_costs(args.costs)  # its errors name the file
    except ValueError as e:
        parser.error(f"--costs {e}")
    try:
        sim.simulate(schedule, costs)
    except ValueError as e:
        parser.error(f"--costs {args.costs}: {e}")
    return costs


def run_config(args):
    """The `exec.pipeline.config.RunConfig` the flags ask for: calibrated inside the run
    unless costs were given or nothing is compared."""
    from exec.pipeline.config import RunConfig
    return RunConfig(steps=args.steps, warmup=args.warmup, lr=args.lr, optimizer=args.optimizer, dp=args.dp, ep=args.ep,
                     overlap_grad_reduce=args.overlap_grad_reduce,
                     calibrate=0 if args.no_compare or args.costs is not None else 1,
                     balance=args.balance, backend=args.backend, timeout=args.timeout, threads=args.threads,
                     fault=args.fault, progress=not args.quiet, trace=None if args.trace is None else str(args.trace),
                     progress_every=args.progress_every)


def _run(args, schedule, spec, config):
    """The run; a rank that fails or a run that times out exits 1 with one line."""
    from exec.launch.processes import RankError
    from exec.pipeline.runner import run_pipeline

    replicas = f" x {args.dp} replicas" if args.dp > 1 else ""
    _progress(args, f"{schedule.name} on {schedule.ranks} ranks{replicas} ({args.backend}), {args.micro_batches} micro-batches, "
                    f"{spec.model} model, {args.optimizer}; {args.warmup} warm-up + {args.steps} measured steps")
    try:
        run = run_pipeline(spec, schedule, config=config)
    except (RankError, TimeoutError) as e:
        _fail(str(e))
    return run


def _sizes(spec) -> dict:
    """The model's sizes; for the GPT, those of the `sim.Transformer` that describes it."""
    if spec.model == "gpt":
        import dataclasses
        return dataclasses.asdict(spec.transformer()) | {"batch_size": spec.batch_size}
    return {"layers": spec.layers, "hidden": spec.hidden, "seq": spec.seq, "batch_size": spec.batch_size}


def _cores(args, run) -> int | None:
    """The cores the gloo ranks held together on rank 0's host, the union of their blocks
    (`PipelineRun.hosts`; None for nccl: one GPU per rank)."""
    return run.hosts[0]["cores"] if args.backend == "gloo" and run.hosts else None


def _ms(xs) -> str:
    return " ".join(f"{x * 1e3:.2f}" for x in xs)


def _table(s: dict) -> str:
    dp = s.get("dp", 1)
    crowded = [h for h in s.get("hosts", []) if h["shared"]] if s.get("cores") is not None else []
    replicas = f" x {dp} replicas = {s['world_size']} ranks" if dp > 1 else ""
    rows = [
        ("schedule", f"{s['schedule']}: {s['stages']} stages on {s['ranks']} ranks{replicas}, "
                     f"{s['micro_batches']} micro-batches"),
        ("stage layers", ", ".join(f"{a}-{b - 1}" for a, b in zip(s["bounds"], s["bounds"][1:]))),
        ("optimizer", s["optimizer"]),
        ("recompute", s.get("recompute", "none")),
        ("measured step", f"{s['measured_step_s'] * 1e3:.2f} ms (median of {len(s['step_times_s'])}; "
                          f"min {min(s['step_times_s']) * 1e3:.2f}, max {max(s['step_times_s']) * 1e3:.2f})"),
    ]
    if s.get("grad_reduce_s") is not None:
        cost = s.get("costs", {}).get("grad_reduce")
        rows.append(("grad reduce (ms)", f"{_ms(s['grad_reduce_s'])} per stage measured"
                     + (f", {_ms(cost)} calibrated" if isinstance(cost, list) else "")))
    if s.get("simulated_step_s") is not None:
        rows.append(("simulated step", f"{s['simulated_step_s'] * 1e3:.2f} ms (error {s['error_pct']:+.1f}%, under the "
                                       f"costs calibrated in the run)"))
        rows.append(("replayed steps", f"error {s['replay_error_pct']:+.1f}% (median over the steps, each simulated with "
                                       f"its own compute times: the rules alone)"))
        if crowded:
            h = crowded[0]
            rows.append(("note", f"{h['ranks']} ranks on {h['cores']} cores, sharing them: rule 9 (each rank on its own cores) "
                                 f"does not hold, so measured and simulated times cannot agree; the run checks correctness"))
        rows.append(("bubble", f"{s['bubble_fraction']:.3f} measured, {s['simulated_bubble']:.3f} simulated"))
    else:
        rows.append(("bubble", f"{s['bubble_fraction']:.3f} measured"))
    if s.get("load"):
        rows.append(("machine", s["load"] + ("; the run's own ranks, which share cores, are among those" if crowded else "")))
    if s.get("cores") is not None:
        from exec.launch.host import crowding
        rows += [("hosts", line) for line in crowding(h for h in s.get("hosts", []) if h["nodes"] > 1)]
    rows += [
        ("peak activations", " ".join(map(str, s["peak_activations"])) + " micro-batches per rank"),
        ("loss", f"{s['loss']:.6f} after {s['steps']} steps (first {s['first_loss']:.6f}; one process: "
                 f"{s['reference_loss']:.6f}); {LOSSES.get(s['model'], 'the loss')}, the same batch every step"),
        ("grad_match", str(s["grad_match"])),
        ("max_grad_diff", f"{s['max_grad_diff']:.3g} (at {s['worst_param']})"),
    ]
    w = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{w}}  {v}" for k, v in rows)


def _save(out: Path, run, comparison) -> None:
    """Chrome trace of the median step, the costs calibrated in the run (for `--costs`),
    and the step's figure (and the overlay) if sim.plot is there."""
    out.mkdir(parents=True, exist_ok=True)
    name = f"{run.schedule.name}_p{run.schedule.stages}_m{run.schedule.micro_batches}"
    run.result.save_chrome_trace(out / f"{name}_measured.trace.json")
    if run.costs is not None:
        from sim import save_costs
        save_costs(run.costs, out / "costs.json", details=run.calibration)
    try:
        from sim.plot.gantt import plot_result, save_figure
    except ImportError:
        return
    save_figure(plot_result(run.result), out / f"{name}_measured.png")
    if comparison is not None:
        from exec.measure.compare import overlay_figure
        overlay_figure(comparison, out / f"{name}_overlay.png")


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


if __name__ == "__main__":
    sys.exit(main())
