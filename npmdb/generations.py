"""Embedding generations: write refreshed vectors for every segment as a new version.

REALM-style refresh (DESIGN.md section 5): a copy of the encoder's parameters becomes
generation ``g`` — its checkpoint is kept inside the database (``encoders/g{g}/``,
safetensors) — every segment of HEAD is re-encoded and re-indexed under ``g``, and one
LMDB transaction records the generation and commits a version that reads it. Older
versions keep their generation and stay queryable with their own encoder.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import encoder as enc_mod
from .errors import ProgrammingError
from .ingest import PreparedSegment, build_indexes, encode_and_store
from npmdb.storage import format as F
from npmdb.storage import versions as V
from npmdb.storage.segments import fsync_dir, remove_dir, segment_dir

if TYPE_CHECKING:  # pragma: no cover
    from .database import Database

__all__ = ["write_generation", "begin_generation", "commit_generation", "NewGeneration",
           "TOKENIZER_FILES"]

TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json",
                   "special_tokens_map.json", "merges.txt", "vocab.json", "sentencepiece.bpe.model")


def _save_checkpoint(db: "Database", model: Any, base_dir: Path, target: Path) -> None:
    tmp = target.with_name(target.name + ".tmp")
    remove_dir(tmp)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp, safe_serialization=True)
    for name in TOKENIZER_FILES:
        if (base_dir / name).exists():
            shutil.copy(base_dir / name, tmp / name)
    for f in tmp.iterdir():
        fd = os.open(f, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    remove_dir(target)
    os.replace(tmp, target)
    fsync_dir(target.parent)


@dataclass(frozen=True)
class NewGeneration:
    """A generation being written: its number, its parent, HEAD's segments when it began,
    and its checkpoint (``encoders/g{gen}`` inside the database) and encoder identity."""

    gen: int
    parent: int
    segments: tuple[int, ...]
    checkpoint: str
    info: "enc_mod.EncoderInfo"


def begin_generation(db: "Database", model: Any) -> NewGeneration:
    """Number the next generation and save ``model`` as its checkpoint (safetensors, with
    the tokenizer files of its parent or, for generation 0, of the base encoder)."""
    with db.env.read() as txn:
        head = V.head(txn, db.env.dbs)
        if head is None:
            raise ProgrammingError("the database is empty: nothing to re-embed")
        gen = int(V.get_meta(txn, db.env.dbs, "next_generation", 1))
    base = db.encoder_for(head.generation)
    ckpt_rel = f"encoders/g{gen}"
    ckpt = db.path / ckpt_rel
    ckpt.parent.mkdir(exist_ok=True)
    parent_dir = db.path / "encoders" / f"g{head.generation}"
    _save_checkpoint(db, model, parent_dir if parent_dir.exists() else Path(base.info.path), ckpt)
    for name in TOKENIZER_FILES:
        src = Path(db.encoder_for(0).info.path) / name
        if src.exists() and not (ckpt / name).exists():
            shutil.copy(src, ckpt / name)
    found = enc_mod.describe(ckpt)
    info = enc_mod.EncoderInfo(base.info.name + f"@g{gen}", str(ckpt), found.fingerprint,
                               found.hidden_size, found.model_type)
    return NewGeneration(gen, head.generation, tuple(head.segments), ckpt_rel, info)


def commit_generation(db: "Database", new: NewGeneration, *, steps: int, tag: str | None,
                      message: str, info: dict) -> int:
    """One LMDB transaction: record generation ``new`` and commit a version of HEAD's
    documents that reads it (tagged ``tag``); returns the version id."""
    gen = new.gen

    def txn_fn(txn):
        dbs = db.env.dbs
        record = {"id": gen, "encoder": new.info.to_dict(), "created": time.time(),
                  "parent": new.parent, "checkpoint": new.checkpoint, "steps": int(steps),
                  "info": info}
        txn.put(F.u32(gen), F.pack(record), db=dbs["generations"])
        cur = V.head(txn, dbs)
        vid = V.next_id(txn, dbs, "next_version")
        m = V.Manifest(vid, cur.id, time.time(), cur.segments, cur.deleted, gen, cur.stats,
                       message or f"embeddings refreshed (generation {gen}, step {steps})",
                       {"steps": int(steps)})
        V.put_version(txn, dbs, m)
        V.put_meta(txn, dbs, "head", vid)
        V.put_meta(txn, dbs, "generation", gen)
        V.put_meta(txn, dbs, "next_version", vid + 1)
        V.put_meta(txn, dbs, "next_generation", gen + 1)
        if tag:
            V.set_tag(txn, dbs, tag, vid)
        return vid
    vid = db.env.write(txn_fn)
    db.env.sync()
    return vid


def write_generation(db: "Database", model: Any, *, steps: int = 0, tag: str | None = None,
                     message: str = "", info: dict | None = None) -> tuple[int, int]:
    """Re-embed HEAD's segments with ``model`` (a transformers model); commit.

    Returns ``(version id, generation)``.
    """
    with db._writing():
        new = begin_generation(db, model)
        gen, new_info, ckpt = new.gen, new.info, db.path / new.checkpoint
        encoder = enc_mod.Encoder(ckpt, device=db.device, info=new_info)
        for seg in new.segments:
            reader = db._segment_reader(seg)
            cols = reader.columns()
            prep = PreparedSegment([], cols.tokens, cols.flags, cols.offsets, cols.block_ptr,
                                   cols.block_doc)
            starts_ends = encode_and_store(db, encoder, prep, seg, gen, db.progress,
                                           chunk=reader.chunk)
            tmp = db.path / "segments" / f"tmp-g{gen}-s{seg:06d}"
            remove_dir(tmp)
            tmp.mkdir(parents=True)
            build_indexes(db, prep, tmp, gen, starts_ends[:2], starts_ends[2:], db.progress,
                          bm25=False)
            final = segment_dir(db.path, seg)
            for f in tmp.iterdir():
                os.replace(f, final / f.name)
            fsync_dir(final)
            remove_dir(tmp)

        vid = commit_generation(db, new, steps=steps, tag=tag, message=message,
                                info=dict(info or {}))
        db._encoders[gen] = encoder
        return vid, gen
