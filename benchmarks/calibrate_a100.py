"""Calibrate the A100 80GB device profile on the development set, and write it.

    PYTHONPATH=. python benchmarks/calibrate_a100.py            # fit, print, write sim/hardware/profiles/a100-80gb-vtrain.json
    PYTHONPATH=. python benchmarks/calibrate_a100.py --dry-run  # fit and print only

The development set (data/vtrain-a100/README.md; sim/plan/published.py):
1. nccl-tests all-reduce on 2-8 A100s of one node (vTrain's traces): the profile keeps them as
   its measured table, and fits NCCL's ring model (bus bandwidth, hop and base latency) to
   them for the collectives the table lacks (reduce-scatter, all-gather).
2. Korthikanti et al. 2022, Table 4 (one 22B layer, t=8, b=4: forward and backward of five
   techniques): fits the matmul efficiency and the memory-bound bandwidth, 2 parameters on 10
   times. A layer of that size runs far above the launch floor, so the host cannot enter.
   The single-node runs alone could not separate the two (they trade off along a line).
3. vTrain's 1,440 single-node Megatron-DeepSpeed runs: the even-numbered rows fit the host's
   launch cost per kernel and a step's fixed overhead, with (1) and (2) held; the odd ones check.

Each fit is least squares on relative errors (scipy.optimize.least_squares); a parameter's
uncertainty is one standard error from the Jacobian at the optimum (covariance (J^T J)^-1 s^2).
Narayanan et al. 2021 Table 1 and Korthikanti Table 5 are not fitted: benchmarks/bench_published.py
checks them.
"""
from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import sim  # noqa: E402
from sim.plan import published  # noqa: E402
from sim.hardware.profile import PRESETS, from_dict  # noqa: E402
from sim.cost.layer import Slice, layer_times  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data" / "vtrain-a100"
OUT = PRESETS / "a100-80gb-vtrain.json"
DATASET = "data/vtrain-a100 (vTrain f8dda84, MICRO 2024) + sim/plan/published.py Korthikanti Table 4"
COMMAND = "PYTHONPATH=. python benchmarks/calibrate_a100.py"
DATE = "2026-11-24"
START = {"efficiency": 0.75, "memory": 1.5e12, "launch": 40e-6, "overhead": 0.01}  # the floor binds at the start


def vtrain_rows() -> list[dict]:
    """The single-node runs: GPUs, batch, micro-batch, hidden, heads, layers, seq, tp, dp, pp, ms."""
    keys = ("gpus", "batch", "micro", "hidden", "heads", "layers", "seq", "tp", "dp", "pp")
    with open(DATA / "single_node_runs.csv") as f:
        rows = list(csv.reader(f))[1:]
    return [dict(zip(keys, map(int, r[:10])), seconds=float(r[10]) / 1e3, index=i) for i, r in enumerate(rows)]


def nccl_rows() -> list[list]:
    """nccl-tests all-reduce, out of place: [op, link, ranks, bytes, seconds]."""
    out = []
    for n in range(2, 9):
        with open(DATA / "nccl_allreduce" / f"allreduce_{n}gpus.csv") as f:
            for r in list(csv.reader(f))[1:]:
                out.append(["all_reduce", "node", n, int(r[0]), float(r[3]) * 1e-9])
    return out


def fit_ring(rows: list[list]) -> tuple[dict, float]:
    """NCCL's ring all-reduce, t = base + 2(n-1) hop + 2(n-1)/n bytes / B, fitted to the
    table by least squares on relative error; returns the values, standard errors, residual."""
    def model(p, r):
        base, hop, inv_bw = p
        n, nbytes = r[2], r[3]
        return base + 2 * (n - 1) * hop + 2 * (n - 1) / n * nbytes * inv_bw
    res = least_squares(lambda p: [model(p, r) / r[4] - 1 for r in rows], [8e-6, 3e-6, 1 / 2e11],
                        x_scale=[1e-5, 1e-6, 1e-11], bounds=([0, 0, 0], [1e-3, 1e-3, 1e-9]))
    se = standard_errors(res)
    base, hop, inv = res.x
    fit = {"bus_bandwidth": (1 / inv, se[2] / inv ** 2), "hop_latency": (hop, se[1]), "base_latency": (base, se[0])}
    return fit, _mape(res.fun)


def standard_errors(res) -> np.ndarray:
    dof = max(1, len(res.fun) - len(res.x))
    s2 = float(res.fun @ res.fun) / dof
    return np.sqrt(np.diag(np.linalg.pinv(res.jac.T @ res.jac)) * s2)


