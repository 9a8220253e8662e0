"""The LMDB environment: sub-databases, map growth, transactions (the writer lock is the
Writer's: :mod:`npmdb.storage.transaction`)."""

from __future__ import annotations

import contextlib
import errno
import os
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

import lmdb

from npmdb.errors import InterfaceError, OperationalError

from .mapped import MappedFile

__all__ = ["Env", "SUBDBS"]

T = TypeVar("T")

SUBDBS = ("meta", "docs", "docids", "segcols", "vectors", "versions", "tags", "segments",
          "generations", "checkpoints")
INITIAL_MAP = 1 << 30  # 1 GiB; grows by doubling when full
MAX_MAP = 1 << 40


# realpath -> [lmdb.Environment, dbs, refcount, readonly, gate, mapped, data.mdb's file id]
_SHARED: dict[str, list] = {}
_SHARED_LOCK = threading.Lock()
CLOSE_WAIT = 60.0  # seconds close() waits for other threads' queries to end


@dataclass
class _Thread:
    """One thread's part in a :class:`_Gate`: its live transactions and its open read
    transactions (innermost last)."""

    n: int = 0
    txns: list = field(default_factory=list)


class _Gate:
    """Keeps a remap of the LMDB file (map growth) away from live transactions.

    ``set_mapsize`` unmaps and remaps the file: py-lmdb invalidates every transaction of
    this process, and zero-copy values read through one would point at unmapped memory (a
    segfault). Transactions register here; a resize waits until none is live and holds
    new ones back meanwhile. A thread that itself holds a transaction cannot wait for
    that, so it gets a clear (retryable) OperationalError instead.

    Closing the environment unmaps it the same way: :meth:`drain` waits for the other
    threads' transactions to end and refuses new ones.
    """

    def __init__(self, mapped: int = 0) -> None:
        self.cond = threading.Condition()
        self.live = 0
        self.resizing = False
        self.mine = threading.local()
        self.mapped = mapped  # this process's map size
        self.closing = False
        self.idle: Callable[[], Any] | None = None  # called when the last transaction ends

    def try_resize(self, env, size: int) -> None:
        """Grow the map now if no transaction of this process is live (never waits)."""
        with self.cond:
            if self.live or self.resizing or size <= self.mapped:
                return
            env.set_mapsize(size)
            self.mapped = size

    def _own(self) -> "_Thread":
        """The calling thread's record: its live transactions."""
        rec = getattr(self.mine, "rec", None)
        if rec is None:
            rec = self.mine.rec = _Thread()
        return rec

    def enter(self) -> "_Thread":
        """Count a transaction of the calling thread as live; returns that thread's record,
        which :meth:`leave` takes (a generator's transaction may end on another thread, as a
        web server resumes a streamed iterator: it is the entering thread's that ends)."""
        rec = self._own()
        with self.cond:
            if self.closing and not rec.n:
                raise InterfaceError("the database handle was closed (by another thread, "
                                     "while this one was using it): open it again")
            while self.resizing and not rec.n:  # a nested entry must not wait for itself
                self.cond.wait()
            self.live += 1
            rec.n += 1
        return rec

    def push(self, rec: "_Thread", txn) -> None:
        with self.cond:  # a generator's transaction may end on another thread
            rec.txns.append(txn)

    def pop(self, rec: "_Thread", txn) -> None:
        with self.cond:
            stack = rec.txns
            for i in range(len(stack) - 1, -1, -1):  # generators may close out of order
                if stack[i] is txn:
                    del stack[i]
                    break

    def outer(self):
        """This thread's innermost open read transaction, if any."""
        rec = self._own()
        with self.cond:
            return rec.txns[-1] if rec.txns else None

    def leave(self, rec: "_Thread") -> None:
        idle = None
        with self.cond:
            rec.n -= 1
            self.live -= 1
            if self.live == 0 or self.closing:
                self.cond.notify_all()
            if self.live == 0:
                idle, self.idle = self.idle, None
        if idle is not None:
            idle()

    def when_idle(self, fn: Callable[[], Any]) -> None:
        """Call ``fn`` now if no transaction is live, else when the last one ends."""
        with self.cond:
            if self.live:
                self.idle = fn
                return
        fn()

    def drain(self, timeout: float) -> bool:
        """Refuse new transactions and wait up to ``timeout`` seconds for those of other
        threads to end (this thread's own, an unfinished generator, cannot); False if some
        are still live then."""
        own = self._own().n
        deadline = time.monotonic() + timeout
        with self.cond:
            self.closing = True
            while self.live > own:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(left)
        return True

    def resize(self, env, size: int, path: Path, timeout: float = 60.0) -> None:
        if self._own().n:
            raise OperationalError(
                f"the LMDB map of {path} must be resized, but this thread holds an open read "
                "transaction (a snapshot, or an unfinished documents() iterator): finish it "
                "and retry")
        with self.cond:
            while self.resizing:
                self.cond.wait()
            self.resizing = True
            try:
                deadline = time.monotonic() + timeout
                while self.live:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise OperationalError(
                            f"the LMDB map of {path} must be resized, but {self.live} "
                            f"transactions of this process stayed open for {timeout:.0f} s "
                            "(the database grew while a query ran): retry")
                    self.cond.wait(left)
                env.set_mapsize(size)
                self.mapped = env.info()["map_size"]
            finally:
                self.resizing = False
                self.cond.notify_all()


