"""GPU paths: CUDA encoding (mixed precision), FAISS GPU search, training, Ray GPU workers.

Tests marked ``gpu`` need CUDA: tests/conftest.py skips them where torch sees no CUDA
device (CI, and machines without a GPU). FAISS GPU tests also need a FAISS build with GPU
support (``faiss.StandardGpuResources``) and skip without one. One unmarked test runs the
GPU search path everywhere, with FAISS's GPU classes replaced by CPU stand-ins.
"""

from __future__ import annotations

import numpy as np
import pytest

import npmdb
from npmdb.storage.dense import (
    GPU_MAX_K, INDEX_KINDS, DenseParams, build_dense, faiss_gpu_available, load_dense,
)

gpu = pytest.mark.gpu
needs_faiss_gpu = pytest.mark.skipif(not faiss_gpu_available(),
                                     reason="FAISS has no GPU support or sees no GPU")


def _cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1) + 1e-12)


@gpu
def test_encoder_uses_cuda_with_mixed_precision(tiny_encoder, sample_corpus):
    from npmdb.encoder import Encoder
    from npmdb.ingest import prepare
    from npmdb.corpus import Document

    gpu = Encoder(tiny_encoder)  # default device: CUDA when present
    cpu = Encoder(tiny_encoder, device="cpu")
    assert gpu.device.type == "cuda" and cpu.device.type == "cpu"
    docs = [Document(str(i), "", d["text"], {}) for i, d in enumerate(sample_corpus[:50])]
    prep = prepare(cpu, docs, 256)
    blocks = [prep.block(b) for b in range(prep.n_blocks)]
    hg = np.concatenate(gpu.encode_blocks(blocks))
    hc = np.concatenate(cpu.encode_blocks(blocks))
    assert hg.dtype == np.float32 and hg.shape == hc.shape
    assert _cos(hg, hc).min() > 0.99  # bfloat16 autocast against float32
    qg = gpu.encode_query("Salem is the capital of [MASK].")
    qc = cpu.encode_query("Salem is the capital of [MASK].")
    assert _cos(qg.start[None], qc.start[None])[0] > 0.99


