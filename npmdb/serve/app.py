"""The ASGI application: one warm :class:`Server` (database handle, encoder, thread limiter),
access and size guards, the JSON API (:mod:`.api`) and the pages (:mod:`.pages`).

Routes::

    GET  /                     query page (fill_mask, evidence, plan, versions side by side)
    GET  /sql                  SQL console
    GET  /documents            documents: BM25 search and paging
    GET  /documents/{id}       one document, occurrences highlighted (its id one path
                               segment, a "/" in it escaped)
    GET  /document?id=         the same, for the ids "." and ".." (a browser drops them
                               from a path)
    GET  /versions             history, tags, diff between two versions
    POST /api/fill_mask        POST /api/classify        POST /api/sql
    GET  /api/versions         GET  /api/documents       GET  /api/documents/{id}
    GET  /api/diff             GET  /openapi.json
    with --write:  POST /api/documents   DELETE /api/documents/{id}   POST /api/tags

Without a token the server answers only requests addressed to a loopback name
(``Settings.local_only``: DNS rebinding), and every POST body is JSON (a page elsewhere
cannot send one without the browser asking the server first).

Every request reads one version whole: HEAD (or the version asked for) is resolved to an
id when the request starts and every read of the request names that id, so a commit by
another process is seen by the next request and never half-way through one.
"""

from __future__ import annotations

import hmac
import json
import os
import re
import threading
from functools import partial
from pathlib import Path
from typing import Any, Callable
from urllib.parse import quote, urlencode

import anyio
import anyio.to_thread
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Match, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from ..errors import (Error, IntegrityError, NotSupportedError, OperationalError,
                      ProgrammingError, QueryDataError, QueryParseError)
from ..storage.versions import parse_ref
from .settings import Settings

__all__ = ["build_app", "Server", "ApiError"]

HERE = Path(__file__).resolve().parent
TOKEN_COOKIE = "npmdb_token"


