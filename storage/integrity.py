"""Storage integrity: checksums of everything a database holds, sealed at commit and
verified on use (the report of ``npmdb check`` is :mod:`npmdb.check`).

What is protected, and where it is verified:

* **Arrays in LMDB** (token columns, vector chunks) carry a CRC32 over header and payload
  (:func:`npmdb.storage.format.pack_array`). Token columns are verified when a segment is
  loaded; a vector chunk the first time a process reads it (then the chunk id is cached
  in the :class:`~npmdb.storage.segments.SegmentReader`), so the hot path pays once.
* **Documents**: the CRC32 of every stored document value, per segment, as an array value
  under the segment's ``#docs`` key (``segcols``). Verified on every document read.
* **Index files** (tantivy BM25, hnswlib / FAISS): size and CRC32 of every file of a
  segment directory, under the segment's ``#files`` key (msgpack ``{name: [size, crc]}``).
  Recorded ("sealed") in the commit transaction that first references the files (an
  ``add``'s segment, an ``optimize``'s merged segment); files an embedding refresh adds
  to existing segments are sealed by the same writer right after its commit (or by the
  next writer, if it was killed in between). Verified before an index is loaded: hnswlib
  and tantivy trust their files, and a damaged one can crash the process or answer
  wrongly. hnswlib writes files without reporting write errors, so every ``.hnsw`` file
  is also walked structurally before the commit that references it
  (:func:`validate_index_files`, called from ``fsync_dir``).
"""

from __future__ import annotations

import mmap
import re
import struct
import zlib
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from npmdb.errors import OperationalError

from . import format as F
from .paths import segment_dir

__all__ = ["seal_segment", "prune_sums", "verify_files", "read_sums", "read_doc_crcs",
           "validate_index_files", "validate_hnsw", "crc_file", "segment_files", "doc_values",
           "gen_of", "FILES_KEY", "DOCS_KEY"]

FILES_KEY = "#files"   # segcols (seg, "#files"): msgpack {relative name: [size, crc32]}
DOCS_KEY = "#docs"     # segcols (seg, "#docs"): int64 array, crc32 of each document value
_UNSEALED = {".tantivy-meta.lock", ".tantivy-writer.lock"}  # tantivy's (empty) lock files
_GEN = re.compile(r"g(\d+)\.")
_HNSW_HEAD = struct.Struct("<QQQQQQiIQQQdQ")


# -- checksums ------------------------------------------------------------------------------


def crc_file(path: Path) -> tuple[int, int]:
    """``(size, crc32)`` of a file."""
    crc, size = 0, 0
    with open(path, "rb") as fh:
        while True:
            chunk = fh.read(1 << 20)
            if not chunk:
                break
            crc = zlib.crc32(chunk, crc)
            size += len(chunk)
    return size, crc


def gen_of(rel: str) -> int | None:
    m = _GEN.match(rel)
    return int(m.group(1)) if m else None


def segment_files(root: Path, seg: int, gen_limit: int | None = None) -> list[str]:
    """Names (relative, ``/``-separated) of the files in a segment's directory, tantivy's
    lock files excepted; with ``gen_limit``, dense files of generations >= it are left
    out (an uncommitted refresh's)."""
    d = segment_dir(root, seg)
    if not d.is_dir():
        return []
    out = []
    for p in sorted(d.rglob("*")):
        if not p.is_file() or p.name in _UNSEALED:
            continue
        rel = p.relative_to(d).as_posix()
        g = gen_of(rel)
        if gen_limit is not None and g is not None and g >= gen_limit:
            continue
        out.append(rel)
    return out


def read_sums(txn, dbs, seg: int) -> dict[str, list[int]] | None:
    raw = txn.get(F.col_key(seg, FILES_KEY), db=dbs["segcols"])
    return None if raw is None else dict(F.unpack(raw))


def read_doc_crcs(txn, dbs, seg: int) -> np.ndarray | None:
    raw = txn.get(F.col_key(seg, DOCS_KEY), db=dbs["segcols"])
    if raw is None:
        return None
    return F.unpack_array(raw, verify=True, what=f"segment {seg} document checksums").copy()


def doc_values(txn, dbs, seg: int) -> Iterable[tuple[int, Any]]:
    prefix = F.u32(seg)
    cur = txn.cursor(db=dbs["docs"])
    if not cur.set_range(prefix):
        return
    for key, val in cur:
        key = bytes(key)
        if key[:4] != prefix:
            break
        yield F.read_u32(key, 4), val


