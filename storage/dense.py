"""Dense (ANN) indexes over token vectors: hnswlib, FAISS and exact, behind one protocol.

Separate start and end indexes hold only valid starts and valid ends (DESIGN.md section 3).
Labels are token positions within the segment. ANN scores only rank candidates; the
engine re-scores exactly from the stored vectors.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from npmdb.errors import NotSupportedError, OperationalError

__all__ = ["DenseIndex", "HnswIndex", "FaissIndex", "build_dense", "load_dense", "INDEX_KINDS",
           "DenseParams"]

INDEX_KINDS = ("hnsw", "faiss-hnsw", "faiss-flat")


@dataclass(frozen=True, slots=True)
class DenseParams:
    """Build and search settings (defaults chosen for recall@1024 >= 0.98)."""

    m: int = 32
    ef_construction: int = 200
    ef_search_min: int = 256
    ef_factor: float = 1.5   # ef = max(ef_search_min, ef_factor * k)


class DenseIndex(Protocol):
    kind: str

    def search(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top ``k`` labels (int64) and approximate inner products, best first."""

    def __len__(self) -> int: ...


class HnswIndex:
    kind = "hnsw"

    def __init__(self, index, params: DenseParams) -> None:
        self.index = index
        self.params = params

    @classmethod
    def build(cls, vectors: np.ndarray, labels: np.ndarray, params: DenseParams,
              threads: int) -> "HnswIndex":
        import hnswlib

        idx = hnswlib.Index(space="ip", dim=vectors.shape[1])
        idx.init_index(max_elements=max(len(labels), 1), M=params.m,
                       ef_construction=params.ef_construction, random_seed=13)
        if len(labels):
            idx.add_items(np.asarray(vectors, dtype=np.float32), labels.astype(np.int64),
                          num_threads=threads)
        return cls(idx, params)

    def save(self, path: Path) -> None:
        self.index.save_index(str(path))

    @classmethod
    def load(cls, path: Path, dim: int, params: DenseParams) -> "HnswIndex":
        import hnswlib

        idx = hnswlib.Index(space="ip", dim=dim)
        try:
            idx.load_index(str(path))
        except (RuntimeError, OSError) as exc:
            raise OperationalError(f"cannot load the dense index {path}: {exc}") from exc
        return cls(idx, params)

    def __len__(self) -> int:
        return self.index.get_current_count()

    def search(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        n = len(self)
        k = min(k, n)
        if k <= 0:
            return np.zeros(0, np.int64), np.zeros(0, np.float32)
        self.index.set_ef(max(self.params.ef_search_min, int(self.params.ef_factor * k), k))
        labels, dist = self.index.knn_query(np.asarray(q, np.float32)[None], k=k, num_threads=1)
        return labels[0].astype(np.int64), (1.0 - dist[0]).astype(np.float32)


class FaissIndex:
    """FAISS inner-product index (HNSW or flat), with a GPU copy where FAISS has GPUs."""

    def __init__(self, index, kind: str, params: DenseParams) -> None:
        self.index = index
        self.kind = kind
        self.params = params

    @staticmethod
    def _faiss():
        try:
            import faiss
        except ImportError as exc:  # pragma: no cover - faiss is a dependency
            raise NotSupportedError("FAISS is not installed: pip install faiss-cpu") from exc
        return faiss

    @classmethod
    def build(cls, vectors: np.ndarray, labels: np.ndarray, params: DenseParams, kind: str
              ) -> "FaissIndex":
        faiss = cls._faiss()
        d = vectors.shape[1]
        if kind == "faiss-hnsw":
            base = faiss.IndexHNSWFlat(d, params.m, faiss.METRIC_INNER_PRODUCT)
            base.hnsw.efConstruction = params.ef_construction
        else:
            base = faiss.IndexFlatIP(d)
        idx = faiss.IndexIDMap2(base)
        if len(labels):
            idx.add_with_ids(np.ascontiguousarray(vectors, dtype=np.float32), labels.astype(np.int64))
        return cls(idx, kind, params)

    def save(self, path: Path) -> None:
        self._faiss().write_index(self.index, str(path))

    @classmethod
    def load(cls, path: Path, kind: str, params: DenseParams) -> "FaissIndex":
        faiss = cls._faiss()
        try:
            idx = faiss.read_index(str(path))
        except RuntimeError as exc:
            raise OperationalError(f"cannot load the dense index {path}: {exc}") from exc
        return cls(idx, kind, params)

    def __len__(self) -> int:
        return int(self.index.ntotal)

    def search(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        k = min(k, len(self))
        if k <= 0:
            return np.zeros(0, np.int64), np.zeros(0, np.float32)
        faiss = self._faiss()
        params = None
        if self.kind == "faiss-hnsw":
            params = faiss.SearchParametersHNSW(
                efSearch=max(self.params.ef_search_min, int(self.params.ef_factor * k), k))
        scores, labels = self.index.search(np.asarray(q, np.float32)[None], k, params=params)
        keep = labels[0] >= 0
        return labels[0][keep].astype(np.int64), scores[0][keep].astype(np.float32)


def build_dense(kind: str, vectors: np.ndarray, labels: np.ndarray, params: DenseParams,
                path: Path, threads: int | None = None) -> None:
    """Build an index of ``kind`` and write it (fsynced) to ``path``."""
    threads = threads or os.cpu_count() or 1
    if kind == "hnsw":
        idx = HnswIndex.build(vectors, labels, params, threads)
    elif kind in ("faiss-hnsw", "faiss-flat"):
        idx = FaissIndex.build(vectors, labels, params, kind)
    else:
        raise NotSupportedError(f"unknown dense index kind {kind!r}; choose one of {INDEX_KINDS}")
    idx.save(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load_dense(kind: str, path: Path, dim: int, params: DenseParams) -> DenseIndex:
    if not path.exists():
        raise OperationalError(f"the dense index {path} is missing: the database directory is "
                               "incomplete (run `npmdb check`)")
    if kind == "hnsw":
        return HnswIndex.load(path, dim, params)
    return FaissIndex.load(path, kind, params)
