"""BM25 over blocks: one tantivy index per segment, one tantivy document per block."""

from __future__ import annotations

import errno
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

import tantivy

from npmdb.errors import OperationalError

from .paths import fsync_path

__all__ = ["BlockDoc", "build_bm25", "BM25Index", "FieldStats", "analyze", "bm25_idf",
           "field_stats", "search_segments", "FIELDS"]

#: The text fields of a block's tantivy document (both indexed since the first format).
FIELDS = ("text", "title")
#: tantivy numbers a schema's fields in the order :func:`_schema` adds them; an explanation
#: names a term's field by that number.
_FIELD_NUMBERS = {2: "title", 3: "text"}
#: tantivy's BM25 parameters.
K1, B = 1.2, 0.75

_ANALYZER = (tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.simple())
             .filter(tantivy.Filter.remove_long(40)).filter(tantivy.Filter.lowercase()).build())


def analyze(text: str) -> list[str]:
    """The terms tantivy's default tokenizer makes of ``text`` (used to build queries)."""
    return _ANALYZER.analyze(text)


def _schema() -> tantivy.Schema:
    sb = tantivy.SchemaBuilder()
    sb.add_unsigned_field("block", stored=True, indexed=True, fast=True)
    sb.add_unsigned_field("doc", stored=True, indexed=True, fast=True)
    sb.add_text_field("title", stored=False, tokenizer_name="default")
    sb.add_text_field("text", stored=False, tokenizer_name="default")
    return sb.build()


@dataclass(frozen=True, slots=True)
class BlockDoc:
    block: int   # block number within the segment
    doc: int     # document number within the segment
    title: str
    text: str    # the block's text (the document text it covers)


def build_bm25(path: Path, docs: Iterable[BlockDoc]) -> int:
    """Write a tantivy index of ``docs`` into the empty directory ``path``; returns count."""
    path.mkdir(parents=True, exist_ok=True)
    index = tantivy.Index(_schema(), path=str(path))
    writer = index.writer(heap_size=64_000_000, num_threads=1)
    n = 0
    try:
        for d in docs:
            doc = tantivy.Document()
            doc.add_unsigned("block", d.block)
            doc.add_unsigned("doc", d.doc)
            doc.add_text("title", d.title)
            doc.add_text("text", d.text)
            writer.add_document(doc)
            n += 1
        writer.commit()
        writer.wait_merging_threads()
    except ValueError as exc:
        if any(t in str(exc) for t in ("killed", "io::Error", "IO error", "os error")):
            raise _writer_thread_failed(exc, path) from exc
        raise
    for f in path.iterdir():
        if f.is_file():
            fsync_path(f)
    return n


def _writer_thread_failed(exc: ValueError, path: Path) -> OSError:
    """tantivy failed to write (a ValueError: "An IO error occurred …", or, where its
    writer thread failed, only "an index writer was killed … io::Error most likely"): an
    OSError, so that the writer reports a file-system failure (the second was a bare
    ValueError); ENOSPC where the disk is (almost) full."""
    full = "os error 28" in str(exc) or "No space left" in str(exc)
    try:
        st = os.statvfs(path)
        full = full or st.f_bavail * st.f_frsize < (8 << 20)
    except OSError:
        pass
    code = errno.ENOSPC if full else errno.EIO
    return OSError(code, f"{os.strerror(code)} (tantivy: {exc})", str(path))


@dataclass(frozen=True, slots=True)
class FieldStats:
    """BM25 statistics of one field for one query over a set of blocks: what one tantivy
    index over exactly those blocks would score with. Counts of disjoint parts add up (a
    version sums its segments', a sharded query its shards')."""

    blocks: int             # blocks (tantivy documents)
    tokens: int             # the field's length summed over the blocks (an integer, so
                            # that sums do not depend on their order)
    dfs: tuple[int, ...]    # blocks holding each query term in the field

    def __add__(self, other: "FieldStats") -> "FieldStats":
        return FieldStats(self.blocks + other.blocks, self.tokens + other.tokens,
                          tuple(a + b for a, b in zip(self.dfs, other.dfs, strict=True)))

    @property
    def avgdl(self) -> float:
        return self.tokens / self.blocks if self.blocks else 0.0

    def idf(self) -> list[float]:
        return [bm25_idf(df, self.blocks) for df in self.dfs]


def _lock_refused(exc: BaseException) -> bool:
    """Whether tantivy could not open an index only because it could not write its lock
    file (a read-only file system, no write permission on the directory)."""
    text = str(exc)
    return "Lockfile" in text and any(why in text for why in (
        "ReadOnlyFilesystem", "PermissionDenied", "Read-only file system",
        "Permission denied"))


