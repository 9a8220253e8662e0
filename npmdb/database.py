"""Database: the facade. Lifecycle (open, close), queries, documents and writes; writes go
to the Writer (:mod:`npmdb.storage.transaction`) through ingest, queries to the query
runner. The version and maintenance methods (tags, checkout, restore, diff, optimize,
vacuum) are :class:`npmdb.versioning.Versioning`'s.

A database is a directory: an LMDB environment (``data.mdb``: documents, blocks, vectors,
manifests) and ``segments/`` (tantivy BM25 and dense index files per segment). Every change
commits a new immutable version in one LMDB write transaction, after the index files it
needs are written and fsynced.
"""

from __future__ import annotations

import inspect
import numbers
import os
import time
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from . import encoder as enc_mod
from . import ingest
from .arguments import check_device, check_location, check_ref, check_text
from .corpus import read_documents
from .encoders import Encoders
from .errors import InterfaceError, OperationalError, ProgrammingError
from .opening import FORMAT, check_config, claim_new, creation_lock, remove_unfinished
from .progress import bar_factory
from .result import Result
from .shards import check_sharding, open_shards
from .snapshot import Snapshot, history
from .versioning import Versioning, check_codec, index_kind
from npmdb.query.context import ExecContext
from npmdb.query.executor import execute
from npmdb.query.plan import Plan
from npmdb.query.planner import (
    SEARCH_COLUMNS, classify_prior, plan_classify, plan_masked, plan_search,
)
from npmdb.query.spec import (DEFAULT_K, ClassifySpec, DocFilter, MaskedSpec, check_names,
                              check_options, labels_of)
from npmdb.query.text import split_mask
from npmdb.storage import codec as C
from npmdb.storage import format as F
from npmdb.storage import versions as V
from npmdb.storage.dense import AUTO, IVF, SEGMENT_KINDS, DenseParams
from npmdb.storage.ivf import check_ivf_params
from npmdb.storage.env import Env
from npmdb.storage.segments import Readers
from npmdb.storage.paths import disk_bytes
from npmdb.storage.transaction import Writer

__all__ = ["Database", "open"]

_open = open


def open(path: str | os.PathLike, *, encoder: str | os.PathLike | None = None,
         create: bool = True, readonly: bool = False, **options: Any) -> "Database":
    """Open (or create) the database in directory ``path``; use it as a context manager.

    ``encoder``: a local Hugging Face model directory; None uses the one the database was
    made with, or for a new one npmdb's shipped encoder (``npmdb/all-MiniLM-L6-v2-npm``,
    the base trained by ``npmdb.train``; the untrained base where it is missing).
    Creation options: ``block_len`` (tokens a block, 256, or what the encoder takes if
    less), ``codec`` ('auto' | 'float16' | 'int8' | 'int4' |
    'pq'; 'auto', the default, stores float16 while the corpus is below ``AUTO_IVF_TOKENS``
    and int4 from there), ``index`` ('auto' | 'hnsw' | 'ivf' | 'exact'; 'auto', the default,
    picks per segment by corpus size, hnsw below ``AUTO_IVF_TOKENS`` and the compact IVF-PQ
    above; ``dense=`` is its older name, also taking 'faiss-hnsw' | 'faiss-flat'). Both are
    recorded per segment; an existing database converts with ``db.optimize(index=...,
    codec=...)``. Other options: ``timeout`` (seconds to wait
    for the writer lock), ``progress`` (show progress bars), ``device``.

    Sharded search: ``npmdb.open(path, readonly=True, engine="ray", shards=N)`` spreads
    the segments of the version each query reads over N Ray actors and merges their
    answers exactly (``engine="local"``: N shards in this process); see docs/SCALE.md.
    """
    check_names(options, set(inspect.signature(Database).parameters) - {"path"}, "npmdb.open")
    return Database(path, encoder=encoder, create=create, readonly=readonly, **options)


#: Tokens a block holds unless ``block_len`` says otherwise (or the encoder takes fewer).
DEFAULT_BLOCK_LEN = 256

