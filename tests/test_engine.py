"""API behaviour on tiny-encoder databases: adding, versions, errors, locking, deletion,
results and their conversions, closing."""

from __future__ import annotations

import json
import multiprocessing as mp
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import npmdb

sys.path.insert(0, str(Path(__file__).resolve().parent))  # --import-mode=importlib
from conftest import make_tiny_encoder  # noqa: E402

Q = "Thessaloniki is a city in [MASK]."


def fold(s: str) -> str:
    return " ".join(s.split()).casefold()


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """Tiny forward passes: one torch thread is ~100x faster on a busy 2-core machine."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture()
def small_db(new_db, sample_corpus):
    new_db.add(sample_corpus[:80])
    return new_db


# ------------------------------------------------------------------ adding and versions


def test_add_strings_dicts_and_jsonl(new_db, tmp_path):
    assert new_db.count() == 0 and new_db.version is None
    v1 = new_db.add(["Thessaloniki is a city in Greece.", "Salem is the capital of Oregon."])
    assert new_db.count() == 2
    v2 = new_db.add([{"id": "d1", "title": "Athens", "text": "Athens is the capital of Greece.",
                      "meta": {"lang": "en"}},
                     {"id": 42, "text": "Paris is the capital of France."}])
    path = tmp_path / "more.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [
        {"id": "j1", "title": "Rome", "text": "Rome is the capital of Italy."},
        {"id": "j2", "text": "Madrid is the capital of Spain."},
        {"text": "Lisbon is the capital of Portugal."},
    ]), encoding="utf-8")
    v3 = new_db.add(path)
    assert isinstance(v1, int) and v1 < v2 < v3
    assert new_db.version == v3
    assert new_db.count() == 7 and len(new_db) == 7
    d = new_db.get("d1")
    assert d == {"id": "d1", "title": "Athens", "text": "Athens is the capital of Greece.",
                 "meta": {"lang": "en"}}
    assert new_db.get("42")["text"] == "Paris is the capital of France."
    assert new_db.get("j1")["title"] == "Rome"
    ids = [d["id"] for d in new_db.documents()]
    assert len(ids) == len(set(ids)) == 7
    assert {"d1", "42", "j1", "j2"} <= set(ids)
    vs = new_db.versions()
    assert [v["id"] for v in vs] == [v1, v2, v3]
    assert [v["docs"] for v in vs] == [2, 4, 7]
    assert vs[-1]["head"] and not vs[0]["head"]
    # older versions stay readable
    assert new_db.count(version=v1) == 2
    assert new_db.get("d1", version=v1) is None


def test_version_ids_increase_with_deletes_too(new_db):
    seen = [new_db.add([f"Document number {i} is about rivers."]) for i in range(3)]
    first = new_db.documents().__next__()["id"]
    seen.append(new_db.delete(first))
    assert seen == sorted(seen) and len(set(seen)) == 4
    assert new_db.count() == 2


def test_add_nothing_keeps_the_version(small_db):
    v = small_db.version
    assert small_db.add([]) == v
    assert small_db.version == v


def test_duplicate_id_is_an_integrity_error_and_nothing_is_written(small_db, tmp_path):
    before_count, before_version = small_db.count(), small_db.version
    before = small_db.fill_mask(Q, exact=True).to_list()
    existing = next(small_db.documents())["id"]
    with pytest.raises(npmdb.IntegrityError, match="already exists"):
        small_db.add([{"id": "fresh-1", "text": "A new document."},
                      {"id": existing, "text": "A clash."}])
    with pytest.raises(npmdb.IntegrityError, match="duplicate"):
        small_db.add([{"id": "x", "text": "one"}, {"id": "x", "text": "two"}])
    assert small_db.count() == before_count
    assert small_db.version == before_version
    assert small_db.get("fresh-1") is None and small_db.get("x") is None
    assert small_db.fill_mask(Q, exact=True).to_list() == before
    # no orphaned segment directory is left behind
    segs = sorted(p.name for p in (Path(small_db.path) / "segments").iterdir())
    assert len(segs) == small_db.stats()["segments"]
    # and the database still takes writes
    small_db.add([{"id": "fresh-1", "text": "A new document."}])
    assert small_db.count() == before_count + 1


# ------------------------------------------------------------------ query errors


@pytest.mark.parametrize("query", ["Thessaloniki is a city in Greece.",
                                   "[MASK] is a city in [MASK].",
                                   "<mask> and [MASK]", ""])
def test_query_needs_exactly_one_mask(small_db, query):
    with pytest.raises(npmdb.ProgrammingError, match="exactly one mask"):
        small_db.fill_mask(query, retrieval="dense")
    with pytest.raises(npmdb.ProgrammingError):
        small_db.classify(query, {"a": ["Greece"]})


@pytest.mark.parametrize("mask", ["[MASK]", "<mask>", "[mask]", "<MASK>"])
def test_mask_spellings(small_db, mask):
    res = small_db.fill_mask(f"Thessaloniki is a city in {mask}.", exact=True, top=3)
    assert len(res) == 3


def test_non_string_query(small_db):
    with pytest.raises(npmdb.ProgrammingError):
        small_db.fill_mask(42, retrieval="dense")


@pytest.mark.parametrize("opts", [dict(k=0), dict(k=-1), dict(top=-1), dict(max_len=0),
                                  dict(tau=0), dict(tau=-1.0), dict(blocks=0),
                                  dict(mode="span"), dict(retrieval="sparse"), dict(k=2.5),
                                  dict(exact="yes"), dict(alpha="big")])
def test_bad_option_values(small_db, opts):
    with pytest.raises(npmdb.ProgrammingError):
        small_db.fill_mask(Q, **opts)


def test_unknown_option_suggests_the_right_one(small_db):
    with pytest.raises(npmdb.ProgrammingError, match=r"unknown option 'mx_len'.*did you mean "
                                                     r"'max_len'"):
        small_db.fill_mask(Q, mx_len=3, retrieval="dense")
    with pytest.raises(npmdb.ProgrammingError, match="did you mean 'retrieval'"):
        small_db.fill_mask(Q, retreival="bm25", retrieval="dense")
    with pytest.raises(npmdb.ProgrammingError, match="did you mean 'phrase'"):
        small_db.fill_mask(Q, mode="phrse", retrieval="dense")
    with pytest.raises(npmdb.ProgrammingError, match="unknown option"):
        small_db.classify(Q, {"a": ["x"]}, alpha=1.0)


def test_query_on_an_empty_database(new_db):
    with pytest.raises(npmdb.ProgrammingError, match="empty|no documents"):
        new_db.fill_mask(Q, retrieval="dense")
    with pytest.raises(npmdb.ProgrammingError, match="empty|no documents"):
        new_db.classify(Q, {"a": ["Greece"]})


def test_query_after_deleting_everything(new_db):
    new_db.add([{"id": "a", "text": "Thessaloniki is a city in Greece."}])
    new_db.delete("a")
    assert new_db.count() == 0
    with pytest.raises(npmdb.ProgrammingError, match="no documents"):
        new_db.fill_mask(Q, retrieval="dense")


def test_classify_label_errors(small_db):
    with pytest.raises(npmdb.ProgrammingError):
        small_db.classify(Q, {})
    with pytest.raises(npmdb.ProgrammingError):
        small_db.classify(Q, ["Greece"])
    with pytest.raises(npmdb.ProgrammingError):
        small_db.classify(Q, {"a": []})
    # 1 and "1" were two labels named '1', each with both labels' score and support
    with pytest.raises(npmdb.ProgrammingError, match="two labels are named '1'"):
        small_db.classify(Q, {1: "Greece", "1": "Oregon"})
    with pytest.raises(npmdb.ProgrammingError, match="label names are strings"):
        small_db.classify(Q, {None: "Greece"})  # it became a label named 'None'
    res = small_db.classify(Q, {np.int64(0): "Greece", 1: "Oregon"})  # class ids: by digits
    assert sorted(a.text for a in res.answers) == ["0", "1"]


def test_classify_evidence_stays_best_first_where_weights_overflow(small_db):
    """At tau=1e-3 (accepted) each occurrence's exp(logit) passes a float's range: every
    evidence score read exp(700) and the evidence came in text order. Ranked by the logits
    now, with inf where the weight overflows."""
    labels = {"place": ["Greece", "Oregon", "city", "capital", "state"]}
    wide = small_db.classify(Q, labels, tau=1.0, evidence=8).answers[0].evidence
    tight = small_db.classify(Q, labels, tau=1e-3, evidence=8).answers[0].evidence
    key = [(e.doc_id, e.start) for e in wide]
    assert len(key) > 1 and [(e.doc_id, e.start) for e in tight] == key
    assert all(e.score == float("inf") or e.score > 1e300 for e in tight)


def test_a_label_word_spelt_twice_counts_its_candidates_once(small_db):
    """Words that fold alike ("Greece", "greece") or repeat are one word of the label: each
    copy added the candidates again, doubling the label's score and support."""
    one = small_db.classify(Q, {"place": ["Greece"], "other": ["Oregon"]}, exact=True)
    for words in (["Greece", "greece"], ["Greece", "Greece", "GREECE"]):
        again = small_db.classify(Q, {"place": words, "other": ["Oregon"]}, exact=True)
        assert [(a.text, a.score, a.support) for a in again.answers] == \
            [(a.text, a.score, a.support) for a in one.answers]
    assert any(a.support for a in one.answers)


