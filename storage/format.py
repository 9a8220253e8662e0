"""What npmdb's LMDB values look like: key layout, msgpack values, numpy array values
(with a CRC32), per-token flag bits, and the typed records of segments and generations.

One place for the on-disk layout, so that every writer and reader agrees on it.
"""

from __future__ import annotations

import contextlib
import hashlib
import struct
import zlib
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np

from npmdb.errors import DataError, OperationalError, ProgrammingError

__all__ = [
    "u32", "u64", "read_u32", "read_u64", "doc_key", "docid_key", "docid_prefix", "col_key",
    "vec_key", "pack", "unpack", "pack_array", "unpack_array",
    "VALID_START", "VALID_END", "WORD_START", "WORD_END", "STOPWORD", "PUNCT",
    "BREAK", "SegmentRecord", "GenerationRecord", "LEGACY_CHUNK", "put_segment", "get_segment",
    "put_generation", "get_generation",
]

# -- per-token flag bits (uint8), stored with every block ------------------------------------

VALID_START = 1 << 0   # begins a word that is neither punctuation nor a stopword
VALID_END = 1 << 1     # ends such a word
WORD_START = 1 << 2    # begins a word (any word)
WORD_END = 1 << 3      # ends a word (any word)
STOPWORD = 1 << 4      # belongs to a stopword
PUNCT = 1 << 5         # is punctuation or a symbol
BREAK = 1 << 6         # clause or sentence punctuation (npmdb.boundaries.is_break): a clean
                       # span never holds one (databases built before this bit: no breaks)


# -- keys (big-endian so LMDB's byte order is numeric order) ------------------------------


def u32(x: int) -> bytes:
    return struct.pack(">I", x)


def u64(x: int) -> bytes:
    return struct.pack(">Q", x)


def read_u32(b: bytes, at: int = 0) -> int:
    return struct.unpack_from(">I", b, at)[0]


def read_u64(b: bytes, at: int = 0) -> int:
    return struct.unpack_from(">Q", b, at)[0]


def doc_key(seg: int, local: int) -> bytes:
    return u32(seg) + u32(local)


def id_type_error(doc_id: Any) -> ProgrammingError:
    """The error for a document id that is not a str (an int id was stored as its text)."""
    hint = (f": an id added as {doc_id!r} is stored as {str(doc_id)!r}; pass that"
            if isinstance(doc_id, int) and not isinstance(doc_id, bool) else "")
    return ProgrammingError(f"document ids are strings, got {doc_id!r}{hint}")


