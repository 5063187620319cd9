"""The command line of `sim.plan`: search the layouts of a run, print the best, draw them.

    python -m sim.plan --model gpt3-175b --gpu a100-80gb --gpus 1024 --global-batch 1536
    python -m sim.plan --model megatron-1.7b --gpu a100-80gb --gpus 16 --global-batch 64 --json

Bad input (an unknown model or GPU, a tp that does not divide the heads, GPUs that tp*pp
does not divide, a batch that does not split into micro-batches) is one line on stderr and
exit status 2, before any work. Progress goes to stderr: a bar when it is a terminal (or
with --progress), else a plain line every 2 s; none with --quiet.

    python -m sim.plan --model my-model.json --gpu h100-80gb --gpus 64 --global-batch 512 --seq 8192

A torchtitan job config is estimated as it stands (`sim.plan.configs`), and the best plan, or
the config's run, written as the next run's config, torchtitan's TOML and Megatron-Core's arguments:

    python -m sim.plan --config sim/plan/data/torchtitan_llama3_8b.toml --gpu h100-96gb-500w-torchtitan --gpus 128
    python -m sim.plan --model llama3.1-8b --gpu h100-80gb --gpus 64 --global-batch 512 --write-config out/next
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import threading
import time
from pathlib import Path
from typing import Sequence

from sim import cli
from sim.cli import whole
from sim.hardware.gpus import GIB, GPUS, PRECISIONS
from sim.hardware.profile import resolve
from sim.model.footprint import DEFAULT_OPTIMIZER, OPTIMIZERS
from sim.schedule.ir import ScheduleError
from .bounds import Bounds
from .configs import megatron_args, pinned, read_torchtitan, write_torchtitan
from .layout import DEFAULT_HEADROOM, MAX_CELLS, Layout
from .space import configurations
from .steps import Steps
from sim.model.registry import MODELS, find_model, model_key, model_name
from .planner import TOO_LARGE, Plan, search
from .space import CP_MIN_SEQ, CP_MIN_TOKENS, MAX_CONFIGS, MAX_MICRO_BATCH, MAX_VIRTUAL, TOP
from sim.schedule.registry import SCHEDULES
from sim.model.transformer import RECOMPUTE

PROG = "sim.plan"
GPU_HELP = (f"one of {', '.join(GPUS)}, a device profile's name, or a profile FILE.json (what python -m "
            f"exec.profile_device --out FILE.json writes)")


def _ints(text: str) -> list[int]:
    """`4` or `1,2,4`: positive integers."""
    return [whole(t.strip()) for t in text.split(",")]


def _zeros(text: str) -> list[int]:
    return [whole(t.strip(), minimum=0) for t in text.split(",")]


def _words(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def headroom(text: str) -> float:
    """`--memory-headroom`: a share of each GPU's memory, `10%` or `0.1` (a bare number is a
    fraction, below 1), or bytes with their unit: `4GiB`, `512MiB`, `4e9B`. A bare number of 1
    or more (`1`, `1.5`: a fraction or bytes?) is refused."""
    units = {"%": 0.01, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "B": 1}
    for suffix, scale in units.items():
        if text.endswith(suffix):
            value = cli.number(text[:-len(suffix)]) * scale
            if suffix == "%" and value >= 1:
                raise argparse.ArgumentTypeError(f"got {text}, need a share below 100%")
            return value
    value = cli.number(text)
    if value >= 1:
        raise argparse.ArgumentTypeError(f"got {text}: a bare number is a fraction of each GPU's memory, below 1 "
                                         f"(0.1 or 10%); give bytes with a unit (4GiB, 512MiB, 4e9B)")
    return value


def _config_arguments(parser: argparse.ArgumentParser) -> None:
    """--config and --write-config: torchtitan's job config in, the next run's configs out."""
    parser.add_argument("--config", metavar="FILE.toml", help="a torchtitan job config: estimate the run it says "
                        "(model, degrees, schedule, batch, checkpointing, float8; docs/planner.md, 'torchtitan and "
                        "Megatron-Core configs') instead of searching; --gpus where data_parallel_shard_degree is -1")
    parser.add_argument("--write-config", metavar="DIR", help="write the best plan that each can say (with --config: "
                        "the config's run) as DIR/torchtitan.toml and DIR/megatron.args (Megatron-Core's arguments)")


def build_parser() -> argparse.ArgumentParser:
    parser = cli.OneLineParser(
        error_prog=PROG, prog="python -m sim.plan", formatter_class=cli.DefaultsFormatter,
        description="Search tensor, pipeline and data parallelism, micro-batch size, schedule, chunks, "
                    "recompute and ZeRO stage for the fastest training step that fits; print the best, "
                    "draw its step and a scatter of all simulated configurations.",
        epilog="Lists are comma-separated. What is searched and the bounds that drop configurations "
               "before they are simulated: docs/planner.md, 'Planner'.")
    _config_arguments(parser)
    parser.add_argument("--model", help=f"a preset ({', '.join(MODELS)}) or FILE.json, an object of sim.Transformer's fields "
                        f"(layers, hidden, heads, seq, vocab; optional ffn, kv_heads, arch, attention, ...)")
    parser.add_argument("--seq", type=whole, help="sequence length (default: the model's)")
    parser.add_argument("--gpu", required=True, help=GPU_HELP)
    parser.add_argument("--gpus", type=whole, help="GPUs in all: tp * cp * pp * dp")
    parser.add_argument("--global-batch", type=whole, help="sequences per step")
    parser.add_argument("--tp", type=_ints, help="tensor-parallel sizes (default: powers of two within a node)")
    parser.add_argument("--cp", type=_ints, help="context-parallel sizes (default: 1 below a sequence of "
                        f"{CP_MIN_SEQ}; from it, powers of two keeping {CP_MIN_TOKENS} tokens a rank)")
    parser.add_argument("--pp", type=_ints, help="pipeline sizes (default: every divisor of gpus/tp up to the layers)")
    parser.add_argument("--ep", type=_ints, help="expert-parallel sizes, a mixture of experts only (default: every "
                        "divisor of the experts that folds onto tp x cp x dp)")
    parser.add_argument("--expert-tp", type=_ints, help="expert tensor-parallel sizes, a mixture of experts only "
                        "(default: 1 and tp)")
    parser.add_argument("--micro-batch", type=_ints, help="micro-batch sizes (default: divisors up to --max-micro-batch)")
    parser.add_argument("--schedules", type=_words,
                   help=f"schedules, replacing the default (all but zb-auto, v-min and v-half): {', '.join(SCHEDULES)}")
    parser.add_argument("--virtual", type=_ints, help="chunks per device for the schedules that take them "
                                                 "(default: 2..--max-virtual where pp*V divides the layers)")
    parser.add_argument("--recompute", type=_words, help=f"any of {', '.join(RECOMPUTE)} (default: all)")
    parser.add_argument("--zero", type=_zeros, help="ZeRO stages, any of 0,1,2,3 (default: all; 2 only with pp 1; 3 with "
                        "pp > 1 is FSDP, its gathers and reduce-scatters actions on the step)")
    parser.add_argument("--reshard-after-forward", choices=("both", "on", "off"), default="both",
                        help="FSDP2's option where zero is 3 with pp > 1: release each stage's gathered parameters "
                             "after its forward (on) or keep them to its last backward (off); both differ only where "
                             "a device holds several stages")
    parser.add_argument("--sequence-parallel", choices=("both", "on", "off"), default="both",
                   help="sequence parallelism (only where tp > 1)")
    parser.add_argument("--precision", default="bf16", help=f"one of {', '.join(PRECISIONS)}, or fp8 (Transformer "
                        f"Engine's FP8 Linear GEMMs, on a profile that times them: h100-80gb's default does)")
    parser.add_argument("--optimizer", default=DEFAULT_OPTIMIZER, choices=list(OPTIMIZERS),
                        help="the run's optimizer: its state in memory, its step in time (the names of exec.run --optimizer)")
    parser.add_argument("--memory-headroom", type=headroom, default=DEFAULT_HEADROOM,
                   help="kept free of each GPU's memory for the CUDA context, NCCL's buffers and fragmentation: "
                        "a fraction below 1 (0.1, 10%%) or bytes with a unit (4GiB, 512MiB, 4e9B)")
    parser.add_argument("--gpus-per-node", type=whole, default=8, help="GPUs joined by NVLink")
    parser.add_argument("--nics-per-node", type=whole, help="network cards a node's GPUs share "
                                                       "(default: --gpus-per-node, one a GPU)")
    parser.add_argument("--max-micro-batch", type=whole, default=MAX_MICRO_BATCH, help="largest micro-batch tried")
    parser.add_argument("--max-virtual", type=whole, default=MAX_VIRTUAL, help="most chunks per device tried")
    parser.add_argument("--max-configs", type=whole, default=MAX_CONFIGS, help="refuse a larger search")
    parser.add_argument("--top", type=whole, default=TOP, help="configurations to rank and print")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON on stdout instead of a table")
    parser.add_argument("--out", default="out", help="folder for the figures, created if missing (default out/, "
                                                "which git ignores)")
    parser.add_argument("--no-figures", action="store_true", help="draw nothing")
    shown = parser.add_mutually_exclusive_group()
    shown.add_argument("--quiet", action="store_true", help="no progress on stderr")
    shown.add_argument("--progress", action="store_true", help="a redrawn progress bar even when stderr is not a "
                                                               "terminal (else plain lines every few seconds)")
    return parser


class ProgressBar:
    """`sim.plan: [#####.......] 1234/5678 settled, 12.3 s` on stderr, redrawn at most 10
    times a second as configurations settle, and at least once every `every` seconds of
    `clock` while one is being simulated (a zb-auto configuration takes seconds: the clock
    keeps moving; a thread calls `beat`); a newline when done. `plain=True` (stderr not a
    terminal: a log, a pipe) writes a whole line instead, `sim.plan: 1234/5678 settled, 12.3 s`,
    at most every `every` seconds. `close()` stops the redrawing."""

    def __init__(self, width: int = 30, every: float = 1.0, plain: bool = False, clock=time.perf_counter):
        self.width, self.every, self.plain, self.clock = width, every, plain, clock
        self.start, self.last = clock(), 0.0
        self.state: tuple[int, int] | None = None
        self._lock, self._done = threading.RLock(), threading.Event()
        threading.Thread(target=self._beat, name="sim.plan-progress", daemon=True).start()

    def __call__(self, done: int, total: int) -> None:
        with self._lock:  # one drawing of a moment, whether this call or `beat` makes it
            now = self.clock()
            self.state = (done, total)
            if done >= total or now - self.last >= (self.every if self.plain else 0.1):
                self._draw(done, total, now)

    def _draw(self, done: int, total: int, now: float) -> None:
        with self._lock:
            if self._done.is_set():
                return
            self.last = now
            filled = self.width * done // max(total, 1)
            bar = "" if self.plain else f"[{'#' * filled}{'.' * (self.width - filled)}] "
            print(f"{'' if self.plain else chr(13)}{PROG}: {bar}{done}/{total} settled, {now - self.start:.1f} s",
                  end="\n" if done >= total or self.plain else "", file=sys.stderr, flush=True)
            if done >= total:
                self._done.set()

    def beat(self) -> None:
        """Redraw the last state if `every` seconds have passed since the last drawing."""
        with self._lock:
            now = self.clock()
            if self.state is not None and now - self.last >= self.every:
                self._draw(*self.state, now)

    def _beat(self) -> None:
        while not self._done.wait(self.every / 4):
            self.beat()

    def close(self) -> None:
        self._done.set()


def profile_kind(profile) -> str:
    """What the profile's numbers are (their `source`s, docs/profiles.md): "calibrated" if any
    was fitted, else "measured" if any was measured here, else "best case" (published figures)."""
    sources = set()

    def walk(node) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("source"), str):
                sources.add(node["source"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(profile.data)
    return next((kind for kind in ("calibrated", "measured") if kind in sources), "best case")


def format_table(plan: Plan) -> str:
    """One aligned line per ranked configuration."""
    head = ("rank", "tp", "cp", "pp", "dp", "b", "m", "schedule", "V", "recompute", "zero", "sp", "step s",
            "HW TFLOP/s/GPU", "MFU", "bubble", "peak GiB", "fits")
    experts = plan.model.moe is not None  # its ep and expert_tp after cp
    head = head[:3] + ("ep", "etp") * experts + head[3:]
    rows = [head]
    for i, row in enumerate(plan.rows, 1):
        config = row.config
        rows.append((str(i), str(config.tp), str(config.cp), *((str(config.ep), str(config.expert_tp)) * experts),
                     str(config.pp), str(config.dp), str(config.micro_batch),
                     str(row.micro_batches), config.schedule + ("+pairs" if config.overlap else ""), str(config.virtual), config.recompute,
                     f"{config.zero}{'' if config.reshard_after_forward else ' keep'}",
                     "on" if config.sequence_parallel else "off",
                     f"{row.step_time:.4g}", f"{row.tflops_per_gpu:.1f}", f"{row.mfu:.1%}", f"{row.bubble_fraction:.1%}",
                     f"{row.peak_memory / GIB:.1f}", "yes" if row.fits else "no"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    left = {head.index("schedule"), head.index("recompute")}
    return "\n".join("  ".join(v.ljust(w) if i in left else v.rjust(w) for i, (v, w) in enumerate(zip(row, widths)))
                     .rstrip() for row in rows)


def legend(plan: Plan) -> list[str]:
    """What the table's less obvious columns mean (issue 52: the TFLOP/s count recompute)."""
    lines = ["b: micro-batch size, m: micro-batches a step, V: chunks a device, sp: sequence parallelism",
             "HW TFLOP/s/GPU: the FLOPs a GPU executes a second, recomputed forwards included (Narayanan et al. "
             "2021, Eq. 3); MFU: the model's FLOPs alone (no recompute) over the GPU's peak"]
    if plan.model.moe is not None:
        lines.append("ep: expert parallelism (the routed experts split over ep ranks); etp: expert tensor "
                     "parallelism (each expert's matrices split over etp ranks), Megatron-Core's "
                     "--expert-tensor-parallel-size")
    return lines


