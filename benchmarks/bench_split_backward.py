"""The split backward's I and W against the full backward B, on one stage in this process.

    python benchmarks/bench_split_backward.py               # 15 repetitions of each
    python benchmarks/bench_split_backward.py --repeats 40

For each model: the second of two stages (its input needs a gradient, its loss is in its
F), B, then I and W (`exec.runtime.split_backward`) on a fresh forward each, interleaved, timed in
CPU time of this thread with torch on one thread (so that other processes on a loaded
machine do not count). Prints the minimum and the median of each in ms, (I + W) / B and
W / B from the minima. The first model is the one `tests/exec/runtime/test_split_backward.py` checks.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from exec.models.spec import ModelSpec
from exec.runtime.split_backward import backward_input, backward_weight

MODELS = (ModelSpec("mlp", layers=2, hidden=512, seq=256, batch_size=1),   # the test's
          ModelSpec(),                                                     # exec's default, micro 1
          ModelSpec("gpt", layers=4, batch_size=8))


def times(spec: ModelSpec, repeats: int) -> dict[str, list[float]]:
    """Seconds of B, I and W on stage 1 of 2, `repeats` times each, interleaved."""
    first, stage = spec.build_stages(2)
    x0, y = spec.micro_batches(1)[0]
    with torch.no_grad():
        h = first(x0)
    params, out = list(stage.parameters()), {"B": [], "I": [], "W": []}

    def forward():
        x = h.clone().requires_grad_()
        return x, spec.loss(stage(x), y)
    for _ in range(repeats):
        x, loss = forward()
        t = time.thread_time()
        loss.backward()
        out["B"].append(time.thread_time() - t)
        x, loss = forward()
        t = time.thread_time()
        _, work = backward_input(loss, None, x, params)
        t1 = time.thread_time()
        backward_weight(work)
        out["W"].append(time.thread_time() - t1)
        out["I"].append(t1 - t)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"{'model':<34} {'B ms min/med':>14} {'I ms min/med':>14} {'W ms min/med':>14} {'(I+W)/B':>8} {'W/B':>6}")
    for spec in MODELS:
        t = times(spec, args.repeats)
        lo = {k: min(v) * 1e3 for k, v in t.items()}
        med = {k: statistics.median(v) * 1e3 for k, v in t.items()}
        name = f"{spec.model} L{spec.layers} h{spec.hidden} s{spec.seq} b{spec.batch_size}"
        cells = " ".join(f"{lo[k]:6.2f}/{med[k]:6.2f}".rjust(14) for k in "BIW")
        print(f"{name:<34} {cells} {(lo['I'] + lo['W']) / lo['B']:8.3f} {lo['W'] / lo['B']:6.3f}")


if __name__ == "__main__":
    main()
