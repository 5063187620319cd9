"""How fast is `sim.simulate`? Compared, in the same run, with a minimal hand-written SimPy
model of the same training step.

    python benchmarks/bench_sim.py                      # 1F1B, p=64, m=1024, latency 0.1
    python benchmarks/bench_sim.py --stages 8 --micro 64 --repeat 9
    python benchmarks/bench_sim.py --against 29fe587           # and the simulator of that commit, same run

The minimal model is what one would write by hand to get the makespan of 1F1B and
nothing else: one SimPy process per device that runs its computes in 1F1B order, and
one SimPy event per transfer (scheduled `latency` after the send; the receiver yields
on it if it is not there yet). No validation, no lowering, no event record, no memory.
Both use the same costs: F = 1, B = 2, `--latency` per transfer, free bandwidth.

`sim.simulate` does more: it validates the schedule (completeness, lowering to SEND/RECV
actions, deadlock check), runs the lowered program under the documented rules
(rendezvous, FIFO links, receives posted one compute early) and records every compute
and transfer and each device's memory. The script checks that both give the same
makespan (they are independent computations), times them alternately `--repeat` times
(CPU time of this process) and prints the medians, with the phases of `sim.simulate`
timed separately, and the ratio of `sim.simulate` (with `make_schedule`) to the minimal
model as written (the target: at most `TARGET`). `sim.simulate` switches Python's garbage
collector off while it runs, so the minimal model is timed both with it (as written) and
without it.
Results and explanation: docs/performance.md.
"""
from __future__ import annotations

import argparse
import gc
import math
import os
import platform
import statistics
import sys
import time

import simpy

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import sim  # noqa: E402
from sim.engine import core as engine  # noqa: E402
from sim.passes.checks import check_complete  # noqa: E402
from sim.passes.numbering import number_program  # noqa: E402


# CPU time of this process: other work on the machine slows it much less than it slows
# the wall clock (it still does somewhat, through shared caches).
clock = time.process_time
TARGET = 0.3  # sim.simulate's time over the minimal model's, at p=64, m=1024 (issue 47)


# --- the minimal hand-written model ------------------------------------------------------

def minimal_1f1b(p: int, m: int, forward: float = 1.0, backward: float = 2.0, latency: float = 0.1) -> float:
    """The makespan of one 1F1B step of `p` stages and `m` micro-batches, by the shortest
    SimPy model we could write: a process per device, one event per transfer."""
    env = simpy.Environment()
    # arrivals[(kind, stage, micro)]: the event "the input of that compute is on its
    # device". Made by whichever side comes first; the sender schedules it `latency`
    # after the send (what simpy.Timeout does in its constructor), the receiver yields on it.
    arrivals: dict[tuple[str, int, int], simpy.Event] = {}

    def arrival(key):
        ev = arrivals.get(key)
        if ev is None:
            ev = arrivals[key] = simpy.Event(env)
        return ev

    def send(key):
        ev = arrival(key)
        ev._ok, ev._value = True, None
        env.schedule(ev, delay=latency)

    def device(s: int):
        warmup = min(p - s - 1, m)
        order = [("F", i) for i in range(warmup)]
        for i in range(m - warmup):
            order += [("F", warmup + i), ("B", i)]
        order += [("B", i) for i in range(m - warmup, m)]
        for kind, i in order:
            if kind == "F":
                if s > 0:
                    ev = arrival(("F", s, i))
                    if not ev.processed:
                        yield ev
                yield env.timeout(forward)
                if s < p - 1:
                    send(("F", s + 1, i))
            else:
                if s < p - 1:
                    ev = arrival(("B", s, i))
                    if not ev.processed:
                        yield ev
                yield env.timeout(backward)
                if s > 0:
                    send(("B", s - 1, i))

    for s in range(p):
        env.process(device(s))
    env.run()
    return env.now


# --- sim.simulate, whole and by phase ----------------------------------------------------

def run_sim(p: int, m: int, costs: sim.Costs) -> float:
    return sim.simulate(sim.make_schedule("1f1b", p, m), costs).makespan


def run_sim_phases(p: int, m: int, costs: sim.Costs) -> dict[str, float]:
    """The same work as `sim.simulate` (with the garbage collector off, as it does), with a
    clock between the phases; then the two things a Result makes only on demand."""
    gc.disable()
    t0 = clock()
    schedule = sim.make_schedule("1f1b", p, m)
    t1 = clock()
    check_complete(schedule)
    t2 = clock()
    stage_costs = costs.for_stages(schedule.stages)
    program = number_program(schedule)
    t3 = clock()
    engine.run(program, stage_costs)
    t4 = clock()
    r = sim.simulate(schedule, costs)
    t5 = clock()
    r.events
    t6 = clock()
    r.schedule
    t7 = clock()
    gc.enable()
    return {"generate": t1 - t0, "check": t2 - t1, "steps": t3 - t2, "engine": t4 - t3,
            "events": t6 - t5, "lowered": t7 - t6}


