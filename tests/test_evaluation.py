"""``npmdb.evaluate`` and ``npmdb eval``: exact match of questions with known answers, per
version. A hand-made corpus where BM25 leaves each question one candidate answer makes
the top answers known whatever the (tiny, random) encoder scores; the real encoder is
checked against plain ``fill_mask`` calls."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

import npmdb
from npmdb.cli import main
from npmdb.evaluation import (Question, compare, exact_match, keep_if_better, load_questions,
                              mcnemar_exact, normalize_answer)

DOCS = [
    {"id": "salem", "title": "Salem", "text": "Salem: Oregon"},
    {"id": "thess", "title": "Thessaloniki", "text": "Thessaloniki: Greece"},
    {"id": "lima", "title": "Lima", "text": "Lima: Peru"},
    {"id": "oslo", "title": "Oslo", "text": "Oslo: Norway"},
]
QUESTIONS = [
    {"id": "q1", "query": "Salem is the capital of [MASK].", "answers": ["Oregon"],
     "relation": "capital"},
    {"id": "q2", "query": "Thessaloniki is a city in [MASK].", "answers": ["Greece", "Hellas"],
     "relation": "located_in"},
    {"id": "q3", "query": "Lima is a city in [MASK].", "answers": "Chile",
     "relation": "located_in"},
    {"id": "q4", "query": "Oslo is the capital of [MASK].", "answers": ["Kingdom of Norway"],
     "relation": "capital", "answer_ngram": 3},
]


@pytest.fixture()
def planted(tmp_path, tiny_encoder):
    """Version 1: the four entries; version 2: Salem's entry deleted."""
    path = tmp_path / "db"
    with npmdb.open(path, encoder=tiny_encoder, progress=False) as db:
        db.add(DOCS)
        db.delete("salem")
    return path


def test_normalisation_is_squads():
    assert normalize_answer("  The  Kingdom of Norway. ") == "kingdom of norway"
    assert exact_match("the Oregon!", ["Oregon"])
    assert exact_match("Hellas", ("Greece", "hellas"))
    assert not exact_match("Oregon State", ["Oregon"])
    assert not exact_match(None, ["Oregon"])


def test_figures_per_version(planted):
    with npmdb.open(planted, progress=False) as db:
        before = npmdb.evaluate(db, QUESTIONS, version=1)
        after = npmdb.evaluate(db, QUESTIONS)
    assert [r.predicted for r in before.results] == ["Oregon", "Greece", "Peru", "Norway"]
    assert [r.correct for r in before.results] == [True, True, False, False]
    assert (before.version, before.n, before.retrieval) == (1, 4, "bm25")
    assert before.micro == pytest.approx(50.0)
    assert before.by_length == pytest.approx({"1": 200 / 3, "3": 0.0})
    assert before.length_macro == pytest.approx(100 / 3)
    assert before.by_relation == pytest.approx({"capital": 50.0, "located_in": 50.0})
    assert before.relation_macro == pytest.approx(50.0)
    # HEAD (version 2) has no Salem entry: that question loses its answer
    assert after.version == 2
    assert after.results[0].predicted != "Oregon" and not after.results[0].correct
    assert after.micro == pytest.approx(25.0)
    rows = before.to_list()
    assert rows[2] == {"id": "q3", "query": QUESTIONS[2]["query"], "answers": ["Chile"],
                       "relation": "located_in", "bucket": "1", "predicted": "Peru",
                       "correct": False}
    assert "EM 50.0 micro" in str(before)
    assert list(before.to_pandas()["correct"]) == [True, True, False, False]
    assert before.to_arrow().num_rows == 4


def test_mcnemar_exact():
    assert mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(5, 5) == 1.0 and mcnemar_exact(1, 0) == 1.0
    assert mcnemar_exact(10, 0) == pytest.approx(2 / 1024)
    assert mcnemar_exact(6, 1) == pytest.approx(2 * (1 + 7) / 128)
    assert mcnemar_exact(1, 6) == mcnemar_exact(6, 1)
    # large counts: no underflow
    assert mcnemar_exact(600, 400) == pytest.approx(2.73e-10, rel=0.01)
    with pytest.raises(npmdb.ProgrammingError, match="counts"):
        mcnemar_exact(-1, 2)


def _mcnemar_big_int(gained: int, lost: int) -> float:
    """The exact two-sided tail in integers: the formula mcnemar_exact used to compute."""
    n = gained + lost
    tail = sum(math.comb(n, i) for i in range(min(gained, lost) + 1))
    return min(1.0, 2 * tail / 2 ** n) if n else 1.0


