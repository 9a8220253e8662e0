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
plain text, one document per file. Directories are read recursively in sorted order, skipping
hidden files and directories (names starting with ``.``).
"""

from __future__ import annotations

import csv
import gzip
import json
import os
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sized
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

from npmdb.errors import DataError, InterfaceError, NotSupportedError, OperationalError

__all__ = ["Document", "Source", "read_documents", "count_hint", "sample_path"]

#: What :func:`read_documents` accepts (see the module docstring).
Source = Union[str, "os.PathLike[str]", Iterable[Any]]

_BOM = b"\xef\xbb\xbf"
_MAX_META_DEPTH = 100
_MSGPACK_INT_MIN = -(2**63)
_MSGPACK_INT_MAX = 2**64 - 1
_PARQUET_BATCH = 1024
_SAMPLE_DIR = Path(__file__).parent / "data" / "dev-small"


@dataclass(frozen=True, slots=True)
class Document:
    """One validated document.

    ``id`` is ``None`` when the database should assign one; ``meta`` holds only
    msgpack-serialisable values (``str`` keys; ``str``/``int``/``float``/``bool``/``None``
    values and lists/dicts of those). :func:`read_documents` guarantees both; constructing a
    ``Document`` directly does not validate anything.
    """

    id: str | None
    title: str
    text: str
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Fields:
    text: str
    id: str
    title: str


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
    rows = _tabular_rows(source)
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


def _is_arrow(obj: Any) -> bool:
    return (type(obj).__module__.startswith("pyarrow") and hasattr(obj, "to_pylist")
            and hasattr(obj, "num_rows") and hasattr(obj, "schema"))


def _tabular_rows(source: Any) -> Iterator[Mapping[str, Any]] | None:
    """Rows of a pandas DataFrame or pyarrow Table/RecordBatch as dicts; None for other types.

    Iterating a DataFrame directly would yield its column names, so it must be caught here.
    """
    if _is_dataframe(source):
        def frame_rows() -> Iterator[Mapping[str, Any]]:
            for start in range(0, len(source), _PARQUET_BATCH):
                chunk = source.iloc[start:start + _PARQUET_BATCH]
                yield from chunk.to_dict("records")
        return frame_rows()
    if _is_arrow(source):
        def arrow_rows() -> Iterator[Mapping[str, Any]]:
            batches = source.to_batches() if hasattr(source, "to_batches") else [source]
            for batch in batches:
                yield from batch.to_pylist()
        return arrow_rows()
    return None


# --------------------------------------------------------------------------------------------
# validation


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _check_encodable(text: str, where: str, what: str) -> None:
    """Reject lone surrogates: they are not Unicode scalar values and cannot be stored."""
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise DataError(
            f"{where}: {what} contains a lone surrogate U+{ord(text[exc.start]):04X} at "
            f"character {exc.start}, which cannot be stored as UTF-8; fix the text (it was "
            "probably decoded with errors='surrogateescape' or came from broken \\u escapes)"
        ) from None


def _decode_bytes(data: bytes, where: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(
            f"{where}: invalid UTF-8 at byte offset {exc.start} (byte 0x{data[exc.start]:02x}); "
            "pass text as str, or bytes encoded as UTF-8 (decode other encodings first, "
            "e.g. data.decode('latin-1'))") from None


def _check_text(value: Any, where: str, field_name: str) -> str:
    if isinstance(value, str):
        _check_encodable(value, where, f"{field_name!r}")
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _decode_bytes(bytes(value), f"{where}: {field_name!r}")
    if value is None:
        kind = "null"
    elif isinstance(value, float) and value != value:
        kind = "NaN (a missing value)"
    else:
        kind = f"{type(value).__name__} ({_short(value)})"
    raise DataError(f"{where}: {field_name!r} is {kind}, not text; every "
                    "document's text must be a str (use \"\" for an empty document)")


def _check_id(value: Any, where: str, field_name: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, str):
        if not value:
            raise DataError(f"{where}: {field_name!r} is empty; give a non-empty id, or leave "
                            "it out (or None) to let the database assign one")
        _check_encodable(value, where, f"{field_name!r}")
        return value
    raise DataError(f"{where}: {field_name!r} is {type(value).__name__} ({_short(value)}); a "
                    "document id must be a non-empty str or an int (or None to let the "
                    "database assign one)")


def _check_title(value: Any, where: str, field_name: str) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        _check_encodable(value, where, f"{field_name!r}")
        return value
    raise DataError(f"{where}: {field_name!r} is {type(value).__name__} ({_short(value)}); a "
                    "title must be a str (or left out)")


def _meta_value(value: Any, path: str, where: str, depth: int) -> Any:
    """Check one meta value is msgpack-serialisable; return it (tuples become lists)."""
    if depth > _MAX_META_DEPTH:
        raise DataError(f"{where}: meta is nested more than {_MAX_META_DEPTH} levels deep at "
                        f"{path} (a reference cycle?); flatten it")
    if value is None or isinstance(value, (bool, float)):
        return value
    if isinstance(value, str):
        _check_encodable(value, where, path)
        return value
    if isinstance(value, int):
        if not _MSGPACK_INT_MIN <= value <= _MSGPACK_INT_MAX:
            raise DataError(f"{where}: {path} = {_short(value)} is outside the 64-bit integer "
                            "range that meta can store; store it as a str")
        return value
    if isinstance(value, (list, tuple)):
        return [_meta_value(v, f"{path}[{i}]", where, depth + 1) for i, v in enumerate(value)]
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise DataError(f"{where}: {path} has the key {_short(key)} of type "
                                f"{type(key).__name__}; meta keys must be str")
            _check_encodable(key, where, f"the key {path}[{key!r}]")
            out[key] = _meta_value(item, f"{path}[{key!r}]", where, depth + 1)
        return out
    raise DataError(f"{where}: {path} is {type(value).__name__} ({_short(value)}), which meta "
                    "cannot store; meta values must be str, int, float, bool, None, or lists "
                    "and dicts of those (convert it, e.g. to str)")


def _validated(where: str, text_field: str, text: Any, doc_id: Any, title: Any,
               meta: Any) -> Document:
    if not isinstance(meta, Mapping):
        raise DataError(f"{where}: 'meta' is {type(meta).__name__} ({_short(meta)}); meta must "
                        "be a dict with str keys")
    return Document(
        id=_check_id(doc_id, where, "id"),
        title=_check_title(title, where, "title"),
        text=_check_text(text, where, text_field),
        meta=_meta_value(meta, "meta", where, 0),
    )


def _from_mapping(record: Mapping[Any, Any], where: str, fields: _Fields) -> Document:
    if fields.text not in record:
        found = ", ".join(_short(k, 30) for k in record) or "none"
        raise DataError(f"{where}: no {fields.text!r} field (found: {found}); each document "
                        f"needs its text under {fields.text!r}, or pass text_field= to name "
                        "the field that holds it")
    meta = record.get("meta")
    if meta is None:
        meta = {}
    elif not isinstance(meta, Mapping):
        raise DataError(f"{where}: 'meta' is {type(meta).__name__} ({_short(meta)}); meta must "
                        "be a dict (JSON object) with str keys")
    known = {fields.text, fields.id, fields.title, "meta"}
    extras = {k: v for k, v in record.items() if k not in known}
    if extras:
        clash = [k for k in extras if k in meta]
        if clash:
            raise DataError(f"{where}: {_short(clash[0], 30)} is both a top-level field and a "
                            "key of 'meta'; keep only one of them")
        meta = {**meta, **extras}
    return Document(
        id=_check_id(record.get(fields.id), where, fields.id),
        title=_check_title(record.get(fields.title), where, fields.title),
        text=_check_text(record[fields.text], where, fields.text),
        meta=_meta_value(meta, "meta", where, 0),
    )


def _from_json_value(value: Any, where: str, fields: _Fields) -> Document:
    if isinstance(value, dict):
        return _from_mapping(value, where, fields)
    if isinstance(value, str):
        _check_encodable(value, where, "the text")
        return Document(None, "", value, {})
    kind = {list: "an array", int: "a number", float: "a number", bool: "a boolean",
            type(None): "null"}.get(type(value), type(value).__name__)
    raise DataError(f"{where}: expected a JSON object with a {fields.text!r} field, got "
                    f"{kind} ({_short(value)})")


# --------------------------------------------------------------------------------------------
# files


def _existing_path(source: str | os.PathLike[str], *, top_level: bool,
                   where: str = "") -> Path:
    path = Path(source)
    try:
        exists = path.exists()
    except (OSError, ValueError):  # name too long, embedded NUL, ...
        exists = False
    if exists:
        return path
    prefix = f"{where}: " if where else ""
    message = f"{prefix}file not found: {_short(os.fspath(source))}"
    if top_level and isinstance(source, str):
        message += ("; a str source is always read as a path. To add raw text, pass a list of "
                    "strings, e.g. db.add([text])")
    raise DataError(message)


def _read_path(path: Path, fields: _Fields) -> Iterator[Document]:
    if path.is_dir():
        for file, rel in _walk(path):
            yield from _read_file(file, rel, fields)
    else:
        yield from _read_file(path, path.name, fields)


def _walk(root: Path) -> list[tuple[Path, str]]:
    """Files under ``root`` (recursively, hidden ones skipped) sorted by relative path."""
    found: list[tuple[tuple[str, ...], Path]] = []

    def fail(exc: OSError) -> None:
        raise OperationalError(f"{root}: cannot list directory: {exc}") from exc

    for dirpath, dirnames, filenames in os.walk(root, onerror=fail):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for name in filenames:
            if name.startswith("."):
                continue
            file = Path(dirpath, name)
            if file.is_file():
                found.append((file.relative_to(root).parts, file))
    found.sort(key=lambda item: item[0])
    return [(file, "/".join(parts)) for parts, file in found]


def _format_of(name: str) -> tuple[str, bool]:
    """(format, gzip-compressed) from a file name's suffixes."""
    lower = name.lower()
    compressed = lower.endswith(".gz")
    if compressed:
        lower = lower[:-3]
    for suffixes, fmt in (((".jsonl", ".ndjson"), "jsonl"), ((".json",), "json"),
                          ((".parquet",), "parquet"), ((".csv",), "csv"), ((".tsv",), "tsv")):
        if lower.endswith(suffixes):
            return fmt, compressed
    return "text", compressed