def test_search_options_are_checked_by_name_and_take_numpy(small_db):
    with pytest.raises(npmdb.ProgrammingError, match="search: unknown option 'limt'; did you "
                                                     "mean 'limit'"):
        small_db.search("capital", limt=3)  # a bare TypeError before
    words = [w for d in small_db.documents() for w in d["text"].split() if w.isalpha()]
    assert 1 <= len(small_db.search(" ".join(words[:20]), limit=np.int64(2))) <= 2
    assert small_db.fill_mask(Q, exact=np.bool_(True), top=1).answers is not None


# ------------------------------------------------------------------ bad documents


@pytest.mark.parametrize("docs", [[{"text": 5}], [{"text": None}], [{"id": "a"}],
                                  [{"text": ["a", "b"]}], [3.5], [{"text": "ok", "id": 1.5}]])
def test_non_text_document_is_a_data_error(new_db, docs):
    with pytest.raises(npmdb.DataError):
        new_db.add(docs)
    assert new_db.count() == 0 and new_db.version is None


def test_invalid_utf8_is_a_data_error(new_db, tmp_path):
    with pytest.raises(npmdb.DataError, match="UTF-8"):
        new_db.add([b"caf\xe9 au lait"])
    with pytest.raises(npmdb.DataError, match="UTF-8"):
        new_db.add([{"text": b"\xff\xfe bad"}])
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"text": "ok"}\n{"text": "caf\xe9"}\n')
    with pytest.raises(npmdb.DataError):
        new_db.add(bad)
    assert new_db.count() == 0
    # valid UTF-8 bytes are text
    new_db.add([b"caf\xc3\xa9 au lait"])
    assert next(new_db.documents())["text"] == "café au lait"


