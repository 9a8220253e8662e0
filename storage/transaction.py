"""The Writer: the one owner of every change to a database.

An ``add``, a ``delete``, a batch, ``optimize``, ``restore``, ``vacuum`` and an embedding
refresh all run as the Writer of their handle:

* **the lock**: an ``flock`` on ``write.lock`` (one writer process at a time) and, inside
  the process, one owning thread per handle: another thread waits until the owner is
  done (up to ``timeout`` seconds, then :class:`~npmdb.errors.OperationalError`); it never
  joins the owner's batch. The owner may nest (a batch's adds);
* **pending changes** of a transaction (new segments, tombstones, claimed ids), the
  version it was read from, **id and segment allocation**;
* **per-call rollback**: a call inside a transaction runs in a :meth:`savepoint`; if it
  fails, the transaction is exactly as before the call (what the call wrote is removed),
  as with a SQLite savepoint;
* **the commit**: pending changes, or a maintenance operation, are committed as
  :mod:`~npmdb.storage.versions` operations against the version they read, in one LMDB
  transaction, then synced;
* **recovery**: when it takes the lock, and after a failed change, it removes what a
  killed or failed writer left (:func:`npmdb.storage.cleanup.recover`).
"""

from __future__ import annotations

import errno
import re
import threading
import time
from collections import deque
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from npmdb.errors import (Error, IntegrityError, InterfaceError, OperationalError,
                          ProgrammingError)

from . import codec as C
from . import format as F
from . import versions as V
from .cleanup import recover, remove_segment, seal
from .dense import DenseParams
from .env import Env, file_id
from .filelock import FileLock
from .integrity import seal_segment
from .segment_writer import Bar, SegmentWriter, no_bar
from .segments import Readers, SegmentReader

__all__ = ["Writer", "Transaction", "FileLock"]


@dataclass
class _Changes:
    """What an open transaction has written but not committed."""

    read: V.Manifest | None            # the version it began on (None: empty database)
    message: str = ""
    segments: list[F.SegmentRecord] = field(default_factory=list)
    deleted: dict[int, set[int]] = field(default_factory=dict)
    new_ids: dict[str, tuple[int, int]] = field(default_factory=dict)
    auto_used: int = 0
    allocated: list[int] = field(default_factory=list)  # segment numbers handed out

    @property
    def changed(self) -> bool:
        return bool(self.segments or self.deleted)

    @property
    def generation(self) -> int:
        return self.read.generation if self.read else 0

    def view(self) -> V.Manifest:
        """The read version with this transaction's tombstones (for id lookups)."""
        m = self.read or V.EMPTY
        deleted = {s: tuple(sorted(set(v) | self.deleted.get(s, set())))
                   for s, v in m.deleted.items()}
        for s, v in self.deleted.items():
            deleted.setdefault(s, tuple(sorted(v)))
        return V.Manifest(m.id, m.parent, m.time, m.segments, deleted, m.generation, m.stats)

    def mark(self) -> tuple:
        return (len(self.segments), {s: set(v) for s, v in self.deleted.items()},
                dict(self.new_ids), self.auto_used, len(self.allocated))

    def rollback(self, mark: tuple) -> list[int]:
        """Back to ``mark``; returns the segments allocated since (to remove)."""
        n_segs, deleted, new_ids, auto_used, n_alloc = mark
        del self.segments[n_segs:]
        self.deleted, self.new_ids, self.auto_used = deleted, new_ids, auto_used
        dropped = self.allocated[n_alloc:]
        del self.allocated[n_alloc:]
        return dropped

    def operations(self) -> list[V.Operation]:
        ops: list[V.Operation] = []
        if self.segments or self.auto_used:
            ops.append(V.Append(tuple(self.segments), self.generation, self.auto_used))
        if self.deleted:
            ops.append(V.Delete(tuple((s, tuple(sorted(v)))
                                      for s, v in sorted(self.deleted.items()))))
        return ops


@dataclass
class Transaction:
    """The handle ``Writer.transaction()`` yields: ``outermost`` is False when it joined a
    transaction this thread already had open (a batch); after the block, ``version`` is
    what it committed (HEAD's id when there was nothing to commit; None when nested)."""

    writer: "Writer"
    outermost: bool
    version: int | None = None


_ENOSPC_TEXT = re.compile(r"No space left on device|os error 28\b|Disk quota exceeded|"
                          r"os error 122\b")


