"""Bad inputs and what each gets (the table in docs/BAD_INPUTS.md, one test per row), the
fuzzing of the query language and of ``add`` (hypothesis), and damaged database files
(checksums: detected and reported, never answered from)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

import lmdb
import numpy as np
import pytest

import npmdb
from npmdb.storage import format as SF

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import faults as F  # noqa: E402

Q = "Salem is the capital of [MASK]."


def _docs(prefix: str, n: int) -> list[dict]:
    return [{"id": f"{prefix}{i}", "title": f"Title {i}", "text": F.doc_text(f"{prefix}{i}")}
            for i in range(n)]


@pytest.fixture(scope="module")
def base(tmp_path_factory, tiny_encoder):
    """Two versions (tag v1), 50 documents, mixed-script and NUL documents."""
    path = tmp_path_factory.mktemp("bad") / "db"
    with npmdb.open(path, encoder=tiny_encoder, progress=False) as db:
        db.add(_docs("d", 30) + [
            {"id": "mixed", "text": "Москва — столица России; 東京は日本の首都; القاهرة عاصمة "
                                    "مصر; café́ naïve ｆｕｌｌ 🎉 e\u0301clair"},
            {"id": "nul\x00id", "title": "t\x00", "text": "Salem\x00 is the capital of Oregon."}])
        db.tag("v1")
        db.add(_docs("e", 18))
    return path


@pytest.fixture(scope="module")
def db(base):
    with npmdb.open(base, readonly=True, progress=False) as d:
        yield d


@pytest.fixture()
def rw(base, tmp_path):
    """A writable copy of the base database."""
    dst = tmp_path / "db"
    shutil.copytree(base, dst)
    with npmdb.open(dst, progress=False) as d:
        yield d


def _unchanged(d, before):
    assert (d.version, d.count()) == before
    assert d.check().clean


# == documents ===============================================================================


@pytest.mark.parametrize("text", ["", "   \n\t ", "!!! ... ???", "\x00\x00"])
def test_empty_and_blank_documents_are_stored_and_never_answer(rw, text):
    v = rw.add([{"id": "blank", "text": text}])
    assert v is not None and rw.get("blank")["text"] == text
    res = rw.fill_mask(Q, retrieval="hybrid", top=50, evidence=50)
    assert all(e.doc_id != "blank" for a in res for e in a.evidence)
    assert rw.check().clean


def test_a_huge_document_is_cut_into_blocks(rw):
    text = " ".join(f"The river{i % 97} flows past town{i % 31}." for i in range(800))
    word = "x" * 50_000  # one "word" far longer than any tokenizer's limit
    rw.add([{"id": "huge", "text": text}, {"id": "word", "text": word}])
    assert rw.get("huge")["text"] == text and rw.get("word")["text"] == word
    res = rw.fill_mask("The river5 flows past [MASK].", retrieval="bm25", top=5)
    assert res.answers and all(a.text in text for a in res if a.evidence[0].doc_id == "huge")
    assert rw.check().clean


@pytest.mark.parametrize("bad", [b"caf\xe9", b"\xff\xfe", b"ok \xc3"])
def test_invalid_utf8_is_a_data_error_and_nothing_is_written(rw, tmp_path, bad):
    before = (rw.version, rw.count())
    with pytest.raises(npmdb.DataError, match="UTF-8"):
        rw.add([b"fine", bad])
    f = tmp_path / "docs.jsonl"
    f.write_bytes(b'{"text": "fine"}\n{"text": "' + bad + b'"}\n')
    with pytest.raises(npmdb.DataError, match=r"docs\.jsonl:2: invalid UTF-8"):
        rw.add(f)
    _unchanged(rw, before)


def test_lone_surrogates_are_refused_everywhere(rw):
    before = (rw.version, rw.count())
    with pytest.raises(npmdb.DataError, match="surrogate"):
        rw.add(["bad \ud800 text"])
    with pytest.raises(npmdb.DataError, match="surrogate"):
        rw.add([{"id": "\udc80", "text": "x"}])
    with pytest.raises(npmdb.ProgrammingError, match="surrogate"):
        rw.fill_mask("\ud800 is [MASK].", retrieval="dense")
    with pytest.raises(npmdb.ProgrammingError, match="surrogate"):
        rw.sql("SELECT phrase FROM MASKED('\ud800 [MASK]')")
    with pytest.raises(npmdb.ProgrammingError, match="surrogate"):
        rw.sql("SELECT phrase FROM MASKED(?)", ["\ud800 [MASK]"])
    with pytest.raises(npmdb.ProgrammingError, match="surrogate"):
        rw.search("\ud800")
    with pytest.raises(npmdb.ProgrammingError, match="surrogate"):
        rw.tag("\ud800")
    assert rw.get("\ud800") is None
    _unchanged(rw, before)


@pytest.mark.parametrize("message", [5, b"x", None, "\udcff"])
def test_a_version_message_that_is_not_text_is_refused_before_any_work(rw, message):
    """It used to be stored as it came (5, b'x'), or refused only at the commit, after
    the whole ingest (a lone surrogate)."""
    before = (rw.version, rw.count())
    for call in (lambda: rw.add(["Salem is the capital of Oregon."], message=message),
                 lambda: rw.delete("d1", message=message),
                 lambda: rw.update([{"id": "d2", "text": "new"}], message=message),
                 lambda: rw.restore("v1", message=message),
                 lambda: rw.optimize(message=message)):
        with pytest.raises(npmdb.ProgrammingError, match="message"):
            call()
    _unchanged(rw, before)


def test_nul_characters_are_kept_exactly(db):
    d = db.get("nul\x00id")
    assert d["text"] == "Salem\x00 is the capital of Oregon." and d["title"] == "t\x00"
    res = db.fill_mask("Salem\x00 is the capital of [MASK].", retrieval="bm25", top=20)
    for a in res:
        for e in a.evidence:
            if e.doc_id == "nul\x00id":
                assert d["text"][e.start:e.end] == a.text or a.text in d["text"]


def test_mixed_scripts_round_trip_and_answers_are_slices_of_the_text(db):
    text = db.get("mixed")["text"]
    assert text.startswith("Москва — столица России; 東京")
    res = db.fill_mask("Москва — [MASK] России", retrieval="bm25", top=50, evidence=5)
    found = [e for a in res for e in a.evidence if e.doc_id == "mixed"]
    assert found
    for e in found:
        assert text[e.start:e.end]  # offsets index the stored text


def test_duplicate_ids_are_integrity_errors_and_nothing_is_written(rw):
    before = (rw.version, rw.count())
    with pytest.raises(npmdb.IntegrityError, match="duplicate document id 'x'"):
        rw.add([{"id": "x", "text": "one"}, {"id": "x", "text": "two"}])
    with pytest.raises(npmdb.IntegrityError, match="already exists"):
        rw.add([{"id": "d1", "text": "again"}])
    with pytest.raises(npmdb.IntegrityError):
        with rw.batch():
            rw.add([{"id": "y", "text": "one"}])
            rw.add([{"id": "y", "text": "two"}])
    assert rw.get("y") is None
    _unchanged(rw, before)


@pytest.mark.parametrize("doc,err", [
    ({"id": 1.5, "text": "x"}, npmdb.DataError), ({"id": "", "text": "x"}, npmdb.DataError),
    ({"id": ["a"], "text": "x"}, npmdb.DataError), ({"text": 5}, npmdb.DataError),
    ({"title": "no text"}, npmdb.DataError), ({"text": "x", "meta": {"s": {1, 2}}}, npmdb.DataError),
    ({"text": "x", "meta": {"big": 2 ** 70}}, npmdb.DataError),
    ({"text": "x", "meta": "not a dict"}, npmdb.DataError),
])
def test_malformed_documents_are_data_errors(rw, doc, err):
    before = (rw.version, rw.count())
    with pytest.raises(err):
        rw.add([{"id": "ok", "text": "fine"}, doc])
    _unchanged(rw, before)


@pytest.mark.parametrize("source,err", [
    (None, npmdb.InterfaceError), (5, npmdb.InterfaceError),
    ({"text": "a single dict"}, npmdb.InterfaceError), (b"bytes", npmdb.InterfaceError),
    ("no/such/file.jsonl", npmdb.DataError), ([object()], npmdb.DataError)])
def test_what_is_not_a_document_source(rw, source, err):
    before = (rw.version, rw.count())
    with pytest.raises(err):
        rw.add(source)
    _unchanged(rw, before)


# == encoders and vector dimensions ===========================================================


def test_opening_with_another_encoder_is_refused(base, tmp_path):
    other = F.make_tiny_encoder(tmp_path / "e48", hidden=48, seed=3)
    with pytest.raises(npmdb.ProgrammingError, match="was built with encoder"):
        npmdb.open(base, encoder=other, readonly=True)


@pytest.mark.parametrize("hidden", [48, 32])
def test_an_encoder_changed_underneath_is_refused_not_mixed_in(tmp_path, hidden):
    """The encoder directory is replaced by another model (another dimension, or the same
    dimension with other weights): queries and adds refuse instead of mixing vectors."""
    enc = F.make_tiny_encoder(tmp_path / "enc")
    with npmdb.open(tmp_path / "db", encoder=enc, progress=False) as d:
        d.add(_docs("a", 5))
    shutil.rmtree(enc)
    F.make_tiny_encoder(enc, hidden=hidden, seed=9)
    with npmdb.open(tmp_path / "db", progress=False) as d:
        before = (d.version, d.count())
        with pytest.raises(npmdb.OperationalError, match="not the one that made its vectors"):
            d.fill_mask(Q, retrieval="dense")
        with pytest.raises(npmdb.OperationalError, match="not the one that made its vectors"):
            d.add(_docs("b", 3))
        with pytest.raises(npmdb.OperationalError, match="not the one that made its vectors"):
            d.fill_mask(Q, retrieval="bm25")  # scoring encodes the query too
    with npmdb.open(tmp_path / "db", progress=False) as d:
        assert (d.version, d.count()) == before and d.check().clean


# == versions and tags ========================================================================


@pytest.mark.parametrize("ref", [999, -1, 2 ** 70, "nope", "", 1.5, True, [1], "v2"])
def test_unknown_versions_and_tags_are_programming_errors(db, ref):
    with pytest.raises(npmdb.ProgrammingError):
        db.fill_mask(Q, version=ref, retrieval="dense")
    with pytest.raises(npmdb.ProgrammingError):
        db.count(ref)
    with pytest.raises(npmdb.ProgrammingError):
        db.get("d1", version=ref)


def test_unknown_tag_suggests_a_close_one_and_sql_points_at_it(db):
    with pytest.raises(npmdb.ProgrammingError, match="did you mean 'v1'"):
        db.fill_mask(Q, version="v11", retrieval="dense")
    with pytest.raises(npmdb.QueryParseError) as exc:
        db.sql("SELECT phrase FROM MASKED('x [MASK]') AS OF 'nope'")
    assert exc.value.column == 45


@pytest.mark.parametrize("name", ["", "123", "HEAD", None, 5, "x" * 401, "\ud800", " 7", "+2", "-1", "7.0", "1e3", ".5"])
def test_invalid_tag_names(rw, name):
    with pytest.raises(npmdb.ProgrammingError):
        rw.tag(name)
    with pytest.raises(npmdb.ProgrammingError):
        rw.tag("fine", 999)


# == queries ===================================================================================


@pytest.mark.parametrize("query", ["no mask", "two [MASK] and [MASK]", "", None, b"x [MASK]",
                                   123, ["[MASK]"]])
def test_malformed_query_strings(db, query):
    with pytest.raises(npmdb.ProgrammingError):
        db.fill_mask(query, retrieval="dense")


@pytest.mark.parametrize("query", ["[MASK]", "\x00 [MASK] \x00", "<mask> is a river.",
                                   "word " * 20_000 + "[MASK]", "Москва [MASK] 東京"])
def test_odd_but_valid_queries_answer(db, query):
    res = db.fill_mask(query, top=3, k=64, retrieval="dense")
    assert res.version == db.version
    assert res.answers and all(np.isfinite(a.score) for a in res)
    if query.strip("\x00 ") == "[MASK]":  # no word to search BM25 blocks with: no answers
        assert not db.fill_mask(query, retrieval="bm25").answers


@pytest.mark.parametrize("opts", [
    dict(top=-1), dict(k=0), dict(k="a"), dict(k=1.5), dict(tau=0), dict(tau=float("nan")),
    dict(tau=float("inf")), dict(tau=1e-300), dict(alpha=float("nan")), dict(alpha=782),
    dict(mode="x"), dict(retrieval="x"), dict(blocks=0), dict(max_len=0), dict(max_len=10 ** 9),
    dict(exact="yes"), dict(evidence=-1), dict(offset=-1), dict(scoring="x"),
    dict(group_by="x"), dict(bogus=1), dict(top=True), dict(doc_filter=1),
    dict(doc_filter="doc.id = 'a'"),
    # integers past float's range or past 4,300 digits (Python's limit on printing them)
    dict(tau=10 ** 400), dict(alpha=-10 ** 400), dict(bm25_prior=10 ** 5000),
    dict(tau=-10 ** 5000), dict(top=10 ** 5000), dict(k=2 ** 63), dict(evidence=10 ** 30)])
def test_bad_query_parameters(db, opts):
    with pytest.raises(npmdb.ProgrammingError):
        db.fill_mask(Q, **opts)
    if "doc_filter" in opts:
        with pytest.raises(npmdb.ProgrammingError, match="doc_filter takes a .*DocFilter"):
            db.classify("It was [MASK].", {"a": ["x"]}, **opts)


def test_numpy_integers_are_integers(db):
    """Integer options and version ids read from numpy or a data frame are ints; a numpy
    float is still not an integer, and a negative numpy version is still no version."""
    want = db.fill_mask(Q, top=3, blocks=2, max_len=5, version=db.version)
    got = db.fill_mask(Q, top=np.int64(3), blocks=np.int32(2), max_len=np.uint8(5),
                       version=np.int64(db.version))
    assert [(a.text, a.score) for a in got] == [(a.text, a.score) for a in want]
    with pytest.raises(npmdb.ProgrammingError, match="top must be an integer"):
        db.fill_mask(Q, top=np.float64(3))
    # a numpy float is a number where a number is asked for
    want = db.fill_mask(Q, top=3, tau=0.5, alpha=0.25)
    got = db.fill_mask(Q, top=3, tau=np.float32(0.5), alpha=np.float64(0.25))
    assert [(a.text, a.score) for a in got] == [(a.text, a.score) for a in want]
    with pytest.raises(npmdb.ProgrammingError, match="no version -1"):
        db.fill_mask(Q, version=np.int64(-1))


@pytest.mark.parametrize("labels", [{}, {"a": []}, {"a": [1]}, "abc", {"a": "\ud800"}])
def test_bad_classify_labels(db, labels):
    with pytest.raises(npmdb.ProgrammingError):
        db.classify("It was [MASK].", labels)


@pytest.mark.parametrize("words", [5, None, 1.5, b"great", ["great", 5], ("great", None)])
def test_classify_words_that_are_not_text_name_the_label(db, words):
    """A label's words that are not a str or a list of str: a ProgrammingError naming the
    label (a bare TypeError from tuple(5) before)."""
    with pytest.raises(npmdb.ProgrammingError,
                       match="label 'a'.*words must be a str or a list of str"):
        db.classify("It was [MASK].", {"b": ["great"], "a": words})


@pytest.mark.parametrize("stmt,params,err", [
    ("SELCT phrase FROM MASKED('x [MASK]')", None, npmdb.QueryParseError),
    ("SELECT phrase FROM MASKED('x [MASK]'", None, npmdb.QueryParseError),
    ("SELECT phrase FROM MASKED(?)", None, npmdb.QueryParseError),
    ("SELECT phrase FROM MASKED(?)", ["a [MASK]", "extra"], npmdb.ProgrammingError),
    ("SELECT phrase FROM MASKED(?)", 5, npmdb.ProgrammingError),
    ("SELECT phrase FROM MASKED(?)", [object()], npmdb.ProgrammingError),
    ("SELECT phrase FROM MASKED('x [MASK]') LIMIT ?", [float("nan")], npmdb.ProgrammingError),
    ("SELECT phrase FROM MASKED('x [MASK]') LIMIT 99999999999999999999", None,
     npmdb.QueryParseError),
    ("SELECT nope FROM MASKED('x [MASK]')", None, npmdb.ProgrammingError),
    ("SELECT phrase FROM MASKED('x [MASK]') WITH alpha = 782", None, npmdb.ProgrammingError),
    ("SELECT phrase FROM MASKED('x') ", None, npmdb.ProgrammingError),
    ("", None, npmdb.QueryParseError), (None, None, npmdb.InterfaceError),
    (b"SELECT", None, npmdb.InterfaceError), ("(" * 5000, None, npmdb.ProgrammingError)])
def test_malformed_statements_and_parameters(db, stmt, params, err):
    with pytest.raises(err):
        db.sql(stmt, params)


def test_misuse_of_the_api(rw, base):
    with pytest.raises(npmdb.ProgrammingError):
        rw.get(5)
    with pytest.raises(npmdb.ProgrammingError):
        rw.delete(5)
    with pytest.raises(npmdb.ProgrammingError):
        rw.delete(None)
    with pytest.raises(npmdb.ProgrammingError):
        rw.delete("no-such-id")
    with pytest.raises(npmdb.ProgrammingError):
        rw.search(None)
    with pytest.raises(npmdb.ProgrammingError):
        rw.search("x", limit="a")
    with pytest.raises(npmdb.ProgrammingError):
        rw.vacuum(older_than="x")
    with npmdb.open(base, readonly=True, progress=False) as ro:
        with pytest.raises(npmdb.OperationalError, match="read-only"):
            ro.add(["x"])
    with pytest.raises(npmdb.ProgrammingError, match="did you mean 'readonly'"):
        npmdb.open(base, read_only=True)
    rw.close()
    with pytest.raises(npmdb.InterfaceError):
        rw.fill_mask(Q, retrieval="dense")


@pytest.mark.parametrize("path", [None, 5, b"/tmp/db", ["db"]])
def test_open_of_what_is_not_a_path(path):
    with pytest.raises(npmdb.ProgrammingError, match="the database path must be a str or "
                                                     "pathlib.Path"):
        npmdb.open(path, progress=False)


def test_an_encoder_that_is_not_a_path(base, tmp_path):
    for where in (base, tmp_path / "new"):
        with pytest.raises(npmdb.ProgrammingError, match="encoder must be a str or pathlib.Path"):
            npmdb.open(where, encoder=5, progress=False)
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("device", ["bogus", "tpu", "", 5, 1.5, ["cpu"]])
def test_a_device_torch_cannot_name_is_refused_at_open(base, tmp_path, device):
    """Checked at open, before anything is created: every query used to fail with an
    InternalError instead."""
    for where, kw in ((base, {"readonly": True}), (tmp_path / "new", {})):
        with pytest.raises(npmdb.ProgrammingError, match="device"):
            npmdb.open(where, device=device, progress=False, **kw)
    assert not (tmp_path / "new").exists()


def test_a_device_this_machine_lacks_is_not_supported(base, tmp_path):
    import torch

    missing = ["meta"] if torch.cuda.is_available() else ["cuda", "cuda:0", "meta"]
    missing.append(f"cuda:{torch.cuda.device_count()}")  # one past the last
    for device in missing:
        with pytest.raises(npmdb.NotSupportedError, match=f"device {device!r}"):
            npmdb.open(base, device=device, readonly=True, progress=False)
    with npmdb.open(base, device="cpu", readonly=True, progress=False) as db:
        assert len(db.fill_mask(Q, retrieval="dense", top=2)) == 2


# == the database directory ====================================================================


@pytest.fixture()
def damaged(base, tmp_path):
    dst = tmp_path / "damaged"
    shutil.copytree(base, dst)
    return dst


def _check_cli(path) -> tuple[int, str]:
    r = subprocess.run([sys.executable, "-m", "npmdb", "check", str(path)], capture_output=True,
                       text=True, timeout=120, cwd=str(ROOT))
    return r.returncode, r.stdout + r.stderr


def _raw(path, db_name, key) -> bytes:
    with npmdb.open(path, readonly=True, progress=False) as d:
        with d.env.read() as t:
            return bytes(t.get(key, db=d.env.dbs[db_name]))


def _flip_in_mdb(path, raw: bytes, at: int) -> None:
    """Flip one bit of a stored value (every copy of it: LMDB's copy-on-write may leave
    stale copies in free pages)."""
    f = path / "data.mdb"
    blob = bytearray(f.read_bytes())
    i = blob.find(raw)
    assert i >= 0
    while i >= 0:
        blob[i + at] ^= 0x20
        i = blob.find(raw, i + 1)
    f.write_bytes(bytes(blob))


def test_not_a_database_directory(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(npmdb.OperationalError, match="is a file, not an npmdb database"):
        npmdb.open(tmp_path / "file")
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "notes.txt").write_text("x")
    with pytest.raises(npmdb.OperationalError, match="non-empty directory"):
        npmdb.open(tmp_path / "dir")
    with pytest.raises(npmdb.OperationalError, match="no npmdb database.*create=True.*npmdb add"):
        npmdb.open(tmp_path / "missing", create=False)


@pytest.mark.parametrize("how", ["truncate", "zero", "garbage"])
def test_a_truncated_or_replaced_data_file_is_refused_at_open(damaged, how):
    f = damaged / "data.mdb"
    size = f.stat().st_size
    if how == "truncate":
        with open(f, "r+b") as fh:
            fh.truncate(size // 2)
    elif how == "zero":
        f.write_bytes(b"")
    else:
        f.write_bytes(os.urandom(size))
    with pytest.raises(npmdb.OperationalError,
                       match="truncated|not an npmdb database|not an LMDB file|cannot open"):
        with npmdb.open(damaged, progress=False) as d:
            d.fill_mask(Q, retrieval="dense")
    code, out = _check_cli(damaged)
    assert code != 0, out


def test_a_flipped_byte_in_a_vector_value_is_detected_not_answered_from(damaged):
    raw = _raw(damaged, "vectors", SF.vec_key(0, 1, 0))
    _flip_in_mdb(damaged, raw, len(raw) - 7)
    with npmdb.open(damaged, readonly=True, progress=False) as d:
        with pytest.raises(npmdb.OperationalError, match=r"segment 1: vector chunk 0 .*corrupt"
                                                         r".*npmdb check"):
            d.fill_mask(Q, exact=True)
        rep = d.check()
        assert not rep.ok and any("vector chunk 0 of generation 0" in p.message
                                  for p in rep.errors), rep
    code, out = _check_cli(damaged)
    assert code == 1 and "DAMAGED" in out and "chunk 0" in out, out
    # a damaged token column too: the vector chunk is still reported (it was not looked
    # at), and each finding says its segment once, without "run `npmdb check`"
    raw = _raw(damaged, "segcols", SF.col_key(1, "tokens"))
    _flip_in_mdb(damaged, raw, len(raw) - 3)
    with npmdb.open(damaged, readonly=True, progress=False) as d:
        found = [p.message for p in d.check().errors if p.where == "segment 1"]
    assert any("column 'tokens'" in m for m in found), found
    assert any("vector chunk 0 of generation 0" in m for m in found), found
    assert not any("segment 1" in m or "npmdb check" in m for m in found), found


def test_a_flipped_byte_in_a_document_is_detected(damaged):
    raw = _raw(damaged, "docs", SF.doc_key(1, 3))
    _flip_in_mdb(damaged, raw, len(raw) - 4)
    with npmdb.open(damaged, readonly=True, progress=False) as d:
        with pytest.raises(npmdb.OperationalError, match="document 3 is corrupt"):
            d.get("d3")
        assert any("document 3 is corrupt" in p.message for p in d.check().errors)


@pytest.mark.parametrize("target", ["g0.start.hnsw", "g0.end.hnsw"])
@pytest.mark.parametrize("how", ["flip", "truncate", "delete"])
def test_a_damaged_dense_index_is_refused_before_hnswlib_loads_it(damaged, target, how):
    f = damaged / "segments" / "s000001" / target
    b = bytearray(f.read_bytes())
    if how == "flip":
        b[8] ^= 0xFF  # the header: hnswlib itself would corrupt the heap on this one
        f.write_bytes(bytes(b))
    elif how == "truncate":
        f.write_bytes(bytes(b[:len(b) // 2]))
    else:
        f.unlink()
    with npmdb.open(damaged, readonly=True, progress=False) as d:
        with pytest.raises(npmdb.OperationalError, match=f"index file {target} is"):
            d.fill_mask(Q, retrieval="dense")
        assert not d.check().ok


@pytest.mark.parametrize("suffix", [".fast", ".term", ".idx", "meta.json"])
def test_a_damaged_bm25_index_is_refused(damaged, suffix):
    bm = damaged / "segments" / "s000001" / "bm25"
    f = next(p for p in bm.iterdir() if p.name.endswith(suffix))
    b = bytearray(f.read_bytes())
    b[len(b) // 2] ^= 0xFF
    f.write_bytes(bytes(b))
    with npmdb.open(damaged, readonly=True, progress=False) as d:
        with pytest.raises(npmdb.OperationalError, match="bm25/.* is corrupt"):
            d.fill_mask(Q, retrieval="bm25")
        assert not d.check().ok


def test_a_damaged_encoder_checkpoint_is_refused(damaged, tiny_encoder):
    from transformers import AutoModel

    from npmdb.generations import write_generation

    with npmdb.open(damaged, progress=False) as d:
        write_generation(d, AutoModel.from_pretrained(tiny_encoder), steps=1)
        w = damaged / "encoders" / "g1" / "model.safetensors"
    b = bytearray(w.read_bytes())
    b[len(b) // 2] ^= 0xFF
    w.write_bytes(bytes(b))
    with npmdb.open(damaged, readonly=True, progress=False) as d:
        with pytest.raises(npmdb.OperationalError, match="generation 1"):
            d.fill_mask(Q, retrieval="dense")
        assert any("generation 1" in p.where for p in d.check().errors)
        assert d.fill_mask(Q, version="v1", top=1, k=16, retrieval="dense") is not None  # generation 0 is intact


def test_leftovers_in_the_directory_are_listed_then_removed_by_the_next_writer(damaged):
    (damaged / "segments" / "tmp-s000099").mkdir()
    (damaged / "segments" / "s000042").mkdir()
    with npmdb.open(damaged, readonly=True, progress=False) as d:
        rep = d.check()
        assert rep.ok and len(rep.warnings) == 2, rep
    (damaged / "lock.mdb").unlink()
    (damaged / "write.lock").unlink(missing_ok=True)
    with npmdb.open(damaged, progress=False) as d:  # a writer open recovers
        assert d.check().clean
        assert d.fill_mask(Q, top=1, retrieval="dense").answers


def test_a_lost_segment_record_never_makes_a_writer_delete_the_segment(damaged):
    """With one segment's record lost (its data and directory intact, every version naming
    it), check reports the damage and opening a writer used to remove the segment's
    documents, vectors and files as a killed writer's leftovers: lost for good."""
    with npmdb.open(damaged, readonly=True, progress=False) as d:
        with d.env.read() as t:
            seg = max(SF.read_u32(bytes(k)) for k in
                      t.cursor(db=d.env.dbs["segments"]).iternext(values=False))
            docs = sum(1 for k in t.cursor(db=d.env.dbs["docs"]).iternext(values=False)
                       if SF.read_u32(bytes(k)) == seg)
    assert docs
    env = lmdb.open(str(damaged), max_dbs=64)
    with env.begin(write=True, db=env.open_db(b"segments")) as t:
        assert t.delete(SF.u32(seg))
    env.close()
    code, out = _check_cli(damaged)
    assert code == 1 and f"reads segment {seg}, which is not recorded" in out, out
    assert "removes" not in out, out          # it is not a leftover the writer may remove
    with npmdb.open(damaged, progress=False):  # a writer's open (recovery) runs
        pass
    with npmdb.open(damaged, readonly=True, progress=False) as d:
        with d.env.read() as t:
            assert docs == sum(1 for k in t.cursor(db=d.env.dbs["docs"]).iternext(
                values=False) if SF.read_u32(bytes(k)) == seg)
    assert (damaged / "segments" / f"s{seg:06d}").is_dir()


