"""Versioned snapshots: time travel, incremental segments, optimize, vacuum, crash safety,
concurrent readers (issue: versioned corpus snapshots)."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import npmdb
from npmdb.boundaries import fold

HERE = Path(__file__).resolve().parent


def _answers(res):
    return [(fold(a.text), round(a.score, 6), a.support) for a in res]


# -- time travel (TempLAMA-style, on real text) ------------------------------------------


def test_as_of_each_version_answers_its_own_fact(tmp_path, sample_corpus):
    """Version A states one fact, version B the same documents with the fact changed; the
    same query AS OF each version returns that version's answer, before and after vacuum."""
    base = [d for d in sample_corpus if d["id"].startswith("wn:")][:120]
    fact_a = {"id": "fact:capital", "title": "Freedonia",
              "text": "Freedonia (Republic of Freedonia): a small country whose capital is Alphaville."}
    fact_b = dict(fact_a, text="Freedonia (Republic of Freedonia): a small country whose "
                               "capital is Betatown since the 2021 reform.")
    q = "The capital of Freedonia is [MASK]."
    with npmdb.open(tmp_path / "db", progress=False) as db:
        db.add(base + [fact_a])
        db.tag("wiki-2019")
        db.update([fact_b])
        db.tag("wiki-2022")
        extra = [d for d in sample_corpus if d["id"].startswith("freedict")][:20]
        db.add(extra)  # untagged: vacuumed later
        db.delete([d["id"] for d in extra[:5]])
        for when, want in (("wiki-2019", "alphaville"), ("wiki-2022", "betatown")):
            # every phrase of the retrieved blocks (the untrained encoder ranks poorly; this
            # test is about which corpus answers, not about ranking)
            res = db.fill_mask(q, retrieval="bm25", version=when, top=200, blocks=2)
            texts = [fold(a.text) for a in res]
            assert want in texts, (when, texts)
            other = "betatown" if want == "alphaville" else "alphaville"
            assert other not in texts
            for a in res:
                for e in a.evidence:
                    assert e.doc_id in {d["id"] for d in base} | {"fact:capital"}
        diff = db.diff("wiki-2019", "wiki-2022")
        assert diff.changed == ("fact:capital",) and not diff.added and not diff.removed
        removed = db.vacuum()
        assert removed["versions"] >= 1
        for when, want in (("wiki-2019", "alphaville"), ("wiki-2022", "betatown")):
            texts = [fold(a.text) for a in db.fill_mask(q, retrieval="bm25", version=when,
                                                         top=200, blocks=2)]
            assert want in texts
        assert {t for v in db.versions() for t in v["tags"]} == {"wiki-2019", "wiki-2022"}


def test_checkout_is_read_only_and_restore_makes_a_new_version(new_db):
    v1 = new_db.add([{"id": "a", "text": "Salem is the capital of Oregon."}])
    new_db.delete("a")
    assert new_db.count() == 0
    view = new_db.checkout(v1)
    assert view.count() == 1 and view.get("a")["text"].startswith("Salem")
    with pytest.raises(npmdb.OperationalError, match="read-only"):
        view.add(["more text"])
    v3 = new_db.restore(v1)
    assert v3 > v1 and new_db.count() == 1 and new_db.get("a") is not None
    with pytest.raises(npmdb.ProgrammingError, match="no version or tag"):
        new_db.fill_mask("x [MASK]", version="nope", retrieval="dense")


def test_editing_what_a_read_returned_changes_nothing_stored(new_db):
    """Readers cache documents for every version that holds their segment; get(),
    documents() and SQL rows handed out the cached meta itself, so editing it changed old
    versions' answers and hid the change from diff()."""
    db = new_db
    db.add([{"id": "b", "text": "Bergen is in Norway.", "meta": {"year": "old", "tags": []}}])
    old = db.version
    d = db.get("b")
    d["meta"]["year"] = 1990
    d["meta"]["tags"].append("x")
    for row in db.documents():
        row["meta"]["year"] = "edited"
    db.sql("SELECT id, doc.meta FROM DOCUMENTS").rows[0][1]["year"] = "edited too"
    assert db.get("b")["meta"] == {"year": "old", "tags": []}
    new = db.update([d])
    assert db.get("b", version=old)["meta"] == {"year": "old", "tags": []}
    assert db.get("b")["meta"] == {"year": 1990, "tags": ["x"]}
    assert db.diff(old, new).changed == ("b",)
    assert db.sql(f"SELECT id FROM DOCUMENTS AS OF {old} WHERE doc.meta.year = 1990").rows == ()