def format_report(plan: Plan, name: str | None = None) -> str:
    """The header (the run, its profile and kind, the memory a GPU may fill), the table and its
    legend, and what was left out: the enumerated configurations by reason (they and the simulated
    ones that fit add up to the enumerated), then what was not enumerated at all (layouts and
    schedule sizes, not configurations). `name`: the model's as the user gave it."""
    fit = plan.simulated - plan.dropped_configs["does not fit (simulated)"]
    kind = profile_kind(plan.profile)
    lines = [f"{name or model_name(plan.model)} on {plan.gpus} x {plan.gpu.name}, global batch {plan.global_batch}, {plan.precision}: "
             f"{plan.enumerated} configurations, {plan.simulated} simulated ({fit} fit) in {plan.seconds:.1f} s",
             f"{plan.profile.header} (profile {plan.profile.name}); fits: peak <= {plan.usable_memory / GIB:.1f} of "
             f"{plan.gpu.memory / GIB:.1f} GiB (the rest is headroom for CUDA, NCCL and fragmentation)"]
    if kind == "best case":
        lines.append("caveat: a best-case profile (the best published figures for recent software, not a "
                     "calibrated stack): expect real steps 10-25 % slower")
    lines += [f"warning: {w}" for w in plan.warnings]
    lines += [format_table(plan), *legend(plan)] if plan.rows else ["no configuration fits"]
    if any(not row.config.reshard_after_forward for row in plan.rows):
        lines.append("zero '3 keep': FSDP with reshard_after_forward off (each stage kept gathered from its first "
                     "forward to its last backward)")
    if any(row.config.overlap for row in plan.rows):
        lines.append("'+pairs': the schedule's overlapped forward-backward pairs, each one's expert all-to-all "
                     "hidden under the other's compute (docs/rules.md, rule 18)")
    for title, counts in ((f"dropped (of the {plan.enumerated} configurations):", plan.dropped_configs),
                          ("not enumerated (layouts, schedule sizes):", plan.not_enumerated)):
        if counts:
            lines.append(title)
            lines += [f"  {n:>7}  {why}" for why, n in sorted(counts.items(), key=lambda kv: -kv[1])]
    return "\n".join(lines)


