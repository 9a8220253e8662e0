"""The HTML pages (Jinja2 templates, no build step; the query page and the SQL console
call the JSON API from ``static/app.js``)."""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import quote, urlencode

from starlette.requests import Request
from starlette.routing import Route
from starlette.templating import Jinja2Templates

from npmdb.query.result import json_text
from npmdb.query.spec import MAX_LEN, RANGES

from .api import MAX_OFFSET, occurrences, page_of_documents
from .app import ApiError, Server

__all__ = ["routes", "highlight", "doc_href"]


def doc_href(doc_id: str, **params: Any) -> str:
    """The document page's URL for ``doc_id``: its id as one path segment (a ``/`` in it
    escaped: the browser would resolve ``a/../b``), and ``?id=`` for the ids ``.`` and
    ``..``, which a browser drops from any path, escaped or not."""
    q = {k: v for k, v in params.items() if v is not None}
    if doc_id in (".", ".."):
        return "/document?" + urlencode({"id": doc_id, **q})
    return "/documents/" + quote(doc_id, safe="") + ("?" + urlencode(q) if q else "")


def highlight(text: str, spans: list[tuple[int, int]], current: tuple[int, int] | None
              ) -> list[tuple[str, str]]:
    """``text`` cut into (piece, kind) with kind '', 'hl' or 'hl current'; overlaps merged."""
    marks = sorted(set(spans) | ({current} if current else set()))
    out: list[tuple[str, str]] = []
    pos = 0
    for a, b in marks:
        a, b = max(a, pos), min(b, len(text))
        if a >= b:
            continue
        if a > pos:
            out.append((text[pos:a], ""))
        kind = "hl current" if current and a < current[1] and b > current[0] else "hl"
        out.append((text[a:b], kind))
        pos = b
    if pos < len(text):
        out.append((text[pos:], ""))
    return out


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value not in (None, "") else None
    except ValueError:
        raise ApiError(400, "BadRequest", f"expected an integer, got {value!r}") from None


def _span(start: int | None, end: int | None, length: int) -> tuple[int, int] | None:
    """The occurrence a link names, or None when it names none in a text of ``length``
    characters (missing, negative, past the end, empty): Python's negative indexes would
    highlight other text."""
    if start is None or end is None or not 0 <= start < end <= length:
        return None
    return start, end


def routes(server: Server, templates: Jinja2Templates) -> list[Route]:
    db = server.db
    s = server.settings
    templates.env.filters["doc_href"] = doc_href
    # meta as its JSON, characters as themselves (tojson escapes them for a <script>)
    templates.env.filters["json_text"] = lambda v: json_text(v, indent=1)

    def render(request: Request, name: str, **ctx: Any):
        return templates.TemplateResponse(request, name, {"page": name.split(".")[0],
                                                          "write": s.write, **ctx})

    async def index(request: Request):
        vs = await server.call(db.versions)
        return render(request, "query.html", versions=vs, limits=s,
                      ranges=RANGES | {"max_len": (1, MAX_LEN)})

    async def sql_page(request: Request):
        return render(request, "sql.html", limits=s)

    async def documents(request: Request):
        p = request.query_params
        per = 20
        page = _int(p.get("page"))
        page = 1 if page is None else page
        last = MAX_OFFSET // per + 1
        if not 1 <= page <= last:
            raise ApiError(400, "BadRequest", f"page must be 1 to {last:,}, got {page}")
        q = (p.get("q") or "")[:s.max_query] or None
        data = await server.call(page_of_documents, server, p.get("version"), q,
                                 (page - 1) * per, per)
        vs = await server.call(db.versions)
        return render(request, "documents.html", data=data, page_no=page, q=q or "",
                      versions=vs)

    async def document(request: Request):
        p = request.query_params
        doc_id = request.path_params.get("doc_id", p.get("id"))
        if doc_id is None:
            raise ApiError(400, "BadRequest", "name the document: /documents/ID or "
                           "/document?id=ID")
        start, end = _int(p.get("start")), _int(p.get("end"))
        phrase = (p.get("phrase") or "")[:s.max_query]

        def run(vid: int):
            d = db.get(doc_id, version=vid)
            if d is None:
                raise ApiError(404, "NotFound", f"no document {doc_id!r} at version {vid}")
            text = d["text"]
            current = _span(start, end, len(text))
            if not phrase and current is not None:
                spans = occurrences(text, text[start:end])
            else:
                spans = occurrences(text, phrase)
            label = phrase or (text[start:end] if current else "")
            return vid, d, highlight(text, spans, current), len(spans), label
        vid, d, pieces, n, label = await server.call(server.at, p.get("version"), run)
        return render(request, "document.html", doc=d, version=vid, pieces=pieces, count=n,
                      label=label)

    async def versions(request: Request):
        p = request.query_params

        def run():
            vs = db.versions()
            diff = None
            if p.get("a"):
                a, b = server.pin(p.get("a")), server.pin(p.get("b"))
                diff = (a, b, db.diff(a, b))
            return vs, diff
        vs, diff = await server.call(run)
        for v in vs:
            v["when"] = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(v["time"]))
        return render(request, "versions.html", versions=list(reversed(vs)), diff=diff,
                      a=p.get("a", ""), b=p.get("b", ""))

    return [Route("/", index), Route("/sql", sql_page), Route("/documents", documents),
            Route("/documents/{doc_id:path}", document), Route("/document", document),
            Route("/versions", versions)]
