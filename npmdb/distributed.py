"""Distributed encoding with Ray Data: ``db.add(source, engine="ray")`` and Ray refreshes.

The optional extra ``npmdb[ray]`` (``pip install 'npmdb[ray]'``) provides Ray Data::

    db.add("corpus.jsonl.gz", engine="ray")                     # Ray's defaults
    db.add("corpus.jsonl.gz", engine=RayEngine(workers=8))      # or choose
    npmdb add my.npmdb corpus.jsonl.gz --ray --workers 8         # RAY_ADDRESS picks a cluster

LMDB has a single writer, so the work is split three ways:

* **driver** (this process): reads and validates the documents and assigns ids exactly as
  a local ``add`` does, then cuts them into *pieces* (the unit of work, ``piece_docs``
  documents) grouped into *segments* (closed at ``segment_docs`` documents or
  ``segment_chars`` characters);
* **encoder actors** (``Dataset.map_batches`` over an actor pool, one GPU each where the
  cluster has GPUs): each piece is tokenised, flagged and cut into blocks by
  :func:`npmdb.ingest.prepare` -- the local path's own code, so blocks are identical --
  encoded, and put through the database's vector codec. Token columns and stored vectors
  come back through Ray's object store (nothing needs a shared file system);
* **driver** again: puts pieces back in order and writes each segment as the local path
  does (vector chunks streamed into LMDB, documents and columns, tantivy BM25 and dense
  index files fsynced and renamed into place), then one commit (``Database._commit``) adds
  every segment as one version.

Nothing is visible to readers before that commit; on any failure the segments this call
wrote are removed and the pending batch is left as it was. A segment's documents, stored
vectors and index vectors are held by the driver only until the segment is written, and
documents are read in *waves* of ``wave_chars`` characters, so the driver's memory is
bounded by ``wave_chars`` plus one segment, whatever the size of the corpus.

:func:`write_generation` re-embeds every segment with a new model over the same workers (a
refresh after training); it has the signature of
:func:`npmdb.generations.write_generation`, so it plugs into
``npmdb.train.refresh.Refresher(db, write=...)``.

See docs/SCALE.md for measured throughput and the plan for a billion-token corpus.
"""

from __future__ import annotations

import inspect
import logging
import os
import time
import warnings
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator

import numpy as np

from .boundaries import VALID_END, VALID_START
from .corpus import Document, read_documents
from .errors import Error, IntegrityError, NotSupportedError, OperationalError, ProgrammingError
from npmdb.storage import codec as C
from npmdb.storage import format as F
from npmdb.storage import versions as V
from npmdb.storage import segments as _segments
from npmdb.storage.segments import fsync_dir, remove_dir, segment_dir, write_vector_chunk

if TYPE_CHECKING:  # pragma: no cover
    from .database import Database, _Batch
    from .encoder import Encoder

__all__ = ["RayEngine", "resolve_engine", "encode_piece", "write_generation"]

RAY_EXTRA = "pip install 'npmdb[ray]'"
_ENCODE_WINDOW = 256  # blocks per encode_blocks call, as in ingest.encode_and_store


def _import_ray():
    """``ray`` with Ray Data, or NotSupportedError naming the extra."""
    try:
        import ray
        import ray.data  # noqa: F401 - Ray Data comes with the [data] extra of ray
    except ImportError as exc:
        raise NotSupportedError(
            f"engine='ray' needs Ray Data, which is not installed: {RAY_EXTRA} "
            f"(ray[data] >= 2.9); or use engine='local' ({exc})") from exc
    return ray


