"""Tokens → syntax tree: a recursive-descent parser for npmdb's query language.

    >>> from npmdb.query.parser import parse
    >>> parse("SHOW VERSIONS")
    Show(what='VERSIONS')

The grammar is in ``GRAMMAR.md`` next to this file. Every malformed input raises
:class:`npmdb.errors.QueryParseError` naming the line, the column and what was expected,
with a "did you mean" for misspelt keywords, table functions and ``USING`` methods.
Nothing else escapes (a non-string argument is an :class:`npmdb.errors.InterfaceError`).
Nesting is capped at :data:`MAX_DEPTH` and input length at ``MAX_QUERY_LENGTH``.
"""

from __future__ import annotations

import difflib
from typing import Any, Iterable, NoReturn

from npmdb.errors import Error, InterfaceError, InternalError, QueryParseError

from . import ast as A
from .lexer import MAX_QUERY_LENGTH, Token, error_at, tokenize

__all__ = ["parse", "parse_expression", "MAX_DEPTH", "MAX_QUERY_LENGTH", "error_at"]

#: Deepest accepted nesting of expressions (parentheses, NOT, operators).
MAX_DEPTH = 64

_STATEMENT_STARTS = ("SELECT", "EXPLAIN", "SHOW")
# (keyword that starts the clause, how messages name it, Select field), in the required order.
_CLAUSES = (
    ("AS", "AS OF", "as_of"), ("USING", "USING", "using"), ("WITH", "WITH", "options"),
    ("WHERE", "WHERE", "where"), ("GROUP", "GROUP BY", "group_by"), ("ORDER", "ORDER BY", "order_by"),
    ("LIMIT", "LIMIT", "limit"), ("OFFSET", "OFFSET", "offset"),
)
_CLAUSE_KEYWORDS = tuple(c[0] for c in _CLAUSES)
_COMPARISONS = {"=": "=", "!=": "!=", "<>": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}
_END = ("';'", "end of input")
_CONSTANTS = {"TRUE": True, "FALSE": False, "NULL": None}
_STRUCTURAL = frozenset("SELECT FROM WHERE USING WITH AS AND OR IN LIKE BETWEEN IS NOT TRUE FALSE NULL".split())
_NAME_LIKE = ("an expression", "a name", "a column name", "an option name", "an alias", "a label name")


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


def _suggest(word: str, candidates: Iterable[str]) -> str | None:
    cands = {c.split()[0].upper(): c.split()[0] for c in candidates
             if c[:1].isalpha() and c.split()[0] not in ("a", "an", "end")}
    match = difflib.get_close_matches(word.upper(), list(cands), n=1, cutoff=0.6)
    return cands[match[0]] if match else None