def test_lone_surrogate_is_a_data_error(new_db):
    with pytest.raises(npmdb.DataError):
        new_db.add(["bad \ud800 text"])


def test_single_dict_or_bytes_is_an_interface_error(new_db):
    with pytest.raises(npmdb.InterfaceError):
        new_db.add({"text": "one document, not a list"})
    with pytest.raises(npmdb.InterfaceError):
        new_db.add(b"bytes")


# ------------------------------------------------------------------ opening


def test_readonly_open_then_add(tiny_db_path):
    with npmdb.open(tiny_db_path, readonly=True, progress=False) as db:
        assert db.count() == 600
        assert len(db.fill_mask(Q, top=2, retrieval="dense")) == 2
        with pytest.raises(npmdb.OperationalError, match="read-only"):
            db.add(["Something new."])
        with pytest.raises(npmdb.OperationalError):
            db.delete(next(db.documents())["id"])


def test_readonly_open_of_missing_database(tmp_path):
    with pytest.raises(npmdb.OperationalError):
        npmdb.open(tmp_path / "nothing", readonly=True)
    with pytest.raises(npmdb.OperationalError):
        npmdb.open(tmp_path / "nothing", create=False)
    assert not (tmp_path / "nothing").exists()


def test_open_a_non_database_directory(tmp_path):
    d = tmp_path / "stuff"
    d.mkdir()
    (d / "notes.txt").write_text("hello")
    with pytest.raises(npmdb.OperationalError, match="not an npmdb database"):
        npmdb.open(d)


def test_open_with_a_different_encoder(tmp_path, tiny_encoder):
    path = tmp_path / "db"
    with npmdb.open(path, encoder=tiny_encoder, progress=False) as db:
        db.add(["Thessaloniki is a city in Greece."])
    other = make_tiny_encoder(tmp_path / "other-encoder", seed=1)
    with pytest.raises(npmdb.Error) as info:
        npmdb.open(path, encoder=other, progress=False)
    msg = str(info.value)
    assert "encoder" in msg and "built with" in msg and "encoder=None" in msg
    # the same encoder is fine, and so is none (the database's own)
    with npmdb.open(path, encoder=tiny_encoder, progress=False) as db:
        assert db.count() == 1
    with npmdb.open(path, progress=False) as db:
        assert len(db.fill_mask(Q, top=1, retrieval="dense")) == 1


def _try_to_add(path: str, queue) -> None:
    import npmdb as _npmdb

    try:
        with _npmdb.open(path, progress=False) as db:
            db.add(["A second writer's document."])
        queue.put(("ok", ""))
    except Exception as exc:  # noqa: BLE001 - report whatever happened
        queue.put((type(exc).__name__, str(exc)))


def test_second_writer_process_gets_operational_error(new_db):
    new_db.add(["Thessaloniki is a city in Greece."])
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with new_db.batch():
        new_db.add(["Held inside the batch: the writer lock is taken."])
        proc = ctx.Process(target=_try_to_add, args=(str(new_db.path), queue))
        proc.start()
        kind, msg = queue.get(timeout=120)
        proc.join(timeout=60)
    assert kind == "OperationalError", (kind, msg)
    assert "locked" in msg
    assert new_db.count() == 2
    # once the lock is free, another process can write
    proc = ctx.Process(target=_try_to_add, args=(str(new_db.path), queue))
    proc.start()
    kind, msg = queue.get(timeout=120)
    proc.join(timeout=60)
    assert kind == "ok", msg
    assert new_db.count() == 3


