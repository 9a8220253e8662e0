"""Writing one segment: tokenize → flag boundaries → cut blocks → encode → store → index.

Each stage is a function that can run and be tested alone. Nothing here is visible to
readers until :meth:`Database._commit` writes the manifest that names the segment.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, Sequence

import numpy as np

from .blocks import cut_blocks
from .boundaries import VALID_END, VALID_START, token_flags
from .corpus import Document
from npmdb.storage import codec as C
from npmdb.storage import format as F
from npmdb.storage.bm25 import BlockDoc, build_bm25
from npmdb.storage.dense import build_dense
from npmdb.storage import segments as _segments
from npmdb.storage.segments import (
    dense_path, fsync_dir, remove_dir, segment_dir, write_columns, write_vector_chunk,
)

if TYPE_CHECKING:  # pragma: no cover
    from .database import Database
    from .encoder import Encoder

__all__ = ["PreparedSegment", "prepare", "encode_and_store", "build_indexes", "ingest_segment",
           "progress_bar", "segment_codec"]


def progress_bar(total: int, desc: str, enabled: bool | None, unit: str = "it"):
    from tqdm.auto import tqdm

    disable = (not sys.stderr.isatty()) if enabled is None else (not enabled)
    return tqdm(total=total, desc=desc, unit=unit, disable=disable, leave=False,
                dynamic_ncols=True, mininterval=0.5)


@dataclass
class PreparedSegment:
    """Token columns of a segment, before encoding."""

    docs: list[Document]
    tokens: np.ndarray
    flags: np.ndarray
    offsets: np.ndarray
    block_ptr: np.ndarray
    block_doc: np.ndarray

    @property
    def n_blocks(self) -> int:
        return len(self.block_doc)

    def block(self, b: int) -> np.ndarray:
        return self.tokens[self.block_ptr[b]:self.block_ptr[b + 1]]

    def columns(self) -> dict[str, np.ndarray]:
        return {"tokens": self.tokens, "flags": self.flags, "offsets": self.offsets,
                "block_ptr": self.block_ptr, "block_doc": self.block_doc}


def prepare(encoder: "Encoder", docs: Sequence[Document], block_len: int,
            progress: bool | None = None) -> PreparedSegment:
    """Tokenize every document with offsets, flag word boundaries, cut blocks."""
    toks, flags, offs, ptr, bdoc = [], [], [], [0], []
    bar = progress_bar(len(docs), "tokenize", progress, "doc")
    step = 512
    for i in range(0, len(docs), step):
        chunk = docs[i:i + step]
        for j, (d, tt) in enumerate(zip(chunk, encoder.tokenize_batch([d.text for d in chunk]))):
            f = token_flags(d.text, tt.offsets)
            for a, b in cut_blocks(f, block_len):
                toks.append(tt.ids[a:b])
                flags.append(f[a:b])
                offs.append(tt.offsets[a:b])
                ptr.append(ptr[-1] + (b - a))
                bdoc.append(i + j)
        bar.update(len(chunk))
    bar.close()
    cat = lambda xs, dt, shape: np.concatenate(xs).astype(dt) if xs else np.zeros(shape, dt)  # noqa: E731
    return PreparedSegment(list(docs), cat(toks, np.int32, (0,)), cat(flags, np.uint8, (0,)),
                           cat(offs, np.int32, (0, 2)).reshape(-1, 2),
                           np.asarray(ptr, dtype=np.int64), np.asarray(bdoc, dtype=np.int32))


TRAIN_POINTS = 16384  # vectors a stateful codec (PQ) is trained on, from the first ones stored


def segment_codec(db: "Database"):
    """The database's vector codec: stateless, trained (PQ), or untrained (``PQSpec``)."""
    return C.load_codec(db.env, db.config.get("codec", "float16"))


