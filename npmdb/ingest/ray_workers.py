"""The Ray side of distributed ingest: starting (or joining) a cluster, the encoder
actors, and running pieces through them (:mod:`npmdb.ingest.ray` is the driver).

An actor (``Dataset.map_batches`` over an actor pool, one GPU each where the cluster has
GPUs) loads the database's encoder once (checked against its fingerprint), then turns each
piece into token columns (:func:`npmdb.ingest.prepare`: the local path's own code, so
blocks are identical) and float16 vectors, returned through Ray's object store (nothing
needs a shared file system). npmdb errors raised in actors come back as themselves.
"""

from __future__ import annotations

import inspect
import logging
import os
import re
import threading
import time
import warnings
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import numpy as np

from ..corpus import Document
from ..errors import Error, NotSupportedError, OperationalError, ProgrammingError
from .prepare import prepare
from npmdb.storage import format as F
from npmdb.storage import ivf
from npmdb.storage.codec import Float16Codec, cast, get_codec, is_stateful

if TYPE_CHECKING:  # pragma: no cover
    from ..encoder import Encoder
    from .ray import RayEngine

__all__ = ["encode_piece", "PieceIndex", "import_ray", "Runs", "guarded", "RAY_EXTRA"]

RAY_EXTRA = "pip install 'npmdb[ray]'"
_ENCODE_WINDOW = 256  # blocks per encode_blocks call, as in npmdb.ingest.local


def import_ray():
    """``ray`` with Ray Data, or NotSupportedError naming the extra."""
    try:
        import ray
        import ray.data  # noqa: F401 - Ray Data comes with the [data] extra of ray
    except ImportError as exc:
        raise NotSupportedError(
            f"engine='ray' needs Ray Data, which is not installed: {RAY_EXTRA} "
            f"(ray[data] >= 2.9); or use engine='local' ({exc})") from exc
    return ray



# -- the worker side ------------------------------------------------------------------------


class PieceIndex:
    """What a worker needs to code a piece's vectors for the segment writer itself: the
    segment's codec (a stateless one) and the generation's trained IVF template."""

    def __init__(self, codec: str, template: bytes, dim: int) -> None:
        if is_stateful(codec):
            raise ProgrammingError(f"a worker cannot code vectors in the stateful codec "
                                   f"{codec!r}")
        self.codec = get_codec(codec)
        self.coder = ivf.Coder(ivf.load_template(template, dim))

    def code(self, h: np.ndarray, flags: np.ndarray) -> dict[str, Any]:
        """Every token's row in the codec, and the IVF entries of the valid starts and
        ends (each once), exactly as the segment writer makes them from float16 vectors."""
        x = cast(h, np.float16)
        stored = x if isinstance(self.codec, Float16Codec) else \
            self.codec.encode(cast(x, np.float32))
        need = np.flatnonzero(flags & (F.VALID_START | F.VALID_END))
        vecs = cast(cast(self.codec.decode(stored[need]), np.float16), np.float32) \
            if len(need) else np.zeros((0, h.shape[1]), np.float32)
        e = self.coder.encode(vecs, need)
        return {"stored": stored, "ivf_labels": e.labels, "ivf_lists": e.lists,
                "ivf_codes": e.codes}


def encode_piece(encoder: "Encoder", piece: dict, block_len: int,
                 batch_tokens: int = 8192, index: PieceIndex | None = None) -> dict[str, Any]:
    """Encode one piece (what an actor does; callable without Ray).

    ``piece`` is ``{"texts": [...]}`` (documents: tokenised, flagged and cut into blocks by
    :func:`npmdb.ingest.prepare`) or ``{"tokens": int32[n], "block_ptr": int64[b+1]}``
    (existing blocks, for a refresh). Returns the token columns (documents only) and
    ``vectors``: every token's vector in float16 (what the segment writer in the driver
    stores through the database's codec; a stateful codec is trained there, once), in
    token order. With ``index`` (documents only) the worker codes them itself: ``stored``
    (the codec's rows) and the IVF entries (``ivf_labels``, ``ivf_lists``, ``ivf_codes``)
    replace ``vectors``, so the driver only writes them.
    """
    t0, c0 = time.perf_counter(), time.process_time()
    if "texts" in piece:
        docs = [Document(str(i), "", t, {}) for i, t in enumerate(piece["texts"])]
        prep = prepare(encoder, docs, block_len, progress=False)
        out: dict[str, Any] = dict(prep.columns())
        tokens, ptr = prep.tokens, prep.block_ptr
    else:
        out = {}
        tokens, ptr = piece["tokens"], piece["block_ptr"]
    blocks = [tokens[ptr[i]:ptr[i + 1]] for i in range(len(ptr) - 1)]
    hidden: list[np.ndarray] = []
    for i in range(0, len(blocks), _ENCODE_WINDOW):
        hidden.extend(encoder.encode_blocks(blocks[i:i + _ENCODE_WINDOW],
                                            batch_tokens=batch_tokens))
    h = np.concatenate(hidden) if hidden else np.zeros((0, encoder.hidden_size), np.float32)
    if index is not None and "flags" in out:
        out.update(index.code(h, out["flags"]))
    else:
        out["vectors"] = cast(h, np.float16)
    out["stats"] = {"tokens": int(len(tokens)), "wall_s": time.perf_counter() - t0,
                    "cpu_s": time.process_time() - c0, "pid": os.getpid(),
                    "device": str(encoder.device)}
    return out


