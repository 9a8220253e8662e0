"""Version maintenance as Writer operations: restore, optimize (merge segments), vacuum;
and diff, which only reads.

Each operation that changes what HEAD reads commits one version through the Writer
(:mod:`npmdb.storage.transaction`). Files that a commit makes unreferenced are listed in
the ``trash`` meta key by that same transaction and removed once no reader can still open
them, so a crash between the commit and the removal leaves nothing the next writer does
not clean up.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

import numpy as np

from .corpus import Document
from .errors import OperationalError
from npmdb.storage import codec as C
from npmdb.storage import format as F
from npmdb.storage import ivf
from npmdb.storage import versions as V
from npmdb.storage.dense import AUTO, AUTO_IVF_TOKENS, IVF
from npmdb.storage.cleanup import drop_unkept, empty_trash
from npmdb.storage.paths import segment_dir

if TYPE_CHECKING:  # pragma: no cover
    from npmdb.storage.segments import SegmentReader
    from npmdb.storage.transaction import Writer

__all__ = ["restore", "diff", "optimize", "vacuum", "check_space", "Diff"]


@dataclass(frozen=True)
class Diff:
    """Documents added, removed and changed between two versions (by document id)."""

    added: tuple[str, ...]
    removed: tuple[str, ...]
    changed: tuple[str, ...]

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.changed)


def restore(writer: "Writer", ref: int | str, message: str = "") -> int:
    """A new version whose contents equal version ``ref`` (no data is copied)."""
    V.check_message(message)
    with writer.hold():
        with writer.env.read() as txn:
            old = V.resolve(txn, writer.env.dbs, ref)
        m = writer.commit([V.Restore(old.id)], read=writer.head(),
                          message=message or f"restore of version {old.id}",
                          info={"restored_from": old.id})
        return m.id


def diff(a: Iterable[dict[str, Any]], b: Iterable[dict[str, Any]]) -> Diff:
    """What changed from the documents ``a`` (of one version) to ``b`` (of another)."""
    da = {d["id"]: (d["title"], d["text"], d["meta"]) for d in a}
    db = {d["id"]: (d["title"], d["text"], d["meta"]) for d in b}
    return Diff(tuple(sorted(set(db) - set(da))), tuple(sorted(set(da) - set(db))),
                tuple(sorted(k for k in set(da) & set(db) if not _same_doc(da[k], db[k]))))


def _same_doc(a: tuple, b: tuple) -> bool:
    """Equal title, text and meta (:func:`same_value`)."""
    return a[:2] == b[:2] and same_value(a[2], b[2])


def same_value(x: Any, y: Any) -> bool:
    """``x`` and ``y`` hold the same stored values: of the same types (3 is not 3.0, True
    is not 1, which ``==`` calls equal: a change of type was no change in the diff), NaN
    equal to itself (which ``==`` denies), maps with the same keys in any order."""
    if type(x) is not type(y):
        return False
    if isinstance(x, dict):
        return x.keys() == y.keys() and all(same_value(x[k], y[k]) for k in x)
    if isinstance(x, (list, tuple)):
        return len(x) == len(y) and all(same_value(i, j) for i, j in zip(x, y))
    if isinstance(x, float):
        return x == y or (x != x and y != y)
    return x == y


def optimize(writer: "Writer", message: str = "", index: str | None = None,
             codec: str | None = None, retrain: bool | None = None) -> int | None:
    """Merge HEAD's segments into one and drop deleted documents; returns the version.

    Vectors in the merged segment's codec are copied in their stored form; others are
    decoded and re-coded (never re-encoded by the model). The segment writer rebuilds the
    BM25 and dense indexes of the merged segment. ``index`` / ``codec``: the dense index
    kind and vector codec to record and write (a conversion rewrites even a single
    segment); without ``codec``, an ``auto`` database takes the codec for HEAD's size and
    any other keeps the first segment's. Older versions keep their segments until vacuum.

    An IVF merged segment: ``retrain`` (None: when the corpus has outgrown the template's
    lists, :func:`npmdb.storage.retrain.plan`) trains the generation a new template sized
    for HEAD's corpus, codes the merged segment against it (even a single segment is
    rewritten) and commits the template with it; later segments use it.
    """
    V.check_message(message)
    with writer.hold():
        writer.refuse_uncommitted()  # before the merge, not after it
        changes = {k: v for k, v in (("dense", index), ("codec", codec)) if v is not None}
        before = dict(writer.config)
        # the merge writes with the new settings; they are recorded with its commit (or on
        # their own where nothing is merged), never before it: a failed optimize keeps
        # the settings the database had
        writer.config.update(changes)
        try:
            return _merge(writer, message, index, codec, retrain,
                          changed=writer.config != before)
        except BaseException:
            writer.config.clear()
            writer.config.update(before)
            raise


def _merge(writer: "Writer", message: str, index: str | None, codec: str | None,
           retrain: bool | None, *, changed: bool) -> int | None:
    """:func:`optimize`'s work, under the writer lock, with ``writer.config`` already
    holding the settings to write with (``changed``: not recorded yet)."""
    from npmdb.storage import retrain as R

    head = writer.head()
    if head is None:
        if changed:
            writer.save_config()
        return None
    readers = [writer.reader(s) for s in head.segments]
    if codec is None and writer.config.get("codec") != C.AUTO:
        codec = readers[0].record.codec
    target = writer.new_codec(int(head.stats.get("tokens", 0)), codec)
    # "auto" is what its rule picks for HEAD's size: a segment records the kind it has
    kind = (IVF if _writes_ivf(writer, head) else "hnsw") if index == AUTO else index
    converts = (kind is not None and any(r.record.dense != kind for r in readers)) or \
        any(not _same_codec(r.record.codec, target, r.record.dim) for r in readers)
    meta: dict[bytes, Any] = {}
    template = p = None
    with writer.env.read(buffers=True) as txn:
        if _writes_ivf(writer, head):
            p = R.plan(R.index_entries(readers, txn),
                       ivf.read_template(writer.env, head.generation), writer.params.ivf,
                       retrain)
        if len(head.segments) > 1 or head.deleted or converts or (p and p.retrain):
            check_space(writer.root, readers, target)
        if p is not None and p.retrain:
            template = R.train_for(readers, txn, head.generation, writer.params.ivf,
                                   p.wanted, writer.progress)
            meta[ivf.template_key(head.generation)] = ivf.template_value(template)
        if len(head.segments) <= 1 and not head.deleted and not converts and not meta:
            if changed:
                writer.save_config()
            return head.id
        sw = writer.segment_writer(writer.allocate_segment(), head.generation,
                                   codec=target, merged_from=head.segments)
        sw.template = template
        # the template the merged rows are coded with, where the sources' IVF codes may be
        # copied (not after a retrain: every row is coded anew)
        coding = ivf.Coding.of_template(ivf.read_template(writer.env, head.generation),
                                        readers[0].record.dim) \
            if p is not None and not meta and any(r.record.dense == IVF for r in readers) \
            else None
        bar = writer.progress(sum(r.record.tokens for r in readers), "optimize (merge)",
                              "tok")
        for r in readers:
            _merge_live(sw, r, txn, head, coding, bar=bar)
        bar.close()
    record = sw.finish()
    note = ""
    if template is not None and p is not None:
        note = (f"; IVF template retrained: {p.current or 'none'} -> "
                f"{ivf.template_nlist(template):,} lists")
    if changed:
        meta[b"config"] = dict(writer.config)  # recorded by the commit that uses it
    m = writer.commit([V.Rewrite(head.segments, record)], read=head, meta=meta,
                      message=message or f"optimize: merged segments "
                                         f"{list(head.segments)}{note}")
    empty_trash(writer.env, writer.root)  # what an earlier vacuum left for old readers
    return m.id


# bytes a segment stores per token besides its vectors and its index files: token ids,
# flags, offsets and block columns, the document text and ids (23 B on the 100M replay: 2.3
# GB of LMDB rows for 100.3M tokens), with headroom
ROW_BYTES_PER_TOKEN = 32


def check_space(root: Path, readers: "list[SegmentReader]", codec: str) -> None:
    """Raise :class:`OperationalError` before an optimize writes anything when the disk
    under ``root`` cannot hold the merged segment beside the ones it replaces (they stay
    until the commit; LMDB's file never shrinks, and it does not reliably reuse its free
    pages for large rows: an in-place 100M-token optimize grew the file by the full
    segment with 22 GB of free pages inside it)."""
    tokens = sum(r.record.tokens for r in readers)
    dim = readers[0].record.dim if readers else 0
    files = sum(f.stat().st_size for r in readers
                for f in segment_dir(root, r.seg).rglob("*") if f.is_file())
    need = files + tokens * (C.get_codec(codec).bytes_per_vector(dim) + ROW_BYTES_PER_TOKEN)
    free = shutil.disk_usage(root).free
    if need > free:
        raise OperationalError(
            f"optimize needs about {_size(need)} of free disk for the merged segment "
            f"({tokens:,} tokens; the segments it replaces stay until it commits) and "
            f"{_size(free)} are free under {root}: free disk space and run it again "
            "(nothing was written)")


def _size(n: int) -> str:
    if n >= 1e8:
        return f"{n / 1e9:.1f} GB"
    return f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.0f} kB"


def _writes_ivf(writer: "Writer", head: V.Manifest) -> bool:
    """Whether the merged segment gets an IVF index (``auto``: by HEAD's size, as the
    segment writer decides)."""
    dense = str(writer.config.get("dense", "hnsw"))
    return dense == IVF or (dense == AUTO and
                            int(head.stats.get("tokens", 0)) >= AUTO_IVF_TOKENS)


def _merge_live(sw: Any, r: "SegmentReader", txn, head: V.Manifest,
                coding: "ivf.Coding | None", bar: Any = None) -> None:
    """Hand the live documents of segment ``r`` to segment writer ``sw``: each run of
    consecutive live documents (empty ones, which have no blocks, included) with its
    blocks' columns and stored vector rows, copied from the chunks they lie in (and their
    IVF entries, where they were coded with ``coding``, the merged segment's template)."""
    cols = r.columns(txn)
    ptr, bdoc = cols.block_ptr, cols.block_doc
    coded: Any = False  # r's IVF entries, where they can be copied (decided at the first rows)
    live = np.ones(r.record.docs, dtype=bool)
    live[list(head.deleted.get(r.seg, ()))] = False
    edges = np.flatnonzero(np.diff(np.concatenate([[0], live.astype(np.int8), [0]])))
    for d0, d1 in zip(edges[::2].tolist(), edges[1::2].tolist()):
        b0, b1 = (int(x) for x in np.searchsorted(bdoc, [d0, d1]))  # blocks are in doc order
        lo, hi = int(ptr[b0]), int(ptr[b1])
        docs = [r.doc(txn, local) for local in range(d0, d1)]
        sw.add_documents([Document(d.id, d.title, d.text, d.meta) for d in docs], {
            "tokens": cols.tokens[lo:hi], "flags": cols.flags[lo:hi],
            "offsets": cols.offsets[lo:hi], "block_ptr": ptr[b0:b1 + 1] - lo,
            "block_doc": bdoc[b0:b1] - d0})
        n, copy = r.chunk, _same_codec(r.record.codec, sw.codec.name, r.record.dim)
        if coded is False:
            # rows copied in their codec into an IVF segment coded against the template
            # the source's entries were coded with: its list numbers and PQ codes are
            # copied too, not computed again (a kind can only turn to ivf as tokens
            # arrive, never back). A segment of a version restored from before a retrain
            # holds codes of the old template: its rows are coded anew.
            coded = None
            if copy and sw.kind() == IVF and r.record.dense == IVF and \
                    r.ivf_file(head.generation).coded_with(coding):
                coded = r.ivf_coded(head.generation)
        for c in range(lo // n, (hi - 1) // n + 1 if hi > lo else lo // n):
            stored = r.stored_chunk(txn, head.generation, c)
            a, z = max(lo, c * n), min(hi, (c + 1) * n)
            rows = stored[a - c * n:z - c * n]
            if coded is not None:
                sw.add_encoded(np.array(rows), coded.between(a, z))
            elif copy:
                sw.add_stored(np.array(rows))
            else:  # another codec: decoded, then coded as the merged segment's
                sw.add_vectors(r.codec.decode(rows))
            if bar is not None:
                bar.update(z - a)


def _same_codec(stored: str, target: str, dim: int) -> bool:
    """Whether rows stored in codec ``stored`` are already rows of ``target`` (a trained
    PQ codec 'pq96:<hash>' is what the name 'pq96' writes, and 'pq' is 'pq{dim/4}')."""
    if target == "pq":
        target = f"pq{dim // 4}"
    return stored == target or stored.split(":")[0] == target


def vacuum(writer: "Writer", *, keep_tags: bool = True, older_than: float | None = None
           ) -> dict[str, int]:
    """Remove versions that are not kept, and every segment, vector set, index file and
    checkpoint that no kept version references.

    Kept: HEAD, tagged versions (``keep_tags``), and versions younger than ``older_than``
    seconds (when given). Returns counts of what was removed.
    """
    with writer.hold():
        def txn_fn(txn):
            dbs = writer.env.dbs
            # HEAD resolved, not read raw: a HEAD that names no version (damage) would
            # keep nothing, and vacuum would remove every untagged version for good
            m = V.head(txn, dbs)
            head = None if m is None else m.id
            versions = V.list_versions(txn, dbs)
            if head is None and versions:
                raise OperationalError(
                    f"the database is damaged: it has {len(versions)} versions and no HEAD; "
                    "nothing was removed; run `npmdb check` for a full report")
            tags = V.tags_of(txn, dbs)
            now = time.time()
            keep = {v.id for v in versions if v.id == head
                    or (keep_tags and v.id in tags.values())
                    or (older_than is not None and now - v.time < older_than)}
            return drop_unkept(txn, dbs, writer.root, keep)
        removed = writer.maintain(txn_fn)
        writer.readers.clear()
        empty_trash(writer.env, writer.root)
        removed["training_state"] = int(drop_orphaned_training_state(writer.root,
                                                                     writer.env))
        return removed


def drop_orphaned_training_state(root: Path, env: Any) -> bool:
    """Remove the saved training state at ``root`` whose embedding generation a vacuum
    removed: resume refuses it for good, and its files (the optimizer's state, twice the
    model's size) stayed until a new run. Never while a run holds the training lock; a
    state that cannot be read is left for resume to report."""
    import msgpack

    from .train.lock import run_lock
    from .train.state import STATE_DIR

    d = Path(root) / STATE_DIR
    mp = d / "state.msgpack"
    try:
        gen = int(msgpack.unpackb(mp.read_bytes(), raw=False,
                                  strict_map_key=False)["generation"])
    except Exception:  # noqa: BLE001 - absent, unreadable or damaged: not ours to judge
        return False
    with env.read() as txn:
        if F.get_generation(txn, env.dbs, gen) is not None:
            return False
    try:
        with run_lock(root) as holder:
            if holder is not None:
                return False
            for f in [mp, *d.glob("state*.safetensors*")]:
                f.unlink(missing_ok=True)
            return True
    except OSError:
        return False
