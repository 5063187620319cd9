"""The planner against real runs of several model shapes: sim.estimate on one measured device profile predicts each shape's step time and per-rank peak memory; exec.run measures them.

    python -m exec.profile_device --out /tmp/cpu.json                     # once, just before
    PYTHONPATH=. python benchmarks/bench_plan_vs_run.py --profile /tmp/cpu.json            # about 12 min
    PYTHONPATH=. python benchmarks/bench_plan_vs_run.py --profile /tmp/cpu.json --quick    # 6 runs

The grid: seven shapes the profile did not measure (`SHAPES`: other hidden sizes, sequence
lengths, head counts, vocabularies and depths), each under 1F1B, GPipe and ZB-H1 with
recompute none and full, 4 micro-batches of a batch of 32, 2 CPU ranks, AdamW; and the
profiled shape (exec's --model gpt: 4 blocks, hidden 128, 4 heads, sequence 64, vocabulary
512) run just before and just after each of them under the same case. A shape the profile
did not measure is timed by the kernel model run as a step runs it, fitted on the blocks the
profile measured (`sim.cost.block_fit`). Per run it prints the predicted and measured step (the
median step), their error, the drift of the machine (`reference`: a block of the profiled
shape timed in this process just before the run, over the same timed when the bench started,
right after the profile) and the error with the prediction scaled by it, the spread of the
measured steps ((max - min) / median), the peak-memory error of the worst rank, the share of
the step other processes took (exec.run's `lost_share`), the share of the machine's CPU time
the hypervisor took (`steal`) and the load average (/proc/loadavg) before and after. Then,
per shape and over the shapes the profile did not measure, the
median and worst |error|: raw, drift-scaled, paired (`paired`: against the profiled
shape's error in the runs around it, which cancels what the machine's drift and load do to
both) and of the computes alone (`compute_error`: the median over kinds and stages of each
compute's predicted / measured duration). A VM's speed drifts 20-30 % in minutes (docs/measurements.md), and other processes
slow a pipeline's handoffs more than its computes: read the errors beside the load.
The summary also gives the same over the runs other processes took less than 5 % of
(`UNTOUCHED`). `--schedule`, `--recompute` and `--shape` narrow or change the grid; `--json
FILE` writes every row (`--summary FILE` prints that run's summary again, measuring nothing);
`--summary FILE --profile P` predicts those runs again from the profile P (how another profile of the
same machine predicts the same measured runs); `--record` writes the summary into the profile (`layers.checked`, docs/profiles.md); `--reprofile` measures the device again before each run and writes it to `--profile`.
`--rounds K` runs the grid K times, one after another, and reads each case by the median of
its rounds (`median_runs`), as does `--summary` given several files: a VM's slow minute
passes (docs/measurements.md). A shape's paired error is taken in each round, against the
profiled runs of its own minute, and then read by its median over the rounds: the host can
slow this VM for minutes unseen by it (no steal, faults or pressure), and slows a shape's run
and the profiled runs around it alike. With a profile that is itself the median of several
(`python -m exec.profile_device --repeat 3`), that is the loop's check on this VM:

    python -m exec.profile_device --out /tmp/cpu.json --repeat 3                          # about 16 min
    PYTHONPATH=. python benchmarks/bench_plan_vs_run.py --profile /tmp/cpu.json --rounds 3  # about 36 min
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the repository's sim and exec, installed or not

import sim  # noqa: E402
from exec.launch.host import cpu_ticks, loadavg, steal_share  # noqa: E402

SCHEDULES = ("1f1b", "gpipe", "zb-h1", "interleaved-1f1b")
GRID_SCHEDULES = ("1f1b", "gpipe", "zb-h1")
MODEL = dict(layers=4, hidden=128, heads=4, seq=64, vocab=512)  # exec's --model gpt, 4 blocks: the profiled shape
# shapes the default profile did not measure (it measures the model's blocks and, as anchors, a quarter,
# half and twice its hidden size, heads and sequence; the quarter since profile-s13): hidden, heads,
# sequence, vocabulary and depth each moved; the last two were added after the anchors were chosen on
# the first five (docs/measurements.md)
SHAPES = (dict(layers=4, hidden=256, heads=8, seq=64, vocab=512), dict(layers=4, hidden=128, heads=4, seq=128, vocab=512),
          dict(layers=4, hidden=64, heads=2, seq=64, vocab=1024), dict(layers=4, hidden=192, heads=6, seq=32, vocab=2048),
          dict(layers=8, hidden=128, heads=8, seq=64, vocab=512), dict(layers=6, hidden=96, heads=3, seq=48, vocab=768),
          dict(layers=4, hidden=32, heads=1, seq=32, vocab=256))


@dataclass(frozen=True)
class Case:
    schedule: str
    micro: int
    recompute: str
    dp: int
    pp: int = 2
    batch: int = 32


def grid(cores: int, pp: int = 2, quick: bool = False, schedules=GRID_SCHEDULES, recomputes=("none", "full"),
         shapes=SHAPES) -> list[tuple[dict, Case]]:
    """(model, case) pairs in the order they run: per schedule and recompute mode, the
    profiled shape (MODEL) before and after each of `shapes`, so that each shape's error can be
    read against the profiled shape's in the same minute (`paired`); 4 micro-batches, dp 1 (pp
    ranks, each on its own core: rule 9); `quick`: the first shape, 1F1B only."""
    if quick:
        shapes, schedules = shapes[:1], schedules[:1]
    order = [MODEL] + [m for shape in shapes for m in (shape, MODEL)]
    return [(dict(m), Case(s, 4, r, 1, pp)) for s in schedules for r in recomputes for m in order]


def paired(rows: list[dict]) -> list[dict]:
    """Each row of a shape other than MODEL with `paired_error_pct` (and `paired_compute_pct`):
    its step error (its computes' error, `compute_error`) against the profiled shape's of the
    same case measured just before and just after it, (1 + e) / sqrt((1 + e_before)(1 +
    e_after)) - 1: what the machine's drift and load do to both cancels, what the shape model
    adds stays. A row that has them already (`median_runs`: paired in each round) keeps them."""
    return [_pair(rows, i) | r for i, r in enumerate(rows) if r["model"] != MODEL]


def _pair(rows: list[dict], i: int) -> dict:
    """The paired errors of `rows[i]` (`paired`) against the profiled runs next to it ({}
    for a run of MODEL itself)."""
    r = rows[i]
    if r["model"] == MODEL:
        return {}
    near = [rows[j] for j in (i - 1, i + 1) if 0 <= j < len(rows) and rows[j]["model"] == MODEL
            and rows[j]["case"] == r["case"]]
    extra = {}
    for key, name in (("error_pct", "paired_error_pct"), ("compute_error_pct", "paired_compute_pct")):
        if key in r and all(key in n for n in near):
            ref = statistics.geometric_mean([1 + n[key] / 100 for n in near]) if near else 1.0
            extra[name] = ((1 + r[key] / 100) / ref - 1) * 100
    return extra


def kind_seconds(events) -> dict[str, list[float]]:
    """Per compute kind (F, B, I, W), per stage, the median duration of `events`: (kind,
    stage, seconds) triples."""
    by: dict = {}
    for kind, stage, seconds in events:
        by.setdefault(kind, {}).setdefault(stage, []).append(seconds)
    return {k: [statistics.median(v[s]) for s in sorted(v)] for k, v in by.items()}


def transformer(model: dict = MODEL) -> sim.Transformer:
    """The planner's description of exec's GPT of these sizes (`exec.models.spec.ModelSpec.transformer`)."""
    from exec.models.spec import ModelSpec
    return ModelSpec("gpt", **model).transformer()


def predict(profile, case: Case, model: dict = MODEL) -> dict:
    """The planner's step time (s) and per-rank peak memory (bytes) for `case`."""
    e = sim.estimate(transformer(model), gpu=profile, gpus_per_node=case.pp * case.dp, tp=1, pp=case.pp,
                     dp=case.dp, micro_batch=case.batch // (case.dp * case.micro), global_batch=case.batch,
                     schedule=case.schedule, recompute=case.recompute, precision="fp32", optimizer="adamw")
    kinds = kind_seconds((ev.action.kind.name, ev.action.stage, ev.duration) for ev in e.result.events
                         if ev.action.kind.is_compute)
    return {"step_s": e.step_time, "peak_memory": e.peak_memory, "parts": e.time_parts, "kinds": kinds}


def run_command(case: Case, model: dict = MODEL, steps: int = 5, warmup: int = 2) -> list[str]:
    """The exec.run command line that measures `case` (AdamW: the optimizer the planner counts)."""
    return [sys.executable, "-m", "exec.run", "--model", "gpt", "--layers", str(model["layers"]),
            "--hidden", str(model["hidden"]), "--heads", str(model["heads"]), "--seq", str(model["seq"]),
            "--vocab", str(model["vocab"]), "--batch-size", str(case.batch), "--stages", str(case.pp),
            "--micro", str(case.micro), "--schedule", case.schedule, "--recompute", case.recompute,
            "--dp", str(case.dp), "--optimizer", "adamw", "--steps", str(steps), "--warmup", str(warmup),
            "--no-compare", "--json", "--quiet", "--timeout", "240"]


def measure(case: Case, model: dict = MODEL, steps: int = 5, warmup: int = 2) -> dict:
    """exec.run's measured step (median), its spread, the per-rank peak memory of replica 0's
    pipeline, the median step's compute durations by kind and stage (its Chrome trace), the
    share of the step other processes took, the load before and after, when it started (Unix
    time), and the share of the machine's CPU time the hypervisor took over the run
    (`steal`, `exec.launch.host.steal_share`). RuntimeError (one line) if the run fails."""
    before, started, ticks = loadavg(), time.time(), cpu_ticks()
    env = _env()
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(run_command(case, model, steps, warmup) + ["--out", tmp], capture_output=True, text=True,
                             timeout=300, env=env)
        if out.returncode != 0:
            raise RuntimeError(f"exec.run failed for {case}: {out.stderr.strip().splitlines()[-1:]}")
        trace = json.loads(next(Path(tmp).glob("*_measured.trace.json")).read_text())["traceEvents"]
    d = json.loads(out.stdout)
    steps_s = d["train_step_times_s"]
    kinds = kind_seconds((e["cat"], e["args"]["stage"], e["dur"] / 1e6) for e in trace
                         if e.get("ph") == "X" and e.get("cat") in ("F", "B", "I", "W"))
    return {"step_s": d["measured_train_step_s"], "pipeline_s": d["measured_step_s"],
            "spread": (max(steps_s) - min(steps_s)) / statistics.median(steps_s),
            "peak_memory": d["measured_peak_memory"], "kinds": kinds, "lost_share": d.get("lost_share"),
            "load": f"{before} -> {loadavg()}", "started": started, "steal": steal_share(ticks, cpu_ticks())}


def compare(profile, case: Case, model: dict = MODEL, steps: int = 5, warmup: int = 2, drift: float = 1.0) -> dict:
    """Predicted, measured and the errors (%) of one case; `drift`: the machine's speed now
    over its speed at the profile (`reference`), by which the drift-scaled error scales the prediction."""
    m = measure(case, model, steps, warmup)
    measured = {"case": case, "model": dict(model), "measured_s": m["step_s"], "pipeline_s": m["pipeline_s"],
                "drift": drift, "spread": m["spread"], "measured_kinds": m["kinds"], "lost_share": m["lost_share"],
                "load": m["load"], "measured_memory": m["peak_memory"], "started": m["started"], "steal": m["steal"]}
    return _predicted(predict(profile, case, model), measured)


def repredict(profile, r: dict) -> dict:
    """The recorded run `r` (a row `compare` made) with its predictions made again from
    `profile`, its measurements kept: how another profile of the same machine predicts the
    same runs (`--summary FILE --profile P`)."""
    return _predicted(predict(profile, r["case"], r["model"]), r)


def _predicted(p: dict, r: dict) -> dict:
    """The measured run `r` with the prediction `p` (`predict`) and their errors (%)."""
    mem = max(abs(a / b - 1) for a, b in zip(p["peak_memory"], r["measured_memory"])) * 100
    kinds = {k: [(a / b - 1) * 100 for a, b in zip(p["kinds"][k], r["measured_kinds"][k])]
             for k in sorted(p["kinds"]) if k in r["measured_kinds"]}
    return r | {"predicted_s": p["step_s"], "error_pct": (p["step_s"] / r["measured_s"] - 1) * 100,
                "scaled_error_pct": (p["step_s"] * r["drift"] / r["measured_s"] - 1) * 100, "memory_error_pct": mem,
                "kind_error_pct": kinds, "predicted_kinds": p["kinds"], "predicted_memory": p["peak_memory"]}


def compute_error(r: dict) -> float:
    """The median error (%) of the computes, over kinds and stages (`kind_error_pct`), less
    ZB-H1's first-stage I, which rule 15 leaves empty: the shape model's own error, which the
    machine's load moves less than the step's handoffs."""
    errors = [e for v in r["kind_error_pct"].values() for e in v if e > -99]
    return statistics.median(errors) if errors else float("nan")


def shape_name(model: dict) -> str:
    return f"h{model['hidden']} a{model['heads']} s{model['seq']} v{model['vocab']} L{model['layers']}"


def row(r: dict) -> str:
    c = r["case"]
    lost = "n/a" if r["lost_share"] is None else f"{r['lost_share'] * 100:.0f}%"
    steal = "n/a" if r.get("steal") is None else f"{r['steal'] * 100:.1f}%"
    return (f"{shape_name(r['model']):>22} {c.schedule:>5} {c.recompute:>4}  {r['predicted_s'] * 1e3:7.1f} "
            f"{r['measured_s'] * 1e3:7.1f} {r['error_pct']:+6.1f}% {r['drift']:5.2f} {r['scaled_error_pct']:+6.1f}% "
            f"{compute_error(r):+7.1f}% {r['spread'] * 100:5.1f}% {r['memory_error_pct']:7.3f}% {lost:>5} {steal:>5}  "
            f"{r['load']}")


def reference(hidden: int = MODEL["hidden"], heads: int = MODEL["heads"], seq: int = MODEL["seq"], micro_batch: int = 8,
              repeats: int = 40) -> float:
    """Seconds of one block of the profiled shape (exec.models.layers.Block), forward and
    backward, in this process on one thread: the median of `repeats` after two untimed. The
    machine's speed now, for its drift between the profile and a case."""
    import torch
    from exec.models.layers import Block
    torch.set_num_threads(1)
    torch.manual_seed(0)
    block, x = Block(hidden, heads), torch.randn(micro_batch, seq, hidden, requires_grad=True)
    times = []
    for i in range(repeats + 2):
        t0 = time.perf_counter()
        block(x).sum().backward()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[2:])


