"""`python -m exec.run`'s command line: what it refuses before any rank starts (outputs, the
learning rate, a costs file), each on one line with exit status 2, and a run whose loss
overflows, which exits 1 naming the step.

The refusals call its `main(argv)` in this process (`helpers.run_main`); what needs a fresh
Python (torch not yet imported) or real ranks runs the command itself (slow)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from exec import run as exec_run
from helpers import one_line, refusing, run_main

ROOT = Path(__file__).resolve().parents[2]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    """`python -m exec.run ARGS`, run in this process."""
    return run_main(exec_run.main, *args)


def python_m_exec_run(*args: str) -> subprocess.CompletedProcess:
    """`python -m exec.run ARGS` in a fresh Python (real ranks)."""
    return subprocess.run([sys.executable, "-m", "exec.run", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})


def _costs_file(tmp_path: Path, doc) -> Path:
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize("args, words", [
    (["--out", "/proc/x"], ["--out", "/proc/x"]),
    (["--out", "README.md/sub"], ["--out", "README.md/sub"]),
    (["--lr", "-5"], ["--lr", "-5"]),
    (["--lr", "nan"], ["--lr", "nan"]),
])
def test_exec_run_refuses_outputs_and_lr_up_front(args, words):
    one_line(run_cli(*args), 2, *words)


def test_exec_run_refuses_costs_naming_the_file(tmp_path):
    one_line(run_cli("--costs", str(tmp_path)), 2, str(tmp_path), "directory")
    for doc, what in (({"costs": {"forward": -1}}, "forward"), ([1, 2], "no costs"),
                      ({"costs": [1]}, "JSON object"), ({"costs": {"forward": [1, 2, 3]}}, "3 values")):
        path = _costs_file(tmp_path, doc)
        one_line(run_cli("--costs", str(path)), 2, str(path), what)


def test_exec_run_costs_refused_without_torch(tmp_path):
    """The costs are checked before torch is imported, so a refusal costs no start-up: run
    as in a new interpreter with torch refused, the refusal is the costs' and nothing asked
    for torch."""
    path = _costs_file(tmp_path, {"costs": {"forward": -1}})
    with refusing("torch") as asked:
        from exec import run as fresh_run
        proc = run_main(fresh_run.main, "--costs", str(path))
    one_line(proc, 2, str(path), "forward")
    assert asked == set()


@pytest.mark.slow
def test_exec_run_non_finite_loss_exits_1_naming_the_step():
    """A real two-rank run whose loss overflows: the table shows the last loss (nan), the
    exit status is 1 and the line says at which step; the JSON carries the machine's load."""
    proc = python_m_exec_run("--lr", "1e30", "--steps", "2", "--warmup", "1", "--no-compare", "--quiet", "--json",
                             "--timeout", "120")
    assert proc.returncode == 1, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("exec.run: error: the loss became") and "at step" in last, last
    doc = json.loads(proc.stdout)
    assert doc["loss"] is None and doc["first_loss"] > 0 and doc["steps"] == 3  # nan -> null in JSON
    assert len(doc["lost_share_per_rank"]) == 2
    assert doc["lost_share"] is None or 0 <= doc["lost_share"] <= 1
    # busy or quiet, the line's shape; with fewer cores than ranks (not on 2 cores) it says they take turns
    assert any(s in doc["load"] for s in ("of the step lost to other processes", "take turns", "no scheduler statistics"))


def test_exec_refuses_a_model_this_machine_cannot_hold():
    one_line(run_cli("--model", "gpt3-175b"), 2, "--model gpt3-175b of 175.2 B parameters")


def test_cli_refuses_selective_recompute_of_the_mlp():
    one_line(run_cli("--model", "mlp", "--recompute", "selective"), 2, "only model 'gpt'")
