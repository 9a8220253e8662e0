"""The write path: one Writer owns every change (bugs found by reading, issue "One way down").

1. a failed call inside a batch leaves the batch exactly as before the call (a savepoint);
2. a failed add leaves no rows behind, and its segment number is never reused;
3. one handle shared by threads: another thread's add waits for (or is refused by) an open
   batch, never joins it; an embedding refresh racing an add covers the new segment.
"""

from __future__ import annotations

import copy
import os
import threading
import time

import pytest

import npmdb


def _docs(prefix: str, n: int) -> list[dict]:
    return [{"id": f"{prefix}{i}", "text": f"{prefix} document number {i} about Thessaloniki "
             f"and the river {prefix}{i}."} for i in range(n)]


# -- 1. a failed delete inside a batch ---------------------------------------------------------


def test_failed_delete_in_batch_is_not_half_applied(new_db):
    new_db.add(_docs("a", 3))
    with new_db.batch():
        with pytest.raises(npmdb.ProgrammingError, match="no-such-id"):
            new_db.delete(["a0", "no-such-id"])
        new_db.delete(["a1"])  # the batch goes on
    assert new_db.get("a0") is not None  # the failed call deleted nothing
    assert new_db.get("a1") is None
    assert new_db.count() == 2


# -- 2. a failed add inside a batch --------------------------------------------------------------


def _fail_installing_segments(monkeypatch):
    """Make the next installation of a segment directory fail, after its documents were
    stored in LMDB (the rename into place is the last step of writing a segment)."""
    real = os.replace
    state = {"armed": True}

    def replace(src, dst, *a, **k):
        if state["armed"] and "tmp-s" in os.fspath(src):
            state["armed"] = False
            raise OSError(5, "injected I/O error", os.fspath(dst))
        return real(src, dst, *a, **k)
    monkeypatch.setattr(os, "replace", replace)
    return state


def test_failed_add_in_batch_leaves_no_trace(new_db, monkeypatch):
    new_db.add(_docs("a", 2))
    before = new_db.stats()["segments"]
    state = _fail_installing_segments(monkeypatch)
    with new_db.batch():
        with pytest.raises(npmdb.OperationalError, match="injected"):
            new_db.add(_docs("x", 3))
        assert not state["armed"]
        new_db.add(_docs("y", 1))  # must not reuse the failed add's segment number
    # the failed add's ids resolve to nothing (not to the documents of the next add)
    for i in range(3):
        assert new_db.get(f"x{i}") is None
    assert new_db.get("y0")["text"].startswith("y document")
    assert new_db.count() == 3
    assert new_db.stats()["segments"] == before + 1
    assert [d["id"] for d in new_db.documents()] == ["a0", "a1", "y0"]
    report = new_db.check()
    assert report.ok and report.clean, str(report)
    new_db.add(_docs("x", 3))  # the ids are free
    assert new_db.count() == 6


def test_failed_add_outside_a_batch_leaves_no_trace(new_db, monkeypatch):
    new_db.add(_docs("a", 2))
    _fail_installing_segments(monkeypatch)
    with pytest.raises(npmdb.OperationalError, match="injected"):
        new_db.add(_docs("x", 3))
    assert new_db.get("x0") is None and new_db.count() == 2
    new_db.add(_docs("y", 2))
    assert new_db.get("x1") is None and new_db.get("y1") is not None
    report = new_db.check()
    assert report.ok and report.clean, str(report)


# -- 3. threads sharing one handle ----------------------------------------------------------------


def test_other_threads_add_is_refused_not_joined(new_db):
    new_db.add(_docs("a", 1))
    out: dict = {}
    inside = threading.Event()

    def other():
        inside.wait(10)
        try:
            out["vid"] = new_db.add(_docs("t", 1))
        except npmdb.OperationalError as exc:
            out["error"] = exc

    t = threading.Thread(target=other)
    t.start()
    with pytest.raises(RuntimeError, match="abandon"):
        with new_db.batch():
            new_db.add(_docs("m", 1))
            inside.set()
            t.join(10)
            raise RuntimeError("abandon the batch")
    assert "error" in out, out  # timeout=0: refused at once, never part of the batch
    assert "locked" in str(out["error"])
    assert new_db.get("t0") is None and new_db.get("m0") is None
    assert new_db.count() == 1


