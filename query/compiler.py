"""Logical plan → physical plan, and running it.

MASKED, TOKENS, EVIDENCE and CLASSIFY compile to a :class:`~npmdb.query.spec.MaskedSpec`
or :class:`~npmdb.query.spec.ClassifySpec` plus the arguments of
:func:`~npmdb.query.planner.plan_masked` / :func:`~npmdb.query.planner.plan_classify`
(answer filter, order, and a tail of row operators ending in ``Project``): the same plans
``fill_mask`` and ``classify`` build. SEARCH and DOCUMENTS compile to small operator
chains (BM25Blocks → BlockRows, ScanDocuments). Every statement runs through the one
executor (:func:`npmdb.query.executor.execute`) over a context the caller opens. WHERE's
document terms become a :class:`~npmdb.query.spec.DocFilter` that the snapshot applies
during retrieval.

Expressions (WHERE, ORDER BY keys, select items) are compiled to functions of a row by
:mod:`npmdb.query.evaluate`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable

from . import ast as A
from . import logical as L
from .context import OpenContext
from .evaluate import Row, compile_condition, compile_expr
from .executor import execute
from .lexer import one_line
from .operators import BM25Blocks
from .physical import Answers, Operator
from .plan import Plan
from .planner import classify_prior, plan_classify, plan_masked
from .printer import expr_to_sql
from .rows import (
    BlockRows, EvidenceRows, FilterRows, LimitRows, OrderRows, Project, ScanDocuments,
)
from .spec import ClassifySpec, DocFilter, MaskedSpec
from .text import split_mask

__all__ = ["Compiled", "compile_plan", "show", "format_explain"]


# ================================================================ expressions


def _doc_filter(e: A.Expr, text: str) -> DocFilter:
    def make():
        pred = compile_condition(e, text)
        return lambda d: pred(_doc_row(d))
    return DocFilter.shared(expr_to_sql(e), make, statement=text)


# ================================================================ rows of each source

def _doc_row(d: Any) -> Row:
    return {"doc.id": d.id, "doc.title": d.title, "doc.text": d.text, "doc.meta": d.meta}


def _answer_row(g: Any) -> Row:
    return {"phrase": g.text, "score": float(g.score), "support": g.support,
            "tokens": g.n_tokens, "length": len(g.text.split()),
            "answer_score": float(g.score)}  # EVIDENCE's name for the answer's score


def _output_row(g: Any, snap: Any, rank: int) -> Row:
    row = _answer_row(g)
    ev = g.evidence[0] if g.evidence else None
    row.update({
        "rank": rank, "version": snap.manifest.id, "generation": snap.generation,
        "evidence": [dataclasses.asdict(x) for x in g.evidence],
        "start": ev.start if ev else None, "end": ev.end if ev else None,
        "snippet": ev.snippet if ev else None,
        "doc.id": ev.doc_id if ev else None, "doc.title": ev.title if ev else None,
    })
    return row


_ANSWER_ORDER = {("phrase",): "phrase", ("score",): "score", ("support",): "support",
                 ("tokens",): "tokens", ("length",): "words"}


def _answer_order(keys: tuple[L.OrderKey, ...]) -> tuple[tuple[str, bool], ...]:
    out = []
    for k in keys:
        e = k.expr
        if isinstance(e, A.Call) and e.name == "length":
            col = "words"
        else:
            col = _ANSWER_ORDER[e.parts]  # the binder admits nothing else
        out.append((col, k.descending))
    return tuple(out)


# ================================================================ compiled statements

@dataclass
class Compiled:
    """A SELECT ready to run: ``spec`` + ``plan_args`` (MASKED/TOKENS/EVIDENCE/CLASSIFY) or
    a row operator chain (SEARCH/DOCUMENTS), or nothing (LIMIT 0)."""

    logical: L.Node
    source: str
    columns: tuple[str, ...]
    spec: MaskedSpec | ClassifySpec | None = None
    plan_args: dict = field(default_factory=dict)
    rows_root: Operator | None = None
    query: str = ""
    version: int | str | None = None
    doc_filter: DocFilter | None = None

    def physical(self) -> Plan | None:
        """The physical plan (a fresh one: plans record their last run)."""
        if isinstance(self.spec, MaskedSpec):
            return plan_masked(self.spec, **self.plan_args)
        if isinstance(self.spec, ClassifySpec):
            return plan_classify(self.spec, **self.plan_args)
        if self.rows_root is not None:
            return Plan(self.rows_root, kind="rows", query=self.query)
        return None

    def run(self, open_context: OpenContext) -> Any:
        """Run over the version the statement reads, in a context ``open_context`` opens."""
        from .result import Result

        if self.spec is not None:
            split_mask(self.spec.text)  # fail fast on a query without exactly one mask
        plan = self.physical()
        with open_context(self.version, self.doc_filter) as ctx:
            if plan is None:  # LIMIT 0
                snap = ctx.require()
                return Result((), query=self.query, version=snap.manifest.id,
                              generation=snap.generation, columns=self.columns, rows=())
            if isinstance(self.spec, ClassifySpec) and self.spec.calibrate:
                prior = classify_prior(self.spec, lambda p: execute(p, ctx))
                plan = plan_classify(self.spec, prior=prior, **self.plan_args)
            res = execute(plan, ctx)
        if res.columns is None:
            return dataclasses.replace(res, columns=self.columns, rows=())
        return res


def compile_plan(plan: L.Node, text: str) -> Compiled:
    """Turn an optimized logical plan (see :func:`npmdb.query.rules.optimize`) into a
    :class:`Compiled` statement. ``text`` is the query, for positioned errors."""
    nodes = L.chain(plan)
    project = nodes[0]
    assert isinstance(project, L.Project)
    columns = tuple(i.name for i in project.items)
    leaf = nodes[-1]
    if isinstance(leaf, L.Empty):
        return Compiled(plan, leaf.source, columns, version=leaf.version)
    doc_filter = _doc_filter(leaf.doc_filter, text) if leaf.doc_filter is not None else None
    fns = [compile_expr(i.expr, text) for i in project.items]
    if leaf.source in ("SEARCH", "DOCUMENTS"):
        return _compile_rows(plan, nodes, columns, fns, doc_filter, text)
    return _compile_answers(plan, nodes, columns, fns, doc_filter, text)


def _row_ops(nodes: list[L.Node], text: str) -> list[Operator]:
    """Row-level Filter/Order/Limit nodes (bottom-up) as operators."""
    ops: list[Operator] = []
    for n in reversed(nodes):
        if isinstance(n, L.Filter) and n.level == "row":
            ops.append(FilterRows(expr_to_sql(n.condition), compile_condition(n.condition, text)))
        elif isinstance(n, L.Order) and n.level == "row":
            ops.append(OrderRows(tuple((expr_to_sql(k.expr), compile_expr(k.expr, text),
                                        k.descending, getattr(k.expr, "pos", None) or 0)
                                       for k in n.keys), text))
        elif isinstance(n, L.Limit) and n.level == "row":
            ops.append(LimitRows(n.count, n.offset))
    return ops


def _stack(ops: list[Operator]) -> Operator:
    op = ops[0]
    for nxt in ops[1:]:
        op = dataclasses.replace(nxt, children=(op,))
    return op


def _project(columns: tuple[str, ...], fns: list[Callable[[Row], Any]]) -> Project:
    return Project(columns, lambda rows, _snap: [tuple(f(r) for f in fns) for r in rows.rows])


def _compile_rows(plan, nodes, columns, fns, doc_filter, text) -> Compiled:
    leaf: L.Retrieve = nodes[-1]
    docs = doc_filter.describe if doc_filter else ""
    if leaf.source == "SEARCH":
        base = [BM25Blocks(leaf.blocks or L.DEFAULT_LIMIT["SEARCH"], docs=docs), BlockRows()]
    else:
        base = [ScanDocuments(leaf.stop_after, docs=docs)]
    root = _stack(base + _row_ops(nodes, text) + [_project(columns, fns)])
    return Compiled(plan, leaf.source, columns, rows_root=root, query=leaf.query,
                    version=leaf.version, doc_filter=doc_filter)


def _compile_answers(plan, nodes, columns, fns, doc_filter, text) -> Compiled:
    leaf: L.Retrieve = nodes[-1]
    kw: dict[str, Any] = {"mode": leaf.mode, "retrieval": leaf.method, "k": leaf.k,
                          "blocks": leaf.blocks, "exact": leaf.exact, "version": leaf.version,
                          "doc_filter": doc_filter, "evidence": 0,
                          "bm25_title": leaf.bm25_title, "bm25_question": leaf.bm25_question}
    plan_args: dict[str, Any] = {}
    labels = None
    expand: L.Evidence | None = None
    for n in nodes:
        if isinstance(n, L.Assemble):
            kw.update(max_len=n.max_len, clean_edges=n.clean_edges)
            if leaf.source != "CLASSIFY":
                kw["no_stopwords"] = n.no_stopwords
        elif isinstance(n, L.Score):
            kw["tau"] = n.tau
            if n.scoring != "softmax" and leaf.source != "CLASSIFY":
                kw["scoring"] = n.scoring
            if leaf.source != "CLASSIFY":
                kw["bm25_prior"] = n.prior
        elif isinstance(n, L.Aggregate):
            kw.update(group_by=n.group_by, alpha=n.alpha, not_in_query=n.not_in_query,
                      no_query_words=n.no_query_words, not_subject_name=n.not_subject_name,
                      whole_names=n.whole_names)
        elif isinstance(n, L.Classify):
            labels, kw["tau"], kw["calibrate"] = n.labels, n.tau, n.calibrate
        elif isinstance(n, L.Filter) and n.level == "answer":
            pred = compile_condition(n.condition, text)
            plan_args["answer_filter"] = (expr_to_sql(n.condition), lambda g: pred(_answer_row(g)))
        elif isinstance(n, L.Top):
            plan_args["order"] = _answer_order(n.keys)
            kw.update(top=n.count or 0, offset=n.offset)
        elif isinstance(n, L.Order) and n.level == "answer":
            plan_args["order"] = _answer_order(n.keys)
        elif isinstance(n, L.Evidence):
            kw["evidence"] = n.per_answer
            if n.expand:
                expand = n
    if leaf.source == "CLASSIFY":
        spec: MaskedSpec | ClassifySpec = ClassifySpec(leaf.query, labels, **kw)
    else:
        spec = MaskedSpec(leaf.query, **kw)
    offset = spec.offset
    if expand is not None:
        tail = [EvidenceRows(expand.per_answer, offset)] + _row_ops(nodes, text) + \
            [_project(columns, fns)]
    else:
        def make(ans: Answers, snap: Any) -> list[tuple]:
            return [tuple(f(row) for f in fns) for row in
                    (_output_row(g, snap, offset + i + 1) for i, g in enumerate(ans.groups))]
        tail = [Project(columns, make)]
    plan_args["tail"] = tuple(tail)
    return Compiled(plan, leaf.source, columns, spec=spec, plan_args=plan_args, query=leaf.query,
                    version=leaf.version, doc_filter=doc_filter)


# ================================================================ SHOW and EXPLAIN

def show(versions: list[dict[str, Any]], what: str) -> Any:
    """SHOW VERSIONS (one row per version, oldest first) / SHOW TAGS (tag, version), from
    the version history (``ExecContext.history()``)."""
    from .result import Result

    if what == "VERSIONS":
        columns = ("id", "time", "parent", "tags", "docs", "tokens", "segments", "generation",
                   "head", "message")
        rows = tuple(tuple(",".join(v[c]) if c == "tags" else v[c] for c in columns)
                     for v in versions)
    else:
        columns = ("tag", "version")
        rows = tuple(sorted((t, v["id"]) for v in versions for t in v["tags"]))
    head = next((v for v in versions if v["head"]), None)
    return Result((), query=f"SHOW {what}", version=head["id"] if head else None,
                  generation=head["generation"] if head else None, columns=columns, rows=rows)


def format_explain(logical: L.Node, physical: str, notes: list[str], total: str = "") -> str:
    """EXPLAIN's text: the logical plan (after the rules), the physical plan, the rules
    that applied; every plan one node a line, indented under its parent."""
    def block(title: str, body: str) -> list[str]:
        return [title] + ["  " + line for line in body.splitlines()]

    lines = block("logical plan:", L.explain(logical))
    lines += block("physical plan:", physical or "(nothing to run)")
    if total:
        lines.append("  " + total)
    lines += block("rules applied:", "\n".join(map(one_line, notes)) if notes else "(none)")
    return "\n".join(lines)
