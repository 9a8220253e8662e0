"""The first operators of a span-query plan: query encoding and candidate retrieval (dense
ANN, exact scan, BM25 blocks).

The operator protocol, the execution state and the typed outputs are in
:mod:`npmdb.query.physical`; span assembly, scoring and answers in
:mod:`npmdb.query.answers`, the answer-level tail in :mod:`npmdb.query.tail`; row-level
operators (EVIDENCE, SEARCH, DOCUMENTS, projection) in :mod:`npmdb.query.rows`.
"""

from __future__ import annotations

import os
import sys
import threading
from concurrent.futures import wait
from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np

from npmdb.storage.bm25 import analyze, field_stats, search_segments
from npmdb.storage.dense import IVF
from npmdb.storage.format import VALID_END, VALID_START, WORD_END, WORD_START

from .physical import (
    BlockHits, Candidates, ExecState, Operator, Output, QueryVectors, _fmt,
)
from .scoring import sorted_unique
from .text import bm25_text

__all__ = ["EncodeQuery", "DenseTopK", "ExactTopK", "BM25Blocks", "BlockTokens", "per_segment"]

SIDE_FLAGS = {"start": VALID_START, "end": VALID_END, "token": VALID_START | VALID_END}
# Any word's edges: closed-set classification scores label words even when they are
# stopwords ("yes" / "no"), which clean candidates (and the ANN indexes) leave out.
WORD_SIDE_FLAGS = {"start": WORD_START, "end": WORD_END, "token": WORD_START | WORD_END}


def side_flags(side: str, any_word: bool) -> int:
    return (WORD_SIDE_FLAGS if any_word else SIDE_FLAGS)[side]


_POOL = None
_POOL_LOCK = threading.Lock()


def _reset_after_fork() -> None:
    """A forked child has none of the parent's threads: its pool would take tasks that no
    thread runs (a query hung for ever). The child starts a pool of its own."""
    global _POOL, _POOL_LOCK
    _POOL, _POOL_LOCK = None, threading.Lock()
    torch = sys.modules.get("torch")
    if torch is not None:  # its OpenMP threads are not the child's either: one thread
        torch.set_num_threads(1)


os.register_at_fork(after_in_child=_reset_after_fork)


def per_segment(fn: Callable[[int], Any], n: int) -> list:
    """``[fn(si) for si in range(n)]``, in a thread pool when there are several segments
    (hnswlib and tantivy release the GIL); results stay in segment order. When a task
    raises, the others are waited for before the first error is raised."""
    global _POOL
    if n <= 1:
        return [fn(si) for si in range(n)]
    with _POOL_LOCK:  # concurrent operators (and user threads) may get here at once
        if _POOL is None:
            import os
            from concurrent.futures import ThreadPoolExecutor

            size = int(os.environ.get("NPMDB_SEGMENT_THREADS", "0")) or min(8, os.cpu_count() or 1)
            _POOL = ThreadPoolExecutor(size, thread_name_prefix="npmdb-seg")
    futures = [_POOL.submit(fn, si) for si in range(n)]
    # every task ends before this returns or raises: a task still running after its query
    # failed would read the snapshot's pages (zero-copy columns, vectors) after the
    # snapshot, or the database, was closed
    wait(futures)
    return [f.result() for f in futures]


# -- query encoding -----------------------------------------------------------------------


@dataclass(frozen=True)
class EncodeQuery(Operator):
    mode: str
    children: tuple = ()
    any_word: bool = False  # every word's edges, stopwords included (classify)

    def detail(self) -> str:
        return _fmt(mode=self.mode) + (", words: any" if self.any_word else "")

    def run(self, st: ExecState) -> QueryVectors:
        if st.encode is not None:
            qv = st.encode(st.text, self.mode)
        else:
            qv = st.snapshot.encoder().encode_query(st.text, self.mode)
        return QueryVectors(qv, 2 if self.mode == "phrase" else 1)


# -- candidate retrieval ------------------------------------------------------------------


