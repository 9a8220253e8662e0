"""Syntax tree → logical plan: what a SELECT asks for, resolved and checked, before any
choice of operators.

A logical plan is a chain of frozen dataclasses, the root first and one leaf
(:class:`Retrieve`, or :class:`Empty`) at the bottom::

    Project → [Evidence] → Limit|Top → Order → [Filter] → Aggregate|Classify → Score
      → [Assemble] → Retrieve

:func:`npmdb.query.binder.build` makes one from a syntax tree (resolving and checking
every name against the scopes defined here: what each source offers). The rewrite
rules (:mod:`npmdb.query.rules`) then move predicates and limits; :mod:`.compiler` turns the
result into a spec and physical operators. :func:`explain` prints a plan, one node a line.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from . import ast as A
from .lexer import one_line, quote_string
from .printer import expr_to_sql
from .spec import MaskedSpec

__all__ = [
    "Node", "Retrieve", "Assemble", "Score", "Aggregate", "Classify", "Filter", "Order",
    "Limit", "Top", "Evidence", "Project", "Empty", "OrderKey", "ProjectItem",
    "explain", "chain", "unchain", "SOURCES", "FUNCTIONS", "column_names",
    "DEFAULT_LIMIT",
]

#: Source kinds, named as in queries.
SOURCES = {A.Masked: "MASKED", A.Classify: "CLASSIFY", A.Evidence: "EVIDENCE",
           A.Search: "SEARCH", A.Documents: "DOCUMENTS"}

#: LIMIT when none is written (MASKED/EVIDENCE as fill_mask's ``top``, SEARCH as db.search).
DEFAULT_LIMIT = {"MASKED": MaskedSpec.top, "TOKENS": MaskedSpec.top, "EVIDENCE": MaskedSpec.top,
                 "SEARCH": 10}

#: Scalar functions: name → (min args, max args, what it takes).
FUNCTIONS: dict[str, tuple[int, int, str]] = {
    "length": (1, 1, "length(text): number of words"),
    "lower": (1, 1, "lower(text)"),
    "upper": (1, 1, "upper(text)"),
    "abs": (1, 1, "abs(number)"),
    "round": (1, 2, "round(number[, digits])"),
    "coalesce": (1, 16, "coalesce(value, ...)"),
}
_AGGREGATES = ("count", "sum", "avg", "min", "max")


# ================================================================ nodes

@dataclass(frozen=True)
class Node:
    """Base: unary nodes have ``child``; :class:`Retrieve` and :class:`Empty` are leaves."""

    @property
    def name(self) -> str:
        return type(self).__name__

    def detail(self) -> str:
        return ""

    def describe(self) -> str:
        d = self.detail()
        return f"{self.name} ({d})" if d else self.name


@dataclass(frozen=True)
class Retrieve(Node):
    """Candidates from the corpus: the leaf of every plan.

    ``source`` MASKED/TOKENS/CLASSIFY/EVIDENCE (masked-span retrieval), SEARCH (BM25
    blocks) or DOCUMENTS (a scan). ``doc_filter`` is a predicate over ``doc.*`` columns
    that restricts retrieval itself.
    """

    source: str
    query: str = ""
    method: str = "dense"          # dense | bm25 | hybrid | exact | scan
    mode: str = "phrase"
    k: int | None = None
    blocks: int | None = None
    exact: bool = False
    version: int | str | None = None
    doc_filter: A.Expr | None = None
    stop_after: int | None = None  # DOCUMENTS: a LIMIT folded into the scan
    bm25_title: bool = True        # BM25 matches the document titles too
    bm25_question: bool = False    # BM25 searches only the question before the mask

    def detail(self) -> str:
        parts = [self.source]
        if self.source not in ("DOCUMENTS",):
            exact = self.exact and self.method in ("dense", "hybrid")
            parts.append(self.method + (" (exact scan)" if exact else ""))
        if self.source not in ("SEARCH", "DOCUMENTS"):
            parts.append(f"mode={self.mode}")
        if self.k is not None and self.method in ("dense", "hybrid", "exact"):
            parts.append(f"k={self.k}")
        if self.blocks is not None and self.method in ("bm25", "hybrid"):
            parts.append(f"blocks={self.blocks}")
            if not self.bm25_title:
                parts.append("bm25_title=false")
            if self.bm25_question:
                parts.append("bm25_question=true")
        if self.query:
            parts.append("query=" + quote_string(self.query))
        if self.version is not None:
            parts.append(f"as_of={self.version!r}")
        if self.doc_filter is not None:
            parts.append("docs: " + expr_to_sql(self.doc_filter))
        if self.stop_after is not None:
            parts.append(f"stop_after={self.stop_after}")
        return ", ".join(parts)


@dataclass(frozen=True)
class Assemble(Node):
    """Phrase mode: spans from candidate starts forward and ends backward."""

    max_len: int
    clean_edges: bool
    no_stopwords: bool
    child: Node

    def detail(self) -> str:
        return (f"max_len={self.max_len}, clean_edges={_b(self.clean_edges)}, "
                f"no_stopwords={_b(self.no_stopwords)}")


@dataclass(frozen=True)
class Score(Node):
    """Exact similarities and NPM's span score (``npm``/``raw``), or token mode's softmax."""

    tau: float
    scoring: str  # npm | raw | softmax (token mode)
    child: Node
    prior: float = 0.0  # bm25_prior: the weight of each block's BM25 text score

    def detail(self) -> str:
        return f"{self.scoring}, tau={self.tau}" + \
            (f", bm25_prior={self.prior:g}" if self.prior else "")


@dataclass(frozen=True)
class Aggregate(Node):
    group_by: str
    alpha: float
    child: Node
    not_in_query: bool = True      # drop answers that are a run of the query's words
    no_query_words: bool = True    # drop answers holding a non-stopword of the query
    not_subject_name: bool = True  # drop answers only found as names of the query's subject
    whole_names: bool = True  # drop answers only found as part of a longer name

    def detail(self) -> str:
        return f"group_by={self.group_by}, alpha={self.alpha}" + (
            "" if self.not_in_query else ", not_in_query=false") + (
            "" if self.no_query_words else ", no_query_words=false") + (
            "" if self.not_subject_name else ", not_subject_name=false") + (
            "" if self.whole_names else ", whole_names=false")


@dataclass(frozen=True)
class Classify(Node):
    labels: tuple[tuple[str, tuple[str, ...]], ...]
    tau: float
    child: Node
    calibrate: bool = False   # contextual calibration against the template's label prior

    def detail(self) -> str:
        labels = ", ".join(f"{n}: [{', '.join(quote_string(w) for w in ws)}]" for n, ws in self.labels)
        return (f"labels={{{labels}}}, tau={self.tau}"
                + (", calibrate=true" if self.calibrate else ""))


@dataclass(frozen=True)
class Filter(Node):
    """``level``: ``where`` (as written, before the rules), ``answer`` (on grouped
    answers) or ``row`` (on output rows: occurrences, blocks)."""

    condition: A.Expr
    level: str
    child: Node

    @property
    def name(self) -> str:
        return f"Filter[{self.level}]"

    def detail(self) -> str:
        return expr_to_sql(self.condition)


@dataclass(frozen=True)
class OrderKey:
    expr: A.Expr
    descending: bool = False

    def __str__(self) -> str:
        return expr_to_sql(self.expr) + (" DESC" if self.descending else " ASC")


@dataclass(frozen=True)
class Order(Node):
    """``level`` ``answer`` (sorts answers before LIMIT) or ``row``."""

    keys: tuple[OrderKey, ...]
    level: str
    child: Node

    @property
    def name(self) -> str:
        return f"Order[{self.level}]"

    def detail(self) -> str:
        return ", ".join(str(k) for k in self.keys)


@dataclass(frozen=True)
class Limit(Node):
    """``count`` None = no limit; ``level`` ``answer`` or ``row``."""

    count: int | None
    offset: int
    level: str
    child: Node

    @property
    def name(self) -> str:
        return f"Limit[{self.level}]"

    def detail(self) -> str:
        return ("all" if self.count is None else str(self.count)) + f", offset={self.offset}"


@dataclass(frozen=True)
class Top(Node):
    """ORDER BY + LIMIT on answers, folded: the engine keeps the best ``count``."""

    keys: tuple[OrderKey, ...]
    count: int | None
    offset: int
    child: Node

    def detail(self) -> str:
        n = "all" if self.count is None else str(self.count)
        return ", ".join(str(k) for k in self.keys) + f", limit={n}, offset={self.offset}"


@dataclass(frozen=True)
class Evidence(Node):
    """Occurrences behind the answers: attached to each (``expand`` False, at most
    ``per_answer``), or one output row each (``expand`` True; ``per_answer`` 0 = all)."""

    per_answer: int
    expand: bool
    child: Node

    @property
    def name(self) -> str:
        return "Occurrences" if self.expand else "AttachEvidence"

    def detail(self) -> str:
        return f"per_answer={self.per_answer or 'all'}"


@dataclass(frozen=True)
class ProjectItem:
    name: str
    expr: A.Expr

    def __str__(self) -> str:
        text = expr_to_sql(self.expr)
        return text if text == self.name else f"{text} AS {self.name}"


@dataclass(frozen=True)
class Project(Node):
    items: tuple[ProjectItem, ...]
    child: Node

    def detail(self) -> str:
        return ", ".join(str(i) for i in self.items)


@dataclass(frozen=True)
class Empty(Node):
    """Nothing to run (LIMIT 0); ``source`` and ``version`` are kept for the result."""

    reason: str
    source: str = ""
    version: int | str | None = None

    def detail(self) -> str:
        return self.reason


def chain(node: Node) -> list[Node]:
    """The nodes from the root down to the leaf."""
    out = [node]
    while hasattr(out[-1], "child"):
        out.append(out[-1].child)
    return out


def unchain(nodes: list[Node]) -> Node:
    """Rebuild a plan from a root-to-leaf list (each node's ``child`` relinked)."""
    node = nodes[-1]
    for n in reversed(nodes[:-1]):
        node = replace(n, child=node)
    return node


def explain(node: Node) -> str:
    """The plan, one node a line, children indented under their parent."""
    return "\n".join("  " * d + ("-> " if d else "") + one_line(n.describe())
                     for d, n in enumerate(chain(node)))


def _b(v: bool) -> str:
    return "true" if v else "false"



# ================================================================ scopes

_TEXT, _NUM, _BOOL, _ANY = "text", "number", "boolean", None

# Per source: column as written → (canonical path, static type).
_DOC = {"doc_id": (("doc", "id"), _TEXT), "title": (("doc", "title"), _TEXT)}
_ANSWER = {
    "phrase": (("phrase",), _TEXT), "text": (("phrase",), _TEXT), "label": (("phrase",), _TEXT),
    "score": (("score",), _NUM), "support": (("support",), _NUM),
    "tokens": (("tokens",), _NUM), "length": (("length",), _NUM),
}
_AFTER_LIMIT = {
    "evidence": (("evidence",), _ANY), "start": (("start",), _NUM), "end": (("end",), _NUM),
    "snippet": (("snippet",), _TEXT), "rank": (("rank",), _NUM),
    "version": (("version",), _NUM), "generation": (("generation",), _NUM),
}
_SCOPES: dict[str, dict[str, tuple[tuple[str, ...], str | None]]] = {
    "MASKED": {**_ANSWER, **_AFTER_LIMIT, **_DOC},
    "EVIDENCE": {
        "phrase": (("phrase",), _TEXT), "label": (("phrase",), _TEXT), "text": (("text",), _TEXT),
        "score": (("score",), _NUM), "answer_score": (("answer_score",), _NUM),
        "support": (("support",), _NUM), "rank": (("rank",), _NUM),
        "start": (("start",), _NUM), "end": (("end",), _NUM), "snippet": (("snippet",), _TEXT),
        "tokens": (("tokens",), _NUM), "length": (("length",), _NUM),
        "version": (("version",), _NUM), "generation": (("generation",), _NUM), **_DOC,
    },
    "SEARCH": {
        "block": (("block",), _NUM), "score": (("score",), _NUM), "snippet": (("snippet",), _TEXT),
        "start": (("start",), _NUM), "end": (("end",), _NUM), "text": (("text",), _TEXT),
        "version": (("version",), _NUM), "generation": (("generation",), _NUM), **_DOC,
    },
    "DOCUMENTS": {
        "id": (("doc", "id"), _TEXT), "title": (("doc", "title"), _TEXT),
        "text": (("doc", "text"), _TEXT), "meta": (("doc", "meta"), _ANY),
        "doc_id": (("doc", "id"), _TEXT),
        "version": (("version",), _NUM), "generation": (("generation",), _NUM),
    },
}
_SCOPES["CLASSIFY"] = _SCOPES["MASKED"]
_SCOPES["TOKENS"] = _SCOPES["MASKED"]
_DOC_FIELDS = {"id": _TEXT, "title": _TEXT, "text": _TEXT, "meta": _ANY}
#: Columns known while answers are filtered (before LIMIT), for MASKED/TOKENS/CLASSIFY.
ANSWER_LEVEL = frozenset(p for p, _ in _ANSWER.values())
#: EVIDENCE columns that belong to the answer rather than to one occurrence.
EVIDENCE_ANSWER_LEVEL = frozenset({("phrase",), ("support",), ("answer_score",)})

#: ``SELECT *`` per source.
_STAR = {
    "MASKED": ("phrase", "score", "support"), "TOKENS": ("phrase", "score", "support"),
    "CLASSIFY": ("label", "score", "support"),
    "EVIDENCE": ("phrase", "doc_id", "title", "start", "end", "snippet", "score"),
    "SEARCH": ("doc_id", "title", "block", "score", "snippet"),
    "DOCUMENTS": ("id", "title", "text", "meta"),
}


def column_names(source: str) -> tuple[str, ...]:
    """The columns a source offers (as written in queries)."""
    return tuple(_SCOPES[source])