@dataclass(frozen=True)
class RayEngine:
    """How ``Database.add(..., engine=RayEngine(...))`` uses a Ray cluster.

    ``workers``: encoder actors (default: one per GPU where the cluster has GPUs, else one
    per ``cpus_per_worker`` CPUs). ``gpus_per_worker``: default 1 where the cluster has
    GPUs, else 0. ``address``: passed to ``ray.init`` when Ray is not initialised yet
    (None: ``RAY_ADDRESS`` or a new local cluster, shut down again afterwards).
    ``piece_docs`` / ``piece_chars``: the unit of work of one actor call.
    ``segment_docs`` / ``segment_chars``: when a segment is closed (the unit of search:
    bigger segments mean fewer index probes per query, smaller ones less driver memory;
    ~16 M characters is ~3.5 M tokens with the default encoder). ``wave_chars``:
    documents read ahead by the driver. ``piece_tokens``: block tokens per piece when
    re-embedding (:func:`write_generation`). ``batch_tokens``: tokens per forward pass.
    """

    workers: int | None = None
    gpus_per_worker: float | None = None
    cpus_per_worker: float = 1.0
    address: str | None = None
    piece_docs: int = 256
    piece_chars: int = 1 << 20
    segment_docs: int | None = None
    segment_chars: int = 16 << 20
    wave_chars: int = 256 << 20
    piece_tokens: int = 1 << 16
    batch_tokens: int = 8192
    report: dict = field(default_factory=dict, compare=False, repr=False)
    """Filled by each run: pieces, tokens, actors, devices, worker CPU and wall seconds."""

    def __post_init__(self) -> None:
        for name in ("piece_docs", "piece_chars", "segment_chars", "wave_chars",
                     "piece_tokens", "batch_tokens"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ProgrammingError(f"RayEngine.{name} must be a positive integer, got {v!r}")
        for name in ("workers", "segment_docs"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise ProgrammingError(f"RayEngine.{name} must be a positive integer or None, "
                                       f"got {v!r}")
        if not self.cpus_per_worker > 0:
            raise ProgrammingError(f"RayEngine.cpus_per_worker must be > 0, got "
                                   f"{self.cpus_per_worker!r}")
        if self.gpus_per_worker is not None and not self.gpus_per_worker >= 0:
            raise ProgrammingError(f"RayEngine.gpus_per_worker must be >= 0, got "
                                   f"{self.gpus_per_worker!r}")

    def add_to_batch(self, db: "Database", b: "_Batch", docs: Any) -> None:
        """Encode ``docs`` on the cluster and add their segments to the pending batch ``b``."""
        _add_to_batch(self, db, b, docs)


def resolve_engine(engine: Any) -> RayEngine:
    """``'ray'`` or a :class:`RayEngine` (checked: Ray Data must be importable)."""
    if isinstance(engine, str) and engine == "ray":
        engine = RayEngine()
    if not isinstance(engine, RayEngine):
        raise ProgrammingError(f"engine must be 'local', 'ray' or an npmdb.distributed.RayEngine, "
                               f"got {engine!r}")
    _import_ray()
    return engine


# -- the worker side ------------------------------------------------------------------------


def encode_piece(encoder: "Encoder", piece: dict, block_len: int, codec_name: str,
                 batch_tokens: int = 8192) -> dict[str, Any]:
    """Encode one piece (what an actor does; callable without Ray).

    ``piece`` is ``{"texts": [...]}`` (documents: tokenised, flagged and cut into blocks by
    :func:`npmdb.ingest.prepare`) or ``{"tokens": int32[n], "block_ptr": int64[b+1]}``
    (existing blocks, for a refresh). Returns the token columns (documents only) and
    ``stored``: the codec's representation of every token's vector, in token order.
    """
    from .ingest import prepare

    t0, c0 = time.perf_counter(), time.process_time()
    codec = C.get_codec(codec_name)
    if "texts" in piece:
        docs = [Document(str(i), "", t, {}) for i, t in enumerate(piece["texts"])]
        prep = prepare(encoder, docs, block_len, progress=False)
        out: dict[str, Any] = dict(prep.columns())
        tokens, ptr = prep.tokens, prep.block_ptr
    else:
        out = {}
        tokens, ptr = piece["tokens"], piece["block_ptr"]
    blocks = [tokens[ptr[i]:ptr[i + 1]] for i in range(len(ptr) - 1)]
    hidden: list[np.ndarray] = []
    for i in range(0, len(blocks), _ENCODE_WINDOW):
        hidden.extend(encoder.encode_blocks(blocks[i:i + _ENCODE_WINDOW],
                                            batch_tokens=batch_tokens))
    h = np.concatenate(hidden) if hidden else np.zeros((0, encoder.hidden_size), np.float32)
    out["stored"] = codec.encode(h)
    out["stats"] = {"tokens": int(len(tokens)), "wall_s": time.perf_counter() - t0,
                    "cpu_s": time.process_time() - c0, "pid": os.getpid(),
                    "device": str(encoder.device)}
    return out


def _pack_piece(arrays: dict[str, Any]) -> bytes:
    return F.pack({k: (F.pack_array(v) if isinstance(v, np.ndarray) else v)
                   for k, v in arrays.items()})


def _unpack_piece(raw: bytes) -> dict[str, Any]:
    d = F.unpack(raw)
    return {k: (F.unpack_array(v, verify=True, what=f"encoded piece {k}")
                if isinstance(v, (bytes, bytearray)) else v) for k, v in d.items()}


class _EncodeWorker:
    """A Ray Data actor: loads the encoder once, then encodes one piece per call."""

    def __init__(self, encoder_path: str, info: dict, block_len: int, codec: str,
                 device: str, threads: int, batch_tokens: int) -> None:
        import torch

        from .encoder import Encoder, EncoderInfo, fingerprint_dir

        if device == "cpu":
            torch.set_num_threads(max(1, threads))
        enc_info = EncoderInfo.from_dict(info)
        path = Path(encoder_path)
        if not (path / "config.json").exists():
            raise OperationalError(f"a Ray worker cannot find the encoder at {path}: every node "
                                   "needs the encoder directory at the same path")
        if fingerprint_dir(path) != enc_info.fingerprint:
            raise OperationalError(f"a Ray worker found a different encoder at {path} (sha256 "
                                   f"mismatch): every node needs the database's encoder")
        self.encoder = Encoder(path, device=device, info=enc_info)
        self.block_len = block_len
        self.codec = codec
        self.batch_tokens = batch_tokens

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = [_pack_piece(encode_piece(self.encoder, _unpack_piece(bytes(p)), self.block_len,
                                        self.codec, self.batch_tokens))
               for p in batch["payload"]]
        res = np.empty(len(out), dtype=object)
        res[:] = out
        return {"piece": np.asarray(batch["piece"], dtype=np.int64), "payload": res}


# -- the driver side: cluster and pipeline ------------------------------------------------


@contextmanager
def _cluster(engine: RayEngine, progress: bool | None) -> Iterator[Any]:
    ray = _import_ray()
    started = False
    if not ray.is_initialized():
        ray.init(address=engine.address, include_dashboard=False,
                 logging_level=logging.WARNING)
        started = True
    ctx = ray.data.DataContext.get_current()
    saved = ctx.enable_progress_bars
    data_log = logging.getLogger("ray.data")
    level = data_log.level
    ctx.enable_progress_bars = bool(progress)
    if not progress:
        data_log.setLevel(logging.WARNING)
    try:
        yield ray
    finally:
        ctx.enable_progress_bars = saved
        data_log.setLevel(level)
        if started:
            ray.shutdown()


def _placement(ray, engine: RayEngine, db: "Database") -> tuple[int, float, str]:
    """(actors, GPUs per actor, torch device of an actor) for this cluster."""
    res = ray.cluster_resources()
    gpus, cpus = float(res.get("GPU", 0.0)), float(res.get("CPU", 1.0))
    per_gpu = engine.gpus_per_worker
    if per_gpu is None:
        per_gpu = 1.0 if gpus >= 1 else 0.0
    if per_gpu > gpus:
        raise ProgrammingError(f"RayEngine(gpus_per_worker={per_gpu}) but the Ray cluster has "
                               f"{gpus:g} GPUs")
    workers = engine.workers
    if workers is None:
        workers = int(gpus // per_gpu) if per_gpu else int(cpus // engine.cpus_per_worker)
    workers = max(1, workers)
    need_cpu, need_gpu = workers * engine.cpus_per_worker, workers * per_gpu
    if need_cpu > cpus or need_gpu > gpus:
        warnings.warn(f"RayEngine: {workers} workers need {need_cpu:g} CPUs and {need_gpu:g} "
                      f"GPUs, the Ray cluster has {cpus:g} and {gpus:g} now: the encoding waits "
                      "for resources (an autoscaler) or runs with fewer actors",
                      RuntimeWarning, stacklevel=4)
    # an actor sees only its own GPU(s) (Ray sets CUDA_VISIBLE_DEVICES): plain "cuda"
    want_cuda = per_gpu > 0 and not str(db.device or "cuda").startswith("cpu")
    return workers, per_gpu, ("cuda" if want_cuda else "cpu")


def _encoder_args(db: "Database", gen: int, encoder: "Encoder | None" = None) -> dict:
    enc = encoder or db.encoder_for(gen)
    return {"encoder_path": str(Path(enc.model.name_or_path).resolve()),
            "info": enc.info.to_dict(), "block_len": int(db.config["block_len"]),
            "codec": db.config.get("codec", "float16")}


def _run_pieces(ray, engine: RayEngine, items: list[dict], ctor: dict, workers: int,
                gpus: float) -> Iterator[tuple[int, dict]]:
    """Encode ``items`` (``{"piece": id, "payload": bytes}``) on an actor pool; yields
    ``(piece id, result)`` as results arrive (in any order)."""
    import ray.data

    kw = {}
    params = inspect.signature(ray.data.from_items).parameters
    if "override_num_blocks" in params:  # Ray >= 2.10; older: parallelism
        kw["override_num_blocks"] = len(items)
    else:  # pragma: no cover - old Ray
        kw["parallelism"] = len(items)
    ds = ray.data.from_items(items, **kw)
    ds = ds.map_batches(_EncodeWorker, batch_size=1, batch_format="numpy",
                        compute=ray.data.ActorPoolStrategy(size=min(workers, len(items))),
                        fn_constructor_kwargs=ctor, num_cpus=engine.cpus_per_worker,
                        num_gpus=gpus or None, zero_copy_batch=True)
    for batch in ds.iter_batches(batch_size=None, batch_format="numpy"):
        for pid, payload in zip(batch["piece"], batch["payload"]):
            yield int(pid), _unpack_piece(bytes(payload))


def _worker_error(exc: BaseException) -> Error | None:
    """The npmdb error an actor raised, recovered from Ray's wrapper (or None)."""
    import re

    from . import errors

    cause = getattr(exc, "cause", None)
    if isinstance(cause, Error):
        name, msg = type(cause).__name__, str(cause)
    else:
        found = re.findall(r"npmdb\.errors\.(\w+): ([^\n]*)", str(exc))
        if not found:
            return None
        name, msg = found[-1]
    cls = getattr(errors, name, None)
    if not (isinstance(cls, type) and issubclass(cls, Error)):
        return None
    return cls(msg if "Ray worker" in msg else f"{msg} (in a Ray worker)")


@contextmanager
def _ray_errors(what: str) -> Iterator[None]:
    """npmdb errors raised in actors come back as themselves; any other failure on the
    cluster as OperationalError (Ray's own exception and trace are its cause)."""
    try:
        yield
    except Error:
        raise
    except Exception as exc:  # noqa: BLE001 - Ray wraps actor failures in its own types
        err = _worker_error(exc)
        if err is not None:
            raise err from exc
        first = str(exc).strip().splitlines()[:1] or [""]
        raise OperationalError(f"{what} failed on the Ray cluster: {type(exc).__name__}: "
                               f"{first[0][:500]}") from exc


def _guarded(results: Iterator[tuple[int, dict]], what: str) -> Iterator[tuple[int, dict]]:
    """``results``, with failures on the cluster (not in the driver's own work between
    items) translated by :func:`_ray_errors`."""
    while True:
        with _ray_errors(what):
            item = next(results, None)
        if item is None:
            return
        yield item


# -- the driver side: writing segments ------------------------------------------------------


class _VectorWriter:
    """Streams a segment's stored vectors into LMDB chunks (as ``encode_and_store`` does)
    and keeps the valid starts' and ends' vectors for the dense indexes."""

    def __init__(self, db: "Database", seg: int, gen: int, codec_name: str,
                 rows: int | None = None) -> None:
        self.db, self.seg, self.gen = db, seg, gen
        self.rows = rows or _segments.CHUNK  # tokens per chunk: the segment's, or a new one's
        self.codec = C.get_codec(codec_name)
        self.pending: list[np.ndarray] = []
        self.n_pending = 0
        self.chunk = 0
        self.n = 0
        self.sides: dict[str, tuple[list, list]] = {"start": ([], []), "end": ([], [])}

    def append(self, flags: np.ndarray, stored: np.ndarray) -> None:
        if len(flags) != len(stored):
            raise OperationalError(f"a worker returned {len(stored)} vectors for "
                                   f"{len(flags)} tokens (segment {self.seg})")
        if len(stored):
            decoded = self.codec.decode(stored)  # exactly what the local path indexes
            for side, bit in (("start", VALID_START), ("end", VALID_END)):
                idx = np.flatnonzero(flags & bit)
                self.sides[side][0].append(idx + self.n)
                self.sides[side][1].append(decoded[idx].astype(np.float16))
            self.pending.append(stored)
            self.n_pending += len(stored)
        self.n += len(flags)
        self._flush(final=False)

    def _flush(self, final: bool) -> None:
        if self.n_pending < self.rows and not (final and self.n_pending):
            return
        buf = np.concatenate(self.pending)
        chunks = []
        while len(buf) >= self.rows or (final and len(buf)):
            chunks.append((self.chunk, np.ascontiguousarray(buf[:self.rows])))
            buf = buf[self.rows:]
            self.chunk += 1
        self.pending = [buf] if len(buf) else []
        self.n_pending = len(buf)
        if chunks:
            dbs = self.db.env.dbs
            self.db.env.write(lambda txn: [write_vector_chunk(txn, dbs, self.gen, self.seg, c, v)
                                           for c, v in chunks])

    def close(self, dim: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Flush; (start positions, start vectors, end positions, end vectors)."""
        self._flush(final=True)
        out = []
        for side in ("start", "end"):
            pos, vecs = self.sides[side]
            out.append(np.concatenate(pos).astype(np.int64) if pos else np.zeros(0, np.int64))
            out.append(np.concatenate(vecs) if vecs else np.zeros((0, dim), np.float16))
        return out[0], out[1], out[2], out[3]


class _SegmentBuilder:
    """One new segment assembled from encoded pieces, in order."""

    def __init__(self, db: "Database", seg: int, gen: int, codec: str, dim: int) -> None:
        self.db, self.seg, self.gen, self.dim, self.codec = db, seg, gen, dim, codec
        self.t0 = time.time()
        self.docs: list[Document] = []
        self.cols: dict[str, list[np.ndarray]] = {"tokens": [], "flags": [], "offsets": [],
                                                   "block_ptr": [np.zeros(1, np.int64)],
                                                   "block_doc": []}
        self.vectors = _VectorWriter(db, seg, gen, codec)

    def append(self, docs: list[Document], out: dict) -> None:
        n0, d0 = self.vectors.n, len(self.docs)
        c = self.cols
        c["tokens"].append(out["tokens"].astype(np.int32, copy=False))
        c["flags"].append(out["flags"].astype(np.uint8, copy=False))
        c["offsets"].append(out["offsets"].astype(np.int32, copy=False).reshape(-1, 2))
        c["block_ptr"].append(out["block_ptr"][1:].astype(np.int64) + n0)
        c["block_doc"].append(out["block_doc"].astype(np.int32) + d0)
        self.docs.extend(docs)
        self.vectors.append(out["flags"], out["stored"])

    def finish(self) -> dict:
        from .ingest import PreparedSegment, build_indexes, install_segment_dir, store_documents

        db, seg = self.db, self.seg
        starts_ends = self.vectors.close(self.dim)
        c = self.cols
        prep = PreparedSegment(self.docs, np.concatenate(c["tokens"] or [np.zeros(0, np.int32)]),
                               np.concatenate(c["flags"] or [np.zeros(0, np.uint8)]),
                               np.concatenate(c["offsets"] or [np.zeros((0, 2), np.int32)]),
                               np.concatenate(c["block_ptr"]),
                               np.concatenate(c["block_doc"] or [np.zeros(0, np.int32)]))
        self.cols = {}
        tmp = db.path / "segments" / f"tmp-s{seg:06d}"
        remove_dir(tmp)
        tmp.mkdir(parents=True)
        try:
            store_documents(db, seg, prep)
            build_indexes(db, prep, tmp, self.gen, starts_ends[:2], starts_ends[2:], db.progress)
            install_segment_dir(db, tmp, seg)
        except BaseException:
            remove_dir(tmp)
            raise
        return {"id": seg, "docs": len(prep.docs), "blocks": prep.n_blocks,
                "tokens": int(len(prep.tokens)), "dim": self.dim, "codec": self.codec,
                "chunk": self.vectors.rows,
                "dense": db.config.get("dense", "hnsw"), "gens": [self.gen],
                "created": time.time(), "seconds": round(time.time() - self.t0, 3),
                "engine": "ray"}


@dataclass
class _Piece:
    seg: int                      # segment number
    docs: list[Document]
    last: bool = False            # the segment's last piece
    chars: int = 0


@dataclass
class _Planner:
    """Assigns ids (as ``Database._add_to_batch`` does) and cuts pieces and segments."""

    db: "Database"
    b: "_Batch"
    engine: RayEngine
    first_seg: int
    seen: dict[str, int] = field(default_factory=dict)
    n_items: int = 0
    seg: int = 0
    seg_docs: int = 0
    seg_chars: int = 0
    piece: list[Document] = field(default_factory=list)
    piece_chars: int = 0

    def __post_init__(self) -> None:
        self.seg = self.first_seg

    def assign_ids(self, items: list[Document]) -> list[Document]:
        """Auto ids and duplicate checks for one wave, exactly as a local ``add``."""
        db, b = self.db, self.b
        with db.env.read() as txn:
            head = db._pending_manifest(txn, b)
            auto = int(V.get_meta(txn, db.env.dbs, "next_auto", 1)) + b.auto_used
            for j, d in enumerate(items):
                i = self.n_items + j
                if d.id is None:
                    while True:
                        cand = f"doc-{auto}"
                        auto += 1
                        b.auto_used += 1
                        if cand not in self.seen and cand not in b.new_ids and \
                                db._find_live(txn, head, cand) is None:
                            break
                    items[j] = d = Document(cand, d.title, d.text, d.meta)
                if d.id in self.seen:
                    raise IntegrityError(f"duplicate document id {d.id!r} (items {self.seen[d.id]} "
                                         f"and {i} of this add); nothing was committed")
                self.seen[d.id] = i
                if d.id in b.new_ids or db._find_live(txn, head, d.id) is not None:
                    raise IntegrityError(f"a document with id {d.id!r} already exists; use "
                                         "db.update(...) to replace it. Nothing was committed")
        self.n_items += len(items)
        return items

    def cut(self, items: list[Document]) -> Iterator[_Piece]:
        e = self.engine
        for d in items:
            self.piece.append(d)
            self.piece_chars += len(d.text)
            self.seg_docs += 1
            self.seg_chars += len(d.text)
            seg_full = self.seg_chars >= e.segment_chars or (
                e.segment_docs is not None and self.seg_docs >= e.segment_docs)
            if seg_full or len(self.piece) >= e.piece_docs or self.piece_chars >= e.piece_chars:
                yield self._close(last=seg_full)

    def _close(self, last: bool) -> _Piece:
        p = _Piece(self.seg, self.piece, last, self.piece_chars)
        self.piece, self.piece_chars = [], 0
        if last:
            self.seg += 1
            self.seg_docs = self.seg_chars = 0
        return p

    def end(self) -> Iterator[_Piece]:
        if self.piece:
            yield self._close(last=True)


def _waves(source: Iterable[Document], wave_chars: int
           ) -> Iterator[tuple[list[Document], bool]]:
    """Documents in waves of about ``wave_chars`` characters: ``(wave, is_last)``."""
    wave: list[Document] = []
    chars = 0
    for d in source:
        if chars >= wave_chars:  # full, and another document follows
            yield wave, False
            wave, chars = [], 0
        wave.append(d)
        chars += len(d.text)
    yield wave, True


class _Runs:
    """Starts the Ray cluster on first use; accumulates the workers' statistics."""

    def __init__(self, engine: RayEngine, db: "Database", ctor: dict) -> None:
        self.engine, self.db, self.ctor = engine, db, ctor
        self.stack = ExitStack()
        self.ray = None
        self.t0 = time.perf_counter()
        engine.report.clear()
        engine.report.update(pieces=0, tokens=0, worker_cpu_s=0.0, worker_wall_s=0.0,
                             actors=set(), devices=set())

    def run(self, items: list[dict]) -> Iterator[tuple[int, dict]]:
        if not items:
            return
        rep = self.engine.report
        if self.ray is None:
            t = time.perf_counter()
            self.ray = self.stack.enter_context(_cluster(self.engine, self.db.progress))
            self.workers, self.gpus, device = _placement(self.ray, self.engine, self.db)
            self.ctor.update(device=device, threads=int(max(1, self.engine.cpus_per_worker)),
                             batch_tokens=self.engine.batch_tokens)
            rep.update(cluster_s=time.perf_counter() - t, workers=self.workers,
                       gpus_per_worker=self.gpus)
        for pid, out in _run_pieces(self.ray, self.engine, items, self.ctor, self.workers,
                                    self.gpus):
            st = out.pop("stats", {})
            rep["pieces"] += 1
            rep.setdefault("first_result_s", time.perf_counter() - self.t0)
            rep["tokens"] += int(st.get("tokens", 0))
            rep["worker_cpu_s"] += float(st.get("cpu_s", 0.0))
            rep["worker_wall_s"] += float(st.get("wall_s", 0.0))
            rep["actors"].add(st.get("pid"))
            rep["devices"].add(st.get("device"))
            yield pid, out

    def close(self) -> None:
        rep = self.engine.report
        rep["actors"] = len(rep["actors"])
        rep["devices"] = sorted(str(d) for d in rep["devices"])
        rep["wall_s"] = time.perf_counter() - self.t0
        self.stack.close()


def _add_to_batch(engine: RayEngine, db: "Database", b: "_Batch", docs: Any) -> None:
    source = read_documents(docs)  # type and path errors at once, before Ray starts
    with db.env.read() as txn:
        gen = db._pending_manifest(txn, b).generation
        first_seg = int(V.get_meta(txn, db.env.dbs, "next_segment", 1)) + len(b.segments)
    encoder = db.encoder_for(gen)
    ctor = _encoder_args(db, gen, encoder)
    codec, dim = ctor["codec"], encoder.hidden_size
    saved = (len(b.segments), dict(b.new_ids), b.auto_used)
    planner = _Planner(db, b, engine, first_seg)
    builders: dict[int, _SegmentBuilder] = {}
    meta: dict[int, _Piece] = {}
    ready: dict[int, dict] = {}
    state = {"next": 0, "ids": 0}

    def handle(pid: int, out: dict) -> None:
        ready[pid] = out
        while state["next"] in ready:
            p, res = meta.pop(state["next"]), ready.pop(state["next"])
            state["next"] += 1
            builder = builders.get(p.seg)
            if builder is None:
                builder = builders[p.seg] = _SegmentBuilder(db, p.seg, gen, codec, dim)
            builder.append(p.docs, res)
            if p.last:
                finish(p.seg)

    def finish(seg: int) -> None:
        builder = builders[seg]
        info = builder.finish()
        del builders[seg]
        b.segments.append((seg, info))
        for local, d in enumerate(builder.docs):
            b.new_ids[d.id] = (seg, local)

    runs = _Runs(engine, db, ctor)

    def submit(pieces: list[_Piece]) -> None:
        items = []
        for p in pieces:
            pid = state["ids"]
            state["ids"] += 1
            meta[pid] = p
            items.append({"piece": pid,
                          "payload": _pack_piece({"texts": [d.text for d in p.docs]})})
        for pid, out in _guarded(runs.run(items), "encoding"):
            handle(pid, out)
        if meta:
            raise OperationalError(f"{len(meta)} encoded pieces never came back from Ray")

    try:
        try:
            for wave, last in _waves(source, engine.wave_chars):
                pieces = list(planner.cut(planner.assign_ids(wave)))
                if last:
                    pieces += list(planner.end())
                submit(pieces)
        finally:
            runs.close()
        for seg in sorted(builders):  # a segment whose last piece came before the end
            finish(seg)
    except BaseException:
        n_segs, new_ids, auto_used = saved
        for seg, _ in b.segments[n_segs:]:
            db._remove_segment(seg)
        for seg in builders:
            db._remove_segment(seg)
        del b.segments[n_segs:]
        b.new_ids.clear()
        b.new_ids.update(new_ids)
        b.auto_used = auto_used
        raise


# -- refresh: a new embedding generation over Ray --------------------------------------------


def write_generation(db: "Database", model: Any, *, steps: int = 0, tag: str | None = None,
                     message: str = "", info: dict | None = None,
                     engine: Any = "ray") -> tuple[int, int]:
    """Re-embed HEAD's segments with ``model`` on Ray workers; commit (one version).

    The same result as :func:`npmdb.generations.write_generation` (vectors within float16
    rounding): the checkpoint is kept inside the database, every segment gets vectors and
    dense indexes of the new generation, and one LMDB transaction records the generation
    and commits a version that reads it. Returns ``(version id, generation)``.
    """
    from .generations import begin_generation, commit_generation

    engine = resolve_engine(engine)
    with db._writing():
        new = begin_generation(db, model)
        gen, new_info, ckpt = new.gen, new.info, db.path / new.checkpoint
        ctor = {"encoder_path": str(ckpt), "info": new_info.to_dict(),
                "block_len": int(db.config["block_len"]),
                "codec": db.config.get("codec", "float16")}
        # waves of whole segments (about wave_chars / 4 tokens): bounded driver memory
        waves: list[list[Any]] = [[]]
        wave_tokens = 0
        for seg in new.segments:
            r = db._segment_reader(seg)
            if waves[-1] and wave_tokens + r.columns().n_tokens > engine.wave_chars // 4:
                waves.append([])
                wave_tokens = 0
            waves[-1].append(r)
            wave_tokens += r.columns().n_tokens
        runs = _Runs(engine, db, ctor)
        try:
            for readers in waves:
                _refresh_wave(db, runs, readers, gen, ctor["codec"], new_info.hidden_size,
                              engine.piece_tokens)
        finally:
            runs.close()

        vid = commit_generation(db, new, steps=steps, tag=tag, message=message,
                                info=dict(info or {}) | {"engine": "ray"})
        return vid, gen


def _refresh_wave(db: "Database", runs: _Runs, readers: list, gen: int, codec: str, dim: int,
                  piece_tokens: int) -> None:
    """Re-embed the segments ``readers`` (pieces of about ``piece_tokens`` block tokens);
    each segment's vectors and dense indexes of generation ``gen`` are written in order."""
    items: list[dict] = []
    meta: dict[int, tuple[Any, int, int, bool]] = {}
    for r in readers:
        cols = r.columns()
        ptr = cols.block_ptr
        for b0, b1 in _block_ranges(ptr, piece_tokens):
            lo, hi = int(ptr[b0]), int(ptr[b1])
            meta[len(items)] = (r, lo, hi, b1 == len(ptr) - 1)
            items.append({"piece": len(items), "payload": _pack_piece(
                {"tokens": np.ascontiguousarray(cols.tokens[lo:hi]),
                 "block_ptr": (ptr[b0:b1 + 1] - lo).astype(np.int64)})})
    writers: dict[int, _VectorWriter] = {}
    ready: dict[int, dict] = {}
    nxt = 0
    for pid, out in _guarded(runs.run(items), "re-embedding"):
        ready[pid] = out
        while nxt in ready:
            r, lo, hi, last = meta[nxt]
            res = ready.pop(nxt)
            nxt += 1
            w = writers.get(r.seg)
            if w is None:
                w = writers[r.seg] = _VectorWriter(db, r.seg, gen, codec, r.chunk)
            w.append(r.columns().flags[lo:hi], res["stored"])
            if last:
                _index_refreshed(db, r, gen, writers.pop(r.seg), dim)
    if nxt != len(items) or writers:
        raise OperationalError("some re-embedded pieces never came back from Ray")


def _block_ranges(ptr: np.ndarray, piece_tokens: int) -> Iterator[tuple[int, int]]:
    """Consecutive block ranges ``[b0, b1)`` of about ``piece_tokens`` tokens (at least one
    block each; one empty range for a segment without blocks)."""
    nb = len(ptr) - 1
    if nb == 0:
        yield 0, 0
        return
    b0 = 0
    while b0 < nb:
        b1 = int(np.searchsorted(ptr, ptr[b0] + piece_tokens, side="right")) - 1
        b1 = min(max(b1, b0 + 1), nb)
        yield b0, b1
        b0 = b1


def _index_refreshed(db: "Database", reader, gen: int, writer: _VectorWriter, dim: int) -> None:
    """Dense indexes of generation ``gen`` for one re-embedded segment, moved into place."""
    from .ingest import PreparedSegment, build_indexes

    cols = reader.columns()
    starts_ends = writer.close(dim)
    prep = PreparedSegment([], cols.tokens, cols.flags, cols.offsets, cols.block_ptr,
                           cols.block_doc)
    tmp = db.path / "segments" / f"tmp-g{gen}-s{reader.seg:06d}"
    remove_dir(tmp)
    tmp.mkdir(parents=True)
    build_indexes(db, prep, tmp, gen, starts_ends[:2], starts_ends[2:], db.progress, bm25=False)
    final = segment_dir(db.path, reader.seg)
    for f in tmp.iterdir():
        os.replace(f, final / f.name)
    fsync_dir(final)
    remove_dir(tmp)
