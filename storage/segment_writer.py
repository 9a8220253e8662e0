"""The one segment writer: every write path hands it vectors, and it writes them.

A local ``add`` and Ray ingest hand it documents with their token columns and the
encoder's vectors; an embedding refresh hands it a new generation's vectors for an
existing segment; ``optimize`` hands it the merged segments' documents, columns and
stored codes. It

1. stores the vectors through the database's codec, in chunks of ``chunk`` tokens, as
   they arrive (a stateful codec not trained yet, PQ on a new database, is trained here,
   once, on the first ``TRAIN_POINTS`` vectors, and its state saved before anything is
   stored with it); vectors are rounded to float16 first, so every path stores the same
   codes for the same encoder output;
2. keeps the valid starts' and ends' vectors exactly as stored (decoded), for the dense
   indexes -- or, for an IVF segment whose generation has its template, codes them
   against it as they arrive (``ivf.BackgroundCoder``): on a background thread, so the
   coding overlaps the encoder, unless ``code_ahead`` is off (an encoder with every CPU
   core), then between windows. A generation's first IVF segment trains the template
   once it holds :func:`template_rows` rows (or at ``finish``, if it never does) and
   codes from then on;
3. on :meth:`SegmentWriter.finish`: stores the documents and token columns (new segments),
   builds the BM25 index (new segments) and the dense start/end indexes, fsyncs them and
   moves them into place, and returns the typed :class:`~npmdb.storage.format.SegmentRecord`.

Nothing it writes is visible before a commit names the segment (or the generation); what a
failed writer leaves is removed by the Writer (:mod:`npmdb.storage.transaction`).
"""

from __future__ import annotations

import bisect
import os
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol, Sequence

import numpy as np

from npmdb.errors import OperationalError

from . import codec as C
from . import format as F
from . import segments as S
from .bm25 import BlockDoc, build_bm25
from . import ivf
from .dense import AUTO, AUTO_IVF_TOKENS, IVF, DenseParams, build_dense
from .env import Env
from .paths import fsync_path, remove_dir, segment_dir

__all__ = ["SegmentWriter", "TRAIN_POINTS", "TEMPLATE_ROWS_PER_SAMPLE", "template_rows", "Bar"]

TRAIN_POINTS = 16384  # vectors a stateful codec (PQ) is trained on, from the first ones stored
# a generation's first IVF segment trains its template once it holds this many times the
# training sample (IvfParams.train_points) in start and end rows: ~400 MB of float16 rows
# at the defaults, from which the template's sample is drawn
TEMPLATE_ROWS_PER_SAMPLE = 4


def template_rows(params: ivf.IvfParams) -> int:
    """Start and end rows a generation's first IVF segment holds before it trains the
    template (a token that is both counts twice, so at least twice ``ivf.MIN_TRAIN``)."""
    return max(TEMPLATE_ROWS_PER_SAMPLE * params.train_points, 2 * ivf.MIN_TRAIN)


class Bar(Protocol):
    """A progress bar (tqdm's interface)."""

    def update(self, n: int) -> Any: ...

    def close(self) -> Any: ...


class _NoBar:
    def update(self, n: int) -> None:
        return None

    def close(self) -> None:
        return None


def no_bar(total: int, desc: str, unit: str) -> Bar:
    return _NoBar()


class _Doc(Protocol):
    id: str
    title: str
    text: str
    meta: Any


