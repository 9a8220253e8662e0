"""Ingest: documents → blocks → vectors → the segment writer, in this process or on Ray.

    prepare (tokenize, flag boundaries, cut blocks) → encode (locally, or on Ray actors)
      → SegmentWriter (codec, vector chunks, documents, BM25 and dense indexes)
      → the Writer's open transaction (committed as one version by its owner)

Every entry takes the Writer (:mod:`npmdb.storage.transaction`) and the encoder cache
(:mod:`npmdb.encoders`), never the Database.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..corpus import Document, read_documents
from .local import write_segment
from .prepare import PreparedSegment, prepare

if TYPE_CHECKING:  # pragma: no cover
    from npmdb.storage.transaction import Writer

    from ..encoders import Encoders

__all__ = ["add", "prepare", "PreparedSegment", "write_segment"]


def add(writer: "Writer", encoders: "Encoders", docs: Any, engine: Any = None) -> None:
    """Add ``docs`` (anything :func:`npmdb.corpus.read_documents` reads) to the writer's
    open transaction, as one new segment (local) or several (``engine``: a
    :class:`npmdb.ingest.ray.RayEngine`). The caller holds a savepoint."""
    if engine is not None:
        engine.add(writer, encoders, docs)
        return
    items = list(read_documents(docs))
    if not items:
        return
    ids = writer.assign_ids([d.id for d in items], {})
    items = [Document(i, d.title, d.text, d.meta) for i, d in zip(ids, items)]
    record = write_segment(writer, encoders.get(writer.generation), items)
    writer.append(record, ids)
