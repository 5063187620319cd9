"""What a new user trips over in the planner (issue 36): ZeRO-2 with pipelining, the memory headroom, size guards, ties, the command line's parsers and header."""
from __future__ import annotations

import ast
import dataclasses
import importlib
import json
from pathlib import Path

import pytest

import sim
import sim.model.registry
import sim.limits
import sim.plan
from sim.hardware.gpus import GIB
from sim.hardware.network import collective_time, links_of
from sim.plan import cli as plan_cli
from sim.plan import layout as plan_layout
from sim.plan.layout import DEFAULT_HEADROOM, usable_memory
from sim.plan.planner import TOO_LARGE, rank_key

ROOT = Path(__file__).resolve().parents[3]
SMALL = sim.Transformer(layers=4, hidden=256, heads=4, seq=128, vocab=1024)  # gpt: tied, learned positions, biases


def hand_params(model: sim.Transformer) -> int:
    """Narayanan et al. 2021, Eq. 2 for a GPT (12h^2 + 13h a layer, (V + s)h of embedding),
    plus the final LayerNorm's 2h."""
    h = model.hidden
    return model.layers * (12 * h * h + 13 * h) + (model.vocab + model.seq) * h + 2 * h


# ---------------------------------------------------------------- 1. ZeRO-2 and pipelining

def test_zero2_with_pipelining_is_refused_in_one_line():
    """DeepSpeed's pipeline engine refuses ZeRO-2 and -3; Megatron's distributed optimizer is ZeRO-1."""
    with pytest.raises(ValueError, match=r"zero=2 with pp > 1.*use zero <= 1") as err:
        sim.estimate("megatron-1.7b", tp=1, pp=2, dp=2, global_batch=16, zero=2)
    assert "\n" not in str(err.value)


def test_no_searched_row_with_pipelining_is_zero2_and_its_zero3_rows_are_fsdp():
    """With pp > 1 the search never proposes ZeRO-2 (each micro-batch's gradients reduce-scattered:
    refused), and ZeRO-3 is FSDP: gathers as actions, the gradients held whole until the stage's
    reduce-scatter."""
    plan = sim.plan.search("megatron-1.7b", "a100-80gb", gpus=16, global_batch=64, top=None, max_step_time=10.0)
    assert plan.rows and any(r.config.pp > 1 for r in plan.rows)
    assert all(r.config.zero != 2 for r in plan.rows if r.config.pp > 1)
    fsdp = next(r.config for r in plan.rows if r.config.pp > 1 and r.config.zero == 3)
    e = sim.estimate("megatron-1.7b", "a100-80gb", **fsdp.keywords())
    assert any(ev.action.kind is sim.Kind.UNSHARD for ev in e.result.events)
    assert e.memory_parts[0]["grads"] == pytest.approx(4 * e.memory_parts[0]["weights"] * fsdp.dp * fsdp.cp / 2)


@pytest.mark.parametrize("micro_batches", [1, 4, 8])
def test_zero2_holds_a_dp_share_of_the_gradients_and_reduces_each_micro_batch(micro_batches):
    """Hand count, pp = 1, dp = 4, m micro-batches: ZeRO-1 holds every fp32 gradient (4 bytes a
    parameter) through the m micro-batches; ZeRO-2 a quarter, because it reduce-scatters the
    gradients after each micro-batch's backward (DeepSpeed's stage 2): m reduce-scatters of
    the whole gradient in the step, where ZeRO-1 does one, after the last."""
    dp, params = 4, hand_params(SMALL)
    kw = dict(tp=1, pp=1, dp=dp, micro_batch=1, global_batch=dp * micro_batches)
    one, two = (sim.estimate(SMALL, zero=z, **kw) for z in (1, 2))
    assert one.memory_parts[0]["grads"] == pytest.approx(4 * params)
    assert two.memory_parts[0]["grads"] == pytest.approx(4 * params / dp)
    assert one.memory_parts[0]["optimizer"] == two.memory_parts[0]["optimizer"] == pytest.approx(12 * params / dp)
    scatter = collective_time(links_of(two.profile), "reduce_scatter", 4 * params, two.layout.topology().group("dp"))
    assert two.time_parts["zero_collectives"] == pytest.approx(micro_batches * scatter)
    assert one.time_parts["zero_collectives"] == 0.0