def why_none_fits(plan: Plan) -> str:
    """The fix for a plan with no row, from the commonest reason its configurations went."""
    reasons = plan.dropped_configs
    if reasons and max(reasons, key=reasons.get) == TOO_LARGE:
        return "its steps are too large to simulate on this machine; give a smaller global batch"
    return "give more GPUs, a smaller global batch, a smaller --memory-headroom or a GPU with more memory"


def nearest_miss(plan: Plan, limits: dict) -> str | None:
    """When nothing fits, the configuration closest to fitting and by how much it misses: the
    simulated one of the least peak, else (none simulated: the memory bounds dropped them all)
    the enumerated one of the least bound (`Bounds.memory`, the fullest device's weights,
    gradients, optimizer state and the activations its schedule holds: a lower bound of its
    peak). None if neither misses by memory."""
    from .figures import describe  # (figures imports matplotlib when drawn, not before)
    usable = plan.usable_memory
    if plan.points:
        row = min(plan.points, key=lambda r: r.peak_memory)
        return (f"nearest miss: {describe(row)}: peak {row.peak_memory / GIB:.1f} GiB, "
                f"{(row.peak_memory - usable) / GIB:.1f} GiB over the {usable / GIB:.1f} GiB usable (simulated)")
    keep = {k: v for k, v in limits.items() if k not in _SEARCH_ONLY}
    run = Layout(global_batch=plan.global_batch, precision=plan.precision, gpus_per_node=limits["gpus_per_node"],
                 nics_per_node=limits["nics_per_node"], memory_headroom=limits["memory_headroom"],
                 optimizer=limits["optimizer"])
    configs = configurations(plan.model, plan.gpus, plan.global_batch, run=run, **keep)
    if not configs:
        return None
    bounds = Bounds(plan.model, plan.profile, Steps(plan.model, plan.profile))
    need, index = min((bounds.memory(c), i) for i, c in enumerate(configs))
    config = configs[index]
    if need <= usable:  # then the bound did not drop it: no miss by memory to show
        return None
    row = f"tp={config.tp} {f'cp={config.cp} ' if config.cp > 1 else ''}pp={config.pp} dp={config.dp} " \
          f"b={config.micro_batch} {config.schedule} V={config.virtual} recompute={config.recompute} zero={config.zero}"
    return (f"nearest miss: {row}: at least {need / GIB:.1f} GiB (its fullest device's weights, gradients, optimizer "
            f"state and the activations its schedule holds; a bound, not simulated), {(need - usable) / GIB:.1f} GiB over the "
            f"{usable / GIB:.1f} GiB usable")


