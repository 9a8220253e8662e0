"""What a masked-span or classification query asks for: validated, frozen option sets.

``Database.fill_mask``/``classify`` and the SQL planner both build one of these, and the
planner turns it into the same physical plan.
"""

from __future__ import annotations

import difflib
import math
import numbers
from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from npmdb.errors import ProgrammingError

from .lexer import MAX_INTEGER

__all__ = ["MaskedSpec", "ClassifySpec", "DocFilter", "check_options", "check_names", "DEFAULT_K",
           "MAX_LEN", "RANGES", "labels_of"]

MODES = ("phrase", "token")
RETRIEVALS = ("dense", "bm25", "hybrid")
SCORINGS = ("npm", "raw")
GROUPS = ("phrase", "tokens", "document", "word")


@dataclass(frozen=True)
class DocFilter:
    """Restricts retrieval to documents: by id, by title, or by a predicate on the stored
    document (id, title, meta). ``describe`` is what EXPLAIN prints."""

    describe: str
    predicate: Any = field(compare=False, repr=False)  # Callable[[StoredDoc], bool]

    @classmethod
    def shared(cls, describe: str, make_predicate: Callable[[], Any], *,
               statement: str = "") -> "DocFilter":
        """One filter per ``describe`` and ``statement``, for descriptions that determine
        their predicate (the query language's SQL text, bound values included): the
        snapshot caches each filter's document masks by its predicate, so a statement run
        again reuses them. The statement is part of the key because the predicate's errors
        point into it (line, column, caret): another statement with the same condition
        gets its own."""
        key = (describe, statement)
        found = _SHARED.get(key)
        if found is None:
            found = cls(describe, make_predicate())
            if len(_SHARED) >= 256:
                _SHARED.clear()
            _SHARED[key] = found
        return found


_SHARED: dict[tuple[str, str], DocFilter] = {}


# Dense candidates per side. NPM's released code searches k = 4096; measured on dev-small
# cloze with the shipped encoder, 4096 answers no better than 1024 (dense EM 4.7 vs 5.8)
# for 4x the candidates, so the default stays 1024 (bench/results/inference-dev-small.md).
DEFAULT_K = 1024


@dataclass(frozen=True)
class MaskedSpec:
    text: str
    top: int = 5
    k: int = DEFAULT_K
    mode: str = "phrase"
    # None: BM25 blocks (NPM's restricted mode, the paper's best open-set setting), or
    # dense where exact=True asks for an exact scan of the vectors (masked_retrieval).
    # Measured with the shipped encoder, cloze EM 46.0 (bm25) against 12.1 (dense) on
    # dev-small and 53.9 against 11.9 on dev (bench/results/inference-dev-small.md).
    # Classification keeps NPM's dense search over the whole corpus.
    retrieval: str | None = None
    blocks: int = 3
    max_len: int = 10
    tau: float = 1.0
    alpha: float = 0.0
    exact: bool = False
    scoring: str = "npm"
    group_by: str = "phrase"
    clean_edges: bool = True
    no_stopwords: bool = False
    # drop answers whose words are a run of the query's own words (not in NPM; measured on
    # dev-small cloze with the shipped encoder: bm25 EM 18.9 -> 21.4, dense unchanged)
    not_in_query: bool = True
    # drop answers holding any word of the query that is not a stopword ("capital of
    # Moldova" for "Where is Moldova? It is in [MASK]."; not in NPM; measured on dev-small
    # cloze with bm25_title on: bm25 EM 28.2 -> 29.3, length-macro 10.0 -> 10.7,
    # relation-macro 23.3 -> 24.4, dense and translation unchanged)
    no_query_words: bool = True
    # drop answers found only in an entry's head ("Washington (Evergreen State, WA): ...")
    # whose title or other names occur in the query: names of the query's subject, not
    # answers (query/subjects.py; not in NPM; measured with the shipped encoder, bm25 cloze
    # EM 46.0 -> 47.4 on dev-small, 53.9 -> 55.1 on dev; bench/results/inference-dev-small.md)
    not_subject_name: bool = True
    # drop answers found only as part of a longer capitalised name ("New" of "New York",
    # "Korea" of "South Korea"; query/names.py; not in NPM; measured in
    # bench/results/inference-dev-small.md)
    whole_names: bool = True
    # BM25 retrieval matches the document title too (NPM's blocks carried it; measured on
    # dev-small cloze with the shipped encoder: bm25 EM 21.4 -> 28.2, length-macro 7.2 ->
    # 10.0, relation-macro 18.7 -> 23.3). bm25_question searches only the question before
    # the mask, as NPM cut a question at "?" (measured: 21.4 -> 20.0, so off).
    bm25_title: bool = True
    bm25_question: bool = False
    # BM25 retrieval: each start's and end's similarity gains bm25_prior x its block's BM25
    # score on the block text alone (a retrieval prior; the title still picks the blocks).
    # Not in NPM (0 is NPM's score); measured on dev-small with the shipped encoder, bm25
    # cloze EM 37.0 -> 46.0, translation 10.6 -> 27.5 at 0.5 (bench/results/
    # inference-dev-small.md)
    bm25_prior: float = 0.5
    evidence: int = 3
    offset: int = 0
    version: int | str | None = None
    doc_filter: DocFilter | None = None

    def __post_init__(self) -> None:
        if self.retrieval is None:
            object.__setattr__(self, "retrieval", masked_retrieval(self.exact))
        _validate(self)


