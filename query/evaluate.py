"""Expressions of the query language compiled to functions of a row.

A row is a dict keyed by canonical column (``phrase``, ``score``, ``doc.id``, ``doc.meta``
...). SQL semantics: NULL propagates through comparisons and arithmetic, AND/OR/NOT are
three-valued, a condition keeps rows where it is TRUE; ``=`` on text is exact, ``LIKE``
is case-insensitive (``%`` any run, ``_`` one character, matched without backtracking);
``length(text)`` counts words; ``round`` takes halves away from zero. Integers, literal or
computed, are 64-bit and floats finite. A value that a valid statement cannot use in a
row (text compared with a number, an overflow) is a :class:`~npmdb.errors.QueryDataError`
placed in the statement and naming the row's document or answer; a statement that is
wrong whatever the rows hold is a :class:`~npmdb.errors.QueryParseError`.
"""

from __future__ import annotations

import decimal
import math
from functools import lru_cache
from numbers import Integral
from typing import Any, Callable

from npmdb.errors import ProgrammingError, QueryDataError

from . import ast as A
from .lexer import error_at, in_int64
from .printer import expr_to_sql

__all__ = ["Row", "compile_expr", "compile_condition", "like", "round_half_away"]

Row = dict


def _getter(parts: tuple[str, ...]) -> Callable[[Row], Any]:
    if parts[0] == "doc":
        key, rest = "doc." + parts[1], parts[2:]
    else:
        key, rest = parts[0], parts[1:]
    if not rest:
        return lambda r: r.get(key)

    def get(r: Row) -> Any:
        v = r.get(key)
        for p in rest:
            v = v.get(p) if isinstance(v, dict) else None
        return v
    return get


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float))  # bool is an int: TRUE = 1


def kind_of(v: Any) -> str:
    """A value's type as the language names it (boolean, number, text, or Python's)."""
    if isinstance(v, bool):
        return "boolean"
    if _is_num(v):
        return "number"
    if isinstance(v, str):
        return "text"
    return type(v).__name__


@lru_cache(maxsize=256)
def _lower(s: str) -> str:
    """``s`` in lower case, one character for one (``'İ'.lower()`` is two characters, and
    ``_`` matches one): a character whose lower case is longer stays as it is."""
    low = s.lower()
    if len(low) == len(s):
        return low
    return "".join(c.lower() if len(c.lower()) == 1 else c for c in s)


def like(pattern: str) -> Callable[[str], bool]:
    """A case-insensitive SQL LIKE matcher for ``pattern`` (``%``: any run, ``_``: one
    character); linear-time per segment, no regular expressions, no backtracking blowup."""
    p = _lower(pattern)
    parts = p.split("%")

    def at(s: str, i: int, part: str) -> bool:
        if i < 0 or i + len(part) > len(s):
            return False
        if "_" not in part:
            return s.startswith(part, i)
        return all(c == "_" or c == s[i + k] for k, c in enumerate(part))

    def find(s: str, start: int, stop: int, part: str) -> int:
        if "_" not in part:
            j = s.find(part, start, stop)
            return j
        for i in range(start, stop - len(part) + 1):
            if at(s, i, part):
                return i
        return -1

    def match(s: str) -> bool:
        s = _lower(s)
        if len(parts) == 1:
            return len(s) == len(p) and at(s, 0, p)
        first, last = parts[0], parts[-1]
        end = len(s) - len(last)
        if end < len(first) or not at(s, 0, first) or not at(s, end, last):
            return False
        i = len(first)
        for part in parts[1:-1]:
            if not part:
                continue
            j = find(s, i, end, part)
            if j < 0:
                return False
            i = j + len(part)
        return True
    return match


