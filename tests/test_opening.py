"""Opening a database directory as users meet it: two processes making the same new
database, paths the OS refuses, another program's LMDB store, configs of another format,
and records damaged out of band (check() reports them; every other call is an
OperationalError; vacuum removes nothing)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import lmdb
import msgpack
import pytest

import npmdb

sys.path.insert(0, str(Path(__file__).resolve().parent))  # --import-mode=importlib
from conftest import make_tiny_encoder  # noqa: E402

RACER = """
import sys, time, npmdb
path, enc, at, name = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
while time.time() < at:
    pass
try:
    with npmdb.open(path, encoder=enc, progress=False, timeout=30) as db:
        db.add([{"id": name, "text": f"Document {name} says Salem is the capital of Oregon."}])
        print("made", db.config["dim"])
except npmdb.Error as exc:
    print("refused", type(exc).__name__, exc)
"""


def _put(path: Path, table: bytes | None, key: bytes, value) -> None:
    """Write one raw record, as damage or another program would (not through npmdb)."""
    env = lmdb.open(str(path), max_dbs=20)
    try:
        db = env.open_db(table) if table else None
        with env.begin(write=True) as txn:
            txn.put(key, msgpack.packb(value), db=db)
    finally:
        env.close()


@pytest.fixture()
def two_versions(tmp_path, tiny_encoder) -> Path:
    path = tmp_path / "db"
    with npmdb.open(path, encoder=tiny_encoder, progress=False) as db:
        db.add([{"id": "a", "text": "Salem is the capital of Oregon."}])
        db.add([{"id": "b", "text": "Rome is the capital of Italy."}])
    return path


def test_two_processes_making_one_database_agree_on_its_encoder(tmp_path, tiny_encoder):
    """Both used to pass the 'is it new' test and write a config each: the last won, and
    the other stored vectors of its encoder under it (every dense query then failed). One
    makes it now; the other finds it made, and is refused for its other encoder."""
    wide = make_tiny_encoder(tmp_path / "wide", hidden=48)
    for trial in range(2):
        path = tmp_path / f"db{trial}"
        at = time.time() + 4  # both start their open at the same moment
        procs = [subprocess.Popen([sys.executable, "-c", RACER, str(path), str(enc), str(at),
                                   name], stdout=subprocess.PIPE, text=True)
                 for name, enc in (("A", tiny_encoder), ("B", wide))]
        outs = [p.communicate(timeout=240)[0] for p in procs]
        assert sorted(o.split()[0] for o in outs) == ["made", "refused"], outs
        assert "was built with encoder" in next(o for o in outs if o.startswith("refused"))
        with npmdb.open(path, readonly=True, progress=False) as db:
            assert db.count() == 1
            assert db.check().ok
            dim = int(next(o for o in outs if o.startswith("made")).split()[1])
            assert db.config["dim"] == dim
            assert db.fill_mask("Salem is the capital of [MASK].", retrieval="dense", top=1)


@pytest.mark.parametrize("make, match", [
    (lambda t: (t / "afile").write_text("x") and t / "afile" / "db",
     r"cannot make the database directory .*afile/db: Not a directory"),
    (lambda t: t / ("x" * 300), r"cannot use the database path .*File name too long"),
    (lambda t: "", r"the database path is empty"),
    (lambda t: f"{t}/a\0b", r"holds a NUL character"),
    (lambda t: f"{t}/db\udcff", r"is not valid UTF-8"),  # a name of the bytes b"db\xff"
])
def test_paths_the_os_refuses_are_errors_naming_the_path(tmp_path, tiny_encoder, make, match):
    """They were NotADirectoryError, OSError and ValueError (a traceback from the CLI), and
    an empty path made a database in the working directory."""
    with pytest.raises(npmdb.Error, match=match):
        npmdb.open(make(tmp_path), encoder=tiny_encoder, progress=False)


def test_cli_names_a_path_under_a_file_without_a_traceback(tmp_path):
    (tmp_path / "afile").write_text("x")
    (tmp_path / "doc.txt").write_text("Salem is the capital of Oregon.")
    r = subprocess.run([sys.executable, "-m", "npmdb", "add", str(tmp_path / "afile" / "db"),
                        str(tmp_path / "doc.txt")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Not a directory" in r.stderr and "Traceback" not in r.stderr


def test_another_programs_lmdb_store_is_refused_and_left_unchanged(tmp_path, tiny_encoder):
    path = tmp_path / "theirs"
    env = lmdb.open(str(path))
    with env.begin(write=True) as txn:
        txn.put(b"user:1", b"precious")
    env.close()
    before = (path / "data.mdb").read_bytes()
    for kw in ({"encoder": tiny_encoder}, {"create": False}, {"readonly": True}):
        with pytest.raises(npmdb.OperationalError,
                           match="LMDB store that is not an npmdb database.*nothing was changed"):
            npmdb.open(path, progress=False, **kw)
    assert (path / "data.mdb").read_bytes() == before


@pytest.mark.parametrize("fmt, match", [
    (2, r"has format 2, this npmdb reads format 1: it was written by a newer npmdb; upgrade"),
    ("1", r"has format '1', this npmdb reads format 1: it is not a format any npmdb wrote"),
])
def test_a_config_of_another_format_says_what_to_do(two_versions, fmt, match):
    env = lmdb.open(str(two_versions), max_dbs=20)
    meta = env.open_db(b"meta")
    with env.begin() as txn:
        config = msgpack.unpackb(txn.get(b"config", db=meta))
    env.close()
    _put(two_versions, b"meta", b"config", {**config, "format": fmt})
    with pytest.raises(npmdb.OperationalError, match=match):
        npmdb.open(two_versions, progress=False)


def test_vacuum_removes_nothing_when_head_names_no_version(two_versions):
    """check() reported the damage, but vacuum kept only 'HEAD' (no version) and tags and
    removed every version, segment and document for good."""
    _put(two_versions, b"meta", b"head", 7)
    with npmdb.open(two_versions, progress=False) as db:
        assert "HEAD names version 7, which does not exist" in str(db.check())
        for call in (db.vacuum, lambda: db.fill_mask("Rome is the capital of [MASK]."),
                     lambda: db.add(["Paris is the capital of France."])):
            with pytest.raises(npmdb.OperationalError,
                               match="damaged: HEAD names version 7, which does not exist"):
                call()
        assert db.count(version=1) == 1 and db.count(version=2) == 2  # AS OF still reads
    _put(two_versions, b"meta", b"head", 2)
    with npmdb.open(two_versions, progress=False) as db:
        assert db.check().ok and db.count() == 2


@pytest.mark.parametrize("table, key, value, found", [
    (b"meta", b"head", "x", "head holds 'x', not an id"),
    (b"meta", b"next_segment", "x", "next_segment holds 'x', not an id"),
    (b"meta", b"trash", 5, "trash holds 5, not a list of paths"),
    (b"tags", b"t1", "zz", "tag 't1': holds 'zz', not a version id"),
    (b"versions", (2).to_bytes(8, "big"), {"id": 2},
     "a version's manifest is unreadable (KeyError: 'time')"),
])
def test_records_of_the_wrong_shape_are_reported_never_raised_raw(two_versions, table, key,
                                                                  value, found):
    """check() crashed on them (ValueError, TypeError) and every other call raised int()'s
    or a KeyError; now check() reports them and the calls that read them say the database
    is damaged."""
    with npmdb.open(two_versions, progress=False) as db:
        db.tag("t1", 1)
    _put(two_versions, table, key, value)
    with npmdb.open(two_versions, progress=False) as db:
        report = db.check()
        assert not report.ok and found in str(report), str(report)
        raised = 0
        for call in (db.versions, lambda: db.add(["Paris is the capital of France."]),
                     db.vacuum):
            try:
                call()
            except npmdb.OperationalError as exc:
                assert "the database is damaged" in str(exc)
                raised += 1
        assert raised


def _can_mount_read_only() -> bool:
    """Whether this machine lets a test mount in a private mount namespace (root, and no
    container policy against it): a small tmpfs, and a directory bound read-only."""
    import shutil
    import tempfile

    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return False
    with tempfile.TemporaryDirectory() as d:
        r = subprocess.run(
            ["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size=1m tmpfs {d} && "
             f"mount --bind {d} {d} && mount -o remount,ro,bind {d} {d} && "
             f"! touch {d}/probe 2>/dev/null"], capture_output=True, timeout=60)
    return r.returncode == 0


READ_ONLY_QUERY = """
import sys, npmdb
with npmdb.open(sys.argv[1], readonly=True, progress=False) as db:
    answers = db.fill_mask("Rome is the capital of [MASK].", top=1)
    print("ANSWERS", len(answers), "HITS", len(db.search("capital", limit=5)))
