"""Measure this machine's device as exec's ranks use it and write its device profile (docs/profiles.md) for the planner.

    python -m exec.profile_device --out ~/.cache/exec/cpu.json                    # gloo, cores ranks
    python -m exec.profile_device --out ~/.cache/exec/quick.json --ranks 2 --quick  # coarser, under a minute
    python -m exec.profile_device --out ~/.cache/exec/gpu.json --backend nccl --ranks 1  # a GPU
    python -m exec.profile_device --out ~/.cache/exec/cpu.json --repeat 3         # three, and their median
    python -m exec.profile_device --out ~/.cache/exec/m.json --median-of A --median-of B  # measures nothing
    >>> measure_device(Path.home() / ".cache/exec/cpu.json", ranks=2, quick=True)   # doctest: +SKIP

A profile belongs to the machine, not to the code: write it outside the checkout (its folder
is made), so that `git status` stays clean; `sim.plan --gpu FILE` reads it from there.

It measures, in ranks set up as `exec.launch.processes` sets up a run's (each rank on its cores with
cores / ranks threads, or one GPU each):

- matmuls of the shapes the planner asks for (`exec.profiler.device_bench.planner_gemms` of the
  GPT the flags give, at each --micro-batch) -> `matmul.table`;
- torch's causal attention call, forward and backward, at a grid of head widths, sequences and
  counts of problems with the model's and each --layer-shape's own added
  (`exec.profiler.device_bench.attention_shapes`) -> `attention.table`;
- memory-bound kernels by class, at several sizes, their bandwidth the slope of time over
  bytes -> `memory_bound`; the best copy bandwidth is the datasheet's `hbm_bandwidth`;
- the host's cost of a kernel -> `launch.per_kernel` (CPU: a block of the GPT at almost no
  work, its forward and backward over the kernels the planner lists; CUDA: an op that does
  nothing), and an optimizer step's fixed cost -> `step_overhead`, and each optimizer's cost per
  parameter tensor -> `optimizer_per_tensor`;
- all-reduce, reduce-scatter and all-gather over 2..N ranks and sends between two, by
  message size -> `collectives.table`, `p2p.table`, and the ring model fitted to them.
- with gloo, what exec's runtime costs its CPU ranks around sends, receives and computes
  (`exec.profiler.host_bench`, exec's own calibration) -> `host_transport` (none with nccl);
- with gloo on 2 ranks, one block's F, B, I and W as a step runs them, at each --micro-batch
  and recompute none and full (`exec.profiler.layer_bench`), of the model's shape and of
  each --layer-shape (default, without --quick or --no-anchors: a quarter, half and twice the
  model's hidden size, heads and sequence, `anchor_shapes`, so that the planner's fit of other
  shapes has measured blocks on both sides: `sim.cost.block_fit`) -> `layers`.

With --repeat N it measures N profiles one after another, keeps each beside --out
(`run_path`) and writes their median (`exec.profiler.median`): a VM's minutes differ by about
10 % (docs/validation.md, "One profile, many shapes"). Every number says how it was measured (docs/profiles.md: source "measured" with the
command, the machine and the date; the fits "derived"). The run has a timeout and leaves no
process behind (`exec.launch.processes`). Exit status: 0 written, 1 a rank failed or timed out, 2 bad
arguments or a device it cannot measure (--backend nccl without enough GPUs).
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Sequence

from sim.cli import OneLineParser, file_problem, missing_extra, number, whole
from exec.runtime.optim import OPTIMIZERS

__all__ = ["main", "measure_device", "anchor_shapes", "SCHEMA"]

PROG = "exec.profile_device"
TIMEOUT = 2400.0  # seconds for each launch of ranks
SCHEMA = "pipeline-workbench/device-profile/1"
QUICK = dict(memory=(2**12, 2**16, 2**20), messages=(2**10, 2**16, 2**20), loops=3, repeats=3, host=(4, 2))
FULL = dict(memory=(2**12, 2**14, 2**16, 2**18, 2**20, 2**22),
            messages=(2**10, 2**12, 2**14, 2**16, 2**18, 2**20, 2**22, 2**24), loops=5, repeats=7,
            host=(20, 5))  # host: (repeats of the calls, steps of the compute marks)


def build_parser():
    p = OneLineParser(error_prog=PROG, prog=PROG, description="Measure this device as exec's ranks use it; write "
                                                            "its device profile (docs/profiles.md).")
    p.add_argument("--out", type=Path, required=True,
                   help="the profile to write (JSON), outside the checkout, e.g. ~/.cache/exec/cpu.json")
    p.add_argument("--backend", choices=["gloo", "nccl"], default="gloo", help="gloo: CPU ranks; nccl: one GPU each")
    p.add_argument("--ranks", type=whole, help="ranks exec will run (default: the cores for gloo, the GPUs for nccl); "
                                               "collectives are measured over 2..ranks")
    p.add_argument("--quick", action="store_true", help="fewer sizes and repeats, no anchor shapes: coarser (about 35 s on an idle 2-core VM: "
                        "docs/exec.md)")
    p.add_argument("--timeout", type=lambda t: number(t, minimum=1.0), default=TIMEOUT,
                   help=f"seconds for each launch of ranks (default {TIMEOUT:.0f}: a full profile on a noisy 2-core "
                        f"VM, its blocks timed again where off a line, took over 900)")
    g = p.add_argument_group("the GPT whose matmuls to measure (sim.Transformer; default: exec's --model gpt)")
    g.add_argument("--hidden", type=whole, default=128)
    g.add_argument("--heads", type=whole, default=4)
    g.add_argument("--seq", type=whole, default=64)
    g.add_argument("--vocab", type=whole, default=512)
    g.add_argument("--ffn", type=whole, help="default 4 x hidden")
    g.add_argument("--micro-batch", type=whole, action="append", dest="micro_batches",
                   help="micro-batch size (repeat; default 1 2 4 8)")
    g.add_argument("--layer-shape", type=_shape, action="append", metavar="HIDDEN,HEADS,SEQ",
                   help="also time whole blocks of this shape (repeat; gloo, 2 ranks), in place of the default "
                        "quarter, half and twice the model's (none with --quick): the planner's anchors for other "
                        "shapes (sim.cost.block_fit)")
    g.add_argument("--no-anchors", action="store_true",
                   help="time the model's blocks only (the planner's fit alone for other shapes; about 30 s)")
    m = p.add_argument_group("the median of several profiles (exec.profiler.median)")
    m.add_argument("--repeat", type=whole, default=1,
                   help="measure N times, one after another, keep each (OUT.runI.json) and write their median "
                        "to --out (a VM's minutes differ by about 10 %%: docs/validation.md)")
    m.add_argument("--median-of", type=Path, action="append", metavar="PROFILE",
                   help="write the median of these profiles of this machine to --out and measure nothing "
                        "(repeat, at least two)")
    return p


def _shape(text: str) -> tuple[int, int, int]:
    """HIDDEN,HEADS,SEQ: three whole numbers, hidden a multiple of heads."""
    try:
        hidden, heads, seq = (whole(v) for v in text.split(","))
    except (ValueError, argparse.ArgumentTypeError):
        raise argparse.ArgumentTypeError(f"takes HIDDEN,HEADS,SEQ (three whole numbers), got {text!r}") from None
    if hidden % heads:
        raise argparse.ArgumentTypeError(f"{text}: hidden must be a multiple of heads")
    return hidden, heads, seq


def anchor_shapes(model) -> list[tuple[int, int, int]]:
    """(hidden, heads, seq) of a quarter, half and twice `model`'s hidden size, heads and
    sequence (each at least 1; the heads divided only where they divide the smaller hidden
    size, else the model's; a smaller shape only where it differs from the larger ones): the
    blocks `measure_device` times beside the model's own by default. The quarter one: below
    the half, the fit of a small block extrapolates, and a block of hidden 32 came out up to
    66 % long under one profile and up to 36 % short under another (docs/validation.md, "One profile, many shapes")."""
    shapes = []
    for k in (4, 2):
        heads = max(1, model.heads // k)
        heads = heads if (model.hidden // k) % heads == 0 else model.heads
        shape = (max(1, model.hidden // k), heads, max(1, model.seq // k))
        if shape[0] % shape[1] == 0 and shape not in (*shapes, (model.hidden, model.heads, model.seq)):
            shapes.append(shape)
    return shapes + [(2 * model.hidden, 2 * model.heads, 2 * model.seq)]


def repeats(model, shape) -> int:
    """How many times the steps a block of `shape` is timed over, against `model`'s: its work
    (hidden^2 x sequence) that many times smaller, at most 4. A small block is a small slope
    under a stage's fixed costs, and scatters most (docs/validation.md, "One profile, many shapes"); it is cheap to time."""
    ratio = (model.hidden ** 2 * model.seq) / (shape.hidden ** 2 * shape.seq)
    return max(1, min(4, round(ratio)))


def layer_shapes(args, model) -> list[tuple[int, int, int]]:
    """The (hidden, heads, seq) whose blocks to time beside the model's: --layer-shape's, else
    `anchor_shapes` unless --quick or --no-anchors."""
    return args.layer_shape or ([] if args.quick or args.no_anchors else anchor_shapes(model))


def _say(text: str) -> None:
    print(f"{PROG}: {text}", file=sys.stderr, flush=True)


def _worker(ctx, plan: dict) -> dict:
    """One rank: the compute measurements (if asked), then the collectives and sends."""
    import torch
    import torch.distributed as dist
    from exec.profiler import comm_bench, device_bench, host_bench, layer_bench

    say = _say if ctx.rank == 0 else (lambda text: None)
    device, out = ctx.device, {"threads": torch.get_num_threads()}
    if plan["compute"]:
        rows = device_bench.matmul_rows(plan["gemms"], device, torch.float32, "fp32", dist.barrier, say, plan["loops"])
        out.update(matmul=rows,
                   attention=device_bench.attention_rows(plan["attention"], device, torch.float32, "fp32", dist.barrier,
                                                         say, plan["loops"]),
                   memory=device_bench.memory_rows(plan["memory"], device, torch.float32, dist.barrier, say,
                                                   plan["loops"]),
                   compute=device_bench.compute_rows(plan["memory"], device, torch.float32, dist.barrier, say,
                                                     plan["loops"]),
                   launch=device_bench.launch_seconds(device, dist.barrier) if device.type == "cuda"
                   else device_bench.layer_launch_seconds(plan["model"], dist.barrier),
                   step_overhead=device_bench.step_overhead_seconds(device, dist.barrier),
                   optimizer_per_tensor={name: device_bench.optimizer_tensor_seconds(device, dist.barrier, name)
                                         for name in OPTIMIZERS})
        per_tensor = ", ".join(f"{k} {v * 1e6:.1f}" for k, v in out["optimizer_per_tensor"].items())
        say(f"launch {out['launch'] * 1e6:.1f} us an op, step overhead {out['step_overhead'] * 1e6:.0f} us, "
            f"the optimizers' us a parameter tensor: {per_tensor}")
    if plan["compute"] and plan["host"] and ctx.world_size > 1:  # gloo's CPU ranks: exec's own costs
        out["host"] = host_bench.host_costs(ctx, plan["model"], plan["host_micro_batch"], *plan["host"])
        say(f"host transport: {len(out['host']['before'])} computes timed")
    if plan["compute"] and plan["host"] and ctx.world_size == 2:  # whole blocks as a step runs them
        out["layers"] = {"blocks": [], "ends": [], "first": [], "optimizer": []}
        for model in (plan["model"], *plan["layer_models"]):  # the profiled shape, then --layer-shape's
            steps = plan["host"][1] * repeats(plan["model"], model)
            rows = layer_bench.layer_rows(ctx, model, plan["layer_micro_batches"], steps=steps, say=say)
            out["layers"] = {k: out["layers"][k] + rows[k] for k in rows}
    if ctx.world_size > 1:
        out["collectives"] = comm_bench.collective_rows(plan["messages"], device, plan["repeats"], say)
        if plan["p2p"]:
            out["p2p"] = comm_bench.p2p_rows(plan["messages"], device, plan["repeats"], say)
    return out


def fingerprint(backend: str, threads: int | None) -> dict:
    """What was measured, with what: device, driver, CUDA, torch, NCCL, backend, host,
    threads per rank, date (null where there is none)."""
    import torch
    cuda = backend == "nccl"
    nccl = None
    if cuda and hasattr(torch.cuda, "nccl"):
        v = torch.cuda.nccl.version()
        nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    return {"device": torch.cuda.get_device_name(0) if cuda else cpu_name(), "driver": _driver() if cuda else None,
            "cuda": torch.version.cuda if cuda else None, "torch": torch.__version__, "nccl": nccl,
            "backend": backend, "host": platform.node() or None, "threads": threads,
            "date": datetime.date.today().isoformat()}


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), or the platform's processor string."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _driver() -> str | None:
    try:
        import subprocess
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.SubprocessError):
        return None


