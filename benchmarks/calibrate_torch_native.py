"""Calibrates the torch-native stacks' profiles on the torch-native development set, in the open: prints the fit table (each parameter, its rows, method, residual and leave-one-model-out spread) and writes the profiles.

    PYTHONPATH=. python benchmarks/calibrate_torch_native.py            # fit, print, write the profiles
    PYTHONPATH=. python benchmarks/calibrate_torch_native.py --dry-run  # fit and print only

The set is sim/plan/data/torch_native_dev.csv (copied from ../shared/data/torch-native-dev;
`sim.plan.published.torch_native_runs`). Few physical parameters, each fitted by least squares
on log step time over the rows it governs, everything else as `h100-80gb-best-case` has it
(published figures):

- llm-foundry (`h100-80gb-llm-foundry`, the 32 MPT rows, H100 80 GB SXM): the matmul efficiency
  and the attention efficiency of its kernel, flash-attn 1.x's Triton flash attention of 2023
  (`triton-flash-2023`: no published H100 benchmark of it, so its rate is fitted here; the
  sequence bands separate the two, the attention growing as seq^2 and the matmuls as seq);
- torchtitan (`h100-96gb-500w-torchtitan`, the 4 BF16 Llama 3.1 8B rows, Grand Teton's 96 GB
  500 W H100): the matmul efficiency alone (the 500 W limit's clock is not published:
  sim/hardware/gpus.py); its attention is torch's SDPA at FlashAttention-2's published rates
  (`sim.hardware.attention_kernels`), not fitted. One model only: no leave-one-model-out.
  Its compile-on and compile-off rows are fitted together (the elementwise kinds are not yet
  timed apart: docs/validation.md). Then its FP8 efficiency alone on the 8 float8 rows whose
  micro-batch is stated (torchao's dynamic tensorwise float8 as current scaling), the matmul
  efficiency held.

`h100-80gb-torchtitan` (torchtitan's stack on the 80 GB SXM part, no row of the set) is the
best case's published figures with torchtitan's stack: kind "best case", nothing fitted.
"""
from __future__ import annotations

import argparse
import copy
import math
import os
import sys

import numpy as np
from scipy.optimize import least_squares

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import sim  # noqa: E402
from sim.hardware.profile import PRESETS, from_dict  # noqa: E402
from sim.plan import published  # noqa: E402
from calibrate_a100 import standard_errors  # noqa: E402  (benchmarks/, beside this file)

BEST = "h100-80gb-best-case"
DATASET = "sim/plan/data/torch_native_dev.csv (copied from ../shared/data/torch-native-dev: llm-foundry and torchtitan READMEs)"
COMMAND = "PYTHONPATH=. python benchmarks/calibrate_torch_native.py"
DATE = "2026-12-02"
METHOD = "least squares on log step time, {} together (the rest at h100-80gb-best-case); standard error from the Jacobian"
PATHS = {"matmul": ("matmul", "efficiency"), "attention": ("attention", "efficiency"),
         "fp8": ("matmul", "fp8_efficiency")}
# name: (datasheet, stack, the rows' source_id, fitted parameters, start values)
STACKS = {
    "h100-80gb-llm-foundry": ("h100-80gb", {
        "name": "llm-foundry", "description": "MosaicML llm-foundry (Composer, PyTorch FSDP, flash-attn 1.x Triton "
        "attention, eager elementwise) on H100 80GB SXM, 2023-24", "attention_kernel": "triton-flash-2023",
        "elementwise": "eager"}, "llm-foundry-mpt-benchmarks", ("matmul", "attention"), (0.6, 0.2)),
    "h100-96gb-500w-torchtitan": ("h100-96gb-500w", {
        "name": "torchtitan", "description": "torchtitan 9dec370 (FSDP2, torch 1963fc8 SDPA) on Grand Teton H100 96GB "
        "500 W, Dec 2024", "attention_kernel": "flash-attention-2", "elementwise": "compiled"},
        "torchtitan-llama3-h100-202412", ("matmul",), (0.5,)),
}
FP8 = {"h100-96gb-500w-torchtitan": (0.4,)}  # the profiles whose FP8 efficiency is fitted next, and its start
TORCHTITAN_80GB = ("h100-80gb-torchtitan", "h100-80gb", "torchtitan (FSDP2, torch.compile, torch SDPA) on H100 80GB "
                   "SXM: the best case's published figures, nothing fitted")


def base(name: str, datasheet: str, stack: dict) -> dict:
    """The best case's JSON on `datasheet` with `stack`, its own attention efficiency taken out."""
    data = copy.deepcopy(sim.profile(BEST).to_dict())
    data.pop("attention", None)
    data.update(name=name, datasheet=datasheet, stack=stack,
                description=f"{stack['description']}: benchmarks/calibrate_torch_native.py (the rest as {BEST})")
    data["fingerprint"] = dict(data["fingerprint"], device=datasheet, date=DATE)
    return data


