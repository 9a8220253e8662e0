"""Vector codecs: the product quantiser (trained per database, state in LMDB), int8 and
float16 through whole databases, and the codec registry."""

from __future__ import annotations

import numpy as np
import pytest

import npmdb
from npmdb.errors import DataError, OperationalError
from npmdb.storage import codec as C
from npmdb.storage import format as F

QUERY = "The capital of France is [MASK]."


def _clustered(n: int, dim: int, seed: int = 0) -> np.ndarray:
    """Vectors with structure (a few directions plus noise), like hidden states."""
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((16, dim)).astype(np.float32) * 3
    return (centers[rng.integers(0, 16, n)] + rng.standard_normal((n, dim))).astype(np.float32)


# ------------------------------------------------------------------ the PQ codec alone


def test_pq_names_and_sizes():
    assert C.get_codec("pq").bytes_per_vector(384) == 96          # dim / 4 by default
    assert C.get_codec("pq48").bytes_per_vector(384) == 48
    assert C.get_codec("pq").bytes_per_vector(32) == 8
    assert C.is_stateful("pq") and C.is_stateful("pq96:0123456789abcdef")
    assert not C.is_stateful("float16")
    for bad in ("pq0", "pq:zz", "lz4", ""):
        with pytest.raises(DataError):
            C.get_codec(bad)
    with pytest.raises(DataError):  # 7 sub-quantisers do not divide 32 dimensions
        C.PQSpec("pq7", 7).train(_clustered(300, 32))


def test_pq_round_trip_and_adc():
    x = _clustered(3000, 32)
    pq = C.PQSpec("pq", None).train(x, niter=8)
    assert pq.name.startswith("pq8:") and pq.m == 8 and pq.bytes_per_vector(32) == 8
    codes = pq.encode(x)
    assert codes.dtype == np.uint8 and codes.shape == (3000, 8)
    # FAISS's encoder and the numpy nearest-centroid search agree
    alt = C._nearest_codes(x.reshape(3000, 8, 4).transpose(1, 0, 2), pq.centroids).T
    assert np.array_equal(alt, codes)
    y = pq.decode(codes)
    assert y.dtype == np.float32 and y.shape == x.shape
    # far better than the spread of the data (k-means reconstruction)
    assert np.linalg.norm(y - x) < 0.6 * np.linalg.norm(x - x.mean(0))
    # decoding is a gather: every sub-vector is one of its sub-space's centroids
    assert np.array_equal(y[5].reshape(8, 4), pq.centroids[np.arange(8), codes[5]])
    q = np.random.default_rng(1).standard_normal(32).astype(np.float32)
    assert np.allclose(pq.scores(codes, q), y @ q, rtol=1e-4, atol=1e-3)


def test_pq_tiny_sample_and_determinism():
    x = _clustered(40, 32)  # fewer rows than centroids: still trains
    a = C.PQSpec().train(x)
    b = C.PQSpec().train(x)
    assert a.name == b.name  # same sample, same seed: same centroids, same name
    assert a.decode(a.encode(x)).shape == x.shape
    with pytest.raises(DataError):
        C.PQSpec().train(np.zeros((0, 32), np.float32))


def test_pq_state_round_trip_and_corruption():
    pq = C.PQSpec().train(_clustered(500, 32))
    state = F.unpack(F.pack(pq.state()))  # what LMDB holds: msgpack + packed array, no pickle
    again = C.PQCodec.from_state(pq.name, state)
    codes = pq.encode(_clustered(10, 32, seed=3))
    assert np.array_equal(again.decode(codes), pq.decode(codes))
    bad = dict(state)
    raw = bytearray(bad["centroids"])
    raw[-1] ^= 0xFF
    bad["centroids"] = bytes(raw)
    with pytest.raises(OperationalError):  # CRC of the packed centroids
        C.PQCodec.from_state(pq.name, bad)
    with pytest.raises(OperationalError):  # centroids that do not hash to the name
        C.PQCodec(np.asarray(pq.centroids) + 1, pq.name)


