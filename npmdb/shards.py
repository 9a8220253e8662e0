"""Search sharded over processes: ``npmdb.open(path, readonly=True, engine="ray", shards=N)``.

The coordinator (the process that opened the database) encodes each query once and runs
the plan; its :class:`~npmdb.query.exchange.Exchange` operators send the segment work
(dense and BM25 retrieval, exact re-scoring, span assembly, surface texts, evidence) to N
shards and merge their answers exactly (see :mod:`npmdb.query.exchange`). The segments of
the version being read are dealt to the shards by size, per query, so ``AS OF`` and a
moving HEAD need no re-balancing.

A shard is a :class:`ShardServer`: a read-only handle on the same database directory (a
path every node can read, or a copy at the same path on each node) that serves requests
for any version. Two shard sets run them:

* :class:`RayShards` (``engine="ray"``): one Ray actor per shard, on the cluster
  ``RAY_ADDRESS`` names or a new local one. A shard whose process dies is started again
  and its request asked once more; a request that still fails raises
  :class:`~npmdb.errors.OperationalError`, never a partial answer.
* :class:`LocalShards` (``engine="local"``): the same servers in this process, one after
  another (the reference the Ray engine is tested against; no parallelism).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path
from typing import Any, Iterator

from .errors import OperationalError, ProgrammingError

__all__ = ["ShardServer", "LocalShards", "RayShards", "open_shards", "check_sharding"]

log = logging.getLogger(__name__)


class ShardServer:
    """One shard: a read-only handle on the database that answers the exchange's requests
    (``handle(method, request)``) over the segments each request names."""

    METHODS = ("term_stats", "retrieve", "spans", "locate", "texts", "doc_ids", "block_rows")

    def __init__(self, path: str, options: dict | None = None) -> None:
        from .database import Database

        self.path = path
        self.db = Database(path, readonly=True, create=False, **(options or {}))

    def ping(self) -> dict:
        return {"pid": os.getpid(), "path": self.path}

    @contextmanager
    def _snapshot(self, version: int, doc_filter: Any) -> Iterator[Any]:
        """The version the coordinator reads. A vacuum in another process can remove it
        between the coordinator's snapshot and this one: an OperationalError to retry,
        not the ProgrammingError of a version that never was."""
        with ExitStack() as stack:
            try:
                snap = stack.enter_context(self.db.snapshot(version, doc_filter))
            except ProgrammingError:
                if any(v["id"] == version for v in self.db.versions()):
                    raise
                raise OperationalError(
                    f"version {version} was removed by a vacuum (in another process) while "
                    "this query ran: run the query again") from None
            yield snap

    def handle(self, method: str, req: dict) -> Any:
        from npmdb.query.exchange import ShardWork

        if method not in self.METHODS:
            raise ProgrammingError(f"unknown shard request {method!r}")
        t0 = time.perf_counter()
        with self._snapshot(req["version"], req["doc_filter"]) as snap:
            work = ShardWork(snap.subset(req["segments"]), req["segments"], req["text"])
            if method == "term_stats":
                out = work.term_stats(req["subtree"])
            elif method == "retrieve":
                out = work.retrieve(req["subtree"], req["qv"], req["stats"])
            elif method == "spans":
                out = work.spans(req["subtree"], req["qv"], req["outputs"], req["group_by"])
            elif method == "locate":
                out = work.locate(req["items"])
            elif method == "texts":
                out = work.texts(req["items"])
            elif method == "doc_ids":
                out = work.doc_ids(req["items"])
            else:
                out = work.block_rows(req["items"])
        if isinstance(out, dict):
            out["wall_ms"] = (time.perf_counter() - t0) * 1000.0
        return out

    def close(self) -> None:
        self.db.close()


class LocalShards:
    """Shard servers in this process, each with its own handle, asked in turn."""

    engine = "local"

    def __init__(self, path: str | os.PathLike, n: int, options: dict | None = None) -> None:
        self.n = n
        self.servers = [ShardServer(str(path), options) for _ in range(n)]

    def map(self, method: str, requests: list[tuple[int, dict]]) -> list[Any]:
        return [self.servers[i].handle(method, req) for i, req in requests]

    def close(self) -> None:
        for s in self.servers:
            s.close()


class RayShards:
    """One Ray actor per shard. ``address``: passed to ``ray.init`` when Ray is not running
    yet (None: ``RAY_ADDRESS`` or a new local cluster, shut down when the last npmdb user
    of Ray in this process closes); ``cpus``: CPUs each actor reserves (None: one, or an
    equal part of half the cluster's CPUs where it has fewer than ``2 n``, so that a Ray
    add beside the shards finds CPUs); ``timeout``: seconds a request may take;
    ``concurrency``: requests a shard serves at once (each in its own snapshot)."""

    engine = "ray"

    def __init__(self, path: str | os.PathLike, n: int, options: dict | None = None, *,
                 address: str | None = None, cpus: float | None = None,
                 timeout: float | None = 600.0, concurrency: int = 4) -> None:
        from .ingest.ray_workers import end_ray_session, free_cpus, hold_cpus, ray_session

        self.n, self.path, self.options = n, str(path), dict(options or {})
        self.timeout = timeout
        self._stack = ExitStack()
        self.ray = ray = ray_session(address)
        self._stack.callback(end_ray_session)
        self._lock = threading.Lock()  # one replacement of a dead shard, not one a query
        try:
            if cpus is None:  # every shard must fit at once, or queries wait forever
                cpus = min(1.0, float(ray.cluster_resources().get("CPU", 1.0)) / (2 * n))
            free = free_cpus(ray, n * cpus)
            if n * cpus > free + 1e-9:
                raise OperationalError(
                    f"the {n} shards need {n * cpus:g} CPUs ({cpus:g} each) and the Ray "
                    f"cluster has {free:g} free: other Ray work holds them (another sharded "
                    "handle, an add). Close it, or pass fewer CPUs a shard (RayShards(cpus=))")
        except BaseException:
            self._stack.close()
            raise
        self.cpus = cpus
        hold_cpus(n * cpus)
        self._stack.callback(hold_cpus, -n * cpus)
        # a killed actor process is started again by Ray; the exchange's requests are
        # reads, so Ray may run one again on the new process
        # several requests at once per shard (queries from several threads): the server's
        # read-only handle opens one snapshot per request
        self._actor = ray.remote(num_cpus=cpus, max_restarts=-1, max_task_retries=2,
                                 max_concurrency=concurrency)(ShardServer)
        self.actors: list[Any] = [None] * n
        self.restarts = 0
        try:
            for i in range(n):
                self.actors[i] = self._start()
            with _ray_errors("starting the shards"):
                ray.get([a.ping.remote() for a in self.actors], timeout=timeout)
        except BaseException:
            self.close()
            raise

    def _start(self) -> Any:
        return self._actor.remote(self.path, self.options)

    def pids(self) -> list[int]:
        """Each shard's process id (for tests and ``stats``)."""
        with _ray_errors("asking the shards"):
            return [p["pid"] for p in self.ray.get([a.ping.remote() for a in self.actors],
                                                   timeout=self.timeout)]

    def map(self, method: str, requests: list[tuple[int, dict]]) -> list[Any]:
        ray = self.ray
        asked = [(i, req, self.actors[i]) for i, req in requests]
        with _ray_errors("asking the shards", DIED):
            refs = [actor.handle.remote(method, req) for i, req, actor in asked]
        out: list[Any] = []
        for (i, req, actor), ref in zip(asked, refs):
            try:
                with _ray_errors(f"shard {i}", DIED):
                    out.append(ray.get(ref, timeout=self.timeout))
            except OperationalError as exc:
                if not _died(exc):
                    raise
                # the actor is gone for good (Ray gave up restarting it): a new one (once,
                # whichever query found it dead first), and the request once more
                current = self._replace(i, actor, exc)
                with _ray_errors(f"shard {i}, started again", DIED_AGAIN):
                    out.append(ray.get(current.handle.remote(method, req),
                                       timeout=self.timeout))
        return out

    def _replace(self, i: int, dead: Any, exc: BaseException) -> Any:
        """Shard ``i``'s actor after ``dead`` died: a new one, unless another query has
        started it again already."""
        with self._lock:
            if self.actors[i] is dead:
                cause = exc.__cause__ or exc
                log.warning("shard %d's process died (%s); starting it again", i,
                            type(cause).__name__)
                with suppress(Exception):  # already gone
                    self.ray.kill(dead)
                self.actors[i] = self._start()
                self.restarts += 1
            return self.actors[i]

    def close(self) -> None:
        for a in self.actors:
            if a is not None:
                try:
                    self.ray.kill(a)
                except Exception:  # noqa: BLE001 - already gone
                    pass
        self.actors = []
        self._stack.close()