def _pack_piece(arrays: dict[str, Any]) -> bytes:
    return F.pack({k: (F.pack_array(v) if isinstance(v, np.ndarray) else v)
                   for k, v in arrays.items()})


def _unpack_piece(raw: bytes) -> dict[str, Any]:
    d = F.unpack(raw)
    return {k: (F.unpack_array(v, verify=True, what=f"encoded piece {k}")
                if isinstance(v, (bytes, bytearray)) else v) for k, v in d.items()}


class _EncodeWorker:
    """A Ray Data actor: loads the encoder once, then encodes one piece per call."""

    def __init__(self, encoder_path: str, info: dict, block_len: int,
                 device: str, threads: int, batch_tokens: int,
                 index: dict | None = None) -> None:
        import torch

        from ..encoder import Encoder, EncoderInfo, fingerprint_dir

        if device == "cpu":
            torch.set_num_threads(max(1, threads))
        enc_info = EncoderInfo.from_dict(info)
        path = Path(encoder_path)
        if not (path / "config.json").exists():
            raise OperationalError(f"a Ray worker cannot find the encoder at {path}: every node "
                                   "needs the encoder directory at the same path")
        if fingerprint_dir(path) != enc_info.fingerprint:
            raise OperationalError(f"a Ray worker found a different encoder at {path} (sha256 "
                                   f"mismatch): every node needs the database's encoder")
        self.encoder = Encoder(path, device=device, info=enc_info)
        self.block_len = block_len
        self.batch_tokens = batch_tokens
        self.index = None if index is None else PieceIndex(index["codec"], index["template"],
                                                           self.encoder.hidden_size)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = [_pack_piece(encode_piece(self.encoder, _unpack_piece(bytes(p)), self.block_len,
                                        self.batch_tokens, self.index))
               for p in batch["payload"]]
        res = np.empty(len(out), dtype=object)
        res[:] = out
        return {"piece": np.asarray(batch["piece"], dtype=np.int64), "payload": res}


# -- the driver side: the cluster ------------------------------------------------------------


_SESSION_LOCK = threading.Lock()
_session = {"users": 0, "started": False, "held": 0.0}  # held: CPUs shards reserve


def ray_session(address: str | None = None) -> Any:
    """Ray, initialised for one more npmdb user of this process (a Ray add, a sharded
    handle): ``ray.init`` when Ray is not running yet. Pair with :func:`end_ray_session`;
    the last user shuts down a Ray that npmdb started (closing one handle shut it down
    under every other, whose next query failed), never one the application started."""
    ray = import_ray()
    with _SESSION_LOCK:
        if not ray.is_initialized():
            ray.init(address=address, include_dashboard=False, logging_level=logging.WARNING)
            _session["started"] = True
        _session["users"] += 1
    return ray


def end_ray_session() -> None:
    ray = import_ray()
    with _SESSION_LOCK:
        _session["users"] = max(0, _session["users"] - 1)
        if _session["users"] == 0 and _session["started"]:
            _session["started"] = False
            ray.shutdown()


def hold_cpus(cpus: float) -> None:
    """Count ``cpus`` (negative: give back) as held for the session's life by this
    process's shards: an add sizes its pool by the CPUs nothing else of npmdb keeps."""
    with _SESSION_LOCK:
        _session["held"] = max(0.0, _session["held"] + cpus)


