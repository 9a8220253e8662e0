"""The JSON API: request checking, one pinned version per request, answers as JSON."""

from __future__ import annotations

import json
import re
import time
from functools import partial
from typing import Any, Sequence

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from npmdb.boundaries import is_cjk
from npmdb.errors import Error, ProgrammingError
from npmdb.query.result import json_text
from npmdb.query.spec import ClassifySpec
from npmdb.query.text import snippet_bounds

from .app import ApiError, Server
from .settings import MAX_OFFSET

__all__ = ["routes", "answers_json", "context", "occurrences", "StrictJSONResponse",
           "MAX_OFFSET"]

#: fill_mask options the API passes on (after the limits below are checked).
FILL_OPTIONS = ("top", "k", "mode", "retrieval", "blocks", "max_len", "tau", "alpha", "exact",
                "scoring", "group_by", "clean_edges", "no_stopwords", "not_in_query",
                "no_query_words", "not_subject_name", "whole_names", "bm25_title", "bm25_question",
                "bm25_prior", "evidence", "offset", "version")
CLASSIFY_OPTIONS = ("tau", "k", "mode", "retrieval", "blocks", "max_len", "exact",
                    "clean_edges", "bm25_title", "bm25_question", "calibrate", "evidence",
                    "version")
CONTEXT = 80  # characters of context either side of an occurrence


class StrictJSONResponse(JSONResponse):
    """JSON as the standard has it: a NaN or infinite number (a label score that overflowed
    at a small tau, ``1e308 * 10`` in SQL) is null, never a 500."""

    def render(self, content: Any) -> bytes:
        return json_text(content, separators=(",", ":")).encode("utf-8")


async def read_json(request: Request, keys: Sequence[str] | None = None) -> dict[str, Any]:
    """The request body as a JSON object, or a 400 that says what is wrong; with ``keys``,
    a key not among them is refused (a misspelt "versoin" must not be ignored)."""
    body = await request.body()
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, "BadRequest", f"the request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise ApiError(400, "BadRequest", "the request body is nested too deeply") from None
    if not isinstance(data, dict):
        raise ApiError(400, "BadRequest", "the request body must be a JSON object")
    unknown = sorted(set(data) - set(keys)) if keys is not None else []
    if unknown:
        raise ApiError(400, "BadRequest", f"unknown field(s) {', '.join(unknown)}; allowed: "
                       f"{', '.join(keys)}")
    return data


def _query(data: dict, server: Server, key: str = "query") -> str:
    q = data.get(key)
    if not isinstance(q, str) or not q.strip():
        raise ApiError(400, "BadRequest", f"'{key}' must be a non-empty string")
    check_length(f"'{key}'", q, server)
    return q


def check_length(name: str, text: str, server: Server) -> None:
    """A 413 PayloadTooLarge when ``text`` is over the server's query length."""
    if len(text) > server.settings.max_query:
        raise ApiError(413, "PayloadTooLarge", f"{name} is {len(text)} characters; the limit "
                       f"is {server.settings.max_query}: send a shorter text")


def check_params(server: Server, params: Any) -> None:
    """Refuse a SQL parameter holding a text over the query length: a masked query bound
    as ``?`` or ``:name`` is as bounded as one written in the statement."""
    if not params:
        return
    named = isinstance(params, dict)
    for key, value in (params.items() if named else enumerate(params)):
        stack = [value]
        while stack:  # the strings anywhere inside it (iterative: JSON nests deeply)
            v = stack.pop()
            if isinstance(v, str):
                check_length(f"'params.{key}'" if named else f"'params[{key}]'", v, server)
            elif isinstance(v, (list, dict)):
                stack.extend(v.values() if isinstance(v, dict) else v)