def _open_copy(path: Path) -> tuple[tantivy.Index, Any]:
    """Open a copy of the index at ``path`` in a temporary directory (removed with the
    handle that holds it)."""
    import shutil
    import tempfile

    copy = tempfile.TemporaryDirectory(prefix="npmdb-bm25-")
    try:
        target = Path(copy.name) / "bm25"
        shutil.copytree(path, target, ignore=shutil.ignore_patterns(".tantivy-*.lock"))
        return tantivy.Index.open(str(target)), copy
    except (ValueError, OSError, shutil.Error) as exc:
        copy.cleanup()
        raise OperationalError(
            f"cannot open the BM25 index {path}: its directory is read-only and a copy in "
            f"{tempfile.gettempdir()} failed ({exc}); make the database writable, set TMPDIR "
            "to a writable directory, or query with retrieval='dense'") from exc


class BM25Index:
    """A read-only handle on one segment's BM25 index.

    Alone, a segment is scored with tantivy's own statistics. Given ``stats`` (the
    :class:`FieldStats` of every segment of a version, summed), :meth:`search` returns
    what one index over all those blocks would: the same top blocks with the same scores
    (to float rounding). tantivy scores with the segment's own IDFs and average block
    length; boosting each term by ``global idf / local idf`` fixes the IDFs, and each
    candidate is then rescored from its explanation (term frequencies and block length)
    with the global average length."""

    def __init__(self, path: Path) -> None:
        self._copy = None  # a temporary copy, where the index's own directory is read-only
        try:
            self.index = tantivy.Index.open(str(path))
        except (ValueError, OSError) as exc:
            if not _lock_refused(exc):
                raise OperationalError(f"cannot open the BM25 index {path}: "
                                       f"{str(exc).removesuffix(' None')}") from exc
            # tantivy takes a lock file in the index's directory even to read, so a database
            # on a read-only file system (a read-only volume or mount) reads a copy
            self.index, self._copy = _open_copy(Path(path))
        self.schema = self.index.schema
        self.searcher = self.index.searcher()
        self._avgdl: dict[str, float] = {}

    def avgdl(self, field: str, terms: Sequence[str] = ()) -> float:
        """The segment's average length of ``field`` (tantivy's; 0.0 where it is empty),
        read from the explanation of a block holding one of ``terms``, or else the most
        frequent term (a walk over the field's whole term dictionary)."""
        if field not in self._avgdl:
            found = 0.0
            term = next((t for t in terms if self.searcher.doc_freq(field, t)), None)
            if term is None:
                top = self.searcher.terms_with_prefix(field, "", limit=1)
                term = top[0][0] if top else None
            if term is not None:
                q = tantivy.Query.term_query(self.schema, field, term)
                hits = self.searcher.search(q, limit=1, count=False).hits
                found = next(t[4] for t in _terms(_explain(q, self.searcher, hits[0][1])))
            self._avgdl[field] = found
        return self._avgdl[field]

    def field_stats(self, terms: Sequence[str], field: str = "text") -> FieldStats:
        """This segment's :class:`FieldStats` of ``field`` for ``terms``."""
        n = self.searcher.num_docs
        return FieldStats(n, round(self.avgdl(field, terms) * n),
                          tuple(self.searcher.doc_freq(field, t) for t in terms))

    def query(self, terms: Sequence[str], *, docs: Sequence[int] | None = None,
              idf: Mapping[str, Sequence[float]] | None = None,
              fields: Sequence[str] = ("text",)) -> tantivy.Query:
        """OR of the terms over ``fields`` (``text``; ``title`` too: every block carries its
        document's title, as NPM's BM25 blocks did). With ``idf`` (IDFs per field, one per
        term) each term is boosted by ``idf / local idf``."""
        for f in fields:
            if f not in FIELDS:
                raise ValueError(f"no BM25 field {f!r} (fields: {', '.join(FIELDS)})")
        terms = list(dict.fromkeys(terms)) if idf is None else list(terms)
        shoulds = []
        n_docs = self.searcher.num_docs
        for f in fields:
            for i, t in enumerate(terms):
                q = tantivy.Query.term_query(self.schema, f, t)
                if idf is not None:
                    df = self.searcher.doc_freq(f, t)
                    if df == 0:
                        continue
                    q = tantivy.Query.boost_query(q, float(idf[f][i] / bm25_idf(df, n_docs)))
                shoulds.append((tantivy.Occur.Should, q))
        return self.only_docs(tantivy.Query.boolean_query(shoulds), docs)

    def only_docs(self, q: tantivy.Query, docs: Sequence[int] | None) -> tantivy.Query:
        """``q`` restricted to ``docs`` (None: all) by a non-scoring filter: BM25 scores
        stay those of the unfiltered query."""
        if docs is None:
            return q
        allowed = tantivy.Query.const_score_query(
            tantivy.Query.term_set_query(self.schema, "doc", [int(d) for d in docs]), 0.0)
        return tantivy.Query.boolean_query([(tantivy.Occur.Must, q), (tantivy.Occur.Must, allowed)])

    def search(self, terms: Sequence[str], n: int, *, docs: Sequence[int] | None = None,
               stats: Mapping[str, FieldStats] | None = None,
               fields: Sequence[str] = ("text",), text_scores: bool = False
               ) -> list[tuple]:
        """Top ``n`` blocks as ``(block, doc, score)``, best first; with ``text_scores``,
        ``(block, doc, score, score on the text alone)``. ``stats``: the statistics of
        each of ``fields`` over every segment of the version (None: this segment's own)."""
        if not terms or n <= 0 or self.num_docs == 0:
            return []
        if stats is not None:
            top = search_segments([self], terms, n, docs=[docs], stats=stats, fields=fields)
            return [h[1:] if text_scores else h[1:4] for h in top]
        res = self.searcher.search(self.query(terms, docs=docs, fields=fields),
                                   limit=min(n, self.num_docs), count=False)
        hits = self._rows([a for _, a in res.hits], [s for s, _ in res.hits])
        if text_scores:
            text = self.block_scores(terms, [h[0] for h in hits])
            hits = [(*h, text.get(h[0], 0.0)) for h in hits]
        return hits

    def _rows(self, addrs: list, scores: list[float]) -> list[tuple[int, int, float]]:
        if not addrs:
            return []
        blocks = self.searcher.fast_field_values("block", addrs)
        dids = self.searcher.fast_field_values("doc", addrs)
        return [(int(b), int(d), float(s)) for s, b, d in zip(scores, blocks, dids)]

    def block_scores(self, terms: Sequence[str], blocks: Sequence[int], *,
                     fields: Sequence[str] = ("text",)) -> dict[int, float]:
        """The BM25 score over ``fields`` of each of ``blocks`` for ``terms``, with this
        segment's statistics; a block that matches no term is absent."""
        blocks = [int(b) for b in blocks]
        if not terms or not blocks:
            return {}
        only = tantivy.Query.const_score_query(
            tantivy.Query.term_set_query(self.schema, "block", blocks), 0.0)
        q = tantivy.Query.boolean_query([(tantivy.Occur.Must, self.query(terms, fields=fields)),
                                         (tantivy.Occur.Must, only)])
        res = self.searcher.search(q, limit=len(blocks), count=False)
        if not res.hits:
            return {}
        got = self.searcher.fast_field_values("block", [a for _, a in res.hits])
        return {int(b): float(sc) for (sc, _), b in zip(res.hits, got)}

    @property
    def num_docs(self) -> int:
        return self.searcher.num_docs


