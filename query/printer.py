"""Syntax tree → canonical SQL text.

:func:`to_sql` writes one line: keywords upper case, single spaces, clauses in their
required order, parentheses only where precedence needs them, identifiers quoted only
when they must be. ``parse(to_sql(tree)) == tree`` holds for every tree the parser
builds (and for hand-built trees whose positional Params are numbered in text order).
"""

from __future__ import annotations

from typing import Any

from npmdb.errors import InternalError

from . import ast as A
from .lexer import quote_identifier, quote_string

__all__ = ["to_sql", "expr_to_sql"]

# Binding strength, weakest first.
_OR, _AND, _NOT, _PREDICATE, _ADD, _MUL, _NEG, _ATOM = range(1, 9)


def to_sql(node: A.Node) -> str:
    """Canonical SQL for a statement, a source, a clause node or an expression."""
    if isinstance(node, A.Select):
        return _select(node)
    if isinstance(node, A.Explain):
        return "EXPLAIN " + ("ANALYZE " if node.analyze else "") + _select(node.statement)
    if isinstance(node, A.Show):
        return "SHOW " + node.what.upper()
    if isinstance(node, A.Source):
        return _source(node)
    if isinstance(node, A.Using):
        return _using(node)
    if isinstance(node, A.Option):
        return quote_identifier(node.name) + " = " + expr_to_sql(node.value)
    if isinstance(node, A.SelectItem):
        return _select_item(node)
    if isinstance(node, A.OrderItem):
        return _order_item(node)
    if isinstance(node, A.Label):
        return _label(node)
    return expr_to_sql(node)


def _select(s: A.Select) -> str:
    out = ["SELECT", ", ".join(_select_item(c) for c in s.columns), "FROM", _source(s.source)]
    if s.as_of is not None:
        out += ["AS OF", expr_to_sql(s.as_of)]
    if s.using is not None:
        out.append(_using(s.using))
    if s.options:
        out += ["WITH", ", ".join(quote_identifier(o.name) + " = " + expr_to_sql(o.value) for o in s.options)]
    if s.where is not None:
        out += ["WHERE", expr_to_sql(s.where)]
    if s.group_by is not None:
        out += ["GROUP BY", quote_identifier(s.group_by)]
    if s.order_by:
        out += ["ORDER BY", ", ".join(_order_item(o) for o in s.order_by)]
    if s.limit is not None:
        out += ["LIMIT", expr_to_sql(s.limit)]
    if s.offset is not None:
        out += ["OFFSET", expr_to_sql(s.offset)]
    return " ".join(out)


def _select_item(item: A.SelectItem) -> str:
    text = expr_to_sql(item.expr)
    return text if item.alias is None else f"{text} AS {quote_identifier(item.alias)}"


def _order_item(item: A.OrderItem) -> str:
    return expr_to_sql(item.expr) + (" DESC" if item.descending else "")


def _using(u: A.Using) -> str:
    text = "USING " + quote_identifier(u.method)
    if u.args:
        text += "(" + ", ".join(quote_identifier(a.name) + " => " + expr_to_sql(a.value) for a in u.args) + ")"
    return text


def _label(label: A.Label) -> str:
    words = label.words
    body = expr_to_sql(words[0]) if len(words) == 1 else "(" + ", ".join(expr_to_sql(w) for w in words) + ")"
    return quote_identifier(label.name) + " = " + body


def _source(src: A.Source) -> str:
    if isinstance(src, A.Masked):
        return ("TOKENS(" if src.tokens else "MASKED(") + expr_to_sql(src.query) + ")"
    if isinstance(src, A.Classify):
        labels = (expr_to_sql(src.labels) if isinstance(src.labels, A.Param)
                  else "LABELS(" + ", ".join(_label(lab) for lab in src.labels) + ")")
        return "CLASSIFY(" + expr_to_sql(src.query) + ", " + labels + ")"
    if isinstance(src, A.Evidence):
        return "EVIDENCE(" + expr_to_sql(src.query) + ")"
    if isinstance(src, A.Search):
        return "SEARCH(" + expr_to_sql(src.query) + ")"
    if isinstance(src, A.Documents):
        return "DOCUMENTS"
    raise InternalError(f"cannot print source {src!r}")


