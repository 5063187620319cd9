"""Calibrate the H100 80GB device profile on the H100 development set, BF16 then FP8, and write it (and the H200's, derived).

    PYTHONPATH=. python benchmarks/calibrate_h100.py            # fit, print, write h100-80gb-dgxc.json, h200-dgxc.json
    PYTHONPATH=. python benchmarks/calibrate_h100.py --dry-run  # fit and print only
    PYTHONPATH=. python benchmarks/calibrate_h100.py --fp8-only # the FP8 fit alone, BF16 as h100-80gb-dgxc.json has it
    PYTHONPATH=. python benchmarks/calibrate_h100.py --probe    # how much each parameter moves the BF16 rows
    PYTHONPATH=. python benchmarks/calibrate_h100.py --moe-only # grouped_gemm_efficiency on the MoE rows, the rest held

The development set is sim/plan/data/h100_dev.csv (a copy of ../shared/data/h100-dev/runs.csv;
provenance in sim/plan/data/README.md): NVIDIA's DGX Cloud benchmarking recipes on DGX H100.
Fitted in two steps. BF16: the rows `sim.plan.h100_dev` expresses that are BF16, cp = 1 and
dense (GPT-3 175B and Nemotron-4 15B and 340B, NeMo 24.05 to 25.04); it fits the matmul
efficiency. FP8, after it: every dense FP8 row the planner expresses on the profile (cp 1 and 2:
GPT-3 175B, Llama 3.1 8B, 70B and 405B, Nemotron-4 15B and 340B), the BF16 fit's values held,
fitting `matmul.fp8_efficiency` alone (the share of the FP8 peak TE's FP8 Linear GEMMs reach,
`sim.cost.fp8`). Every FP8 row of the set is `fp8` as its source states it, NeMo's default
recipe, Transformer Engine's delayed scaling (no `fp8-cs` row), so the fitted value says
`scaling: "delayed"`.
The profile's FP8 value was written by `--fp8-only` (2026-11-25), the BF16 0.674 held as
stored: re-running the BF16 fit on that day's planner gave 0.654 (docs/validation.md, "Device profiles calibrated").
MoE, after both (`--moe-only`): the 20 MoE rows (Grok-1's proxy, BF16 and FP8; DeepSeek-V3,
BF16), every other value held as the written profile has it, fitting
`matmul.grouped_gemm_efficiency` alone (the share of one plain GEMM's speed Megatron-Core's
grouped expert GEMMs reach, `sim.cost.moe`; best case 1, no published figure).

Start: `h100-80gb-best-case` (published best cases). `--probe` moves each physical parameter
by 10 % and prints d log(step) / d log(parameter) over the rows: matmul efficiency -0.75,
NVLink -0.08, network -0.07, memory-bound -0.04, attention -0.03, a second of step overhead
+0.28, the launch floor 0 (every kernel of these layers runs far above it). Fitted together,
every parameter but the matmul efficiency runs to its physical bound (attention and memory-bound
at 1 and the HBM rate, NVLink and network at the link rates, overhead at 0; Jacobian singular
values 4.6, 0.27, 0.13, 0.03, 0.005, 0): the rows want them at least as good as the best case
and cannot place them. So FITTED is the matmul efficiency alone (matmul, network and overhead
together: 0.672 +- 0.018, network at its bound, overhead 0, the same residual); the others
keep their best-case (published) values.

Method: least squares on log step time (scipy.optimize.least_squares), each parameter as the
log of its ratio to the best case (the step overhead in seconds), bounded by physics
(efficiencies at most 1, bandwidths at most the datasheet's HBM or link rate); one standard
error from the Jacobian at the optimum (covariance (J^T J)^-1 s^2, benchmarks/calibrate_a100.py's
`standard_errors`), and the fit redone leaving out each model in turn (the held-out model's MAPE
says how well the fit carries to a model it did not see).
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import os
import sys

import numpy as np
from scipy.optimize import least_squares

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import sim  # noqa: E402
from sim.hardware.gpus import gpu as datasheet  # noqa: E402
from sim.hardware.profile import PRESETS, from_dict  # noqa: E402
from sim.plan import h100_dev  # noqa: E402
from calibrate_a100 import standard_errors  # noqa: E402  (benchmarks/, beside this file)

NAME, DERIVED = "h100-80gb-dgxc", {"h200": "h200-dgxc"}
BEST = "h100-80gb-best-case"
DATASET = "sim/plan/data/h100_dev.csv (copied from ../shared/data/h100-dev: NVIDIA/dgxc-benchmarking READMEs)"
COMMAND = "PYTHONPATH=. python benchmarks/calibrate_h100.py"
DATE = "2026-11-25"
# name: (profile paths that take the value, the datasheet field bounding it from above or a number)
PARAMETERS = {
    "matmul": (("matmul.efficiency",), 1.0),
    "fp8": (("matmul.fp8_efficiency",), 1.0),
    "grouped": (("matmul.grouped_gemm_efficiency",), 1.0),
    "attention": (("attention.efficiency",), 1.0),
    "memory": (("memory_bound.bandwidth",), "hbm_bandwidth"),
    "launch": (("launch.per_kernel",), 1e-4),
    "nvlink": (("collectives.node.bus_bandwidth", "p2p.node.bandwidth"), "nvlink_bandwidth"),
    "network": (("collectives.network.bus_bandwidth", "p2p.network.bandwidth"), "network_bandwidth"),
    "overhead": (("step_overhead",), 5.0),
}
FITTED = ("matmul",)  # why: the module's docstring
FITTED_FP8 = ("fp8",)  # fitted on the FP8 rows, FITTED held
FITTED_MOE = ("grouped",)  # fitted on the MoE rows, FITTED and FITTED_FP8 held
SCALING = "delayed"    # the FP8 rows' recipe (the module's docstring)
ADDITIVE = ("overhead",)  # fitted in seconds (its best case is 0), the others as log(value / best case)


def fit_runs() -> list:
    """The rows the fit uses: expressed, BF16, cp = 1, dense."""
    return [r for r in h100_dev.runs() if r.reason is None and r.row["precision"] == "bf16"
            and int(r.row["cp"] or 1) == 1 and r.row["moe"] == "0"]


def fp8_runs() -> list:
    """The rows the FP8 fit uses: dense FP8 rows the planner expresses, or would but for the
    profile's missing FP8 efficiency (`sim.plan.h100_dev`'s reason "fp8"), expressed here."""
    return [h100_dev.DevRun(r.row, h100_dev.model_of(r.row), h100_dev.keywords_of(r.row), None)
            for r in h100_dev.runs() if r.reason in (None, "fp8") and r.row["precision"].startswith("fp8")
            and r.row["moe"] == "0"]


def moe_runs() -> list:
    """The rows the MoE fit uses: every MoE row the planner expresses."""
    return [r for r in h100_dev.runs() if r.reason is None and r.row["moe"] == "1"]


def get(data: dict, path: str) -> dict:
    for key in path.split("."):
        data = data[key]
    return data


def best_values() -> dict:
    """Every parameter's best-case value."""
    best = sim.profile(BEST).to_dict()
    return {name: get(best, paths[0])["value"] if name not in FITTED_MOE else 1.0  # none: as fast as one GEMM
            for name, (paths, _) in PARAMETERS.items()}


