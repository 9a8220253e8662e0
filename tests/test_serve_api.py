"""`npmdb serve`: every API endpoint, option and error, in process (Starlette TestClient).

The database has two versions: 300 sample documents tagged 'first', then 100 more."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.parse

import pytest

pytest.importorskip("starlette")
pytest.importorskip("httpx")
from starlette.testclient import TestClient  # noqa: E402

from npmdb.serve import Settings, create_app, is_loopback  # noqa: E402

Q = "Doha is the capital of [MASK]."
LOCAL = "http://localhost"  # a server without a token answers loopback names only


@pytest.fixture(scope="module")
def client(versioned_db_path):
    with TestClient(create_app(versioned_db_path), base_url=LOCAL) as c:
        yield c


@pytest.fixture()
def writer(tmp_path, tiny_encoder, sample_corpus):
    import npmdb

    path = tmp_path / "db"
    with npmdb.open(path, encoder=tiny_encoder, progress=False) as db:
        db.add(sample_corpus[:50])
    app = create_app(path, Settings(token="s3cret", write=True))
    with TestClient(app, base_url=LOCAL) as c:
        yield c, path


JSON = {"content-type": "application/json"}


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
    app = create_app(versioned_db_path, Settings(max_rows=5))
    with TestClient(app, base_url=LOCAL) as c:
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
    error_of(client.post("/api/fill_mask", content=b"\xff\xfe", headers=JSON), 400)
    # another media type (a page elsewhere can POST text/plain without a preflight)
    for kind in (None, "text/plain", "application/x-www-form-urlencoded"):
        e = error_of(client.post("/api/fill_mask", content=b'{"query": "a [MASK]"}',
                                 headers={"content-type": kind} if kind else {}), 415)
        assert "Content-Type: application/json" in e["message"]
    assert client.post("/api/fill_mask", content=b'{"query": "a [MASK]", "retrieval": "bm25"}',
                       headers={"content-type": "Application/JSON; charset=utf-8"}
                       ).status_code == 200
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
    for name in ("tau", "alpha", "bm25_prior"):  # an integer past float's range: was a 500
        e = error_of(client.post("/api/fill_mask", json={"query": Q, name: 10 ** 400}), 400)
        assert "must be a finite number" in e["message"], e
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
    error_of(client.post("/api/sql", content=chunks(), headers=JSON), 413)


def test_time_limit(versioned_db_path):
    app = create_app(versioned_db_path, Settings(time_limit=0.0001))
    with TestClient(app, base_url=LOCAL) as c:
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
    # a cookie left by an earlier server (--write makes a new token at each start) does
    # not hide the right ?token=, and the page then sets the new cookie
    c.cookies.set("npmdb_token", "old-token")
    r = c.get("/versions", params={"token": "s3cret"}, follow_redirects=False)
    assert r.status_code == 303 and "npmdb_token=s3cret" in r.headers["set-cookie"]
    assert c.get("/api/versions", headers={"Authorization": "Bearer wrong"},
                 params={"token": "s3cret"}).status_code == 200
    c.cookies.clear()


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


def test_a_server_without_a_token_answers_only_loopback_names(versioned_db_path):
    """Without a token, local_only: a page elsewhere that points its own name at
    127.0.0.1 (DNS rebinding) gets no answer (it had every document)."""
    assert Settings().local_only and not Settings(token="t").local_only
    assert not Settings(local_only=False).local_only   # behind a proxy that sends its Host
    with TestClient(create_app(versioned_db_path)) as c:  # no token; Host: testserver
        assert error_of(c.get("/api/versions"), 421)
    with TestClient(create_app(versioned_db_path), base_url="http://localhost:8000") as c:
        assert c.get("/api/versions").status_code == 200
        for host in ("127.0.0.1:8000", "[::1]:8000", "LOCALHOST"):
            assert c.get("/api/versions", headers={"host": host}).status_code == 200, host
        for host in ("attacker.example", "attacker.example:8000", "127.0.0.1.nip.io", ""):
            e = error_of(c.get("/api/versions", headers={"host": host}), 421)
            assert "localhost" in e["message"] and "--token" in e["message"]
            assert c.get("/documents", headers={"host": host}).status_code == 421


def test_main_serves_loopback_names_only_without_a_token(versioned_db_path, monkeypatch):
    from types import SimpleNamespace

    import uvicorn

    from npmdb.serve import main

    seen = []

    def run(self):
        seen.append(self.config.app)
    monkeypatch.setattr(uvicorn.Server, "run", run)
    for token, local in ((None, True), ("s3cret", False)):
        main(SimpleNamespace(db=str(versioned_db_path), host="127.0.0.1", port=0, token=token,
                             write=False, time_limit=5.0, shards=None, ray=False))
        with TestClient(seen.pop(), base_url="http://attacker.example") as c:
            r = c.get("/api/versions", headers={"Authorization": "Bearer s3cret"})
            assert r.status_code == (421 if local else 200), r.text


def test_document_pages_for_meta_dot_ids_and_whole_words(writer):
    """The document page shows meta's characters as themselves (tojson escaped them as
    \\u0391…), links every id to its own page (a browser resolved "a/./b" to "a/b" and
    "a/../../sql" to "/sql"), and highlights the answer as whole words ("Oregon", not the
    start of "Oregonians")."""
    c, _ = writer
    auth = {"Authorization": "Bearer s3cret"}
    ids = ["notes/./a.txt", "a/../../sql", "..", ".", "x?y#z", "plain"]
    r = c.post("/api/documents", headers=auth, json={"documents": [
        {"id": i, "text": f"Salem is in Oregon; Oregonians say so ({n}).",
         "meta": {"city": "Αθήνα", "note": "a < b & c", "fun": "🎉"}}
        for n, i in enumerate(ids)]})
    assert r.status_code == 201, r.text
    import html
    import re

    page = "".join(c.get("/documents", headers=auth, params={"page": n}).text
                   for n in (1, 2, 3))  # 56 documents, 20 a page
    for i in ids:
        href = html.unescape(re.search(f'<a href="([^"]*)">{re.escape(html.escape(i))}</a>',
                                       page).group(1))
        # where a browser goes: urljoin removes dot segments as browsers do
        url = urllib.parse.urljoin("http://testserver/documents", href)
        r = c.get(url, headers=auth)
        assert r.status_code == 200 and f"<code>{html.escape(i)}</code>" in r.text, (i, url)
    r = c.get("/documents/plain", headers=auth, params={"phrase": "Oregon"})
    assert "1 occurrence of" in r.text and "<mark class=\"hl\">Oregon</mark>ians" not in r.text
    assert "Αθήνα" in r.text and "🎉" in r.text and "a &lt; b &amp; c" in r.text
    assert "\\u" not in r.text


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
    app = create_app(versioned_db_path, Settings(shards=2, engine="local"))
    with TestClient(app, base_url=LOCAL) as c:
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
    app = create_app(path, Settings(token="s3cret", write=True))
    with TestClient(app, base_url=LOCAL) as c:
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
    e = error_of(c.post("/api/fill_mask", headers=auth | JSON, content="[" * 5000 + "]" * 5000),
                 400)
    assert "nested too deeply" in e["message"]
    # a computed value past float's range: a DataError placed in the statement (never a
    # non-finite number in the JSON)
    e = error_of(c.post("/api/sql", headers=auth, json={
        "query": "SELECT id, 1e308 * 10 AS x FROM DOCUMENTS LIMIT 1"}), 400)
    assert e["type"] == "DataError" and "number out of range" in e["message"]
    assert (e["line"], e["column"]) == (1, 12)


# ---------------------------------------------------------------- bugs found by the hunt

def test_document_search_lists_each_document_once(writer):
    """BM25 ranks blocks; the documents page lists each document once (its best block) and
    pages over documents, however many blocks of one document match."""
    c, _ = writer
    auth = {"Authorization": "Bearer s3cret"}
    long_text = " ".join(f"Zanzibar harbour number {i} is busy with dhows every morning."
                         for i in range(400))
    docs = [{"id": "long:1", "title": "Harbours", "text": long_text}] + [
        {"id": f"short:{i}", "title": f"Isle {i}", "text": f"Zanzibar isle {i} has beaches."}
        for i in range(5)]
    assert c.post("/api/documents", headers=auth, json={"documents": docs}).status_code == 201
    seen, offset = [], 0
    while True:
        page = c.get("/api/documents", headers=auth,
                     params={"q": "Zanzibar", "limit": 2, "offset": offset}).json()
        seen += [d["id"] for d in page["documents"]]
        offset += 2
        if not page["more"]:
            break
    assert sorted(seen) == sorted(d["id"] for d in docs)   # every document, each once
    scores = [d["score"] for d in c.get("/api/documents", headers=auth,
                                        params={"q": "Zanzibar"}).json()["documents"]]
    assert scores == sorted(scores, reverse=True)
    r = c.get("/documents", headers=auth, params={"q": "Zanzibar"})
    assert r.text.count('href="/documents/long%3A1') == 1


def test_top_zero_is_over_the_limit(client):
    e = error_of(client.post("/api/fill_mask", json={"query": Q, "retrieval": "bm25",
                                                     "top": 0}), 400)
    assert e["type"] == "LimitExceeded" and e["limit"] == 100
    top = client.get("/openapi.json").json()["components"]["schemas"]["FillMaskRequest"][
        "properties"]["top"]
    assert (top["minimum"], top["maximum"]) == (1, 100)


@pytest.mark.parametrize("statement,field", [
    ("SELECT phrase FROM MASKED(?) USING dense(k => 100000)", "k"),
    ("SELECT phrase FROM MASKED(?) USING bm25(blocks => 100000)", "blocks"),
    ("SELECT phrase FROM MASKED(?) USING hybrid(k => 8, blocks => 51)", "blocks"),
    ("SELECT phrase FROM MASKED(?) USING bm25 LIMIT 101", "top"),
    ("SELECT phrase FROM EVIDENCE(?) USING bm25 WITH evidence = 21", "evidence"),
    ("EXPLAIN ANALYZE SELECT phrase FROM MASKED(?) USING dense(k => 5000)", "k"),
])
def test_sql_keeps_the_limits_of_fill_mask(client, statement, field):
    e = error_of(client.post("/api/sql", json={"query": statement, "params": [Q]}), 400)
    assert e["type"] == "LimitExceeded" and e["message"].startswith(field + "=")


def test_sql_within_the_limits_runs(client):
    for statement in ("SELECT phrase FROM MASKED(?) USING bm25(blocks => 50) LIMIT 100",
                      "EXPLAIN SELECT phrase FROM MASKED(?) USING dense(k => 100000)",
                      "SELECT label FROM CLASSIFY(?, LABELS(a = 'Qatar')) USING bm25"):
        r = client.post("/api/sql", json={"query": statement, "params": [Q]})
        assert r.status_code == 200, r.text
    body = client.post("/api/sql", json={"query": "SELECT id FROM DOCUMENTS"}).json()
    assert body["truncated"] is False and len(body["rows"]) == 400   # LIMIT: rows are cut


def test_threads_cap_holds_after_timeouts(versioned_db_path):
    """Reads cut off by the time limit keep running on their threads; the cap on work at
    once counts them, and a read whose request gave up while it waited never runs."""
    import concurrent.futures as cf
    import threading

    lock = threading.Lock()
    running, peak, calls = [0], [0], [0]

    def slow_fill_mask(*args, **kw):
        with lock:
            running[0] += 1
            calls[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.5)
        with lock:
            running[0] -= 1
        raise AssertionError("never answered: the request timed out")

    app = create_app(versioned_db_path, Settings(threads=2, time_limit=0.2))
    with TestClient(app, base_url=LOCAL) as c:
        c.app.state.server.db.fill_mask = slow_fill_mask
        with cf.ThreadPoolExecutor(12) as ex:
            codes = list(ex.map(lambda _: c.post("/api/fill_mask", json={"query": Q}
                                                 ).status_code, range(12)))
        assert codes == [503] * 12
        deadline = time.time() + 10
        while running[0] and time.time() < deadline:
            time.sleep(0.05)
    assert 1 <= peak[0] <= 2 and calls[0] < 12


def test_classify_scores_that_overflow_are_null(client):
    """A tiny tau overflows exp(similarity / tau): the answer is strict JSON, not a 500."""
    r = client.post("/api/classify", json={"query": Q, "tau": 0.001,
                                           "labels": {"a": "France", "b": "Greece"}})
    assert r.status_code == 200, r.text
    assert "Infinity" not in r.text and "NaN" not in r.text
    assert None in [a["score"] for a in r.json()["answers"]]


def test_classify_inf_score_is_null(client, monkeypatch):
    from npmdb.query.result import Answer, Result

    db = client.app.state.server.db
    inf = Result((Answer("a", float("inf"), 1), Answer("b", float("nan"), 1)), query=Q)
    monkeypatch.setattr(db, "classify", lambda *a, **kw: inf)
    r = client.post("/api/classify", json={"query": Q, "labels": {"a": "x", "b": "y"}})
    assert r.status_code == 200, r.text
    assert [a["score"] for a in r.json()["answers"]] == [None, None]


def test_sql_says_which_results_are_explain(client):
    body = client.post("/api/sql", json={"query": "SELECT title AS plan FROM DOCUMENTS "
                                                  "LIMIT 2"}).json()
    assert body["columns"] == ["plan"] and body["explain"] is False
    body = client.post("/api/sql", json={"query": "EXPLAIN SELECT phrase FROM MASKED(?)",
                                         "params": [Q]}).json()
    assert body["explain"] is True


def test_token_redirect_keeps_the_path_and_stays_on_this_host(writer):
    """The redirect that drops ?token= goes to the path as sent (still percent-encoded)
    and never to another host (``//evil.example/x`` is scheme-relative)."""
    import anyio

    c, _ = writer

    def redirect(raw: bytes) -> str:
        path, _, query = raw.partition(b"?")
        scope = {"type": "http", "http_version": "1.1", "method": "GET", "scheme": "http",
                 "path": urllib.parse.unquote(path.decode()), "raw_path": path,
                 "query_string": query, "root_path": "", "headers": [(b"host", b"testserver")],
                 "server": ("testserver", 80), "client": ("127.0.0.1", 1)}
        sent: list[dict] = []

        async def receive():
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message):
            sent.append(message)
        anyio.run(c.app, scope, receive, send)
        assert sent[0]["status"] == 303
        return dict(sent[0]["headers"])[b"location"].decode()
    assert redirect(b"/documents/a%3Fb?token=s3cret&x=1") == "/documents/a%3Fb?x=1"
    assert redirect(b"//evil.example/x?token=s3cret") == "/evil.example/x"
    assert redirect(b"/\\evil.example/x?token=s3cret").startswith("/evil.example")


