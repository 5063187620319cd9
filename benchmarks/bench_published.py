"""How close is `sim.estimate` to published measurements? Prints four tables, each row with
the predicted value, the published one and the error in %.

    PYTHONPATH=. python benchmarks/bench_published.py          # the tables (a few seconds)
    PYTHONPATH=. python benchmarks/bench_published.py --json   # the same rows as JSON

(a) Narayanan et al. 2021, Table 1: TFLOP/s per GPU of ten GPT models on A100-80GB, fp16,
    full recompute, micro-batch and interleaving of Megatron-LM's examples/sc21/run_table_1.sh.
(b) Korthikanti et al. 2022, Table 4: one layer of the 22B model (t=8, b=4), forward and
    backward in ms, for the five techniques.
(c) Korthikanti et al. 2022, Table 5: iteration time with full recompute and with selective
    recompute + sequence parallelism (no data parallelism), their ratio and MFU.
(d) Where the time of one step goes (Table 1's 145.6B row, the only GPT-3-sized row with
    data parallelism).
(e) vTrain's 1,440 single-node Megatron-DeepSpeed runs on A100 80GB (data/vtrain-a100): MAPE in
    all, on the rows the A100 profile was not fitted on (the odd ones), by tp and by micro-batch.
(f) The H100 development set (sim/plan/data/h100_dev.csv: NVIDIA's DGX Cloud benchmarking recipes,
    NeMo on DGX H100): step-time MAPE overall, of the dense and of the MoE rows, and by model,
    precision, cp and release, on h100-80gb's default profile and on the best case, FP8's
    speedup over BF16 on paired rows (measured and predicted), and the rows left out by reason.
(g) The torch-native development set (sim/plan/data/torch_native_dev.csv: llm-foundry's MPT runs,
    torchtitan's Llama 3.1 table): step-time MAPE overall, by model, by sequence band and by
    profile, each row on its stack's profile, and the rows left out by reason.

The published settings and the comparisons are in sim/plan/published.py; results and what they
say about the model: docs/validation.md, "The planner against published runs".
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from sim.plan import h100_dev, published  # noqa: E402
from calibrate_a100 import by, vtrain_errors, vtrain_rows  # noqa: E402  (benchmarks/, beside this file)

PARTS_ROW = 6  # Table 1's 145.6B row: t=8, p=8, d=24, interleaved over 2 chunks


def table(headers: list[str], rows: list[list]) -> str:
    """A plain text table, columns right-aligned."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def pct(x: float) -> str:
    return f"{x * 100:+.1f}%"


def print_narayanan(rows: list[dict]) -> None:
    print("(a) Narayanan et al. 2021, Table 1: TFLOP/s per GPU, A100-80GB, fp16, full recompute")
    print(table(["model", "t", "p", "d", "b", "v", "m", "bubble", "fits", "predicted", "published", "error"],
                [[r["model"], r["tp"], r["pp"], r["dp"], r["micro_batch"], r["virtual"], r["micro_batches"],
                  f"{r['bubble']:.1%}", r["fits"], f"{r['predicted']:.1f}", r["published"], pct(r["error"])]
                 for r in rows]))
    errors = [abs(r["error"]) for r in rows]
    print(f"mean |error| {sum(errors) / len(errors):.1%}, largest {max(errors):.1%}\n")


def print_layer(rows: list[dict]) -> None:
    print("(b) Korthikanti et al. 2022, Table 4: one 22B layer (t=8, b=4, s=2048), ms; "
          "the paper says 'mixed precision' (bf16 and fp16 time alike here)")
    print(table(["technique", "forward", "published", "error", "backward", "published", "error",
                 "F+B", "published", "error"],
                [[r["technique"], f"{r['forward']:.2f}", r["forward_published"], pct(r["forward_error"]),
                  f"{r['backward']:.2f}", r["backward_published"], pct(r["backward_error"]),
                  f"{r['combined']:.2f}", f"{r['combined_published']:.1f}", pct(r["combined_error"])]
                 for r in rows]))
    base = rows[0]["combined"]
    print("overhead over the baseline, predicted (published): " + ", ".join(
        f"{r['technique']} {r['combined'] / base - 1:+.0%} ({r['combined_published'] / rows[0]['combined_published'] - 1:+.0%})"
        for r in rows[1:]) + "\n")


def print_steps(rows: list[dict]) -> None:
    print("(c) Korthikanti et al. 2022, Table 5: iteration time (s), t=8, no data parallelism; "
          "'present' = selective recompute + sequence parallelism")
    print(table(["model", "p", "v", "full", "published", "error", "present", "published", "error",
                 "full/present", "published", "MFU", "published", "MFU from published time"],
                [[r["model"], r["pp"], r["virtual"], f"{r['full']:.2f}", r["full_published"], pct(r["full_error"]),
                  f"{r['present']:.2f}", r["present_published"], pct(r["present_error"]),
                  f"{r['ratio']:.3f}", f"{r['ratio_published']:.3f}", f"{r['mfu']:.1%}", f"{r['mfu_published']:.1%}",
                  f"{r['mfu_from_published_time']:.1%}"] for r in rows]))
    print("'MFU from published time': Table 5's time with our model FLOPs (Eq. 7) at 312 TFLOP/s, "
          "a check of the FLOP count\n")