def masked_retrieval(exact: bool) -> str:
    """A masked query's retrieval when none is named: an exact scan of the dense vectors
    if ``exact`` asks for one, else BM25 blocks."""
    return "dense" if exact is True else "bm25"


@dataclass(frozen=True)
class ClassifySpec:
    text: str
    labels: tuple[tuple[str, tuple[str, ...]], ...]
    k: int = DEFAULT_K
    mode: str = "phrase"
    retrieval: str = "dense"
    blocks: int = 3
    max_len: int = 10
    tau: float = 5.0
    exact: bool = False
    clean_edges: bool = True
    bm25_title: bool = True
    bm25_question: bool = False
    # contextual calibration against the label prior of the sentence holding the mask
    # (measured on dev-small sentiment: 49.4 -> 51.7 with one word per label, 49.4 ->
    # 60.5 with ten; off: a second query per call, and scores become label probabilities)
    calibrate: bool = False
    evidence: int = 3
    version: int | str | None = None
    doc_filter: DocFilter | None = None
    top: int = 0  # 0 = every label
    offset: int = 0

    def __post_init__(self) -> None:
        _validate(self)
        if not self.labels:
            raise ProgrammingError("classify needs at least one label, e.g. "
                                   "{'positive': ['great'], 'negative': ['terrible']}")
        for label, words in self.labels:
            if not isinstance(label, str) or not label:
                raise ProgrammingError(f"label names must be non-empty strings, not {label!r}")
            if not words or not all(isinstance(w, str) and w.strip() for w in words):
                raise ProgrammingError(f"label {label!r} needs one or more non-empty words")


def _shown(v: Any) -> str:
    """``v`` for a message: an integer too long to print whole is named by its size."""
    if isinstance(v, int) and v.bit_length() > 64:
        sign = "a negative" if v < 0 else "an"
        return f"{sign} integer of about {round(v.bit_length() * math.log10(2))} digits"
    return repr(v)


def labels_of(labels: Any) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """classify's labels as ``(name, words)`` pairs. A name is a str or an int (a class id,
    named by its digits); two that read the same (1 and "1") are refused: their answers
    were merged into one, under one name."""
    if not isinstance(labels, Mapping):
        raise ProgrammingError("labels must be a dict of label -> word or list of words")
    out: dict[str, tuple[str, ...]] = {}
    for label, words in labels.items():
        if isinstance(label, bool) or not isinstance(label, (str, numbers.Integral)):
            raise ProgrammingError(f"label names are strings (or integer class ids), not "
                                   f"{label!r}")
        name = label if isinstance(label, str) else str(int(label))
        if name in out:
            raise ProgrammingError(f"two labels are named {name!r} (as text): give each "
                                   "label its own name")
        out[name] = _label_words(label, words)
    return tuple(out.items())


def _label_words(label: Any, words: Any) -> tuple[str, ...]:
    """A classify label's words as a tuple: one str, or an iterable of str."""
    if isinstance(words, str):
        return (words,)
    try:
        got = tuple(words) if not isinstance(words, (bytes, bytearray)) else None
    except TypeError:
        got = None
    if got is None or not all(isinstance(w, str) for w in got):
        raise ProgrammingError(f"label {label!r}: words must be a str or a list of str, got "
                               f"{words!r:.80}")
    return got


#: The longest answer, in tokens, a query may ask for (``max_len``).
MAX_LEN = 64

#: Accepted ranges of the float options.
RANGES = {"tau": (1e-3, 1e3), "alpha": (-16.0, 16.0), "bm25_prior": (0.0, 100.0)}


