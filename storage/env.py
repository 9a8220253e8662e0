"""The LMDB environment: sub-databases, map growth, transactions, the writer lock."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import threading
import time
from pathlib import Path
from typing import Callable, Iterator, TypeVar

import lmdb

from npmdb.errors import OperationalError

__all__ = ["Env", "SUBDBS", "WriterLock"]

T = TypeVar("T")

SUBDBS = ("meta", "docs", "docids", "segcols", "vectors", "versions", "tags", "segments",
          "generations", "checkpoints")
INITIAL_MAP = 1 << 30  # 1 GiB; grows by doubling when full
MAX_MAP = 1 << 40


_SHARED: dict[str, list] = {}  # realpath -> [lmdb.Environment, dbs, refcount, readonly]
_SHARED_LOCK = threading.Lock()


class Env:
    """An LMDB environment holding npmdb's sub-databases.

    LMDB allows one environment per file per process, so handles on the same directory
    share it (reference-counted); ``readonly`` is then enforced by npmdb, not by LMDB.
    """

    def __init__(self, path: Path, *, readonly: bool = False, create: bool = True) -> None:
        self.path = Path(path)
        self.readonly = readonly
        self._key = str(self.path.resolve())
        self._closed = False
        with _SHARED_LOCK:
            shared = _SHARED.get(self._key)
            if shared is not None:
                if shared[3] and not readonly:
                    raise OperationalError(
                        f"{self.path} is already open read-only in this process; close that "
                        "handle before opening it for writing")
                shared[2] += 1
                self.env, self.dbs = shared[0], shared[1]
                return
            self._open(readonly, create)
            _SHARED[self._key] = [self.env, self.dbs, 1, readonly]

    def _open(self, readonly: bool, create: bool) -> None:
        data = self.path / "data.mdb"
        map_size = max(INITIAL_MAP, _next_pow2(data.stat().st_size * 2) if data.exists() else 0)
        try:
            self.env = lmdb.open(
                str(self.path), subdir=True, map_size=min(map_size, MAX_MAP), max_dbs=len(SUBDBS) + 2,
                readonly=readonly, create=create and not readonly, lock=True, readahead=False,
                max_readers=256, meminit=False)
        except lmdb.Error as exc:
            raise OperationalError(f"cannot open the LMDB store in {self.path}: {exc}") from exc
        self.dbs = {}
        for name in SUBDBS:
            try:
                self.dbs[name] = self.env.open_db(name.encode(), create=not readonly)
            except lmdb.NotFoundError:
                self.env.close()
                raise OperationalError(
                    f"{self.path} is not an npmdb database (missing table {name!r})") from None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with _SHARED_LOCK:
            shared = _SHARED.get(self._key)
            if shared is not None and shared[0] is self.env:
                shared[2] -= 1
                if shared[2] > 0:
                    return
                del _SHARED[self._key]
        self.env.close()

    # -- transactions ------------------------------------------------------------------

    @contextlib.contextmanager
    def read(self, *, buffers: bool = False) -> Iterator[lmdb.Transaction]:
        """A read transaction: one consistent snapshot of every sub-database."""
        try:
            txn = self.env.begin(buffers=buffers)
        except lmdb.MapResizedError:
            self.env.set_mapsize(0)  # another process grew the map: adopt its size
            txn = self.env.begin(buffers=buffers)
        try:
            yield txn
        finally:
            txn.abort()

    def write(self, fn: Callable[[lmdb.Transaction], T]) -> T:
        """Run ``fn`` in one write transaction; grow the map and retry when it is full."""
        if self.readonly:
            raise OperationalError("the database was opened read-only")
        while True:
            txn = self.env.begin(write=True)
            try:
                result = fn(txn)
                txn.commit()
                return result
            except lmdb.MapFullError:
                txn.abort()
                self._grow()
            except lmdb.MapResizedError:
                txn.abort()
                self.env.set_mapsize(0)
            except lmdb.DiskError as exc:
                txn.abort()
                raise OperationalError(f"disk error while writing {self.path}: {exc}; the "
                                       "change was not committed") from exc
            except lmdb.Error as exc:
                txn.abort()
                if _is_enospc(exc):
                    raise OperationalError(f"the disk is full ({self.path}); the change was not "
                                           "committed: free space and retry") from exc
                raise OperationalError(f"LMDB write failed in {self.path}: {exc}") from exc
            except BaseException:
                txn.abort()
                raise

    def _grow(self) -> None:
        size = self.env.info()["map_size"]
        if size >= MAX_MAP:
            raise OperationalError(f"the LMDB map reached its maximum size ({MAX_MAP} bytes)")
        self.env.set_mapsize(min(size * 2, MAX_MAP))

    def sync(self) -> None:
        self.env.sync(True)


class WriterLock:
    """An exclusive, process-level writer lock (``flock`` on ``write.lock``).

    LMDB serialises write transactions itself, but npmdb does long work (encoding, index
    builds) before its commit transaction, so a whole change holds this lock.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path) / "write.lock"
        self.fd: int | None = None
        self.depth = 0

    def acquire(self, timeout: float = 0.0) -> None:
        if self.fd is not None:
            self.depth += 1
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + max(timeout, 0.0)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = _read_pid(fd)
                    os.close(fd)
                    who = f" (pid {holder})" if holder else ""
                    raise OperationalError(
                        f"the database {self.path.parent} is locked by another writer{who}; "
                        "wait for it to finish, or pass timeout= to wait") from None
                time.sleep(0.05)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self.fd = fd
        self.depth = 1

    def release(self) -> None:
        if self.fd is None:
            return
        self.depth -= 1
        if self.depth > 0:
            return
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
        self.fd = None

    @property
    def held(self) -> bool:
        return self.fd is not None


def _read_pid(fd: int) -> int | None:
    try:
        return int(os.pread(fd, 32, 0).decode().strip() or 0) or None
    except (OSError, ValueError):
        return None


def _next_pow2(n: int) -> int:
    p = 1
    while p < n:
        p <<= 1
    return p


def _is_enospc(exc: Exception) -> bool:
    return "No space left" in str(exc) or getattr(exc, "errno", None) == errno.ENOSPC
