"""Version maintenance: restore, diff, optimize (merge segments) and vacuum.

Every operation that changes what HEAD reads commits a new version in one LMDB
transaction. Files that a commit makes unreferenced are listed in the ``trash`` meta key
by that same transaction and removed afterwards, so a crash between the commit and the
removal leaves nothing the next writer does not clean up (:meth:`Database._recover`).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .corpus import Document
from .errors import ProgrammingError
from .ingest import PreparedSegment, build_indexes, install_segment_dir, store_documents
from npmdb.storage import codec as C
from npmdb.storage import format as F
from npmdb.storage import segments as _segments
from npmdb.storage import versions as V
from npmdb.storage.segments import (
    delete_segment_data, fsync_dir, remove_dir, segment_dir, write_columns,
    write_vector_chunk,
)

if TYPE_CHECKING:  # pragma: no cover
    from .database import Database

__all__ = ["restore", "diff", "optimize", "vacuum", "empty_trash", "Diff"]


@dataclass(frozen=True)
class Diff:
    """Documents added, removed and changed between two versions (by document id)."""

    added: tuple[str, ...]
    removed: tuple[str, ...]
    changed: tuple[str, ...]

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.changed)


def restore(db: "Database", ref: int | str, message: str = "") -> int:
    """A new version whose contents equal version ``ref`` (no data is copied)."""
    with db._writing():
        def txn_fn(txn):
            dbs = db.env.dbs
            old = V.resolve(txn, dbs, ref)
            for s in old.segments:
                if txn.get(F.u32(s), db=dbs["segments"]) is None:
                    raise ProgrammingError(f"version {old.id} can no longer be restored: its "
                                           "segment data was vacuumed")
            cur = V.head(txn, dbs)
            vid = V.next_id(txn, dbs, "next_version")
            m = V.Manifest(vid, cur.id if cur else None, time.time(), old.segments, old.deleted,
                           old.generation, old.stats, message or f"restore of version {old.id}",
                           {"restored_from": old.id})
            V.put_version(txn, dbs, m)
            V.put_meta(txn, dbs, "head", vid)
            V.put_meta(txn, dbs, "next_version", vid + 1)
            V.put_meta(txn, dbs, "generation", old.generation)
            return vid
        vid = db.env.write(txn_fn)
        db.env.sync()
        return vid


def _live_docs(db: "Database", ref) -> dict[str, tuple[str, str, Any]]:
    out = {}
    for d in db.documents(version=ref):
        out[d["id"]] = (d["title"], d["text"], d["meta"])
    return out


def diff(db: "Database", a: int | str, b: int | str | None = None) -> Diff:
    """What changed from version ``a`` to version ``b`` (HEAD by default)."""
    da, dbb = _live_docs(db, a), _live_docs(db, b)
    added = tuple(sorted(set(dbb) - set(da)))
    removed = tuple(sorted(set(da) - set(dbb)))
    changed = tuple(sorted(k for k in set(da) & set(dbb) if da[k] != dbb[k]))
    return Diff(added, removed, changed)


def optimize(db: "Database", message: str = "") -> int | None:
    """Merge HEAD's segments into one and drop deleted documents; returns the version.

    Vectors are copied in their stored form (no re-encoding); the BM25 and dense indexes
    of the merged segment are rebuilt. Older versions keep their segments until vacuum.
    """
    with db._writing():
        with db.env.read() as txn:
            head = V.head(txn, db.env.dbs)
            if head is None:
                return None
            if len(head.segments) <= 1 and not head.deleted:
                return head.id
            seg_new = int(V.get_meta(txn, db.env.dbs, "next_segment", 1))
            gen = head.generation
        readers = [db._segment_reader(s) for s in head.segments]
        docs: list[Document] = []
        toks, flags, offs, ptr, bdoc, ranges = [], [], [], [0], [], []
        with db.env.read() as txn:
            for r in readers:
                cols = r.columns(txn)
                dead = set(head.deleted.get(r.seg, ()))
                last = None
                for b in range(len(cols.block_doc)):
                    local = int(cols.block_doc[b])
                    if local in dead:
                        continue
                    if local != last:  # blocks of one document are consecutive
                        d = r.doc(txn, local)
                        docs.append(Document(d.id, d.title, d.text, d.meta))
                        last = local
                    lo, hi = int(cols.block_ptr[b]), int(cols.block_ptr[b + 1])
                    toks.append(cols.tokens[lo:hi])
                    flags.append(cols.flags[lo:hi])
                    offs.append(cols.offsets[lo:hi])
                    ptr.append(ptr[-1] + hi - lo)
                    bdoc.append(len(docs) - 1)
                    ranges.append((r, lo, hi))
        prep = PreparedSegment(
            docs, np.concatenate(toks).astype(np.int32) if toks else np.zeros(0, np.int32),
            np.concatenate(flags).astype(np.uint8) if flags else np.zeros(0, np.uint8),
            np.concatenate(offs).astype(np.int32).reshape(-1, 2) if offs else np.zeros((0, 2), np.int32),
            np.asarray(ptr, np.int64), np.asarray(bdoc, np.int32))
        tmp = db.path / "segments" / f"tmp-s{seg_new:06d}"
        remove_dir(tmp)
        tmp.mkdir(parents=True)
        try:
            starts, ends = _copy_vectors(db, prep, ranges, seg_new, gen)
            store_documents(db, seg_new, prep)
            build_indexes(db, prep, tmp, gen, starts, ends, db.progress)
            install_segment_dir(db, tmp, seg_new)
        except BaseException:
            remove_dir(tmp)
            db._remove_segment(seg_new)
            raise
        info = {"id": seg_new, "docs": len(prep.docs), "blocks": prep.n_blocks,
                "tokens": int(len(prep.tokens)), "dim": readers[0].dim,
                "codec": readers[0].info.get("codec", "float16"),
                "dense": readers[0].info.get("dense", "hnsw"), "gens": [gen],
                "chunk": _segments.CHUNK,
                "created": time.time(), "merged_from": list(head.segments)}

        def txn_fn(txn):
            dbs = db.env.dbs
            cur = V.head(txn, dbs)
            vid = V.next_id(txn, dbs, "next_version")
            txn.put(F.u32(seg_new), F.pack(info), db=dbs["segments"])
            stats = {"docs": info["docs"], "blocks": info["blocks"], "tokens": info["tokens"]}
            m = V.Manifest(vid, cur.id, time.time(), (seg_new,), {}, cur.generation, stats,
                           message or f"optimize: merged segments {list(head.segments)}")
            V.put_version(txn, dbs, m)
            V.put_meta(txn, dbs, "head", vid)
            V.put_meta(txn, dbs, "next_version", vid + 1)
            V.put_meta(txn, dbs, "next_segment", seg_new + 1)
            return vid
        vid = db.env.write(txn_fn)
        db.env.sync()
        empty_trash(db)  # what an earlier vacuum left for readers that have since finished
        return vid


def _copy_vectors(db, prep: PreparedSegment, ranges, seg_new: int, gen: int):
    """Copy stored vector rows of the kept token ranges into the new segment's chunks."""
    from .boundaries import VALID_END, VALID_START

    rows: list[np.ndarray] = []
    with db.env.read(buffers=True) as txn:
        for r, lo, hi in ranges:
            n = r.chunk  # the old segment's chunk size; the merged one gets CHUNK's
            for c0 in range(lo // n, (hi - 1) // n + 1 if hi > lo else lo // n):
                stored = r._chunk(txn, gen, c0)
                a, b = max(lo, c0 * n), min(hi, (c0 + 1) * n)
                rows.append(np.array(stored[a - c0 * n:b - c0 * n]))
    allrows = np.concatenate(rows) if rows else np.zeros((0, 1), np.uint8)
    out = _segments.CHUNK
    chunks = [(i // out, allrows[i:i + out]) for i in range(0, len(allrows), out)]
    for i in range(0, len(chunks), 16):
        part = chunks[i:i + 16]
        db.env.write(lambda txn: [write_vector_chunk(txn, db.env.dbs, gen, seg_new, c, v)
                                  for c, v in part])
    codec = C.get_codec(ranges[0][0].info.get("codec", "float16") if ranges else
                        db.config.get("codec", "float16"), env=db.env)
    sp = np.flatnonzero(prep.flags & VALID_START)
    ep = np.flatnonzero(prep.flags & VALID_END)
    return (sp, codec.decode(allrows[sp]) if len(sp) else np.zeros((0, 1), np.float32)), \
        (ep, codec.decode(allrows[ep]) if len(ep) else np.zeros((0, 1), np.float32))


def vacuum(db: "Database", *, keep_tags: bool = True, older_than: float | None = None
           ) -> dict[str, int]:
    """Remove versions that are not kept, and every segment, vector set, index file and
    checkpoint that no kept version references.

    Kept: HEAD, tagged versions (``keep_tags``), and versions younger than ``older_than``
    seconds (when given). Returns counts of what was removed.
    """
    with db._writing():
        removed: dict[str, Any] = {}

        def txn_fn(txn):
            dbs = db.env.dbs
            allv = V.list_versions(txn, dbs)
            head = V.get_meta(txn, dbs, "head")
            tags = V.tags_of(txn, dbs)
            now = time.time()
            keep = {v.id for v in allv if v.id == head
                    or (keep_tags and v.id in tags.values())
                    or (older_than is not None and now - v.time < older_than)}
            drop = [v for v in allv if v.id not in keep]
            kept = [v for v in allv if v.id in keep]
            need_segs = {s for v in kept for s in v.segments}
            need_pairs = {(s, v.generation) for v in kept for s in v.segments}
            need_gens = {v.generation for v in kept} | {0}
            for v in drop:
                txn.delete(F.u64(v.id), db=dbs["versions"])
            for name, vid in tags.items():
                if vid not in keep:
                    txn.delete(name.encode(), db=dbs["tags"])
            trash: list[str] = []
            seg_records = {F.read_u32(bytes(k)): F.unpack(v)
                           for k, v in txn.cursor(db=dbs["segments"])}
            dead_segs = [s for s in seg_records if s not in need_segs]
            for s in dead_segs:
                delete_segment_data(txn, dbs, s)
                txn.delete(F.u32(s), db=dbs["segments"])
                trash.append(f"segments/s{s:06d}")
            # generations no longer used by a kept segment
            gens_in_vectors = {(F.read_u32(bytes(k), 4), F.read_u32(bytes(k)))
                               for k in txn.cursor(db=dbs["vectors"]).iternext(values=False)}
            stale = {(s, g) for s, g in gens_in_vectors if s in need_segs and (s, g) not in need_pairs}
            for s, g in sorted(stale):
                delete_segment_data(txn, dbs, s, gens=[g], docs=False)
                info = seg_records[s]
                kind = info.get("dense", "hnsw")
                trash += [f"segments/s{s:06d}/g{g}.start.{kind}", f"segments/s{s:06d}/g{g}.end.{kind}"]
            gen_records = [F.read_u32(bytes(k)) for k in
                           txn.cursor(db=dbs["generations"]).iternext(values=False)]
            for g in gen_records:
                if g not in need_gens:
                    txn.delete(F.u32(g), db=dbs["generations"])
                    trash.append(f"encoders/g{g}")
            old = V.get_meta(txn, dbs, "trash", []) or []
            # with this commit's id: a reader whose snapshot is older may still open them
            V.put_meta(txn, dbs, "trash", old + [[rel, txn.id()] for rel in trash])
            removed.update(versions=len(drop), segments=len(dead_segs),
                           generation_sets=len(stale), checkpoints=sum(
                               1 for t in trash if t.startswith("encoders/")))
        db.env.write(txn_fn)
        db.env.sync()
        for s in list(db._segments):
            db._segments.pop(s, None)
        empty_trash(db)
        return removed


def empty_trash(db: "Database") -> int:
    """Remove the files listed in ``trash`` once no reader can still use them.

    An entry is ``[path, id of the commit that unreferenced it]``. While any read
    transaction (of any process) holds a snapshot older than that commit, a query on that
    snapshot may still open the files (indexes load lazily), so the entry waits; the next
    vacuum, optimize or writer open tries again. Returns the number removed.
    """
    with db.env.read() as txn:
        trash = V.get_meta(txn, db.env.dbs, "trash", []) or []
    if not trash:
        return 0
    oldest = db.env.oldest_reader_txn()
    waiting = []
    for entry in trash:
        rel, after = (entry, 0) if isinstance(entry, str) else (entry[0], int(entry[1]))
        if oldest is not None and oldest < after:
            waiting.append(entry)
            continue
        p = db.path / rel
        if p.is_dir():
            remove_dir(p)
        elif p.exists():
            p.unlink()
    if len(waiting) != len(trash):
        db.env.write(lambda txn: V.put_meta(txn, db.env.dbs, "trash", waiting))
    return len(trash) - len(waiting)
