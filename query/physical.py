"""The vocabulary of physical plans: the operator protocol, the execution state, and the
typed outputs that pass between operators.

Every operator is a frozen dataclass of its parameters with ``run(state)``; the executor
(:mod:`npmdb.query.executor`) runs a plan's operators bottom-up over one :class:`ExecState`
and records rows and milliseconds per operator. An operator returns a typed, frozen
:class:`Output` (kept by the executor for its parent, which reads it with
``state.inputs(self, kind)``); nothing else passes between operators (``state.info``
only collects notes for the Result). Operators read storage only through the snapshot in
the state.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, TypeVar

import numpy as np

__all__ = [
    "ExecState", "Operator", "Output", "QueryVectors", "Candidates", "BlockHits", "Occurrences",
    "Answers", "Rows", "Projection", "Group",
]


@dataclass
class Group:
    """One answer under construction: its key, surface text and occurrences.

    ``idx`` indexes the occurrences in the state's parallel arrays (seg, s, e, score).
    """

    key: Any
    text: str
    score: float = 0.0
    n_tokens: int = 0
    idx: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    weights: np.ndarray | None = None  # per-occurrence scores when not occ.score (classify)
    log_weights: np.ndarray | None = None  # their logs (an overflowed weight is inf)
    evidence: list = field(default_factory=list)
    extra: dict = field(default_factory=dict)
    # the score's logarithm, kept where a query's scores underflow (``scoring.TINY``)
    log_score: float | None = None

    @property
    def support(self) -> int:
        return int(len(self.idx))


# -- typed outputs --------------------------------------------------------------------------


class Output:
    """What an operator hands its parent; ``count`` is the rows EXPLAIN ANALYZE reports."""

    count: int


@dataclass(frozen=True)
class QueryVectors(Output):
    """The query's vectors (``.start``/``.end`` in phrase mode, ``.token`` in token mode)."""

    vectors: Any
    count: int

    def side(self, side: str) -> np.ndarray:
        v = self.vectors
        return {"start": v.start, "end": v.end, "token": v.token}[side]


@dataclass(frozen=True)
class Candidates(Output):
    """Candidate positions per side ('start' | 'end' | 'token') and segment index, and the
    query vectors they were retrieved for (None where none were needed: BM25 blocks)."""

    by_side: Mapping[str, Mapping[int, np.ndarray]]
    count: int
    qv: Any = None
    index: str = ""  # the dense index kinds searched (EXPLAIN ANALYZE), e.g. "ivf"

    @staticmethod
    def union(found: list["Candidates"], side: str) -> dict[int, np.ndarray]:
        """Per segment, the union of every ``found`` set's ``side`` positions (one set's
        positions as they are)."""
        merged: dict[int, np.ndarray] = {}
        for c in found:
            for si, p in c.by_side.get(side, {}).items():
                prev = merged.get(si)
                merged[si] = p if prev is None else np.union1d(prev, p)
        return merged

    @staticmethod
    def query_vectors(found: list["Candidates"]) -> Any:
        return next((c.qv for c in found if c.qv is not None), None)


@dataclass(frozen=True)
class BlockHits(Output):
    """Retrieved blocks, best first: (segment index, block, BM25 score), and when the
    retrieval was asked for it (``BM25Blocks.text_scores``) a fourth item, the block's
    BM25 score on its text alone (the span scorers' block prior)."""

    hits: tuple[tuple[int, int, float], ...]
    # rows of these blocks when the snapshot does not hold them (the shards that do)
    rows_of: Any = field(default=None, compare=False, repr=False)

    @property
    def count(self) -> int:  # type: ignore[override]
        return len(self.hits)


def _empty(dtype: Any = np.float64) -> np.ndarray:
    return np.zeros(0, dtype)


@dataclass(frozen=True)
class Occurrences(Output):
    """Spans (phrase mode) or tokens (token mode, ``e == s``) as parallel arrays over all
    segments: segment index, first and last token; once scored, the exact similarities
    (``sim_e`` in phrase mode only) and each occurrence's score."""

    seg: np.ndarray
    s: np.ndarray
    e: np.ndarray
    qv: Any = None
    sim_s: np.ndarray = field(default_factory=_empty)
    sim_e: np.ndarray = field(default_factory=_empty)
    score: np.ndarray = field(default_factory=_empty)
    # each score's logarithm where some score is below ``scoring.TINY`` (a small tau
    # underflows them), else None
    log_score: np.ndarray | None = field(default=None, compare=False, repr=False)
    # where their texts come from when not from this process's snapshot: the shards that
    # own them (:class:`npmdb.query.exchange.ShardSurfaces`); None: the snapshot
    surfaces: Any = field(default=None, compare=False, repr=False)

    @property
    def count(self) -> int:  # type: ignore[override]
        return int(len(self.s))