DIED = "its process died (Ray started it again or gave up: the query asks a new one)"
DIED_AGAIN = ("its process died, and the one started in its place too: the query could not "
              "be answered whole; run it again (the Ray workers' logs under "
              "/tmp/ray/session_latest/logs say why)")


def _died(exc: BaseException) -> bool:
    cause = exc.__cause__
    name = type(cause).__name__ if cause is not None else ""
    return name in ("ActorDiedError", "RayActorError", "ActorUnavailableError")


@contextmanager
def _ray_errors(what: str, died: str | None = None) -> Iterator[None]:
    from .ingest.ray_workers import _ray_errors as translate

    with translate(what, died):
        yield


def check_sharding(engine: Any, shards: Any, readonly: bool) -> None:
    """``engine=`` / ``shards=`` of a sharded read-only handle (npmdb.shards)."""
    if shards is None:
        raise ProgrammingError(f"engine={engine!r} needs shards=N (the number of shards to "
                               "spread the segments over)")
    if not isinstance(shards, int) or isinstance(shards, bool) or shards < 1:
        raise ProgrammingError(f"shards must be a positive integer, got {shards!r}")
    if engine is not None and engine not in ("local", "ray"):
        raise ProgrammingError(f"engine must be 'ray' or 'local' for sharded search, got "
                               f"{engine!r}")
    if not readonly:
        raise ProgrammingError("sharded search reads only: open with readonly=True (write "
                               "through another handle; shards see each new version)")


def open_shards(path: Path, engine: str, shards: int, options: dict) -> Any:
    """The shard set ``npmdb.open(..., engine=, shards=)`` asks for (the database checked
    the arguments)."""
    return (RayShards if engine == "ray" else LocalShards)(path, shards, options)
