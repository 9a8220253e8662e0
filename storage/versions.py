"""Versions: immutable manifests, HEAD, tags, and the one commit.

A manifest names the segments a version reads, the documents deleted from them
(tombstones), its embedding generation and statistics. HEAD's manifest is the one source
of truth for the current generation.

Every change is committed by :func:`commit`: a sequence of *operations* (frozen values:
:class:`Append`, :class:`Delete`, :class:`Rewrite`, :class:`Restore`, :class:`Reembed`)
applied to the version they were read from, in one LMDB write transaction that writes the
new manifest, the records it names, the counters, and moves HEAD; readers in a read
transaction see one version whole. If HEAD moved since that version, the operations are
rebased onto HEAD only where that is provably safe (a re-embedding must cover every
segment of the HEAD it commits on; a rewrite must find its segments and their tombstones
unchanged; a restore is always safe); otherwise the commit raises and changes nothing.
"""

from __future__ import annotations

import numbers
import re
import time
import unicodedata
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence, Union

from npmdb.errors import OperationalError, ProgrammingError

from . import format as F

__all__ = ["Manifest", "get_meta", "put_meta", "head", "head_generation", "get_version",
           "put_version", "is_id", "meta_id", "trash_of", "parse_ref", "check_tag_name", "resolve", "list_versions", "set_tag", "tags_of", "next_id",
           "find_doc", "Append", "Delete", "Rewrite", "Restore", "Reembed", "Operation",
           "commit", "EMPTY"]


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
        with F.damaged("a version's manifest"):
            return cls(int(d["id"]), d.get("parent"), float(d["time"]),
                       tuple(int(s) for s in d["segments"]),
                       {int(s): tuple(v) for s, v in (d.get("deleted") or {}).items()},
                       int(d["generation"]), dict(d.get("stats") or {}), d.get("message", ""),
                       dict(d.get("info") or {}))


def get_meta(txn, dbs, key: str, default: Any = None) -> Any:
    raw = txn.get(key.encode(), db=dbs["meta"])
    return default if raw is None else F.unpack(raw)


def put_meta(txn, dbs, key: str, value: Any) -> None:
    txn.put(key.encode(), F.pack(value), db=dbs["meta"])