def _merge_topk(side: str, found: list[tuple[int, np.ndarray, np.ndarray]],
                k: int, qv: QueryVectors) -> Candidates:
    """Keep the global top ``k`` over all segments, per segment: a token found twice (in
    the start and the end index) once, with its best score; ties by (segment, position);
    positions ascending. The result does not depend on the order of ``found`` (a shard's
    part of it gives the same positions as one process)."""
    if not found:
        return Candidates({side: {}}, 0, qv.vectors)
    segs = np.concatenate([np.full(len(p), si, np.int64) for si, p, _ in found])
    key = segs * (1 << 40) + np.concatenate([p for _, p, _ in found])
    sc = np.concatenate([s for _, _, s in found])
    order = np.lexsort((-sc, key))  # by key, best score first
    key, sc = key[order], sc[order]
    _, first = np.unique(key, return_index=True)
    key, sc = key[first], sc[first]
    if len(sc) > k:
        key = key[np.sort(np.lexsort((key, -sc))[:k])]
    segs, pos = key >> 40, key & ((1 << 40) - 1)
    return Candidates({side: {int(si): pos[segs == si] for si in sorted_unique(segs)}},
                      int(len(pos)), qv.vectors)


def _top_candidates(found: list[tuple[int, np.ndarray, np.ndarray]], n: int
                    ) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """The best ``n`` distinct (segment, position) pairs of ``found`` by score, as
    ``(segment, positions, scores)`` per segment, segments in order and positions best
    first. Approximate scores of different segments are comparable: every segment of an
    embedding generation is coded with the same trained template. The best ``n`` of a
    subset of the segments (a shard's) hold every pair of the best ``n`` of all of them
    that lies in the subset."""
    if not found:
        return []
    segs = np.concatenate([np.full(len(p), si, np.int64) for si, p, _ in found])
    key = segs * (1 << 40) + np.concatenate([p for _, p, _ in found])
    sc = np.concatenate([s for _, _, s in found])
    if len(sc) > 2 * n > 0:
        # a pair is found at most twice (once a side), so the best n distinct pairs are
        # among the best 2n entries: keep every entry scoring at least the 2n-th best
        # (ties included, so the order below is the same) and sort only those
        cut = np.partition(sc, len(sc) - 2 * n)[len(sc) - 2 * n]
        near = sc >= cut
        key, sc = key[near], sc[near]
    order = np.lexsort((key, -sc))  # best first, ties by (segment, position)
    key, sc = key[order], sc[order]
    _, first = np.unique(key, return_index=True)  # a token found from both sides once
    kept = np.sort(first)[:n]
    key, sc = key[kept], sc[kept]
    segs, pos = key >> 40, key & ((1 << 40) - 1)
    return [(int(si), pos[segs == si], sc[segs == si]) for si in sorted_unique(segs)]


def _split_found(found: list[tuple[int, np.ndarray, np.ndarray, int]]
                 ) -> tuple[list, list, int]:
    """A dense search's per-segment results split into those with exact scores and those
    with approximate ones (compressed codes), and the approximate ones' re-rank factor."""
    exact = [(si, p, s) for si, p, s, refine in found if not refine]
    approx = [(si, p, s) for si, p, s, refine in found if refine]
    return exact, approx, max((r for *_, r in found), default=0)


