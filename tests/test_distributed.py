"""Distributed ingest (npmdb.distributed): Ray Data workers encode, the driver commits once.

The Ray tests start a local cluster (``ray.init(num_cpus=2)``) and are skipped where the
optional ``npmdb[ray]`` extra is not installed; the rest run everywhere.
"""

from __future__ import annotations

import copy
import itertools
import json
import os
import shutil
import signal
import sys
from contextlib import contextmanager

import numpy as np
import pytest

import npmdb
from npmdb.corpus import Document
from npmdb.distributed import RayEngine, encode_piece, resolve_engine
from npmdb.ingest import ray_workers
from npmdb.ingest.ray import _Planner, _waves

QUERIES = ["Salem is the capital of [MASK].", "Thessaloniki is a city in [MASK].",
           "The currency of Japan is the [MASK].", "A gorgeous, witty film. It was [MASK]."]
RETRIEVALS = [dict(retrieval="dense"), dict(retrieval="dense", exact=True),
              dict(retrieval="bm25"), dict(retrieval="hybrid", k=256),
              dict(retrieval="dense", mode="token")]


def _docs(sample_corpus, n=240):
    docs = [dict(d) for d in sample_corpus[:n]]
    for d in docs[5:25]:  # some documents get their ids from the database
        d.pop("id")
    return docs


# -- without Ray --------------------------------------------------------------------------


