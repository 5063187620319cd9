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
    assert out.startswith("megatron-1.7b at seq 4096 on 8 x a100-80gb")  # the model with its sequence length changed
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


# ------------------------------------------------------- a profile FILE.json (issue 52, item 2)

def _profile_file(tmp_path, name="my-h100"):
    """The h100-80gb best-case preset saved under another name, as a file of one's own."""
    path = tmp_path / f"{name}.json"
    sim.save_profile({**sim.profile("h100-80gb-best-case").to_dict(), "name": name}, path)
    return path


def test_gpu_takes_a_profile_file_and_plans_as_with_the_preset(tmp_path):
    path = _profile_file(tmp_path)
    status, out, err = run(["--model", "megatron-1.7b", "--quiet", "--gpu", str(path), *BASE[2:]])
    assert status == 0, err
    assert "best case (profile my-h100)" in out
    _, preset, _ = run(["--model", "megatron-1.7b", "--quiet", "--gpu", "h100-80gb-best-case", *BASE[2:]])
    assert out.splitlines()[2:] == preset.splitlines()[2:]  # all but the time taken and the profile's name
    assert sum(line.startswith("   ") and line.endswith(" yes") for line in out.splitlines()) == 2  # --top 2


@pytest.mark.parametrize("content, words", [
    (None, ["cannot read"]),
    ("{not json", ["not JSON"]),
    (json.dumps({"schema": "something-else"}), ["not a device profile"]),
    (json.dumps({**sim.profile("h100-80gb-best-case").to_dict(), "launch": {}}), ["launch"]),
])
def test_a_bad_profile_file_is_one_line_naming_it_and_exit_2(tmp_path, content, words):
    path = tmp_path / "p.json"
    if content is not None:
        path.write_text(content)
    proc = run_main(plan_cli.main, "--model", "megatron-1.7b", "--gpu", str(path), *BASE[2:])
    one_line(proc, 2, "sim.plan: error:", str(path), *words)
    assert proc.stdout == ""


def test_estimate_takes_a_profile_file(tmp_path):
    path = _profile_file(tmp_path)
    layout = dict(tp=1, pp=2, dp=1, micro_batch=1, global_batch=8)
    mine, preset = (sim.estimate("megatron-1.7b", gpu, **layout) for gpu in (str(path), "h100-80gb-best-case"))
    assert mine.profile.name == "my-h100" and mine.step_time == preset.step_time
    assert sim.estimate("megatron-1.7b", path, **layout).step_time == preset.step_time  # a Path too
    with pytest.raises(sim.hardware.profile.ProfileError, match="cannot read"):
        sim.estimate("megatron-1.7b", str(tmp_path / "missing.json"), **layout)


# ----------------------------------------------- what a new user trips over (issue 52, item 8)

@pytest.mark.parametrize("text", ["1", "1.5", "4e9", "100"])
def test_a_bare_headroom_of_1_or_more_is_refused_in_one_line(text):
    """A bare number is a fraction of each GPU's memory; bytes need their unit."""
    proc = run_main(plan_cli.main, "--model", "megatron-1.7b", "--memory-headroom", text, *BASE)
    one_line(proc, 2, "--memory-headroom", f"got {text}", "fraction", "4GiB")
    assert plan_cli.headroom("0.5") == 0.5 and plan_cli.headroom("4e9B") == 4e9 and plan_cli.headroom("1B") == 1
    assert plan_cli.headroom("512MiB") == 512 * 2**20


@pytest.mark.parametrize("given, shown", [("llama3.1-8b", "llama3.1-8b"), ("llama3-8b", "llama3-8b"),
                                          ("LLaMA3.1_8B", "llama3.1-8b")])
def test_the_model_is_named_as_the_user_named_it(tmp_path, given, shown):
    """llama3.1-8b and llama3-8b are one model (one Transformer): each is printed, in the
    table's header, the JSON and the figures' names, as given."""
    assert sim.MODELS["llama3.1-8b"] == sim.MODELS["llama3-8b"]
    argv = ["--model", given, "--gpu", "a100-80gb", "--gpus", "8", "--global-batch", "8", "--tp", "8", "--pp", "1",
            "--micro-batch", "1", "--recompute", "full", "--zero", "1", "--quiet", "--top", "1"]
    status, out, err = run([*argv, "--no-figures"])
    assert status == 0, err
    assert out.startswith(f"{shown} on 8 x a100-80gb")
    status, out, err = run([*argv, "--no-figures", "--json"])
    assert status == 0 and json.loads(out)["model"] == shown
    from sim.plan.figures import figure_paths
    plan = sim.plan.search(given, "a100-80gb", 8, 8, tp=8, pp=1, micro_batch=1, recompute="full", zero=1, top=1)
    assert figure_paths(plan, tmp_path, shown)[0].name == f"plan_{shown}-a100-80gb_n8_B8_best.png"