def upper(name: str) -> float:
    bound = PARAMETERS[name][1]
    return getattr(datasheet("h100-80gb"), bound) if isinstance(bound, str) else bound


def values_of(x, names, best: dict) -> dict:
    """Parameter values from the fit's vector `x` (log ratios to the best case; additive ones in seconds)."""
    return {n: (v if n in ADDITIVE else best[n] * math.exp(v)) for n, v in zip(names, x)}


def bounds_of(names, best: dict) -> tuple[list, list]:
    lo = [0.0 if n in ADDITIVE else math.log(0.1) for n in names]
    hi = [upper(n) if n in ADDITIVE else math.log(upper(n) / best[n]) for n in names]
    return lo, hi


def calibrated(name: str, value: float, se: float, notes: dict) -> dict:
    """A fitted number with its provenance, and its value fitted without each model where known."""
    out = {"value": value, "source": "calibrated", "dataset": DATASET, "rows": notes["rows"],
           "method": notes["method"], "residual": notes["residual"], "standard_error": se,
           "command": COMMAND, "date": DATE}
    if "held" in notes:
        out["leave_one_model_out"] = {m: v[0][name] for m, v in notes["held"].items()}
    if name in FITTED_FP8:
        out["scaling"] = SCALING
    return out


def profile_data(values: dict, se: dict | None = None, notes: dict | None = None) -> dict:
    """The calibrated profile's JSON: the best case with `values` in place (calibrated sources;
    `notes` by parameter name)."""
    data = copy.deepcopy(sim.profile(BEST).to_dict())
    fitting = {"rows": "(fitting)", "method": "(fitting)", "residual": "(fitting)"}
    for name, value in values.items():
        for path in PARAMETERS[name][0]:
            parent, key = path.rsplit(".", 1) if "." in path else ("", path)
            node = get(data, parent) if parent else data
            node[key] = calibrated(name, value, (se or {}).get(name, 0.0), (notes or {}).get(name, fitting))
    data["name"] = NAME
    data["description"] = ("H100 80GB SXM as NeMo/Megatron-Core runs it (NeMo 24.05-25.04, DGX H100): calibrated on "
                           "the H100 development set by benchmarks/calibrate_h100.py; the rest as h100-80gb-best-case")
    data["stack"] = dict(data["stack"], name="megatron-te",
                         description="NeMo 24.05-25.04 (Megatron-Core, Transformer Engine) on DGX H100")
    data["fingerprint"] = dict(data["fingerprint"], device="NVIDIA H100 80GB HBM3 (DGX H100)", torch=None, cuda=None,
                               date=DATE)
    return data


