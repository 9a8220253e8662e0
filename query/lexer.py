"""Query text → tokens.

The lexer turns a query string into a tuple of :class:`Token` ending with one ``eof``
token. It knows the spelling of literals, identifiers, parameters, operators and
comments; it knows nothing about statements. Every malformed input raises
:class:`npmdb.errors.QueryParseError` with the line and column of the offending text.

Token kinds:

``keyword``  a reserved word (value upper case: ``SELECT``)
``ident``    an identifier as written (``phrase``, ``doc``, ``MASKED``)
``qident``   a double-quoted identifier, unescaped (``"end"`` → ``end``)
``string``   a single-quoted string, unescaped (``'it''s'`` → ``it's``)
``integer``  an integer literal (value ``int``)
``float``    a floating point literal (value ``float``)
``param``    ``?`` (value ``None``) or ``:name`` (value ``"name"``)
``op``       punctuation and operators (value as written: ``(``, ``=>``, ``<=`` ...)
``eof``      the end of the input
"""

from __future__ import annotations

import bisect
import math
import re
from dataclasses import dataclass
from typing import Any

from npmdb.errors import QueryParseError

__all__ = [
    "KEYWORDS",
    "MAX_QUERY_LENGTH",
    "MAX_INTEGER",
    "in_int64",
    "Token",
    "tokenize",
    "line_col",
    "error_at",
    "is_plain_identifier",
    "quote_identifier",
    "quote_string",
]

#: Words that cannot be used as bare identifiers (quote them: ``"order"``).
#: Table functions (MASKED, CLASSIFY ...), LABELS, VERSIONS and TAGS are *not* reserved:
#: they are recognised by position, so ``tokens`` stays usable as a column name.
KEYWORDS = frozenset(
    """
    SELECT FROM WHERE GROUP BY ORDER LIMIT OFFSET USING WITH AS OF
    AND OR NOT IN LIKE BETWEEN IS NULL TRUE FALSE ASC DESC
    EXPLAIN ANALYZE SHOW
    """.split()
)

#: Longest accepted query, in characters.
MAX_QUERY_LENGTH = 1_000_000

#: Integer literals must fit in a signed 64-bit integer.
MAX_INTEGER = 2**63 - 1


def in_int64(v: int) -> bool:
    """Whether ``v`` fits in a signed 64-bit integer (a literal, a parameter, a result)."""
    return -MAX_INTEGER - 1 <= v <= MAX_INTEGER

# The line breaks str.splitlines() knows; QueryParseError renders lines with
# splitlines(), so line numbers and `--` comments follow the same rule.
_LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"

_TOKEN_RE = re.compile(
    r"""
      (?P<ws>\s+)
    | (?P<comment>--[^{lb}]*)
    | (?P<bcomment>/\*.*?\*/)
    | (?P<number>(?:[0-9]+\.[0-9]*|\.[0-9]+|[0-9]+)(?:[eE][+-]?[0-9]+)?)
    | (?P<ident>[^\W\d]\w*)
    | (?P<qident>"[^"]*(?:""[^"]*)*")
    | (?P<string>'[^']*(?:''[^']*)*')
    | (?P<param>\?|:[A-Za-z_][A-Za-z0-9_]*)
    | (?P<op><=|>=|<>|!=|=>|[-+*/=<>(),;.])
    """.replace("{lb}", _LINE_BREAKS),
    re.VERBOSE | re.DOTALL,
)

_PLAIN_IDENT_RE = re.compile(r"[^\W\d]\w*\Z")
_BAD_NUMBER_TAIL_RE = re.compile(r"[\w.]*")


@dataclass(frozen=True)
class Token:
    """One lexical token: ``kind``, decoded ``value``, raw ``text`` and offsets."""

    kind: str
    value: Any
    text: str
    pos: int
    end: int

    def is_keyword(self, *words: str) -> bool:
        return self.kind == "keyword" and (not words or self.value in words)

    def is_op(self, *ops: str) -> bool:
        return self.kind == "op" and (not ops or self.value in ops)

    def describe(self) -> str:
        """How an error message names this token."""
        if self.kind == "eof":
            return "end of input"
        if self.kind == "string":
            return "string " + _shorten(self.text)
        if self.kind in ("integer", "float"):
            return "number " + _shorten(self.text)
        if self.kind == "param":
            return "parameter " + self.text
        return "'" + _shorten(self.text, quote=False) + "'"


def _shorten(s: str, limit: int = 30, quote: bool = True) -> str:
    if len(s) > limit:
        s = s[: limit - 3] + "..." + (s[0] if quote and s[:1] in "'\"" else "")
    return s


class _Lines:
    """Offsets of line starts, following str.splitlines() (``\\r\\n`` is one break)."""

    def __init__(self, text: str) -> None:
        starts = [0]
        total = 0
        for line in text.splitlines(keepends=True):
            total += len(line)
            starts.append(total)
        # A final line without a break ends at len(text); drop a duplicate start.
        if starts[-1] == len(text) and len(starts) > 1 and not text.endswith(tuple(_LINE_BREAKS)):
            starts.pop()
        self.starts = starts

    def line_col(self, offset: int) -> tuple[int, int]:
        i = bisect.bisect_right(self.starts, offset) - 1
        return i + 1, offset - self.starts[i] + 1


def line_col(text: str, offset: int) -> tuple[int, int]:
    """1-based (line, column) of character ``offset`` in ``text``."""
    return _Lines(text).line_col(max(0, min(offset, len(text))))


