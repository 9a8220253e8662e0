"""Reading and validating documents: whatever ``Database.add(docs)`` is given becomes a stream
of :class:`Document` objects, or a :class:`~npmdb.errors.DataError` that says where the bad
input is (file path and line, or the item's index) and how to fix it.

Accepted sources (see :func:`read_documents`):

* an iterable of ``str`` (one document's text each), ``bytes`` (UTF-8, decoded strictly),
  ``dict`` (``{"id", "title", "text", "meta"}``; other keys go into ``meta``), :class:`Document`,
  or :class:`os.PathLike` (a file or directory, read as below). A ``str`` *inside* an iterable is
  always text, never a path: pass :class:`pathlib.Path` objects for a list of files;
* a pandas ``DataFrame`` or a pyarrow ``Table``/``RecordBatch`` (one document per row);
* a path (``str`` or :class:`os.PathLike`) to a file or a directory. A plain ``str`` source is
  *always* a path; to add raw text pass a list of strings.

File formats, by suffix (a further ``.gz`` means gzip-compressed): ``.jsonl``/``.ndjson`` (one
JSON object per line, streamed), ``.json`` (a JSON list of objects, or JSON lines),
``.parquet`` (needs pyarrow), ``.csv``/``.tsv`` (header row required), and anything else is
plain text, one document per file, whose id is its path relative to the directory added
(its name, for a file added alone: two directories that both hold ``a.txt`` give the id
``a.txt`` twice, an IntegrityError). Directories are read recursively in sorted order,
skipping hidden files and directories (names starting with ``.``) and following symbolic
links, each directory once.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterable, Iterator, Mapping, Sized
from pathlib import Path
from typing import Any, Union

from npmdb.errors import DataError, InterfaceError

from .files import _existing_path, _read_path
from .records import (
    _PARQUET_BATCH, Document, _check_encodable, _decode_bytes, _Fields, _from_mapping, _short,
    _validated,
)

__all__ = ["Document", "Source", "read_documents", "count_hint", "sample_path"]

#: What :func:`read_documents` accepts (see the module docstring).
Source = Union[str, "os.PathLike[str]", Iterable[Any]]

_SAMPLE_DIR = Path(__file__).resolve().parent.parent / "data" / "dev-small"


# --------------------------------------------------------------------------------------------
# public API


def read_documents(source: Source, *, text_field: str = "text", id_field: str = "id",
                   title_field: str = "title") -> Iterator[Document]:
    """Yield the validated documents of ``source``, streaming (large files are not loaded whole).

    ``text_field``, ``id_field`` and ``title_field`` name the keys (dicts, JSON) or columns
    (CSV, Parquet, data frames) that hold the text, id and title; every other key except
    ``meta`` is merged into the document's ``meta``. An ``int`` id becomes ``str``; a missing
    or null id means "let the database assign one"; a missing or null title becomes ``""``.
    Text is kept exactly as given (NUL characters and any Unicode included); empty text is
    allowed. A UTF-8 byte-order mark at the start of a file is dropped.

    The type of ``source`` and the existence of a top-level path are checked at once
    (:class:`~npmdb.errors.InterfaceError`, :class:`~npmdb.errors.DataError`); everything
    else is checked as the returned iterator advances, raising
    :class:`~npmdb.errors.DataError` (bad data), :class:`~npmdb.errors.NotSupportedError`
    (Parquet without pyarrow) or :class:`~npmdb.errors.OperationalError` (unreadable file).
    """
    for name, value in (("text_field", text_field), ("id_field", id_field),
                        ("title_field", title_field)):
        if not isinstance(value, str) or not value:
            raise InterfaceError(f"{name} must be a non-empty str, got {value!r}")
    if len({text_field, id_field, title_field, "meta"}) != 4:
        raise InterfaceError("text_field, id_field and title_field must differ from each other "
                             "and from 'meta'")
    fields = _Fields(text=text_field, id=id_field, title=title_field)

    if isinstance(source, (str, os.PathLike)):
        path = _existing_path(source, top_level=True)
        return _read_path(path, fields)
    if isinstance(source, (bytes, bytearray, memoryview)):
        raise InterfaceError("cannot read documents from a single bytes object; pass a list of "
                             "bytes (one UTF-8 encoded document each), or a list of str")
    if isinstance(source, Document):
        raise InterfaceError("got a single Document; pass a list of documents, e.g. [doc]")
    if isinstance(source, Mapping):
        raise InterfaceError("got a single dict; pass a list of dicts (one per document), "
                             "e.g. [{'id': ..., 'text': ...}]")
    if isinstance(source, io.IOBase):  # iterating it would read raw lines as texts
        raise InterfaceError(
            f"got an open file ({getattr(source, 'name', type(source).__name__)!r}); pass its "
            "path instead (db.add('corpus.jsonl') or a pathlib.Path), so that its format "
            "is read")
    rows = _tabular_rows(source, id_field)
    if rows is not None:
        return _read_records(rows, fields)
    if not isinstance(source, Iterable):
        raise InterfaceError(
            f"cannot read documents from {type(source).__name__}; pass a path, or an iterable "
            "of str, bytes, dict, Document or pathlib.Path")
    return _read_items(source, fields)


def count_hint(source: Source) -> int | None:
    """A cheap document count for ``source`` when one is known, else ``None``.

    Known: ``len()`` of a sized collection of documents (not of paths), the row count of a
    data frame or Arrow table, and the row count in a Parquet file's metadata.
    """
    try:
        if isinstance(source, (str, os.PathLike)):
            path = Path(source)
            if path.name.lower().endswith(".parquet") and path.is_file():
                import pyarrow.parquet as pq

                return int(pq.ParquetFile(path).metadata.num_rows)
            return None
        if isinstance(source, (bytes, bytearray, memoryview, Mapping, Document)):
            return None
        if _is_dataframe(source) or _is_arrow(source):
            return int(source.num_rows) if _is_arrow(source) else len(source)  # type: ignore[union-attr, arg-type]
        if isinstance(source, Sized) and isinstance(source, Iterable):
            if any(isinstance(item, os.PathLike) for item in source):
                return None  # a list of files: the document count is not known
            return len(source)
    except Exception:  # noqa: BLE001 - a hint must never fail
        return None
    return None


def sample_path(name: str) -> Path:
    """The path of a file of the bundled ``dev-small`` sample data, e.g. ``"corpus.jsonl.gz"``.

    See ``npmdb/data/README.md`` for what each file holds and its licence.
    """
    available = sorted(p.name for p in _SAMPLE_DIR.iterdir()
                       if p.is_file() and not p.name.startswith(".")) if _SAMPLE_DIR.is_dir() else []
    if name not in available:
        listing = ", ".join(available) if available else "none (the sample data is not installed)"
        raise DataError(f"no bundled sample file named {name!r}; available: {listing}")
    return _SAMPLE_DIR / name


# --------------------------------------------------------------------------------------------
# in-memory sources


def _read_items(source: Iterable[Any], fields: _Fields) -> Iterator[Document]:
    for index, item in enumerate(source):
        where = f"documents[{index}]"
        if isinstance(item, str):
            _check_encodable(item, where, "the text")
            yield Document(None, "", item, {})
        elif isinstance(item, (bytes, bytearray, memoryview)):
            yield Document(None, "", _decode_bytes(bytes(item), where), {})
        elif isinstance(item, Document):
            yield _validated(where, fields.text, item.text, item.id, item.title, item.meta)
        elif isinstance(item, Mapping):
            yield _from_mapping(item, where, fields)
        elif isinstance(item, os.PathLike):
            yield from _read_path(_existing_path(item, top_level=False, where=where), fields)
        else:
            raise DataError(
                f"{where}: expected a str, bytes, dict, Document or pathlib.Path, got "
                f"{type(item).__name__} ({_short(item)})")


def _read_records(rows: Iterator[Mapping[str, Any]], fields: _Fields) -> Iterator[Document]:
    for index, record in enumerate(rows):
        yield _from_mapping(record, f"row {index}", fields)


def _is_dataframe(obj: Any) -> bool:
    return (type(obj).__module__.startswith("pandas") and hasattr(obj, "columns")
            and hasattr(obj, "iloc") and hasattr(obj, "to_dict"))


def _as_file_columns(frame: Any, id_field: str) -> Any:
    named = [name for name in frame.index.names if name is not None]
    if named:  # an index that repeats a column is dropped, not inserted twice
        frame = frame.reset_index(drop=any(name in frame.columns for name in named))
    dup = frame.columns[frame.columns.duplicated()]
    if len(dup):
        raise DataError(f"the data frame has two columns named {str(dup[0])!r}; rename one")
    ids = frame[id_field] if id_field in frame.columns else None
    if ids is not None and ids.dtype.kind == "f":
        whole = ids.dropna()
        # ints and blanks (inf, or past int64, stay floats: the id check names them)
        if len(whole) and bool(((whole == whole.round()) & (whole.abs() < 2.0 ** 63)).all()):
            frame = frame.assign(**{id_field: ids.astype("Int64")})
    return frame


def _is_arrow(obj: Any) -> bool:
    return (type(obj).__module__.startswith("pyarrow") and hasattr(obj, "to_pylist")
            and hasattr(obj, "num_rows") and hasattr(obj, "schema"))


def _tabular_rows(source: Any, id_field: str = "id") -> Iterator[Mapping[str, Any]] | None:
    """Rows of a pandas DataFrame or pyarrow Table/RecordBatch as dicts; None for other types.

    Iterating a DataFrame directly would yield its column names, so it must be caught here.
    A data frame is read as its file would be: a named index is a column (``set_index("id")``
    keeps the ids), an id column that pandas made float to hold a blank holds integers and
    blanks, and two columns of one name are refused, not one silently dropped.
    """
    if _is_dataframe(source):
        source = _as_file_columns(source, id_field)

        def frame_rows() -> Iterator[Mapping[str, Any]]:
            for start in range(0, len(source), _PARQUET_BATCH):
                chunk = source.iloc[start:start + _PARQUET_BATCH]
                # a missing cell (NaN, None, NA, NaT) is None, as the frame's Parquet file
                # holds it: a str column's NaN was stored as a float and escaped IS NULL
                yield from chunk.astype(object).where(chunk.notna(), None).to_dict("records")
        return frame_rows()
    if _is_arrow(source):
        def arrow_rows() -> Iterator[Mapping[str, Any]]:
            batches = source.to_batches() if hasattr(source, "to_batches") else [source]
            for batch in batches:
                yield from batch.to_pylist()
        return arrow_rows()
    return None
