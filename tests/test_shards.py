"""Sharded search (npmdb.shards, npmdb.query.exchange): a query over N shards gives the
answers, scores and evidence of one process over the same version.

The shards run in this process (``engine="local"``) and on a local Ray cluster of two
worker processes (``engine="ray"``, skipped only where the optional npmdb[ray] extra is not
installed). Databases have four segments or more, with deleted documents and two versions.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import npmdb

QUERIES = ["Salem is the capital of [MASK].", "Thessaloniki is a city in [MASK].",
           "The currency of Japan is the [MASK]."]
RETRIEVALS = [dict(retrieval="dense"), dict(retrieval="dense", exact=True),
              dict(retrieval="bm25"), dict(retrieval="hybrid", k=256),
              dict(retrieval="dense", mode="token"),
              dict(retrieval="dense", mode="token", group_by="word"),
              dict(retrieval="bm25", group_by="document"), dict(retrieval="bm25", mode="token"),
              dict(retrieval="dense", group_by="tokens", k=128)]
LABELS = {"positive": ["great", "good"], "negative": ["terrible", "bad"]}


def _build(path, encoder, docs, **kw):
    with npmdb.open(path, encoder=encoder, progress=False, **kw) as db:
        for i in range(4):  # one segment each
            db.add(docs[i * 120:(i + 1) * 120], message=f"part {i}")
        db.tag("four-parts")
        db.delete([docs[3]["id"], docs[200]["id"]], message="two gone")
        db.add(docs[480:520], message="a fifth segment")
    return path


@pytest.fixture(scope="module")
def hnsw_db_path(tmp_path_factory, tiny_encoder, sample_corpus):
    return _build(tmp_path_factory.mktemp("shards-hnsw") / "db", tiny_encoder, sample_corpus)


@pytest.fixture(scope="module")
def ivf_db_path(tmp_path_factory, tiny_encoder, sample_corpus):
    """The large-corpus kind: int4 rows, IVF-PQ (approximate candidates re-scored)."""
    return _build(tmp_path_factory.mktemp("shards-ivf") / "db", tiny_encoder, sample_corpus,
                  index="ivf", codec="int4")


@pytest.fixture(params=["hnsw", "ivf"])
def sharded_db_path(request):
    return request.getfixturevalue(f"{request.param}_db_path")


def _answers(res):
    return [(a.text, a.score, a.support, a.tokens, a.evidence) for a in res.answers]


def _same(one, many, run):
    a, b = run(one), run(many)
    assert _answers(a) == _answers(b)
    return a, b


def _check_all(one, many):
    for q in QUERIES:
        for opts in RETRIEVALS:
            _same(one, many, lambda db: db.fill_mask(q, top=8, evidence=2, **opts))
    # a tau that underflows most scores: shards rank them by their logs as one process does
    _same(one, many, lambda db: db.fill_mask(QUERIES[0], retrieval="dense", tau=1e-3, top=20))
    _same(one, many, lambda db: db.fill_mask(QUERIES[1], mode="token", tau=1e-3, top=20))
    # AS OF an older version (four segments, nothing deleted)
    _same(one, many, lambda db: db.fill_mask(QUERIES[0], version="four-parts", evidence=1, retrieval="dense"))
    _same(one, many, lambda db: db.classify("A gorgeous, witty film. It was [MASK].", LABELS,
                                            evidence=1))
    _same(one, many, lambda db: db.classify("Dull and long. It was [MASK].", LABELS,
                                            retrieval="bm25", calibrate=True))
    assert one.search("capital city", limit=7) == many.search("capital city", limit=7)
    for stmt in ("SELECT phrase, score, support FROM MASKED('Salem is the capital of [MASK].') "
                 "WHERE doc.title LIKE 'S%' LIMIT 5",
                 "SELECT phrase, doc_id, start, end, snippet, score FROM "
                 "EVIDENCE('Thessaloniki is a city in [MASK].') LIMIT 6",
                 "SELECT doc_id, title, snippet, score FROM SEARCH('church') LIMIT 4",
                 "SELECT tokens, score FROM TOKENS('The capital of Greece is [MASK].') "
                 "USING dense(k => 64) LIMIT 5"):
        assert one.sql(stmt).rows == many.sql(stmt).rows, stmt


def test_local_shards_answer_as_one_process(sharded_db_path):
    with npmdb.open(sharded_db_path, readonly=True) as one, \
            npmdb.open(sharded_db_path, readonly=True, engine="local", shards=2) as many:
        _check_all(one, many)


def test_shards_over_approximate_ivf_segments_and_a_flat_one(tmp_path, tiny_encoder,
                                                            sample_corpus):
    """A first IVF add too small to train gets an exact segment: a shard holding only it
    sent no refine factor (KeyError). Each shard probed lists by its own segments' entries,
    not the version's, so its candidates (and the answers) differed from one process."""
    path = tmp_path / "db"
    with npmdb.open(path, encoder=tiny_encoder, index="ivf", codec="int4",
                    progress=False) as db:
        db.add(sample_corpus[:5])
        db.add(sample_corpus[5:1800])
        db.add(sample_corpus[1800:2600])
    with npmdb.open(path, readonly=True) as one, \
            npmdb.open(path, readonly=True, engine="local", shards=3) as many:
        with one.snapshot() as snap:
            approximate = [s.ivf_file(snap.generation).approximate for s in snap.segments]
        assert approximate == [False, True, True]
        for q in QUERIES:
            _same(one, many, lambda db: db.fill_mask(q, retrieval="dense", k=32, evidence=1))
            _same(one, many, lambda db: db.fill_mask(q, retrieval="dense", mode="token",
                                                     k=64))


