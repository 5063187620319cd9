"""exec.measure.busy: the load of a measured step, from the kernel's scheduler statistics
per thread (faked, then this thread's own), and the line that says how busy the machine was."""
from __future__ import annotations

import threading
import types

import pytest


def test_step_load_reads_the_kernels_waits_per_thread(monkeypatch):
    """The kernel's scheduler statistics and the clocks, faked: a step of 0.4 s wall time
    in which the main thread ran 0.3 s and waited 0.1 s for a core, and the transport
    threads (one of them started during the step) waited 0.05 s and 0.02 s. The record
    takes the differences, the summary the main thread's share, the line says busy."""
    from exec.launch.host import GLOO_IO_THREAD
    from exec.measure import busy
    main = threading.get_native_id()
    before = {main: ("python", 1.0, 0.5), 7: (GLOO_IO_THREAD, 0.2, 0.1), 8: ("other", 0.0, 0.0)}
    after = {main: ("python", 1.3, 0.6), 7: (GLOO_IO_THREAD, 0.25, 0.15), 9: (GLOO_IO_THREAD, 0.0, 0.02),
             8: ("other", 0.5, 3.0)}
    reads = iter([before, after])
    monkeypatch.setattr(busy, "thread_sched", lambda: next(reads))
    clocks = {"perf_counter": iter([10.0, 10.4]), "thread_time": iter([2.0, 2.3]), "process_time": iter([5.0, 5.5])}
    monkeypatch.setattr(busy, "time", types.SimpleNamespace(**{k: (lambda it=it: next(it)) for k, it in clocks.items()}))
    with busy.StepLoad() as load:
        pass
    rec = load.record
    assert rec["wall"] == pytest.approx(0.4) and rec["cpu"] == pytest.approx(0.3)
    assert rec["cpu_process"] == pytest.approx(0.5)
    assert rec["waited"] == pytest.approx(0.1) and rec["waited_transport"] == pytest.approx(0.07)
    s = busy.load_summary([[rec], [dict(rec, waited=0.0)]])
    assert s["lost_share_max"] == pytest.approx(0.25) and s["ranks"][1]["lost_share"] == 0.0
    assert busy.describe_load(s).startswith("the machine was busy: 25% of the step lost to other processes (rank 0")


def test_thread_sched_names_this_thread():
    """The kernel's statistics themselves: this thread is among them, with the time it ran."""
    from exec.measure.busy import thread_sched
    sched = thread_sched()
    if sched is None:
        pytest.skip("no scheduler statistics here")
    name, ran, waited = sched[threading.get_native_id()]
    assert name and ran > 0 and waited >= 0


def test_the_busy_line_counts_own_ranks_when_they_outnumber_the_cores():
    from exec.measure.busy import describe_load
    summary = {"ranks": [{"lost_share": 0.02, "cpu_share": 0.5}, {"lost_share": 0.4, "cpu_share": 0.5},
                         {"lost_share": 0.1, "cpu_share": 0.9}], "lost_share_max": 0.4}
    assert describe_load(summary, cores=4).startswith("the machine was busy: 40% of the step lost to other processes")
    line = describe_load(summary, cores=2)
    assert line.startswith("3 ranks on 2 cores take turns: 40% of the step") and "own ranks" in line
