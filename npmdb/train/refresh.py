"""REALM-style refresh: re-embed the corpus with a copy of the encoder while training goes on.

:class:`Refresher` owns one background thread. ``submit`` hands it a *copy* of the model
(the trainer deep-copies the parameters, so training can keep updating its own model)
and returns at once; the thread calls :func:`npmdb.generations.write_generation`, which
saves the copy as a safetensors checkpoint inside the database, re-encodes and re-indexes
every segment under a new embedding generation and commits a version that reads it in
one LMDB transaction. Queries running meanwhile read whichever version was HEAD when they
began (the old one, or the new one once committed, never a mix), and every Result names
its version and generation.

At most one refresh runs and at most one waits: if a newer copy arrives while one is
waiting, the newer replaces it (a refresh of stale parameters is no use once fresher ones
exist). Work is committed in submission order, so the last submission becomes HEAD.
An exception in the thread is kept and re-raised by :meth:`check` / :meth:`close`; one
raised by a job's ``after`` hook (the trainer saves its state there) comes after the
commit, so the version stands and is listed in ``done``, and the message says so.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

from npmdb.errors import OperationalError

if TYPE_CHECKING:  # pragma: no cover
    from npmdb.database import Database

__all__ = ["Refresher", "RefreshJob", "RefreshDone", "AfterCommitError"]


@dataclasses.dataclass
class RefreshJob:
    """One model copy to turn into an embedding generation."""

    model: Any                      # a transformers model (a copy, owned by the job)
    step: int
    tag: str | None = None
    message: str = ""
    info: dict | None = None
    # called in the refresh thread after the commit: after(version, generation)
    after: Callable[[int, int], None] | None = None
    # what ``after`` does, for the message when it fails (the version stays committed)
    after_what: str = "the step after the commit"


@dataclasses.dataclass(frozen=True)
class RefreshDone:
    step: int
    version: int
    generation: int
    tag: str | None
    seconds: float


class AfterCommitError(Exception):
    """A refresh committed ``done`` and then its job's ``after`` hook failed with ``error``."""

    def __init__(self, done: RefreshDone, what: str, error: BaseException) -> None:
        super().__init__(f"{what} failed: {error}")
        self.done, self.what, self.error = done, what, error


class Refresher:
    """A background thread that writes embedding generations (see the module docstring).

    Use as a context manager or call :meth:`close`. ``done`` lists the refreshes that
    committed, in order; ``dropped`` counts copies replaced by newer ones before they ran.
    """

    def __init__(self, db: "Database", *, write: Callable[..., tuple[int, int]] | None = None,
                 name: str = "npmdb-refresh") -> None:
        if write is None:
            from npmdb.generations import write_generation as write
        self.db = db
        self._write = write
        self._cond = threading.Condition()
        self._pending: RefreshJob | None = None
        self._running: RefreshJob | None = None
        self._stop = False
        self.error: BaseException | None = None
        self.done: list[RefreshDone] = []
        self.dropped = 0
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    # -- API ---------------------------------------------------------------------------

    def submit(self, job: RefreshJob) -> None:
        """Queue ``job`` (replacing a job that has not started yet); returns at once."""
        self.check()
        with self._cond:
            if self._stop:
                raise OperationalError("the refresher is closed")
            if self._pending is not None:
                self.dropped += 1
            self._pending = job
            self._cond.notify_all()

    @property
    def busy(self) -> bool:
        with self._cond:
            return self._running is not None or self._pending is not None

    def check(self) -> None:
        """Re-raise a failure of the refresh thread (as OperationalError): of the refresh
        itself (nothing committed), or of its ``after`` hook (the refresh committed)."""
        if self.error is not None:
            err = self.error
            if isinstance(err, AfterCommitError):
                d = err.done
                raise OperationalError(
                    f"the refresh committed version {d.version} (embedding generation "
                    f"{d.generation}, step {d.step}), which stands; then {err.what} failed: "
                    f"{err.error}") from err.error
            raise OperationalError(f"refreshing the embeddings failed: {err}") from err

    def wait(self, timeout: float | None = None) -> bool:
        """Block until no refresh is running or waiting; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while (self._running is not None or self._pending is not None) and self.error is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def close(self, *, drain: bool = True) -> None:
        """Stop the thread: with ``drain`` finish the waiting job too, else drop it.

        Always waits for a running refresh to commit or fail (never leaves one half done
        in this process), then re-raises a failure.
        """
        with self._cond:
            if not drain and self._pending is not None:
                self._pending = None
                self.dropped += 1
            self._stop = True
            self._cond.notify_all()
        self._thread.join()
        self.check()

    def __enter__(self) -> "Refresher":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        # on an error in the training loop: finish what runs, drop what waits
        self.close(drain=exc_type is None)

    # -- thread ----------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._cond:
                while self._pending is None and not self._stop:
                    self._cond.wait()
                if self._pending is None:  # stopping, nothing left
                    return
                job, self._pending = self._pending, None
                self._running = job
            t0 = time.perf_counter()
            try:
                vid, gen = self._write(self.db, job.model, steps=job.step, tag=job.tag,
                                       message=job.message, info=job.info)
                done = RefreshDone(job.step, int(vid), int(gen), job.tag,
                                   time.perf_counter() - t0)
                with self._cond:
                    self.done.append(done)  # committed, whatever ``after`` does
                if job.after is not None:
                    try:
                        job.after(vid, gen)
                    except BaseException as exc:  # noqa: BLE001 - reported by check()
                        raise AfterCommitError(done, job.after_what, exc) from exc
            except BaseException as exc:  # noqa: BLE001 - kept and re-raised by check()
                with self._cond:
                    self.error = exc
                    self._pending = None
                    self._running = None
                    self._cond.notify_all()
                return
            finally:
                job.model = None  # free the copy
            with self._cond:
                self._running = None
                self._cond.notify_all()
