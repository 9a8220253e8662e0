"""Removing what nothing references, safely: a killed writer's leftovers (:func:`recover`),
files a commit unreferenced once no reader can still open them (:func:`empty_trash`),
and the versions and data a vacuum drops (:func:`drop_unkept`); and recording the
checksums of committed files that lack them (:func:`seal`).

Every function here runs under the writer lock (see :mod:`npmdb.storage.transaction`):
then no change is in flight, so data that no record names is garbage.
"""

from __future__ import annotations

from contextlib import suppress
from pathlib import Path
from typing import Any

from npmdb.errors import Error

from . import format as F
from . import versions as V
from .env import Env
from .integrity import DOCS_KEY, read_sums, seal_segment, segment_files
from .paths import checkpoint_dir, dense_files, remove_dir, segment_dir

__all__ = ["recover", "named_segments", "remove_segment", "empty_trash", "seal", "drop_unkept",
           "delete_segment_data"]


def delete_segment_data(txn, dbs, seg: int, *, gens: list[int] | None = None,
                        docs: bool = True) -> None:
    """Remove a segment's LMDB data (all generations' vectors, or just ``gens``)."""
    from .integrity import prune_sums

    prefix = F.u32(seg)
    targets = [("segcols", prefix), ("docs", prefix)] if docs else []
    for name, pfx in targets:
        cur = txn.cursor(db=dbs[name])
        if cur.set_range(pfx):
            while cur.key()[:4] == pfx:
                if not cur.delete():
                    break
    if docs:  # docids: scan (keys are hashed ids + seg)
        cur = txn.cursor(db=dbs["docids"])
        for key in [k for k in cur.iternext(keys=True, values=False) if k[-4:] == prefix]:
            txn.delete(key, db=dbs["docids"])
    cur = txn.cursor(db=dbs["vectors"])
    keys = [k for k in cur.iternext(keys=True, values=False)
            if k[4:8] == prefix and (gens is None or F.read_u32(k) in gens)]
    for k in keys:
        txn.delete(k, db=dbs["vectors"])
    if gens is not None and not docs:  # their index files go too: forget their checksums
        prune_sums(txn, dbs, seg, gens)


def remove_segment(env: Env, root: Path, seg: int, *, uncommitted: bool = True) -> None:
    """Remove every trace of an uncommitted segment: its LMDB data and its directories.
    ``uncommitted``: only if its number is still past every commit's (``next_segment``):
    a number below it was committed by some writer (a rollback must not remove what
    another committed under the same number); recovery, which checked the versions
    itself, passes False."""
    def remove(txn) -> bool:
        if uncommitted and seg < V.next_id(txn, env.dbs, "next_segment"):
            return False
        delete_segment_data(txn, env.dbs, seg)
        return True
    if env.write(remove):
        remove_dir(segment_dir(root, seg))
        remove_dir(Path(root) / "segments" / f"tmp-s{seg:06d}")


def _segments_with_data(txn, dbs) -> set[int]:
    """Segments that have token columns or documents (one cursor seek per segment)."""
    found: set[int] = set()
    for name in ("segcols", "docs"):
        cur = txn.cursor(db=dbs[name])
        ok = cur.first()
        while ok:
            s = F.read_u32(bytes(cur.key()))
            found.add(s)
            ok = cur.set_range(F.u32(s + 1)) if s + 1 < 1 << 32 else False
    return found


def named_segments(txn, dbs) -> set[int]:
    """The segments some version's manifest reads."""
    return {s for m in V.list_versions(txn, dbs) for s in m.segments}


