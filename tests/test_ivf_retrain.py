"""optimize() retraining an outgrown IVF template (storage/retrain.py): when it retrains,
what the merged segment and later adds are coded with, older versions, recall, a failed
commit, bad arguments.

Real FAISS, LMDB and tantivy over the bundled sample corpus with the tiny random encoder;
small ``train_points`` and ``list_entries`` make a 2,300-document corpus outgrow its
first template the way 100M tokens outgrow the default one."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

import npmdb
from npmdb.storage import ivf as I
from npmdb.storage import retrain as R
from npmdb.storage.dense import DenseParams
from npmdb.storage.format import VALID_END, VALID_START

QUERIES = ["Thessaloniki is a city in [MASK].", "Salem is the capital of [MASK].",
           "Paris is located in [MASK]."]
PARAMS = DenseParams(ivf=I.IvfParams(train_points=4096, list_entries=16))


@pytest.fixture(scope="module")
def grown(tmp_path_factory, tiny_encoder, sample_corpus):
    """Two IVF adds coded with a template trained on 4,096 rows of the first."""
    path = tmp_path_factory.mktemp("retrain") / "db"
    with npmdb.open(path, encoder=tiny_encoder, index="ivf", dense_params=PARAMS,
                    progress=False) as db:
        db.add(sample_corpus[:1200])
        db.add(sample_corpus[1200:2300])
    return path


def _copy(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "db"
    shutil.copytree(src, dst)
    return dst


def _nlist(db) -> int:
    return I.template_nlist(I.read_template(db.env, 0))


def _answers(db, **kw) -> list:
    return [[(a.text, round(a.score, 4)) for a in db.fill_mask(q, top=5, **{"retrieval": "dense", **kw})]
            for q in QUERIES]


def test_plan_retrains_only_an_outgrown_template():
    p = I.IvfParams()
    t = I.train_template(np.random.default_rng(0).standard_normal((8192, 16)).astype(
        np.float32), I.IvfParams(nlist=64, m=4))
    assert R.plan(64 * 6144, t, p, None).retrain is False  # lists at the size wanted
    grown = R.plan(64 * 6144 * 3, t, p, None)
    assert grown.retrain and grown.current == 64 and grown.wanted == 1024  # auto's floor
    assert "retrain" in str(grown) and "18,432 entries a list" in grown.reason
    assert R.plan(100, t, p, True).retrain is False  # too few to train on, even if asked
    assert R.plan(64 * 6144, t, p, True).retrain and not R.plan(10 ** 9, t, p, False).retrain
    # no template yet: judged by the one a first segment would train (1,024 lists here)
    assert R.plan(1024 * 6144, None, p, None).retrain is False
    assert R.plan(1024 * 6144 * 3, None, p, None).retrain is True
    # a fixed nlist is never outgrown
    assert R.plan(10 ** 9, t, I.IvfParams(nlist=64), None).retrain is False
    assert I.corpus_nlist(100_000_000, p) == 16384 and I.corpus_nlist(10, p) == 16
    with pytest.raises(npmdb.ProgrammingError, match="retrain must be True, False or None"):
        R.plan(10, t, p, "yes")


def test_optimize_retrains_codes_with_the_new_template_and_keeps_answers(
        grown, tmp_path, sample_corpus):
    path = _copy(grown, tmp_path)
    with npmdb.open(path, dense_params=PARAMS, progress=False) as db:
        before_nlist = _nlist(db)
        v0 = db.version
        exact = _answers(db, exact=True)
        old = _answers(db)
        with db.snapshot() as snap:
            entries = R.index_entries(snap.segments, snap.txn)
        assert I.outgrown(before_nlist, entries, PARAMS.ivf)
        v1 = db.optimize()
        after_nlist = _nlist(db)
        # the lists the corpus asks for, as many as its 39 samples a list allow
        assert after_nlist == I.trainable_nlist(entries, PARAMS.ivf) \
            == min(I.corpus_nlist(entries, PARAMS.ivf), entries // 39)
        assert after_nlist > 2 * before_nlist
        assert f"IVF template retrained: {before_nlist} -> {after_nlist:,} lists" in \
            db.versions()[-1]["message"]
        assert _answers(db, exact=True) == exact  # the vectors are the same
        assert _answers(db, version=v0) == old  # the old version keeps its own lists
        with db.snapshot() as snap:
            seg = snap.segments[0]
            f = seg.ivf_file(snap.generation)
            assert f.ivf.nlist == after_nlist and f.entries == entries
            coded = seg.ivf_coded(snap.generation)
            np.testing.assert_array_equal(
                coded.labels, np.flatnonzero(seg.columns().flags & (VALID_START | VALID_END)))
            rng = np.random.default_rng(1)
            recalls = []
            for side, bit in (("start", VALID_START), ("end", VALID_END)):
                idx = seg.dense(snap.generation, side)
                pos = np.flatnonzero(seg.columns().flags & bit)
                for t in rng.choice(pos, 5, replace=False):
                    q = seg.vectors(snap.txn, snap.generation, np.array([t]))[0]
                    sc = seg.vectors(snap.txn, snap.generation, pos) @ q
                    want = set(pos[np.argsort(-sc, kind="stable")[:32]].tolist())
                    got, _ = idx.search(q, 32 * idx.refine, entries=snap.ivf_entries())
                    vecs = seg.vectors(snap.txn, snap.generation, got)
                    top = got[np.argsort(-(vecs @ q), kind="stable")[:32]]
                    recalls.append(len(want & set(top.tolist())) / 32)
            assert np.mean(recalls) >= 0.9, recalls
        # a later add codes against the retrained template and does not retrain
        db.add(sample_corpus[2300:2400])
        assert _nlist(db) == after_nlist
        with db.snapshot() as snap:
            assert [s.ivf_file(snap.generation).ivf.nlist for s in snap.segments] == \
                [after_nlist, after_nlist]
        # now sized for the corpus: auto keeps it, and a lone segment is left as it is
        v2 = db.optimize()
        assert v2 > v1 and _nlist(db) == after_nlist
        assert db.optimize() == v2
        assert db.check().ok


def _lists_agree_with_their_file(db) -> list[float]:
    """Per segment: the share of its IVF entries that sit in the list its own file's
    quantiser assigns them (1.0 for a segment coded with the template it was built with)."""
    out = []
    with db.snapshot() as snap:
        for seg in snap.segments:
            f = seg.ivf_file(snap.generation)
            coded = seg.ivf_coded(snap.generation)
            vecs = seg.vectors(snap.txn, snap.generation, coded.labels).astype(np.float32)
            own = I.Coder(f.index).encode(vecs, coded.labels)
            out.append(float(np.mean(own.lists == coded.lists)))
    return out


def test_optimize_after_restoring_from_before_a_retrain_codes_the_old_rows_anew(
        grown, tmp_path, sample_corpus):
    """The restored version's segments hold codes of the template a retrain replaced; an
    optimize copied them into a segment of the new template (recall fell to 0.1, and a
    template of fewer lists raised a raw FAISS error). They are coded anew."""
    path = _copy(grown, tmp_path)
    with npmdb.open(path, dense_params=PARAMS, progress=False) as db:
        first = db.versions()[0]["id"]
        db.optimize(retrain=True)
        db.restore(first)
        db.add(sample_corpus[2300:2400])
        assert len(set(_lists_agree_with_their_file(db))) >= 1
        exact = _answers(db, exact=True)
        db.optimize()
        agree = _lists_agree_with_their_file(db)
        assert agree == [1.0], agree
        assert _answers(db, exact=True) == exact and db.check().ok


def test_retrain_true_forces_and_false_keeps(grown, tmp_path):
    path = _copy(grown, tmp_path)
    with npmdb.open(path, dense_params=PARAMS, progress=False) as db:
        t0 = I.read_template(db.env, 0)
        db.optimize(retrain=False)
        assert I.read_template(db.env, 0) == t0
        v = db.optimize(retrain=True)  # one segment, nothing deleted: rewritten all the same
        assert v == db.version and I.read_template(db.env, 0) != t0
        with pytest.raises(npmdb.ProgrammingError, match="retrain must be True, False or None"):
            db.optimize(retrain="yes")
        assert db.version == v


def test_a_failed_commit_keeps_the_old_template_and_head(grown, tmp_path, monkeypatch):
    from npmdb.storage import transaction as T

    path = _copy(grown, tmp_path)
    with npmdb.open(path, dense_params=PARAMS, progress=False) as db:
        t0, v0 = I.read_template(db.env, 0), db.version

        def boom(self, *a, **k):
            raise npmdb.OperationalError("disk full (injected)")

        monkeypatch.setattr(T.Writer, "_commit", boom)
        with pytest.raises(npmdb.OperationalError, match="injected"):
            db.optimize()
        monkeypatch.undo()
        assert I.read_template(db.env, 0) == t0 and db.version == v0
        assert db.stats()["segments"] == 2
        assert db.check().ok


def test_the_sample_draws_an_equal_share_from_every_chunk(tmp_path, tiny_encoder,
                                                           sample_corpus, monkeypatch):
    """Rows from a few whole 65,536-token chunks are a few stretches of the corpus (a 25M
    replay retrained so fell from 0.955 to 0.837 recall): every chunk gives its share."""
    from npmdb.storage import segments as S

    monkeypatch.setattr(S, "CHUNK", 512)
    path = tmp_path / "db"
    with npmdb.open(path, encoder=tiny_encoder, index="ivf", progress=False) as db:
        db.add(sample_corpus[:600])
    read = []
    real = S.SegmentReader.stored_chunk
    monkeypatch.setattr(S.SegmentReader, "stored_chunk",
                        lambda self, txn, gen, c: read.append(c) or real(self, txn, gen, c))
    with npmdb.open(path, readonly=True, progress=False) as db, db.snapshot() as snap:
        seg = snap.segments[0]
        chunks = -(-seg.record.tokens // seg.chunk)
        assert seg.chunk == 512 and chunks >= 8
        rows = R.sample_rows(snap.segments, snap.txn, 0, 8 * chunks)
        assert sorted(read) == list(range(chunks))  # every chunk, once
        assert 7 * chunks <= len(rows) <= 8 * chunks and rows.dtype == np.float32
        # the rows are stored vectors of valid starts and ends
        valid = np.flatnonzero(seg.columns().flags & (VALID_START | VALID_END))
        stored = {v.tobytes() for v in seg.vectors(snap.txn, 0, valid).astype(np.float32)}
        assert all(r.tobytes() in stored for r in rows)