def test_diff_of_unchanged_documents_whose_meta_holds_nan(new_db):
    new_db.add([{"id": "a", "text": "Paris is in France.", "meta": {"year": float("nan")}}])
    first = new_db.version
    new_db.add(["Oslo is in Norway."])
    new_db.optimize()  # rewrites "a": another stored copy of the same NaN
    d = new_db.diff(first)
    assert d.changed == () and d.removed == () and len(d.added) == 1


def test_batch_groups_changes_into_one_version(new_db):
    v0 = new_db.add(["one document", "two documents"])
    with new_db.batch():
        new_db.add([{"id": "x", "text": "Rome is in Italy."}])
        new_db.add([{"id": "y", "text": "Paris is in France."}])
        new_db.delete("x")
    assert new_db.version == v0 + 1
    assert new_db.get("x") is None and new_db.get("y") is not None
    assert len(new_db.versions()) == 2


def test_batch_rolls_back_on_error(new_db):
    new_db.add([{"id": "keep", "text": "Oslo is in Norway."}])
    before = (new_db.version, new_db.count())
    with pytest.raises(npmdb.IntegrityError):
        with new_db.batch():
            new_db.add([{"id": "new", "text": "Bern is in Switzerland."}])
            new_db.add([{"id": "keep", "text": "duplicate"}])
    assert (new_db.version, new_db.count()) == before
    assert new_db.get("new") is None
    segs = sorted(p.name for p in (new_db.path / "segments").iterdir())
    assert segs == ["s000001"], segs


# -- segments fan out and merge exactly ---------------------------------------------------


def test_many_small_adds_equal_one_add_and_optimize(tmp_path, tiny_encoder, sample_corpus,
                                                    sample_cloze):
    docs = sample_corpus[:300]
    queries = [c["query"] for c in sample_cloze[:12]]
    with npmdb.open(tmp_path / "one", encoder=tiny_encoder, progress=False) as one, \
            npmdb.open(tmp_path / "many", encoder=tiny_encoder, progress=False) as many:
        one.add(docs)
        for i in range(0, len(docs), 40):
            many.add(docs[i:i + 40])
        assert len(many.versions()) == 8
        for mode in ("phrase", "token"):
            for q in queries:
                a = one.fill_mask(q, exact=True, k=256, mode=mode, top=10)
                b = many.fill_mask(q, exact=True, k=256, mode=mode, top=10)
                assert _answers(a) == _answers(b), q
        many.delete([d["id"] for d in docs[:25]])
        one_minus = npmdb.open(tmp_path / "one-minus", encoder=tiny_encoder, progress=False)
        with one_minus:
            one_minus.add(docs[25:])
            before = {q: _answers(many.fill_mask(q, exact=True, k=256, top=10)) for q in queries}
            many.optimize()
            assert many.stats()["segments"] == 1
            for q in queries:
                ref = _answers(one_minus.fill_mask(q, exact=True, k=256, top=10))
                assert _answers(many.fill_mask(q, exact=True, k=256, top=10)) == ref == before[q]
            # the ANN index of the merged segment answers too
            assert many.fill_mask(queries[0], retrieval="dense").answers


def test_deleted_documents_never_answer(new_db, sample_corpus):
    new_db.add(sample_corpus[:80])
    gone = [d["id"] for d in sample_corpus[:40]]
    new_db.delete(gone)
    for retrieval in ("dense", "bm25", "hybrid"):
        for q in ("Spain is a country in [MASK].", "The capital is [MASK]."):
            res = new_db.fill_mask(q, retrieval=retrieval, top=20, k=64, evidence=50)
            for a in res:
                assert all(e.doc_id not in gone for e in a.evidence)


# -- crash safety --------------------------------------------------------------------------


def _live_ids(db) -> set[str]:
    return {d["id"] for d in db.documents()}


def _parse_log(path: Path):
    """Committed state (set of live ids) and the in-flight change, from a child's log."""
    committed: set[str] = set()
    inflight = None
    if not path.exists():
        return committed, inflight
    for line in path.read_text().splitlines():
        kind, op, payload = line.split(" ", 2)
        if kind == "BEGIN":
            inflight = (op, json.loads(payload))
        elif kind == "COMMIT":
            committed = _apply(committed, inflight)
            inflight = None
    return committed, inflight