# ------------------------------------------------------------------ deletion


def test_deleted_documents_never_appear_as_evidence(new_db, sample_corpus):
    docs = sample_corpus[:120]
    new_db.add(docs[:60])
    new_db.add(docs[60:])
    gone = {d["id"] for d in docs[::2]}
    v = new_db.delete(sorted(gone))
    assert new_db.count() == 60
    assert all(new_db.get(i) is None for i in list(gone)[:10])
    assert not gone & {d["id"] for d in new_db.documents()}
    queries = [Q, "Hagios Demetrios is located in [MASK].", "The [MASK] is a genus of plants.",
               "Δημιουργός: [MASK]"]
    for q in queries:
        for opts in (dict(retrieval="dense"), dict(exact=True), dict(retrieval="bm25", blocks=10),
                     dict(retrieval="hybrid"), dict(mode="token", retrieval="dense"),
                     dict(mode="token", exact=True)):
            res = new_db.fill_mask(q, top=20, evidence=100, **opts)
            for a in res.answers:
                assert not gone & {e.doc_id for e in a.evidence}, (q, opts, a.text)
            assert res.version == v
        res = new_db.classify(q, {"x": ["genus", "city"], "y": ["Greece"]}, evidence=100)
        for a in res.answers:
            assert not gone & {e.doc_id for e in a.evidence}
        assert not gone & {h["doc_id"] for h in new_db.search(q.replace("[MASK]", ""), limit=50)}
    # the version before the delete still sees them
    old = new_db.fill_mask(Q, top=20, evidence=100, version=v - 1, retrieval="bm25", blocks=10)
    assert old.version == v - 1


def test_delete_unknown_id(small_db):
    with pytest.raises(npmdb.ProgrammingError):
        small_db.delete("no-such-document")
    assert small_db.delete("no-such-document", missing_ok=True) == small_db.version


# ------------------------------------------------------------------ results


COLUMNS = ["text", "score", "support", "tokens", "evidence"]


def test_result_conversions(small_db):
    res = small_db.fill_mask(Q, top=4, exact=True)
    assert len(res) == 4 and res.top is res.answers[0] and res[1] is res.answers[1]
    rows = res.to_list()
    assert len(rows) == 4
    assert all(set(r) == set(COLUMNS) for r in rows)
    assert [r["text"] for r in rows] == [a.text for a in res]
    assert all(isinstance(r["evidence"], list) and r["evidence"] for r in rows)
    assert set(rows[0]["evidence"][0]) >= {"doc_id", "title", "start", "end", "snippet"}
    df = res.to_pandas()
    assert df.shape == (4, 5) and list(df.columns) == COLUMNS
    assert df["score"].is_monotonic_decreasing
    tbl = res.to_arrow()
    assert tbl.num_rows == 4 and set(tbl.column_names) == set(COLUMNS)
    assert tbl.column("text").to_pylist() == [a.text for a in res]
    json.dumps(rows)  # plain data
    # an empty result converts too
    empty = small_db.fill_mask(Q, top=2, offset=10 ** 6, exact=True)
    assert len(empty) == 0 and empty.to_list() == [] and empty.top is None
    assert empty.to_pandas().shape == (0, 5)
    assert empty.to_arrow().num_rows == 0


def _concat_and_compare(full, empty):
    """``empty``'s Arrow schema and pandas dtypes are ``full``'s, and they concatenate."""
    import pyarrow as pa

    assert len(full) > 0 and len(empty) == 0
    assert empty.to_arrow().schema == full.to_arrow().schema
    assert pa.concat_tables([full.to_arrow(), empty.to_arrow()]).num_rows == len(full)
    assert empty.to_pandas().dtypes.to_dict() == full.to_pandas().dtypes.to_dict()