def log_errors(values: dict, runs: list) -> np.ndarray:
    """log(predicted / measured) step time of each run with the profile at `values`."""
    dev = from_dict(profile_data(values), "calibration")
    return np.array([math.log(h100_dev.estimate_run(r, dev).step_time / r.step_time) for r in runs])


def fit(runs: list, names=FITTED, held: dict | None = None, progress=print):
    """Least squares on log step time over `runs` of the parameters `names`, those of `held` at
    their values; returns the fitted values, their standard errors and the optimizer's answer."""
    best, held = best_values(), held or {}
    hi = bounds_of(names, best)[1]  # from the best case, or just inside its bound where it is at one (grouped: 1)
    start = [min(0.0, top - 0.1) if n not in ADDITIVE else 0.1 for n, top in zip(names, hi)]
    res = least_squares(lambda x: log_errors({**held, **values_of(x, names, best)}, runs), start,
                        bounds=bounds_of(names, best), diff_step=1e-3, x_scale=1.0)
    values, se_x = values_of(res.x, names, best), standard_errors(res)
    se = {n: float(s if n in ADDITIVE else values[n] * s) for n, s in zip(names, se_x)}
    progress(", ".join(f"{n} {values[n]:.4g} +- {se[n]:.2g}" for n in names) +
             f"; RMS log error {math.sqrt(np.mean(res.fun ** 2)):.3f} on {len(runs)} rows")
    return values, se, res


def probe(runs: list) -> dict:
    """d log(step) / d log(parameter) of each parameter at the best case: mean, min, max over the runs."""
    best = best_values()
    base = log_errors({}, runs)
    out = {}
    for name in PARAMETERS:
        moved = {name: 0.05 if name in ADDITIVE else best[name] * 1.1}
        d = (log_errors(moved, runs) - base) / (0.05 if name in ADDITIVE else math.log(1.1))
        out[name] = (float(d.mean()), float(d.min()), float(d.max()))
        print(f"  {name}: {out[name][0]:+.3f} (rows {out[name][1]:+.3f} to {out[name][2]:+.3f})"
              + (" a second of overhead" if name in ADDITIVE else ""))
    return out


def relative(log_err) -> list[float]:
    return [math.exp(e) - 1 for e in log_err]


def report(runs: list, before: list[float], after: list[float], was: str = "best case") -> None:
    """MAPE before (`was`) and after (calibrated), overall and by each of h100_dev.GROUPS."""
    print(f"MAPE on {len(runs)} rows: {was} {h100_dev.mape(before):.1%}, calibrated {h100_dev.mape(after):.1%}")
    for key in h100_dev.GROUPS:
        b, a = h100_dev.mape_by(runs, before, key), h100_dev.mape_by(runs, after, key)
        print(f"  by {key}: " + "; ".join(f"{k} ({n}) {b[k][0]:.1%} -> {v:.1%}" for k, (v, n) in a.items()))


def leave_one_model_out(runs: list, names=FITTED, fixed: dict | None = None) -> dict:
    """Refit `names` without each model (`fixed` held); the parameters and the held-out model's MAPE."""
    out, fixed = {}, fixed or {}
    for model in sorted({r.row["model"] for r in runs}):
        keep = [r for r in runs if r.row["model"] != model]
        held = [r for r in runs if r.row["model"] == model]
        print(f"without {model}: ", end="")
        values, _, _ = fit(keep, names, fixed)
        out[model] = (values, h100_dev.mape(relative(log_errors({**fixed, **values}, held))))
        print(f"  held-out MAPE on {model} ({len(held)} rows): {out[model][1]:.1%}")
    return out