def _apply(state: set[str], change) -> set[str]:
    if change is None:
        return state
    op, arg = change
    if op == "add":
        return state | set(arg)
    if op == "delete":
        return state - set(arg)
    if op == "batch":
        return (state | set(arg["add"])) - set(arg["delete"])
    return state


def _check_clean(db) -> None:
    from npmdb.storage import format as F
    from npmdb.storage import versions as V

    seg_root = db.path / "segments"
    with db.env.read() as txn:
        records = {F.read_u32(bytes(k)) for k in
                   txn.cursor(db=db.env.dbs["segments"]).iternext(values=False)}
        nxt = int(V.get_meta(txn, db.env.dbs, "next_segment", 1))
        assert not V.get_meta(txn, db.env.dbs, "trash", [])
        for k in txn.cursor(db=db.env.dbs["vectors"]).iternext(values=False):
            assert F.read_u32(bytes(k), 4) < nxt
        head = V.head(txn, db.env.dbs)
    if seg_root.exists():
        for p in seg_root.iterdir():
            assert not p.name.startswith("tmp-"), p
            assert int(p.name[1:]) in records, f"orphan segment dir {p.name}"
    if head is not None:
        for s in head.segments:
            assert s in records


@pytest.mark.slow
def test_sigkill_at_random_points_never_loses_or_tears(tmp_path, tiny_encoder):
    """>= 50 trials: SIGKILL a writer during add/delete/batch/optimize/vacuum; reopen and
    check that HEAD is a complete version holding exactly the committed changes (or the
    in-flight one, if its commit landed), every committed document answers, and no
    orphaned file or record survives the next writer's open."""
    trials = int(os.environ.get("NPMDB_CRASH_TRIALS", "50"))
    db_path = tmp_path / "db"
    with npmdb.open(db_path, encoder=tiny_encoder, progress=False) as db:
        db.add([{"id": "seed-0", "text": "Salem is the capital of Oregon."}])
    log = Path(str(db_path) + ".log")
    log.write_text('BEGIN add ["seed-0"]\nCOMMIT add 1\n')
    proc = subprocess.Popen([sys.executable, str(HERE / "crash_worker.py"), str(db_path),
                             str(tiny_encoder)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=dict(os.environ, TOKENIZERS_PARALLELISM="false"))
    try:
        assert proc.stdout.readline().strip() == "READY"
        rng = random.Random(7)
        killed = 0
        for n in range(trials):
            proc.stdin.write(f"TRIAL {n} {rng.randint(5, 900)} {1000 + n}\n")
            proc.stdin.flush()
            line = proc.stdout.readline().split()
            assert line[:2] == ["DONE", str(n)], line
            killed += int(line[2])
            committed, inflight = _parse_log(log)
            with npmdb.open(db_path, progress=False) as db:  # a writer open runs recovery
                live = _live_ids(db)
                allowed = [committed, _apply(committed, inflight)]
                assert live in allowed, (n, inflight, live ^ committed)
                if live != committed:  # the in-flight change did commit: adopt it
                    committed = live
                    with open(log, "a") as fh:
                        fh.write(f"COMMIT recovered {db.version}\n")
                assert db.count() == len(live)
                _check_clean(db)
                some = sorted(live)[:3]
                for did in some:
                    assert db.get(did) is not None
                if live:
                    res = db.fill_mask("Salem is the capital of [MASK].", retrieval="bm25",
                                       top=3)
                    assert res.version == db.version
        assert killed >= trials // 3, f"only {killed} of {trials} trials were killed mid-run"
    finally:
        proc.stdin.write("QUIT\n")
        proc.stdin.flush()
        proc.wait(timeout=30)


# -- concurrency ---------------------------------------------------------------------------


def _reader(path: str, seconds: float, out) -> None:
    import npmdb as _npmdb

    served, errors, versions = 0, [], set()
    deadline = time.time() + seconds
    with _npmdb.open(path, readonly=True, progress=False) as db:
        while time.time() < deadline:
            try:
                with db.snapshot() as snap:
                    m = snap.manifest
                    n = sum(s.record.docs - len(m.deleted.get(s.seg, ()))
                            for s in snap.segments)
                    if n != m.stats["docs"]:
                        errors.append(f"torn version {m.id}: {n} != {m.stats['docs']}")
                res = db.fill_mask("Rome is the capital of [MASK].", retrieval="bm25", top=3)
                versions.add(res.version)
                served += 1
            except Exception as exc:  # noqa: BLE001
                errors.append(f"{type(exc).__name__}: {exc}")
    out.put((served, errors, sorted(versions)))


def test_readers_in_other_processes_never_see_errors_or_torn_versions(tmp_path, tiny_encoder,
                                                                       sample_corpus):
    path = tmp_path / "db"
    with npmdb.open(path, encoder=tiny_encoder, progress=False) as db:
        db.add(sample_corpus[:50])
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    readers = [ctx.Process(target=_reader, args=(str(path), 12.0, q)) for _ in range(2)]
    for r in readers:
        r.start()
    time.sleep(4.0)  # let the readers import and start
    with npmdb.open(path, progress=False) as db:
        for i in range(8):
            db.add(sample_corpus[50 + 20 * i: 70 + 20 * i])
            db.delete([sample_corpus[50 + 20 * i]["id"]])
        second = npmdb.open(path, progress=False)
        with second, pytest.raises(npmdb.OperationalError, match="locked by another writer"):
            with db.batch():
                second.add(["concurrent writer"])
    results = [q.get(timeout=60) for _ in readers]
    for r in readers:
        r.join(timeout=30)
    for served, errors, versions in results:
        assert not errors, errors[:3]
        assert served > 0


def test_parallel_segment_search_equals_serial(tmp_path, tiny_encoder, sample_corpus,
                                               sample_cloze, monkeypatch):
    """Per-segment ANN and BM25 searches run in a thread pool; results are identical to
    running them one segment after another."""
    from npmdb.query import operators

    with npmdb.open(tmp_path / "db", encoder=tiny_encoder, progress=False) as db:
        for i in range(0, 200, 40):
            db.add(sample_corpus[i:i + 40])
        queries = [c["query"] for c in sample_cloze[:10]]
        runs = []
        for serial in (False, True):
            if serial:
                monkeypatch.setattr(operators, "per_segment",
                                    lambda fn, n: [fn(si) for si in range(n)])
            runs.append([_answers(db.fill_mask(q, retrieval=r, mode=m, k=128, top=10))
                         for q in queries for r in ("dense", "bm25", "hybrid")
                         for m in ("phrase", "token")])
        assert runs[0] == runs[1]


def _old_snapshot_reader(path: str, ready, go, out) -> None:
    """Holds a snapshot from before a vacuum, then answers from it after the vacuum."""
    import npmdb as _npmdb
    from npmdb.query.physical import ExecState
    from npmdb.query.planner import plan_masked
    from npmdb.query.spec import MaskedSpec

    try:
        with _npmdb.open(path, readonly=True, progress=False) as db:
            with db.snapshot() as snap:   # nothing loaded yet: indexes open lazily
                ready.set()
                go.wait(120)
                text = "Rome is the capital of [MASK]."
                for retrieval in ("bm25", "dense"):
                    st = plan_masked(MaskedSpec(text, top=3, retrieval=retrieval)).run(
                        ExecState(snap, text))
                    assert st.groups, retrieval
                out.put(("ok", snap.manifest.id, sorted(s.seg for s in snap.segments)))
    except Exception as exc:  # noqa: BLE001 - reported to the test
        out.put(("error", f"{type(exc).__name__}: {exc}", None))


def test_vacuum_keeps_files_a_live_reader_in_another_process_still_needs(tmp_path, tiny_encoder,
                                                                         sample_corpus):
    path = tmp_path / "db"
    with npmdb.open(path, encoder=tiny_encoder, progress=False) as db:
        db.add(sample_corpus[:40])
        db.add(sample_corpus[40:80])
    ctx = mp.get_context("spawn")
    ready, go, out = ctx.Event(), ctx.Event(), ctx.Queue()
    reader = ctx.Process(target=_old_snapshot_reader, args=(str(path), ready, go, out))
    reader.start()
    try:
        assert ready.wait(120), "the reader did not start"
        with npmdb.open(path, progress=False) as db:
            db.optimize()                       # HEAD: one merged segment
            db.vacuum()                         # segments 1 and 2 are no longer referenced
            seg_dirs = {p.name for p in (path / "segments").iterdir()}
            assert {"s000001", "s000002"} <= seg_dirs   # kept: the reader's snapshot uses them
            assert not db.check().errors
        go.set()
        status, detail, segs = out.get(timeout=120)
        assert status == "ok", detail
        assert segs == [1, 2]
    finally:
        go.set()
        reader.join(timeout=60)
    with npmdb.open(path, progress=False) as db:  # the reader is gone: the next writer cleans
        assert not {"s000001", "s000002"} & {p.name for p in (path / "segments").iterdir()}
        assert db.check().clean
        assert db.fill_mask("Rome is the capital of [MASK].", top=1, retrieval="dense").answers


def test_an_existing_tag_moves_only_when_asked(tmp_path, tiny_encoder, capsys):
    """A tag keeps its version through vacuum, so tagging another version with the same
    name is refused (nothing changes, the version stays kept) unless ``move=True`` (the
    CLI's ``--move``, the API's ``"move": true``); the same version again is a no-op."""
    from npmdb.cli import main

    path = tmp_path / "db"
    with npmdb.open(path, encoder=tiny_encoder, progress=False) as db:
        db.add([{"id": "a", "text": "Oslo is the capital of Norway."}])
        assert db.tag("release") == 1
        db.add([{"id": "b", "text": "Bergen is a city in Norway."}])
        with pytest.raises(npmdb.IntegrityError, match=r"already names version 1.*move=True"):
            db.tag("release")
        assert db.tag("release", 1) == 1  # the same version: a no-op
        db.vacuum()
        assert [v["id"] for v in db.versions()] == [1, 2]  # version 1 is still kept
        assert db.checkout("release").count() == 1
        with pytest.raises(npmdb.ProgrammingError, match="move must be True or False"):
            db.tag("release", move="yes")
    assert main(["tag", str(path), "release"]) == 2
    assert "already names version 1" in capsys.readouterr().err
    assert main(["tag", str(path), "release", "--move"]) == 0
    assert "tagged version 2 as 'release'" in capsys.readouterr().out
    with npmdb.open(path, progress=False) as db:
        db.vacuum()
        assert [v["id"] for v in db.versions()] == [2]
        assert db.checkout("release").count() == 2


def test_a_view_checks_a_version_given_to_it(tmp_path, tiny_encoder):
    """A view of version 1 takes version=1, its tag or None; 1.0 and True are refused as
    they are everywhere (True == 1 and 1.0 == 1 in Python)."""
    with npmdb.open(tmp_path / "db", encoder=tiny_encoder, progress=False) as db:
        db.add(["Oslo is the capital of Norway."])
        db.tag("one")
        view = db.checkout(1)
        for ok in (None, 1, "1", "one"):
            assert view.fill_mask("Oslo is the capital of [MASK].", version=ok).version == 1
        for bad in (1.0, True):
            with pytest.raises(npmdb.ProgrammingError, match="version reference"):
                view.fill_mask("Oslo is the capital of [MASK].", version=bad)


def test_a_tag_is_removed_and_its_version_goes_at_the_next_vacuum(tmp_path, tiny_encoder,
                                                                  capsys):
    """``db.untag`` (``npmdb tag --delete``) removes a name; the version it kept stays
    until a vacuum finds nothing else keeping it."""
    from npmdb.cli import main

    path = tmp_path / "db"
    with npmdb.open(path, encoder=tiny_encoder, progress=False) as db:
        db.add([{"id": "a", "text": "Oslo is the capital of Norway."}])
        db.tag("first")
        db.tag("also-first")
        db.add([{"id": "b", "text": "Bergen is a city in Norway."}])
        assert db.untag("first") == 1
        with pytest.raises(npmdb.ProgrammingError, match="no tag named 'first'; did you mean "
                                                         "'also-first'"):
            db.untag("first")
        with pytest.raises(npmdb.ProgrammingError, match="a tag name is a str"):
            db.untag(1)
        db.vacuum()
        assert [v["id"] for v in db.versions()] == [1, 2]  # "also-first" still keeps it
    assert main(["tag", str(path), "also-first", "--delete", "--version", "2"]) == 2
    assert "--delete takes only the tag name" in capsys.readouterr().err
    assert main(["tag", str(path), "also-first", "--delete"]) == 0
    assert "removed tag 'also-first' (it named version 1)" in capsys.readouterr().out
    assert main(["tag", str(path), "also-first", "--delete"]) == 2
    assert "no tag named 'also-first'; no tags exist yet" in capsys.readouterr().err
    with npmdb.open(path, progress=False) as db:
        db.vacuum()
        assert [v["id"] for v in db.versions()] == [2]


def test_version_references_typed_as_text(tmp_path, tiny_encoder):
    """A digit string is a version id only in ASCII and within u64; anything else is an
    unknown tag or version, a ProgrammingError, never an overflow or a ValueError."""
    with npmdb.open(tmp_path / "db", encoder=tiny_encoder, progress=False) as db:
        db.add([{"id": "a", "text": "Oslo is the capital of Norway."}])
        assert db.checkout("1").version == 1
        for ref in ("99999999999999999999999", "²", "١", 2 ** 64):
            with pytest.raises(npmdb.ProgrammingError, match="no version"):
                db.checkout(ref)
            with pytest.raises(npmdb.ProgrammingError, match="no version"):
                db.restore(ref)
        with pytest.raises(npmdb.ProgrammingError, match="no version"):
            db.sql("SELECT phrase FROM MASKED('Oslo is in [MASK].') AS OF ?",
                   ["99999999999999999999999"])
        with pytest.raises(npmdb.ProgrammingError, match="keep_tags must be True or False"):
            db.vacuum(keep_tags=None)
        assert [v["id"] for v in db.versions()] == [1]


def test_batch_refuses_what_it_cannot_see(tmp_path, tiny_encoder):
    """Inside a batch with uncommitted changes, tagging HEAD (the version before the batch)
    and optimize (before merging anything) are refused; update returns None there, as add
    and delete do."""
    with npmdb.open(tmp_path / "db", encoder=tiny_encoder, progress=False) as db:
        db.add([{"id": "a", "text": "Oslo is the capital of Norway."}])
        db.add([{"id": "b", "text": "Bergen is a city in Norway."}])
        with db.batch():
            assert db.update([{"id": "a", "text": "Oslo is a city in Norway."}]) is None
            with pytest.raises(npmdb.ProgrammingError, match="tag after the batch"):
                db.tag("with-update")
            assert db.tag("before", 2) == 2  # a named, committed version is fine
            with pytest.raises(npmdb.ProgrammingError, match="run it after the batch"):
                db.optimize()
        assert db.version == 3 and db.get("a", version=3)["text"] == "Oslo is a city in Norway."
        assert db.check().clean  # optimize left no merged segment behind
        assert db.update([{"id": "b", "text": "Bergen is a port."}]) == 4


def test_every_write_of_a_checkout_view_is_read_only(tmp_path, tiny_encoder):
    """``untag`` and ``write_generation`` too: an AttributeError before."""
    with npmdb.open(tmp_path / "db", encoder=tiny_encoder, progress=False) as db:
        db.add(["Oslo is the capital of Norway."])
        db.tag("first")
        view = db.checkout("first")
        for write, args in [("add", (["x"],)), ("delete", ("x",)), ("update", ([],)),
                            ("tag", ("t",)), ("untag", ("first",)), ("optimize", ()),
                            ("vacuum", ()), ("restore", (1,)), ("batch", ()),
                            ("write_generation", (None,))]:
            with pytest.raises(npmdb.OperationalError, match="read-only snapshot"):
                getattr(view, write)(*args)
        assert db.versions()[-1]["tags"] == ["first"] and db.version == 1


def test_a_checkout_view_reads_its_version(tmp_path, tiny_encoder):
    """A view takes its own version by id or tag, refuses another, and runs SQL on itself."""
    with npmdb.open(tmp_path / "db", encoder=tiny_encoder, progress=False) as db:
        db.add([{"id": "a", "text": "Oslo is the capital of Norway."}])
        db.tag("first")
        db.add([{"id": "b", "text": "Bergen is a city in Norway."}])
        view = db.checkout("first")
        q = "Oslo is the capital of [MASK]."
        assert view.fill_mask(q, version="first").version == 1
        with pytest.raises(npmdb.ProgrammingError, match="this view is of version 1"):
            view.fill_mask(q, version=2)
        res = view.sql("SELECT phrase FROM MASKED(?) LIMIT 3", [q])
        assert res.version == 1
        assert view.sql("SELECT phrase FROM MASKED(?) AS OF 'first'", [q]).version == 1
        with pytest.raises(npmdb.ProgrammingError, match="this view is of version 1"):
            view.sql("SELECT phrase FROM MASKED(?) AS OF 2", [q])


# ---------------------------------------------------------------- write_generation's inputs

@pytest.fixture()
def small_db(tmp_path, tiny_encoder, sample_corpus):
    with npmdb.open(tmp_path / "db", encoder=tiny_encoder, progress=False) as db:
        db.add(sample_corpus[:30])
        yield db


def _bert(hidden=32, vocab=30522, positions=512):
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    return BertModel(BertConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=1,
                                num_attention_heads=2, intermediate_size=hidden,
                                max_position_embeddings=positions))


