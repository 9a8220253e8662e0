"""Ray for work beyond one process (the ``npmdb[ray]`` extra): the public names.

``db.add(source, engine="ray")`` / ``engine=RayEngine(...)`` encodes on a Ray cluster
(:mod:`npmdb.ingest.ray`); ``db.write_generation(model, engine=...)`` re-embeds there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .generations import REFRESH_LOCK_WAIT
from .ingest.ray import RayEngine, resolve_engine
from .ingest.ray_workers import encode_piece

if TYPE_CHECKING:  # pragma: no cover
    from .database import Database

__all__ = ["RayEngine", "resolve_engine", "encode_piece", "write_generation"]


def write_generation(db: "Database", model: Any, *, steps: int = 0, tag: str | None = None,
                     message: str = "", info: dict | None = None,
                     engine: Any = "ray", timeout: float = REFRESH_LOCK_WAIT) -> tuple[int, int]:
    """``db.write_generation`` on Ray workers: the same result as a local refresh (vectors
    within float16 rounding); plugs into ``npmdb.train.refresh.Refresher(db, write=...)``.
    Like a local refresh it waits up to ``timeout`` seconds for another writer, and moves
    its tag (a training run's ``train-step-N``)."""
    return db.write_generation(model, steps=steps, tag=tag, message=message, info=info,
                               engine=engine, timeout=timeout, move=True)
