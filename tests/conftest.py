"""Shared fixtures: a tiny random BERT encoder, the bundled sample corpus, built databases.

Tests run on the real LMDB, tantivy and hnswlib. The tiny encoder (random weights, the
default encoder's real tokenizer) keeps unit tests fast; tests marked ``slow`` and the
end-to-end tests use the real default encoder.
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "npmdb" / "data" / "dev-small"


def _has_cuda() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    cuda = None
    for item in items:
        if "gpu" in item.keywords:
            if cuda is None:
                cuda = _has_cuda()
            if not cuda:
                item.add_marker(skip_gpu)


def load_jsonl(name: str) -> list[dict]:
    path = SAMPLE / name
    opener = gzip.open if name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


@pytest.fixture(scope="session")
def sample_corpus() -> list[dict]:
    return load_jsonl("corpus.jsonl.gz")


@pytest.fixture(scope="session")
def sample_cloze() -> list[dict]:
    return load_jsonl("cloze.jsonl")


def make_tiny_encoder(path: Path, *, seed: int = 0, hidden: int = 32,
                      positions: int = 512) -> Path:
    """A randomly initialised 2-layer BERT with the default encoder's tokenizer."""
    import torch
    from transformers import BertConfig, BertModel

    from npmdb.encoder import default_encoder_path

    src = default_encoder_path()
    path.mkdir(parents=True, exist_ok=True)
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (src / name).exists():
            shutil.copy(src / name, path / name)
    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=30522, hidden_size=hidden, num_hidden_layers=2,
                     num_attention_heads=2, intermediate_size=2 * hidden,
                     max_position_embeddings=positions)
    BertModel(cfg).save_pretrained(path, safe_serialization=True)
    return path


@pytest.fixture(scope="session")
def tiny_encoder(tmp_path_factory) -> Path:
    return make_tiny_encoder(tmp_path_factory.mktemp("tiny-encoder"))


@pytest.fixture(scope="session")
def tiny_db_path(tmp_path_factory, tiny_encoder, sample_corpus) -> Path:
    """A database of 600 sample documents encoded with the tiny encoder (built once)."""
    import npmdb

    path = tmp_path_factory.mktemp("tiny-db") / "db"
    with npmdb.open(path, encoder=tiny_encoder, progress=False) as db:
        db.add(sample_corpus[:600])
    return path


@pytest.fixture()
def tiny_db(tiny_db_path):
    import npmdb

    with npmdb.open(tiny_db_path, progress=False) as db:
        yield db


@pytest.fixture(scope="session")
def real_db_path(tmp_path_factory, sample_corpus) -> Path:
    """1,200 sample documents with the real default encoder (built once per session)."""
    import npmdb

    path = tmp_path_factory.mktemp("real-db") / "db"
    docs = [d for d in sample_corpus if not d["id"].startswith("wn:")][:200] + \
        [d for d in sample_corpus if d["id"].startswith("wn:")][:1000]
    with npmdb.open(path, progress=False) as db:
        db.add(docs)
    return path


@pytest.fixture()
def real_db(real_db_path):
    import npmdb

    with npmdb.open(real_db_path, progress=False) as db:
        yield db


@pytest.fixture()
def new_db(tmp_path, tiny_encoder):
    """A fresh empty database (tiny encoder) in a temp directory."""
    import npmdb

    with npmdb.open(tmp_path / "db", encoder=tiny_encoder, progress=False) as db:
        yield db


@pytest.fixture(scope="session")
def versioned_db_path(tmp_path_factory, tiny_encoder, sample_corpus) -> Path:
    """Two versions (tiny encoder): 300 sample documents tagged 'first', then 100 more."""
    import npmdb

    path = tmp_path_factory.mktemp("versioned-db") / "db"
    with npmdb.open(path, encoder=tiny_encoder, progress=False) as db:
        db.add(sample_corpus[:300], message="first 300")
        db.tag("first")
        db.add(sample_corpus[300:400], message="100 more")
    return path


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray cluster of two CPUs (the tests' worker processes), or skip where the
    optional npmdb[ray] extra is not installed."""
    import logging

    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"the optional npmdb[ray] extra is not installed ({exc})")
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING)
    yield ray
    if started:
        ray.shutdown()
