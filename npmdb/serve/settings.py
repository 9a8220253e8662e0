"""What one ``npmdb serve`` process allows: token, writes and the per-request limits."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Settings"]


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