def check_options(data: dict, allowed: tuple[str, ...], server: Server,
                  skip: tuple[str, ...] = ("query",)) -> dict[str, Any]:
    """The options of a request, with unknown names and the limits on k/top refused."""
    s = server.settings
    opts = {k: v for k, v in data.items() if k not in skip}
    unknown = sorted(set(opts) - set(allowed))
    if unknown:
        raise ApiError(400, "ProgrammingError", f"unknown option(s) {', '.join(unknown)}; "
                       f"allowed: {', '.join((*skip, *allowed))}")
    for name, most in (("k", s.max_k), ("top", s.max_top), ("blocks", s.max_blocks),
                       ("evidence", s.max_evidence), ("offset", s.max_rows)):
        v = opts.get(name)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int):
            raise ApiError(400, "ProgrammingError", f"{name} must be an integer, got {v!r}")
        check_limit(name, v, most)
    return opts


def check_limit(name: str, value: int, most: int, how: str = "") -> None:
    """A 400 LimitExceeded when ``value`` is over ``most``; ``top`` 0 (the engine's "every
    answer") counts as over the limit. ``how`` says where the value came from in SQL."""
    if value > most or (name == "top" and value == 0):
        said = f"{name}={value}" + (" (every answer)" if value == 0 else "")
        raise ApiError(400, "LimitExceeded", f"{said}{how} is over this server's limit of "
                       f"{most}: ask for at most {most}", limit=most)


def check_statement(server: Server, text: str, params: Any) -> None:
    """Refuse a SQL statement that would run with k, blocks, top, offset or evidence over
    the server's limits, or with a parameter over the query length (as /api/fill_mask
    does); a plain EXPLAIN runs nothing and passes. A statement that does not compile is
    left to ``db.sql``, which reports it."""
    from npmdb.query import ast as A
    from npmdb.query.sql import prepare

    check_params(server, params)
    try:
        stmt, compiled, _ = prepare(text, params)
    except Error:  # db.sql raises the same error, with its position
        return
    if compiled is None or compiled.spec is None or (
            isinstance(stmt, A.Explain) and not stmt.analyze):
        return
    spec, s = compiled.spec, server.settings
    checks = [("k", spec.k, s.max_k, " (USING dense/hybrid/exact(k => N) or WITH k = N)"),
              ("blocks", spec.blocks, s.max_blocks,
               " (USING bm25/hybrid(blocks => N) or WITH blocks = N)"),
              ("evidence", spec.evidence, s.max_evidence, " (WITH evidence = N)"),
              ("offset", spec.offset, s.max_rows, " (the OFFSET of a masked query)")]
    if not isinstance(spec, ClassifySpec):  # CLASSIFY: every label, as many as given
        checks.append(("top", spec.top, s.max_top, " (the LIMIT of a masked query)"))
    for name, value, most, how in checks:
        check_limit(name, value, most, how)


def context(text: str, a: int, b: int, width: int = CONTEXT) -> dict[str, str]:
    """``text[a:b]`` with up to ``width`` characters around it, cut at white space, as
    (before, match, after): the engine's snippet cut, split where the match is."""
    lo, hi = snippet_bounds(text, a, b, width)
    return {"before": ("…" if lo > 0 else "") + text[lo:a], "match": text[a:b],
            "after": text[b:hi] + ("…" if hi < len(text) else "")}


def occurrences(text: str, phrase: str) -> list[tuple[int, int]]:
    """Every case-insensitive occurrence of ``phrase`` in ``text`` (white space folded)
    that is whole words: "Oregon" is not the start of "Oregonians" (an ideograph is a word
    of its own, as the engine reads Chinese and Japanese text)."""
    words = phrase.split()
    if not words:
        return []
    pat = r"\s+".join(re.escape(w) for w in words)
    return [(m.start(), m.end()) for m in re.finditer(pat, text, re.IGNORECASE)
            if not (_glued(text, m.start() - 1, m.start())
                    or _glued(text, m.end() - 1, m.end()))]


