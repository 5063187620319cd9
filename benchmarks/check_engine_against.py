"""Check that the engine of this tree simulates exactly what the engine of an earlier commit
did, on random configurations: every event, the memory and activation series, the busy
times and the makespan, to 1e-12 relative.

    python benchmarks/check_engine_against.py 29fe587            # 300 configurations, seed 0
    python benchmarks/check_engine_against.py 29fe587 --seed 3 -n 1000
    python benchmarks/check_engine_against.py 1eda15a --all    # every difference, and a count

The earlier `sim` is taken from git (`git archive REV sim`) into a temporary folder and
imported as `oldsim`; both run the same named schedules and hand-built schedules with
several stages per rank and split backwards, compute-only or lowered, under the same
random costs. `--extras` more configurations (default 100) draw what those do not: the
other named schedules (zero bubble, interleaved, V-shaped, DualPipeV with overlapped
pairs), the passes that add actions beside the devices (gradient reductions, offload,
FSDP), rule 19's first compute, and measured `durations`. Exit status 1 at the first
configuration that differs (printed); with
`--all`, each one that differs is printed with whether each engine's links deliver
their transfers in the order the SENDs were issued (rules 6 and 10), and the status is
1 if any did.
"""
import argparse
import math
import os
import random
import re
import subprocess
import sys
import tempfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
import sim  # noqa: E402
from sim.schedule.textbook import gpipe_on  # noqa: E402


