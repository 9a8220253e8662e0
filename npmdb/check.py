"""``npmdb check``: the report of a database's integrity (the checksums themselves are
written and verified by :mod:`npmdb.storage.integrity`).

:func:`check` (``db.check()``, ``npmdb check DB``) verifies every checksum, plus the
references between versions, segments, generations and files, and lists leftovers of
killed writers.
"""

from __future__ import annotations

import re
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import Error
from npmdb.storage import codec as C
from npmdb.storage import format as F
from npmdb.storage import versions as V
from npmdb.storage.integrity import (
    doc_values, gen_of, read_doc_crcs, read_sums, segment_files, validate_hnsw, verify_files,
)
from npmdb.storage.paths import dense_files, segment_dir

if TYPE_CHECKING:  # pragma: no cover
    from npmdb.storage.env import Env

__all__ = ["check", "CheckReport", "Problem"]

# -- the full check -------------------------------------------------------------------------


@dataclass(frozen=True)
class Problem:
    """One finding: ``level`` is ``"error"`` (damage or loss: queries may fail) or
    ``"warning"`` (leftovers a writer or vacuum removes; checksums not recorded yet)."""

    level: str
    where: str
    message: str

    def __str__(self) -> str:
        return f"{self.level}: {self.where}: {self.message}"


@dataclass
class CheckReport:
    """What :func:`check` found. ``ok`` is True when there is no error (warnings allowed)."""

    path: str
    problems: list[Problem] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.level == "error"]

    @property
    def warnings(self) -> list[Problem]:
        return [p for p in self.problems if p.level == "warning"]

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def clean(self) -> bool:
        """No error and no warning."""
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "ok": self.ok, "counts": dict(self.counts),
                "seconds": round(self.seconds, 3),
                "problems": [{"level": p.level, "where": p.where, "message": p.message}
                             for p in self.problems]}

    def __str__(self) -> str:
        c = self.counts
        head = (f"{self.path}: {'OK' if self.ok else 'DAMAGED'} — {len(self.errors)} errors, "
                f"{len(self.warnings)} warnings; checked {c.get('versions', 0)} versions, "
                f"{c.get('segments', 0)} segments, {c.get('documents', 0)} documents, "
                f"{c.get('arrays', 0)} arrays, {c.get('vector_chunks', 0)} vector chunks, "
                f"{c.get('files', 0)} files ({c.get('bytes', 0):,} bytes) in "
                f"{self.seconds:.2f} s")
        return "\n".join([head, *(f"  {p}" for p in self.problems)])