def seal_segment(txn, dbs, root: Path, seg: int, *, gen_limit: int | None,
                 docs: int | None = None) -> int:
    """Record the checksums a segment lacks: its files' (``#files``) and, given its
    document count, its documents' (``#docs``). Returns how many entries were added."""
    sums = read_sums(txn, dbs, seg) or {}
    added = 0
    d = segment_dir(root, seg)
    for rel in segment_files(root, seg, gen_limit):
        if rel not in sums:
            sums[rel] = list(crc_file(d / rel))
            added += 1
    if added:
        txn.put(F.col_key(seg, FILES_KEY), F.pack(sums), db=dbs["segcols"])
    if docs is not None and txn.get(F.col_key(seg, DOCS_KEY), db=dbs["segcols"]) is None:
        crcs = np.full(int(docs), -1, dtype=np.int64)
        for local, val in doc_values(txn, dbs, seg):
            if local < len(crcs):
                crcs[local] = zlib.crc32(val)
        if (crcs < 0).any():
            raise OperationalError(f"segment {seg}: document {int(np.argmax(crcs < 0))} is "
                                   "missing; run `npmdb check`")
        txn.put(F.col_key(seg, DOCS_KEY), F.pack_array(crcs), db=dbs["segcols"])
        added += 1
    return added


def prune_sums(txn, dbs, seg: int, gens: Iterable[int]) -> None:
    """Forget the dense files of generations ``gens`` (vacuum removed them)."""
    sums = read_sums(txn, dbs, seg)
    if not sums:
        return
    gens = set(gens)
    kept = {k: v for k, v in sums.items() if gen_of(k) not in gens}
    if len(kept) != len(sums):
        txn.put(F.col_key(seg, FILES_KEY), F.pack(kept), db=dbs["segcols"])


def _damaged(root: Path, seg: int, rel: str, what: str) -> OperationalError:
    return OperationalError(
        f"segment {seg}: index file {rel} is {what}: the database directory {root} was "
        f"damaged; nothing was answered from it. Run `npmdb check {root}` for a full report, "
        "then restore the directory from a backup")


def verify_files(root: Path, seg: int, sums: dict[str, list[int]] | None,
                 rels: Iterable[str], crc: bool = True) -> int:
    """Compare files of a segment with their recorded size and CRC32 (files with no
    record are not checked; ``crc=False``: the size only, for memory-mapped files too
    large to read whole at first use, which `npmdb check` still reads whole); raises
    OperationalError naming the first bad one. Returns the bytes verified."""
    if not sums:
        return 0
    d = segment_dir(root, seg)
    n = 0
    for rel in rels:
        want = sums.get(rel)
        if want is None:
            continue
        p = d / rel
        if not p.is_file():
            raise _damaged(root, seg, rel, "missing")
        if not crc:
            size = p.stat().st_size
            if size != want[0]:
                raise _damaged(root, seg, rel, f"{size} bytes instead of {want[0]} (truncated "
                                               "or overwritten)")
            continue
        size, got = crc_file(p)
        if size != want[0]:
            raise _damaged(root, seg, rel, f"{size} bytes instead of {want[0]} (truncated or "
                                           "overwritten)")
        if got != want[1]:
            raise _damaged(root, seg, rel, "corrupt (checksum mismatch)")
        n += size
    return n


# -- structural checks of index files -------------------------------------------------------


def validate_hnsw(path: Path) -> None:
    """Walk an hnswlib index file (header, level-0 data, link lists) and check that it is
    complete and self-consistent. hnswlib's own loader can crash on a damaged file, and its
    writer does not report write errors (a full disk leaves a short file)."""
    size = path.stat().st_size
    if size < _HNSW_HEAD.size:
        raise OperationalError(f"{path} is not a complete hnswlib index ({size} bytes)")
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        (off0, max_el, count, per_el, label_off, data_off, max_level, entry, max_m, max_m0,
         m, _mult, _efc) = _HNSW_HEAD.unpack_from(mm, 0)
        links = max_m * 4 + 4
        bad = (off0 != 0 or count > max_el or per_el == 0 or per_el > 1 << 24
               or label_off + 8 > per_el or data_off > label_off or max_m == 0
               or max_m > 1 << 16 or m == 0 or (count and not 0 <= entry < count)
               or not -1 <= max_level < 64)
        pos = _HNSW_HEAD.size + count * per_el
        if bad or pos > size:
            raise OperationalError(f"{path} is not a complete hnswlib index (bad header or "
                                   f"short level-0 data: {size} bytes)")
        unpack = struct.Struct("<I").unpack_from
        for _ in range(count):
            if pos + 4 > size:
                break
            n = unpack(mm, pos)[0]
            if n % links:
                raise OperationalError(f"{path} is not a complete hnswlib index (bad link list "
                                       f"at byte {pos})")
            pos += 4 + n
        else:
            if pos == size:
                return
        raise OperationalError(f"{path} is not a complete hnswlib index: {size} bytes, the "
                               f"structure needs {max(pos, size + 1)} (truncated: was the disk "
                               "full?)")


def validate_index_files(directory: Path) -> None:
    """Structural checks of the dense index files directly inside ``directory``."""
    try:
        items = list(Path(directory).iterdir())
    except (NotADirectoryError, FileNotFoundError):
        return
    for p in items:
        if p.name.endswith(".hnsw") and p.is_file():
            validate_hnsw(p)