def import_old(rev: str):
    folder = tempfile.mkdtemp(prefix="oldsim-")
    archive = subprocess.run(["git", "-C", ROOT, "archive", rev, "sim"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", folder], input=archive, check=True)
    os.rename(os.path.join(folder, "sim"), os.path.join(folder, "oldsim"))
    # its absolute imports (`from sim.engine import ...`) must name the old package too
    for here, _, files in os.walk(os.path.join(folder, "oldsim")):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(here, name)
                with open(path) as f:
                    text = f.read()
                text = re.sub(r"^(\s*)(from|import) sim\b", r"\1\2 oldsim", text, flags=re.M)
                with open(path, "w") as f:
                    f.write(text)
    sys.path.insert(0, folder)
    import oldsim
    return oldsim


def gpipe_like(mod, placement, micro_batches, split):
    """`sim.schedule.textbook.gpipe_on`, handed to `mod` (this tree's sim or the earlier one) as text."""
    s = gpipe_on(placement, micro_batches, split, name="custom")
    return mod.Schedule([[str(a) for a in p] for p in s.programs], placement, micro_batches, name=s.name)

def key(r):
    ev = sorted((e.rank, str(e.action), e.start, e.end, e.peer) for e in r.events)
    return (r.makespan, r.t0, ev, [list(map(tuple, m)) for m in r.memory], [list(map(tuple, a)) for a in r.activations], r.busy(), str(r.schedule))

def close(a, b):
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(close(x, y) for x, y in zip(a, b))
    if isinstance(a, float):
        return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-9)
    return a == b

def in_send_order(r) -> bool:
    """Whether every link of run `r` delivers its transfers in the order their SENDs were issued."""
    links = {}
    for e in r.events:
        if e.action.kind.name.startswith("SEND"):
            links.setdefault((e.rank, e.peer), []).append(e)
    return all(b.end >= a.end - 1e-12 for xs in links.values()
               for a, b in zip(sorted(xs, key=lambda e: e.start), sorted(xs, key=lambda e: e.start)[1:]))

EXTRA_SCHEDULES = ["zb-h1", "zb-h2", "zbv", "interleaved-1f1b", "interleaved-zb", "looped-bfs", "v-half", "dualpipev"]


def extra_config(rnd: random.Random):
    """One configuration of what the main draw leaves out: (make(mod) -> schedule or None
    where the generator refuses the sizes, Costs keywords, durations (action text -> time) or None)."""
    name, p, m = rnd.choice(EXTRA_SCHEDULES), rnd.randint(1, 4), rnd.randint(1, 10)
    overlap = name == "dualpipev" and rnd.random() < 0.7
    passes = [x for x in ("grad_reduce", "offload", "fsdp") if rnd.random() < 0.3]
    grad_overlap = rnd.random() < 0.5

    def make(mod):
        try:
            s = mod.make_schedule(name, p, m, **({"overlap": True} if overlap else {}))
        except ValueError:  # ScheduleError: these sizes are refused (by both trees alike)
            return None
        if "grad_reduce" in passes:
            s = mod.add_grad_reduce(s, grad_overlap)
        if "offload" in passes:
            s = mod.add_offload(s)
        if "fsdp" in passes:
            s = mod.add_fsdp(s)
        return s

    n = 2 * p  # model stages of the V-shaped and interleaved ones (V = 2); the others take the first p
    per = lambda lo, hi: [rnd.uniform(lo, hi) for _ in range(n)]  # noqa: E731
    kw = dict(forward=per(0.05, 3), backward=per(0.05, 3), backward_input=per(0.05, 3), backward_weight=per(0.05, 3),
              latency=rnd.choice([0.0, 0.01, 0.3]), bandwidth=rnd.choice([math.inf, 1e3]),
              activation_bytes_sent=rnd.choice([0.0, 10.0]), activation_bytes=per(1e8, 1e9),
              a2a_forward=per(0, 1), a2a_backward=per(0, 1), grad_reduce=per(0, 2), offload=per(0, 1),
              reload=per(0, 1), offload_bytes=per(0, 1e8), unshard=per(0, 1), unshard_bytes=per(0, 1e8),
              first_compute=rnd.choice([0.0, 0.5]), first_compute_tau=rnd.choice([0.0, 0.7]),
              before_compute=rnd.choice([0.0, 0.01]), after_compute=rnd.choice([0.0, 0.02]))
    times = rnd.random() < 0.3
    return name, make, kw, times


def costs_for(mod, kw: dict, stages: int):
    """`mod.Costs` of `kw`, its per-stage lists cut to `stages`."""
    return mod.Costs(**{k: v[:stages] if isinstance(v, list) else v for k, v in kw.items()})


def check_extras(oldsim, rnd: random.Random, n: int) -> int:
    """Compare `n` configurations of `extra_config`; return how many differ (printed)."""
    differ = compared = 0
    for i in range(n):
        name, make, kw, times = extra_config(rnd)
        so, sn = make(oldsim), make(sim)
        assert (so is None) == (sn is None), name
        if sn is None:
            continue
        durations = {a: rnd.uniform(0.05, 2) for prog in sn.programs for a in prog if a.kind.is_compute} if times else None
        old_durations = durations and {oldsim.Action(*a): t for a, t in durations.items()}
        ro = oldsim.simulate(so, costs_for(oldsim, kw, so.stages), old_durations)
        rn = sim.simulate(sn, costs_for(sim, kw, sn.stages), durations)
        compared += 1
        if not close(key(ro), key(rn)):
            differ += 1
            print("DIFF extra", i, name, sn.stages, sn.micro_batches, kw)
    print(f"{compared - differ} of {compared} extra configs identical ({n - compared} refused by both trees)")
    return differ


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rev", help="the git revision whose engine to compare with")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-n", type=int, default=300, help="configurations")
    ap.add_argument("--all", action="store_true", help="go on past a difference; count them")
    ap.add_argument("--extras", type=int, default=100, help="configurations of what the main draw leaves out")
    args = ap.parse_args()
    oldsim = import_old(args.rev)
    rnd, n, differ = random.Random(args.seed), args.n, 0
    for i in range(n):
        kind = rnd.random()
        if kind < 0.6:
            name = rnd.choice(["naive", "gpipe", "1f1b"]); p = rnd.randint(1, 7); m = rnd.randint(1, 12)
            mk = lambda mod: mod.make_schedule(name, p, m)
        else:
            pl = rnd.choice([[0, 1, 0, 1], [0, 1, 1, 0], [0, 0, 1], [1, 0, 2, 2, 0, 1], [0, 1, 2, 3]])
            p = len(pl); m = rnd.randint(1, 6); split = rnd.random() < 0.5
            mk = lambda mod: gpipe_like(mod, pl, m, split)
        kw = dict(
            forward=[rnd.uniform(0.05, 3) for _ in range(p)], backward=[rnd.uniform(0.05, 3) for _ in range(p)],
            latency=rnd.choice([0.0, 0.01, 0.3, 2.0]), bandwidth=rnd.choice([math.inf, 1e3, 50.0]),
            activation_bytes_sent=rnd.choice([0.0, 10.0, 200.0]),
            activation_bytes=[rnd.uniform(0, 1e9) for _ in range(p)], static_bytes=[rnd.uniform(0, 1e10) for _ in range(p)],
            send_overhead=rnd.choice([0.0, 0.02, 0.5]), recv_overhead=rnd.choice([0.0, 0.03, 0.4]),
            arrive_overhead=rnd.choice([0.0, 0.04, 0.3]), io_tick=rnd.choice([0.0, 0.05, 0.7, math.inf]),
            before_compute=rnd.choice([0.0, 0.01, 0.2]), after_compute=rnd.choice([0.0, 0.02, 0.3]))
        if rnd.random() < 0.5:
            kw["backward_input"] = [rnd.uniform(0.05, 3) for _ in range(p)]
            kw["backward_weight"] = [rnd.uniform(0.05, 3) for _ in range(p)]
        lowered = rnd.random() < 0.3
        so, sn = mk(oldsim), mk(sim)
        if lowered:
            so, sn = oldsim.lower(so), sim.lower(sn)
        ro = oldsim.simulate(so, oldsim.Costs(**kw)); rn = sim.simulate(sn, sim.Costs(**kw))
        ko, kn = key(ro), key(rn)
        if not close(ko, kn):
            differ += 1
            for a, b, nm in zip(ko, kn, ["makespan", "t0", "events", "memory", "acts", "busy", "sched"]):
                if a != b: print("DIFF", i, nm, kw); break
            if not args.all:
                sys.exit(1)
            print(f"  links in SEND order: {args.rev} {in_send_order(ro)}, this tree {in_send_order(rn)}; "
                  f"makespan {ro.makespan:.6g} -> {rn.makespan:.6g}")
    print(f"{n - differ} of {n} configs identical")
    differ += check_extras(oldsim, random.Random(args.seed + 1_000_003), args.extras)
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