@dataclass(frozen=True)
class Answers(Output):
    """Answers (or labels), in their current order; each group's ``idx`` indexes ``occ``."""

    groups: list[Group]
    occ: Occurrences
    count: int


@dataclass(frozen=True)
class Rows(Output):
    """Row-level results (EVIDENCE, SEARCH, DOCUMENTS): one dict per row, keyed by column."""

    rows: list[dict]

    @property
    def count(self) -> int:  # type: ignore[override]
        return len(self.rows)


@dataclass(frozen=True)
class Projection(Output):
    """The statement's output: column names and one tuple per row."""

    columns: tuple[str, ...]
    rows: tuple[tuple, ...]

    @property
    def count(self) -> int:  # type: ignore[override]
        return len(self.rows)


O = TypeVar("O", bound=Output)


@dataclass
class ExecState:
    """One run of a plan: the snapshot it reads, the query, the typed outputs of the
    operators run so far (by operator), and ``info`` notes for the Result."""

    snapshot: Any
    text: str
    encode: Callable[[str, str], Any] | None = None  # None: the snapshot's encoder
    outputs: dict[int, Output] = field(default_factory=dict)  # by id(operator)
    info: dict = field(default_factory=dict)
    root: "Operator | None" = None  # the plan's root, once run
    # what an operator's serial ``prepare`` computed for its (concurrent) ``run``
    prepared: dict[int, Any] = field(default_factory=dict)
    # concurrent operators that read through the snapshot's transaction take turns
    txn_lock: threading.Lock = field(default_factory=threading.Lock)
    # stages run elsewhere (a sharded plan's subtree): (operator, StageStat), recorded
    # with the plan's own
    remote: list = field(default_factory=list)

    def inputs(self, op: "Operator", kind: type[O]) -> list[O]:
        """The outputs of ``op``'s children that are ``kind``s, in child order."""
        found = (self.outputs.get(id(c)) for c in op.children)
        return [o for o in found if isinstance(o, kind)]

    def input(self, op: "Operator", kind: type[O]) -> O:
        """The one ``kind`` output of ``op``'s children."""
        found = self.inputs(op, kind)
        if len(found) != 1:
            raise RuntimeError(f"{op.name} expects one {kind.__name__} input, got {len(found)}")
        return found[0]

    def nearest(self, kind: type[O]) -> O | None:
        """The output of the highest operator on the root's first-child chain that is a
        ``kind`` (the answers a plan ends with, under its row operators)."""
        op = self.root
        while op is not None:
            out = self.outputs.get(id(op))
            if isinstance(out, kind):
                return out
            op = op.children[0] if op.children else None
        return None

    @property
    def groups(self) -> list[Group]:
        """The answers the plan produced (empty for a plan of rows only)."""
        found = self.nearest(Answers)
        return found.groups if found is not None else []


class Operator:
    """Base: ``name``, ``children``, ``detail()`` for EXPLAIN, ``run(state)`` -> its
    :class:`Output`.

    ``concurrent`` operators may run at the same time as concurrent siblings (the executor
    runs their ``prepare`` first, one at a time: everything that reads through the
    snapshot's LMDB transaction, which one thread at a time may use).
    """

    children: tuple["Operator", ...] = ()
    concurrent = False
    remote = False  # True: runs its children itself, elsewhere (an Exchange)

    def prepare(self, st: "ExecState") -> None:
        return None

    @property
    def name(self) -> str:
        return type(self).__name__

    def detail(self) -> str:
        return ""

    def analyzed(self, out: "Output") -> str:
        """The detail EXPLAIN ANALYZE prints once the operator has run (what it found
        out, such as the index kinds it searched); ``detail()`` by default."""
        return self.detail()

    def run(self, st: ExecState) -> Output:  # pragma: no cover - abstract
        raise NotImplementedError


def _fmt(**kw) -> str:
    return ", ".join(f"{k}={v}" for k, v in kw.items())