def test_other_threads_add_waits_for_the_batch(tmp_path, tiny_encoder):
    with npmdb.open(tmp_path / "db", encoder=tiny_encoder, progress=False, timeout=30) as db:
        db.add(_docs("a", 1))
        out: dict = {}
        inside = threading.Event()

        def other():
            inside.wait(10)
            out["vid"] = db.add(_docs("t", 1))
            out["done"] = time.monotonic()

        t = threading.Thread(target=other)
        t.start()
        with pytest.raises(RuntimeError, match="abandon"):
            with db.batch():
                db.add(_docs("m", 1))
                inside.set()
                time.sleep(0.5)
                assert "vid" not in out  # it waits for this batch
                ended = time.monotonic()
                raise RuntimeError("abandon the batch")
        t.join(30)
        assert out["done"] >= ended
        # committed on its own, after the batch was rolled back
        assert db.get("t0") is not None and db.get("m0") is None
        assert db.count() == 2 and out["vid"] == db.version


def _perturbed(db):
    import torch

    model = copy.deepcopy(db.encoder.model).cpu()
    torch.manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def _every_version_answers(db):
    for v in db.versions():
        res = db.fill_mask("Thessaloniki is a city in [MASK].", version=v["id"], k=16, retrieval="dense")
        assert res.generation == v["generation"]
        res = db.fill_mask("Thessaloniki is a city in [MASK].", version=v["id"], k=16,
                           exact=True)
        assert res.generation == v["generation"]


def test_refresh_waits_for_an_open_batch_and_covers_its_segments(tmp_path, tiny_encoder):
    """A refresh started (in another thread) while a batch is open commits after it, and
    its generation has vectors for the batch's segments too."""
    from npmdb.generations import write_generation

    with npmdb.open(tmp_path / "db", encoder=tiny_encoder, progress=False, timeout=60) as db:
        db.add(_docs("a", 20))
        model = _perturbed(db)
        out: dict = {}

        def refresh():
            try:
                out["vg"] = write_generation(db, model, steps=1, tag="refreshed")
            except Exception as exc:  # noqa: BLE001 - reported below
                out["error"] = exc

        with db.batch():
            db.add(_docs("b", 20))
            t = threading.Thread(target=refresh)
            t.start()
            time.sleep(0.5)
            db.add(_docs("c", 20))
        t.join(120)
        assert "error" not in out, out
        vid, gen = out["vg"]
        assert db.version == vid and db.stats()["generation"] == gen == 1
        assert db.count() == 60
        _every_version_answers(db)
        assert db.check().ok


def test_refresh_racing_adds_never_leaves_a_version_without_vectors(tmp_path, tiny_encoder):
    from npmdb.generations import write_generation

    with npmdb.open(tmp_path / "db", encoder=tiny_encoder, progress=False, timeout=60) as db:
        db.add(_docs("a", 30))
        model = _perturbed(db)
        out: dict = {}

        def refresh():
            try:
                out["vg"] = write_generation(db, model, steps=1)
            except Exception as exc:  # noqa: BLE001
                out["error"] = exc

        t = threading.Thread(target=refresh)
        t.start()
        for i in range(3):
            db.add(_docs(f"r{i}-", 5))
        t.join(120)
        assert "error" not in out, out
        assert db.count() == 45
        _every_version_answers(db)
        assert db.check().ok


# -- maintenance through the Writer -------------------------------------------------------------


def test_optimize_keeps_empty_documents(new_db):
    """Documents without tokens have no blocks; merging segments must keep them."""
    new_db.add(_docs("a", 3) + [{"id": "empty", "text": ""}, {"id": "blank", "text": "  "}])
    new_db.add(_docs("b", 2))
    new_db.delete(["a1"])
    before = sorted(d["id"] for d in new_db.documents())
    new_db.optimize()
    assert new_db.stats()["segments"] == 1
    assert sorted(d["id"] for d in new_db.documents()) == before
    assert new_db.get("empty")["text"] == "" and new_db.count() == len(before)
    assert new_db.check().clean