@pytest.mark.parametrize("kw, error, message", [
    ({"model": None}, npmdb.ProgrammingError, "takes a transformers model"),
    ({"model": "wrong-width"}, npmdb.ProgrammingError, "hidden size is 64 and the database's "
                                                       "vectors are 32 wide"),
    ({"model": "small-vocabulary"}, npmdb.ProgrammingError, "vocabulary holds 1000 tokens"),
    ({"model": "few-positions"}, npmdb.ProgrammingError, "takes 64 positions"),
    ({"steps": "x"}, npmdb.ProgrammingError, "steps"),
    ({"steps": -1}, npmdb.ProgrammingError, "steps"),
    ({"info": 5}, npmdb.ProgrammingError, "info must be a dict"),
    ({"info": {"a": {1, 2}}}, npmdb.ProgrammingError, "info cannot be stored"),
    ({"tag": ""}, npmdb.ProgrammingError, "invalid tag name"),
    ({"tag": "7"}, npmdb.ProgrammingError, "invalid tag name"),
    ({"tag": "first"}, npmdb.IntegrityError, "tag 'first' already names version 1"),
])
def test_write_generation_refuses_bad_input_before_any_work(small_db, kw, error, message):
    """A model that does not fit the database (it used to commit vectors of another width,
    breaking every query at HEAD while check() said ok) and bad arguments are refused before
    anything is encoded; nothing is written."""
    small_db.tag("first")
    models = {"wrong-width": _bert(hidden=64), "small-vocabulary": _bert(vocab=1000),
              "few-positions": _bert(positions=64)}
    kw = dict(kw)
    model = kw.pop("model", "ok")
    model = models.get(model, _bert() if model == "ok" else model)
    before = small_db.versions()
    with pytest.raises(error, match=message):
        small_db.write_generation(model, **kw)
    assert small_db.versions() == before
    assert not (small_db.path / "encoders" / "g1").exists()
    assert small_db.check().ok