def docid_prefix(doc_id: str) -> bytes:
    return hashlib.blake2b(doc_id.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def docid_key(doc_id: str, seg: int) -> bytes:
    return docid_prefix(doc_id) + u32(seg)


def col_key(seg: int, name: str) -> bytes:
    return u32(seg) + name.encode()


def vec_key(gen: int, seg: int, chunk: int) -> bytes:
    return u32(gen) + u32(seg) + u32(chunk)


# -- msgpack values -----------------------------------------------------------------------


def pack(obj: Any) -> bytes:
    try:
        return msgpack.packb(obj, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise DataError(f"value cannot be stored (msgpack): {exc}") from exc


def unpack(data: bytes | memoryview) -> Any:
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as exc:  # noqa: BLE001 - msgpack raises several kinds on bad bytes
        raise OperationalError(f"corrupt value in the database ({type(exc).__name__}: {exc}); "
                               "run `npmdb check` for a full report") from None


@contextlib.contextmanager
def damaged(what: str):
    """Turn a record of the wrong shape (a key missing, a value of the wrong type: what a
    damaged or foreign record unpacks to) into an OperationalError naming ``what``."""
    try:
        yield
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
        raise OperationalError(
            f"the database is damaged: {what} is unreadable ({type(exc).__name__}: {exc}); "
            "run `npmdb check` for a full report") from None


# -- numpy arrays: 16-byte aligned header, CRC32 of the payload -----------------------------

_MAGIC = b"NA"
_DTYPES = {0: np.dtype("<f2"), 1: np.dtype("<f4"), 2: np.dtype("<i4"), 3: np.dtype("<i8"),
           4: np.dtype("u1"), 5: np.dtype("i1")}
_CODES = {v: k for k, v in _DTYPES.items()}


def pack_array(a: np.ndarray) -> bytes:
    a = np.asarray(a)
    dt = a.dtype.newbyteorder("<") if a.dtype.byteorder == ">" else a.dtype
    code = _CODES.get(np.dtype(dt))
    if code is None:
        raise DataError(f"arrays of dtype {a.dtype} cannot be stored")
    payload = a.astype(dt, copy=False).tobytes(order="C")
    shape = struct.pack(f"<{a.ndim}Q", *a.shape)
    crc = zlib.crc32(payload, zlib.crc32(bytes([code, a.ndim]) + shape))
    head = struct.pack("<2sBBI", _MAGIC, code, a.ndim, crc) + shape
    head += b"\0" * (-len(head) % 16)
    return head + payload


def unpack_array(buf: bytes | memoryview, *, verify: bool = False, what: str = "array"
                 ) -> np.ndarray:
    """Decode :func:`pack_array` output; zero-copy over ``buf`` (a read-only view)."""
    if len(buf) < 8 or bytes(buf[:2]) != _MAGIC:
        raise OperationalError(f"corrupt {what}: bad header (run `npmdb check`)")
    _, code, ndim, crc = struct.unpack_from("<2sBBI", buf, 0)
    if ndim > 8 or len(buf) < 8 + 8 * ndim:
        raise OperationalError(f"corrupt {what}: bad header (ndim {ndim})")
    shape = struct.unpack_from(f"<{ndim}Q", buf, 8)
    hlen = 8 + 8 * ndim
    hlen += -hlen % 16
    dtype = _DTYPES.get(code)
    if dtype is None:
        raise OperationalError(f"corrupt {what}: unknown dtype code {code}")
    n = 1
    for d in shape:
        n *= int(d)
    if n > len(buf):
        raise OperationalError(f"corrupt {what}: shape {shape} does not fit {len(buf)} bytes")
    if len(buf) != hlen + n * dtype.itemsize:
        raise OperationalError(f"corrupt {what}: {len(buf)} bytes, expected "
                               f"{hlen + n * dtype.itemsize}")
    try:  # a damaged ndim can read padding and data as a zero and a dimension past int64
        arr = np.frombuffer(buf, dtype=dtype, count=n, offset=hlen).reshape(shape)
    except ValueError as exc:
        raise OperationalError(f"corrupt {what}: bad shape {shape} ({exc}); run "
                               "`npmdb check`") from None
    head_crc = zlib.crc32(bytes([code, ndim]) + bytes(buf[8:8 + 8 * ndim]))
    if verify and zlib.crc32(memoryview(buf)[hlen:], head_crc) != crc:
        raise OperationalError(f"corrupt {what}: checksum mismatch (the file was damaged); "
                               "run `npmdb check` for a full report, then restore from a "
                               "backup or re-add the affected documents")
    return arr


# -- typed records: one place writes them and reads them --------------------------------------

LEGACY_CHUNK = 4096  # tokens per vector chunk of segments whose record has no "chunk"


@dataclass(frozen=True)
class SegmentRecord:
    """What a segment is (the ``segments`` table, key ``u32(id)``): written once, by the
    commit that first names the segment, and never changed.

    ``codec`` is the full name of the codec its vectors were stored with (a trained codec's
    name carries its state's hash: ``pq96:3f2a…``); ``dense`` the dense index kind;
    ``chunk`` the tokens per vector chunk; ``gens`` the generation it was written with;
    ``merged_from`` the segments an ``optimize`` merged into it.
    """

    id: int
    docs: int
    blocks: int
    tokens: int
    dim: int
    codec: str
    dense: str
    chunk: int
    gens: tuple[int, ...]
    created: float
    seconds: float = 0.0
    engine: str = "local"
    merged_from: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"id": self.id, "docs": self.docs, "blocks": self.blocks,
                             "tokens": self.tokens, "dim": self.dim, "codec": self.codec,
                             "dense": self.dense, "chunk": self.chunk, "gens": list(self.gens),
                             "created": self.created, "seconds": self.seconds}
        if self.engine != "local":
            d["engine"] = self.engine
        if self.merged_from:
            d["merged_from"] = list(self.merged_from)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "SegmentRecord":
        with damaged("a segment record"):
            return cls(int(d["id"]), int(d["docs"]), int(d["blocks"]), int(d["tokens"]),
                           int(d["dim"]), str(d.get("codec", "float16")),
                       str(d.get("dense", "hnsw")),
                       int(d.get("chunk", LEGACY_CHUNK)),
                       tuple(int(g) for g in d.get("gens", ())),
                       float(d.get("created", 0.0)), float(d.get("seconds", 0.0)),
                       str(d.get("engine", "local")),
                       tuple(int(s) for s in d.get("merged_from", ())))


@dataclass(frozen=True)
class GenerationRecord:
    """An embedding generation (the ``generations`` table, key ``u32(id)``): the encoder that
    made a set of vectors. ``encoder`` is the encoder's identity (name, path, sha256
    fingerprint, hidden size); ``checkpoint`` its directory inside the database (None for
    generation 0, the encoder the database was made with); ``parent`` the generation it
    was trained from; ``steps`` the training steps behind it."""

    id: int
    encoder: dict[str, Any]
    created: float
    parent: int | None = None
    checkpoint: str | None = None
    steps: int = 0
    info: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "encoder": dict(self.encoder), "created": self.created,
                "parent": self.parent, "checkpoint": self.checkpoint, "steps": self.steps,
                "info": dict(self.info)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "GenerationRecord":
        with damaged("an embedding generation's record"):
            return cls(int(d["id"]), dict(d["encoder"]), float(d.get("created", 0.0)),
                       d.get("parent"), d.get("checkpoint"), int(d.get("steps", 0)),
                       dict(d.get("info") or {}))


def put_segment(txn, dbs, rec: SegmentRecord) -> None:
    txn.put(u32(rec.id), pack(rec.to_dict()), db=dbs["segments"])


def get_segment(txn, dbs, seg: int) -> SegmentRecord | None:
    raw = txn.get(u32(seg), db=dbs["segments"])
    return None if raw is None else SegmentRecord.from_dict(unpack(raw))


def put_generation(txn, dbs, rec: GenerationRecord) -> None:
    txn.put(u32(rec.id), pack(rec.to_dict()), db=dbs["generations"])


def get_generation(txn, dbs, gen: int) -> GenerationRecord | None:
    raw = txn.get(u32(gen), db=dbs["generations"])
    return None if raw is None else GenerationRecord.from_dict(unpack(raw))
