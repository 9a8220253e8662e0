"""A read-only view of one version of a database (``db.checkout(ref)``)."""

from __future__ import annotations

import numbers
from typing import TYPE_CHECKING, Any

from .arguments import check_text
from .errors import OperationalError, ProgrammingError
from .result import Result

if TYPE_CHECKING:  # pragma: no cover
    from .database import Database

__all__ = ["VersionView"]


class VersionView:
    """A read-only view of one version: queries default to it; writes are refused."""

    def __init__(self, db: "Database", version: int) -> None:
        self._db = db
        self.version = version

    def _ref(self, ref: int | str | None) -> int:
        """This view's version for ``ref``: None, its id, or a tag of it; another version
        is refused."""
        if ref is None or (isinstance(ref, numbers.Integral) and not isinstance(ref, bool)
                           and int(ref) == self.version):
            return self.version
        if self._db.checkout(ref).version != self.version:  # checks the reference first
            raise ProgrammingError(f"this view is of version {self.version}; query "
                                   "other versions through the database")
        return self.version

    def _opts(self, kw: dict) -> dict:
        kw["version"] = self._ref(kw.get("version"))
        return kw

    def sql(self, text: str, params: Any = None) -> Result:
        """``db.sql`` reading this version: a statement without ``AS OF`` reads it, and
        ``AS OF`` may name only it."""
        from contextlib import contextmanager

        from npmdb.query import sql

        db = self._db

        @contextmanager
        def context(ref=None, doc_filter=None):
            with db._context(self._ref(ref), doc_filter) as ctx:
                yield ctx
        db._check_open()
        check_text(text, "the statement")
        check_text(params, "a parameter")
        return sql.execute(text, params, context)

    def fill_mask(self, query: str, **kw: Any) -> Result:
        return self._db.fill_mask(query, **self._opts(kw))

    def classify(self, query: str, labels, **kw: Any) -> Result:
        return self._db.classify(query, labels, **self._opts(kw))

    def search(self, text: str, **kw: Any):
        return self._db.search(text, **self._opts(kw))

    def get(self, doc_id: str, *, version: int | str | None = None):
        return self._db.get(doc_id, version=self._ref(version))

    def documents(self, *, version: int | str | None = None):
        return self._db.documents(version=self._ref(version))

    def count(self, version: int | str | None = None) -> int:
        return self._db.count(self._ref(version))

    def __len__(self) -> int:
        return self.count()

    def versions(self) -> list[dict[str, Any]]:
        """The database's version history (reading it writes nothing)."""
        return self._db.versions()

    def diff(self, a: int | str, b: int | str | None = None):
        """Documents added, removed and changed from version ``a`` to ``b`` (this view's
        version by default)."""
        return self._db.diff(a, self.version if b is None else b)

    def _refuse(self, *a, **k):
        raise OperationalError(f"version {self.version} is a read-only snapshot: write through "
                               "the database (db.add / db.delete / db.restore)")

    add = delete = update = tag = untag = optimize = vacuum = restore = batch = \
        write_generation = _refuse

    def __repr__(self) -> str:
        return f"<npmdb.VersionView version={self.version} of {str(self._db.path)!r}>"