def test_write_generation_moves_a_tag_only_when_asked(small_db):
    small_db.tag("release")
    vid, _ = small_db.write_generation(_bert(), tag="release", move=True)
    assert small_db.checkout("release").version == vid
    assert small_db.check().ok


@pytest.mark.parametrize("name", ["HEAD ", " v1", "v1 ", "\t", "a\nb", "a\x00b"])
def test_tag_names_with_edge_white_space_or_control_characters_are_refused(small_db, name):
    with pytest.raises(npmdb.ProgrammingError, match="invalid tag name"):
        small_db.tag(name)
    assert small_db.sql("SHOW TAGS").rows == ()


def test_a_view_reads_as_its_database_does(small_db, sample_corpus):
    first = small_db.version
    small_db.add(sample_corpus[30:35])
    view = small_db.checkout(first)
    doc = sample_corpus[0]["id"]
    assert view.get(doc, version=first) == small_db.get(doc, version=first)
    assert view.count(first) == len(view) == 30
    assert len(list(view.documents(version=first))) == 30
    with pytest.raises(npmdb.ProgrammingError, match="this view is of version"):
        view.count(small_db.version)
    assert view.versions() == small_db.versions()
    assert len(view.diff(small_db.version).removed) == 5  # from HEAD back to the view


def test_an_empty_database_reads_as_empty(tmp_path, tiny_encoder):
    with npmdb.open(tmp_path / "db", encoder=tiny_encoder, progress=False) as db:
        assert db.get("x") is None and list(db.documents()) == [] and len(db) == 0


