"""The planner's layer against torch's: one block of exec's GPT, its passes (F, B, I, W) and the kernels of the CPU rules, predicted on a device profile and timed in one process.

    PYTHONPATH=. python -m exec.profile_device --out /tmp/cpu.json          # once per machine
    PYTHONPATH=. python benchmarks/bench_layer_vs_torch.py --profile /tmp/cpu.json
    PYTHONPATH=. python benchmarks/bench_layer_vs_torch.py --profile /tmp/cpu.json --micro-batch 4 --recompute none

Each pass is `sim.cost.layer.layer_times` of `Transformer(kernels="torch")` under the
profile's launch floor (`DeviceProfile.pass_time`), against `exec.models.layers.Block` run alone on
one thread as a pipeline rank runs it: F its forward, B `backward` of its output, I and W
`exec.runtime.split_backward` (I first, then W). The kernels: erf GeLU forward and backward and the
flash attention's forward and backward (`scaled_dot_product_attention`, causal) against
`sim.hardware.kernels` on the listed work. Every time is the fastest of `--loops` loops
(the block's own time, the least slowed by other processes: this isolates the layer model
from the pipeline and from the load, which bench_plan_vs_run.py measures with it); the
load average is printed beside.
"""
from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.nn.functional as F

import sim
from exec.launch.host import loadavg
from exec.models.layers import Block
from exec.models.spec import ModelSpec
from exec.runtime.split_backward import backward_input, backward_weight
from sim.hardware.kernels import elementwise_time, gemm_time
from sim.cost.layer import Slice, gemm_shapes, layer_times

MODEL = dict(layers=4, hidden=128, heads=4, seq=64, vocab=512)  # exec's --model gpt


def fastest(fn, loops: int, least: float = 4e-3) -> float:
    """Seconds per call of `fn`: the fastest of `loops` loops of calls lasting `least` seconds."""
    fn()
    t = time.perf_counter()
    fn()
    calls = max(1, int(least / max(time.perf_counter() - t, 1e-7)))
    best = float("inf")
    for _ in range(loops):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t) / calls)
    return best


def measured_passes(b: int, recompute: str, loops: int) -> dict[str, float]:
    """F, B, I and W of one block on micro-batch `b`, in seconds."""
    blk = Block(MODEL["hidden"], MODEL["heads"], recompute)
    x = torch.randn(b, MODEL["seq"], MODEL["hidden"], requires_grad=True)
    grad = torch.randn(b, MODEL["seq"], MODEL["hidden"])
    params = list(blk.parameters())
    f = fastest(lambda: blk(x), loops)
    fb = fastest(lambda: blk(x).backward(grad), loops)

    def split():
        _, work = backward_input(blk(x), grad, x, params)
        return work
    fi = fastest(split, loops)
    fiw = fastest(lambda: backward_weight(split()), loops)
    return {"F": f, "B": fb - f, "I": fi - f, "W": fiw - fi}


def predicted_passes(profile, b: int, recompute: str) -> dict[str, float]:
    m = ModelSpec("gpt", **MODEL).transformer()
    lt = layer_times(m, profile, Slice(b, precision="fp32"), recompute)
    times = {"F": lt.forward, "B": lt.backward, "I": lt.backward_input, "W": lt.backward_weight}
    return {k: profile.pass_time(v, lt.kernels[k]) for k, v in times.items()}


def kernels(profile, b: int, loops: int) -> list[tuple[str, float, float]]:
    """(kernel, predicted s, measured s) of the CPU rules' kernels at micro-batch `b`."""
    s, h, a = MODEL["seq"], MODEL["hidden"], MODEL["heads"]
    m = ModelSpec("gpt", **MODEL).transformer()
    sbf, scores = b * s * 4 * h, a * s * s * b
    xf, gf = torch.randn(sbf), torch.randn(sbf)
    q, k, v = (torch.randn(b, a, s, h // a) for _ in range(3))
    out, lse, *_ = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True)
    go = torch.randn_like(out)
    shapes = gemm_shapes(m, Slice(b, precision="fp32"))
    mm = {name: gemm_time(profile, "fp32", *shape) for name, shape in shapes.items()}
    sm, sn, sk, sb = shapes["scores"]
    vm, vn, vk, vb = shapes["values"]
    grads = (gemm_time(profile, "fp32", sm, sk, sn, sb) + gemm_time(profile, "fp32", sk, sn, sm, sb)
             + gemm_time(profile, "fp32", vm, vk, vn, vb) + gemm_time(profile, "fp32", vk, vn, vm, vb))
    exp = elementwise_time(profile, 0, "elementwise", scores, "exp")
    sbh = b * s * h
    return [
        ("gelu (erf) forward", elementwise_time(profile, 8 * sbf, "elementwise", sbf, "gelu"),
         fastest(lambda: F.gelu(xf), loops)),
        ("gelu (erf) backward", elementwise_time(profile, 12 * sbf, "elementwise", sbf, "gelu_backward"),
         fastest(lambda: torch.ops.aten.gelu_backward(gf, xf), loops)),
        ("flash attention forward", mm["scores"] + mm["values"] + exp,
         fastest(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), loops)),
        ("flash attention backward", mm["scores"] + grads + exp + elementwise_time(profile, 4 * 3 * sbh, "copy")
         + elementwise_time(profile, 8 * sbh),
         fastest(lambda: torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
             go, q, k, v, out, lse, 0.0, True), loops)),
    ]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", required=True, help="a device profile (python -m exec.profile_device --out FILE)")
    ap.add_argument("--micro-batch", type=int, action="append", help="micro-batch size (repeat; default 4 8)")
    ap.add_argument("--recompute", action="append", choices=("none", "selective", "full"),
                    help="recompute mode (repeat; default none full)")
    ap.add_argument("--loops", type=int, default=15, help="loops per time; the fastest is kept (default 15)")
    args = ap.parse_args(argv)
    try:
        profile = sim.load_profile(args.profile)
    except (OSError, ValueError) as e:
        print(f"bench_layer_vs_torch: {e}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)  # one thread: a pipeline rank of exec on a core of its own
    print(f"{'pass':>26}  {'pred ms':>8} {'meas ms':>8} {'error':>8}  load (1, 5, 15 min)")
    for b in args.micro_batch or (4, 8):
        for name, p, m in kernels(profile, b, args.loops):
            print(f"{name + f' b={b}':>26}  {p * 1e3:8.3f} {m * 1e3:8.3f} {(p / m - 1) * 100:+7.1f}%  {loadavg()}")
        for r in args.recompute or ("none", "full"):
            pred, meas = predicted_passes(profile, b, r), measured_passes(b, r, args.loops)
            for k in ("F", "B", "I", "W"):
                print(f"{f'block {k} b={b} {r}':>26}  {pred[k] * 1e3:8.3f} {meas[k] * 1e3:8.3f} "
                      f"{(pred[k] / meas[k] - 1) * 100:+7.1f}%  {loadavg()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