def _glued(text: str, a: int, b: int) -> bool:
    """Whether ``text[a]`` and ``text[b]`` are letters or digits of one word."""
    if a < 0 or b >= len(text):
        return False
    x, y = text[a], text[b]
    return x.isalnum() and y.isalnum() and not (is_cjk(x) or is_cjk(y))


def answers_json(db: Any, res: Any, vid: int) -> list[dict[str, Any]]:
    """Answers with each occurrence's context read from the pinned version's document."""
    docs: dict[str, dict | None] = {}
    out = []
    for a in res.answers:
        ev = []
        for e in a.evidence:
            if e.doc_id not in docs:
                docs[e.doc_id] = db.get(e.doc_id, version=vid)
            d = docs[e.doc_id]
            item = {"doc_id": e.doc_id, "title": e.title, "start": e.start, "end": e.end,
                    "snippet": e.snippet, "score": e.score}
            if d is not None:
                field = d.get(e.field) if isinstance(d.get(e.field), str) else d["text"]
                item.update(context(field, e.start, e.end))
            ev.append(item)
        out.append({"text": a.text, "score": a.score, "support": a.support,
                    "tokens": a.tokens, "evidence": ev})
    return out


def result_json(server: Server, res: Any, vid: int, ms: float) -> dict[str, Any]:
    return {"query": res.query, "answers": answers_json(server.db, res, vid),
            "version": res.version, "generation": res.generation, "ms": round(ms, 3),
            "plan": res.plan,
            "stats": [{"operator": s.operator, "detail": s.detail, "rows": s.rows,
                       "ms": round(s.ms, 4), "depth": s.depth} for s in res.stats]}