def free_cpus(ray, need: float = 0.0, wait: float = 10.0) -> float:
    """CPUs of the Ray cluster that nothing holds, waiting up to ``wait`` seconds for
    ``need`` of them (a finished add's workers let go of theirs a moment after it
    returns)."""
    deadline = time.monotonic() + wait
    while True:
        free = float(ray.available_resources().get("CPU", 0.0))
        if free >= need - 1e-9 or time.monotonic() >= deadline:
            return free
        time.sleep(0.2)


@contextmanager
def _cluster(engine: "RayEngine", progress: bool | None) -> Iterator[Any]:
    ray = ray_session(engine.address)
    ctx = ray.data.DataContext.get_current()
    saved = ctx.enable_progress_bars
    data_log = logging.getLogger("ray.data")
    level = data_log.level
    ctx.enable_progress_bars = bool(progress)
    if not progress:
        data_log.setLevel(logging.WARNING)
    try:
        yield ray
    finally:
        ctx.enable_progress_bars = saved
        data_log.setLevel(level)
        end_ray_session()


def _placement(ray, engine: "RayEngine", device: str | None) -> tuple[int, float, str]:
    """(actors, GPUs per actor, torch device of an actor) for this cluster."""
    res = ray.cluster_resources()
    gpus, cpus = float(res.get("GPU", 0.0)), float(res.get("CPU", 1.0))
    per_gpu = engine.gpus_per_worker
    if per_gpu is None:
        per_gpu = 1.0 if gpus >= 1 else 0.0
    if per_gpu > gpus:
        raise ProgrammingError(f"RayEngine(gpus_per_worker={per_gpu}) but the Ray cluster has "
                               f"{gpus:g} GPUs")
    workers = engine.workers
    # CPUs others hold (a sharded handle's shards, an add that just ended) are not this
    # add's, and it would wait for them without a word: as many workers as fit in the
    # cluster's CPUs less what this process's shards hold, waiting a moment for a finished
    # add's workers to let go of theirs (sized when one worker's worth was free, an idle
    # cluster's pool came out short)
    want = engine.cpus_per_worker if workers is not None else max(
        engine.cpus_per_worker, cpus - _session["held"])
    free = free_cpus(ray, want)
    if workers is None:
        workers = int(gpus // per_gpu) if per_gpu else int(free // engine.cpus_per_worker)
    workers = max(1, workers)
    need_cpu, need_gpu = workers * engine.cpus_per_worker, workers * per_gpu
    if need_cpu > free or need_gpu > gpus:
        warnings.warn(f"RayEngine: {workers} workers need {need_cpu:g} CPUs and {need_gpu:g} "
                      f"GPUs; the Ray cluster has {free:g} of its {cpus:g} CPUs free and {gpus:g} "
                      "GPUs now: the encoding waits until other Ray work (a sharded handle's "
                      "shards: RayShards(cpus=)) lets go of them, or an autoscaler adds them",
                      RuntimeWarning, stacklevel=4)
    # an actor sees only its own GPU(s) (Ray sets CUDA_VISIBLE_DEVICES): plain "cuda"
    want_cuda = per_gpu > 0 and not str(device or "cuda").startswith("cpu")
    return workers, per_gpu, ("cuda" if want_cuda else "cpu")


def _bounded_retries(engine: "RayEngine") -> dict[str, int]:
    """Ray Data's defaults restart a dead actor and retry its task for ever (-1), so a piece
    that kills its worker every time (out of memory, a crash) would hang the add."""
    return {"max_restarts": engine.worker_restarts, "max_task_retries": engine.worker_restarts}


def _run_pieces(ray, engine: "RayEngine", items: list[dict], ctor: dict, workers: int,
                gpus: float) -> Iterator[tuple[int, dict]]:
    """Encode ``items`` (``{"piece": id, "payload": bytes}``) on an actor pool; yields
    ``(piece id, result)`` as results arrive (in any order)."""
    import ray.data

    kw = {}
    params = inspect.signature(ray.data.from_items).parameters
    if "override_num_blocks" in params:  # Ray >= 2.10; older: parallelism
        kw["override_num_blocks"] = len(items)
    else:  # pragma: no cover - old Ray
        kw["parallelism"] = len(items)
    ds = ray.data.from_items(items, **kw)
    with warnings.catch_warnings():  # Ray 2.60 takes the retries only through its
        warnings.filterwarnings(     # deprecated **ray_remote_args (no named parameter)
            "ignore", message=r".*ray_remote_args.* is deprecated")
        ds = ds.map_batches(_EncodeWorker, batch_size=1, batch_format="numpy",
                            compute=ray.data.ActorPoolStrategy(size=min(workers, len(items))),
                            fn_constructor_kwargs=ctor, num_cpus=engine.cpus_per_worker,
                            num_gpus=gpus or None, zero_copy_batch=True,
                            **_bounded_retries(engine))
    for batch in ds.iter_batches(batch_size=None, batch_format="numpy"):
        for pid, payload in zip(batch["piece"], batch["payload"]):
            yield int(pid), _unpack_piece(bytes(payload))


def _worker_error(exc: BaseException) -> Error | None:
    """The npmdb error an actor raised, recovered from Ray's wrapper (or None)."""
    from .. import errors

    cause = getattr(exc, "cause", None)
    if isinstance(cause, Error):
        name, msg = type(cause).__name__, str(cause)
    else:
        found = re.findall(r"npmdb\.errors\.(\w+): ([^\n]*)", str(exc))
        if not found:
            return None
        name, msg = found[-1]
    cls = getattr(errors, name, None)
    if not (isinstance(cls, type) and issubclass(cls, Error)):
        return None
    return cls(msg if "Ray worker" in msg else f"{msg} (in a Ray worker)")


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# an exception's line in a traceback's text: "ValueError: message" or a bare "MemoryError"
_EXC_LINE = re.compile(r"^([A-Za-z_][\w.]*): (.*)$|"
                       r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt))$")