#: Bytes reserved for a new ``lock.mdb`` (LMDB's reader table: 256 readers of 64 bytes and
#: its header fit).
LOCK_FILE_BYTES = 64 << 10


def _reserve_lock_file(path: Path) -> None:
    """Allocate a new ``lock.mdb`` before LMDB maps it. LMDB makes it a sparse file and
    writes through the map: on a full disk the first write is a SIGBUS, which kills the
    process. Allocated here, a full disk is an OperationalError instead."""
    if path.exists():
        return
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return
    except OSError as exc:
        raise OperationalError(f"cannot create {path}: {exc.strerror or exc}") from None
    try:
        os.posix_fallocate(fd, 0, LOCK_FILE_BYTES)
        full = False
    except OSError as exc:
        # a file system without fallocate (EOPNOTSUPP, EINVAL): LMDB sizes it as before
        full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
    finally:
        os.close(fd)
    if full:
        path.unlink(missing_ok=True)
        raise OperationalError(f"the disk is full ({path.parent}): cannot create the "
                               "database's lock file; free some space and retry")


class Env:
    """An LMDB environment holding npmdb's sub-databases.

    LMDB allows one environment per file per process, so handles on the same directory
    share it (reference-counted); ``readonly`` is then enforced by npmdb, not by LMDB.
    """

    def __init__(self, path: Path, *, readonly: bool = False, create: bool = True) -> None:
        self.path = Path(path)
        self._data = str(self.path / "data.mdb")
        self.readonly = readonly
        self._key = str(self.path.resolve())
        self._closed = False
        with _SHARED_LOCK:
            shared = _SHARED.get(self._key)
            # shared only while it is the same file: a database removed (or replaced) and
            # made again at this path is another store, which the old map does not show
            if shared is not None and shared[6] == file_id(self.path / "data.mdb"):
                if shared[3] and not readonly:
                    raise OperationalError(
                        f"{self.path} is already open read-only in this process; close that "
                        "handle before opening it for writing")
                shared[2] += 1
                self.env, self.dbs, self._gate, self.mapped, self.file_id = \
                    shared[0], shared[1], shared[4], shared[5], shared[6]
            else:
                self._open(readonly, create)
                self.file_id = file_id(self.path / "data.mdb")
                self._gate = _Gate(self.env.info()["map_size"])
                # write-once values (vector chunks, columns) read without py-lmdb's touch
                self.mapped = MappedFile(self.path / "data.mdb", self.env.stat()["psize"])
                _SHARED[self._key] = [self.env, self.dbs, 1, readonly, self._gate,
                                      self.mapped, self.file_id]
        # a handle dropped without close() lets go of the environment when collected
        self._release = weakref.finalize(self, _release, self._key, self.env, self._gate)

    def _open(self, readonly: bool, create: bool) -> None:
        data = self.path / "data.mdb"
        if readonly and data.exists() and data.stat().st_size == 0:  # LMDB: "Bad file descriptor"
            raise OperationalError(
                f"{self.path} holds an unfinished npmdb database (its data.mdb is empty: its "
                "creation was interrupted before anything was committed): open it for "
                "writing with create=True to initialise it")
        if not readonly:
            _reserve_lock_file(self.path / "lock.mdb")
        map_size = max(INITIAL_MAP, _next_pow2(data.stat().st_size * 2) if data.exists() else 0)
        try:
            self.env = lmdb.open(
                str(self.path), subdir=True, map_size=min(map_size, MAX_MAP), max_dbs=len(SUBDBS) + 2,
                readonly=readonly, create=create and not readonly, lock=True, readahead=False,
                max_readers=256, meminit=False)
        except lmdb.Error as exc:
            why = "the disk is full" if _is_enospc(exc) else str(exc)
            raise OperationalError(f"cannot open the LMDB store in {self.path}: {why}") from exc
        try:  # a file shorter than its last committed page would be read past its end (SIGBUS)
            size = data.stat().st_size
            end = (self.env.info()["last_pgno"] + 1) * self.env.stat()["psize"]
        except (OSError, lmdb.Error):
            size = end = 0
        if size < end:
            self.env.close()
            raise OperationalError(
                f"{data} is truncated ({size} bytes; its last committed page ends at byte "
                f"{end}): the file was damaged; restore it from a backup")
        try:  # the main table holds the named tables' names: any other key is not ours
            with self.env.begin() as txn:
                foreign = [bytes(k) for k in txn.cursor().iternext(values=False)
                           if bytes(k).decode(errors="replace") not in SUBDBS]
        except lmdb.Error:
            foreign = []
        if foreign:
            self.env.close()
            raise OperationalError(
                f"{self.path} holds an LMDB store that is not an npmdb database (its main "
                f"table holds {foreign[0]!r:.60}, which npmdb never writes); nothing was "
                "changed: give npmdb a new or empty directory")
        self.dbs = {}
        for name in SUBDBS:
            try:
                self.dbs[name] = self.env.open_db(name.encode(), create=not readonly)
            except lmdb.NotFoundError:
                self.env.close()
                raise OperationalError(
                    f"{self.path} is not an npmdb database (missing table {name!r})") from None
            except lmdb.Error as exc:  # making the tables: a full disk
                self.env.close()
                why = "the disk is full" if _is_enospc(exc) else str(exc)
                raise OperationalError(f"cannot open the LMDB store in {self.path}: {why}; "
                                       "nothing was committed") from None

    def close(self) -> None:
        """Let go of the environment (see :func:`_release`); a handle dropped without it
        does the same when it is collected."""
        if self._closed:
            return
        self._closed = True
        self._release()

    # -- transactions ------------------------------------------------------------------

    @contextlib.contextmanager
    def read(self, *, buffers: bool = False) -> Iterator[lmdb.Transaction]:
        """A read transaction: one consistent snapshot of every sub-database."""
        gate = self._gate
        self._headroom()
        rec = gate.enter()
        entered = True  # left once: a failed re-entry below must not be left again
        try:
            borrowed = False
            try:
                txn = self._begin(buffers)
            except lmdb.MapResizedError:
                outer = gate.outer()
                if outer is not None:
                    # Another process grew the file past this process's map while this
                    # thread holds a snapshot, which a remap would invalidate. A nested
                    # read (segment columns, generation records, checksums: data that
                    # snapshot already references) is served from that snapshot.
                    txn, borrowed = outer, True
                else:
                    gate.leave(rec)
                    entered = False
                    try:  # another process grew the map: adopt its size
                        self._gate.resize(self.env, 0, self.path, timeout=5.0)
                    finally:
                        rec = gate.enter()
                        entered = True
                    txn = self.env.begin(buffers=buffers)
            if not borrowed:
                gate.push(rec, txn)
            try:
                yield txn
            except lmdb.Error as exc:
                raise OperationalError(f"LMDB read failed in {self.path}: {exc} (run "
                                       f"`npmdb check {self.path}`)") from exc
            finally:
                if not borrowed:
                    gate.pop(rec, txn)
                    txn.abort()
        finally:
            if entered:
                gate.leave(rec)

    def _begin(self, buffers: bool) -> lmdb.Transaction:
        """A read transaction; a full reader table is cleared of the slots of dead
        processes once, then it is an OperationalError saying what to do."""
        try:
            return self.env.begin(buffers=buffers)
        except lmdb.ReadersFullError:
            with contextlib.suppress(lmdb.Error):
                self.env.reader_check()
            try:
                return self.env.begin(buffers=buffers)
            except lmdb.ReadersFullError:
                raise OperationalError(
                    f"too many open read transactions on {self.path} (LMDB's reader table "
                    "is full): finish open snapshots and documents() iterators, or use "
                    "fewer processes and threads at once") from None

    def oldest_reader_txn(self) -> int | None:
        """The oldest snapshot (transaction id) a live read transaction of any process
        holds, or None when none is open. Slots of dead processes are cleared first."""
        try:
            self.env.reader_check()
            table = self.env.readers()
        except lmdb.Error as exc:
            raise OperationalError(f"cannot read the LMDB reader table of {self.path}: {exc}"
                                   ) from exc
        ids = [int(parts[2]) for parts in (line.split() for line in table.splitlines()[1:])
               if len(parts) >= 3 and parts[2].isdigit()]
        return min(ids) if ids else None

    def write(self, fn: Callable[[lmdb.Transaction], T]) -> T:
        """Run ``fn`` in one write transaction; grow the map and retry when it is full."""
        if self.readonly:
            raise OperationalError("the database was opened read-only")
        while True:
            resize = None
            self._headroom()
            rec = self._gate.enter()
            try:
                try:
                    txn = self.env.begin(write=True)
                except lmdb.MapResizedError:
                    resize = 0
                except lmdb.Error as exc:
                    raise OperationalError(f"cannot begin a write in {self.path}: {exc}") from exc
                if resize is None:
                    try:
                        result = fn(txn)
                        txn.commit()
                        return result
                    except lmdb.MapFullError:
                        txn.abort()
                        resize = -1
                    except lmdb.MapResizedError:
                        txn.abort()
                        resize = 0
                    except lmdb.DiskError as exc:
                        txn.abort()
                        raise OperationalError(f"disk error while writing {self.path}: {exc}; "
                                               "the change was not committed") from exc
                    except lmdb.Error as exc:
                        txn.abort()
                        if _is_enospc(exc):
                            raise OperationalError(f"the disk is full ({self.path}); the change "
                                                   "was not committed: free space and retry") from exc
                        raise OperationalError(f"LMDB write failed in {self.path}: {exc}") from exc
                    except BaseException:
                        txn.abort()
                        raise
            finally:
                self._gate.leave(rec)
            if resize == 0:
                self._resize(0)
            else:
                self._grow()

    def _headroom(self) -> None:
        """Keep this process's map at least twice the size of the file, growing it while
        no transaction of the process is live. Another process's writes can then almost
        never outgrow this map in the middle of a query, when a remap would have to wait
        for (or fail) the query's own transaction."""
        gate = self._gate
        if gate.live or gate.resizing:
            return
        try:
            size = os.stat(self._data).st_size
        except OSError:
            return
        if size * 2 > gate.mapped:
            gate.try_resize(self.env, min(_next_pow2(size * 4), MAX_MAP))

    def _grow(self) -> None:
        size = self.env.info()["map_size"]
        if size >= MAX_MAP:
            raise OperationalError(f"the LMDB map reached its maximum size ({MAX_MAP} bytes)")
        self._resize(min(size * 2, MAX_MAP))

    def _resize(self, size: int) -> None:
        self._gate.resize(self.env, size, self.path)

    def sync(self) -> None:
        try:
            self.env.sync(True)
        except lmdb.Error as exc:
            if _is_enospc(exc):
                raise OperationalError(f"the disk is full ({self.path}): {exc}") from exc
            raise OperationalError(f"cannot sync {self.path} to disk: {exc}") from exc


def _next_pow2(n: int) -> int:
    p = 1
    while p < n:
        p <<= 1
    return p


def _is_enospc(exc: Exception) -> bool:
    return "No space left" in str(exc) or getattr(exc, "errno", None) == errno.ENOSPC


def _release(key: str, env: lmdb.Environment, gate: "_Gate") -> None:
    """One handle lets go of the shared environment ``env``; the last one closes it: it
    waits up to CLOSE_WAIT seconds for the other threads' transactions, and unmaps only
    once no transaction is live (a query still reading zero-copy values, or this thread's
    own open snapshot, would crash the process on an unmapped file)."""
    with _SHARED_LOCK:
        shared = _SHARED.get(key)
        if shared is not None and shared[0] is env:
            shared[2] -= 1
            if shared[2] > 0:
                return
            del _SHARED[key]
    gate.drain(CLOSE_WAIT)
    gate.when_idle(env.close)


def file_id(path: Path) -> tuple[int, int] | None:
    """(device, inode) of ``path``; None where it is gone."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino
