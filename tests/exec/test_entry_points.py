"""What a new user meets first (issue 52): `python -m exec`'s index, a model named by a string,
the GPU rule and NCCL's limits said up front, the profile's paths outside the checkout, the
cores counted per host, and a two-node run on one host that says its nodes share the host."""
from __future__ import annotations

import json
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from exec.launch.host import crowding, host_cores, hosts_of  # noqa: E402
from exec.launch.processes import free_port  # noqa: E402
from exec.models.spec import ModelSpec  # noqa: E402
from exec.pipeline.config import MODELS, model_spec  # noqa: E402
from exec.run import main as exec_run  # noqa: E402
from helpers import run_main  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--layers", "4", "--hidden", "32", "--seq", "8", "--batch-size", "8", "--micro-batches", "4"]
NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")


def test_python_m_exec_prints_an_index_and_runs_nothing(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["exec"])
    with pytest.raises(SystemExit) as info:
        runpy.run_module("exec", run_name="__main__")
    out = capsys.readouterr().out
    assert info.value.code == 0
    assert "python -m exec.run" in out and "python -m exec.profile_device" in out and "--help" in out


def test_a_model_name_is_its_spec_and_another_name_is_refused_naming_the_choices():
    from exec import run_pipeline
    assert [model_spec("run_pipeline", m) for m in MODELS] == [ModelSpec(m) for m in MODELS]
    spec = ModelSpec("gpt", layers=2)
    assert model_spec("run_pipeline", spec) is spec
    with pytest.raises(ValueError, match=r"unknown model 'rnn'; give one of 'mlp', 'gpt' or a ModelSpec"):
        run_pipeline("rnn", "1f1b", 2, 4)  # refused before any rank starts (this loop starts none)
    with pytest.raises(TypeError, match=r"spec must be an exec.ModelSpec or a model name \(mlp, gpt\), got int"):
        run_pipeline(3, "1f1b", 2, 4)


@NO_GPU
def test_nccl_without_gpus_is_refused_up_front_by_the_api_and_the_cli_alike():
    from exec import run_pipeline
    rule = "nccl runs one process per GPU: 2 ranks need 2 GPUs, this machine has 0"
    with pytest.raises(ValueError, match=re.escape(rule)):
        run_pipeline(ModelSpec(), "1f1b", 2, 4, backend="nccl")
    p = run_main(exec_run, "--backend", "nccl", "--no-compare")
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and rule in p.stderr, p.stderr


@pytest.mark.parametrize("args, says", [
    (["--backend", "nccl"], "--backend nccl: calibration is not supported on NCCL yet"),
    (["--backend", "nccl", "--dp", "2", "--no-compare"], "data parallelism (REDUCE_GRAD in '1f1b') is not supported "
                                                         "on NCCL yet"),
])
def test_what_nccl_does_not_run_yet_is_one_line_saying_so(args, says):
    p = run_main(exec_run, *args)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and says in p.stderr, p.stderr
    assert "checks the gradients and times the steps only" in p.stderr


def test_the_help_says_what_nccl_runs():
    p = run_main(exec_run, "--help")
    assert "no calibration and no --dp on NCCL yet" in " ".join(p.stdout.split())


def test_the_profile_paths_suggested_lie_outside_the_checkout():
    """Every `--out` that `exec.profile_device`'s help and docs/exec.md suggest is under the
    home folder or absolute, so that following them leaves `git status` clean."""
    import exec.profile_device as profile_device
    texts = [profile_device.__doc__, (ROOT / "docs/exec.md").read_text(), run_main(profile_device.main, "--help").stdout]
    suggested = [m for t in texts for m in re.findall(r"profile_device --out (\S+)", t)]
    assert suggested and all(p.startswith(("~/", "/")) or p in ("FILE", "F") for p in suggested), suggested


def _place(host, cores, node=None):
    return {"host": host, "cores": list(cores), "node": node}


def test_ranks_pinned_apart_hold_their_cores_together_and_share_none():
    """torchrun's two ranks on cores 0 and 1: the host's ranks hold 2 cores, nothing is said."""
    hosts = hosts_of([_place("a", [0], 0), _place("a", [1], 0)])
    assert hosts == [{"host": "a", "ranks": 2, "cores": 2, "nodes": 1, "shared": False}] and crowding(hosts) == []