# ---------------------------------------------------------------- 2. memory headroom

def test_headroom_is_a_fraction_or_bytes():
    assert usable_memory(100.0, 0.1) == pytest.approx(90.0)
    assert usable_memory(100.0, 0) == 100.0
    assert usable_memory(100.0, 30.0) == 70.0
    for bad in (-0.1, 100.0, float("nan"), True, "10%"):
        with pytest.raises(ValueError, match="memory_headroom"):
            usable_memory(100.0, bad)
    assert DEFAULT_HEADROOM == 0.10


def test_a_peak_within_the_headroom_does_not_fit_and_says_why():
    """A layout whose peak lies between the usable memory and the GPU's fits only with no headroom."""
    kw = dict(tp=1, pp=1, dp=1, micro_batch=1, global_batch=1)
    bare = sim.estimate("megatron-1.7b", "a100-80gb", memory_headroom=0, **kw)
    peak, memory = max(bare.peak_memory), bare.profile.memory
    assert bare.fits and not bare.warnings
    room = (memory - peak) + 2**30  # a headroom that the peak reaches into
    kept = sim.estimate("megatron-1.7b", "a100-80gb", memory_headroom=room, **kw)
    assert not kept.fits and kept.usable_memory == memory - room
    assert any("headroom" in w for w in kept.warnings)
    assert kept.summary()["usable_memory"] == memory - room


def test_the_search_ranks_only_rows_within_the_usable_memory():
    plan = sim.plan.search("megatron-1.7b", "a100-80gb", gpus=8, global_batch=32, top=None, max_step_time=10.0,
                           memory_headroom=0.3)
    assert plan.usable_memory == pytest.approx(0.7 * plan.gpu.memory)
    assert plan.rows and all(r.peak_memory <= plan.usable_memory for r in plan.rows)


# ---------------------------------------------------------------- 5. size guards

def test_a_step_too_large_to_simulate_is_refused_before_any_work():
    with pytest.raises(ValueError, match="step too large to simulate in seconds") as err:
        sim.estimate("gpt3-175b", tp=1, pp=64, global_batch=100_000)
    assert "\n" not in str(err.value) and "6,400,000 stage-micro-batches" in str(err.value)


def test_a_step_too_large_for_this_machine_is_refused_by_the_host_guard(monkeypatch):
    """Within `MAX_CELLS` but beyond what this machine's memory holds: `sim.limits`' one line, at
    `sim.estimate`'s entry; the layout itself stays valid (its check never asks the host)."""
    monkeypatch.setattr(sim.limits, "machine_memory", lambda: 2 * sim.limits.BASE_BYTES)
    with pytest.raises(sim.limits.StepTooLarge, match="step too large for this machine: 64 stage-micro-batches"):
        sim.estimate("megatron-1.7b", pp=8, global_batch=8)
    lay = plan_layout.Layout(pp=8, global_batch=8)
    assert plan_layout.check_layout(sim.MODELS["megatron-1.7b"], sim.profile("a100-80gb"), lay) == []


def test_the_search_skips_and_counts_steps_too_large(monkeypatch):
    """On a machine that can simulate 100 stage-micro-batches, 200 micro-batches of 1 are
    skipped and counted; 100 of 2 are simulated."""
    monkeypatch.setattr(sim.plan.planner, "most_cells", lambda: 100)  # asked once, at the search's entry
    plan = sim.plan.search("megatron-1.7b", "a100-80gb", gpus=8, global_batch=8 * 200, pp=[1], tp=[1],
                           micro_batch=[1, 2], recompute="none", zero=[0])
    assert plan.dropped[TOO_LARGE] == 1
    assert [(r.config.micro_batch, r.micro_batches) for r in plan.rows] == [(2, 100)]


# ---------------------------------------------------------------- 8. the errors say the real reason

@pytest.mark.parametrize("kw, words", [
    (dict(pp=[128]), "more stages than the model's 24 layers"),
    (dict(pp=[3]), "not a multiple of pp=3"),
    (dict(tp=[2], pp=[16]), "tp*pp = 2*16 = 32"),
])
def test_sizes_given_are_refused_by_their_real_reason(kw, words):
    with pytest.raises(ValueError, match=words.replace("*", r"\*")):
        sim.plan.search("megatron-1.7b", "a100-80gb", gpus=16, global_batch=64, **kw)


