"""Files a user keeps are written whole or not at all."""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import IO, Iterator


def check_writable(path: str | os.PathLike) -> Path:
    """`path` as a Path, or an OSError naming it: `IsADirectoryError` where it is a folder,
    `FileNotFoundError` where its folder does not exist (nothing is created),
    `NotADirectoryError` where that "folder" is a file."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"cannot write {path}: it is a directory; give a file name")
    parent = path.parent
    if not parent.exists():
        raise FileNotFoundError(f"cannot write {path}: directory {parent} does not exist")
    if not parent.is_dir():
        raise NotADirectoryError(f"cannot write {path}: {parent} is not a directory")
    return path


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w") -> Iterator[IO]:
    """Open a temporary file next to `path`; on success rename it over `path` (atomic on
    POSIX), on error delete it, so a reader never sees half a file. The folder must exist
    (`check_writable`): a mistyped folder is an error, not a new folder."""
    path = check_writable(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; a kept file gets the usual mode
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