def _env() -> dict:
    """This environment with the repository first on PYTHONPATH, for the commands it starts."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))


def reprofile(path: str):
    """The device measured again now (`python -m exec.profile_device --out path`), loaded."""
    subprocess.run([sys.executable, "-m", "exec.profile_device", "--out", path], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600, env=_env())
    return sim.load_profile(path)


def median_runs(rounds: list[list[dict]]) -> list[dict]:
    """Several rounds of one grid (`--rounds`, or several `--json` files), case by case (the
    same position in each): the run whose measured step is nearest the rounds' median, with
    that median as its measured step and its errors from it, and every round's step
    (`round_steps_s`); for a shape other than MODEL, its paired errors (`paired`) taken in
    each round, against the profiled runs of that same minute, then their median over the
    rounds (`round_paired_pct`: each round's). A VM's slow minute passes: one case measured at
    several moments is read by its median (docs/measurements.md). ValueError where the rounds
    are not one grid."""
    if len({len(r) for r in rounds}) != 1:
        raise ValueError(f"rounds of different grids: {[len(r) for r in rounds]} runs")
    def with_computes(rd: list[dict]) -> list[dict]:
        return [r | {"compute_error_pct": compute_error(r)} if "kind_error_pct" in r else r for r in rd]
    pairs = [[_pair(rd, i) for i in range(len(rd))] for rd in map(with_computes, rounds)]
    out = []
    for runs, extras in zip(zip(*rounds), zip(*pairs)):
        if any((r["model"], r["case"]) != (runs[0]["model"], runs[0]["case"]) for r in runs):
            raise ValueError(f"rounds of different grids: {[shape_name(r['model']) for r in runs]}")
        steps = [r["measured_s"] for r in runs]
        m = statistics.median(steps)
        r = min(runs, key=lambda r: abs(r["measured_s"] - m))
        p = r["predicted_s"]
        med = {k: statistics.median(e[k] for e in extras) for k in extras[0] if all(k in e for e in extras)}
        if "paired_error_pct" in med:
            med["round_paired_pct"] = [e["paired_error_pct"] for e in extras]
        out.append(r | med | {"measured_s": m, "error_pct": (p / m - 1) * 100,
                              "scaled_error_pct": (p * r["drift"] / m - 1) * 100, "round_steps_s": steps})
    return out


def read_rounds(paths: list[Path]) -> list[list[dict]]:
    """The rounds of the grids `--json` wrote to `paths` (a row's `round`, 0 where it has none)."""
    rounds: dict = {}
    for i, path in enumerate(paths):
        for r in json.loads(path.read_text()):
            rounds.setdefault((i, r.get("round", 0)), []).append(r | {"case": Case(**r["case"])})
    return list(rounds.values())


UNTOUCHED = 0.05  # a run whose steps other processes took less than this share of (exec.run's lost_share)


def summary(rows: list[dict]) -> list[str]:
    """Per shape, and over the shapes other than MODEL: the median and worst |error|, raw,
    drift-scaled and paired (`paired`), and the worst peak-memory error; then the same over
    the runs that other processes barely touched (`UNTOUCHED`), the profiled shape's and the others'."""
    def stats(rs, key):
        e = [abs(r[key]) for r in rs if key in r]
        return f"{statistics.median(e):4.1f}% / {max(e):5.1f}%" if e else "-"

    out = [f"{'shape':>22}  {'raw median / worst':>18}  {'drift-scaled':>15}  {'paired':>15}  {'computes':>15}  "
           f"{'computes paired':>15}  memory"]
    rows = [r | {"compute_error_pct": compute_error(r)} for r in rows]
    others = paired(rows)
    groups = {shape_name(MODEL): [r for r in rows if r["model"] == MODEL]}
    for r in others:
        groups.setdefault(shape_name(r["model"]), []).append(r)
    untouched = [r for r in rows if (r.get("lost_share") or 1.0) < UNTOUCHED]
    for name, rs in list(groups.items()) + ([("not profiled", others)] if others else []) + [
            ("profiled, lost < 5%", [r for r in untouched if r["model"] == MODEL]),
            ("others, lost < 5%", [r for r in untouched if r["model"] != MODEL])]:
        if rs:
            out.append(f"{name:>22}  {stats(rs, 'error_pct'):>18}  {stats(rs, 'scaled_error_pct'):>15}  "
                       f"{stats(rs, 'paired_error_pct'):>15}  {stats(rs, 'compute_error_pct'):>15}  "
                       f"{stats(rs, 'paired_compute_pct'):>15}  {max(r['memory_error_pct'] for r in rs):.3f}%")
    return out


def record(path: Path, rows: list[dict], command: str) -> None:
    """Write into the profile at `path` (`layers.checked`, docs/profiles.md) how far its
    predictions held: per shape its runs and median and worst |step error| (%), paired for the
    shapes the profile did not measure (`paired`), raw for the profiled one."""
    import datetime
    import platform
    profile = sim.load_profile(path)
    out = []
    others = paired(rows)
    for model in [MODEL] + [m for m in dict.fromkeys(tuple(r["model"].items()) for r in others)]:
        model = dict(model)
        rs = [r for r in (rows if model == MODEL else others) if r["model"] == model]
        e = [abs(r["error_pct" if model == MODEL else "paired_error_pct"]) for r in rs]
        if e:
            out.append([*(model[k] for k in ("layers", "hidden", "heads", "seq", "vocab")), len(e),
                        max(statistics.median(e), 1e-9), max(max(e), 1e-9)])
    data = profile.to_dict()
    data["layers"]["checked"] = {"rows": out, "source": "measured", "command": command,
                                 "machine": f"{platform.node()}: {profile.gpu.name}",
                                 "date": datetime.date.today().isoformat(),
                                 "how": "benchmarks/bench_plan_vs_run.py: |step error| %, raw for the profiled shape, "
                                        "paired with the profiled shape's runs around it for the others"}
    sim.save_profile(data, path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", help="a device profile (python -m exec.profile_device --out FILE)")
    ap.add_argument("--summary", type=Path, action="append",
                    help="print the summary of a run --json wrote, and measure nothing (repeat: the median of "
                         "each case over the files' rounds, `median_runs`)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run the grid this many times, one after another, and read each case by the median "
                         "of its rounds (`median_runs`)")
    ap.add_argument("--quick", action="store_true", help="6 runs (1F1B, one other shape), 2 measured steps")
    ap.add_argument("--pp", type=int, default=2)
    ap.add_argument("--schedule", action="append", choices=SCHEDULES, help="only this schedule (repeat)")
    ap.add_argument("--recompute", action="append", choices=("none", "full"), help="only this mode (repeat)")
    ap.add_argument("--shape", action="append", metavar="L,H,A,S,V",
                    help="a model shape instead of SHAPES: layers, hidden, heads, sequence, vocabulary (repeat)")
    ap.add_argument("--json", type=Path, help="write every row to this file")
    ap.add_argument("--record", action="store_true",
                    help="write into the profile how far from its blocks it held (layers.checked, docs/profiles.md)")
    ap.add_argument("--reprofile", action="store_true",
                    help="measure the device again just before each case and predict it with that profile "
                         "(a VM's speed can drift 20-30 %% in minutes: docs/measurements.md)")
    args = ap.parse_args(argv)
    if args.summary:  # a stored run's summary, nothing measured
        try:
            rounds = read_rounds(args.summary)
            rows = median_runs(rounds) if len(rounds) > 1 else rounds[0]
        except (OSError, ValueError, TypeError, KeyError, IndexError) as e:
            print(f"bench_plan_vs_run: {' '.join(map(str, args.summary))}: {e}", file=sys.stderr)
            return 2
        if args.profile:  # the same runs, predicted again from this profile
            try:
                profile = sim.load_profile(args.profile)
            except (OSError, ValueError) as e:
                print(f"bench_plan_vs_run: {e}", file=sys.stderr)
                return 2
            rows = [repredict(profile, r) for r in rows]
        print("\n".join(summary(rows)))
        return 0
    if not args.profile or args.rounds < 1:
        print("bench_plan_vs_run: give --profile (or --summary FILE)" if not args.profile else
              f"bench_plan_vs_run: --rounds must be at least 1, got {args.rounds}", file=sys.stderr)
        return 2
    try:
        profile = None if args.reprofile else sim.load_profile(args.profile)
        shapes = [dict(zip(("layers", "hidden", "heads", "seq", "vocab"), map(int, s.split(",")), strict=True))
                  for s in args.shape] if args.shape else SHAPES
    except (OSError, ValueError) as e:
        print(f"bench_plan_vs_run: {e}", file=sys.stderr)
        return 2
    from exec.launch.host import host_cores
    steps, warmup = (2, 1) if args.quick else (5, 2)
    measured = sorted({(k[1], k[2], k[4]) for k in profile.layers.blocks}) if profile else []
    start = (reference() + reference()) / 2
    print(f"profile blocks measured at (hidden, heads, seq): {measured}; reference block {start * 1e3:.2f} ms; "
          f"load {loadavg()}")
    print(f"{'shape':>22} {'sched':>5} {'rc':>4}  {'pred':>7} {'meas ms':>7} {'error':>7} {'drift':>5} "
          f"{'scaled':>7} {'computes':>8} {'spread':>6} {'mem err':>8} {'lost':>5} {'steal':>5}  "
          f"load (1, 5, 15 min) before -> after")
    rows = []
    cases = grid(len(host_cores()), args.pp, args.quick, args.schedule or GRID_SCHEDULES,
                 args.recompute or ("none", "full"), shapes)
    for k in range(args.rounds):
        if args.rounds > 1:
            print(f"round {k + 1} of {args.rounds}; load {loadavg()}", flush=True)
        for model, case in cases:
            if args.reprofile:
                profile = reprofile(args.profile)
            rows.append(compare(profile, case, model, steps, warmup, drift=reference() / start) | {"round": k})
            print(row(rows[-1]), flush=True)
            if args.json:
                args.json.write_text(json.dumps([{**r, "case": asdict(r["case"])} for r in rows], indent=1) + "\n")
    if args.rounds > 1:
        rows = median_runs([[r for r in rows if r["round"] == k] for k in range(args.rounds)])
        print(f"each case: the median of its {args.rounds} rounds (paired: paired in each round, then the median)")
    print("\n".join(summary(rows)))
    if args.record and rows and "layers" in profile.to_dict():
        record(Path(args.profile), rows, "python benchmarks/bench_plan_vs_run.py " + " ".join(argv or sys.argv[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