# ---------------------------------------------------------------- expressions

def _precedence(e: Any) -> int:
    if isinstance(e, A.BoolOp):
        return _OR if e.op == "OR" else _AND
    if isinstance(e, A.UnaryOp):
        return _NOT if e.op == "NOT" else _NEG
    if isinstance(e, (A.Like, A.InList, A.Between, A.IsNull)):
        return _PREDICATE
    if isinstance(e, A.BinaryOp):
        if e.op in ("+", "-"):
            return _ADD
        if e.op in ("*", "/"):
            return _MUL
        return _PREDICATE
    if isinstance(e, A.Literal) and e.kind in ("integer", "float") and _is_negative(e.value):
        return _NEG  # printed with a leading minus
    return _ATOM


def _is_negative(v: float) -> bool:
    return v < 0 or (v == 0 and str(v).startswith("-"))


def _wrap(e: Any, minimum: int) -> str:
    """``e`` printed, parenthesised when it binds weaker than ``minimum``."""
    text = expr_to_sql(e)
    return "(" + text + ")" if _precedence(e) < minimum else text


def expr_to_sql(e: Any) -> str:
    """Canonical SQL for one expression."""
    if isinstance(e, A.Literal):
        return _literal(e)
    if isinstance(e, A.Param):
        return "?" if e.name is None else ":" + e.name
    if isinstance(e, A.Name):
        return ".".join(quote_identifier(p) for p in e.parts)
    if isinstance(e, A.Star):
        return "*"
    if isinstance(e, A.Call):
        return quote_identifier(e.name) + "(" + ", ".join(expr_to_sql(a) for a in e.args) + ")"
    if isinstance(e, A.BoolOp):
        p = _precedence(e)
        return f" {e.op} ".join(_wrap(o, p + 1) for o in e.operands)
    if isinstance(e, A.UnaryOp):
        if e.op == "NOT":
            return "NOT " + _wrap(e.operand, _NOT)
        operand = e.operand
        text = expr_to_sql(operand)
        if _precedence(operand) < _NEG or (
                isinstance(operand, A.Literal) and operand.kind in ("integer", "float") and not text.startswith("-")):
            return "-(" + text + ")"  # "-(3)": a bare "-3" would read as the literal -3
        return ("- " if text.startswith("-") else "-") + text  # never "--": that starts a comment
    if isinstance(e, A.BinaryOp):
        p = _precedence(e)
        left_min = _ADD if p == _PREDICATE else p
        right_min = _ADD if p == _PREDICATE else p + 1
        return f"{_wrap(e.left, left_min)} {e.op} {_wrap(e.right, right_min)}"
    if isinstance(e, A.Like):
        op = " NOT LIKE " if e.negated else " LIKE "
        return _wrap(e.expr, _ADD) + op + _wrap(e.pattern, _ADD)
    if isinstance(e, A.InList):
        op = " NOT IN (" if e.negated else " IN ("
        return _wrap(e.expr, _ADD) + op + ", ".join(expr_to_sql(i) for i in e.items) + ")"
    if isinstance(e, A.Between):
        op = " NOT BETWEEN " if e.negated else " BETWEEN "
        return _wrap(e.expr, _ADD) + op + _wrap(e.low, _ADD) + " AND " + _wrap(e.high, _ADD)
    if isinstance(e, A.IsNull):
        return _wrap(e.expr, _ADD) + (" IS NOT NULL" if e.negated else " IS NULL")
    raise InternalError(f"cannot print expression {e!r}")


def _literal(lit: A.Literal) -> str:
    v = lit.value
    if lit.kind == "null":
        return "NULL"
    if lit.kind == "boolean":
        return "TRUE" if v else "FALSE"
    if lit.kind == "string":
        return quote_string(v)
    if lit.kind == "float":
        text = repr(v)
        if text in ("inf", "-inf", "nan"):
            raise InternalError(f"cannot print non-finite number {text}")
        return text
    return str(v)
