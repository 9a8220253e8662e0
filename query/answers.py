"""From candidates to answers: phrase assembly, exact scoring, grouping into answers, and
closed-set labels. The answer-level tail (filter, order, limit, evidence) is
:mod:`npmdb.query.tail`.

Typed outputs flow up the plan: the retrieval operators (:mod:`npmdb.query.operators`)
hand these :class:`~npmdb.query.physical.Candidates`; assembly and scoring produce
:class:`~npmdb.query.physical.Occurrences`; grouping produces
:class:`~npmdb.query.physical.Answers` (the groups and the occurrences they index).
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np

from . import scoring as S
from .calibration import calibrated_scores
from .physical import (
    Answers, BlockHits, Candidates, ExecState, Group, Occurrences, Operator, _empty, _fmt,
)
from .surfaces import (  # re-exported: the answer stages' view of occurrences
    Located, Surfaces, locate, locate_in, snippet, surface, surfaces_of, widen_to_words,
)
from .answer_rules import AnswerRules, occurrence_check
from .text import fold

__all__ = [
    "AssembleSpans", "ScoreSpans", "ScoreTokens", "Aggregate", "ClassifyLabels",
    "Surfaces",
    "Located", "locate", "locate_in", "snippet", "surface", "span_sims", "token_sims", "scores_from_sims",
    "widen_to_words", "block_prior",
]

# -- phrase assembly and scoring ------------------------------------------------------------

# Segments written before the BREAK flag bit: their flags with breaks derived from the
# stored offsets, computed once per segment reader (segments never change).
_DERIVED_FLAGS: "weakref.WeakKeyDictionary[Any, np.ndarray]" = weakref.WeakKeyDictionary()
_DERIVED_LOCK = threading.Lock()
_STORED = object()  # not looked at yet


def clause_flags(reader: Any, cols: Any) -> np.ndarray:
    """The flags a clean span is checked against: the stored ones, or, for a segment
    stored before the ``BREAK`` bit (no break anywhere), breaks derived at query time
    (:func:`npmdb.query.scoring.spaced_breaks`), so an old database keeps answering
    without spans across "." or ","."""
    with _DERIVED_LOCK:
        got = _DERIVED_FLAGS.get(reader, _STORED)
    if got is _STORED:  # first use: keep the derived flags, or None for "the stored ones"
        # (never the stored column itself: it is a view of one snapshot's pages)
        got = S.spaced_breaks(cols.flags, cols.offsets, cols.block_ptr) \
            if S.lacks_breaks(cols.flags) else None
        with _DERIVED_LOCK:
            _DERIVED_FLAGS[reader] = got
    return cols.flags if got is None else got


@dataclass(frozen=True)
class AssembleSpans(Operator):
    max_len: int
    clean_edges: bool = True
    no_stopwords: bool = False
    children: tuple = ()

    def detail(self) -> str:
        return _fmt(max_len=self.max_len, clean_edges=self.clean_edges,
                    no_stopwords=self.no_stopwords)

    def run(self, st: ExecState) -> Occurrences:
        segs, ss, es = [], [], []
        found = st.inputs(self, Candidates)
        starts_by, ends_by = Candidates.union(found, "start"), Candidates.union(found, "end")
        for si in sorted(set(starts_by) | set(ends_by)):
            reader = st.snapshot.segments[si]
            cols = st.snapshot.columns(si)
            starts = starts_by.get(si, np.zeros(0, np.int64))
            ends = ends_by.get(si, np.zeros(0, np.int64))
            both = np.concatenate([starts, ends]).astype(np.int64)
            flags = clause_flags(reader, cols) if self.clean_edges else cols.flags
            spans = S.assemble_spans(starts, ends, flags, cols.block_start(both),
                                     cols.block_end(both), max_len=self.max_len,
                                     clean_edges=self.clean_edges, no_stopwords=self.no_stopwords)
            segs.append(np.full(len(spans), si, np.int64))
            ss.append(spans[:, 0])
            es.append(spans[:, 1])
        qv = Candidates.query_vectors(found)
        if not segs:
            return Occurrences(_empty(np.int64), _empty(np.int64), _empty(np.int64), qv)
        return Occurrences(np.concatenate(segs), np.concatenate(ss), np.concatenate(es), qv)


def _exact_sims(snap: Any, seg: np.ndarray, pos: list[np.ndarray], qs: list[np.ndarray]
                ) -> list[tuple[np.ndarray, np.ndarray]]:
    """Exact ``sim(q, E(c))`` of the candidates ``pos[i]`` (positions in segments ``seg``)
    for query vector ``qs[i]``: per i, (inverse ids into the unique candidates, their sims).

    Every stored vector needed is read once (one gather over the union of the sets, one
    read of each chunk touched). The mat-vec uses ``einsum``, not ``@``: a multi-threaded
    BLAS call leaves its threads spinning and slows the next torch call on a busy machine
    (measured ~50x here).
    """
    scale = 1.0 / np.sqrt(len(qs[0]))
    qs = [np.asarray(q, np.float32) for q in qs]

    def matvecs(vecs: np.ndarray) -> np.ndarray:  # one einsum per query vector: a 2-column
        return np.stack([np.einsum("ij,j->i", vecs, q) for q in qs], axis=1)  # einsum is slow

    one = len(snap.segments) == 1
    uniqs, invs = [], []
    for p in pos:
        u, inv = S.unique_inverse(p if one else seg * (1 << 40) + p)
        uniqs.append(u)
        invs.append(inv)
    union = S.sorted_unique(np.concatenate(uniqs))
    if one:
        sims = matvecs(snap.segments[0].vectors(snap.txn, snap.generation, union))
    else:
        sims = np.empty((len(union), len(qs)), dtype=np.float32)
        useg, upos = union >> 40, union & ((1 << 40) - 1)
        for si in S.sorted_unique(useg):
            m = useg == si
            vecs = snap.segments[int(si)].vectors(snap.txn, snap.generation, upos[m])
            sims[m] = matvecs(vecs)
    return [(invs[i], sims[np.searchsorted(union, u), i].astype(np.float64) * scale)
            for i, u in enumerate(uniqs)]


def block_prior(st: ExecState, op: Operator, seg: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """The block prior of occurrences at ``(seg, pos)``: the BM25 score on its text alone of
    the block holding each, from the :class:`BlockHits` (with text scores) under ``op``;
    0 for a block BM25 did not retrieve (a dense candidate's, in hybrid retrieval)."""
    out = np.zeros(len(pos), np.float64)
    stack, hits = [op], None
    while stack and hits is None:
        o = stack.pop()
        got = st.outputs.get(id(o))
        hits = got if isinstance(got, BlockHits) else None
        stack.extend(o.children)
    if hits is None or not len(pos):
        return out
    text = {(h[0], h[1]): h[3] for h in hits.hits if len(h) > 3}
    for si in np.unique(seg).tolist():
        m = seg == si
        blocks, inv = np.unique(st.snapshot.columns(si).block_of(pos[m]), return_inverse=True)
        out[m] = np.array([text.get((si, b), 0.0) for b in blocks.tolist()])[inv]
    return out


@dataclass(frozen=True)
class ScoreSpans(Operator):
    """Exact similarities for every start in S and end in E, then NPM's span score.
    ``prior`` > 0 adds ``prior`` x the block's BM25 text score (:func:`block_prior`) to
    each start's and end's similarity before the softmax (0: NPM's score exactly)."""

    tau: float
    scoring: str = "npm"
    children: tuple = ()
    prior: float = 0.0

    def detail(self) -> str:
        return _fmt(tau=self.tau, scoring=self.scoring) + \
            (f", bm25_prior={self.prior:g}" if self.prior else "")

    def run(self, st: ExecState) -> Occurrences:
        sp, ((inv_s, sims_s), (inv_e, sims_e)) = span_sims(st.snapshot,
                                                           st.input(self, Occurrences))
        if self.prior:
            bonus = self.prior * block_prior(st, self, sp.seg, sp.s)
            sims_s, sims_e = _with_prior(sims_s, inv_s, bonus), _with_prior(sims_e, inv_e, bonus)
        score, logs = S.scores_and_logs(inv_s, inv_e, sims_s, sims_e, self.tau, self.scoring)
        st.info["unique_starts"], st.info["unique_ends"] = len(sims_s), len(sims_e)
        return replace(sp, score=score, log_score=logs)


def _with_prior(sims: np.ndarray, inv: np.ndarray, bonus: np.ndarray) -> np.ndarray:
    """``sims`` (one per unique position) plus the prior of each position's block (the
    occurrences ``inv`` maps to one position all lie in its block)."""
    out = np.asarray(sims, np.float64).copy()
    out[inv] += bonus
    return out


def scores_from_sims(occ: Occurrences, tau: float, scoring: str, prior: np.ndarray | None = None
                     ) -> tuple[np.ndarray, np.ndarray | None, int, int]:
    """:class:`ScoreSpans`' scores from each occurrence's similarities (gathered from
    shards): the unique starts and ends in (segment, position) order, as one process
    finds them, then NPM's span score, with ``prior`` (per occurrence, already weighted)
    added to both similarities. Returns the scores, their logs where some underflowed,
    and the unique counts."""
    key_s = occ.seg * (1 << 40) + occ.s
    key_e = occ.seg * (1 << 40) + occ.e
    us, first_s, inv_s = np.unique(key_s, return_index=True, return_inverse=True)
    ue, first_e, inv_e = np.unique(key_e, return_index=True, return_inverse=True)
    sims_s, sims_e = occ.sim_s[first_s], occ.sim_e[first_e]
    if prior is not None:
        sims_s, sims_e = _with_prior(sims_s, inv_s, prior), _with_prior(sims_e, inv_e, prior)
    score, logs = S.scores_and_logs(inv_s, inv_e, sims_s, sims_e, tau, scoring)
    return score, logs, len(us), len(ue)


def span_sims(snap: Any, sp: Occurrences) -> tuple[Occurrences, tuple]:
    """``sp`` with each occurrence's exact start and end similarities, and the unique
    sets they came from (``(inv_s, sims_s), (inv_e, sims_e)``)."""
    (inv_s, sims_s), (inv_e, sims_e) = found = _exact_sims(snap, sp.seg, [sp.s, sp.e],
                                                           [sp.qv.start, sp.qv.end])
    return replace(sp, sim_s=sims_s[inv_s], sim_e=sims_e[inv_e]), found


def token_sims(snap: Any, found: list[Candidates]) -> Occurrences:
    """Token mode: every candidate token (in segment order) with its exact similarity."""
    qv = Candidates.query_vectors(found)
    segs, poss = [], []
    for si, p in sorted(Candidates.union(found, "token").items()):
        segs.append(np.full(len(p), si, np.int64))
        poss.append(p)
    if not segs:
        return Occurrences(_empty(np.int64), _empty(np.int64), _empty(np.int64), qv)
    seg, s = np.concatenate(segs), np.concatenate(poss)
    ((inv, sims),) = _exact_sims(snap, seg, [s], [qv.token])
    return Occurrences(seg, s, s.copy(), qv, sim_s=sims[inv])


@dataclass(frozen=True)
class ScoreTokens(Operator):
    """Token mode: exact ``sim(q, c)`` for every candidate token, softmax over them
    (``prior``: as :class:`ScoreSpans`')."""

    tau: float
    children: tuple = ()
    prior: float = 0.0

    def detail(self) -> str:
        return _fmt(tau=self.tau) + (f", bm25_prior={self.prior:g}" if self.prior else "")

    def run(self, st: ExecState) -> Occurrences:
        occ = token_sims(st.snapshot, st.inputs(self, Candidates))
        sims = occ.sim_s
        if self.prior:
            sims = sims + self.prior * block_prior(st, self, occ.seg, occ.s)
        score, logs = S.softmax_and_logs(sims, self.tau)
        return replace(occ, score=score, log_score=logs)


# -- aggregation ----------------------------------------------------------------------------


def _make_groups(keys: list, texts_of: Callable[[list[int]], list[str]], scores: np.ndarray,
                 n_tokens: np.ndarray, *, alpha: float = 0.0, top_n: int = 0,
                 logs: np.ndarray | None = None) -> list[Group]:
    """Answers from occurrences: per group the summed score (times ``n_tokens ** alpha``),
    the surface text of its best occurrence, and its members. With ``top_n``, only the
    ``top_n`` best groups are built (in first-seen order, as a stable sort expects).
    ``logs``: the scores' logarithms where some underflowed; groups whose sums did are
    ranked by their sums in log space (``Group.log_score``)."""
    gid, distinct = S.group_keys(keys)
    if not distinct:
        return []
    sums = np.bincount(gid, weights=scores, minlength=len(distinct))
    lsums = None if logs is None else S.group_log_sums(gid, len(distinct), logs)
    nt = n_tokens.tolist()
    if not alpha and top_n and top_n <= 32 and top_n < len(distinct):
        # the common ORDER BY score LIMIT n: rank groups by their sums, then find the
        # members and best occurrence of the n kept ones only
        keep = np.sort(S.rank_order(sums, lsums)[:top_n])
        members = [np.flatnonzero(gid == g) for g in keep.tolist()]
        best = [_best_of(m, scores, logs) for m in members]
        return [Group(distinct[g], t, float(sums[g]), nt[b], m, log_score=_log_of(lsums, g))
                for g, t, b, m in zip(keep.tolist(), texts_of(best), best, members)]
    # per group, best first (ties: first seen)
    by_score = np.lexsort((*S.rank_keys(scores, logs), gid))
    order = np.argsort(gid, kind="stable")         # per group, in occurrence order
    cuts = np.flatnonzero(np.diff(gid[order])) + 1
    lo = np.concatenate([[0], cuts])
    hi = np.concatenate([cuts, [len(order)]])
    best = by_score[lo]
    final, lfinal = sums, lsums
    if alpha:
        final = sums * (n_tokens[best].astype(np.float64) ** alpha)
        lfinal = None if lsums is None else lsums + alpha * np.log(n_tokens[best])
    keep = np.arange(len(distinct))
    if top_n and top_n < len(distinct):
        keep = np.sort(S.rank_order(final, lfinal)[:top_n])
    lo_l, hi_l, best_l, fin_l = lo.tolist(), hi.tolist(), best.tolist(), final.tolist()
    kept = keep.tolist()
    texts = texts_of([best_l[g] for g in kept])
    return [Group(distinct[g], t, fin_l[g], nt[best_l[g]], order[lo_l[g]:hi_l[g]],
                  log_score=_log_of(lfinal, g)) for g, t in zip(kept, texts)]


def _distinct_spans(occ: Occurrences, idx: np.ndarray, scores: np.ndarray,
                    logs: np.ndarray | None
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """``idx`` with one row per distinct (segment, start, end), its best-scored one, in
    occurrence order, and the summed scores (and their logs) of the rows each stands for.
    Token candidates widened to their words: the first and the last piece of
    "overcapitalization" are one occurrence of it, whose score is both pieces' (as the
    answer's is); its support and evidence count the word once."""
    if len(idx) < 2:
        return idx, scores[idx], None if logs is None else logs[idx]
    order = idx[np.argsort(-scores[idx], kind="stable")]
    rows = np.stack([occ.seg[order], occ.s[order], occ.e[order]], axis=1)
    _, first, inverse = np.unique(rows, axis=0, return_index=True, return_inverse=True)
    inverse = inverse.ravel()
    sums = np.zeros(len(first))
    np.add.at(sums, inverse, scores[order])
    lsums = None
    if logs is not None:
        lsums = np.full(len(first), -np.inf)
        np.logaddexp.at(lsums, inverse, logs[order])
    by_position = np.argsort(order[first])
    return (order[first][by_position], sums[by_position],
            None if lsums is None else lsums[by_position])


def _best_of(members: np.ndarray, scores: np.ndarray, logs: np.ndarray | None) -> int:
    """The best of a group's occurrences (ties: first seen)."""
    if logs is None:
        return int(members[np.argmax(scores[members])])
    return int(members[S.rank_order(scores[members], logs[members])[0]])


def _log_of(lsums: np.ndarray | None, g: int) -> float | None:
    return None if lsums is None else float(lsums[g])


@dataclass(frozen=True)
class Aggregate(Operator):
    """Group occurrences into answers; answer score = sum of scores * n_tokens ** alpha."""

    group_by: str = "phrase"
    alpha: float = 0.0
    children: tuple = ()
    top_n: int = 0  # > 0: build only the best top_n answers (planner: ORDER BY score LIMIT)
    # answers whose folded text fails this are left out before the top_n are chosen (the
    # planner's query-word filters, which read only the words of an answer's text: the
    # FilterAnswers above them then keep every answer they get)
    keep_text: Callable[[str], bool] | None = field(default=None, compare=False, repr=False)
    keep_describe: str = ""
    # with top_n: where an answer was found is asked too (:class:`FilterByOccurrence`'s
    # rules, asked with the query-word filters)
    rules: AnswerRules = field(default_factory=lambda: AnswerRules())
    # occurrences whose folded text fails this are left out before grouping: the
    # query-word filters of a grouping whose answers are not texts (documents)
    keep_occurrence: Callable[[str], bool] | None = field(default=None, compare=False,
                                                          repr=False)
    occurrence_describe: str = ""

    def detail(self) -> str:
        kept = "; ".join(d for d in (self.keep_describe, self.rules.describe()) if d)
        return _fmt(group_by=self.group_by, alpha=self.alpha) + (
            f", top_n={self.top_n}" if self.top_n else "") + (
            f" of those kept by: {kept}" if kept else "") + (
            f", occurrences kept by: {self.occurrence_describe}"
            if self.keep_occurrence is not None else "")

    def run(self, st: ExecState) -> Answers:
        occ = st.input(self, Occurrences)
        if self.group_by == "word" and occ.surfaces is None:  # shards widen their own
            occ = widen_to_words(st.snapshot, occ)
        sf = surfaces_of(st, occ)
        keys = sf.group_keys(self.group_by)
        scores, n_tokens = np.asarray(occ.score, np.float64), occ.e - occ.s + 1
        logs = occ.log_score
        keep = self._keep(st, occ)
        if keep is not None and not self.alpha and 0 < self.top_n <= 32 and \
                self.keep_occurrence is None:
            groups = self._top_kept(keys, sf.texts, scores, logs, n_tokens, st.info, keep)
        elif keep is None and self.keep_occurrence is None:
            st.info["answers"] = len(set(keys))
            groups = _make_groups(keys, sf.texts, scores, n_tokens, alpha=self.alpha,
                                  top_n=self.top_n, logs=logs)
        else:  # the occurrences kept only; group members back to occ's rows
            st.info["answers"] = len(set(keys))
            ok = np.ones(len(keys), dtype=bool)
            if self.keep_occurrence is not None:
                # each occurrence's text (a shard's own, where shards found them)
                ok[:] = [self.keep_occurrence(t) for t in sf.texts(list(range(len(keys))))]
            if keep is not None:
                ok &= self._kept(keys, scores, logs, keep)
            sel = np.flatnonzero(ok)
            groups = _make_groups([keys[i] for i in sel.tolist()],
                                  lambda idx: sf.texts(sel[np.asarray(idx, np.int64)].tolist()),
                                  scores[sel], n_tokens[sel], alpha=self.alpha,
                                  top_n=self.top_n, logs=None if logs is None else logs[sel])
            for g in groups:
                g.idx = sel[g.idx]
        if self.group_by == "document":
            for g in groups:
                g.text = sf.doc_id(*g.key)
        if self.group_by == "word":  # a word's pieces widen to one occurrence: count it once
            weights = scores.copy()  # an occurrence's evidence score: all of its pieces'
            log_weights = None if logs is None else np.asarray(logs, np.float64).copy()
            for g in groups:
                g.idx, summed, lsummed = _distinct_spans(occ, g.idx, scores, logs)
                weights[g.idx] = summed
                if log_weights is not None:
                    log_weights[g.idx] = lsummed
                g.weights, g.log_weights = weights, log_weights
        return Answers(groups, occ, st.info["answers"])

    def _keep(self, st: ExecState, occ: Occurrences
              ) -> Callable[[str, Callable[[], np.ndarray]], bool] | None:
        """The filters asked before the ``top_n`` are chosen, as one test of an answer's
        folded text and (asked for only when the text passes) its occurrences; None: no
        filter."""
        text, names = self.keep_text, (occurrence_check(st, occ, self.rules)
                                       if self.rules else None)
        if text is None and names is None:
            return None
        return lambda key, members: (text is None or bool(text(key))) and (
            names is None or names(members()))

    def _top_kept(self, keys: list, texts_of: Callable[[list[int]], list[str]],
                  scores: np.ndarray, logs: np.ndarray | None, n_tokens: np.ndarray,
                  info: dict, keep: Callable[[str, Callable[[], np.ndarray]], bool]
                  ) -> list[Group]:
        """The common ``ORDER BY score LIMIT n`` under answer filters, grouped once:
        answers ranked by summed score (ties: first seen), ``keep`` asked best first
        until ``top_n`` pass; they come back in first-seen order with their members and
        best occurrence, as :func:`_make_groups` builds them."""
        gid, distinct = S.group_keys(keys)
        info["answers"] = len(distinct)
        sums = np.bincount(gid, weights=scores, minlength=len(distinct))
        lsums = None if logs is None else S.group_log_sums(gid, len(distinct), logs)
        kept = sorted(self._best_kept(distinct, sums, lsums, gid, keep))
        members = [np.flatnonzero(gid == g) for g in kept]
        best = [_best_of(m, scores, logs) for m in members]
        return [Group(distinct[g], t, float(sums[g]), int(n_tokens[b]), m,
                      log_score=_log_of(lsums, g))
                for g, t, b, m in zip(kept, texts_of(best), best, members)]

    def _kept(self, keys: list, scores: np.ndarray, logs: np.ndarray | None,
              keep: Callable[[str, Callable[[], np.ndarray]], bool]) -> np.ndarray:
        """Per occurrence: is its answer kept by ``keep``? Ranked by summed score
        (alpha 0), only answers down to the ``top_n``-th kept one are looked at."""
        gid, distinct = S.group_keys(keys)
        ok = np.zeros(len(distinct), dtype=bool)
        if self.alpha or not self.top_n:
            ok[:] = [keep(k, lambda g=g: np.flatnonzero(gid == g))
                     for g, k in enumerate(distinct)]
            return ok[gid]
        n = len(distinct)
        ok[self._best_kept(distinct, np.bincount(gid, weights=scores, minlength=n),
                           None if logs is None else S.group_log_sums(gid, n, logs),
                           gid, keep)] = True
        return ok[gid]

    def _best_kept(self, distinct: list, sums: np.ndarray, lsums: np.ndarray | None,
                   gid: np.ndarray, keep: Callable[[str, Callable[[], np.ndarray]], bool]
                   ) -> list[int]:
        """The ``top_n`` best answers (by summed score, ties first seen) that ``keep``
        keeps, best first; ``keep`` is asked only down to the last of them."""
        kept: list[int] = []
        for g in S.rank_order(sums, lsums).tolist():
            if keep(distinct[g], lambda g=g: np.flatnonzero(gid == g)):
                kept.append(g)
                if len(kept) == self.top_n:
                    break
        return kept


@dataclass(frozen=True)
class ClassifyLabels(Operator):
    """score(label) = sum over candidates whose text is a label word of
    exp(sim_s/tau + sim_e/tau) (phrase) or exp(sim/tau) (token)."""

    labels: tuple[tuple[str, tuple[str, ...]], ...]
    tau: float
    mode: str = "phrase"
    children: tuple = ()
    # contextual calibration: each label's probability divided by ``prior`` (the label
    # probabilities of the content-free ``template``, run first), renormalised
    calibrate: bool = False
    template: str = ""
    prior: tuple[tuple[str, float], ...] = ()

    def detail(self) -> str:
        return _fmt(labels="{" + ", ".join(f"{l}: {list(w)}" for l, w in self.labels) + "}",
                    tau=self.tau) + (
            "" if not self.calibrate else
            f", calibrated by {self.template!r}" if self.template else ", calibrated")

    def run(self, st: ExecState) -> Answers:
        occ = st.input(self, Occurrences)
        # a candidate counts once for a label: words that fold alike ("great", "Great")
        # or repeat are one word (each added its candidates again: the label's score
        # doubled, and a decision could flip on how its words were spelt)
        word_to_labels: dict[str, list[str]] = {}
        for label, words in self.labels:
            for w in dict.fromkeys(fold(w) for w in words):
                word_to_labels.setdefault(w, []).append(label)
        logits = S.label_logits(occ.sim_s, occ.sim_e if self.mode == "phrase" else None,
                                self.tau)
        keys = surfaces_of(st, occ).keys()
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
            if len(idx):
                with np.errstate(over="ignore"):  # past exp's range: inf, ranked by its log
                    weights = np.exp(logits)
            else:
                weights = None
            g = Group(label, label, score=score, idx=idx, weights=weights,
                      log_weights=logits if len(idx) else None)
            g.log_score = log_score
            groups.append(g)
        logs = {g.text: g.log_score for g in groups}
        st.info["label_log_scores"] = logs
        if self.calibrate and not self.prior:  # said, not silent: the scores are plain
            st.info["calibrated"] = {
                "template": None, "skipped": "nothing precedes the sentence holding the "
                "mask: there is no content-free input to calibrate against"}
        if self.prior:
            prior = dict(self.prior)
            cal = calibrated_scores({g.text: g.score for g in groups}, prior, logs=logs)
            for g in groups:  # calibrated scores are ratios of probabilities: no log kept
                g.extra["uncalibrated"], g.score, g.log_score = g.score, cal[g.text], None
            st.info["calibrated"] = {"template": self.template,
                                     "prior": {t: round(v, 6) for t, v in prior.items()}}
        return Answers(groups, occ, len(groups))
