"""The answer-level tail of a masked-span plan: filter, order, limit, and the evidence
attached to each answer.

These run after :class:`~npmdb.query.answers.Aggregate` (or
:class:`~npmdb.query.answers.ClassifyLabels`) and see only
:class:`~npmdb.query.physical.Answers`: the groups and the occurrences they index.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from . import scoring as S
from .physical import Answers, ExecState, Group, Occurrences, Operator, _fmt
from .surfaces import locate, snippet

__all__ = ["FilterAnswers", "OrderBy", "Limit", "AttachEvidence", "best_first"]


@dataclass(frozen=True)
class FilterAnswers(Operator):
    describe: str
    predicate: Callable[[Group], bool] = field(compare=False, repr=False)
    children: tuple = ()

    def detail(self) -> str:
        return self.describe

    def run(self, st: ExecState) -> Answers:
        ans = st.input(self, Answers)
        kept = [g for g in ans.groups if self.predicate(g)]
        return replace(ans, groups=kept, count=len(kept))


@dataclass(frozen=True)
class OrderBy(Operator):
    keys: tuple[tuple[str, bool], ...] = (("score", True),)  # (column, descending)
    children: tuple = ()

    def detail(self) -> str:
        return ", ".join(f"{k} {'DESC' if d else 'ASC'}" for k, d in self.keys)

    def run(self, st: ExecState) -> Answers:
        ans = st.input(self, Answers)
        groups = list(ans.groups)
        for col, desc in reversed(self.keys):
            groups.sort(key=lambda g: _sort_value(g, col), reverse=desc)
        return replace(ans, groups=groups, count=len(groups))


def _sort_value(g: Group, col: str):
    if col == "score":  # an underflowed or overflowed score ranks by its log (rank_keys)
        if g.log_score is not None and g.score < S.TINY:
            return (0.0, g.log_score)
        if g.log_score is not None and math.isinf(g.score):
            return (g.score, g.log_score)
        return (g.score, 0.0)
    if col == "support":
        return g.support
    if col in ("phrase", "label", "text"):  # character order, as rows of other sources sort
        return g.text
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

    def run(self, st: ExecState) -> Answers:
        ans = st.input(self, Answers)
        end = self.offset + self.n if self.n else None
        kept = ans.groups[self.offset:end]
        return replace(ans, groups=kept, count=len(kept))


def best_first(g: Group, occ: Occurrences) -> tuple[np.ndarray, np.ndarray]:
    """An answer's occurrences best first (ties: first seen; an underflowed score by its
    log), and the weights they are ranked by (``occ.score``, or a label's own)."""
    if g.weights is not None:  # its own (a label's exp(logit), a word's summed pieces)
        w, logs = np.asarray(g.weights), g.log_weights
    else:
        w, logs = np.asarray(occ.score), occ.log_score
    return g.idx[S.rank_order(w[g.idx], None if logs is None else logs[g.idx])], w


@dataclass(frozen=True)
class AttachEvidence(Operator):
    """For each answer: its best ``n`` occurrences as (doc id, title, offsets, snippet)."""

    n: int
    children: tuple = ()

    def detail(self) -> str:
        return _fmt(per_answer=self.n)

    def run(self, st: ExecState) -> Answers:
        from .result import Evidence

        ans = st.input(self, Answers)
        occ = ans.occ
        chosen = []  # per answer, its best n occurrences and their weights
        for g in ans.groups:
            idx, w = best_first(g, occ)
            idx = idx[: self.n].tolist()
            chosen.append((idx, w))
        found = iter(locate(st, occ, [i for idx, _ in chosen for i in idx]))
        groups = []
        for g, (idx, w) in zip(ans.groups, chosen):
            evidence = []
            for i in idx:
                at = next(found)
                evidence.append(Evidence(at.doc.id, at.doc.title, "text", at.start, at.end,
                                         snippet(at.doc.text, at.start, at.end), float(w[i])))
            groups.append(replace(g, evidence=evidence))
        return replace(ans, groups=groups, count=sum(len(i) for i, _ in chosen))
