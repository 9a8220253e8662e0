"""`npmdb serve` end to end in a real headless browser (Debian's chromium, driven by
Playwright): ask a masked query, check the highlighted evidence against the document,
follow it to the document page, switch version and compare two versions side by side.

Skips (with the reason) where chromium or playwright is missing. Screenshots go to
``$NPMDB_TEST_ARTIFACTS`` (default ``build/test-artifacts/``); with
``NPMDB_UPDATE_DOCS=1`` the query page's also replaces ``docs/serve.png``.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
Q = "Doha is the capital of [MASK]."


def chromium_path() -> str | None:
    for name in (os.environ.get("NPMDB_CHROMIUM"), "/usr/bin/chromium", "chromium",
                 "chromium-browser"):
        if name and (shutil.which(name) or Path(name).is_file()):
            return shutil.which(name) or name
    return None


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (pip install 'npmdb[test]')")
    exe = chromium_path()
    if exe is None:
        pytest.skip("chromium is not installed (apt-get install chromium)")
    with sync_playwright() as p:
        try:
            b = p.chromium.launch(executable_path=exe, args=["--no-sandbox"])
        except Exception as exc:  # noqa: BLE001 - a browser that cannot start: skip, say why
            pytest.skip(f"chromium at {exe} does not start under playwright: {exc}")
        yield b
        b.close()


@pytest.fixture(scope="module")
def artefacts() -> Path:
    out = Path(os.environ.get("NPMDB_TEST_ARTIFACTS", ROOT / "build" / "test-artifacts"))
    out.mkdir(parents=True, exist_ok=True)
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(versioned_db_path, browser):
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "npmdb", "serve", str(versioned_db_path),
                             "--port", str(port)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 180
    while True:
        try:
            urllib.request.urlopen(base + "/api/versions", timeout=2).read()
            break
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                proc.kill()
                pytest.fail("npmdb serve did not start: " + (proc.stdout.read() or ""))
            time.sleep(0.3)
    yield base
    proc.terminate()
    proc.wait(timeout=30)


def test_query_evidence_document_and_versions(browser, server, artefacts, versioned_db_path):
    import npmdb

    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    requested: list[str] = []
    page.on("request", lambda r: requested.append(r.url))

    page.goto(server + "/")
    page.fill("#q", Q)
    page.select_option("select[name=retrieval]", "bm25")
    page.fill("input[name=top]", "4")
    page.click("#ask button[type=submit]")
    page.wait_for_selector("#status.done")
    answers = page.locator("section.answers .answer")
    assert 1 <= answers.count() <= 4
    assert page.locator("section.answers").get_attribute("data-version") == "2"
    assert page.locator("#plan .plan-row").count() >= 5      # the plan's bar chart
    assert "BM25Blocks" in page.inner_text("#plan")

    # every highlighted span is the document's text at the linked offsets
    links = page.locator(".evidence a.doc-link")
    marks = page.locator(".evidence mark.span")
    assert links.count() == marks.count() > 0
    with npmdb.open(versioned_db_path, readonly=True, progress=False) as db:
        for i in range(links.count()):
            url = urllib.parse.urlparse(links.nth(i).get_attribute("href"))
            q = urllib.parse.parse_qs(url.query)
            doc_id = urllib.parse.unquote(url.path.removeprefix("/documents/"))
            text = db.get(doc_id, version=int(q["version"][0]))["text"]
            assert marks.nth(i).inner_text() == text[int(q["start"][0]):int(q["end"][0])]
        top_answer = page.locator(".answer-text").first.inner_text()
        page.screenshot(path=str(artefacts / "serve-query.png"), full_page=True)
        if os.environ.get("NPMDB_UPDATE_DOCS"):
            shutil.copy(artefacts / "serve-query.png", ROOT / "docs" / "serve.png")

        # the document page highlights every occurrence, the linked one as current
        first = links.first
        href = first.get_attribute("href")
        first.click()
        page.wait_for_selector("#doc-text")
        q = urllib.parse.parse_qs(urllib.parse.urlparse(href).query)
        doc_id = urllib.parse.unquote(urllib.parse.urlparse(href).path.split("/documents/")[1])
        text = db.get(doc_id)["text"]
        assert page.inner_text("#doc-text") == text
        assert page.inner_text("mark.current") == text[int(q["start"][0]):int(q["end"][0])]
        for m in page.locator("#doc-text mark").all_inner_texts():
            assert " ".join(m.lower().split()) == " ".join(top_answer.lower().split()) or \
                m.lower() == q["phrase"][0].lower()
        page.screenshot(path=str(artefacts / "serve-document.png"), full_page=True)

    # switch version: AS OF 'first', compared with HEAD side by side
    page.go_back()
    page.wait_for_selector("#ask")
    page.fill("#q", Q)
    page.select_option("select[name=retrieval]", "bm25")
    page.select_option("#version", "1")
    page.select_option("#compare", "2")
    page.click("#ask button[type=submit]")
    page.wait_for_function("document.querySelectorAll('section.answers').length == 2")
    page.wait_for_selector("#status.done")
    cols = page.locator("section.answers")
    assert [cols.nth(i).get_attribute("data-version") for i in range(2)] == ["1", "2"]
    for i in range(2):
        assert "generation 0" in cols.nth(i).inner_text()
    page.screenshot(path=str(artefacts / "serve-compare.png"), full_page=True)

    # the SQL console shows a parse error with its caret
    page.goto(server + "/sql")
    page.fill("#sql", "SELECT phrase\nFROM MASKED('a [MASK]')\nORDER score")
    page.click("#sql-form button[type=submit]")
    page.wait_for_selector("#sql-error:not([hidden])")
    assert "line 3, column 7" in page.inner_text("#sql-error")
    page.fill("#sql", "SELECT id, title FROM DOCUMENTS LIMIT 3")
    page.click("#sql-form button[type=submit]")
    page.wait_for_selector("#sql-result table")
    assert page.locator("#sql-result tbody tr").count() == 3

    page.goto(server + "/versions?a=first")
    assert "100 added" in page.inner_text("#diff")
    assert errors == []
    assert all(u.startswith(server) for u in requested), "the page fetched from elsewhere"
    page.close()



def _sql_console(browser, server):
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(server + "/sql")
    return page, errors


def _run_sql(page, statement: str) -> None:
    page.fill("#sql", statement)
    page.click("#sql-form button[type=submit]")
    page.wait_for_function("!['running…', ''].includes("
                           "document.getElementById('status').textContent)")


def test_sql_console_shows_a_plan_only_for_explain(browser, server):
    """The API says which results are EXPLAIN's; a column named "plan" is a table."""
    page, errors = _sql_console(browser, server)
    _run_sql(page, "SELECT title AS plan FROM DOCUMENTS LIMIT 3")
    assert page.locator("#sql-result table tbody tr").count() == 3
    _run_sql(page, "EXPLAIN SELECT phrase FROM MASKED('a [MASK]') USING bm25")
    assert page.locator("#sql-result table").count() == 0
    assert "BM25" in page.inner_text("#sql-result pre")
    assert errors == []
    page.close()


