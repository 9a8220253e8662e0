"""Binding: a syntax tree becomes a logical plan (:mod:`npmdb.query.logical`).

:func:`build` resolves every name against its source's scope (a "did you mean" for
unknown columns, options, ``USING`` arguments, ``GROUP BY`` keys and functions, positioned
with :func:`~npmdb.query.lexer.error_at`), checks option values, and writes names in one
canonical form: document columns as ``doc.id``, ``doc.title``, ``doc.text``, ``doc.meta``
and ``doc.meta.<field>...``; ``text``/``label`` of an answer as ``phrase``.
"""

from __future__ import annotations

import difflib
from dataclasses import fields, replace
from typing import Any, Iterable, NoReturn

from npmdb.errors import ProgrammingError

from . import ast as A
from .lexer import error_at
from .logical import (
    _AGGREGATES, _BOOL, _DOC_FIELDS, _NUM, _SCOPES, _STAR, _TEXT, ANSWER_LEVEL, DEFAULT_LIMIT, FUNCTIONS, SOURCES, Aggregate,
    Assemble, Classify, Evidence, Filter, Limit, Node, Order, OrderKey, Project, ProjectItem,
    Retrieve, Score,
)
from .printer import expr_to_sql
from .spec import GROUPS, MODES, SCORINGS, ClassifySpec, MaskedSpec, masked_retrieval

__all__ = ["build"]



def _fail(text: str, node: Any, message: str, expected: Iterable[str] = ()) -> NoReturn:
    raise error_at(text, getattr(node, "pos", None) or 0, message, tuple(expected))


