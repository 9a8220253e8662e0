"""`npmdb serve`: every API endpoint, option and error, in process (Starlette TestClient).

The database has two versions: 300 sample documents tagged 'first', then 100 more."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

pytest.importorskip("starlette")
pytest.importorskip("httpx")
from starlette.testclient import TestClient  # noqa: E402

from npmdb.serve import Settings, create_app, is_loopback  # noqa: E402

Q = "Doha is the capital of [MASK]."


@pytest.fixture(scope="module")
def client(versioned_db_path):
    with TestClient(create_app(versioned_db_path)) as c:
        yield c


@pytest.fixture()
def writer(tmp_path, tiny_encoder, sample_corpus):
    import npmdb

    path = tmp_path / "db"
    with npmdb.open(path, encoder=tiny_encoder, progress=False) as db:
        db.add(sample_corpus[:50])
    app = create_app(path, Settings(token="s3cret", write=True))
    with TestClient(app) as c:
        yield c, path


def error_of(r, status):
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and {"type", "message"} <= set(body["error"])
    assert "Traceback" not in r.text
    return body["error"]


# ---------------------------------------------------------------- fill_mask / classify

def test_fill_mask_answers_with_evidence_and_plan(client, versioned_db_path):
    import npmdb

    r = client.post("/api/fill_mask", json={"query": Q, "retrieval": "bm25", "top": 3})
    assert r.status_code == 200
    body = r.json()
    assert {"answers", "version", "generation", "ms", "plan", "stats"} <= set(body)
    assert body["version"] == 2 and body["generation"] == 0 and 0 < len(body["answers"]) <= 3
    with npmdb.open(versioned_db_path, readonly=True, progress=False) as db:
        ref = db.fill_mask(Q, retrieval="bm25", top=3)
        for a, b in zip(body["answers"], ref.answers):
            assert (a["text"], a["support"]) == (b.text, b.support)
            assert a["score"] == pytest.approx(b.score)
            for ev in a["evidence"]:
                assert {"doc_id", "title", "start", "end", "snippet"} <= set(ev)
                text = db.get(ev["doc_id"])["text"]
                assert ev["match"] == text[ev["start"]:ev["end"]]
                assert (ev["before"].lstrip("…") + ev["match"] + ev["after"].rstrip("…")) in text
    ops = [s["operator"] for s in body["stats"]]
    assert "BM25Blocks" in ops and all(s["ms"] >= 0 for s in body["stats"])
    assert "rows=" in body["plan"]


@pytest.mark.parametrize("opts", [
    {"retrieval": "dense", "k": 64}, {"retrieval": "hybrid", "k": 32, "blocks": 2},
    {"mode": "token", "retrieval": "bm25"}, {"exact": True, "k": 16},
    {"retrieval": "bm25", "max_len": 3, "tau": 0.5, "alpha": 0.5, "scoring": "raw"},
    {"retrieval": "bm25", "group_by": "document", "evidence": 1, "offset": 1},
    {"retrieval": "bm25", "clean_edges": False, "no_stopwords": True},
    {"retrieval": "bm25", "bm25_title": False, "bm25_question": True, "not_in_query": False,
     "no_query_words": False},
])
def test_fill_mask_options(client, opts):
    r = client.post("/api/fill_mask", json={"query": Q, "top": 2, **opts})
    assert r.status_code == 200, r.text
    assert len(r.json()["answers"]) <= 2


def test_fill_mask_as_of_a_tag_and_an_id(client):
    old = client.post("/api/fill_mask", json={"query": Q, "retrieval": "bm25",
                                              "version": "first"}).json()
    assert old["version"] == 1
    assert client.post("/api/fill_mask", json={"query": Q, "retrieval": "bm25",
                                               "version": 1}).json()["answers"] == old["answers"]
    e = error_of(client.post("/api/fill_mask", json={"query": Q, "version": "nope"}), 400)
    assert e["type"] == "ProgrammingError"


def test_classify(client):
    r = client.post("/api/classify", json={"query": "Doha is in [MASK].", "retrieval": "bm25",
                                           "labels": {"qatar": ["Qatar"], "other": "Croatia"}})
    assert r.status_code == 200, r.text
    labels = {a["label"] for a in r.json()["answers"]}
    assert labels == {"qatar", "other"}
    r = client.post("/api/classify", json={"query": "A city. Doha is in [MASK].",
                                           "retrieval": "bm25", "calibrate": True,
                                           "labels": {"qatar": ["Qatar"], "other": "Croatia"}})
    assert r.status_code == 200, r.text
    assert abs(sum(a["score"] for a in r.json()["answers"]) - 1.0) < 1e-9   # probabilities
    error_of(client.post("/api/classify", json={"query": "x [MASK]", "labels": []}), 400)
    error_of(client.post("/api/classify", json={"query": "x [MASK]", "labels": {"a": 3}}), 400)
    e = error_of(client.post("/api/classify", json={"query": "x [MASK]", "labels": {"a": "b"},
                                                    "top": 3}), 400)
    assert "top" in e["message"]


# ---------------------------------------------------------------- sql

def test_sql_rows_and_params(client):
    r = client.post("/api/sql", json={"query": "SELECT id, title FROM DOCUMENTS WHERE title "
                                               "LIKE :t LIMIT 3", "params": {"t": "D%"}})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["columns"] == ["id", "title"] and len(body["rows"]) <= 3
    assert all(row[1].lower().startswith("d") for row in body["rows"])
    r = client.post("/api/sql", json={"query": "SELECT phrase, score, evidence FROM MASKED(?) "
                                               "USING bm25 LIMIT 2", "params": [Q]})
    assert r.status_code == 200 and r.json()["columns"] == ["phrase", "score", "evidence"]
    r = client.post("/api/sql", json={"query": "SHOW TAGS"})
    assert r.json()["rows"] == [["first", 1]]
    r = client.post("/api/sql", json={"query": "EXPLAIN ANALYZE SELECT phrase FROM MASKED(?) "
                                               "USING bm25 LIMIT 1", "params": [Q]})
    assert r.json()["columns"] == ["plan"] and "ms" in r.json()["plan"]


def test_sql_parse_error_has_line_and_column(client):
    e = error_of(client.post("/api/sql", json={"query": "SELECT phrase\nFROM MASKED('a [MASK]')"
                                                        "\nORDER score"}), 400)
    assert e["type"] == "ProgrammingError"
    assert (e["line"], e["column"]) == (3, 7)
    assert "^" in e["message"]
    e = error_of(client.post("/api/sql", json={"query": "SELECT 1 FROM DOCUMENTS", "params": 3}),
                 400)
    assert e["type"] == "BadRequest"
    e = error_of(client.post("/api/sql", json={"query": "SELECT id FROM DOCUMENTS LIMIT ?",
                                               "params": []}), 400)
    assert e["type"] == "ProgrammingError"


def test_sql_rows_are_capped(versioned_db_path):
    with TestClient(create_app(versioned_db_path, Settings(max_rows=5))) as c:
        body = c.post("/api/sql", json={"query": "SELECT id FROM DOCUMENTS"}).json()
        assert len(body["rows"]) == 5 and body["truncated"] is True


# ---------------------------------------------------------------- versions and documents

def test_versions_and_diff(client):
    body = client.get("/api/versions").json()
    assert [v["id"] for v in body["versions"]] == [1, 2]
    assert body["head"] == 2 and body["tags"] == {"first": 1}
    d = client.get("/api/diff", params={"a": "first"}).json()
    assert (d["a"], d["b"], len(d["added"]), d["removed"]) == (1, 2, 100, [])
    error_of(client.get("/api/diff"), 400)


def test_documents_paging_search_and_get(client, sample_corpus):
    page = client.get("/api/documents", params={"limit": 5, "offset": 10}).json()
    assert [d["id"] for d in page["documents"]] == [d["id"] for d in sample_corpus[10:15]]
    assert page["total"] == 400 and page["more"] is True
    old = client.get("/api/documents", params={"version": "first", "offset": 295}).json()
    assert old["total"] == 300 and len(old["documents"]) == 5 and old["more"] is False
    hits = client.get("/api/documents", params={"q": "Doha Qatar"}).json()["documents"]
    assert hits and hits[0]["id"] == "freedict-eng-jpn:8705"
    doc = client.get("/api/documents/freedict-eng-jpn:8705").json()
    assert doc["text"] == sample_corpus[294]["text"] and doc["version"] == 2
    new_id = sample_corpus[350]["id"]
    assert client.get(f"/api/documents/{new_id}").status_code == 200
    e = error_of(client.get(f"/api/documents/{new_id}", params={"version": "first"}), 404)
    assert e["type"] == "NotFound"
    error_of(client.get("/api/documents", params={"limit": 10_000}), 400)
    error_of(client.get("/api/documents", params={"offset": "x"}), 400)


def test_openapi(client):
    doc = client.get("/openapi.json").json()
    assert doc["openapi"].startswith("3.")
    for path in ("/api/fill_mask", "/api/classify", "/api/sql", "/api/versions",
                 "/api/documents", "/api/documents/{id}"):
        assert path in doc["paths"]
    assert "/api/tags" not in doc["paths"]  # read-only server


# ---------------------------------------------------------------- errors and limits

def test_bad_requests(client):
    e = error_of(client.post("/api/fill_mask", content=b"{not json",
                             headers={"content-type": "application/json"}), 400)
    assert e["type"] == "BadRequest" and "JSON" in e["message"]
    error_of(client.post("/api/fill_mask", content=b"\xff\xfe"), 400)
    error_of(client.post("/api/fill_mask", json=["a list"]), 400)
    error_of(client.post("/api/fill_mask", json={"query": 3}), 400)
    error_of(client.post("/api/fill_mask", json={}), 400)
    e = error_of(client.post("/api/fill_mask", json={"query": "no mask here"}), 400)
    assert e["type"] == "ProgrammingError" and "mask" in e["message"]
    e = error_of(client.post("/api/fill_mask", json={"query": Q, "bogus": 1}), 400)
    assert "bogus" in e["message"]
    e = error_of(client.post("/api/fill_mask", json={"query": Q, "retrieval": "magic"}), 400)
    assert e["type"] == "ProgrammingError"
    error_of(client.post("/api/fill_mask", json={"query": Q, "k": "many"}), 400)
    error_of(client.get("/api/nothing"), 404)
    error_of(client.get("/api/fill_mask"), 405)


@pytest.mark.parametrize("field,value", [("k", 5000), ("top", 101), ("blocks", 51),
                                         ("evidence", 21)])
def test_limits_on_k_top_blocks(client, field, value):
    e = error_of(client.post("/api/fill_mask", json={"query": Q, field: value}), 400)
    assert e["type"] == "LimitExceeded" and str(value) in e["message"]


def test_oversized_requests(client):
    e = error_of(client.post("/api/fill_mask", json={"query": "[MASK] " + "a" * 3000}), 413)
    assert e["type"] == "PayloadTooLarge"
    e = error_of(client.post("/api/sql", content=b'{"query": "' + b"x" * (2 << 20) + b'"}',
                             headers={"content-type": "application/json"}), 413)
    assert e["type"] == "PayloadTooLarge"

    def chunks():  # no content-length: the size is counted as the body arrives
        for _ in range(40):
            yield b"x" * 65536
    error_of(client.post("/api/sql", content=chunks()), 413)


def test_time_limit(versioned_db_path):
    with TestClient(create_app(versioned_db_path, Settings(time_limit=0.0001))) as c:
        e = error_of(c.post("/api/fill_mask", json={"query": Q, "exact": True}), 503)
        assert e["type"] == "Timeout"


def test_read_only_refuses_writes(client):
    for r in (client.post("/api/documents", json={"documents": ["x"]}),
              client.delete("/api/documents/freedict-eng-jpn:8705"),
              client.post("/api/tags", json={"name": "t"}),
              client.delete("/api/tags/t")):
        assert error_of(r, 403)["type"] == "ReadOnly"


# ---------------------------------------------------------------- token and writes

def test_token_required_everywhere(writer):
    c, _ = writer
    for r in (c.get("/api/versions"), c.get("/"), c.get("/openapi.json"),
              c.post("/api/fill_mask", json={"query": Q}),
              c.get("/api/versions", headers={"Authorization": "Bearer wrong"})):
        assert error_of(r, 401)["type"] == "Unauthorized"
    auth = {"Authorization": "Bearer s3cret"}
    assert c.get("/api/versions", headers=auth).status_code == 200
    assert c.get("/api/versions", params={"token": "s3cret"}).status_code == 200
    # a page visited with ?token= sets the cookie and drops the token from the address
    r = c.get("/versions", params={"token": "s3cret"}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/versions"
    assert c.get("/versions").status_code == 200  # with the cookie now
    r = c.get("/documents", params={"q": "a b&c", "token": "s3cret"}, follow_redirects=False)
    assert r.headers["location"] == "/documents?q=a+b%26c"
    c.cookies.clear()
    assert c.get("/versions").status_code == 401


def test_write_endpoints(writer):
    c, path = writer
    auth = {"Authorization": "Bearer s3cret"}
    assert "/api/tags" in c.get("/openapi.json", headers=auth).json()["paths"]
    r = c.post("/api/documents", headers=auth, json={"documents": [
        {"id": "new:1", "title": "Zed", "text": "Zanzibar is an island in Tanzania."}],
        "message": "one more"})
    assert r.status_code == 201 and r.json() == {"version": 2, "added": 1}
    assert c.get("/api/documents/new:1", headers=auth).json()["title"] == "Zed"
    r = c.post("/api/tags", headers=auth, json={"name": "with-zed"})
    assert r.json() == {"tag": "with-zed", "version": 2}
    r = c.delete("/api/documents/new:1", headers=auth)
    assert r.json() == {"version": 3}
    # an existing tag moves only when asked
    e = error_of(c.post("/api/tags", headers=auth, json={"name": "with-zed"}), 409)
    assert e["type"] == "IntegrityError" and "already names version 2" in e["message"]
    error_of(c.post("/api/tags", headers=auth, json={"name": "with-zed", "move": 1}), 400)
    r = c.post("/api/tags", headers=auth, json={"name": "moved", "version": 3})
    assert r.json() == {"tag": "moved", "version": 3}
    r = c.post("/api/tags", headers=auth, json={"name": "moved", "version": 2, "move": True})
    assert r.json() == {"tag": "moved", "version": 2}
    assert error_of(c.get("/api/documents/new:1", headers=auth), 404)
    assert c.get("/api/documents/new:1", headers=auth, params={"version": "with-zed"}
                 ).status_code == 200
    e = error_of(c.post("/api/documents", headers=auth, json={"documents": [
        {"id": "new:2", "text": "a"}, {"id": "new:2", "text": "b"}]}), 409)
    assert e["type"] == "IntegrityError"
    error_of(c.post("/api/documents", headers=auth, json={"documents": "nope"}), 400)
    error_of(c.post("/api/tags", headers=auth, json={"name": ""}), 400)
    assert error_of(c.post("/api/documents", json={"documents": ["x"]}), 401)
    # removing a tag (a name with a slash too); the version stays
    r = c.post("/api/tags", headers=auth, json={"name": "a/b", "version": 2})
    assert r.json() == {"tag": "a/b", "version": 2}
    assert c.delete("/api/tags/a/b", headers=auth).json() == {"tag": "a/b", "version": 2}
    assert "no tag named 'a/b'" in error_of(c.delete("/api/tags/a/b", headers=auth),
                                            404)["message"]
    assert error_of(c.delete("/api/tags/moved"), 401)
    assert 2 in [v["id"] for v in c.get("/api/versions", headers=auth).json()["versions"]]
    assert "/api/tags/{name}" in c.get("/openapi.json", headers=auth).json()["paths"]


def test_commit_by_another_process_is_seen_at_the_next_request(writer, tiny_encoder):
    c, path = writer
    auth = {"Authorization": "Bearer s3cret"}
    before = c.get("/api/versions", headers=auth).json()["head"]
    code = ("import npmdb, sys; db = npmdb.open(sys.argv[1], progress=False); "
            "db.add([{'id': 'other:1', 'text': 'Written by another process.'}]); db.close()")
    subprocess.run([sys.executable, "-c", code, str(path)], check=True, timeout=120)
    assert c.get("/api/versions", headers=auth).json()["head"] == before + 1
    assert c.get("/api/documents/other:1", headers=auth).status_code == 200
    r = c.post("/api/sql", headers=auth, json={"query": "SELECT id FROM DOCUMENTS WHERE "
                                                        "id = 'other:1'"})
    assert r.json()["rows"] == [["other:1"]]


def test_concurrent_requests_read_one_version_each(client):
    import concurrent.futures as cf

    def ask(v):
        return client.post("/api/fill_mask", json={"query": Q, "retrieval": "bm25",
                                                   "version": v}).json()
    with cf.ThreadPoolExecutor(4) as ex:
        out = list(ex.map(ask, [1, 2, "first", None] * 3))
    assert [o["version"] for o in out] == [1, 2, 1, 2] * 3
    for o in out:  # every occurrence exists in the version the request read
        for a in o["answers"]:
            for ev in a["evidence"]:
                assert client.get(f"/api/documents/{ev['doc_id']}",
                                  params={"version": o["version"]}).status_code == 200


# ---------------------------------------------------------------- pages and startup rules

def test_pages_render(client):
    r = client.get("/")
    assert r.status_code == 200 and 'id="ask"' in r.text and "first" in r.text
    assert "http://" not in r.text and "https://" not in r.text  # nothing from elsewhere
    assert client.get("/sql").status_code == 200
    r = client.get("/documents", params={"q": "Doha"})
    assert "freedict-eng-jpn:8705" in r.text
    r = client.get("/documents/freedict-eng-jpn:8705", params={"start": 8, "end": 12,
                                                                "phrase": "Doha"})
    assert '<mark class="hl current">Doha</mark>' in r.text
    r = client.get("/versions", params={"a": "first"})
    assert "100 added" in r.text
    assert client.get("/documents/nope").status_code == 404
    assert client.get("/static/app.js").status_code == 200


def test_page_escapes_document_text(writer):
    c, _ = writer
    auth = {"Authorization": "Bearer s3cret"}
    c.post("/api/documents", headers=auth, json={"documents": [
        {"id": "x:1", "title": "<b>t</b>", "text": "<script>alert(1)</script> end"}]})
    r = c.get("/documents/x:1", headers=auth)
    assert "<script>alert" not in r.text and "&lt;script&gt;" in r.text


def test_loopback_rules():
    from argparse import Namespace

    import npmdb
    from npmdb.serve import main

    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.4")
    args = Namespace(db="x", host="0.0.0.0", port=0, token=None, write=False, time_limit=1.0)
    with pytest.raises(npmdb.ProgrammingError, match="token"):
        main(args)


def test_sharded_server_answers_as_one_process(versioned_db_path, client):
    """``npmdb serve --shards 2`` (shards in process here): the same answers, an Exchange
    in the plan; --shards with --write is refused."""
    with TestClient(create_app(versioned_db_path, Settings(shards=2, engine="local"))) as c:
        for body in ({"query": Q, "retrieval": "bm25", "top": 3},
                     {"query": Q, "top": 3, "version": "first"}):
            got = c.post("/api/fill_mask", json=body).json()
            want = client.post("/api/fill_mask", json=body).json()
            assert got["answers"] == want["answers"]
            assert "Exchange (shards=2, engine=local)" in got["plan"]
    from types import SimpleNamespace

    from npmdb.errors import ProgrammingError
    from npmdb.serve import main

    args = SimpleNamespace(db=str(versioned_db_path), host="127.0.0.1", port=0, token=None,
                           write=True, time_limit=5.0, shards=2, ray=False)
    with pytest.raises(ProgrammingError, match="reads only"):
        main(args)
    with pytest.raises(ProgrammingError, match="give --shards N"):
        main(SimpleNamespace(**{**vars(args), "write": False, "shards": None, "ray": True}))


def test_writes_run_to_their_end_and_queue(tmp_path, tiny_encoder, sample_corpus):
    """A write is not cut off by the time limit (it would commit after a 503, and a retry
    would add its documents twice), and overlapping writes wait for each other."""
    import threading

    import npmdb

    path = tmp_path / "db"
    with npmdb.open(path, encoder=tiny_encoder, progress=False) as db:
        db.add(sample_corpus[:20])
    auth = {"Authorization": "Bearer s3cret"}
    docs = [{"id": f"w{i}", "text": d["text"]} for i, d in enumerate(sample_corpus[20:220])]
    with TestClient(create_app(path, Settings(token="s3cret", write=True,
                                              time_limit=0.01))) as c:
        r = c.post("/api/documents", headers=auth, json={"documents": docs})
        assert r.status_code == 201 and r.json() == {"version": 2, "added": 200}
    with TestClient(create_app(path, Settings(token="s3cret", write=True))) as c:
        codes: list[int] = []

        def post(i: int) -> None:
            codes.append(c.post("/api/documents", headers=auth, json={"documents": [
                {"id": f"t{i}", "text": f"Town {i} is in Norway."}]}).status_code)
        threads = [threading.Thread(target=post, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert codes == [201] * 6
        assert c.get("/api/versions", headers=auth).json()["head"] == 8


def test_bodies_the_api_refuses_or_cleans(writer):
    c, _ = writer
    auth = {"Authorization": "Bearer s3cret"}
    e = error_of(c.post("/api/tags", headers=auth, json={"name": "t", "versoin": 1}), 400)
    assert "unknown field(s) versoin" in e["message"]
    error_of(c.post("/api/documents", headers=auth, json={"documents": ["x"], "msg": "m"}), 400)
    e = error_of(c.post("/api/fill_mask", headers=auth, content="[" * 5000 + "]" * 5000), 400)
    assert "nested too deeply" in e["message"]
    body = c.post("/api/sql", headers=auth, json={
        "query": "SELECT id, 1e308 * 10 AS x, 0.0 * (1e308 * 10) AS y FROM DOCUMENTS LIMIT 1"})
    assert body.status_code == 200 and body.json()["rows"][0][1:] == [None, None]
