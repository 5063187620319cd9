"""What several test modules share: an independent model of the rules (docs/rules.md)
to check the engine against, a count of calls in place of a time limit, a command line
run in this process, and a fresh import that says what it pulls in."""
import contextlib
import importlib
import importlib.abc
import io
import math
import os
import subprocess
import sys
from collections import Counter

import pytest

import sim
from sim import KINDS, Action, Kind, Role, Schedule
from sim.passes.dependencies import peer


@contextlib.contextmanager
def counting_calls(*functions):
    """Within the block, count the calls of each of `functions` in this thread (a Counter
    keyed by function), so a test says "refused before any simulation" by a count of
    zero rather than by a time limit. Calls are matched by their code, so a function is
    counted wherever it is imported from."""
    codes = {f.__code__: f for f in functions}
    counts = Counter({f: 0 for f in functions})
    previous = sys.getprofile()

    def profile(frame, event, arg):
        if event == "call" and frame.f_code in codes:
            counts[codes[frame.f_code]] += 1
    sys.setprofile(profile)
    try:
        yield counts
    finally:
        sys.setprofile(previous)


def run_main(main, *args: str) -> subprocess.CompletedProcess:
    """A command line's `main(argv)` run in this process as the shell would run it: its exit
    status (what it returns, or the code of the `SystemExit` it raises: 2 for a refusal,
    0 after --help), all it printed to stdout and to stderr, at the width a pipe gets (80
    columns), so a test needs no subprocess."""
    out, err, columns = io.StringIO(), io.StringIO(), os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "80"
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as e:
                code = e.code
    finally:
        if columns is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = columns
    return subprocess.CompletedProcess(list(args), code or 0, out.getvalue(), err.getvalue())


