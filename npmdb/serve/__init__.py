"""``npmdb serve DB``: one warm process serving a query page and a JSON API.

    from npmdb.serve import create_app, Settings
    app = create_app("my.npmdb", Settings(token="s3cret", write=True))   # an ASGI app

Needs the ``serve`` extra (``pip install 'npmdb[serve]'``: starlette, uvicorn, jinja2).
Safe defaults: loopback only; any other address needs an access token (``--token`` or
``NPMDB_TOKEN``); read-only unless ``--write``; bounded bodies, queries, ``k``, ``top``
and time per request. See :mod:`npmdb.serve.app` for the routes.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import sys
from dataclasses import replace
from typing import Any
from urllib.parse import quote

from ..errors import NotSupportedError, OperationalError, ProgrammingError
from .settings import Settings, check_token

__all__ = ["create_app", "Settings", "main", "is_loopback", "check_port"]


def create_app(db_path: str | os.PathLike, settings: Settings | None = None) -> Any:
    """The Starlette application serving the database at ``db_path``."""
    try:
        from .app import build_app
    except ImportError as exc:
        raise NotSupportedError(f"npmdb serve needs the serve extra: pip install "
                                f"'npmdb[serve]' ({exc.name} is missing)") from exc
    return build_app(db_path, settings or Settings())


def is_loopback(host: str) -> bool:
    """True for addresses only this machine can reach (127.0.0.0/8, ::1, localhost)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def main(args: Any) -> int:
    """``npmdb serve``: check the safety rules and the arguments, then run uvicorn."""
    token = args.token or os.environ.get("NPMDB_TOKEN") or None
    if token is not None:
        check_token(token)
    if not is_loopback(args.host) and not token:
        raise ProgrammingError(f"binding {args.host} (not loopback) needs an access token: "
                               "--token TOKEN or NPMDB_TOKEN=TOKEN")
    check_port(args.port)
    shards = getattr(args, "shards", None)
    if getattr(args, "ray", False) and shards is None:
        raise ProgrammingError("--ray serves sharded search: give --shards N")
    if shards is not None and args.write:
        raise ProgrammingError("--shards serves reads only: drop --write (write through "
                               "another handle; the shards read each new version)")
    settings = Settings(token=token, write=args.write, time_limit=args.time_limit,
                        shards=shards, engine="ray" if getattr(args, "ray", False) else "local")
    generated = args.write and not token  # after every check: told once it listens
    if generated:
        token = secrets.token_urlsafe(18)
        settings = replace(settings, token=token)
    app = create_app(args.db, settings)
    try:
        import uvicorn
    except ImportError as exc:
        raise NotSupportedError("npmdb serve needs uvicorn: pip install 'npmdb[serve]'") from exc

    class Listening(uvicorn.Server):
        """Prints the URL (and a generated token) once the socket listens; uvicorn exits
        before that when it cannot listen."""

        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            port = self.servers[0].sockets[0].getsockname()[1]  # --port 0: the one it got
            if generated:
                print(f"npmdb serve: --write without a token; generated one: {token}",
                      file=sys.stderr)
            shown = f"[{args.host}]" if ":" in args.host else args.host
            print(f"npmdb serve: http://{shown}:{port}/"
                  + (f"?token={quote(token, safe='')}" if token else "")
                  + f"  ({'read-write' if args.write else 'read-only'}; Ctrl-C stops)",
                  file=sys.stderr)

    server = Listening(uvicorn.Config(app, host=args.host, port=args.port, log_level="warning"))
    try:
        server.run()
    except SystemExit:
        if server.started:
            raise
        raise OperationalError(f"npmdb serve could not listen on {args.host}:{args.port} "
                               "(the reason is above): is the port in use? Pick another "
                               "with --port") from None
    return 0


def check_port(port: Any) -> None:
    """A TCP port: 0 (any free port) to 65535; the OS would wrap a larger one silently."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ProgrammingError(f"--port must be 0 to 65535 (0: any free port), got {port!r}")
