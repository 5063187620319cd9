"""The planner against real runs: a grid of model shapes and cases, each predicted by `sim.estimate` on a measured device profile and measured by `exec.run`, and the paired and median errors that read them on a shared host.

`benchmarks/bench_plan_vs_run.py` is its command (`exec.measure.plan_report.main`); what it
checks and its current result: docs/validation.md, "The planner against runs on this
machine". A shape the profile did not measure is timed by the kernel model fitted on the
blocks the profile measured (`sim.cost.block_fit`). `measure` runs `python -m exec.run` in a
process of its own; `reference` times one block of the profiled shape in this process, the
machine's speed now, for its drift since the profile.

A VM's speed drifts 20-30 % in minutes and its host can slow it unseen by the guest
(docs/validation.md, "The host's slow minutes"), so a shape is read against the profiled
shape's runs just before and after it (`paired`), and one case measured in several rounds by
its median (`median_runs`), paired within each round first.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import sim
from exec.launch.host import cpu_ticks, loadavg, steal_share

ROOT = Path(__file__).resolve().parents[2]  # the repository, first on the PYTHONPATH of the runs it starts

SCHEDULES = ("1f1b", "gpipe", "zb-h1", "interleaved-1f1b")
GRID_SCHEDULES = ("1f1b", "gpipe", "zb-h1")
MODEL = dict(layers=4, hidden=128, heads=4, seq=64, vocab=512)  # exec's --model gpt, 4 blocks: the profiled shape
# shapes the default profile did not measure (it measures the model's blocks and, as anchors, a quarter,
# half and twice its hidden size, heads and sequence; the quarter since profile-s13): hidden, heads,
# sequence, vocabulary and depth each moved; the last two were added after the anchors were chosen on
# the first five (docs/validation.md, "One profile, many shapes")
SHAPES = (dict(layers=4, hidden=256, heads=8, seq=64, vocab=512), dict(layers=4, hidden=128, heads=4, seq=128, vocab=512),
          dict(layers=4, hidden=64, heads=2, seq=64, vocab=1024), dict(layers=4, hidden=192, heads=6, seq=32, vocab=2048),
          dict(layers=8, hidden=128, heads=8, seq=64, vocab=512), dict(layers=6, hidden=96, heads=3, seq=48, vocab=768),
          dict(layers=4, hidden=32, heads=1, seq=32, vocab=256))


@dataclass(frozen=True)
class Case:
    schedule: str
    micro_batches: int
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
                     dp=case.dp, micro_batch=case.batch // (case.dp * case.micro_batches), global_batch=case.batch,
                     schedule=case.schedule, recompute=case.recompute, precision="fp32", optimizer="adamw")
    kinds = kind_seconds((ev.action.kind.name, ev.action.stage, ev.duration) for ev in e.result.events
                         if ev.action.kind.is_compute)
    return {"step_s": e.step_time, "peak_memory": e.peak_memory, "parts": e.time_parts, "kinds": kinds}


def run_command(case: Case, model: dict = MODEL, steps: int = 5, warmup: int = 2) -> list[str]:
    """The exec.run command line that measures `case` (AdamW: the optimizer the planner counts)."""
    return [sys.executable, "-m", "exec.run", "--model", "gpt", "--layers", str(model["layers"]),
            "--hidden", str(model["hidden"]), "--heads", str(model["heads"]), "--seq", str(model["seq"]),
            "--vocab", str(model["vocab"]), "--batch-size", str(case.batch), "--stages", str(case.pp),
            "--micro", str(case.micro_batches), "--schedule", case.schedule, "--recompute", case.recompute,
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
    several moments is read by its median (docs/validation.md, "The host's slow minutes"). ValueError where the rounds
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
            case = {("micro_batches" if k == "micro" else k): v for k, v in r["case"].items()}  # "micro" before 2026-12
            rounds.setdefault((i, r.get("round", 0)), []).append(r | {"case": Case(**case)})
    return list(rounds.values())