def test_optimize_without_the_disk_for_the_merged_segment_refuses_and_writes_nothing(
        new_db, monkeypatch):
    """optimize() checks the free disk against the merged segment's size before it writes:
    a disk too small for it (simulated: ``shutil.disk_usage`` reports 1 kB free) is a clear
    error, and HEAD, its segments and the LMDB file are as they were."""
    import shutil

    from npmdb import maintenance

    new_db.add(_docs("a", 3))
    new_db.add(_docs("b", 2))
    head, size = new_db.version, (new_db.path / "data.mdb").stat().st_size
    usage = shutil.disk_usage(new_db.path)
    monkeypatch.setattr(maintenance.shutil, "disk_usage",
                        lambda p: usage._replace(free=1_000))
    with pytest.raises(npmdb.OperationalError,
                       match=r"optimize needs about [1-9]\d* kB of free disk .* [0-9]+ kB are free"):
        new_db.optimize()
    assert new_db.version == head and new_db.stats()["segments"] == 2
    assert (new_db.path / "data.mdb").stat().st_size == size
    # a conversion that fails keeps the settings (they were recorded before the merge,
    # so the next add wrote exact int4 segments)
    config = dict(new_db.config)
    with pytest.raises(npmdb.OperationalError, match="free disk"):
        new_db.optimize(index="exact", codec="int4")
    assert new_db.config == config and new_db.version == head
    with npmdb.open(new_db.path, readonly=True, progress=False) as again:
        assert again.config == config
    monkeypatch.undo()
    new_db.optimize()  # the disk it has is enough
    assert new_db.stats()["segments"] == 1 and new_db.count() == 5
    assert new_db.check().clean


def test_maintenance_inside_a_batch_with_changes_is_refused(new_db):
    new_db.add(_docs("a", 2))
    new_db.add(_docs("b", 2))
    with pytest.raises(npmdb.ProgrammingError, match="inside a batch"):
        with new_db.batch():
            new_db.add(_docs("c", 1))
            new_db.optimize()
    assert new_db.count() == 4 and new_db.get("c0") is None
    with new_db.batch():  # an empty batch may optimize, then go on from the new version
        new_db.optimize()
        new_db.add(_docs("c", 1))
    assert new_db.count() == 5 and new_db.stats()["segments"] == 2


def test_a_failed_update_in_a_batch_keeps_the_old_document(new_db, monkeypatch):
    new_db.add(_docs("a", 2))
    _fail_installing_segments(monkeypatch)
    with new_db.batch():
        with pytest.raises(npmdb.OperationalError, match="injected"):
            new_db.update([{"id": "a0", "text": "a replacement"}])
    assert new_db.get("a0")["text"].startswith("a document") and new_db.count() == 2


# -- the one commit: operations against the version they read -----------------------------------


def _commit(db, ops, read, **kw):
    from npmdb.storage import versions as V

    return db.env.write(lambda txn: V.commit(txn, db.env.dbs, ops, read, **kw))


def test_commit_rebases_only_what_is_provably_safe(new_db):
    from npmdb.storage import format as F
    from npmdb.storage import versions as V

    new_db.add(_docs("a", 2))
    with new_db.env.read() as txn:
        old = V.head(txn, new_db.env.dbs)
        rec = F.get_segment(txn, new_db.env.dbs, old.segments[0])
        g0 = F.get_generation(txn, new_db.env.dbs, 0)
    new_db.add(_docs("b", 2))  # HEAD moves on
    head = new_db.version
    gen = F.GenerationRecord(7, g0.encoder, 0.0, 0)
    for op in (V.Reembed(gen, old.segments),            # misses the new segment
               V.Append((), 0, 0),                        # checked against the old version
               V.Delete(((old.segments[0], (0,)),))):
        with pytest.raises(npmdb.OperationalError, match="cannot be rebased"):
            _commit(new_db, [op], old)
        assert new_db.version == head
    m = _commit(new_db, [V.Restore(old.id)], old, message="restored")  # always safe
    assert m.parent == head and m.segments == old.segments and m.stats["docs"] == 2
    assert new_db.count() == 2 and rec.docs == 2



def test_a_rewrite_is_not_rebased_over_a_new_embedding_generation(new_db):
    """An optimize read at generation 0 and committed over a re-embedding would name a
    merged segment with no vectors of HEAD's generation."""
    from npmdb.storage import format as F
    from npmdb.storage import versions as V

    new_db.add(_docs("a", 2))
    with new_db.env.read() as txn:
        old = V.head(txn, new_db.env.dbs)
        rec = F.get_segment(txn, new_db.env.dbs, old.segments[0])
        g0 = F.get_generation(txn, new_db.env.dbs, 0)
    _commit(new_db, [V.Reembed(F.GenerationRecord(1, g0.encoder, 0.0, 0), old.segments)],
            old)  # a re-embedding lands
    head = new_db.version
    with pytest.raises(npmdb.OperationalError, match="embedding generation changed"):
        _commit(new_db, [V.Rewrite(old.segments, rec)], old)
    assert new_db.version == head