def derived_profile(data: dict, gpu_name: str) -> dict:
    """The calibrated profile carried to another GPU of the H100's die through its datasheet: the
    memory-bound bandwidth as the same share of its HBM rate (derived), every other number as it
    is (as h200-best-case does with the published H100 figures), a fitted one saying so."""
    h100, other = datasheet("h100-80gb"), datasheet(gpu_name)
    out = copy.deepcopy(data)
    out.update(name=DERIVED[gpu_name], datasheet=gpu_name,
               description=f"{gpu_name}: {NAME} carried over through the datasheets (benchmarks/calibrate_h100.py): "
                           "the H100's compute die, clocks and links, its own HBM")
    out["fingerprint"] = dict(out["fingerprint"], device=gpu_name)
    out["stack"] = dict(out["stack"], description="NeMo 24.05-25.04 (Megatron-Core, Transformer Engine), carried "
                                                  "over from DGX H100")
    memory = get(out, "memory_bound.bandwidth")
    scale = other.hbm_bandwidth / h100.hbm_bandwidth
    was = dict(memory)
    memory.clear()
    memory.update(value=was["value"] * scale, source="derived", **{"from": ["datasheet.hbm_bandwidth"]},
                  how=f"{NAME}'s memory-bound bandwidth ({was['value'] / 1e12:.2f} TB/s, {was['source']}: "
                      f"{was.get('citation', was.get('rows', ''))}) as a share of the H100's "
                      f"{h100.hbm_bandwidth / 1e12:.2f} TB/s HBM, applied to the {gpu_name}'s "
                      f"{other.hbm_bandwidth / 1e12:.2f} TB/s")
    for name in FITTED + FITTED_FP8 + FITTED_MOE:
        for path in PARAMETERS[name][0]:
            if path.rsplit(".", 1)[1] not in get(out, path.rsplit(".", 1)[0]):
                continue  # not fitted yet
            get(out, path)["carried_over"] = (f"fitted on H100 rows; the {gpu_name} has the H100's compute die, "
                                              "clocks and links (its datasheet), so the same value")
    return out


def row_ids(runs: list) -> str:
    return ", ".join(str(r.row_id) for r in runs)


def calibrate_bf16(runs: list) -> tuple[dict, dict, dict]:
    """The BF16 fit on `runs`: values, standard errors and the notes its numbers carry."""
    values, se, res = fit(runs)
    before, after = relative(log_errors({}, runs)), relative(res.fun)
    report(runs, before, after)
    held = leave_one_model_out(runs)
    notes = {"rows": f"the {len(runs)} BF16, cp = 1, dense rows sim.plan.h100_dev expresses (row_id {row_ids(runs)})",
             "method": f"least squares on log step time, {' and '.join(FITTED)} (the rest at {BEST}, which the rows "
                       "cannot place: benchmarks/calibrate_h100.py's docstring); "
                       "standard error from the Jacobian",
             "residual": f"MAPE {h100_dev.mape(after):.1%} (best case {h100_dev.mape(before):.1%}); leaving one "
                         "model out, its MAPE: " + ", ".join(f"{m} {v[1]:.1%}" for m, v in held.items()),
             "held": held}
    return values, se, {name: notes for name in FITTED}


def calibrate_fp8(runs: list, bf16: dict) -> tuple[dict, dict, dict]:
    """The FP8 fit on `runs`, the BF16 fit's values `bf16` held: values, standard errors, notes."""
    print(f"{len(runs)} rows: FP8 ({SCALING} scaling), dense, cp 1 and 2; {', '.join(bf16)} held")
    return calibrate_held(runs, FITTED_FP8, bf16, "the best case's fp8 efficiency", ("model", "cp", "release"),
                          f"the {len(runs)} FP8 (all 'fp8' as stated: TE delayed scaling, no fp8-cs row), dense rows "
                          "sim.plan.h100_dev expresses, cp 1 and 2")


