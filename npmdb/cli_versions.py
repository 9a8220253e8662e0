"""The command line's commands that list, name and change a database's versions without
adding to it: versions, tag, restore, update, delete, optimize, vacuum (``npmdb add`` and
``npmdb train`` are in :mod:`npmdb.cli`). Each opens the database, makes one change (a
new version, or a removal by vacuum) and prints what it did."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .errors import DataError, ProgrammingError
from .output import print_table, shorten
from .shell import version_row

__all__ = ["register", "timeout_flag", "check_paths"]


def timeout_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--timeout", type=float, default=0.0,
                        help="seconds to wait for another writer (default 0: fail at once)")


def _open(args, *, write: bool = True):
    import npmdb

    if write:
        return npmdb.open(args.db, create=False, progress=not getattr(args, "quiet", True),
                          timeout=args.timeout)
    return npmdb.open(args.db, create=False, readonly=True, progress=False)


def cmd_versions(args) -> int:
    with _open(args, write=False) as db:
        rows = [(*row[:-1], shorten(row[-1] or "", 40))
                for row in map(version_row, db.versions())]
        print_table(("id", "time", "parent", "tags", "docs", "tokens", "gen", "head",
                     "message"), rows, sys.stdout)
    return 0


def cmd_tag(args) -> int:
    if args.delete and (args.version is not None or args.move):
        raise ProgrammingError("--delete takes only the tag name (no --version, no --move)")
    with _open(args) as db:
        if args.delete:
            vid = db.untag(args.name)
            print(f"removed tag {args.name!r} (it named version {vid})")
        else:
            vid = db.tag(args.name, args.version, move=args.move)
            print(f"tagged version {vid} as {args.name!r}")
    return 0


def cmd_restore(args) -> int:
    from .storage.versions import parse_ref

    with _open(args) as db:
        old = db.checkout(parse_ref(args.version)).version  # an id, a tag or HEAD: its id
        vid = db.restore(old, message=args.message)
        named = "" if str(old) == args.version else f" ({args.version})"
        print(f"restored: version {vid} equals version {old}{named} (nothing copied; "
              f"every older version stays readable)")
    return 0


def _change(args, verb: str, change, said, *, kept: str = "", empty: str = "") -> int:
    """Run ``change(db)`` (a new version, or none when nothing changed) and print what it
    did: ``said(version, documents gained)``; ``kept`` / ``empty``: said too when nothing
    changed / when there is no version yet."""
    with _open(args) as db:
        head, before = db.version, db.count()
        vid = change(db)
        if vid is None:
            print(f"nothing to {verb}: the database has no version yet{empty}")
        elif vid == head:
            print(f"nothing to {verb}; version {vid} is unchanged{kept}")
        else:
            print(said(vid, db.count() - before))
    return 0


def check_paths(files) -> None:
    """Paths given on the command line name something: ``Path("")`` is the working
    directory, which would be read whole."""
    if any(not f.strip() for f in files):
        raise DataError("an empty path names no file: give a file or directory (\".\" "
                        "for the working directory)")


def cmd_update(args) -> int:
    check_paths(args.files)
    return _change(args, "update", lambda db: db.update([Path(f) for f in args.files],
                                                        message=args.message),
                   lambda vid, n: f"updated: version {vid} ({n:+d} documents; each id that "
                                  "was there is replaced)")


def cmd_delete(args) -> int:
    return _change(args, "delete", lambda db: db.delete(args.ids, message=args.message,
                                                        missing_ok=args.missing_ok),
                   lambda vid, n: f"deleted {-n} documents; version {vid} (older versions "
                                  "keep them until a vacuum; `npmdb optimize` reclaims "
                                  "their space)")


def cmd_optimize(args) -> int:
    segments: list[int] = []

    def optimize(db):
        segments.append(db.stats()["segments"])
        return db.optimize(message=args.message, index=args.index, codec=args.codec)
    settings = ", ".join(f"--{k} {v}" for k, v in (("index", args.index),
                                                    ("codec", args.codec)) if v is not None)
    return _change(args, "optimize", optimize,
                   lambda vid, _: f"optimized: version {vid} ({segments[0]} segments merged "
                                  "into 1; deleted documents dropped)",
                   kept=f" (its segments already are what {settings} writes; new segments "
                        "use it from now on)" if settings else "",
                   empty=f" ({settings} is recorded for its first segments)" if settings else "")


def cmd_vacuum(args) -> int:
    with _open(args) as db:
        removed = db.vacuum(keep_tags=not args.drop_tags, older_than=args.older_than)
        print("vacuum removed " + ", ".join(f"{n} {what.replace('_', ' ')}"
                                              for what, n in removed.items()))
    return 0


def _change_command(sub, name: str, fn, help: str, *, message: bool = True,
                    quiet: bool = False) -> argparse.ArgumentParser:
    """A command that changes the database: ``db``, ``--timeout`` (and ``--message``,
    ``-q``); the caller adds its own arguments."""
    p = sub.add_parser(name, help=help)
    p.add_argument("db")
    if message:
        p.add_argument("--message", default="")
    timeout_flag(p)
    if quiet:
        p.add_argument("-q", "--quiet", action="store_true")
    p.set_defaults(fn=fn)
    return p


def register(sub) -> None:
    """Add these commands to the ``npmdb`` parser's subcommands ``sub``."""
    v = sub.add_parser("versions", help="list versions")
    v.add_argument("db")
    v.set_defaults(fn=cmd_versions)

    t = _change_command(sub, "tag", cmd_tag, "name a version (or remove a name: --delete)",
                        message=False)
    t.add_argument("name")
    t.add_argument("--version", default=None)
    t.add_argument("--move", action="store_true",
                   help="point an existing tag at this version (by default it is refused)")
    t.add_argument("--delete", action="store_true",
                   help="remove the tag (its version stays until a vacuum finds nothing "
                        "else keeping it)")

    rs = _change_command(sub, "restore", cmd_restore,
                         "commit a new version equal to an older one")
    rs.add_argument("version", help="version id or tag")

    up = _change_command(sub, "update", cmd_update, "replace documents with the same ids (an "
                         "id not there is added), as one version", quiet=True)
    up.add_argument("files", nargs="+", help="files or directories, as `npmdb add` reads")

    de = _change_command(sub, "delete", cmd_delete, "delete documents by id (one version)")
    de.add_argument("ids", nargs="+", metavar="ID")
    de.add_argument("--missing-ok", action="store_true",
                    help="skip ids that are not there (by default nothing is deleted)")

    op = _change_command(sub, "optimize", cmd_optimize, "merge HEAD's segments into one, "
                         "dropping deleted documents (a new version)", quiet=True)
    op.add_argument("--index", default=None, choices=("hnsw", "ivf", "exact", "auto"),
                    help="the dense index of the merged segment and of later ones")
    op.add_argument("--codec", default=None,
                    help="the vector codec of the merged segment and of later ones "
                         "(float16, int8, int4, pqM, auto)")

    va = _change_command(sub, "vacuum", cmd_vacuum, "remove versions that are neither HEAD "
                         "nor tagged, and the files only they used", message=False)
    va.add_argument("--drop-tags", action="store_true",
                    help="remove tagged versions too (HEAD always stays)")
    va.add_argument("--older-than", type=float, default=None, metavar="SECONDS",
                    help="keep versions younger than this")