def test_a_cluster_is_counted_per_host_never_world_against_one_rank():
    """8 nodes of 4 ranks, each rank on its own 16 cores: 32 ranks, 64 cores a host, nothing shared."""
    places = [_place(f"n{n}", range(16 * r, 16 * (r + 1)), n) for n in range(8) for r in range(4)]
    hosts = hosts_of(places)
    assert [(h["ranks"], h["cores"], h["shared"]) for h in hosts] == [(4, 64, False)] * 8 and crowding(hosts) == []


def test_ranks_that_share_cores_get_one_line_naming_the_nodes_when_nodes_share_the_host():
    unpinned = hosts_of([_place("a", [0, 1]) for _ in range(3)])  # 3 ranks, 2 cores: the OS places them
    assert crowding(unpinned) == ["3 ranks on 2 cores of host a: ranks share cores"]
    two_nodes = hosts_of([_place("a", [c], n) for n in (0, 1) for c in (0, 1)])  # each launcher pins to 0 and 1
    [line] = crowding(two_nodes)
    assert line.startswith("2 nodes (torchrun launchers) share host a: 4 ranks on its 2 cores")


def _clean_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "LOCAL_WORLD_SIZE")}
    return env | {"PYTHONPATH": str(ROOT)}


@pytest.mark.slow
def test_two_nodes_on_one_host_run_and_say_they_share_it(tmp_path):
    """Two torchrun launchers, `--nnodes 2` with c10d's rendezvous on 127.0.0.1 (no
    --node-rank: c10d assigns it), one rank each: the run's gradients match, the JSON
    counts one host with 2 ranks of 2 nodes sharing its cores, and the table says so in one
    line. Both launchers end within the timeout, and nothing is left behind."""
    port = free_port()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "exec-two-nodes",
           "-m", "exec.run", "--devices", "2", *SMALL, "--steps", "1", "--warmup", "1", "--json", "--no-compare",
           "--timeout", "150"]
    nodes = [subprocess.Popen(cmd, cwd=tmp_path, env=_clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    try:
        outs = [p.communicate(timeout=240) for p in nodes]
    finally:
        for p in nodes:
            p.kill()
            p.wait(10)
    assert [p.returncode for p in nodes] == [0, 0], [err[-2000:] for _, err in outs]
    [report] = [json.loads(out) for out, _ in outs if out.strip()]  # rank 0's launcher alone reports
    assert report["grad_match"] is True
    # each launcher pins its one rank to all of the host's cores: both ranks on the same ones
    assert report["hosts"] == [{"host": report["hosts"][0]["host"], "ranks": 2, "cores": len(host_cores()),
                                "nodes": 2, "shared": True}]
    said = [line for _, err in outs for line in err.splitlines() if "share host" in line]
    assert len(said) == 1 and said[0].startswith("hosts") and f"2 ranks on its {len(host_cores())} cores" in said[0]
    assert not any("node-rank" in err or "node_rank" in err for _, err in outs)
    assert _running_in(tmp_path) == []  # no rank, no launcher left


def _running_in(folder: Path) -> list[int]:
    """The processes whose working folder is `folder` (Linux /proc)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if Path(os.readlink(f"/proc/{pid}/cwd")) == folder:
                found.append(int(pid))
        except OSError:
            continue
    return found


@pytest.mark.parametrize("model", MODELS)
def test_the_default_learning_rate_lowers_the_loss_every_step(model):
    """A run's steps train on the same batch: under the default optimizer and learning rate
    the loss of every step a default run takes (warm-up and measured) is below the one before
    (at 0.01 AdamW took the MLP's 2.32 to 55.8 in 7 steps), here in one process."""
    from exec.pipeline.config import RunConfig
    from exec.runtime.optim import make_optimizer
    config, spec = RunConfig(), ModelSpec(model)
    net = torch.nn.Sequential(*spec.build_stages(1))
    opt = make_optimizer(config.optimizer, list(net.parameters()), config.lr)
    inputs, targets = spec.batch()
    losses = []
    for _ in range(config.warmup + config.steps):
        opt.zero_grad()
        loss = spec.loss(net(inputs), targets)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