def test_a_pp_given_alone_skips_the_tp_sizes_it_does_not_divide():
    plan = sim.plan.search("megatron-1.7b", "a100-80gb", gpus=16, global_batch=64, pp=[16], top=None,
                           max_step_time=100.0)
    assert {r.config.tp for r in plan.points} == {1}


def test_a_tp_beyond_a_node_runs_in_the_search_as_in_the_estimate():
    plan = sim.plan.search("gpt3-175b", "a100-80gb", gpus=256, global_batch=64, tp=[16], pp=[16], top=1,
                           recompute="full", zero=[1])
    assert plan.best is not None and plan.best.config.tp == 16


# ---------------------------------------------------------------- 9. ties

def test_ties_break_by_memory_then_the_configuration_so_any_top_agrees():
    """megatron-1.7b on 16 GPUs has rows of equal step time (ZeRO-1 and -2 at one micro-batch):
    every `top` ranks the same rows first."""
    full = sim.plan.search("megatron-1.7b", "a100-80gb", gpus=16, global_batch=64, top=10)
    times = [rank_key(r)[0] for r in full]  # to 12 significant digits
    tied = next(i for i in range(len(times) - 1) if times[i] == times[i + 1])
    assert [rank_key(r) for r in full] == sorted(rank_key(r) for r in full)
    assert full[tied].peak_memory <= full[tied + 1].peak_memory
    for top in (1, tied + 1):
        assert [r.config for r in sim.plan.search("megatron-1.7b", "a100-80gb", gpus=16, global_batch=64,
                                                  top=top)] == [r.config for r in full[:top]]


# ---------------------------------------------------------------- 4. the command lines

def _parser_builders() -> list:
    """Every function of sim and exec that builds an argparse parser: found by reading the
    sources for `ArgumentParser(` or `OneLineParser(` calls inside a function."""
    found = []
    for path in sorted((ROOT / "sim").rglob("*.py")) + sorted((ROOT / "exec").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for fn in ast.walk(tree):
            if isinstance(fn, ast.FunctionDef) and any(
                    isinstance(n, ast.Call) and getattr(n.func, "attr", getattr(n.func, "id", None))
                    in ("ArgumentParser", "OneLineParser") for n in ast.walk(fn)):
                module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
                found.append((module, fn.name))
    return found


def test_every_parser_takes_no_abbreviations():
    builders = _parser_builders()
    assert {m for m, _ in builders} >= {"sim.plan.cli", "sim.plot.cli", "exec.run", "exec.profile_device"}
    for module, name in builders:
        parser = getattr(importlib.import_module(module), name)()
        assert parser.allow_abbrev is False, (module, name)


def run(argv, capsys):
    try:
        status = plan_cli.main(argv)
    except SystemExit as e:
        status = e.code
    out = capsys.readouterr()
    return status, out.out, out.err


BASE = ["--gpu", "a100-80gb", "--gpus", "8", "--global-batch", "32", "--no-figures", "--top", "2"]


def test_seq_is_the_sequence_length_not_a_prefix(capsys):
    status, out, err = run(["--model", "megatron-1.7b", "--seq", "4096", "--quiet", *BASE], capsys)
    assert status == 0, err
    assert out.startswith("l24-h2304-a24-s4096")  # the model with its sequence length changed
    status, _, err = run(["--model", "megatron-1.7b", "--seq-par", "on", *BASE], capsys)
    assert status == 2 and "unrecognized arguments: --seq-par" in err


def test_a_model_from_a_json_file(tmp_path, capsys):
    spec = dict(layers=8, hidden=1024, heads=16, seq=1024, vocab=32000, arch="llama")
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(spec))
    status, out, err = run(["--model", str(path), "--quiet", *BASE], capsys)
    assert status == 0, err
    assert sim.model.registry.find_model(str(path)) == sim.Transformer(**spec)
    path.write_text(json.dumps({**spec, "width": 3}))
    status, out, err = run(["--model", str(path), *BASE], capsys)
    assert status == 2 and len(err.splitlines()) == 1 and "unknown fields ['width']" in err