def refusal(backend: str, ranks: int | None) -> str | None:
    """Why this device cannot be measured as asked (one line), or None."""
    import torch
    if backend == "nccl":
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if gpus == 0:
            return "--backend nccl needs a CUDA GPU; this machine has none (use --backend gloo)"
        if ranks is not None and ranks > gpus:
            return f"--backend nccl runs one rank per GPU: --ranks {ranks} needs {ranks} GPUs, this machine has {gpus}"
    elif not hasattr(os, "sched_getaffinity") and ranks is None:
        return "cannot tell this machine's cores; give --ranks"
    return None


def measure_device(out: Path, backend: str = "gloo", ranks: int | None = None, quick: bool = False,
                   model=None, micro_batches: Sequence[int] = (1, 2, 4, 8), timeout: float = TIMEOUT,
                   command: str | None = None, layer_models: Sequence = ()) -> dict:
    """Measure and write the profile to `out`; return it. `model`: the `sim.Transformer`
    whose matmuls to measure and blocks to time (default: exec's small GPT); `layer_models`:
    more `sim.Transformer`s whose blocks to time as well. Raises ValueError where the device
    cannot be measured (`refusal`), `exec.launch.processes.RankError` / TimeoutError where a rank fails."""
    import torch
    from exec.profiler.device_bench import attention_shapes, planner_gemms
    from exec.launch.host import host_cores
    from exec.launch.processes import launch
    from exec.models.spec import ModelSpec
    from exec.profiler.assemble import assemble

    why = refusal(backend, ranks)
    if why:
        raise ValueError(why)
    cores = len(host_cores())
    n = ranks or (torch.cuda.device_count() if backend == "nccl" else cores)
    model = model or ModelSpec("gpt").transformer()
    sizes = QUICK if quick else FULL
    plan = dict(gemms=planner_gemms(model, micro_batches), model=model, memory=sizes["memory"], messages=sizes["messages"],
                loops=sizes["loops"], repeats=sizes["repeats"], host=sizes["host"] if backend == "gloo" else None,
                host_micro_batch=sorted(micro_batches)[len(micro_batches) // 2], layer_micro_batches=tuple(micro_batches),
                layer_models=tuple(layer_models), attention=attention_shapes((model, *layer_models), quick))
    t0 = time.perf_counter()
    _say(f"{backend} on {n} rank(s), {max(1, cores // n) if backend == 'gloo' else 'GPU'} thread(s) each; "
         f"{len(plan['gemms'])} matmul shapes, {'quick' if quick else 'full'} sizes")
    measured, collectives = None, []
    for world in range(min(2, n), n + 1):
        _say(f"launching {world} rank(s)")
        ranks_got = launch(_worker, world, plan | dict(compute=world == n, p2p=world == n), backend=backend,
                           timeout=timeout)
        got = ranks_got[0]
        collectives += got.get("collectives", [])
        if world == n:
            measured = got | ({"host": [r["host"] for r in ranks_got]} if "host" in got else {})
    fp = fingerprint(backend, measured["threads"])
    profile = assemble(measured, collectives, fp, cores if backend == "gloo" else None,
                       command or f"python -m {PROG} --out {out} --backend {backend} --ranks {n}"
                       + (" --quick" if quick else ""), backend)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(profile, indent=1) + "\n")
    _say(f"wrote {out} in {time.perf_counter() - t0:.0f} s")
    return profile


