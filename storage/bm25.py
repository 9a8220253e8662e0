"""BM25 over blocks: one tantivy index per segment, one tantivy document per block."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import tantivy

from npmdb.errors import OperationalError

from .paths import fsync_path

__all__ = ["BlockDoc", "build_bm25", "BM25Index", "analyze", "bm25_idf", "global_idf",
           "term_counts", "FIELDS"]

#: The text fields of a block's tantivy document (both indexed since the first format).
FIELDS = ("text", "title")

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
    for f in path.iterdir():
        if f.is_file():
            fsync_path(f)
    return n


class BM25Index:
    """A read-only handle on one segment's BM25 index."""

    def __init__(self, path: Path) -> None:
        try:
            self.index = tantivy.Index.open(str(path))
        except (ValueError, OSError) as exc:
            raise OperationalError(f"cannot open the BM25 index {path}: {exc}") from exc
        self.schema = self.index.schema
        self.searcher = self.index.searcher()

    def term_stats(self, terms: Sequence[str], field: str = "text") -> tuple[int, list[int]]:
        """(number of blocks, document frequency of each term in ``field``) in this segment."""
        return self.searcher.num_docs, [self.searcher.doc_freq(field, t) for t in terms]

    def query(self, terms: Sequence[str], *, docs: Sequence[int] | None = None,
              idf: Mapping[str, Sequence[float]] | Sequence[float] | None = None,
              fields: Sequence[str] = ("text",)) -> tantivy.Query:
        """OR of the terms over ``fields`` (``text``; ``title`` too: every block carries its
        document's title, as NPM's BM25 blocks did). With ``idf`` (global IDFs per field, one
        per term; a plain sequence is the ``text`` field's) each term is boosted by
        ``idf / local idf`` so scores use the statistics of the whole version."""
        if idf is not None and not isinstance(idf, Mapping):
            idf = {"text": idf}
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
        q = tantivy.Query.boolean_query(shoulds)
        if docs is not None:
            # a non-scoring filter: BM25 scores stay those of the unfiltered query
            allowed = tantivy.Query.const_score_query(
                tantivy.Query.term_set_query(self.schema, "doc", [int(d) for d in docs]), 0.0)
            q = tantivy.Query.boolean_query([(tantivy.Occur.Must, q), (tantivy.Occur.Must, allowed)])
        return q

    def search(self, terms: Sequence[str], n: int, *, docs: Sequence[int] | None = None,
               idf: Mapping[str, Sequence[float]] | Sequence[float] | None = None,
               fields: Sequence[str] = ("text",)) -> list[tuple[int, int, float]]:
        """Top ``n`` blocks as ``(block, doc, score)``, best first."""
        if not terms or n <= 0:
            return []
        res = self.searcher.search(self.query(terms, docs=docs, idf=idf, fields=fields),
                                   limit=n, count=False)
        if not res.hits:
            return []
        addrs = [a for _, a in res.hits]
        blocks = self.searcher.fast_field_values("block", addrs)
        dids = self.searcher.fast_field_values("doc", addrs)
        return [(int(b), int(d), float(s)) for (s, _), b, d in zip(res.hits, blocks, dids)]

    def block_scores(self, terms: Sequence[str], blocks: Sequence[int], *,
                     idf: Mapping[str, Sequence[float]] | Sequence[float] | None = None,
                     fields: Sequence[str] = ("text",)) -> dict[int, float]:
        """The BM25 score over ``fields`` of each of ``blocks`` for ``terms`` (statistics
        as :meth:`query`'s); a block that matches no term is absent."""
        blocks = [int(b) for b in blocks]
        if not terms or not blocks:
            return {}
        only = tantivy.Query.const_score_query(
            tantivy.Query.term_set_query(self.schema, "block", blocks), 0.0)
        q = tantivy.Query.boolean_query([(tantivy.Occur.Must, self.query(terms, idf=idf,
                                                                         fields=fields)),
                                         (tantivy.Occur.Must, only)])
        res = self.searcher.search(q, limit=len(blocks), count=False)
        if not res.hits:
            return {}
        got = self.searcher.fast_field_values("block", [a for _, a in res.hits])
        return {int(b): float(sc) for (sc, _), b in zip(res.hits, got)}

    @property
    def num_docs(self) -> int:
        return self.searcher.num_docs


def bm25_idf(df: int, n_docs: int) -> float:
    """tantivy's (and Lucene's) BM25 IDF."""
    return math.log(1.0 + (n_docs - df + 0.5) / (df + 0.5))


def term_counts(indexes: Sequence["BM25Index"], terms: Sequence[str], field: str = "text"
                ) -> tuple[int, list[int]]:
    """Blocks, and blocks holding each term in ``field``, over all ``indexes`` together
    (counts of disjoint parts add up: a sharded query sums its shards')."""
    total, dfs = 0, [0] * len(terms)
    for ix in indexes:
        n, d = ix.term_stats(terms, field)
        total += n
        dfs = [a + b for a, b in zip(dfs, d)]
    return total, dfs


def global_idf(indexes: Sequence["BM25Index"], terms: Sequence[str], field: str = "text"
               ) -> list[float]:
    """IDF of each term in ``field`` over all ``indexes`` together, as one index over all
    blocks."""
    total, dfs = term_counts(indexes, terms, field)
    return [bm25_idf(df, total) for df in dfs]
