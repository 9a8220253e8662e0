"""The encoder cache of one database: embedding generation → encoder, loaded once and
checked against the fingerprint recorded with the generation (vectors are only comparable
with the encoder that made them); and saving a trained model as a generation's checkpoint.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

from . import encoder as enc_mod
from .errors import Error, OperationalError
from npmdb.storage import format as F
from npmdb.storage.env import Env
from npmdb.storage.paths import remove_dir
from npmdb.storage.segments import fsync_dir

__all__ = ["Encoders", "preload", "save_checkpoint", "TOKENIZER_FILES"]

#: The tokenizer files a checkpoint gets (those its source has): every file a tokenizer
#: is read from.
TOKENIZER_FILES = enc_mod.ALL_TOKENIZER_FILES


class Encoders:
    """Encoders by generation for the database at ``root`` (LMDB environment ``env``).

    ``override``: the encoder directory the user passed at open (generation 0's encoder
    moved since the database was made); ``device``: torch device for new encoders.
    """

    def __init__(self, env: Env, root: Path, *, device: str | None = None,
                 override: str | os.PathLike | None = None) -> None:
        self.env, self.root, self.device = env, Path(root), device
        self.override = None if override is None else Path(override)
        self._cache: dict[int, enc_mod.Encoder] = {}
        self._lock = threading.Lock()
        self._swept = -1  # the id of the last transaction sweep() looked through
        self._sweep_lock = threading.Lock()

    def _record(self, txn, gen: int) -> F.GenerationRecord:
        rec = F.get_generation(txn, self.env.dbs, gen)
        if rec is None:
            raise OperationalError(f"embedding generation {gen} is not recorded in {self.root}")
        return rec

    def get(self, gen: int, record: F.GenerationRecord | None = None) -> enc_mod.Encoder:
        """The encoder of generation ``gen`` (loaded once, then cached); ``record``: the
        generation's record as the caller's snapshot read it (None: read it now)."""
        e = self._cache.get(gen)
        if e is not None:
            return e
        with self._lock:
            e = self._cache.get(gen)
            if e is None:
                e = self._cache[gen] = self._load(gen, record)
            return e

    def _load(self, gen: int, record: F.GenerationRecord | None = None) -> enc_mod.Encoder:
        if record is not None:
            g = record
        else:
            with self.env.read() as txn:
                g = self._record(txn, gen)
        info = enc_mod.EncoderInfo.from_dict(g.encoder)
        if g.checkpoint:
            path = self.root / g.checkpoint
        elif self.override is not None:
            path = self.override
        else:
            path = self._installed(Path(info.path), info)
        # vectors are only comparable with the encoder that made them: a changed or damaged
        # model directory must not answer (or write vectors) silently
        if not (path / "config.json").exists():
            raise OperationalError(f"the encoder of embedding generation {gen} is missing "
                                   f"({path}); run `npmdb check {self.root}`")
        fp = enc_mod.fingerprint_dir(path)
        if fp != info.fingerprint and info.name == enc_mod.SHIPPED_NAME and not g.checkpoint:
            raise OperationalError(
                f"this database's vectors were made by the default encoder of another npmdb "
                f"release (sha256 {info.fingerprint[:12]}…), which this release does not "
                f"ship (it ships {fp[:12]}… and keeps {len(enc_mod.shipped_encoders()) - 1} "
                "earlier one(s)): open it with encoder='/path/to/that/checkpoint' (npmdb's "
                "git history of npmdb/models/minilm-npm), or rebuild the database")
        if fp != info.fingerprint:
            raise OperationalError(
                f"the encoder of embedding generation {gen} at {path} is not the one that "
                f"made its vectors (sha256 {fp[:12]}…, recorded {info.fingerprint[:12]}…): "
                "its config or weights changed or were damaged, and no installed encoder "
                "has the recorded weights; restore that directory, or open with "
                "encoder='/path/to/the/original'")
        if info.tokenizer and not enc_mod.tokenizer_matches(path, info.tokenizer):
            tok = enc_mod.fingerprint_tokenizer(path)
            raise OperationalError(
                f"the tokenizer of embedding generation {gen} at {path} is not the one that "
                f"made its vectors (its files changed: sha256 {tok[:12]}…, recorded "
                f"{info.tokenizer[:12]}…); the same weights would read the text as other "
                "tokens. Restore the tokenizer files (vocab, tokenizer.json, "
                "tokenizer_config.json), or open with encoder='/path/to/the/original'")
        return enc_mod.Encoder(path, device=self.device, info=info)

    @staticmethod
    def _installed(recorded: Path, info: enc_mod.EncoderInfo) -> Path:
        """Where the encoder recorded as ``info`` is now (:func:`npmdb.encoder.find_encoder`)."""
        found = enc_mod.find_encoder(info.fingerprint, recorded)
        if found is None:
            raise OperationalError(
                f"the encoder this database was built with ({recorded}, sha256 "
                f"{info.fingerprint[:12]}…) is gone and no installed encoder has its "
                "weights: open with encoder='/path/to/it'")
        return found

    def sweep(self, txn) -> None:
        """Drop the encoders of generations ``txn`` no longer records (a vacuum in another
        handle or process removed them and their checkpoints): a handle kept open beside
        a writer kept one model per training refresh, its deleted file still mapped.
        Runs once per commit seen; a snapshot that still reads such a generation loads
        it again from what the vacuum left for it."""
        tid = txn.id()
        if tid <= self._swept:
            return
        with self._sweep_lock:  # not self._lock: get() holds it while a model loads
            if tid <= self._swept:  # an older snapshot waited for a newer one's sweep
                return
            self._swept = tid
            for gen in [g for g in list(self._cache)
                        if F.get_generation(txn, self.env.dbs, g) is None]:
                self._cache.pop(gen, None)

    def put(self, gen: int, encoder: enc_mod.Encoder) -> None:
        """Cache ``encoder`` as generation ``gen``'s (a refresh that just wrote it)."""
        self._cache[gen] = encoder

    def clear(self) -> None:
        self._cache.clear()