class _ExprCompiler:
    def __init__(self, text: str) -> None:
        self.text = text

    def fail(self, node: Any, message: str) -> ProgrammingError:
        """The statement itself is wrong (whatever the rows hold)."""
        return error_at(self.text, getattr(node, "pos", None) or 0, message)

    def bad(self, node: Any, message: str) -> QueryDataError:
        """A row's value cannot be used here (:func:`_in_row` adds which row)."""
        return error_at(self.text, getattr(node, "pos", None) or 0, message,
                        cls=QueryDataError)

    def checked(self, v: Any, node: Any) -> Any:
        """A computed number within the literals' range: a 64-bit integer, a float that is
        not infinite. NaN passes (it comes from an operand that is NaN: a data frame's
        missing number in ``meta``, as npmdb stores it), and compares as nothing."""
        if isinstance(v, float) and math.isinf(v):
            raise self.bad(node, f"number out of range from {expr_to_sql(node):.80}")
        if isinstance(v, int) and not in_int64(v):
            raise self.bad(node, f"integer out of range (must fit in 64 bits) from "
                                 f"{expr_to_sql(node):.80}")
        return v

    def truth(self, v: Any, node: Any) -> bool | None:
        if v is None or isinstance(v, bool):
            return v
        raise self.bad(node, f"expected a condition (TRUE, FALSE or NULL), got {kind_of(v)} "
                              f"{v!r:.60} from {expr_to_sql(node):.80}")

    def compile(self, e: A.Expr) -> Callable[[Row], Any]:
        m = getattr(self, "c_" + type(e).__name__, None)
        if m is None:
            raise self.fail(e, f"cannot evaluate {type(e).__name__}")
        return m(e)

    def condition(self, e: A.Expr) -> Callable[[Row], bool]:
        """A predicate: True only where ``e`` is TRUE (NULL and FALSE drop the row)."""
        f = self.compile(e)
        return lambda r: self.truth(f(r), e) is True

    # ------------------------------------------------------------ leaves

    def c_Literal(self, e: A.Literal) -> Callable[[Row], Any]:
        v = e.value
        return lambda r: v

    def c_Name(self, e: A.Name) -> Callable[[Row], Any]:
        return _getter(e.parts)

    def c_Param(self, e: A.Param) -> Callable[[Row], Any]:  # pragma: no cover - bound before
        raise self.fail(e, "unbound parameter")

    def c_Star(self, e: A.Star) -> Callable[[Row], Any]:
        raise self.fail(e, "'*' is not a value")

    # ------------------------------------------------------------ operators

    def c_UnaryOp(self, e: A.UnaryOp) -> Callable[[Row], Any]:
        f = self.compile(e.operand)
        if e.op == "NOT":
            def not_(r: Row) -> Any:
                v = self.truth(f(r), e.operand)
                return None if v is None else not v
            return not_

        def neg(r: Row) -> Any:
            v = f(r)
            if v is None:
                return None
            if not _is_num(v):
                raise self.bad(e, f"'-' needs a number, got {kind_of(v)} {v!r:.60}")
            return self.checked(-v, e)
        return neg

    def c_BoolOp(self, e: A.BoolOp) -> Callable[[Row], Any]:
        fs = [(self.compile(o), o) for o in e.operands]
        stop = e.op == "OR"  # OR stops at TRUE, AND at FALSE

        def boolop(r: Row) -> Any:
            unknown = False
            for f, o in fs:
                v = self.truth(f(r), o)
                if v is None:
                    unknown = True
                elif v is stop:
                    return stop
            return None if unknown else not stop
        return boolop

    def compare(self, op: str, a: Any, b: Any, node: Any) -> bool | None:
        if a is None or b is None:
            return None
        if op in ("=", "!="):
            same = (_is_num(a) and _is_num(b)) or type(a) is type(b) or (
                isinstance(a, str) and isinstance(b, str))
            eq = same and a == b
            return eq if op == "=" else not eq
        if not ((_is_num(a) and _is_num(b)) or (isinstance(a, str) and isinstance(b, str))):
            raise self.bad(node, f"cannot compare {kind_of(a)} with {kind_of(b)}: "
                                 f"{a!r:.40} {op} {b!r:.40}; a field that holds values of "
                                 "different types needs one type (db.update), or a test "
                                 "of each")
        if op == "<":
            return a < b
        if op == "<=":
            return a <= b
        if op == ">":
            return a > b
        return a >= b

    def c_BinaryOp(self, e: A.BinaryOp) -> Callable[[Row], Any]:
        fa, fb = self.compile(e.left), self.compile(e.right)
        op = e.op
        if op in A.COMPARISON_OPS:
            return lambda r: self.compare(op, fa(r), fb(r), e)

        def arith(r: Row) -> Any:
            a, b = fa(r), fb(r)
            if a is None or b is None:
                return None
            if not (_is_num(a) and _is_num(b)):
                raise self.bad(e, f"{op} needs numbers, got {kind_of(a)} and {kind_of(b)}")
            if op == "/" and b == 0:
                return None  # division by zero is NULL, as in SQLite
            try:
                if op == "/" and isinstance(a, Integral) and isinstance(b, Integral):
                    # integers divide to an integer, truncated toward zero (as in SQLite
                    # and PostgreSQL; a float quotient lost 64-bit values)
                    q = abs(int(a)) // abs(int(b))
                    v = -q if (a < 0) != (b < 0) else q
                else:
                    v = a + b if op == "+" else a - b if op == "-" else a * b \
                        if op == "*" else a / b
            except OverflowError:
                raise self.bad(e, f"number out of range from {expr_to_sql(e):.80}") from None
            return self.checked(v, e)
        return arith

    def c_Like(self, e: A.Like) -> Callable[[Row], Any]:
        fv, fp = self.compile(e.expr), self.compile(e.pattern)
        neg = e.negated

        def like_(r: Row) -> Any:
            v, p = fv(r), fp(r)
            if v is None or p is None:
                return None
            if not isinstance(p, str):
                raise self.bad(e.pattern, f"LIKE needs a text pattern, got {kind_of(p)}")
            if isinstance(v, bool):  # a boolean is the integer 1 or 0 (TRUE = 1), as in =
                v = str(int(v))
            elif _is_num(v):
                v = str(v)
            if not isinstance(v, str):
                raise self.bad(e.expr, f"LIKE needs text, got {kind_of(v)}")
            return like(p)(v) != neg
        return like_

    def c_InList(self, e: A.InList) -> Callable[[Row], Any]:
        fv = self.compile(e.expr)
        neg = e.negated
        if all(isinstance(i, A.Literal) for i in e.items):  # a set lookup, as '=' compares
            values = [i.value for i in e.items]
            texts = {v for v in values if isinstance(v, str)}
            numbers = {v for v in values if _is_num(v)}  # 1 = 1.0 = TRUE, as in compare
            has_null = any(v is None for v in values)

            def in_set(r: Row) -> Any:
                v = fv(r)
                if v is None:
                    return None
                hit = v in texts if isinstance(v, str) else _is_num(v) and v in numbers
                if hit:
                    return not neg
                return None if has_null else neg
            return in_set
        items = [self.compile(i) for i in e.items]

        def in_(r: Row) -> Any:
            v = fv(r)
            if v is None:
                return None
            unknown = False
            for f in items:
                eq = self.compare("=", v, f(r), e)
                if eq is None:
                    unknown = True
                elif eq:
                    return not neg
            return None if unknown else neg
        return in_

    def c_Between(self, e: A.Between) -> Callable[[Row], Any]:
        fv, lo, hi = self.compile(e.expr), self.compile(e.low), self.compile(e.high)
        neg = e.negated

        def between(r: Row) -> Any:
            v = fv(r)
            a, b = self.compare(">=", v, lo(r), e), self.compare("<=", v, hi(r), e)
            if a is False or b is False:
                return neg
            if a is None or b is None:
                return None
            return not neg
        return between

    def c_IsNull(self, e: A.IsNull) -> Callable[[Row], Any]:
        f = self.compile(e.expr)
        neg = e.negated
        return lambda r: (f(r) is None) != neg

    # ------------------------------------------------------------ functions

    def c_Call(self, e: A.Call) -> Callable[[Row], Any]:
        args = [self.compile(a) for a in e.args]
        impl = getattr(self, "f_" + e.name, None)
        if impl is None:
            raise self.fail(e, f"unknown function {e.name}()")
        return lambda r: impl(e, [a(r) for a in args])

    def _text(self, e: A.Call, v: Any) -> str:
        if not isinstance(v, str):
            raise self.bad(e, f"{e.name}() takes text, got {kind_of(v)} {v!r:.40}")
        return v

    def _num(self, e: A.Call, v: Any) -> Any:
        if not _is_num(v):
            raise self.bad(e, f"{e.name}() takes a number, got {kind_of(v)} {v!r:.40}")
        return v

    def f_length(self, e: A.Call, a: list) -> Any:
        return None if a[0] is None else len(self._text(e, a[0]).split())

    def f_lower(self, e: A.Call, a: list) -> Any:
        return None if a[0] is None else self._text(e, a[0]).lower()

    def f_upper(self, e: A.Call, a: list) -> Any:
        return None if a[0] is None else self._text(e, a[0]).upper()

    def f_abs(self, e: A.Call, a: list) -> Any:
        return None if a[0] is None else self.checked(abs(self._num(e, a[0])), e)

    def f_round(self, e: A.Call, a: list) -> Any:
        if any(v is None for v in a):
            return None
        x = self._num(e, a[0])
        n = a[1] if len(a) > 1 else 0
        if not isinstance(n, int) or isinstance(n, bool):
            raise self.bad(e, f"round() takes an integer number of digits, got {n!r:.40}")
        return self.checked(round_half_away(x, max(-400, min(400, n))), e)

    def f_coalesce(self, e: A.Call, a: list) -> Any:
        return next((v for v in a if v is not None), None)