def test_an_os_error_before_the_change_says_nothing_was_committed(small_db):
    """A leftover that recovery cannot remove fails the next change before it starts: the
    message must not claim a commit."""
    (small_db.path / "encoders").write_text("not a directory")
    before = small_db.versions()
    with pytest.raises(npmdb.OperationalError, match="the change was not committed"):
        small_db.add(["Another document."])
    assert small_db.versions() == before


def _deleted_files_under(path: Path) -> set[str]:
    """Files under ``path`` that this process still maps or holds open after their removal."""
    held = set()
    root = str(path.resolve())
    for line in Path("/proc/self/maps").read_text().splitlines():
        if line.endswith(" (deleted)") and root in line:
            held.add(line.split(None, 5)[-1])
    for fd in Path("/proc/self/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.endswith(" (deleted)") and target.startswith(root):
            held.add(target)
    return held


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs Linux /proc")
def test_a_long_lived_reader_lets_go_of_what_another_handle_vacuumed(tmp_path, tiny_encoder,
                                                                     sample_corpus):
    """A read handle kept open beside a writer (``npmdb serve``) drops the segments and
    embedding generations a vacuum removed at its next query: it held their files (disk
    space never returned) and their indexes (memory) until it was closed."""
    path = tmp_path / "db"
    with npmdb.open(path, encoder=tiny_encoder, progress=False) as db:
        db.add(sample_corpus[:40])
        db.add(sample_corpus[40:80])
    q = "Rome is the capital of [MASK]."
    with npmdb.open(path, progress=False) as reader:
        for retrieval in ("bm25", "dense"):
            assert reader.fill_mask(q, retrieval=retrieval, top=3).answers
        with npmdb.open(path, progress=False) as db:
            db.optimize()
            db.vacuum()
        assert not (path / "segments" / "s000001").exists()
        after = reader.fill_mask(q, retrieval="dense", top=3)
        assert after.answers
        assert not _deleted_files_under(path)
        with reader.snapshot() as snap:
            head = {s.seg for s in snap.segments}
        assert set(reader._readers._readers) == head
    with npmdb.open(path, progress=False) as fresh:
        assert [a.text for a in after] == [a.text for a in fresh.fill_mask(
            q, retrieval="dense", top=3)]


def test_a_long_lived_reader_lets_go_of_a_vacuumed_embedding_generation(tmp_path, tiny_encoder,
                                                                        sample_corpus):
    """A new embedding generation (a training refresh) and a vacuum in another handle: the
    read handle's next query drops the old generation's loaded dense indexes."""
    from transformers import AutoModel

    path = tmp_path / "db"
    with npmdb.open(path, encoder=tiny_encoder, progress=False) as db:
        db.add(sample_corpus[:30])
    q = "Rome is the capital of [MASK]."
    with npmdb.open(path, progress=False) as reader:
        assert reader.fill_mask(q, retrieval="dense", top=3).answers
        (seg,) = reader._readers._readers.values()
        assert {g for g, _ in seg._dense} == {0}
        for _ in range(3):  # each refresh's encoder and checkpoint too (one model each)
            with npmdb.open(path, progress=False) as db:
                _, gen = db.write_generation(AutoModel.from_pretrained(tiny_encoder))
                db.vacuum()
            assert reader.fill_mask(q, retrieval="dense", top=3).answers
            assert {g for g, _ in seg._dense} == {gen}
            assert all(g == gen for g, _ in seg._located)
            assert set(reader._encoders._cache) <= {0, gen}
            assert not _deleted_files_under(path)


def test_diff_sees_a_meta_value_that_changed_type(new_db):
    """3 → 3.0 and True → 1 are changes (``==`` called them equal); keys in another order
    are not."""
    new_db.add([{"id": "a", "text": "Paris is in France.", "meta": {"n": 3, "flag": True}},
                {"id": "b", "text": "Oslo is in Norway.", "meta": {"x": 1, "y": [1, 2.5]}}])
    first = new_db.version
    new_db.update([{"id": "a", "text": "Paris is in France.", "meta": {"n": 3.0, "flag": 1}},
                   {"id": "b", "text": "Oslo is in Norway.", "meta": {"y": [1, 2.5], "x": 1}}])
    assert new_db.diff(first).changed == ("a",)