def _read_file(path: Path, rel: str, fields: _Fields) -> Iterator[Document]:
    fmt, compressed = _format_of(path.name)
    if fmt == "jsonl":
        return _read_jsonl(path, compressed, fields, hint="")
    if fmt == "json":
        return _read_json(path, compressed, fields)
    if fmt == "parquet":
        return _read_parquet(path, fields)
    if fmt in ("csv", "tsv"):
        return _read_csv(path, compressed, fields, csv.excel if fmt == "csv" else csv.excel_tab)
    return _read_text(path, compressed, rel)


def _io_error(path: Path, exc: BaseException) -> Exception:
    if isinstance(exc, (gzip.BadGzipFile, EOFError, zlib.error)):
        return DataError(f"{path}: not a valid gzip file, or truncated ({exc}); re-compress it, "
                         "or drop the .gz suffix if it is not compressed")
    return OperationalError(f"{path}: cannot read file: {exc}")


def _open(path: Path, compressed: bool) -> Any:
    return gzip.open(path, "rb") if compressed else open(path, "rb")  # noqa: SIM115


def _binary_lines(path: Path, compressed: bool) -> Iterator[tuple[int, int, bytes]]:
    """(line number, byte offset, raw line) for each line; I/O errors become npmdb errors."""
    try:
        with _open(path, compressed) as handle:
            offset = 0
            for lineno, raw in enumerate(handle, 1):
                if lineno == 1 and raw.startswith(_BOM):
                    raw = raw[len(_BOM):]
                    offset = len(_BOM)
                yield lineno, offset, raw
                offset += len(raw)
    except (OSError, EOFError, zlib.error) as exc:
        raise _io_error(path, exc) from exc


