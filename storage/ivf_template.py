"""An IVF template as the database keeps it: the trained, empty FAISS index of a generation
(coarse quantiser and PQ codebooks, :func:`npmdb.storage.ivf.train_template`), stored in
LMDB's ``meta`` table under ``ivf:g{gen}`` with its CRC-32, and read back checked (a
damaged template failed inside FAISS or, damaged in its centroids, coded every later
segment against lists that were never trained)."""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np

from npmdb.errors import OperationalError

from .format import unpack

__all__ = ["template_key", "template_value", "template_of", "read_template",
           "template_nlist", "load_template"]

_RESTORE = "run `npmdb check`, then restore the database from a backup"


def template_key(gen: int) -> bytes:
    return f"ivf:g{gen}".encode()


def template_value(template: bytes) -> dict:
    """What the ``meta`` table stores for a template: its bytes and their CRC-32."""
    return {"template": bytes(template), "crc": zlib.crc32(template)}


def template_of(value: Any, gen: int) -> bytes:
    """The template bytes of a stored :func:`template_value` (checked), or of a bare
    template, as databases written before the checksum stored it."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if not (isinstance(value, dict) and isinstance(value.get("template"), bytes)):
        raise OperationalError(f"the IVF template of generation {gen} is damaged (not a "
                               f"template): {_RESTORE}")
    if zlib.crc32(value["template"]) != value.get("crc"):
        raise OperationalError(f"the IVF template of generation {gen} is damaged (checksum "
                               f"mismatch): {_RESTORE}")
    return value["template"]


def read_template(env, gen: int) -> bytes | None:
    """Generation ``gen``'s trained template (its checksum checked), or None before the
    first is trained."""
    with env.read() as txn:
        raw = txn.get(template_key(gen), db=env.dbs["meta"])
    return template_of(unpack(raw), gen) if raw is not None else None


def _deserialize(template: bytes):
    """The FAISS index of a serialised template (FAISS's own error on bytes it cannot read:
    an OperationalError)."""
    import faiss

    try:
        return faiss.deserialize_index(np.frombuffer(template, dtype=np.uint8))
    except RuntimeError as exc:
        raise OperationalError(f"the IVF template cannot be read ({str(exc)[:200]}): "
                               f"{_RESTORE}") from None


def template_nlist(template: bytes) -> int:
    """The lists of a serialised template."""
    import faiss

    return int(faiss.extract_index_ivf(_deserialize(template)).nlist)


def load_template(template: bytes, dim: int):
    """The trained, empty FAISS index ``template`` holds (checked against ``dim``)."""
    index = _deserialize(template)
    if index.d != dim:
        raise OperationalError(f"the IVF template has dimension {index.d}, the vectors "
                               f"{dim}: the database is inconsistent")
    return index
