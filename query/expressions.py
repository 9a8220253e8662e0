"""The expression half of the parser, and the token cursor both halves share.

:class:`ExprParser` walks the token tuple (lookahead, accept/expect, errors naming the line
and column with a "did you mean"), builds nodes while enforcing :data:`MAX_DEPTH`, and
parses expressions by precedence: OR, AND, NOT, comparisons / LIKE / IN / BETWEEN / IS
NULL, ``+ -``, ``* /``, unary minus, primaries (literals, parameters, names, calls).
Statements and clauses are in :mod:`npmdb.query.parser`, which subclasses it.
"""

from __future__ import annotations

import difflib
from typing import Any, Iterable, NoReturn

from . import ast as A
from .lexer import MAX_INTEGER, Token, error_at

__all__ = ["ExprParser", "MAX_DEPTH", "CLAUSES"]

#: Deepest accepted nesting of expressions (parentheses, NOT, operators).
MAX_DEPTH = 64

# (keyword that starts the clause, how messages name it, Select field), in the required order;
# a clause keyword also ends the expression before it.
CLAUSES = (
    ("AS", "AS OF", "as_of"), ("USING", "USING", "using"), ("WITH", "WITH", "options"),
    ("WHERE", "WHERE", "where"), ("GROUP", "GROUP BY", "group_by"), ("ORDER", "ORDER BY", "order_by"),
    ("LIMIT", "LIMIT", "limit"), ("OFFSET", "OFFSET", "offset"),
)
_CLAUSE_KEYWORDS = tuple(c[0] for c in CLAUSES)
_COMPARISONS = {"=": "=", "!=": "!=", "<>": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}
CONSTANTS = {"TRUE": True, "FALSE": False, "NULL": None}
_STRUCTURAL = frozenset("SELECT FROM WHERE USING WITH AS AND OR IN LIKE BETWEEN IS NOT TRUE FALSE NULL".split())
_NAME_LIKE = ("an expression", "a name", "a column name", "an option name", "an alias", "a label name")


def _suggest(word: str, candidates: Iterable[str]) -> str | None:
    cands = {c.split()[0].upper(): c.split()[0] for c in candidates
             if c[:1].isalpha() and c.split()[0] not in ("a", "an", "end")}
    match = difflib.get_close_matches(word.upper(), list(cands), n=1, cutoff=0.6)
    return cands[match[0]] if match else None


class ExprParser:
    """Token cursor, errors, node building and the expression grammar."""

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
            self.fail(f"expression nested too deeply (limit {MAX_DEPTH} levels; each + - * / of "
                      "a chain is a level: group long sums with parentheses)", expected=())
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
        if t.kind == "integer" and t.value > MAX_INTEGER:  # 2**63 after a binary '-'
            raise error_at(self.text, t.pos, f"integer out of range {t.text!r} (must fit in "
                           "64 bits)")
        if t.kind in ("string", "integer", "float"):
            self.advance()
            return A.Literal(t.value, pos=t.pos)
        if t.is_keyword("TRUE", "FALSE", "NULL"):
            self.advance()
            return A.Literal(CONSTANTS[t.value], pos=t.pos)
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
