"""``Database.sql``: one statement from text to a :class:`~npmdb.result.Result`.

    text → tokens → syntax tree (parser) → bound tree (:func:`bind`) → logical plan
      (:func:`npmdb.query.binder.build`) → rewrite rules (:func:`npmdb.query.rules.optimize`)
      → physical operators (:func:`npmdb.query.compiler.compile_plan`) → executor

MASKED/TOKENS/EVIDENCE/CLASSIFY run the plan :mod:`npmdb.query.planner` builds for
``fill_mask``/``classify`` (plus a Project, and for EVIDENCE occurrence rows, on top)
through the same executor, so a statement and the equivalent call return the same
answers. The caller passes ``open_context(version_ref, doc_filter=None)``, a context
manager yielding the :class:`~npmdb.query.context.ExecContext` of a version; this module
never sees the database itself. SHOW reads the version history from that context.

**Parameters** are values, never text: ``?`` (bound from a sequence, in text order) and
``:name`` (from a mapping) become Literal nodes of the tree. A list or tuple bound to a
parameter inside ``IN (...)`` expands to its items; a mapping bound to CLASSIFY's labels
parameter gives the labels (``{'positive': ['great', 'awesome'], ...}``). A missing,
surplus or unusable value is a ProgrammingError naming the parameter.

**Sources and columns** (``*`` in brackets):

- MASKED(q) / TOKENS(q) (token mode) — one row per answer: [phrase, score, support],
  tokens (token count), length (words), rank, evidence (list of dicts), doc_id, title,
  start, end, snippet (of the best occurrence), version, generation; ``text`` and
  ``label`` are the phrase. ``LIMIT`` defaults to 5 (fill_mask's ``top``).
- CLASSIFY(q, LABELS(...)) — one row per label: [label, score, support], same columns.
  Every label unless LIMIT.
- EVIDENCE(q) — one row per occurrence of the best answers (LIMIT and OFFSET count the
  occurrence rows; the answers expanded are the top 5, or LIMIT + OFFSET when that is
  more; ``WITH evidence = n`` keeps n occurrences per answer; see GRAMMAR.md):
  [phrase, doc_id, title, start, end, snippet, score], text (the occurrence), tokens,
  length, support, rank, answer_score, version, generation.
- SEARCH(text) — BM25 over blocks, as ``db.search``: [doc_id, title, block, score,
  snippet], start, end, text. LIMIT defaults to 10.
- DOCUMENTS — [id, title, text, meta], ``meta.<field>``, version, generation.

WHERE on every source reads ``doc.id``, ``doc.title``, ``doc.text`` and
``doc.meta.<field>`` (nested fields allowed; missing ones are NULL); rows of EVIDENCE,
SEARCH and DOCUMENTS can select them too, answers only doc.id and doc.title (of their
best occurrence).

**WHERE** splits at its top-level ANDs. Terms over document columns only restrict
retrieval itself (a DocFilter: BM25 searches the allowed documents, dense search
oversamples until k allowed candidates, the exact scan masks, the DOCUMENTS scan skips),
so LIMIT still fills where the corpus allows. Other terms filter answers before ORDER BY
and LIMIT (phrase, score, support, tokens, length), or on EVIDENCE/SEARCH rows after
retrieval. A term mixing document and answer columns under OR raises NotSupportedError on
MASKED/TOKENS/CLASSIFY; on row sources it filters rows. Expressions: comparisons, LIKE
(case-insensitive; ``%``, ``_``), IN, BETWEEN, IS NULL, AND/OR/NOT (three-valued),
``+ - * /``, and ``length`` (words), ``lower``, ``upper``, ``abs``, ``round``,
``coalesce``. ``=`` on text is exact, and text sorts in character order. Integers, literal
or computed, are 64-bit and floats finite; a row's value that cannot be used (text compared
with a number, an overflow) is a :class:`~npmdb.errors.QueryDataError` naming the row.

**Options**: ``USING dense(k) | bm25(blocks) | hybrid(k, blocks) | exact(k)`` (exact =
dense with an exact scan) and ``WITH`` any of mode, k, blocks, max_len, tau, alpha, exact,
scoring, clean_edges, no_stopwords, evidence, bm25_title, bm25_question, bm25_prior,
not_in_query, no_query_words, not_subject_name, whole_names (CLASSIFY: no alpha, scoring,
no_stopwords, bm25_prior, not_in_query, no_query_words, not_subject_name, whole_names;
calibrate, CLASSIFY only); an option the retrieval or mode does not use (``k`` with bm25,
``blocks`` with dense, ``max_len`` in token mode) is an error. ``GROUP BY phrase | tokens | document | word``; ``AS OF`` a version id or
tag. Answers are ordered by score, support, phrase, tokens, length or length(phrase)
(a name, an alias or a select-list position); rows of the other sources by any expression.
``LIMIT 0`` returns no rows without running.

**EXPLAIN** returns one row per line (column ``plan``) and the same text in
``Result.plan``: the logical plan after the rules, the physical plan (``Plan.explain``),
and the rules that applied, each plan one node a line, indented under its parent.
``EXPLAIN ANALYZE`` runs the statement first and adds rows and milliseconds per operator
and a total.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from npmdb.errors import Error, InternalError, ProgrammingError

from . import ast as A
from .compiler import compile_plan, format_explain, show
from .context import OpenContext
from .lexer import error_at, in_int64
from .binder import build
from .printer import expr_to_sql
from .parser import parse
from .rules import optimize

__all__ = ["execute", "bind", "prepare"]


def execute(text: str, params: Any, open_context: OpenContext) -> Any:
    """Run one statement of the query language over the versions ``open_context`` opens."""
    try:
        return _execute(text, params, open_context)
    except Error:
        raise
    except RecursionError:
        raise ProgrammingError("query nested too deeply") from None
    except Exception as exc:  # a bug, never a user error
        raise InternalError(f"query failed: {type(exc).__name__}: {exc}") from exc


def prepare(text: str, params: Any = None):
    """Parse, bind, build, optimize and compile a SELECT (or EXPLAIN's SELECT), without a
    database: returns ``(statement, compiled, rule notes)``; ``compiled`` is None for SHOW."""
    stmt = bind(parse(text), params, text)
    if isinstance(stmt, A.Show):
        return stmt, None, []
    select = stmt.statement if isinstance(stmt, A.Explain) else stmt
    plan, notes = optimize(build(select, text), text)
    return stmt, compile_plan(plan, text), notes


def _execute(text: str, params: Any, open_context: OpenContext) -> Any:
    from .result import Result

    stmt, compiled, notes = prepare(text, params)
    if isinstance(stmt, A.Show):
        with open_context(None) as ctx:
            return show(ctx.history(), stmt.what)
    # every statement, EXPLAIN too, reports an unknown AS OF as the SELECT would
    _check_version(open_context, stmt.statement if isinstance(stmt, A.Explain) else stmt,
                   compiled, text)
    if not isinstance(stmt, A.Explain):
        return compiled.run(open_context)
    if stmt.analyze:
        res = compiled.run(open_context)
        total = f"total: {res.elapsed_ms:.2f} ms, {len(res.rows or ())} rows"
        physical = res.plan if compiled.spec is not None or compiled.rows_root is not None else ""
        plan_text = format_explain(compiled.logical, physical, notes, total)
        return Result(res.answers, query=text, version=res.version, generation=res.generation,
                      stats=res.stats, plan=plan_text, info={**res.info, "explain": True},
                      columns=("plan",),
                      rows=tuple((line,) for line in plan_text.splitlines()))
    physical = compiled.physical()
    if physical is not None:
        with open_context(None) as ctx:  # a sharded handle: the plan its shards would run
            if ctx.shards is not None:
                from .exchange import distribute

                physical = distribute(physical, ctx.shards)
    plan_text = format_explain(compiled.logical, physical.explain() if physical else "", notes)
    return Result((), query=text, plan=plan_text, info={"explain": True}, columns=("plan",),
                  rows=tuple((line,) for line in plan_text.splitlines()))


def _check_version(open_context: OpenContext, select: A.Select, compiled: Any,
                   text: str) -> None:
    """An unknown AS OF version or tag is reported at its place in the query."""
    if select.as_of is None:
        return
    try:
        with open_context(compiled.version):
            pass
    except ProgrammingError as exc:
        raise error_at(text, select.as_of.pos, str(exc)) from None


# ================================================================ binding

def _name(p: A.Param) -> str:
    return f":{p.name}" if p.name is not None else f"?{p.index}"


def bind(stmt: A.Statement, params: Any, text: str) -> A.Statement:
    """``stmt`` with every Param replaced by its value (a Literal at the parameter's
    position). Missing, surplus and unusable values raise ProgrammingError naming the
    parameter."""
    found = A.params(stmt)
    positional = [p for p in found if p.name is None]
    named = [p for p in found if p.name is not None]
    if params is None:
        if found:
            p = found[0]
            raise error_at(text, p.pos, f"no value for parameter {_name(p)}: the query has "
                           f"{len(found)} parameter{'s' if len(found) > 1 else ''}; pass "
                           "params=[...] for ? or params={...} for :name")
        return stmt
    if isinstance(params, Mapping):
        if positional:
            raise error_at(text, positional[0].pos, "positional parameter ? needs params as a "
                           "sequence (list or tuple), not a mapping")
        values: dict[Any, Any] = {}
        for k, v in params.items():
            if not isinstance(k, str):
                raise ProgrammingError(f"parameter names must be strings, got {k!r}")
            values[k[1:] if k.startswith(":") else k] = v
        wanted = {p.name for p in named}
        for p in named:
            if p.name not in values:
                raise error_at(text, p.pos, f"no value for parameter :{p.name}")
        unused = sorted(set(values) - wanted)
        if unused:
            raise ProgrammingError(
                f"unused parameter{'s' if len(unused) > 1 else ''} "
                f"{', '.join(':' + u for u in unused)} (the query has "
                f"{', '.join(':' + n for n in sorted(wanted)) or 'no named parameters'})")
        lookup = lambda p: values[p.name]  # noqa: E731
    elif isinstance(params, Sequence) and not isinstance(params, (str, bytes, bytearray)):
        if named:
            raise error_at(text, named[0].pos, f"named parameter :{named[0].name} needs params "
                           "as a mapping (dict), not a sequence")
        seq = list(params)
        if len(seq) < len(positional):
            p = positional[len(seq)]
            raise error_at(text, p.pos, f"no value for parameter ?{p.index} ({len(seq)} "
                           f"value{'s' if len(seq) != 1 else ''} given for {len(positional)} "
                           "parameters)")
        if len(seq) > len(positional):
            raise ProgrammingError(
                f"{len(seq)} parameter values given but the query has {len(positional)} "
                f"'?' parameter{'s' if len(positional) != 1 else ''}: value "
                f"{len(positional)} ({seq[len(positional)]!r:.60}) is unused")
        lookup = lambda p: seq[p.index]  # noqa: E731
    else:
        raise ProgrammingError(f"params must be a sequence (for ?) or a mapping (for :name), "
                               f"not {type(params).__name__}")
    return _Binder(text, lookup).node(_param_items_named(stmt))


def _param_items_named(stmt: A.Statement) -> A.Statement:
    """``stmt`` with each select item that holds a parameter named by its text (``?``,
    ``:name``, ``? + 1``) unless it has an alias: a column's name comes from the statement,
    never from the values bound to it."""
    select = stmt.statement if isinstance(stmt, A.Explain) else stmt
    if not isinstance(select, A.Select):
        return stmt
    cols = tuple(dataclasses.replace(it, alias=expr_to_sql(it.expr))
                 if it.alias is None and not isinstance(it.expr, (A.Star, A.Name))
                 and A.params(it.expr) else it for it in select.columns)
    if cols == select.columns:
        return stmt
    select = dataclasses.replace(select, columns=cols)
    return dataclasses.replace(stmt, statement=select) if isinstance(stmt, A.Explain) else select


class _Binder:
    def __init__(self, text: str, lookup) -> None:
        self.text = text
        self.lookup = lookup

    def literal(self, p: A.Param, v: Any) -> A.Literal:
        if hasattr(v, "item") and not isinstance(v, (str, bytes)) and callable(v.item):
            try:
                v = v.item()  # numpy scalars
            except Exception:  # noqa: BLE001 - not a scalar; reported below
                pass
        if v is None or isinstance(v, (bool, str)):
            return A.Literal(v, pos=p.pos)
        if isinstance(v, int):
            if not in_int64(v):
                raise error_at(self.text, p.pos, f"parameter {_name(p)} is out of range "
                               "(integers must fit in 64 bits)")
            return A.Literal(int(v), pos=p.pos)
        if isinstance(v, float):
            if not math.isfinite(v):
                raise error_at(self.text, p.pos, f"parameter {_name(p)} must be a finite "
                               f"number, got {v!r}")
            return A.Literal(v, pos=p.pos)
        if isinstance(v, (list, tuple)):
            raise error_at(self.text, p.pos, f"parameter {_name(p)} is a {type(v).__name__}: "
                           "a list binds only as the whole list of IN (?)")
        raise error_at(self.text, p.pos, f"parameter {_name(p)} has unsupported type "
                       f"{type(v).__name__}: use str, int, float, bool or None")

    def labels(self, p: A.Param) -> tuple[A.Label, ...]:
        v = self.lookup(p)
        if not isinstance(v, Mapping) or not v:
            raise error_at(self.text, p.pos, f"parameter {_name(p)} gives CLASSIFY's labels: "
                           "pass a non-empty dict of label -> word or list of words")
        out = []
        for name, words in v.items():
            if not isinstance(name, str) or not name:
                raise error_at(self.text, p.pos, f"label names must be non-empty strings, "
                               f"got {name!r}")
            ws = (words,) if isinstance(words, str) else words
            if not isinstance(ws, (list, tuple)) or not ws or \
                    not all(isinstance(w, str) for w in ws):
                raise error_at(self.text, p.pos, f"label {name!r} needs a word or a list of "
                               "words (strings)")
            out.append(A.Label(name, tuple(A.Literal(w, pos=p.pos) for w in ws), pos=p.pos))
        return tuple(out)

    def node(self, n: Any) -> Any:
        if isinstance(n, A.Param):
            return self.literal(n, self.lookup(n))
        if isinstance(n, tuple):
            return tuple(self.node(x) for x in n)
        if not isinstance(n, A.Node):
            return n
        if isinstance(n, A.Classify) and isinstance(n.labels, A.Param):
            return dataclasses.replace(n, query=self.node(n.query), labels=self.labels(n.labels))
        if isinstance(n, A.InList):
            items: list[A.Expr] = []
            for it in n.items:
                if isinstance(it, A.Param):
                    v = self.lookup(it)
                    if isinstance(v, (list, tuple)):
                        if not v:
                            raise error_at(self.text, it.pos, f"parameter {_name(it)} is an "
                                           "empty list: IN needs at least one value")
                        items.extend(self.literal(it, x) for x in v)
                        continue
                items.append(self.node(it))
            return dataclasses.replace(n, expr=self.node(n.expr), items=tuple(items))
        changes = {}
        for f in dataclasses.fields(n):
            if f.name == "pos" or not f.init:
                continue
            v = getattr(n, f.name)
            if isinstance(v, (A.Node, tuple)):
                nv = self.node(v)
                if nv is not v:
                    changes[f.name] = nv
        return dataclasses.replace(n, **changes) if changes else n
