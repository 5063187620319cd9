"""Run the test suite several times while other processes keep every core busy: a test that
depends on the timing of a quiet machine fails here.

    python benchmarks/suite_under_load.py                 # 3 runs, one busy process per core
    python benchmarks/suite_under_load.py --runs 5 --hogs 2 -- -x tests/exec/test_run.py

Each busy process spins in pure Python at normal priority, so the suite's processes share
the cores with them as with other users' jobs on a shared machine. The busy processes are
killed at the end whatever happens. Prints one line per run (exit status, the summary line
of pytest, the wall time) and exits 1 if any run failed.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

SPIN = "while True: pass"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--hogs", type=int, default=os.cpu_count() or 2, help="busy processes (default: one per core)")
    ap.add_argument("pytest_args", nargs="*", help="arguments for pytest (after --)")
    args = ap.parse_args(argv)
    hogs = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(args.hogs)]
    failed = 0
    try:
        for i in range(args.runs):
            t = time.perf_counter()
            run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args.pytest_args],
                                 capture_output=True, text=True)
            lines = [line for line in run.stdout.splitlines() if line.strip()]
            summary = lines[-1] if lines else run.stderr.strip()[-200:]
            print(f"run {i + 1}/{args.runs}: exit {run.returncode}, {summary} ({time.perf_counter() - t:.0f} s wall, "
                  f"{args.hogs} busy processes)", flush=True)
            if run.returncode != 0:
                failed += 1
                print("\n".join(line for line in lines if line.startswith(("FAILED", "ERROR"))), flush=True)
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