def is_id(value: Any) -> bool:
    """Whether ``value`` is a stored id or counter: an integer in 0 .. 2**63 - 1."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2 ** 63


def meta_id(txn, dbs, key: str, default: int | None = None) -> int | None:
    """A meta entry that holds an id or a counter (``head``, ``next_segment``…): an integer
    >= 0, else the database is damaged (OperationalError, not int()'s ValueError)."""
    value = get_meta(txn, dbs, key)
    if value is None:
        return default
    if not is_id(value):
        raise OperationalError(f"the database is damaged: meta {key!r} holds {value!r}, not an "
                               "id; run `npmdb check` for a full report")
    return value


def trash_of(txn, dbs) -> list:
    """The ``trash`` meta entry: a list of ``[path, commit id]`` (older ones: a path)."""
    trash = get_meta(txn, dbs, "trash") or []
    if not isinstance(trash, list) or not all(
            isinstance(e, str) or (isinstance(e, list) and len(e) == 2
                                   and isinstance(e[0], str)) for e in trash):
        raise OperationalError(f"the database is damaged: meta 'trash' holds {trash!r:.80}, "
                               "not a list of paths; run `npmdb check` for a full report")
    return trash


def next_id(txn, dbs, counter: str) -> int:
    """The next value of a counter (not incremented: the commit does that)."""
    return meta_id(txn, dbs, counter, 1)


def head(txn, dbs) -> Manifest | None:
    """HEAD's manifest (None before the first version). A HEAD that names no version is
    damage, an OperationalError: never the caller's ProgrammingError."""
    vid = meta_id(txn, dbs, "head")
    if vid is None:
        return None
    if txn.get(F.u64(vid), db=dbs["versions"]) is None:
        raise OperationalError(f"the database is damaged: HEAD names version {vid}, which "
                               "does not exist; nothing can be read or changed at HEAD "
                               "(versions stay readable by id: AS OF); run `npmdb check` for "
                               "a full report")
    return get_version(txn, dbs, vid)


def head_generation(txn, dbs) -> int:
    """The current embedding generation: HEAD's (0 before the first version)."""
    m = head(txn, dbs)
    return 0 if m is None else m.generation


def parse_ref(text: str) -> int | str:
    """A version reference typed as text: ASCII digits are a version id, anything else a
    tag name ("²" and "١" are digits to ``str.isdigit`` but no version id)."""
    return int(text) if text.isascii() and text.isdigit() else text


def get_version(txn, dbs, vid: int) -> Manifest:
    if not 0 <= vid < 2 ** 63:  # ids are u64 keys: a huge one is no version, not an overflow
        raise ProgrammingError(f"no version {vid}: version ids are integers >= 0; see "
                               "db.versions() for the versions that exist")
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
    out = {}
    for k, v in cur:
        vid = F.unpack(v)
        with F.damaged(f"tag {bytes(k)!r}"):
            name = bytes(k).decode()
            if not is_id(vid):
                raise TypeError(f"it names {vid!r}, not a version id")
        out[name] = vid
    return out


# a name that reads as a number: " 7", "+2", "-1", "7.0", "1e3" (a version id, to a reader)
_NUMBER = re.compile(r"\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*")


def check_tag_name(name: object) -> None:
    """A tag name is a non-empty str, not a number, not HEAD, without white space at its
    ends or control characters (``"v1 "`` would be a second tag that looks like ``"v1"``),
    at most 400 bytes of UTF-8."""
    if not isinstance(name, str) or not name or name.isdigit() or name.upper() == "HEAD" \
            or _NUMBER.fullmatch(name):
        raise ProgrammingError(f"invalid tag name {name!r}: use a non-empty name that is not "
                               "a number and not HEAD")
    if name != name.strip() or any(unicodedata.category(c) == "Cc" for c in name):
        raise ProgrammingError(f"invalid tag name {name!r}: a tag name has no white space at "
                               "its ends and no control characters (tabs, line breaks, NUL)")
    try:
        size = len(name.encode())
    except UnicodeEncodeError:
        raise ProgrammingError(f"invalid tag name {name!r}: it holds a lone surrogate, which "
                               "is not valid Unicode text") from None
    if size > 400:
        raise ProgrammingError(f"tag names are at most 400 bytes (UTF-8), got {size}")


def set_tag(txn, dbs, name: str, vid: int) -> None:
    check_tag_name(name)
    txn.put(name.encode(), F.pack(int(vid)), db=dbs["tags"])


def delete_tag(txn, dbs, name: str) -> int:
    """Remove the tag ``name``; returns the version it named."""
    if not isinstance(name, str):
        raise ProgrammingError(f"a tag name is a str, not {type(name).__name__}")
    tags = tags_of(txn, dbs)
    if name not in tags:
        raise ProgrammingError(f"no tag named {name!r}{_tag_hint(name, tags)}")
    txn.delete(name.encode(), db=dbs["tags"])
    return tags[name]


def _tag_hint(name: str, tags: dict[str, int]) -> str:
    import difflib
    close = difflib.get_close_matches(name, list(tags), n=1)
    return f"; did you mean {close[0]!r}?" if close else (
        f"; known tags: {', '.join(sorted(tags))}" if tags else "; no tags exist yet")


def resolve(txn, dbs, ref: int | str | None) -> Manifest:
    """A version id, a tag, ``"HEAD"`` or None (HEAD) to its manifest."""
    if ref is None or (isinstance(ref, str) and ref.upper() == "HEAD"):
        m = head(txn, dbs)
        if m is None:
            raise ProgrammingError("the database is empty: add documents first (db.add(...))")
        return m
    if isinstance(ref, bool):
        raise ProgrammingError(f"invalid version reference {ref!r}")
    if isinstance(ref, numbers.Integral):  # numpy's integers too
        return get_version(txn, dbs, int(ref))
    if isinstance(ref, str):
        tags = tags_of(txn, dbs)
        if ref in tags:
            return get_version(txn, dbs, tags[ref])
        if isinstance(parse_ref(ref), int):
            return get_version(txn, dbs, int(ref))
        raise ProgrammingError(f"no version or tag named {ref!r}{_tag_hint(ref, tags)}")
    raise ProgrammingError(f"a version reference must be an id, a tag or 'HEAD', not "
                           f"{type(ref).__name__}")


def find_doc(txn, dbs, m: Manifest, doc_id: str) -> tuple[int, int] | None:
    """``(segment, local number)`` of the live document ``doc_id`` in version ``m``."""
    prefix = F.docid_prefix(doc_id)
    cur = txn.cursor(db=dbs["docids"])
    live = set(m.segments)
    if cur.set_range(prefix):
        for key, val in cur:
            key = bytes(key)
            if key[:16] != prefix:
                break
            seg = F.read_u32(key, 16)
            if seg in live and int(F.unpack(val)) not in set(m.deleted.get(seg, ())):
                return seg, int(F.unpack(val))
    return None


# -- operations ---------------------------------------------------------------------------------

#: the version before the first one: no segments, generation 0
EMPTY = Manifest(0, None, 0.0, (), {}, 0, {"docs": 0, "blocks": 0, "tokens": 0})


@dataclass(frozen=True)
class Append:
    """New segments (their records are written by the commit), all with vectors of
    ``generation``; ``auto_ids`` automatic document ids were used (``doc-N``)."""

    segments: tuple[F.SegmentRecord, ...]
    generation: int
    auto_ids: int = 0


@dataclass(frozen=True)
class Delete:
    """Tombstones: ``((segment, (local numbers...)), ...)``."""

    docs: tuple[tuple[int, tuple[int, ...]], ...]


@dataclass(frozen=True)
class Rewrite:
    """``added`` replaces the segments ``removed`` (their live documents, merged); their
    tombstones are dropped with them."""

    removed: tuple[int, ...]
    added: F.SegmentRecord


@dataclass(frozen=True)
class Restore:
    """The contents (segments, tombstones, generation) of version ``version``."""

    version: int


@dataclass(frozen=True)
class Reembed:
    """Embedding generation ``generation`` (its record is written by the commit), whose
    vectors and dense indexes exist for the segments ``covers``."""

    generation: F.GenerationRecord
    covers: tuple[int, ...]


Operation = Union[Append, Delete, Rewrite, Restore, Reembed]


@dataclass
class _Draft:
    """The manifest being built by one commit."""

    segments: list[int]
    deleted: dict[int, set[int]]
    generation: int

    @classmethod
    def of(cls, m: Manifest) -> "_Draft":
        return cls(list(m.segments), {s: set(v) for s, v in m.deleted.items()}, m.generation)


def _moved(op: Operation, read: Manifest, now: Manifest) -> str | None:
    """Why ``op``, read at version ``read``, cannot be applied to HEAD ``now`` (None: it
    can be rebased safely)."""
    if isinstance(op, Restore):
        return None
    if isinstance(op, Reembed):
        missing = sorted(set(now.segments) - set(op.covers))
        return f"segments {missing} were added and have no vectors of generation " \
               f"{op.generation.id}" if missing else None
    if isinstance(op, Rewrite):
        if now.generation != read.generation:  # its new segments hold the old vectors only
            return (f"the embedding generation changed ({read.generation} -> "
                    f"{now.generation}) meanwhile")
        gone = [s for s in op.removed if s not in now.segments]
        if gone:
            return f"segments {gone} it rewrites are no longer in HEAD"
        if any(set(now.deleted.get(s, ())) != set(read.deleted.get(s, ())) for s in op.removed):
            return "documents of the segments it rewrites were deleted meanwhile"
        return None
    return "its documents were checked against that version"  # Append, Delete


def check_message(message: Any) -> None:
    """A version's message is text: anything else (or text that is not valid Unicode) is
    refused before any work, not after it."""
    if not isinstance(message, str):
        raise ProgrammingError(f"a version message must be a str, got "
                               f"{type(message).__name__} {message!r:.60}")
    try:
        message.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ProgrammingError(
            f"the message contains a lone surrogate U+{ord(message[exc.start]):04X} at "
            f"character {exc.start}, which is not valid Unicode text") from None


def commit(txn, dbs, ops: Sequence[Operation], read: Manifest | None, *, message: str = "",
           info: dict | None = None, tag: str | None = None,
           seal: Callable[[Any, int, int | None], None] | None = None) -> Manifest:
    """Apply ``ops`` to version ``read`` (None: the empty database) in write transaction
    ``txn``: write the records they add, the new manifest and the counters, move HEAD (and
    ``tag`` it). ``seal(txn, segment, docs)`` records the checksums of the files (and,
    given ``docs``, the documents) of each segment the commit adds or re-embeds.
    Returns the new manifest."""
    check_message(message)
    now = head(txn, dbs)
    base = read or EMPTY
    if (now.id if now else None) != (read.id if read else None):
        for op in ops:
            why = _moved(op, base, now or EMPTY)
            if why is not None:
                raise OperationalError(
                    f"version {now.id if now else None} became HEAD while this change was "
                    f"prepared on version {base.id}, and it cannot be rebased ({why}): "
                    "nothing was committed; retry the change")
        base = now or EMPTY
    draft = _Draft.of(base)
    meta_next = {k: next_id(txn, dbs, k) for k in ("next_segment", "next_auto",
                                                    "next_generation")}
    nxt = dict(meta_next)
    records: dict[int, F.SegmentRecord] = {}

    def add_segment(rec: F.SegmentRecord) -> None:
        F.put_segment(txn, dbs, rec)
        records[rec.id] = rec
        if seal is not None:
            seal(txn, rec.id, rec.docs)
        nxt["next_segment"] = max(nxt["next_segment"], rec.id + 1)

    for op in ops:
        if isinstance(op, Append):
            if op.segments and op.generation != draft.generation:
                raise OperationalError(
                    f"new segments have vectors of generation {op.generation} but the version "
                    f"reads generation {draft.generation}: nothing was committed; retry")
            for rec in op.segments:
                add_segment(rec)
                draft.segments.append(rec.id)
            nxt["next_auto"] += op.auto_ids
        elif isinstance(op, Delete):
            for seg, locals_ in op.docs:
                if seg not in draft.segments:
                    raise OperationalError(f"cannot delete from segment {seg}: the version "
                                           "does not read it")
                draft.deleted.setdefault(seg, set()).update(locals_)
        elif isinstance(op, Rewrite):
            at = min(draft.segments.index(s) for s in op.removed)
            kept = [s for s in draft.segments if s not in op.removed]
            add_segment(op.added)
            draft.segments = kept[:at] + [op.added.id] + kept[at:]
            for s in op.removed:
                draft.deleted.pop(s, None)
        elif isinstance(op, Restore):
            old = get_version(txn, dbs, op.version)
            for s in old.segments:
                if F.get_segment(txn, dbs, s) is None:
                    raise ProgrammingError(f"version {old.id} can no longer be restored: its "
                                           "segment data was vacuumed")
            draft = _Draft.of(old)
        elif isinstance(op, Reembed):
            g = op.generation
            F.put_generation(txn, dbs, g)
            draft.generation = g.id
            if seal is not None:  # the new generation's index files
                for s in op.covers:
                    seal(txn, s, None)
            nxt["next_generation"] = max(nxt["next_generation"], g.id + 1)
        else:  # pragma: no cover - the Operation union is closed
            raise TypeError(f"not an operation: {op!r}")
    stats = _stats(txn, dbs, draft, records)
    vid = next_id(txn, dbs, "next_version")
    m = Manifest(vid, now.id if now else None, time.time(), tuple(draft.segments),
                 {s: tuple(sorted(v)) for s, v in draft.deleted.items() if v},
                 draft.generation, stats, message, dict(info or {}))
    put_version(txn, dbs, m)
    put_meta(txn, dbs, "head", vid)
    put_meta(txn, dbs, "next_version", vid + 1)
    for key, value in nxt.items():
        if value != meta_next[key]:
            put_meta(txn, dbs, key, value)
    if tag:
        set_tag(txn, dbs, tag, vid)
    return m


def _stats(txn, dbs, d: _Draft, records: dict[int, F.SegmentRecord]) -> dict[str, int]:
    """Live documents of a manifest, and the blocks and tokens its segments store, from the
    segments' records: a deleted document's blocks and tokens count until ``optimize``
    rewrites its segment (as a search index counts deleted entries until a merge)."""
    docs = blocks = tokens = 0
    for s in d.segments:
        rec = records.get(s) or F.get_segment(txn, dbs, s)
        if rec is None:
            raise OperationalError(f"segment {s} is named by the version but not recorded")
        docs += rec.docs - len(d.deleted.get(s, ()))
        blocks += rec.blocks
        tokens += rec.tokens
    return {"docs": docs, "blocks": blocks, "tokens": tokens}
