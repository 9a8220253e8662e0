"""End to end with the real default encoder (all-MiniLM-L6-v2): every retrieval and mode
answers with evidence that slices the documents, a planted answer is found, and the
command line adds and queries."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import npmdb

ROOT = Path(__file__).resolve().parent.parent

PLANTED = [
    {"id": "planted-1", "title": "Hagios Demetrios",
     "text": "Hagios Demetrios is the patron saint church of Thessaloniki, a city in Greece."},
    {"id": "planted-2", "title": "Hagios Demetrios",
     "text": "The basilica of Hagios Demetrios stands in the centre of Thessaloniki."},
    {"id": "planted-3", "title": "Thessaloniki",
     "text": "Thessaloniki is the second largest city in Greece and the capital of Macedonia."},
]


def fold(s: str) -> str:
    return " ".join(s.split()).casefold()


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """Query encoding is a small forward pass: torch's default intra-op threads make it
    much slower on a busy 2-core machine. Restored afterwards."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def check_evidence(db, res) -> None:
    texts: dict[str, str] = {}
    for a in res.answers:
        if a.support == 0:  # a classification label nothing matched
            assert not a.evidence and a.score == 0.0
            continue
        assert a.evidence and a.support >= len(a.evidence) >= 1
        for ev in a.evidence:
            if ev.doc_id not in texts:
                doc = db.get(ev.doc_id)
                assert doc is not None, ev.doc_id
                texts[ev.doc_id] = doc["text"]
            text = texts[ev.doc_id]
            assert 0 <= ev.start < ev.end <= len(text)
            assert fold(text[ev.start:ev.end]) == fold(a.text)
            assert text[ev.start:ev.end].replace("\n", " ") in ev.snippet


@pytest.mark.parametrize("retrieval", ["dense", "bm25", "hybrid"])
@pytest.mark.parametrize("mode", ["phrase", "token"])
def test_fill_mask_evidence_slices_documents(real_db, sample_cloze, retrieval, mode):
    queries = [c["query"] for c in sample_cloze[:4]] + ["The [MASK] is a genus of plants."]
    for q in queries:
        res = real_db.fill_mask(q, top=5, mode=mode, retrieval=retrieval)
        assert res.answers, (q, mode, retrieval)
        assert len(res) <= 5
        scores = [a.score for a in res]
        assert scores == sorted(scores, reverse=True)
        assert res.version == real_db.version
        if mode == "token":
            assert all(a.tokens == 1 for a in res)
        check_evidence(real_db, res)


def test_dense_exact_and_ann_agree_on_top_answer(real_db, sample_cloze):
    agree = 0
    queries = [c["query"] for c in sample_cloze[:10]]
    for q in queries:
        ann = real_db.fill_mask(q, top=1, retrieval="dense")
        exact = real_db.fill_mask(q, top=1, exact=True)
        # scores may differ a little: a candidate the ANN index misses changes the softmax
        agree += fold(ann[0].text) == fold(exact[0].text)
    assert agree >= 9, f"ANN top-1 agrees with exact on {agree}/{len(queries)}"


def test_classify_real_encoder(real_db):
    res = real_db.classify("Balearic Islands is situated in [MASK].",
                           {"spain": ["Spain", "Kingdom of Spain"], "france": ["France"],
                            "none": ["zzz-never"]}, retrieval="hybrid")
    assert {a.text for a in res} == {"spain", "france", "none"}
    assert [a for a in res if a.text == "none"][0].score == 0.0
    check_evidence(real_db, res)


def _planted(path: Path, sample_corpus, batches: int):
    docs = [d for d in sample_corpus if d["id"].startswith("wn:")][:50]
    with npmdb.open(path, progress=False) as db:
        if batches == 1:
            db.add(docs + PLANTED)
        else:
            db.add(docs)      # two adds: two segments, each with its own BM25 index
            db.add(PLANTED)
    return npmdb.open(path, progress=False)


@pytest.fixture(scope="module", params=[1, 2], ids=["one-add", "two-adds"])
def planted_db(request, tmp_path_factory, sample_corpus):
    with _planted(tmp_path_factory.mktemp("planted") / "db", sample_corpus,
                  request.param) as db:
        yield db


