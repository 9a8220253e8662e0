"""Direct reads of write-once LMDB values through this process's own mapping of the file.

py-lmdb touches one byte of every 4 KB page of a value each time it hands one out (its
"preload", done even for zero-copy buffers): a 50 MB vector chunk costs ~85 us per read and
is faulted in whole, though a query wants a few hundred rows of it. A million-token query
read 14 chunks that way: ~3 ms, and every page of every chunk resident.

Values written once and never changed -- vector chunks ``(generation, segment, chunk)``
and a segment's token columns -- are therefore *located* the first time a process reads
one (the file offset of the address py-lmdb returned, found through ``/proc/self/maps``)
and later read as numpy views of a plain read-only ``mmap`` of ``data.mdb``: only the
pages of the rows used are touched.

Why a location stays valid: such a key is written before the version that names it is
committed and is never rewritten (segment and generation numbers are never handed out
again once a version holds them; a re-embedding writes a new generation, a merge new
segments). Only values in LMDB's *overflow pages* are located: a value of a page or more,
which starts 16 bytes (the page header) into a page. LMDB copies tree pages on write, and
a small value stored inside a leaf page moves whenever a neighbouring key changes (its old
page is then reused); an overflow value's pages stay where they are until the value is
deleted, and it is deleted (vacuum) only when no version names it and no reader can see
it, so no query asks for it again. A location is recorded only after the bytes at that
offset of this mapping are checked to equal the value py-lmdb returned.

Once a value is located and checked, the pages the first read faulted into LMDB's own
mapping are released (``madvise(MADV_DONTNEED)``: LMDB maps the file read-only and shared,
so this only drops the process's page-table entries; the page cache keeps the data), so a
value's pages are not resident twice, once in each mapping.

The mapping is advised ``MADV_RANDOM``: a query reads a few thousand rows scattered over
the file, and the kernel's default readahead turned each page fault into a read of up to
128 KB around it. Under a memory limit that thrashed: a 10M-token database capped at 914 MB
(1.3x the 1M database's RSS) answered in ~1 s a query; with the advice, in the uncapped
time (``bench/results/corpus-size-*.md``, "Under a memory limit"). LMDB's own mapping gets
the same advice (``readahead=False``).

Where ``/proc/self/maps`` is missing (not Linux) or the file cannot be matched, nothing is
located and every read goes through py-lmdb as before.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import threading
from pathlib import Path

import numpy as np

__all__ = ["MappedFile"]

_CHECK = 64  # bytes compared at each end of a value before its location is trusted
_PAGE_HEADER = 16  # LMDB's page header: an overflow value starts this far into its page
_MADV_DONTNEED = 4  # Linux
_LIBC: "ctypes.CDLL | None" = None


class MappedFile:
    """A read-only mapping of an LMDB data file and the file offsets of located values
    (``page_size``: the file's LMDB page size)."""

    def __init__(self, path: Path, page_size: int) -> None:
        self.path = Path(path)
        self.page_size = int(page_size)
        self._lock = threading.Lock()
        self._mm: mmap.mmap | None = None
        self._ino: int | None = None
        self._region: tuple[int, int, int] | None = None  # LMDB's map: start, end, file off
        self.enabled = os.path.exists("/proc/self/maps")

    def locate(self, buf: memoryview) -> int | None:
        """The file offset of ``buf`` (a zero-copy value py-lmdb returned from this file),
        or None when it cannot be found or checked."""
        n = len(buf)
        if not self.enabled or n < self.page_size:  # may live inside a leaf page: it moves
            return None
        addr = np.frombuffer(buf, np.uint8).ctypes.data
        with self._lock:
            region = self._region
            if region is None or not region[0] <= addr < region[1]:
                region = self._region = self._find_region(addr)
            if region is None:
                return None
            off = addr - region[0] + region[2]
            if off % self.page_size != _PAGE_HEADER:  # not an overflow value
                return None
            mm = self._map(off + n)
            if mm is None:
                return None
            if mm[off:off + _CHECK] != bytes(buf[:_CHECK]) or \
                    mm[off + n - _CHECK:off + n] != bytes(buf[n - _CHECK:]):
                return None
        self._release(addr - _PAGE_HEADER, n + _PAGE_HEADER)
        return off

    def _release(self, addr: int, n: int) -> None:
        """Drop LMDB's mapping of the value's own pages (``addr`` page-aligned: the
        value's first overflow page) from this process's resident set."""
        end = addr + n
        end += -end % self.page_size  # the value's last overflow page is its own too
        global _LIBC
        try:
            if _LIBC is None:
                _LIBC = ctypes.CDLL(None, use_errno=True)
            _LIBC.madvise(ctypes.c_void_p(addr), ctypes.c_size_t(end - addr), _MADV_DONTNEED)
        except (OSError, AttributeError):  # pragma: no cover - not a libc with madvise
            pass

    def view(self, off: int, n: int) -> memoryview:
        """``n`` bytes at file offset ``off`` (located by :meth:`locate`)."""
        mm = self._mm
        if mm is None or off + n > len(mm):
            with self._lock:
                mm = self._map(off + n)
        if mm is None:  # pragma: no cover - a located value lies inside the file
            raise OSError(f"{self.path}: bytes {off}..{off + n} are past the end of the file")
        return memoryview(mm)[off:off + n]

    def _map(self, need: int) -> mmap.mmap | None:
        """The mapping, remapped when the file has grown past it (lock held)."""
        if self._mm is not None and len(self._mm) >= need:
            return self._mm
        try:
            with open(self.path, "rb") as fh:
                st = os.fstat(fh.fileno())
                if st.st_size < need or (self._ino is not None and st.st_ino != self._ino):
                    return None
                # an old mapping stays alive while views of it exist (numpy holds them)
                self._mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
                if hasattr(mmap, "MADV_RANDOM"):  # rows are read scattered: no readahead
                    self._mm.madvise(mmap.MADV_RANDOM)
                self._ino = st.st_ino
        except (OSError, ValueError):
            self.enabled = False
            return None
        return self._mm

    def _find_region(self, addr: int) -> tuple[int, int, int] | None:
        """LMDB's mapping of this file that holds ``addr``: (start, end, file offset)."""
        try:
            ino = os.stat(self.path).st_ino
            with open("/proc/self/maps") as fh:
                for line in fh:
                    parts = line.split()
                    if len(parts) < 6 or int(parts[4]) != ino:
                        continue
                    lo, hi = (int(x, 16) for x in parts[0].split("-"))
                    if lo <= addr < hi:
                        if self._ino is not None and self._ino != ino:
                            return None
                        return lo, hi, int(parts[2], 16)
        except (OSError, ValueError):
            self.enabled = False
        return None