def test_missing_ray_names_the_extra(new_db, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(npmdb.NotSupportedError, match=r"npmdb\[ray\]"):
        new_db.add(["some text"], engine="ray")
    with pytest.raises(npmdb.NotSupportedError, match=r"npmdb\[ray\]"):
        new_db.add(["some text"], engine=RayEngine(workers=2))
    assert new_db.count() == 0 and new_db.versions() == []


def test_cli_missing_ray_fails_before_creating(tmp_path, monkeypatch, capsys):
    from npmdb.cli import main

    monkeypatch.setitem(sys.modules, "ray", None)
    src = tmp_path / "docs.txt"
    src.write_text("one document\n")
    assert main(["add", str(tmp_path / "db"), str(src), "--ray", "-q"]) == 2
    assert "npmdb[ray]" in capsys.readouterr().err
    assert not (tmp_path / "db").exists()
    assert main(["add", str(tmp_path / "db"), str(src), "--workers", "2", "-q"]) == 2


def test_engine_argument_is_checked(new_db):
    with pytest.raises(npmdb.ProgrammingError, match="engine must be"):
        new_db.add(["x"], engine="spark")
    with pytest.raises(npmdb.ProgrammingError, match="piece_docs"):
        RayEngine(piece_docs=0)
    with pytest.raises(npmdb.ProgrammingError, match="workers"):
        RayEngine(workers=0)
    with pytest.raises(npmdb.ProgrammingError, match="engine must be"):
        resolve_engine(object())


def test_encode_piece_is_the_local_pipeline(tiny_db, sample_corpus):
    """A worker's piece: the local prepare() columns and the stored (codec) vectors."""
    from npmdb.ingest import prepare
    from npmdb.storage.codec import get_codec

    enc = tiny_db.encoder
    texts = [d["text"] for d in sample_corpus[:40]]
    out = encode_piece(enc, {"texts": texts}, 256)
    prep = prepare(enc, [Document(str(i), "", t, {}) for i, t in enumerate(texts)], 256)
    for name, col in prep.columns().items():
        assert np.array_equal(out[name], col), name
    blocks = [prep.block(b) for b in range(prep.n_blocks)]
    want = get_codec("float16").encode(np.concatenate(enc.encode_blocks(blocks)))
    assert out["vectors"].dtype == np.float16 and out["vectors"].shape == want.shape
    np.testing.assert_allclose(out["vectors"].astype(np.float32), want.astype(np.float32),
                               rtol=2e-3, atol=2e-3)
    again = encode_piece(enc, {"tokens": prep.tokens, "block_ptr": prep.block_ptr}, 256)
    assert set(again) == {"vectors", "stats"}
    np.testing.assert_array_equal(again["vectors"], out["vectors"])
    assert out["stats"]["tokens"] == len(prep.tokens)


def test_planner_cuts_pieces_and_segments(new_db):
    docs = [Document(f"d{i}", "", "x" * (10 + i), {}) for i in range(23)]
    eng = RayEngine(piece_docs=4, segment_docs=10, segment_chars=10_000)
    pieces = []
    with new_db.batch() as writer:
        planner = _Planner(writer, eng, itertools.count(7).__next__)
        for wave, last in _waves(docs, wave_chars=100):
            pieces += list(planner.cut(planner.assign_ids(wave)))
            if last:
                pieces += list(planner.end())
        with pytest.raises(npmdb.IntegrityError, match="duplicate"):
            planner.assign_ids([Document("d3", "", "again", {})])
    assert [d.id for p in pieces for d in p.docs] == [d.id for d in docs]
    assert [p.seg for p in pieces if p.last] == [7, 8, 9]
    by_seg = {}
    for p in pieces:
        assert 1 <= len(p.docs) <= 4
        by_seg.setdefault(p.seg, []).extend(p.docs)
    assert [len(v) for v in by_seg.values()] == [10, 10, 3]
    assert list(_waves([], 10)) == [([], True)]


def test_worker_restarts_is_checked():
    with pytest.raises(npmdb.ProgrammingError, match="worker_restarts"):
        RayEngine(worker_restarts=-1)
    assert RayEngine().worker_restarts == 2


def test_worker_failure_message_names_the_user_exception_without_escapes():
    """What the driver gets of an exception raised in an actor is Ray's wrapper, whose text
    holds the worker's (coloured) traceback: the message names the original exception."""
    class RayTaskError(Exception):  # stands in for ray.exceptions.RayTaskError
        pass

    RayTaskError.__module__ = "ray.exceptions"
    text = ("\x1b[36mray::MapWorker(MapBatches(_EncodeWorker)).submit()\x1b[39m (pid=1)\n"
            "  File \"w.py\", line 3, in __call__\n    raise ValueError(\"bad piece\")\n"
            "ValueError: bad piece\n\nThe above exception was the direct cause of the "
            "following exception:\n\n\x1b[36mray::MapWorker\x1b[39m (pid=1)\n"
            "ray.exceptions.UserCodeException: UDF failed to process a data block.\n")
    with pytest.raises(npmdb.OperationalError) as info:
        with ray_workers._ray_errors("encoding"):
            raise RayTaskError(text)
    msg = str(info.value)
    assert "ValueError: bad piece" in msg and "\x1b" not in msg, msg


# -- with a local Ray cluster ---------------------------------------------------------------


FAULT_MARKER = "npmdb-test-fault-marker"


def _faulty_worker(fault):
    """The encoder actor class, calling ``fault()`` on a piece whose text holds
    FAULT_MARKER (a local class: Ray pickles it by value, so the actors run it)."""
    class Faulty(ray_workers._EncodeWorker):
        def __call__(self, batch):
            if any(FAULT_MARKER.encode() in bytes(p) for p in batch["payload"]):
                fault()
            return super().__call__(batch)

    return Faulty


class _Hung(BaseException):  # not an Exception: nothing on the way translates it
    pass


@contextmanager
def _deadline(seconds: int):
    def hung(signum, frame):
        raise _Hung(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _add_with_a_fault(db, tmp_path, sample_corpus, monkeypatch, fault) -> npmdb.Error:
    """A Ray add whose piece with FAULT_MARKER calls ``fault()`` in its actor: returns the
    error, having checked that nothing was committed and that the next add works."""
    monkeypatch.setattr(ray_workers, "_EncodeWorker", _faulty_worker(fault))
    docs = _docs(sample_corpus, 120)
    docs[100]["text"] += " " + FAULT_MARKER
    db.add(["first"])
    before = sorted(p.name for p in (tmp_path / "db" / "segments").iterdir())
    with _deadline(150), pytest.raises(npmdb.OperationalError) as info:
        db.add(docs, engine=RayEngine(workers=2, piece_docs=20, segment_docs=60))
    assert db.count() == 1 and len(db.versions()) == 1
    assert sorted(p.name for p in (tmp_path / "db" / "segments").iterdir()) == before
    assert db.add(["second"]) == 2
    return info.value


def _same_answers(a, b, query, opts):
    ra, rb = a.fill_mask(query, **opts), b.fill_mask(query, **opts)
    assert [(x.text, x.support) for x in ra] == [(x.text, x.support) for x in rb], (query, opts)
    np.testing.assert_allclose([x.score for x in ra], [x.score for x in rb], rtol=1e-3, atol=1e-6)


def _all_columns(db):
    with db.snapshot() as snap:
        out = {n: [] for n in ("tokens", "flags", "offsets", "block_sizes")}
        vecs = []
        for seg in snap.segments:
            c = seg.columns(snap.txn)
            out["tokens"].append(c.tokens)
            out["flags"].append(c.flags)
            out["offsets"].append(c.offsets)
            out["block_sizes"].append(np.diff(c.block_ptr))
            vecs.append(seg.vectors(snap.txn, snap.generation, np.arange(c.n_tokens)))
        return {k: np.concatenate(v) for k, v in out.items()}, np.concatenate(vecs)


@pytest.mark.ray
def test_ray_add_equals_local_add(ray_cluster, tmp_path, tiny_encoder, sample_corpus):
    """Same documents: identical blocks, documents and ids; vectors within float16
    rounding; identical answers. Ray writes 3 segments in one version."""
    docs = _docs(sample_corpus)
    eng = RayEngine(workers=2, segment_docs=80, piece_docs=24)
    with npmdb.open(tmp_path / "ray", encoder=tiny_encoder, progress=False) as db:
        db.add(["an existing document"])  # ids and segments continue after it
        vid = db.add(copy.deepcopy(docs), engine=eng, message="ray")
        vers = db.versions()
        assert [v["message"] for v in vers] == ["", "ray"] and vers[-1]["id"] == vid
        assert db.stats()["segments"] == 4
    # a pool of 2 actors; how many of them got a piece is up to Ray's scheduler (on 2 busy
    # cores the first actor can take all 12 before the second has loaded its model)
    assert eng.report["pieces"] == 12 and eng.report["workers"] == 2
    assert 1 <= eng.report["actors"] <= 2
    with npmdb.open(tmp_path / "local-seg", encoder=tiny_encoder, progress=False) as db:
        db.add(["an existing document"])
        with db.batch("local"):  # the same segmentation, written by the local path
            for i in range(0, len(docs), 80):
                db.add(copy.deepcopy(docs[i:i + 80]))
    with npmdb.open(tmp_path / "local", encoder=tiny_encoder, progress=False) as db:
        db.add(["an existing document"])
        db.add(copy.deepcopy(docs))  # one segment

    r = npmdb.open(tmp_path / "ray", readonly=True, progress=False)
    ls = npmdb.open(tmp_path / "local-seg", readonly=True, progress=False)
    lo = npmdb.open(tmp_path / "local", readonly=True, progress=False)
    try:
        assert list(r.documents()) == list(lo.documents()) == list(ls.documents())
        assert {k: r.stats()[k] for k in ("docs", "blocks", "tokens")} == \
            {k: lo.stats()[k] for k in ("docs", "blocks", "tokens")}
        cr, vr = _all_columns(r)
        for other in (ls, lo):
            co, vo = _all_columns(other)
            for name in cr:
                np.testing.assert_array_equal(cr[name], co[name], err_msg=name)
            scale = float(np.abs(vo).max())
            np.testing.assert_allclose(vr, vo, rtol=2 ** -10, atol=scale * 2 ** -11)
        for q in QUERIES:
            for opts in RETRIEVALS:  # every retrieval, against the same segmentation
                _same_answers(r, ls, q, opts)
            _same_answers(r, lo, q, dict(retrieval="dense", exact=True))  # exact merge
        labels = {"positive": ["great", "good"], "negative": ["terrible", "bad"]}
        ca = r.classify(QUERIES[3], labels, retrieval="dense", exact=True)
        cb = lo.classify(QUERIES[3], labels, retrieval="dense", exact=True)
        assert [x.text for x in ca] == [x.text for x in cb]
        np.testing.assert_allclose([x.score for x in ca], [x.score for x in cb], rtol=1e-3)
    finally:
        for d in (r, ls, lo):
            d.close()


@pytest.mark.ray
def test_ray_add_into_a_pq_database_equals_local(ray_cluster, tmp_path, tiny_encoder,
                                                 sample_corpus):
    """A database with the trained ``pq`` codec: Ray ingest trains the codec once (in the
    driver, as a local add does) and answers exactly as a local add of the same segments."""
    docs = _docs(sample_corpus)
    eng = RayEngine(workers=2, segment_docs=120, piece_docs=30)
    with npmdb.open(tmp_path / "ray", encoder=tiny_encoder, codec="pq", progress=False) as db:
        db.add(copy.deepcopy(docs), engine=eng)
    with npmdb.open(tmp_path / "local", encoder=tiny_encoder, codec="pq", progress=False) as db:
        with db.batch():
            for i in range(0, len(docs), 120):
                db.add(copy.deepcopy(docs[i:i + 120]))
    r = npmdb.open(tmp_path / "ray", readonly=True, progress=False)
    lo = npmdb.open(tmp_path / "local", readonly=True, progress=False)
    try:
        assert r.stats()["segments"] == lo.stats()["segments"] == 2
        cr, vr = _all_columns(r)
        co, vo = _all_columns(lo)
        # the same codec (trained once, on the first vectors) and, but for float rounding
        # in the encoders of different processes, the same codes
        assert vr.shape == vo.shape and (vr == vo).all(axis=1).mean() > 0.99
        for q in QUERIES:
            for opts in RETRIEVALS:
                _same_answers(r, lo, q, opts)
        assert r.check().ok
    finally:
        r.close()
        lo.close()


@pytest.mark.ray
def test_ray_failure_commits_nothing(ray_cluster, tmp_path, tiny_encoder, sample_corpus):
    """A worker that cannot load the database's encoder: an error, nothing left behind."""
    enc = tmp_path / "enc"
    shutil.copytree(tiny_encoder, enc)
    with npmdb.open(tmp_path / "db", encoder=enc, progress=False) as db:
        db.add(["first"])
        db.encoder_for(0)  # loaded in the driver; the files then change under it
        cfg = json.loads((enc / "config.json").read_text())
        (enc / "config.json").write_text(json.dumps(cfg, indent=4))
        before = sorted(p.name for p in (tmp_path / "db" / "segments").iterdir())
        with pytest.raises(npmdb.OperationalError, match="different encoder"):
            db.add(_docs(sample_corpus, 60), engine=RayEngine(workers=1, segment_docs=20))
        assert db.count() == 1 and len(db.versions()) == 1
        assert sorted(p.name for p in (tmp_path / "db" / "segments").iterdir()) == before
        assert db.add(["second"]) == 2  # the writer is usable; segment numbers continue
        assert db.stats()["segments"] == 2


@pytest.mark.ray
def test_ray_worker_that_dies_fails_the_add(ray_cluster, tmp_path, tiny_encoder,
                                            sample_corpus, monkeypatch):
    """A piece whose worker process dies (out of memory, a crash) every time: Ray restarts
    the actor and retries the piece RayEngine.worker_restarts times (not forever), then
    the add fails with OperationalError and leaves nothing (~20 s here with the default 2)."""
    with npmdb.open(tmp_path / "db", encoder=tiny_encoder, progress=False) as db:
        err = _add_with_a_fault(db, tmp_path, sample_corpus, monkeypatch, lambda: os._exit(1))
    msg = str(err)
    assert "worker process died" in msg and "worker_restarts" in msg, msg
    assert "\x1b" not in msg, msg


@pytest.mark.ray
def test_ray_worker_exception_is_reported_as_itself(ray_cluster, tmp_path, tiny_encoder,
                                                    sample_corpus, monkeypatch):
    """An exception raised in an actor: the message names its type and text (not Ray's
    coloured wrapper), and nothing is committed."""
    def fault():
        raise ValueError("injected fault in a worker")

    with npmdb.open(tmp_path / "db", encoder=tiny_encoder, progress=False) as db:
        err = _add_with_a_fault(db, tmp_path, sample_corpus, monkeypatch, fault)
    msg = str(err)
    assert "ValueError: injected fault in a worker" in msg and "\x1b" not in msg, msg


@pytest.mark.ray
def test_ray_refresh_equals_local_refresh(ray_cluster, tmp_path, tiny_encoder, sample_corpus):
    """A new embedding generation written over Ray equals the local refresh."""
    import torch

    from npmdb.distributed import write_generation as ray_write
    from npmdb.generations import write_generation as local_write

    docs = _docs(sample_corpus, 120)
    paths = {}
    for name in ("local", "ray"):
        paths[name] = tmp_path / name
        with npmdb.open(paths[name], encoder=tiny_encoder, progress=False) as db:
            db.add(docs[:60])
            db.add(docs[60:])
    with npmdb.open(paths["local"], progress=False) as db:
        model = copy.deepcopy(db.encoder.model).cpu()
        torch.manual_seed(1)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.05 * torch.randn_like(p))
        v1, g1 = local_write(db, model, steps=5, tag="t")
    with npmdb.open(paths["ray"], progress=False) as db:
        eng = RayEngine(workers=2, piece_tokens=300)
        v2, g2 = ray_write(db, model, steps=5, tag="t", engine=eng)
        assert eng.report["pieces"] > 2
    assert (v1, g1) == (v2, g2) == (3, 1)
    a = npmdb.open(paths["local"], readonly=True, progress=False)
    b = npmdb.open(paths["ray"], readonly=True, progress=False)
    try:
        _, va = _all_columns(a)
        _, vb = _all_columns(b)
        np.testing.assert_allclose(va, vb, rtol=2 ** -10, atol=float(np.abs(va).max()) * 2 ** -11)
        assert [v["generation"] for v in a.versions()] == [v["generation"] for v in b.versions()]
        for q in QUERIES[:2]:
            _same_answers(a, b, q, dict(retrieval="dense"))
            _same_answers(a, b, q, dict(retrieval="dense", version=2))  # the old generation
    finally:
        a.close()
        b.close()


@pytest.mark.ray
def test_cli_add_ray(ray_cluster, tmp_path, tiny_encoder, sample_corpus):
    from npmdb.cli import main

    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps(d) + "\n" for d in sample_corpus[:50]))
    assert main(["add", str(tmp_path / "db"), str(src), "--encoder", str(tiny_encoder),
                 "--ray", "--workers", "1", "-q"]) == 0
    with npmdb.open(tmp_path / "db", readonly=True, progress=False) as db:
        assert db.count() == 50 and db.versions()[-1]["id"] == 1
        assert db.get(sample_corpus[7]["id"])["text"] == sample_corpus[7]["text"]