def os_failure(exc: BaseException) -> bool:
    """A full disk, a read-only or failing file system (tantivy and FAISS report it as
    ValueError / RuntimeError text)."""
    return isinstance(exc, OSError) or (isinstance(exc, Exception) and not isinstance(
        exc, Error) and bool(_ENOSPC_TEXT.search(str(exc))))


_UNREAD = object()


def os_message(exc: BaseException, path: Path, committed: bool | None) -> str:
    code = getattr(exc, "errno", None)
    if code in (errno.ENOSPC, errno.EDQUOT) or _ENOSPC_TEXT.search(str(exc)):
        what = f"the disk is full ({path})"
    elif code == errno.EROFS:
        what = f"the file system of {path} is read-only"
    else:
        what = f"I/O error in {path}"
    tail = ("the change was committed before the error" if committed else
            "the change was not committed: the database is as it was before it")
    return f"{what}: {exc}; {tail}"


class Writer:
    """The writer of one database handle (see the module docstring).

    ``config``: the database's configuration (``block_len``, ``codec``, ``dense``, ``dim``);
    ``readers``: the handle's segment readers; ``params``: dense index parameters;
    ``timeout``: seconds to wait for the lock (another process's writer, or another thread
    of this handle) before OperationalError; ``progress``: show progress bars (None: when
    stderr is a terminal); ``bars(total, desc, unit)`` makes one.
    """

    def __init__(self, env: Env, root: Path, config: dict[str, Any], readers: Readers, *,
                 params: DenseParams, timeout: float = 0.0, progress: bool | None = None,
                 bars: Callable[[int, str, str], Bar] | None = None) -> None:
        self.env = env
        self.root = Path(root)
        self.config = config
        self.readers = readers
        self.params = params
        self.timeout = timeout
        self.progress_enabled = progress
        self.progress = bars or no_bar
        self._file = FileLock(self.root)
        self._data_id = env.file_id  # the store this handle opened
        self._cond = threading.Condition()
        self._owner: int | None = None
        self._depth = 0
        self._queue: deque[object] = deque()  # threads waiting for the writer, in turn
        self._closed = False
        self._changes: _Changes | None = None
        self._allocated: list[int] = []  # segment numbers handed out while held

    @property
    def block_len(self) -> int:
        return int(self.config["block_len"])

    def reader(self, seg: int) -> SegmentReader:
        """The reader of committed segment ``seg``."""
        with self.env.read() as txn:
            return self.readers.get(txn, seg)

    def segment_writer(self, seg: int, gen: int, *, existing: SegmentReader | None = None,
                       codec: str | None = None, engine: str = "local",
                       merged_from: Sequence[int] = ()) -> SegmentWriter:
        """The segment writer for new segment ``seg`` (the database's codec and index kind)
        or, with ``existing``, for generation ``gen`` of that committed segment (its own
        codec, index kind and chunk size)."""
        if existing is not None:
            rec = existing.record
            return SegmentWriter(self.env, self.root, seg, gen, codec=rec.codec,
                                 dense=rec.dense, params=self.params, dim=rec.dim,
                                 chunk=rec.chunk, columns=existing.columns(),
                                 progress=self.progress, engine=engine)
        head = self.head()
        corpus = int(head.stats.get("tokens", 0)) if head else 0
        return SegmentWriter(self.env, self.root, seg, gen,
                             codec=self.new_codec(corpus, codec),
                             dense=str(self.config.get("dense", "hnsw")), params=self.params,
                             dim=int(self.config["dim"]), progress=self.progress,
                             engine=engine, merged_from=merged_from, corpus_tokens=corpus)

    def new_codec(self, corpus_tokens: int, codec: str | None = None) -> str:
        """The codec a new segment stores in a corpus of ``corpus_tokens``: ``codec``, else
        the database's (``auto`` resolved by corpus size, with the index's threshold)."""
        from . import segment_writer

        return C.resolve_codec(codec or str(self.config.get("codec", "float16")),
                               corpus_tokens, segment_writer.AUTO_IVF_TOKENS)

    def save_config(self) -> None:
        """Record ``self.config`` (the caller holds the writer lock and changed it:
        ``optimize(index=..., codec=...)``, which converts the existing segments)."""
        config = dict(self.config)
        self.env.write(lambda txn: V.put_meta(txn, self.env.dbs, "config", config))

    # -- the lock -----------------------------------------------------------------------

    @contextmanager
    def hold(self, timeout: float | None = None) -> Iterator["Writer"]:
        """Be the writer, for this thread: the outermost hold takes the file lock and
        recovers; nested holds of the same thread re-enter. ``timeout`` overrides the
        handle's (None: the handle's)."""
        wait = self.timeout if timeout is None else timeout
        outer = self._enter(wait)
        head: Any = _UNREAD  # HEAD when the hold began (not read: nothing was committed)
        try:
            if outer:
                self._file.acquire(max(0.0, wait))
                if file_id(self.root / "data.mdb") != self._data_id:
                    self._file.release()  # a change here would commit to a removed file
                    raise OperationalError(
                        f"the database {self.root} was removed or replaced by another process "
                        "while this handle was open (a first add that failed removes the "
                        "database it made); nothing was written: open it again")
                self._reload_config()
                self._allocated = []
                recover(self.env, self.root)
                head = self.head_id()
            yield self
        except BaseException as exc:
            if outer and isinstance(exc, Exception) and self._file.fd is not None:
                with suppress(Exception):  # remove what the failed change left, now
                    recover(self.env, self.root)
            if os_failure(exc):
                moved: bool | None = False  # HEAD unread: nothing committed yet
                if head is not _UNREAD:
                    moved = None
                    with suppress(Exception):
                        moved = self.head_id() != head
                raise OperationalError(os_message(exc, self.root, outer and moved)) from exc
            raise
        else:
            if outer:
                with suppress(Error):
                    seal(self.env, self.root)
        finally:
            self._exit(outer)

    def _reload_config(self) -> None:
        """The config as committed: another handle's ``optimize(index=, codec=)`` may have
        changed it since this one opened (new segments were written with the old kinds,
        and the next optimize merged back to them). Updated in place: the Database's
        handle holds the same dict."""
        with self.env.read() as txn:
            config = V.get_meta(txn, self.env.dbs, "config")
        if isinstance(config, dict) and config != self.config:
            self.config.clear()
            self.config.update(config)

    def _enter(self, timeout: float) -> bool:
        """Become the writer (False: this thread already is). Threads waiting take it in
        the order they came: a thread that writes in a loop let go and took it again before
        a waiting thread woke, which then timed out."""
        me = threading.get_ident()
        with self._cond:
            self.check_open()
            if self._owner == me:
                self._depth += 1
                return False
            turn = object()
            self._queue.append(turn)
            try:
                deadline = time.monotonic() + max(timeout, 0.0)
                while self._owner is not None or self._queue[0] is not turn:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        waited = f"waited {timeout:g} s: " if timeout > 0 else ""
                        raise OperationalError(
                            f"the database {self.root} is locked by another writer (a thread "
                            f"of this process is writing through the same handle); {waited}"
                            "wait for it to finish, or pass a longer timeout=")
                    self._cond.wait(left)
                    self.check_open()
            finally:
                self._queue.remove(turn)
                self._cond.notify_all()  # the next in turn looks again
            self._owner, self._depth = me, 1
            return True

    def _exit(self, outer: bool) -> None:
        with self._cond:
            self._depth -= 1
            if self._depth == 0:
                self._file.release()
                self._owner = None
                self._cond.notify_all()

    def check_open(self) -> None:
        """Refuse to go on once the handle is closed (a thread writing while another closed
        the handle wrote on without the lock, beside another handle's writer)."""
        if self._closed:
            raise InterfaceError("the database handle was closed (by another thread, while "
                                 "this one was writing); nothing more was written: open it "
                                 "again")

    @property
    def held(self) -> bool:
        """Whether the calling thread is the writer."""
        return self._owner == threading.get_ident()

    def recover_if_free(self) -> None:
        """Recover now if no other writer is active (at open)."""
        try:
            with self.hold(timeout=0.0):
                pass
        except OperationalError:
            pass  # another writer is active; it recovers on its own

    def close(self, wait: float = 10.0) -> None:
        """Close the writer: a thread writing stops at its next step (InterfaceError; what
        it wrote is removed by the next writer's recovery) and lets go of the lock, waited
        for up to ``wait`` seconds (a thread between the calls of a batch stops at its next
        call); the file lock is never released under it."""
        me = threading.get_ident()
        deadline = time.monotonic() + wait
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            while self._owner not in (None, me) and (left := deadline - time.monotonic()) > 0:
                self._cond.wait(left)
            if self._owner is None:  # an owner lets go at its end (this thread's too:
                self._file.release()  # its batch's rollback still needs the lock)

    # -- transactions --------------------------------------------------------------------

    @contextmanager
    def transaction(self, message: str = "") -> Iterator[Transaction]:
        """A unit of work committed as one version when the outermost transaction of this
        thread ends (rolled back if it raises); nested ones join it."""
        V.check_message(message)
        with self.hold():
            if self._changes is not None:  # a nested batch: undone alone if it raises
                with self.savepoint():
                    yield Transaction(self, outermost=False)
                return
            self._changes = _Changes(self.head(), message)
            tx = Transaction(self, outermost=True)
            try:
                yield tx
                changes, self._changes = self._changes, None
                if changes.changed:
                    tx.version = self._commit(changes.operations(), changes.read,
                                              message=changes.message).id
                else:
                    self._remove(changes.allocated)
                    tx.version = self.head_id()
            except BaseException:
                changes, self._changes = self._changes, None
                if changes is not None:
                    self._remove(changes.allocated)
                raise

    @contextmanager
    def savepoint(self) -> Iterator[None]:
        """One call inside the open transaction: if it raises, the transaction is left
        exactly as before the call, and the segments it wrote are removed."""
        changes = self._open()
        mark = changes.mark()
        try:
            yield
        except BaseException:
            self._remove(changes.rollback(mark))
            raise

    @property
    def uncommitted(self) -> bool:
        """The open batch holds changes that are not committed yet (the caller holds the
        writer, so the batch is this thread's)."""
        return self._changes is not None and self._changes.changed

    @property
    def in_batch(self) -> bool:
        """The calling thread has a batch (``Writer.transaction``) open."""
        return self._changes is not None and self.held

    def refuse_uncommitted(self) -> None:
        """Maintenance that commits a version of its own (restore, optimize, a refresh)
        calls this before it does any work: it cannot run inside a batch with changes."""
        if self.uncommitted:
            raise ProgrammingError(
                "this operation commits a version of its own and cannot run inside a batch "
                "with uncommitted changes: run it after the batch")

    def _open(self) -> _Changes:
        if self._changes is None or not self.held:
            raise ProgrammingError("no transaction is open in this thread: use "
                                   "Writer.transaction()")
        return self._changes

    def _remove(self, segments: Sequence[int]) -> None:
        """Remove the segments an undone change wrote, holding the file lock (without it,
        another writer may be writing the same numbers: the next writer's recovery
        removes them instead)."""
        if self._file.fd is None or self._closed:
            return
        for seg in segments:
            remove_segment(self.env, self.root, seg)

    # -- what the open transaction reads and changes ---------------------------------------

    @property
    def generation(self) -> int:
        """The embedding generation new segments of the open transaction are written in."""
        return self._open().generation

    def allocate_segment(self) -> int:
        """A new segment number (never handed out twice, even if its writing fails); in a
        transaction, a failed call's segments are removed at its savepoint."""
        if not self.held:
            raise ProgrammingError("allocating a segment needs the writer: use Writer.hold()")
        self.check_open()
        with self.env.read() as txn:
            nxt = V.next_id(txn, self.env.dbs, "next_segment")
        seg = max([nxt] + [s + 1 for s in self._allocated])
        self._allocated.append(seg)
        if self._changes is not None:
            self._changes.allocated.append(seg)
        return seg

    def assign_ids(self, ids: Sequence[str | None], seen: dict[str, int], first: int = 0
                   ) -> list[str]:
        """Document ids for items ``first, first + 1, ...`` of one add: a ``None`` gets the
        next free ``doc-N`` that no item of ``ids`` gives either; an id given twice in the
        add (``seen``, which this fills) or already live raises IntegrityError."""
        given = {i for i in ids if i is not None}
        assigned: set[str] = set()
        changes = self._open()
        out: list[str] = []
        with self.env.read() as txn:
            m = changes.view()
            auto = V.next_id(txn, self.env.dbs, "next_auto") + changes.auto_used

            def taken(doc_id: str) -> bool:
                return doc_id in changes.new_ids or \
                    V.find_doc(txn, self.env.dbs, m, doc_id) is not None

            for j, doc_id in enumerate(ids):
                i = first + j
                if doc_id is None:
                    while True:
                        cand = f"doc-{auto}"
                        auto += 1
                        changes.auto_used += 1
                        if cand not in seen and cand not in given and not taken(cand):
                            break
                    doc_id = cand
                    assigned.add(doc_id)
                if doc_id in seen:
                    why = (f" ({doc_id!r} was assigned to item {seen[doc_id]}, which had no "
                           "id; give every document an id, or none the form doc-N)"
                           if doc_id in assigned else "")
                    raise IntegrityError(f"duplicate document id {doc_id!r} (items "
                                         f"{seen[doc_id]} and {i} of this add){why}; nothing "
                                         "was written")
                seen[doc_id] = i
                if taken(doc_id):
                    raise IntegrityError(f"a document with id {doc_id!r} already exists; use "
                                         "db.update(...) (`npmdb update` on the command "
                                         "line) to replace it. Nothing was written")
                out.append(doc_id)
        return out

    def append(self, record: F.SegmentRecord, doc_ids: Sequence[str]) -> None:
        """Add a written segment (documents ``doc_ids``, in order) to the transaction."""
        changes = self._open()
        if record.id not in changes.allocated:
            raise ProgrammingError(f"segment {record.id} was not allocated by this transaction")
        changes.segments.append(record)
        for local, doc_id in enumerate(doc_ids):
            changes.new_ids[doc_id] = (record.id, local)

    def delete(self, doc_ids: Sequence[str], *, missing_ok: bool = False) -> int:
        """Tombstone live documents (of HEAD or of this transaction); every id is checked
        before anything changes. Returns how many were deleted."""
        changes = self._open()
        found: list[tuple[str, tuple[int, int]]] = []
        with self.env.read() as txn:
            m = changes.view()
            for doc_id in doc_ids:
                if not isinstance(doc_id, str):
                    raise F.id_type_error(doc_id)
                loc = V.find_doc(txn, self.env.dbs, m, doc_id) or changes.new_ids.get(doc_id)
                if loc is None:
                    if missing_ok:
                        continue
                    raise ProgrammingError(f"no document with id {doc_id!r} to delete")
                found.append((doc_id, loc))
        for doc_id, (seg, local) in found:
            changes.deleted.setdefault(seg, set()).add(local)
            changes.new_ids.pop(doc_id, None)
        return len(found)

    # -- commits --------------------------------------------------------------------------

    def head(self) -> V.Manifest | None:
        with self.env.read() as txn:
            return V.head(txn, self.env.dbs)

    def head_id(self) -> int | None:
        with self.env.read() as txn:
            return V.meta_id(txn, self.env.dbs, "head")

    def commit(self, ops: Sequence[V.Operation], *, read: V.Manifest | None,
               message: str = "", info: dict | None = None, tag: str | None = None,
               meta: dict[bytes, Any] | None = None) -> V.Manifest:
        """Commit ``ops``, read at version ``read``, as one version (see
        :func:`npmdb.storage.versions.commit`); the caller holds the writer. Maintenance
        (restore, optimize, a refresh) commits this way; it cannot while this thread's
        transaction has uncommitted changes. ``meta``: keys of the ``meta`` table set (to
        packed values) in the same transaction, such as a retrained IVF template."""
        if not self.held:
            raise ProgrammingError("commit needs the writer: use Writer.hold()")
        self.refuse_uncommitted()
        pending = self._changes
        m = self._commit(ops, read, message=message, info=info, tag=tag, meta=meta)
        if pending is not None:  # an open (empty) batch goes on from the new version
            pending.read = m
            # the segments this commit wrote are committed: the batch's end must not
            # remove them as its own unused ones (an optimize in a batch lost its merge)
            pending.allocated.clear()
        return m

    def _commit(self, ops: Sequence[V.Operation], read: V.Manifest | None, *,
                message: str = "", info: dict | None = None, tag: str | None = None,
                meta: dict[bytes, Any] | None = None) -> V.Manifest:
        self.check_open()
        def sealer(txn, seg: int, docs: int | None) -> None:
            seal_segment(txn, self.env.dbs, self.root, seg, gen_limit=None, docs=docs)

        def txn_fn(txn):
            out = V.commit(txn, self.env.dbs, ops, read, message=message, info=info, tag=tag,
                           seal=sealer)
            for key, value in (meta or {}).items():
                txn.put(key, F.pack(value), db=self.env.dbs["meta"])
            return out

        m = self.env.write(txn_fn)
        self.env.sync()
        return m

    def maintain(self, fn: Callable[[Any], Any]) -> Any:
        """Run ``fn(txn)`` in one LMDB write transaction and sync (vacuum, tags): changes
        that are not versions. The caller holds the writer."""
        if not self.held:
            raise ProgrammingError("maintenance needs the writer: use Writer.hold()")
        out = self.env.write(fn)
        self.env.sync()
        return out