class _Parser:
    def __init__(self, text: str, tokens: tuple[Token, ...]) -> None:
        self.text = text
        self.toks = tokens
        self.i = 0
        self.depth = 0
        self.positional = 0
        self.follow: tuple[str, ...] = ()
        self._depths: dict[int, int] = {}
        self._keep: list[A.Node] = []  # keeps ids in _depths unique while parsing

    # ------------------------------------------------------------ token helpers

    @property
    def tok(self) -> Token:
        return self.toks[self.i]

    def peek(self, k: int = 1) -> Token:
        return self.toks[min(self.i + k, len(self.toks) - 1)]

    def advance(self) -> Token:
        t = self.toks[self.i]
        if t.kind != "eof":
            self.i += 1
        return t

    def accept_keyword(self, word: str) -> Token | None:
        return self.advance() if self.tok.is_keyword(word) else None

    def accept_op(self, op: str) -> Token | None:
        return self.advance() if self.tok.is_op(op) else None

    def expect_keyword(self, word: str, also: tuple[str, ...] = ()) -> Token:
        if not self.tok.is_keyword(word):
            self.unexpected(also + (word,))
        return self.advance()

    def expect_op(self, op: str, also: tuple[str, ...] = ()) -> Token:
        if not self.tok.is_op(op):
            self.unexpected(also + (f"'{op}'",))
        return self.advance()

    # ------------------------------------------------------------ errors

    def fail(self, message: str, tok: Token | None = None, expected: tuple[str, ...] = ()) -> NoReturn:
        raise error_at(self.text, (tok or self.tok).pos, message, expected)

    def unexpected(self, expected: tuple[str, ...], *, message: str | None = None,
                   suggest_from: Iterable[str] | None = None, tok: Token | None = None) -> NoReturn:
        tok = tok or self.tok
        msg = message or ("empty query" if tok.kind == "eof" and len(self.toks) == 1
                          else f"unexpected {tok.describe()}")
        if tok.kind == "ident":
            hint = _suggest(tok.value, expected if suggest_from is None else suggest_from)
            if hint is not None:
                msg += f"; did you mean {hint}?"
        elif tok.kind == "keyword" and self._looks_like_a_name(tok) and any(e in _NAME_LIKE for e in expected):
            msg += f" ({tok.value} is a reserved word; write \"{tok.text}\" to use it as a name)"
        elif message is None and tok is self.tok and self.i > 0 and self.toks[self.i - 1].is_op(","):
            msg += " after ','"
        self.fail(msg, tok, expected)

    def _looks_like_a_name(self, tok: Token) -> bool:
        """A reserved word used as a name, rather than a clause started too early."""
        if tok.value in _STRUCTURAL or tok is not self.tok:
            return False
        nxt = self.peek()
        if tok.value in ("ORDER", "GROUP"):
            return not nxt.is_keyword("BY")
        if tok.value in ("LIMIT", "OFFSET"):
            return nxt.kind not in ("integer", "param")
        return True

    # ------------------------------------------------------------ nodes

    def node(self, cls: type, *args: Any, pos: int, **kw: Any) -> Any:
        """Build an expression node, enforcing MAX_DEPTH on the tree's depth."""
        node = cls(*args, pos=pos, **kw)
        depth = 0
        for v in list(args) + list(kw.values()):
            for child in (v if isinstance(v, tuple) else (v,)):
                if isinstance(child, A.Node):
                    depth = max(depth, self._depths.get(id(child), 1))
        if depth + 1 > MAX_DEPTH:
            self.fail(f"expression nested too deeply (limit {MAX_DEPTH} levels)", expected=())
        self._depths[id(node)] = depth + 1
        self._keep.append(node)
        return node

    def enter(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            self.fail(f"expression nested too deeply (limit {MAX_DEPTH} levels)")

    def param(self, tok: Token) -> A.Param:
        if tok.value is None:
            self.positional += 1
            return A.Param(index=self.positional - 1, pos=tok.pos)
        return A.Param(name=tok.value, pos=tok.pos)

    def identifier(self, what: str = "a name") -> Token:
        t = self.tok
        if t.kind in ("ident", "qident"):
            return self.advance()
        self.unexpected((what,))

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

    # ------------------------------------------------------------ expressions

    def expr(self, expected: tuple[str, ...] = ("an expression",)) -> A.Expr:
        self.enter()
        try:
            if self.tok.kind == "eof" or self.tok.is_op(")", ",", ";") or self.tok.is_keyword(*_CLAUSE_KEYWORDS):
                self.unexpected(expected)
            return self.or_expr(expected)
        finally:
            self.depth -= 1

    def or_expr(self, expected: tuple[str, ...]) -> A.Expr:
        first = self.and_expr(expected)
        operands = [first]
        while self.accept_keyword("OR"):
            operands.append(self.and_expr())
        return first if len(operands) == 1 else self.node(A.BoolOp, "OR", tuple(operands), pos=first.pos)

    def and_expr(self, expected: tuple[str, ...] = ("an expression",)) -> A.Expr:
        first = self.not_expr(expected)
        operands = [first]
        while self.accept_keyword("AND"):
            operands.append(self.not_expr())
        return first if len(operands) == 1 else self.node(A.BoolOp, "AND", tuple(operands), pos=first.pos)

    def not_expr(self, expected: tuple[str, ...] = ("an expression",)) -> A.Expr:
        t = self.tok
        if t.is_keyword("NOT"):
            self.advance()
            self.enter()
            try:
                return self.node(A.UnaryOp, "NOT", self.not_expr(), pos=t.pos)
            finally:
                self.depth -= 1
        return self.predicate(expected)

    def predicate(self, expected: tuple[str, ...]) -> A.Expr:
        left = self.additive(expected)
        t = self.tok
        pos = left.pos
        if t.kind == "op" and t.value in _COMPARISONS:
            self.advance()
            return self.node(A.BinaryOp, _COMPARISONS[t.value], left, self.additive(), pos=pos)
        negated = False
        if t.is_keyword("NOT"):
            if not self.peek().is_keyword("LIKE", "IN", "BETWEEN"):
                self.advance()
                self.unexpected(("LIKE", "IN", "BETWEEN"))
            self.advance()
            negated = True
            t = self.tok
        if t.is_keyword("LIKE"):
            self.advance()
            return self.node(A.Like, left, self.additive(), negated, pos=pos)
        if t.is_keyword("IN"):
            self.advance()
            self.expect_op("(")
            items = [self.expr()]
            while self.accept_op(","):
                items.append(self.expr())
            self.expect_op(")", also=("','",))
            return self.node(A.InList, left, tuple(items), negated, pos=pos)
        if t.is_keyword("BETWEEN"):
            self.advance()
            low = self.additive()
            self.expect_keyword("AND")
            return self.node(A.Between, left, low, self.additive(), negated, pos=pos)
        if t.is_keyword("IS"):
            self.advance()
            neg = self.accept_keyword("NOT") is not None
            self.expect_keyword("NULL", also=() if neg else ("NOT",))
            return self.node(A.IsNull, left, neg, pos=pos)
        return left

    def additive(self, expected: tuple[str, ...] = ("an expression",)) -> A.Expr:
        left = self.multiplicative(expected)
        while self.tok.is_op("+", "-"):
            op = self.advance().value
            left = self.node(A.BinaryOp, op, left, self.multiplicative(), pos=left.pos)
        return left

    def multiplicative(self, expected: tuple[str, ...] = ("an expression",)) -> A.Expr:
        left = self.unary(expected)
        while self.tok.is_op("*", "/"):
            op = self.advance().value
            left = self.node(A.BinaryOp, op, left, self.unary(), pos=left.pos)
        return left

    def unary(self, expected: tuple[str, ...] = ("an expression",)) -> A.Expr:
        t = self.tok
        if not t.is_op("-"):
            return self.primary(expected)
        self.advance()
        if self.tok.kind in ("integer", "float"):
            return A.Literal(-self.advance().value, pos=t.pos)
        self.enter()
        try:
            return self.node(A.UnaryOp, "-", self.unary(), pos=t.pos)
        finally:
            self.depth -= 1

    def primary(self, expected: tuple[str, ...]) -> A.Expr:
        t = self.tok
        if t.kind in ("string", "integer", "float"):
            self.advance()
            return A.Literal(t.value, pos=t.pos)
        if t.is_keyword("TRUE", "FALSE", "NULL"):
            self.advance()
            return A.Literal(_CONSTANTS[t.value], pos=t.pos)
        if t.kind == "param":
            self.advance()
            return self.param(t)
        if t.is_op("("):
            self.advance()
            inner = self.expr()
            self.expect_op(")")
            return inner
        if t.kind in ("ident", "qident"):
            self.advance()
            if self.tok.is_op("("):
                return self.call(t)
            parts = [t.value]
            while self.tok.is_op("."):
                self.advance()
                p = self.tok
                if p.kind in ("ident", "qident"):
                    parts.append(p.value)
                elif p.kind == "keyword":
                    parts.append(p.text)
                else:
                    self.unexpected(("a name",))
                self.advance()
            return A.Name(tuple(parts), pos=t.pos)
        self.unexpected(expected)

    def call(self, name: Token) -> A.Expr:
        self.advance()  # (
        args: list[A.Expr] = []
        if not self.accept_op(")"):
            while True:
                t = self.tok
                if t.is_op("*"):
                    self.advance()
                    args.append(A.Star(pos=t.pos))
                else:
                    args.append(self.expr())
                if not self.accept_op(","):
                    break
            self.expect_op(")", also=("','",))
        return self.node(A.Call, name.value.lower(), tuple(args), pos=name.pos)