def routes(server: Server) -> list[Route]:
    db = server.db
    s = server.settings

    async def fill_mask(request: Request) -> StrictJSONResponse:
        data = await read_json(request)
        q = _query(data, server)
        opts = check_options(data, FILL_OPTIONS, server)

        ref = opts.pop("version", None)

        def run(vid: int):
            t0 = time.perf_counter()
            res = db.fill_mask(q, version=vid, **opts)
            return result_json(server, res, vid, (time.perf_counter() - t0) * 1000)
        return StrictJSONResponse(await server.call(server.at, ref, run))

    async def classify(request: Request) -> StrictJSONResponse:
        data = await read_json(request)
        q = _query(data, server)
        labels = data.get("labels")
        if not isinstance(labels, dict) or not labels or not all(
                isinstance(v, str) or (isinstance(v, list) and v and all(
                    isinstance(w, str) for w in v)) for v in labels.values()):
            raise ApiError(400, "BadRequest", "'labels' must be an object of label -> word "
                           "or list of words")
        opts = check_options(data, CLASSIFY_OPTIONS, server, skip=("query", "labels"))

        ref = opts.pop("version", None)

        def run(vid: int):
            t0 = time.perf_counter()
            res = db.classify(q, labels, version=vid, **opts)
            out = result_json(server, res, vid, (time.perf_counter() - t0) * 1000)
            for a in out["answers"]:
                a["label"] = a["text"]
            return out
        return StrictJSONResponse(await server.call(server.at, ref, run))

    async def sql(request: Request) -> StrictJSONResponse:
        data = await read_json(request)
        q = _query(data, server)
        check_options(data, ("params",), server)
        params = data.get("params")
        if params is not None and not isinstance(params, (list, dict)):
            raise ApiError(400, "BadRequest", "'params' must be a list (for ?) or an object "
                           "(for :name)")

        def run():
            t0 = time.perf_counter()
            check_statement(server, q, params)
            res = db.sql(q, params)
            ms = (time.perf_counter() - t0) * 1000
            cols, rows = (list(res.columns), [list(r) for r in res.rows]) \
                if res.columns is not None and res.rows is not None else \
                (["text", "score", "support"], [[a.text, a.score, a.support] for a in res])
            body = {"columns": cols, "rows": rows[:s.max_rows], "truncated": len(rows) > s.max_rows,
                    "version": res.version, "generation": res.generation, "ms": round(ms, 3),
                    "plan": res.plan, "explain": res.is_explain}
            return body
        return StrictJSONResponse(await server.call(run))

    async def versions(request: Request) -> JSONResponse:
        def run():
            vs = db.versions()
            head = next((v["id"] for v in vs if v["head"]), None)
            return {"versions": vs, "head": head,
                    "tags": {t: v["id"] for v in vs for t in v["tags"]}}
        return StrictJSONResponse(await server.call(run))

    async def documents(request: Request) -> JSONResponse:
        p = request.query_params
        try:
            offset = int(p.get("offset", 0))
            limit = int(p.get("limit", 20))
        except ValueError:
            raise ApiError(400, "BadRequest", "offset and limit must be integers") from None
        if not (0 <= offset <= MAX_OFFSET and 1 <= limit <= s.max_page):
            raise ApiError(400, "LimitExceeded", f"limit must be 1 to {s.max_page} and offset "
                           f"0 to {MAX_OFFSET:,}; got limit={limit}, offset={offset}",
                           limit=s.max_page)
        q = p.get("q") or None
        if q is not None:
            check_length("'q'", q, server)
        page = await server.call(page_of_documents, server, p.get("version"), q, offset, limit)
        return StrictJSONResponse(page)

    async def document(request: Request) -> JSONResponse:
        doc_id = request.path_params["doc_id"]

        def run(vid: int):
            d = db.get(doc_id, version=vid)
            if d is None:
                raise ApiError(404, "NotFound", f"no document {doc_id!r} at version {vid}")
            return d | {"version": vid}
        return StrictJSONResponse(await server.call(server.at,
                                                    request.query_params.get("version"), run))

    async def diff(request: Request) -> JSONResponse:
        p = request.query_params
        if not p.get("a"):
            raise ApiError(400, "BadRequest", "diff needs ?a=VERSION (and b, default HEAD)")

        def run():
            a, b = server.pin(p.get("a")), server.pin(p.get("b"))
            d = db.diff(a, b)
            return {"a": a, "b": b, "added": list(d.added), "removed": list(d.removed),
                    "changed": list(d.changed)}
        return StrictJSONResponse(await server.call(run))

    async def openapi(request: Request) -> JSONResponse:
        from .openapi import schema
        return JSONResponse(schema(s))

    out = [
        Route("/api/fill_mask", fill_mask, methods=["POST"]),
        Route("/api/classify", classify, methods=["POST"]),
        Route("/api/sql", sql, methods=["POST"]),
        Route("/api/versions", versions, methods=["GET"]),
        Route("/api/diff", diff, methods=["GET"]),
        Route("/openapi.json", openapi, methods=["GET"]),
    ]
    if s.write:
        out += write_routes(server)
    else:
        async def read_only(request: Request) -> JSONResponse:
            raise ApiError(403, "ReadOnly", "this server is read-only: start it with --write "
                           "(and a token) to add, delete or tag")
        out += [Route("/api/documents", read_only, methods=["POST"]),
                Route("/api/documents/{doc_id:path}", read_only, methods=["DELETE"]),
                Route("/api/tags", read_only, methods=["POST"]),
                Route("/api/tags/{name:path}", read_only, methods=["DELETE"])]
    out += [Route("/api/documents", documents, methods=["GET"]),
            Route("/api/documents/{doc_id:path}", document, methods=["GET"])]
    return out


def page_of_documents(server: Server, version: Any, q: str | None, offset: int,
                      limit: int) -> dict[str, Any]:
    """One page of documents: BM25 hits for ``q``, else documents in insertion order."""
    return server.at(version, partial(_page_at, server.db, q, offset, limit))