_ADD_AND_VACUUM = """
import sys, npmdb
with npmdb.open(sys.argv[1], progress=False) as w:
    w.add(["another document"], message="more")
    w.vacuum()
"""


def test_a_version_vacuumed_while_a_sharded_query_runs(tmp_path, tiny_encoder, sample_corpus,
                                                       monkeypatch):
    """Another process commits and vacuums the version a sharded query reads between the
    coordinator's snapshot and the shards': an OperationalError to retry (it was the
    ProgrammingError "no version 2" of a version that never existed)."""
    import npmdb.query.exchange as X

    path = tmp_path / "db"
    with npmdb.open(path, encoder=tiny_encoder, progress=False) as db:
        db.add(sample_corpus[:100])
        db.add(sample_corpus[100:200])
    run, fired = X.Exchange.run, []

    def racing(self, st):
        if not fired:
            fired.append(subprocess.run([sys.executable, "-c", _ADD_AND_VACUUM, str(path)],
                                        capture_output=True, text=True, timeout=300))
        return run(self, st)

    monkeypatch.setattr(X.Exchange, "run", racing)
    with npmdb.open(path, readonly=True, engine="local", shards=2) as many:
        with pytest.raises(npmdb.OperationalError, match="removed by a vacuum"):
            many.fill_mask(QUERIES[0], retrieval="dense")
        assert fired[0].returncode == 0, fired[0].stderr
        assert many.fill_mask(QUERIES[0], retrieval="dense").version == 3  # the retry


def test_more_shards_than_segments(hnsw_db_path):
    with npmdb.open(hnsw_db_path, readonly=True) as one, \
            npmdb.open(hnsw_db_path, readonly=True, engine="local", shards=7) as many:
        a, b = _same(one, many, lambda db: db.fill_mask(QUERIES[1], evidence=3, retrieval="dense"))
        assert b.info["shards"]["segments"].count(0) == 2  # 5 segments over 7 shards


def test_explain_analyze_shows_the_exchange_and_shard_times(ivf_db_path):
    with npmdb.open(ivf_db_path, readonly=True, engine="local", shards=2) as db:
        res = db.fill_mask(QUERIES[0], retrieval="dense")
        plan = res.plan
        assert "Exchange (shards=2, engine=local)" in plan
        line = next(li for li in plan.splitlines() if "DenseTopK" in li)
        assert "shard ms: " in line and "time=" in line
        assert sorted(res.info["shards"]["segments"]) == [2, 3]
        text = db.sql("EXPLAIN SELECT phrase FROM MASKED('Salem is the capital of [MASK].')"
                      ).rows
        assert any("Exchange" in str(r) for r in text)


def test_shard_assignment_balances_tokens(ivf_db_path):
    from npmdb.query.exchange import assign

    with npmdb.open(ivf_db_path, readonly=True) as db, db.snapshot() as snap:
        owned = assign(snap, 2)
        assert sorted(si for o in owned for si in o) == list(range(len(snap.segments)))
        load = [sum(snap.segments[si].record.tokens for si in o) for o in owned]
        biggest = max(seg.record.tokens for seg in snap.segments)
        assert abs(load[0] - load[1]) <= biggest
        with pytest.raises(npmdb.OperationalError, match="disagree on the version"):
            snap.subset([0, 99])