def test_openapi_matches_the_server(writer):
    import inspect

    from npmdb.database import Database
    from npmdb.query.spec import ClassifySpec, MaskedSpec

    c, _ = writer
    doc = c.get("/openapi.json", headers={"Authorization": "Bearer s3cret"}).json()
    schemas = doc["components"]["schemas"]
    for method, name, spec in ((Database.fill_mask, "FillMaskRequest", MaskedSpec),
                               (Database.classify, "ClassifyRequest", ClassifySpec)):
        props = schemas[name]["properties"]
        assert schemas[name]["additionalProperties"] is False
        defaults = {f.name: f.default for f in __import__("dataclasses").fields(spec)}
        defaults.update({n: p.default for n, p in inspect.signature(method).parameters.items()
                         if p.default is not inspect.Parameter.empty})
        for option, prop in props.items():
            if "default" in prop and defaults.get(option) is not None:
                assert prop["default"] == defaults[option], (name, option)
    props = schemas["ClassifyRequest"]["properties"]
    assert props["tau"]["default"] == 5.0
    assert (props["tau"]["minimum"], props["tau"]["maximum"]) == (1e-3, 1e3)
    fill = schemas["FillMaskRequest"]["properties"]
    assert (fill["alpha"]["minimum"], fill["alpha"]["maximum"]) == (-16, 16)
    assert (fill["max_len"]["minimum"], fill["max_len"]["maximum"]) == (1, 64)
    assert fill["k"]["minimum"] == fill["blocks"]["minimum"] == 1
    assert fill["offset"]["maximum"] == 10_000
    assert schemas["SqlRequest"]["additionalProperties"] is False
    error = schemas["Error"]["properties"]["error"]["properties"]
    assert {"type", "message", "line", "column", "expected", "detail", "limit"} <= set(error)
    params = {p["name"]: p["schema"] for p in doc["paths"]["/api/documents"]["get"]["parameters"]}
    assert (params["limit"]["minimum"], params["offset"]["maximum"]) == (1, 1_000_000)
    assert "404" in doc["paths"]["/api/documents/{id}"]["delete"]["responses"]
    assert "404" in doc["paths"]["/api/tags/{name}"]["delete"]["responses"]
    for code in ("405", "409"):
        assert code in doc["paths"]["/api/tags"]["post"]["responses"]