@gpu
def test_forward_passes_never_take_cudnn_attention(tiny_encoder, sample_corpus):
    """cuDNN's attention builds a graph for each new input shape (~12 ms of CPU per call on
    an H200); npmdb's encoding and training batches change shape on nearly every call, so
    their forward passes leave it out (npmdb.encoder.forward_context)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from npmdb.corpus import Document
    from npmdb.encoder import Encoder, forward_context
    from npmdb.ingest import prepare

    enc = Encoder(tiny_encoder)
    docs = [Document(str(i), "", d["text"], {}) for i, d in enumerate(sample_corpus[:40])]
    prep = prepare(enc, docs, 256)
    blocks = [prep.block(b) for b in range(prep.n_blocks)]
    model = enc.model.train()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        enc.encode_blocks(blocks)
        enc.encode_query("Salem is the capital of [MASK].")
        for n in (37, 101, 256):  # a training-style forward and backward, new shapes
            ids = torch.randint(1000, 2000, (3, n), device=enc.device)
            with forward_context(enc.device):
                out = model(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state
            out.float().sum().backward()
    names = {e.key for e in prof.key_averages()}
    assert not [n for n in names if "cudnn_attention" in n]
    assert [n for n in names if "attention" in n]  # attention did run, on another kernel


@gpu
@needs_faiss_gpu
@pytest.mark.parametrize("kind", INDEX_KINDS)
def test_gpu_dense_search_is_exact(kind, tmp_path):
    rng = np.random.default_rng(0)
    # float16-representable vectors, as the default codec stores them
    x = rng.standard_normal((20_000, 64)).astype(np.float16).astype(np.float32)
    labels = np.arange(len(x), dtype=np.int64) * 3 + 5
    build_dense(kind, x, labels, DenseParams(), tmp_path / kind)
    gpu = load_dense(kind, tmp_path / kind, 64, DenseParams())
    cpu = load_dense(kind, tmp_path / kind, 64, DenseParams(gpu=False))
    assert gpu.on_gpu and not cpu.on_gpu and len(gpu) == len(cpu) == len(x)
    for q in x[:5] + 0.1:
        exact = x @ q
        for k in (10, 1024):
            got, scores = gpu.search(q, k)
            want = labels[np.argsort(-exact, kind="stable")[:k]]
            assert len(set(got) & set(want)) >= 0.99 * k  # fp16 query rounding at the edge
            np.testing.assert_allclose(scores, exact[(got - 5) // 3], rtol=1e-2, atol=1e-2)
    got, _ = gpu.search(x[0], GPU_MAX_K + 10)  # beyond FAISS's GPU k: the CPU index answers
    assert len(got) == GPU_MAX_K + 10


@gpu
@needs_faiss_gpu
def test_gpu_required_and_refused(tmp_path):
    x = np.ones((10, 8), np.float32)
    build_dense("faiss-flat", x, np.arange(10), DenseParams(), tmp_path / "f")
    assert load_dense("faiss-flat", tmp_path / "f", 8, DenseParams(gpu=True)).on_gpu
    assert not load_dense("faiss-flat", tmp_path / "f", 8, DenseParams(gpu=False)).on_gpu


@gpu
@needs_faiss_gpu
@pytest.mark.parametrize("dense", ["hnsw", "faiss-flat"])
def test_database_searches_on_gpu(dense, tmp_path, tiny_encoder, sample_corpus):
    with npmdb.open(tmp_path / "db", encoder=tiny_encoder, dense=dense, progress=False) as db:
        db.add(sample_corpus[:400])
        with db.snapshot() as snap:
            assert snap.segments[0].dense(snap.generation, "start").on_gpu
        for q in ("Salem is the capital of [MASK].", "Thessaloniki is a city in [MASK]."):
            ann = db.fill_mask(q, retrieval="dense", top=3)
            exact = db.fill_mask(q, retrieval="dense", top=3, exact=True)
            assert [a.text for a in ann] == [a.text for a in exact]
            np.testing.assert_allclose([a.score for a in ann], [a.score for a in exact],
                                       rtol=1e-3)


@gpu
def test_training_runs_on_cuda(tmp_path, tiny_encoder, sample_corpus):
    with npmdb.open(tmp_path / "db", encoder=tiny_encoder, progress=False) as db:
        db.add(sample_corpus[:200])
        report = npmdb.train(db, steps=2, batch_blocks=8)
        assert str(report.device).startswith("cuda")
        assert db.fill_mask("Salem is the capital of [MASK].", retrieval="bm25").answers


@gpu
def test_ray_gpu_workers(tmp_path, tiny_encoder, sample_corpus):
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"the optional npmdb[ray] extra is not installed ({exc})")
    import logging

    import torch

    from npmdb.distributed import RayEngine

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, num_gpus=torch.cuda.device_count(), include_dashboard=False,
                 logging_level=logging.WARNING)
    try:
        eng = RayEngine(segment_docs=100)  # one actor per GPU by default
        with npmdb.open(tmp_path / "ray", encoder=tiny_encoder, progress=False) as db:
            db.add(sample_corpus[:300], engine=eng)
            assert db.stats()["segments"] == 3
        assert eng.report["gpus_per_worker"] == 1.0
        assert all(d.startswith("cuda") for d in eng.report["devices"])
        with npmdb.open(tmp_path / "local", encoder=tiny_encoder, progress=False) as db:
            db.add(sample_corpus[:300])
        a = npmdb.open(tmp_path / "ray", readonly=True, progress=False)
        b = npmdb.open(tmp_path / "local", readonly=True, progress=False)
        with a.snapshot() as sa, b.snapshot() as sb:
            toks = np.concatenate([s.columns(sa.txn).tokens for s in sa.segments])
            assert np.array_equal(toks, sb.segments[0].columns(sb.txn).tokens)
            va = np.concatenate([s.vectors(sa.txn, 0, np.arange(s.columns(sa.txn).n_tokens))
                                 for s in sa.segments])
            vb = sb.segments[0].vectors(sb.txn, 0, np.arange(len(toks)))
            assert _cos(va, vb).min() > 0.99  # both bfloat16 on CUDA, batched differently
        a.close()
        b.close()
    finally:
        if started:
            ray.shutdown()


def test_gpu_search_path_with_cpu_stand_ins(monkeypatch, tmp_path, tiny_encoder, sample_corpus):
    """Where FAISS reports a GPU, every kind is searched through GpuFlat (exact, float16
    storage, rows mapped back to labels) and k beyond the GPU limit goes to the CPU index.
    FAISS's GPU classes are replaced by CPU stand-ins, so this runs on any machine."""
    import faiss

    from npmdb.storage import dense as D

    class StandIn:  # GpuIndexFlatIP: rows 0..n-1, float16 storage, k <= GPU_MAX_K
        def __init__(self, res, d, cfg):
            assert cfg.useFloat16
            self.index = faiss.IndexFlatIP(d)

        def add(self, x):
            self.index.add(x.astype(np.float16).astype(np.float32))

        def search(self, x, k):
            assert k <= GPU_MAX_K
            return self.index.search(x, k)

    class Config:
        device = 0
        useFloat16 = False

    monkeypatch.setattr(faiss, "StandardGpuResources", object, raising=False)
    monkeypatch.setattr(faiss, "GpuIndexFlatConfig", Config, raising=False)
    monkeypatch.setattr(faiss, "GpuIndexFlatIP", StandIn, raising=False)
    monkeypatch.setattr(faiss, "get_num_gpus", lambda: 1)
    monkeypatch.setattr(D, "_GPU_RES", {})
    assert faiss_gpu_available()

    rng = np.random.default_rng(0)
    x = rng.standard_normal((3000, 32)).astype(np.float16).astype(np.float32)
    labels = np.arange(len(x), dtype=np.int64) * 3 + 5
    for kind in INDEX_KINDS:
        build_dense(kind, x, labels, DenseParams(), tmp_path / kind)
        idx = load_dense(kind, tmp_path / kind, 32, DenseParams())
        assert idx.on_gpu, kind
        assert not load_dense(kind, tmp_path / kind, 32, DenseParams(gpu=False)).on_gpu
        q = x[7] + 0.05
        got, scores = idx.search(q, 100)
        order = np.argsort(-(x @ q), kind="stable")[:100]
        np.testing.assert_array_equal(np.sort(got), np.sort(labels[order]))
        np.testing.assert_allclose(scores, (x @ q)[(got - 5) // 3], rtol=1e-4, atol=1e-4)
        assert len(idx.search(q, GPU_MAX_K + 1)[0]) == GPU_MAX_K + 1  # the CPU index
    with npmdb.open(tmp_path / "db", encoder=tiny_encoder, progress=False) as db:
        db.add(sample_corpus[:200])
        with db.snapshot() as snap:
            assert snap.segments[0].dense(snap.generation, "end").on_gpu
        q = "Salem is the capital of [MASK]."
        ann, exact = db.fill_mask(q, top=3, retrieval="dense"), db.fill_mask(q, top=3, exact=True)
        assert [a.text for a in ann] == [a.text for a in exact]
