"""Opening a database directory: the checks before a new database is made, the lock its
creation holds, the removal of what a failed creation left, and the check of an existing
database's config.

Two processes may open the same new path at once. One creates the database while it holds
the writer lock (``write.lock``); the others wait for it, then find the database made and
open it as an existing one (and refuse it, as for any existing database, if they asked for
another encoder). Without the lock both wrote a config and the last one won: one process
then stored vectors of its encoder under the other's.
"""

from __future__ import annotations

import os
import shutil
from contextlib import suppress
from pathlib import Path

from .errors import Error, OperationalError
from npmdb.storage.filelock import FileLock

__all__ = ["FORMAT", "check_config", "check_empty", "check_new", "claim_new", "creation_lock",
           "has_file", "remove_if_never_written", "remove_unfinished"]

#: The on-disk format this npmdb reads and writes (the config's ``format``).
FORMAT = 1


def has_file(path: Path, name: str) -> bool:
    """Whether ``path/name`` exists (an OS error, such as a name too long: an
    OperationalError naming the path, not the OSError of ``Path.exists``)."""
    try:
        return (path / name).exists()
    except OSError as exc:
        raise OperationalError(f"cannot use the database path {path}: "
                               f"{exc.strerror or exc}") from None


def check_new(path: Path, *, readonly: bool, create: bool) -> bool:
    """Whether a new database may be made at ``path``; makes its directory and says
    whether it did. OS errors (a parent that is a file, no permission, a read-only file
    system) are an OperationalError naming the path."""
    try:
        if path.exists() and not path.is_dir():  # a file: create=True won't help
            raise OperationalError(f"{path} is a file, not an npmdb database (a database is "
                                   "a directory): give the database's directory")
        if readonly or not create:
            raise OperationalError(f"no npmdb database at {path}: pass create=True (and "
                                   "readonly=False) to make one, or from the shell "
                                   f"`npmdb add {path} FILE`")
        made = not path.exists()
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OperationalError(f"cannot make the database directory {path}: "
                               f"{exc.strerror or exc}") from None
    return made


def claim_new(path: Path, *, readonly: bool, create: bool, timeout: float
              ) -> tuple[bool, bool, FileLock | None]:
    """``(exists, made, lock)`` for a database at ``path``: whether it exists; where it
    does not, whether its directory was made here, and the creation lock, held (one
    process creates: the others wait for it, up to ``max(timeout, 60)`` seconds, then
    find the database made, and get no lock)."""
    if has_file(path, "data.mdb"):
        return True, False, None
    made = check_new(path, readonly=readonly, create=create)
    lock = creation_lock(path, max(timeout, 60.0))
    if has_file(path, "data.mdb"):
        lock.release()
        return True, made, None
    try:
        check_empty(path)
    except BaseException:
        lock.release()
        raise
    return False, made, lock


def check_empty(path: Path) -> None:
    """A new database's directory holds nothing but its lock file (checked holding the
    creation lock: a database another process is making is not 'a non-empty directory'),
    and LMDB's ``lock.mdb`` where a creation killed before LMDB made ``data.mdb`` left it
    (a reader table, no data: it was refused for good, and every retry failed)."""
    try:
        other = next((p.name for p in path.iterdir()
                      if p.name not in ("write.lock", "lock.mdb")), None)
    except OSError as exc:
        raise OperationalError(f"cannot read the database directory {path}: "
                               f"{exc.strerror or exc}") from None
    if other is not None:
        raise OperationalError(f"{path} is a non-empty directory that is not an npmdb "
                               f"database (it holds {other!r}): choose a new or empty "
                               "directory")


def creation_lock(path: Path, timeout: float) -> FileLock:
    """The writer lock of the new database at ``path``, held. A lock file that a failed
    creation removed while this process waited on it is no lock: take the new one."""
    while True:
        with suppress(OSError):
            path.mkdir(parents=True, exist_ok=True)
        lock = FileLock(path)
        lock.acquire(timeout)
        try:
            same = os.stat(lock.path).st_ino == os.fstat(lock.fd).st_ino
        except OSError:
            same = False
        if same:
            return lock
        lock.release()


def remove_unfinished(path: Path, made: bool) -> None:
    """Remove what a failed creation left (called holding the creation lock, whose file
    goes too: the directory held nothing else before), and the directory if the creation
    made it."""
    for child in path.iterdir() if path.is_dir() else ():
        with suppress(OSError):
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
    if made:
        with suppress(OSError):
            path.rmdir()


def remove_if_never_written(path: Path, *, made: bool) -> None:
    """Remove the database a failed first ``npmdb add`` made at ``path`` if it still holds
    no version (a directory that existed before stays, emptied). Checked and removed
    holding the writer lock: a process that opened the database meanwhile and is adding
    to it holds the lock (then the database is left to it), or finds it removed when it
    takes the lock."""
    from .database import open as open_db

    lock = FileLock(path)
    try:
        lock.acquire(0.0)
    except Error:  # another writer is at work on it: it is theirs now
        return
    try:
        try:
            with open_db(path, readonly=True, create=False, progress=False) as db:
                if db.versions():
                    return
        except Error:  # not a database, or not one to judge: leave it as it is
            return
        remove_unfinished(path, made)
    finally:
        lock.release()


def check_config(path: Path, config: object) -> None:
    """An existing database's config is a map of this npmdb's format, with a positive
    ``dim`` and ``block_len`` (else an OperationalError: what is wrong and what to do)."""
    if not isinstance(config, dict):
        raise OperationalError(f"{path} is damaged: its config is a "
                               f"{type(config).__name__}, not a map; restore it from a "
                               "backup")
    fmt = config.get("format")
    if fmt != FORMAT:
        newer = isinstance(fmt, int) and not isinstance(fmt, bool) and fmt > FORMAT
        raise OperationalError(
            f"{path} has format {fmt!r}, this npmdb reads format {FORMAT}: " +
            ("it was written by a newer npmdb; upgrade npmdb to open it" if newer else
             "it is not a format any npmdb wrote (a damaged config); restore it from a "
             "backup"))
    for key in ("dim", "block_len"):
        v = config.get(key)
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise OperationalError(f"{path} is damaged: its config's {key} is "
                                   f"{v!r:.40}, not a positive integer; restore it from "
                                   "a backup")
