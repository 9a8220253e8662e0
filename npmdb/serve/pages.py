"""The HTML pages (Jinja2 templates, no build step; the query page and the SQL console
call the JSON API from ``static/app.js``)."""

from __future__ import annotations

import time
from typing import Any

from starlette.requests import Request
from starlette.routing import Route
from starlette.templating import Jinja2Templates

from npmdb.query.spec import MAX_LEN, RANGES

from .api import MAX_OFFSET, occurrences, page_of_documents
from .app import ApiError, Server

__all__ = ["routes", "highlight"]


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
        doc_id = request.path_params["doc_id"]
        p = request.query_params
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
            Route("/documents/{doc_id:path}", document), Route("/versions", versions)]