def test_planted_answer_bm25(planted_db):
    """The planted documents hold the rare query words (Hagios, Demetrios), so BM25 must
    rank them first whether they were added with the rest or in a later add."""
    db = planted_db
    assert db.count() == 53
    res = db.fill_mask("Hagios Demetrios is located in [MASK].", retrieval="bm25", top=5)
    texts = [fold(a.text) for a in res]
    assert {"thessaloniki", "greece"} & set(texts), texts
    right = [a for a in res if fold(a.text) in ("thessaloniki", "greece")][0]
    assert {e.doc_id for e in right.evidence} <= {p["id"] for p in PLANTED}
    check_evidence(db, res)
    # the BM25 blocks are the planted documents
    hits = db.search("Hagios Demetrios is located in", limit=3)
    assert hits[0]["doc_id"] in {"planted-1", "planted-2"}


def test_planted_answer_hybrid_and_token(planted_db):
    res = planted_db.fill_mask("Hagios Demetrios is located in [MASK].", retrieval="hybrid",
                               top=10, blocks=3)
    assert {"thessaloniki", "greece"} & {fold(a.text) for a in res}
    tok = planted_db.fill_mask("Hagios Demetrios is located in [MASK].", retrieval="bm25",
                               mode="token", top=10)
    assert tok.answers
    check_evidence(planted_db, tok)


# ------------------------------------------------------------------ the command line


def npmdb_cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    return subprocess.run([sys.executable, "-m", "npmdb", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT, env=env)


def test_cli_add_and_query(tmp_path, sample_corpus):
    data = tmp_path / "docs.jsonl"
    rows = [d for d in sample_corpus if d["id"].startswith("wn:")][:20] + PLANTED
    data.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows),
                    encoding="utf-8")
    db = tmp_path / "cli.npmdb"

    # a failed first add leaves no database behind, nor its encoder choice
    out = npmdb_cli("add", str(db), str(tmp_path / "missing.jsonl"), "-q")
    assert out.returncode == 2 and "file not found" in out.stderr
    assert not db.exists()
    (tmp_path / "empty").mkdir()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": \n', encoding="utf-8")
    out = npmdb_cli("add", str(tmp_path / "empty"), str(bad), "-q")
    assert out.returncode == 2 and "bad.jsonl:2" in out.stderr
    assert (tmp_path / "empty").is_dir() and not any((tmp_path / "empty").iterdir())

    out = npmdb_cli("add", str(db), str(data), "-q")
    assert out.returncode == 0, out.stderr
    assert "added 23 documents" in out.stdout

    out = npmdb_cli("query", str(db), "Hagios Demetrios is located in [MASK].",
                    "--retrieval", "bm25", "--top", "5", "--json")
    assert out.returncode == 0, out.stderr
    rows_out = json.loads(out.stdout)
    assert 1 <= len(rows_out) <= 5
    assert {"text", "score", "support", "evidence"} <= set(rows_out[0])
    assert {"thessaloniki", "greece"} & {fold(r["text"]) for r in rows_out}
    texts = {r["id"]: r["text"] for r in rows}
    for r in rows_out:
        for ev in r["evidence"]:
            assert fold(texts[ev["doc_id"]][ev["start"]:ev["end"]]) == fold(r["text"])

    out = npmdb_cli("query", str(db), "Hagios Demetrios is located in [MASK].",
                    "--retrieval", "bm25", "--top", "5", "--json", "--explain")
    assert out.returncode == 0, out.stderr   # --explain with --json: the plan is kept
    explained = json.loads(out.stdout)
    assert explained["answers"] == rows_out and "BM25Blocks" in explained["plan"]

    out = npmdb_cli("query", str(db), "Thessaloniki is a city in [MASK].", "--top", "3",
                    "--mode", "token")
    assert out.returncode == 0, out.stderr
    assert "score=" in out.stdout and "version" in out.stdout

    # errors: exit status 2 and a one-line message, no traceback
    out = npmdb_cli("query", str(db), "no mask here")
    assert out.returncode == 2
    assert "npmdb: error:" in out.stderr and "mask" in out.stderr
    assert "Traceback" not in out.stderr
    # adding the same ids again is refused and nothing changes
    out = npmdb_cli("add", str(db), str(data), "-q")
    assert out.returncode == 2 and "already exists" in out.stderr
    with npmdb.open(db, readonly=True, progress=False) as check:
        assert check.count() == 23 and len(check.versions()) == 1


