"""Write-once values read through the process's own mapping of data.mdb
(:mod:`npmdb.storage.mapped`): the same bytes as py-lmdb's, across file growth, and a
fallback where a value cannot be located."""

from __future__ import annotations

import os

import numpy as np
import pytest

import npmdb
from npmdb.storage import format as F
from npmdb.storage.mapped import MappedFile

linux = pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs /proc/self/maps")


def _lmdb_chunk(db, seg: int, gen: int, ch: int) -> np.ndarray:
    """A vector chunk as py-lmdb returns it (copied out of a fresh transaction)."""
    with db.env.read() as txn:
        return F.unpack_array(txn.get(F.vec_key(gen, seg, ch), db=db.env.dbs["vectors"])).copy()


def _readers(db):
    with db.snapshot() as snap:
        return [(r, snap.generation) for r in snap.segments]


@linux
def test_located_chunks_and_columns_equal_lmdb_reads(new_db, sample_corpus):
    new_db.add(sample_corpus[:1500])  # every column a page or more (over 1,024 blocks)
    first = new_db.fill_mask("The capital of France is [MASK].", k=64, retrieval="dense").to_list()
    (reader, gen), = _readers(new_db)
    assert reader._located and all(v is not None for v in reader._located.values())
    assert reader._mapped_cols is not None
    with new_db.snapshot() as snap:
        for (g, ch), (off, n) in reader._located.items():
            mapped = reader.stored_chunk(snap.txn, g, ch)
            np.testing.assert_array_equal(mapped, _lmdb_chunk(new_db, reader.seg, g, ch))
        cols = snap.columns(0)
        with new_db.env.read() as txn:
            raw = F.unpack_array(txn.get(F.col_key(reader.seg, "offsets"),
                                         db=new_db.env.dbs["segcols"]))
            np.testing.assert_array_equal(cols.offsets, raw)
    # later queries are served from the mapping: the same answers
    assert new_db.fill_mask("The capital of France is [MASK].", k=64, retrieval="dense").to_list() == first


@linux
def test_file_growth_remaps_and_old_views_stay_valid(tmp_path, tiny_encoder, sample_corpus):
    path = tmp_path / "db"
    with npmdb.open(path, encoder=tiny_encoder, progress=False) as db:
        db.add(sample_corpus[:30])
        db.fill_mask("Paris is in [MASK].", k=32, retrieval="dense")
        (r1, gen), = _readers(db)
        with db.snapshot() as snap:
            old = r1.stored_chunk(snap.txn, gen, 0)
        before = len(db.env.mapped._mm)
        db.add(sample_corpus[30:400])  # the file grows past the first mapping
        db.fill_mask("Paris is in [MASK].", k=32, retrieval="dense")
        readers = _readers(db)
        assert len(readers) == 2
        r2, _ = readers[1]
        assert r2._located and all(v is not None for v in r2._located.values())
        assert len(db.env.mapped._mm) > before
        np.testing.assert_array_equal(old, _lmdb_chunk(db, r1.seg, gen, 0))  # still readable
        with db.snapshot() as snap:
            np.testing.assert_array_equal(r2.stored_chunk(snap.txn, gen, 0),
                                          _lmdb_chunk(db, r2.seg, gen, 0))


def test_unlocated_values_fall_back_to_lmdb(new_db, sample_corpus, monkeypatch):
    new_db.add(sample_corpus[:40])
    with_map = new_db.fill_mask("The capital of France is [MASK].", k=64, retrieval="dense").to_list()
    new_db.close()
    db = npmdb.open(new_db.path, progress=False)
    try:
        monkeypatch.setattr(db.env.mapped, "enabled", False)
        without = db.fill_mask("The capital of France is [MASK].", k=64, retrieval="dense").to_list()
        (reader, _), = _readers(db)
        assert reader._located and all(v is None for v in reader._located.values())
        assert reader._mapped_cols is None
        assert without == with_map
        # a second read of an unlocated chunk is not CRC-checked again, and still served
        assert db.fill_mask("The capital of France is [MASK].", k=64, retrieval="dense").to_list() == with_map
    finally:
        db.close()


def test_locate_refuses_bytes_that_are_not_in_the_file(tmp_path):
    data = tmp_path / "data.mdb"
    data.write_bytes(os.urandom(8192))
    mf = MappedFile(data, 4096)
    assert mf.locate(memoryview(b"x" * 8192)) is None  # not an address inside the file
    assert mf.locate(memoryview(b"x" * 200)) is None  # small: may live in a leaf page


def test_small_values_inside_leaf_pages_are_never_located(tmp_path, tiny_encoder,
                                                          sample_corpus):
    """A value smaller than a page lives inside a leaf page, which LMDB copies (and then
    reuses) when a neighbouring key changes: such values are always read through py-lmdb.
    Many small segments, each read and then followed by writes that move their leaves,
    keep answering exactly as a fresh process does."""
    path = tmp_path / "db"
    docs = [d for d in sample_corpus if len(d["text"]) < 120][:8]
    q = "The [MASK] is here."
    with npmdb.open(path, encoder=tiny_encoder, progress=False) as db:
        for d in docs:
            db.add([d])
            db.fill_mask(q, k=16, retrieval="dense")
        seen = [r for r, _ in _readers(db)]
        small = [at for r in seen for at in r._located.values()]
        assert small and all(at is None for at in small)  # every chunk is under a page
        assert all(r._mapped_cols is None for r in seen)
        got = db.fill_mask(q, k=16, retrieval="dense").to_list()
    with npmdb.open(path, progress=False) as fresh:
        assert fresh.fill_mask(q, k=16, retrieval="dense").to_list() == got


def _lmdb_map_rss_kb(db) -> int:
    """Resident KB of LMDB's own mapping(s) of data.mdb (not npmdb's read-only one)."""
    ino = os.stat(db.path / "data.mdb").st_ino
    mm = db.env.mapped._mm
    ours = np.frombuffer(mm, np.uint8).ctypes.data if mm is not None else -1
    total, inside = 0, False
    with open("/proc/self/smaps") as fh:
        for line in fh:
            parts = line.split()
            if "-" in parts[0] and len(parts) >= 5 and ":" in parts[3]:  # a mapping's header
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                inside = int(parts[4]) == ino and not lo <= ours < hi
            elif inside and parts[0] == "Rss:":
                total += int(parts[1])
    return total


@linux
@pytest.mark.parametrize("release", [True, False])
def test_located_values_are_not_resident_twice(new_db, sample_corpus, monkeypatch, release):
    """After a value's first (checked) read, LMDB's mapping of its pages is released: the
    chunk stays readable through npmdb's mapping and is not counted twice in RSS."""
    if not release:
        monkeypatch.setattr(MappedFile, "_release", lambda self, addr, n: None)
    new_db.add(sample_corpus[:1500])
    (reader, gen), = _readers(new_db)
    with new_db.snapshot() as snap:
        before = _lmdb_map_rss_kb(new_db)
        chunk = reader.stored_chunk(snap.txn, gen, 0)
        grown = _lmdb_map_rss_kb(new_db) - before
    assert reader._located[(gen, 0)] is not None
    if release:
        assert grown < chunk.nbytes / 1024 / 4
    else:  # the control: py-lmdb's read faulted the whole chunk into its mapping
        assert grown > chunk.nbytes / 1024 / 2
    np.testing.assert_array_equal(chunk, _lmdb_chunk(new_db, reader.seg, gen, 0))