def test_the_table_says_its_tflops_count_recompute():
    status, out, _ = run(["--model", "megatron-1.7b", "--quiet", *BASE])
    assert status == 0
    head = next(line for line in out.splitlines() if line.startswith("rank"))
    assert "HW TFLOP/s/GPU" in head and "MFU" in head
    assert "HW TFLOP/s/GPU: the FLOPs a GPU executes a second, recomputed forwards included" in out
    assert "etp:" not in out  # a dense model has no expert columns to explain


def test_a_mixture_of_experts_table_explains_ep_and_etp():
    plan = sim.plan.search("mixtral-8x7b", "h100-80gb", 64, 64, tp=4, pp=4, ep=4, expert_tp=[1], micro_batch=1,
                           schedules=["1f1b"], recompute=["full"], zero=[1], top=1)
    report = plan_cli.format_report(plan)
    head = next(line for line in report.splitlines() if line.startswith("rank"))
    assert " ep " in head and " etp " in head
    assert "etp: expert tensor parallelism" in report and "ep: expert parallelism" in report


def test_when_nothing_fits_the_nearest_miss_is_shown_with_how_much_it_misses():
    """None simulated (the memory bound drops all): the least bound, which the simulated
    peak of that layout is at least; some simulated: the least simulated peak."""
    status, out, err = run(["--model", "llama3.1-8b", "--gpu", "a100-80gb", "--gpus", "1", "--global-batch", "8",
                            "--no-figures", "--quiet"])
    assert status == 1 and "no configuration fits" in err
    miss = next(line for line in out.splitlines() if line.startswith("nearest miss: "))
    bound = float(miss.split("at least ")[1].split(" GiB")[0])
    over = float(miss.split("), ")[1].split(" GiB over")[0])
    assert bound - over == pytest.approx(72.0, abs=0.11)  # the usable 72.0 GiB of 80
    e = sim.estimate("llama3.1-8b", "a100-80gb", global_batch=8, micro_batch=1, recompute="full")
    assert max(e.peak_memory) / GIB >= bound - 0.05 and not e.fits  # a bound: the simulated peak is above it
    assert "tp=1 pp=1 dp=1 b=1 1f1b V=1 recompute=full zero=0" in miss
    status, out, _ = run(["--model", "llama3.1-8b", "--gpu", "a100-80gb", "--gpus", "1", "--global-batch", "8",
                          "--no-figures", "--quiet", "--json"])
    assert status == 1 and json.loads(out)["nearest_miss"] == miss  # --json says it too
    # simulated and none fits (its bound, 43.5 GiB, under the usable 45, its peak above): the least peak
    layout = dict(pp=2, micro_batch=4, global_batch=32, schedule="naive", recompute="none", zero=0)
    e = sim.estimate("megatron-1.7b", "a100-80gb", **layout)
    status, out, _ = run(["--model", "megatron-1.7b", "--gpu", "a100-80gb", "--gpus", "2", "--global-batch", "32",
                          "--pp", "2", "--micro-batch", "4", "--schedules", "naive", "--recompute", "none",
                          "--zero", "0", "--memory-headroom", "35GiB", "--no-figures", "--quiet"])
    miss = [line for line in out.splitlines() if line.startswith("nearest miss: ")]
    assert status == 1 and len(miss) == 1 and miss[0].endswith("(simulated)")
    assert f"peak {max(e.peak_memory) / GIB:.1f} GiB, {(max(e.peak_memory) - 45 * GIB) / GIB:.1f} GiB over " \
           f"the 45.0 GiB usable" in miss[0] and "tp=1 pp=2 dp=1 b=4 m=8 naive" in miss[0]


def test_a_global_batch_no_step_could_simulate_is_refused_at_once():
    """Even dp = gpus at the largest micro-batch leaves more micro-batches than a step may
    have (`MAX_CELLS`): one line, exit 2, before any configuration is enumerated."""
    from helpers import counting_calls
    from sim.plan import space
    batch = str(8 * 16 * (plan_cli.MAX_CELLS + 1))
    with counting_calls(space.configurations) as calls:
        proc = run_main(plan_cli.main, "--model", "megatron-1.7b", "--gpu", "a100-80gb", "--gpus", "8",
                        "--global-batch", batch, "--no-figures")
    one_line(proc, 2, "global batch", f"{plan_cli.MAX_CELLS:,}", "smaller global batch")
    assert calls[space.configurations] == 0 and proc.stdout == ""
    # at the bound itself every layout's step is too large or not, as the search says
    just = 8 * 16 * plan_cli.MAX_CELLS
    assert plan_cli.fewest_cells(plan_cli.build_parser().parse_args(
        ["--model", "x", "--gpu", "y", "--gpus", "8", "--global-batch", str(just)])) == plan_cli.MAX_CELLS


def test_the_micro_batch_sizes_of_a_huge_batch_are_the_small_divisors_only():
    from sim.plan.space import layouts
    got = layouts(sim.MODELS["megatron-1.7b"], 8, 8 * 3 * 2**20, tp=[1], pp=[1], max_micro_batch=16)
    assert [b for *_, b, _ in got] == [1, 2, 3, 4, 6, 8, 12, 16]