def recover(env: Env, root: Path) -> None:
    """Remove what a killed writer left: segments no record names (their LMDB data and
    directories), temporary directories, and the vectors, index files and checkpoints of
    generations past ``next_generation``; then empty the trash and seal."""
    dbs = env.dbs
    with env.read() as txn:
        recorded = {F.read_u32(bytes(k)) for k in
                    txn.cursor(db=dbs["segments"]).iternext(values=False)}
        orphans = _segments_with_data(txn, dbs) - recorded
        next_gen = V.next_id(txn, dbs, "next_generation")
        # a vacuumed segment's directory waits in the trash while a reader may use it
        trashed = {(e if isinstance(e, str) else e[0]) for e in
                   V.trash_of(txn, dbs)}
        stale_gens = False
        for key in txn.cursor(db=dbs["vectors"]).iternext(keys=True, values=False):
            g, s = F.read_u32(bytes(key)), F.read_u32(bytes(key), 4)
            if s not in recorded:
                orphans.add(s)
            elif g >= next_gen:
                stale_gens = True
    seg_root = Path(root) / "segments"
    if seg_root.exists():
        for p in seg_root.iterdir():
            name = p.name
            if name.startswith("tmp-"):
                remove_dir(p)
            elif name.startswith("s") and name[1:].isdigit() and int(name[1:]) not in recorded:
                if f"segments/{name}" not in trashed:
                    orphans.add(int(name[1:]))
            elif p.is_dir():
                for f in p.iterdir():  # index files of an uncommitted generation
                    g = f.name.split(".", 1)[0]
                    if g.startswith("g") and g[1:].isdigit() and int(g[1:]) >= next_gen:
                        f.unlink(missing_ok=True)
    enc_root = Path(root) / "encoders"
    if enc_root.exists():
        for p in enc_root.iterdir():
            g = p.name.split(".", 1)[0]
            if p.name.endswith(".tmp") or (g[1:].isdigit() and int(g[1:]) >= next_gen):
                remove_dir(p)
    if orphans:
        # data a version names is never a killed writer's: a lost record (damage that
        # `npmdb check` reports) must not become the loss of the segment's documents
        with env.read() as txn:
            orphans -= named_segments(txn, dbs)
    for seg in sorted(orphans):
        remove_segment(env, root, seg, uncommitted=False)
    empty_trash(env, root)
    if stale_gens:
        def drop(txn):
            cur = txn.cursor(db=dbs["vectors"])
            for k in [bytes(k) for k in cur.iternext(values=False)]:
                if F.read_u32(k) >= next_gen:
                    txn.delete(k, db=dbs["vectors"])
        env.write(drop)
    with suppress(Error):
        seal(env, root)


def seal(env: Env, root: Path) -> None:
    """Record the checksums of committed segment files that lack them (see
    :mod:`npmdb.storage.integrity`): a commit seals what it references itself, so this
    finds only files of databases written before that, or of a writer killed in between.
    The ``sealed`` meta key holds the counters at the last complete seal, so only segments
    and generations that came since are listed."""
    dbs = env.dbs
    todo = []
    with env.read() as txn:
        next_seg = V.next_id(txn, dbs, "next_segment")
        next_gen = V.next_id(txn, dbs, "next_generation")
        mark = V.get_meta(txn, dbs, "sealed") or [0, 0]
        if list(mark) == [next_seg, next_gen]:
            return
        start = int(mark[0]) if int(mark[1]) == next_gen else 0
        cur = txn.cursor(db=dbs["segments"])
        for k, v in (cur if cur.set_range(F.u32(start)) else ()):
            s, rec = F.read_u32(bytes(k)), F.SegmentRecord.from_dict(F.unpack(v))
            sums = read_sums(txn, dbs, s) or {}
            if txn.get(F.col_key(s, DOCS_KEY), db=dbs["segcols"]) is None or any(
                    r not in sums for r in segment_files(root, s, next_gen)):
                todo.append((s, rec.docs))

    def txn_fn(txn):
        for s, n in todo:
            seal_segment(txn, dbs, root, s, gen_limit=next_gen, docs=n)
        V.put_meta(txn, dbs, "sealed", [next_seg, next_gen])
    env.write(txn_fn)


def empty_trash(env: Env, root: Path) -> int:
    """Remove the files listed in ``trash`` once no reader can still use them.

    An entry is ``[path, id of the commit that unreferenced it]``. While any read
    transaction (of any process) holds a snapshot older than that commit, a query on that
    snapshot may still open the files (indexes load lazily), so the entry waits; the next
    vacuum, optimize or writer tries again. Returns the number removed.
    """
    with env.read() as txn:
        trash = V.trash_of(txn, env.dbs)
    if not trash:
        return 0
    oldest = env.oldest_reader_txn()
    waiting = []
    for entry in trash:
        rel, after = (entry, 0) if isinstance(entry, str) else (entry[0], int(entry[1]))
        if oldest is not None and oldest < after:
            waiting.append(entry)
            continue
        p = Path(root) / rel
        if p.is_dir():
            remove_dir(p)
        elif p.exists():
            p.unlink()
    if len(waiting) != len(trash):
        env.write(lambda txn: V.put_meta(txn, env.dbs, "trash", waiting))
    return len(trash) - len(waiting)