def save_checkpoint(model: Any, target: Path, tokenizer_dirs: list[Path]) -> None:
    """Save ``model`` (a transformers model) to ``target`` as safetensors, with the
    tokenizer files of the first of ``tokenizer_dirs`` that holds a tokenizer; fsynced,
    then renamed into place. Raises OperationalError, with nothing in place, where none
    of them holds one."""
    source = next((d for d in tokenizer_dirs if enc_mod.has_tokenizer(d)), None)
    if source is None:
        raise OperationalError(
            "no tokenizer to save with the new checkpoint: none of "
            f"{', '.join(str(d) for d in tokenizer_dirs)} holds one (the encoder's directory "
            "was moved or emptied); reopen the database with encoder=<its directory>")
    tmp = target.with_name(target.name + ".tmp")
    remove_dir(tmp)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp, safe_serialization=True)
    for name in TOKENIZER_FILES:  # one tokenizer's files, never a mix of two
        if (source / name).exists():
            shutil.copy(source / name, tmp / name)
    for f in tmp.iterdir():
        fd = os.open(f, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    remove_dir(target)
    os.replace(tmp, target)
    fsync_dir(target.parent)


def preload(db: Any, version: int | str | None = None) -> float:
    """Load the encoder that a query of ``db`` at ``version`` (HEAD by default) uses, ahead
    of the query, and return the seconds it took: torch and the model take seconds, once
    per process, so a one-shot command can time the query alone and a prompt can load while
    the user types. Where nothing can be loaded (no such version, an empty database, a
    missing model) it loads nothing and returns 0.0: the query itself says why."""
    t0 = time.perf_counter()
    try:
        with db.snapshot(version) as snap:
            gen = snap.generation
        db.encoder_for(gen)
    except Error:
        return 0.0
    return time.perf_counter() - t0
