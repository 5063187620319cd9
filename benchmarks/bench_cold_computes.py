"""Computes in a measured pipeline step against the same computes as exec's calibration times them, by what came before each: where exec's own closed loop loses its time on a CPU.

    PYTHONPATH=. python benchmarks/bench_cold_computes.py                      # 12 runs, about 3 min
    PYTHONPATH=. python benchmarks/bench_cold_computes.py --shape 4,32,1,32,256 --schedule gpipe --runs 5

exec.run calibrates each compute in the run itself, between the measured steps
(`exec.measure.calibrate`: inside training steps of the same schedule since rule 19 of
docs/rules.md, a compute-only step before it) and simulates the step under those costs; it
also replays each measured step with its own compute times (the rules alone). Per
run this prints both errors. Then, over every compute of the runs' median steps (their
Chrome traces), the compute's excess over its calibrated median (the same stage and kind),
grouped by what came before it on its rank: nothing in this step (the step's first compute,
after the last step's optimizer), another compute within 0.1 ms, a wait of 0.1-1 ms or more
than 1 ms for its input; and by whether its own send was in flight. A group whose median
excess stands out is a cost the calibration and the profile's blocks do not see (the first
compute's is rule 19's `first_compute`; docs/measurements.md, "... and the compute after a
wait" and "Rule 19").
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the repository's sim and exec, installed or not

from sim.cli import OneLineParser, whole  # noqa: E402

SHAPES = ((4, 128, 4, 64, 512), (4, 32, 1, 32, 256))  # layers, hidden, heads, seq, vocab: the profiled shape, the smallest
GROUPS = (("first in the step", lambda c: c["gap"] is None), ("after a compute (< 0.1 ms)", lambda c: c["gap"] is not None and c["gap"] < 1e-4),
          ("after a wait of 0.1-1 ms", lambda c: c["gap"] is not None and 1e-4 <= c["gap"] < 1e-3),
          ("after a wait of > 1 ms", lambda c: c["gap"] is not None and c["gap"] >= 1e-3),
          ("its send in flight", lambda c: c["sending"]), ("no send in flight", lambda c: not c["sending"]))


def shape(text: str) -> tuple[int, ...]:
    """'layers,hidden,heads,seq,vocab' -> five positive whole numbers."""
    parts = text.split(",")
    if len(parts) != 5 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"--shape needs layers,hidden,heads,seq,vocab (five positive whole numbers), got {text!r}")
    return tuple(int(p) for p in parts)


def run(model: tuple, schedule: str, out: Path) -> dict:
    """One exec.run of `model` (2 ranks, 4 micro-batches of a batch of 32, AdamW) into `out`:
    its JSON summary. RuntimeError (one line) if it fails."""
    layers, hidden, heads, seq, vocab = model
    cmd = [sys.executable, "-m", "exec.run", "--model", "gpt", "--layers", str(layers), "--hidden", str(hidden),
           "--heads", str(heads), "--seq", str(seq), "--vocab", str(vocab), "--batch-size", "32", "--stages", "2",
           "--micro", "4", "--schedule", schedule, "--optimizer", "adamw", "--steps", "5", "--warmup", "2",
           "--json", "--quiet", "--timeout", "240", "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"exec.run failed: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout)


def computes(out: Path) -> list[dict]:
    """Every compute of the run's median step (its trace) with its excess over the run's
    calibrated median of its stage and kind (s), the gap since its rank's last compute
    (None for the first) and whether its rank's own send was in flight during it."""
    calibrated = json.loads((out / "costs.json").read_text())["details"]["compute_median"]["concurrent"]
    trace = json.loads(next(out.glob("*_measured.trace.json")).read_text())["traceEvents"]
    events = [e for e in trace if e.get("ph") == "X"]
    sends = [e for e in events if e["cat"].startswith("SEND")]
    rows = []
    for tid in sorted({e["tid"] for e in events if e["cat"] in ("F", "B", "I", "W")}):
        mine = sorted((e for e in events if e["tid"] == tid and e["cat"] in ("F", "B", "I", "W")), key=lambda e: e["ts"])
        for prev, e in zip([None] + mine, mine):
            end = e["ts"] + e["dur"]
            rows.append({"excess": (e["dur"] - calibrated[f"{tid}{e['cat']}"] * 1e6) / 1e6,
                         "gap": None if prev is None else (e["ts"] - prev["ts"] - prev["dur"]) / 1e6,
                         "sending": any(s["tid"] - 1000 == tid and s["ts"] < end and s["ts"] + s["dur"] > e["ts"]
                                        for s in sends)})
    return rows


def table(rows: list[dict]) -> list[str]:
    """The median excess of each group of `GROUPS`."""
    out = []
    for name, member in GROUPS:
        x = [r["excess"] for r in rows if member(r)]
        if x:
            out.append(f"    {name:<28} {len(x):4d} computes, median excess {statistics.median(x) * 1e6:+7.0f} us")
    return out


def main(argv=None) -> int:
    p = OneLineParser(prog="bench_cold_computes", description=__doc__.splitlines()[0], error_prog="bench_cold_computes")
    p.add_argument("--shape", type=shape, action="append", help="layers,hidden,heads,seq,vocab (repeat)")
    p.add_argument("--schedule", choices=("gpipe", "1f1b"), action="append", help="(repeat; default both)")
    p.add_argument("--runs", type=whole, default=3, help="runs of each shape and schedule, interleaved (default 3)")
    args = p.parse_args(argv)
    shapes, schedules = args.shape or SHAPES, args.schedule or ("gpipe", "1f1b")
    by_shape: dict = {s: [] for s in shapes}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            for schedule in schedules:
                for s in shapes:
                    out = Path(tmp) / f"{i}-{schedule}-{'-'.join(map(str, s))}"
                    d = run(s, schedule, out)
                    by_shape[s] += computes(out)
                    print(f"{str(s):>24} {schedule:6} run {i + 1}: step {d['measured_train_step_s'] * 1e3:7.2f} ms, "
                          f"simulated under the run's calibration {d['error_pct']:+6.1f} %, "
                          f"replayed with its own computes {d['replay_error_pct']:+5.1f} %", flush=True)
    for s, rows in by_shape.items():
        print(f"shape {s} (layers, hidden, heads, seq, vocab): each compute's excess over its calibrated median")
        print("\n".join(table(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