_SEARCH_ONLY = ("precision", "optimizer", "nics_per_node", "max_configs", "top", "memory_headroom")


def fewest_cells(args: argparse.Namespace) -> int:
    """A lower bound of any layout's stage x micro-batches (`sim.plan.layout.cells`): pp, V >= 1,
    dp <= --gpus and a micro-batch at most the largest tried make at least global batch / (gpus x
    micro-batch) micro-batches."""
    largest = max(args.micro_batch) if args.micro_batch else args.max_micro_batch
    return -(-args.global_batch // (args.gpus * largest))


def shown_name(args: argparse.Namespace) -> str:
    """The model as the user named it: a preset as given (`llama3.1-8b`, though `llama3-8b` is
    the same model), a file by its path; with `--seq`, the sequence length after it."""
    name = args.model if args.model.endswith(".json") else model_key(args.model)
    return f"{name} at seq {args.seq}" if args.seq is not None else name


def _check_out(out: Path) -> None:
    """Make the folder and write a file in it, before any work (`sim.cli.folder_problem`)."""
    problem = cli.folder_problem(out)
    if problem:
        cli.fail(PROG, f"argument --out: {problem}")


def _limits(args: argparse.Namespace) -> dict:
    sp, raf = ({"both": None, "on": [True], "off": [False]}[choice]
               for choice in (args.sequence_parallel, args.reshard_after_forward))
    return dict(tp=args.tp, cp=args.cp, pp=args.pp, ep=args.ep, expert_tp=args.expert_tp, micro_batch=args.micro_batch, schedules=args.schedules,
                virtual=args.virtual, recompute=args.recompute, zero=args.zero, sequence_parallel=sp,
                reshard_after_forward=raf,
                precision=args.precision, optimizer=args.optimizer, gpus_per_node=args.gpus_per_node,
                nics_per_node=args.nics_per_node, max_micro_batch=args.max_micro_batch,
                max_virtual=args.max_virtual, max_configs=args.max_configs, top=args.top,
                memory_headroom=args.memory_headroom)


_SEARCH_ARGS = ("model", "seq", "global_batch", "tp", "cp", "pp", "ep", "expert_tp", "micro_batch", "schedules",
                "virtual", "recompute", "zero")


def _check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """--model, --gpus and --global-batch for a search; with --config none of what the config says."""
    if args.config:
        given = [f"--{a.replace('_', '-')}" for a in _SEARCH_ARGS if getattr(args, a) is not None]
        if given:
            parser.error(f"--config gives the model, the batch and the layout; drop {', '.join(given)}")
    else:
        missing = [f"--{a.replace('_', '-')}" for a in ("model", "gpus", "global_batch") if getattr(args, a) is None]
        if missing:
            parser.error(f"the following arguments are required: {', '.join(missing)} (or --config FILE.toml)")
    if args.write_config:
        problem = cli.folder_problem(Path(args.write_config))
        if problem:
            cli.fail(PROG, f"argument --write-config: {problem}")


def write_configs(folder: Path, estimates: list, profile, out=sys.stdout) -> int:
    """Write the first of `estimates` (best first) that torchtitan says as folder/torchtitan.toml,
    and the first Megatron-Core runs as folder/megatron.args; 1 if one of them has none."""
    status = 0
    for name, write in (("torchtitan.toml", lambda e: write_torchtitan(e.model, pinned(e), profile)),
                        ("megatron.args", lambda e: " ".join(megatron_args(e.model, e.layout, e.layers_per_stage,
                                                                           profile)) + "\n")):
        problems = []
        for rank, e in enumerate(estimates, 1):
            try:
                text = write(e)
            except ValueError as err:
                problems.append(str(err))
                continue
            (folder / name).write_text(text)
            print(f"wrote {folder / name}" + (f" (rank {rank})" if len(estimates) > 1 else ""), file=out)
            break
        else:
            print(f"{PROG}: no {name} written: {problems[0] if problems else 'no configuration fits'}", file=sys.stderr)
            status = 1
    return status


def format_estimate(e, config: str) -> str:
    """The config's run, its profile, what the estimate predicts, and its warnings."""
    lay, tokens = e.layout, e.layout.global_batch * e.model.seq / (e.step_time * e.layout.gpus)
    virtual = e.result.schedule.stages // lay.pp
    lines = [f"{config}: {model_name(e.model)} at seq {e.model.seq} on {lay.gpus} x {e.gpu.name}: tp {lay.tp}, cp "
             f"{lay.cp}, pp {lay.pp}, dp {lay.dp} (zero {lay.zero}), micro-batch {lay.micro_batch}, global batch "
             f"{lay.global_batch}, {lay.schedule} V {virtual}, recompute {lay.recompute}, {lay.precision}",
             f"{e.profile.header} (profile {e.profile.name})",
             f"step {e.step_time:.4g} s, {tokens:,.0f} tokens/s/GPU, {e.tflops_per_gpu:.1f} HW TFLOP/s/GPU, MFU "
             f"{e.mfu:.1%}, bubble {e.bubble_fraction:.1%}, peak {max(e.peak_memory) / GIB:.1f} of "
             f"{e.usable_memory / GIB:.1f} GiB usable: fits {'yes' if e.fits else 'no'}"]
    if profile_kind(e.profile) == "best case":
        lines.append("caveat: a best-case profile (the best published figures for recent software, not a "
                     "calibrated stack): expect real steps 10-25 % slower")
    return "\n".join(lines + [f"warning: {w}" for w in e.warnings])


def run_config(args: argparse.Namespace) -> int:
    """--config: estimate the torchtitan job config's run; print it; write it where asked."""
    try:
        profile = resolve(args.gpu)
        job = read_torchtitan(args.config, args.gpus, profile, gpus_per_node=args.gpus_per_node,
                              nics_per_node=args.nics_per_node, memory_headroom=args.memory_headroom)
        e = job.estimate(profile)
    except (ValueError, ScheduleError) as err:
        cli.fail(PROG, str(err).splitlines()[0])
    print(json.dumps(e.summary(), indent=1) if args.json else format_estimate(e, args.config), flush=True)
    return write_configs(Path(args.write_config), [e], profile, sys.stderr if args.json else sys.stdout) \
        if args.write_config else 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (2 for what is refused)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    _check_args(parser, args)
    if args.config:
        return run_config(args)
    out = Path(args.out)
    if not args.no_figures:
        _check_out(out)
    bar = None if args.quiet else ProgressBar(plain=not (args.progress or sys.stderr.isatty()),
                                              every=1.0 if args.progress or sys.stderr.isatty() else 2.0)
    if fewest_cells(args) > MAX_CELLS:  # before any work: no layout's step could be simulated
        if bar is not None:
            bar.close()
        cli.fail(PROG, f"global batch {args.global_batch:,} on {args.gpus} GPUs: even the fewest micro-batches (dp "
                       f"{args.gpus}, micro-batch {max(args.micro_batch or [args.max_micro_batch])}) make "
                       f"{fewest_cells(args):,}, more than the {MAX_CELLS:,} stage-micro-batches a step may have to "
                       f"be simulated in seconds; give a smaller global batch, more GPUs or a larger micro-batch")
    try:
        model = find_model(args.model)
        if args.seq is not None:
            model = dataclasses.replace(model, seq=args.seq)
        plan = search(model, args.gpu, args.gpus, args.global_batch, progress=bar, **_limits(args))
    except (ValueError, ScheduleError) as e:
        cli.fail(PROG, str(e).splitlines()[0])
    finally:
        if bar is not None:
            bar.close()
    name = shown_name(args)
    summary = {**plan.summary(), "model": name}
    miss = None if plan.rows else nearest_miss(plan, _limits(args))
    if args.json:
        print(json.dumps({**summary, "nearest_miss": miss} if not plan.rows else summary, indent=1), flush=True)
    else:
        print(format_report(plan, name), flush=True)
    if not plan.rows:
        if miss and not args.json:
            print(miss, flush=True)
        print(f"{PROG}: no configuration fits on {args.gpus} x {args.gpu}; {why_none_fits(plan)}", file=sys.stderr)
        return 1
    status = write_configs(Path(args.write_config), [r.estimate for r in plan.rows if r.estimate is not None],
                           plan.profile, sys.stderr if args.json else sys.stdout) if args.write_config else 0
    if args.no_figures:
        return status
    from .figures import write_figures
    try:
        written = write_figures(plan, out, name)
    except OSError as e:
        print(f"{PROG}: error: cannot write to {out}: {e.strerror or e}", file=sys.stderr)
        return 1
    for path in written:
        print(f"wrote {path}", file=sys.stderr if args.json else sys.stdout)
    return status


if __name__ == "__main__":
    sys.exit(main())
