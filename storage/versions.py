"""Versions: immutable manifests, HEAD, tags and the id counters.

A manifest names the segments a version reads, the documents deleted from them
(tombstones), its embedding generation and statistics. A commit is one LMDB write
transaction that writes the manifest and moves HEAD; readers in a read transaction see
one version whole.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from npmdb.errors import ProgrammingError

from . import format as F

__all__ = ["Manifest", "get_meta", "put_meta", "head", "get_version", "put_version",
           "resolve", "list_versions", "set_tag", "tags_of", "next_id"]


@dataclass(frozen=True)
class Manifest:
    id: int
    parent: int | None
    time: float
    segments: tuple[int, ...]
    deleted: dict[int, tuple[int, ...]]  # seg -> deleted local doc numbers
    generation: int
    stats: dict[str, int]
    message: str = ""
    info: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"id": self.id, "parent": self.parent, "time": self.time,
                "segments": list(self.segments),
                "deleted": {int(s): list(v) for s, v in self.deleted.items()},
                "generation": self.generation, "stats": dict(self.stats),
                "message": self.message, "info": dict(self.info)}

    @classmethod
    def from_dict(cls, d: dict) -> "Manifest":
        return cls(int(d["id"]), d.get("parent"), float(d["time"]), tuple(d["segments"]),
                   {int(s): tuple(v) for s, v in (d.get("deleted") or {}).items()},
                   int(d["generation"]), dict(d.get("stats") or {}), d.get("message", ""),
                   dict(d.get("info") or {}))


def get_meta(txn, dbs, key: str, default: Any = None) -> Any:
    raw = txn.get(key.encode(), db=dbs["meta"])
    return default if raw is None else F.unpack(raw)


def put_meta(txn, dbs, key: str, value: Any) -> None:
    txn.put(key.encode(), F.pack(value), db=dbs["meta"])


def next_id(txn, dbs, counter: str) -> int:
    """The next value of a counter (not incremented: the commit does that)."""
    return int(get_meta(txn, dbs, counter, 1))


def head(txn, dbs) -> Manifest | None:
    vid = get_meta(txn, dbs, "head")
    return None if vid is None else get_version(txn, dbs, int(vid))


def get_version(txn, dbs, vid: int) -> Manifest:
    raw = txn.get(F.u64(vid), db=dbs["versions"])
    if raw is None:
        raise ProgrammingError(f"no version {vid}: see db.versions() for the versions that exist")
    return Manifest.from_dict(F.unpack(raw))


def put_version(txn, dbs, m: Manifest) -> None:
    txn.put(F.u64(m.id), F.pack(m.to_dict()), db=dbs["versions"])


def list_versions(txn, dbs) -> list[Manifest]:
    cur = txn.cursor(db=dbs["versions"])
    return [Manifest.from_dict(F.unpack(v)) for _, v in cur]


def tags_of(txn, dbs) -> dict[str, int]:
    cur = txn.cursor(db=dbs["tags"])
    return {bytes(k).decode(): int(F.unpack(v)) for k, v in cur}


def set_tag(txn, dbs, name: str, vid: int) -> None:
    if not isinstance(name, str) or not name or name.isdigit() or name.upper() == "HEAD":
        raise ProgrammingError(f"invalid tag name {name!r}: use a non-empty name that is not "
                               "a number and not HEAD")
    txn.put(name.encode(), F.pack(int(vid)), db=dbs["tags"])


def resolve(txn, dbs, ref: int | str | None) -> Manifest:
    """A version id, a tag, ``"HEAD"`` or None (HEAD) to its manifest."""
    if ref is None or (isinstance(ref, str) and ref.upper() == "HEAD"):
        m = head(txn, dbs)
        if m is None:
            raise ProgrammingError("the database is empty: add documents first (db.add(...))")
        return m
    if isinstance(ref, bool):
        raise ProgrammingError(f"invalid version reference {ref!r}")
    if isinstance(ref, int):
        return get_version(txn, dbs, ref)
    if isinstance(ref, str):
        tags = tags_of(txn, dbs)
        if ref in tags:
            return get_version(txn, dbs, tags[ref])
        if ref.isdigit():
            return get_version(txn, dbs, int(ref))
        import difflib
        close = difflib.get_close_matches(ref, list(tags), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else (
            f"; known tags: {', '.join(sorted(tags))}" if tags else "; no tags exist yet")
        raise ProgrammingError(f"no version or tag named {ref!r}{hint}")
    raise ProgrammingError(f"a version reference must be an id, a tag or 'HEAD', not "
                           f"{type(ref).__name__}")


def now() -> float:
    return time.time()
