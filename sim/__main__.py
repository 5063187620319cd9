"""`python -m sim`: an index of the project's commands, each one line; it runs none of them."""
from __future__ import annotations

import sys
from typing import Sequence

from sim import cli

# (command, what it does, an example's arguments): the commands a user types, in the order a
# new user meets them (README.md)
COMMANDS = (
    ("sim.plot", "simulate pipeline schedules: makespan, bubble, memory, Gantt charts", "--stages 4 --micro 8"),
    ("sim.plan", "search a run's parallel layouts for the fastest step that fits",
     "--model gpt3-175b --gpu a100-80gb --gpus 1024 --global-batch 1536"),
    ("exec.run", "run a schedule on torch.distributed ranks, against its simulation (the exec extra)",
     "--schedule 1f1b --devices 2"),
    ("exec.profile_device", "measure this machine into a profile for sim.plan --gpu FILE.json",
     "--out ~/my-device.json"),
)


def index() -> str:
    """The commands, each with what it does and an example; then where to read more."""
    width = max(len(name) for name, _, _ in COMMANDS)
    lines = ["The pipeline-parallel workbench's commands (each takes --help):", ""]
    for name, what, example in COMMANDS:
        lines += [f"  {name:<{width}}  {what}", f"  {'':<{width}}  python -m {name} {example}"]
    lines += ["", "The library: import sim (sim.simulate, sim.estimate, sim.plan.search); the tutorials: notebooks/;",
              "the docs: docs/README.md."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Print the index (also for -h and --help) and return 0; anything else is refused in one line."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] not in ("-h", "--help") or len(argv) > 1:
        cli.fail("sim", f"python -m sim takes no arguments (got {' '.join(argv)}); it lists the commands: "
                        f"{', '.join('python -m ' + name for name, _, _ in COMMANDS)}")
    print(index())
    return 0


if __name__ == "__main__":
    sys.exit(main())