def with_values(data: dict, values: dict, notes: dict | None = None) -> dict:
    """`data` with each fitted parameter at its value (and provenance, `notes` by name)."""
    out = copy.deepcopy(data)
    for name, value in values.items():
        section, key = PATHS[name]
        note = (notes or {}).get(name, {"rows": "(fitting)", "residual": "(fitting)", "standard_error": 0.0})
        out.setdefault(section, {})[key] = {"value": value, "source": "calibrated", "dataset": DATASET,
                                            "method": METHOD.format(" and ".join(values)), "command": COMMAND,
                                            "date": DATE, **note, **({"scaling": "current"} if name == "fp8" else {})}
    return out


def runs_of(source_id: str, precision: str = "bf16") -> list:
    return [r for r in published.torch_native_runs()
            if r.reason is None and r.row["source_id"] == source_id and r.row["precision"] == precision]


def log_errors(data: dict, runs: list) -> np.ndarray:
    dev = from_dict(data, "calibration")
    return np.array([math.log(published.torch_native_estimate(r, dev).step_time / r.step_time) for r in runs])


def fit(data: dict, runs: list, names, start) -> tuple[dict, dict, np.ndarray]:
    """The parameters `names` fitted on `runs`: values, standard errors, relative errors."""
    res = least_squares(lambda x: log_errors(with_values(data, dict(zip(names, x))), runs), list(start),
                        bounds=([0.02] * len(names), [1.0] * len(names)), diff_step=1e-3)
    return dict(zip(names, map(float, res.x))), dict(zip(names, map(float, standard_errors(res)))), np.expm1(res.fun)


def mape(errors) -> float:
    return float(np.mean(np.abs(errors)))


def leave_one_model_out(data: dict, runs: list, names, start) -> dict:
    """{model: (values fitted without it, its MAPE at them)}; {} for a single model."""
    models = sorted({r.row["model"] for r in runs})
    out = {}
    for model in models if len(models) > 1 else ():
        values, _, _ = fit(data, [r for r in runs if r.row["model"] != model], names, start)
        out[model] = (values, mape(np.expm1(log_errors(with_values(data, values),
                                                       [r for r in runs if r.row["model"] == model]))))
    return out


def calibrate(name: str) -> dict:
    """The profile `name` of STACKS fitted (its BF16 parameters, then FP8's where FP8 says so)."""
    datasheet, stack, source, names, start = STACKS[name]
    data = calibrate_on(base(name, datasheet, stack), runs_of(source), names, start, f"{name} ({stack['name']} on {datasheet})")
    if name in FP8:
        data = calibrate_on(data, runs_of(source, "fp8"), ("fp8",), FP8[name], f"{name} FP8")
    return data


def calibrate_on(data: dict, runs: list, names, start, title: str) -> dict:
    """`data` with `names` fitted on `runs`, their provenance filled in; prints the fit table."""
    source, precision = runs[0].row["source_id"], runs[0].row["precision"]
    values, se, errors = fit(data, runs, names, start)
    held = leave_one_model_out(data, runs, names, start)
    by_model = {m: mape([e for r, e in zip(runs, errors) if r.row["model"] == m]) for m in sorted({r.row["model"] for r in runs})}
    residual = (f"MAPE {mape(errors):.1%} over the {len(runs)} rows; by model: "
                + ", ".join(f"{m} {v:.1%}" for m, v in by_model.items())
                + ("; leaving one model out, its MAPE: " + ", ".join(f"{m} {v[1]:.1%}" for m, v in held.items())
                   if held else "; one model: no leave-one-model-out"))
    rows = f"the {len(runs)} {precision.upper()} rows of {source} (row_id {', '.join(r.row['row_id'] for r in runs)})"
    notes = {n: {"rows": rows, "residual": residual, "standard_error": se[n],
                 **({"leave_one_model_out": {m: v[0][n] for m, v in held.items()}} if held else {})} for n in names}
    print(f"{title}, {len(runs)} rows:")
    for n in names:
        spread = ", ".join(f"{m} {v[0][n]:.4f}" for m, v in held.items()) or "-"
        print(f"  {n:<10} {values[n]:.4f} +- {se[n]:.4f}   leave-one-model-out: {spread}")
    print(f"  residual: {residual}")
    for r, e in zip(runs, errors):
        print(f"    row {r.row['row_id']:>4} {r.row['model']:<14} seq {r.seq:>6} {r.row['n_gpus']:>4} GPUs  {e:+.1%}")
    return with_values(data, values, notes)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="fit and print; write no profile")
    args = ap.parse_args(argv)
    out = {name: calibrate(name) for name in STACKS}
    name, datasheet, description = TORCHTITAN_80GB
    out[name] = base(name, datasheet, dict(STACKS["h100-96gb-500w-torchtitan"][1], description=description))
    if not args.dry_run:
        for name, data in out.items():
            sim.save_profile(data, PRESETS / f"{name}.json")
            print(f"wrote {PRESETS / f'{name}.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
