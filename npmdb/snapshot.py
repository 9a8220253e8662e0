"""A snapshot: one version of the database, read whole inside one LMDB read transaction.

Query operators read storage only through a snapshot: its segments, the tombstones and
document filter (``allowed_docs``), its embedding generation and that generation's encoder.
:func:`history` lists the versions (``db.versions()``, ``SHOW VERSIONS``) from a read
transaction.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from npmdb.errors import OperationalError
from npmdb.storage.dense import IVF
from npmdb.storage.segments import SegmentColumns, SegmentReader, StoredDoc
from npmdb.storage import versions as V
from npmdb.storage.versions import Manifest

if TYPE_CHECKING:  # pragma: no cover
    from .encoder import Encoder
    from npmdb.query.spec import DocFilter

__all__ = ["Snapshot", "history"]


def history(txn, dbs) -> list[dict[str, Any]]:
    """Every version, oldest first: id, time, parent, tags, counts, generation, whether
    it is HEAD, and its message."""
    tags = V.tags_of(txn, dbs)
    head = V.meta_id(txn, dbs, "head")
    return [{"id": m.id, "time": m.time, "parent": m.parent,
             "tags": sorted(t for t, v in tags.items() if v == m.id),
             "docs": m.stats.get("docs", 0), "tokens": m.stats.get("tokens", 0),
             "segments": len(m.segments), "generation": m.generation,
             "head": m.id == head, "message": m.message}
            for m in V.list_versions(txn, dbs)]


class Snapshot:
    def __init__(self, txn, manifest: Manifest, segments: list[SegmentReader],
                 encoder: Callable[[], "Encoder"], doc_filter: "DocFilter | None" = None,
                 filter_cache: dict | None = None) -> None:
        self.txn = txn
        self.manifest = manifest
        self.generation = manifest.generation
        self.segments = segments
        self._encoder = encoder
        self.doc_filter = doc_filter
        self._allowed: dict[int, np.ndarray | None] = {}
        self._filter_cache = filter_cache if filter_cache is not None else {}
        self._columns: dict[int, SegmentColumns] = {}
        self._columns_lock = threading.Lock()
        self._ivf_entries: int | None = None
        self._whole: Snapshot | None = None  # for a subset: the snapshot it is a part of

    def encoder(self) -> "Encoder":
        return self._encoder()

    def columns(self, si: int) -> SegmentColumns:
        """Segment ``si``'s token columns, zero-copy in this snapshot's transaction (valid
        while the snapshot is open; see :meth:`SegmentReader.column_views`)."""
        cols = self._columns.get(si)
        if cols is None:
            with self._columns_lock:
                cols = self._columns.get(si)
                if cols is None:
                    if self.txn is None:
                        raise OperationalError("this snapshot is closed: its columns were "
                                               "views of its transaction's pages")
                    cols = self._columns[si] = self.segments[si].column_views(self.txn)
        return cols

    def subset(self, segs: list[int]) -> "Snapshot":
        """The same version and transaction over segments ``segs`` only (a shard's part of
        it; segment ``i`` of the subset is ``segs[i]`` of this one). Valid while this
        snapshot is open."""
        n = len(self.segments)
        bad = [si for si in segs if not (isinstance(si, int) and 0 <= si < n)]
        if bad:
            raise OperationalError(f"version {self.manifest.id} has {n} segments; asked for "
                                   f"segments {bad}: the shard and the coordinator disagree "
                                   "on the version")
        sub = Snapshot(self.txn, self.manifest, [self.segments[si] for si in segs],
                       self._encoder, self.doc_filter, self._filter_cache)
        sub._whole = self  # the lists a search probes follow the whole version's entries
        return sub

    def close(self) -> None:
        """Let go of the transaction, of every view of its pages and of its segment
        readers (query state can keep a closed snapshot in a reference cycle until the
        next garbage collection; a reader a vacuum removed would hold its files till then)."""
        with self._columns_lock:
            self._columns.clear()
        self.txn = None
        self.segments = []
        self._whole = None

    def dense(self, si: int, side: str):
        """Segment ``si``'s dense index of ``side`` for this snapshot's generation."""
        return self.segments[si].dense(self.generation, side, self.columns(si).flags)

    def ivf_entries(self) -> int:
        """Entries in the IVF-PQ lists of every segment of this snapshot (one template per
        generation: list ``i`` of each segment is a part of one list ``i``), which sets how
        many lists a search probes (:func:`npmdb.storage.ivf.probe_count`); 0 without."""
        if self._whole is not None:  # a shard's part probes as the whole version does
            return self._whole.ivf_entries()
        if self._ivf_entries is None:
            total = 0
            for seg in self.segments:
                if seg.record.dense == IVF:
                    file = seg.ivf_file(self.generation)
                    total += file.entries if file.approximate else 0
            self._ivf_entries = total
        return self._ivf_entries

    def doc(self, si: int, local: int) -> StoredDoc:
        return self.segments[si].doc(self.txn, local)

    def allowed_docs(self, si: int) -> np.ndarray | None:
        """Boolean mask over segment ``si``'s documents, or None when all are allowed."""
        if si in self._allowed:
            return self._allowed[si]
        seg = self.segments[si]
        n_docs = seg.record.docs
        mask = None
        dead = self.manifest.deleted.get(seg.seg)
        if dead:
            mask = np.ones(n_docs, dtype=bool)
            mask[np.asarray(dead, dtype=np.int64)] = False
        if self.doc_filter is not None:
            # the predicate is part of the key: two filters may share a description (the
            # query language reuses one DocFilter per predicate text, so its masks still hit)
            key = (seg.seg, self.doc_filter.describe, self.doc_filter.predicate)
            hit = self._filter_cache.get(key)
            if hit is None:
                if len(self._filter_cache) > 64:
                    self._filter_cache.clear()
                hit = self._filter_cache[key] = (np.zeros(n_docs, dtype=bool),
                                                 np.zeros(n_docs, dtype=bool))
            fmask, known = hit
            # only live documents are asked: a deleted one is no row (its meta, fixed by
            # an update, could make the statement fail for good)
            pred = self.doc_filter.predicate
            for i in np.flatnonzero(~known if mask is None else (mask & ~known)).tolist():
                fmask[i] = bool(pred(seg.doc(self.txn, i)))
                known[i] = True
            mask = fmask.copy() if mask is None else (mask & fmask)
        self._allowed[si] = mask
        return mask
