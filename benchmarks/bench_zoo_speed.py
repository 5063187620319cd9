"""How fast is the simulation of a big interleaved 1F1B step, against torch's own lowering of it?

    python benchmarks/bench_zoo_speed.py                       # P=32, V=2, M=256, 5 rounds
    python benchmarks/bench_zoo_speed.py --stages 8 --micro 64 --repeat 3

Ours: `sim.simulate` of `make_schedule("interleaved-1f1b", P, M, V)` with real durations:
unequal per-stage costs (F, B, activation sizes drawn from a seeded generator), a latency
and a bandwidth on every transfer, memory counted, under the default "gloo-cpu" transport
and once more under "ideal". The schedule's generation and its lowering to SEND/RECV
(`sim.lower`, what `simulate` does inside, as its plan) are timed on their own too.

torch's: `torch.distributed.pipelining._schedule_visualizer.get_schedule_ops(
"Interleaved1F1B", P, M, num_stages_per_rank=V, with_comms=True)`: the same schedule's
order and its lowering to SEND/RECV actions, with no times at all (unit steps) and no
memory. It is less work than ours: a simulation also times every action.

Every round runs each of them once, one after the other in this process (so that the
machine's load hits them alike); the table gives the medians of CPU time (process_time).
"""
from __future__ import annotations

import argparse
import gc
import os
import platform
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import sim  # noqa: E402

clock = time.process_time  # CPU time: another process's load slows it less than the wall clock


def real_costs(stages: int, transport: str, seed: int = 0) -> sim.Costs:
    """Unequal per-stage costs (up to 20 % apart), 1 MB sent per micro-batch at 10 GB/s
    after a latency of 5 % of a forward, 10 MB of activations held: "real durations"."""
    rng = random.Random(seed)
    return sim.Costs(forward=[1 + 0.2 * rng.random() for _ in range(stages)],
                     backward=[2 + 0.4 * rng.random() for _ in range(stages)],
                     latency=0.05, bandwidth=1e10, activation_bytes_sent=1e6,
                     activation_bytes=[1e7 * (1 + 0.2 * rng.random()) for _ in range(stages)],
                     weight_bytes=1e8, transport=transport)


def timed(fn) -> tuple[float, object]:
    gc.collect()
    t = clock()
    out = fn()
    return clock() - t, out


def torch_ops(p: int, m: int, v: int):
    from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops
    return get_schedule_ops("Interleaved1F1B", p, m, num_stages_per_rank=v, with_comms=True)


def one_round(p: int, m: int, v: int, costs: dict[str, sim.Costs]) -> dict[str, float]:
    """One timing of each thing, in turn; checks what each made."""
    out: dict[str, float] = {}
    out["generate"], schedule = timed(lambda: sim.make_schedule("interleaved-1f1b", p, m, v))
    out["lower"], lowered = timed(lambda: sim.lower(schedule))
    for name, c in costs.items():
        out[name], result = timed(lambda: sim.simulate(sim.make_schedule("interleaved-1f1b", p, m, v), c))
        assert result.makespan > 0 and len(result.peak_memory) == p
    out["torch"], ops = timed(lambda: torch_ops(p, m, v))
    ours = sum(len(prog) for prog in lowered.programs)
    theirs = sum(a is not None for rank in ops for a in rank)
    out["actions"], out["torch actions"] = ours, theirs
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", "--stages", "-p", dest="devices", type=int, default=32,
                    help="pipeline devices (--stages: alias of --devices)")
    ap.add_argument("--virtual", "-v", type=int, default=2)
    ap.add_argument("--micro-batches", "--micro", "-m", dest="micro_batches", type=int, default=256,
                    help="micro-batches per step (--micro: alias of --micro-batches)")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    p, v, m = args.devices, args.virtual, args.micro_batches
    costs = {t: real_costs(p * v, t) for t in ("gloo-cpu", "ideal")}
    load = os.getloadavg()
    rounds = [one_round(p, m, v, costs) for _ in range(args.repeat)]
    med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    torch_s = med["torch"]
    import torch
    print(f"interleaved 1F1B, P={p}, V={v}, M={m}: {int(med['actions'])} lowered actions "
          f"(torch's: {int(med['torch actions'])}); median CPU seconds of {args.repeat} rounds; "
          f"Python {platform.python_version()}, torch {torch.__version__}, {os.cpu_count()} CPUs, "
          f"load average {load[0]:.1f} before, {os.getloadavg()[0]:.1f} after\n")
    rows = [("sim.make_schedule (generation)", "generate"), ("sim.lower (SEND/RECV added)", "lower"),
            ('sim.simulate, generation included, transport "gloo-cpu"', "gloo-cpu"),
            ('sim.simulate, generation included, transport "ideal"', "ideal"),
            ("torch get_schedule_ops(with_comms=True)", "torch")]
    print(f"| {'what':<56} | median s | torch's / this |")
    print(f"|{'-' * 58}|---------:|---------------:|")
    for label, k in rows:
        print(f"| {label:<56} | {med[k]:8.3f} | {torch_s / med[k]:14.1f} |")
    ratio = torch_s / med["gloo-cpu"]
    print(f"\nsimulation (gloo-cpu) {ratio:.1f}x faster than torch's lowering (aim: 10x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
