"""Dense (ANN) indexes over token vectors: hnswlib, FAISS and exact, behind one protocol.

Separate start and end indexes hold only valid starts and valid ends (DESIGN.md section 3).
Labels are token positions within the segment. ANN scores only rank candidates; the
engine re-scores exactly from the stored vectors.

GPU: where FAISS has GPU support and a GPU is present, dense search runs on the GPU
(``DenseParams.gpu``: None = when available, False = never, True = required). FAISS has no
GPU HNSW, and an IVF index needs most of its lists probed to keep recall@1024 (measured in
docs/SCALE.md), so every kind is served on the GPU by what a GPU does best: an exact
brute-force ``GpuIndexFlatIP`` over the index's own vectors (read back from the hnswlib or
FAISS index at load time; the graph stays on the CPU for ``k`` beyond FAISS's GPU limit).
Vectors are held in float16 on the GPU, which loses nothing for the default float16 codec
(the indexed vectors are the stored float16 values). Files on disk are always the CPU
indexes, so a database moves between machines with and without GPUs unchanged. An index
that does not fit on the GPU stays on the CPU (with a warning).
"""

from __future__ import annotations

import os
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

import numpy as np

from npmdb.errors import NotSupportedError, OperationalError

from .ivf import IvfParams
from .paths import fsync_path

__all__ = ["DenseIndex", "HnswIndex", "FaissIndex", "GpuFlat", "build_dense", "load_dense",
           "INDEX_KINDS", "DenseParams", "faiss_gpu_available", "IVF", "IvfParams",
           "AUTO", "AUTO_IVF_TOKENS", "INDEX_NAMES", "SEGMENT_KINDS"]

IVF = "ivf"  # the compact kind for large corpora (npmdb.storage.ivf: one file, both sides)
INDEX_KINDS = ("hnsw", "faiss-hnsw", "faiss-flat")  # one file per side (this module)
SEGMENT_KINDS = INDEX_KINDS + (IVF,)  # what a segment may record
AUTO = "auto"  # per segment when it is written: hnsw below AUTO_IVF_TOKENS, ivf from there
# corpus tokens (HEAD's plus the new segment's) from which "auto" writes ivf: at 1M, ivf
# answered with hnsw's p50 and a quarter of its anon memory (bench/results/ivf-dev.md)
AUTO_IVF_TOKENS = 1_000_000
# the names npmdb.open(index=...) accepts, and the kind each records
INDEX_NAMES = {"auto": AUTO, "hnsw": "hnsw", "ivf": IVF, "exact": "faiss-flat",
               "faiss-hnsw": "faiss-hnsw", "faiss-flat": "faiss-flat"}
GPU_MAX_K = 2048  # FAISS's GPU k-selection limit; a larger k is searched on the CPU


@dataclass(frozen=True, slots=True)
class DenseParams:
    """Build and search settings (defaults chosen for recall@1024 >= 0.98)."""

    m: int = 32
    ef_construction: int = 200
    ef_search_min: int = 256
    ef_factor: float = 1.5   # ef = max(ef_search_min, ef_factor * k)
    gpu: bool | None = None  # search on a GPU: None when available, False never, True required
    gpu_device: int = 0
    ivf: IvfParams = field(default_factory=IvfParams)  # the "ivf" kind's settings