def test_mcnemar_exact_equals_the_exact_tail():
    """The float recurrence (log space beyond 1000 questions) against exact integers."""
    splits = [(g, n - g) for n in range(0, 61) for g in range(n + 1)]
    splits += [(g, n - g) for n in (199, 200, 999, 1000) for g in range(0, n + 1, 7)]
    for g, lost in splits:
        want = _mcnemar_big_int(g, lost)
        assert mcnemar_exact(g, lost) == pytest.approx(want, rel=1e-12, abs=1e-300), (g, lost)
    for g, lost in [(900, 1100), (1000, 1001), (0, 1500), (1400, 1600)]:  # lgamma's range
        assert mcnemar_exact(g, lost) == pytest.approx(_mcnemar_big_int(g, lost), rel=1e-11)


def test_mcnemar_exact_is_linear_in_the_questions():
    """Tens of thousands of discordant questions: the integer sum took 40-65 s for 25,200 and
    never ended for 200,000 (timings in the change's report, not asserted here)."""
    for g, lost in [(20000, 21000), (12000, 13200), (100000, 100000), (0, 10 ** 6)]:
        p = mcnemar_exact(g, lost)
        assert math.isfinite(p) and 0.0 <= p <= 1.0
    assert mcnemar_exact(100000, 100000) == 1.0
    assert 0.0 < mcnemar_exact(20000, 21000) < 1e-5


@pytest.mark.parametrize("counts", [(1.5, 2), (2, "3"), (True, 1), (None, 0), (-1, 2)])
def test_mcnemar_exact_takes_counts(counts):
    with pytest.raises(npmdb.ProgrammingError, match="counts of questions"):
        mcnemar_exact(*counts)


def test_what_is_not_questions_or_evaluations_is_refused(planted):
    with npmdb.open(planted, progress=False) as db:
        for bad in (5, None, {"query": "x [MASK]", "answers": ["y"]}):
            with pytest.raises(npmdb.ProgrammingError, match="questions must be a question "
                                                             "file's path or a list"):
                npmdb.evaluate(db, bad)
        ok = npmdb.evaluate(db, QUESTIONS)
    for before, after in (("x", "y"), (ok, None), (None, ok)):
        with pytest.raises(npmdb.ProgrammingError, match="compare takes two evaluations"):
            compare(before, after)


def test_an_empty_evaluation_has_the_schema_of_a_full_one(planted):
    import dataclasses

    import pyarrow as pa

    with npmdb.open(planted, progress=False) as db:
        full = npmdb.evaluate(db, QUESTIONS)
    empty = dataclasses.replace(full, results=())
    assert empty.to_arrow().schema == full.to_arrow().schema
    assert full.to_arrow().schema.field("answers").type == pa.list_(pa.string())
    assert pa.concat_tables([full.to_arrow(), empty.to_arrow()]).num_rows == 4
    assert empty.to_pandas().dtypes["correct"] == full.to_pandas().dtypes["correct"] == bool


def test_compare_pairs_questions(planted):
    with npmdb.open(planted, progress=False) as db:
        before = npmdb.evaluate(db, QUESTIONS, version=1)
        after = npmdb.evaluate(db, QUESTIONS)
        fewer = npmdb.evaluate(db, QUESTIONS[:3])
    c = compare(before, after)
    assert [r.id for r in c.lost] == ["q1"] and c.gained == ()
    assert c.delta == pytest.approx(-25.0) and c.n == 4
    assert c.p_value == 1.0 and not c.significant()
    assert c.by_relation() == {"capital": (0, 1)}
    assert c.summary()["by_relation"] == {"capital": {"gained": 0, "lost": 1}}
    assert "version 2 bm25 against version 1 bm25: -25.0 points" in str(c)
    assert "0 of 4 questions gained, 1 lost" in str(c)
    back = compare(after, before)
    assert [r.id for r in back.gained] == ["q1"] and back.lost == ()
    with pytest.raises(npmdb.ProgrammingError, match="same questions"):
        compare(before, fewer)