def parts_of_a_row() -> dict:
    row = published.NARAYANAN_TABLE_1[PARTS_ROW]
    e = published.narayanan_estimate(row)
    return {"model": row[0], "step_time": e.step_time, "makespan": e.result.makespan,
            "parts": dict(e.time_parts)}


def print_parts(p: dict) -> None:
    print(f"(d) Where the time goes: {p['model']} as Table 1 ran it; seconds per pipeline device "
          f"(mean over the {published.NARAYANAN_TABLE_1[PARTS_ROW][2]} devices)")
    parts = p["parts"]
    print(table(["part", "seconds", "of the step"],
                [[k, f"{v:.3f}", f"{v / p['step_time']:.1%}"] for k, v in parts.items()]
                + [["sum of the parts", f"{sum(parts.values()):.3f}", f"{sum(parts.values()) / p['step_time']:.1%}"],
                   ["step_time", f"{p['step_time']:.3f}", "100.0%"]]))
    print("step_time = the simulated makespan (the reduction of the gradients included) + the optimizer step\n")


def single_node() -> dict:
    """The A100 80GB default profile against every single-node run, and by tp and micro-batch."""
    import sim
    rows = vtrain_rows()
    errors = vtrain_errors(sim.profile("a100-80gb"), rows)
    odd = [e for r, e in zip(rows, errors) if r["index"] % 2]
    return {"profile": sim.profile("a100-80gb").name, "rows": len(rows), "mape": sum(map(abs, errors)) / len(errors),
            "mape_unfitted": sum(map(abs, odd)) / len(odd), "median": sorted(errors)[len(errors) // 2],
            "by_tp": by(rows, errors, "tp"), "by_micro_batch": by(rows, errors, "micro"), "by_pp": by(rows, errors, "pp")}


def print_single_node(s: dict) -> None:
    print(f"(e) vTrain single-node runs (A100 80GB, Megatron-DeepSpeed), profile {s['profile']}: "
          f"MAPE {s['mape']:.1%} over {s['rows']} rows, {s['mape_unfitted']:.1%} on the odd rows (not fitted), "
          f"median error {s['median']:+.1%}")
    for key in ("by_tp", "by_micro_batch", "by_pp"):
        print(f"  MAPE {key.replace('_', ' ')}: " + ", ".join(f"{k}: {v:.1%}" for k, v in s[key].items()))
    print()


def h100_dev_set() -> dict:
    """The H100 development set's expressed rows on h100-80gb's default profile and on its best
    case: MAPE overall and by group; the rows left out, by reason."""
    import sim
    runs = h100_dev.runs()
    ok = [r for r in runs if r.reason is None]
    out = {"rows": len(runs), "expressed": len(ok), "left_out": h100_dev.refused_counts(runs), "profiles": {}}
    for name in dict.fromkeys((sim.profile(h100_dev.GPU).name, "h100-80gb-best-case")):
        errors = h100_dev.errors(ok, name)
        kinds = {kind: [e for r, e in zip(ok, errors) if r.row["moe"] == flag] for kind, flag in (("dense", "0"), ("moe", "1"))}
        moe = [(r, e) for r, e in zip(ok, errors) if r.row["moe"] == "1"]
        out["profiles"][name] = {"mape": h100_dev.mape(errors), "speedup": fp8_speedup(ok, errors),
                                 **{kind: (h100_dev.mape(e), len(e)) for kind, e in kinds.items() if e},
                                 "moe_by_precision": h100_dev.mape_by(*map(list, zip(*moe)), "precision") if moe else {},
                                 **{key: h100_dev.mape_by(ok, errors, key) for key in h100_dev.GROUPS}}
    return out


def fp8_speedup(ok: list, errors: list[float]) -> dict:
    """FP8's speedup over BF16 (BF16 step / FP8 step) of each model's paired rows
    (`sim.plan.h100_dev.pairs`), measured and predicted (means), and the mean |predicted /
    measured - 1| of the pairs' speedups."""
    predicted = {r.row_id: r.step_time * (1 + e) for r, e in zip(ok, errors)}
    out: dict = {}
    for b, f in h100_dev.pairs(ok):
        out.setdefault(b.row["model"], []).append((b.step_time / f.step_time, predicted[b.row_id] / predicted[f.row_id]))
    every = [p for v in out.values() for p in v]
    return {**{m: (statistics.fmean(x for x, _ in v), statistics.fmean(y for _, y in v), len(v))
               for m, v in sorted(out.items())},
            "error": statistics.fmean(abs(y / x - 1) for x, y in every) if every else None}


def print_h100_dev(s: dict) -> None:
    print(f"(f) H100 development set (sim/plan/data/h100_dev.csv, NeMo on DGX H100): {s['expressed']} of "
          f"{s['rows']} rows expressed; step-time MAPE (rows)")
    for name, p in s["profiles"].items():
        print(f"  {name}: {p['mape']:.1%} overall; " + "; ".join(f"{kind} rows {p[kind][0]:.1%} ({p[kind][1]})"
                                                               for kind in ("dense", "moe") if kind in p))
        for key in h100_dev.GROUPS:
            print(f"    by {key}: " + "; ".join(f"{k} {m:.1%} ({n})" for k, (m, n) in p[key].items()))
        if p["moe_by_precision"]:
            print("    MoE rows by precision: " + "; ".join(f"{k} {m:.1%} ({n})" for k, (m, n) in p["moe_by_precision"].items()))
        speedup = {k: v for k, v in p["speedup"].items() if k != "error"}
        if speedup:
            print("    FP8/BF16 speedup of paired rows (same model, release, layout), measured -> predicted: "
                  + "; ".join(f"{k} {x:.2f} -> {y:.2f} ({n})" for k, (x, y, n) in speedup.items())
                  + f"; mean |predicted/measured - 1| {p['speedup']['error']:.1%}")
    print("  left out:")
    for k, n in sorted(s["left_out"].items()):
        print(f"    {n} {h100_dev.REASONS[k]}")
    print()


BANDS = ((0, 2048, "<= 2K"), (2049, 8192, "4K-8K"), (8193, 1 << 30, ">= 16K"))
# torchtitan's Tables 1 and 3 (8 and 128 GPUs): (what is added, the row without it, the row with it)
GAINS = (("torch.compile", "57", "58"), ("float8", "58", "59"), ("torch.compile", "60", "61"), ("float8", "61", "62"))


def torch_native_set() -> dict:
    """Each expressed row of the torch-native set on its stack's profile: MAPE overall and by
    model, sequence band and profile; the rows left out, by reason."""
    runs = published.torch_native_runs()
    ok = [r for r in runs if r.reason is None]
    errors = [published.error(published.torch_native_estimate(r).step_time, r.step_time) for r in ok]

    def by(key) -> dict:
        groups: dict = {}
        for r, e in zip(ok, errors):
            groups.setdefault(key(r), []).append(abs(e))
        return {k: (statistics.fmean(v), len(v)) for k, v in groups.items()}

    left: dict = {}
    for r in runs:
        if r.reason is not None:
            left[r.reason] = left.get(r.reason, 0) + 1
    step = {r.row["row_id"]: (r.step_time, r.step_time * (1 + e)) for r, e in zip(ok, errors)}
    gains = [(what, a, b, step[a][0] / step[b][0], step[a][1] / step[b][1]) for what, a, b in GAINS]
    return {"rows": len(runs), "expressed": len(ok), "mape": statistics.fmean(map(abs, errors)), "gains": gains,
            "by_model": by(lambda r: r.row["model"]),
            "by_band": by(lambda r: next(name for lo, hi, name in BANDS if lo <= r.seq <= hi)),
            "by_profile": by(lambda r: published.TORCH_NATIVE_PROFILES[r.row["source_id"]]), "left_out": left}


def print_torch_native(s: dict) -> None:
    print(f"(g) torch-native development set (sim/plan/data/torch_native_dev.csv, llm-foundry and torchtitan on "
          f"H100): {s['expressed']} of {s['rows']} rows expressed; step-time MAPE {s['mape']:.1%}")
    for key in ("by_model", "by_band", "by_profile"):
        print(f"  {key.replace('_', ' ')}: " + "; ".join(f"{k} {m:.1%} ({n})" for k, (m, n) in s[key].items()))
    print("  Llama 3.1 8B speedups (row without -> row with), measured -> predicted: " + "; ".join(
        f"{what} {a}->{b} {x:.2f} -> {y:.2f}" for what, a, b, x, y in s["gains"]))
    print("  left out:")
    for k, n in sorted(s["left_out"].items()):
        print(f"    {n} {published.TORCH_NATIVE_REASONS[k]}")
    print()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the rows as JSON instead of tables")
    args = ap.parse_args(argv)
    t = time.perf_counter()
    out = {"narayanan_table_1": published.narayanan_table_1(), "korthikanti_table_4": published.korthikanti_table_4(),
           "korthikanti_table_5": published.korthikanti_table_5(), "time_parts": parts_of_a_row(),
           "single_node": single_node(), "h100_dev": h100_dev_set(),
           "torch_native": torch_native_set()}
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print_narayanan(out["narayanan_table_1"])
    print_layer(out["korthikanti_table_4"])
    print_steps(out["korthikanti_table_5"])
    print_parts(out["time_parts"])
    print_single_node(out["single_node"])
    print_h100_dev(out["h100_dev"])
    print_torch_native(out["torch_native"])
    print(f"ran in {time.perf_counter() - t:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