"""


@pytest.mark.skipif(not _can_mount_read_only(), reason="needs unshare -m (root) to mount "
                                                       "a read-only file system")
def test_bm25_reads_a_database_on_a_read_only_file_system(two_versions, tmp_path):
    """tantivy takes a lock file even to read: on a read-only mount every BM25 query (the
    default retrieval) and search failed with "Failed to acquire Lockfile … None"."""
    script = tmp_path / "q.py"
    script.write_text(READ_ONLY_QUERY)
    ro = str(two_versions)
    r = subprocess.run(
        ["unshare", "-m", "sh", "-c", f"mount --bind {ro} {ro} && mount -o remount,ro,bind "
         f"{ro} {ro} && touch {ro}/probe 2>/dev/null && echo WRITABLE; "
         f"{sys.executable} {script} {ro}"], capture_output=True, text=True, timeout=240)
    assert "WRITABLE" not in r.stdout
    assert r.returncode == 0, r.stderr
    assert "ANSWERS 1 HITS 2" in r.stdout, r.stdout


FILL_THEN_OPEN = """
import os, sys
from pathlib import Path
import npmdb
disk = Path(sys.argv[1])
with open(disk / "filler", "wb") as fh:
    try:
        while True:
            fh.write(bytes(65536))
            fh.flush()
    except OSError:
        pass