def test_untrained_pq_refuses_to_encode():
    with pytest.raises(OperationalError):
        C.PQSpec().encode(np.zeros((2, 32), np.float32))


# ------------------------------------------------------------------ whole databases


@pytest.fixture(scope="module")
def codec_dbs(tmp_path_factory, tiny_encoder, sample_corpus):
    """The same 300 documents in one database per codec (two adds each)."""
    root = tmp_path_factory.mktemp("codecs")
    paths = {}
    for name in ("float16", "int8", "int4", "pq", "pq16"):
        path = root / name
        with npmdb.open(path, encoder=tiny_encoder, codec=name, progress=False) as db:
            db.add(sample_corpus[:150])
            db.add(sample_corpus[150:300])
        paths[name] = path
    return paths


def _segment_infos(db) -> list[dict]:
    with db.env.read() as txn:
        cur = txn.cursor(db=db.env.dbs["segments"])
        return [F.unpack(v) for _, v in cur.iternext()]


def _stored_width(db) -> set[int]:
    with db.env.read() as txn:
        cur = txn.cursor(db=db.env.dbs["vectors"])
        return {F.unpack_array(v).shape[1] for v in cur.iternext(keys=False, values=True)}


def test_codec_databases_store_their_width(codec_dbs):
    widths = {"float16": 64, "int8": 36, "int4": 20, "pq": 8, "pq16": 16}  # dim 32
    for name, path in codec_dbs.items():
        with npmdb.open(path, progress=False) as db:
            assert db.config["codec"] == name
            width = _stored_width(db)
            itemsize = 2 if name == "float16" else 1
            assert {w * itemsize for w in width} == {widths[name]}
            res = db.fill_mask(QUERY, top=3, retrieval="dense")
            assert len(res) > 0


def test_pq_state_lives_in_lmdb_and_names_the_segments(codec_dbs):
    with npmdb.open(codec_dbs["pq"], progress=False) as db:
        infos = _segment_infos(db)
        names = {i["codec"] for i in infos}
        assert len(names) == 1  # trained once, on the first add; the second add reuses it
        (name,) = names
        assert name.startswith("pq8:")
        with db.env.read() as txn:
            assert F.unpack(txn.get(C.CODEC_STATE_KEY.encode(), db=db.env.dbs["meta"])) == name
            assert txn.get(f"codec:{name}".encode(), db=db.env.dbs["meta"]) is not None
        assert C.load_codec(db.env, "pq").name == name
        assert C.load_codec(db.env, name).name == name


def test_pq_database_reopens_without_the_process_cache(codec_dbs):
    with npmdb.open(codec_dbs["pq"], progress=False) as db:
        before = [(a.text, a.score) for a in db.fill_mask(QUERY, top=5, retrieval="dense")]
    C._LOADED.clear()  # a new process: the centroids come back from LMDB
    with npmdb.open(codec_dbs["pq"], readonly=True, progress=False) as db:
        after = [(a.text, a.score) for a in db.fill_mask(QUERY, top=5, retrieval="dense")]
    assert after == before


def test_two_pq_databases_open_at_once(codec_dbs):
    C._LOADED.clear()
    with npmdb.open(codec_dbs["pq"], progress=False) as a, \
            npmdb.open(codec_dbs["pq16"], progress=False) as b:
        ra = a.fill_mask(QUERY, top=3, exact=True)
        rb = b.fill_mask(QUERY, top=3, exact=True)
        assert len(ra) and len(rb)
        # each decodes with its own centroids (the segment names them)
        assert {i["codec"] for i in _segment_infos(a)} != {i["codec"] for i in _segment_infos(b)}


@pytest.mark.parametrize("name,tol,common", [("int8", 0.05, 10), ("int4", 0.15, 8)])
def test_codec_scores_track_float16(codec_dbs, name, tol, common):
    """Exact scores of the same spans: int8 within a few per cent of float16, int4 within
    fifteen."""
    with npmdb.open(codec_dbs["float16"], progress=False) as f16, \
            npmdb.open(codec_dbs[name], progress=False) as other:
        a = {x.text: x.score for x in f16.fill_mask(QUERY, top=20, exact=True, scoring="raw")}
        b = {x.text: x.score for x in other.fill_mask(QUERY, top=20, exact=True, scoring="raw")}
        both = set(a) & set(b)
        assert len(both) >= common
        for t in both:
            assert b[t] == pytest.approx(a[t], rel=tol, abs=tol)