def one_line(proc: subprocess.CompletedProcess, code: int, *words: str) -> str:
    """The one line on stderr of a command that ended with `code`, holding each of `words`."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == code, proc.stderr
    assert len(lines) == 1, proc.stderr
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


class _Refuse(importlib.abc.MetaPathFinder):
    def __init__(self, names):
        self.names, self.asked = set(names), set()

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.names:
            self.asked.add(name.split(".")[0])
            raise ImportError(f"{name} may not be imported here")
        return None


@contextlib.contextmanager
def refusing(*names: str, fresh=("sim", "exec")):
    """Within the block, this process as a new interpreter would be for `fresh` (sim, exec:
    imported afresh) and `names` (torch: not imported yet), with any import of `names`
    failing; yields the set of those that something tried to import (even inside `try`).
    This process's own copies of `fresh` and `names` are put back afterwards, so other
    tests see nothing of it."""
    ours = set(fresh) | set(names)
    mine = lambda name: name.split(".")[0] in ours  # noqa: E731
    saved = {name: m for name, m in sys.modules.items() if mine(name)}
    refuse = _Refuse(names)
    for name in saved:
        del sys.modules[name]
    sys.meta_path.insert(0, refuse)
    try:
        yield refuse.asked
    finally:
        sys.meta_path.remove(refuse)
        for name in [n for n in sys.modules if mine(n)]:
            del sys.modules[name]
        sys.modules.update(saved)


def fresh_import(*modules: str, refuse=("torch",)) -> set[str]:
    """Import `modules` (sim, exec, ...) afresh, as a new interpreter would, and return which
    of the packages `refuse` they tried to import (see `refusing`)."""
    with refusing(*refuse, fresh={m.split(".")[0] for m in modules}) as asked:
        for m in modules:
            try:
                importlib.import_module(m)
            except ImportError:
                if not asked:  # failed for a reason of its own
                    raise
    return asked


def reference_times(schedule, costs):
    """The end of every compute, collective and copy under the rules (`reference_run`)."""
    return reference_run(schedule, costs)[1]


def reference_run(schedule, costs):
    """The rules of docs/rules.md computed directly, without SimPy, for infinite bandwidth:
    walk every rank's lowered program, advancing whichever rank can advance. Returns the
    end of every compute.

    Unlike the engine, which looks ahead in the sender's program when a ready notice comes
    in late (rule 10), this records the windows in which each rank's transport thread may
    run (a SEND call's start, a wait for data and its taking in, the end) as the ranks
    advance, and finds the first one at or after the notice. With the `ideal` transport
    the data leaves as the SEND is issued. What each kind does comes from `sim.KINDS`.
    A collective (REDUCE_GRAD) does not hold its rank: it runs on the rank's own stream,
    one at a time, from the later of its issue, the end of every backward (B or W) of its
    stage and the end of the collective before it, for its stage's `grad_reduce`.
    A copy (OFFLOAD, RELOAD) does not hold its rank either: it runs on its rank's copy
    engine for its direction, one at a time, from the later of its issue, the end of the
    copy before it there and the end of what it needs (a RELOAD's OFFLOAD); a backward
    whose activations a RELOAD brings back starts no earlier than that RELOAD's end.
    A compute takes its cost and its `comm` (the expert all-to-all); at an OVERLAP_F_B mark
    the rank waits until the input of the backward it names has arrived, and the pair's F
    takes F + max(0, a_F - B), its backward B + max(0, a_B - F) (rule 18).
    An UNSHARD runs on its rank's all-gather stream, one at a time, from the later of its
    issue and the end of the gather before it, for its stage's `unshard`; a compute starts
    no earlier than its stage's latest UNSHARD's end, and a RESHARD takes no time.
    Returns (start, end) of each of them, as two dicts."""
    low = sim.lower(schedule) if not schedule.is_lowered else schedule
    c = costs.for_stages(low.stages)
    role = {k: spec.role for k, spec in KINDS.items()}
    rendezvous = c.transport != "ideal"
    clock = [0.0] * low.ranks           # when each rank is free
    stream = [0.0] * low.ranks          # when each rank's collective stream is free
    engines = [{"to host": 0.0, "from host": 0.0} for _ in range(low.ranks)]  # each rank's copy engines
    gathers = [0.0] * low.ranks         # when each rank's all-gather stream is free (rule 16)
    gathered = {}                       # stage -> the end of its latest UNSHARD
    computes = {a for p in low.programs for a in p if a.kind.is_compute}
    duration = _durations(low, c, computes)
    start = {}
    windows = [[] for _ in range(low.ranks)]  # (from, to): its transport thread may run; to=None: open
    sent, posted, left, end = {}, {}, {}, {}
    pc = [0] * low.ranks
    started = [False] * low.ranks  # whether each rank has started its first compute (rule 19)

    def notice_at(x):
        return posted[x] + c.latency

    def leaves(x, stalled=False):
        """When the data of the transfer into RECV x leaves its sender, if known yet."""
        if x in left or x not in sent or (rendezvous and x not in posted):
            return left.get(x)
        if not rendezvous or notice_at(x) <= sent[x]:  # the sender saw the notice when it issued the SEND
            left[x] = sent[x]
            return left[x]
        n = notice_at(x)
        for lo, hi in windows[low.placement[peer(x).stage]]:
            if hi is None and lo < n and not stalled:
                return None  # it waits since before the notice: till when is not known yet
            if hi is None or hi >= n:
                wait = max(lo, n) - n
                tick = c.io_tick
                # the expected min(wait, U) for U uniform on [0, tick] (the tick's phase)
                expected = wait - wait * wait / (2 * tick) if wait < tick else tick / 2
                left[x] = n + expected
                return left[x]
        return None

    def inputs(r, a):
        """The RECVs compute `a` takes its inputs from and when their data leaves; None
        while one is not known yet, and rank r waits (a window open from now)."""
        recvs = [x for x in posted if x.stage == a.stage and x.micro == a.micro and x not in end
                 and a.kind in KINDS[x.kind].feeds]
        out = [leaves(x) for x in recvs]
        if None in out:
            if not windows[r] or windows[r][-1] != (clock[r], None):
                windows[r].append((clock[r], None))  # it waits
            return None
        if windows[r] and windows[r][-1] == (clock[r], None):
            windows[r].pop()  # what it waited for is known: the window closes where it goes on
        return recvs, out

    changed = True
    while True:
        while changed:
            changed = False
            for r, prog in enumerate(low.programs):
                while pc[r] < len(prog):
                    a = prog[pc[r]]
                    if role[a.kind] is Role.SEND:
                        windows[r].append((clock[r], clock[r]))  # it yields the core first
                        sent[peer(a)] = clock[r]
                        clock[r] += c.send_overhead
                    elif role[a.kind] is Role.RECV:
                        posted[a] = clock[r]
                        clock[r] += c.recv_overhead
                    elif role[a.kind] is Role.COLLECTIVE:
                        backwards = [t for x, t in end.items() if x.stage == a.stage and x.kind in (Kind.B, Kind.W)]
                        assert len(backwards) == low.micro_batches, f"{a} comes before its stage's backwards"
                        start[a] = max([clock[r], stream[r]] + backwards)
                        end[a] = stream[r] = start[a] + c.grad_reduce[a.stage]
                    elif role[a.kind] is Role.PAIR:  # it waits for the input of the backward it names
                        b = Action(a.stage, Kind.I if Action(a.stage, Kind.I, a.micro) in computes else Kind.B, a.micro)
                        got = inputs(r, b)
                        if got is None:
                            break
                        here = max([clock[r]] + [t + c.latency for t in got[1]])
                        if got[0]:
                            windows[r].append((clock[r], here))
                        clock[r] = here
                    elif role[a.kind] is Role.COPY:
                        spec = KINDS[a.kind]
                        needed = [end[Action(*d)] for d in spec.needs(a.stage, a.micro, low.stages, computes)]
                        start[a] = max([clock[r], engines[r][spec.stream]] + needed)
                        end[a] = engines[r][spec.stream] = start[a] + getattr(c, spec.cost)[a.stage]
                    elif a.kind is Kind.UNSHARD:
                        start[a] = max(clock[r], gathers[r])
                        end[a] = gathers[r] = gathered[a.stage] = start[a] + c.unshard[a.stage]
                    elif a.kind is Kind.RESHARD:
                        start[a] = end[a] = max(clock[r], gathered[a.stage])
                    else:
                        got = inputs(r, a)
                        if got is None:
                            break
                        recvs, out = got
                        for x in recvs:
                            end[x] = True
                        ready = max([clock[r]] + [t + c.latency for t in out]) + c.arrive_overhead * len(recvs)
                        if recvs:
                            windows[r].append((clock[r], ready))
                        start[a] = ready + c.before_compute + (0.0 if started[r] else _first(c, duration[a]))
                        started[r] = True
                        reload = Action(a.stage, Kind.RELOAD, a.micro)
                        if a.kind in KINDS[Kind.RELOAD].feeds and reload in end:
                            start[a] = max(start[a], end[reload])
                        start[a] = max(start[a], gathered.get(a.stage, 0.0))  # its stage's gather (rule 16)
                        end[a] = start[a] + duration[a]
                        clock[r] = end[a] + c.after_compute
                    pc[r] += 1
                    changed = True
                if pc[r] == len(prog) and (not windows[r] or windows[r][-1][1] != math.inf):
                    windows[r].append((clock[r], math.inf))  # done: it waits for its sends
        if all(pc[r] == len(p) for r, p in enumerate(low.programs)):
            kept = (Role.COMPUTE, Role.COLLECTIVE, Role.COPY, Role.GATHER)
            return start, {a: t for a, t in end.items() if role[a.kind] in kept}
        # Stuck: every rank left waits on a transfer whose notice came while its sender
        # was waiting. Each of those waits lasts past the earliest such notice (everything
        # it waits for comes after it), so that transfer leaves at its notice.
        pending = [x for x in posted if x in sent and x not in left]
        assert pending, "the reference got stuck without a pending transfer"
        leaves(min(pending, key=notice_at), stalled=True)
        changed = True


def _first(c, d: float) -> float:
    """Rule 19, written out again: the first compute's excess, the deficit most / tau e^(-t / tau)
    integrated over its duration d (most itself where tau is 0)."""
    tau = c.first_compute_tau
    return c.first_compute * (1.0 - math.exp(-d / tau)) if tau > 0 else c.first_compute


def _durations(low, c, computes):
    """Each compute's time: its cost and its all-to-all, or its share of its pair's."""
    def alone(a, with_comm=True):
        spec = KINDS[a.kind]
        return getattr(c, spec.cost)[a.stage] + (getattr(c, spec.comm)[a.stage] if spec.comm and with_comm else 0.0)
    duration = {a: alone(a) for a in computes}
    for prog in low.programs:
        for i, mark in enumerate(prog):
            if mark.kind is Kind.OVERLAP_F_B:
                f = next(a for a in prog[i:] if a.kind.is_compute)
                b = next(a for a in prog[i:] if a.kind.is_backward)
                fc, bc = alone(f, False), alone(b, False)
                duration[f] = fc + max(0.0, alone(f) - fc - bc)
                duration[b] = bc + max(0.0, alone(b) - bc - fc)
    return duration


def assert_matches_reference(schedule, costs):
    """Simulate `schedule` and check every compute's, collective's and copy's end, and the
    makespan, against `reference_times`; returns the `sim.Result`."""
    r = sim.simulate(schedule, costs)
    ref = reference_times(schedule, costs)
    for e in r.events:
        if e.is_compute or e.is_collective or e.is_copy:
            assert e.end == pytest.approx(ref[e.action], rel=1e-9, abs=1e-9), str(e.action)
    assert r.t0 + r.makespan == pytest.approx(max(ref.values()))
    return r


def reference_peak_memory(schedule, costs):
    """Per rank, the most bytes it holds, from `reference_run`'s starts and ends and the
    memory effects of the kind table: its stages' static bytes, then each action's
    change at its start or end. At one time, the computes' changes come in program order;
    a copy gives back before them and takes after them."""
    low = sim.lower(schedule) if not schedule.is_lowered else schedule
    c = costs.for_stages(low.stages)
    start, end = reference_run(low, costs)
    peaks = []
    for r, prog in enumerate(low.programs):
        static = sum(c.static_total(s) for s, rank in enumerate(low.placement) if rank == r)
        changes = []
        for i, a in enumerate(prog):
            for effect in KINDS[a.kind].memory:
                t = start[a] if effect.at == "start" else end[a]
                order = 1 if a.kind.is_compute else (0 if effect.sign < 0 else 2)
                changes.append((t, order, i, effect.at == "end", effect.sign * getattr(c, effect.field)[a.stage]))
        held = peak = static
        for *_, change in sorted(changes):
            held += change
            peak = max(peak, held)
        peaks.append(peak)
    return peaks


def rank_processes() -> list[int]:
    """Rank processes (`exec.launch.processes.launch`'s spawned children) of this test
    process still around; the resource tracker is not one."""
    import os
    from pathlib import Path

    from exec.launch.processes import children_of
    out = []
    for pid in children_of([os.getpid()]):
        try:
            if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                out.append(pid)
        except OSError:
            continue
    return out


def notebook_module(name: str):
    """notebooks/<name>.py (build, nbhelp) as a module: notebooks/ is no package, and `build`
    is also a PyPI name."""
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "notebooks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"notebooks_{name}", path)
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
