"""The version and maintenance half of :class:`~npmdb.database.Database`: the history,
tags, read-only checkouts, restore, diff, and the maintenance that rewrites segments or
drops versions (``optimize``, ``vacuum``). A mixin over the handle's environment, writer
and snapshots; the work itself is in :mod:`npmdb.maintenance` and
:mod:`npmdb.storage.versions`."""

from __future__ import annotations

from typing import Any

from . import maintenance
from .arguments import check_ref, check_text
from .errors import DataError, IntegrityError, ProgrammingError
from .snapshot import history
from .views import VersionView
from npmdb.storage import codec as C
from npmdb.storage import versions as V
from npmdb.storage.dense import AUTO, INDEX_NAMES, IVF
from npmdb.storage.ivf import check_ivf_params

__all__ = ["Versioning", "check_codec", "index_kind"]


class Versioning:
    """``Database``'s methods over versions (see the module docstring)."""

    def versions(self) -> list[dict[str, Any]]:
        """Every version, oldest first: id, time, parent, tags, counts, generation."""
        self._check_open()
        with self.env.read() as txn:
            return history(txn, self.env.dbs)

    def tag(self, name: str, version: int | str | None = None, *, move: bool = False) -> int:
        """Name a version (HEAD by default); returns its id.

        A tag keeps its version through :meth:`vacuum`, so a name that already tags another
        version is refused (``IntegrityError``) unless ``move=True``: moving it would let
        the next vacuum drop the version it named. Tagging the same version again is a
        no-op."""
        if not isinstance(move, bool):
            raise ProgrammingError(f"move must be True or False, got {move!r}")
        if isinstance(name, str):
            check_text(name, "the tag name")
        V.check_tag_name(name)
        check_ref(version)
        writer = self._writing()
        with writer.hold():
            if version is None and writer.uncommitted:
                raise ProgrammingError(
                    "tag names a committed version, and this batch's changes are not "
                    "committed yet (HEAD is still the version before the batch): tag after "
                    "the batch, or name the version to tag")

            def txn_fn(txn):
                m = V.resolve(txn, self.env.dbs, version)
                had = V.tags_of(txn, self.env.dbs).get(name)
                if had is not None and had != m.id and not move:
                    raise IntegrityError(
                        f"tag {name!r} already names version {had}: choose another name, "
                        f"or pass move=True (npmdb tag --move) to point it at version "
                        f"{m.id}; once it moves, vacuum no longer keeps version {had} "
                        "for it")
                V.set_tag(txn, self.env.dbs, name, m.id)
                return m.id
            return writer.maintain(txn_fn)

    def untag(self, name: str) -> int:
        """Remove the tag ``name``; returns the version it named. The version itself stays
        until a :meth:`vacuum` finds nothing else keeping it (HEAD, another tag)."""
        writer = self._writing()
        with writer.hold():
            return writer.maintain(lambda txn: V.delete_tag(txn, self.env.dbs, name))

    def checkout(self, ref: int | str) -> "VersionView":
        """A read-only view of version ``ref`` (an id or a tag)."""
        with self.snapshot(ref) as snap:
            return VersionView(self, snap.manifest.id)

    def restore(self, ref: int | str, *, message: str = "") -> int:
        """Commit a new version equal to version ``ref`` (no data is copied)."""
        check_ref(ref)
        return maintenance.restore(self._writing(), ref, message)

    def diff(self, a: int | str, b: int | str | None = None) -> maintenance.Diff:
        """Documents added, removed and changed from version ``a`` to ``b`` (HEAD)."""
        return maintenance.diff(self.documents(version=a), self.documents(version=b))

    def optimize(self, *, message: str = "", index: str | None = None,
                 codec: str | None = None, retrain: bool | None = None) -> int | None:
        """Merge HEAD's segments into one, dropping deleted documents (a new version).
        ``index`` ('hnsw' | 'ivf' | 'exact' | 'auto') and ``codec`` ('float16' | 'int8' |
        'int4' | 'pqM' | 'auto'): the dense index and vector codec of the merged segment
        and of every segment written after it (vectors are copied or re-coded, never
        re-encoded by the model). ``retrain`` (an IVF segment; None: when the corpus has
        outgrown the template's lists): train the generation's IVF template anew with lists
        sized for HEAD's corpus, on a sample of its stored vectors, and code the merged
        segment and later ones against it."""
        if retrain is not None and not isinstance(retrain, bool):
            raise ProgrammingError(f"retrain must be True, False or None (when the corpus "
                                   f"has outgrown the IVF template), got {retrain!r}")
        kind = None
        if index is not None:
            kind = index_kind(index)
            if kind in (IVF, AUTO):
                check_ivf_params(self.dense_params.ivf, int(self.config["dim"]))
        if codec is not None:
            if not isinstance(codec, str):
                raise ProgrammingError(f"codec must be a codec name, got {codec!r}")
            if codec != C.AUTO:
                check_codec(codec, int(self.config["dim"]))
        return maintenance.optimize(self._writing(), message, index=kind, codec=codec,
                                    retrain=retrain)

    def vacuum(self, *, keep_tags: bool = True, older_than: float | None = None) -> dict:
        """Remove unkept versions and all data only they referenced: segments, vector sets,
        generations and their checkpoints and IVF templates, trained PQ codec states (see
        maintenance). Returns counts of what went."""
        if not isinstance(keep_tags, bool):  # None or 0 would drop every tagged version
            raise ProgrammingError(f"keep_tags must be True or False, got {keep_tags!r}")
        if older_than is not None and (isinstance(older_than, bool) or not isinstance(
                older_than, (int, float)) or not older_than >= 0):
            raise ProgrammingError(f"older_than must be None or a number of seconds >= 0, "
                                   f"got {older_than!r}")
        return maintenance.vacuum(self._writing(), keep_tags=keep_tags, older_than=older_than)


def check_codec(name: Any, dim: int | None = None) -> None:
    """A codec option names a known codec that fits vectors of ``dim``: a bad one is the
    caller's mistake (ProgrammingError; a damaged stored name stays a DataError)."""
    try:
        C.get_codec(name)
        if dim is not None:
            C.check_fits(name, dim)
    except DataError as exc:
        fits = [m for m in range(1, dim + 1) if dim % m == 0] if dim else []
        hint = (f"; for {dim}-dimensional vectors use pq or pqM with M one of "
                f"{', '.join(map(str, fits))}" if fits and str(name).startswith("pq") else "")
        raise ProgrammingError(f"{exc}{hint}") from None


def index_kind(index: Any) -> str:
    if not isinstance(index, str) or index not in INDEX_NAMES:
        raise ProgrammingError(f"unknown index kind {index!r}: choose one of "
                               f"{sorted(INDEX_NAMES)}")
    return INDEX_NAMES[index]
