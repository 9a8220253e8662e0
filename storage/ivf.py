"""The compact dense index for large corpora: FAISS IVF-PQ, its lists memory-mapped.

One file per segment and embedding generation, ``g{gen}.tokens.ivf``, holds every valid
start and every valid end of the segment once (NPM searches one index with ``q_s`` and
``q_e``); a search for starts or for ends selects its side with a bitmap over the
segment's token positions (FAISS ``IDSelectorBitmap``), so no side is over-fetched.

* **Trained once per database and generation.** The coarse quantiser (``nlist``
  centroids) and the PQ codebooks (``m`` bytes a vector) are trained on a sample (at
  most ``IvfParams.train_points`` vectors) of the first segment written with that
  generation -- of its first ``segment_writer.template_rows`` rows where it has more, so
  that a large first add never holds all its rows -- and kept in LMDB (``meta``, key
  ``ivf:g{gen}``) as an empty trained FAISS index with its CRC-32 (:func:`template_value`).
  Every later segment of that generation reuses it: an ``add`` only assigns and
  encodes its vectors, it never retrains. ``optimize()`` rewrites segments with the
  current template, or -- once the corpus has outgrown its lists (:func:`outgrown`) --
  trains a larger one for the corpus and commits it with the merged segment
  (:mod:`npmdb.storage.retrain`).
* **Memory-mapped.** The file is read with ``IO_FLAG_MMAP_IFC``: FAISS's in-memory list
  layout points into one read-only mapping of the file, so the inverted lists (codes and
  ids) stay in the page cache, never copied; resident memory per segment is the coarse
  centroids (``nlist x dim`` float32) and the codebooks. (``IO_FLAG_MMAP``, FAISS's
  on-disk lists, measured 1.7-2.3x slower per search for the same memory.)
* **Exact where it counts.** PQ scores only rank candidates: a search returns
  ``refine * k`` of them (:attr:`IvfSide.refine`) and the query engine re-scores those
  exactly from the stored vectors before keeping the top ``k``.
* **Probes by what is wanted, not by segment.** One template means list ``i`` of every
  segment is a part of one list ``i`` of the generation, so a search probes as many lists
  as hold about ``scan`` entries per candidate wanted, counting every segment's entries
  (:func:`probe_count`, between ``min_nprobe`` and ``nprobe``). As a corpus grows its
  lists fill up and fewer of them hold the best candidates: at 1M tokens a k = 1,024
  search probes ``nprobe`` (48) lists, at 10M 16, and the lists scanned per query stop
  growing with the corpus (bench/results/ivf-probes.md).
* **Small segments.** A segment written before any template exists and with fewer than
  :data:`MIN_TRAIN` vectors gets an exact flat index in the same file (a few MB at most);
  the file says which it holds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from npmdb.errors import OperationalError, ProgrammingError

from .ivf_template import (load_template, read_template, template_key, template_nlist,
                           template_of, template_value)
from .paths import fsync_path

__all__ = ["IvfParams", "IvfFile", "IvfSide", "MIN_TRAIN", "template_key", "template_value",
           "template_of", "train_template",
           "build_ivf", "Entries", "Coder", "BackgroundCoder", "load_template",
           "check_ivf_params", "side_bitmap", "IVF_FILE", "read_template", "probe_count",
           "corpus_nlist", "trainable_nlist", "outgrown", "template_nlist", "RETRAIN_FACTOR",
           "POINTS_PER_LIST"]

MIN_TRAIN = 4096  # vectors a template is trained on at least (PQ's 256 centroids each)
IVF_FILE = "tokens.ivf"  # g{gen}.tokens.ivf


@dataclass(frozen=True, slots=True)
class IvfParams:
    """IVF-PQ settings. ``nlist``: coarse lists (None: a power of two near 4·√n of the
    training vectors, at least 39 training vectors per list); ``m``: PQ bytes per vector
    (None: 64, NPM's code size, or the largest divisor of the dimension below it);
    ``nprobe``: the most lists searched per query and segment; ``min_nprobe``: the fewest;
    ``scan``: index entries scanned per candidate wanted, which picks the lists between
    the two (:func:`probe_count`); ``refine``: candidates re-scored exactly per wanted
    one; ``train_points``: the largest training sample; ``list_entries``: the entries a
    list holds on average when ``optimize`` retrains the template for the corpus
    (:func:`corpus_nlist`, :func:`outgrown`)."""

    nlist: int | None = None
    m: int | None = None
    nprobe: int = 48
    min_nprobe: int = 16
    scan: int = 14
    refine: int = 3
    train_points: int = 131072
    list_entries: int = 6144


def _pq_m(dim: int, m: int | None) -> int:
    if m is None:
        return max(d for d in range(1, min(64, dim) + 1) if dim % d == 0)
    if not isinstance(m, int) or isinstance(m, bool) or m < 1 or dim % m:
        raise ProgrammingError(f"IVF-PQ with m={m!r} bytes a vector does not fit the encoder's "
                               f"dimension {dim}: m must divide {dim} (for example "
                               f"{[d for d in (16, 32, 48, 64, 96) if dim % d == 0]})")
    return m


def check_ivf_params(params: IvfParams, dim: int) -> None:
    """Raise :class:`ProgrammingError` for settings that cannot work (before any write)."""
    _pq_m(dim, params.m)
    for name in ("nprobe", "min_nprobe", "scan", "refine", "train_points", "list_entries"):
        v = getattr(params, name)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ProgrammingError(f"IvfParams.{name} must be a positive integer, got {v!r}")
    if params.nlist is not None and (not isinstance(params.nlist, int) or params.nlist < 1):
        raise ProgrammingError(f"IvfParams.nlist must be a positive integer or None, got "
                               f"{params.nlist!r}")


def probe_count(params: IvfParams, wanted: int, entries: int, nlist: int) -> int:
    """Lists to probe for ``wanted`` candidates when the generation's lists (``nlist`` of
    them, one template) hold ``entries`` over all the segments searched: enough that about
    ``params.scan`` entries are scanned per candidate wanted, at least ``min_nprobe`` and
    at most ``nprobe`` (which wins) and ``nlist``.

    Measured on the int4 dev replays (k = 1,024, refine 3, recall against an exact scan):
    at 1M tokens 48 lists give 0.977 (16: 0.876); at 10.5M 16 lists give 0.981 (48:
    0.988, at three times the scan) (bench/results/ivf-probes.md)."""
    mean = max(entries / max(nlist, 1), 1.0)
    want = math.ceil(params.scan * max(wanted, 1) / mean)
    return int(max(1, min(nlist, params.nprobe, max(params.min_nprobe, want))))


def _auto_nlist(n: int) -> int:
    want = 2 ** round(math.log2(max(4.0 * math.sqrt(n), 1.0)))
    return int(max(16, min(want, 65536, n // 39)))


# optimize() retrains a generation's template once its lists hold this many times
# IvfParams.list_entries on average (docs/SCALE.md section 4: what a retrain bought at 24.8M)
RETRAIN_FACTOR = 2.0
# the training sample of a retrained template: this many vectors a list (FAISS's k-means
# subsamples to 256 a list; 64 keeps 8,192 lists trainable in minutes on 2 cores)
POINTS_PER_LIST = 64


def corpus_nlist(entries: int, params: IvfParams) -> int:
    """Lists for a template whose lists should hold ``params.list_entries`` of a corpus's
    ``entries`` (valid starts and ends): the power of two nearest, at least what a first
    segment's template gets (:func:`_auto_nlist` of the largest sample), at most 65,536;
    ``params.nlist`` where set."""
    if params.nlist is not None:
        return params.nlist
    want = 2 ** round(math.log2(max(entries / params.list_entries, 1.0)))
    return int(min(max(want, _auto_nlist(min(entries, params.train_points))), 65536))


def trainable_nlist(entries: int, params: IvfParams) -> int:
    """:func:`corpus_nlist`, as many as a sample of all ``entries`` can train (FAISS's 39
    vectors a list)."""
    return max(1, min(corpus_nlist(entries, params), entries // 39))


def outgrown(nlist: int, entries: int, params: IvfParams) -> bool:
    """Whether a template of ``nlist`` lists is too coarse for ``entries``: its lists hold
    more than :data:`RETRAIN_FACTOR` times ``params.list_entries`` on average, and a new
    template would have at least twice the lists (:func:`trainable_nlist`), so a retrain
    halves what a probed list holds at least, and a retrained template is not retrained
    again until the corpus has grown. Every search probes at least ``min_nprobe`` lists:
    a list's size is what a search's cost grows with."""
    return (entries > RETRAIN_FACTOR * params.list_entries * nlist
            and trainable_nlist(entries, params) >= 2 * nlist)


def train_template(sample: np.ndarray, params: IvfParams, threads: int | None = None,
                   nlist: int | None = None) -> bytes:
    """An empty IVF-PQ index trained on ``sample`` (float32 rows), serialised: with
    ``nlist`` lists (default: ``params.nlist``, else one for the sample's size), on at most
    ``params.train_points`` of the rows (or :data:`POINTS_PER_LIST` a list, if more)."""
    import faiss

    n, dim = sample.shape
    m = _pq_m(dim, params.m)
    if n < MIN_TRAIN:
        raise ProgrammingError(f"an IVF-PQ index needs at least {MIN_TRAIN} training vectors, "
                               f"got {n}")
    nlist = nlist or (params.nlist if params.nlist is not None else _auto_nlist(n))
    if nlist * 39 > n:
        raise ProgrammingError(f"IVF nlist={nlist} is too large for a training sample of {n} "
                               f"vectors (FAISS needs at least 39 per list): choose nlist <= "
                               f"{n // 39}, or leave it None to pick one")
    limit = max(params.train_points, POINTS_PER_LIST * nlist)
    if n > limit:
        rng = np.random.default_rng(13)
        sample = sample[np.sort(rng.choice(n, limit, replace=False))]
    x = np.ascontiguousarray(sample, dtype=np.float32)
    quantizer = faiss.IndexFlatIP(dim)
    index = faiss.IndexIVFPQ(quantizer, dim, nlist, m, 8, faiss.METRIC_INNER_PRODUCT)
    index.cp.max_points_per_centroid = 64  # a bounded k-means: the sample, not the corpus
    index.cp.niter = 12
    prev = faiss.omp_get_max_threads()
    if threads:
        faiss.omp_set_num_threads(threads)
    try:
        index.train(x)
    finally:
        faiss.omp_set_num_threads(prev)
    return bytes(faiss.serialize_index(index))


@dataclass(frozen=True)
class Entries:
    """Vectors already coded against a template (where a Ray worker coded them): token
    positions, inverted-list numbers and PQ codes, row for row."""

    labels: np.ndarray   # int64[n]
    lists: np.ndarray    # int64[n]
    codes: np.ndarray    # uint8[n, code_size]

    def shifted(self, by: int) -> "Entries":
        return Entries(self.labels + by, self.lists, self.codes)

    def between(self, lo: int, hi: int) -> "Entries":
        """The entries of positions ``lo`` to ``hi`` (labels ascending), from position 0."""
        a, z = np.searchsorted(self.labels, [lo, hi])
        return Entries(self.labels[a:z] - lo, self.lists[a:z], self.codes[a:z])


class Coder:
    """Codes vectors against a trained template (:func:`load_template`) as
    ``add_with_ids`` stores them: an inverted-list number and a PQ code of the residual.

    The coarse assignment, ~90 % of an add's cost with a flat quantiser (every vector
    against every centroid: 2,048 x 384 multiply-adds), is a search of an HNSW graph over
    the template's centroids instead (``efSearch`` 64: the nearest centroid for all but a
    few vectors in a thousand, and those go to a list nearly as near, which a query's
    ``nprobe`` lists still cover). The graph is built on one thread, so the same template
    codes the same vectors the same way in every process: the driver and the Ray workers
    write byte-identical files. Queries still probe with the template's exact quantiser.

    The PQ code of each residual is computed here, one sub-quantiser at a time as a
    matrix product against its 256 centroids (:meth:`pq_codes`), not by FAISS's
    ``encode_vectors``, which for sub-vectors this short (6 dimensions at 64 bytes and
    384) measures each centroid one vector at a time: 2.4 s instead of 6.8 s for 160k
    vectors on 2 cores, the same code for all but ~1 vector in 20,000 (a centroid tied
    to float rounding).
    """

    def __init__(self, index) -> None:
        import faiss

        self.index = index
        self.ivf = faiss.extract_index_ivf(index)
        centroids = self.ivf.quantizer.reconstruct_n(0, self.ivf.nlist)
        self.graph = faiss.IndexHNSWFlat(self.ivf.d, 32, self.ivf.metric_type)
        self.graph.hnsw.efConstruction = 80
        self.graph.hnsw.efSearch = 64
        prev = faiss.omp_get_max_threads()
        faiss.omp_set_num_threads(1)
        try:
            self.graph.add(centroids)
        finally:
            faiss.omp_set_num_threads(prev)
        self.centroids = centroids
        pq = getattr(faiss.downcast_index(self.ivf), "pq", None)
        self.pq = None  # (centroids M x ksub x dsub, their squared norms) for pq_codes
        if pq is not None and pq.nbits == 8 and self.ivf.by_residual and \
                self.ivf.code_size == pq.M:
            c = faiss.vector_to_array(pq.centroids).reshape(pq.M, pq.ksub, pq.dsub)
            self.pq = (np.ascontiguousarray(c.transpose(0, 2, 1)), (c ** 2).sum(-1))

    def encode(self, vectors: np.ndarray, labels: np.ndarray) -> Entries:
        import faiss

        x = np.ascontiguousarray(vectors, dtype=np.float32)
        labels = np.ascontiguousarray(labels, dtype=np.int64)
        codes = np.zeros((len(x), self.ivf.code_size), np.uint8)
        if not len(x):
            return Entries(labels, np.zeros(0, np.int64), codes)
        _, nearest = self.graph.search(x, 1)
        lists = np.ascontiguousarray(nearest[:, 0], dtype=np.int64)
        if self.pq is not None:
            codes = self.pq_codes(x, lists)
        else:
            self.ivf.encode_vectors(len(x), faiss.swig_ptr(x), faiss.swig_ptr(lists),
                                    faiss.swig_ptr(codes), False)
        return Entries(labels, lists, codes)

    def pq_codes(self, x: np.ndarray, lists: np.ndarray, block: int = 8192) -> np.ndarray:
        """The 8-bit PQ codes of ``x``'s residuals from their lists' centroids: for each
        sub-quantiser the nearest of its centroids by L2 (``‖c‖² − 2·r·c``)."""
        assert self.pq is not None
        ct, norms = self.pq
        m, dsub, _ = ct.shape
        codes = np.empty((len(x), m), np.uint8)
        for a in range(0, len(x), block):
            r = (x[a:a + block] - self.centroids[lists[a:a + block]]).reshape(-1, m, dsub)
            for j in range(m):
                d = r[:, j, :] @ ct[j]
                d *= -2.0
                d += norms[j]
                codes[a:a + block, j] = d.argmin(1)
        return codes


class BackgroundCoder:
    """A segment's index rows coded on one background thread while the encoder runs.

    A local ``add`` into a generation whose template exists hands each window's valid
    starts and ends here as they are encoded, instead of coding them all in
    :func:`build_ivf` after the encoder is done (FAISS releases the GIL; the coder runs on
    one OpenMP thread). It pays where the cores are not all the encoder's: a replayed copy
    (no encoder) builds in about half the time; an encoder-bound add on 2 cores measured
    no faster; there (``threaded=False``) each window is coded in the caller's thread
    as it arrives, which costs the same as coding every row at the end and holds a
    window instead of the segment. At most ``depth`` windows wait, so memory stays
    bounded when the coder falls behind. :meth:`parts` gives the rows in the order they
    were handed in: the same entries :func:`build_ivf` would code from the same vectors.
    """

    def __init__(self, template: bytes, dim: int, depth: int = 2, *,
                 threaded: bool = True) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.coder = Coder(load_template(template, dim))
        self.depth = depth
        self.threaded = threaded  # False: each submit codes in the caller's thread
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="npmdb-ivf-code") \
            if threaded else None
        self._pending: list = []
        self._done: list[Entries] = []
        self.count = 0  # rows handed in

    def submit(self, vectors: np.ndarray, labels: np.ndarray) -> None:
        self.count += len(labels)
        if self._pool is None:
            self._done.append(self.coder.encode(vectors, labels))
            return
        while len(self._pending) >= self.depth:
            self._done.append(self._pending.pop(0).result())
        self._pending.append(self._pool.submit(self._code, vectors, labels))

    def _code(self, vectors: np.ndarray, labels: np.ndarray) -> Entries:
        import faiss

        faiss.omp_set_num_threads(1)  # this thread's OpenMP only: the encoder has the cores
        return self.coder.encode(vectors, labels)

    def parts(self) -> list[Entries]:
        """Every row coded, in order, as the windows were coded (waits for the thread; the
        thread is let go): what :func:`build_ivf` adds one at a time, never joined."""
        try:
            while self._pending:
                self._done.append(self._pending.pop(0).result())
        finally:
            self.close()
        done, self._done = self._done, []
        return done

    def close(self) -> None:
        for f in self._pending:
            f.cancel()
        if self._pool is not None:
            self._pool.shutdown(wait=False)


def _add_entries(index, entries: Entries) -> None:
    import faiss

    ivf = faiss.extract_index_ivf(index)
    if entries.codes.shape[1] != ivf.code_size:
        raise OperationalError(f"coded vectors of {entries.codes.shape[1]} bytes for an index "
                               f"of {ivf.code_size}: they were coded with another template")
    if not len(entries.lists):
        return
    order = np.argsort(entries.lists, kind="stable")
    lists, labels = entries.lists[order], entries.labels[order]
    codes = np.ascontiguousarray(entries.codes[order])
    cuts = np.flatnonzero(np.diff(lists)) + 1
    for lo, hi in zip(np.concatenate([[0], cuts]), np.concatenate([cuts, [len(lists)]])):
        ids = np.ascontiguousarray(labels[lo:hi])
        part = np.ascontiguousarray(codes[lo:hi])
        ivf.invlists.add_entries(int(lists[lo]), int(hi - lo), faiss.swig_ptr(ids),
                                 faiss.swig_ptr(part))
    ivf.ntotal += len(lists)
    index.ntotal = ivf.ntotal


def build_ivf(template: bytes | None, vectors: np.ndarray, labels: np.ndarray,
              path: Path, entries: "Entries | list[Entries] | None" = None) -> None:
    """Write the segment's index to ``path`` (fsynced): the template's IVF-PQ filled with
    ``vectors`` under ``labels`` (token positions) and with ``entries`` (vectors coded
    elsewhere with the same template), or an exact flat index without a template.

    ``entries`` may be a list of parts in order (a coder's windows): each is added and
    dropped from the list in turn, never joined, so the build holds the parts and the
    index, not a third copy (a 100M-token merged segment's 52.6M entries are 4.2 GB a
    copy: joined and sorted whole, its build was killed for memory on a 24 GB machine).
    The file is the same either way: a list's entries keep the parts' order."""
    import faiss

    dim = vectors.shape[1]
    parts = entries if isinstance(entries, list) else [] if entries is None else [entries]
    if template is not None:
        index = load_template(template, dim)
        if len(labels):
            _add_entries(index, Coder(index).encode(vectors, labels))
        while parts:  # appended after: what one add of both in order gives
            _add_entries(index, parts.pop(0))
    else:
        if any(len(p.labels) for p in parts):
            raise OperationalError("coded vectors for a segment without an IVF template")
        index = faiss.IndexIDMap2(faiss.IndexFlatIP(dim))
        if len(labels):
            index.add_with_ids(np.ascontiguousarray(vectors, dtype=np.float32),
                               np.ascontiguousarray(labels, dtype=np.int64))
    faiss.write_index(index, str(path))
    fsync_path(path)


def side_bitmap(flags: np.ndarray, bit: int) -> np.ndarray:
    """A FAISS ``IDSelectorBitmap`` bitmap (bit ``i & 7`` of byte ``i >> 3``) of the
    positions whose flags have ``bit``."""
    return np.packbits((flags & bit) != 0, bitorder="little")


def _template_part(ivf: Any, name: str) -> np.ndarray:
    """An IVF-PQ index's coarse ``centroids`` or its PQ ``codebooks``, as an array."""
    import faiss

    if name == "centroids":
        return ivf.quantizer.reconstruct_n(0, ivf.nlist)
    return faiss.vector_to_array(faiss.downcast_index(ivf).pq.centroids)


@dataclass(frozen=True)
class Coding:
    """What an IVF-PQ template codes vectors against: its coarse centroids and PQ
    codebooks, read once (``optimize`` compares every source segment's file with it)."""

    nlist: int
    code_size: int
    centroids: np.ndarray
    codebooks: np.ndarray

    @classmethod
    def of(cls, ivf: Any) -> "Coding":
        return cls(int(ivf.nlist), int(ivf.code_size), _template_part(ivf, "centroids"),
                   _template_part(ivf, "codebooks"))

    @classmethod
    def of_template(cls, template: bytes | None, dim: int) -> "Coding | None":
        """The coding of a serialized template (None for none)."""
        import faiss

        if template is None:
            return None
        loaded = load_template(template, dim)  # kept alive while its parts are read
        return cls.of(faiss.extract_index_ivf(loaded))

    def matches(self, ivf: Any) -> bool:
        """Whether the IVF-PQ index ``ivf`` codes with these centroids and codebooks."""
        return (self.nlist, self.code_size) == (ivf.nlist, ivf.code_size) and \
            np.array_equal(self.centroids, _template_part(ivf, "centroids")) and \
            np.array_equal(self.codebooks, _template_part(ivf, "codebooks"))


class IvfFile:
    """A segment's ``g{gen}.tokens.ivf``, opened memory-mapped."""

    def __init__(self, index, path: Path) -> None:
        import faiss

        self.index, self.path = index, path
        self.ivf = faiss.try_extract_index_ivf(index) if hasattr(
            faiss, "try_extract_index_ivf") else None
        self.approximate = self.ivf is not None

    @classmethod
    def load(cls, path: Path) -> "IvfFile":
        import faiss

        if not path.exists():
            raise OperationalError(f"the dense index {path} is missing: the database directory "
                                   "is incomplete (run `npmdb check`)")
        try:
            index = faiss.read_index(str(path), faiss.IO_FLAG_MMAP_IFC)
        except RuntimeError as exc:
            raise OperationalError(f"cannot load the dense index {path}: "
                                   f"{str(exc).splitlines()[0][:300]}") from exc
        return cls(index, path)

    @property
    def kind(self) -> str:
        return "ivf-pq" if self.approximate else "flat"

    @property
    def entries(self) -> int:
        """Index entries (valid starts and ends) in the file's lists."""
        return int(self.index.ntotal)

    def coded_with(self, coding: "Coding | None") -> bool:
        """Whether this file's entries were coded against ``coding``: the same coarse
        centroids and PQ codebooks (a generation's template changes when ``optimize``
        retrains it, and a version restored from before holds segments of the old one)."""
        if not self.approximate or coding is None:
            return False
        return coding.matches(self.ivf)

    def coded(self) -> Entries:
        """Every entry of an IVF-PQ file as :class:`Entries` (token positions ascending):
        what ``optimize`` hands to a merged segment of the same template instead of coding
        the vectors again."""
        import faiss

        if not self.approximate:
            raise OperationalError(f"{self.path} is an exact (flat) index: it has no codes")
        inv, size = self.ivf.invlists, self.ivf.code_size
        labels, lists, codes = [], [], []
        for i in range(self.ivf.nlist):
            n = inv.list_size(i)
            if not n:
                continue
            labels.append(faiss.rev_swig_ptr(inv.get_ids(i), n).astype(np.int64))
            codes.append(faiss.rev_swig_ptr(inv.get_codes(i), n * size).reshape(n, size).copy())
            lists.append(np.full(n, i, np.int64))
        if not labels:
            return Entries(np.zeros(0, np.int64), np.zeros(0, np.int64),
                           np.zeros((0, size), np.uint8))
        got = Entries(np.concatenate(labels), np.concatenate(lists), np.concatenate(codes))
        order = np.argsort(got.labels, kind="stable")
        return Entries(got.labels[order], got.lists[order], got.codes[order])

    def side(self, bitmap: np.ndarray, count: int, params: IvfParams) -> "IvfSide":
        return IvfSide(self, bitmap, count, params)


class IvfSide:
    """One side (starts or ends) of an :class:`IvfFile`: the :class:`DenseIndex`
    protocol, with ``approximate`` and ``refine`` telling the engine to re-score."""

    kind = "ivf"

    def __init__(self, file: IvfFile, bitmap: np.ndarray, count: int, params: IvfParams) -> None:
        import faiss

        self.file, self.count, self.params = file, count, params
        self.bitmap = np.ascontiguousarray(bitmap, dtype=np.uint8)  # kept alive for FAISS
        self.selector = faiss.IDSelectorBitmap(len(self.bitmap) * 8, faiss.swig_ptr(self.bitmap))
        self.approximate = file.approximate
        self.refine = params.refine if file.approximate else 1

    def __len__(self) -> int:
        return self.count

    def probes(self, k: int, entries: int | None = None) -> int:
        """Lists a search for ``k`` probes when the lists searched hold ``entries`` in all
        (None: this file's own; the query engine passes every segment's, see
        :func:`probe_count`)."""
        return probe_count(self.params, k, self.file.entries if entries is None else entries,
                           self.file.ivf.nlist)

    def search(self, q: np.ndarray, k: int, entries: int | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` best of this side by PQ score (exact on a flat file); ``entries``:
        the entries of every segment searched with the same template (:meth:`probes`)."""
        import faiss

        k = min(k, self.count)
        if k <= 0:
            return np.zeros(0, np.int64), np.zeros(0, np.float32)
        if self.file.approximate:
            sp = faiss.SearchParametersIVF(sel=self.selector, nprobe=self.probes(k, entries))
        else:
            sp = faiss.SearchParameters(sel=self.selector)
        scores, labels = self.file.index.search(
            np.ascontiguousarray(q, dtype=np.float32)[None], k, params=sp)
        keep = labels[0] >= 0
        return labels[0][keep].astype(np.int64), scores[0][keep].astype(np.float32)