def _page_at(db: Any, q: str | None, offset: int, limit: int, vid: int) -> dict[str, Any]:
    total = db.count(vid)
    if q:
        hits = best_block_per_document(db, q, offset + limit + 1, vid)
        rows = [{"id": h["doc_id"], "title": h["title"], "snippet": h["snippet"],
                 "score": h["score"]} for h in hits[offset:offset + limit]]
        more = len(hits) > offset + limit
    else:
        res = db.sql("SELECT id, title, text FROM DOCUMENTS AS OF ? LIMIT ? OFFSET ?",
                     [vid, limit + 1, offset])
        rows = [{"id": r[0], "title": r[1], "snippet": r[2][:200]} for r in res.rows[:limit]]
        more = len(res.rows) > limit
    return {"version": vid, "total": total, "offset": offset, "limit": limit, "q": q,
            "documents": rows, "more": more}


def best_block_per_document(db: Any, q: str, want: int, vid: int) -> list[dict[str, Any]]:
    """BM25 hits for ``q``, one per document (its best block), best first: up to ``want``
    documents. ``db.search`` ranks blocks, and a long document has many; more blocks are
    fetched until ``want`` distinct documents are found or the hits run out."""
    fetch = want
    while True:
        hits = db.search(q, limit=fetch, version=vid)
        best: dict[str, dict[str, Any]] = {}
        for h in hits:  # best first: a document's first hit is its best block
            best.setdefault(h["doc_id"], h)
        if len(best) >= want or len(hits) < fetch:
            return list(best.values())[:want]
        fetch *= 2


def write_routes(server: Server) -> list[Route]:
    """add / delete / tag (only with --write; the Guard has checked the token)."""
    db = server.db

    async def add(request: Request) -> JSONResponse:
        data = await read_json(request, ("documents", "message"))
        docs = data.get("documents")
        if not isinstance(docs, list) or not docs or not all(
                isinstance(d, (str, dict)) for d in docs):
            raise ApiError(400, "BadRequest", "'documents' must be a non-empty list of "
                           "strings or {id, title, text, meta} objects")
        message = data.get("message", "")
        if not isinstance(message, str):
            raise ApiError(400, "BadRequest", "'message' must be a string")

        def run():  # all or nothing: every document is added, or none
            return {"version": db.add(docs, message=message), "added": len(docs)}
        return StrictJSONResponse(await server.write(run), status_code=201)

    async def delete(request: Request) -> JSONResponse:
        doc_id = request.path_params["doc_id"]

        def run():
            try:
                return {"version": db.delete(doc_id)}
            except ProgrammingError:  # refused: asked after, so a concurrent delete is a 404
                if db.get(doc_id) is None:
                    raise ApiError(404, "NotFound",
                                   f"no document {doc_id!r} at HEAD to delete") from None
                raise
        return StrictJSONResponse(await server.write(run))

    async def tag(request: Request) -> JSONResponse:
        data = await read_json(request, ("name", "version", "move"))
        name, ref, move = data.get("name"), data.get("version"), data.get("move", False)
        if not isinstance(name, str) or not name:
            raise ApiError(400, "BadRequest", "'name' must be a non-empty string")
        if not isinstance(move, bool):
            raise ApiError(400, "BadRequest", "'move' must be true or false")

        def run():
            return {"tag": name, "version": db.tag(name, server.pin(ref), move=move)}
        return StrictJSONResponse(await server.write(run))

    async def untag(request: Request) -> JSONResponse:
        name = request.path_params["name"]

        def run():
            if not any(name in v["tags"] for v in db.versions()):
                raise ApiError(404, "NotFound", f"no tag named {name!r}")
            return {"tag": name, "version": db.untag(name)}
        return StrictJSONResponse(await server.write(run))

    return [Route("/api/documents", add, methods=["POST"]),
            Route("/api/documents/{doc_id:path}", delete, methods=["DELETE"]),
            Route("/api/tags", tag, methods=["POST"]),
            Route("/api/tags/{name:path}", untag, methods=["DELETE"])]