class _Checker:
    def __init__(self, env: "Env", root: Path, deep: bool) -> None:
        self.env = env
        self.root = Path(root)
        self.dbs = env.dbs
        self.deep = deep
        self.report = CheckReport(str(root))
        self.counts = self.report.counts
        for k in ("versions", "segments", "documents", "arrays", "vector_chunks", "files",
                  "bytes"):
            self.counts[k] = 0

    def err(self, where: str, message: str) -> None:
        self.report.problems.append(Problem("error", where, message))

    def warn(self, where: str, message: str) -> None:
        self.report.problems.append(Problem("warning", where, message))

    def unpack(self, raw, where: str):
        try:
            return F.unpack(raw)
        except Error as exc:
            self.err(where, _finding(exc))
            return None

    def meta_id(self, meta: dict, key: str, default: int | None) -> int | None:
        """``meta[key]``, an id or counter: an integer >= 0, else an error (and ``default``)."""
        value = meta.get(key)
        if value is None:
            return default
        if not V.is_id(value):
            self.err("meta", f"{key} holds {value!r:.80}, not an id")
            return default
        return value

    # -- LMDB ------------------------------------------------------------------------

    def run(self) -> CheckReport:
        t0 = time.perf_counter()
        with self.env.read() as txn:
            meta = {}
            for k, v in txn.cursor(db=self.dbs["meta"]):
                meta[bytes(k).decode(errors="replace")] = self.unpack(v, f"meta {bytes(k)!r}")
            config = meta.get("config")
            if not isinstance(config, dict):
                self.err("meta", "no config: this is not a complete npmdb database")
                config = {}
            next_seg = self.meta_id(meta, "next_segment", 1)
            next_gen = self.meta_id(meta, "next_generation", 1)
            self.meta_id(meta, "next_auto", 1)
            head = self.meta_id(meta, "head", None)
            trash = meta.get("trash")
            if trash is not None and not isinstance(trash, list):
                self.err("meta", f"trash holds {trash!r:.80}, not a list of paths")
            elif trash:
                self.warn("meta", f"{len(trash)} files wait to be removed (trash); the "
                                  "next vacuum, optimize or writer open removes them once no reader holds an older snapshot")
            gens: dict[int, dict] = {}
            for k, v in txn.cursor(db=self.dbs["generations"]):
                g = F.read_u32(bytes(k))
                rec = self.unpack(v, f"generation {g}")
                if isinstance(rec, dict):
                    gens[g] = rec
            versions: dict[int, Any] = {}
            for k, v in txn.cursor(db=self.dbs["versions"]):
                vid = F.read_u64(bytes(k))
                d = self.unpack(v, f"version {vid}")
                try:
                    versions[vid] = V.Manifest.from_dict(d)
                except Exception as exc:  # noqa: BLE001
                    self.err(f"version {vid}", f"unreadable manifest: {exc}")
            self.counts["versions"] = len(versions)
            if head is not None and head not in versions:
                self.err("HEAD", f"HEAD names version {head}, which does not exist")
            elif head is None and versions:
                self.err("HEAD", f"there are {len(versions)} versions and no HEAD")
            for k, v in txn.cursor(db=self.dbs["tags"]):
                name = bytes(k).decode(errors="replace")
                vid = self.unpack(v, f"tag {name!r}")
                if not V.is_id(vid):
                    if vid is not None:
                        self.err(f"tag {name!r}", f"holds {vid!r:.80}, not a version id")
                elif vid not in versions:
                    self.err(f"tag {name!r}", f"names version {vid}, which does not exist")
            records: dict[int, F.SegmentRecord] = {}
            for k, v in txn.cursor(db=self.dbs["segments"]):
                s = F.read_u32(bytes(k))
                rec = self.unpack(v, f"segment {s}")
                try:
                    records[s] = F.SegmentRecord.from_dict(rec)
                except Exception as exc:  # noqa: BLE001 - a damaged record is a finding
                    self.err(f"segment {s}", f"unreadable segment record: {exc}")
            needed: dict[int, set[int]] = {}  # segment -> generations some version reads
            for m in versions.values():
                where = f"version {m.id}"
                if m.generation not in gens:
                    self.err(where, f"reads embedding generation {m.generation}, which is not "
                                    "recorded")
                docs = 0
                for s in m.segments:
                    if s not in records:
                        self.err(where, f"reads segment {s}, which is not recorded")
                        continue
                    needed.setdefault(s, set()).add(m.generation)
                    dead = m.deleted.get(s, ())
                    n = records[s].docs
                    if any(not 0 <= x < n for x in dead):
                        self.err(where, f"deletes documents outside segment {s} (0..{n - 1})")
                    docs += n - len(set(dead))
                for s in m.deleted:
                    if s not in m.segments:
                        self.err(where, f"has tombstones for segment {s}, which it does not read")
                if m.stats.get("docs") != docs:
                    self.err(where, f"counts {m.stats.get('docs')} documents, its segments hold "
                                    f"{docs}")
            for s, rec in sorted(records.items()):
                if s >= next_seg:
                    self.warn(f"segment {s}", "recorded at or past next_segment")
                self.segment(txn, s, rec, needed.get(s, set()), config, next_gen)
            self.trained_state(meta, records)
            named = {s for m in versions.values() for s in m.segments}
            self.stray_vectors(txn, records, next_gen, named)
            self.stray_columns(txn, records, named)
        self.directories(records, gens, named)
        self.encoders(gens)
        self.report.seconds = time.perf_counter() - t0
        return self.report

    def segment(self, txn, s: int, rec: F.SegmentRecord, gens: set[int], config: dict,
                next_gen: int) -> None:
        where = f"segment {s}"
        self.counts["segments"] += 1
        cols = {}
        from npmdb.storage.segments import COLUMNS
        for name in COLUMNS:
            raw = txn.get(F.col_key(s, name), db=self.dbs["segcols"])
            if raw is None:
                self.err(where, f"column {name!r} is missing")
                continue
            try:
                cols[name] = F.unpack_array(raw, verify=True, what=f"column {name!r}")
                self.counts["arrays"] += 1
            except Error as exc:
                self.err(where, _finding(exc))
        n_docs = rec.docs
        n_tok = None
        if len(cols) == len(COLUMNS):
            n_tok = self.columns(where, cols, rec, n_docs)
        # documents
        crcs = None
        try:
            crcs = read_doc_crcs(txn, self.dbs, s)
        except Error as exc:
            self.err(where, _finding(exc))
        if crcs is None:
            self.warn(where, "no document checksums recorded yet (the next writer records them)")
        elif len(crcs) != n_docs:
            self.err(where, f"{len(crcs)} document checksums for {n_docs} documents")
            crcs = None
        seen = np.zeros(n_docs, dtype=bool)
        good = np.zeros(n_docs, dtype=bool)
        text_len = np.zeros(n_docs, dtype=np.int64)
        for local, val in doc_values(txn, self.dbs, s):
            if local >= n_docs:
                self.err(where, f"holds document {local}, past its {n_docs} documents")
                continue
            seen[local] = True
            self.counts["documents"] += 1
            if crcs is not None and zlib.crc32(val) != int(crcs[local]):
                self.err(where, f"document {local} is corrupt (checksum mismatch)")
                continue
            d = self.unpack(val, f"{where} document {local}")
            if not isinstance(d, dict) or not isinstance(d.get("id"), str) or not isinstance(
                    d.get("text"), str):
                self.err(where, f"document {local} is malformed")
                continue
            text_len[local] = len(d["text"])
            good[local] = True
            got = txn.get(F.docid_key(d["id"], s), db=self.dbs["docids"])
            if got is None or self.unpack(got, f"{where} id map") != local:
                self.err(where, f"the id map does not lead to document {local} ({d['id']!r})")
        if not seen.all():
            self.err(where, f"{int((~seen).sum())} of its {n_docs} documents are missing "
                            f"(first: {int(np.argmax(~seen))})")
        if n_tok is not None and len(cols["offsets"]):
            doc_of_tok = np.repeat(cols["block_doc"].astype(np.int64), np.diff(cols["block_ptr"]))
            ok_tok = good[doc_of_tok]
            if (cols["offsets"][ok_tok, 1] > text_len[doc_of_tok[ok_tok]]).any():
                self.err(where, "token offsets point past the end of their document's text")
        # vectors (codec-agnostic: one row per token, the same width in every chunk); with
        # damaged columns, as many as the record counts (a damaged column must not hide a
        # damaged vector chunk)
        if n_tok is None:
            n_tok = int(rec.tokens)
        rows_per = rec.chunk
        n_chunks = (n_tok + rows_per - 1) // rows_per
        fixed = C.CODECS.get(rec.codec)  # a stateless codec: its row size is known
        row_bytes = None if fixed is None else fixed.bytes_per_vector(rec.dim)
        for g in sorted(gens):
            width = None
            for ch in range(n_chunks):
                raw = txn.get(F.vec_key(g, s, ch), db=self.dbs["vectors"])
                w = f"vector chunk {ch} of generation {g}"
                if raw is None:
                    self.err(where, f"vector chunk {ch} of generation {g} is missing")
                    continue
                try:
                    arr = F.unpack_array(raw, verify=self.deep, what=w)
                except Error as exc:
                    self.err(where, _finding(exc))
                    continue
                self.counts["vector_chunks"] += 1
                rows = min(rows_per, n_tok - ch * rows_per)
                if width is None:
                    width = arr.shape[1:]
                    got = arr.dtype.itemsize * int(np.prod(width))
                    if row_bytes is not None and got != row_bytes:
                        self.err(where, f"vectors of generation {g} are {got} bytes a "
                                        f"token where {rec.codec} at the segment's "
                                        f"{rec.dim} dimensions stores {row_bytes}: "
                                        "vectors of another width were written")
                if arr.shape != (rows, *width):
                    self.err(where, f"vector chunk {ch} of generation {g} has shape "
                                    f"{arr.shape}, expected {(rows, *width)}")
        self.files(s, rec, gens, next_gen, txn)

    def columns(self, where: str, cols: dict, rec: F.SegmentRecord, n_docs: int) -> int | None:
        tok, flags, offs, ptr, bdoc = (cols[k] for k in ("tokens", "flags", "offsets",
                                                         "block_ptr", "block_doc"))
        n = len(tok)
        ok = (len(flags) == n and offs.ndim == 2 and offs.shape == (n, 2) and ptr.ndim == 1
              and len(ptr) == len(bdoc) + 1 and (len(ptr) == 0 or (ptr[0] == 0 and ptr[-1] == n))
              and bool((np.diff(ptr) >= 0).all())
              and bool(((bdoc >= 0) & (bdoc < n_docs)).all()))
        if not ok:
            self.err(where, "its token columns are inconsistent (lengths, block pointers or "
                            "document numbers)")
            return None
        if rec.tokens != n or rec.blocks != len(bdoc):
            self.err(where, f"its record counts {rec.tokens} tokens / {rec.blocks} "
                            f"blocks, its columns hold {n} / {len(bdoc)}")
        return n

    def files(self, s: int, rec: F.SegmentRecord, gens: set[int], next_gen: int, txn) -> None:
        where = f"segment {s}"
        d = segment_dir(self.root, s)
        sums = read_sums(txn, self.dbs, s)
        present = segment_files(self.root, s)
        kind = rec.dense
        if not d.is_dir():
            self.err(where, f"its directory {d.relative_to(self.root)} is missing")
            return
        if not any(r.startswith("bm25/") for r in present):
            self.err(where, "its BM25 index (bm25/) is missing")
        for g in sorted(gens):
            for rel in dense_files(g, kind):
                if rel not in present:
                    self.err(where, f"dense index {rel} is missing")
        if sums is None:
            self.warn(where, "no file checksums recorded yet (the next writer records them)")
            sums = {}
        for rel in sums:
            if rel not in present:
                self.err(where, f"index file {rel} is missing")
        for rel in present:
            g = gen_of(rel)
            if g is not None and g >= next_gen:
                self.warn(where, f"{rel} belongs to an uncommitted refresh (the next writer "
                                 "removes it)")
                continue
            p = d / rel
            if rel not in sums:
                self.warn(where, f"{rel} has no recorded checksum yet (the next writer records "
                                 "it)")
            else:
                try:
                    self.counts["bytes"] += verify_files(self.root, s, sums, [rel])
                except Error as exc:
                    self.err(where, str(exc).split(": the database directory")[0]
                             .removeprefix(f"segment {s}: "))
                    continue
            self.counts["files"] += 1
            if self.deep and rel.endswith(".hnsw"):
                try:
                    validate_hnsw(p)
                except Error as exc:
                    self.err(where, _finding(exc))

    def trained_state(self, meta: dict, records: dict) -> None:
        """The states trained once and shared by later segments: each PQ codec's centroids
        (checksum, and the hash its name carries) and each generation's IVF template
        (checksum, and that FAISS reads it; a generation's first small segment is flat, with
        no template yet); and that every codec state a segment or the database names is
        there. A damaged one failed every query, or coded new segments against
        untrained lists, while check said OK."""
        from npmdb.storage import ivf

        for key, value in meta.items():
            if value is None:  # unreadable: reported where it was read
                continue
            if key.startswith("codec:"):
                try:
                    C.PQCodec.from_state(key[6:], value)
                except Exception as exc:  # noqa: BLE001 - a damaged state is a finding
                    self.err(f"meta {key}", _finding(exc))
            elif re.fullmatch(r"ivf:g\d+", key):
                try:
                    ivf.template_nlist(ivf.template_of(value, int(key[5:])))
                except Exception as exc:  # noqa: BLE001
                    self.err(f"meta {key}", _finding(exc))
        current = meta.get(C.CODEC_STATE_KEY)
        if current is not None and f"codec:{current}" not in meta:
            self.err("meta", f"the current codec {current!r} has no trained state")
        for s, rec in sorted(records.items()):
            if C.is_stateful(rec.codec) and ":" in rec.codec and \
                    f"codec:{rec.codec}" not in meta:
                self.err(f"segment {s}", f"its codec {rec.codec!r} has no trained state")

    def stray_vectors(self, txn, records: dict, next_gen: int, named: set[int]) -> None:
        stray: dict[tuple[int, int], int] = {}
        for k in txn.cursor(db=self.dbs["vectors"]).iternext(values=False):
            k = bytes(k)
            g, s = F.read_u32(k), F.read_u32(k, 4)
            if (s not in records and s not in named) or g >= next_gen:
                stray[(g, s)] = stray.get((g, s), 0) + 1
        for (g, s), n in sorted(stray.items()):
            self.warn(f"segment {s}", f"{n} vector chunks of generation {g} that nothing "
                                      "references (left by a killed writer; the next writer "
                                      "removes them)")

    def stray_columns(self, txn, records: dict, named: set[int]) -> None:
        stray = set()
        for name in ("segcols", "docs"):
            for k in txn.cursor(db=self.dbs[name]).iternext(values=False):
                s = F.read_u32(bytes(k))
                if s not in records and s not in named:  # named: the versions' error above
                    stray.add(s)
        for s in sorted(stray):
            self.warn(f"segment {s}", "data of an uncommitted or removed segment (the next "
                                      "writer or vacuum removes it)")

    # -- directories ---------------------------------------------------------------------

    def directories(self, records: dict, gens: dict, named: set[int]) -> None:
        root = self.root / "segments"
        if root.is_dir():
            for p in sorted(root.iterdir()):
                name = p.name
                if name.startswith("tmp-"):
                    self.warn(f"segments/{name}", "a killed writer's temporary directory (the "
                                                  "next writer removes it)")
                elif name.startswith("s") and name[1:].isdigit() and p.is_dir():
                    if int(name[1:]) not in records and int(name[1:]) not in named:
                        self.warn(f"segments/{name}", "a directory no segment record names "
                                                      "(the next writer or vacuum removes it)")
                else:
                    self.warn(f"segments/{name}", "an unknown file or directory")
        enc = self.root / "encoders"
        if enc.is_dir():
            for p in sorted(enc.iterdir()):
                m = re.fullmatch(r"g(\d+)", p.name)
                if not m or int(m.group(1)) not in gens:
                    self.warn(f"encoders/{p.name}", "no recorded generation uses it (the next "
                                                    "writer or vacuum removes it)")

    def encoders(self, gens: dict) -> None:
        from . import encoder as enc_mod

        for g, rec in sorted(gens.items()):
            ck = rec.get("checkpoint")
            if not ck:
                continue
            p = self.root / ck
            where = f"generation {g}"
            if not (p / "config.json").is_file() or not enc_mod.weight_files(p):
                self.err(where, f"its encoder checkpoint {ck} is missing or incomplete")
                continue
            if self.deep:
                want = (rec.get("encoder") or {}).get("fingerprint")
                if want and enc_mod.fingerprint_dir(p) != want:
                    self.err(where, f"its encoder checkpoint {ck} is corrupt (sha256 mismatch)")
                tok = (rec.get("encoder") or {}).get("tokenizer")
                if tok and not enc_mod.tokenizer_matches(p, tok):
                    self.err(where, f"the tokenizer files of its encoder checkpoint {ck} "
                                    "changed (sha256 mismatch)")


