"""The executor runs concurrent sibling operators (the start and end ANN searches) side by
side: answers, scores and the recorded stages must be those of running them one by one."""

from __future__ import annotations

import threading

import pytest

import npmdb
from npmdb.query import operators as O
from npmdb.query.spec import DocFilter

QUERIES = ["Salem is located in [MASK].", "The capital of Peru is [MASK].",
           "Thessaloniki is a city in [MASK].", "Chopin was a [MASK]."]


@pytest.fixture(scope="module")
def two_segments(tmp_path_factory, tiny_encoder, sample_corpus):
    path = tmp_path_factory.mktemp("executor") / "db"
    with npmdb.open(path, encoder=tiny_encoder, progress=False) as db:
        db.add(sample_corpus[:200])
        db.add(sample_corpus[200:400])
        db.delete([sample_corpus[3]["id"]])
    return path


def _run(db, **kw):
    """Each query's answers and operators; dense retrieval unless ``kw`` names another (the
    siblings under test are the two DenseTopK searches)."""
    out = []
    for q in QUERIES:
        r = db.fill_mask(q, top=5, **{"retrieval": "dense", **kw})
        out.append(([(a.text, a.score) for a in r.answers], [s.operator for s in r.stats]))
    return out


TITLE_S = DocFilter("title starts with S", lambda d: d.title.startswith("S"))


@pytest.mark.parametrize("kw", [{}, {"retrieval": "hybrid"}, {"mode": "token"},
                                {"doc_filter": TITLE_S}])
def test_concurrent_siblings_answer_as_serial_ones(two_segments, monkeypatch, kw):
    with npmdb.open(two_segments, readonly=True, progress=False) as db:
        together = _run(db, **kw)
        monkeypatch.setattr(O.DenseTopK, "concurrent", False)
        serial = _run(db, **kw)
    assert together == serial


def test_plan_records_both_searches_and_explains_the_same(two_segments):
    with npmdb.open(two_segments, readonly=True, progress=False) as db:
        r = db.fill_mask(QUERIES[0], top=3, retrieval="dense")
        ops = [s.operator for s in r.stats]
        assert ops.count("DenseTopK") == 2 and ops.index("EncodeQuery") < ops.index("DenseTopK")
        assert ops[-1] == "Limit" or ops[-1] == "AttachEvidence"
        assert "DenseTopK (side=start" in r.plan and "DenseTopK (side=end" in r.plan


def test_many_threads_querying_at_once(two_segments):
    with npmdb.open(two_segments, readonly=True, progress=False) as db:
        want = _run(db)
        errors, got = [], []

        def worker():
            try:
                for _ in range(3):
                    got.append(_run(db))
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=worker) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors, errors
    assert all(g == want for g in got)


def test_per_segment_waits_for_every_task_before_raising():
    """A task still running after its query failed would read the snapshot's zero-copy
    pages after the snapshot (or the database) was closed: a failure is raised only once
    every task of the call has ended."""
    import time

    from npmdb.query.operators import per_segment

    ended = []

    def fn(si):
        if si == 0:
            raise ValueError("segment 0 failed")
        time.sleep(0.3)
        ended.append(si)
        return si

    with pytest.raises(ValueError, match="segment 0 failed"):
        per_segment(fn, 2)
    assert ended == [1]


@pytest.mark.parametrize("kw", [{"retrieval": "dense"}, {}, {"mode": "token", "group_by": "word"},
                                {"offset": 3}])
def test_query_word_filters_pushed_into_aggregate_keep_the_answers(two_segments, kw):
    """The query-word filters run on the grouping keys inside Aggregate, before its top-n:
    the same answers (scores, support, evidence) as filtering every answer after it."""
    from npmdb.query.executor import execute
    from npmdb.query.planner import plan_masked
    from npmdb.query.spec import MaskedSpec

    with npmdb.open(two_segments, readonly=True, progress=False) as db:
        for q in QUERIES + ["Salem is the capital of [MASK] in Salem."]:
            spec = MaskedSpec(q, top=5, evidence=2, **kw)
            pushed = plan_masked(spec)
            after = plan_masked(spec, answer_filter=("every answer", lambda g: True))
            assert "of those kept by" in pushed.explain()
            assert "of those kept by" not in after.explain()
            with db._context() as ctx:
                a, b = execute(pushed, ctx), execute(after, ctx)
            assert [(x.text, x.score, x.support, x.evidence) for x in a.answers] == \
                [(x.text, x.score, x.support, x.evidence) for x in b.answers]
            assert a.info["answers"] == b.info["answers"]


def test_doc_filters_sharing_a_description_keep_their_own_documents(two_segments):
    """The snapshot caches each filter's document mask; two filters with one description
    but different predicates must not share it (a stale mask answered from the wrong
    documents). The query language reuses one filter per predicate text, so a statement
    run again still finds its mask."""
    with npmdb.open(two_segments, readonly=True, progress=False) as db:
        hits = db.search("Salem capital", limit=6, title=True)
        ids = [h["doc_id"] for h in hits]
        assert len(set(ids)) >= 4
        q = "Salem is the capital of [MASK]."
        got = []
        for allowed in ({ids[0]}, {ids[3]}):
            f = DocFilter("same description", lambda d, allowed=allowed: d.id in allowed)
            res = db.fill_mask(q, top=5, evidence=5, doc_filter=f)
            got.append({e.doc_id for a in res for e in a.evidence})
        assert got[0] <= {ids[0]} and got[1] <= {ids[3]} and got[0] != got[1]
        stmt = "SELECT phrase FROM MASKED(?) WHERE doc.id = ? LIMIT 3"
        first = db.sql(stmt, [q, ids[0]])
        assert db.sql(stmt, [q, ids[0]]).rows == first.rows
        assert db.sql(stmt, [q, ids[3]]).rows != first.rows
        before = len(db._filter_cache)
        db.sql(stmt, [q, ids[0]])
        assert len(db._filter_cache) == before   # the same predicate's masks were reused
