"""Segments: the immutable unit one ``add`` writes (documents, blocks, vectors, indexes),
and reading them (the one writer is :mod:`npmdb.storage.segment_writer`).

LMDB keys (see :mod:`npmdb.storage.format`): documents under ``docs`` (seg, local),
``docids`` maps a user id to the segments holding it, token columns under ``segcols``
(seg, name), vectors under ``vectors`` (generation, seg, chunk) as contiguous chunks of
``CHUNK`` tokens read zero-copy from the memory map (a segment records its chunk size; ones
written before it was recorded use ``LEGACY_CHUNK``). Index files live in
``segments/sNNNNNN/``: ``bm25/`` (tantivy) and ``g{gen}.{start,end}.{kind}``.
"""

from __future__ import annotations

import threading
import zlib
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from npmdb.errors import OperationalError

from . import codec as C
from . import format as F
from .bm25 import BM25Index
from .dense import IVF, DenseIndex, DenseParams, load_dense
from .ivf import IVF_FILE, Entries, IvfFile, IvfSide, side_bitmap
from .integrity import read_doc_crcs, read_sums, validate_index_files, verify_files
from .paths import dense_path, fsync_path, segment_dir

__all__ = ["CHUNK", "LEGACY_CHUNK", "COLUMNS", "SegmentColumns", "SegmentReader", "Readers",
           "StoredDoc", "fsync_dir"]

# Tokens per vector value. Large chunks keep a query's gather to a few LMDB reads (one
# per chunk touched: 15 on a million-token segment) and are still read zero-copy.
CHUNK = 65536
LEGACY_CHUNK = F.LEGACY_CHUNK  # segments whose record has no "chunk"
COLUMNS = ("tokens", "flags", "offsets", "block_ptr", "block_doc")
_UNREAD = ()  # a vector chunk this process has not read (and checked) yet


@dataclass(frozen=True, slots=True)
class StoredDoc:
    """A stored document. Readers cache it and every version holding its segment shares
    it, so its ``meta`` is kept packed: each read unpacks a fresh dict, and a caller that
    edits what it got (``db.get(id)["meta"]["year"] = 1990``) changes nothing stored."""

    seg: int
    local: int
    id: str
    title: str
    text: str
    packed_meta: bytes = b""

    @property
    def meta(self) -> dict[str, Any]:
        return F.unpack(self.packed_meta) if self.packed_meta else {}


@dataclass(frozen=True)
class SegmentColumns:
    """Token-level columns of a segment, concatenated over its blocks."""

    tokens: np.ndarray     # int32[N]
    flags: np.ndarray      # uint8[N]
    offsets: np.ndarray    # int32[N, 2] character spans in the document text
    block_ptr: np.ndarray  # int64[B + 1]: block b holds tokens block_ptr[b]:block_ptr[b+1]
    block_doc: np.ndarray  # int32[B]: document (local number) of each block

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    def block_of(self, pos):
        """The block of each token position (no per-token array: a search over block_ptr)."""
        return np.searchsorted(self.block_ptr, pos, side="right") - 1

    def doc_of(self, pos: np.ndarray) -> np.ndarray:
        return self.block_doc[self.block_of(pos)]

    def block_end(self, pos: np.ndarray) -> np.ndarray:
        return self.block_ptr[self.block_of(pos) + 1]

    def block_start(self, pos: np.ndarray) -> np.ndarray:
        return self.block_ptr[self.block_of(pos)]