def offset_of(text: str, line: int, column: int) -> int:
    """The character offset of 1-based (``line``, ``column``) in ``text`` (line_col's
    inverse)."""
    starts = _Lines(text).starts
    return max(0, min(starts[max(0, min(line, len(starts)) - 1)] + column - 1, len(text)))


def error_at(text: str, offset: int, message: str, expected: tuple[str, ...] = (),
             cls: type = QueryParseError) -> Any:
    """A :class:`QueryParseError` (or ``cls``, e.g. ``QueryDataError``) pointing at
    ``offset`` in ``text``.

    Later stages (name resolution, binding, evaluation) can use it with a node's ``pos``
    to report errors the same way the parser does.
    """
    line, column = line_col(text, offset if offset is not None else 0)
    return cls(message, text=text, line=line, column=column, expected=tuple(expected))


def is_plain_identifier(name: str) -> bool:
    """True when ``name`` lexes as one bare identifier that is not a keyword."""
    return bool(_PLAIN_IDENT_RE.match(name)) and not (name.isascii() and name.upper() in KEYWORDS)


def quote_identifier(name: str) -> str:
    """``name`` as it must be written: bare when possible, else double-quoted."""
    if is_plain_identifier(name):
        return name
    return '"' + name.replace('"', '""') + '"'


def quote_string(value: str) -> str:
    """A single-quoted SQL string literal."""
    return "'" + value.replace("'", "''") + "'"


def tokenize(text: str) -> tuple[Token, ...]:
    """Split ``text`` into tokens; the last one has kind ``eof``.

    Raises QueryParseError for unterminated strings, quoted identifiers and comments,
    malformed or out-of-range numbers, stray characters and over-long input.
    """
    if len(text) > MAX_QUERY_LENGTH:
        raise QueryParseError(
            f"query is too long ({len(text)} characters; the limit is {MAX_QUERY_LENGTH})",
            text=text[:200], line=1, column=1,
        )
    tokens: list[Token] = []
    pos = 0
    n = len(text)
    last_end = 0
    match = _TOKEN_RE.match
    while pos < n:
        m = match(text, pos)
        if m is None:
            raise _lex_error(text, pos)
        kind = m.lastgroup
        raw = m.group()
        end = m.end()
        if kind in ("ws", "comment", "bcomment"):
            pos = end
            continue
        value: Any
        if kind == "op" and raw == "/" and text.startswith("/*", pos):
            raise error_at(text, pos, "unterminated comment: '/*' without '*/'")
        if kind == "number":
            tail = _BAD_NUMBER_TAIL_RE.match(text, end).group()
            if tail:
                raise error_at(text, pos, f"bad number {_shorten(raw + tail)!r}")
            negated = bool(tokens) and tokens[-1].kind == "op" and tokens[-1].value == "-"
            kind, value = _number(text, pos, raw, negated)
        elif kind == "ident":
            if raw.isascii() and raw.upper() in KEYWORDS:
                kind, value = "keyword", raw.upper()
            else:
                value = raw
        elif kind == "qident":
            value = raw[1:-1].replace('""', '"')
            if not value:
                raise error_at(text, pos, 'empty quoted identifier ""')
        elif kind == "string":
            value = raw[1:-1].replace("''", "'")
        elif kind == "param":
            value = raw[1:] if raw.startswith(":") else None
        else:
            value = raw
        tokens.append(Token(kind, value, raw, pos, end))
        last_end = end
        pos = end
    tokens.append(Token("eof", None, "", last_end, last_end))
    return tuple(tokens)


def _number(text: str, pos: int, raw: str, negated: bool = False) -> tuple[str, int | float]:
    """A number token's kind and value; an integer after a minus sign may be 2**63 (the
    parser folds the sign; one that is not negated is refused there)."""
    if any(c in raw for c in ".eE"):
        value = float(raw)
        if not math.isfinite(value):
            raise error_at(text, pos, f"number out of range {_shorten(raw)!r}")
        return "float", value
    if len(raw.lstrip("0")) > 19 or int(raw) > MAX_INTEGER + negated:
        raise error_at(text, pos, f"integer out of range {_shorten(raw)!r} (must fit in 64 bits)")
    return "integer", int(raw)


def _lex_error(text: str, pos: int) -> QueryParseError:
    ch = text[pos]
    if ch == "'":
        return error_at(text, pos, "unterminated string", ("closing \"'\"",))
    if ch == '"':
        return error_at(text, pos, "unterminated quoted identifier", ("closing '\"'",))
    if ch == ":":
        return error_at(text, pos, "bad parameter: ':' must be followed by a name (:name)")
    if ch == "!":
        return error_at(text, pos, "unexpected character '!'", ("'!='",))
    if ch.isprintable():
        return error_at(text, pos, f"unexpected character {ch!r}")
    return error_at(text, pos, f"unexpected character U+{ord(ch):04X}")


_ESCAPES = {ord(c): ("\\n" if c == "\n" else "\\r" if c == "\r" else f"\\u{ord(c):04x}")
            for c in _LINE_BREAKS}


def one_line(s: str) -> str:
    """``s`` on one line, for a plan: every character that breaks a line (``\\n``, and
    also U+2028, ``\\x0b`` … that ``str.splitlines`` breaks at) escaped, so a name or a
    literal holding one cannot split a plan's line into two rows of EXPLAIN."""
    return s.translate(_ESCAPES)
