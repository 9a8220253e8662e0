"""Exact match of masked-span questions with known answers, one version at a time.

How a user measures whether a change helped on their own questions: ``npmdb.train``
writes a new version, and the version before it stays readable (``AS OF``), so the two
are compared on the same questions::

    qs = npmdb.evaluation.load_questions("my-questions.jsonl")
    before = npmdb.evaluate(db, qs, version=1, retrieval="bm25")
    after = npmdb.evaluate(db, qs, retrieval="bm25")          # HEAD
    print(before, after, sep="\\n")

The measure is the NPM paper's: the top answer against every gold answer after SQuAD
normalisation (lower case, no punctuation or articles, white space folded), reported
micro-averaged, macro-averaged over answer lengths 1, 2, 3 and 4+ words, and
macro-averaged over the questions' ``relation`` groups (one group when none is given).
``bench/quality.py`` scores the bundled evaluation sets with the same functions.

Whether a difference between two versions is more than noise: :func:`compare` pairs the
two evaluations question by question (which questions one got right and the other not)
and gives McNemar's exact test on those, as a few hundred questions move a point or two
between any two runs::

    print(npmdb.evaluation.compare(before, after))

:func:`keep_if_better` makes the comparison the rule after a training run (``npmdb train
--keep-if-better QUESTIONS``): the trained version stays HEAD only if it answers more of
the questions; otherwise a new version restores the one before training (the trained one
stays readable with ``AS OF``).
"""

from __future__ import annotations

import gzip
import json
import math
import numbers
import re
import string
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from .arguments import check_text
from .errors import DataError, NotSupportedError, ProgrammingError
from .progress import progress_bar
from .query.spec import MaskedSpec, check_options
from .query.text import split_mask

if TYPE_CHECKING:  # pragma: no cover
    from .database import Database

__all__ = ["Question", "QuestionResult", "Evaluation", "Comparison", "Decision",
           "load_questions", "evaluate", "check_settings", "compare", "keep_if_better",
           "mcnemar_exact", "normalize_answer", "exact_match", "length_bucket", "COLUMNS"]

