"""The compact IVF-PQ dense index (storage/ivf.py): recall against exact search, exact
re-scores, persistence, a quantiser trained once and reused, optimize converting
hnsw -> ivf, crash safety, damaged files and bad parameters.

Real FAISS, LMDB and tantivy over the bundled sample corpus, with the tiny random encoder
(hidden size 32: PQ with 32 one-byte codes)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import npmdb
from npmdb.storage import ivf as I
from npmdb.storage import segment_writer as SW
from npmdb.storage.dense import DenseParams
from npmdb.storage.format import VALID_END, VALID_START

SAMPLE = Path(npmdb.__file__).parent / "data" / "dev-small"
QUERIES = ["Thessaloniki is a city in [MASK].", "Salem is the capital of [MASK].",
           "The currency of Japan is the [MASK].", "Paris is located in [MASK]."]


@pytest.fixture(scope="module")
def ivf_path(tmp_path_factory, tiny_encoder, sample_corpus):
    """2,300 documents as an ivf database: a small first add (flat, before any template),
    then two adds that train the template once and reuse it."""
    path = tmp_path_factory.mktemp("ivf") / "db"
    with npmdb.open(path, encoder=tiny_encoder, index="ivf", progress=False) as db:
        db.add(sample_corpus[:20])
        db.add(sample_corpus[20:1500])
        db.add(sample_corpus[1500:2300])
    return path


def _template(path: Path, gen: int = 0) -> bytes | None:
    with npmdb.open(path, readonly=True, progress=False) as db:
        return I.read_template(db.env, gen)


def test_small_first_segment_is_flat_then_one_template_is_trained_and_reused(ivf_path):
    with npmdb.open(ivf_path, readonly=True, progress=False) as db:
        assert db.stats()["index"] == {"ivf": 3}
        with db.snapshot() as snap:
            files = [I.IvfFile.load(Path(db.path) / "segments" / f"s{s.seg:06d}" /
                                    f"g0.{I.IVF_FILE}") for s in snap.segments]
        assert [f.kind for f in files] == ["flat", "ivf-pq", "ivf-pq"]
        t = I.read_template(db.env, 0)
    import faiss
    tmpl = faiss.deserialize_index(np.frombuffer(t, np.uint8))
    # both IVF segments hold the template's quantiser (the second add did not retrain)
    for f in files[1:]:
        q = faiss.downcast_index(f.ivf.quantizer)
        tq = faiss.downcast_index(faiss.extract_index_ivf(tmpl).quantizer)
        np.testing.assert_array_equal(faiss.rev_swig_ptr(q.get_xb(), q.ntotal * q.d),
                                      faiss.rev_swig_ptr(tq.get_xb(), tq.ntotal * tq.d))


def test_a_later_add_does_not_retrain(ivf_path, tmp_path, sample_corpus, monkeypatch):
    import shutil
    dst = tmp_path / "db"
    shutil.copytree(ivf_path, dst)
    before = _template(dst)
    calls = []
    real = I.train_template
    monkeypatch.setattr(I, "train_template", lambda *a, **k: calls.append(1) or real(*a, **k))
    with npmdb.open(dst, progress=False) as db:
        db.add(sample_corpus[2300:2500])
        assert db.stats()["index"] == {"ivf": 4}
    assert calls == [] and _template(dst) == before


def _exact_top(seg, snap, q, bit, k):
    cols = seg.columns(snap.txn)
    pos = np.flatnonzero(cols.flags & bit)
    sc = seg.vectors(snap.txn, snap.generation, pos) @ q
    order = np.argsort(-sc, kind="stable")[:k]
    return pos[order], sc[order]


def test_recall_against_exact_and_exact_rescores(ivf_path):
    """Per segment and side: the index's candidates, re-ranked exactly from the stored
    vectors, find >= 0.9 of the exact top-k, and the scores the engine keeps are exact."""
    from npmdb.query.operators import DenseTopK, EncodeQuery
    from npmdb.query.physical import ExecState

    with npmdb.open(ivf_path, readonly=True, progress=False) as db, db.snapshot() as snap:
        rng = np.random.default_rng(0)
        recalls = []
        for seg in snap.segments[1:]:
            for side, bit in (("start", VALID_START), ("end", VALID_END)):
                seg.columns(snap.txn)
                idx = seg.dense(snap.generation, side)
                assert idx.approximate and idx.refine == I.IvfParams().refine
                cols = seg.columns()
                for t in rng.choice(cols.n_tokens, 5, replace=False):
                    # a query near the corpus (as an encoded mask is): a token's vector
                    q = seg.vectors(snap.txn, snap.generation, np.array([t]))[0]
                    q = q + 0.1 * np.linalg.norm(q) / np.sqrt(seg.dim) * \
                        rng.standard_normal(seg.dim).astype(np.float32)
                    k = 64
                    want, _ = _exact_top(seg, snap, q, bit, k)
                    got, _ = idx.search(q, k * idx.refine)
                    vecs = seg.vectors(snap.txn, snap.generation, got)
                    top = got[np.argsort(-(vecs @ q), kind="stable")[:k]]
                    recalls.append(len(set(top) & set(want)) / k)
                    assert (seg.columns().flags[got] & bit).all()  # the side's own tokens
        assert np.mean(recalls) >= 0.9, recalls
        # the operator re-scores the global best refine * k approximate candidates (not
        # refine * k per segment) and keeps the top k by exact score with the exact segments'
        st = ExecState(snap, QUERIES[0], encode=None)
        enc = EncodeQuery("phrase")
        op = DenseTopK("start", 32, children=(enc,))
        st.outputs[id(enc)] = enc.run(st)
        op.prepare(st)
        got = op.run(st).by_side["start"]
        q = st.outputs[id(enc)].side("start")
        approx, pool = [], []
        refine = I.IvfParams().refine
        for si, seg in enumerate(snap.segments):
            idx = seg.dense(snap.generation, "start")
            # probes set by every segment's entries, as the operator searches
            pos, sc = idx.search(q, 32 * idx.refine, entries=snap.ivf_entries())
            (approx if idx.approximate else pool).extend(
                (float(x), si, int(p)) for x, p in zip(sc, pos))
        assert len(approx) == 2 * 32 * refine  # two ivf-pq segments
        for _, si, p in sorted(approx, reverse=True)[:32 * refine]:
            seg = snap.segments[si]
            pool.append((float(seg.vectors(snap.txn, snap.generation, np.array([p]))[0] @ q),
                         si, p))
        want = {(si, p) for _, si, p in sorted(pool, reverse=True)[:32]}
        assert {(si, int(p)) for si, ps in got.items() for p in ps} == want


def test_answers_match_exact_search_and_survive_reopen(ivf_path):
    with npmdb.open(ivf_path, readonly=True, progress=False) as db:
        first = {q: [(a.text, round(a.score, 6)) for a in db.fill_mask(q, k=128, top=5, retrieval="dense")]
                 for q in QUERIES}
        agree = sum(db.fill_mask(q, k=128, top=1, retrieval="dense")[0].text ==
                    db.fill_mask(q, k=128, top=1, exact=True)[0].text for q in QUERIES)
        assert agree >= len(QUERIES) - 1
    with npmdb.open(ivf_path, readonly=True, progress=False) as db:
        again = {q: [(a.text, round(a.score, 6)) for a in db.fill_mask(q, k=128, top=5, retrieval="dense")]
                 for q in QUERIES}
    assert again == first


def test_optimize_converts_hnsw_to_ivf_with_unchanged_exact_answers(tmp_path, tiny_encoder,
                                                                     sample_corpus):
    with npmdb.open(tmp_path / "db", encoder=tiny_encoder, progress=False) as db:
        db.add(sample_corpus[:600])
        db.add(sample_corpus[600:1400])
        assert db.stats()["index"] == {"hnsw": 2}
        before = [[(a.text, round(a.score, 5)) for a in db.fill_mask(q, exact=True, top=5)]
                  for q in QUERIES]
        dense_before = [db.fill_mask(q, k=128, top=1, retrieval="dense")[0].text for q in QUERIES]
        v = db.optimize(index="ivf")
        assert db.stats()["index"] == {"ivf": 1} and db.config["dense"] == "ivf"
        after = [[(a.text, round(a.score, 5)) for a in db.fill_mask(q, exact=True, top=5)]
                 for q in QUERIES]
        assert after == before
        dense_after = [db.fill_mask(q, k=128, top=1, retrieval="dense")[0].text for q in QUERIES]
        assert sum(a == b for a, b in zip(dense_before, dense_after)) >= len(QUERIES) - 1
        db.add(sample_corpus[1400:1450])  # later segments follow the recorded kind
        assert db.stats()["index"] == {"ivf": 2}
        assert db.optimize(index="ivf") > v
        assert db.check().ok


def test_auto_picks_by_corpus_size(tmp_path, tiny_encoder, sample_corpus, monkeypatch):
    monkeypatch.setattr(SW, "AUTO_IVF_TOKENS", 15_000)
    with npmdb.open(tmp_path / "db", encoder=tiny_encoder, index="auto", progress=False) as db:
        db.add(sample_corpus[:50])
        assert db.stats()["index"] == {"hnsw": 1}
        db.add(sample_corpus[50:1500])
        assert db.stats()["index"] == {"hnsw": 1, "ivf": 1}
        assert db.config["dense"] == "auto"
        assert db.fill_mask(QUERIES[1], k=64, retrieval="dense").answers


def test_check_finds_a_damaged_list_file_and_queries_refuse_a_short_one(ivf_path, tmp_path):
    import shutil
    dst = tmp_path / "db"
    shutil.copytree(ivf_path, dst)
    f = dst / "segments" / "s000001" / f"g0.{I.IVF_FILE}"
    with npmdb.open(dst, readonly=True, progress=False) as db:
        assert db.check().ok
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0xFF  # a flipped byte in the lists
    f.write_bytes(bytes(data))
    with npmdb.open(dst, readonly=True, progress=False) as db:
        rep = db.check()
        assert not rep.ok and any(I.IVF_FILE in str(p) for p in rep.problems), rep.problems
    f.write_bytes(bytes(data[: len(data) // 3]))  # truncated: refused before FAISS maps it
    with npmdb.open(dst, readonly=True, progress=False) as db:
        with pytest.raises(npmdb.OperationalError, match="truncated"):
            db.fill_mask(QUERIES[0], k=64, retrieval="dense")


def test_bad_parameters_are_clear_errors_and_write_nothing(tmp_path, tiny_encoder,
                                                          sample_corpus):
    with pytest.raises(npmdb.ProgrammingError, match="unknown index kind 'ivfpq'"):
        npmdb.open(tmp_path / "a", encoder=tiny_encoder, index="ivfpq", progress=False)
    assert not (tmp_path / "a" / "data.mdb").exists()
    with pytest.raises(npmdb.ProgrammingError, match="does not fit the encoder's dimension 32"):
        npmdb.open(tmp_path / "b", encoder=tiny_encoder, index="ivf", progress=False,
                   dense_params=DenseParams(ivf=I.IvfParams(m=5)))
    assert not (tmp_path / "b" / "data.mdb").exists()
    big = DenseParams(ivf=I.IvfParams(nlist=100_000))
    with npmdb.open(tmp_path / "c", encoder=tiny_encoder, index="ivf", progress=False,
                    dense_params=big) as db:
        db.add(sample_corpus[:20])
        v = db.version
        with pytest.raises(npmdb.ProgrammingError, match="nlist=100000 is too large"):
            db.add(sample_corpus[20:1500])
        assert db.version == v and db.stats()["docs"] == 20 and db.check().ok
        assert I.read_template(db.env, 0) is None
    with npmdb.open(tmp_path / "c", progress=False) as db:
        with pytest.raises(npmdb.ProgrammingError, match=r"convert with db.optimize\(index='hnsw'\)"):
            npmdb.open(tmp_path / "c", index="hnsw", progress=False)
        with pytest.raises(npmdb.ProgrammingError, match="unknown index kind"):
            db.optimize(index="annoy")
    for bad in (dict(refine=0), dict(refine=-2), dict(nprobe=0), dict(refine=2.5),
                dict(nprobe="4")):  # reopening: they gave no candidates or an InternalError
        with pytest.raises(npmdb.ProgrammingError, match="IvfParams"):
            npmdb.open(tmp_path / "c", readonly=True, progress=False,
                       dense_params=DenseParams(ivf=I.IvfParams(**bad)))


_ADDER = """
import sys, json, gzip, npmdb
path, enc = sys.argv[1], sys.argv[2]
docs = [json.loads(l) for l in gzip.open(sys.argv[3], "rt")][:900]
with npmdb.open(path, encoder=enc, index="ivf", progress=False) as db:
    for i in range(0, 900, 300):
        db.add(docs[i:i + 300])
        print("COMMIT", db.version, flush=True)
