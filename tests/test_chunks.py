"""Vector chunk size: recorded per segment, so segments written with any chunk size (older
databases used 4,096 tokens) read, merge, refresh and check the same way."""

from __future__ import annotations

import numpy as np
import pytest

import npmdb
from npmdb.storage import format as F
from npmdb.storage import segments as S

QUERIES = ["Salem is located in [MASK].", "The capital of Peru is [MASK].",
           "Thessaloniki is a city in [MASK]."]


def _answers(db, **kw):
    return [[(a.text, round(a.score, 6)) for a in db.fill_mask(q, top=5, exact=True, **kw).answers]
            for q in QUERIES]


def _segment_infos(db) -> dict[int, dict]:
    with db.env.read() as txn:
        return {int.from_bytes(bytes(k), "big"): F.unpack(v)
                for k, v in txn.cursor(db=db.env.dbs["segments"])}


@pytest.fixture(scope="module")
def docs(sample_corpus):
    return sample_corpus[:150]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_encoder, docs):
    """The same documents written with the default chunk size (one chunk per segment)."""
    path = tmp_path_factory.mktemp("chunks-ref") / "db"
    with npmdb.open(path, encoder=tiny_encoder, progress=False) as db:
        db.add(docs)
        return _answers(db), db.fill_mask(QUERIES[0], top=3, retrieval="dense").to_list()


def test_small_chunks_give_the_same_answers_and_check_clean(tmp_path, tiny_encoder, docs,
                                                          reference, monkeypatch):
    monkeypatch.setattr(S, "CHUNK", 97)   # many chunks, none aligned with blocks
    with npmdb.open(tmp_path / "db", encoder=tiny_encoder, progress=False) as db:
        db.add(docs)
        (info,) = _segment_infos(db).values()
        assert info["chunk"] == 97
        assert _answers(db) == reference[0]
        assert db.fill_mask(QUERIES[0], top=3, retrieval="dense").to_list() == reference[1]   # ANN path too
        rep = db.check()
        assert rep.clean, rep
        assert rep.counts["vector_chunks"] == -(-info["tokens"] // 97)


def test_segments_of_different_chunk_sizes_merge_and_refresh(tmp_path, tiny_encoder, docs,
                                                            reference, monkeypatch):
    from npmdb.generations import write_generation

    with npmdb.open(tmp_path / "db", encoder=tiny_encoder, progress=False) as db:
        monkeypatch.setattr(S, "CHUNK", 50)
        db.add(docs[:70])
        monkeypatch.setattr(S, "CHUNK", 128)
        db.add(docs[70:])
        assert sorted(i["chunk"] for i in _segment_infos(db).values()) == [50, 128]
        assert _answers(db) == reference[0]
        # a refresh writes each segment's new vectors in that segment's own chunk size
        model = db.encoder_for(0).model
        write_generation(db, model, steps=1)
        assert _answers(db) == reference[0]
        assert db.check().clean
        monkeypatch.setattr(S, "CHUNK", 64)
        db.optimize()
        (merged,) = [i for i in _segment_infos(db).values() if i.get("merged_from")]
        assert merged["chunk"] == 64
        assert _answers(db) == reference[0]
        assert db.check().clean


def test_a_segment_without_a_recorded_chunk_size_reads_as_legacy(tmp_path, tiny_encoder, docs,
                                                               reference, monkeypatch):
    monkeypatch.setattr(S, "CHUNK", S.LEGACY_CHUNK)
    path = tmp_path / "db"
    with npmdb.open(path, encoder=tiny_encoder, progress=False) as db:
        db.add(docs)

        def drop(txn):   # what a database written before chunk sizes were recorded holds
            for key, value in list(txn.cursor(db=db.env.dbs["segments"])):
                info = F.unpack(value)
                info.pop("chunk")
                txn.put(bytes(key), F.pack(info), db=db.env.dbs["segments"])
        db.env.write(drop)
    monkeypatch.setattr(S, "CHUNK", 65536)
    with npmdb.open(path, progress=False) as db:
        assert "chunk" not in next(iter(_segment_infos(db).values()))
        assert _answers(db) == reference[0]
        assert db.check().clean


def test_gather_reads_rows_in_any_order(tiny_db):
    with tiny_db.snapshot() as snap:
        seg = snap.segments[0]
        n = seg.columns(snap.txn).n_tokens
        pos = np.random.default_rng(0).integers(0, n, 500)
        got = seg.vectors(snap.txn, snap.generation, pos)
        rows = [seg.vectors(snap.txn, snap.generation, np.array([p]))[0] for p in pos[:20]]
        np.testing.assert_array_equal(got[:20], np.stack(rows))
        assert got.dtype == np.float32 and got.shape == (500, seg.dim)