def round_half_away(x: int | float, n: int) -> int | float:
    """``x`` rounded to ``n`` decimal digits, halves away from zero (SQL's ``round``, not
    Python's halves to even), from the number as it prints: ``round(2.675, 2)`` is 2.68. An
    integer stays an integer."""
    with decimal.localcontext() as ctx:
        ctx.prec, ctx.Emax, ctx.Emin = 1000, 10_000, -10_000
        d = decimal.Decimal(repr(x) if isinstance(x, float) else int(x))
        if not d.is_finite():
            return x
        r = d.quantize(decimal.Decimal(1).scaleb(-n), rounding=decimal.ROUND_HALF_UP)
    return float(r) if isinstance(x, float) else int(r)


def _in_row(f: Callable[[Row], Any]) -> Callable[[Row], Any]:
    """``f`` whose data errors say which row held the value: its document, or its answer."""
    def run(r: Row) -> Any:
        try:
            return f(r)
        except QueryDataError as exc:
            doc, phrase = r.get("doc.id"), r.get("phrase")
            if phrase is not None:  # an answer's row (its best occurrence's document)
                where = f"answer {phrase!r}" + (f", document {doc!r}" if doc is not None
                                                else "")
            elif doc is not None:
                where = f"document {doc!r}"
            else:
                raise
            raise QueryDataError(f"{exc.short_message} (in {where})", text=exc.text,
                                 line=exc.line, column=exc.column) from None
    return run


def compile_expr(e: A.Expr, text: str = "") -> Callable[[Row], Any]:
    """A function of a row computing ``e`` (names in canonical form, see :mod:`.logical`)."""
    return _in_row(_ExprCompiler(text).compile(e))


def compile_condition(e: A.Expr, text: str = "") -> Callable[[Row], bool]:
    """A predicate of a row: True only where ``e`` is TRUE (NULL and FALSE drop the row)."""
    return _in_row(_ExprCompiler(text).condition(e))