def encode_and_store(db: "Database", encoder: "Encoder", prep: PreparedSegment, seg: int,
                     gen: int, progress: bool | None = None, window: int = 256,
                     chunk: int | None = None
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Encode every block, write float16 (or codec) vector chunks of ``chunk`` tokens (the
    segment's chunk size; default: ``npmdb.storage.segments.CHUNK``, for a new segment) to
    LMDB as they fill.

    Each window of blocks is encoded by the codec once: its codes are what is stored, and
    the decoded valid starts and ends (exactly as stored) are kept for the dense indexes.
    A stateful codec not trained yet (PQ, on a new database) is trained on the first
    ``TRAIN_POINTS`` vectors, and its state committed, before anything is stored with it.

    Returns the positions and float32 vectors of valid starts and of valid ends, for the
    dense indexes.
    """
    codec = segment_codec(db)
    chunk = chunk or _segments.CHUNK
    n = len(prep.tokens)
    dim = encoder.hidden_size
    start_pos = np.flatnonzero(prep.flags & VALID_START)
    end_pos = np.flatnonzero(prep.flags & VALID_END)
    start_vecs = np.empty((len(start_pos), dim), dtype=np.float16)
    end_vecs = np.empty((len(end_pos), dim), dtype=np.float16)
    index_rows = np.zeros(n, dtype=bool)
    index_rows[start_pos] = True
    index_rows[end_pos] = True
    bar = progress_bar(n, "encode", progress, "tok")
    codes: list[np.ndarray] = []  # encoded rows not yet written (less than a chunk)
    n_codes = 0
    written = 0  # tokens flushed
    waiting: list[tuple[int, np.ndarray]] = []  # (lo, float32 vectors) before codec training

    def flush(final: bool) -> None:
        nonlocal codes, n_codes, written
        if n_codes < chunk and not (final and n_codes):
            return
        buf = np.concatenate(codes) if len(codes) > 1 else codes[0]
        chunks = []
        while len(buf) >= chunk or (final and len(buf)):
            part, buf = buf[:chunk], buf[chunk:]
            chunks.append((written // chunk, np.ascontiguousarray(part)))
            written += len(part)
        codes, n_codes = ([buf] if len(buf) else []), len(buf)
        if chunks:
            db.env.write(lambda txn: [write_vector_chunk(txn, db.env.dbs, gen, seg, c, v)
                                      for c, v in chunks])

    def store(lo: int, h: np.ndarray) -> None:
        nonlocal n_codes
        hi = lo + len(h)
        stored = codec.encode(h)
        codes.append(stored)
        n_codes += len(stored)
        # the dense indexes get the vectors exactly as stored (codec round trip)
        need = np.flatnonzero(index_rows[lo:hi])
        dec = codec.decode(stored[need]) if len(need) else np.zeros((0, dim), np.float32)
        row_of = np.full(hi - lo, -1, dtype=np.int64)
        row_of[need] = np.arange(len(need))
        for pos, vecs in ((start_pos, start_vecs), (end_pos, end_vecs)):
            a, z = np.searchsorted(pos, lo), np.searchsorted(pos, hi)
            vecs[a:z] = dec[row_of[pos[a:z] - lo]]
        flush(False)

    def train(final: bool) -> None:
        nonlocal codec, waiting
        have = sum(len(h) for _, h in waiting)
        if have == 0 or (have < TRAIN_POINTS and not final):
            return
        codec = codec.train(np.concatenate([h for _, h in waiting]))
        db.env.write(lambda txn: C.save_codec_state(txn, db.env.dbs, codec))
        for lo, h in waiting:
            store(lo, h)
        waiting = []

    for b0 in range(0, prep.n_blocks, window):
        b1 = min(b0 + window, prep.n_blocks)
        hidden = encoder.encode_blocks([prep.block(b) for b in range(b0, b1)])
        lo, hi = int(prep.block_ptr[b0]), int(prep.block_ptr[b1])
        h = np.concatenate(hidden) if hidden else np.zeros((0, dim), np.float32)
        if len(h):
            if isinstance(codec, C.PQSpec):
                waiting.append((lo, h))
                train(False)
            else:
                store(lo, h)
        bar.update(hi - lo)
    if isinstance(codec, C.PQSpec):
        train(True)
    flush(True)
    bar.close()
    return start_pos, start_vecs, end_pos, end_vecs


def _block_docs(prep: PreparedSegment) -> Iterator[BlockDoc]:
    for b in range(prep.n_blocks):
        d = prep.docs[int(prep.block_doc[b])]
        lo, hi = int(prep.block_ptr[b]), int(prep.block_ptr[b + 1])
        text = d.text[prep.offsets[lo, 0]:prep.offsets[hi - 1, 1]] if hi > lo else ""
        yield BlockDoc(b, int(prep.block_doc[b]), d.title, text)


def build_indexes(db: "Database", prep: PreparedSegment, target, gen: int,
                  starts: tuple[np.ndarray, np.ndarray], ends: tuple[np.ndarray, np.ndarray],
                  progress: bool | None = None, bm25: bool = True) -> None:
    """BM25 (tantivy) and dense start/end indexes into directory ``target``."""
    kind = db.config.get("dense", "hnsw")
    if bm25:
        build_bm25(target / "bm25", _block_docs(prep))
    bar = progress_bar(len(starts[0]) + len(ends[0]), f"index ({kind})", progress, "vec")
    for side, (pos, vecs) in (("start", starts), ("end", ends)):
        path = target / f"g{gen}.{side}.{kind}"
        build_dense(kind, vecs.astype(np.float32), pos.astype(np.int64), db.dense_params, path)
        bar.update(len(pos))
    bar.close()


def store_documents(db: "Database", seg: int, prep: PreparedSegment) -> None:
    """Token columns, documents and the id index of segment ``seg`` (one transaction)."""
    cols = prep.columns()

    def write(txn):
        write_columns(txn, db.env.dbs, seg, cols)
        for local, d in enumerate(prep.docs):
            txn.put(F.doc_key(seg, local), F.pack({"id": d.id, "title": d.title,
                                                   "text": d.text, "meta": d.meta}),
                    db=db.env.dbs["docs"])
            txn.put(F.docid_key(d.id, seg), F.pack(local), db=db.env.dbs["docids"])
    db.env.write(write)


def install_segment_dir(db: "Database", tmp, seg: int) -> None:
    """Fsync the finished index directory and rename it into place (atomic)."""
    fsync_dir(tmp)
    final = segment_dir(db.path, seg)
    remove_dir(final)
    os.replace(tmp, final)
    fsync_dir(final.parent)


def ingest_segment(db: "Database", seg: int, gen: int, docs: list[Document]) -> dict:
    """Write segment ``seg`` (data in LMDB, index files in place); returns its record."""
    t0 = time.time()
    encoder = db.encoder_for(gen)
    prep = prepare(encoder, docs, int(db.config["block_len"]), db.progress)
    tmp = db.path / "segments" / f"tmp-s{seg:06d}"
    remove_dir(tmp)
    tmp.mkdir(parents=True)
    try:
        rows = _segments.CHUNK  # recorded: readers and later generations use the same
        starts_ends = encode_and_store(db, encoder, prep, seg, gen, db.progress, chunk=rows)

        store_documents(db, seg, prep)
        build_indexes(db, prep, tmp, gen, starts_ends[:2], starts_ends[2:], db.progress)
        install_segment_dir(db, tmp, seg)
    except BaseException:
        remove_dir(tmp)
        raise
    return {"id": seg, "docs": len(prep.docs), "blocks": prep.n_blocks,
            "tokens": int(len(prep.tokens)), "dim": encoder.hidden_size,
            "codec": segment_codec(db).name, "dense": db.config.get("dense", "hnsw"),
            "chunk": rows,
            "gens": [gen], "created": time.time(), "seconds": round(time.time() - t0, 3)}