def test_an_empty_result_has_the_schema_of_a_full_one(small_db):
    """Answers have an explicit schema (evidence a list of structs, even when every list is
    empty); SQL's standard columns are typed by name when there are no rows. An empty
    result's columns used to be Arrow nulls (and pandas objects), so it did not
    concatenate with a full one."""
    import pyarrow as pa

    full = small_db.fill_mask(Q, top=3, exact=True)
    _concat_and_compare(full, small_db.fill_mask(Q, top=2, offset=10 ** 6, exact=True))
    assert full.to_arrow().schema == small_db.fill_mask(Q, top=3, exact=True,
                                                        evidence=0).to_arrow().schema
    ev = full.to_arrow().schema.field("evidence").type
    assert ev == pa.list_(pa.struct([("doc_id", pa.string()), ("title", pa.string()),
                                     ("field", pa.string()), ("start", pa.int64()),
                                     ("end", pa.int64()), ("snippet", pa.string()),
                                     ("score", pa.float64())]))
    labels = {"yes": ["Greece"], "no": ["Peru"]}
    _concat_and_compare(small_db.classify(Q, labels),
                        small_db.classify(Q, labels, offset=10))
    for stmt, none in [
            ("SELECT id, title, text FROM DOCUMENTS", "WHERE id = 'no such id'"),
            ("SELECT * FROM SEARCH('Greece')", "WHERE doc_id = 'no such id'"),
            ("SELECT doc_id, title, snippet, score, start, end, text FROM SEARCH('Greece')",
             "WHERE doc_id = 'no such id'"),
            (f"SELECT * FROM MASKED('{Q}') USING exact", "WHERE phrase = 'no such phrase'"),
            (f"SELECT phrase, score, support, tokens, length, evidence, doc_id, title, start, "
             f"end, snippet, version, generation FROM MASKED('{Q}') USING exact", "LIMIT 0"),
            (f"SELECT * FROM EVIDENCE('{Q}') USING exact", "WHERE doc_id = 'no such id'")]:
        _concat_and_compare(small_db.sql(f"{stmt} LIMIT 3" if "LIMIT" not in none else stmt),
                            small_db.sql(f"{stmt} {none}"))


def test_column_types_cover_the_standard_columns():
    """Every standard column of the SQL sources but ``meta`` (whatever the documents hold)
    has a type (``rank`` and ``answer_score`` had none: an empty result typed them null,
    and did not concatenate with a full one), and the evidence struct has Evidence's fields
    in order."""
    import dataclasses

    import pyarrow as pa

    from npmdb.query.logical import SOURCES, column_names
    from npmdb.query.result import COLUMN_TYPES, EVIDENCE_TYPES

    standard = {c for s in SOURCES.values() for c in column_names(s)} - {"meta"}
    assert standard - set(COLUMN_TYPES) == set()
    assert [f for f, _ in EVIDENCE_TYPES] == [f.name for f in dataclasses.fields(npmdb.Evidence)]
    cols = ("phrase", "rank", "answer_score")
    full = npmdb.Result((), columns=cols, rows=(("Oregon", 1, 0.5),)).to_arrow()
    assert pa.concat_tables([full, npmdb.Result((), columns=cols, rows=()).to_arrow()]) \
        .num_rows == 1


def test_arrow_columns_of_other_values_keep_inference():
    """A standard name over other values (an alias) is inferred; a column of several types
    is strict JSON text (NaN as null, never the NaN JSON lacks)."""
    res = npmdb.Result((), columns=("start", "x"),
                       rows=(("a", [1.0, float("nan")]), (None, "b")))
    tbl = res.to_arrow()
    assert tbl.column("start").to_pylist() == ["a", None]
    assert tbl.column("x").to_pylist() == ["[1.0, null]", "b"]
    assert npmdb.Result((), columns=("start",), rows=((-1,), (2 ** 64 - 1,))).to_arrow() \
        .column("start").to_pylist() == ["-1", str(2 ** 64 - 1)]


def test_result_stats_list_operators(tiny_db):
    for opts, expect in ((dict(exact=True), {"ExactTopK", "AssembleSpans", "ScoreSpans"}),
                         (dict(retrieval="dense"), {"DenseTopK", "AssembleSpans", "ScoreSpans"}),
                         (dict(), {"BM25Blocks", "BlockTokens", "ScoreSpans"}),
                         (dict(mode="token", retrieval="dense"), {"DenseTopK", "ScoreTokens"})):
        res = tiny_db.fill_mask(Q, top=3, **opts)
        assert len(res) == 3
        names = [s.operator for s in res.stats]
        assert expect | {"EncodeQuery", "Aggregate", "OrderBy", "Limit"} <= set(names), names
        for s in res.stats:
            assert isinstance(s.rows, int) and s.rows >= 0
            assert isinstance(s.ms, float) and s.ms >= 0
        assert {s.operator: s.rows for s in res.stats}["Limit"] == 3
        assert res.elapsed_ms >= 0
        assert "EncodeQuery" in res.plan and "rows=" in res.plan
        assert res.version == tiny_db.version and res.generation == 0


def test_answers_are_ranked_and_bounded(small_db):
    res = small_db.fill_mask(Q, top=10, exact=True)
    scores = [a.score for a in res]
    assert scores == sorted(scores, reverse=True)
    assert len({fold(a.text) for a in res}) == len(res)
    assert all(a.support >= 1 and 1 <= a.tokens <= 10 for a in res)
    short = small_db.fill_mask(Q, top=10, exact=True, max_len=2)
    assert all(a.tokens <= 2 for a in short)
    page2 = small_db.fill_mask(Q, top=5, offset=5, exact=True)
    assert [a.text for a in page2] == [a.text for a in res][5:10]