class Database(Versioning):
    """An npmdb database directory. Create with :func:`npmdb.open`."""

    def __init__(self, path: str | os.PathLike, *, encoder: str | os.PathLike | None = None,
                 create: bool = True, readonly: bool = False, block_len: int | None = None,
                 codec: str | None = None, dense: str = AUTO, index: str | None = None,
                 timeout: float = 0.0,
                 progress: bool | None = None, device: str | None = None,
                 dense_params: DenseParams | None = None, engine: str | None = None,
                 shards: int | None = None) -> None:
        check_location(path, "the database path", "its directory")
        if encoder is not None:
            check_location(encoder, "encoder", "a local Hugging Face model directory, or None "
                           "for the database's own")
        try:
            self.path = Path(path).expanduser().resolve()
        except (OSError, RuntimeError) as exc:  # a symlink loop, an unreadable parent
            raise OperationalError(f"cannot resolve the database path {path!s:.200}: "
                                   f"{exc}") from None
        self._shards = None
        if engine is not None or shards is not None:
            check_sharding(engine, shards, readonly)
        self.readonly = readonly
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or \
                not 0 <= timeout < float("inf"):
            raise ProgrammingError(f"timeout must be a number of seconds >= 0 (0: do not "
                                   f"wait for another writer), got {timeout!r}")
        self.timeout = timeout
        self.progress = progress
        self.device = device if device is None else check_device(device)
        self.dense_params = dense_params or DenseParams()
        asked_index, asked_codec = index, codec
        codec = C.AUTO if codec is None else codec
        if index is not None:
            dense = index_kind(index)
        self._closed = True
        self._filter_cache: dict = {}
        exists, made, creating = claim_new(self.path, readonly=readonly, create=create,
                                           timeout=timeout)
        #: Whether this handle made the database (a failed first `npmdb add` removes it).
        self.created = not exists
        try:
            self.env = Env(self.path, readonly=readonly, create=not exists)
        except BaseException:
            if creating is not None:
                remove_unfinished(self.path, made)
                creating.release()
            raise
        self._closed = False
        self._readers = Readers(self.path, self.env, self.dense_params)
        self._encoders = Encoders(self.env, self.path, device=device)
        self._writer: Writer | None = None
        try:
            if not exists:
                self._create(encoder, block_len=block_len, codec=codec, dense=dense)
            else:
                self._check_existing(encoder, create=dict(block_len=block_len, codec=codec,
                                                          dense=dense) if create else None)
                # search settings too: refine=0 or nprobe="4" on reopening an IVF database
                # gave no candidates or an InternalError
                check_ivf_params(self.dense_params.ivf, self.config["dim"])
                if asked_index is not None and self.config.get("dense") != dense:
                    raise ProgrammingError(
                        f"{self.path} writes {self.config.get('dense')!r} indexes, not "
                        f"{asked_index!r}: open it without index= and convert with "
                        f"db.optimize(index={asked_index!r})")
                if asked_codec is not None and self.config.get("codec") != asked_codec:
                    raise ProgrammingError(
                        f"{self.path} writes {self.config.get('codec')!r} vectors, not "
                        f"{asked_codec!r}: open it without codec= and convert with "
                        f"db.optimize(codec={asked_codec!r})")
            if not readonly:
                self._writer = Writer(self.env, self.path, self.config, self._readers,
                                      params=self.dense_params, timeout=timeout,
                                      progress=progress, bars=bar_factory(progress))
                if exists:
                    self._writer.recover_if_free()
            if shards is not None:
                self._shards = open_shards(self.path, engine or "ray", shards,
                                           {"dense_params": self.dense_params})
        except BaseException:
            created = False  # by this handle (the creation lock keeps others out)
            if not exists:
                with suppress(Exception), self.env.read() as txn:
                    created = V.get_meta(txn, self.env.dbs, "config") is not None
            self.close()
            if not exists and not created:  # a failed creation leaves nothing behind
                remove_unfinished(self.path, made)
            raise
        finally:
            if creating is not None:
                creating.release()

    # -- lifecycle ---------------------------------------------------------------------

    def _create(self, encoder, *, block_len: int | None, codec: str, dense: str) -> None:
        if codec != C.AUTO:
            check_codec(codec)  # the name first: before the encoder is read
        if dense not in SEGMENT_KINDS + (AUTO,):
            raise ProgrammingError(f"dense must be one of {SEGMENT_KINDS + (AUTO,)}, got "
                                   f"{dense!r}")
        info = enc_mod.describe(encoder)
        if codec != C.AUTO:
            check_codec(codec, info.hidden_size)
        limit = enc_mod.block_limit(info.path)  # the encoder's positions less [CLS], [SEP]
        if block_len is None:
            block_len = min(DEFAULT_BLOCK_LEN, limit)
        if isinstance(block_len, bool) or not isinstance(block_len, int) or not 8 <= block_len:
            raise ProgrammingError(f"block_len must be an integer in 8..{limit}, got "
                                   f"{block_len!r}")
        if block_len > limit:
            raise ProgrammingError(
                f"block_len {block_len} is more than the encoder {info.name!r} takes: a block "
                f"and its [CLS] and [SEP] must fit its {limit + 2} positions; pass "
                f"block_len={limit} or less")
        if dense in (IVF, AUTO):
            check_ivf_params(self.dense_params.ivf, info.hidden_size)
        # loaded now, not at the first add: a directory it cannot be (no mask token,
        # weights that do not fit) made a database bound to it for good
        self._encoders.put(0, enc_mod.Encoder(info.path, device=self._encoders.device,
                                              info=info))
        config = {"format": FORMAT, "created": time.time(), "block_len": block_len,
                  "codec": codec, "dense": dense, "dim": info.hidden_size}

        def txn_fn(txn):
            V.put_meta(txn, self.env.dbs, "config", config)
            F.put_generation(txn, self.env.dbs, F.GenerationRecord(0, info.to_dict(),
                                                                   time.time()))
        self.env.write(txn_fn)
        self.env.sync()
        self.config = config

    def _check_existing(self, encoder, create: dict | None = None) -> None:
        with self.env.read() as txn:
            config = V.get_meta(txn, self.env.dbs, "config")
            unfinished = config is None and not any(True for _ in txn.cursor(db=self.env.dbs["meta"]))
            gen0 = None if config is None else F.get_generation(txn, self.env.dbs, 0)
        if not config:
            if unfinished and not (self.path / "segments").exists():
                # creation was interrupted before its first commit: nothing was committed
                if create is not None and not self.readonly:
                    # another process may be making it this moment: make it under its lock
                    lock = creation_lock(self.path, max(self.timeout, 60.0))
                    try:
                        with self.env.read() as txn:
                            if V.get_meta(txn, self.env.dbs, "config") is None:
                                return self._create(encoder, **create)
                    finally:
                        lock.release()
                    return self._check_existing(encoder, create)  # the other one made it
                raise OperationalError(
                    f"{self.path} holds an unfinished npmdb database (its creation was "
                    "interrupted before anything was committed): open it with create=True "
                    "to initialise it")
            raise OperationalError(f"{self.path} is not an npmdb database (no config): its "
                                   "data.mdb was replaced or damaged; restore it from a backup")
        check_config(self.path, config)
        if gen0 is None:
            raise OperationalError(f"embedding generation 0 is not recorded in {self.path}")
        self.config = config
        if encoder is not None:
            given = enc_mod.describe(encoder)
            want = enc_mod.EncoderInfo.from_dict(gen0.encoder)
            if given.fingerprint != want.fingerprint:
                raise ProgrammingError(
                    f"{self.path} was built with encoder {want.name!r} (sha256 "
                    f"{want.fingerprint[:12]}…) but you passed {given.name!r} (sha256 "
                    f"{given.fingerprint[:12]}…): open it with encoder=None to use its own "
                    "encoder, or use another directory for the new encoder")
            if want.tokenizer and not enc_mod.tokenizer_matches(Path(given.path),
                                                                 want.tokenizer):
                raise ProgrammingError(
                    f"{self.path} was built with encoder {want.name!r} and another tokenizer "
                    f"than the one at {given.path} (sha256 {given.tokenizer[:12]}…, recorded "
                    f"{want.tokenizer[:12]}…): the same weights would read the text as other "
                    "tokens; pass the directory with the original tokenizer files")
            self._encoders.override = Path(given.path)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._writer is not None:  # first: a thread writing stops and lets go
            self._writer.close()
        if self._shards is not None:
            self._shards.close()
            self._shards = None
        self._readers.clear()
        self._encoders.clear()
        self.env.close()

    def __enter__(self) -> "Database":
        self._check_open()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("read-only" if self.readonly else "open")
        return f"<npmdb.Database {str(self.path)!r} ({state})>"

    def _check_open(self) -> None:
        if self._closed:
            raise InterfaceError("the database is closed: open it again with npmdb.open(path)")

    def _writing(self) -> Writer:
        """The Writer, for a change (refused on a closed or read-only handle)."""
        self._check_open()
        if self.readonly or self._writer is None:
            raise OperationalError("the database was opened read-only (readonly=True)")
        return self._writer

    # -- encoders and snapshots --------------------------------------------------------------

    def encoder_for(self, gen: int) -> enc_mod.Encoder:
        """The encoder of embedding generation ``gen`` (loaded once, then cached)."""
        self._check_open()
        return self._encoders.get(gen)

    @property
    def encoder(self) -> enc_mod.Encoder:
        """The encoder of HEAD's embedding generation."""
        self._check_open()
        with self.env.read() as txn:
            gen = V.head_generation(txn, self.env.dbs)
        return self.encoder_for(gen)

    @contextmanager
    def snapshot(self, version: int | str | None = None, doc_filter=None) -> Iterator[Snapshot]:
        """A consistent read view of ``version`` (HEAD by default)."""
        self._check_open()
        check_ref(version)
        with self.env.read(buffers=True) as txn:
            m = V.resolve(txn, self.env.dbs, version)
            self._readers.sweep(txn)
            self._encoders.sweep(txn)
            segs = [self._readers.get(txn, s) for s in m.segments]
            gen = m.generation
            # the generation's record as this snapshot sees it: a vacuum in another process
            # may drop it (and keep its checkpoint until this reader ends) before the
            # encoder loads, which a bm25 query does only after its retrieval
            record = F.get_generation(txn, self.env.dbs, gen)
            snap = Snapshot(txn, m, segs, lambda: self._encoders.get(gen, record), doc_filter,
                            self._filter_cache)
            try:
                yield snap
            finally:
                # py-lmdb keeps an aborted read transaction's reader slot until the
                # Transaction object is freed; a Snapshot left in a reference cycle (query
                # state) would hold it until the next garbage collection, and under load
                # the 256 slots run out (MDB_READERS_FULL). A closed snapshot lets go.
                snap.close()  # the transaction, and the views of its pages
                del txn

    @contextmanager
    def _context(self, version: int | str | None = None, doc_filter: DocFilter | None = None
                 ) -> Iterator[ExecContext]:
        """What the query runner needs to read ``version``: its snapshot, the encoder of its
        generation, the version history. A database without versions gives a context
        without a snapshot (SHOW VERSIONS lists nothing; a query says the database is empty)."""
        self._check_open()
        check_ref(version)
        if version is None:
            with self.env.read() as txn:
                if V.get_meta(txn, self.env.dbs, "head") is None:
                    versions = history(txn, self.env.dbs)
                    yield ExecContext(None, self._encode_with(0), lambda: versions)
                    return
        with self.snapshot(version, doc_filter) as snap:
            yield ExecContext(snap, lambda text, mode: snap.encoder().encode_query(text, mode),
                              lambda: history(snap.txn, self.env.dbs), doc_filter,
                              shards=self._shards)

    def _encode_with(self, gen: int):
        return lambda text, mode: self.encoder_for(gen).encode_query(text, mode)

    # -- queries -------------------------------------------------------------------------

    def fill_mask(self, query: str, *, top: int = 5, k: int = DEFAULT_K, mode: str = "phrase",
                  retrieval: str | None = None, blocks: int = 3, max_len: int = 10,
                  tau: float = 1.0, alpha: float = 0.0, exact: bool = False,
                  **options: Any) -> Result:
        """Fill the single ``[MASK]`` in ``query`` with phrases retrieved from the corpus.

        ``retrieval``: ``"bm25"`` (the default: every token of the top ``blocks`` BM25
        blocks is a candidate), ``"dense"`` (top-``k`` starts and ends over the whole
        corpus; the default when ``exact=True``) or ``"hybrid"``.
        ``top``: answers returned (0: every one). See DESIGN.md section 1. Extra options: ``scoring`` ('npm' | 'raw'), ``group_by``
        ('phrase' | 'tokens' | 'document' | 'word'), ``clean_edges``, ``no_stopwords``,
        ``evidence`` (occurrences kept per answer), ``offset``, ``version`` (AS OF).
        """
        check_options(MaskedSpec, options)
        spec = MaskedSpec(query, top=top, k=k, mode=mode, retrieval=retrieval, blocks=blocks,
                          max_len=max_len, tau=tau, alpha=alpha, exact=exact, **options)
        return self.run_masked(spec)

    def run_masked(self, spec: MaskedSpec, **plan_args: Any) -> Result:
        split_mask(spec.text)  # fail fast on a query without exactly one mask
        check_text(spec.text, "the query")
        return self._run(plan_masked(spec, **plan_args), spec)

    def classify(self, query: str, labels: Mapping[str, str | Iterable[str]], *,
                 tau: float = 5.0, k: int = DEFAULT_K, mode: str = "phrase",
                 retrieval: str = "dense", calibrate: bool = False, **options: Any) -> Result:
        """Closed-set classification: each label's score sums exp-similarities of the
        retrieved candidates whose text is one of its words (DESIGN.md section 1).

        ``calibrate=True``: divide each label's probability by its probability for the
        sentence holding the mask alone (contextual calibration; one more query), so a
        label word that is merely frequent in the corpus does not always win."""
        check_options(ClassifySpec, options)
        norm = labels_of(labels)
        spec = ClassifySpec(query, norm, tau=tau, k=k, mode=mode, retrieval=retrieval,
                            calibrate=calibrate, **options)
        return self.run_classify(spec)

    def run_classify(self, spec: ClassifySpec, **plan_args: Any) -> Result:
        split_mask(spec.text)
        check_text(spec.text, "the query")
        check_text(spec.labels, "a label")
        with self._context(spec.version, spec.doc_filter) as ctx:
            # calibration: the template's label prior first, over the same version
            prior = classify_prior(spec, lambda plan: execute(plan, ctx))
            return execute(plan_classify(spec, prior=prior, **plan_args), ctx)

    def _run(self, plan: Plan, spec: MaskedSpec | ClassifySpec) -> Result:
        with self._context(spec.version, spec.doc_filter) as ctx:
            return execute(plan, ctx)

    def sql(self, text: str, params: Any = None) -> Result:
        """Run one query-language statement (see ``query/GRAMMAR.md``); ``?`` and ``:name``
        parameters are bound from ``params`` (a sequence or a mapping), never spliced."""
        from npmdb.query import sql

        self._check_open()
        check_text(text, "the statement")
        check_text(params, "a parameter")
        return sql.execute(text, params, self._context)

    def search(self, text: str, *, limit: int = 10, version: int | str | None = None,
               title: bool = False, **unknown: Any) -> list[dict[str, Any]]:
        """BM25 search over blocks: ``[{doc_id, title, block, score, snippet}]``.
        ``title=True`` matches the document titles too (what ``fill_mask``'s BM25
        retrieval does by default, ``bm25_title``). ``block`` numbers the block within its
        segment: it changes when ``optimize`` merges segments; ``doc_id`` and the snippet
        name the block for good."""
        check_names(unknown, ("limit", "version", "title"), "search")
        if not isinstance(text, str):
            raise ProgrammingError(f"search text must be a str, not {type(text).__name__}")
        check_text(text, "the search text")
        if not isinstance(limit, numbers.Integral) or isinstance(limit, bool) or limit < 0:
            raise ProgrammingError(f"limit must be a non-negative integer, got {limit!r}")
        limit = int(limit)  # numpy's too
        if not isinstance(title, bool):
            raise ProgrammingError(f"title must be True or False, got {title!r}")
        with self._context(version) as ctx:
            res = execute(plan_search(text, limit, title=title), ctx)
        return [dict(zip(SEARCH_COLUMNS, row)) for row in res.rows]

    # -- documents -----------------------------------------------------------------------

    def count(self, version: int | str | None = None) -> int:
        """Number of live documents at ``version`` (HEAD by default)."""
        self._check_open()
        check_ref(version)
        with self.env.read() as txn:
            if version is None and V.head(txn, self.env.dbs) is None:
                return 0
            return int(V.resolve(txn, self.env.dbs, version).stats.get("docs", 0))

    def __len__(self) -> int:
        return self.count()

    def get(self, doc_id: str, *, version: int | str | None = None) -> dict[str, Any] | None:
        """The live document ``doc_id`` as a dict, or None (also in an empty database)."""
        if not isinstance(doc_id, str):
            raise F.id_type_error(doc_id)
        if version is None and self.version is None:
            return None
        with self.snapshot(version) as snap:
            loc = V.find_doc(snap.txn, self.env.dbs, snap.manifest, doc_id)
            if loc is None:
                return None
            seg, local = loc
            d = snap.doc(snap.manifest.segments.index(seg), local)
            return {"id": d.id, "title": d.title, "text": d.text, "meta": d.meta}

    def documents(self, *, version: int | str | None = None) -> Iterator[dict[str, Any]]:
        """Every live document at ``version``, in insertion order (none in an empty
        database)."""
        if version is None and self.version is None:
            return
        with self.snapshot(version) as snap:
            for seg in snap.segments:
                dead = set(snap.manifest.deleted.get(seg.seg, ()))
                for local in range(seg.record.docs):
                    if local in dead:
                        continue
                    self._check_open()  # the iterator outlived db.close()
                    d = seg.doc(snap.txn, local)
                    yield {"id": d.id, "title": d.title, "text": d.text, "meta": d.meta}

    # -- writing -------------------------------------------------------------------------

    @contextmanager
    def batch(self, message: str = "") -> Iterator[Writer]:
        """Group changes into one version: ``with db.batch(): db.add(a); db.delete(b)``.
        Yields the Writer; another thread's change waits for the batch (``timeout=``)."""
        with self._writing().transaction(message):
            yield self._writer

    def add(self, docs: Any, *, message: str = "", engine: Any = "local") -> int | None:
        """Add documents; returns the new version id (None inside a batch).

        ``docs``: strings, dicts ``{id, title, text, meta}``, Documents, or a path to
        JSONL(.gz) / Parquet / CSV / text files or a directory of them.
        ``engine``: 'local' (this process), or 'ray' / an ``npmdb.distributed.RayEngine``
        to encode on a Ray cluster (the ``npmdb[ray]`` extra; see docs/SCALE.md).
        """
        runner = None
        if not (isinstance(engine, str) and engine == "local"):
            from .ingest.ray import resolve_engine
            runner = resolve_engine(engine)  # unknown engine or Ray missing: fail first
        writer = self._writing()
        with writer.transaction(message) as tx:
            with writer.savepoint():
                ingest.add(writer, self._encoders, docs, runner)
        return tx.version

    def delete(self, doc_ids: str | Iterable[str], *, message: str = "",
               missing_ok: bool = False) -> int | None:
        """Delete documents by id (tombstones until ``optimize``); returns the new version
        (None inside a batch). Every id is checked before anything is deleted."""
        if isinstance(doc_ids, (bytes, bytearray, Mapping)) or not (
                isinstance(doc_ids, str) or isinstance(doc_ids, Iterable)):
            raise ProgrammingError(f"delete takes a document id or a list of ids, got "
                                   f"{type(doc_ids).__name__}")
        ids = [doc_ids] if isinstance(doc_ids, str) else list(doc_ids)
        writer = self._writing()
        with writer.transaction(message) as tx:
            with writer.savepoint():
                writer.delete(ids, missing_ok=missing_ok)
        return tx.version

    def update(self, docs: Any, *, message: str = "") -> int | None:
        """Replace documents with the same ids (delete + add, one version; an id that is
        not there is added: an upsert); returns the new version id (None inside a
        batch)."""
        items = list(read_documents(docs))
        writer = self._writing()
        with writer.transaction(message) as tx:
            with writer.savepoint():
                writer.delete([d.id for d in items if d.id is not None], missing_ok=True)
                ingest.add(writer, self._encoders, items)
        return tx.version

    def write_generation(self, model: Any, *, steps: int = 0, tag: str | None = None,
                         message: str = "", info: dict | None = None,
                         engine: Any = "local", timeout: float | None = None,
                         move: bool = False) -> tuple[int, int]:
        """Re-embed every document with ``model`` (a transformers model, e.g. a trained
        copy of the encoder) as a new embedding generation, and commit a version that reads
        it (tagged ``tag``); returns ``(version, generation)``. Older versions keep their
        own encoder. ``engine``: 'local' or 'ray' / a RayEngine (see docs/SCALE.md);
        ``timeout``: seconds to wait for another writer (None: the handle's); ``move``: a
        ``tag`` that names another version moves (refused otherwise, as ``db.tag`` does).

        The model must be a copy of the database's encoder: the same hidden size, a
        vocabulary that holds the stored token ids, room for a block. Every argument is
        checked before anything is encoded; nothing is written when one is refused."""
        from .generations import check_request, reembed

        check_request(model, steps=steps, tag=tag, message=message, info=info,
                      timeout=timeout, move=move)

        runner = None
        if not (isinstance(engine, str) and engine == "local"):
            from .ingest.ray import resolve_engine
            runner = resolve_engine(engine)
        return reembed(self._writing(), self._encoders, model, steps=steps, tag=tag,
                       message=message, info=info, engine=runner, timeout=timeout,
                       move=move)

    def check(self, *, deep: bool = True):
        """Verify every checksum and reference of the database (see :mod:`npmdb.check`);
        returns a :class:`~npmdb.check.CheckReport` (``report.ok``, ``report.problems``)."""
        from .check import check
        self._check_open()
        return check(self.env, self.path, deep=deep)

    @property
    def version(self) -> int | None:
        """HEAD's version id (None for an empty database)."""
        self._check_open()
        with self.env.read() as txn:
            return V.meta_id(txn, self.env.dbs, "head")

    def stats(self) -> dict[str, Any]:
        """Counts and sizes: documents, blocks, tokens, segments, bytes on disk."""
        self._check_open()
        with self.env.read() as txn:
            m = V.head(txn, self.env.dbs)
            kinds: dict[str, int] = {}
            for seg in (m.segments if m else ()):
                kind = self._readers.get(txn, seg).record.dense
                kinds[kind] = kinds.get(kind, 0) + 1
        size = disk_bytes(self.path)
        data = {"tokens": 0} | (m.stats if m else {}) | {
            "segments": len(m.segments) if m else 0, "version": m.id if m else None,
            "generation": m.generation if m else 0, "bytes": size, "bytes_on_disk": size,
            "index": kinds}
        return data | {"config": dict(self.config)}