class DenseIndex(Protocol):
    kind: str

    def search(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top ``k`` labels (int64) and approximate inner products, best first."""

    def __len__(self) -> int: ...


# -- GPU ----------------------------------------------------------------------------------


def faiss_gpu_available() -> bool:
    """True when the installed FAISS has GPU support and sees at least one GPU."""
    try:
        import faiss
    except ImportError:  # pragma: no cover - faiss is a dependency
        return False
    try:
        return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0
    except Exception:  # noqa: BLE001 - a broken CUDA setup means no GPU
        return False


def _want_gpu(params: DenseParams) -> bool:
    if params.gpu is False:
        return False
    if faiss_gpu_available():
        return True
    if params.gpu is True:
        raise NotSupportedError(
            "DenseParams(gpu=True) needs FAISS with GPU support and a GPU: install a FAISS GPU "
            "build (conda faiss-gpu, or pip install faiss-gpu-cu12 in place of faiss-cpu), or "
            "leave gpu=None to fall back to the CPU")
    return False


_GPU_LOCK = threading.Lock()  # a StandardGpuResources is not thread-safe: GPU calls take turns
_GPU_RES: dict[int, object] = {}


def _gpu_resources(device: int):
    res = _GPU_RES.get(device)
    if res is None:
        import faiss
        res = _GPU_RES[device] = faiss.StandardGpuResources()
    return res


class GpuFlat:
    """Exact inner-product search on a GPU (FAISS ``GpuIndexFlatIP``, float16 storage)."""

    def __init__(self, vectors: np.ndarray, labels: np.ndarray, device: int = 0) -> None:
        import faiss

        cfg = faiss.GpuIndexFlatConfig()
        cfg.device = device
        cfg.useFloat16 = True
        with _GPU_LOCK:
            self.index = faiss.GpuIndexFlatIP(_gpu_resources(device), int(vectors.shape[1]), cfg)
            self.index.add(np.ascontiguousarray(vectors, dtype=np.float32))
        self.labels = np.asarray(labels, dtype=np.int64)  # GPU rows are 0..n-1

    @classmethod
    def attach(cls, stored: Callable[[], tuple[np.ndarray, np.ndarray]], what: str,
               device: int = 0) -> "GpuFlat | None":
        """A GPU copy of ``stored()`` (labels, vectors), or None (and a warning) when it
        cannot be made (GPU memory, CUDA errors, an index that cannot give its vectors)."""
        try:
            labels, vectors = stored()
            return cls(vectors, labels, device) if len(labels) else None
        except Exception as exc:  # noqa: BLE001 - out of GPU memory, CUDA errors
            warnings.warn(f"npmdb: searching the {what} index on the CPU: cannot copy it to "
                          f"GPU {device}: {exc}", RuntimeWarning, stacklevel=3)
            return None

    def __len__(self) -> int:
        return len(self.labels)

    def search(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        k = min(k, len(self))
        with _GPU_LOCK:
            scores, rows = self.index.search(np.ascontiguousarray(q, dtype=np.float32)[None], k)
        keep = rows[0] >= 0
        return self.labels[rows[0][keep]], scores[0][keep].astype(np.float32)


# -- hnswlib ------------------------------------------------------------------------------


class HnswIndex:
    kind = "hnsw"

    def __init__(self, index, params: DenseParams) -> None:
        self.index = index
        self.params = params
        self.gpu: GpuFlat | None = None

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
        obj = cls(idx, params)
        if _want_gpu(params) and len(obj):
            obj.gpu = GpuFlat.attach(obj.stored, str(path), params.gpu_device)
        return obj

    def stored(self) -> tuple[np.ndarray, np.ndarray]:
        """Labels and vectors held by the index."""
        labels = np.asarray(self.index.get_ids_list(), dtype=np.int64)
        vecs = np.asarray(self.index.get_items(labels, return_type="numpy"), dtype=np.float32)
        return labels, vecs.reshape(len(labels), -1)

    @property
    def on_gpu(self) -> bool:
        return self.gpu is not None

    def __len__(self) -> int:
        return self.index.get_current_count()

    def search(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        n = len(self)
        k = min(k, n)
        if k <= 0:
            return np.zeros(0, np.int64), np.zeros(0, np.float32)
        if self.gpu is not None and k <= GPU_MAX_K:
            return self.gpu.search(q, k)
        if 2 * k >= n:  # most of the index: a scan is as cheap, and exact
            return self._scan(q, k)
        self.index.set_ef(max(self.params.ef_search_min, int(self.params.ef_factor * k), k))
        try:
            labels, dist = self.index.knn_query(np.asarray(q, np.float32)[None], k=k,
                                                num_threads=1)
        except RuntimeError:  # the graph reaches fewer than k elements from its entry point
            return self._scan(q, k)
        return labels[0].astype(np.int64), (1.0 - dist[0]).astype(np.float32)

    def _scan(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The exact top ``k`` of every stored vector (by score, then label)."""
        labels, vecs = self.stored()
        scores = (vecs @ np.asarray(q, np.float32).reshape(-1)).astype(np.float32)
        order = np.lexsort((labels, -scores))[:k]
        return labels[order], scores[order]


# -- FAISS --------------------------------------------------------------------------------


class FaissIndex:
    """FAISS inner-product index (HNSW or flat), with a GPU copy where FAISS has GPUs."""

    def __init__(self, index, kind: str, params: DenseParams) -> None:
        self.index = index
        self.kind = kind
        self.params = params
        self.gpu: GpuFlat | None = None

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
        obj = cls(idx, kind, params)
        if _want_gpu(params) and len(obj):
            obj.gpu = GpuFlat.attach(obj.stored, str(path), params.gpu_device)
        return obj

    def stored(self) -> tuple[np.ndarray, np.ndarray]:
        """Labels and vectors held by the index (the flat storage under HNSW too)."""
        faiss = self._faiss()
        idmap = faiss.downcast_index(self.index)
        sub = faiss.downcast_index(idmap.index)
        flat = faiss.downcast_index(sub.storage) if hasattr(sub, "storage") else sub
        n = int(flat.ntotal)
        vecs = flat.reconstruct_n(0, n) if n else np.zeros((0, flat.d), np.float32)
        return faiss.vector_to_array(idmap.id_map).astype(np.int64), vecs

    @property
    def on_gpu(self) -> bool:
        return self.gpu is not None

    def __len__(self) -> int:
        return int(self.index.ntotal)

    def search(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        k = min(k, len(self))
        if k <= 0:
            return np.zeros(0, np.int64), np.zeros(0, np.float32)
        if self.gpu is not None and k <= GPU_MAX_K:
            return self.gpu.search(q, k)
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
    fsync_path(path)


def load_dense(kind: str, path: Path, dim: int, params: DenseParams) -> DenseIndex:
    if not path.exists():
        raise OperationalError(f"the dense index {path} is missing: the database directory is "
                               "incomplete (run `npmdb check`)")
    if kind == "hnsw":
        return HnswIndex.load(path, dim, params)
    return FaissIndex.load(path, kind, params)
