"""`python -m sim.plan`'s command line: the exit status and counts when nothing fits, the
progress bar that moves while nothing settles, the flags (--seq, a model from a JSON file,
--memory-headroom), the help and the header. Its `main(argv)` runs in this process."""
from __future__ import annotations

import json

import pytest

import sim
from sim.hardware.gpus import GIB
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


def run(argv) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `python -m sim.plan ARGV`, run in this process."""
    proc = run_main(plan_cli.main, *argv)
    return proc.returncode, proc.stdout, proc.stderr


BASE = ["--gpu", "a100-80gb", "--gpus", "8", "--global-batch", "32", "--no-figures", "--top", "2"]


def test_seq_is_the_sequence_length_not_a_prefix():
    status, out, err = run(["--model", "megatron-1.7b", "--seq", "4096", "--quiet", *BASE])
    assert status == 0, err
    assert out.startswith("l24-h2304-a24-s4096")  # the model with its sequence length changed
    status, _, err = run(["--model", "megatron-1.7b", "--seq-par", "on", *BASE])
    assert status == 2 and "unrecognized arguments: --seq-par" in err


def test_a_model_from_a_json_file(tmp_path):
    spec = dict(layers=8, hidden=1024, heads=16, seq=1024, vocab=32000, arch="llama")
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(spec))
    status, out, err = run(["--model", str(path), "--quiet", *BASE])
    assert status == 0, err
    assert sim.model.registry.find_model(str(path)) == sim.Transformer(**spec)
    path.write_text(json.dumps({**spec, "width": 3}))
    status, out, err = run(["--model", str(path), *BASE])
    assert status == 2 and len(err.splitlines()) == 1 and "unknown fields ['width']" in err


def test_help_lists_the_presets(capsys):
    with pytest.raises(SystemExit):
        plan_cli.build_parser().parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "gpt3-175b" in text and "FILE.json" in text and "tf32" in text and "--memory-headroom" in text


def test_the_header_names_the_gpu_the_stack_the_profile_and_its_kind():
    status, out, _ = run(["--model", "megatron-1.7b", "--quiet", *BASE])
    assert status == 0 and "caveat" not in out
    assert "a100-80gb, megatron-lm: Megatron-LM / Megatron-DeepSpeed 2021-2023 on DGX A100, calibrated " \
           "(profile a100-80gb-vtrain)" in out
    status, out, _ = run(["--model", "megatron-1.7b", "--quiet", *BASE[:1], "h100-80gb-best-case", *BASE[2:]])
    assert status == 0 and "h100-80gb, best-case: " in out and ", best case (profile h100-80gb-best-case)" in out
    assert sum(line.startswith("caveat: a best-case profile") for line in out.splitlines()) == 1
    assert "fits: peak <= 71.7 of 79.6 GiB" in out


def test_headroom_on_the_command_line():
    assert plan_cli.headroom("10%") == pytest.approx(0.1) and plan_cli.headroom("4GiB") == 4 * GIB
    status, out, _ = run(["--model", "megatron-1.7b", "--quiet", "--memory-headroom", "8GiB", *BASE])
    assert status == 0 and "fits: peak <= 72.0 of 80.0 GiB" in out


def test_progress_is_plain_lines_without_a_terminal():
    """stderr is not a terminal under pytest: whole lines, no carriage return, no bar."""
    status, _, err = run(["--model", "megatron-1.7b", *BASE])
    assert status == 0
    lines = err.splitlines()
    assert lines and all(line.startswith("sim.plan: ") and "settled" in line for line in lines)
    assert "\r" not in err and "[" not in err


def test_an_unknown_optimizer_is_one_line_and_exit_2():
    proc = run_main(plan_cli.main, "--model", "megatron-1.7b", "--gpu", "a100-80gb", "--gpus", "1", "--global-batch", "1",
                    "--optimizer", "lion", "--no-figures")
    one_line(proc, 2, "--optimizer", "lion")
