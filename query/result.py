"""Query results: :class:`Result` of :class:`Answer` rows, each with its :class:`Evidence`."""

from __future__ import annotations

import json
import math
import numbers
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator, Sequence

from npmdb.errors import NotSupportedError

from .lexer import in_int64

__all__ = ["Evidence", "Answer", "Result", "StageStat", "finite", "json_text",
           "COLUMN_TYPES"]

from .plan import StageStat  # noqa: E402  (re-exported)


def finite(value: Any) -> Any:
    """``value`` with every NaN or infinite number as None: JSON has neither, and a SQL
    expression can compute them (``1e308 * 10``)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def _whole_numbers(values: list) -> bool:
    """Every value is None or a 64-bit int (not a bool), and one is an int: a column
    pandas would make float64, losing every int past 2**53 (2**53 + 1 read ...992.0)."""
    ints = [v for v in values if v is not None]
    return bool(ints) and all(type(v) is int and in_int64(v) for v in ints)


def json_text(value: Any, **kw: Any) -> str:
    """``value`` as strict JSON (:func:`finite`; what JSON cannot hold as its ``str``)."""
    return json.dumps(finite(value), ensure_ascii=False, allow_nan=False, default=str, **kw)


#: The type of each column whose type its name tells, for ``to_arrow`` and ``to_pandas``:
#: an answer's (:meth:`Answer.to_dict`) and the standard columns of the SQL sources
#: (``query/logical.py``'s ``column_names``: MASKED, TOKENS, CLASSIFY, EVIDENCE, SEARCH,
#: DOCUMENTS; SHOW TAGS).
#: "evidence" is a list of :class:`Evidence` as dicts.
COLUMN_TYPES: dict[str, str] = {
    "text": "string", "phrase": "string", "label": "string", "id": "string",
    "doc_id": "string", "doc.id": "string", "title": "string", "doc.title": "string",
    "snippet": "string", "tag": "string",
    "score": "float64",
    "support": "int64", "tokens": "int64", "length": "int64", "start": "int64", "end": "int64",
    "block": "int64", "version": "int64", "generation": "int64", "rank": "int64",
    "answer_score": "float64",
    "evidence": "evidence",
}

#: :class:`Evidence`'s fields and their types, in order.
EVIDENCE_TYPES: tuple[tuple[str, str], ...] = (
    ("doc_id", "string"), ("title", "string"), ("field", "string"), ("start", "int64"),
    ("end", "int64"), ("snippet", "string"), ("score", "float64"))

#: The pandas dtype of a column type (what pandas infers from such values).
_PANDAS_TYPES = {"string": "str", "int64": "int64", "float64": "float64"}


@dataclass(frozen=True, slots=True)
class Evidence:
    """One occurrence of an answer: ``document.text[start:end]`` is the occurrence."""

    doc_id: str
    title: str
    field: str
    start: int
    end: int
    snippet: str
    score: float = 0.0


@dataclass(frozen=True, slots=True)
class Answer:
    """A phrase (or label) with its aggregated score, support and evidence."""

    text: str
    score: float
    support: int
    evidence: tuple[Evidence, ...] = ()
    tokens: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "score": self.score, "support": self.support,
                "tokens": self.tokens, "evidence": [asdict(e) for e in self.evidence]}


@dataclass(frozen=True, eq=False)
class Result:
    """The answers of one query, best first, and how they were produced.

    A result is one query's answer at one moment (its timings included): it equals only
    itself and hashes by identity; compare answers with ``to_list()``.

    ``stats`` lists every plan operator with its output rows and milliseconds;
    ``version``/``generation`` name the snapshot and embeddings that answered.

    A result is a sequence of what ``len`` counts: of its answers (:class:`Answer`) when
    ``fill_mask``/``classify`` gave it, of its rows (dicts, as :meth:`to_list` gives them)
    when SQL did (``columns`` and ``rows`` set; an EVIDENCE row is an occurrence, a SEARCH
    row a block). ``answers`` and ``top`` are the answers either way.
    """

    answers: tuple[Answer, ...]
    query: str = ""
    version: int | None = None
    generation: int | None = None
    stats: tuple[StageStat, ...] = ()
    plan: str = ""
    info: dict = field(default_factory=dict)
    columns: tuple[str, ...] | None = None
    rows: tuple[tuple, ...] | None = None

    @property
    def is_explain(self) -> bool:
        """True for the result of ``EXPLAIN``: one row per line of its plan."""
        return self.info.get("explain") is True

    @property
    def _has_rows(self) -> bool:
        return self.rows is not None and self.columns is not None

    def _row(self, r: tuple) -> dict[str, Any]:
        return dict(zip(self.columns or (), r))

    def __iter__(self) -> Iterator[Any]:
        if self._has_rows:
            return (self._row(r) for r in self.rows or ())
        return iter(self.answers)

    def __len__(self) -> int:
        return len(self.rows or ()) if self._has_rows else len(self.answers)

    def __getitem__(self, i):
        if not self._has_rows:
            return self.answers[i]
        got = (self.rows or ())[i]
        return [self._row(r) for r in got] if isinstance(i, slice) else self._row(got)

    @property
    def top(self) -> Answer | None:
        """The first answer: the best one, unless a statement's ORDER BY put another
        first."""
        return self.answers[0] if self.answers else None

    @property
    def elapsed_ms(self) -> float:
        return sum(s.ms for s in self.stats)

    def to_list(self) -> list[dict[str, Any]]:
        if self._has_rows:
            return list(self)
        return [a.to_dict() for a in self.answers]

    def to_pandas(self):
        try:
            import pandas as pd
        except ImportError as exc:
            raise NotSupportedError("to_pandas needs pandas: pip install 'npmdb[pandas]'") from exc
        rows = self.to_list()
        frame = pd.DataFrame(rows, columns=list(self._column_names()))
        if rows:
            for c in frame.columns:  # whole numbers with a gap: pandas' nullable Int64
                values = [r.get(c) for r in rows]
                if None in values and _whole_numbers(values):
                    frame[c] = pd.array(values, dtype="Int64")
            return frame
        return frame.astype({c: _PANDAS_TYPES[COLUMN_TYPES[c]] for c in frame.columns
                             if COLUMN_TYPES.get(c) in _PANDAS_TYPES})  # not all object

    def to_arrow(self):
        """A table of the rows (answers); a column whose type its name tells
        (:data:`COLUMN_TYPES`) has that type, rows or none, so results concatenate."""
        try:
            import pyarrow as pa
        except ImportError as exc:
            raise NotSupportedError("to_arrow needs pyarrow: pip install 'npmdb[arrow]'") from exc
        rows = self.to_list()
        names = list(rows[0]) if rows else list(self._column_names())
        return pa.table({c: _arrow_column(pa, [r.get(c) for r in rows], COLUMN_TYPES.get(c))
                         for c in names})

    def _column_names(self) -> Sequence[str]:
        if self.columns is not None:
            return self.columns
        return ("text", "score", "support", "tokens", "evidence")

    def explain(self) -> str:
        """The plan with rows and milliseconds per operator (as EXPLAIN ANALYZE)."""
        return self.plan

    def __repr__(self) -> str:
        head = f"Result(version={self.version}, generation={self.generation}, {len(self)} rows"
        if self._has_rows:
            body = "".join(f"\n  {row}" for row in self[:10])
        else:
            body = "".join(f"\n  {a.text!r} score={a.score:.4f} support={a.support}"
                           for a in self.answers[:10])
        return head + ")" + body


def _arrow_column(pa: Any, values: list, kind: str | None = None) -> Any:
    """One Arrow column of ``values``: of type ``kind`` (:data:`COLUMN_TYPES`) when every
    value is one (or None), else inferred. A column that holds values of more than one
    type (a ``meta`` field that is a number in one document and a string or list in
    another) is a column of strings: each value as JSON, a string as itself, a missing one
    as null. So is a column of integers that no one Arrow integer type holds (2**64 - 1
    beside -1)."""
    if kind is not None and all(v is None or _is_kind(v, kind) for v in values):
        try:
            return pa.array(values, type=_arrow_type(pa, kind))
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            pass  # an alias over other values (SELECT length(text) AS start ...): inferred
    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        return pa.array([v if v is None or isinstance(v, str) else json_text(v)
                         for v in values], type=pa.string())


def _is_kind(value: Any, kind: str) -> bool:
    """Whether ``value`` is a Python value of the column type ``kind``."""
    if kind == "string":
        return isinstance(value, str)
    if kind == "evidence":
        return isinstance(value, (list, tuple))
    if isinstance(value, bool):
        return False
    return isinstance(value, numbers.Integral if kind == "int64" else numbers.Real)


def _arrow_type(pa: Any, kind: str) -> Any:
    """The Arrow type of the column type ``kind``."""
    if kind == "evidence":
        return pa.list_(pa.struct([(f, _arrow_type(pa, k)) for f, k in EVIDENCE_TYPES]))
    return {"string": pa.string(), "int64": pa.int64(), "float64": pa.float64()}[kind]