def test_delete_of_a_missing_document_is_404(writer):
    c, _ = writer
    auth = {"Authorization": "Bearer s3cret"}
    e = error_of(c.delete("/api/documents/no-such-id", headers=auth), 404)
    assert e["type"] == "NotFound" and "no-such-id" in e["message"]
    assert c.get("/api/versions", headers=auth).json()["head"] == 1   # nothing committed


@pytest.mark.parametrize("seconds", [0, -1, float("nan"), float("inf")])
def test_time_limit_must_be_positive_and_finite(seconds):
    from argparse import Namespace

    import npmdb
    from npmdb.serve import main

    with pytest.raises(npmdb.ProgrammingError, match="time limit must be a positive"):
        Settings(time_limit=seconds)
    args = Namespace(db="/nonexistent", host="127.0.0.1", port=0, token=None, write=False,
                     time_limit=seconds)
    with pytest.raises(npmdb.ProgrammingError, match="--time-limit"):
        main(args)


def test_document_page_out_of_range_offsets(client):
    r = client.get("/documents/freedict-eng-jpn:8705", params={"start": -5, "end": 3})
    assert r.status_code == 200 and "hl current" not in r.text
    r = client.get("/documents/freedict-eng-jpn:8705", params={"start": 5, "end": 10 ** 6})
    assert r.status_code == 200 and "hl current" not in r.text
    for page in ("50002", str(10 ** 30), "-3"):
        r = client.get("/documents", params={"page": page})
        assert r.status_code == 400 and "page must be 1 to 50,001" in r.text
        assert "SELECT" not in r.text and "OFFSET" not in r.text
    assert client.get("/documents", params={"page": "50001"}).status_code == 200


