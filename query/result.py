"""Query results: :class:`Result` of :class:`Answer` rows, each with its :class:`Evidence`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Iterator, Sequence

from npmdb.errors import NotSupportedError

__all__ = ["Evidence", "Answer", "Result", "StageStat"]

from .plan import StageStat  # noqa: E402  (re-exported)


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


@dataclass(frozen=True)
class Result:
    """The answers of one query, best first, and how they were produced.

    ``stats`` lists every plan operator with its output rows and milliseconds;
    ``version``/``generation`` name the snapshot and embeddings that answered.
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

    def __iter__(self) -> Iterator[Answer]:
        return iter(self.answers)

    def __len__(self) -> int:
        return len(self.rows) if self.rows is not None else len(self.answers)

    def __getitem__(self, i):
        return self.answers[i]

    @property
    def top(self) -> Answer | None:
        return self.answers[0] if self.answers else None

    @property
    def elapsed_ms(self) -> float:
        return sum(s.ms for s in self.stats)

    def to_list(self) -> list[dict[str, Any]]:
        if self.rows is not None and self.columns is not None:
            return [dict(zip(self.columns, r)) for r in self.rows]
        return [a.to_dict() for a in self.answers]

    def to_pandas(self):
        try:
            import pandas as pd
        except ImportError as exc:
            raise NotSupportedError("to_pandas needs pandas: pip install 'npmdb[pandas]'") from exc
        return pd.DataFrame(self.to_list(), columns=list(self._column_names()))

    def to_arrow(self):
        try:
            import pyarrow as pa
        except ImportError as exc:
            raise NotSupportedError("to_arrow needs pyarrow: pip install 'npmdb[arrow]'") from exc
        rows = self.to_list()
        if not rows:
            return pa.table({c: [] for c in self._column_names()})
        return pa.Table.from_pylist(rows)

    def _column_names(self) -> Sequence[str]:
        if self.columns is not None:
            return self.columns
        return ("text", "score", "support", "tokens", "evidence")

    def explain(self) -> str:
        """The plan with rows and milliseconds per operator (as EXPLAIN ANALYZE)."""
        return self.plan

    def __repr__(self) -> str:
        head = f"Result(version={self.version}, generation={self.generation}, {len(self)} rows"
        body = "".join(f"\n  {a.text!r} score={a.score:.4f} support={a.support}"
                       for a in self.answers[:10])
        return head + ")" + body
