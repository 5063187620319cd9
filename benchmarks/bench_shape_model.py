"""One profile's blocks against blocks it did not measure: the kernel model and the in-step fit (`sim.cost.block_fit`) of one profile, each pass against the blocks other profiles measured at their own shapes.

    python -m exec.profile_device --out /tmp/base.json                    # the profile that predicts
    python -m exec.profile_device --out /tmp/h256.json --hidden 256 --heads 8 --micro-batch 4 --micro-batch 8
    PYTHONPATH=. python benchmarks/bench_shape_model.py /tmp/base.json /tmp/h256.json [more profiles]

For every block row of each other profile (its shape, micro-batch and recompute mode) it
prints the error (%) of F, B, I and W predicted from the first profile: by the kernel model
with the profile's launch cost per kernel (`sim.cost.layer.kernel_layer_times`, what the
planner used before the fit) and by the planner (`sim.cost.layer.layer_times`: the in-step
fit at a shape the first profile did not measure), and the fit itself
(`sim.cost.layer.block_fits`). No run: it reads profiles. A block row measured inside a step
is a slope through three step medians and scatters by 10-20 % between profiles.
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import sim  # noqa: E402
from sim.cost.layer import Slice, block_fits, kernel_layer_times, layer_times  # noqa: E402

PASSES = ("F", "B", "I", "W")


def gpt(hidden: int, heads: int, seq: int, ffn: int) -> sim.Transformer:
    """exec's GPT block of this shape as the planner describes it (`exec.models.spec.ModelSpec.transformer`)."""
    return sim.Transformer(layers=1, hidden=hidden, heads=heads, seq=seq, vocab=512, ffn=ffn, arch="gpt",
                           attention="flash", dropout=False, tied=False, kernels="torch")


def errors(base: sim.DeviceProfile, other: sim.DeviceProfile) -> list[tuple[tuple, dict, dict]]:
    """Per block row of `other`: (its key, kernel model's errors %, the planner's errors %)."""
    out = []
    for key, row in sorted(other.layers.blocks.items()):
        precision, hidden, heads, ffn, seq, b, recompute = key
        m, x = gpt(hidden, heads, seq, ffn), Slice(b, precision=precision)
        k = kernel_layer_times(m, base, x, recompute)
        plain = dict(zip(PASSES, (k.forward, k.backward, k.backward_input, k.backward_weight)))
        plain = {p: base.pass_time(plain[p], k.kernels[p]) for p in PASSES}
        lt = layer_times(m, base, x, recompute)
        fitted = dict(zip(PASSES, (lt.forward, lt.backward, lt.backward_input, lt.backward_weight)))
        out.append((key, {p: (plain[p] / row[p] - 1) * 100 for p in PASSES},
                    {p: (fitted[p] / row[p] - 1) * 100 for p in PASSES}))
    return out


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 2:
        print("bench_shape_model: give the predicting profile, then one or more profiles to check", file=sys.stderr)
        return 2
    try:
        base, others = sim.load_profile(args[0]), [sim.load_profile(a) for a in args[1:]]
    except (OSError, ValueError) as e:
        print(f"bench_shape_model: {e}", file=sys.stderr)
        return 2
    model = gpt(*next(iter(base.layers.shapes()), ("fp32", 128, 4, 512, 64))[1:3], 64, 512)
    for p, f in block_fits(model, base).items():
        print(f"fit {p}: slowdown {f.slowdown:.2f}, {f.per_kernel * 1e6:.1f} us a kernel (launch "
              f"{base.launch_per_kernel * 1e6:.1f}), {f.rows} rows, largest residual {f.residual * 100:.0f} %")
    print(f"{'shape':>24}  {'kernel model F / B / I / W %':>30}  {'planner (fit) F / B / I / W %':>30}")
    fitted_all = []
    for other in others:
        for (_, h, a, _, s, b, rc), plain, fitted in errors(base, other):
            if (h, a, s) in {(k[1], k[2], k[4]) for k in base.layers.blocks}:
                continue  # the base measured this shape: the planner takes its row
            fitted_all += [abs(v) for v in fitted.values()]
            print(f"{f'h{h} a{a} s{s} b{b} {rc}':>24}  {' / '.join(f'{plain[p]:+4.0f}' for p in PASSES):>30}  "
                  f"{' / '.join(f'{fitted[p]:+4.0f}' for p in PASSES):>30}")
    if fitted_all:
        print(f"planner: median |error| {statistics.median(fitted_all):.1f} %, worst {max(fitted_all):.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
