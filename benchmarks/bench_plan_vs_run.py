"""The planner against a real run: sim.estimate on a measured device profile predicts the step time and per-rank peak memory; exec.run measures them.

    python -m exec.profile_device --out /tmp/cpu.json                     # once per machine
    PYTHONPATH=. python benchmarks/bench_plan_vs_run.py --profile /tmp/cpu.json
    PYTHONPATH=. python benchmarks/bench_plan_vs_run.py --profile /tmp/cpu.json --quick   # two cases

For each case of the grid (schedules 1f1b, gpipe, zb-h1, interleaved-1f1b; 4 and 8
micro-batches; recompute none and full; dp 1 and 2 where pp x dp ranks fit the cores) it
prints the predicted and measured step (start to the last optimizer step's end: the
planner's `step_time`), their error, the measured spread ((max - min) / median of the
measured steps), the peak-memory error of the worst rank, the error of each compute kind
(F, B, I, W) per stage (predicted / measured median duration - 1, in %), the share
of the step other processes took (exec.run's `lost_share`) and the load average
(/proc/loadavg) before and after the run; then the medians of the errors. The machine's
load changes what a run measures (docs/rules.md, rule 9): read the load beside the error.
`--schedule` and `--recompute` narrow the grid; `--json FILE` writes every row;
`--reprofile` measures the device again before each case and writes it to `--profile`.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the repository's sim and exec, installed or not

import sim  # noqa: E402
from exec.launch.host import loadavg  # noqa: E402

SCHEDULES = ("1f1b", "gpipe", "zb-h1", "interleaved-1f1b")
MODEL = dict(layers=4, hidden=128, heads=4, seq=64, vocab=512)  # exec's --model gpt, 4 blocks


@dataclass(frozen=True)
class Case:
    schedule: str
    micro: int
    recompute: str
    dp: int
    pp: int = 2
    batch: int = 32


def grid(cores: int, pp: int = 2, quick: bool = False, schedules=SCHEDULES, recomputes=("none", "full")) -> list[Case]:
    """The cases: every schedule, micro-batch count and recompute mode, and dp 1 and 2 where
    pp x dp ranks fit the cores (each rank on its own, rule 9); `quick`: two of them."""
    if quick:
        return [Case("1f1b", 4, "none", 1, pp), Case("gpipe", 4, "full", 1, pp)]
    dps = [d for d in (1, 2) if pp * d <= cores] or [1]
    return [Case(s, m, r, d, pp) for s in schedules for m in (4, 8) for r in recomputes for d in dps]


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
                     schedule=case.schedule, recompute=case.recompute, precision="fp32")
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
    share of the step other processes took, and the load before and after. RuntimeError (one
    line) if the run fails."""
    before = loadavg()
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
            "load": f"{before} -> {loadavg()}"}


def compare(profile, case: Case, model: dict = MODEL, steps: int = 5, warmup: int = 2) -> dict:
    """Predicted, measured and the errors (%) of one case."""
    p, m = predict(profile, case, model), measure(case, model, steps, warmup)
    mem = max(abs(a / b - 1) for a, b in zip(p["peak_memory"], m["peak_memory"])) * 100
    kinds = {k: [(a / b - 1) * 100 for a, b in zip(p["kinds"][k], m["kinds"][k])]
             for k in sorted(p["kinds"]) if k in m["kinds"]}
    return {"case": case, "predicted_s": p["step_s"], "measured_s": m["step_s"],
            "error_pct": (p["step_s"] / m["step_s"] - 1) * 100, "memory_error_pct": mem, "spread": m["spread"],
            "kind_error_pct": kinds, "predicted_kinds": p["kinds"], "measured_kinds": m["kinds"],
            "lost_share": m["lost_share"], "load": m["load"], "predicted_memory": p["peak_memory"],
            "measured_memory": m["peak_memory"]}


def row(r: dict) -> str:
    c = r["case"]
    kinds = " ".join(k + "/".join(f"{e:+.0f}" for e in v) for k, v in r["kind_error_pct"].items())
    lost = "n/a" if r["lost_share"] is None else f"{r['lost_share'] * 100:.0f}%"
    return (f"{c.schedule:>16} m={c.micro} {c.recompute:>4} dp={c.dp}  {r['predicted_s'] * 1e3:8.1f} "
            f"{r['measured_s'] * 1e3:8.1f} {r['error_pct']:+7.1f}% {r['spread'] * 100:6.1f}% "
            f"{r['memory_error_pct']:7.3f}%  {kinds:<28} {lost:>5}  {r['load']}")


def _env() -> dict:
    """This environment with the repository first on PYTHONPATH, for the commands it starts."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))


def reprofile(path: str):
    """The device measured again now (`python -m exec.profile_device --out path`), loaded."""
    subprocess.run([sys.executable, "-m", "exec.profile_device", "--out", path], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600, env=_env())
    return sim.load_profile(path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", required=True, help="a device profile (python -m exec.profile_device --out FILE)")
    ap.add_argument("--quick", action="store_true", help="two cases, 2 measured steps")
    ap.add_argument("--pp", type=int, default=2)
    ap.add_argument("--schedule", action="append", choices=SCHEDULES, help="only this schedule (repeat)")
    ap.add_argument("--recompute", action="append", choices=("none", "full"), help="only this mode (repeat)")
    ap.add_argument("--json", type=Path, help="write every row to this file")
    ap.add_argument("--reprofile", action="store_true",
                    help="measure the device again just before each case and predict it with that profile "
                         "(a VM's speed can drift 20-30 %% in minutes: docs/measurements.md)")
    args = ap.parse_args(argv)
    try:
        profile = None if args.reprofile else sim.load_profile(args.profile)
    except (OSError, ValueError) as e:
        print(f"bench_plan_vs_run: {e}", file=sys.stderr)
        return 2
    from exec.launch.host import host_cores
    steps, warmup = (2, 1) if args.quick else (5, 2)
    print(f"{'case':>34}  {'pred ms':>8} {'meas ms':>8} {'error':>8} {'spread':>7} {'mem err':>8}  "
          f"{'by kind and stage (%)':<28} {'lost':>5}  load (1, 5, 15 min)")
    rows = []
    for case in grid(len(host_cores()), args.pp, args.quick, args.schedule or SCHEDULES, args.recompute or ("none", "full")):
        if args.reprofile:
            profile = reprofile(args.profile)
        rows.append(compare(profile, case, steps=steps, warmup=warmup))
        print(row(rows[-1]), flush=True)
        if args.json:
            args.json.write_text(json.dumps([{**r, "case": asdict(r["case"])} for r in rows], indent=1) + "\n")
    errors = [abs(r["error_pct"]) for r in rows]
    print(f"median |step error| {statistics.median(errors):.1f}%, worst {max(errors):.1f}%; "
          f"worst peak-memory error {max(r['memory_error_pct'] for r in rows):.3f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
