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
from typing import TYPE_CHECKING, Any, Mapping

from . import encoder as enc_mod
from .arguments import check_text
from .encoders import save_checkpoint
from .errors import IntegrityError, ProgrammingError
from .ingest.local import encode_into
from npmdb.storage import format as F
from npmdb.storage import versions as V
from npmdb.storage.paths import checkpoint_dir

if TYPE_CHECKING:  # pragma: no cover
    from npmdb.storage.transaction import Writer

    from .database import Database
    from .encoders import Encoders

__all__ = ["write_generation", "reembed", "NewGeneration", "check_request", "check_model"]


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


def check_request(model: Any, *, steps: Any, tag: Any, message: Any, info: Any,
                  timeout: Any, move: Any) -> None:
    """``db.write_generation``'s arguments, checked before the writer is taken: a bad one
    is refused before anything is encoded (the model's fit is :func:`check_model`'s)."""
    if timeout is not None and (isinstance(timeout, bool)
                                or not isinstance(timeout, (int, float)) or timeout < 0):
        raise ProgrammingError(f"timeout must be a number of seconds >= 0, got {timeout!r}")
    V.check_message(message)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ProgrammingError(f"steps (the training steps behind the model, recorded with "
                               f"it) must be an integer >= 0, got {steps!r}")
    if info is not None:
        if not isinstance(info, Mapping):
            raise ProgrammingError(f"info must be a dict of what to record with the "
                                   f"generation, got {type(info).__name__}")
        try:
            F.pack(dict(info))
        except Exception as exc:  # noqa: BLE001 - msgpack raises several kinds
            raise ProgrammingError(f"info cannot be stored: {exc} (use str, numbers, lists "
                                   "and dicts)") from None
    if tag is not None:
        check_text(tag, "the tag name")
        V.check_tag_name(tag)
    if not isinstance(move, bool):
        raise ProgrammingError(f"move must be True or False, got {move!r}")
    if not (hasattr(model, "save_pretrained") and hasattr(model, "config")
            and callable(getattr(model, "state_dict", None))):
        raise ProgrammingError(
            f"write_generation takes a transformers model (a trained copy of the database's "
            f"encoder, e.g. npmdb.train's), not {type(model).__name__}")


def check_model(model: Any, base: enc_mod.Encoder, dim: int) -> None:
    """``model`` must read the corpus as ``base`` (the encoder of the generation it
    refreshes) does, into vectors of the database's width: the same hidden size, a
    vocabulary that holds every stored token id, and room for a whole block. Checked
    before anything is encoded or written."""
    config = model.config
    hidden = getattr(config, "hidden_size", None)
    if hidden != dim:
        raise ProgrammingError(
            f"the model's hidden size is {hidden} and the database's vectors are {dim} "
            "wide: refresh with a trained copy of the database's encoder (its vectors "
            "must have the width the indexes hold), or make a new database for this model")
    vocab, have = getattr(config, "vocab_size", None), int(base.model.config.vocab_size)
    if not isinstance(vocab, int) or vocab < have:
        raise ProgrammingError(
            f"the model's vocabulary holds {vocab} tokens and the database's encoder "
            f"{have}: the stored token ids are its tokenizer's, so refresh with a model "
            "trained from the database's encoder")
    positions = enc_mod.usable_positions(config.to_dict())
    if positions < base.max_positions:
        raise ProgrammingError(
            f"the model takes {positions} positions and the database's blocks need "
            f"{base.max_positions}: refresh with a model trained from the database's encoder")


def _begin(writer: "Writer", encoders: "Encoders", model: Any) -> NewGeneration:
    """Number the next generation and save ``model`` as its checkpoint (safetensors, with
    the tokenizer files of its parent or, for generation 0, of the base encoder as it was
    loaded, wherever that is now)."""
    head = writer.head()
    if head is None:
        raise ProgrammingError("the database is empty: nothing to re-embed")
    with writer.env.read() as txn:
        gen = V.next_id(txn, writer.env.dbs, "next_generation")
    base = encoders.get(head.generation)
    check_model(model, base, int(writer.config["dim"]))
    ckpt = checkpoint_dir(writer.root, gen)
    ckpt.parent.mkdir(exist_ok=True)
    parent = checkpoint_dir(writer.root, head.generation)
    # the directories the encoders were loaded from: a recorded path may be gone (a
    # database copied to another machine finds its default encoder by its sha256)
    save_checkpoint(model, ckpt, [parent if parent.exists() else base.path,
                                  encoders.get(0).path])
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
    seconds for another writer, and moves its tag (a run's ``train-step-N`` tags name the
    latest run's steps: see ``npmdb.train``'s ``tag_prefix``)."""
    return db.write_generation(model, steps=steps, tag=tag, message=message, info=info,
                               timeout=timeout, move=True)


def reembed(writer: "Writer", encoders: "Encoders", model: Any, *, steps: int = 0,
            tag: str | None = None, message: str = "", info: dict | None = None,
            engine: Any = None, timeout: float | None = None,
            move: bool = False) -> tuple[int, int]:
    """Re-embed HEAD's segments with ``model`` (a transformers model) as a new generation
    and commit a version that reads it; returns ``(version id, generation)``.
    ``engine``: None (this process) or a :class:`npmdb.ingest.ray.RayEngine`;
    ``timeout``: seconds to wait for another writer (None: the handle's); ``move``: the
    ``tag`` may already name another version (refused otherwise, as ``db.tag`` does)."""
    with writer.hold(timeout):
        writer.refuse_uncommitted()  # before encoding every segment, not after
        if tag is not None and not move:
            with writer.env.read() as txn:
                had = V.tags_of(txn, writer.env.dbs).get(tag)
            if had is not None:
                raise IntegrityError(
                    f"tag {tag!r} already names version {had}: choose another tag, or pass "
                    "move=True to point it at the new version (vacuum then no longer keeps "
                    f"version {had} for it); nothing was written")
        new = _begin(writer, encoders, model)
        encoder = enc_mod.Encoder(writer.root / new.checkpoint, device=encoders.device,
                                  info=new.info)
        if engine is None:
            for seg in new.segments:
                reader = writer.reader(seg)
                cols = reader.columns()
                sw = writer.segment_writer(seg, new.gen, existing=reader)
                encode_into(sw, encoder, cols.tokens, cols.block_ptr,
                            writer.progress(cols.n_tokens, f"re-embed s{seg}", "tok"),
                            writer.check_open)
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
