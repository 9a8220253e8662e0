"""The writer lock of a database directory: an exclusive ``flock`` on ``write.lock``, held
for a whole change (LMDB serialises its own write transactions, but a change does long work,
encoding and index builds, before its commit transaction)."""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from npmdb.errors import OperationalError

__all__ = ["FileLock"]


class FileLock:
    """An exclusive, process-level lock (``flock`` on ``write.lock``). LMDB serialises its
    own write transactions, but a change does long work (encoding, index builds) before
    its commit transaction, so a whole change holds this lock."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path) / "write.lock"
        self.fd: int | None = None

    def acquire(self, timeout: float) -> None:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise OperationalError(f"cannot open the writer lock {self.path}: {exc}") from exc
        deadline = time.monotonic() + max(timeout, 0.0)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        holder = _read_pid(fd)
                        who = f" (pid {holder})" if holder else ""
                        raise OperationalError(
                            f"the database {self.path.parent} is locked by another "
                            f"writer{who}; retry when it has finished, or let the call wait: "
                            "timeout=SECONDS in Python, --timeout SECONDS on the command line"
                            ) from None
                    time.sleep(0.05)
            # held from here on: release() must see it (a Ctrl-C before it was recorded
            # left the lock held by a descriptor nothing closed, until the process ended)
            self.fd = fd
        except BaseException:
            if self.fd != fd:
                os.close(fd)
            raise
        try:  # the pid is informational; a full disk must not stop the writer here
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
        except OSError:
            pass

    def release(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)


def _read_pid(fd: int) -> int | None:
    try:
        return int(os.pread(fd, 32, 0).decode().strip() or 0) or None
    except (OSError, ValueError):
        return None