def test_cli_output_into_a_closed_pipe_stops_quietly(tmp_path, tiny_encoder, monkeypatch,
                                                     capsys):
    """`npmdb sql DB ... | head -1`: the reader goes away, and the command stops with the
    status a shell gives a command the pipe killed (141), not a BrokenPipeError trace."""
    from npmdb.cli import main

    with npmdb.open(tmp_path / "db", encoder=tiny_encoder, progress=False) as db:
        db.add(["Oslo is in Norway.", "Bergen is in Norway."])

    class Closed:
        def write(self, _text):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(sys, "stdout", Closed())
    assert main(["sql", str(tmp_path / "db"), "SELECT id, text FROM DOCUMENTS"]) == 141
    assert "Traceback" not in capsys.readouterr().err


def test_cli_update_delete_optimize_and_vacuum(tmp_path, tiny_encoder, capsys):
    """What a command-line user needs after `npmdb add`: replace and remove documents,
    merge segments, reclaim space (only Python could, and `npmdb add` of an existing id
    told the user to call db.update)."""
    from npmdb.cli import main

    db = str(tmp_path / "db")
    with npmdb.open(db, encoder=tiny_encoder, progress=False) as d:
        d.add([{"id": "a", "text": "Salem is the capital of Oregon."},
               {"id": "b", "text": "Boise is the capital of Idaho."}], message="first load")
    docs = tmp_path / "new.jsonl"
    docs.write_text('{"id": "a", "text": "Salem is a city in Oregon."}\n'
                    '{"id": "c", "text": "Helena is the capital of Montana."}\n')
    assert main(["add", db, str(docs), "-q"]) == 2
    assert "`npmdb update` on the command line" in capsys.readouterr().err
    assert main(["update", db, str(docs), "-q", "--message", "fix a"]) == 0
    assert "updated: version 2 (+1 documents" in capsys.readouterr().out
    assert main(["delete", db, "b", "zz"]) == 2
    assert "zz" in capsys.readouterr().err
    assert main(["delete", db, "b", "zz", "--missing-ok"]) == 0
    assert "deleted 1 documents; version 3" in capsys.readouterr().out
    assert main(["optimize", db, "-q"]) == 0
    assert "optimized: version 4 (2 segments merged into 1" in capsys.readouterr().out
    assert main(["optimize", db, "-q"]) == 0
    assert "nothing to optimize; version 4 is unchanged" in capsys.readouterr().out
    # --index auto on a database whose segment is what auto picks: nothing rewritten (each
    # call copied the whole segment into a new version)
    for _ in range(2):
        assert main(["optimize", db, "-q", "--index", "auto"]) == 0
        assert "nothing to optimize; version 4 is unchanged (its segments already are " \
            "what --index auto writes" in capsys.readouterr().out
    assert main(["vacuum", db]) == 0
    assert "vacuum removed 3 versions" in capsys.readouterr().out
    assert main(["versions", db]) == 0
    out = capsys.readouterr().out
    assert "message" in out.splitlines()[0] and "optimize" not in out.splitlines()[0]
    with npmdb.open(db, readonly=True, progress=False) as d:
        assert sorted(x["id"] for x in d.documents()) == ["a", "c"]
        assert d.get("a")["text"] == "Salem is a city in Oregon."
        assert [v["id"] for v in d.versions()] == [4] and d.stats()["segments"] == 1
        assert d.check().clean
    empty = str(tmp_path / "empty")
    npmdb.open(empty, encoder=tiny_encoder, progress=False).close()
    for argv in (["optimize", empty], ["delete", empty, "a", "--missing-ok"]):
        assert main(argv) == 0
        assert "the database has no version yet" in capsys.readouterr().out
    assert main(["optimize", empty, "--index", "hnsw"]) == 0
    assert "no version yet (--index hnsw is recorded for its first segments)" in \
        capsys.readouterr().out