def _validate(spec) -> None:
    if not isinstance(spec.text, str):
        raise ProgrammingError(f"the query must be a string, not {type(spec.text).__name__}")
    # bounded as SQL's integers are (a count past 2**63 - 1 is a mistake, and printing it
    # in a plan is Python's ValueError past 4,300 digits)
    _int(spec, "k", 1, MAX_INTEGER)
    _int(spec, "blocks", 1, MAX_INTEGER)
    _int(spec, "max_len", 1, MAX_LEN)
    _int(spec, "top", 0, MAX_INTEGER)
    _int(spec, "offset", 0, MAX_INTEGER)
    _int(spec, "evidence", 0, MAX_INTEGER)
    if spec.doc_filter is not None and not isinstance(spec.doc_filter, DocFilter):
        raise ProgrammingError(
            f"doc_filter takes a npmdb.query.spec.DocFilter, not "
            f"{type(spec.doc_filter).__name__}: to restrict the documents a query reads, use "
            "SQL, e.g. db.sql(\"SELECT phrase FROM MASKED(?) WHERE doc.id IN ('a', 'b')\", "
            "[query])")
    # numbers: numpy's too (a value read from a data frame), as Python floats
    for name in ("tau", "alpha", "bm25_prior"):
        if not hasattr(spec, name):
            continue
        v = getattr(spec, name)
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise ProgrammingError(f"{name} must be a {'positive ' if name == 'tau' else ''}"
                                   f"number, got {v!r}")
        if not isinstance(v, (int, float)):  # numpy's: as a Python float
            object.__setattr__(spec, name, float(v))
    if not spec.tau > 0:
        raise ProgrammingError(f"tau must be a positive number, got {_shown(spec.tau)}")
    # NaN, infinite or extreme values give NaN or infinite scores (or overflow when
    # occurrences are summed), not answers
    for name, (lo, hi) in RANGES.items():
        v = getattr(spec, name, None)
        # the range first: an int past float's range compares exactly (isfinite overflows)
        if v is not None and not (lo <= v <= hi and math.isfinite(v)):
            raise ProgrammingError(f"{name} must be a finite number in [{lo:g}, {hi:g}], "
                                   f"got {_shown(v)}")
    _choice(spec, "mode", MODES)
    _choice(spec, "retrieval", RETRIEVALS)
    if hasattr(spec, "scoring"):
        _choice(spec, "scoring", SCORINGS)
        _choice(spec, "group_by", GROUPS)
    for name in ("exact", "clean_edges", "not_in_query", "no_query_words", "not_subject_name",
                 "whole_names", "no_stopwords",
                 "bm25_title", "bm25_question", "calibrate"):
        if not hasattr(spec, name):
            continue
        v = getattr(spec, name)
        if isinstance(v, np.bool_):  # numpy's (a value read from a data frame): as bool
            object.__setattr__(spec, name, bool(v))
        elif not isinstance(v, bool):
            raise ProgrammingError(f"{name} must be True or False, got {v!r}")


def _int(spec, name: str, lo: int, hi: int | None = None) -> None:
    v = getattr(spec, name)
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise ProgrammingError(f"{name} must be an integer, got {v!r}")
    if type(v) is not int:  # numpy's integers (a value read from a data frame): as int
        v = int(v)
        object.__setattr__(spec, name, v)
    if v < lo or (hi is not None and v > hi):
        rng = f">= {lo}" if hi is None else f"between {lo} and {hi}"
        raise ProgrammingError(f"{name} must be {rng}, got {_shown(v)}")


def _choice(spec, name: str, choices: tuple[str, ...]) -> None:
    v = getattr(spec, name)
    if v not in choices:
        close = difflib.get_close_matches(str(v), choices, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ProgrammingError(f"{name} must be one of {', '.join(choices)}, got {v!r}{hint}")


def check_options(cls, options: Mapping[str, Any]) -> None:
    """Unknown keyword options get a clear error with a suggestion."""
    check_names(options, {f.name for f in fields(cls)} - {"text", "labels"})


def check_names(options: Iterable[str], known: Iterable[str], where: str = "") -> None:
    """A name outside ``known`` is a ProgrammingError with the closest known one (or the
    list); ``where`` prefixes the message (``npmdb.open``: a misspelt ``read_only=True``
    would otherwise be a bare TypeError)."""
    known = sorted(known)
    for name in options:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; known: {', '.join(known)}"
            raise ProgrammingError(f"{where + ': ' if where else ''}unknown option {name!r}{hint}")


def with_options(spec, **changes):
    return replace(spec, **changes)
