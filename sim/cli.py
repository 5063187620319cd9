"""What the command lines (`sim.plot`, `sim.plan`, `exec.run`) share: a bad argument is one line on
stderr and exit status 2, never a usage dump or a traceback; a long wait is never silent."""
from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, NoReturn

from sim.limits import machine_memory  # noqa: F401  (the one host-memory guard's; `exec.run` asks it here)


def fail(prog: str, message: str) -> NoReturn:
    """Print `<prog>: error: <message>` on one line to stderr and exit with status 2."""
    print(f"{prog}: error: {' '.join(str(message).split())}", file=sys.stderr)
    sys.exit(2)


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad argument is one line on stderr and exit status 2; `error_prog`
    names the command in that line. Options are never abbreviated (`allow_abbrev=False`):
    a prefix such as `--seq` would otherwise be taken for the one option it starts."""

    def __init__(self, *args, error_prog: str, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.error_prog = error_prog

    def error(self, message: str) -> NoReturn:  # type: ignore[override]
        fail(self.error_prog, message)


def number(text: str, minimum: float = 0.0, strict: bool = False, allow_inf: bool = False) -> float:
    """A float >= `minimum` (> if `strict`); infinity only if `allow_inf`; never NaN."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if math.isnan(v) or (math.isinf(v) and not allow_inf) or v < minimum or (strict and v == minimum):
        need = f"> {minimum:g}" if strict else f">= {minimum:g}"
        what = "a number" if allow_inf else "a finite number"
        raise argparse.ArgumentTypeError(f"got {text}, need {what} {need}")
    return v


def whole(text: str, minimum: int = 1) -> int:
    """An integer >= `minimum` (default: a positive integer)."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number; give an integer >= {minimum}") from None
    if v < minimum:
        raise argparse.ArgumentTypeError(f"got {v}, need an integer >= {minimum}")
    return v


def folder_problem(out: str | os.PathLike) -> str | None:
    """Make the output folder `out` (with its parents) and write a file in it, before any
    work: None if that worked, else one line saying why not (a file in the way, no
    permission, a read-only or virtual file system such as /proc)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        return f"{out} is a file; give a folder (it is created if missing)"
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as e:
        return f"cannot write to {out}: {e.strerror or e}"
    return None


def missing_extra(module: str = "torch", extra: str = "exec") -> str | None:
    """One line naming the install that brings `module`, where it cannot be imported (found
    without importing it: `sim` never imports torch), else None."""
    import importlib.util
    if importlib.util.find_spec(module) is None:
        return f"{module} is not installed; install the {extra!r} extra: pip install -e .[{extra}]"
    return None


def file_problem(path: str | os.PathLike) -> str | None:
    """Before any work, whether a file can be written at `path` (its folder is made as it is
    written): None if so, else one line saying why not (a folder at the path, a file where a
    folder should be, no permission, a read-only or virtual file system such as /proc)."""
    path = Path(path)
    if path.is_dir():
        return f"{path} is a folder; give a file name"
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        return f"{folder} is a file, not a folder; {path} cannot be written under it"
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        return f"cannot write to {folder}: {e.strerror or e}"
    return None


class Heartbeat:
    """Progress lines for a silent stretch, on any clock: `beat()` writes `line(seconds)`
    (the seconds since the silence began) once `first` seconds of `clock` have passed
    without a line, then every `every` seconds; `said()` tells it a line of the caller's
    own just went out, so the silence starts over. As a context manager it beats from a
    thread on the real clock; a test calls `beat()` itself on a clock it moves.

        >>> now, out = [0.0], []
        >>> h = Heartbeat(lambda s: f"{s:.0f} s so far", first=2, every=5, clock=lambda: now[0], write=out.append)
        >>> for now[0] in (1.9, 2.0, 6.9, 7.0):
        ...     _ = h.beat()
        >>> out
        ['2 s so far', '7 s so far']
    """

    def __init__(self, line: Callable[[float], str], every: float = 5.0, first: float | None = None,
                 clock: Callable[[], float] = time.monotonic, write: Callable[[str], None] | None = None):
        self.line, self.every, self.first = line, every, every if first is None else first
        self.clock, self.write = clock, write or (lambda text: print(text, file=sys.stderr, flush=True))
        self._done, self._lock = threading.Event(), threading.Lock()  # said() and beat() come from two threads
        self._thread: threading.Thread | None = None
        self.said()

    def said(self) -> None:
        """A line of the caller's own went out: the silence starts now."""
        with self._lock:
            self.quiet_since = self.last = self.clock()
            self.beats = 0

    def due(self) -> float:
        """When, on `clock`, the next beat writes a line (unless `said()` comes first)."""
        return self.last + (self.every if self.beats else self.first)

    def beat(self) -> bool:
        """Write a line if one is due; say whether it did."""
        with self._lock:
            now = self.clock()
            if now < self.due():
                return False
            self.last, self.beats = now, self.beats + 1
            self.write(self.line(now - self.quiet_since))
            return True

    def __enter__(self) -> "Heartbeat":
        def run() -> None:
            while not self._done.wait(max(0.0, self.due() - self.clock())):
                self.beat()
        self._thread = threading.Thread(target=run, name="heartbeat", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()


def heartbeat(prog: str, what: str, first: float = 2.0, every: float = 5.0) -> Heartbeat:
    """While the block runs past `first` seconds, a plain progress line on stderr every `every`
    seconds (`sim.plot: building zb-auto: 7 s so far`): a long build or simulation is never silent,
    a short one prints nothing (`with heartbeat(...):`; a `Heartbeat` on the real clock)."""
    return Heartbeat(lambda s: f"{prog}: {what}: {s:.0f} s so far", every=every, first=first)


class DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default, except for flags and options with none to show."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default in (None, False, argparse.SUPPRESS):
            return action.help or ""
        return super()._get_help_string(action)
