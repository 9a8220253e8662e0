"""Documents from files and directories: JSON lines, JSON, CSV/TSV, Parquet and plain
text, optionally gzip-compressed; directories are read recursively in sorted order."""

from __future__ import annotations

import csv
import gzip
import json
import os
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from npmdb.errors import DataError, NotSupportedError, OperationalError

from .records import (
    _BOM, _FIELD_HINT, _PARQUET_BATCH, Document, _check_encodable, _Fields,
    _from_json_value, _from_mapping, _short,
)

# --------------------------------------------------------------------------------------------
# files


def _existing_path(source: str | os.PathLike[str], *, top_level: bool,
                   where: str = "") -> Path:
    if not os.fspath(source).strip():  # Path("") is ".": every file of the working directory
        raise DataError(f"{where + ': ' if where else ''}an empty path names no file: give a "
                        "file or directory (\".\" for the working directory)")
    path = Path(source)
    try:
        exists = path.exists()
    except (OSError, ValueError):  # name too long, embedded NUL, ...
        exists = False
    if exists:
        return path
    prefix = f"{where}: " if where else ""
    message = f"{prefix}file not found: {_short_path(os.fspath(source))}"
    if top_level and isinstance(source, str):
        message += ("; a str source is always read as a path. To add raw text, pass a list of "
                    "strings, e.g. db.add([text])")
    raise DataError(message)


def _short_path(path: str, limit: int = 120) -> str:
    """``path`` quoted, its middle cut when long: the start shows where it is, the end
    names the file (a plain cut at the end would hide the file's name)."""
    text = repr(path)
    return text if len(text) <= limit else f"{text[:40]}...{text[-(limit - 43):]}"


def _read_path(path: Path, fields: _Fields) -> Iterator[Document]:
    if path.is_dir():
        for file, rel in _walk(path):
            yield from _read_file(file, rel, fields)
    else:
        yield from _read_file(path, path.name, fields)


def _walk(root: Path) -> list[tuple[Path, str]]:
    """Files under ``root`` (recursively, hidden ones skipped, symbolic links to files and
    directories followed, each directory once; a directory holding an LMDB ``data.mdb``,
    such as an npmdb database added from its parent, skipped whole) sorted by relative
    path."""
    found: list[tuple[tuple[str, ...], Path]] = []
    visited = {os.path.realpath(root)}

    def fail(exc: OSError) -> None:
        raise OperationalError(f"{root}: cannot list directory: {exc}") from exc

    def first_visit(d: str) -> bool:  # a link loop, or two links to one directory
        real = os.path.realpath(d)
        new = real not in visited
        visited.add(real)
        return new

    for dirpath, dirnames, filenames in os.walk(root, onerror=fail, followlinks=True):
        if "data.mdb" in filenames:  # a database (npmdb's or LMDB's): never documents
            dirnames[:] = []
            continue
        dirnames[:] = [d for d in dirnames
                       if not d.startswith(".") and first_visit(os.path.join(dirpath, d))]
        for name in filenames:
            if name.startswith("."):
                continue
            file = Path(dirpath, name)
            try:
                regular = file.is_file()
            except OSError as exc:  # e.g. a link into /proc that this user may not follow
                raise DataError(f"{_short_path(str(file))}: cannot read it ({exc.strerror or exc}); "
                                "nothing was added") from exc
            if not regular and file.is_symlink() and not file.exists():
                raise DataError(f"{_short_path(str(file))}: a broken symbolic link (to "
                                f"{os.readlink(file)!r}); remove it or fix its target. Nothing "
                                "was added")
            if regular:
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
        except (RecursionError, ValueError) as exc:
            raise _unreadable_json(where, exc) from None
        yield _from_json_value(value, where, fields)


def _csv_why(exc: Exception) -> str:
    """The csv module's complaint, in a user's terms where it speaks of Python's (a file
    whose lines end in a bare carriage return: old Mac line endings)."""
    if "universal-newline" in str(exc):
        return ("its lines end in a bare carriage return (\\r, old Mac line endings); "
                "convert them to \\n (e.g. tr '\\r' '\\n')")
    return str(exc)


def _unreadable_json(where: str, exc: BaseException) -> DataError:
    """Valid JSON that Python will not read: nested past its recursion limit, or an integer
    of more digits than ``int`` converts (4,300)."""
    if isinstance(exc, RecursionError):
        return DataError(f"{where}: the JSON is nested too deeply; flatten it")
    return DataError(f"{where}: the JSON holds a number too long to read ({exc}); store "
                     "long numbers as str")


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
    except (RecursionError, ValueError) as exc:
        raise _unreadable_json(str(path), exc) from None
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

    reader = csv.reader(text_lines(), dialect, strict=True)
    try:
        header = next(reader)
    except StopIteration:
        raise DataError(f"{path}: empty {kind} file; a header row naming the columns (with a "
                        f"{fields.text!r} column) is required") from None
    except csv.Error as exc:
        raise DataError(f"{path}:{reader.line_num}: malformed {kind}: {_csv_why(exc)}") from None
    if fields.text not in header:
        columns = ", ".join(repr(c) for c in header) or "none"
        raise DataError(f"{path}:1: no {fields.text!r} column (the header row has: {columns}); "
                        f"the first row must name the columns, one of them {fields.text!r} "
                        f"({_FIELD_HINT})")
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
            hint = ("; a quote opened in this row never closes, so the rest of the file "
                    "would be one field" if "end of data" in str(exc) else "")
            raise DataError(f"{path}:{start}: malformed {kind} in the row that starts on this "
                            f"line: {_csv_why(exc)}{hint}; nothing was added") from None
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
    except (RecursionError, ValueError) as exc:
        raise _unreadable_json(where, exc) from None
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
                        f"{_FIELD_HINT}")
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


def text_title(name: str) -> str:
    """A text file's title: its name less an extension of letters ("notes.txt", "a.md"),
    never a version's digits ("Apache-2.0", "notes.v1.2" were "Apache-2", "notes.v1")."""
    stem, dot, ext = name.rpartition(".")
    return stem if dot and stem and ext.isascii() and ext.isalpha() and len(ext) <= 10 \
        else name


def _read_text(path: Path, compressed: bool, rel: str) -> Iterator[Document]:
    text = _decode_file_bytes(_read_all(path, compressed), path)
    name = path.name[:-3] if compressed else path.name
    title = text_title(name)
    _check_encodable(rel, str(path), "the file name")
    yield Document(rel, title, text, {})