def test_help_lists_the_presets(capsys):
    with pytest.raises(SystemExit):
        plan_cli.build_parser().parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "gpt3-175b" in text and "FILE.json" in text and "tf32" in text and "--memory-headroom" in text


def test_the_header_names_the_profile_and_its_kind(capsys):
    status, out, _ = run(["--model", "megatron-1.7b", "--quiet", *BASE], capsys)
    assert status == 0 and "profile a100-80gb-vtrain (calibrated)" in out and "caveat" not in out
    status, out, _ = run(["--model", "megatron-1.7b", "--quiet", *BASE[:1], "h100-80gb-best-case", *BASE[2:]], capsys)
    assert status == 0 and "profile h100-80gb-best-case (best case)" in out
    assert sum(line.startswith("caveat: a best-case profile") for line in out.splitlines()) == 1
    assert "fits: peak <= 71.7 of 79.6 GiB" in out


def test_headroom_on_the_command_line(capsys):
    assert plan_cli.headroom("10%") == pytest.approx(0.1) and plan_cli.headroom("4GiB") == 4 * GIB
    status, out, _ = run(["--model", "megatron-1.7b", "--quiet", "--memory-headroom", "8GiB", *BASE], capsys)
    assert status == 0 and "fits: peak <= 72.0 of 80.0 GiB" in out


def test_progress_is_plain_lines_without_a_terminal(capsys):
    """stderr is not a terminal under pytest: whole lines, no carriage return, no bar."""
    status, _, err = run(["--model", "megatron-1.7b", *BASE], capsys)
    assert status == 0
    lines = err.splitlines()
    assert lines and all(line.startswith("sim.plan: ") and "settled" in line for line in lines)
    assert "\r" not in err and "[" not in err


# ---------------------------------------------------------------- 7. exec checks before it works

