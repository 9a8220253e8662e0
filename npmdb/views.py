"""A read-only view of one version of a database (``db.checkout(ref)``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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

    def _opts(self, kw: dict) -> dict:
        if kw.get("version") not in (None, self.version):
            raise ProgrammingError(f"this view is of version {self.version}; query "
                                   "other versions through the database")
        kw["version"] = self.version
        return kw

    def fill_mask(self, query: str, **kw: Any) -> Result:
        return self._db.fill_mask(query, **self._opts(kw))

    def classify(self, query: str, labels, **kw: Any) -> Result:
        return self._db.classify(query, labels, **self._opts(kw))

    def search(self, text: str, **kw: Any):
        return self._db.search(text, **self._opts(kw))

    def get(self, doc_id: str):
        return self._db.get(doc_id, version=self.version)

    def documents(self):
        return self._db.documents(version=self.version)

    def count(self) -> int:
        return self._db.count(self.version)

    def _refuse(self, *a, **k):
        raise OperationalError(f"version {self.version} is a read-only snapshot: write through "
                               "the database (db.add / db.delete / db.restore)")

    add = delete = update = tag = optimize = vacuum = restore = batch = _refuse

    def __repr__(self) -> str:
        return f"<npmdb.VersionView version={self.version} of {str(self._db.path)!r}>"
