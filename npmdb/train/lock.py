"""One training run on a database at a time: ``<db>/train.lock``, taken without waiting
(an ``flock``, let go when its process ends). A run holds it from before its first step to
its report; a vacuum takes it before it removes a saved state, so never under a run."""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import Iterator

__all__ = ["LOCK_FILE", "run_lock"]

LOCK_FILE = "train.lock"


@contextlib.contextmanager
def run_lock(root: str | os.PathLike) -> Iterator[str | None]:
    """The training lock of the database at ``root`` for the block: yields None when this
    process holds it, else what its holder wrote (a pid, or ""). OSError where the lock file
    cannot be opened."""
    fd = os.open(Path(root) / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield os.pread(fd, 32, 0).decode(errors="replace").strip()
            return
        with contextlib.suppress(OSError):  # the pid is informational
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield None
    finally:
        os.close(fd)  # closing lets the lock go
