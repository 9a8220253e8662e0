"""BM25 over blocks: one tantivy index per segment, one tantivy document per block."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import tantivy

from npmdb.errors import OperationalError

__all__ = ["BlockDoc", "build_bm25", "BM25Index", "analyze"]

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
            _fsync(f)
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

    def query(self, terms: Sequence[str], *, docs: Sequence[int] | None = None) -> tantivy.Query:
        shoulds = [(tantivy.Occur.Should, tantivy.Query.term_query(self.schema, "text", t))
                   for t in dict.fromkeys(terms)]
        q = tantivy.Query.boolean_query(shoulds)
        if docs is not None:
            allowed = tantivy.Query.term_set_query(self.schema, "doc", [int(d) for d in docs])
            q = tantivy.Query.boolean_query([(tantivy.Occur.Must, q), (tantivy.Occur.Must, allowed)])
        return q

    def search(self, terms: Sequence[str], n: int, *, docs: Sequence[int] | None = None
               ) -> list[tuple[int, int, float]]:
        """Top ``n`` blocks as ``(block, doc, score)``, best first."""
        if not terms or n <= 0:
            return []
        res = self.searcher.search(self.query(terms, docs=docs), limit=n, count=False)
        if not res.hits:
            return []
        addrs = [a for _, a in res.hits]
        blocks = self.searcher.fast_field_values("block", addrs)
        dids = self.searcher.fast_field_values("doc", addrs)
        return [(int(b), int(d), float(s)) for (s, _), b, d in zip(res.hits, blocks, dids)]

    @property
    def num_docs(self) -> int:
        return self.searcher.num_docs


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
