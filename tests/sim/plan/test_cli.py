"""`python -m sim.plan`'s command line: the exit status and counts when nothing fits, and
the progress bar that moves while nothing settles. Its `main(argv)` runs in this process
(`helpers.run_main`)."""
from __future__ import annotations

from sim.plan import cli as plan_cli
from sim.plan.cli import ProgressBar
from helpers import one_line, run_main


def test_plan_exits_1_when_nothing_fits_and_counts_add_up():
    proc = run_main(plan_cli.main, "--model", "gpt3-175b", "--gpu", "a100-80gb", "--gpus", "3", "--global-batch", "1536",
                    "--no-figures", "--quiet")
    one_line(proc, 1, "no configuration fits")
    head = proc.stdout.splitlines()[0]
    enumerated = int(head.split(": ")[1].split()[0])
    dropped = proc.stdout.split("dropped (of the")[1].split("not enumerated")[0]
    counts = [int(line.split()[0]) for line in dropped.splitlines()[1:] if line.strip()]
    assert sum(counts) == enumerated  # none fits: every enumerated configuration is dropped once


class FakeClock:
    """A clock that moves only when the test says so."""

    def __init__(self, now: float = 100.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_progress_bar_moves_while_nothing_settles(capsys):
    """While nothing settles, the bar is redrawn once each `every` seconds of its clock,
    with the clock's time; settling redraws it at most ten times a second, and the last
    configuration ends the line and the redrawing."""
    clock = FakeClock()
    bar = ProgressBar(every=1.0, clock=clock)
    bar(3, 10)                                      # drawn: the first state
    for step in (0.5, 0.5, 0.2, 2.5, 0.9, 0.2):     # due at +1.0, +3.7 and +4.8
        clock.now += step
        bar.beat()
    clock.now += 0.05
    bar(4, 10)                                      # within 0.1 s of the last drawing: not drawn
    clock.now += 0.06
    bar(5, 10)                                      # 0.11 s after it: drawn
    bar(10, 10)                                     # the last one always is, with a newline
    clock.now += 5
    bar.beat()                                      # done: nothing more
    bar.close()
    err = capsys.readouterr().err
    drawn = [d.split("] ")[1] for d in err.split("\r") if d]
    assert drawn == ["3/10 settled, 0.0 s", "3/10 settled, 1.0 s", "3/10 settled, 3.7 s", "3/10 settled, 4.8 s",
                     "5/10 settled, 4.9 s", "10/10 settled, 4.9 s\n"]