class SegmentWriter:
    """Writes segment ``seg``'s data of embedding generation ``gen``.

    ``codec``: the codec's name (the database's, e.g. ``'pq'``, for a new segment; the
    segment's recorded one when re-embedding or merging). ``columns``: the token columns
    of an existing segment (a refresh); None for a new segment, whose documents come
    through :meth:`add_documents`. ``progress(total, desc, unit)`` makes a progress bar.
    """

    def __init__(self, env: Env, root: Path, seg: int, gen: int, *, codec: str, dense: str,
                 params: DenseParams, dim: int, chunk: int | None = None,
                 columns: S.SegmentColumns | None = None,
                 progress: Callable[[int, str, str], Bar] | None = None,
                 engine: str = "local", merged_from: Sequence[int] = (),
                 corpus_tokens: int = 0) -> None:
        self.env, self.root, self.seg, self.gen = env, Path(root), seg, gen
        self.corpus_tokens = corpus_tokens  # HEAD's tokens, for the "auto" index kind
        self.codec = C.load_codec(env, codec)
        self.dense, self.params, self.dim = dense, params, dim
        self.chunk = chunk or S.CHUNK
        self.existing = columns
        self.progress = progress or no_bar
        self.engine, self.merged_from = engine, tuple(merged_from)
        self.t0 = time.time()
        self.docs: list[_Doc] = []
        self._cols: dict[str, list[np.ndarray]] = {k: [] for k in S.COLUMNS}
        self._cols["block_ptr"].append(np.zeros(1, np.int64))
        self._starts: list[int] = [0]  # token offset of each appended flags array
        self.n_tokens = 0 if columns is None else columns.n_tokens  # known token count
        self.n = 0  # vector rows received
        self._codes: list[np.ndarray] = []
        self._n_codes = 0
        self._chunk_no = 0
        self._waiting: list[np.ndarray] = []  # float32 rows before the codec is trained
        self._sides: dict[str, tuple[list[np.ndarray], list[np.ndarray]]] = {
            "start": ([], []), "end": ([], [])}
        self._entries: list[ivf.Entries] = []  # index rows coded by Ray workers
        # index rows coded while the encoder runs (an IVF segment whose generation has a
        # template): decided at the first vectors
        self._ahead: ivf.BackgroundCoder | None = None
        self._ahead_decided = False
        # whether that background coder may run: an encoder that has every CPU core sets
        # it False (npmdb.ingest.local.leaves_a_core), and the rows are coded at finish
        self.code_ahead = True
        # the IVF template to code against instead of the generation's saved one: a
        # template that optimize() retrains and commits with the segment
        self.template: bytes | None = None

    # -- input ----------------------------------------------------------------------------

    def add_documents(self, docs: Sequence[_Doc], cols: dict[str, np.ndarray]) -> None:
        """Append documents and their token columns (``tokens``, ``flags``, ``offsets``,
        ``block_ptr`` (from 0), ``block_doc`` (from 0)) to a new segment."""
        if self.existing is not None:
            raise OperationalError(f"segment {self.seg} exists: it takes no documents")
        n0, d0 = self.n_tokens, len(self.docs)
        c = self._cols
        c["tokens"].append(np.asarray(cols["tokens"], np.int32))
        c["flags"].append(np.asarray(cols["flags"], np.uint8))
        c["offsets"].append(np.asarray(cols["offsets"], np.int32).reshape(-1, 2))
        c["block_ptr"].append(np.asarray(cols["block_ptr"][1:], np.int64) + n0)
        c["block_doc"].append(np.asarray(cols["block_doc"], np.int32) + d0)
        self.docs.extend(docs)
        self.n_tokens += len(cols["tokens"])
        self._starts.append(self.n_tokens)

    def add_vectors(self, h: np.ndarray) -> None:
        """The encoder's vectors (float32 or float16) of the next ``len(h)`` tokens."""
        if not len(h):
            return
        if isinstance(self.codec, C.Float16Codec) and h.dtype == np.float16:
            self.add_stored(np.ascontiguousarray(h))
            return
        x = C.cast(np.asarray(h), np.float16) if h.dtype != np.float16 else np.asarray(h)
        if isinstance(self.codec, C.Float16Codec):
            self.add_stored(x)
            return
        x = C.cast(x, np.float32)  # float16 first: every path stores the same codes
        if isinstance(self.codec, C.PQSpec):
            self._waiting.append(x)
            self._train(final=False)
        else:
            self.add_stored(self.codec.encode(x))

    def add_stored(self, stored: np.ndarray) -> None:
        """Rows of the next tokens already in this segment's codec (copied by optimize)."""
        self._append_stored(stored, decode=True)

    def _append_stored(self, stored: np.ndarray, *, decode: bool) -> None:
        """Append codec rows; with ``decode``, keep the valid starts' and ends' vectors (as
        stored) for the dense index."""
        if not len(stored):
            return
        lo, hi = self.n, self.n + len(stored)
        if hi > self.n_tokens:
            raise OperationalError(f"segment {self.seg}: vectors for {hi} tokens, but the "
                                   f"segment has {self.n_tokens}")
        if decode:
            flags = self._flags(lo, hi)
            need = np.flatnonzero(flags & (F.VALID_START | F.VALID_END))
            decoded = self.codec.decode(stored[need]) if len(need) else \
                np.zeros((0, self.dim), np.float32)
            ahead = self._coder_ahead()
            if ahead is not None:  # each token once, as the IVF file keeps them
                ahead.submit(C.cast(C.cast(decoded, np.float16), np.float32), need + lo)
            else:
                for side, bit in (("start", F.VALID_START), ("end", F.VALID_END)):
                    rows = np.flatnonzero(flags[need] & bit)
                    self._sides[side][0].append(need[rows] + lo)
                    self._sides[side][1].append(C.cast(decoded[rows], np.float16))
                self._train_when_enough()
        self._codes.append(stored)
        self._n_codes += len(stored)
        self.n = hi
        self._flush(final=False)

    def _coder_ahead(self) -> ivf.BackgroundCoder | None:
        """The coder of this segment's IVF rows as they arrive, once its index is IVF and
        the generation has a template (the tokens are all known at the first vectors, so
        ``auto`` has picked the kind): on a background thread where ``code_ahead`` allows,
        else in this thread between windows. Either way the writer holds a window of float
        vectors at a time, not the segment's."""
        if not self._ahead_decided:  # looked up once: only this writer could add one
            self._ahead_decided = True
            if self.kind() == IVF:
                template = self.template or ivf.read_template(self.env, self.gen)
                if template is not None:  # else rows are kept until _train_when_enough
                    self._start_coder(template)
        return self._ahead

    def _start_coder(self, template: bytes) -> None:
        self._ahead = ivf.BackgroundCoder(template, self.dim, threaded=self.code_ahead)

    def _train_when_enough(self) -> None:
        """The first IVF segment of a generation keeps its rows until it holds
        :func:`template_rows` of them, then trains the template on them, saves it and
        codes them (later rows are coded as they arrive). Before, it kept every row to
        ``finish``: a 33M-token first segment reached 13 GB in its first minutes. A smaller
        first segment trains at ``finish`` as before."""
        if self._ahead is not None or self.kind() != IVF:
            return
        held = sum(len(p) for side in self._sides.values() for p in side[0])
        if held < template_rows(self.params.ivf):
            return
        pos, vecs = self._ivf_vectors()
        template = self.ensure_template(vecs)
        if template is None:  # pragma: no cover - template_rows covers MIN_TRAIN
            return
        self._sides = {"start": ([], []), "end": ([], [])}
        self._start_coder(template)
        assert self._ahead is not None
        self._ahead.submit(vecs, pos)

    def add_encoded(self, stored: np.ndarray, entries: ivf.Entries) -> None:
        """Rows of the next tokens in this segment's codec with their IVF entries, coded
        by a worker against the generation's template (positions from the first of these
        tokens): nothing is decoded or coded here."""
        lo = self.n
        if self.kind() != IVF:
            raise OperationalError(f"segment {self.seg}: IVF entries for a "
                                   f"{self.kind()} index")
        self._entries.append(entries.shifted(lo))
        self._append_stored(stored, decode=False)

    def _flags(self, lo: int, hi: int) -> np.ndarray:
        if self.existing is not None:
            return self.existing.flags[lo:hi]
        parts = self._cols["flags"]
        i = bisect.bisect_right(self._starts, lo) - 1
        out, at = [], lo
        while at < hi:
            a = at - self._starts[i]
            take = parts[i][a:a + hi - at]
            out.append(take)
            at += len(take)
            i += 1
        return out[0] if len(out) == 1 else np.concatenate(out)

    def _train(self, final: bool) -> None:
        have = sum(len(x) for x in self._waiting)
        if have == 0 or (have < TRAIN_POINTS and not final):
            return
        trained = self.codec.train(np.concatenate(self._waiting))  # type: ignore[union-attr]
        self.env.write(lambda txn: C.save_codec_state(txn, self.env.dbs, trained))
        self.codec = trained
        waiting, self._waiting = self._waiting, []
        for x in waiting:
            self.add_stored(trained.encode(x))

    def _flush(self, final: bool) -> None:
        if self._n_codes < self.chunk and not (final and self._n_codes):
            return
        buf = np.concatenate(self._codes) if len(self._codes) > 1 else self._codes[0]
        chunks = []
        while len(buf) >= self.chunk or (final and len(buf)):
            part, buf = buf[:self.chunk], buf[self.chunk:]
            chunks.append((self._chunk_no, np.ascontiguousarray(part)))
            self._chunk_no += 1
        self._codes, self._n_codes = ([buf] if len(buf) else []), len(buf)
        if chunks:
            dbs = self.env.dbs
            self.env.write(lambda txn: [txn.put(F.vec_key(self.gen, self.seg, c),
                                                F.pack_array(v), db=dbs["vectors"])
                                        for c, v in chunks])

    # -- output ---------------------------------------------------------------------------

    def columns(self) -> dict[str, np.ndarray]:
        """The new segment's token columns, concatenated."""
        c = self._cols
        return {"tokens": _cat(c["tokens"], np.int32, (0,)),
                "flags": _cat(c["flags"], np.uint8, (0,)),
                "offsets": _cat(c["offsets"], np.int32, (0, 2)),
                "block_ptr": np.concatenate(c["block_ptr"]),
                "block_doc": _cat(c["block_doc"], np.int32, (0,))}

    def finish(self) -> F.SegmentRecord | None:
        """Write everything left and move the index files into place; returns the new
        segment's record (None when re-embedding an existing segment)."""
        if isinstance(self.codec, C.PQSpec):
            self._train(final=True)
        self._flush(final=True)
        if self.n != self.n_tokens:
            raise OperationalError(f"segment {self.seg}: {self.n} vectors for "
                                   f"{self.n_tokens} tokens")
        new = self.existing is None
        tmp = self.root / "segments" / (f"tmp-s{self.seg:06d}" if new else
                                        f"tmp-g{self.gen}-s{self.seg:06d}")
        remove_dir(tmp)
        tmp.mkdir(parents=True)
        try:
            cols = self.columns() if new else None
            if new:
                self.store_documents(cols)
                build_bm25(tmp / "bm25", self.block_docs(cols))
            self._build_dense(tmp)
            final = segment_dir(self.root, self.seg)
            if new:
                S.fsync_dir(tmp)
                remove_dir(final)
                os.replace(tmp, final)
                fsync_path(final.parent)
            else:
                for f in tmp.iterdir():
                    os.replace(f, final / f.name)
                S.fsync_dir(final)
        finally:
            remove_dir(tmp)
        if not new:
            return None
        return F.SegmentRecord(
            self.seg, len(self.docs), len(cols["block_doc"]), self.n_tokens, self.dim,
            self.codec.name, self.dense, self.chunk, (self.gen,), time.time(),
            round(time.time() - self.t0, 3), self.engine, self.merged_from)

    def store_documents(self, cols: dict[str, np.ndarray]) -> None:
        """Token columns, documents and the id index of a new segment (one LMDB
        transaction)."""
        dbs = self.env.dbs

        def write(txn):
            for name in S.COLUMNS:
                txn.put(F.col_key(self.seg, name), F.pack_array(cols[name]), db=dbs["segcols"])
            for local, d in enumerate(self.docs):
                txn.put(F.doc_key(self.seg, local), F.pack({"id": d.id, "title": d.title,
                                                            "text": d.text, "meta": d.meta}),
                        db=dbs["docs"])
                txn.put(F.docid_key(d.id, self.seg), F.pack(local), db=dbs["docids"])
        self.env.write(write)

    def block_docs(self, cols: dict[str, np.ndarray]) -> Iterator[BlockDoc]:
        """One BM25 document per block: its text, its document's title."""
        ptr, bdoc, offs = cols["block_ptr"], cols["block_doc"], cols["offsets"]
        for b in range(len(bdoc)):
            d = self.docs[int(bdoc[b])]
            lo, hi = int(ptr[b]), int(ptr[b + 1])
            text = d.text[offs[lo, 0]:offs[hi - 1, 1]] if hi > lo else ""
            yield BlockDoc(b, int(bdoc[b]), d.title, text)

    def index_vectors(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """``{"start": (positions, float16 vectors), "end": ...}``: the valid starts' and
        ends' vectors as stored, for the dense indexes."""
        return {side: (np.concatenate(pos).astype(np.int64) if pos else np.zeros(0, np.int64),
                       np.concatenate(vecs) if vecs else np.zeros((0, self.dim), np.float16))
                for side, (pos, vecs) in self._sides.items()}

    def kind(self) -> str:
        """The index kind this segment gets: the database's, or for ``auto`` the one its
        corpus size asks for (with the tokens known so far)."""
        if self.dense != AUTO:
            return self.dense
        return IVF if self.corpus_tokens + self.n_tokens >= AUTO_IVF_TOKENS else "hnsw"

    def ensure_template(self, vecs: np.ndarray | None = None) -> bytes | None:
        """The generation's IVF template, trained on this segment's vectors so far (or
        ``vecs``, those the caller has already gathered) and saved when there is none yet
        and they are enough; None while there is none (:attr:`template` where set)."""
        template = self.template or ivf.read_template(self.env, self.gen)
        if template is not None:
            return template
        if vecs is None:
            _, vecs = self._ivf_vectors()
        if len(vecs) < ivf.MIN_TRAIN:
            return None
        template = ivf.train_template(vecs, self.params.ivf)
        value = F.pack(ivf.template_value(template))
        self.env.write(lambda txn: txn.put(ivf.template_key(self.gen), value,
                                           db=self.env.dbs["meta"]))
        return template

    def _ivf_vectors(self) -> tuple[np.ndarray, np.ndarray]:
        """The valid starts and ends (each token once, by position) as stored: positions
        and float32 vectors, what the IVF file indexes."""
        sides = self.index_vectors()
        pos = np.concatenate([sides["start"][0], sides["end"][0]])
        pos, first = np.unique(pos, return_index=True)
        vecs = np.concatenate([sides["start"][1], sides["end"][1]])[first]
        return pos, C.cast(vecs, np.float32)  # torch's conversion: ~10x numpy's

    def _build_dense(self, target: Path) -> None:
        self.dense = self.kind()  # auto resolved by corpus size, recorded per segment
        if self.dense == IVF:
            self._build_ivf(target)
            return
        sides = self.index_vectors()
        bar = self.progress(sum(len(p) for p, _ in sides.values()), f"index ({self.dense})",
                            "vec")
        for side, (pos, vecs) in sides.items():
            build_dense(self.dense, C.cast(vecs, np.float32), pos, self.params,
                        target / f"g{self.gen}.{side}.{self.dense}")
            bar.update(len(pos))
        bar.close()

    def _build_ivf(self, target: Path) -> None:
        """One IVF file over the valid starts and ends (each token once), filled from the
        generation's template; the first segment big enough trains and saves it."""
        pos, vecs = self._ivf_vectors()  # none left when they were coded ahead
        parts = (self._ahead.parts() if self._ahead is not None else []) + self._entries
        self._entries = []
        n = len(pos) + sum(len(p.labels) for p in parts)
        bar = self.progress(n, "index (ivf)", "vec")
        template = self.ensure_template(vecs)
        ivf.build_ivf(template, vecs, pos, target / f"g{self.gen}.{ivf.IVF_FILE}", parts)
        bar.update(n)
        bar.close()


def _cat(parts: list[np.ndarray], dtype, empty: tuple) -> np.ndarray:
    return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(empty, dtype)
