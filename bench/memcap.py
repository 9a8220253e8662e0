"""Run a measuring process under a memory limit: how much memory serving *needs*.

A process's VmRSS counts the pages of memory-mapped files it has touched for as long as
the kernel leaves them mapped, and with free RAM it leaves them all: after 100 queries on a
10M-token database the LMDB file's pages alone are ~1 GB of RSS, though the kernel may take
any of them back (they are clean copies of the file). What a database needs is what it can
serve in without slowing down. So the scale step also measures each database in a memory
cgroup whose limit is a multiple of the smallest database's RSS: the kernel then has to
reclaim file pages to stay under it, and the latency shows whether the queries' working
set fits.

Before a capped run the database's pages are evicted from the page cache
(``posix_fadvise(DONTNEED)``): a page cached earlier is charged to the cgroup that first
read it, so without the eviction the limit would not see the database at all.

Needs a writable cgroup memory controller (root on Linux; v2 ``memory.max`` or v1
``memory.limit_in_bytes``); where there is none, ``MemoryCap.available()`` says why and the
step is skipped.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

__all__ = ["MemoryCap", "evict"]

_V2 = Path("/sys/fs/cgroup")
_V1 = Path("/sys/fs/cgroup/memory")


def evict(path: Path) -> int:
    """Drop every file of ``path`` (a database directory) from the page cache; the bytes."""
    n = 0
    for p in Path(path).rglob("*"):
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
            n += p.stat().st_size
    return n


class MemoryCap:
    """A fresh memory cgroup limited to ``limit_mb``; ``preexec`` moves a child into it."""

    def __init__(self, limit_mb: float) -> None:
        self.limit_mb = float(limit_mb)
        self.dir: Path | None = None
        self._v2 = False

    @staticmethod
    def available() -> str | None:
        """None when a capped run can be made here, else why not."""
        if not hasattr(os, "posix_fadvise"):
            return "no posix_fadvise on this platform"
        if _V1.is_dir():
            root, limit = _V1, "memory.limit_in_bytes"
        elif (_V2 / "cgroup.controllers").exists() and \
                "memory" in (_V2 / "cgroup.controllers").read_text().split():
            root, limit = _V2, "memory.max"
        else:
            return "no cgroup memory controller"
        if not os.access(root, os.W_OK):
            return f"{root} is not writable (not root, or mounted read-only)"
        probe = root / f"npmdb-bench-probe-{uuid.uuid4().hex[:8]}"
        try:  # a container may list the controller yet not enable it for new groups
            probe.mkdir()
            try:
                if not (probe / limit).exists():
                    return f"a new cgroup under {root} has no {limit}"
            finally:
                probe.rmdir()
        except OSError as exc:
            return f"cannot make a cgroup under {root}: {exc}"
        return None

    def __enter__(self) -> "MemoryCap":
        why = self.available()
        if why:
            raise RuntimeError(f"cannot cap memory: {why}")
        self._v2 = not _V1.is_dir()
        name = f"npmdb-bench-{uuid.uuid4().hex[:8]}"
        self.dir = (_V2 if self._v2 else _V1) / name
        self.dir.mkdir()
        limit = str(int(self.limit_mb * 2**20))
        (self.dir / ("memory.max" if self._v2 else "memory.limit_in_bytes")).write_text(limit)
        return self

    def preexec(self) -> None:
        """For ``subprocess``'s ``preexec_fn``: the child joins the cgroup before it execs."""
        assert self.dir is not None
        (self.dir / "cgroup.procs").write_text(str(os.getpid()))

    def peak_mb(self) -> float | None:
        """The most memory the cgroup was charged (page cache included), where recorded."""
        assert self.dir is not None
        f = self.dir / ("memory.peak" if self._v2 else "memory.max_usage_in_bytes")
        return int(f.read_text()) / 2**20 if f.exists() else None

    def __exit__(self, *exc) -> None:
        if self.dir is not None:
            try:
                self.dir.rmdir()  # empty once its processes have exited
            except OSError:
                pass