def _exit(main, argv, capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as end:
        main(argv)
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    return end.value.code, err


@pytest.mark.parametrize("out, words", [("/proc/x.json", "cannot write to /proc"),
                                        ("{file}/x.json", "is a file, not a folder"),
                                        ("{tmp}", "is a folder; give a file name")])
def test_the_profiler_checks_its_output_before_measuring(out, words, tmp_path, capsys):
    from exec import profile_device
    (tmp_path / "f").write_text("")
    out = out.format(file=tmp_path / "f", tmp=tmp_path)
    status, err = _exit(profile_device.main, ["--out", out], capsys)
    assert status == 2 and words in err


def test_exec_refuses_a_model_this_machine_cannot_hold(capsys):
    from exec import run as exec_run
    status, err = _exit(exec_run.main, ["--model", "gpt3-175b"], capsys)
    assert status == 2 and "--model gpt3-175b of 175.2 B parameters" in err


def test_a_sim_only_install_names_the_extra(monkeypatch, capsys):
    from exec import profile_device
    from exec import run as exec_run
    assert sim.cli.missing_extra("no_such_module_here") == ("no_such_module_here is not installed; install the "
                                                            "'exec' extra: pip install -e .[exec]")
    gone = lambda: "torch is not installed; install the 'exec' extra: pip install -e .[exec]"  # noqa: E731
    for module, argv in ((exec_run, []), (profile_device, ["--out", "x.json"])):
        monkeypatch.setattr(module, "missing_extra", gone)
        status, err = _exit(module.main, argv, capsys)
        assert status == 2 and "pip install -e .[exec]" in err


# ---------------------------------------------------------------- 11. exec's busy line

def test_the_busy_line_counts_own_ranks_when_they_outnumber_the_cores():
    from exec.measure.busy import describe_load
    summary = {"ranks": [{"lost_share": 0.02, "cpu_share": 0.5}, {"lost_share": 0.4, "cpu_share": 0.5},
                         {"lost_share": 0.1, "cpu_share": 0.9}], "lost_share_max": 0.4}
    assert describe_load(summary, cores=4).startswith("the machine was busy: 40% of the step lost to other processes")
    line = describe_load(summary, cores=2)
    assert line.startswith("3 ranks on 2 cores take turns: 40% of the step") and "own ranks" in line


# ---------------------------------------------------------------- 6, 11. sim.plot: never silent, one unit, costs shown

def test_a_long_build_says_so_and_a_short_one_is_silent():
    """On a clock the test moves: nothing before `first` seconds, then a line every `every`
    seconds of silence, each with the seconds so far; a line of the caller's own starts the
    silence over. No bound here depends on how fast the machine is."""
    from sim.cli import Heartbeat
    now, out = [0.0], []
    beat = Heartbeat(lambda s: f"sim.plot: building zb-auto: {s:.0f} s so far", first=2, every=5,
                     clock=lambda: now[0], write=out.append)
    wrote = []
    for now[0] in (0.5, 1.99, 2.0, 2.5, 6.99, 7.0, 11.0, 12.0):
        wrote.append(beat.beat())
    assert wrote == [False, False, True, False, False, True, False, True]
    assert out == [f"sim.plot: building zb-auto: {s} s so far" for s in (2, 7, 12)]
    now[0] = 13.0
    beat.said()
    assert [beat.beat() for now[0] in (14.99, 15.0)] == [False, True]  # `first` again, from 13 s
    assert out[-1] == "sim.plot: building zb-auto: 2 s so far"


def test_the_heartbeat_thread_writes_while_the_block_runs(capsys):
    """`with heartbeat(...)`: its thread's lines reach stderr while the block runs (however
    long the machine takes to run the thread), and a short block prints nothing."""
    import threading
    from sim.cli import heartbeat
    err = ""
    with heartbeat("sim.plot", "building zb-auto", first=0.01, every=0.01):
        while "\n" not in err:  # the test's own timeout bounds this wait, not a guess at the machine's speed
            threading.Event().wait(0.01)
            err += capsys.readouterr().err
    lines = (err + capsys.readouterr().err).splitlines()
    assert lines and all(line.startswith("sim.plot: building zb-auto: ") for line in lines)
    with heartbeat("sim.plot", "building 1f1b", first=60):
        pass
    assert capsys.readouterr().err == ""


def test_zbv_peak_is_counted_in_a_device_micro_batches_as_on_the_figure():
    from sim.plot.cli import chunk_costs
    from sim.plot.labels import costs_note, device_micro_batches
    result = sim.simulate(sim.make_schedule("zbv", 4, 8), chunk_costs(sim.Costs(), 2))  # as sim.plot runs it
    assert result.peak_activations == [8, 8, 8, 8]  # chunk micro-batches: two chunks a device
    assert device_micro_batches(result) == ["4", "4", "4", "4"]
    assert max(result.peak_memory) == 4  # the figure's and the table's memory: a device's micro-batches
    assert costs_note(sim.Costs()) == "costs: F 1, B 2 a stage; transfers free"
    assert costs_note(sim.Costs(), 2, split=True) == "costs: F 1, B 2 (I 1 + W 1) a device (1/V of it a chunk); transfers free"


def test_the_readme_figure_shares_its_time_axis(tmp_path):
    from sim.plot.cli import main as plot_main
    import matplotlib.pyplot as plt
    from sim.plot import gantt
    seen = []
    original = gantt.plot_compare

    def spy(results, shared_time=None, unit=None, note=None):
        seen.append((shared_time, note))
        return original(results, shared_time, unit, note=note)

    import sim.plot.cli as plot_cli
    plot_cli.plot_compare, saved = spy, plot_cli.plot_compare
    try:
        assert plot_main(["--stages", "4", "--micro", "8", "--out", str(tmp_path)]) == 0
    finally:
        plot_cli.plot_compare = saved
        plt.close("all")
    assert seen == [(True, "costs: F 1, B 2 a stage; transfers free")]


def test_more_gpus_than_any_published_run_says_so():
    plan = sim.plan.search("megatron-1.7b", "a100-80gb", gpus=32_768, global_batch=32_768, tp=[1], pp=[1],
                           micro_batch=[1], recompute="none", zero=[0])
    assert plan.rows and len(plan.warnings) == 1 and "32,768 GPUs: more than the 16,384" in plan.warnings[0]
    assert plan.summary()["warnings"] == plan.warnings
    assert not sim.plan.search("megatron-1.7b", "a100-80gb", gpus=8, global_batch=8, tp=[1], pp=[1],
                               micro_batch=[1], recompute="none", zero=[0]).warnings
