"""Embedding generations: write refreshed vectors for every segment as a new version.

REALM-style refresh (DESIGN.md section 5): a copy of the encoder's parameters becomes
generation ``g`` — its checkpoint is kept inside the database (``encoders/g{g}/``,
safetensors) — every segment of HEAD is re-encoded and re-indexed under ``g`` (by the one
segment writer), and one commit records the generation and a version that reads it (a
:class:`~npmdb.storage.versions.Reembed` operation, which must cover every segment of the
HEAD it commits on). Older versions keep their generation and stay queryable with their
own encoder.

The refresh holds the writer for its whole run: a change from another thread of the same
handle waits for it (or is refused after ``timeout``), and a refresh that another thread's
batch holds up waits for that batch, then covers its segments too.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import encoder as enc_mod
from .encoders import save_checkpoint
from .errors import ProgrammingError
from .ingest.local import encode_into
from npmdb.storage import format as F
from npmdb.storage import versions as V
from npmdb.storage.paths import checkpoint_dir

if TYPE_CHECKING:  # pragma: no cover
    from npmdb.storage.transaction import Writer

    from .database import Database
    from .encoders import Encoders

__all__ = ["write_generation", "reembed", "NewGeneration"]


@dataclass(frozen=True)
class NewGeneration:
    """A generation being written: its number, the HEAD it re-embeds, its checkpoint
    (relative to the database) and encoder identity."""

    gen: int
    head: V.Manifest
    checkpoint: str
    info: enc_mod.EncoderInfo

    @property
    def segments(self) -> tuple[int, ...]:
        return self.head.segments


def _begin(writer: "Writer", encoders: "Encoders", model: Any) -> NewGeneration:
    """Number the next generation and save ``model`` as its checkpoint (safetensors, with
    the tokenizer files of its parent or, for generation 0, of the base encoder)."""
    head = writer.head()
    if head is None:
        raise ProgrammingError("the database is empty: nothing to re-embed")
    with writer.env.read() as txn:
        gen = int(V.get_meta(txn, writer.env.dbs, "next_generation", 1))
    base = encoders.get(head.generation)
    ckpt = checkpoint_dir(writer.root, gen)
    ckpt.parent.mkdir(exist_ok=True)
    parent = checkpoint_dir(writer.root, head.generation)
    save_checkpoint(model, ckpt, [parent if parent.exists() else Path(base.info.path),
                                  Path(encoders.get(0).info.path)])
    found = enc_mod.describe(ckpt)
    info = enc_mod.EncoderInfo(base.info.name + f"@g{gen}", str(ckpt), found.fingerprint,
                               found.hidden_size, found.model_type, found.tokenizer)
    return NewGeneration(gen, head, ckpt.relative_to(writer.root).as_posix(), info)


#: Seconds a training refresh waits for another writer (an ``add`` in another process)
#: before it gives up: a refresh comes after minutes or hours of steps, so it waits
#: rather than fail at once as a handle's default ``timeout=0`` would.
REFRESH_LOCK_WAIT = 600.0


def write_generation(db: "Database", model: Any, *, steps: int = 0, tag: str | None = None,
                     message: str = "", info: dict | None = None,
                     timeout: float = REFRESH_LOCK_WAIT) -> tuple[int, int]:
    """``db.write_generation(model, ...)``: the refresh function a
    :class:`~npmdb.train.refresh.Refresher` calls by default; it waits up to ``timeout``
    seconds for another writer."""
    return db.write_generation(model, steps=steps, tag=tag, message=message, info=info,
                               timeout=timeout)


def reembed(writer: "Writer", encoders: "Encoders", model: Any, *, steps: int = 0,
            tag: str | None = None, message: str = "", info: dict | None = None,
            engine: Any = None, timeout: float | None = None) -> tuple[int, int]:
    """Re-embed HEAD's segments with ``model`` (a transformers model) as a new generation
    and commit a version that reads it; returns ``(version id, generation)``.
    ``engine``: None (this process) or a :class:`npmdb.ingest.ray.RayEngine`;
    ``timeout``: seconds to wait for another writer (None: the handle's)."""
    with writer.hold(timeout):
        writer.refuse_uncommitted()  # before encoding every segment, not after
        new = _begin(writer, encoders, model)
        encoder = enc_mod.Encoder(writer.root / new.checkpoint, device=encoders.device,
                                  info=new.info)
        if engine is None:
            for seg in new.segments:
                reader = writer.reader(seg)
                cols = reader.columns()
                sw = writer.segment_writer(seg, new.gen, existing=reader)
                encode_into(sw, encoder, cols.tokens, cols.block_ptr,
                            writer.progress(cols.n_tokens, f"re-embed s{seg}", "tok"))
                sw.finish()
        else:
            engine.reembed(writer, encoders, new)
        record = F.GenerationRecord(
            new.gen, new.info.to_dict(), time.time(), new.head.generation, new.checkpoint,
            int(steps), dict(info or {}) | ({"engine": "ray"} if engine is not None else {}))
        m = writer.commit([V.Reembed(record, new.segments)], read=new.head,
                          message=message or f"embeddings refreshed (generation {new.gen}, "
                                             f"step {steps})",
                          info={"steps": int(steps)}, tag=tag)
        encoders.put(new.gen, encoder)
        return m.id, new.gen