def test_optimize_in_an_empty_batch_keeps_its_merged_segment(new_db):
    """The batch's end removed the segment optimize had committed, as an unused leftover:
    HEAD named a missing segment, and the next vacuum removed the intact versions."""
    new_db.add(_docs("a", 1))
    new_db.add(_docs("b", 1))
    with new_db.batch():
        new_db.optimize()
    assert sorted(d["id"] for d in new_db.documents()) == ["a0", "b0"]
    assert new_db.check().ok
    new_db.vacuum()
    assert sorted(d["id"] for d in new_db.documents()) == ["a0", "b0"]


def test_a_nested_batch_that_raises_is_undone_alone(new_db):
    new_db.add([{"id": "keep", "text": "Oslo is in Norway."}])
    with new_db.batch():
        new_db.add([{"id": "outer", "text": "Bergen is in Norway."}])
        with pytest.raises(ValueError):
            with new_db.batch():  # e.g. a helper with a batch of its own
                new_db.add([{"id": "inner", "text": "half of a change."}])
                new_db.delete("keep")
                raise ValueError("the helper failed half way")
    assert sorted(d["id"] for d in new_db.documents()) == ["keep", "outer"]


def test_a_handle_writes_with_the_settings_another_handle_converted_to(new_db):
    """A handle opened before another's optimize(index=, codec=) kept writing hnsw/float16
    segments, and its next optimize merged everything back to them."""
    new_db.add(_docs("a", 1))
    with npmdb.open(new_db.path, progress=False) as other:
        other.optimize(index="exact", codec="int8")
    new_db.add(_docs("b", 1))
    assert new_db.config["dense"] == "faiss-flat" and new_db.config["codec"] == "int8"
    new_db.optimize()
    assert set(new_db.stats()["index"]) == {"faiss-flat"}


# -- 4. threads of one process, found by a hunt ---------------------------------------------


def test_a_ctrl_c_while_the_lock_is_taken_never_leaves_it_held(tmp_path, monkeypatch):
    """An interrupt after flock() but before the descriptor was recorded left the lock
    held (by a descriptor nothing closed) until the process ended: every later write of
    every handle and process was 'locked by another writer'."""
    from npmdb.storage.transaction import FileLock

    lock = FileLock(tmp_path)

    def interrupted(fd, length):
        raise KeyboardInterrupt
    monkeypatch.setattr(os, "ftruncate", interrupted)
    with pytest.raises(KeyboardInterrupt):
        lock.acquire(0.0)
    lock.release()
    monkeypatch.undo()
    other = FileLock(tmp_path)
    other.acquire(0.0)
    other.release()


def test_a_writer_thread_in_a_loop_does_not_starve_another(tmp_path, tiny_encoder):
    """Threads take the writer in turn: a thread adding in a loop let go and took it again
    before the waiting thread woke, whose delete then timed out."""
    with npmdb.open(tmp_path / "db", encoder=tiny_encoder, progress=False, timeout=5) as db:
        db.add(_docs("a", 2))
        stop = threading.Event()

        def loop():
            n = 0
            while not stop.is_set():
                db.add([{"id": f"l{n}", "text": "Thessaloniki is a city."}])
                n += 1
        t = threading.Thread(target=loop)
        t.start()
        try:
            time.sleep(0.5)
            t0 = time.monotonic()
            db.delete("a0")
            waited = time.monotonic() - t0
        finally:
            stop.set()
            t.join(60)
        assert db.get("a0") is None and waited < 5, waited