def write_median(out: Path, paths: Sequence[Path]) -> dict:
    """Write the median (`exec.profiler.median.median_profile`) of the profiles at `paths` to
    `out`; return it. ValueError (one line) where one cannot be read or they differ."""
    from exec.profiler.median import median_profile
    profiles = []
    for path in paths:
        try:
            profiles.append(json.loads(Path(path).read_text()))
        except (OSError, ValueError) as e:
            raise ValueError(f"{path}: {e}") from None
    profile = median_profile(profiles)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(profile, indent=1) + "\n")
    _say(f"wrote {out}: the median of {len(paths)} profiles")
    return profile


def run_path(out: Path, i: int) -> Path:
    """Where --repeat keeps its i-th profile (from 1): OUT.runI.json beside --out."""
    return out.with_name(f"{out.stem}.run{i}{out.suffix or '.json'}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.median_of:  # measure nothing
        problem = file_problem(args.out) or (None if len(args.median_of) > 1 else "--median-of needs two profiles or more")
        if problem:
            parser.error(problem)
        try:
            write_median(args.out, args.median_of)
        except ValueError as e:
            parser.error(str(e))
        return 0
    problem = missing_extra() or file_problem(args.out)  # before any measuring
    if problem:
        parser.error(problem if problem.startswith("torch") else f"--out {problem}")
    import sim
    from exec.launch.processes import RankError
    why = refusal(args.backend, args.ranks)
    if why:
        print(f"{PROG}: {why}", file=sys.stderr)
        return 2
    try:
        model = sim.Transformer(layers=1, hidden=args.hidden, heads=args.heads, seq=args.seq, vocab=args.vocab,
                                ffn=args.ffn)
    except ValueError as e:
        parser.error(str(e))
    command = "python -m exec.profile_device " + " ".join(sys.argv[1:] if argv is None else argv)
    try:
        shapes = [dataclasses.replace(model, hidden=h, heads=a, seq=s, ffn=None, kv_heads=None)
                  for h, a, s in layer_shapes(args, model)]
        outs = [args.out] if args.repeat == 1 else [run_path(args.out, i + 1) for i in range(args.repeat)]
        for i, out in enumerate(outs):
            if len(outs) > 1:
                _say(f"profile {i + 1} of {len(outs)}")
            measure_device(out, args.backend, args.ranks, args.quick, model, args.micro_batches or (1, 2, 4, 8),
                           args.timeout, command, shapes)
        if len(outs) > 1:
            write_median(args.out, outs)
    except (RankError, TimeoutError) as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