def _read_all(path: Path, compressed: bool) -> bytes:
    try:
        with _open(path, compressed) as handle:
            data: bytes = handle.read()
    except (OSError, EOFError, zlib.error) as exc:
        raise _io_error(path, exc) from exc
    return data[len(_BOM):] if data.startswith(_BOM) else data


def _decode_file_bytes(data: bytes, path: Path, *, line: int | None = None,
                       base_offset: int = 0) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        if line is None:
            line = data.count(b"\n", 0, exc.start) + 1
        raise DataError(
            f"{path}:{line}: invalid UTF-8 at byte offset {base_offset + exc.start} (byte "
            f"0x{data[exc.start]:02x}); the file must be UTF-8 encoded: re-encode it "
            "(e.g. iconv -f latin1 -t utf-8)") from None


def _read_jsonl(path: Path, compressed: bool, fields: _Fields, hint: str) -> Iterator[Document]:
    for lineno, offset, raw in _binary_lines(path, compressed):
        if not raw.strip():
            continue
        where = f"{path}:{lineno}"
        line = _decode_file_bytes(raw, path, line=lineno, base_offset=offset)
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{where}: malformed JSON at column {exc.colno}: {exc.msg}; each "
                            f"line must hold one JSON object{hint}") from None
        yield _from_json_value(value, where, fields)


def _first_byte(path: Path, compressed: bool) -> bytes:
    """The first non-whitespace byte of a file (after a BOM), or b"" if there is none."""
    try:
        with _open(path, compressed) as handle:
            head = handle.read(len(_BOM))
            chunk = head[len(_BOM):] if head == _BOM else head
            while True:
                stripped = chunk.lstrip()
                if stripped:
                    return stripped[:1]
                chunk = handle.read(65536)
                if not chunk:
                    return b""
    except (OSError, EOFError, zlib.error) as exc:
        raise _io_error(path, exc) from exc


