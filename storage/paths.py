"""Where a database's files live: segment directories, dense index files, checkpoints."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

__all__ = ["segment_dir", "dense_path", "dense_files", "checkpoint_dir", "remove_dir",
           "fsync_path", "disk_bytes"]


def segment_dir(root: Path, seg: int) -> Path:
    return Path(root) / "segments" / f"s{seg:06d}"


def dense_path(root: Path, seg: int, gen: int, side: str, kind: str) -> Path:
    return segment_dir(root, seg) / f"g{gen}.{side}.{kind}"


def dense_files(gen: int, kind: str) -> list[str]:
    """The dense index files of generation ``gen`` in a segment of index ``kind``: one
    per side, or the one IVF file that holds both sides."""
    if kind == "ivf":
        return [f"g{gen}.tokens.ivf"]
    return [f"g{gen}.start.{kind}", f"g{gen}.end.{kind}"]


def checkpoint_dir(root: Path, gen: int) -> Path:
    """Where generation ``gen``'s encoder checkpoint is kept (inside the database)."""
    return Path(root) / "encoders" / f"g{gen}"


def remove_dir(path: Path) -> None:
    if path.exists():
        shutil.rmtree(path, ignore_errors=True)


def fsync_path(path: Path) -> None:
    """fsync a file or a directory (its entries)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def disk_bytes(root: Path) -> int:
    """Bytes of the files under ``root``; a file a writer removes meanwhile counts 0."""
    total = 0
    for dirpath, _, names in os.walk(root):
        for name in names:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass
    return total