os.truncate(disk / "filler", os.path.getsize(disk / "filler") - int(sys.argv[3]))
try:
    npmdb.open(disk / "db", encoder=sys.argv[2], progress=False).close()
    print("OPENED")
except npmdb.Error as exc:
    print("REFUSED", exc)
print("LEFT", sorted(os.listdir(disk)))
"""


@pytest.mark.skipif(not _can_mount_read_only(), reason="needs unshare -m (root) to mount "
                                                       "a small file system")
@pytest.mark.parametrize("free", [0, 70_000, 100_000])
def test_making_a_database_on_a_full_disk_is_an_error_not_a_crash(tmp_path, tiny_encoder,
                                                                   free):
    """LMDB maps its new, sparse lock file: on a full disk the first write through the
    map was a SIGBUS that killed the process; with room for that file only, making the
    tables raised lmdb.DiskError."""
    script, disk = tmp_path / "fill.py", tmp_path / "disk"
    script.write_text(FILL_THEN_OPEN)
    disk.mkdir()
    r = subprocess.run(
        ["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size=3m tmpfs {disk} && "
         f"{sys.executable} {script} {disk} {tiny_encoder} {free}"],
        capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "REFUSED" in r.stdout and "disk is full" in r.stdout, r.stdout
    assert "LEFT ['filler']" in r.stdout  # the failed creation left nothing


def test_a_handle_whose_database_was_removed_writes_nothing(tmp_path, tiny_encoder):
    """A failed first `npmdb add` removes the database it made; a handle another process
    opened on it meanwhile used to commit into the removed file and report success."""
    import shutil

    path = tmp_path / "db"
    path.mkdir()
    with npmdb.open(path, encoder=tiny_encoder, progress=False) as db:
        for child in path.iterdir():  # what the other process's cleanup removes
            shutil.rmtree(child) if child.is_dir() else child.unlink()
        with pytest.raises(npmdb.OperationalError, match="was removed or replaced by another "
                                                         "process.*nothing was written"):
            db.add(["Salem is the capital of Oregon."])


def test_a_failed_first_add_leaves_a_database_another_writer_holds(tmp_path, tiny_encoder):
    """The cleanup of a failed first `npmdb add` removed a database that another process
    was adding to (it had no version yet): that add then reported success for a database
    that was gone."""
    from npmdb.opening import remove_if_never_written as _remove_if_never_written
    from npmdb.storage.transaction import FileLock

    path = tmp_path / "db"
    npmdb.open(path, encoder=tiny_encoder, progress=False).close()
    other = FileLock(path)
    other.acquire(0.0)  # another process's add, under way
    try:
        _remove_if_never_written(path, made=True)
    finally:
        other.release()
    assert (path / "data.mdb").exists()
    _remove_if_never_written(path, made=True)  # nobody holds it: removed
    assert not path.exists()


# -- handles and resources (a threads-and-resources hunt) ------------------------------------


def test_a_database_made_again_at_a_path_is_not_the_dropped_handles(tmp_path, tiny_encoder):
    """Handles shared one LMDB environment per path until an explicit close(): a handle
    dropped without it kept the old (removed) file mapped, and a database made again at
    the path wrote into that removed file (a fresh process found no database)."""
    import gc
    import shutil

    path = tmp_path / "db"
    old = npmdb.open(path, encoder=tiny_encoder, progress=False)
    old.add(["Salem is the capital of Oregon."])
    del old  # never closed
    gc.collect()
    shutil.rmtree(path)
    with npmdb.open(path, encoder=tiny_encoder, progress=False) as db:
        db.add(["Rome is the capital of Italy.", "Paris is the capital of France."])
    r = subprocess.run([sys.executable, "-c", f"import npmdb; print(npmdb.open({str(path)!r}, "
                        "readonly=True, progress=False).count())"],
                       capture_output=True, text=True, timeout=120)
    assert r.stdout.strip() == "2", r.stderr


def test_a_collected_read_only_handle_lets_a_writable_one_open(tiny_db_path):
    import gc

    ro = npmdb.open(tiny_db_path, readonly=True, progress=False)
    assert ro.count()
    del ro
    gc.collect()
    with npmdb.open(tiny_db_path, progress=False) as db:  # "already open read-only" before
        assert db.count()


CLOSE_IN_SNAPSHOT = """
import sys, numpy as np, npmdb
db = npmdb.open(sys.argv[1], readonly=True, progress=False)
with db.snapshot() as snap:
    cols = snap.columns(0)  # zero-copy: views of the mapped file
    db.close()  # unmapped the file under this snapshot: reading it then was a SIGSEGV
    print("read", int(cols.tokens.sum()) > 0)