def test_evaluation_module_reachable_from_bare_import():
    # in a fresh interpreter: here the tests' own imports have loaded the module already
    out = subprocess.run([sys.executable, "-c", "import npmdb; print(npmdb.evaluation.compare"
                          ".__name__)"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "compare"


def _reembed(db, tiny_encoder) -> int:
    """A training refresh's kind of version: new vectors (a noisy copy of the encoder),
    the same documents."""
    import torch
    from transformers import AutoModel

    model = AutoModel.from_pretrained(tiny_encoder)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p))
    return db.write_generation(model)[0]


def test_keep_if_better(planted, tiny_encoder):
    with npmdb.open(planted, progress=False) as db:
        # a run's version (2 -> 3: new vectors, the same documents) that answers no more
        # (25 % both): restored; ``before`` may be a tag or a digit string
        db.tag("start", 2)
        trained = _reembed(db, tiny_encoder)
        d = keep_if_better(db, QUESTIONS, before="start", trained=[trained], progress=False)
        assert not d.kept and d.restored_as == 4 == db.version
        assert "restored: version 4 equals version 2" in str(d) and "AS OF 3" in str(d)
        assert db.versions()[-1]["message"].startswith("kept version 2: the trained version 3")
        # HEAD answers more than ``before`` (Salem's entry back: 50 % against 25 %): kept
        back = db.restore(1)
        d = keep_if_better(db, QUESTIONS, before=2, trained=[back], progress=False)
        assert d.kept and d.restored_as is None and db.version == back
        assert d.comparison.delta == pytest.approx(25.0)
        # no better, but another writer's version came between: restoring would undo it
        db.tag("five", back)
        db.delete("oslo")
        other = db.version
        trained = _reembed(db, tiny_encoder)
        d = keep_if_better(db, QUESTIONS, before="five", trained=[trained], progress=False)
        assert d.kept and d.restored_as is None and db.version == trained
        assert f"version(s) {other} were committed after {back}" in d.reason
        # the same once a vacuum has dropped that version: the documents tell
        db.vacuum()
        assert other not in [v["id"] for v in db.versions()]
        d = keep_if_better(db, QUESTIONS, before="five", trained=[trained], progress=False)
        assert d.kept and d.restored_as is None and db.version == trained
        assert (f"the documents of version {trained} are not those of version {back}"
                in d.reason)
        assert db.get("oslo") is None
        with pytest.raises(npmdb.ProgrammingError, match="committed none"):
            keep_if_better(db, QUESTIONS, before=3, trained=[])


def test_cli_restore(planted, capsys):
    assert main(["restore", str(planted), "1", "--message", "back to four entries"]) == 0
    assert "restored: version 3 equals version 1" in capsys.readouterr().out
    with npmdb.open(planted, progress=False) as db:
        assert db.version == 3 and db.get("salem") is not None
        assert db.versions()[-1]["message"] == "back to four entries"
        db.tag("before", 2)
    assert main(["restore", str(planted), "before"]) == 0
    assert "version 4 equals version 2 (before)" in capsys.readouterr().out  # the id too
    assert main(["restore", str(planted), "99"]) == 2
    assert "99" in capsys.readouterr().err
    with npmdb.open(planted, progress=False) as db:
        assert db.version == 4 and db.get("salem") is None
    from npmdb.storage.transaction import FileLock

    other = FileLock(planted)  # another writer at work: --timeout waits (it had none)
    other.acquire(0.0)
    try:
        assert main(["restore", str(planted), "1", "--timeout", "0.2"]) == 2
        assert "locked by another writer" in capsys.readouterr().err
        assert main(["tag", str(planted), "t", "--timeout", "0.2"]) == 2
    finally:
        other.release()
    assert main(["tag", str(planted), "t", "--timeout", "5"]) == 0


def _copy_with_questions(tiny_db_path, sample_cloze, tmp_path, n: int):
    """A copy of the tiny database, its HEAD, and a file of its first ``n`` questions."""
    import shutil

    path = tmp_path / "db"
    shutil.copytree(tiny_db_path, path)
    with npmdb.open(path, progress=False) as db:
        start = db.version
    qfile = tmp_path / "questions.jsonl"
    qfile.write_text("".join(json.dumps(q) + "\n" for q in sample_cloze[:n]))
    return path, start, qfile