def _mape(relative) -> float:
    return float(np.mean(np.abs(relative)))


def _cal(value: float, se: float, rows: str, method: str, residual: str) -> dict:
    return {"value": value, "source": "calibrated", "dataset": DATASET, "rows": rows, "method": method,
            "residual": residual, "standard_error": se, "command": COMMAND, "date": DATE}


def profile_data(p: dict, ring: dict, table: list[list], notes: dict) -> dict:
    """The profile's JSON for parameters `p` (efficiency, memory, launch, overhead) and the ring fit."""
    best = sim.profile("a100-80gb-best-case").to_dict()
    c = notes.get
    node = {k: _cal(v, se, c("ring_rows"), c("ring_method"), c("ring_residual")) for k, (v, se) in ring.items()}
    derived = {"source": "derived", "from": ["collectives.node"], "how": "a send over NVLink at the ring's bus bandwidth "
               "and one hop's latency (nothing in the development set measures a send)"}
    return {
        "schema": "pipeline-workbench/device-profile/1", "name": "a100-80gb-vtrain",
        "description": "A100 80GB SXM as Megatron-LM/Megatron-DeepSpeed ran it (2021-2023 stacks): calibrated on the "
                       "development set by benchmarks/calibrate_a100.py",
        "datasheet": "a100-80gb",
        "stack": best["stack"] | {"name": "megatron-lm", "description": "Megatron-LM / Megatron-DeepSpeed 2021-2023 on "
                                  "DGX A100", "attention_kernel": "unfused"},
        "fingerprint": {"device": "NVIDIA A100-SXM4-80GB", "driver": None, "cuda": None, "torch": None, "nccl": None,
                        "backend": "nccl", "host": None, "threads": None, "date": DATE},
        "matmul": {"efficiency": _cal(p["efficiency"], c("se", {}).get("efficiency", 0.0), c("t4_rows"),
                                      c("t4_method"), c("t4_residual"))},
        "memory_bound": {"bandwidth": _cal(p["memory"], c("se", {}).get("memory", 0.0), c("t4_rows"),
                                           c("t4_method"), c("t4_residual"))},
        "collectives": {"node": node, "network": best["collectives"]["network"],
                        "table": {"rows": table, "source": "published",
                                  "citation": "vTrain (VIA-Research/vTrain f8dda84) trace/a100/AR_GPU{N}_1M_1024M_LUT: "
                                              "nccl-tests all_reduce_perf, out of place, fp32, on 2-8 A100 80GB of one "
                                              "node (data/vtrain-a100/nccl_allreduce)"}},
        "p2p": {"node": {"bandwidth": dict(derived, value=ring["bus_bandwidth"][0]),
                         "latency": dict(derived, value=ring["hop_latency"][0])},
                "network": best["p2p"]["network"]},
        "launch": {"per_kernel": _cal(p["launch"], c("se", {}).get("launch", 0.0), c("host_rows"), c("host_method"),
                                      c("host_residual")), "host_runs_ahead": True},
        "step_overhead": _cal(p["overhead"], c("se", {}).get("overhead", 0.0), c("host_rows"), c("host_method"),
                              c("host_residual")),
    }


def table_4_errors(dev) -> list[float]:
    """Relative errors of a 22B layer's F and B against Korthikanti et al. 2022, Table 4."""
    c = published.KORTHIKANTI_22B_LAYER
    m, out = sim.MODELS[c["model"]], []
    for _, sp, recompute, fwd, bwd in published.KORTHIKANTI_TABLE_4:
        lt = layer_times(m, dev, Slice(c["micro_batch"], c["tp"], sp, published.KORTHIKANTI_PRECISION), recompute)
        out += [lt.forward * 1e3 / fwd - 1, lt.backward * 1e3 / bwd - 1]
    return out


def vtrain_estimate(dev, r: dict):
    """`sim.estimate` of one single-node run as vTrain's validation configs ran it (README)."""
    tp = r["tp"]
    m = sim.Transformer(layers=r["layers"], hidden=r["hidden"], heads=r["heads"], seq=r["seq"],
                        vocab=50257 + (-50257) % (128 * tp))   # Megatron pads to a multiple of 128 tp
    return sim.estimate(m, dev, tp=tp, pp=r["pp"], dp=r["dp"], micro_batch=r["micro"], global_batch=r["batch"],
                        recompute="full", precision="fp16", schedule="1f1b")


def vtrain_errors(dev, rows: list[dict]) -> list[float]:
    return [vtrain_estimate(dev, r).step_time / r["seconds"] - 1 for r in rows]


