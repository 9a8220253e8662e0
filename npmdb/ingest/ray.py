"""Distributed ingest with Ray Data: ``db.add(source, engine="ray")`` and Ray refreshes.

The optional extra ``npmdb[ray]`` (``pip install 'npmdb[ray]'``) provides Ray Data::

    db.add("corpus.jsonl.gz", engine="ray")                     # Ray's defaults
    db.add("corpus.jsonl.gz", engine=RayEngine(workers=8))      # or choose
    npmdb add my.npmdb corpus.jsonl.gz --ray --workers 8         # RAY_ADDRESS picks a cluster

LMDB has a single writer, so the work is split three ways:

* **driver** (this process): reads and validates the documents and assigns ids through the
  Writer, exactly as a local ``add`` does, then cuts them into *pieces* (the unit of work,
  ``piece_docs`` documents) grouped into *segments* (closed at ``segment_docs`` documents
  or ``segment_chars`` characters);
* **encoder actors** (:mod:`npmdb.ingest.ray_workers`): each piece is tokenised, flagged
  and cut into blocks by the local path's own code, and encoded; token columns and float16
  vectors come back through Ray's object store;
* **driver** again: puts pieces back in order and hands each segment's documents, columns
  and vectors to the one segment writer (:mod:`npmdb.storage.segment_writer`), which
  stores them through the database's codec (training PQ once, as a local add does) and
  builds the indexes; the Writer's transaction commits every segment as one version.

Nothing is visible to readers before that commit; on any failure the caller's savepoint
removes the segments this call wrote and leaves the open transaction as it was. A
segment's documents and index vectors are held by the driver only until the segment is
written, and documents are read in *waves* of ``wave_chars`` characters, so the driver's
memory is bounded by ``wave_chars`` plus one segment, whatever the size of the corpus.

:meth:`RayEngine.reembed` re-embeds every segment with a new model over the same workers
(a refresh after training: ``db.write_generation(model, engine="ray")``).

See docs/SCALE.md for measured throughput and the plan for a billion-token corpus.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

import numpy as np

from npmdb.storage.ivf import Entries

from ..corpus import Document, read_documents
from ..errors import OperationalError, ProgrammingError
from .ray_workers import RAY_EXTRA, Runs, encode_piece, guarded, import_ray
from .ray_workers import _pack_piece

if TYPE_CHECKING:  # pragma: no cover
    from npmdb.storage.segment_writer import SegmentWriter
    from npmdb.storage.transaction import Writer

    from ..encoders import Encoders
    from ..generations import NewGeneration

__all__ = ["RayEngine", "resolve_engine", "encode_piece", "RAY_EXTRA"]


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
    ``worker_restarts``: how often Ray restarts an actor whose process died (out of memory,
    a crash) and retries its piece before the call fails with OperationalError (Ray Data's
    own default, for ever, would hang on a piece that kills its worker every time).
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
    worker_restarts: int = 2
    report: dict = field(default_factory=dict, compare=False, repr=False)
    """Filled by each run: pieces, tokens, waves, actors (the most in one wave),
    actor_processes (over all waves), devices, worker CPU and wall seconds."""

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
        v = self.worker_restarts
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ProgrammingError(f"RayEngine.worker_restarts must be an integer >= 0, got "
                                   f"{v!r}")
        if not self.cpus_per_worker > 0:
            raise ProgrammingError(f"RayEngine.cpus_per_worker must be > 0, got "
                                   f"{self.cpus_per_worker!r}")
        if self.gpus_per_worker is not None and not self.gpus_per_worker >= 0:
            raise ProgrammingError(f"RayEngine.gpus_per_worker must be >= 0, got "
                                   f"{self.gpus_per_worker!r}")

    def add(self, writer: "Writer", encoders: "Encoders", docs: Any) -> None:
        """Encode ``docs`` on the cluster and add their segments to the writer's open
        transaction (the caller holds a savepoint: a failure leaves nothing)."""
        _add(self, writer, encoders, docs)

    def reembed(self, writer: "Writer", encoders: "Encoders", new: "NewGeneration") -> None:
        """Write generation ``new``'s vectors and dense indexes for every segment it
        covers, encoding on the cluster (see :func:`npmdb.generations.write_generation`)."""
        _reembed(self, writer, encoders, new)


def resolve_engine(engine: Any) -> RayEngine:
    """``'ray'`` or a :class:`RayEngine` (checked: Ray Data must be importable)."""
    if isinstance(engine, str) and engine == "ray":
        engine = RayEngine()
    if not isinstance(engine, RayEngine):
        raise ProgrammingError(f"engine must be 'local', 'ray' or an npmdb.distributed.RayEngine, "
                               f"got {engine!r}")
    import_ray()
    return engine


# -- the driver -----------------------------------------------------------------------------


@dataclass
class _Piece:
    seg: int                      # segment number
    docs: list[Document]
    last: bool = False            # the segment's last piece
    chars: int = 0


@dataclass
class _Planner:
    """Assigns ids (through the Writer, as a local ``add``) and cuts pieces and segments;
    ``allocate()`` numbers each new segment."""

    writer: "Writer"
    engine: RayEngine
    allocate: Callable[[], int]
    seen: dict[str, int] = field(default_factory=dict)
    n_items: int = 0
    seg: int | None = None
    seg_docs: int = 0
    seg_chars: int = 0
    piece: list[Document] = field(default_factory=list)
    piece_chars: int = 0

    def assign_ids(self, items: list[Document]) -> list[Document]:
        """Auto ids and duplicate checks for one wave, exactly as a local ``add``."""
        ids = self.writer.assign_ids([d.id for d in items], self.seen, self.n_items)
        self.n_items += len(items)
        return [Document(i, d.title, d.text, d.meta) for i, d in zip(ids, items)]

    def cut(self, items: list[Document]) -> Iterator[_Piece]:
        e = self.engine
        for d in items:
            if self.seg is None:
                self.seg = self.allocate()
            self.piece.append(d)
            self.piece_chars += len(d.text)
            self.seg_docs += 1
            self.seg_chars += len(d.text)
            seg_full = self.seg_chars >= e.segment_chars or (
                e.segment_docs is not None and self.seg_docs >= e.segment_docs)
            if seg_full or len(self.piece) >= e.piece_docs or self.piece_chars >= e.piece_chars:
                yield self._close(last=seg_full)

    def _close(self, last: bool) -> _Piece:
        assert self.seg is not None
        p = _Piece(self.seg, self.piece, last, self.piece_chars)
        self.piece, self.piece_chars = [], 0
        if last:
            self.seg = None
            self.seg_docs = self.seg_chars = 0
        return p

    def end(self) -> Iterator[_Piece]:
        if self.piece:
            yield self._close(last=True)


def _waves(source: Iterable[Document], wave_chars: int, first_chars: int | None = None
           ) -> Iterator[tuple[list[Document], bool]]:
    """Documents in waves of about ``wave_chars`` characters (the first of about
    ``first_chars``, where given): ``(wave, is_last)``."""
    wave: list[Document] = []
    chars = 0
    limit = first_chars or wave_chars
    for d in source:
        if chars >= limit:  # full, and another document follows
            yield wave, False
            wave, chars, limit = [], 0, wave_chars
        wave.append(d)
        chars += len(d.text)
    yield wave, True


def _ctor(writer: "Writer", encoder_path: str, info: dict) -> dict:
    return {"encoder_path": encoder_path, "info": info, "block_len": writer.block_len}


def _runs(engine: RayEngine, writer: "Writer", encoders: "Encoders", ctor: dict) -> Runs:
    return Runs(engine, ctor, progress=writer.progress_enabled, device=encoders.device)


def _in_order(results: Iterator[tuple[int, dict]], n: int, what: str
              ) -> Iterator[tuple[int, dict]]:
    """``(piece id, result)`` from the cluster, put back in piece order."""
    ready: dict[int, dict] = {}
    nxt = 0
    for pid, out in guarded(results, what):
        ready[pid] = out
        while nxt in ready:
            yield nxt, ready.pop(nxt)
            nxt += 1
    if nxt != n:
        raise OperationalError(f"{n - nxt} {what} pieces never came back from Ray")


def _add(engine: RayEngine, writer: "Writer", encoders: "Encoders", docs: Any) -> None:
    source = read_documents(docs)  # type and path errors at once, before Ray starts
    gen = writer.generation
    encoder = encoders.get(gen)
    runs = _runs(engine, writer, encoders, _ctor(
        writer, str(Path(encoder.model.name_or_path).resolve()), encoder.info.to_dict()))
    planner = _Planner(writer, engine, writer.allocate_segment)
    open_segments: dict[int, "SegmentWriter"] = {}
    ivf_add = _ivf_codec(writer) is not None
    index = _worker_index(writer, gen)
    coded = 0

    def finish(seg: int) -> None:
        sw = open_segments.pop(seg)
        writer.append(sw.finish(), [d.id for d in sw.docs])

    # without a template yet, a first wave of about a training sample: the driver trains
    # the template on it, and the workers code every later wave's vectors themselves
    first = min(engine.wave_chars, TRAIN_WAVE_CHARS) if ivf_add and index is None else None
    try:
        for wave, last in _waves(source, engine.wave_chars, first):
            pieces = list(planner.cut(planner.assign_ids(wave)))
            if last:
                pieces += list(planner.end())
            items = [{"piece": i, "payload": _pack_piece({"texts": [d.text for d in p.docs]})}
                     for i, p in enumerate(pieces)]
            runs.ctor["index"] = index
            for pid, out in _in_order(runs.run(items), len(items), "encoding"):
                p = pieces[pid]
                sw = open_segments.get(p.seg)
                if sw is None:
                    sw = open_segments[p.seg] = writer.segment_writer(p.seg, gen, engine="ray")
                sw.add_documents(p.docs, out)
                if "stored" in out:  # coded by the worker against the template
                    sw.add_encoded(out["stored"], Entries(out["ivf_labels"], out["ivf_lists"],
                                                          out["ivf_codes"]))
                    coded += 1
                else:
                    sw.add_vectors(out["vectors"])
                if p.last:
                    finish(p.seg)
            if ivf_add and index is None and not last:
                for sw in open_segments.values():
                    if sw.ensure_template() is not None:
                        break
                index = _worker_index(writer, gen)
    finally:
        runs.close()
        engine.report["pieces_indexed_by_workers"] = coded
    for seg in sorted(open_segments):  # a segment whose last piece came before the end
        finish(seg)


# The first wave of an IVF add without a template: ~4M characters, about 900k tokens, more
# than the largest training sample (IvfParams.train_points) of valid starts and ends.
TRAIN_WAVE_CHARS = 4 << 20


def _ivf_codec(writer: "Writer") -> str | None:
    """The codec a worker codes in when every segment this add writes gets an IVF index
    (the database's kind, or ``auto`` over a corpus already past the threshold) and that
    codec is stateless; None otherwise."""
    from npmdb.storage.codec import is_stateful
    from npmdb.storage.dense import AUTO, AUTO_IVF_TOKENS, IVF

    head = writer.head()
    corpus = int(head.stats.get("tokens", 0)) if head else 0
    dense = str(writer.config.get("dense", "hnsw"))
    codec = writer.new_codec(corpus)
    big = dense == IVF or (dense == AUTO and corpus >= AUTO_IVF_TOKENS)
    return codec if big and not is_stateful(codec) else None


def _worker_index(writer: "Writer", gen: int) -> dict | None:
    """What the workers code with (the codec and the generation's IVF template), or None
    where they cannot or while the generation has no template."""
    from npmdb.storage import ivf

    codec = _ivf_codec(writer)
    template = ivf.read_template(writer.env, gen) if codec is not None else None
    return None if template is None else {"codec": codec, "template": template}


def _reembed(engine: RayEngine, writer: "Writer", encoders: "Encoders",
             new: "NewGeneration") -> None:
    """Re-embed the segments of ``new`` in waves of whole segments (about
    ``wave_chars / 4`` tokens: bounded driver memory), pieces of about ``piece_tokens``
    block tokens; each segment's vectors and dense indexes are written in order."""
    runs = _runs(engine, writer, encoders, _ctor(writer, str(writer.root / new.checkpoint),
                                                 new.info.to_dict()))
    readers = [writer.reader(seg) for seg in new.segments]
    waves: list[list[Any]] = [[]]
    tokens = 0
    for r in readers:
        n = r.columns().n_tokens
        if waves[-1] and tokens + n > engine.wave_chars // 4:
            waves.append([])
            tokens = 0
        waves[-1].append(r)
        tokens += n
    try:
        for wave in waves:
            items: list[dict] = []
            where: list[tuple[Any, bool]] = []
            for r in wave:
                cols = r.columns()
                ptr = cols.block_ptr
                for b0, b1 in _block_ranges(ptr, engine.piece_tokens):
                    lo, hi = int(ptr[b0]), int(ptr[b1])
                    where.append((r, b1 == len(ptr) - 1))
                    items.append({"piece": len(items), "payload": _pack_piece(
                        {"tokens": np.ascontiguousarray(cols.tokens[lo:hi]),
                         "block_ptr": (ptr[b0:b1 + 1] - lo).astype(np.int64)})})
            open_segments: dict[int, "SegmentWriter"] = {}
            for pid, out in _in_order(runs.run(items), len(items), "re-embedding"):
                r, last = where[pid]
                sw = open_segments.get(r.seg)
                if sw is None:
                    sw = open_segments[r.seg] = writer.segment_writer(
                        r.seg, new.gen, existing=r)
                sw.add_vectors(out["vectors"])
                if last:
                    open_segments.pop(r.seg).finish()
    finally:
        runs.close()


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