@pytest.mark.ray
def test_ray_add_codes_the_ivf_index_in_the_workers(ray_cluster, tmp_path, tiny_encoder,
                                                    sample_corpus, monkeypatch):
    """An IVF add on Ray: the first wave (about a training sample) trains the template in
    the driver, then the workers code every later piece (codec rows and IVF entries). The
    database equals one whose pieces the driver coded: same vectors, same index, same
    answers."""
    from npmdb.ingest import ray as ray_ingest

    monkeypatch.setattr(ray_ingest, "TRAIN_WAVE_CHARS", 40_000)
    docs = sample_corpus[:1500]
    kw = dict(encoder=tiny_encoder, progress=False, index="ivf", codec="int4")

    def add(path, **extra):
        eng = RayEngine(workers=2, segment_docs=600, piece_docs=150, wave_chars=1 << 20)
        with npmdb.open(path, **kw) as db:
            db.add(copy.deepcopy(docs), engine=eng)
        return eng.report

    coded = add(tmp_path / "workers")
    assert coded["pieces_indexed_by_workers"] > 0
    # an actor pool a wave: "actors" is the most in one wave, not the sum over the waves
    assert coded["waves"] >= 2 and 1 <= coded["actors"] <= 2, coded
    assert coded["actors"] <= coded["actor_processes"] <= 2 * coded["waves"], coded
    monkeypatch.setattr(ray_ingest, "_worker_index", lambda writer, gen: None)
    assert add(tmp_path / "driver")["pieces_indexed_by_workers"] == 0
    with npmdb.open(tmp_path / "workers", readonly=True) as a, \
            npmdb.open(tmp_path / "driver", readonly=True) as b:
        assert a.stats()["segments"] == b.stats()["segments"] == 3
        assert a.stats()["index"] == {"ivf": 3}
        with a.snapshot() as sa, b.snapshot() as sb:
            for ra, rb in zip(sa.segments, sb.segments):
                n = ra.record.tokens
                np.testing.assert_array_equal(ra.vectors(sa.txn, 0, np.arange(n)),
                                              rb.vectors(sb.txn, 0, np.arange(n)))
                assert ivf_file(ra).read_bytes() == ivf_file(rb).read_bytes()
        for q in QUERIES:
            assert [(x.text, x.score) for x in a.fill_mask(q, retrieval="dense")] == \
                [(x.text, x.score) for x in b.fill_mask(q, retrieval="dense")]


def ivf_file(reader):
    from npmdb.storage.ivf import IVF_FILE
    from npmdb.storage.paths import segment_dir

    return segment_dir(reader.root, reader.seg) / f"g0.{IVF_FILE}"