_DIED = ("RayActorError", "WorkerCrashedError", "NodeDiedError")


def _is_ray(exc: BaseException) -> bool:
    return type(exc).__module__.split(".")[0] == "ray"


def _first_line(text: str) -> str:
    lines = _ANSI.sub("", text).strip().splitlines()
    return lines[0][:500] if lines else ""


def _user_exception(exc: BaseException) -> tuple[str, str] | None:
    """(type name, message) of the exception the actor's own code raised, found through
    Ray's wrappers (``cause``, ``__cause__``) or, where only its traceback came back, in
    the wrapper's text; None when there is none (a Ray failure of its own)."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if not _is_ray(e):
            return type(e).__name__, _first_line(str(e))
        e = getattr(e, "cause", None) or e.__cause__
    for line in _ANSI.sub("", str(exc)).splitlines():
        m = _EXC_LINE.match(line)
        name = m and (m.group(1) or m.group(3))
        if name and not name.startswith("ray."):
            return name, (m.group(2) or "")[:500]
    return None


def _died(exc: BaseException) -> bool:
    return _is_ray(exc) and any(c.__name__ in _DIED for c in type(exc).__mro__)


def _died_message(exc: BaseException, what: str) -> str:
    text = _ANSI.sub("", str(exc))
    detail = re.search(r"Worker exit detail: ([^\n]*)", text)
    why = f"; {detail.group(1).split(' Some common causes')[0]}" if detail else ""
    died = _first_line(text).rstrip(".")
    return (f"{what} failed on the Ray cluster: a worker process died on a piece "
            f"({type(exc).__name__}: {died}{why}), also on each of Ray's "
            f"retries (RayEngine.worker_restarts: how often). A piece that kills its worker "
            f"is most often out of memory: try smaller pieces and batches (RayEngine("
            f"piece_docs=, piece_chars=, batch_tokens=)) or more memory per worker; the Ray "
            f"workers' logs (on each node under /tmp/ray/session_latest/logs) say more")


def _failure_message(exc: BaseException, what: str, died: str | None = None) -> str:
    """What failed on the cluster, in one message without Ray's colour codes (``died``:
    what to say when a process died, instead of the encoding workers' advice)."""
    if _died(exc):
        if died is not None:
            return f"{what}: {died} ({type(exc).__name__}: {_first_line(str(exc))})"
        return _died_message(exc, what)
    user = _user_exception(exc)
    if user is None:
        return (f"{what} failed on the Ray cluster: {type(exc).__name__}: "
                f"{_first_line(str(exc))} (Ray's exception is this error's cause)")
    name, msg = user
    hint = " (out of memory: try smaller RayEngine(piece_docs=, piece_chars=, batch_tokens=))" \
        if name.split(".")[-1] in ("MemoryError", "OutOfMemoryError") else ""
    if not _is_ray(exc):  # not from a worker: the driver's own work on a result
        return f"{what} failed on the Ray cluster: {name}: {msg}{hint}"
    return (f"{what} failed on the Ray cluster: a worker raised {name}: {msg}{hint} "
            f"(the worker's traceback is in this error's cause)")