def drop_unkept(txn, dbs, root: Path, keep: set[int]) -> dict[str, Any]:
    """In write transaction ``txn``: delete every version not in ``keep`` (HEAD must be in
    it), the tags naming them, and the segments, vector sets and generations only they
    referenced; their files go to the trash, stamped with this transaction's id. Returns
    counts of what was removed."""
    allv = V.list_versions(txn, dbs)
    drop = [v for v in allv if v.id not in keep]
    kept = [v for v in allv if v.id in keep]
    need_segs = {s for v in kept for s in v.segments}
    need_pairs = {(s, v.generation) for v in kept for s in v.segments}
    need_gens = {v.generation for v in kept} | {0}
    for v in drop:
        txn.delete(F.u64(v.id), db=dbs["versions"])
    for name, vid in V.tags_of(txn, dbs).items():
        if vid not in keep:
            txn.delete(name.encode(), db=dbs["tags"])
    trash: list[str] = []
    records = {F.read_u32(bytes(k)): F.SegmentRecord.from_dict(F.unpack(v))
               for k, v in txn.cursor(db=dbs["segments"])}
    dead_segs = [s for s in records if s not in need_segs]
    for s in dead_segs:
        delete_segment_data(txn, dbs, s)
        txn.delete(F.u32(s), db=dbs["segments"])
        trash.append(f"segments/s{s:06d}")
    in_vectors = {(F.read_u32(bytes(k), 4), F.read_u32(bytes(k)))
                  for k in txn.cursor(db=dbs["vectors"]).iternext(values=False)}
    stale = {(s, g) for s, g in in_vectors if s in need_segs and (s, g) not in need_pairs}
    for s, g in sorted(stale):
        delete_segment_data(txn, dbs, s, gens=[g], docs=False)
        kind = records[s].dense
        trash += [f"segments/s{s:06d}/{rel}" for rel in dense_files(g, kind)]
    checkpoints = 0
    for k in list(txn.cursor(db=dbs["generations"]).iternext(values=False)):
        g = F.read_u32(bytes(k))
        if g not in need_gens:
            txn.delete(F.u32(g), db=dbs["generations"])
            txn.delete(f"ivf:g{g}".encode(), db=dbs["meta"])  # its IVF template, if any
            trash.append(checkpoint_dir(Path("."), g).as_posix())
            checkpoints += 1
    codec_states = _drop_unused_codec_states(txn, dbs, {records[s].codec for s in need_segs
                                                         if s in records})
    old = V.trash_of(txn, dbs)
    # with this commit's id: a reader whose snapshot is older may still open them
    V.put_meta(txn, dbs, "trash", old + [[rel, txn.id()] for rel in trash])
    return {"versions": len(drop), "segments": len(dead_segs), "generation_sets": len(stale),
            "checkpoints": checkpoints, "codec_states": codec_states}


def _drop_unused_codec_states(txn, dbs, used: set[str]) -> int:
    """Delete the trained PQ codec states (``codec:<name>``) that no kept segment stores
    its vectors in and that are not the database's current one (which the next add
    codes with); returns how many went."""
    from .codec import CODEC_STATE_KEY

    raw = txn.get(CODEC_STATE_KEY.encode(), db=dbs["meta"])
    keep = used | ({F.unpack(raw)} if raw is not None else set())
    prefix = b"codec:"
    dead = [bytes(k) for k in txn.cursor(db=dbs["meta"]).iternext(values=False)
            if bytes(k).startswith(prefix) and bytes(k)[len(prefix):].decode() not in keep]
    for k in dead:
        txn.delete(k, db=dbs["meta"])
    return len(dead)
