"""npmdb's exceptions: one root, :class:`Error`, with DB-API 2.0 style subclasses.

    Error
    ├── InterfaceError          misuse of the API itself (closed database, wrong argument type)
    └── DatabaseError
        ├── DataError           bad input data (non-text document, invalid UTF-8, bad file)
        │   └── QueryDataError  a statement met a value it cannot use (text > number)
        ├── OperationalError    the environment failed (locked, disk full, corrupt file)
        ├── IntegrityError      a constraint would break (duplicate document id)
        ├── InternalError       a bug in npmdb: please report it
        ├── ProgrammingError    a bad query or option (no mask, unknown option, parse error)
        │   └── QueryParseError a statement that does not parse or bind
        └── NotSupportedError   valid, but not available here (missing extra, no GPU)
"""

from __future__ import annotations

__all__ = [
    "Error",
    "Warning",
    "InterfaceError",
    "DatabaseError",
    "DataError",
    "OperationalError",
    "IntegrityError",
    "InternalError",
    "ProgrammingError",
    "NotSupportedError",
    "QueryParseError",
    "QueryDataError",
]


class Warning(Exception):  # noqa: A001 - DB-API name
    """Important warnings (DB-API); npmdb emits them through :mod:`warnings` too."""


class Error(Exception):
    """Root of every exception npmdb raises on purpose."""


class InterfaceError(Error):
    """The API was used the wrong way (closed database, wrong argument type)."""


class DatabaseError(Error):
    """Errors about the database or its contents."""


class DataError(DatabaseError):
    """Input data is unusable: not text, invalid UTF-8, a malformed file."""


class OperationalError(DatabaseError):
    """The environment failed: locked by another writer, disk full, corrupt file."""


class IntegrityError(DatabaseError):
    """A constraint would be broken, e.g. a duplicate document id."""


class InternalError(DatabaseError):
    """npmdb reached a state it should never reach; please report it."""


class ProgrammingError(DatabaseError):
    """The query or its options are wrong: no mask, unknown option, syntax error."""


class NotSupportedError(DatabaseError):
    """Valid, but not available here (a missing optional extra, no GPU)."""


class _Positioned:
    """An error at a place in a statement: ``line``, ``column`` and a caret diagram."""

    def __init__(self, message: str, *, text: str = "", line: int = 1, column: int = 1,
                 expected: tuple[str, ...] = ()) -> None:
        self.text = text
        self.line = line
        self.column = column
        self.expected = tuple(expected)
        self.short_message = message
        super().__init__(self._render(message))

    def __reduce__(self):  # pickled whole (a shard's process, a Ray worker)
        return (_rebuild, (type(self), self.short_message, self.text, self.line, self.column,
                           self.expected))

    def _render(self, message: str) -> str:
        head = f"{message} (line {self.line}, column {self.column})"
        if self.expected:
            head += "; expected " + ", ".join(self.expected)
        lines = self.text.splitlines() or [""]
        if 1 <= self.line <= len(lines):
            src = lines[self.line - 1]
            head += "\n  " + src + "\n  " + " " * (self.column - 1) + "^"
        return head


def _rebuild(cls: type, message: str, text: str, line: int, column: int,
             expected: tuple[str, ...]) -> Exception:
    return cls(message, text=text, line=line, column=column, expected=expected)


class QueryParseError(_Positioned, ProgrammingError):
    """A query string failed to parse; carries line, column and a caret diagram."""


class QueryDataError(_Positioned, DataError):
    """A valid statement met a value it cannot use: a document's text compared with a
    number, arithmetic past 64 bits. Carries the place in the statement (as
    :class:`QueryParseError`) and says which row held the value."""