def test_documents_limit_must_be_positive(client):
    e = error_of(client.get("/api/documents", params={"limit": 0}), 400)
    assert "limit must be 1 to 200" in e["message"]


def test_405_has_allow_and_error_pages_know_write_mode(writer):
    c, _ = writer
    auth = {"Authorization": "Bearer s3cret"}
    r = c.put("/api/documents", headers=auth)
    assert r.status_code == 405
    assert set(r.headers["allow"].split(", ")) >= {"GET", "POST"}
    r = c.patch("/api/fill_mask", headers=auth)
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    r = c.get("/documents/nope", headers=auth)
    assert r.status_code == 404 and "read-write" in r.text and "read-only" not in r.text


# ---------------------------------------------------------------- limits the hunt found open

@pytest.mark.parametrize("port", ["65536", "99999", "-5"])
def test_serve_refuses_a_port_out_of_range(port, capsys):
    """The OS would wrap 99999 to 34463 (and 65536 to any free port): refused before the
    database is opened or anything is bound."""
    from npmdb.cli import main

    assert main(["serve", "/nonexistent", "--port", port]) == 2
    err = capsys.readouterr().err
    assert f"--port must be 0 to 65535 (0: any free port), got {port}" in err
    assert "http://" not in err


def test_serve_prints_the_url_it_listens_on_and_none_when_it_cannot(versioned_db_path):
    """--port 0 prints the port it got; a second server on that port fails without
    printing a URL (or a generated token) first."""
    cmd = [sys.executable, "-m", "npmdb", "serve", str(versioned_db_path), "--port"]
    first = subprocess.Popen(cmd + ["0"], stderr=subprocess.PIPE, text=True)
    try:
        banner = first.stderr.readline()
        assert banner.startswith("npmdb serve: http://127.0.0.1:"), banner
        port = int(banner.split("http://127.0.0.1:")[1].split("/")[0])
        assert port != 0
        import urllib.request
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/versions", timeout=30) as r:
            assert r.status == 200
        second = subprocess.run(cmd + [str(port), "--write"], capture_output=True, text=True,
                                timeout=120)
        assert second.returncode == 2 and "http://" not in second.stderr
        assert "generated" not in second.stderr   # a token for a server that never ran
        assert f"could not listen on 127.0.0.1:{port}" in second.stderr
    finally:
        first.terminate()
        first.wait(timeout=60)
        first.stderr.close()