def test_cli_train_keep_if_better(tiny_db_path, sample_cloze, tmp_path, capsys):
    path, start, qfile = _copy_with_questions(tiny_db_path, sample_cloze, tmp_path, 15)
    # a bad question file stops before any training
    assert main(["train", str(path), "--steps", "2", "--keep-if-better",
                 str(tmp_path / "missing.jsonl"), "-q"]) == 2
    assert "no question file" in capsys.readouterr().err
    assert main(["train", str(path), "--steps", "2", "--batch-blocks", "8",
                 "--keep-if-better", str(qfile), "-q"]) == 0
    out = capsys.readouterr().out
    assert f"on {qfile}:" in out and "15 questions" in out
    with npmdb.open(path, progress=False) as db:
        trained = start + 1
        if "restored: version" in out:  # HEAD is the version before training again
            assert db.version == trained + 1 and db.stats()["generation"] == 0
        else:
            assert f"kept version {trained}" in out
            assert db.version == trained and db.stats()["generation"] == 1


def test_questions_are_checked(tmp_path):
    with pytest.raises(npmdb.ProgrammingError, match="exactly one mask"):
        Question("Salem is the capital of Oregon.", ("Oregon",))
    with pytest.raises(npmdb.ProgrammingError, match="non-empty list"):
        Question("Salem is in [MASK].", ())
    with pytest.raises(npmdb.ProgrammingError, match="non-empty list"):
        Question("Salem is in [MASK].", 3)
    with pytest.raises(npmdb.ProgrammingError, match="missing answers"):
        load_questions([{"query": "Salem is in [MASK]."}])
    with pytest.raises(npmdb.ProgrammingError, match="answer_ngram"):
        load_questions([{"query": "Salem is in [MASK].", "answers": ["Oregon"],
                         "answer_ngram": "one"}])
    with pytest.raises(npmdb.ProgrammingError, match="answers must be a list"):
        load_questions([{"query": "Salem is in [MASK].", "answers": 3}])
    assert Question("Salem is in [MASK].", ("Marion County",)).bucket == "2"
    bad = tmp_path / "q.jsonl"
    bad.write_text(json.dumps(QUESTIONS[0]) + "\n{not json\n")
    with pytest.raises(npmdb.DataError, match=r"q\.jsonl, line 2"):
        load_questions(bad)
    with pytest.raises(npmdb.ProgrammingError, match="no question file"):
        load_questions(tmp_path / "missing.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(npmdb.ProgrammingError, match="no questions"):
        load_questions(tmp_path / "empty.jsonl")
    # damaged files: a DataError naming the file (and the line), never a decoder's traceback
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(json.dumps(QUESTIONS[0]).encode() + b'\n{"query": "a [MASK].", '
                      b'"answers": ["caf\xe9"]}\n')
    with pytest.raises(npmdb.DataError, match=r"latin\.jsonl, line 2: not UTF-8"):
        load_questions(latin)
    fake = tmp_path / "q.jsonl.gz"
    fake.write_text(json.dumps(QUESTIONS[0]) + "\n")
    with pytest.raises(npmdb.DataError, match=r"q\.jsonl\.gz cannot be read"):
        load_questions(fake)
    # a BOM is not part of the first object; an id of 0 is an id
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + json.dumps(dict(QUESTIONS[0], id=0)).encode() + b"\n")
    assert load_questions(bom)[0].id == "0"


def test_options_reach_fill_mask(planted):
    with npmdb.open(planted, progress=False) as db:
        db.tag("before", 1)
        with pytest.raises(npmdb.ProgrammingError, match="top"):
            npmdb.evaluate(db, QUESTIONS, top=5)
        with pytest.raises(npmdb.ProgrammingError, match="no_such_option"):
            npmdb.evaluate(db, QUESTIONS, no_such_option=1)
        ev = npmdb.evaluate(db, QUESTIONS, version="before", blocks=1, max_len=4)
    assert ev.version == 1 and ev.options == {"blocks": 1, "max_len": 4}
    assert [r.predicted for r in ev.results] == ["Oregon", "Greece", "Peru", "Norway"]