class SegmentReader:
    """Read access to one committed segment; columns and indexes load on first use."""

    def __init__(self, root: Path, env, record: F.SegmentRecord, params: DenseParams) -> None:
        self.root = root
        self.env = env
        self.seg = record.id
        self.record = record
        self.params = params
        self.dim = record.dim
        self.chunk = record.chunk
        self.codec = C.get_codec(record.codec, env=env)
        self._cols: SegmentColumns | None = None
        self._cols_checked = False  # the columns' CRCs were verified in this process
        self._mapped_cols: SegmentColumns | None = None  # views of the file (located)
        self._bm25: BM25Index | None = None
        self._dense: dict[tuple[int, str], DenseIndex] = {}
        self._ivf: dict[int, IvfFile] = {}
        self._docs: OrderedDict[int, StoredDoc] = OrderedDict()
        self._views: dict[int, tuple[str, Any]] = {}  # text, view(text): see doc_view
        self._lock = threading.RLock()  # dense() loads the IVF file under it (ivf_file)
        # vector chunks whose CRC was checked, by (generation, chunk): their file offset
        # and length (npmdb.storage.mapped), or None where they could not be located
        self._located: dict[tuple[int, int], tuple[int, int] | None] = {}
        self._doc_crcs: np.ndarray | None = None

    def _verify_files(self, rels, crc: bool = True) -> None:
        """Check index files against the checksums recorded for this segment (see
        :mod:`npmdb.storage.integrity`) before a library that trusts them loads them
        (``crc=False``: sizes only)."""
        with self.env.read() as t:
            sums = read_sums(t, self.env.dbs, self.seg)
        if sums:
            verify_files(self.root, self.seg, sums,
                         [r for r in sums if r.startswith("bm25/")] if rels == "bm25" else rels,
                         crc=crc)

    # -- columns ---------------------------------------------------------------------

    def columns(self, txn=None) -> SegmentColumns:
        """The columns, copied into this process and kept (writers, maintenance, training);
        queries read :meth:`column_views` instead."""
        if self._cols is None:
            with self._lock:
                if self._cols is None:
                    self._cols = self._load_columns(txn)
        return self._cols

    def _load_columns(self, txn) -> SegmentColumns:
        if txn is None:
            with self.env.read() as t:
                return self._read_columns(t, copy=True)
        return self._read_columns(txn, copy=True)

    def column_views(self, txn) -> SegmentColumns:
        """The columns as zero-copy views of ``txn``'s pages (a ``buffers=True`` read
        transaction, as a snapshot's): valid while it is open, and never copied, so a
        reader's resident memory does not grow with the corpus (the pages are the LMDB
        file's, in the page cache). CRCs are checked the first time this process reads
        them."""
        if self._cols is not None:
            return self._cols
        if self._mapped_cols is not None:
            return self._mapped_cols
        return self._read_columns(txn, copy=False)

    def _read_columns(self, txn, *, copy: bool) -> SegmentColumns:
        """Every column from ``txn`` (copied, or views of its pages), CRC-checked on this
        process's first read. Views of columns that can be located in the file are kept
        (write-once: :mod:`npmdb.storage.mapped`) and serve every later snapshot."""
        check = not self._cols_checked
        arrs, located = {}, {}
        for name in COLUMNS:
            raw = txn.get(F.col_key(self.seg, name), db=self.env.dbs["segcols"])
            if raw is None:
                raise OperationalError(f"segment {self.seg} is missing its {name!r} column")
            arr = F.unpack_array(raw, verify=check, what=f"segment {self.seg} {name}")
            arrs[name] = arr.copy() if copy else arr
            if check and not copy and isinstance(raw, memoryview):
                located[name] = self.env.mapped.locate(raw), len(raw)
        self._cols_checked = True
        for name, (off, n) in located.items():  # LMDB's mapping of these was released
            if off is not None:
                arrs[name] = F.unpack_array(self.env.mapped.view(off, n),
                                            what=f"segment {self.seg} {name}")
        cols = SegmentColumns(**arrs)
        if located and all(off is not None for off, _ in located.values()):
            self._mapped_cols = cols
        return cols

    # -- vectors ----------------------------------------------------------------------

    def vectors(self, txn, gen: int, positions: np.ndarray) -> np.ndarray:
        """float32 vectors of ``positions`` (any order) for embedding generation ``gen``."""
        positions = np.asarray(positions, dtype=np.int64)
        if len(positions) == 0:
            return np.empty((0, self.dim), dtype=np.float32)
        chunks = positions // self.chunk
        first, last = int(chunks.min()), int(chunks.max())
        if first == last:
            stored = self.stored_chunk(txn, gen, first)
            return self.codec.decode(stored[positions - first * self.chunk])
        # gather the stored rows of every chunk touched, then decode them in one call
        order = np.argsort(chunks, kind="stable")
        bounds = np.flatnonzero(np.diff(chunks[order])) + 1
        raw = None
        for grp in np.split(order, bounds):
            ch = int(chunks[grp[0]])
            stored = self.stored_chunk(txn, gen, ch)
            if raw is None:
                raw = np.empty((len(positions), *stored.shape[1:]), dtype=stored.dtype)
            raw[grp] = stored[positions[grp] - ch * self.chunk]
        return self.codec.decode(raw)

    def stored_chunk(self, txn, gen: int, ch: int) -> np.ndarray:
        """Vector chunk ``ch`` of generation ``gen`` as stored (the codec's rows), checked
        against its CRC the first time this process reads it."""
        what = f"vectors g{gen} s{self.seg} c{ch}"
        at = self._located.get((gen, ch), _UNREAD)
        if at is not None and at is not _UNREAD:  # checked and located before: a view of the file, no page touch
            return F.unpack_array(self.env.mapped.view(*at), what=what)
        raw = txn.get(F.vec_key(gen, self.seg, ch), db=self.env.dbs["vectors"])
        if raw is None:
            raise OperationalError(f"segment {self.seg} has no vectors for generation {gen} "
                                   f"(chunk {ch}); the database is incomplete")
        if at is None:  # checked before, not located (no /proc, or a copied read)
            return F.unpack_array(raw, what=what)
        try:  # the CRC of each chunk is checked the first time this process reads it
            arr = F.unpack_array(raw, verify=True, what=what)
        except OperationalError as exc:
            raise OperationalError(
                f"segment {self.seg}: vector chunk {ch} of embedding generation {gen} is "
                f"corrupt ({exc}); nothing was answered from it. Run `npmdb check "
                f"{self.root}` for a full report") from None
        off = self.env.mapped.locate(raw) if isinstance(raw, memoryview) else None
        self._located[(gen, ch)] = None if off is None else (off, len(raw))  # write-once
        if off is not None:  # LMDB's mapping of it was released: read it from the file's
            return F.unpack_array(self.env.mapped.view(off, len(raw)), what=what)
        return arr

    def iter_chunks(self, txn, gen: int) -> Iterator[tuple[int, np.ndarray]]:
        n = self.record.tokens
        for ch in range((n + self.chunk - 1) // self.chunk):
            yield ch * self.chunk, self.stored_chunk(txn, gen, ch)

    def scan(self, txn, gen: int, q: np.ndarray, mask: np.ndarray, k: int
             ) -> tuple[np.ndarray, np.ndarray]:
        """Exact top-``k`` positions by inner product with ``q`` among ``mask`` tokens."""
        best_pos: list[np.ndarray] = []
        best_sc: list[np.ndarray] = []
        for base, stored in self.iter_chunks(txn, gen):
            m = mask[base:base + len(stored)]
            idx = np.flatnonzero(m)
            if len(idx) == 0:
                continue
            sims = self.codec.decode(stored[idx]) @ q
            if len(sims) > k:
                part = np.argpartition(-sims, k - 1)[:k]
                idx, sims = idx[part], sims[part]
            best_pos.append(idx + base)
            best_sc.append(sims)
        if not best_pos:
            return np.zeros(0, np.int64), np.zeros(0, np.float32)
        pos = np.concatenate(best_pos)
        sc = np.concatenate(best_sc)
        if len(sc) > k:
            part = np.argpartition(-sc, k - 1)[:k]
            pos, sc = pos[part], sc[part]
        order = np.argsort(-sc, kind="stable")
        return pos[order], sc[order]

    # -- indexes ----------------------------------------------------------------------

    def forget_generations(self, recorded: Callable[[int], bool]) -> None:
        """Drop the loaded indexes and located chunks of embedding generations for which
        ``recorded`` is false (removed by a vacuum); snapshots using them keep theirs."""
        with self._lock:
            # list(): stored_chunk adds located chunks without the lock
            located = list(self._located)
            gens = {g for g, _ in self._dense} | set(self._ivf) | {g for g, _ in located}
            for gen in [g for g in gens if not recorded(g)]:
                for key in [k for k in list(self._dense) if k[0] == gen]:
                    del self._dense[key]
                for key in [k for k in located if k[0] == gen]:
                    self._located.pop(key, None)
                self._ivf.pop(gen, None)

    def bm25(self) -> BM25Index:
        if self._bm25 is None:
            with self._lock:
                if self._bm25 is None:
                    self._verify_files("bm25")
                    self._bm25 = BM25Index(segment_dir(self.root, self.seg) / "bm25")
        return self._bm25

    def dense(self, gen: int, side: str, flags: np.ndarray | None = None) -> DenseIndex:
        """The dense index of ``side`` for generation ``gen`` (loaded once); an ``ivf``
        segment selects its side from the token ``flags`` (``column_views(txn).flags``)."""
        key = (gen, side)
        idx = self._dense.get(key)
        if idx is None:
            with self._lock:
                idx = self._dense.get(key)
                if idx is None:
                    kind = self.record.dense
                    if kind == IVF:
                        idx = self._ivf_side(gen, side, flags)
                    else:
                        self._verify_files([f"g{gen}.{side}.{kind}"])
                        idx = load_dense(kind, dense_path(self.root, self.seg, gen, side, kind),
                                         self.dim, self.params)
                    self._dense[key] = idx
        return idx

    def ivf_file(self, gen: int) -> IvfFile:
        """The segment's one IVF file of generation ``gen`` (an ``ivf`` segment's; loaded
        once, memory-mapped)."""
        file = self._ivf.get(gen)
        if file is None:
            with self._lock:
                file = self._ivf.get(gen)
                if file is None:
                    rel = f"g{gen}.{IVF_FILE}"
                    self._verify_files([rel], crc=False)  # mapped: sizes here, CRCs in check
                    file = self._ivf[gen] = IvfFile.load(segment_dir(self.root, self.seg) / rel)
        return file

    def ivf_coded(self, gen: int) -> "Entries | None":
        """Generation ``gen``'s IVF entries, coded (:meth:`IvfFile.coded`), or None where
        the segment's dense index is not an IVF-PQ file (another kind, or exact)."""
        if self.record.dense != IVF:
            return None
        file = self.ivf_file(gen)
        return file.coded() if file.approximate else None

    def _ivf_side(self, gen: int, side: str, flags: np.ndarray | None) -> IvfSide:
        """A side of the segment's one IVF file, selected by a bitmap of ``flags`` (kept:
        1 bit a token)."""
        file = self.ivf_file(gen)
        if flags is None:
            flags = self.columns().flags
        bit = F.VALID_START if side == "start" else F.VALID_END
        return file.side(side_bitmap(flags, bit), int(np.count_nonzero(flags & bit)),
                         self.params.ivf)

    # -- documents --------------------------------------------------------------------

    def doc_view(self, txn, local: int, view: Callable[[str], Any]) -> tuple[str, Any]:
        """A document's text and ``view(text)``, kept for the next call (the query layer
        keeps its folded text here, so answer keys are slices, not per-answer folds; one
        view function per reader)."""
        got = self._views.get(local)
        if got is None:
            if len(self._views) > 50_000:
                self._views.clear()
            text = self.doc(txn, local).text
            got = self._views[local] = (text, view(text))
        return got

    def doc(self, txn, local: int) -> StoredDoc:
        d = self._docs.get(local)
        if d is not None:
            self._docs.move_to_end(local)
            return d
        raw = txn.get(F.doc_key(self.seg, local), db=self.env.dbs["docs"])
        if raw is None:
            raise OperationalError(f"document {local} of segment {self.seg} is missing")
        if self._doc_crcs is None:
            self._doc_crcs = read_doc_crcs(txn, self.env.dbs, self.seg)
        if self._doc_crcs is not None and 0 <= local < len(self._doc_crcs) and \
                zlib.crc32(raw) != int(self._doc_crcs[local]):
            raise OperationalError(
                f"segment {self.seg}: document {local} is corrupt (checksum mismatch); run "
                f"`npmdb check {self.root}` for a full report")
        v = F.unpack(raw)
        meta = v.get("meta")
        d = StoredDoc(self.seg, local, v["id"], v["title"], v["text"],
                      F.pack(meta) if meta else b"")
        self._docs[local] = d
        if len(self._docs) > 50_000:
            self._docs.popitem(last=False)
        return d


def fsync_dir(path: Path) -> None:
    """fsync a directory of new index files before the commit that references them;
    hnswlib reports no write errors (a full disk leaves a short file), so walk them first."""
    validate_index_files(path)
    fsync_path(path)


class Readers:
    """The segment readers of one database handle, made once per segment (their loaded
    columns and indexes are shared by every snapshot that reads the segment)."""

    def __init__(self, root: Path, env, params: DenseParams) -> None:
        self.root, self.env, self.params = Path(root), env, params
        self._readers: dict[int, SegmentReader] = {}
        self._lock = threading.Lock()
        self._swept = -1  # the id of the last transaction sweep() looked through

    def get(self, txn, seg: int) -> SegmentReader:
        r = self._readers.get(seg)
        if r is None:
            rec = F.get_segment(txn, self.env.dbs, seg)
            if rec is None:
                raise OperationalError(f"segment {seg} is referenced but not recorded")
            with self._lock:
                r = self._readers.setdefault(seg, SegmentReader(self.root, self.env, rec,
                                                                self.params))
        return r

    def sweep(self, txn) -> None:
        """Let go of the readers of segments that ``txn`` no longer records (a vacuum in
        another handle or process removed them), and of the embedding generations whose
        vectors of a segment it no longer holds. A handle kept open beside a writer held
        their files (disk space never returned) and loaded indexes until it was closed.
        Snapshots that still use a reader keep it; only this cache's reference goes. Runs
        once per commit seen."""
        tid = txn.id()
        if tid <= self._swept:
            return
        dbs = self.env.dbs
        with self._lock:
            if tid <= self._swept:  # an older snapshot waited here for a newer one's sweep
                return
            self._swept = tid
            for seg, r in list(self._readers.items()):
                if F.get_segment(txn, dbs, seg) is None:
                    del self._readers[seg]
                else:  # a generation's vectors of this segment (chunk 0 is always there)
                    r.forget_generations(lambda g, s=seg: txn.get(
                        F.vec_key(g, s, 0), db=dbs["vectors"]) is not None)

    def clear(self) -> None:
        self._readers.clear()