def _hint(word: str, candidates: Iterable[str]) -> str:
    close = difflib.get_close_matches(word.lower(), list(candidates), n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


class _Binder:
    def __init__(self, stmt: A.Select, text: str) -> None:
        self.stmt = stmt
        self.text = text
        src = stmt.source
        self.source = "TOKENS" if isinstance(src, A.Masked) and src.tokens else SOURCES[type(src)]
        self.scope = _SCOPES[self.source]

    def fail(self, node: Any, message: str, expected: Iterable[str] = ()) -> NoReturn:
        _fail(self.text, node, message, expected)

    # ------------------------------------------------------------ names

    def resolve(self, e: A.Expr, where: str) -> A.Expr:
        """``e`` with names in canonical form; checks names, functions and simple types.
        ``where``: "select", "where" or "order" (MASKED limits what WHERE may use)."""
        if isinstance(e, A.Name):
            return A.Name(self.column(e, where), pos=e.pos)
        if isinstance(e, A.Call):
            return self.call(e, where)
        if isinstance(e, A.Star):
            self.fail(e, "'*' is only allowed as a whole select item", ("an expression",))
        if isinstance(e, A.Param):  # pragma: no cover - bound before
            self.fail(e, "unbound parameter")
        kids = {}
        for f in fields(e):
            if f.name == "pos" or not f.init:
                continue
            v = getattr(e, f.name)
            if isinstance(v, A.Node):
                kids[f.name] = self.resolve(v, where)
            elif isinstance(v, tuple):
                kids[f.name] = tuple(self.resolve(x, where) if isinstance(x, A.Node) else x for x in v)
        out = replace(e, **kids) if kids else e
        self.check_types(out)
        return out

    def column(self, n: A.Name, where: str) -> tuple[str, ...]:
        parts = n.parts
        head = parts[0]
        if head.lower() == "doc" and len(parts) > 1:
            return self.doc_column(n, parts[1:], where)
        if self.source == "DOCUMENTS" and head.lower() == "meta" and len(parts) > 1:
            return ("doc", "meta") + parts[1:]
        key = head.lower() if head.lower() in self.scope else head
        if key not in self.scope or len(parts) > 1:
            if key in self.scope:
                self.fail(n, f"column {key} has no field {parts[1]!r}")
            cands = sorted(set(self.scope) | {"doc.id", "doc.title", "doc.meta"})
            self.fail(n, f"unknown column {'.'.join(parts)!r} in {self.source}"
                      + _hint(".".join(parts), cands), cands)
        path, _ = self.scope[key]
        if where == "where" and self.source in ("MASKED", "TOKENS", "CLASSIFY") and \
                path[0] != "doc" and path not in ANSWER_LEVEL:
            self.fail(n, f"{key} is not known when answers are filtered (only after LIMIT); "
                         "WHERE can use " + ", ".join(sorted({"phrase", "label", "score", "support",
                                                               "tokens", "length"}))
                      + " and document columns (doc.id, doc.title, doc.meta.<field>)")
        if where == "order" and self.source in ("MASKED", "TOKENS", "CLASSIFY") and \
                path not in ANSWER_LEVEL:
            self.fail(n, f"answers cannot be ordered by {key}; ORDER BY takes score, support, "
                         "phrase, tokens or length")
        return path

    def doc_column(self, n: A.Name, rest: tuple[str, ...], where: str) -> tuple[str, ...]:
        f = rest[0].lower()
        if f not in _DOC_FIELDS or (len(rest) > 1 and f != "meta"):
            cands = ["doc.id", "doc.title", "doc.text", "doc.meta"]
            self.fail(n, f"unknown document column {'.'.join(n.parts)!r}"
                      + _hint("doc." + rest[0], cands), cands)
        if self.source in ("MASKED", "TOKENS", "CLASSIFY") and where != "where" and \
                f in ("text", "meta"):
            self.fail(n, f"doc.{f} is not a column of {self.source} answers (an answer comes "
                         "from many documents); filter on it in WHERE, or browse occurrences "
                         "with EVIDENCE(...)")
        if self.source in ("MASKED", "TOKENS", "CLASSIFY") and where == "order":
            self.fail(n, "answers cannot be ordered by a document column; ORDER BY takes "
                         "score, support, phrase, tokens or length")
        return ("doc", f) + rest[1:]

    def call(self, c: A.Call, where: str) -> A.Expr:
        if c.name in _AGGREGATES:
            why = ("answers are already grouped (support counts their occurrences)"
                   if self.source in ("MASKED", "TOKENS", "CLASSIFY", "EVIDENCE") else
                   "db.count() counts documents; db.stats() has documents, blocks and tokens"
                   if self.source == "DOCUMENTS" else
                   "SEARCH ranks blocks; LIMIT sets how many")
            self.fail(c, f"aggregate function {c.name}() is not supported: {why}")
        if c.name not in FUNCTIONS:
            self.fail(c, f"unknown function {c.name}()" + _hint(c.name, FUNCTIONS),
                      tuple(f"{f}()" for f in FUNCTIONS))
        lo, hi, usage = FUNCTIONS[c.name]
        if not lo <= len(c.args) <= hi:
            self.fail(c, f"{c.name}() takes {lo if lo == hi else f'{lo} to {hi}'} argument"
                         f"{'' if lo == hi == 1 else 's'}: {usage}")
        if where == "order" and self.source in ("MASKED", "TOKENS", "CLASSIFY"):
            if not (c.name == "length" and isinstance(c.args[0], A.Name)
                    and self.column(c.args[0], where) == ("phrase",)):
                self.fail(c, "answers can be ordered by score, support, phrase, tokens, length "
                             "or length(phrase)")
        args = tuple(self.resolve(a, where) for a in c.args)
        out = A.Call(c.name, args, pos=c.pos)
        self.check_types(out)
        return out

    # ------------------------------------------------------------ static types

    def type_of(self, e: A.Expr) -> str | None:
        if isinstance(e, A.Literal):
            return {"string": _TEXT, "integer": _NUM, "float": _NUM, "boolean": _BOOL}.get(e.kind)
        if isinstance(e, A.Name):
            p = e.parts
            if p[0] == "doc":
                return _DOC_FIELDS.get(p[1]) if len(p) == 2 else None
            for path, t in self.scope.values():
                if path == p:
                    return t
            return None
        if isinstance(e, A.Call):
            if e.name == "length":
                return _NUM
            if e.name in ("lower", "upper"):
                return _TEXT
            if e.name in ("abs", "round"):
                return _NUM
            return None
        if isinstance(e, (A.BoolOp, A.Like, A.InList, A.Between, A.IsNull)):
            return _BOOL
        if isinstance(e, A.UnaryOp):
            return _BOOL if e.op == "NOT" else _NUM
        if isinstance(e, A.BinaryOp):
            return _BOOL if e.op in A.COMPARISON_OPS else _NUM
        return None

    def check_types(self, e: A.Expr) -> None:
        t = self.type_of
        if isinstance(e, A.BinaryOp) and e.op in A.ARITHMETIC_OPS:
            for side in (e.left, e.right):
                if t(side) not in (_NUM, None):
                    self.fail(side, f"{e.op} needs numbers, not {t(side)} ({expr_to_sql(side)})")
        elif isinstance(e, A.UnaryOp) and e.op == "-" and t(e.operand) not in (_NUM, None):
            self.fail(e.operand, f"'-' needs a number, not {t(e.operand)}")
        elif isinstance(e, A.BinaryOp) and e.op in ("<", "<=", ">", ">="):
            self._comparable(e, e.left, e.right)
        elif isinstance(e, A.Between):
            self._comparable(e, e.expr, e.low)
            self._comparable(e, e.expr, e.high)
        elif isinstance(e, A.Like) and t(e.pattern) not in (_TEXT, None):
            self.fail(e.pattern, f"LIKE needs a text pattern, not {t(e.pattern)}")
        elif isinstance(e, (A.BoolOp, A.UnaryOp)) and (isinstance(e, A.BoolOp) or e.op == "NOT"):
            for o in (e.operands if isinstance(e, A.BoolOp) else (e.operand,)):
                self.condition(o)
        elif isinstance(e, A.Call):
            want = {"length": _TEXT, "lower": _TEXT, "upper": _TEXT, "abs": _NUM, "round": _NUM}
            for a in e.args:
                if e.name in want and t(a) not in (want[e.name], None):
                    self.fail(a, f"{e.name}() takes {want[e.name]}, not {t(a)}")

    def _comparable(self, e: A.Expr, a: A.Expr, b: A.Expr) -> None:
        ta, tb = self.type_of(a), self.type_of(b)
        if ta and tb and ta != tb and not {ta, tb} <= {_NUM, _BOOL}:
            self.fail(e, f"cannot compare {ta} with {tb}: {expr_to_sql(e)}")

    def condition(self, e: A.Expr) -> None:
        if self.type_of(e) not in (_BOOL, None):
            self.fail(e, f"expected a condition, found {self.type_of(e)} {expr_to_sql(e)}")

    # ------------------------------------------------------------ clauses

    def select_items(self) -> tuple[ProjectItem, ...]:
        items: list[ProjectItem] = []
        for it in self.stmt.columns:
            if isinstance(it.expr, A.Star):
                named = [(col, A.Name(self.scope[col][0], pos=it.pos))
                         for col in _STAR[self.source]]
            else:
                named = [(it.alias or (".".join(it.expr.parts) if isinstance(it.expr, A.Name)
                                       else expr_to_sql(it.expr)),
                          self.resolve(it.expr, "select"))]
            for name, expr in named:
                if any(p.name == name for p in items):  # a row is a dict: one would be lost
                    star = f" ('*' is {', '.join(_STAR[self.source])})" \
                        if isinstance(it.expr, A.Star) else ""
                    self.fail(it, f"two select items are named {name!r}{star}; a result row "
                                  "holds one value a name: rename one with AS")
                items.append(ProjectItem(name, expr))
        return tuple(items)

    def order_keys(self) -> tuple[OrderKey, ...]:
        keys = []
        aliases = {it.alias: it for it in self.stmt.columns if it.alias}
        folded = {a.lower(): it for a, it in reversed(aliases.items())}  # as column names
        for o in self.stmt.order_by:
            e = o.expr
            if isinstance(e, A.Literal) and e.kind == "integer":
                cols = self.stmt.columns
                if not 1 <= e.value <= len(cols) or isinstance(cols[e.value - 1].expr, A.Star):
                    self.fail(e, f"ORDER BY {e.value}: no such select item (the select list "
                                 f"has {len(cols)}, and a '*' item cannot be named by position)")
                e = cols[e.value - 1].expr
            elif isinstance(e, A.Name) and len(e.parts) == 1 and (
                    e.parts[0] in aliases or e.parts[0].lower() in folded):
                # the output column wins over a source column of the same name (as in
                # SQL: ORDER BY names what the result shows); an alias, like a column
                # name, is found whatever its case
                e = (aliases.get(e.parts[0]) or folded[e.parts[0].lower()]).expr
            if isinstance(e, A.Literal):
                self.fail(o, "ORDER BY a constant orders nothing; name a column")
            if self.source in ("MASKED", "TOKENS", "CLASSIFY") and \
                    not isinstance(e, (A.Name, A.Call)):
                self.fail(e, "answers are ordered by a column, not an expression: ORDER BY "
                             "takes score, support, phrase, tokens, length or length(phrase), "
                             "each ASC or DESC")
            keys.append(OrderKey(self.resolve(e, "order"), o.descending))
        return tuple(keys)

    def count(self, e: A.Expr | None, clause: str) -> int | None:
        if e is None:
            return None
        if not isinstance(e, A.Literal) or e.kind != "integer" or e.value < 0:
            self.fail(e, f"{clause} takes a non-negative integer, got {_value(e)}",
                      ("a non-negative integer",))
        return int(e.value)

    def as_of(self) -> int | str | None:
        e = self.stmt.as_of
        if e is None:
            return None
        if isinstance(e, A.Literal) and e.kind == "string":
            return e.value
        if isinstance(e, A.Literal) and e.kind == "integer" and 0 <= e.value < 2 ** 63:
            return int(e.value)
        self.fail(e, f"AS OF takes a version id or a tag, got {_value(e)}",
                  ("a version (string or integer)",))

    def query_text(self, e: A.Expr, what: str, masked: bool) -> str:
        if not (isinstance(e, A.Literal) and e.kind == "string"):
            self.fail(e, f"{what} takes a string, got {_value(e)}", ("a string",))
        if masked:
            from .text import split_mask

            try:
                split_mask(e.value)
            except ProgrammingError as exc:
                self.fail(e, str(exc))
        return e.value

    def labels(self, labels: Any) -> tuple[tuple[str, tuple[str, ...]], ...]:
        out = []
        for lab in labels:
            words = []
            for w in lab.words:
                if not (isinstance(w, A.Literal) and w.kind == "string") or not w.value.strip():
                    self.fail(w, f"label {lab.name!r} takes non-empty strings, got {_value(w)}",
                              ("a string",))
                words.append(w.value)
            out.append((lab.name, tuple(words)))
        return tuple(out)

    # ------------------------------------------------------------ options

    def options(self) -> dict[str, Any]:
        """USING and WITH merged into spec field values (validated, positioned errors)."""
        s = self.stmt
        opts: dict[str, Any] = {}
        where: dict[str, A.Node] = {}
        masked_like = self.source in ("MASKED", "TOKENS", "EVIDENCE", "CLASSIFY")
        if s.using is not None:
            if not masked_like:
                self.fail(s.using, f"{self.source} takes no USING clause"
                          + (" (it always ranks blocks by BM25)" if self.source == "SEARCH" else ""))
            method = s.using.method
            opts["retrieval"] = method
            where["retrieval"] = s.using
            allowed = _USING_ARGS[method]
            for a in s.using.args:
                if a.name not in allowed:
                    others = [m for m, names in _USING_ARGS.items() if a.name in names]
                    msg = f"{method}() takes no argument {a.name!r}"
                    msg += (f" ({a.name} belongs to {', '.join(others)})" if others
                            else _hint(a.name, allowed))
                    self.fail(a, msg, tuple(f"{x} =>" for x in allowed))
                opts[a.name] = self.option_value(a)
                where[a.name] = a
        known = _WITH_OPTIONS[self.source]
        for o in s.options:
            if o.name not in known:
                if not known:
                    self.fail(o, f"{self.source} takes no WITH options")
                clause = _CLAUSE_FOR.get(o.name)
                msg = f"unknown option {o.name!r} for {self.source}"
                msg += f" (write {clause} instead)" if clause else _hint(o.name, known)
                self.fail(o, msg, tuple(known))
            if o.name in opts:
                self.fail(o, f"{o.name} is given twice (in USING and in WITH)")
            opts[o.name] = self.option_value(o)
            where[o.name] = o
        if self.source == "TOKENS":
            if opts.get("mode", "token") != "token":
                self.fail(where["mode"], "TOKENS(...) is token mode; use MASKED(...) for phrases")
            opts["mode"] = "token"
        if self.source == "EVIDENCE" and opts.get("evidence") == 0:
            # on MASKED it keeps no occurrence; EVIDENCE's rows are occurrences
            self.fail(where["evidence"], "EVIDENCE lists occurrences: WITH evidence = 0 would "
                      "list none; leave the option out for every occurrence of each answer, "
                      "or give evidence = n (n >= 1) for its best n")
        self.option_pos = where
        return opts

    def option_value(self, o: A.Option) -> Any:
        v = o.value
        want = _OPTION_TYPES.get(o.name)
        if not isinstance(v, A.Literal):  # pragma: no cover - params are bound before
            self.fail(v, "unbound parameter")
        ok = {"int": v.kind == "integer", "number": v.kind in ("integer", "float"),
              "bool": v.kind == "boolean", "str": v.kind == "string"}[want[0]]
        if not ok:
            self.fail(v, f"{o.name} takes {want[1]}, got {_value(v)}", (want[1],))
        if want[0] == "str" and v.value not in want[2]:
            self.fail(v, f"{o.name} must be one of {', '.join(want[2])}, got {v.value!r}"
                      + _hint(v.value, want[2]), want[2])
        if want[0] == "number" and isinstance(v.value, float) and v.value != v.value:
            self.fail(v, f"{o.name} must be a number, got NaN")
        return v.value

    def check_spec(self, cls: type, text: str, opts: dict[str, Any], **extra: Any) -> None:
        """Build the spec once so range errors point at the option that caused them."""
        fields_ = {k: v for k, v in opts.items() if k != "retrieval"}
        if "retrieval" in opts:  # else the spec's default (masked: by exact; classify: dense)
            fields_["retrieval"] = "dense" if opts["retrieval"] == "exact" else opts["retrieval"]
        try:
            cls(text, **extra, **fields_)
        except ProgrammingError as exc:
            msg = str(exc)
            node = next((self.option_pos[n] for n in self.option_pos if msg.startswith(n + " ")),
                        self.stmt)
            self.fail(node, msg)

    def check_used(self, method: str, mode: str, *, named: bool) -> None:
        """A WITH option that the statement's retrieval or mode does not use is an error
        (as the same option in USING is), not silently ignored."""
        chose = "" if named or self.source == "CLASSIFY" or method == "bm25" else \
            " (chosen by exact = TRUE)"
        for o in self.stmt.options:
            why = _UNUSED.get((o.name, method)) or _UNUSED.get((o.name, mode))
            if why is None or (o.name == "exact" and getattr(o.value, "value", None) is False):
                continue  # exact = FALSE asks for what bm25 does anyway
            how = "" if named else chose or f" (the default of {self.source})"
            if mode == "token" and (o.name, "token") in _UNUSED:
                fix = "drop it, or use MASKED(...) for phrases"
            elif method == "bm25":
                fix = "ask for dense search, e.g. USING " + \
                    ("exact(k => 1024)" if o.name == "exact" else "dense(k => 1024)")
            else:
                fix = "drop it, or retrieve BM25 blocks with USING bm25(blocks => 3) or hybrid"
            self.fail(o, f"{o.name} is not used by {why.format(method=method, how=how)}: {fix}")

    def check_no_evidence_columns(self, items: tuple[ProjectItem, ...]) -> None:
        """``WITH evidence = 0`` leaves answers without occurrences: the columns of the
        best occurrence would be NULL for every answer."""
        for it in items:
            for n in A.walk(it.expr):
                if isinstance(n, A.Name) and n.parts in _EVIDENCE_COLUMNS:
                    col = _EVIDENCE_COLUMNS[n.parts]
                    self.fail(n, f"{col} comes from an answer's best occurrence, and "
                                 "WITH evidence = 0 keeps none: drop the option or the column")

    # ------------------------------------------------------------ the plan

    def build(self) -> Node:
        s = self.stmt
        src = s.source
        opts = self.options()
        version = self.as_of()
        limit = self.count(s.limit, "LIMIT")
        offset = self.count(s.offset, "OFFSET") or 0
        items = self.select_items()
        where = self.resolve(s.where, "where") if s.where is not None else None
        if where is not None:
            self.condition(where)
        keys = self.order_keys()
        group_by = self.group_by()

        if self.source in ("SEARCH", "DOCUMENTS"):
            if self.source == "SEARCH":
                query = self.query_text(src.query, "SEARCH", masked=False)
                node: Node = Retrieve("SEARCH", query, "bm25", version=version)
            else:
                node = Retrieve("DOCUMENTS", method="scan", version=version)
            if where is not None:
                node = Filter(where, "where", node)
            if keys:
                node = Order(keys, "row", node)
            if limit is not None or offset:
                node = Limit(limit, offset, "row", node)
            return Project(items, node)

        classify = self.source == "CLASSIFY"
        text = self.query_text(src.query, self.source, masked=True)
        spec_cls = ClassifySpec if classify else MaskedSpec
        labels = self.labels(src.labels) if classify else ()
        extra = {"labels": labels} if classify else {}
        self.check_spec(spec_cls, text, opts, **extra)
        d = {f.name: f.default for f in fields(spec_cls)}
        o = {**d, **opts}
        method = opts.get("retrieval") or d["retrieval"] or masked_retrieval(o["exact"])
        self.check_used(method, o["mode"], named=opts.get("retrieval") is not None)
        if not o["evidence"] and self.source != "EVIDENCE":
            self.check_no_evidence_columns(items)
        node = Retrieve(self.source, text, method, o["mode"], o["k"], o["blocks"], o["exact"],
                        version, bm25_title=o["bm25_title"], bm25_question=o["bm25_question"])
        # the block prior weighs BM25 blocks: none in dense retrieval or classification
        prior = float(o["bm25_prior"]) if not classify and method in ("bm25", "hybrid") else 0.0
        if o["mode"] == "phrase":
            node = Assemble(o["max_len"], o["clean_edges"], o.get("no_stopwords", False), node)
            node = Score(o["tau"], o.get("scoring", "npm"), node, prior)
        else:
            node = Score(o["tau"], "softmax", node, prior)
        if classify:
            node = Classify(labels, o["tau"], node, o["calibrate"])
        else:
            node = Aggregate(group_by or "phrase", o["alpha"], node,
                             o["not_in_query"], o["no_query_words"], o["not_subject_name"],
                             o["whole_names"])
        if where is not None:
            node = Filter(where, "where", node)
        if self.source == "EVIDENCE":
            return Project(items, self.evidence_rows(node, opts.get("evidence", 0), keys,
                                                     limit, offset))
        node = Order(keys or (OrderKey(A.Name(("score",)), True),), "answer", node)
        if limit is not None or offset:
            node = Limit(limit, offset, "answer", node)
        per = opts.get("evidence", d["evidence"])
        if per:
            node = Evidence(per, False, node)
        return Project(items, node)

    @staticmethod
    def evidence_rows(node: Node, per: int, keys: tuple, limit: int | None, offset: int) -> Node:
        """EVIDENCE: one row per occurrence of the best answers. ORDER BY, LIMIT and OFFSET
        apply to those rows, as SQL's do; the answers expanded are the top 5 by score
        (fill_mask's ``top``), or LIMIT + OFFSET of them when that is more, so a LIMIT of
        rows is filled (every answer has an occurrence) and a query with LIMIT returns the
        first rows of the same query without it."""
        node = Order((OrderKey(A.Name(("score",)), True),), "answer", node)
        if limit is not None:
            node = Limit(max(DEFAULT_LIMIT["EVIDENCE"], limit + offset), 0, "answer", node)
        node = Evidence(per, True, node)
        if keys:
            node = Order(keys, "row", node)
        if limit is not None or offset:
            node = Limit(limit, offset, "row", node)
        return node

    def group_by(self) -> str | None:
        g = self.stmt.group_by
        if g is None:
            return None
        if self.source in ("SEARCH", "DOCUMENTS"):
            self.fail(self._group_key(g),
                      f"{self.source} rows cannot be grouped (GROUP BY works on "
                      "MASKED, TOKENS and EVIDENCE answers)")
        if self.source == "CLASSIFY":
            if g != "label":
                self.fail(self._group_key(g),
                          f"CLASSIFY answers are its labels: GROUP BY label, not {g}")
            return None
        keys = tuple(A.GROUP_KEYS) + tuple(k for k in GROUPS if k not in A.GROUP_KEYS)
        if g not in keys:
            self.fail(self._group_key(g),
                      f"unknown GROUP BY key {g!r}" + _hint(g, keys), keys)
        return g

    def _group_key(self, g: str) -> A.Name:
        """The GROUP BY key ``g`` as a node placed where it is written (the tree keeps only
        its name), for an error to point at."""
        from .lexer import tokenize

        toks = tokenize(self.text)
        for a, b, c in zip(toks, toks[1:], toks[2:]):
            if a.is_keyword("GROUP") and b.is_keyword("BY"):
                return A.Name((g,), pos=c.pos)
        return A.Name((g,), pos=self.stmt.pos or 0)


# USING method → its arguments.
_USING_ARGS = {
    "dense": ("k",), "exact": ("k",), "bm25": ("blocks",), "hybrid": ("k", "blocks"),
}
# WITH options per source.
_MASKED_OPTS = ("mode", "k", "blocks", "max_len", "tau", "alpha", "exact", "scoring",
                "clean_edges", "no_stopwords", "evidence", "bm25_title", "bm25_question",
                "bm25_prior", "not_in_query", "no_query_words", "not_subject_name",
                "whole_names")
_WITH_OPTIONS = {
    "MASKED": _MASKED_OPTS, "TOKENS": _MASKED_OPTS, "EVIDENCE": _MASKED_OPTS,
    "CLASSIFY": ("mode", "k", "blocks", "max_len", "tau", "exact", "clean_edges", "evidence",
                 "bm25_title", "bm25_question", "calibrate"),
    "SEARCH": (), "DOCUMENTS": (),
}
# (option, retrieval method or mode) → what does not use it (a WITH option there is an error)
_UNUSED: dict[tuple[str, str], str] = {
    **{(o, "bm25"): "{method} retrieval{how}" for o in ("k", "exact")},
    **{(o, m): "{method} retrieval{how}, which reads no BM25 blocks"
       for o in ("blocks", "bm25_title", "bm25_question", "bm25_prior")
       for m in ("dense", "exact")},
    **{(o, "token"): "token mode (single tokens, no phrases)"
       for o in ("max_len", "scoring", "no_stopwords", "clean_edges")},
}
# answer columns read from the best occurrence (canonical paths)
_EVIDENCE_COLUMNS = {("doc", "id"): "doc_id", ("doc", "title"): "title", ("start",): "start",
                     ("end",): "end", ("snippet",): "snippet"}
# Options that a clause sets.
_CLAUSE_FOR = {"top": "LIMIT", "limit": "LIMIT", "offset": "OFFSET", "version": "AS OF",
               "group_by": "GROUP BY", "retrieval": "USING", "doc_filter": "WHERE",
               "labels": "LABELS(...)"}
# Option → (kind, how messages name it, choices).
_OPTION_TYPES: dict[str, tuple] = {
    "k": ("int", "an integer"), "blocks": ("int", "an integer"), "max_len": ("int", "an integer"),
    "evidence": ("int", "an integer"), "tau": ("number", "a number"),
    "alpha": ("number", "a number"), "bm25_prior": ("number", "a number"),
    "exact": ("bool", "TRUE or FALSE"),
    "clean_edges": ("bool", "TRUE or FALSE"), "no_stopwords": ("bool", "TRUE or FALSE"),
    "bm25_title": ("bool", "TRUE or FALSE"), "bm25_question": ("bool", "TRUE or FALSE"),
    "not_in_query": ("bool", "TRUE or FALSE"), "no_query_words": ("bool", "TRUE or FALSE"),
    "not_subject_name": ("bool", "TRUE or FALSE"), "whole_names": ("bool", "TRUE or FALSE"),
    "calibrate": ("bool", "TRUE or FALSE"),
    "scoring": ("str", "npm or raw", SCORINGS), "mode": ("str", "phrase or token", MODES),
}


def _value(e: A.Expr) -> str:
    if isinstance(e, A.Literal):
        return {"null": "NULL", "boolean": "TRUE" if e.value else "FALSE"}.get(
            e.kind, repr(e.value)) + (f" ({e.kind})" if e.kind not in ("null", "boolean") else "")
    return expr_to_sql(e)


def build(stmt: A.Select, text: str) -> Node:
    """The logical plan of a SELECT whose parameters are bound (see :mod:`.sql`)."""
    return _Binder(stmt, text).build()