def test_cli_compares_versions(planted, tmp_path, capsys):
    qfile = tmp_path / "questions.jsonl"
    qfile.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    assert main(["eval", str(planted), str(qfile), "--version", "1", "--version", "2",
                 "-q"]) == 0
    out = capsys.readouterr().out
    assert "4 questions" in out and "relation-macro" in out and "located_in" in out
    assert "version 2 bm25 against version 1 bm25: -25.0 points" in out
    assert "by relation: capital +0 -1" in out
    # one version, two retrievals: the second against the first
    assert main(["eval", str(planted), str(qfile), "--retrieval", "bm25,dense", "-q"]) == 0
    assert "version 2 dense against version 2 bm25" in capsys.readouterr().out
    assert main(["eval", str(planted), str(qfile), "--version", "1", "--json",
                 "--questions-out", "-q"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got[0]["micro"] == pytest.approx(50.0) and got[0]["version"] == 1
    assert [q["predicted"] for q in got[0]["questions"]] == ["Oregon", "Greece", "Peru", "Norway"]
    assert got[0]["comparison"] is None
    assert main(["eval", str(planted), str(qfile), "--version", "1", "--version", "2",
                 "--json", "-q"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got[0]["comparison"] is None and got[1]["questions"] is None
    assert got[1]["comparison"]["lost"] == 1 and got[1]["comparison"]["p_value"] == 1.0
    assert main(["eval", str(planted), str(qfile), "--option", "blocks"]) == 2
    assert "NAME=VALUE" in capsys.readouterr().err
    assert main(["eval", str(planted), str(qfile), "--option", "max_len=5"]) == 2
    assert "repeats the flag --max-len" in capsys.readouterr().err
    assert main(["query", str(planted), "Salem is in [MASK].", "--option", "k=5"]) == 2
    assert "repeats the flag -k" in capsys.readouterr().err
    assert main(["eval", str(planted), str(qfile), "--retrieval", ","]) == 2
    assert "names no retrieval" in capsys.readouterr().err
    qfile.write_text('{"query": "no mask here", "answers": ["x"]}\n')
    assert main(["eval", str(planted), str(qfile)]) == 2
    assert "line 1" in capsys.readouterr().err


def _commit_during(monkeypatch, db, path, at: int, ref: int) -> list[int]:
    """Another handle restores version ``ref`` just before ``db``'s ``at``-th question is
    asked (a commit while an evaluation runs); returns the list the new version goes to."""
    real, asked, committed = db.fill_mask, [0], []

    def fill_mask(*args, **kwargs):
        asked[0] += 1
        if asked[0] == at:
            with npmdb.open(path, progress=False) as writer:
                committed.append(writer.restore(ref))
        return real(*args, **kwargs)

    monkeypatch.setattr(db, "fill_mask", fill_mask)
    return committed


def test_a_commit_during_an_evaluation_changes_no_answer(planted, monkeypatch):
    same = [dict(q, id=str(i)) for i, q in enumerate([QUESTIONS[0]] * 4)]
    with npmdb.open(planted, progress=False) as db:
        committed = _commit_during(monkeypatch, db, planted, at=3, ref=1)
        ev = npmdb.evaluate(db, same)
    # every question at version 2 (HEAD when the call started), where Salem's entry is gone
    assert committed == [3] and ev.version == 2
    assert not any(r.predicted == "Oregon" for r in ev.results)


def test_keep_if_better_judges_the_head_it_found(planted, monkeypatch):
    with npmdb.open(planted, progress=False) as db:
        trained = db.restore(1)  # answers 50 % against version 2's 25 %
        # another writer puts version 2's documents back while HEAD's questions are asked
        committed = _commit_during(monkeypatch, db, planted, at=len(QUESTIONS) + 2, ref=2)
        d = keep_if_better(db, QUESTIONS, before=2, trained=[trained], progress=False)
    assert committed == [trained + 1]
    assert d.kept and d.comparison.after.version == trained
    assert d.comparison.delta == pytest.approx(25.0)
    assert f"HEAD is now version {trained + 1}" in d.reason


def test_options_that_change_the_scored_answer_are_refused(planted):
    with npmdb.open(planted, progress=False) as db:
        with pytest.raises(npmdb.ProgrammingError, match="offset= would score a later one"):
            npmdb.evaluate(db, QUESTIONS, offset=1)
        with pytest.raises(npmdb.ProgrammingError, match="answers with document ids"):
            npmdb.evaluate(db, QUESTIONS, group_by="document")


def test_an_evaluation_is_labelled_with_the_retrieval_that_asked(planted):
    with npmdb.open(planted, progress=False) as db:  # None: fill_mask's default
        assert npmdb.evaluate(db, QUESTIONS, retrieval=None, version=1).retrieval == "bm25"


def test_questions_hold_text_only(tmp_path):
    query = "Salem is in [MASK]."
    for kwargs, what in ((dict(query="\ud800 is in [MASK]."), "the query"),
                         (dict(answers=("Ore\udc80gon",)), "an answer"),
                         (dict(relation="cap\ud800"), "the relation"),
                         (dict(id="q\ud800"), "the id")):
        with pytest.raises(npmdb.ProgrammingError, match=f"{what} contains a lone surrogate"):
            Question(**dict(dict(query=query, answers=("Oregon",)), **kwargs))
    # in a file (a JSON escape, valid UTF-8): the file and the line, when it is read
    qfile = tmp_path / "q.jsonl"
    qfile.write_text(json.dumps(QUESTIONS[0]) + "\n"
                     + '{"query": "a [MASK].", "answers": ["x"], "id": "\\udc80"}\n')
    with pytest.raises(npmdb.DataError, match=r"q\.jsonl, line 2: .*the id contains a lone"):
        load_questions(qfile)


def test_questions_have_text_labels_and_a_whole_length():
    query = "Salem is in [MASK]."
    for kwargs, match in ((dict(length=True), "length must be a whole number"),
                          (dict(id=7), "id must be a string"),
                          (dict(relation=None), "relation must be a string")):
        with pytest.raises(npmdb.ProgrammingError, match=match):
            Question(query, ("Oregon",), **kwargs)
    row = {"query": query, "answers": ["Oregon"]}
    for extra, match in (({"answer_ngram": False}, "answer_ngram must be"),
                         ({"answer_ngram": -1}, "answer_ngram must be"),
                         ({"relation": ["a", "b"]}, "relation must be a string or a number")):
        with pytest.raises(npmdb.ProgrammingError, match=match):
            Question.from_dict(dict(row, **extra))
    assert Question.from_dict(dict(row, relation=17, id=None)).relation == "17"


def _question_file(tmp_path):
    qfile = tmp_path / "questions.jsonl"
    qfile.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    return qfile


def _count_runs(monkeypatch) -> list[dict]:
    """The keyword arguments of each ``npmdb.evaluate`` call (the real one) from now."""
    real, runs = npmdb.evaluate, []
    monkeypatch.setattr(npmdb, "evaluate", lambda *a, **k: runs.append(k) or real(*a, **k))
    return runs


def test_cli_eval_checks_every_run_before_the_first(planted, tmp_path, capsys, monkeypatch):
    qfile, runs = _question_file(tmp_path), _count_runs(monkeypatch)
    for extra, said in ((["--retrieval", "bm25,bmm25"], "'bmm25'"),
                        (["--version", "1", "--version", "99"], "no version 99"),
                        (["--option", "offset=1"], "offset=")):
        assert main(["eval", str(planted), str(qfile), "-q", *extra]) == 2
        assert said in capsys.readouterr().err and runs == []


def test_cli_eval_runs_each_retrieval_and_version_once(planted, tmp_path, capsys,
                                                       monkeypatch):
    qfile, runs = _question_file(tmp_path), _count_runs(monkeypatch)
    with npmdb.open(planted, progress=False) as db:
        db.tag("one", 1)  # a tag of version 1 is version 1
    assert main(["eval", str(planted), str(qfile), "-q", "--retrieval", "bm25,bm25",
                 "--version", "1", "--version", "one", "--version", "2"]) == 0
    out = capsys.readouterr().out
    assert [(k["version"], k["retrieval"]) for k in runs] == [(1, "bm25"), (2, "bm25")]
    assert out.count("version 2 bm25 against version 1 bm25") == 1
    assert "version 1 bm25 against" not in out


def test_cli_eval_questions_out_needs_json(planted, tmp_path, capsys):
    # the per-question rows are part of the JSON output only
    assert main(["eval", str(planted), str(_question_file(tmp_path)), "-q",
                 "--questions-out"]) == 2
    assert "give --json too" in capsys.readouterr().err


def _quality_data(tmp_path, rows) -> list[str]:
    data = tmp_path / "data"
    data.mkdir()
    (data / "cloze.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return ["--data", str(data), "--tasks", "cloze", "--modes", "bm25"]


@pytest.fixture()
def quality_args(planted, tmp_path, monkeypatch) -> list[str]:
    """``bench.quality`` on the planted database and its questions, writing to tmp_path."""
    from bench import common

    monkeypatch.setattr(common, "RESULTS", tmp_path / "results")
    return _quality_data(tmp_path, QUESTIONS) + ["--db", str(planted), "--name", "t"]


@pytest.mark.parametrize("option, said", [("k=5", "repeats the flag --k"),
                                          ("max_len=5", "each task sets it"),
                                          ("version=1", "repeats the flag --version")])
def test_bench_quality_refuses_options_it_sets(quality_args, option, said, capsys):
    from bench import quality

    with pytest.raises(SystemExit) as exc:
        quality.main(quality_args + ["--option", option])
    assert exc.value.code == 2 and said in capsys.readouterr().err


@pytest.mark.parametrize("extra, said", [(["--version", "99"], "no version 99"),
                                         (["--option", "offset=1"], "offset=")])
def test_bench_quality_reports_errors_as_usage_errors(quality_args, extra, said, capsys):
    from bench import quality

    with pytest.raises(SystemExit) as exc:
        quality.main(quality_args + extra)
    assert exc.value.code == 2 and said in capsys.readouterr().err


def test_bench_quality_skips_an_empty_split(quality_args, capsys):
    from bench import quality

    assert quality.main(quality_args + ["--split", "held-out"]) == 0
    captured = capsys.readouterr()
    assert "cloze: no queries in --split held-out" in captured.err
    assert "cloze: no queries in this split (n = 0)" in captured.out
    assert quality.main(quality_args + ["--version", "1"]) == 0
    assert "| cloze | bm25 | 4 | " in capsys.readouterr().out


def test_real_encoder_matches_fill_mask(real_db, sample_cloze):
    qs = sample_cloze[:12]
    ev = npmdb.evaluate(real_db, qs, retrieval="bm25", progress=False)
    for q, r in zip(qs, ev.results):
        top = real_db.fill_mask(q["query"], retrieval="bm25", top=1).top
        assert r.predicted == (top.text if top else None)
        assert r.correct == exact_match(r.predicted, q["answers"])
    assert ev.micro == pytest.approx(100.0 * sum(r.correct for r in ev.results) / len(qs))


@pytest.mark.slow
def test_demo_reports_how_often_it_is_right(real_db_path, tmp_path, capsys):
    """`npmdb demo` (the README's first command) on a database that already holds part of
    the sample: it answers its queries both ways, then scores the bundled cloze questions
    as `npmdb eval` does and says that queries ask with bm25 by default."""
    import shutil

    path = tmp_path / "demo.npmdb"
    shutil.copytree(real_db_path, path)
    assert main(["demo", str(path), "-q"]) == 0
    out = capsys.readouterr().out
    assert "using the existing database" in out
    assert "== retrieval=bm25" in out and "== retrieval=dense" in out
    assert "Salem is the capital of [MASK]." in out
    assert "how often is the top answer right?" in out and "365 cloze questions" in out
    rows = [line.split() for line in out.splitlines() if line.startswith("1 ")]
    assert [r[2] for r in rows] == ["bm25", "dense"]
    assert all(0.0 <= float(r[3]) <= 100.0 for r in rows)
    assert "Queries retrieve BM25 blocks by default" in out


def test_the_demo_asks_about_entities_the_bundled_sample_holds(sample_corpus):
    """The demo's own questions come before the sample's cloze questions, so they are the
    first answers a new user reads: each asks about an entity that has its own document in
    the sample (NPM's "Hagios Demetrios is located in [MASK]." has none there, and got
    "Java")."""
    from npmdb.cli import DEMO_QUERIES

    titles = {d["title"] for d in sample_corpus}
    for q in DEMO_QUERIES:
        subject = q.split(" is ")[0]
        assert subject in titles, f"{q!r}: the sample has no document titled {subject!r}"


def test_cli_keep_if_better_interrupted_keeps_no_unchecked_version(tiny_db_path, sample_cloze,
                                                                   tmp_path, capsys,
                                                                   monkeypatch):
    """Ctrl-C while --keep-if-better compared left the trained version as HEAD, unchecked,
    and a later --keep-if-better took it for the version before training."""
    import npmdb.evaluation as E

    path, start, qfile = _copy_with_questions(tiny_db_path, sample_cloze, tmp_path, 5)

    def interrupted(*_a, **_k):
        raise KeyboardInterrupt

    monkeypatch.setattr(E, "keep_if_better", interrupted)
    assert main(["train", str(path), "--steps", "2", "--batch-blocks", "8",
                 "--keep-if-better", str(qfile), "-q"]) == 130
    err = capsys.readouterr().err
    assert f"restores version {start} (HEAD before training)" in err
    with npmdb.open(path, progress=False) as db:
        assert db.version == start + 2 and db.stats()["generation"] == 0
        assert db.versions()[-2]["generation"] == 1   # the trained version stays readable
