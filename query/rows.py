"""Row-level physical operators: EVIDENCE, SEARCH and DOCUMENTS rows, their filters,
order and limit, and the projection that every statement ends with.

They share :class:`~npmdb.query.physical.ExecState` and the executor with the span
operators (:mod:`npmdb.query.operators`, :mod:`npmdb.query.answers`); a row is a dict
keyed by canonical column.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from npmdb.errors import QueryDataError

from .evaluate import kind_of
from .lexer import error_at
from .surfaces import locate, snippet
from .tail import best_first
from .physical import Answers, BlockHits, ExecState, Operator, Projection, Rows, _fmt

__all__ = ["EvidenceRows", "BlockRows", "ScanDocuments", "FilterRows", "OrderRows", "LimitRows",
           "Project", "block_rows"]

# Rows are dicts keyed by column: plain names ("score", "snippet") and, for the document a
# row comes from, "doc.id", "doc.title", "doc.text", "doc.meta".


def _doc_columns(doc) -> dict:
    return {"doc.id": doc.id, "doc.title": doc.title, "doc.text": doc.text, "doc.meta": doc.meta}


@dataclass(frozen=True)
class EvidenceRows(Operator):
    """One row per occurrence of each answer (best first within an answer); ``per_answer``
    caps the occurrences of one answer (0 = all of them)."""

    per_answer: int = 0
    offset: int = 0  # the answers' OFFSET, so that ``rank`` counts from offset + 1
    children: tuple = ()

    def detail(self) -> str:
        return _fmt(per_answer=self.per_answer or "all")

    def run(self, st: ExecState) -> Rows:
        snap = st.snapshot
        ans = st.input(self, Answers)
        occ = ans.occ
        chosen = []  # (rank, answer, its occurrences best first, their weights)
        for rank, g in enumerate(ans.groups, start=self.offset + 1):
            idx, w = best_first(g, occ)
            if self.per_answer:
                idx = idx[: self.per_answer]
            chosen.append((rank, g, idx.tolist(), w))
        found = iter(locate(st, occ, [i for *_, idx, _ in chosen for i in idx]))
        rows: list[dict] = []
        for rank, g, idx, w in chosen:
            for i in idx:
                at = next(found)
                a, b, doc = at.start, at.end, at.doc
                rows.append({"phrase": g.text, "text": at.text, "support": g.support,
                             "rank": rank, "answer_score": float(g.score), "score": float(w[i]),
                             "start": a, "end": b, "snippet": snippet(doc.text, a, b),
                             "tokens": int(occ.e[i] - occ.s[i]) + 1,
                             "length": len(at.text.split()),
                             "version": snap.manifest.id, "generation": snap.generation,
                             **_doc_columns(doc)})
        return Rows(rows)


@dataclass(frozen=True)
class BlockRows(Operator):
    """One row per retrieved block (its child's :class:`BlockHits`), as ``Database.search``
    reports them."""

    children: tuple = ()

    def run(self, st: ExecState) -> Rows:
        snap = st.snapshot
        rows: list[dict] = []
        for out in st.inputs(self, BlockHits):
            found = out.rows_of(out.hits) if out.rows_of is not None else \
                block_rows(snap, out.hits)
            rows += [{**r, "version": snap.manifest.id, "generation": snap.generation}
                     for r in found]
        return Rows(rows)


def block_rows(snap: Any, hits: Any) -> list[dict]:
    """One row per ``(segment, block, score)`` hit: the block's text, snippet and document
    (the columns a SEARCH row has, less the version's)."""
    rows = []
    for si, block, score, *_ in hits:
        cols = snap.columns(si)
        doc = snap.doc(si, int(cols.block_doc[block]))
        a = int(cols.offsets[cols.block_ptr[block], 0])
        b = int(cols.offsets[cols.block_ptr[block + 1] - 1, 1])
        rows.append({"block": int(block), "score": float(score), "start": a, "end": b,
                     "text": doc.text[a:b], "snippet": snippet(doc.text, a, b, 0)[:300],
                     **_doc_columns(doc)})
    return rows


@dataclass(frozen=True)
class ScanDocuments(Operator):
    """Every live document the snapshot allows (its document filter applies), in insertion
    order; stops after ``stop_after`` rows when that is set (a folded LIMIT)."""

    stop_after: int | None = None
    docs: str = ""  # the document filter, for EXPLAIN (the snapshot applies it)
    children: tuple = ()

    def detail(self) -> str:
        parts = [f"docs: {self.docs}"] if self.docs else []
        if self.stop_after is not None:
            parts.append(f"stop_after={self.stop_after}")
        return ", ".join(parts)

    def run(self, st: ExecState) -> Rows:
        snap = st.snapshot
        rows: list[dict] = []
        for si, seg in enumerate(snap.segments):
            allowed = snap.allowed_docs(si)
            n_docs = seg.record.docs
            locals_ = range(n_docs) if allowed is None else np.flatnonzero(allowed).tolist()
            for local in locals_:
                if self.stop_after is not None and len(rows) >= self.stop_after:
                    break
                doc = seg.doc(snap.txn, int(local))
                rows.append({"version": snap.manifest.id, "generation": snap.generation,
                             **_doc_columns(doc)})
        return Rows(rows)


@dataclass(frozen=True)
class FilterRows(Operator):
    describe: str
    predicate: Callable[[dict], bool] = field(compare=False, repr=False)
    children: tuple = ()

    def detail(self) -> str:
        return self.describe

    def run(self, st: ExecState) -> Rows:
        return Rows([r for r in st.input(self, Rows).rows if self.predicate(r)])


@dataclass(frozen=True)
class OrderRows(Operator):
    """Sort rows by ``keys``: (describe, key function, descending, the key's offset in
    ``text``, the statement); NULLs (and NaN) sort last."""

    keys: tuple = ()
    text: str = field(default="", compare=False, repr=False)
    children: tuple = ()

    def detail(self) -> str:
        return ", ".join(f"{d} {'DESC' if desc else 'ASC'}" for d, _, desc, _ in self.keys)

    def run(self, st: ExecState) -> Rows:
        rows = st.input(self, Rows).rows
        for describe, fn, desc, pos in reversed(self.keys):
            values = [fn(r) for r in rows]
            # NaN (a DataFrame's missing number) has no order: it sorts with the NULLs
            # (compared as a number it left the rows unsorted, with no error)
            none = [v is None or (isinstance(v, float) and v != v) for v in values]
            present = [i for i, n in enumerate(none) if not n]
            missing = [i for i, n in enumerate(none) if n]
            try:
                present.sort(key=lambda i: values[i], reverse=desc)
            except TypeError:
                raise error_at(self.text, pos, _unsortable(describe, values, present, rows),
                               cls=QueryDataError) from None
            rows = [rows[i] for i in present + missing]
        return Rows(rows)


def _unsortable(describe: str, values: list, present: list[int], rows: list[dict]) -> str:
    """Why ``values`` cannot be sorted, naming a document that holds each kind."""
    first: dict[str, int] = {}
    for i in present:
        first.setdefault(kind_of(values[i]), i)
    where = ", ".join(f"{k} in document {rows[i].get('doc.id')!r}"
                      for k, i in first.items())
    if len(first) == 1:  # one kind that has no order (objects)
        return (f"ORDER BY {describe}: values of type {next(iter(first))} have no order "
                f"({where}); ORDER BY a field inside them")
    return (f"ORDER BY {describe}: cannot sort values of different types ({where}); a "
            "field that holds values of different types needs one type (db.update), or "
            "ORDER BY an expression of one type")


@dataclass(frozen=True)
class LimitRows(Operator):
    n: int | None = None
    offset: int = 0
    children: tuple = ()

    def detail(self) -> str:
        return _fmt(limit=self.n, offset=self.offset) if self.n is not None else _fmt(offset=self.offset)

    def run(self, st: ExecState) -> Rows:
        end = None if self.n is None else self.offset + self.n
        return Rows(st.input(self, Rows).rows[self.offset:end])


@dataclass(frozen=True)
class Project(Operator):
    """The select list: ``make(input, snapshot)`` turns its child's :class:`Answers` or
    :class:`Rows` into the output rows (tuples)."""

    columns: tuple[str, ...]
    make: Callable[[Answers | Rows, Any], list[tuple]] = field(compare=False, repr=False)
    children: tuple = ()

    def detail(self) -> str:
        return ", ".join(self.columns)

    def run(self, st: ExecState) -> Projection:
        (inp,) = [o for o in (st.outputs.get(id(c)) for c in self.children)
                  if isinstance(o, (Answers, Rows))]
        return Projection(self.columns, tuple(self.make(inp, st.snapshot)))