def _read_json(path: Path, compressed: bool, fields: _Fields) -> Iterator[Document]:
    if _first_byte(path, compressed) != b"[":
        yield from _read_jsonl(path, compressed, fields,
                               hint=" (a .json file must hold a JSON list of objects, or one "
                                    "JSON object per line)")
        return
    text = _decode_file_bytes(_read_all(path, compressed), path)
    try:
        items = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}:{exc.lineno}: malformed JSON at column {exc.colno}: "
                        f"{exc.msg}") from None
    for index, value in enumerate(items):
        yield _from_json_value(value, f"{path}: item {index}", fields)


def _raise_csv_field_limit() -> None:
    # The csv module refuses fields over 128 KiB by default; documents can be longer.
    limit = 2**31 - 1
    if csv.field_size_limit() < limit:
        csv.field_size_limit(limit)


def _read_csv(path: Path, compressed: bool, fields: _Fields,
              dialect: type[csv.Dialect]) -> Iterator[Document]:
    _raise_csv_field_limit()
    kind = "CSV" if dialect is csv.excel else "TSV"

    def text_lines() -> Iterator[str]:
        for lineno, offset, raw in _binary_lines(path, compressed):
            yield _decode_file_bytes(raw, path, line=lineno, base_offset=offset)

    reader = csv.reader(text_lines(), dialect)
    try:
        header = next(reader)
    except StopIteration:
        raise DataError(f"{path}: empty {kind} file; a header row naming the columns (with a "
                        f"{fields.text!r} column) is required") from None
    except csv.Error as exc:
        raise DataError(f"{path}:{reader.line_num}: malformed {kind}: {exc}") from None
    if fields.text not in header:
        columns = ", ".join(repr(c) for c in header) or "none"
        raise DataError(f"{path}:1: no {fields.text!r} column (the header row has: {columns}); "
                        f"the first row must name the columns, one of them {fields.text!r} "
                        "(or pass text_field=)")
    duplicates = sorted({c for c in header if header.count(c) > 1})
    if duplicates:
        raise DataError(f"{path}:1: duplicate column names in the header: "
                        f"{', '.join(map(repr, duplicates))}")
    while True:
        start = reader.line_num + 1
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise DataError(f"{path}:{reader.line_num}: malformed {kind}: {exc}") from None
        if not row:
            continue
        where = f"{path}:{start}"
        if len(row) != len(header):
            raise DataError(f"{where}: the row has {len(row)} fields but the header has "
                            f"{len(header)}; quote fields that contain the delimiter, quotes "
                            "or newlines")
        record: dict[str, Any] = dict(zip(header, row))
        if record.get(fields.id) == "":
            record[fields.id] = None  # CSV has no null: an empty cell means "assign an id"
        if "meta" in record:
            record["meta"] = _csv_meta(record["meta"], where)
        yield _from_mapping(record, where, fields)


def _csv_meta(cell: str, where: str) -> dict[str, Any]:
    """A CSV ``meta`` column holds a JSON object (or nothing)."""
    if not cell.strip():
        return {}
    try:
        value = json.loads(cell)
    except json.JSONDecodeError as exc:
        raise DataError(f"{where}: the 'meta' column must hold a JSON object; it is not valid "
                        f"JSON ({exc.msg} at character {exc.pos})") from None
    if not isinstance(value, dict):
        raise DataError(f"{where}: the 'meta' column must hold a JSON object, got "
                        f"{_short(value)}")
    return value


def _read_parquet(path: Path, fields: _Fields) -> Iterator[Document]:
    try:
        import pyarrow
        import pyarrow.parquet as pq
    except ImportError:
        raise NotSupportedError(f"{path}: reading Parquet files needs pyarrow; install it with "
                                "`pip install pyarrow` (or `pip install npmdb[arrow]`)") from None
    bad = (pyarrow.ArrowException, OSError)
    try:
        parquet = pq.ParquetFile(path)
        columns = parquet.schema_arrow.names
    except bad as exc:
        raise DataError(f"{path}: not a valid Parquet file: {exc}") from None
    if fields.text not in columns:
        listing = ", ".join(repr(c) for c in columns) or "none"
        raise DataError(f"{path}: no {fields.text!r} column (the columns are: {listing}); "
                        "rename the column or pass text_field=")
    batches = parquet.iter_batches(batch_size=_PARQUET_BATCH)
    row = 0
    while True:
        try:
            batch = next(batches)
            records = batch.to_pylist()
        except StopIteration:
            return
        except bad as exc:
            raise DataError(f"{path}: cannot read Parquet data after row {row}: {exc}") from None
        for record in records:
            yield _from_mapping(record, f"{path}: row {row}", fields)
            row += 1


def _read_text(path: Path, compressed: bool, rel: str) -> Iterator[Document]:
    text = _decode_file_bytes(_read_all(path, compressed), path)
    name = path.name[:-3] if compressed else path.name
    title = Path(name).stem
    _check_encodable(rel, str(path), "the file name")
    yield Document(rel, title, text, {})