def test_sharded_handle_is_checked(ivf_db_path):
    with pytest.raises(npmdb.ProgrammingError, match="readonly=True"):
        npmdb.open(ivf_db_path, engine="local", shards=2)
    with pytest.raises(npmdb.ProgrammingError, match="shards must be a positive integer"):
        npmdb.open(ivf_db_path, readonly=True, engine="local", shards=0)
    with pytest.raises(npmdb.ProgrammingError, match="needs shards=N"):
        npmdb.open(ivf_db_path, readonly=True, engine="ray")
    with pytest.raises(npmdb.ProgrammingError, match="'ray' or 'local'"):
        npmdb.open(ivf_db_path, readonly=True, engine="spark", shards=2)


def test_shards_read_the_version_the_query_names(tmp_path, tiny_encoder, sample_corpus):
    """A new version written while a sharded handle is open: the next query reads it (the
    shards open each request's version), and AS OF still reads the old one."""
    path = _build(tmp_path / "db", tiny_encoder, sample_corpus)
    with npmdb.open(path, readonly=True, engine="local", shards=2) as many:
        before = many.fill_mask(QUERIES[0], top=3, retrieval="dense")
        # another process writes (this one holds the directory read-only)
        code = ("import json, sys, npmdb\n"
                "with npmdb.open(sys.argv[1], progress=False) as w:\n"
                "    w.add(json.loads(sys.stdin.read()), message='more')\n")
        subprocess.run([sys.executable, "-c", code, str(path)], check=True,
                       input=json.dumps(sample_corpus[600:700]), text=True)
        after = many.fill_mask(QUERIES[0], top=3, retrieval="dense")
        assert after.version == before.version + 1
        with npmdb.open(path, readonly=True) as one:
            assert _answers(after) == _answers(one.fill_mask(QUERIES[0], top=3, retrieval="dense"))
            old = one.fill_mask(QUERIES[0], top=3, version=before.version, retrieval="dense")
        assert _answers(many.fill_mask(QUERIES[0], top=3, version=before.version, retrieval="dense")) == \
            _answers(old)


# -- on a local Ray cluster ---------------------------------------------------------------------


@pytest.mark.ray
def test_ray_shards_answer_as_one_process(ray_cluster, ivf_db_path):
    with npmdb.open(ivf_db_path, readonly=True) as one, \
            npmdb.open(ivf_db_path, readonly=True, engine="ray", shards=2) as many:
        pids = many._shards.pids()
        assert len(set(pids)) == 2  # two worker processes
        _check_all(one, many)
        assert "Exchange (shards=2, engine=ray)" in many.fill_mask(QUERIES[0], retrieval="dense").plan


@pytest.mark.ray
def test_ray_shard_killed_is_started_again(ray_cluster, ivf_db_path):
    """A shard killed for good between queries is replaced and the next query answers
    whole; one killed during a query makes it answer whole or raise OperationalError."""
    import threading

    with npmdb.open(ivf_db_path, readonly=True) as one, \
            npmdb.open(ivf_db_path, readonly=True, engine="ray", shards=2) as many:
        want = _answers(one.fill_mask(QUERIES[1], evidence=2, retrieval="dense"))
        shards = many._shards
        ray_cluster.kill(shards.actors[0], no_restart=True)
        assert _answers(many.fill_mask(QUERIES[1], evidence=2, retrieval="dense")) == want
        assert shards.restarts == 1
        # killed (Ray restarts it) while queries run
        outcomes = []

        def ask():
            for _ in range(6):
                try:
                    outcomes.append(_answers(many.fill_mask(QUERIES[1], evidence=2, retrieval="dense")) == want)
                except npmdb.OperationalError:
                    outcomes.append("error")
        t = threading.Thread(target=ask)
        t.start()
        ray_cluster.kill(shards.actors[1], no_restart=False)
        t.join()
        assert all(o is True or o == "error" for o in outcomes), outcomes
        assert _answers(many.fill_mask(QUERIES[1], evidence=2, retrieval="dense")) == want


