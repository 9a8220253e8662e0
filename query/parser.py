"""Tokens → syntax tree: a recursive-descent parser for npmdb's query language.

    >>> from npmdb.query.parser import parse
    >>> parse("SHOW VERSIONS")
    Show(what='VERSIONS')

The grammar is in ``GRAMMAR.md`` next to this file. Every malformed input raises
:class:`npmdb.errors.QueryParseError` naming the line, the column and what was expected,
with a "did you mean" for misspelt keywords, table functions and ``USING`` methods.
Nothing else escapes (a non-string argument is an :class:`npmdb.errors.InterfaceError`).
Nesting is capped at :data:`MAX_DEPTH` and input length at ``MAX_QUERY_LENGTH``.
Statements and clauses are parsed here; expressions (and the token cursor) in
:mod:`npmdb.query.expressions`.
"""

from __future__ import annotations

from typing import Any

from npmdb.errors import Error, InterfaceError, InternalError, QueryParseError

from . import ast as A
from .expressions import CLAUSES as _CLAUSES
from .expressions import CONSTANTS as _CONSTANTS
from .expressions import MAX_DEPTH, ExprParser
from .lexer import MAX_QUERY_LENGTH, Token, error_at, tokenize

__all__ = ["parse", "parse_expression", "MAX_DEPTH", "MAX_QUERY_LENGTH", "error_at"]

_STATEMENT_STARTS = ("SELECT", "EXPLAIN", "SHOW")
_CLAUSE_KEYWORDS = tuple(c[0] for c in _CLAUSES)
_END = ("';'", "end of input")


def parse(text: str) -> A.Statement:
    """Parse one statement (an optional trailing ``;`` allowed) into a syntax tree."""
    return _run(text, lambda p: p.parse_statement())


def parse_expression(text: str) -> A.Expr:
    """Parse a lone expression (a WHERE condition, say); used by tests and tools."""
    return _run(text, _lone_expression)


def _lone_expression(p: "_Parser") -> A.Expr:
    if p.tok.kind == "eof":
        p.unexpected(("an expression",), message="empty expression")
    node = p.expr()
    if p.tok.kind != "eof":
        p.unexpected(("end of input",))
    return node


def _run(text: str, fn: Any) -> Any:
    if not isinstance(text, str):
        raise InterfaceError(f"a query must be a str, not {type(text).__name__}")
    try:
        return fn(_Parser(text, tokenize(text)))
    except Error:
        raise
    except RecursionError:
        raise QueryParseError(f"query nested too deeply (limit {MAX_DEPTH} levels)", text=text) from None
    except Exception as exc:  # pragma: no cover - a bug, never a user error
        raise InternalError(f"query parser failed: {exc!r}") from exc