def test_the_printed_url_carries_a_token_of_any_characters(versioned_db_path):
    """A token with '+', '#' or '&' printed raw gave a URL that the server refused."""
    token = "pa+ss#1&x%y"
    cmd = [sys.executable, "-m", "npmdb", "serve", str(versioned_db_path), "--port", "0",
           "--token", token]
    server = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    try:
        url = server.stderr.readline().split()[2]
        assert urllib.parse.parse_qs(urllib.parse.urlsplit(url).query) == {"token": [token]}
        from urllib.request import urlopen
        with urlopen(url.replace("/?", "/api/versions?"), timeout=30) as r:
            assert r.status == 200
    finally:
        server.terminate()
        server.wait(timeout=60)
        server.stderr.close()


@pytest.mark.parametrize("shards,seconds", [(2, 5.0), (None, 0)])
def test_serve_checks_its_arguments_before_generating_a_token(versioned_db_path, shards,
                                                              seconds, capsys):
    from types import SimpleNamespace

    import npmdb
    from npmdb.serve import main

    args = SimpleNamespace(db=str(versioned_db_path), host="127.0.0.1", port=0, token=None,
                           write=True, time_limit=seconds, shards=shards, ray=False)
    with pytest.raises(npmdb.ProgrammingError):
        main(args)
    assert "generated" not in capsys.readouterr().err