def fit(table: list[list], ring: dict, rows: list[dict], progress=print) -> tuple[dict, dict]:
    """The two-stage fit: compute on Table 4, then the host on `rows`; returns parameters and notes."""
    p = dict(START)
    notes = {k: "(fitting)" for k in ("ring_rows", "ring_method", "ring_residual", "t4_rows", "t4_method",
                                      "t4_residual", "host_rows", "host_method", "host_residual")}
    build = lambda q: from_dict(profile_data(q, ring, table, notes), "calibration")  # noqa: E731
    t4 = least_squares(lambda x: table_4_errors(build(dict(p, efficiency=x[0], memory=x[1] * 1e12))),
                       [p["efficiency"], p["memory"] / 1e12], bounds=([0.3, 0.3], [1.0, 2.039]))
    p.update(efficiency=t4.x[0], memory=t4.x[1] * 1e12)
    se = standard_errors(t4)
    notes["se"] = {"efficiency": float(se[0]), "memory": float(se[1] * 1e12)}
    progress(f"Table 4: matmul efficiency {p['efficiency']:.3f} +- {se[0]:.3f}, memory-bound "
             f"{p['memory'] / 1e12:.2f} +- {se[1]:.2f} TB/s, MAPE {_mape(t4.fun):.1%}")
    host = least_squares(lambda x: vtrain_errors(build(dict(p, launch=x[0] * 1e-6, overhead=x[1] * 1e-3)), rows),
                         [p["launch"] * 1e6, p["overhead"] * 1e3], bounds=([0, 0], [100, 500]))
    p.update(launch=host.x[0] * 1e-6, overhead=host.x[1] * 1e-3)
    se = standard_errors(host)
    notes["se"].update(launch=float(se[0] * 1e-6), overhead=float(se[1] * 1e-3))
    progress(f"single-node runs: launch {p['launch'] * 1e6:.2f} +- {se[0]:.2f} us a kernel, step overhead "
             f"{p['overhead'] * 1e3:.2f} +- {se[1]:.2f} ms, MAPE {_mape(host.fun):.1%} on {len(rows)} rows")
    notes.update(t4_residual=f"MAPE {_mape(t4.fun):.1%} over the 10 times", host_residual=f"MAPE {_mape(host.fun):.1%}")
    return p, notes


def by(rows: list[dict], errors: list[float], key: str) -> dict:
    out: dict = {}
    for r, e in zip(rows, errors):
        out.setdefault(r[key], []).append(abs(e))
    return {k: statistics.mean(v) for k, v in sorted(out.items())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="fit and print, write nothing")
    args = ap.parse_args(argv)
    table = nccl_rows()
    ring, ring_mape = fit_ring(table)
    print(f"nccl-tests all-reduce (2-8 GPUs, {len(table)} rows): bus bandwidth {ring['bus_bandwidth'][0] / 1e9:.0f} "
          f"+- {ring['bus_bandwidth'][1] / 1e9:.0f} GB/s, hop {ring['hop_latency'][0] * 1e6:.2f} us, base "
          f"{ring['base_latency'][0] * 1e6:.2f} us, MAPE {ring_mape:.1%}")
    rows = vtrain_rows()
    fit_rows, check_rows = rows[0::2], rows[1::2]
    p, notes = fit(table, ring, fit_rows)
    notes.update(ring_rows=f"all {len(table)} rows of nccl_allreduce/allreduce_{{2..8}}gpus.csv",
                 ring_method="least squares on relative error of the ring model", ring_residual=f"MAPE {ring_mape:.1%}",
                 t4_rows="Korthikanti et al. 2022 Table 4: forward and backward of the five techniques (10 times)",
                 t4_method="least squares on relative error, matmul efficiency and memory-bound bandwidth together",
                 host_rows=f"the {len(fit_rows)} even-numbered rows of single_node_runs.csv",
                 host_method="least squares on relative error, launch cost and step overhead together, the "
                             "compute and collectives held at their fits")
    data = profile_data(p, ring, table, notes)
    dev = from_dict(data, "calibration")
    errors = vtrain_errors(dev, check_rows)
    print(f"check: the {len(check_rows)} odd-numbered rows, MAPE {_mape(np.array(errors)):.1%}, "
          f"median error {statistics.median(errors):+.1%}")
    for key in ("tp", "micro", "pp", "hidden"):
        print(f"  MAPE by {key}: " + ", ".join(f"{k}: {v:.1%}" for k, v in by(check_rows, errors, key).items()))
    if not args.dry_run:
        sim.save_profile(data, OUT)
        print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
