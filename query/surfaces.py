"""Where an occurrence is and what it says: its surface text sliced from its document
(folded, as answers are grouped), its location for evidence, and snippets.

:class:`Surfaces` serves one query's occurrences of this process's snapshot; shards serve
theirs through :class:`npmdb.query.exchange.ShardSurfaces`, which has the same interface.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from npmdb.storage.format import WORD_END, WORD_START

from . import scoring as S
from .physical import ExecState, Occurrences
from .text import fold, fold_view, snippet_bounds

__all__ = ["Surfaces", "Located", "locate", "locate_in", "surfaces_of", "snippet", "surface",
           "widen_to_words"]


def surface(snap: Any, si: int, s: int, e: int) -> tuple[str, Any]:
    """The occurrence's text sliced from its document, and the document."""
    seg = snap.segments[si]
    cols = snap.columns(si)
    doc = seg.doc(snap.txn, int(cols.block_doc[cols.block_of(s)]))
    return doc.text[cols.offsets[s, 0]:cols.offsets[e, 1]], doc


@dataclass(frozen=True)
class Located:
    """Where an occurrence is: its text, its document and its character offsets."""

    text: str
    doc: Any  # StoredDoc: id, title, text, meta
    start: int
    end: int


def locate_in(snap: Any, items: list[tuple[int, int, int]]) -> list[Located]:
    """:class:`Located` of each ``(segment, first token, last token)`` in ``snap``."""
    out = []
    for si, s, e in items:
        cols = snap.columns(si)
        text, doc = surface(snap, si, s, e)
        out.append(Located(text, doc, int(cols.offsets[s, 0]), int(cols.offsets[e, 1])))
    return out


def locate(st: ExecState, occ: Occurrences, idx: list[int]) -> list[Located]:
    """Occurrences ``idx`` of ``occ``, located by whoever holds them: this process's
    snapshot, or the shards that own their segments."""
    if occ.surfaces is not None:
        return occ.surfaces.locate(idx)
    return locate_in(st.snapshot, [(int(occ.seg[i]), int(occ.s[i]), int(occ.e[i]))
                                   for i in idx])


def surfaces_of(st: ExecState, occ: Occurrences) -> "Surfaces":
    """The surface texts of ``occ``: the shards' (gathered with them) or the snapshot's."""
    return occ.surfaces if occ.surfaces is not None else Surfaces(st.snapshot, occ.seg,
                                                                   occ.s, occ.e)


def widen_to_words(snap: Any, occ: Occurrences) -> Occurrences:
    """Token occurrences widened to the whole words they are part of."""
    ws, we = occ.s.copy(), occ.e.copy()
    for i in range(len(ws)):
        cols = snap.columns(int(occ.seg[i]))
        ws[i], we[i] = _word_bounds(cols, int(ws[i]), int(we[i]))
    return replace(occ, s=ws, e=we)


class Surfaces:
    """The surface texts of many occurrences, computed on demand: ``keys()`` gives every
    occurrence's folded text (the grouping key) and ``text(i)`` one occurrence's text."""

    def __init__(self, snap: Any, seg: np.ndarray, s: np.ndarray, e: np.ndarray) -> None:
        self.snap, self.seg, self.s, self.e = snap, seg, s, e
        self.n = len(s)
        self.docs = np.zeros(self.n, dtype=np.int64)
        self._parts = []  # (rows, doc numbers, starts, ends, {doc: (text, folded)})
        for si in S.sorted_unique(seg):
            rows = np.flatnonzero(seg == si)
            reader = snap.segments[int(si)]
            cols = snap.columns(int(si))
            ss, ee = s[rows], e[rows]
            dl = cols.block_doc[cols.block_of(ss)]
            self.docs[rows] = dl
            texts = {d: reader.doc_view(snap.txn, d, fold_view)
                     for d in S.sorted_unique(dl).tolist()}
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

    def group_keys(self, group_by: str) -> list:
        """Every occurrence's grouping key: its folded text ('phrase', 'word'), its token
        ids ('tokens') or its (segment, document) ('document')."""
        if group_by in ("phrase", "word"):
            return self.keys()
        if group_by == "tokens":
            return [tuple(self.snap.columns(si).tokens[s:e + 1].tolist()) for si, s, e in
                    zip(self.seg.tolist(), self.s.tolist(), self.e.tolist())]
        return list(zip(self.seg.tolist(), self.docs.tolist()))

    def doc_id(self, si: int, local: int) -> str:
        return self.snap.doc(si, local).id

    def text(self, i: int) -> str:
        return self.texts([i])[0]

    def texts(self, idx: list[int]) -> list[str]:
        """The surface texts of occurrences ``idx`` (one vectorised lookup: the thousands of
        answers a query groups cost a slice each, not numpy scalar indexing)."""
        if self._where is None:  # occurrence -> (part, row within the part)
            self._where = np.zeros((self.n, 2), dtype=np.int64)
            for p, (rows, *_rest) in enumerate(self._parts):
                self._where[rows, 0] = p
                self._where[rows, 1] = np.arange(len(rows))
        where = self._where[np.asarray(idx, dtype=np.int64)]
        out: list[str] = [""] * len(idx)
        for p, (_rows, dl, a, b, texts) in enumerate(self._parts):
            at = np.flatnonzero(where[:, 0] == p)
            j = where[at, 1]
            for i, d, x, y in zip(at.tolist(), dl[j].tolist(), a[j].tolist(), b[j].tolist()):
                out[i] = texts[d][0][x:y]
        return out


def _word_bounds(cols, s: int, e: int) -> tuple[int, int]:
    lo = int(cols.block_ptr[cols.block_of(s)])
    hi = int(cols.block_ptr[cols.block_of(e) + 1]) - 1
    while s > lo and not cols.flags[s] & WORD_START:
        s -= 1
    while e < hi and not cols.flags[e] & WORD_END:
        e += 1
    return s, e


def snippet(text: str, a: int, b: int, width: int = 80) -> str:
    """Context around ``text[a:b]``, cut at white space, with the occurrence in ⟦ ⟧-free form."""
    lo, hi = snippet_bounds(text, a, b, width)
    out = text[lo:hi].replace("\n", " ")
    return ("…" if lo > 0 else "") + out + ("…" if hi < len(text) else "")