def test_closing_a_handle_stops_its_writing_thread_before_letting_go(tmp_path, tiny_encoder):
    """db.close() while another thread added released the file lock under it: the add
    wrote on beside another handle's writer, and its rollback removed a segment the other
    had committed (HEAD unreadable). Now the writing thread stops (InterfaceError, nothing
    committed) before the lock is let go, and the other handle's commit stays whole."""
    from npmdb.storage import transaction as T

    path = tmp_path / "db"
    with npmdb.open(path, encoder=tiny_encoder, progress=False) as db:
        db.add(_docs("a", 2))
    a = npmdb.open(path, progress=False)
    b = npmdb.open(path, progress=False, timeout=60)  # another worker's handle
    inside = threading.Event()
    allocate = T.Writer.allocate_segment

    def allocate_and_say(self):  # the real allocation; tells the test the add is under way
        seg = allocate(self)
        inside.set()
        time.sleep(0.3)
        return seg
    out: dict = {}

    def add():
        try:
            out["vid"] = a.add(_docs("t", 300))
        except npmdb.Error as exc:
            out["error"] = exc
    T.Writer.allocate_segment = allocate_and_say
    try:
        t = threading.Thread(target=add)
        t.start()
        assert inside.wait(60)
        a.close()
        T.Writer.allocate_segment = allocate
        b.add(_docs("b", 3))                 # while the closed handle's add would go on
        t.join(120)
    finally:
        T.Writer.allocate_segment = allocate
    assert isinstance(out.get("error"), npmdb.InterfaceError), out
    with b:
        assert b.count() == 5 and b.get("t0") is None
        assert b.check().ok


def test_a_documents_iterator_finished_on_another_thread(tmp_path, tiny_encoder):
    """A web server resumes a streamed iterator on whichever worker is free: the thread
    that finished it counted a transaction it never began (-1), the one that began it
    kept one (its map growth refused for good), and close() waited 60 s for nothing."""
    import queue

    db = npmdb.open(tmp_path / "db", encoder=tiny_encoder, progress=False)
    db.add(_docs("a", 20))
    jobs: queue.Queue = queue.Queue()
    done: queue.Queue = queue.Queue()

    def worker():
        while (job := jobs.get()) is not None:
            done.put(job())
    w = threading.Thread(target=worker)
    w.start()
    docs = db.documents()
    jobs.put(lambda: next(docs)["id"])
    assert done.get(timeout=60) == "a0"
    assert sum(1 for _ in docs) == 19            # finished on this thread
    gate = db.env._gate
    jobs.put(lambda: gate._own().n)
    assert (gate.live, gate._own().n, done.get(timeout=60)) == (0, 0, 0)
    jobs.put(None)
    w.join(60)
    t0 = time.monotonic()
    db.close()
    assert time.monotonic() - t0 < 5


def test_close_inside_the_own_batch_keeps_the_lock_for_its_end(tmp_path, tiny_encoder):
    """close() from the thread that holds the writer let go of the file lock at once: the
    batch's rollback then removed its segment without the lock, while another handle could
    be writing the same segment number."""
    from npmdb.storage.filelock import FileLock

    path = tmp_path / "db"
    with npmdb.open(path, encoder=tiny_encoder, progress=False) as db:
        db.add(_docs("a", 2))
    a = npmdb.open(path, progress=False)
    other = FileLock(path)
    with pytest.raises(RuntimeError, match="undo"):
        with a.batch():
            a.add(_docs("t", 5))
            a.close()
            with pytest.raises(npmdb.OperationalError, match="locked"):
                other.acquire(0.0)              # still this batch's
            raise RuntimeError("undo")
    other.acquire(0.0)                          # let go at the batch's end
    other.release()
    with npmdb.open(path, progress=False) as b:
        b.add(_docs("b", 3))
        assert b.count() == 5 and b.get("t0") is None and b.check().ok


def test_a_read_refused_while_its_map_is_adopted_leaves_the_gate_once(tmp_path, tiny_encoder,
                                                                      monkeypatch):
    """Another process grew the map, this thread left the gate to adopt the size, and a
    close() meanwhile refused its re-entry: the read left the gate a second time (live
    and the thread's count -1: a later remap would not wait for this thread's reads)."""
    import lmdb

    db = npmdb.open(tmp_path / "db", encoder=tiny_encoder, progress=False)
    db.add(_docs("a", 2))
    env, gate = db.env, db.env._gate
    begin, resize, calls = env._begin, gate.resize, []

    def grown_once(buffers):
        calls.append(1)
        if len(calls) == 1:
            raise lmdb.MapResizedError("another process grew the map")
        return begin(buffers)

    def resize_then_closed(*a, **kw):
        resize(*a, **kw)
        t = threading.Thread(target=gate.drain, args=(0.1,))  # another thread's close()
        t.start()
        t.join()
    monkeypatch.setattr(env, "_begin", grown_once)
    monkeypatch.setattr(gate, "resize", resize_then_closed)
    with pytest.raises(npmdb.InterfaceError):
        with env.read():
            pass
    assert (gate.live, gate._own().n) == (0, 0)
    monkeypatch.undo()
    db.close()