def test_token_mode_candidates_are_distinct(tiny_db):
    """Token mode retrieves k *tokens*; a token that is both a valid start and a valid end
    (any one-wordpiece word) is in both ANN indexes and must count once. Otherwise it gets
    twice the probability and twice the support, and k distinct candidates shrink to ~2/3."""
    for exact in (True, False):
        res = tiny_db.fill_mask(Q, mode="token", k=256, top=0, evidence=10 ** 6, exact=exact,
                                retrieval="dense", not_in_query=False, no_query_words=False,
                                not_subject_name=False, whole_names=False)  # none dropped
        occ = [(e.doc_id, e.start, e.end) for a in res for e in a.evidence]
        assert len(occ) == len(set(occ)), f"exact={exact}: duplicated candidate tokens"
        assert sum(a.support for a in res) == 256, f"exact={exact}"
        assert abs(sum(a.score for a in res) - 1.0) < 1e-9


def test_classify_returns_every_label(small_db):
    res = small_db.classify(Q, {"pos": ["city", "Greece"], "neg": "zzz-never"})
    assert [a.text for a in res].count("pos") == 1 and len(res) == 2
    neg = [a for a in res if a.text == "neg"][0]
    assert neg.score == 0.0 and neg.support == 0
    assert res.answers[-1].text == "neg" or res.answers[0].score == 0.0


# ------------------------------------------------------------------ closing


def test_context_manager_closes(tiny_db_path):
    with npmdb.open(tiny_db_path, progress=False) as db:
        assert db.count() == 600
    assert "closed" in repr(db)
    for call in (lambda: db.fill_mask(Q, retrieval="dense"), lambda: db.count(), lambda: db.add(["x"]),
                 lambda: db.get("x"), lambda: db.classify(Q, {"a": ["b"]}),
                 lambda: db.search("city"), lambda: db.versions(), lambda: db.stats()):
        with pytest.raises(npmdb.InterfaceError):
            call()
    db.close()  # closing twice is fine


_CLOSE_UNDER_QUERIES = """
import sys, threading, time, npmdb
errors = []
for round in range(4):
    db = npmdb.open(sys.argv[1], progress=False, readonly=True)
    db.fill_mask("Salem is in [MASK].")
    def work():
        try:
            for _ in range(200):
                db.fill_mask("Salem is the capital of [MASK].", retrieval="dense")
        except npmdb.Error as exc:
            errors.append(type(exc).__name__)
    ts = [threading.Thread(target=work) for _ in range(3)]
    [t.start() for t in ts]
    time.sleep(0.05 * round)
    db.close()
    [t.join() for t in ts]
print(sorted(set(errors)))
"""


