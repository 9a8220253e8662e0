"""The syntax tree of npmdb's query language.

Every node is a frozen dataclass holding only data; sequences are tuples. Each node may
carry ``pos`` (the character offset of its first token in the query text) for error
messages; ``pos`` takes no part in equality, hashing, :func:`dump` or printing, so a
parsed tree equals the same tree built by hand.

Field order matches the order in which the printer writes them, so :func:`walk` visits
nodes (and positional parameters) in text order.

Names of fixed vocabularies (options, ``USING`` methods and arguments, function names)
are lower-cased by the parser; column names and label names keep their spelling.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Iterator, Union

__all__ = [
    "GROUP_KEYS", "RETRIEVAL_METHODS", "TABLE_FUNCTIONS", "SHOW_TARGETS",
    "Node", "Expr", "Literal", "Param", "Name", "Star", "Call", "UnaryOp", "BinaryOp",
    "BoolOp", "Like", "InList", "Between", "IsNull",
    "SelectItem", "OrderItem", "Option", "Using", "Label",
    "Source", "Masked", "Classify", "Evidence", "Search", "Documents",
    "Statement", "Select", "Explain", "Show",
    "COMPARISON_OPS", "ARITHMETIC_OPS",
    "dump", "walk", "params",
]

#: Accepted ``GROUP BY`` keys (validated after parsing).
GROUP_KEYS: tuple[str, ...] = ("phrase", "tokens", "document")
#: ``USING`` methods; the parser rejects others with a "did you mean".
RETRIEVAL_METHODS: tuple[str, ...] = ("dense", "bm25", "hybrid", "exact")
#: Table functions after FROM, as written in queries.
TABLE_FUNCTIONS: tuple[str, ...] = ("MASKED", "TOKENS", "CLASSIFY", "EVIDENCE", "SEARCH", "DOCUMENTS")
#: What ``SHOW`` can list.
SHOW_TARGETS: tuple[str, ...] = ("VERSIONS", "TAGS")

COMPARISON_OPS: tuple[str, ...] = ("=", "!=", "<", "<=", ">", ">=")
ARITHMETIC_OPS: tuple[str, ...] = ("+", "-", "*", "/")


@dataclass(frozen=True)
class Node:
    """Base of every syntax tree node."""

    pos: int | None = field(default=None, compare=False, repr=False, kw_only=True)


# ---------------------------------------------------------------- expressions

@dataclass(frozen=True)
class Literal(Node):
    """A constant: ``str``, ``int``, ``float``, ``bool`` or ``None`` (NULL).

    ``kind`` ("string", "integer", "float", "boolean", "null") is derived from the value
    and takes part in equality, so ``Literal(1) != Literal(1.0) != Literal(True)``.
    """

    value: str | int | float | bool | None
    kind: str = field(init=False)

    def __post_init__(self) -> None:
        v = self.value
        if v is None:
            kind = "null"
        elif isinstance(v, bool):
            kind = "boolean"
        elif isinstance(v, int):
            kind = "integer"
        elif isinstance(v, float):
            kind = "float"
        elif isinstance(v, str):
            kind = "string"
        else:
            raise TypeError(f"Literal value must be str, int, float, bool or None, not {type(v).__name__}")
        object.__setattr__(self, "kind", kind)


@dataclass(frozen=True)
class Param(Node):
    """A bind parameter: ``?`` (``index`` = 0-based order among the ``?`` of the
    statement, ``name`` None) or ``:name`` (``name`` set, ``index`` None)."""

    name: str | None = None
    index: int | None = None


@dataclass(frozen=True)
class Name(Node):
    """A column or a dotted path: ``phrase`` → ('phrase',); ``doc.meta.year`` → ('doc', 'meta', 'year')."""

    parts: tuple[str, ...]


@dataclass(frozen=True)
class Star(Node):
    """``*`` in a select list or as a call argument (``count(*)``)."""


@dataclass(frozen=True)
class Call(Node):
    """A function call; ``name`` lower case: ``length(phrase)``."""

    name: str
    args: tuple["Expr", ...] = ()


@dataclass(frozen=True)
class UnaryOp(Node):
    """``NOT operand`` or ``-operand`` (``op`` is "NOT" or "-").

    A minus written directly before a number is folded into a negative Literal.
    """

    op: str
    operand: "Expr"


@dataclass(frozen=True)
class BinaryOp(Node):
    """A comparison (``= != < <= > >=``; ``<>`` is read as ``!=``) or arithmetic (``+ - * /``)."""

    op: str
    left: "Expr"
    right: "Expr"


@dataclass(frozen=True)
class BoolOp(Node):
    """``a AND b AND c`` / ``a OR b``: ``op`` is "AND" or "OR", two or more operands.

    One chain written without parentheses is one node; ``(a AND b) AND c`` nests.
    """

    op: str
    operands: tuple["Expr", ...]


@dataclass(frozen=True)
class Like(Node):
    """``expr [NOT] LIKE pattern`` (SQL patterns: ``%`` any run, ``_`` one character)."""

    expr: "Expr"
    pattern: "Expr"
    negated: bool = False


@dataclass(frozen=True)
class InList(Node):
    """``expr [NOT] IN (item, ...)``."""

    expr: "Expr"
    items: tuple["Expr", ...]
    negated: bool = False


@dataclass(frozen=True)
class Between(Node):
    """``expr [NOT] BETWEEN low AND high`` (inclusive)."""

    expr: "Expr"
    low: "Expr"
    high: "Expr"
    negated: bool = False


@dataclass(frozen=True)
class IsNull(Node):
    """``expr IS [NOT] NULL``."""

    expr: "Expr"
    negated: bool = False


Expr = Union[Literal, Param, Name, Star, Call, UnaryOp, BinaryOp, BoolOp, Like, InList, Between, IsNull]


# ---------------------------------------------------------------- clauses

@dataclass(frozen=True)
class SelectItem(Node):
    """One select-list entry: an expression (or Star) and an optional ``AS alias``."""

    expr: Expr
    alias: str | None = None


@dataclass(frozen=True)
class OrderItem(Node):
    """``expr [ASC | DESC]``."""

    expr: Expr
    descending: bool = False


@dataclass(frozen=True)
class Option(Node):
    """``name = value`` in WITH, or ``name => value`` in a USING method's arguments.

    ``value`` is a Literal (a bare identifier value is read as a string) or a Param.
    """

    name: str
    value: Expr


@dataclass(frozen=True)
class Using(Node):
    """``USING method [(name => value, ...)]``; method is one of RETRIEVAL_METHODS."""

    method: str
    args: tuple[Option, ...] = ()


@dataclass(frozen=True)
class Label(Node):
    """One label of LABELS(...): its name and verbalizer words (string Literals or Params)."""

    name: str
    words: tuple[Expr, ...]


# ---------------------------------------------------------------- sources (FROM)

@dataclass(frozen=True)
class Source(Node):
    """Base of the table functions after FROM."""


@dataclass(frozen=True)
class Masked(Source):
    """``MASKED(query)``, or ``TOKENS(query)`` when ``tokens`` (NPM SINGLE, token mode)."""

    query: Expr
    tokens: bool = False


@dataclass(frozen=True)
class Classify(Source):
    """``CLASSIFY(query, LABELS(name = words, ...))``; labels may be one Param instead."""

    query: Expr
    labels: Union[tuple[Label, ...], Param]


@dataclass(frozen=True)
class Evidence(Source):
    """``EVIDENCE(query)``: the occurrences behind the answers, one row each."""

    query: Expr


@dataclass(frozen=True)
class Search(Source):
    """``SEARCH(text)``: BM25 over blocks."""

    query: Expr


@dataclass(frozen=True)
class Documents(Source):
    """``DOCUMENTS``: the documents of the version read."""


# ---------------------------------------------------------------- statements

@dataclass(frozen=True)
class Select(Node):
    """A query. ``limit``/``offset`` are integer Literals or Params; ``as_of`` a string
    or integer Literal or a Param; ``group_by`` a lower-case identifier."""

    columns: tuple[SelectItem, ...]
    source: Source
    as_of: Expr | None = None
    using: Using | None = None
    options: tuple[Option, ...] = ()
    where: Expr | None = None
    group_by: str | None = None
    order_by: tuple[OrderItem, ...] = ()
    limit: Expr | None = None
    offset: Expr | None = None


@dataclass(frozen=True)
class Explain(Node):
    """``EXPLAIN [ANALYZE] select``."""

    statement: Select
    analyze: bool = False


@dataclass(frozen=True)
class Show(Node):
    """``SHOW VERSIONS`` / ``SHOW TAGS`` (``what`` upper case)."""

    what: str


Statement = Union[Select, Explain, Show]


# ---------------------------------------------------------------- utilities

def _fields(node: Node) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(node) if f.compare and f.init]


def walk(node: Any) -> Iterator[Node]:
    """Every node under ``node`` (itself first), depth first, in text order."""
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, tuple):
            stack.extend(reversed(item))
        elif isinstance(item, Node):
            yield item
            stack.extend(reversed([getattr(item, f.name) for f in _fields(item)]))


def params(node: Node) -> tuple[Param, ...]:
    """The Param nodes of a tree in text order."""
    return tuple(n for n in walk(node) if isinstance(n, Param))


def _inline(node: Node) -> str | None:
    if isinstance(node, Literal):
        return f"Literal {node.value!r}"
    if isinstance(node, Param):
        return f"Param :{node.name}" if node.name is not None else f"Param ?{node.index}"
    if isinstance(node, Name):
        return "Name " + ".".join(repr(p) for p in node.parts)
    if isinstance(node, Star):
        return "Star"
    return None


def dump(node: Any) -> str:
    """An indented, deterministic rendering of a tree (fields at their default are left out)."""
    lines: list[str] = []
    _dump(node, 0, "", lines)
    return "\n".join(lines)


def _dump(value: Any, depth: int, prefix: str, out: list[str]) -> None:
    pad = "  " * depth
    if isinstance(value, Node):
        inline = _inline(value)
        if inline is not None:
            out.append(pad + prefix + inline)
            return
        out.append(pad + prefix + type(value).__name__)
        for f in _fields(value):
            v = getattr(value, f.name)
            if f.default is not dataclasses.MISSING and v == f.default and type(v) is type(f.default):
                continue
            _dump(v, depth + 1, f.name + ": ", out)
    elif isinstance(value, tuple):
        out.append(pad + prefix + ("[]" if not value else ""))
        if not value:
            return
        out[-1] = out[-1].rstrip()
        for item in value:
            _dump(item, depth + 1, "- ", out)
    else:
        out.append(pad + prefix + repr(value))
