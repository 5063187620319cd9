"""sim.cli, what every command line shares: parsers that take no abbreviations, one line on
stderr and exit status 2 for what they refuse (a missing extra named), a heartbeat that
says a long wait is a wait."""
from __future__ import annotations

import ast
import importlib
from pathlib import Path

import sim
import sim.cli
from helpers import one_line, run_main

ROOT = Path(__file__).resolve().parents[2]


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


def test_a_sim_only_install_names_the_extra(monkeypatch):
    from exec import profile_device
    from exec import run as exec_run
    assert sim.cli.missing_extra("no_such_module_here") == ("no_such_module_here is not installed; install the "
                                                            "'exec' extra: pip install -e .[exec]")
    gone = lambda: "torch is not installed; install the 'exec' extra: pip install -e .[exec]"  # noqa: E731
    for module, argv in ((exec_run, []), (profile_device, ["--out", "x.json"])):
        monkeypatch.setattr(module, "missing_extra", gone)
        one_line(run_main(module.main, *argv), 2, "pip install -e .[exec]")


def test_python_m_sim_lists_the_commands_and_refuses_arguments():
    """`python -m sim` (sim/__main__.py, run here as `main(argv)`): an index of the commands, exit
    0; each listed command exists, and the examples of sim's own parse; an argument: one line, 2."""
    import importlib.util
    from sim.plan import cli as plan_cli
    from sim.plot import cli as plot_cli
    entry = vars(importlib.import_module("sim.__main__"))  # imported, not run: it defines main
    for argv in ([], ["--help"], ["-h"]):
        proc = run_main(entry["main"], *argv)
        assert proc.returncode == 0 and proc.stderr == ""
        for name, _, example in entry["COMMANDS"]:
            assert f"python -m {name} {example}" in proc.stdout
    names = [name for name, _, _ in entry["COMMANDS"]]
    assert names[:2] == ["sim.plot", "sim.plan"] and {"exec.run", "exec.profile_device"} <= set(names)
    for name in names:
        assert importlib.util.find_spec(name) is not None, name
    examples = {name: example.split() for name, _, example in entry["COMMANDS"]}
    assert plot_cli.build_parser().parse_args(examples["sim.plot"]).devices == 4
    assert plan_cli.build_parser().parse_args(examples["sim.plan"]).gpus == 1024
    for argv in (["plot"], ["--stages", "4"], ["-h", "x"]):
        one_line(run_main(entry["main"], *argv), 2, "sim: error: python -m sim takes no arguments", "sim.plot")