@dataclass(frozen=True)
class DenseTopK(Operator):
    """Top ``k`` valid starts (or ends, or tokens) from the ANN index of every segment."""

    side: str
    k: int
    children: tuple = ()
    docs: str = ""  # the document filter, for EXPLAIN (the snapshot applies it)

    def detail(self) -> str:
        return _fmt(side=self.side, k=self.k, index="ann") + (
            f", docs: {self.docs} (oversampled)" if self.docs else "")

    def analyzed(self, out: "Output") -> str:
        kinds = getattr(out, "index", "")
        return self.detail().replace("index=ann", f"index=ann ({kinds})" if kinds else
                                     "index=ann", 1)

    concurrent = True  # the start and end searches run side by side (hnswlib drops the GIL)

    def prepare(self, st: ExecState) -> None:
        # document filters may read documents through the snapshot's transaction
        # (and every segment's columns: an IVF index selects its side from the flags)
        snap = st.snapshot
        allowed = [snap.allowed_docs(si) for si in range(len(snap.segments))]
        for si in range(len(snap.segments)):
            snap.columns(si)
        st.prepared[id(self)] = allowed

    def run(self, st: ExecState) -> Candidates:
        qv = st.input(self, QueryVectors)
        q = qv.side(self.side)
        exact, approx, refine = _split_found(self.search(st, q))
        if approx:  # re-score the global best refine * k, not refine * k per segment
            exact += self._rescore(st, q, _top_candidates(approx, self.k * refine))
        return replace(_merge_topk(self.side, exact, self.k, qv),
                       index=", ".join(self.kinds(st)))

    @staticmethod
    def kinds(st: ExecState) -> list[str]:
        """The dense index kinds of the snapshot's segments (EXPLAIN ANALYZE)."""
        return sorted({seg.record.dense for seg in st.snapshot.segments})

    def search(self, st: ExecState, q: np.ndarray) -> list[tuple[int, np.ndarray, np.ndarray, int]]:
        """Every segment's ANN search: ``(segment, positions, scores, refine)``, in segment
        order and, within a segment, side order; ``refine`` is 0 where the scores are exact
        and the index's re-rank factor where they are approximate."""
        snap = st.snapshot
        sides = ("start", "end") if self.side == "token" else (self.side,)
        if id(self) not in st.prepared:
            self.prepare(st)
        allowed = st.prepared.pop(id(self))
        entries = snap.ivf_entries()  # IVF lists probed by what all segments hold

        def one(si: int) -> list:
            out = []
            for side in sides:
                idx = snap.dense(si, side)
                refine = getattr(idx, "refine", 1)  # compressed codes: re-rank refine * k
                want = self.k * refine
                more = {"entries": entries} if idx.kind == IVF else {}
                while True:
                    labels, scores = idx.search(q, want, **more)
                    if allowed[si] is not None and len(labels):
                        keep = allowed[si][snap.columns(si).doc_of(labels)]
                        labels, scores = labels[keep], scores[keep]
                    # oversample until k live candidates are found or the index is exhausted
                    if len(labels) >= self.k * refine or want >= len(idx):
                        break
                    want = min(len(idx), want * 4)
                approximate = bool(getattr(idx, "approximate", False))
                out.append((si, labels, scores, refine if approximate else 0))
            return out

        return [f for part in per_segment(one, len(snap.segments)) for f in part]

    @staticmethod
    def _rescore(st: ExecState, q: np.ndarray, cands: list[tuple[int, np.ndarray, Any]]
                 ) -> list:
        """Exact scores of approximate candidates (``(segment, positions, _)``), from the
        stored vectors; segments side by side."""
        snap = st.snapshot
        q32 = np.asarray(q, np.float32)

        def one(i: int) -> tuple:
            si, pos, _ = cands[i]
            with st.txn_lock:  # the snapshot's transaction: one thread at a time
                vecs = snap.segments[si].vectors(snap.txn, snap.generation, pos)
            # einsum, not ``@``: a multi-threaded BLAS mat-vec leaves its threads spinning
            # and slows the next query's encoder forward (2x on 2 cores; see _exact_sims)
            return si, pos, np.einsum("ij,j->i", vecs, q32).astype(np.float32)
        return per_segment(one, len(cands))


@dataclass(frozen=True)
class ExactTopK(Operator):
    """Top ``k`` by an exact scan over every stored vector (the test oracle's twin)."""

    side: str
    k: int
    children: tuple = ()
    docs: str = ""  # the document filter, for EXPLAIN (the snapshot applies it)
    any_word: bool = False  # every word's edges, stopwords included (classify)

    def detail(self) -> str:
        return _fmt(side=self.side, k=self.k, index="exact scan") + (
            ", words: any" if self.any_word else "") + (
            f", docs: {self.docs} (masked)" if self.docs else "")

    def run(self, st: ExecState) -> Candidates:
        qv = st.input(self, QueryVectors)
        return _merge_topk(self.side, self.search(st, qv.side(self.side)), self.k, qv)

    def search(self, st: ExecState, q: np.ndarray) -> list[tuple[int, np.ndarray, np.ndarray]]:
        """Each segment's top ``k``: ``(segment, positions, scores)``, in segment order."""
        snap = st.snapshot
        found = []
        for si, seg in enumerate(snap.segments):
            cols = snap.columns(si)
            mask = (cols.flags & side_flags(self.side, self.any_word)) != 0
            allowed = snap.allowed_docs(si)
            if allowed is not None:
                mask &= allowed[cols.doc_of(np.arange(cols.n_tokens))]
            pos, sc = seg.scan(snap.txn, snap.generation, q, mask, self.k)
            found.append((si, pos, sc))
        return found