class ApiError(Exception):
    """An error answered as ``{"error": {"type", "message", ...}}`` with ``status``."""

    def __init__(self, status: int, type_: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.type = type_
        self.message = message
        self.extra = extra

    def response(self) -> JSONResponse:
        return JSONResponse({"error": {"type": self.type, "message": self.message,
                                       **self.extra}}, status_code=self.status)


def from_npmdb(exc: Error) -> ApiError:
    """npmdb's errors as API errors: a bad query is 400, a conflict 409, never a trace."""
    if isinstance(exc, (QueryParseError, QueryDataError)):
        kind = "ProgrammingError" if isinstance(exc, QueryParseError) else "DataError"
        return ApiError(400, kind, str(exc), line=exc.line, column=exc.column,
                        expected=list(exc.expected), detail=exc.short_message)
    if isinstance(exc, IntegrityError):
        return ApiError(409, "IntegrityError", str(exc))
    if isinstance(exc, OperationalError):
        return ApiError(409, "OperationalError", str(exc))
    if isinstance(exc, NotSupportedError):
        return ApiError(400, "NotSupportedError", str(exc))
    if isinstance(exc, ProgrammingError):
        return ApiError(400, "ProgrammingError", str(exc))
    return ApiError(400, type(exc).__name__, str(exc))


class Server:
    """The process's one database handle, opened once (encoder warm), shared by requests."""

    def __init__(self, db_path: str | os.PathLike, settings: Settings) -> None:
        import npmdb

        self.settings = settings
        sharded = {} if settings.shards is None else {"engine": settings.engine,
                                                      "shards": settings.shards}
        # writes queue for the writer (up to the time limit) instead of failing at once
        self.db = npmdb.open(db_path, create=False, readonly=not settings.write, progress=False,
                             timeout=settings.time_limit, **sharded)
        self.limiter = anyio.CapacityLimiter(settings.threads)
        # the cap on work running at once, held by the worker thread itself: a read cut
        # off by the time limit is abandoned by its request (and gives back its limiter
        # token) but its thread runs on; it keeps its slot until it ends
        self.slots = threading.BoundedSemaphore(settings.threads)

    def warm(self) -> None:
        """Load HEAD's encoder and run one query so the first request is not the slow one."""
        if self.db.version is None:
            return
        try:
            self.db.fill_mask("warm [MASK].", retrieval="bm25", top=1)
            self.db.fill_mask("warm [MASK].", top=1, k=8, retrieval="dense")
        except Error:
            pass

    def pin(self, ref: Any = None) -> int:
        """The version id a request reads: HEAD now, or ``ref`` (an id or a tag)."""
        if ref is None or ref == "":
            vid = self.db.version
            if vid is None:
                raise ApiError(400, "ProgrammingError", "the database has no versions yet")
            return vid
        if isinstance(ref, str):  # "-1" is no tag (a tag name is never a number): an id
            ref = int(ref) if re.fullmatch(r"-[0-9]+", ref) else parse_ref(ref)
        if isinstance(ref, bool) or not isinstance(ref, (int, str)):
            raise ApiError(400, "BadRequest", f"version must be an id or a tag, got {ref!r}")
        return self.db.checkout(ref).version

    def at(self, ref: Any, fn: Callable[[int], Any]) -> Any:
        """``fn(vid)`` at the version ``ref`` names (:meth:`pin`). Where ``ref`` is HEAD and
        a vacuum in another process removed the pinned version before ``fn`` read it
        (HEAD moved on meanwhile), HEAD is pinned again, up to three times: such requests
        were refused with "no version N"."""
        for attempt in range(3):
            vid = self.pin(ref)
            try:
                return fn(vid)
            except Error:
                if (ref is not None and ref != "") or attempt == 2 or self._exists(vid):
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _exists(self, vid: int) -> bool:
        try:
            self.db.checkout(vid)
        except Error:
            return False
        return True

    async def call(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        """Run blocking ``fn`` on a worker thread within the per-request time limit. At most
        ``threads`` calls run at once, counting those whose request timed out (still
        running, abandoned); a call whose request timed out while it waited never runs."""
        abandoned = threading.Event()
        try:
            with anyio.fail_after(self.settings.time_limit):
                return await anyio.to_thread.run_sync(
                    partial(self._run_in_slot, abandoned, partial(fn, *args, **kw)),
                    limiter=self.limiter, abandon_on_cancel=True)
        except TimeoutError:
            abandoned.set()
            raise ApiError(503, "Timeout", f"the request took longer than the "
                           f"{self.settings.time_limit:g} s limit") from None
        except Error as exc:
            raise from_npmdb(exc) from None

    def _run_in_slot(self, abandoned: threading.Event | None, fn: Callable[[], Any]) -> Any:
        """On the worker thread: wait for one of the ``threads`` slots and run ``fn`` in it,
        unless the request gave up while this waited."""
        with self.slots:
            if abandoned is not None and abandoned.is_set():
                return None  # nobody reads the answer
            return fn()

    async def write(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        """Run a write on a worker thread to its end. A write is not cut off by the time
        limit: abandoned, it would still commit after the client was told it failed (and
        a retry would add its documents twice)."""
        try:
            return await anyio.to_thread.run_sync(
                partial(self._run_in_slot, None, partial(fn, *args, **kw)), limiter=self.limiter)
        except Error as exc:
            raise from_npmdb(exc) from None

    def close(self) -> None:
        self.db.close()


class Guard:
    """ASGI middleware: the access token and the request body size.

    With a token configured every request needs it: ``Authorization: Bearer TOKEN``,
    the ``npmdb_token`` cookie, or ``?token=TOKEN`` (a page visited that way sets the
    cookie and redirects to itself without it)."""

    def __init__(self, app: Any, settings: Settings) -> None:
        self.app = app
        self.settings = settings

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        request = Request(scope)
        token = self.settings.token
        if self.settings.local_only and not _loopback_host(request.headers.get("host", "")):
            # without a token the server answers this machine only; a page elsewhere that
            # points its own name at 127.0.0.1 (DNS rebinding) would read it all
            return await ApiError(
                421, "MisdirectedRequest", "this server answers only requests addressed to "
                "localhost, 127.0.0.1 or [::1] (it has no access token), not "
                f"{request.headers.get('host', '')[:100]!r}: open it by one of those, or "
                "serve with --token TOKEN").response()(scope, receive, send)
        if request.method == "POST" and scope["path"].startswith("/api/") and \
                request.headers.get("content-type", "").split(";")[0].strip().lower() \
                != "application/json":
            # a page elsewhere can POST text/plain without asking (no CORS preflight)
            return await ApiError(
                415, "UnsupportedMediaType", "send the request body as JSON with the header "
                "Content-Type: application/json (curl: --json '{...}')"
            ).response()(scope, receive, send)
        if token is not None:
            # any credential given may be the right one: a cookie left by the last run
            # (--write makes a new token each start) must not hide the new ?token=
            if not any(hmac.compare_digest(given.encode(), token.encode())
                       for given in _given_tokens(request)):
                resp = ApiError(401, "Unauthorized", "this server needs its access token: "
                                "Authorization: Bearer TOKEN, or ?token=TOKEN").response()
                resp.headers["WWW-Authenticate"] = "Bearer"
                return await resp(scope, receive, send)
            if "token" in request.query_params and request.method == "GET" \
                    and not scope["path"].startswith("/api/"):
                q = urlencode([(k, v) for k, v in request.query_params.multi_items()
                               if k != "token"])
                resp = RedirectResponse(_same_path(scope) + (f"?{q}" if q else ""), 303)
                resp.set_cookie(TOKEN_COOKIE, token, httponly=True, samesite="strict")
                return await resp(scope, receive, send)
        limit = (self.settings.max_body_write
                 if scope["path"] == "/api/documents" and request.method == "POST"
                 else self.settings.max_body)
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > limit):
            return await _too_large(limit)(scope, receive, send)
        seen = 0

        async def bounded_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise _BodyTooLarge
            return message

        try:
            await self.app(scope, bounded_receive, send)
        except _BodyTooLarge:
            await _too_large(limit)(scope, receive, send)


def _loopback_host(host: str) -> bool:
    """Whether a Host header names this machine (``localhost``, ``127.0.0.1:8080``,
    ``[::1]:8080``; the port is the client's business)."""
    from . import is_loopback

    name = host.rsplit("]", 1)[0] + "]" if host.startswith("[") else host.rsplit(":", 1)[0]
    return is_loopback(name.lower()) if name else False


def _same_path(scope: dict) -> str:
    """The request's own path for a Location header: as the client sent it (still
    percent-encoded: ``/documents/a%3Fb`` must not become ``/documents/a?b``), with one
    leading slash (``//evil.example/x`` would send the browser to another host)."""
    raw = scope.get("raw_path")
    path = raw.decode("latin-1") if raw else quote(scope["path"], safe="/:@!$&'()*+,;=~")
    path = path.split("?", 1)[0]
    return "/" + path.lstrip("/\\")


class _BodyTooLarge(Exception):
    pass


def _too_large(limit: int) -> JSONResponse:
    return ApiError(413, "PayloadTooLarge", f"request bodies are limited to {limit} bytes"
                    ).response()


def _given_tokens(request: Request) -> list[str]:
    """The tokens a request carries: its Bearer header, its ``?token=`` and its cookie."""
    auth = request.headers.get("authorization", "")
    given = [auth[7:].strip()] if auth.lower().startswith("bearer ") else []
    given += [request.query_params.get("token"), request.cookies.get(TOKEN_COOKIE)]
    return [t for t in given if t]


def build_app(db_path: str | os.PathLike, settings: Settings) -> Starlette:
    from . import api, pages

    server = Server(db_path, settings)
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    routes = api.routes(server) + pages.routes(server, templates) + [
        Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
    ]

    async def not_found(request: Request, exc: Exception) -> Response:
        if request.url.path.startswith("/api/"):
            return ApiError(404, "NotFound", f"no route {request.method} "
                            f"{request.url.path}").response()
        return Response("not found", status_code=404, media_type="text/plain")

    async def method_not_allowed(request: Request, exc: Exception) -> Response:
        allow = _allowed_methods(app, request.scope)
        resp = ApiError(405, "MethodNotAllowed", f"{request.method} is not allowed on "
                        f"{request.url.path}; allowed: {', '.join(allow)}").response()
        resp.headers["Allow"] = ", ".join(allow)
        return resp

    async def api_error(request: Request, exc: ApiError) -> Response:
        if request.url.path.startswith("/api/") or exc.status in (401, 413):
            return exc.response()
        return templates.TemplateResponse(request, "error.html",
                                          {"error": exc, "page": "error",
                                           "write": settings.write},
                                          status_code=exc.status)

    async def internal(request: Request, exc: Exception) -> Response:
        return ApiError(500, "InternalError", "internal error: see the server log").response()

    def lifespan(app):
        return _lifespan(server)

    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={
        404: not_found, 405: method_not_allowed, ApiError: api_error, Exception: internal})
    app.state.server = server
    app.add_middleware(Guard, settings=settings)
    return app


def _allowed_methods(app: Starlette, scope: dict) -> list[str]:
    """Every method some route takes on the request's path (the Allow header of a 405:
    a path can have several routes, GET and POST /api/documents)."""
    methods: set[str] = set()
    for route in app.router.routes:
        if isinstance(route, Route) and route.methods and \
                route.matches(scope)[0] != Match.NONE:
            methods |= route.methods
    return sorted(methods)


class _lifespan:
    def __init__(self, server: Server) -> None:
        self.server = server

    async def __aenter__(self):
        await anyio.to_thread.run_sync(self.server.warm)

    async def __aexit__(self, *exc):
        self.server.close()


def dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, default=str)