_PUNCT = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(s: str) -> str:
    """SQuAD normalisation: lower case, strip punctuation and articles, fold white space."""
    s = "".join(ch for ch in s.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", s).split())


def exact_match(pred: str | None, answers: Iterable[str]) -> bool:
    """Whether ``pred`` equals one of ``answers`` after :func:`normalize_answer`."""
    if pred is None:
        return False
    p = normalize_answer(pred)
    return any(p == normalize_answer(a) for a in answers)


def length_bucket(n: int) -> str:
    """NPM's answer-length bucket of an ``n``-word answer: "1", "2", "3" or "4+"."""
    return str(n) if n < 4 else "4+"


@dataclass(frozen=True, slots=True)
class Question:
    """A masked-span question with its gold answers.

    ``relation``: the group it is reported in (a relation, a task); ``length``: the
    answer's length in words for the length macro-average (default: the first answer's)."""

    query: str
    answers: tuple[str, ...]
    relation: str = ""
    id: str = ""
    length: int = 0

    def __post_init__(self) -> None:
        split_mask(self.query)  # exactly one mask, or a clear ProgrammingError
        check_text(self.query, "the query")
        try:
            answers = () if isinstance(self.answers, str) else tuple(self.answers)
        except TypeError:
            answers = ()
        if not answers or not all(isinstance(a, str) and a.strip() for a in answers):
            raise ProgrammingError(f"question {self.query!r}: answers must be a non-empty "
                                   f"list of non-empty strings, got {self.answers!r}")
        object.__setattr__(self, "answers", answers)
        for name in ("relation", "id"):  # grouped, sorted and written out as text
            value = getattr(self, name)
            if not isinstance(value, str):
                raise ProgrammingError(f"question {self.query!r}: {name} must be a string "
                                       f"(\"\" for none), got {type(value).__name__} {value!r}")
        check_text(answers, f"question {self.query!r}: an answer")
        check_text(self.relation, f"question {self.query!r}: the relation")
        check_text(self.id, f"question {self.query!r}: the id")
        if isinstance(self.length, bool) or not isinstance(self.length, int) or \
                self.length < 0:
            raise ProgrammingError(f"question {self.query!r}: length must be a whole number "
                                   f"of words, got {self.length!r}")
        if self.length == 0:
            object.__setattr__(self, "length", max(1, len(self.answers[0].split())))

    @property
    def bucket(self) -> str:
        return length_bucket(self.length)

    @classmethod
    def from_dict(cls, row: Mapping[str, Any]) -> "Question":
        """From a JSON object: ``query`` and ``answers`` (a list, or one string), optional
        ``relation``, ``id`` and ``answer_ngram`` (the answer's length in words)."""
        if not isinstance(row, Mapping):
            raise ProgrammingError(f"a question must be an object, got {type(row).__name__}")
        missing = [k for k in ("query", "answers") if k not in row]
        if missing:
            raise ProgrammingError(f"a question needs the fields 'query' and 'answers'; "
                                   f"missing {', '.join(missing)} in {dict(row)!r}")
        answers = row["answers"]
        if not isinstance(answers, (str, list, tuple)):
            raise ProgrammingError(f"question {row['query']!r}: answers must be a list of "
                                   f"strings, got {answers!r}")
        length = row.get("answer_ngram")
        length = 0 if length is None else length
        if isinstance(length, bool) or not isinstance(length, int) or length < 0:
            raise ProgrammingError(f"question {row['query']!r}: answer_ngram must be a whole "
                                   f"number of words, got {length!r}")
        return cls(query=row["query"], answers=(answers,) if isinstance(answers, str)
                   else tuple(answers), relation=_label_text(row, "relation"),
                   id=_label_text(row, "id"), length=length)


def _label_text(row: Mapping[str, Any], name: str) -> str:
    """A question's ``relation`` or ``id`` as read from JSON: a string or a number, as
    text ("" when absent or null); anything else is refused."""
    value = row.get(name)
    if value is None:
        return ""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ProgrammingError(f"question {row['query']!r}: {name} must be a string or a "
                               f"number, got {value!r}")
    return str(value)


def load_questions(source: str | Path | Iterable[Mapping[str, Any] | Question]
                   ) -> list[Question]:
    """Questions from a JSONL(.gz) file (one object a line, as :meth:`Question.from_dict`
    reads) or from an iterable of dicts or :class:`Question` s."""
    if isinstance(source, (str, Path)):
        path = Path(source)
        if not path.is_file():
            raise ProgrammingError(f"no question file {path}: give a JSONL file with one "
                                   '{"query": ..., "answers": [...]} object a line')
        opener = gzip.open if path.suffix == ".gz" else open
        out = []
        try:
            with opener(path, "rb") as f:  # bytes, decoded a line at a time: exact line numbers
                for lineno, raw in enumerate(f, 1):
                    try:
                        line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
                    except UnicodeDecodeError as exc:
                        raise DataError(f"{path}, line {lineno}: not UTF-8 text ({exc.reason} "
                                        f"at byte {exc.start}): save the file as UTF-8") from None
                    if not line.strip():
                        continue
                    try:
                        out.append(Question.from_dict(json.loads(line)))
                    except (json.JSONDecodeError, ProgrammingError, TypeError, ValueError) as exc:
                        raise DataError(f"{path}, line {lineno}: {exc}") from exc
        except (OSError, EOFError) as exc:  # a damaged or mislabelled .gz, an unreadable file
            raise DataError(f"{path} cannot be read ({exc}): give a JSONL file, gzipped only "
                            "when its name ends in .gz") from None
    else:
        out = [q if isinstance(q, Question) else Question.from_dict(q)
               for q in _question_items(source)]
    if not out:
        raise ProgrammingError(f"no questions in {source!r}")
    return out


def _question_items(source: Any) -> Iterable[Any]:
    """``source`` when it is a collection of questions; what to pass instead when not."""
    if isinstance(source, Mapping) or not isinstance(source, Iterable) or \
            isinstance(source, (bytes, bytearray)):
        raise ProgrammingError(f"questions must be a question file's path or a list of "
                               f'{{"query": ..., "answers": [...]}} dicts, got '
                               f"{type(source).__name__} {source!r:.80}")
    return source


@dataclass(frozen=True, slots=True)
class QuestionResult:
    """One question's top answer (None: nothing answered) and whether it is right."""

    id: str
    query: str
    answers: tuple[str, ...]
    relation: str
    bucket: str
    predicted: str | None
    correct: bool

    def to_dict(self) -> dict[str, Any]:
        return dict(id=self.id, query=self.query, answers=list(self.answers),
                    relation=self.relation, bucket=self.bucket, predicted=self.predicted,
                    correct=self.correct)


#: The columns of :meth:`Evaluation.to_list` / ``to_pandas`` / ``to_arrow``.
COLUMNS = ("id", "query", "answers", "relation", "bucket", "predicted", "correct")


#: ``Evaluation``'s groupings and the :class:`QuestionResult` field each reads.
_GROUP_FIELDS = {"length": "bucket", "relation": "relation"}


def _share(flags: Sequence[bool]) -> float:
    return 100.0 * sum(flags) / len(flags) if flags else 0.0


@dataclass(frozen=True)
class Evaluation:
    """Exact match (in %) of one version and retrieval on a set of questions."""

    version: int
    generation: int
    retrieval: str
    options: Mapping[str, Any]
    results: tuple[QuestionResult, ...]
    seconds: float

    @property
    def n(self) -> int:
        return len(self.results)

    def _groups(self, by: str) -> dict[str, list[bool]]:
        key = _GROUP_FIELDS[by]
        groups: dict[str, list[bool]] = defaultdict(list)
        for r in self.results:
            groups[getattr(r, key)].append(r.correct)
        return dict(sorted(groups.items()))

    def sizes(self, by: str) -> dict[str, int]:
        """How many questions each answer length (``by="length"``) or relation
        (``by="relation"``) holds."""
        return {g: len(v) for g, v in self._groups(by).items()}

    @property
    def by_length(self) -> dict[str, float]:
        return {b: _share(v) for b, v in self._groups("length").items()}

    @property
    def by_relation(self) -> dict[str, float]:
        return {g: _share(v) for g, v in self._groups("relation").items()}

    @property
    def micro(self) -> float:
        return _share([r.correct for r in self.results])

    @property
    def length_macro(self) -> float:
        v = self.by_length
        return sum(v.values()) / len(v) if v else 0.0

    @property
    def relation_macro(self) -> float:
        v = self.by_relation
        return sum(v.values()) / len(v) if v else 0.0

    def summary(self) -> dict[str, Any]:
        """The figures without the per-question rows."""
        return dict(version=self.version, generation=self.generation, retrieval=self.retrieval,
                    n=self.n, micro=self.micro, length_macro=self.length_macro,
                    relation_macro=self.relation_macro, by_length=self.by_length,
                    by_relation=self.by_relation, seconds=self.seconds)

    def to_list(self) -> list[dict[str, Any]]:
        """One dict per question: its top answer and whether it is right."""
        return [r.to_dict() for r in self.results]

    def to_pandas(self):
        try:
            import pandas as pd
        except ImportError as exc:
            raise NotSupportedError("to_pandas needs pandas: pip install 'npmdb[pandas]'") from exc
        frame = pd.DataFrame(self.to_list(), columns=list(COLUMNS))
        return frame if self.results else frame.astype({"correct": bool})

    def to_arrow(self):
        """One row per question, in the same schema whether or not there are any."""
        try:
            import pyarrow as pa
        except ImportError as exc:
            raise NotSupportedError("to_arrow needs pyarrow: pip install 'npmdb[arrow]'") from exc
        schema = pa.schema([(c, pa.list_(pa.string()) if c == "answers" else
                             pa.bool_() if c == "correct" else pa.string()) for c in COLUMNS])
        return pa.Table.from_pylist(self.to_list(), schema=schema)

    def __str__(self) -> str:
        return (f"version {self.version} (generation {self.generation}), {self.retrieval}: "
                f"{self.n} questions, EM {self.micro:.1f} micro, {self.length_macro:.1f} "
                f"length-macro, {self.relation_macro:.1f} relation-macro")


def evaluate(db: "Database", questions: str | Path | Iterable[Mapping[str, Any] | Question], *,
             version: int | str | None = None, retrieval: str | None = "bm25",
             max_len: int = 10, progress: bool | None = None, **options: Any) -> Evaluation:
    """Ask each question with ``db.fill_mask(query, top=1, ...)`` at ``version`` (None:
    HEAD; a tag or HEAD is resolved once, so a commit during the run changes no answer)
    and score its top answer by exact match. ``options`` go to ``fill_mask`` (for
    example ``k``, ``blocks``, ``bm25_prior``), the same for every question."""
    qs = load_questions(questions)
    retrieval = check_settings(retrieval, max_len, options)
    with db.snapshot(version) as snap:  # one version for every question, though HEAD moves
        pinned, generation = snap.manifest.id, snap.generation
    results = []
    t0 = time.perf_counter()
    bar = progress_bar(len(qs), f"evaluating version {pinned} ({retrieval})", progress,
                       unit="q")
    try:
        for q in qs:
            res = db.fill_mask(q.query, top=1, evidence=0, retrieval=retrieval,
                               max_len=max_len, version=pinned, **options)
            pred = res.top.text if res.top else None
            results.append(QuestionResult(q.id, q.query, q.answers, q.relation, q.bucket, pred,
                                          exact_match(pred, q.answers)))
            bar.update(1)
    finally:
        bar.close()
    return Evaluation(version=int(pinned), generation=int(generation), retrieval=retrieval,
                      options=dict(options, max_len=max_len), results=tuple(results),
                      seconds=time.perf_counter() - t0)


def check_settings(retrieval: str | None, max_len: int, options: Mapping[str, Any]) -> str:
    """The retrieval :func:`evaluate` asks with for these settings (None: ``fill_mask``'s
    default), or a ProgrammingError before any question is asked: for a setting that
    ``fill_mask`` refuses, or one that changes which answer is scored."""
    for bad in ("top", "evidence", "query"):
        if bad in options:
            raise ProgrammingError(f"evaluate asks for the top answer itself; drop {bad}=")
    if "offset" in options:
        raise ProgrammingError("evaluate scores the top answer; offset= would score a later "
                               "one instead: drop offset=")
    if options.get("group_by") == "document":
        raise ProgrammingError("evaluate scores the top answer's text, and group_by="
                               "'document' answers with document ids: drop group_by= (or "
                               "give 'phrase', 'tokens' or 'word')")
    check_options(MaskedSpec, options)
    return MaskedSpec("[MASK]", top=1, evidence=0, retrieval=retrieval, max_len=max_len,
                      **options).retrieval


def mcnemar_exact(gained: int, lost: int) -> float:
    """Two-sided exact McNemar p-value: the chance, were both versions equally good, of a
    split of the ``gained + lost`` discordant questions at least this uneven (a binomial
    test at one half). 1.0 when no question differs.

    O(n) in floats: the binomial tail is summed from its largest term down, as multiples
    of that term, then scaled by it (exact but for rounding up to 1000 questions; in log
    space beyond, about 1e-10 relative at 100,000). A sum of exact big integers took
    minutes for tens of thousands of questions."""
    gained, lost = _count(gained, "gained"), _count(lost, "lost")
    n, m = gained + lost, min(gained, lost)
    if 2 * m + 1 >= n:  # as even a split as can be (or none): the tail is at least a half
        return 1.0
    total = term = 1.0  # sum over i <= m of C(n, i) / C(n, m)
    for i in range(m, 0, -1):
        ratio = i / (n - i + 1)
        term *= ratio
        total += term
        if term <= total * 1e-17 * (1.0 - ratio):  # the rest, a geometric bound, is nothing
            break
    return min(1.0, 2.0 * _times_half_binomial(total, n, m))


def _count(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ProgrammingError(f"gained and lost are counts of questions (integers >= 0); "
                               f"{name} is {value!r}")
    return int(value)


def _times_half_binomial(x: float, n: int, m: int) -> float:
    """``x * C(n, m) / 2**n``: with the exact integer quotient while that is cheap (n <=
    1000), in log space from ``lgamma`` beyond (whose rounding grows with ``n``)."""
    if n <= 1000:
        return x * (math.comb(n, m) / 2 ** n)  # int / int rounds once
    return math.exp(math.log(x) + math.lgamma(n + 1) - math.lgamma(m + 1)
                    - math.lgamma(n - m + 1) - n * math.log(2.0))


@dataclass(frozen=True)
class Comparison:
    """Two evaluations of the same questions, paired question by question.

    ``gained``: questions ``after`` answers right and ``before`` wrong; ``lost``: the
    reverse; ``p_value``: McNemar's exact test on those (:func:`mcnemar_exact`)."""

    before: Evaluation
    after: Evaluation
    gained: tuple[QuestionResult, ...]
    lost: tuple[QuestionResult, ...]

    @property
    def n(self) -> int:
        return self.before.n

    @property
    def delta(self) -> float:
        """``after.micro - before.micro``, in points."""
        return self.after.micro - self.before.micro

    @property
    def p_value(self) -> float:
        return mcnemar_exact(len(self.gained), len(self.lost))

    def significant(self, alpha: float = 0.05) -> bool:
        """Whether the split of gained and lost questions is unlikely under no difference."""
        return self.p_value < alpha

    def by_relation(self) -> dict[str, tuple[int, int]]:
        """Each relation's (gained, lost) question counts, for the relations that moved."""
        out: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for i, moved in enumerate((self.gained, self.lost)):
            for r in moved:
                out[r.relation][i] += 1
        return {g: (v[0], v[1]) for g, v in sorted(out.items())}

    def summary(self) -> dict[str, Any]:
        return dict(before=_label(self.before), after=_label(self.after), n=self.n,
                    delta=self.delta, gained=len(self.gained), lost=len(self.lost),
                    p_value=self.p_value,
                    by_relation={g: {"gained": a, "lost": b}
                                 for g, (a, b) in self.by_relation().items()})

    def __str__(self) -> str:
        verdict = ("unlikely to be chance" if self.significant() else
                   "could be chance on this many questions")
        return (f"{_label(self.after)} against {_label(self.before)}: {self.delta:+.1f} points "
                f"micro; {len(self.gained)} of {self.n} questions gained, {len(self.lost)} "
                f"lost (exact McNemar p = {self.p_value:.2g}: {verdict})")


def _label(e: Evaluation) -> str:
    return f"version {e.version} {e.retrieval}"


def compare(before: Evaluation, after: Evaluation) -> Comparison:
    """Pair two evaluations of the same questions (in the same order): which questions
    ``after`` gains and loses against ``before``."""
    for name, e in (("before", before), ("after", after)):
        if not isinstance(e, Evaluation):
            raise ProgrammingError(f"compare takes two evaluations (what npmdb.evaluate "
                                   f"returns); {name} is {type(e).__name__} {e!r:.80}")
    if [(r.id, r.query) for r in before.results] != [(r.id, r.query) for r in after.results]:
        raise ProgrammingError("compare needs two evaluations of the same questions in the "
                               f"same order ({before.n} and {after.n} questions, or different "
                               "ones): evaluate one question list at both versions")
    pairs = list(zip(before.results, after.results))
    return Comparison(before=before, after=after,
                      gained=tuple(a for b, a in pairs if a.correct and not b.correct),
                      lost=tuple(a for b, a in pairs if b.correct and not a.correct))


@dataclass(frozen=True)
class Decision:
    """What :func:`keep_if_better` did: ``kept`` (HEAD is the trained version) or a new
    version ``restored_as`` equal to the version before training; ``reason`` in words."""

    comparison: Comparison
    kept: bool
    restored_as: int | None
    reason: str

    def __str__(self) -> str:
        return f"{self.comparison}\n{self.reason}"


def keep_if_better(db: "Database", questions: str | Path | Iterable[Mapping[str, Any] | Question],
                   *, before: int | str, trained: Sequence[int], retrieval: str = "bm25",
                   max_len: int = 10, progress: bool | None = None,
                   **options: Any) -> Decision:
    """Keep a training run's version as HEAD only if it answers ``questions`` better.

    ``before``: HEAD's version id before training; ``trained``: the versions the run
    committed (``TrainReport.versions``). The two are evaluated (exact match, micro, on
    ``retrieval``); unless HEAD's is higher, a new version restores ``before`` (its
    documents and embedding generation; nothing is copied or deleted, and the trained
    version stays readable). When a version that is not the run's was committed after
    ``before`` (another writer), nothing is restored: that would undo its change."""
    trained = tuple(int(v) for v in trained)
    if not trained:
        raise ProgrammingError("keep_if_better needs the versions the training committed "
                               "(TrainReport.versions); this run committed none")
    qs = load_questions(questions)
    before = db.checkout(before).version  # a tag or a digit string: its id
    head = db.version
    kw = dict(retrieval=retrieval, max_len=max_len, progress=progress, **options)
    c = compare(evaluate(db, qs, version=before, **kw), evaluate(db, qs, version=head, **kw))
    if c.after.micro > c.before.micro:
        moved = (f"; HEAD is now version {db.version}, committed while the questions were "
                 "asked" if db.version != head else "")
        return Decision(c, True, None, f"kept version {head}: it answers more of the "
                        f"{c.n} questions than version {before}{moved}")
    with db._writing().hold():  # nothing commits between the checks and the restore
        why = _other_changes(db, before, head, trained)
        if why:
            return Decision(c, True, None, (
                f"kept version {db.version} although version {head} answers no more of the "
                f"questions than version {before}: {why}, and a restore would undo that; "
                f"`npmdb restore DB {before}` (db.restore({before})) restores it by hand"))
        restored = db.restore(before, message=(
            f"kept version {before}: the trained version {head} answers "
            f"{c.after.micro:.1f} % of {c.n} questions ({c.before.micro:.1f} % before)"))
    return Decision(c, False, restored, (
        f"restored: version {restored} equals version {before} (HEAD before training); "
        f"the trained version {head} stays readable (AS OF {head})"))


def _other_changes(db: "Database", before: int, head: int, trained: Sequence[int]) -> str:
    """Why restoring ``before`` would undo something other than the training run ("": it
    would not). A run's refreshes change only the embedding generation; a version that is
    not the run's, or documents that differ from ``before``'s (another writer's change,
    even one whose own version a vacuum has since dropped), would be undone."""
    if db.version != head:
        return f"version {db.version} was committed while the questions were asked"
    others = [v["id"] for v in db.versions() if v["id"] > before and v["id"] not in trained]
    if others:
        return (f"version(s) {', '.join(map(str, others))} were committed after {before} by "
                "something other than this training run")
    with db.snapshot(before) as a, db.snapshot(head) as b:
        if (a.manifest.segments, a.manifest.deleted) != (b.manifest.segments,
                                                         b.manifest.deleted):
            return (f"the documents of version {head} are not those of version {before}: "
                    "something other than this training run changed them")
    return ""