@dataclass(frozen=True)
class BM25Blocks(Operator):
    """Top ``n`` blocks by BM25 for the query with the mask blanked (NPM's restricted mode)."""

    n: int
    children: tuple = ()
    docs: str = ""  # the document filter, for EXPLAIN (the snapshot applies it)
    title: bool = False     # match the document title too (NPM's blocks carried it)
    question: bool = False  # search only the question before the mask (up to its "?")
    text_scores: bool = False  # each hit also carries its BM25 score on the text alone

    def detail(self) -> str:
        return (_fmt(blocks=self.n) + (", fields: text+title" if self.title else "")
                + (", question only" if self.question else "")
                + (", text scores" if self.text_scores else "")
                + (f", docs: {self.docs}" if self.docs else ""))

    @property
    def fields(self) -> tuple[str, ...]:
        return ("text", "title") if self.title else ("text",)

    def terms(self, text: str) -> list[str]:
        return list(dict.fromkeys(analyze(bm25_text(text, question=self.question))))

    def run(self, st: ExecState) -> BlockHits:
        snap = st.snapshot
        terms = self.terms(st.text)
        # one segment: tantivy's own statistics; several: the version's, as one index
        stats = {f: field_stats([s.bm25() for s in snap.segments], terms, f)
                 for f in self.fields} if len(snap.segments) > 1 else None
        return self.best(self.search(st, terms, stats))

    def best(self, hits: list[tuple[int, int, float]]) -> BlockHits:
        """The top ``n`` of every segment's hits: by score, then segment and block."""
        hits = sorted(hits, key=lambda h: (-h[2], h[0], h[1]))
        return BlockHits(tuple(hits[: self.n]))

    def search(self, st: ExecState, terms: list[str], stats: dict | None
               ) -> list[tuple[int, int, float]]:
        """The top ``n`` blocks of the snapshot's segments (at least: :meth:`best` merges
        a sharded query's), ``(segment, block, score)``, and the score on the text alone
        with ``text_scores`` (the block prior's); ``stats``: each field's
        :class:`~npmdb.storage.bm25.FieldStats` over every segment of the version (None:
        one segment, scored with its own)."""
        snap = st.snapshot
        docs = [None if a is None else np.flatnonzero(a)
                for a in (snap.allowed_docs(si) for si in range(len(snap.segments)))]
        if stats is not None:  # several segments: one search over them all
            hits = search_segments([s.bm25() for s in snap.segments], terms, self.n,
                                   docs=docs, stats=stats, fields=self.fields)
            return [(si, block, *scores[: 2 if self.text_scores else 1])
                    for si, block, _doc, *scores in hits]
        return [(si, block, *scores) for si, seg in enumerate(snap.segments)
                if docs[si] is None or len(docs[si])
                for block, _doc, *scores in seg.bm25().search(
                    terms, self.n, docs=docs[si], fields=self.fields,
                    text_scores=self.text_scores)]


@dataclass(frozen=True)
class BlockTokens(Operator):
    """Every token of the retrieved blocks becomes a candidate (scored exactly later)."""

    mode: str
    children: tuple = ()
    any_word: bool = False  # every word's edges, stopwords included (classify)

    def detail(self) -> str:
        return _fmt(mode=self.mode) + (", words: any" if self.any_word else "")

    def run(self, st: ExecState) -> Candidates:
        n = 0
        sides = ("token",) if self.mode == "token" else ("start", "end")
        found: dict[str, dict[int, np.ndarray]] = {side: {} for side in sides}
        for hits in st.inputs(self, BlockHits):
            for si, block, *_ in hits.hits:
                cols = st.snapshot.columns(si)
                pos = np.arange(cols.block_ptr[block], cols.block_ptr[block + 1], dtype=np.int64)
                for side in sides:
                    sel = pos[(cols.flags[pos] & side_flags(side, self.any_word)) != 0]
                    prev = found[side].get(si)
                    found[side][si] = sel if prev is None else np.union1d(prev, sel)
                n += len(pos)
        qv = st.inputs(self, QueryVectors)
        return Candidates(found, n, qv[0].vectors if qv else None)