#: Relative slack on the bounds of the rescoring search: tantivy's scores are float32.
_SLACK = 1e-5


class _Rescoring:
    """One segment's search with the version's statistics (:class:`BM25Index`). The
    boosted query ranks by the global IDFs but with this segment's average lengths; a
    block's rescored figure is at most ``ratio`` times its boosted score (a term's length
    norm grows with the average length, by at most the ratio of the two averages), so
    ``bound`` (``ratio`` times the last boosted score fetched) caps every block not
    fetched yet."""

    def __init__(self, ix: BM25Index, terms: Sequence[str], docs: Sequence[int] | None,
                 idf: Mapping[str, Sequence[float]], avg: Mapping[str, float],
                 fields: Sequence[str]) -> None:
        self.ix = ix
        self.scored = ix.query(terms, idf=idf, fields=fields)   # the unfiltered query
        self.wanted = ix.only_docs(self.scored, docs)
        self.avg = avg  # the version's average length of each field
        own = {f: ix.avgdl(f, terms) for f in fields}
        self.ratio = max([avg[f] / own[f] for f in fields if own[f] > 0] + [1.0])
        self.fetched = 0
        self.bound: float | None = math.inf if ix.num_docs else None  # None: exhausted

    def more(self, page: int) -> list[tuple[int, int, float, float]]:
        """The next ``page`` blocks in boosted order, rescored, as ``(block, doc, score,
        text score)``; updates :attr:`bound`."""
        ix = self.ix
        limit = min(self.fetched + page, ix.num_docs)
        hits = ix.searcher.search(self.wanted, limit=limit, count=False).hits
        new = hits[self.fetched:]
        self.fetched = limit
        if len(hits) < limit or limit == ix.num_docs:
            self.bound = None  # every matching block is in
        else:
            self.bound = self.ratio * hits[-1][0] * (1 + _SLACK)
        if not new:
            return []
        scores = [_rescore(_explain(self.scored, ix.searcher, a), self.avg) for _, a in new]
        rows = ix._rows([a for _, a in new], [sc[0] for sc in scores])
        return [(*row, sc[1]) for row, sc in zip(rows, scores)]


