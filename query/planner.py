"""From a query spec to a physical plan (``fill_mask``, ``classify`` and SQL share it).

    [tail: EvidenceRows, Project ...] → [AttachEvidence] → Limit → OrderBy → [FilterAnswers]
      → Aggregate|ClassifyLabels → ScoreSpans|ScoreTokens → AssembleSpans
      → retrieval (DenseTopK×2 | ExactTopK×2 | BM25Blocks→BlockTokens) → EncodeQuery

and ``search``'s Project → BlockRows → BM25Blocks (SQL's SEARCH source without WHERE).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Sequence

from .answers import Aggregate, AssembleSpans, ClassifyLabels, ScoreSpans, ScoreTokens
from .tail import AttachEvidence, FilterAnswers, Limit, OrderBy
from .answer_rules import AnswerRules, FilterByOccurrence
from .operators import BlockTokens, BM25Blocks, DenseTopK, EncodeQuery, ExactTopK
from .physical import Operator
from . import calibration
from .plan import Plan
from .result import Result
from .rows import BlockRows, Project
from .spec import ClassifySpec, MaskedSpec
from .text import STOPWORDS, fold, query_content_words, query_ngrams, words_of

__all__ = ["plan_masked", "plan_classify", "classify_prior", "plan_search", "SEARCH_COLUMNS"]

#: ``Database.search``'s keys, in order.
SEARCH_COLUMNS = ("doc_id", "title", "block", "score", "snippet")


def stopword_labels(spec) -> bool:
    """True if a label of a classify spec starts or ends with a stopword ("yes", "no"):
    the clean candidates and the ANN indexes hold no such word, so retrieval must look at
    every word (an exact scan for dense retrieval; EXPLAIN shows ``words: any``)."""
    if not isinstance(spec, ClassifySpec):
        return False
    edges = [(ws[0], ws[-1]) for _, words in spec.labels for w in words
             if (ws := fold(w).split())]
    return any(a in STOPWORDS or b in STOPWORDS for a, b in edges)


def _retrieval(spec, sides: tuple[str, ...], any_word: bool) -> Operator:
    enc = EncodeQuery(spec.mode)
    docs = spec.doc_filter.describe if spec.doc_filter is not None else ""
    dense: list[Operator] = []
    if spec.retrieval in ("dense", "hybrid"):
        if spec.exact or any_word:
            dense = [ExactTopK(side, spec.k, children=(enc,), docs=docs, any_word=any_word)
                     for side in sides]
        else:
            dense = [DenseTopK(side, spec.k, children=(enc,), docs=docs) for side in sides]
    lexical: list[Operator] = []
    if spec.retrieval in ("bm25", "hybrid"):
        bm25 = BM25Blocks(spec.blocks, docs=docs, title=spec.bm25_title,
                          question=spec.bm25_question, text_scores=_prior(spec) > 0)
        lexical = [BlockTokens(spec.mode, children=(bm25,), any_word=any_word)]
        if not dense:
            lexical = [BlockTokens(spec.mode, children=(bm25, enc), any_word=any_word)]
    return tuple(dense + lexical)  # type: ignore[return-value]


def _prior(spec) -> float:
    """The block prior's weight: a masked query's ``bm25_prior`` where BM25 retrieves
    blocks (dense retrieval has none; classify keeps NPM's label scores)."""
    if spec.retrieval == "dense":
        return 0.0
    return float(getattr(spec, "bm25_prior", 0.0))


def _candidates(spec) -> Operator:
    any_word = stopword_labels(spec)
    prior = _prior(spec)
    if spec.mode == "phrase":
        # label words are matched by their text, so a classify span may start or end on
        # any word when a label needs it
        return ScoreSpans(getattr(spec, "tau", 1.0), getattr(spec, "scoring", "npm"), children=(
            AssembleSpans(spec.max_len, spec.clean_edges and not any_word,
                          getattr(spec, "no_stopwords", False),
                          children=_retrieval(spec, ("start", "end"), any_word)),),
            prior=prior)
    return ScoreTokens(spec.tau, children=_retrieval(spec, ("token",), any_word), prior=prior)


def _wrap(op: Operator, tail: Sequence[Operator]) -> Operator:
    """Stack ``tail`` operators (built without children) on top of ``op``, first lowest."""
    for t in tail:
        op = replace(t, children=(op,))
    return op


def _all_of(checks: list[Callable[[str], bool]]) -> Callable[[str], bool]:
    return lambda text: all(f(text) for f in checks)


def plan_masked(spec: MaskedSpec, *, answer_filter: tuple[str, Callable] | None = None,
                order: tuple[tuple[str, bool], ...] = (("score", True),),
                tail: Sequence[Operator] = ()) -> Plan:
    group_by = "word" if spec.mode == "token" and spec.group_by == "word" else spec.group_by
    # the query-word filters read only the words of an answer's text
    text_filters: list[tuple[str, Callable[[str], bool]]] = []
    if spec.not_in_query:
        grams = query_ngrams(spec.text, spec.max_len)
        text_filters.append(("phrase not in the query", lambda t: words_of(t) not in grams))
    if spec.no_query_words:
        content = query_content_words(spec.text)
        text_filters.append(("no word of the query",
                             lambda t: content.isdisjoint(words_of(t).split())))
    # Top-N pushdown: when answers are only ranked by score and cut, Aggregate builds just
    # the best top + offset of them (every occurrence is still grouped and summed). The
    # query-word filters then run in Aggregate on the grouping keys (a folded text has the
    # words of its answer's text) before the best are chosen, and so do the rules on where
    # an answer was found (not_subject_name, whole_names); FilterAnswers above keeps what it
    # gets. Without the pushdown, FilterByOccurrence runs after the order, down to the limit.
    rules = AnswerRules(spec.text if spec.not_subject_name else "", spec.whole_names)
    # a document is no text: its occurrences' texts are filtered before they are grouped
    by_occurrence = group_by == "document" and bool(text_filters)
    pushdown = bool(spec.top) and answer_filter is None and tuple(order) == (("score", True),) \
        and (not text_filters or group_by in ("phrase", "word"))
    keep = _all_of([f for _, f in text_filters]) if pushdown and text_filters else None
    described = "; ".join(d for d, _ in text_filters)
    op: Operator = Aggregate(group_by, spec.alpha, children=(_candidates(spec),),
                             top_n=spec.top + spec.offset if pushdown else 0, keep_text=keep,
                             keep_describe=described if keep else "",
                             rules=rules if pushdown else AnswerRules(),
                             keep_occurrence=_all_of([f for _, f in text_filters])
                             if by_occurrence else None,
                             occurrence_describe=described if by_occurrence else "")
    for describe, f in (() if by_occurrence else text_filters):
        op = FilterAnswers(describe, lambda g, f=f: f(g.text), children=(op,))
    if answer_filter is not None:
        op = FilterAnswers(answer_filter[0], answer_filter[1], children=(op,))
    op = OrderBy(order, children=(op,))
    if rules and not pushdown:  # after the order: it checks only what the limit keeps
        op = FilterByOccurrence(rules, spec.top + spec.offset if spec.top else 0,
                                children=(op,))
    op = Limit(spec.top, spec.offset, children=(op,))
    if spec.evidence:
        op = AttachEvidence(spec.evidence, children=(op,))
    return Plan(_wrap(op, tail), kind="masked", query=spec.text)


def classify_prior(spec: ClassifySpec, run: Callable[[Plan], Result]
                   ) -> tuple[str, tuple[tuple[str, float], ...]] | None:
    """For ``spec.calibrate``: the content-free template (the sentence holding the mask)
    and its label probabilities, its plan run by ``run`` over the same version and
    documents; None when not calibrating or when nothing precedes that sentence."""
    template = calibration.content_free(spec.text) if spec.calibrate else None
    if template is None:
        return None
    res = run(plan_classify(replace(spec, text=template, calibrate=False, evidence=0, top=0,
                                    offset=0)))
    probs = calibration.probabilities({a.text: a.score for a in res.answers},
                                      logs=res.info.get("label_log_scores"))
    return template, tuple(probs.items())


def plan_classify(spec: ClassifySpec, *, answer_filter: tuple[str, Callable] | None = None,
                  order: tuple[tuple[str, bool], ...] = (("score", True),),
                  tail: Sequence[Operator] = (),
                  prior: tuple[str, tuple[tuple[str, float], ...]] | None = None) -> Plan:
    """``prior``: :func:`classify_prior`'s template and label probabilities (calibration)."""
    template, probs = prior if prior is not None else ("", ())
    op: Operator = ClassifyLabels(spec.labels, spec.tau, spec.mode, children=(_candidates(spec),),
                                  calibrate=spec.calibrate, template=template, prior=probs)
    if answer_filter is not None:
        op = FilterAnswers(answer_filter[0], answer_filter[1], children=(op,))
    op = OrderBy(order, children=(op,))
    if spec.top or spec.offset:
        op = Limit(spec.top, spec.offset, children=(op,))
    if spec.evidence:
        op = AttachEvidence(spec.evidence, children=(op,))
    return Plan(_wrap(op, tail), kind="classify", query=spec.text)


def _search_row(r: dict) -> tuple:
    return (r["doc.id"], r["doc.title"], r["block"], r["score"], r["snippet"])


def plan_search(text: str, limit: int, *, title: bool = False) -> Plan:
    """``Database.search``: the top ``limit`` blocks by BM25, one row each
    (:data:`SEARCH_COLUMNS`), as SQL's SEARCH source runs them; ``title``: match the
    document titles too."""
    rows = BlockRows(children=(BM25Blocks(limit, title=title),))
    return Plan(Project(SEARCH_COLUMNS, lambda rows, _snap: [_search_row(r) for r in rows.rows],
                        children=(rows,)), kind="rows", query=text)