def timed(fn, *args, collect: bool = True) -> float:
    gc.collect()
    if not collect:
        gc.disable()
    t = clock()
    fn(*args)
    t = clock() - t
    gc.enable()
    return t


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--devices", "--stages", "-p", dest="devices", type=int, default=64,
                    help="pipeline devices (--stages: alias of --devices)")
    ap.add_argument("--micro-batches", "--micro", "-m", dest="micro_batches", type=int, default=1024,
                    help="micro-batches per step (--micro: alias of --micro-batches)")
    ap.add_argument("--latency", type=float, default=0.1)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--against", metavar="REV", help="also time sim.simulate as of git revision REV, in the same run")
    args = ap.parse_args(argv)
    p, m = args.devices, args.micro_batches
    costs = sim.Costs(forward=1.0, backward=2.0, latency=args.latency)

    # cross-check: two independent computations of the same makespan
    ours = run_sim(p, m, costs)
    mine = minimal_1f1b(p, m, 1.0, 2.0, args.latency)
    print(f"1F1B p={p} m={m} latency={args.latency}: makespan sim.simulate {ours!r}, minimal model {mine!r}")
    if not math.isclose(ours, mine, rel_tol=1e-12, abs_tol=1e-9):
        raise SystemExit("the two models disagree on the makespan")
    if args.latency == 0:  # and a third one, by hand: m + p - 1 slots of F + B
        assert math.isclose(ours, (m + p - 1) * 3.0, rel_tol=1e-12), ours

    times: dict[str, list[float]] = {"minimal": [], "minimal, gc off": [], "simulate": [], "against": []}
    old = None
    if args.against:
        from check_engine_against import import_old
        old = import_old(args.against)
        old_costs = old.Costs(forward=1.0, backward=2.0, latency=args.latency)
        assert math.isclose(old.simulate(old.make_schedule("1f1b", p, m), old_costs).makespan, ours, rel_tol=1e-12)
    phases: dict[str, list[float]] = {}
    for _ in range(args.repeat):  # alternate, so that load from elsewhere hits both alike
        times["minimal"].append(timed(minimal_1f1b, p, m, 1.0, 2.0, args.latency))
        times["simulate"].append(timed(run_sim, p, m, costs))
        if old is not None:
            times["against"].append(timed(lambda: old.simulate(old.make_schedule("1f1b", p, m), old_costs)))
        times["minimal, gc off"].append(timed(minimal_1f1b, p, m, 1.0, 2.0, args.latency, collect=False))
        gc.collect()
        for k, v in run_sim_phases(p, m, costs).items():
            phases.setdefault(k, []).append(v)

    base = statistics.median(times["minimal"])
    rows = [("minimal SimPy model (makespan only)", base),
            ("minimal SimPy model, garbage collector off", statistics.median(times["minimal, gc off"])),
            ("sim.simulate, whole", statistics.median(times["simulate"])),
            *([(f"sim.simulate as of {args.against}", statistics.median(times["against"]))] if old else []),
            ("  make_schedule (1F1B generator)", statistics.median(phases["generate"])),
            ("  check_complete", statistics.median(phases["check"])),
            ("  number_program (lowering rules)", statistics.median(phases["steps"])),
            ("  engine run (it is the deadlock check)", statistics.median(phases["engine"])),
            ("on demand: result.events (389k records)", statistics.median(phases["events"])),
            ("on demand: result.schedule (lowered)", statistics.median(phases["lowered"]))]
    print(f"\nPython {platform.python_version()}, simpy {simpy.__version__}, {os.cpu_count()} CPUs, "
          f"median of {args.repeat} runs\n")
    print(f"| {'model':<46} | {'median s':>8} | {'/ minimal':>9} |")
    print(f"|{'-' * 48}|{'-' * 10}:|{'-' * 10}:|")
    for name, t in rows:
        print(f"| {name:<46} | {t:8.3f} | {t / base:9.2f} |")
    ours = statistics.median(times["simulate"])
    print(f"\nsim.simulate / minimal SimPy model = {ours:.3f} s / {base:.3f} s = {ours / base:.2f} (target: <= {TARGET}); "
          f"against the minimal model with the garbage collector off, as sim.simulate runs: "
          f"{ours / statistics.median(times['minimal, gc off']):.2f}")


if __name__ == "__main__":
    main()