def test_a_healthy_database_checks_clean(db):
    rep = db.check()
    assert rep.clean, rep
    assert rep.counts["vector_chunks"] >= 2 and rep.counts["files"] >= 10
    with db.env.read() as t:
        from npmdb.storage.integrity import read_doc_crcs
        crcs = read_doc_crcs(t, db.env.dbs, 1)
        assert zlib.crc32(t.get(SF.doc_key(1, 0), db=db.env.dbs["docs"])) == int(crcs[0])


# == fuzzing (the bench runs 10,000 cases per target: python -m bench.faults --fuzz 10000) =====

FUZZ = int(os.environ.get("NPMDB_FUZZ_EXAMPLES", "0"))


@pytest.fixture(scope="module")
def fuzz_db(tmp_path_factory, tiny_encoder):
    path = tmp_path_factory.mktemp("fuzz") / "db"
    with F.fuzz_db(path, tiny_encoder) as d:
        yield d


@pytest.mark.parametrize("target,default", [("sql", 1500), ("fill_mask", 800), ("add", 150)])
def test_fuzz_only_npmdb_errors_and_no_hangs(fuzz_db, target, default):
    from hypothesis import HealthCheck, given, settings

    n = FUZZ or default
    strategy, call = {
        "sql": (F.query_strategies(), lambda c: fuzz_db.sql(c[0], c[1])),
        "fill_mask": (F.option_strategies(), lambda c: fuzz_db.fill_mask(c[0], **c[1])),
        "add": (F.add_strategies(), lambda c: F._fuzz_add(fuzz_db, c, added)),
    }[target]
    added: dict[str, str] = {}
    outcomes: dict[str, int] = {}
    F._alarm(20)

    @settings(max_examples=n, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def prop(c):
        import signal
        signal.alarm(20)
        try:
            call(c)
            outcomes["ok"] = outcomes.get("ok", 0) + 1
        except npmdb.InternalError:
            raise
        except npmdb.Error as exc:
            outcomes[type(exc).__name__] = outcomes.get(type(exc).__name__, 0) + 1
        finally:
            signal.alarm(0)

    prop()
    assert sum(outcomes.values()) == n
    assert outcomes.get("ok", 0) > 0, outcomes
    for did, text in added.items():
        assert fuzz_db.get(did)["text"] == text
    assert fuzz_db.check().clean


def test_cli_sql_params_that_are_not_json(base, capsys):
    """`npmdb sql --params` with malformed JSON exits 2 with the reason, no traceback."""
    from npmdb.cli import main

    assert main(["sql", str(base), "SELECT phrase FROM MASKED(?)", "--params", "[1"]) == 2
    err = capsys.readouterr().err
    assert "--params is not JSON" in err and "Traceback" not in err


def test_a_file_is_not_a_database(tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("hello")
    for create in (False, True):
        with pytest.raises(npmdb.OperationalError, match="is a file, not an npmdb database"):
            npmdb.open(f, create=create, progress=False)
    assert f.read_text() == "hello"


def test_a_creation_killed_before_lmdb_made_its_data_file_can_be_retried(tmp_path,
                                                                         tiny_encoder):
    """A kill between LMDB's reserved ``lock.mdb`` and its ``data.mdb`` left a directory
    that every later open refused as "not an npmdb database (it holds 'lock.mdb')"."""
    import subprocess
    import sys

    path = tmp_path / "db"
    child = f"""
import os, npmdb
from npmdb.storage import env as E
real = E._reserve_lock_file
def killed(p):
    real(p)
    os._exit(9)
E._reserve_lock_file = killed
npmdb.open({str(path)!r}, encoder={str(tiny_encoder)!r}, progress=False)
"""
    assert subprocess.run([sys.executable, "-c", child], timeout=300).returncode == 9
    assert "lock.mdb" in os.listdir(path) and "data.mdb" not in os.listdir(path)
    with npmdb.open(path, encoder=tiny_encoder, progress=False) as db:
        db.add(["Salem is the capital of Oregon."])
        assert db.count() == 1