def test_sql_console_reports_a_network_error(browser, server):
    """A request that never reaches the server is an error, not "running…" for ever."""
    page, errors = _sql_console(browser, server)
    page.route("**/api/sql", lambda route: route.abort())
    page.fill("#sql", "SELECT id FROM DOCUMENTS LIMIT 1")
    page.click("#sql-form button[type=submit]")
    page.wait_for_selector("#sql-error:not([hidden])", timeout=10_000)
    assert page.inner_text("#status") == "error"
    assert errors == []
    page.close()


def test_query_page_shows_the_last_query_and_reads_numbers_as_typed(browser, server):
    """A late response to an earlier query never replaces the answers of a later one (a
    query's answers could sit under another query's text), and "1e1" in a number field is
    ten, as the form itself reads it (parseInt sent 1)."""
    import json

    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    held: list = []
    sent: list[dict] = []

    def hold_first(route):
        sent.append(json.loads(route.request.post_data))
        if not held:
            held.append(route)        # answered only after the second query's answers
        else:
            route.continue_()
    page.route("**/api/fill_mask", hold_first)
    page.goto(server + "/")
    page.fill("#q", Q)
    page.select_option("select[name=retrieval]", "bm25")
    page.fill("input[name=top]", "1")
    page.click("#ask button[type=submit]")
    while not held:
        page.wait_for_timeout(50)
    page.fill("input[name=top]", "1e1")
    page.click("#ask button[type=submit]")
    page.wait_for_selector("#status.done")
    shown = page.locator("section.answers .answer").count()
    assert shown > 1 and sent[1]["top"] == 10, sent
    with page.expect_response("**/api/fill_mask"):
        held[0].continue_()
    page.wait_for_timeout(300)
    assert page.locator("section.answers .answer").count() == shown   # not the 1 of the first
    assert errors == []
    page.close()