def test_int4_codes_round_trip_to_the_nearest_level():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((500, 48)).astype(np.float32)
    x[0] = 0.0  # a constant vector
    c = C.get_codec("int4")
    stored = c.encode(x)
    assert stored.shape == (500, 48 // 2 + 4) == (500, c.bytes_per_vector(48))
    y = c.decode(stored)
    step = stored[:, -2:].copy().view("<f2").astype(np.float32)
    assert np.all(np.abs(y - x) <= step / 2 + 1e-3 * np.abs(x).max())  # the nearest level
    np.testing.assert_array_equal(y[0], 0.0)
    cos = (x[1:] * y[1:]).sum(1) / np.linalg.norm(x[1:], axis=1) / np.linalg.norm(y[1:], axis=1)
    assert cos.min() > 0.98
    with pytest.raises(npmdb.DataError, match="even dimension"):
        c.encode(x[:, :47])


def test_pq_database_optimize_and_refresh(tmp_path, tiny_encoder, sample_corpus):
    with npmdb.open(tmp_path / "db", encoder=tiny_encoder, codec="pq", progress=False) as db:
        db.add(sample_corpus[:100])
        db.add(sample_corpus[100:200])
        before = [a.text for a in db.fill_mask(QUERY, top=5, exact=True)]
        db.optimize()  # merges segments: copies codes, decodes them for the new indexes
        assert [a.text for a in db.fill_mask(QUERY, top=5, exact=True)] == before
        assert len(_stored_width(db)) == 1
        merged = db.version
        # already 'pq' (pq8 for 32 dimensions): nothing to convert, no new version (it
        # rewrote the corpus on every call)
        assert db.optimize(codec="pq") == merged == db.optimize(codec="pq8")


def test_vacuum_drops_pq_states_no_kept_segment_uses(tmp_path, tiny_encoder, sample_corpus):
    """A conversion to another PQ size trains a new codec; once no kept version's segments
    store their vectors in the old one, vacuum removes its state (it never did)."""
    def states(db):
        with db.env.read() as txn:
            return sorted(bytes(k).decode() for k in
                          txn.cursor(db=db.env.dbs["meta"]).iternext(values=False)
                          if bytes(k).startswith(b"codec:"))

    with npmdb.open(tmp_path / "db", encoder=tiny_encoder, codec="pq", progress=False) as db:
        db.add(sample_corpus[:200])
        db.tag("pq8")
        db.optimize(codec="pq16")
        assert len(states(db)) == 2
        before = [a.text for a in db.fill_mask(QUERY, top=5, exact=True)]
        assert db.vacuum()["codec_states"] == 0            # the tag keeps the pq8 rows
        db.untag("pq8")
        assert db.vacuum()["codec_states"] == 1
        assert [s.split(":")[1][:4] for s in states(db)] == ["pq16"]
        assert [a.text for a in db.fill_mask(QUERY, top=5, exact=True)] == before
        db.add(sample_corpus[200:220])                       # codes with the current one
        assert len(states(db)) == 1 and db.check().clean


# ------------------------------------------------------------------ codec "auto" and optimize


def test_auto_codec_compacts_a_large_corpus_and_optimize_converts(tmp_path, tiny_encoder,
                                                                  sample_corpus, monkeypatch):
    """New databases store float16 while the corpus is small and int4 once it is large (the
    index's threshold); optimize() re-codes every segment to the codec for HEAD's size, and
    optimize(codec=...) converts and records another, with the same top answers."""
    from npmdb.storage import segment_writer as SW

    monkeypatch.setattr(SW, "AUTO_IVF_TOKENS", 15_000)
    with npmdb.open(tmp_path / "db", encoder=tiny_encoder, progress=False) as db:
        assert db.config["codec"] == "auto" and db.config["dense"] == "auto"
        db.add(sample_corpus[:200])                    # a corpus below 15k tokens
        assert db.stats()["tokens"] < 15_000
        db.add(sample_corpus[200:1400])
        db.add(sample_corpus[1400:1500])               # HEAD is large now
        assert [i["codec"] for i in _segment_infos(db)] == ["float16", "float16", "int4"]
        assert _stored_width(db) == {32, 20}           # float16 rows (dim 32), int4 rows
        want = [a.text for a in db.fill_mask(QUERY, top=3, exact=True)]
        db.optimize()
        assert [i["codec"] for i in _segment_infos(db)][-1:] == ["int4"]
        with db.snapshot() as snap:
            assert [s.record.codec for s in snap.segments] == ["int4"]
        got = [a.text for a in db.fill_mask(QUERY, top=3, exact=True)]
        assert got[0] == want[0]
        v = db.version
        for bad in ("lz4", "pq٤", "pq04", "pq4\n"):  # only ASCII digits name sub-quantisers
            with pytest.raises(npmdb.ProgrammingError, match="unknown vector codec"):
                db.optimize(codec=bad)
        assert db.version == v and db.config["codec"] == "auto"
        db.optimize(codec="int8")
        with db.snapshot() as snap:
            assert [s.record.codec for s in snap.segments] == ["int8"]
        assert db.config["codec"] == "int8"
        assert [a.text for a in db.fill_mask(QUERY, top=3, exact=True)][0] == want[0]
        assert db.check().ok


def test_a_codec_that_does_not_fit_the_encoder_is_refused_up_front(tmp_path, tiny_encoder):
    """pqM must divide the encoder's width: refused at open (nothing created) and by
    optimize, not by every later add; reopening with another codec is refused as another
    index is, not ignored."""
    path = tmp_path / "db"
    with pytest.raises(npmdb.ProgrammingError, match=r"3 sub-quantisers do not divide dim "
                                                     r"32; .* M one of 1, 2, 4, 8, 16, 32"):
        npmdb.open(path, encoder=tiny_encoder, codec="pq3")
    assert not path.exists()
    with npmdb.open(path, encoder=tiny_encoder, codec="float16", progress=False) as db:
        db.add(["Salem is the capital of Oregon."])
        with pytest.raises(npmdb.ProgrammingError, match="do not divide dim 32"):
            db.optimize(codec="pq64")
        assert len(db.versions()) == 1
    with pytest.raises(npmdb.ProgrammingError, match=r"writes 'float16' vectors, not 'int8'.*"
                                                     r"db.optimize\(codec='int8'\)"):
        npmdb.open(path, codec="int8")
    with npmdb.open(path, codec="float16", progress=False) as db:  # the same: fine
        assert db.count() == 1


def test_check_finds_a_damaged_pq_state(tmp_path, tiny_encoder, sample_corpus):
    """The centroids of a trained codec were checked only when a query loaded them: every
    query failed and sent the user to `npmdb check`, which said OK."""
    with npmdb.open(tmp_path / "db", encoder=tiny_encoder, codec="pq", progress=False) as db:
        db.add(sample_corpus[:100])
        with db.env.read() as txn:
            key, raw = next((bytes(k), bytes(v)) for k, v in txn.cursor(db=db.env.dbs["meta"])
                            if bytes(k).startswith(b"codec:"))
        state = F.unpack(raw)
        cents = bytearray(state["centroids"])
        cents[-5] ^= 0x20
        state["centroids"] = bytes(cents)
        db.env.write(lambda txn: txn.put(key, F.pack(state), db=db.env.dbs["meta"]))
    C._LOADED.clear()  # this process loaded the good state when it coded the vectors
    with npmdb.open(tmp_path / "db", readonly=True, progress=False) as db:
        rep = db.check()
        assert not rep.ok and any(p.where == f"meta {key.decode()}" and "checksum" in p.message
                                  for p in rep.errors), rep.problems
        assert "run `npmdb check`" not in str(rep.problems)
        # queries refuse it as before, and name the same damage
        with pytest.raises(OperationalError):
            db.fill_mask(QUERY, retrieval="dense")