"""


@pytest.mark.slow
def test_sigkill_during_ivf_adds_leaves_a_complete_head(tmp_path, tiny_encoder):
    rng = np.random.default_rng(1)
    path = tmp_path / "db"
    for trial in range(4):
        p = subprocess.Popen([sys.executable, "-c", _ADDER, str(path), str(tiny_encoder),
                              str(SAMPLE / "corpus.jsonl.gz")], stdout=subprocess.PIPE,
                             text=True)
        time.sleep(float(rng.uniform(3.0, 12.0)))
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        if not (path / "data.mdb").exists():
            continue
        with npmdb.open(path, progress=False) as db:  # recovers
            rep = db.check()
            assert rep.ok, rep.problems
            if db.version is not None:
                st = db.stats()
                assert st["docs"] % 300 == 0 and st["docs"] >= 300
                assert db.fill_mask(QUERIES[0], k=64, retrieval="dense").answers


def test_queries_read_columns_in_place_and_check_them(ivf_path, tmp_path):
    """A reader's queries keep no copy of the token columns (zero-copy views of the
    snapshot's pages: resident memory does not grow with the corpus), and a damaged
    column is refused on first read, not answered from."""
    import shutil

    from npmdb.storage import format as F

    with npmdb.open(ivf_path, readonly=True, progress=False) as db:
        db.fill_mask(QUERIES[0], k=64, evidence=1, retrieval="dense")
        db.fill_mask(QUERIES[1], k=64, exact=True)
        assert db.search('Paris', limit=3)
        with db.snapshot() as snap:
            assert all(seg._cols is None for seg in snap.segments)  # nothing copied
            from npmdb.query import answers
            for seg in snap.segments:  # no view of a closed snapshot's pages is kept
                kept = answers._DERIVED_FLAGS.get(seg)
                assert kept is None or kept.flags.owndata
            cols = snap.columns(1)
            assert not cols.tokens.flags.owndata and not cols.offsets.flags.writeable
            assert snap.columns(1) is cols  # once per snapshot
            assert (cols.doc_of(np.arange(cols.n_tokens)) ==
                    np.repeat(cols.block_doc, np.diff(cols.block_ptr))).all()
        with pytest.raises(npmdb.OperationalError, match="snapshot is closed"):
            snap.columns(0)  # its views died with its transaction
    dst = tmp_path / "db"
    shutil.copytree(ivf_path, dst)
    with npmdb.open(dst, progress=False) as db:
        with db.snapshot() as snap:
            seg = snap.segments[1].seg
        key = F.col_key(seg, "tokens")
        with db.env.read() as txn:
            raw = bytearray(txn.get(key, db=db.env.dbs["segcols"]))
        raw[-1] ^= 0xFF
        db.env.write(lambda txn: txn.put(key, bytes(raw), db=db.env.dbs["segcols"]))
    with npmdb.open(dst, readonly=True, progress=False) as db:
        with pytest.raises(npmdb.OperationalError, match=f"corrupt segment {seg} tokens"):
            db.fill_mask(QUERIES[0], k=64, retrieval="dense")


def test_entries_coded_apart_fill_the_same_index(tmp_path):
    """Vectors coded against a template elsewhere (a Ray worker's :class:`Coder`) and
    added as entries give the index ``add_with_ids`` gives: the same file, byte for byte."""
    from npmdb.storage import ivf

    rng = np.random.default_rng(0)
    x = rng.standard_normal((9000, 32)).astype(np.float32)
    t = ivf.train_template(x[:5000], ivf.IvfParams(nlist=32, m=8))
    labels = np.arange(4000, dtype=np.int64) * 3
    ivf.build_ivf(t, x[5000:], labels, tmp_path / "a.ivf")
    e = ivf.Coder(ivf.load_template(t, 32)).encode(x[6500:], labels[1500:])
    ivf.build_ivf(t, x[5000:6500], labels[:1500], tmp_path / "b.ivf", entries=e)
    assert (tmp_path / "a.ivf").read_bytes() == (tmp_path / "b.ivf").read_bytes()
    # in parts (a coder's windows), added one at a time and never joined: the same file
    coder = ivf.Coder(ivf.load_template(t, 32))
    parts = [coder.encode(x[a:a + 700], labels[a - 5000:a - 4300])
             for a in range(5000, 9000, 700)]
    ivf.build_ivf(t, x[:0], labels[:0], tmp_path / "p.ivf", entries=parts)
    assert parts == []  # each part let go once added
    assert (tmp_path / "a.ivf").read_bytes() == (tmp_path / "p.ivf").read_bytes()
    other = ivf.train_template(x[:5000], ivf.IvfParams(nlist=32, m=16))
    with pytest.raises(npmdb.OperationalError, match="another template"):
        ivf.build_ivf(other, x[:0], labels[:0], tmp_path / "c.ivf", entries=e)


def test_rows_coded_while_encoding_write_the_same_file(tmp_path, tiny_encoder, sample_corpus,
                                                      monkeypatch):
    """An add into a generation that has its template codes its rows on a background
    thread while the encoder runs (:class:`BackgroundCoder`); the segment's IVF file is
    byte for byte the one coding them all at the end writes, and its answers the same."""
    from npmdb.ingest import local

    monkeypatch.setattr(local, "WINDOW", 16)  # several windows: rows are handed in parts
    made = []
    real = I.BackgroundCoder

    def counting(*a, **kw):
        made.append(real(*a, **kw))
        return made[-1]

    monkeypatch.setattr(I, "BackgroundCoder", counting)
    answers = []
    for name, ahead in (("ahead", True), ("after", False)):
        # the coder runs only where the encoder leaves a core free (a GPU, spare cores)
        monkeypatch.setattr(local, "leaves_a_core", lambda encoder, ahead=ahead: ahead)
        path = tmp_path / name
        with npmdb.open(path, encoder=tiny_encoder, index="ivf", progress=False) as db:
            db.add(sample_corpus[:1500])    # trains the template (coded at the end)
            db.add(sample_corpus[1500:1900])  # has one: coded while encoding, when ahead
            answers.append([db.fill_mask(q, k=64, retrieval="dense").to_list() for q in QUERIES])
    # the second adds: on a thread where the encoder leaves a core, else between windows
    assert [c.threaded for c in made] == [True, False] and all(c.count > 0 for c in made)
    assert _ivf_file(tmp_path / "ahead", 1) == _ivf_file(tmp_path / "after", 1)
    assert _ivf_file(tmp_path / "ahead", 0) == _ivf_file(tmp_path / "after", 0)
    assert answers[0] == answers[1]


def test_a_large_first_segment_trains_early_and_keeps_no_rows(tmp_path, tiny_encoder,
                                                            sample_corpus, monkeypatch):
    """A generation's first IVF segment trains its template once it holds
    ``template_rows`` start and end rows, then codes
    those and every later window as it arrives (in this thread: the encoder has the
    cores), so it never holds the segment's float rows; the index it writes finds what an
    exact scan finds."""
    from npmdb.ingest import local

    monkeypatch.setattr(local, "WINDOW", 16)
    monkeypatch.setattr(local, "leaves_a_core", lambda encoder: False)
    sampled, held, coders = [], [], []
    real_train, real_append, real_coder = I.train_template, SW.SegmentWriter._append_stored, \
        I.BackgroundCoder

    def train(sample, params, *a, **kw):
        sampled.append(len(sample))
        return real_train(sample, params, *a, **kw)

    def append(self, stored, *, decode):
        real_append(self, stored, decode=decode)
        held.append(sum(len(p) for side in self._sides.values() for p in side[0]))

    def coder(*a, **kw):
        coders.append(real_coder(*a, **kw))
        return coders[-1]

    monkeypatch.setattr(I, "train_template", train)
    monkeypatch.setattr(SW.SegmentWriter, "_append_stored", append)
    monkeypatch.setattr(I, "BackgroundCoder", coder)
    train_points = 2048
    params = DenseParams(ivf=I.IvfParams(train_points=train_points))
    limit = SW.template_rows(params.ivf)
    path = tmp_path / "db"
    with npmdb.open(path, encoder=tiny_encoder, index="ivf", dense_params=params,
                    progress=False) as db:
        db.add(sample_corpus[:1500])
    assert len(coders) == 1 and not coders[0].threaded
    with npmdb.open(path, readonly=True, progress=False) as db, db.snapshot() as snap:
        seg = snap.segments[0]
        cols = seg.columns(snap.txn)
        rows = int(((cols.flags & (VALID_START | VALID_END)) > 0).sum())
        assert rows > 1.5 * limit  # a segment larger than the rows trained on
        assert len(sampled) == 1 and limit // 2 <= sampled[0] < rows  # trained mid-way
        assert max(held) < limit and held[-1] == 0  # never more than the training rows
        assert coders[0].count == rows  # the held rows in one batch, then window by window
        rng = np.random.default_rng(3)
        recalls = []
        for side, bit in (("start", VALID_START), ("end", VALID_END)):
            idx = seg.dense(snap.generation, side)
            assert idx.approximate
            for t in rng.choice(np.flatnonzero(cols.flags & bit), 5, replace=False):
                q = seg.vectors(snap.txn, snap.generation, np.array([t]))[0]
                want, _ = _exact_top(seg, snap, q, bit, 32)
                got, _ = idx.search(q, 32 * idx.refine)
                vecs = seg.vectors(snap.txn, snap.generation, got)
                top = got[np.argsort(-(vecs @ q), kind="stable")[:32]]
                recalls.append(len(set(top) & set(want)) / 32)
        assert np.mean(recalls) >= 0.9, recalls


def test_the_background_coder_waits_for_a_spare_core(tiny_encoder):
    """On the CPU the coder thread runs only when torch leaves a core unused."""
    import os

    import torch

    from npmdb.encoder import Encoder
    from npmdb.ingest.local import leaves_a_core

    enc = Encoder(tiny_encoder, device="cpu")
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(os.cpu_count() or 1)
        assert not leaves_a_core(enc)
        if (os.cpu_count() or 1) > 1:
            torch.set_num_threads(1)
            assert leaves_a_core(enc)
    finally:
        torch.set_num_threads(threads)


def _ivf_file(path: Path, seg_index: int) -> bytes:
    with npmdb.open(path, readonly=True, progress=False) as db:
        with db.snapshot() as snap:
            seg = snap.segments[seg_index].seg
    return (Path(path) / "segments" / f"s{seg:06d}" / f"g0.{I.IVF_FILE}").read_bytes()


def test_the_coder_assigns_the_nearest_list_and_codes_as_faiss_does():
    """The HNSW coarse assignment picks the exact quantiser's list for (nearly) every
    vector, and the PQ codes are FAISS's own for that list."""
    import faiss

    from npmdb.storage import ivf

    rng = np.random.default_rng(1)
    centres = rng.standard_normal((300, 48)).astype(np.float32)
    x = (centres[rng.integers(0, 300, 40000)]
         + 0.3 * rng.standard_normal((40000, 48))).astype(np.float32)
    index = ivf.load_template(ivf.train_template(x[:20000], ivf.IvfParams(nlist=512, m=8)), 48)
    coder = ivf.Coder(index)
    e = coder.encode(x[20000:], np.arange(20000))
    _, exact = coder.ivf.quantizer.search(x[20000:], 1)
    assert (e.lists == exact[:, 0]).mean() >= 0.99
    raw = index.sa_encode(x[20000:])            # FAISS's own coding (exact assignment)
    same = e.lists == exact[:, 0]
    assert (raw[same, index.coarse_code_size():] == e.codes[same]).all()
    again = ivf.Coder(ivf.load_template(faiss.serialize_index(index).tobytes(), 48))
    f = again.encode(x[20000:], np.arange(20000))   # another process: the same entries
    assert (f.lists == e.lists).all() and (f.codes == e.codes).all()


def test_probes_follow_what_the_lists_hold():
    """A search probes lists holding ~``scan`` entries per candidate wanted, between
    ``min_nprobe`` and ``nprobe`` (which wins) and never more than ``nlist``."""
    p = I.IvfParams()
    assert (p.nprobe, p.min_nprobe, p.scan, p.refine) == (48, 16, 14, 3)
    k3 = 1024 * p.refine
    # the dev replays' entries: 1M tokens 501k, 10.5M 5.51M (both sides, one template)
    assert I.probe_count(p, k3, 501_000, 2048) == 48        # 1M tokens: capped at nprobe
    assert I.probe_count(p, k3, 5_513_464, 2048) == 16      # 10M: fuller lists, fewer
    assert I.probe_count(p, k3, 55_000_000, 2048) == 16     # never below min_nprobe
    assert I.probe_count(p, 4096 * p.refine, 5_513_464, 2048) == 48
    assert I.probe_count(I.IvfParams(nprobe=4), k3, 501_000, 2048) == 4
    assert I.probe_count(p, k3, 1000, 8) == 8
    for bad in (dict(scan=0), dict(min_nprobe=-1), dict(scan=1.5)):
        with pytest.raises(npmdb.ProgrammingError, match="IvfParams"):
            I.check_ivf_params(I.IvfParams(**bad), 384)


def test_snapshot_counts_every_segments_entries(ivf_path):
    with npmdb.open(ivf_path, readonly=True, progress=False) as db, db.snapshot() as snap:
        files = [snap.dense(si, "start").file for si in range(len(snap.segments))]
        total = sum(f.entries for f in files if f.approximate)
        assert snap.ivf_entries() == total > 0
        idx = snap.dense(1, "start")
        assert idx.approximate
        # the whole snapshot's lists hold more than one segment's: no more probes
        assert idx.probes(64 * idx.refine, total) <= idx.probes(64 * idx.refine)


def test_global_candidates_match_a_full_sort():
    """``_top_candidates`` sorts only the entries that can make the best n (at most two per
    pair: one a side) and still gives what a sort of everything gives, ties included."""
    from npmdb.query.operators import _top_candidates

    rng = np.random.default_rng(5)
    for trial in range(40):
        found = []
        for si in range(int(rng.integers(1, 6))):
            m = int(rng.integers(0, 300))
            pos = rng.choice(1000, m, replace=False).astype(np.int64)
            sc = np.round(rng.normal(size=m), 1).astype(np.float32)  # many ties
            found.append((si, pos, sc))
            if trial % 2:  # the other side of the same segment: some pairs twice
                again = pos[: m // 2]
                found.append((si, again, np.round(rng.normal(size=len(again)), 1)
                              .astype(np.float32)))
        n = int(rng.integers(1, 400))
        best: dict = {}
        for si, pos, sc in found:
            for p, x in zip(pos.tolist(), sc.tolist()):
                best[(si, p)] = max(best.get((si, p), -np.inf), x)
        want = sorted(best.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
        got = [((si, int(p)), float(x)) for si, ps, xs in _top_candidates(found, n)
               for p, x in zip(ps, xs)]
        assert sorted(got) == sorted((k, float(np.float32(v))) for k, v in want)


def test_probes_bench_step(ivf_path):
    """bench.probes: recall against an exact scan and the lists probed, per setting."""
    from bench.probes import measure, render

    rows = [{"query": q} for q in QUERIES[:2]]
    res = measure(ivf_path, ["default", "2x2"], rows, 16, log=lambda m: None)
    default, two = res["settings"]
    assert two["probes"] == [2] and default["probes"] == [16]  # min_nprobe: small lists
    assert all(0.0 <= s["recall"] <= 1.0 and s["ms_p50"] > 0 for s in (default, two))
    assert "| db | " in render({"k": 16, "queries": 2, "dbs": [res]})


def test_optimize_merges_ivf_segments_by_copying_their_codes(ivf_path, tmp_path,
                                                             sample_corpus, monkeypatch):
    """optimize() over IVF-PQ segments of one template copies their list numbers and PQ
    codes (deleted documents' dropped, positions moved) instead of coding the vectors
    again; the merged file is what coding them again would write."""
    import shutil
    dst = tmp_path / "db"
    shutil.copytree(ivf_path, dst)
    with npmdb.open(dst, progress=False) as db:
        db.delete([sample_corpus[30]["id"], sample_corpus[1600]["id"]])
        before = [[(a.text, round(a.score, 5)) for a in db.fill_mask(q, exact=True, top=5)]
                  for q in QUERIES]
        with db.snapshot() as snap:  # segment 0 is flat: only its rows need coding
            flags0 = snap.segments[0].columns().flags
            need0 = int(np.count_nonzero(flags0 & (VALID_START | VALID_END)))
        coded = []
        real = I.Coder.encode
        monkeypatch.setattr(I.Coder, "encode",
                            lambda self, v, labels: coded.append(len(labels)) or
                            real(self, v, labels))
        db.optimize()
        assert db.stats()["index"] == {"ivf": 1}
        assert sum(coded) == need0
        after = [[(a.text, round(a.score, 5)) for a in db.fill_mask(q, exact=True, top=5)]
                 for q in QUERIES]
        assert after == before
        with db.snapshot() as snap:
            seg = snap.segments[0]
            got = seg.ivf_coded(snap.generation)
            valid = np.flatnonzero(seg.columns().flags & (VALID_START | VALID_END))
            np.testing.assert_array_equal(got.labels, valid)  # every start or end, once
            tmpl = I.load_template(I.read_template(db.env, snap.generation), seg.dim)
            monkeypatch.setattr(I.Coder, "encode", real)
            want = I.Coder(tmpl).encode(seg.vectors(snap.txn, snap.generation, got.labels),
                                        got.labels)
            np.testing.assert_array_equal(got.lists, want.lists)
            np.testing.assert_array_equal(got.codes, want.codes)
        assert db.check().ok


def _set_meta(path: Path, key: bytes, value) -> None:
    from npmdb.storage import format as F

    with npmdb.open(path, progress=False) as db:
        db.env.write(lambda txn: txn.put(key, F.pack(value), db=db.env.dbs["meta"]))


def test_a_damaged_template_is_found_by_check_and_refused_by_the_next_add(ivf_path, tmp_path,
                                                                          sample_corpus):
    """The template had no checksum and check never read it: a flipped header byte made
    the next add FAISS's RuntimeError, one in the centroids coded new segments against
    lists never trained, and check said OK both times."""
    import shutil

    good = _template(ivf_path)
    for at, what in ((40, "header"), (len(good) // 2, "centroids")):
        dst = tmp_path / what
        shutil.copytree(ivf_path, dst)
        bad = bytearray(good)
        bad[at] ^= 0x20
        _set_meta(dst, I.template_key(0), {"template": bytes(bad), "crc": I.template_value(
            good)["crc"]})
        with npmdb.open(dst, readonly=True, progress=False) as db:
            rep = db.check()
        assert not rep.ok and any("ivf:g0" in p.where and "checksum" in p.message
                                  for p in rep.errors), rep.problems
        with npmdb.open(dst, progress=False) as db:
            before = db.version
            with pytest.raises(npmdb.OperationalError, match="IVF template of generation 0 "
                                                             "is damaged"):
                db.add(sample_corpus[2300:2400])
            assert db.version == before


def test_a_template_stored_without_its_checksum_still_reads(ivf_path, tmp_path, sample_corpus):
    """Databases written before the checksum stored the template's bytes alone."""
    import shutil

    dst = tmp_path / "db"
    shutil.copytree(ivf_path, dst)
    _set_meta(dst, I.template_key(0), _template(ivf_path))   # the old form: bare bytes
    with npmdb.open(dst, progress=False) as db:
        assert db.check().ok
        db.add(sample_corpus[2300:2400])
        assert db.check().ok and _template(dst) == _template(ivf_path)
    with pytest.raises(npmdb.OperationalError, match="cannot be read"):
        I.template_nlist(b"\0" * 64)   # FAISS's own error on bytes it cannot read
