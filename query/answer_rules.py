"""Rules on where an answer was found (not in NPM; both on by default).

An answer is kept only if one of its occurrences passes every rule that is on; a kept
answer keeps its whole score, so no softmax changes. ``not_subject_name``: an occurrence
inside an entry head that names the query's subject is another name of that subject
(:mod:`npmdb.query.subjects`); ``whole_names``: an occurrence inside a longer capitalised
name is a fragment of it (:mod:`npmdb.query.names`). ``Aggregate`` asks these rules within
its top-N pushdown; without one, :class:`FilterByOccurrence` asks them after the order.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np

from . import scoring as S
from .names import name_fragment
from .physical import Answers, ExecState, Group, Occurrences, Operator
from .subjects import SubjectNames
from .surfaces import locate

__all__ = ["AnswerRules", "FilterByOccurrence", "occurrence_check"]


@dataclass(frozen=True)
class AnswerRules:
    """Rules on where an answer was found: an answer needs one occurrence that passes
    every rule that is on. ``subject``: the query whose subject's names (entry heads,
    :mod:`npmdb.query.subjects`) are no answer (``not_subject_name``); ``whole_names``:
    a fragment of a longer capitalised name is no answer (:mod:`npmdb.query.names`)."""

    subject: str = ""
    whole_names: bool = False

    def __bool__(self) -> bool:
        return bool(self.subject) or self.whole_names

    def describe(self) -> str:
        return "; ".join(d for on, d in (
            (self.subject, "answer not only a name of the query's subject"),
            (self.whole_names, "answer not only part of a longer name")) if on)


@dataclass(frozen=True)
class FilterByOccurrence(Operator):
    """Drop the answers none of whose occurrences passes ``rules`` ("WA" found only in
    "Washington (Evergreen State, WA): ..." for a query about Washington; "New" found only
    in "New York"). An answer kept keeps its score. Answers are checked in their order
    until ``keep`` are kept (0: all); the rest pass unchecked, for the limit above to cut."""

    rules: AnswerRules
    keep: int = 0
    children: tuple = ()

    def detail(self) -> str:
        return self.rules.describe() + (f", first {self.keep}" if self.keep else "")

    def run(self, st: ExecState) -> Answers:
        ans = st.input(self, Answers)
        passes = occurrence_check(st, ans.occ, self.rules)
        kept: list[Group] = []
        for n, g in enumerate(ans.groups):
            if self.keep and len(kept) == self.keep:
                kept += ans.groups[n:]
                break
            if passes(g.idx):
                kept.append(g)
        return replace(ans, groups=kept, count=len(kept))


def occurrence_check(st: ExecState, occ: Occurrences, rules: AnswerRules
                     ) -> Callable[[np.ndarray], bool]:
    """Whether an answer with occurrences ``idx`` of ``occ`` has one that passes
    ``rules`` (each document is read once: from this process's snapshot, or located by the
    shards that own the occurrences)."""
    names, heads, texts = SubjectNames(rules.subject), {}, {}  # by document

    def passes(key: Any, start: int, end: int, doc: Callable[[], Any]) -> bool:
        if key not in texts:
            d = doc()
            texts[key] = d.text
            heads[key] = names.head_end(d.title or "", d.text) if rules.subject else 0
        return start >= heads[key] and not (
            rules.whole_names and name_fragment(texts[key], start, end))

    where: list[np.ndarray] = []  # every occurrence's document, start and end, found once

    def local(idx: np.ndarray) -> bool:
        snap = st.snapshot
        if not where:
            where.extend(np.zeros(len(occ.s), np.int64) for _ in range(3))
            for si in S.sorted_unique(occ.seg).tolist():
                m = occ.seg == si
                cols = snap.columns(si)
                where[0][m] = cols.block_doc[cols.block_of(occ.s[m])]
                where[1][m] = cols.offsets[occ.s[m], 0]
                where[2][m] = cols.offsets[occ.e[m], 1]
        return any(passes((si, d), a, b, lambda si=si, d=d: snap.segments[si].doc(snap.txn, d))
                   for si, d, a, b in zip(occ.seg[idx].tolist(), *(w[idx].tolist()
                                                                     for w in where)))

    def sharded(idx: np.ndarray) -> bool:
        ids = idx.tolist()  # most answers show one that passes in their first few
        return any(passes(at.doc.id, at.start, at.end, lambda at=at: at.doc)
                   for part in (ids[:4], ids[4:]) if part for at in locate(st, occ, part))

    return lambda idx: (local if occ.surfaces is None else sharded)(np.asarray(idx, np.int64))
