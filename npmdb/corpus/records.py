"""Validated documents: :class:`Document`, and turning one record (a dict, a JSON value, a
CSV or Parquet row) into one, or a :class:`~npmdb.errors.DataError` that says where the bad
input is and how to fix it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from npmdb.errors import DataError

__all__ = ["Document"]

_BOM = b"\xef\xbb\xbf"
_MAX_META_DEPTH = 100
_MSGPACK_INT_MIN = -(2**63)
_MSGPACK_INT_MAX = 2**64 - 1
_PARQUET_BATCH = 1024



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
# validation


def _short(value: Any, limit: int = 60) -> str:
    try:
        text = repr(value)
    except ValueError:  # an int of more digits than Python converts to text
        return f"<an int of {value.bit_length()} bits>"
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


#: What to do when the text is under another name (``db.add`` takes no field names).
_FIELD_HINT = ("rename it to 'text', or from Python add "
               "npmdb.corpus.read_documents(SOURCE, text_field=NAME)")


def _missing(value: Any) -> bool:
    """None, or a data frame's missing value: NaN (pandas' missing str) or ``pandas.NA``."""
    return value is None or (isinstance(value, float) and value != value) or \
        type(value).__name__ == "NAType"


def _check_id(value: Any, where: str, field_name: str) -> str | None:
    if _missing(value):
        return None
    if isinstance(value, np.generic):  # a numpy scalar (a data frame's column)
        value = value.item()
    if isinstance(value, int) and not isinstance(value, bool):
        if value.bit_length() > 64:
            raise DataError(f"{where}: {field_name!r} is an int of {value.bit_length()} bits; "
                            "an id is at most 64 bits, or a str")
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
    if _missing(value):
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
    if isinstance(value, (np.generic, np.ndarray)):  # a data frame's scalars and lists
        value = value.tolist()
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
                        f"needs its text under {fields.text!r} ({_FIELD_HINT})")
    meta = record.get("meta")
    if _missing(meta):  # None, or a data frame's blank (NaN, pd.NA)
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