class _Parser(ExprParser):
    # ------------------------------------------------------------ statements

    def parse_statement(self) -> A.Statement:
        stmt = self.statement()
        if self.tok.kind != "eof" and not self.tok.is_op(";"):
            self.unexpected(self.follow + _END, suggest_from=self.follow)
        if self.accept_op(";") and self.tok.kind != "eof":
            self.unexpected(("end of input",),
                            message=f"unexpected {self.tok.describe()} after ';' (one statement per query)")
        return stmt

    def statement(self) -> A.Statement:
        t = self.tok
        if t.is_keyword("SELECT"):
            return self.select()
        if t.is_keyword("EXPLAIN"):
            self.advance()
            analyze = self.accept_keyword("ANALYZE") is not None
            if not self.tok.is_keyword("SELECT"):
                self.unexpected(("SELECT",) if analyze else ("ANALYZE", "SELECT"))
            return A.Explain(self.select(), analyze, pos=t.pos)
        if t.is_keyword("SHOW"):
            self.advance()
            what = self.tok
            if what.kind == "ident" and what.value.upper() in A.SHOW_TARGETS:
                self.advance()
                return A.Show(what.value.upper(), pos=t.pos)
            self.unexpected(A.SHOW_TARGETS)
        self.unexpected(_STATEMENT_STARTS)

    def select(self) -> A.Select:
        start = self.expect_keyword("SELECT")
        columns = self.select_list()
        source = self.source()
        fields: dict[str, Any] = {}
        last = -1
        for k, (kw, _label, _field) in enumerate(_CLAUSES):
            if not self.tok.is_keyword(kw):
                continue
            self.follow = ()
            getattr(self, "clause_" + kw.lower())(fields)
            last = k
        t = self.tok
        if t.is_keyword(*_CLAUSE_KEYWORDS):
            j = _CLAUSE_KEYWORDS.index(t.value)
            label = _CLAUSES[j][1]
            if _CLAUSES[j][2] in fields:
                self.fail(f"duplicate {label} clause", t)
            order = ", ".join(c[1] for c in _CLAUSES)
            self.fail(f"{label} must come before {_CLAUSES[last][1]} (clauses go in this order: {order})", t)
        self.follow = self.follow + tuple(c[1] for c in _CLAUSES[last + 1:])
        return A.Select(columns, source, pos=start.pos, **fields)

    # ------------------------------------------------------------ select list, FROM

    def select_list(self) -> tuple[A.SelectItem, ...]:
        items = []
        while True:
            t = self.tok
            alias = None
            if t.is_op("*"):
                self.advance()
                expr: A.Expr = A.Star(pos=t.pos)
            else:
                if t.is_keyword("FROM"):
                    self.unexpected(("a column name", "'*'"))
                expr = self.expr(("a column name", "'*'"))
                if self.accept_keyword("AS"):
                    alias = self.identifier("an alias").value
            items.append(A.SelectItem(expr, alias, pos=t.pos))
            if not self.accept_op(","):
                break
        if not self.tok.is_keyword("FROM"):
            self.unexpected(("','",) + (("AS",) if alias is None and not isinstance(expr, A.Star) else ()) + ("FROM",))
        self.advance()
        return tuple(items)

    def source(self) -> A.Source:
        t = self.tok
        name = t.value.upper() if t.kind == "ident" else None
        if name not in A.TABLE_FUNCTIONS:
            msg = f"unknown table function {t.describe()}" if t.kind == "ident" else None
            self.unexpected(A.TABLE_FUNCTIONS, message=msg)
        self.advance()
        if name == "DOCUMENTS":
            if self.accept_op("("):
                self.expect_op(")")
            return A.Documents(pos=t.pos)
        self.expect_op("(")
        query = self.text_arg()
        if name == "CLASSIFY":
            if not self.tok.is_op(","):
                self.unexpected(("','",), message=f"CLASSIFY takes the query and its labels: "
                                f"CLASSIFY(text, LABELS(name = 'word', ...)); found {self.tok.describe()}")
            self.advance()
            labels = self.labels()
            self.expect_op(")")
            return A.Classify(query, labels, pos=t.pos)
        self.expect_op(")")
        if name in ("MASKED", "TOKENS"):
            return A.Masked(query, name == "TOKENS", pos=t.pos)
        return (A.Evidence if name == "EVIDENCE" else A.Search)(query, pos=t.pos)

    def labels(self) -> tuple[A.Label, ...] | A.Param:
        t = self.tok
        if t.kind == "param":
            self.advance()
            return self.param(t)
        if not (t.kind == "ident" and t.value.upper() == "LABELS"):
            self.unexpected(("LABELS", "a parameter"))
        self.advance()
        self.expect_op("(")
        labels: list[A.Label] = []
        seen: set[str] = set()
        while True:
            n = self.tok
            if n.kind not in ("ident", "qident", "string"):
                self.unexpected(("a label name",))
            self.advance()
            if not n.value:  # '' could not be printed back as a name (parse(to_sql(t)) == t)
                self.fail("label names must be non-empty: name the label, e.g. "
                          "LABELS(positive = 'great', negative = 'terrible')", n)
            if n.value in seen:
                self.fail(f"duplicate label {n.value!r}", n)
            seen.add(n.value)
            self.expect_op("=")
            labels.append(A.Label(n.value, self.label_words(), pos=n.pos))
            if not self.accept_op(","):
                break
        self.expect_op(")", also=("','",))
        return tuple(labels)

    def label_words(self) -> tuple[A.Expr, ...]:
        if not self.accept_op("("):
            return (self.text_arg(("'('",)),)
        words = [self.text_arg()]
        while self.accept_op(","):
            words.append(self.text_arg())
        self.expect_op(")", also=("','",))
        return tuple(words)

    def text_arg(self, also: tuple[str, ...] = ()) -> A.Expr:
        """A string or a parameter: a table function's query, a label's word."""
        t = self.tok
        if t.kind == "string":
            self.advance()
            return A.Literal(t.value, pos=t.pos)
        if t.kind == "param":
            self.advance()
            return self.param(t)
        self.unexpected(("a string", "a parameter") + also)

    # ------------------------------------------------------------ clauses

    def clause_as(self, fields: dict[str, Any]) -> None:
        self.advance()
        self.expect_keyword("OF")
        t = self.tok
        if t.kind in ("string", "integer"):
            self.advance()
            fields["as_of"] = A.Literal(t.value, pos=t.pos)
        elif t.kind == "param":
            self.advance()
            fields["as_of"] = self.param(t)
        else:
            self.unexpected(("a version (string or integer)", "a parameter"))

    def clause_using(self, fields: dict[str, Any]) -> None:
        start = self.advance()
        t = self.tok
        method = t.value.lower() if t.kind in ("ident", "qident") else None
        if method not in A.RETRIEVAL_METHODS:
            msg = f"unknown retrieval method {t.describe()}" if t.kind in ("ident", "qident") else None
            if t.kind == "qident":
                t = Token("ident", t.value, t.text, t.pos, t.end)
            self.unexpected(A.RETRIEVAL_METHODS, message=msg, tok=t)
        self.advance()
        args: tuple[A.Option, ...] = ()
        self.follow = ("'('",)
        if self.accept_op("("):
            args = () if self.accept_op(")") else self.option_list("=>", ")")
            self.follow = ()
        fields["using"] = A.Using(method, args, pos=start.pos)

    def clause_with(self, fields: dict[str, Any]) -> None:
        self.advance()
        fields["options"] = self.option_list("=", None)
        self.follow = ("','",)

    def option_list(self, assign: str, close: str | None) -> tuple[A.Option, ...]:
        options: list[A.Option] = []
        seen: set[str] = set()
        while True:
            n = self.identifier("an option name")
            name = n.value.lower()
            if name in seen:
                self.fail(f"duplicate option {name!r}", n)
            seen.add(name)
            self.expect_op(assign)
            options.append(A.Option(name, self.option_value(), pos=n.pos))
            if not self.accept_op(","):
                break
        if close is not None:
            self.expect_op(close, also=("','",))
        return tuple(options)

    def option_value(self) -> A.Expr:
        t = self.tok
        if t.kind in ("string", "integer", "float"):
            self.advance()
            return A.Literal(t.value, pos=t.pos)
        if t.is_op("-") and self.peek().kind in ("integer", "float"):
            self.advance()
            return A.Literal(-self.advance().value, pos=t.pos)
        if t.is_keyword(*_CONSTANTS) or t.kind == "param":
            return self.primary(("a value",))
        if t.kind == "ident":
            self.advance()
            return A.Literal(t.value, pos=t.pos)
        self.unexpected(("a value", "a parameter"))

    def clause_where(self, fields: dict[str, Any]) -> None:
        self.advance()
        fields["where"] = self.expr()
        self.follow = ("AND", "OR")

    def clause_group(self, fields: dict[str, Any]) -> None:
        self.advance()
        self.expect_keyword("BY")
        fields["group_by"] = self.identifier("phrase, tokens or document").value.lower()

    def clause_order(self, fields: dict[str, Any]) -> None:
        self.advance()
        self.expect_keyword("BY")
        items = []
        while True:
            t = self.tok
            expr = self.expr()
            desc = False
            self.follow = ("','", "ASC", "DESC")
            if self.accept_keyword("DESC"):
                desc = True
                self.follow = ("','",)
            elif self.accept_keyword("ASC"):
                self.follow = ("','",)
            items.append(A.OrderItem(expr, desc, pos=t.pos))
            if not self.accept_op(","):
                break
        fields["order_by"] = tuple(items)

    def clause_limit(self, fields: dict[str, Any]) -> None:
        fields["limit"] = self.count(self.advance())

    def clause_offset(self, fields: dict[str, Any]) -> None:
        fields["offset"] = self.count(self.advance())

    def count(self, clause: Token) -> A.Expr:
        t = self.tok
        if t.kind == "integer":
            self.advance()
            return A.Literal(t.value, pos=t.pos)
        if t.kind == "param":
            self.advance()
            return self.param(t)
        if t.is_op("-") and self.peek().kind in ("integer", "float"):
            self.fail(f"{clause.value} must not be negative", t, ("an integer", "a parameter"))
        if t.kind == "float":
            self.fail(f"{clause.value} takes an integer, not {t.text}", t, ("an integer", "a parameter"))
        self.unexpected(("an integer", "a parameter"))