def test_close_while_other_threads_query_never_crashes(tiny_db_path):
    """close() unmapped the LMDB file under queries still reading zero-copy columns: the
    process died of SIGSEGV. It now waits for them; later ones get InterfaceError."""
    p = subprocess.run([sys.executable, "-c", _CLOSE_UNDER_QUERIES, str(tiny_db_path)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, (p.returncode, p.stderr[-2000:])
    assert p.stdout.strip() in ("[]", "['InterfaceError']"), p.stdout


def test_close_releases_the_writer_lock(tmp_path, tiny_encoder):
    path = tmp_path / "db"
    db = npmdb.open(path, encoder=tiny_encoder, progress=False)
    db.add(["one"])
    db.close()
    with npmdb.open(path, progress=False) as again:
        again.add(["two"])
        assert again.count() == 2


# ------------------------------------------------------------------ BM25 across segments


def test_bm25_scores_are_comparable_across_segments(new_db, sample_corpus):
    """Every add writes a segment with its own tantivy index. A block holding the rare
    query words must outrank blocks holding only common ones, whichever add wrote it: BM25
    statistics (document frequency, average length) must be the database's, not the
    segment's (in a 3-document segment "demetrios" looks common)."""
    planted = [{"id": "p1", "text": "Hagios Demetrios is the patron saint church of "
                                    "Thessaloniki, a city in Greece."},
               {"id": "p2", "text": "The basilica of Hagios Demetrios stands in Thessaloniki."},
               {"id": "p3", "text": "Thessaloniki is the second largest city in Greece."}]
    new_db.add([d for d in sample_corpus if d["id"].startswith("wn:")][:50])
    new_db.add(planted)
    hits = new_db.search("Hagios Demetrios is located in", limit=3)
    assert [h["doc_id"] for h in hits][:2] in (["p1", "p2"], ["p2", "p1"]), hits
    res = new_db.fill_mask("Hagios Demetrios is located in [MASK].", retrieval="bm25",
                           blocks=2, top=50, evidence=50)
    assert {e.doc_id for a in res for e in a.evidence} == {"p1", "p2"}


def _agree(several: list[dict], one: list[dict]) -> bool:
    """The same hits, to float rounding: the same scores in order, and the same documents
    above the last score (documents tied at the cut may differ: block order breaks ties)."""
    if len(several) != len(one) or any(a["score"] != pytest.approx(b["score"], rel=1e-4)
                                       for a, b in zip(several, one)):
        return False
    cut = several[-1]["score"] + 1e-3 if several else 0.0
    return ({h["doc_id"] for h in several if h["score"] > cut}
            == {h["doc_id"] for h in one if h["score"] > cut})


def test_bm25_over_several_segments_scores_as_one_index(tmp_path, tiny_encoder,
                                                        sample_corpus):
    """Segments of very different block lengths (glosses; two-word dictionary pairs; three
    sentences) score as one tantivy index over the same blocks: the version's IDFs and
    average lengths, not each segment's (README, "Scale")."""
    import shutil

    wn = [d for d in sample_corpus if d["id"].startswith("wn:")][:60]
    pairs = [d for d in sample_corpus if d["id"].startswith("freedict-eng-rus")][:40]
    short = [{"id": "s1", "text": "Rome is the capital of Italy."},
             {"id": "s2", "text": "Paris is the capital of France."},
             {"id": "s3", "text": "Athens lies in Greece."}]
    with npmdb.open(tmp_path / "several", encoder=tiny_encoder, progress=False) as db:
        for part in (wn[:40], pairs, short, wn[40:]):
            db.add(part)
        assert db.stats()["segments"] == 4
    shutil.copytree(tmp_path / "several", tmp_path / "one")
    with npmdb.open(tmp_path / "one", progress=False) as db:
        db.optimize()
        assert db.stats()["segments"] == 1
    queries = ["Rome is the capital of", "capital city of Italy", "Greece", "a city in",
               "the capital of France"] + [d["title"] for d in wn[::7] if d.get("title")]
    with npmdb.open(tmp_path / "several", progress=False) as several, \
            npmdb.open(tmp_path / "one", progress=False) as one:
        for q in queries:
            for title in (False, True):
                a = several.search(q, limit=5, title=title)
                b = one.search(q, limit=5, title=title)
                assert a and _agree(a, b), (q, title, a, b)
        # the span scores, the block prior's text scores included, are the same too
        q = "Rome is the capital of [MASK]."
        a = several.fill_mask(q, retrieval="bm25", top=5)
        b = one.fill_mask(q, retrieval="bm25", top=5)
        assert [(x.text, round(x.score, 5)) for x in a] == [(x.text, round(x.score, 5))
                                                            for x in b]
        # a deleted document is filtered out; the others keep their scores
        before = several.search("capital", limit=10)
        several.delete(before[0]["doc_id"])
        after = several.search("capital", limit=5)
        assert after == [h for h in before if h["doc_id"] != before[0]["doc_id"]][:5]


def _bm25_oracle(blocks: list[dict], live: set[str], query: str, fields: tuple[str, ...],
                 n: int) -> list[tuple[str, float]]:
    """BM25 by hand (tantivy's formula, k1 1.2, b 0.75) over every block ever written
    (a deleted or replaced document's block counts until optimize, as in tantivy), the
    top ``n`` live ones as (doc id, score). Blocks here are short: tantivy's field
    lengths are exact up to 40 terms."""
    import math

    from npmdb.storage.bm25 import analyze

    terms = list(dict.fromkeys(analyze(query)))
    toks = {f: [analyze(b[f]) for b in blocks] for f in fields}
    scores = [0.0] * len(blocks)
    for f in fields:
        avgdl = sum(map(len, toks[f])) / len(blocks)
        for t in terms:
            df = sum(t in tk for tk in toks[f])
            if not df:
                continue
            idf = math.log(1 + (len(blocks) - df + 0.5) / (df + 0.5))
            for i, tk in enumerate(toks[f]):
                tf = tk.count(t)
                if tf:
                    scores[i] += idf * 2.2 * tf / (tf + 1.2 * (0.25 + 0.75 * len(tk) / avgdl))
    got = [(b["id"], sc) for b, sc in zip(blocks, scores) if sc > 0 and b["live"] in live]
    return sorted(got, key=lambda x: -x[1])[:n]


def test_bm25_over_segments_deletes_and_updates_matches_a_hand_computed_oracle(
        tmp_path, tiny_encoder):
    """Random short documents over five adds, with deletes and an update: every search
    (text, and text with titles) gives the scores BM25 computed by hand over all blocks."""
    import random

    rng = random.Random(7)
    words = ("oslo bergen norway capital city river harbour church bridge market king "
             "queen island north south old new").split()

    def doc(i: int) -> dict:
        text = " ".join(rng.choice(words) for _ in range(rng.randint(2, 30)))
        title = " ".join(rng.choice(words) for _ in range(rng.randint(0, 3)))
        return {"id": f"d{i}", "title": title, "text": text}

    blocks: list[dict] = []   # every block ever written, with the version of it that is live
    with npmdb.open(tmp_path / "db", encoder=tiny_encoder, progress=False) as db:
        for part in range(5):
            docs = [doc(part * 20 + i) for i in range(rng.choice((3, 20, 40)))]
            db.add(docs)
            blocks += [{**d, "live": f"{d['id']}@{len(blocks) + j}"}
                       for j, d in enumerate(docs)]
        live = {b["live"] for b in blocks}
        gone = rng.sample([b for b in blocks], 8)
        db.delete([b["id"] for b in gone])
        live -= {b["live"] for b in gone}
        old = next(b for b in blocks if b["live"] in live)
        new = {"id": old["id"], "title": "", "text": "oslo oslo capital"}
        db.update([new])
        live.discard(old["live"])
        blocks.append({**new, "live": f"{new['id']}@{len(blocks)}"})
        live.add(blocks[-1]["live"])
        assert db.stats()["segments"] == 6 and db.count() == len(live)
        for q in ("oslo capital", "the old church by the river", "king queen island",
                  "north", "bridge market harbour bergen"):
            for title in (False, True):
                fields = ("text", "title") if title else ("text",)
                want = _bm25_oracle(blocks, live, q, fields, 6)
                got = [(h["doc_id"], h["score"]) for h in db.search(q, limit=6, title=title)]
                assert [s for _, s in got] == pytest.approx([s for _, s in want], rel=1e-4)
                cut = want[-1][1] * (1 + 1e-4)   # documents tied at the cut may differ
                assert ({d for d, s in got if s > cut} == {d for d, s in want if s > cut}), q


def test_rescoring_a_segment_with_its_own_statistics_gives_tantivys_scores(small_db,
                                                                          sample_corpus):
    """The rescoring path reads each block's term frequencies and field lengths from
    tantivy's explanation; with the segment's own statistics it gives tantivy's scores."""
    from npmdb.storage.bm25 import analyze, field_stats

    with small_db.snapshot() as snap:
        ix = snap.segments[0].bm25()
        # the average length, from a query term's block or from the most frequent term's
        for field in ("text", "title"):
            ix._avgdl.clear()
            walked = ix.avgdl(field)
            ix._avgdl.clear()
            assert ix.avgdl(field, ["zzzz", analyze(sample_corpus[3]["title"])[0]]) \
                == walked > 0.0
        for q in ["the capital city of a country"] + [d["title"] for d in sample_corpus[:80:9]]:
            terms = list(dict.fromkeys(analyze(q)))
            for fields in (("text",), ("text", "title")):
                stats = {f: field_stats([ix], terms, f) for f in fields}
                own = ix.search(terms, 20, fields=fields, text_scores=True)
                got = ix.search(terms, 20, fields=fields, stats=stats, text_scores=True)
                assert own, q
                assert [h[:2] for h in got] == [h[:2] for h in own]
                assert [x for h in got for x in h[2:]] == pytest.approx(
                    [x for h in own for x in h[2:]], rel=1e-5)


def test_dense_k_past_a_segments_size_is_an_exact_scan(new_db):
    """hnswlib cannot always return most of its elements (a query for k near the index's
    size raised "Cannot return the results in a contiguous 2D array"); a k of half the
    index or more scans the stored vectors instead, so it gives the exact search's answers,
    and a selective document filter (which widens k to the whole index) answers too."""
    docs = [f"Document {i} talks about the capital city number {i} and more words to fill."
            for i in range(300)]
    new_db.add(docs)
    q = "Document 5 talks about the capital city number [MASK]."
    for k in (2048, 4096):
        got = new_db.fill_mask(q, retrieval="dense", k=k, top=5)
        exact = new_db.fill_mask(q, exact=True, k=k, top=5)
        assert [(a.text, round(a.score, 5)) for a in got] == [(a.text, round(a.score, 5))
                                                            for a in exact]
        assert new_db.classify("It was [MASK].", {"p": ["capital"], "n": ["city"]}, k=k)
    doc = new_db.documents().__next__()["id"]
    rows = new_db.sql("SELECT phrase FROM MASKED(?) USING dense(k => 64) WHERE doc.id = ? "
                      "LIMIT 3", [q, doc]).to_list()
    assert rows


def test_a_word_answers_evidence_scores_sum_to_its_score(small_db):
    """Token mode grouped by word: a word of two pieces is one occurrence, and its answer
    sums both pieces' scores; its evidence showed one piece's score only."""
    res = small_db.fill_mask(Q, mode="token", retrieval="dense", group_by="word", top=0,
                             evidence=1000)
    split = [a for a in res.answers if a.tokens > 1]
    assert split  # words of several pieces are among the answers
    for a in res.answers:
        assert len(a.evidence) == a.support
        assert sum(e.score for e in a.evidence) == pytest.approx(a.score, rel=1e-6)