@contextmanager
def _ray_errors(what: str, died: str | None = None) -> Iterator[None]:
    """npmdb errors raised in actors come back as themselves; any other failure on the
    cluster as OperationalError naming it (Ray's own exception and trace are its cause;
    ``died``: see :func:`_failure_message`)."""
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - Ray wraps actor failures in its own types
        # Ray's wrapper of an actor's npmdb error is also an instance of that error's
        # class (RayTaskError(OperationalError)): raised as is, its message was Ray's
        # coloured traceback
        if isinstance(exc, Error) and not _is_ray(exc):
            raise
        err = _worker_error(exc)
        if err is not None:
            raise err from exc
        raise OperationalError(_failure_message(exc, what, died)) from exc


def guarded(results: Iterator[tuple[int, dict]], what: str) -> Iterator[tuple[int, dict]]:
    """``results``, with failures on the cluster (not in the driver's own work between
    items) translated by :func:`_ray_errors`."""
    while True:
        with _ray_errors(what):
            item = next(results, None)
        if item is None:
            return
        yield item


class Runs:
    """Starts the Ray cluster on first use; accumulates the workers' statistics.

    Each :meth:`run` (a wave) starts a new actor pool, whose actors load the model afresh
    (a wave's actors can differ: the IVF template the workers code with arrives after the
    first wave). The report counts ``waves`` (pools), ``actors`` (the most actor processes
    that returned pieces in one wave: at most ``workers`` unless Ray restarted one) and
    ``actor_processes`` (over all waves: how often the model was loaded).
    """

    def __init__(self, engine: "RayEngine", ctor: dict, *, progress: bool | None,
                 device: str | None) -> None:
        self.engine, self.ctor = engine, ctor
        self.progress, self.device = progress, device
        self.stack = ExitStack()
        self.ray = None
        self.t0 = time.perf_counter()
        engine.report.clear()
        engine.report.update(pieces=0, tokens=0, worker_cpu_s=0.0, worker_wall_s=0.0,
                             waves=0, actors=0, actor_processes=0, devices=set())

    def run(self, items: list[dict]) -> Iterator[tuple[int, dict]]:
        if not items:
            return
        rep = self.engine.report
        if self.ray is None:
            t = time.perf_counter()
            self.ray = self.stack.enter_context(_cluster(self.engine, self.progress))
            self.workers, self.gpus, device = _placement(self.ray, self.engine, self.device)
            self.ctor.update(device=device, threads=int(max(1, self.engine.cpus_per_worker)),
                             batch_tokens=self.engine.batch_tokens)
            rep.update(cluster_s=time.perf_counter() - t, workers=self.workers,
                       gpus_per_worker=self.gpus)
        rep["waves"] += 1
        wave_actors: set = set()
        for pid, out in _run_pieces(self.ray, self.engine, items, self.ctor, self.workers,
                                    self.gpus):
            st = out.pop("stats", {})
            self._count_actor(wave_actors, st.get("pid"))
            rep["pieces"] += 1
            rep.setdefault("first_result_s", time.perf_counter() - self.t0)
            rep["tokens"] += int(st.get("tokens", 0))
            rep["worker_cpu_s"] += float(st.get("cpu_s", 0.0))
            rep["worker_wall_s"] += float(st.get("wall_s", 0.0))
            rep["devices"].add(st.get("device"))
            yield pid, out

    def _count_actor(self, wave_actors: set, pid: Any) -> None:
        if pid in wave_actors:
            return
        wave_actors.add(pid)
        rep = self.engine.report
        rep["actor_processes"] += 1
        rep["actors"] = max(rep["actors"], len(wave_actors))

    def close(self) -> None:
        rep = self.engine.report
        rep["devices"] = sorted(str(d) for d in rep["devices"])
        rep["wall_s"] = time.perf_counter() - self.t0
        self.stack.close()
