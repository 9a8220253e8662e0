"""What one ``npmdb serve`` process allows: token, writes and the per-request limits."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, fields

from ..errors import ProgrammingError

__all__ = ["Settings", "MAX_OFFSET", "check_token"]

MAX_OFFSET = 1_000_000  # the furthest offset GET /api/documents (and /documents) pages to


def check_token(token: str) -> None:
    """An access token that a request can carry: visible ASCII (an HTTP header is read as
    latin-1 and a cookie's value must be ASCII, so another character could never match),
    with no white space at its ends (a header's value loses it)."""
    if not isinstance(token, str) or not token.strip() or token != token.strip() \
            or not (token.isascii() and token.isprintable()):
        raise ProgrammingError("the access token must be printable ASCII text without white "
                               f"space at its ends, got {token!r:.20}…: pick another (e.g. "
                               "python -c 'import secrets; print(secrets.token_urlsafe())')")


@dataclass(frozen=True)
class Settings:
    """Server settings; the defaults are the safe ones (no writes, bounded requests)."""

    token: str | None = None          # required on every request when set
    write: bool = False               # add / delete / tag endpoints (need the token)
    max_body: int = 1 << 20           # bytes per request body (413 above)
    max_body_write: int = 16 << 20    # bytes per body of POST /api/documents
    max_query: int = 2000             # characters of a query or statement
    max_k: int = 4096
    max_top: int = 100
    max_blocks: int = 50
    max_evidence: int = 20
    max_rows: int = 10_000            # rows returned by /api/sql (the rest is cut)
    max_page: int = 200               # documents per page
    time_limit: float = 30.0          # seconds per read (503 after it); a write waits this
                                      # long for the writer, then runs to its end
    threads: int = 4                  # requests executing at once; the rest wait
    shards: int | None = None         # sharded search over this many shards (read-only)
    engine: str = "ray"               # where the shards run ('ray' | 'local')
    local_only: bool | None = None    # answer only requests addressed to localhost,
                                      # 127.0.0.1 or [::1] (None: when there is no token:
                                      # a page that points its name at 127.0.0.1 by DNS
                                      # rebinding could read everything); False behind a
                                      # reverse proxy that forwards another Host

    def __post_init__(self) -> None:
        if self.token is not None:
            check_token(self.token)
        if self.local_only is None:
            object.__setattr__(self, "local_only", self.token is None)
        t = self.time_limit
        if isinstance(t, bool) or not isinstance(t, numbers.Real) or not (
                math.isfinite(t) and t > 0):
            raise ProgrammingError(f"the time limit must be a positive number of seconds "
                                   f"(--time-limit 30), got {t!r}")
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name.startswith("max_") or f.name == "threads":
                if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                    raise ProgrammingError(f"{f.name} must be a positive integer, got {v!r}")