def calibrate_moe(runs: list, held: dict) -> tuple[dict, dict, dict]:
    """The MoE fit on `runs`, the dense fits' values `held`: values, standard errors, notes."""
    print(f"{len(runs)} MoE rows; {', '.join(f'{k} {v:.4g}' for k, v in held.items())} held")
    return calibrate_held(runs, FITTED_MOE, held, "1, grouped GEMMs as fast as one GEMM", ("model", "precision", "release"),
                          f"the {len(runs)} MoE rows sim.plan.h100_dev expresses (Grok-1 proxy BF16 and FP8, NeMo 24.12 "
                          "and 25.04; DeepSeek-V3 BF16, NeMo 25.04.01)")


def calibrate_held(runs: list, names, held: dict, was: str, groups, rows: str) -> tuple[dict, dict, dict]:
    """A fit of `names` alone on `runs`, `held` at their values: values, standard errors and the
    notes each fitted number carries (`rows` says which rows, `was` what the fit started from;
    the residual by each of `groups`, and leaving each model out)."""
    values, se, res = fit(runs, names, held)
    before, after = relative(log_errors(held, runs)), relative(res.fun)
    report(runs, before, after, was)
    out = leave_one_model_out(runs, names, held)
    by = {key: h100_dev.mape_by(runs, after, key) for key in groups}
    notes = {"rows": f"{rows} (row_id {row_ids(runs)})",
             "method": f"least squares on log step time, {', '.join(PARAMETERS[n][0][0] for n in names)} alone, "
                       f"{', '.join(f'{k} {v:.4g}' for k, v in held.items())} held (the rest at {BEST}); "
                       "standard error from the Jacobian",
             "residual": f"MAPE {h100_dev.mape(after):.1%} (at {was}: {h100_dev.mape(before):.1%}); " + "; ".join(
                             f"by {key}: " + ", ".join(f"{k} {m:.1%}" for k, (m, _) in v.items()) for key, v in by.items())
                         + "; leaving one model out, its MAPE: " + ", ".join(f"{m} {v[1]:.1%}" for m, v in out.items()),
             "held": out}
    return values, se, {name: notes for name in names}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="fit and print, write nothing")
    ap.add_argument("--probe", action="store_true", help="print each parameter's effect on the rows and stop")
    ap.add_argument("--fp8-only", action="store_true", help="fit FP8 alone, the BF16 values held as the profile has them")
    ap.add_argument("--moe-only", action="store_true", help="fit the grouped GEMM efficiency on the MoE rows alone, "
                                                            "the rest held as the profile has it")
    args = ap.parse_args(argv)
    if args.fp8_only or args.moe_only:
        return held_fit(args.dry_run, *((FITTED_FP8, FITTED, fp8_runs, calibrate_fp8, "--fp8-only") if args.fp8_only
                                        else (FITTED_MOE, FITTED + FITTED_FP8, moe_runs, calibrate_moe, "--moe-only")))
    runs = fit_runs()
    print(f"{len(runs)} rows: BF16, cp = 1, dense, expressed by sim.plan.h100_dev")
    if args.probe:
        probe(runs)
        return 0
    values, se, notes = calibrate_bf16(runs)
    fp8_values, fp8_se, fp8_notes = calibrate_fp8(fp8_runs(), values)
    data = profile_data({**values, **fp8_values}, {**se, **fp8_se}, {**notes, **fp8_notes})
    if not args.dry_run:
        write(data)
    return 0


def held_fit(dry_run: bool, names, held_names, runs, calibrate, flag: str) -> int:
    """One fit (`calibrate` of `names` on `runs()`) with `held_names` as the written profile has
    them, written into it (`--fp8-only`, `--moe-only`)."""
    data = json.loads((PRESETS / f"{NAME}.json").read_text())
    held = {name: get(data, PARAMETERS[name][0][0])["value"] for name in held_names}
    values, se, notes = calibrate(runs(), held)
    for name in names:
        for path in PARAMETERS[name][0]:
            parent, key = path.rsplit(".", 1)
            get(data, parent)[key] = dict(calibrated(name, values[name], se[name], notes[name]),
                                          command=f"{COMMAND} {flag}")
    if not dry_run:
        write(data)
    return 0


def write(data: dict) -> None:
    """Write the H100 profile `data` and the ones derived from it."""
    sim.save_profile(data, PRESETS / f"{NAME}.json")
    for gpu_name, name in DERIVED.items():
        sim.save_profile(derived_profile(data, gpu_name), PRESETS / f"{name}.json")
    print(f"wrote {NAME}.json, " + ", ".join(f"{n}.json" for n in DERIVED.values()) + f" in {PRESETS}")


if __name__ == "__main__":
    sys.exit(main())