def check(env: "Env", root: Path, *, deep: bool = True) -> CheckReport:
    """Verify a database: every array's CRC32, every document's checksum, every index
    file's size and CRC32 (and the structure of hnswlib files), the references between
    versions, segments, generations and files, and leftovers of killed writers.

    ``deep=False`` skips reading vector payloads, hnswlib structure and encoder weights.
    Nothing is changed. Errors mean damage (restore from a backup); warnings are leftovers
    that the next writer or ``vacuum`` removes, or checksums the next writer records.
    """
    checker = _Checker(env, root, deep)
    try:
        return checker.run()
    except (Error, KeyError, TypeError, ValueError, AttributeError) as exc:
        # a record of a shape no check foresaw: the report says where the check stopped,
        # rather than the check failing on the damage it is there to report
        checker.err("check", f"stopped at an unreadable record ({type(exc).__name__}: "
                             f"{exc}); the findings above are those made before it")
        return checker.report


def _finding(exc: BaseException) -> str:
    """An error's message as a finding of the report: without the advice to run `npmdb
    check` that the same error gives a query (the report is that check), keeping what to
    do next ("restore from a backup")."""
    text = re.sub(r"\(?[Rr]un `npmdb check[^`]*`(?: for a full report)?(?:,? then )?\)?",
                  "", str(exc))
    text = re.sub(r"\s*\(\s*\)|[;,:]\s*$", "", text.strip()).strip()
    return text or str(exc)