def search_segments(indexes: Sequence[BM25Index], terms: Sequence[str], n: int, *,
                    docs: Sequence[Sequence[int] | None], stats: Mapping[str, FieldStats],
                    fields: Sequence[str] = ("text",)) -> list[tuple[int, int, int, float, float]]:
    """The top ``n`` blocks of several segments scored as one index (``stats``: each
    field's statistics over every segment of the version; ``docs``: each segment's
    allowed documents, None for all) as ``(segment, block, doc, score, text score)``,
    best first (ties: segment, then block). The threshold algorithm: the segment whose
    unfetched blocks could score highest gives its next page, until the ``n``-th score
    found is above every segment's bound, so only blocks that could reach the top are
    rescored."""
    if not terms or n <= 0:
        return []
    idf = {f: stats[f].idf() for f in fields}
    avg = {f: stats[f].avgdl for f in fields}
    runs = {i: _Rescoring(ix, terms, d, idf, avg, fields)
            for i, (ix, d) in enumerate(zip(indexes, docs, strict=True))
            if d is None or len(d)}
    page = {i: 1 for i in runs}  # a first look at each segment gives its first bound
    best: list[tuple[int, int, int, float, float]] = []
    key = lambda h: (-h[3], h[0], h[1])  # noqa: E731
    while True:
        open_ = [(r.bound, i) for i, r in runs.items() if r.bound is not None]
        if not open_:
            break
        bound, i = max(open_, key=lambda x: (x[0], -x[1]))
        if len(best) >= n and bound < best[n - 1][3]:
            break  # no block left anywhere can reach the top n
        best = sorted(best + [(i, *h) for h in runs[i].more(page[i])], key=key)[:n]
        page[i] = min(max(2 * page[i], 8), n)
    return best


_FIELD = re.compile(r"Term\(field=(\d+),")


def _explain(query: tantivy.Query, searcher: tantivy.Searcher, addr: Any) -> dict:
    return json.loads(query.explain(searcher, addr).to_json())


def _terms(node: dict) -> Iterator[tuple[float, str, float, float, float]]:
    """``(score, field, freq, dl, avgdl)`` of each matching term of a tantivy explanation
    of an OR of (boosted) term queries: the term's share of the score (its boost
    included), its frequency, the block's length of the field (tantivy's quantised norm)
    and the average length tantivy scored with."""
    clauses = node["details"] if node["description"].startswith("BooleanClause") else [node]
    for clause in clauses:
        term = clause["details"][0] if clause["description"].startswith("Boost") else clause
        norm = term["details"][2]
        if not (term["description"].startswith("TermQuery")
                and norm["description"].startswith("freq /")):
            raise OperationalError(f"unexpected BM25 explanation from tantivy: {clause}")
        freq, _k1, _b, dl, avgdl = (float(d["value"]) for d in norm["details"])
        field = _FIELD_NUMBERS[int(_FIELD.search(term["context"][0]).group(1))]
        yield float(clause["value"]), field, freq, dl, avgdl


def _norm(freq: float, dl: float, avgdl: float) -> float:
    return freq / (freq + K1 * (1.0 - B + B * dl / avgdl))


def _rescore(expl: dict, avgdl: Mapping[str, float]) -> tuple[float, float]:
    """(score, score on the text field alone) of an explained block with the average
    lengths ``avgdl``: each term's score scaled by its length norm's change."""
    total = text = 0.0
    for value, field, freq, dl, old in _terms(expl):
        v = value * _norm(freq, dl, avgdl[field]) / _norm(freq, dl, old)
        total += v
        if field == "text":
            text += v
    return total, text


def bm25_idf(df: int, n_docs: int) -> float:
    """tantivy's (and Lucene's) BM25 IDF."""
    return math.log(1.0 + (n_docs - df + 0.5) / (df + 0.5))


def field_stats(indexes: Sequence[BM25Index], terms: Sequence[str], field: str = "text"
                ) -> FieldStats:
    """The :class:`FieldStats` of ``field`` over all ``indexes`` together."""
    return sum((ix.field_stats(terms, field) for ix in indexes),
               FieldStats(0, 0, (0,) * len(terms)))