@pytest.mark.parametrize("statement,params", [
    ("SELECT phrase FROM MASKED(?)", ["Doha " * 500 + "is [MASK]."]),
    ("SELECT phrase FROM EVIDENCE(:q)", {"q": "Doha " * 500 + "is [MASK]."}),
    ("SELECT doc_id FROM SEARCH(:q)", {"q": "Doha " * 500}),
    ("SELECT id FROM DOCUMENTS WHERE id IN (?, ?)", ["a", ["b" * 2001]]),
])
def test_sql_params_keep_the_query_length(client, statement, params):
    e = error_of(client.post("/api/sql", json={"query": statement, "params": params}), 413)
    assert e["type"] == "PayloadTooLarge" and "the limit is 2000" in e["message"]
    assert e["message"].startswith("'params")


def test_sql_offset_keeps_the_offset_limit_of_fill_mask(client):
    for statement in ("SELECT phrase FROM MASKED(?) USING bm25 LIMIT 100 OFFSET 1000000000",
                      "SELECT label FROM CLASSIFY(?, LABELS(a = 'Qatar')) OFFSET 10001"):
        e = error_of(client.post("/api/sql", json={"query": statement, "params": [Q]}), 400)
        assert e["type"] == "LimitExceeded" and e["message"].startswith("offset=")
        assert e["limit"] == 10_000
    r = client.post("/api/sql", json={"query": "SELECT phrase FROM MASKED(?) USING bm25 "
                                               "LIMIT 5 OFFSET 10000", "params": [Q]})
    assert r.status_code == 200, r.text


def test_documents_page_zero_is_refused(client):
    r = client.get("/documents", params={"page": "0"})
    assert r.status_code == 400 and "page must be 1 to 50,001, got 0" in r.text


