"""The command line's commands that list, name and change a database's versions without
adding to it: versions, tag, restore, update, delete, optimize, vacuum (``npmdb add`` and
``npmdb train`` are in :mod:`npmdb.cli`). Each opens the database, makes one change (a
new version, or a removal by vacuum) and prints what it did."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from .errors import DataError, ProgrammingError
from .output import print_table, shorten

__all__ = ["register", "timeout_flag"]


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
        rows = [(v["id"], time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(v["time"])),
                 v["parent"], ",".join(v["tags"]), v["docs"], v["tokens"], v["generation"],
                 "*" if v["head"] else "", shorten(v.get("message") or "", 40))
                for v in db.versions()]
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


def _change(args, verb: str, change, said) -> int:
    """Run ``change(db)`` (a new version, or none when nothing changed) and print what it
    did: ``said(version, documents gained)``."""
    with _open(args) as db:
        head, before = db.version, db.count()
        vid = change(db)
        if vid is None:
            print(f"nothing to {verb}: the database has no version yet")
        elif vid == head:
            print(f"nothing to {verb}; version {vid} is unchanged")
        else:
            print(said(vid, db.count() - before))
    return 0


def cmd_update(args) -> int:
    if any(not f.strip() for f in args.files):  # Path("") would read the working directory
        raise DataError("an empty path names no file: give a file or directory")
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
    return _change(args, "optimize", optimize,
                   lambda vid, _: f"optimized: version {vid} ({segments[0]} segments merged "
                                  "into 1; deleted documents dropped)")


def cmd_vacuum(args) -> int:
    with _open(args) as db:
        removed = db.vacuum(keep_tags=not args.drop_tags, older_than=args.older_than)
        print("vacuum removed " + ", ".join(f"{n} {what.replace('_', ' ')}"
                                              for what, n in removed.items()))
    return 0


def register(sub) -> None:
    """Add these commands to the ``npmdb`` parser's subcommands ``sub``."""
    v = sub.add_parser("versions", help="list versions")
    v.add_argument("db")
    v.set_defaults(fn=cmd_versions)

    t = sub.add_parser("tag", help="name a version (or remove a name: --delete)")
    t.add_argument("db")
    t.add_argument("name")
    t.add_argument("--version", default=None)
    t.add_argument("--move", action="store_true",
                   help="point an existing tag at this version (by default it is refused)")
    t.add_argument("--delete", action="store_true",
                   help="remove the tag (its version stays until a vacuum finds nothing "
                        "else keeping it)")
    timeout_flag(t)
    t.set_defaults(fn=cmd_tag)

    rs = sub.add_parser("restore", help="commit a new version equal to an older one")
    rs.add_argument("db")
    rs.add_argument("version", help="version id or tag")
    rs.add_argument("--message", default="")
    timeout_flag(rs)
    rs.set_defaults(fn=cmd_restore)

    up = sub.add_parser("update", help="replace documents with the same ids (an id not there "
                                       "is added), as one version")
    up.add_argument("db")
    up.add_argument("files", nargs="+", help="files or directories, as `npmdb add` reads")
    up.add_argument("--message", default="")
    timeout_flag(up)
    up.add_argument("-q", "--quiet", action="store_true")
    up.set_defaults(fn=cmd_update)

    de = sub.add_parser("delete", help="delete documents by id (one version)")
    de.add_argument("db")
    de.add_argument("ids", nargs="+", metavar="ID")
    de.add_argument("--missing-ok", action="store_true",
                    help="skip ids that are not there (by default nothing is deleted)")
    de.add_argument("--message", default="")
    timeout_flag(de)
    de.set_defaults(fn=cmd_delete)

    op = sub.add_parser("optimize", help="merge HEAD's segments into one, dropping deleted "
                                         "documents (a new version)")
    op.add_argument("db")
    op.add_argument("--index", default=None, choices=("hnsw", "ivf", "exact", "auto"),
                    help="the dense index of the merged segment and of later ones")
    op.add_argument("--codec", default=None,
                    help="the vector codec of the merged segment and of later ones "
                         "(float16, int8, int4, pqM, auto)")
    op.add_argument("--message", default="")
    timeout_flag(op)
    op.add_argument("-q", "--quiet", action="store_true")
    op.set_defaults(fn=cmd_optimize)

    va = sub.add_parser("vacuum", help="remove versions that are neither HEAD nor tagged, and "
                                       "the files only they used")
    va.add_argument("db")
    va.add_argument("--drop-tags", action="store_true",
                    help="remove tagged versions too (HEAD always stays)")
    va.add_argument("--older-than", type=float, default=None, metavar="SECONDS",
                    help="keep versions younger than this")
    timeout_flag(va)
    va.set_defaults(fn=cmd_vacuum)
