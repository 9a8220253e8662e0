"""Physical operators of a span-query plan.

Every operator is a frozen dataclass of its parameters with ``run(state)``; the executor
(:mod:`npmdb.query.plan`) runs a plan's operators bottom-up over one :class:`ExecState`
and records rows and milliseconds per operator. Operators read storage only through the
:class:`~npmdb.snapshot.Snapshot` in the state. Row-level operators (EVIDENCE, SEARCH,
DOCUMENTS, projection) are in :mod:`npmdb.query.rows`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from npmdb.storage.bm25 import analyze
from npmdb.storage.format import VALID_END, VALID_START

from . import scoring as S
from .text import MASK_PATTERN, fold, fold_view

__all__ = [
    "ExecState", "Operator", "EncodeQuery", "DenseTopK", "ExactTopK", "BM25Blocks",
    "BlockTokens", "AssembleSpans", "ScoreSpans", "ScoreTokens", "Aggregate", "ClassifyLabels",
    "FilterAnswers", "OrderBy", "Limit", "AttachEvidence", "Group", "Occurrence", "snippet",
]

SIDE_FLAGS = {"start": VALID_START, "end": VALID_END, "token": VALID_START | VALID_END}


@dataclass
class Occurrence:
    seg: int      # index into the snapshot's segments
    start: int    # first token (position in the segment)
    end: int      # last token (inclusive)
    score: float


@dataclass
class Group:
    """One answer under construction: its key, surface text and occurrences.

    ``idx`` indexes the occurrences in the state's parallel arrays (seg, s, e, score).
    """

    key: Any
    text: str
    score: float = 0.0
    n_tokens: int = 0
    idx: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    weights: np.ndarray | None = None  # per-occurrence scores when not st.score (classify)
    evidence: list = field(default_factory=list)
    extra: dict = field(default_factory=dict)

    @property
    def support(self) -> int:
        return int(len(self.idx))


@dataclass
class ExecState:
    snapshot: Any
    text: str
    qv: Any = None
    # candidates per segment index: positions (int64) and approximate scores
    cands: dict[str, dict[int, np.ndarray]] = field(
        default_factory=lambda: {"start": {}, "end": {}, "token": {}})
    blocks: list[tuple[int, int, float]] = field(default_factory=list)
    # spans (phrase mode) or tokens (token mode): parallel arrays over all segments
    seg: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    s: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    e: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    sim_s: np.ndarray = field(default_factory=lambda: np.zeros(0))
    sim_e: np.ndarray = field(default_factory=lambda: np.zeros(0))
    score: np.ndarray = field(default_factory=lambda: np.zeros(0))
    groups: list[Group] = field(default_factory=list)
    info: dict = field(default_factory=dict)
    # row-level operators (EVIDENCE, SEARCH, DOCUMENTS): one dict per row, keyed by column
    rows: list[dict] = field(default_factory=list)
    # what an operator's serial ``prepare`` computed for its (concurrent) ``run``
    prepared: dict[int, Any] = field(default_factory=dict)


class Operator:
    """Base: ``name``, ``children``, ``detail()`` for EXPLAIN, ``run(state) -> rows``.

    ``concurrent`` operators may run at the same time as concurrent siblings (the executor
    runs their ``prepare`` first, one at a time: everything that reads through the
    snapshot's LMDB transaction, which one thread at a time may use).
    """

    children: tuple["Operator", ...] = ()
    concurrent = False

    def prepare(self, st: "ExecState") -> None:
        return None

    @property
    def name(self) -> str:
        return type(self).__name__

    def detail(self) -> str:
        return ""

    def run(self, st: ExecState) -> int:  # pragma: no cover - abstract
        raise NotImplementedError


_POOL = None
_POOL_LOCK = threading.Lock()


def per_segment(fn: Callable[[int], Any], n: int) -> list:
    """``[fn(si) for si in range(n)]``, in a thread pool when there are several segments
    (hnswlib and tantivy release the GIL); results stay in segment order."""
    global _POOL
    if n <= 1:
        return [fn(si) for si in range(n)]
    with _POOL_LOCK:  # concurrent operators (and user threads) may get here at once
        if _POOL is None:
            import os
            from concurrent.futures import ThreadPoolExecutor

            size = int(os.environ.get("NPMDB_SEGMENT_THREADS", "0")) or min(8, os.cpu_count() or 1)
            _POOL = ThreadPoolExecutor(size, thread_name_prefix="npmdb-seg")
    return list(_POOL.map(fn, range(n)))


def _fmt(**kw) -> str:
    return ", ".join(f"{k}={v}" for k, v in kw.items())


# -- query encoding -----------------------------------------------------------------------


@dataclass(frozen=True)
class EncodeQuery(Operator):
    mode: str
    children: tuple = ()

    def detail(self) -> str:
        return _fmt(mode=self.mode)

    def run(self, st: ExecState) -> int:
        st.qv = st.snapshot.encoder().encode_query(st.text, self.mode)
        return 2 if self.mode == "phrase" else 1


def _query_vector(st: ExecState, side: str) -> np.ndarray:
    qv = st.qv
    return {"start": qv.start, "end": qv.end, "token": qv.token}[side]


# -- candidate retrieval ------------------------------------------------------------------


def _merge_topk(st: ExecState, side: str, found: list[tuple[int, np.ndarray, np.ndarray]],
                k: int) -> int:
    """Keep the global top ``k`` over all segments; store per segment (union with existing)."""
    if not found:
        return 0
    segs = np.concatenate([np.full(len(p), si, np.int64) for si, p, _ in found])
    pos = np.concatenate([p for _, p, _ in found])
    sc = np.concatenate([s for _, _, s in found])
    key = segs * (1 << 40) + pos
    _, first = np.unique(key, return_index=True)  # a token in both start and end indexes
    if len(first) < len(key):
        segs, pos, sc = segs[first], pos[first], sc[first]
    if len(sc) > k:
        keep = np.argpartition(-sc, k - 1)[:k]
        segs, pos = segs[keep], pos[keep]
    for si in np.unique(segs):
        p = pos[segs == si]
        prev = st.cands[side].get(int(si))
        st.cands[side][int(si)] = p if prev is None else np.union1d(prev, p)
    return int(len(pos))


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

    concurrent = True  # the start and end searches run side by side (hnswlib drops the GIL)

    def prepare(self, st: ExecState) -> None:
        # document filters may read documents through the snapshot's transaction
        snap = st.snapshot
        allowed = [snap.allowed_docs(si) for si in range(len(snap.segments))]
        for si, seg in enumerate(snap.segments):
            if allowed[si] is not None:
                seg.columns(snap.txn)
        st.prepared[id(self)] = allowed

    def run(self, st: ExecState) -> int:
        snap = st.snapshot
        q = _query_vector(st, self.side)
        sides = ("start", "end") if self.side == "token" else (self.side,)
        if id(self) not in st.prepared:
            self.prepare(st)
        allowed = st.prepared.pop(id(self))

        def one(si: int) -> list:
            seg, out = snap.segments[si], []
            for side in sides:
                idx = seg.dense(snap.generation, side)
                want = self.k
                while True:
                    labels, scores = idx.search(q, want)
                    if allowed[si] is not None and len(labels):
                        keep = allowed[si][seg.columns().doc_of(labels)]
                        labels, scores = labels[keep], scores[keep]
                    # oversample until k live candidates are found or the index is exhausted
                    if len(labels) >= self.k or want >= len(idx):
                        break
                    want = min(len(idx), want * 4)
                out.append((si, labels[: self.k], scores[: self.k]))
            return out

        found = [f for part in per_segment(one, len(snap.segments)) for f in part]
        return _merge_topk(st, self.side, found, self.k)


@dataclass(frozen=True)
class ExactTopK(Operator):
    """Top ``k`` by an exact scan over every stored vector (the test oracle's twin)."""

    side: str
    k: int
    children: tuple = ()
    docs: str = ""  # the document filter, for EXPLAIN (the snapshot applies it)

    def detail(self) -> str:
        return _fmt(side=self.side, k=self.k, index="exact scan") + (
            f", docs: {self.docs} (masked)" if self.docs else "")

    def run(self, st: ExecState) -> int:
        snap = st.snapshot
        q = _query_vector(st, self.side)
        found = []
        for si, seg in enumerate(snap.segments):
            cols = seg.columns(snap.txn)
            mask = (cols.flags & SIDE_FLAGS[self.side]) != 0
            allowed = snap.allowed_docs(si)
            if allowed is not None:
                mask &= allowed[cols.doc_of(np.arange(cols.n_tokens))]
            pos, sc = seg.scan(snap.txn, snap.generation, q, mask, self.k)
            found.append((si, pos, sc))
        return _merge_topk(st, self.side, found, self.k)


@dataclass(frozen=True)
class BM25Blocks(Operator):
    """Top ``n`` blocks by BM25 for the query with the mask blanked (NPM's restricted mode)."""

    n: int
    children: tuple = ()
    docs: str = ""  # the document filter, for EXPLAIN (the snapshot applies it)

    def detail(self) -> str:
        return _fmt(blocks=self.n) + (f", docs: {self.docs}" if self.docs else "")

    def run(self, st: ExecState) -> int:
        from npmdb.storage.bm25 import global_idf

        snap = st.snapshot
        terms = list(dict.fromkeys(analyze(MASK_PATTERN.sub(" ", st.text))))
        # one segment: tantivy's own statistics; several: global IDFs, as one big index
        idf = global_idf([s.bm25() for s in snap.segments], terms) \
            if len(snap.segments) > 1 else None
        allowed = [snap.allowed_docs(si) for si in range(len(snap.segments))]
        limits = [min(self.n, len(seg.columns(snap.txn).block_ptr) - 1)  # tantivy panics on
                  for seg in snap.segments]                            # huge limits

        def one(si: int) -> list:
            docs = None if allowed[si] is None else np.flatnonzero(allowed[si])
            if docs is not None and len(docs) == 0:
                return []
            return [(si, block, score) for block, _doc, score in
                    snap.segments[si].bm25().search(terms, limits[si], docs=docs, idf=idf)]

        hits = [h for part in per_segment(one, len(snap.segments)) for h in part]
        hits.sort(key=lambda h: (-h[2], h[0], h[1]))
        st.blocks = hits[: self.n]
        return len(st.blocks)


@dataclass(frozen=True)
class BlockTokens(Operator):
    """Every token of the retrieved blocks becomes a candidate (scored exactly later)."""

    mode: str
    children: tuple = ()

    def detail(self) -> str:
        return _fmt(mode=self.mode)

    def run(self, st: ExecState) -> int:
        n = 0
        for si, block, _ in st.blocks:
            cols = st.snapshot.segments[si].columns()
            pos = np.arange(cols.block_ptr[block], cols.block_ptr[block + 1], dtype=np.int64)
            sides = ("token",) if self.mode == "token" else ("start", "end")
            for side in sides:
                sel = pos[(cols.flags[pos] & SIDE_FLAGS[side]) != 0]
                prev = st.cands[side].get(si)
                st.cands[side][si] = sel if prev is None else np.union1d(prev, sel)
            n += len(pos)
        return n


# -- phrase assembly and scoring ------------------------------------------------------------


@dataclass(frozen=True)
class AssembleSpans(Operator):
    max_len: int
    clean_edges: bool = True
    no_stopwords: bool = False
    children: tuple = ()

    def detail(self) -> str:
        return _fmt(max_len=self.max_len, clean_edges=self.clean_edges,
                    no_stopwords=self.no_stopwords)

    def run(self, st: ExecState) -> int:
        segs, ss, es = [], [], []
        for si in sorted(set(st.cands["start"]) | set(st.cands["end"])):
            cols = st.snapshot.segments[si].columns()
            starts = st.cands["start"].get(si, np.zeros(0, np.int64))
            ends = st.cands["end"].get(si, np.zeros(0, np.int64))
            both = np.concatenate([starts, ends]).astype(np.int64)
            spans = S.assemble_spans(starts, ends, cols.flags, cols.block_start(both),
                                     cols.block_end(both), max_len=self.max_len,
                                     clean_edges=self.clean_edges, no_stopwords=self.no_stopwords)
            segs.append(np.full(len(spans), si, np.int64))
            ss.append(spans[:, 0])
            es.append(spans[:, 1])
        if segs:
            st.seg, st.s, st.e = np.concatenate(segs), np.concatenate(ss), np.concatenate(es)
        return int(len(st.s))


def _exact_sims(st: ExecState, seg: np.ndarray, pos: list[np.ndarray], qs: list[np.ndarray]
                ) -> list[tuple[np.ndarray, np.ndarray]]:
    """Exact ``sim(q, E(c))`` of the candidates ``pos[i]`` (positions in segments ``seg``)
    for query vector ``qs[i]``: per i, (inverse ids into the unique candidates, their sims).

    Every stored vector needed is read once (one gather over the union of the sets, one
    read of each chunk touched). The mat-vec uses ``einsum``, not ``@``: a multi-threaded
    BLAS call leaves its threads spinning and slows the next torch call on a busy machine
    (measured ~50x here).
    """
    snap = st.snapshot
    scale = 1.0 / np.sqrt(len(qs[0]))
    qs = [np.asarray(q, np.float32) for q in qs]

    def matvecs(vecs: np.ndarray) -> np.ndarray:  # one einsum per query vector: a 2-column
        return np.stack([np.einsum("ij,j->i", vecs, q) for q in qs], axis=1)  # einsum is slow

    one = len(snap.segments) == 1
    uniqs, invs = [], []
    for p in pos:
        u, inv = np.unique(p if one else seg * (1 << 40) + p, return_inverse=True)
        uniqs.append(u)
        invs.append(inv)
    union, where = np.unique(np.concatenate(uniqs), return_inverse=True)
    if one:
        sims = matvecs(snap.segments[0].vectors(snap.txn, snap.generation, union))
    else:
        sims = np.empty((len(union), len(qs)), dtype=np.float32)
        useg, upos = union >> 40, union & ((1 << 40) - 1)
        for si in np.unique(useg):
            m = useg == si
            vecs = snap.segments[int(si)].vectors(snap.txn, snap.generation, upos[m])
            sims[m] = matvecs(vecs)
    out, lo = [], 0
    for i, u in enumerate(uniqs):
        out.append((invs[i], sims[where[lo:lo + len(u)], i].astype(np.float64) * scale))
        lo += len(u)
    return out


@dataclass(frozen=True)
class ScoreSpans(Operator):
    """Exact similarities for every start in S and end in E, then NPM's span score."""

    tau: float
    scoring: str = "npm"
    children: tuple = ()

    def detail(self) -> str:
        return _fmt(tau=self.tau, scoring=self.scoring)

    def run(self, st: ExecState) -> int:
        (inv_s, sims_s), (inv_e, sims_e) = _exact_sims(st, st.seg, [st.s, st.e],
                                                       [st.qv.start, st.qv.end])
        st.sim_s, st.sim_e = sims_s[inv_s], sims_e[inv_e]
        st.score, _, _ = S.span_scores(inv_s, inv_e, sims_s, sims_e, tau=self.tau,
                                       scoring=self.scoring)
        st.info["unique_starts"], st.info["unique_ends"] = len(sims_s), len(sims_e)
        return int(len(st.score))


@dataclass(frozen=True)
class ScoreTokens(Operator):
    """Token mode: exact ``sim(q, c)`` for every candidate token, softmax over them."""

    tau: float
    children: tuple = ()

    def detail(self) -> str:
        return _fmt(tau=self.tau)

    def run(self, st: ExecState) -> int:
        segs, poss = [], []
        for si, p in sorted(st.cands["token"].items()):
            segs.append(np.full(len(p), si, np.int64))
            poss.append(p)
        if not segs:
            return 0
        st.seg, st.s = np.concatenate(segs), np.concatenate(poss)
        st.e = st.s.copy()
        ((inv, sims),) = _exact_sims(st, st.seg, [st.s], [st.qv.token])
        st.sim_s = sims[inv]
        st.score = S.softmax(st.sim_s, self.tau)
        return int(len(st.score))


# -- aggregation ----------------------------------------------------------------------------


def surface(st: ExecState, si: int, s: int, e: int) -> tuple[str, Any]:
    """The occurrence's text sliced from its document, and the document."""
    snap = st.snapshot
    seg = snap.segments[si]
    cols = seg.columns()
    doc = seg.doc(snap.txn, int(cols.block_doc[cols.block_of[s]]))
    return doc.text[cols.offsets[s, 0]:cols.offsets[e, 1]], doc


class Surfaces:
    """The surface texts of many occurrences, computed on demand: ``keys()`` gives every
    occurrence's folded text (the grouping key) and ``text(i)`` one occurrence's text."""

    def __init__(self, st: ExecState, seg: np.ndarray, s: np.ndarray, e: np.ndarray) -> None:
        self.n = len(s)
        self.docs = np.zeros(self.n, dtype=np.int64)
        self._parts = []  # (rows, doc numbers, starts, ends, {doc: (text, folded)})
        snap = st.snapshot
        for si in np.unique(seg):
            rows = np.flatnonzero(seg == si)
            reader = snap.segments[int(si)]
            cols = reader.columns()
            ss, ee = s[rows], e[rows]
            dl = cols.block_doc[cols.block_of[ss]]
            self.docs[rows] = dl
            texts = {int(d): reader.doc_view(snap.txn, int(d), fold_view) for d in np.unique(dl)}
            self._parts.append((rows, dl, cols.offsets[ss, 0], cols.offsets[ee, 1], texts))
        self._where: np.ndarray | None = None

    def keys(self) -> list[str]:
        """``fold(text)`` of every occurrence: a slice of the document's folded text."""
        out: list[str] = [""] * self.n
        for rows, dl, a, b, texts in self._parts:
            views = [texts[d] for d in dl.tolist()]
            keys = [f[x:y] if f is not None else fold(t[x:y])
                    for (t, f), x, y in zip(views, a.tolist(), b.tolist())]
            if len(self._parts) == 1:
                return keys
            for r, k in zip(rows.tolist(), keys):
                out[r] = k
        return out

    def text(self, i: int) -> str:
        if self._where is None:  # occurrence -> (part, row within the part)
            self._where = np.zeros((self.n, 2), dtype=np.int64)
            for p, (rows, *_rest) in enumerate(self._parts):
                self._where[rows, 0] = p
                self._where[rows, 1] = np.arange(len(rows))
        p, j = self._where[i]
        _rows, dl, a, b, texts = self._parts[p]
        return texts[int(dl[j])][0][int(a[j]):int(b[j])]


def _word_bounds(cols, s: int, e: int) -> tuple[int, int]:
    from npmdb.storage.format import WORD_END, WORD_START

    lo = int(cols.block_ptr[cols.block_of[s]])
    hi = int(cols.block_ptr[cols.block_of[e] + 1]) - 1
    while s > lo and not cols.flags[s] & WORD_START:
        s -= 1
    while e < hi and not cols.flags[e] & WORD_END:
        e += 1
    return s, e


def _make_groups(keys: list, text_of: Callable[[int], str], scores: np.ndarray,
                 n_tokens: np.ndarray, *, alpha: float = 0.0, top_n: int = 0) -> list[Group]:
    """Answers from occurrences: per group the summed score (times ``n_tokens ** alpha``),
    the surface text of its best occurrence, and its members. With ``top_n``, only the
    ``top_n`` best groups are built (in first-seen order, as a stable sort expects)."""
    gid, distinct = S.group_keys(keys)
    if not distinct:
        return []
    sums = np.bincount(gid, weights=scores, minlength=len(distinct))
    nt = n_tokens.tolist()
    if not alpha and top_n and top_n <= 32 and top_n < len(distinct):
        # the common ORDER BY score LIMIT n: rank groups by their sums, then find the
        # members and best occurrence of the n kept ones only
        idx = np.arange(len(distinct))
        keep = np.sort(np.lexsort((idx, -sums))[:top_n])
        groups = []
        for g in keep.tolist():
            members = np.flatnonzero(gid == g)
            best = int(members[np.argmax(scores[members])])  # ties: first seen
            groups.append(Group(distinct[g], text_of(best), float(sums[g]), nt[best], members))
        return groups
    by_score = np.lexsort((-scores, gid))          # per group, best first (ties: first seen)
    order = np.argsort(gid, kind="stable")         # per group, in occurrence order
    cuts = np.flatnonzero(np.diff(gid[order])) + 1
    lo = np.concatenate([[0], cuts])
    hi = np.concatenate([cuts, [len(order)]])
    best = by_score[lo]
    final = sums * (n_tokens[best].astype(np.float64) ** alpha) if alpha else sums
    keep = np.arange(len(distinct))
    if top_n and top_n < len(distinct):
        keep = np.sort(np.lexsort((keep, -final))[:top_n])
    lo_l, hi_l, best_l, fin_l = lo.tolist(), hi.tolist(), best.tolist(), final.tolist()
    return [Group(distinct[g], text_of(best_l[g]), fin_l[g], nt[best_l[g]],
                  order[lo_l[g]:hi_l[g]]) for g in keep.tolist()]


@dataclass(frozen=True)
class Aggregate(Operator):
    """Group occurrences into answers; answer score = sum of scores * n_tokens ** alpha."""

    group_by: str = "phrase"
    alpha: float = 0.0
    children: tuple = ()
    top_n: int = 0  # > 0: build only the best top_n answers (planner: ORDER BY score LIMIT)

    def detail(self) -> str:
        return _fmt(group_by=self.group_by, alpha=self.alpha) + (
            f", top_n={self.top_n}" if self.top_n else "")

    def run(self, st: ExecState) -> int:
        if self.group_by == "word":
            for i in range(len(st.s)):
                cols = st.snapshot.segments[int(st.seg[i])].columns()
                st.s[i], st.e[i] = _word_bounds(cols, int(st.s[i]), int(st.e[i]))
        sf = Surfaces(st, st.seg, st.s, st.e)
        docs = sf.docs
        n_tokens = st.e - st.s + 1
        if self.group_by in ("phrase", "word"):
            keys = sf.keys()
        elif self.group_by == "tokens":
            keys = []
            for si, s, e in zip(st.seg.tolist(), st.s.tolist(), st.e.tolist()):
                keys.append(tuple(st.snapshot.segments[si].columns().tokens[s:e + 1].tolist()))
        else:  # document
            keys = list(zip(st.seg.tolist(), docs.tolist()))
        groups = _make_groups(keys, sf.text, np.asarray(st.score, np.float64), n_tokens,
                              alpha=self.alpha, top_n=self.top_n)
        if self.group_by == "document":
            for g in groups:
                si, local = g.key
                g.text = st.snapshot.doc(si, local).id
        st.groups = groups
        st.info["answers"] = len(set(keys))
        return st.info["answers"]


@dataclass(frozen=True)
class ClassifyLabels(Operator):
    """score(label) = sum over candidates whose text is a label word of
    exp(sim_s/tau + sim_e/tau) (phrase) or exp(sim/tau) (token)."""

    labels: tuple[tuple[str, tuple[str, ...]], ...]
    tau: float
    mode: str = "phrase"
    children: tuple = ()

    def detail(self) -> str:
        return _fmt(labels="{" + ", ".join(f"{l}: {list(w)}" for l, w in self.labels) + "}",
                    tau=self.tau)

    def run(self, st: ExecState) -> int:
        word_to_labels: dict[str, list[str]] = {}
        for label, words in self.labels:
            for w in words:
                word_to_labels.setdefault(fold(w), []).append(label)
        logits = S.label_logits(st.sim_s, st.sim_e if self.mode == "phrase" else None, self.tau)
        keys = Surfaces(st, st.seg, st.s, st.e).keys()
        members: dict[str, list[int]] = {l: [] for l, _ in self.labels}
        for i, t in enumerate(keys):
            for label in word_to_labels.get(t, ()):
                members[label].append(i)
        groups = []
        for label, _ in self.labels:
            idx = np.asarray(members[label], dtype=np.int64)
            if len(idx):
                z = logits[idx]
                m = z.max()
                log_score = float(m + np.log(np.exp(z - m).sum()))
                score = float(np.exp(log_score)) if log_score < 700 else float("inf")
            else:
                log_score, score = float("-inf"), 0.0
            g = Group(label, label, score=score, idx=idx,
                      weights=np.exp(np.minimum(logits, 700.0)) if len(idx) else None)
            g.extra["log_score"] = log_score
            groups.append(g)
        st.groups = groups
        return len(groups)


# -- relational tail ----------------------------------------------------------------------


@dataclass(frozen=True)
class FilterAnswers(Operator):
    describe: str
    predicate: Callable[[Group], bool] = field(compare=False, repr=False)
    children: tuple = ()

    def detail(self) -> str:
        return self.describe

    def run(self, st: ExecState) -> int:
        st.groups = [g for g in st.groups if self.predicate(g)]
        return len(st.groups)


@dataclass(frozen=True)
class OrderBy(Operator):
    keys: tuple[tuple[str, bool], ...] = (("score", True),)  # (column, descending)
    children: tuple = ()

    def detail(self) -> str:
        return ", ".join(f"{k} {'DESC' if d else 'ASC'}" for k, d in self.keys)

    def run(self, st: ExecState) -> int:
        for col, desc in reversed(self.keys):
            st.groups.sort(key=lambda g: _sort_value(g, col), reverse=desc)
        return len(st.groups)


def _sort_value(g: Group, col: str):
    if col == "score":
        return g.score
    if col == "support":
        return g.support
    if col in ("phrase", "label", "text"):
        return fold(g.text)
    if col in ("length", "tokens"):
        return g.n_tokens
    if col == "words":  # SQL's length(phrase): number of words
        return len(g.text.split())
    return g.extra.get(col, 0)


@dataclass(frozen=True)
class Limit(Operator):
    n: int
    offset: int = 0
    children: tuple = ()

    def detail(self) -> str:
        return _fmt(limit=self.n, offset=self.offset) if self.n else _fmt(offset=self.offset)

    def run(self, st: ExecState) -> int:
        end = self.offset + self.n if self.n else None
        st.groups = st.groups[self.offset:end]
        return len(st.groups)


@dataclass(frozen=True)
class AttachEvidence(Operator):
    """For each answer: its best ``n`` occurrences as (doc id, title, offsets, snippet)."""

    n: int
    children: tuple = ()

    def detail(self) -> str:
        return _fmt(per_answer=self.n)

    def run(self, st: ExecState) -> int:
        from .result import Evidence

        count = 0
        for g in st.groups:
            w = g.weights if g.weights is not None else st.score
            idx = g.idx[np.argsort(-np.asarray(w)[g.idx], kind="stable")][: self.n]
            g.evidence = []
            for i in idx.tolist():
                si, s, e = int(st.seg[i]), int(st.s[i]), int(st.e[i])
                cols = st.snapshot.segments[si].columns()
                _, doc = surface(st, si, s, e)
                a, b = int(cols.offsets[s, 0]), int(cols.offsets[e, 1])
                g.evidence.append(Evidence(doc.id, doc.title, "text", a, b, snippet(doc.text, a, b),
                                           float(w[i])))
                count += 1
        return count


def snippet(text: str, a: int, b: int, width: int = 80) -> str:
    """Context around ``text[a:b]``, cut at white space, with the occurrence in ⟦ ⟧-free form."""
    lo = max(0, a - width)
    hi = min(len(text), b + width)
    if lo > 0:
        sp = text.find(" ", lo, a)
        lo = sp + 1 if sp != -1 else lo
    if hi < len(text):
        sp = text.rfind(" ", b, hi)
        hi = sp if sp != -1 else hi
    out = text[lo:hi].replace("\n", " ")
    return ("…" if lo > 0 else "") + out + ("…" if hi < len(text) else "")