def test_query_page_inputs_take_what_the_api_takes(client):
    """The page's bounds on max_len and tau are the API's: the bounds run, just past them
    is refused."""
    import re

    page = client.get("/").text
    bounds = {name: dict(re.findall(r'(min|max)="([^"]+)"', tag)) for name, tag in
              re.findall(r'<input name="(max_len|tau)"([^>]*)>', page)}
    assert set(bounds) == {"max_len", "tau"} and all(len(b) == 2 for b in bounds.values())
    most_len, least_tau = int(bounds["max_len"]["max"]), float(bounds["tau"]["min"])
    ok = {"query": Q, "retrieval": "bm25", "top": 1}
    for opts in ({"max_len": most_len}, {"max_len": int(bounds["max_len"]["min"])},
                 {"tau": least_tau}, {"tau": float(bounds["tau"]["max"])}):
        assert client.post("/api/fill_mask", json=ok | opts).status_code == 200, opts
    for opts in ({"max_len": most_len + 1}, {"tau": least_tau / 2}):
        assert client.post("/api/fill_mask", json=ok | opts).status_code == 400, opts


def test_negative_version_in_a_query_string_is_an_id(client):
    said = error_of(client.post("/api/fill_mask", json={"query": Q, "version": -1}),
                    400)["message"]
    assert said.startswith("no version -1: version ids are integers >= 0")
    assert error_of(client.get("/api/documents", params={"version": "-1"}), 400)[
        "message"] == said
    assert error_of(client.get("/api/diff", params={"a": "-1"}), 400)["message"] == said


@pytest.mark.parametrize("token", [" ", " a ", "tok\n", "geheim-ß-秘密"])
def test_serve_refuses_a_token_no_header_can_carry(versioned_db_path, token):
    """A header's value loses its edge white space, so ' a ' was accepted (on a public
    address too) and every Authorization: Bearer request got 401."""
    from types import SimpleNamespace

    import npmdb
    from npmdb.serve import main

    args = SimpleNamespace(db=str(versioned_db_path), host="0.0.0.0", port=0, token=token,
                           write=False, time_limit=5.0, shards=None, ray=False)
    with pytest.raises(npmdb.ProgrammingError, match="access token must be printable"):
        main(args)
    # the same rule where an application builds the server itself: an HTTP header is
    # latin-1 and a cookie ASCII, so "ß" never matched (and ?token= set no cookie: a 500)
    with pytest.raises(npmdb.ProgrammingError, match="access token must be printable"):
        Settings(token=token)


def test_a_head_request_is_pinned_again_when_a_vacuum_removed_its_version(tmp_path,
                                                                           tiny_encoder,
                                                                           monkeypatch):
    """HEAD's id was pinned, then another process committed and vacuumed before the query
    read it: the request was refused with "no version N" (9 % of HEAD requests under a
    writer). A request for HEAD is pinned again; one that named the version is refused."""
    import npmdb
    from npmdb.serve.app import Server

    path = tmp_path / "db"
    with npmdb.open(path, encoder=tiny_encoder, progress=False) as db:
        db.add(["Salem is the capital of Oregon."])
        db.add(["Boise is the capital of Idaho."])
    app = create_app(path)
    with TestClient(app, base_url=LOCAL) as c:
        server = app.state.server
        stale = [server.db.version]
        writer = ("import npmdb\n"   # another process moves HEAD and vacuums
                  f"with npmdb.open({str(path)!r}, progress=False) as w:\n"
                  "    w.add(['Helena is the capital of Montana.'])\n    w.vacuum()\n")
        subprocess.run([sys.executable, "-c", writer], check=True, timeout=300)
        real = Server.pin
        monkeypatch.setattr(Server, "pin", lambda self, ref=None: stale.pop() if stale and
                            ref in (None, "") else real(self, ref))
        r = c.post("/api/fill_mask", json={"query": "Salem is the capital of [MASK]."})
        assert r.status_code == 200, r.text
        assert r.json()["version"] == 3
        stale.append(2)
        r = c.post("/api/fill_mask", json={"query": "Salem is the capital of [MASK].",
                                           "version": 2})
        assert r.status_code == 400 and "no version 2" in r.text
