"""npmdb: an embedded datastore and query engine for nonparametric masked language models.

    >>> import npmdb
    >>> with npmdb.open("my.npmdb") as db:                       # doctest: +SKIP
    ...     db.add(["Hagios Demetrios is a church in Thessaloniki."])
    ...     db.fill_mask("Hagios Demetrios is located in [MASK].")
"""

from __future__ import annotations

from .errors import (
    DatabaseError, DataError, Error, IntegrityError, InterfaceError, InternalError,
    NotSupportedError, OperationalError, ProgrammingError, QueryDataError, QueryParseError,
    Warning,
)

__version__ = "0.1.0"

__all__ = [
    "open", "train", "evaluate", "Database", "Result", "Answer", "Evidence", "Document",
    "Error", "Warning", "InterfaceError", "DatabaseError", "DataError", "OperationalError",
    "IntegrityError", "InternalError", "ProgrammingError", "NotSupportedError",
    "QueryParseError", "QueryDataError", "__version__",
]


def __getattr__(name: str):
    # Lazy: `import npmdb` stays cheap; the engine loads on first use.
    if name in ("open", "Database"):
        from . import database
        return getattr(database, name)
    if name in ("Result", "Answer", "Evidence"):
        from . import result
        return getattr(result, name)
    if name == "Document":
        from .corpus import Document
        return Document
    if name == "train":
        from .train import train
        return train
    if name == "evaluate":
        from .evaluation import evaluate
        return evaluate
    if name == "evaluation":  # npmdb.evaluation.compare(...) after a bare `import npmdb`
        import importlib
        return importlib.import_module(f"{__name__}.evaluation")
    raise AttributeError(f"module 'npmdb' has no attribute {name!r}")
