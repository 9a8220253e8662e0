"""Rewrite rules over a logical plan (:mod:`npmdb.query.logical`), one function each.

Every rule takes the plan and returns ``(plan, note)``: the rewritten plan and a one-line
note of what it did, or the plan unchanged and ``None`` when it did not apply. Rules never
mutate: plans are frozen. :func:`optimize` runs them in :data:`RULES` order and returns the
notes that EXPLAIN prints under "rules applied".

WHERE is split at its top-level ANDs. A conjunct over document columns only (``doc.id``,
``doc.title``, ``doc.text``, ``doc.meta.<field>``) restricts retrieval; one over answer
columns filters answers before ORDER BY/LIMIT; on EVIDENCE and SEARCH, one over occurrence
or block columns filters output rows. A conjunct that mixes document columns with other
columns (``doc.title = 'X' OR phrase = 'Y'``) cannot restrict retrieval: on MASKED, TOKENS
and CLASSIFY it has no meaning for an answer drawn from many documents and raises
:class:`NotSupportedError` (write the conditions as separate AND terms); on EVIDENCE,
SEARCH and DOCUMENTS every row has one document, so it filters rows after retrieval.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from npmdb.errors import InternalError, NotSupportedError

from . import ast as A
from .lexer import line_col
from .logical import (
    DEFAULT_LIMIT, EVIDENCE_ANSWER_LEVEL, Empty, Evidence, Filter, Limit, Node, Order, Project,
    Retrieve, Top, chain, unchain,
)
from .printer import expr_to_sql

__all__ = [
    "RULES", "optimize", "choose_exact_scan", "push_document_predicates",
    "split_answer_predicates", "default_limit", "fold_limit_into_top", "fold_limit_into_retrieval",
    "limit_zero", "conjuncts", "columns_of",
]

Rule = Callable[[Node, str], "tuple[Node, str | None]"]


# ---------------------------------------------------------------- helpers

def conjuncts(e: A.Expr) -> list[A.Expr]:
    """The top-level AND terms of ``e`` (nested ANDs flattened)."""
    if isinstance(e, A.BoolOp) and e.op == "AND":
        out: list[A.Expr] = []
        for o in e.operands:
            out.extend(conjuncts(o))
        return out
    return [e]


def conjoin(terms: list[A.Expr]) -> A.Expr | None:
    if not terms:
        return None
    return terms[0] if len(terms) == 1 else A.BoolOp("AND", tuple(terms), pos=terms[0].pos)


def columns_of(e: A.Expr) -> set[tuple[str, ...]]:
    """Canonical column paths an expression reads."""
    return {n.parts for n in A.walk(e) if isinstance(n, A.Name)}


def _is_doc(path: tuple[str, ...]) -> bool:
    return path[0] == "doc"


def _source(nodes: list[Node]) -> str:
    leaf = nodes[-1]
    return leaf.source if isinstance(leaf, (Retrieve, Empty)) else ""


def _index(nodes: list[Node], cls: type, **match) -> int | None:
    for i, n in enumerate(nodes):
        if isinstance(n, cls) and all(getattr(n, k) == v for k, v in match.items()):
            return i
    return None



def _not_supported(text: str, e: A.Expr, message: str) -> NotSupportedError:
    line, col = line_col(text, e.pos or 0)
    lines = text.splitlines() or [""]
    caret = ""
    if 1 <= line <= len(lines):
        caret = "\n  " + lines[line - 1] + "\n  " + " " * (col - 1) + "^"
    return NotSupportedError(f"{message} (line {line}, column {col}){caret}")


# ---------------------------------------------------------------- rules

def choose_exact_scan(plan: Node, text: str = "") -> tuple[Node, str | None]:
    """``USING exact`` is dense retrieval by an exact scan over the stored vectors."""
    nodes = chain(plan)
    leaf = nodes[-1]
    if not (isinstance(leaf, Retrieve) and leaf.method == "exact"):
        return plan, None
    nodes[-1] = replace(leaf, method="dense", exact=True)
    return unchain(nodes), "choose_exact_scan: USING exact → dense retrieval with exact=true"


def push_document_predicates(plan: Node, text: str = "") -> tuple[Node, str | None]:
    """Document conjuncts of WHERE become the retrieval's document filter, so retrieval
    (BM25's document set, the dense search's oversampling, the exact scan's mask, the
    DOCUMENTS scan) only ever sees allowed documents."""
    nodes = chain(plan)
    i = _index(nodes, Filter, level="where")
    if i is None:
        return plan, None
    f = nodes[i]
    doc_terms, rest, mixed = [], [], []
    for term in conjuncts(f.condition):
        cols = columns_of(term)
        docs = {c for c in cols if _is_doc(c)}
        if docs and docs != cols:
            if _source(nodes) in ("MASKED", "TOKENS", "CLASSIFY"):
                other = sorted(".".join(c) for c in cols - docs)
                raise _not_supported(
                    text, term,
                    f"this condition mixes document columns ({', '.join(sorted('.'.join(c) for c in docs))}) "
                    f"with {', '.join(other)}: an answer comes from many documents, so document "
                    "conditions restrict retrieval and must stand alone as AND terms of WHERE")
            mixed.append(term)  # rows (occurrences, blocks, documents) carry their document
            rest.append(term)
            continue
        (doc_terms if docs else rest).append(term)
    if not doc_terms:
        if mixed:
            return plan, (f"push_document_predicates: {expr_to_sql(conjoin(mixed))} mixes "
                          "document and row columns: evaluated on rows")
        return plan, None
    leaf = nodes[-1]
    old = [leaf.doc_filter] if leaf.doc_filter is not None else []
    pushed = conjoin(old + doc_terms)
    nodes[-1] = replace(leaf, doc_filter=pushed)
    remaining = conjoin(rest)
    if remaining is None:
        del nodes[i]
    else:
        nodes[i] = replace(f, condition=remaining)
    note = (f"push_document_predicates: {expr_to_sql(conjoin(doc_terms))} → Retrieve "
            "(restricts retrieval)")
    if mixed:
        note += (f"; {expr_to_sql(conjoin(mixed))} mixes document and row columns: evaluated "
                 "on rows")
    return unchain(nodes), note


def split_answer_predicates(plan: Node, text: str = "") -> tuple[Node, str | None]:
    """What WHERE keeps after the document terms: on MASKED/TOKENS/CLASSIFY it filters
    answers (before ORDER BY/LIMIT); on EVIDENCE the answer terms (phrase, support,
    answer_score) filter answers and the rest filters occurrence rows; on SEARCH it
    filters rows."""
    nodes = chain(plan)
    i = _index(nodes, Filter, level="where")
    if i is None:
        return plan, None
    f = nodes[i]
    source = _source(nodes)
    if source in ("MASKED", "TOKENS", "CLASSIFY"):
        nodes[i] = replace(f, level="answer")
        return unchain(nodes), (f"split_answer_predicates: {expr_to_sql(f.condition)} → "
                                "Filter[answer]")
    if source == "EVIDENCE":
        answer, rows = [], []
        for term in conjuncts(f.condition):
            (answer if columns_of(term) <= EVIDENCE_ANSWER_LEVEL else rows).append(term)
        del nodes[i]
        notes = []
        if answer:
            nodes.insert(i, replace(f, condition=conjoin(answer), level="answer"))
            notes.append(f"{expr_to_sql(conjoin(answer))} → Filter[answer]")
        if rows:
            j = _index(nodes, Evidence)
            nodes.insert(j, replace(f, condition=conjoin(rows), level="row"))
            notes.append(f"{expr_to_sql(conjoin(rows))} → Filter[row] over occurrences")
        return unchain(nodes), "split_answer_predicates: " + "; ".join(notes)
    nodes[i] = replace(f, level="row")
    return unchain(nodes), f"split_answer_predicates: {expr_to_sql(f.condition)} → Filter[row]"


def default_limit(plan: Node, text: str = "") -> tuple[Node, str | None]:
    """MASKED, TOKENS and EVIDENCE keep 5 answers (fill_mask's ``top``) and SEARCH 10
    blocks (db.search's ``limit``) unless LIMIT says otherwise; CLASSIFY keeps every
    label and DOCUMENTS every document."""
    nodes = chain(plan)
    source = _source(nodes)
    n = DEFAULT_LIMIT.get(source)
    if n is None:
        return plan, None
    level = "row" if source == "SEARCH" else "answer"
    i = _index(nodes, Limit, level=level)
    if i is not None:
        if nodes[i].count is not None:
            return plan, None
        nodes[i] = replace(nodes[i], count=n)
    else:
        j = _index(nodes, Order, level="answer") if level == "answer" else 1
        nodes.insert(j, Limit(n, 0, level, nodes[j]))
    return unchain(nodes), f"default_limit: no LIMIT on {source} → LIMIT {n}"


def limit_zero(plan: Node, text: str = "") -> tuple[Node, str | None]:
    """LIMIT 0 returns no rows without running anything."""
    nodes = chain(plan)
    i = next((i for i, n in enumerate(nodes) if isinstance(n, (Limit, Top)) and n.count == 0), None)
    if i is None:
        return plan, None
    leaf = nodes[-1]
    empty = Empty("LIMIT 0", _source(nodes), getattr(leaf, "version", None))
    return unchain([nodes[0], empty]), "limit_zero: LIMIT 0 → nothing to run"


def fold_limit_into_top(plan: Node, text: str = "") -> tuple[Node, str | None]:
    """ORDER BY and LIMIT over answers become one Top: the engine orders the answers and
    keeps ``count`` after ``offset`` (fill_mask's ``top`` and ``offset``)."""
    nodes = chain(plan)
    i = _index(nodes, Limit, level="answer")
    if i is None or not isinstance(nodes[i + 1], Order) or nodes[i + 1].level != "answer":
        return plan, None
    lim, order = nodes[i], nodes[i + 1]
    nodes[i:i + 2] = [Top(order.keys, lim.count, lim.offset, order.child)]
    keys = ", ".join(str(k) for k in order.keys)
    n = "ALL" if lim.count is None else lim.count
    return unchain(nodes), f"fold_limit_into_top: ORDER BY {keys} LIMIT {n} OFFSET {lim.offset} → Top"


def fold_limit_into_retrieval(plan: Node, text: str = "") -> tuple[Node, str | None]:
    """SEARCH asks BM25 for LIMIT + OFFSET blocks; a DOCUMENTS scan without ORDER BY stops
    after LIMIT + OFFSET documents.

    SEARCH's rows are its best blocks by BM25. Where the rows are filtered or ordered by
    something else before the LIMIT, the LIMIT cannot say how many blocks to take: it
    takes the default 10 (db.search's) or LIMIT + OFFSET when that is more, so a LIMIT
    returns the first rows of the same query without it."""
    nodes = chain(plan)
    leaf = nodes[-1]
    if not isinstance(leaf, Retrieve) or leaf.source not in ("SEARCH", "DOCUMENTS"):
        return plan, None
    i = _index(nodes, Limit, level="row")
    if i is None or nodes[i].count is None:
        return plan, None
    n = nodes[i].count + nodes[i].offset
    reshaped = any(isinstance(x, (Order, Filter)) for x in nodes[i + 1:-1])
    if leaf.source == "SEARCH":
        if reshaped:
            n = max(n, DEFAULT_LIMIT["SEARCH"])
        if leaf.blocks == n:
            return plan, None
        nodes[-1] = replace(leaf, blocks=n)
        why = " (rows filtered or reordered first)" if reshaped else ""
        return unchain(nodes), f"fold_limit_into_retrieval: BM25 retrieves blocks={n}{why}"
    if reshaped or leaf.stop_after == n:
        return plan, None
    nodes[-1] = replace(leaf, stop_after=n)
    return unchain(nodes), f"fold_limit_into_retrieval: the document scan stops after {n}"


#: The rules, in the order they run.
RULES: tuple[Rule, ...] = (
    choose_exact_scan,
    push_document_predicates,
    split_answer_predicates,
    default_limit,
    limit_zero,
    fold_limit_into_top,
    fold_limit_into_retrieval,
)


def optimize(plan: Node, text: str = "") -> tuple[Node, list[str]]:
    """Run every rule once, in order; returns the plan and the notes of the rules that
    applied. ``text`` is the query, for positioned errors."""
    notes: list[str] = []
    for rule in RULES:
        plan, note = rule(plan, text)
        if note:
            notes.append(note)
    if not isinstance(plan, Project):  # pragma: no cover - every plan is projected
        raise InternalError("a logical plan must have Project at its root")
    return plan, notes