with npmdb.open(sys.argv[1], readonly=True, progress=False) as again:
    print("count", again.count())
"""


def test_close_inside_a_snapshot_unmaps_only_when_it_ends(tiny_db_path, tmp_path):
    script = tmp_path / "close.py"
    script.write_text(CLOSE_IN_SNAPSHOT)
    r = subprocess.run([sys.executable, str(script), str(tiny_db_path)], capture_output=True,
                       text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "read True" in r.stdout and "count" in r.stdout


def test_a_forked_child_can_query_dense(tiny_db_path):
    """The segment and branch thread pools were module globals: a forked child inherited
    pools without threads, and a dense query over several segments waited for ever."""
    import multiprocessing as mp

    with npmdb.open(tiny_db_path, readonly=True, progress=False) as db:
        db.fill_mask("Thessaloniki is a city in [MASK].", retrieval="dense", top=1)  # pools
        ctx = mp.get_context("fork")
        with ctx.Pool(1) as pool:
            got = pool.apply_async(_child_query, (str(tiny_db_path),)).get(timeout=120)
    assert got > 0


def _child_query(path: str) -> int:
    with npmdb.open(path, readonly=True, progress=False) as db:
        return len(db.fill_mask("Thessaloniki is a city in [MASK].", retrieval="dense",
                                top=3).answers)


def test_a_full_reader_table_is_an_operational_error(tiny_db_path):
    import contextlib

    with npmdb.open(tiny_db_path, readonly=True, progress=False) as db:
        with contextlib.ExitStack() as stack:
            with pytest.raises(npmdb.OperationalError, match="reader table is full"):
                for _ in range(5000):
                    stack.enter_context(db.snapshot())
        assert db.count()  # released: reads work again


def test_with_on_a_closed_handle_is_refused(tiny_db_path):
    db = npmdb.open(tiny_db_path, readonly=True, progress=False)
    db.close()
    with pytest.raises(npmdb.InterfaceError):
        with db:
            pass


def test_a_documents_iterator_stops_when_its_handle_closes(tiny_db_path):
    db = npmdb.open(tiny_db_path, readonly=True, progress=False)
    docs = db.documents()
    assert next(docs)["id"]
    db.close()
    with pytest.raises(npmdb.InterfaceError, match="closed"):
        next(docs)