@pytest.mark.ray
def test_a_shard_dead_for_good_is_replaced_once_whatever_the_queries(ray_cluster, ivf_db_path):
    """Four queries at once that all found the shard dead each started a replacement
    (the handle kept the last; the others held CPUs until closed)."""
    from concurrent.futures import ThreadPoolExecutor

    with npmdb.open(ivf_db_path, readonly=True, engine="ray", shards=2) as many:
        want = _answers(many.fill_mask(QUERIES[0], retrieval="dense"))
        ray_cluster.kill(many._shards.actors[0], no_restart=True)
        with ThreadPoolExecutor(4) as pool:
            got = list(pool.map(lambda _: _answers(many.fill_mask(QUERIES[0],
                                                                  retrieval="dense")), range(4)))
        assert got == [want] * 4 and many._shards.restarts == 1


@pytest.mark.ray
def test_ray_shards_share_the_cluster_and_say_what_went_wrong(ray_cluster, ivf_db_path,
                                                              hnsw_db_path, tmp_path,
                                                              tiny_encoder, sample_corpus):
    """Shards leave CPUs for a Ray add beside them (it waited for ever); closing the
    handle that started Ray no longer ends it under another (whose queries then failed);
    a shard's npmdb error comes back as itself (it read as Ray's coloured traceback); and
    shards that cannot fit are refused at once (they waited 600 s)."""
    import shutil

    damaged = tmp_path / "damaged"
    shutil.copytree(hnsw_db_path, damaged)
    with npmdb.open(ivf_db_path, readonly=True, engine="ray", shards=2) as many:
        want = _answers(many.fill_mask(QUERIES[0], retrieval="dense"))
        with npmdb.open(tmp_path / "new", encoder=tiny_encoder, progress=False) as db:
            db.add(sample_corpus[:20], engine="ray")
            assert db.count() == 20
        other = npmdb.open(damaged, readonly=True, engine="ray", shards=2)
        other.close()
        assert _answers(many.fill_mask(QUERIES[0], retrieval="dense")) == want
        with pytest.raises(npmdb.OperationalError, match="CPUs.*free.*RayShards\\(cpus=\\)"):
            npmdb.shards.RayShards(ivf_db_path, 2, cpus=1.0)
    f = next((damaged / "segments").glob("s*/g0.start.hnsw"))
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0xFF
    f.write_bytes(bytes(data))
    with npmdb.open(damaged, readonly=True, engine="ray", shards=2) as many:
        with pytest.raises(npmdb.OperationalError) as err:
            many.fill_mask(QUERIES[0], retrieval="dense")
    assert "\x1b[" not in str(err.value) and "ray::" not in str(err.value), err.value
    assert type(err.value) is npmdb.OperationalError


@pytest.mark.ray
def test_handles_that_start_ray_share_one_session(hnsw_db_path, ivf_db_path):
    """In a process where npmdb itself starts Ray: closing the handle that started it
    shut Ray down under the other, whose next query failed; the last one to close ends
    it."""
    pytest.importorskip("ray")
    script = f"""
import ray, npmdb
q = {QUERIES[0]!r}
a = npmdb.open({str(hnsw_db_path)!r}, readonly=True, engine="ray", shards=1)
b = npmdb.open({str(ivf_db_path)!r}, readonly=True, engine="ray", shards=1)
want = [x.text for x in b.fill_mask(q, retrieval="dense")]
a.close()
assert ray.is_initialized()
assert [x.text for x in b.fill_mask(q, retrieval="dense")] == want
b.close()
assert not ray.is_initialized()
print("one session")
"""
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)  # a cluster of its own, not the tests'
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=600, env=env)
    assert p.returncode == 0 and "one session" in p.stdout, p.stderr[-3000:]


@pytest.mark.slow
def test_real_encoder_sharded(real_db_path, tmp_path, sample_corpus):
    """The shipped encoder's database with a second segment, sharded in process: the
    same answers."""
    import shutil

    path = tmp_path / "db"
    shutil.copytree(real_db_path, path)
    with npmdb.open(path, progress=False) as db:
        have = {d["id"] for d in db.documents()}
        db.add([d for d in sample_corpus if d["id"] not in have][:150])
        assert db.stats()["segments"] == 2
    with npmdb.open(path, readonly=True) as one, \
            npmdb.open(path, readonly=True, engine="local", shards=2) as many:
        for q in QUERIES:
            for opts in RETRIEVALS[:5]:
                a, b = _same(one, many, lambda db: db.fill_mask(q, evidence=2, **opts))
                assert sorted(b.info["shards"]["segments"]) == [1, 1]
        assert len(a.answers) == 5
