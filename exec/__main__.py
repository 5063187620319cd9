"""`python -m exec`: a short index of exec's command lines (it runs nothing; exit 0)."""
import sys

INDEX = """exec: run the simulator's schedules on real ranks (docs/exec.md)

  python -m exec.run --schedule 1f1b --devices 2 --micro-batches 8     run a schedule, check it, compare it with sim
  python -m exec.run --help                                            every option of a run
  python -m exec.profile_device --out ~/.cache/exec/cpu.json --quick   this machine's device profile, for sim.plan
  torchrun --nproc-per-node 2 -m exec.run --devices 2                  the same run under torchrun (docs/exec.md, Multi-node)
"""


def main() -> int:
    print(INDEX, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
