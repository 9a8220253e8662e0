"""What running a plan needs, as one value: :class:`ExecContext`.

The facade (``Database``) opens a context for one version and hands it to the executor
(:func:`npmdb.query.executor.execute`); nothing in ``query/`` reaches back into the facade.
A context holds

- ``snapshot``: the read view of one version (its segments, tombstones and document
  filter, read inside one LMDB read transaction); None when the database has no version
  yet, and then :meth:`ExecContext.require` raises the error a query on it gets;
- ``encode``: query text and mode (``'phrase'`` | ``'token'``) → query vectors, with the
  encoder of the embedding generation the snapshot reads;
- ``doc_filter``: the document filter the snapshot applies during retrieval (or None);
- ``history``: the version listing (``SHOW VERSIONS``), read from the same transaction.

    open_context(version_ref, doc_filter=None) -> context manager yielding ExecContext

is the signature the SQL entry point (:func:`npmdb.query.sql.execute`) takes.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from npmdb.errors import ProgrammingError

from .spec import DocFilter

__all__ = ["ExecContext", "OpenContext", "EMPTY_MESSAGE"]

EMPTY_MESSAGE = "the database is empty: add documents first (db.add(...))"


@dataclass(frozen=True)
class ExecContext:
    snapshot: Any | None
    encode: Callable[[str, str], Any]
    history: Callable[[], list[dict[str, Any]]]
    doc_filter: DocFilter | None = None
    shards: Any = None  # a shard set (npmdb.shards): the plan runs over it

    def require(self) -> Any:
        """The snapshot; a database without any version has none to query."""
        if self.snapshot is None:
            raise ProgrammingError(EMPTY_MESSAGE)
        return self.snapshot

    def allowed_docs(self, si: int):
        """Boolean mask over segment ``si``'s live, allowed documents (None: all)."""
        return self.require().allowed_docs(si)


class OpenContext(Protocol):
    def __call__(self, version_ref: int | str | None, doc_filter: DocFilter | None = None
                 ) -> AbstractContextManager[ExecContext]: ...
