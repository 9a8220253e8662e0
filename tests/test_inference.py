"""Inference defaults that follow NPM's released code (issue: answers worth reading)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from npmdb.boundaries import BREAK, is_break, token_flags
from npmdb.query.scoring import assemble_spans

CORPUS = [
    {"id": "rome", "title": "Rome", "text": "The race began in Rome. Milan was next, then Turin."},
    {"id": "berlin", "title": "Berlin", "text": "Berlin, Germany hosts many artists (painters; poets)."},
    {"id": "dc", "title": "Washington", "text": "Washington, D.C. is the U.S. capital: a planned city."},
    {"id": "misc", "title": "Misc", "text": "An e-mail costs 3.5 cents - or less! Really? Yes."},
]


@pytest.mark.parametrize("text, marks", [
    ("Rome. Milan was next", ["."]),
    ("X): the capital of Y; Z", [")", ":", ";"]),
    ("U.S. Army in Washington, D.C. is", [".", ",", "."]),   # only dots before a space
    ("an e-mail of 3.5 cents - or a/b", ["-"]),              # the spaced dash only
])
def test_break_flags_mark_clause_punctuation(text, marks):
    offs, got = [], []
    for m in re.finditer(r"\w+|[^\w\s]", text):
        offs.append((m.start(), m.end()))
    flags = token_flags(text, np.array(offs, dtype=np.int32))
    got = [text[s:e] for (s, e), f in zip(offs, flags) if f & BREAK]
    assert got == marks
    assert is_break("end.", 3, 4) and not is_break("a.b", 1, 2)


def test_clean_spans_never_hold_a_break():
    #        0      1   2     3      4
    toks = ["Rome", ".", "Milan", "was", "next"]
    text = " ".join(toks)
    offs, pos = [], 0
    for t in toks:
        offs.append((pos, pos + len(t)))
        pos += len(t) + 1
    flags = token_flags(text, np.array(offs, dtype=np.int32))
    n = len(toks)
    bs, be = np.zeros(2 * n, np.int64), np.full(2 * n, n, np.int64)
    spans = assemble_spans(np.arange(n), np.arange(n), flags, bs, be, max_len=5)
    assert [0, 2] not in spans.tolist()           # "Rome . Milan" crosses the full stop
    assert [0, 0] in spans.tolist() and [2, 2] in spans.tolist()
    raw = assemble_spans(np.arange(n), np.arange(n), flags, bs, be, max_len=5,
                         clean_edges=False)
    assert [0, 2] in raw.tolist()                 # clean_edges=False keeps NPM's raw spans


def test_answers_do_not_cross_clause_punctuation(tmp_path, tiny_encoder):
    import npmdb

    with npmdb.open(tmp_path / "db", encoder=tiny_encoder, progress=False) as db:
        db.add(CORPUS)
        seen = 0
        for q in ("The race began in [MASK].", "[MASK] hosts many artists.",
                  "Washington is the [MASK] capital.", "An e-mail costs [MASK] cents."):
            for retrieval in ("dense", "bm25"):
                res = db.fill_mask(q, retrieval=retrieval, top=50, max_len=10)
                for a in res:
                    seen += 1
                    assert not re.search(r"[,;:!?()]|\.\s", a.text), a.text
        assert seen > 20


YES_NO = [
    {"id": "q1", "title": "Sky", "text": "Is the sky green? No, the sky is blue."},
    {"id": "q2", "title": "Grass", "text": "Is the grass green? Yes, the grass is green."},
    {"id": "q3", "title": "Snow", "text": "Is snow hot? No. Snow is cold, and no one doubts it."},
]


@pytest.mark.parametrize("retrieval, exact", [("bm25", False), ("dense", False),
                                               ("dense", True), ("hybrid", False)])
def test_classify_scores_a_stopword_label(tmp_path, tiny_encoder, retrieval, exact):
    """NPM's RTE prompts answer "yes" / "no"; "no" is a stopword, which clean candidates
    (and the ANN indexes) leave out, so it used to score 0 whatever the corpus said."""
    import npmdb

    with npmdb.open(tmp_path / "db", encoder=tiny_encoder, progress=False) as db:
        db.add(YES_NO)
        res = db.classify("Is the sky green? [MASK].", {"yes": ["yes"], "no": ["no"]},
                          retrieval=retrieval, exact=exact, k=64)
        scores = {a.text: a.score for a in res}
        assert scores["no"] > 0 and scores["yes"] > 0, scores
        assert "words: any" in res.plan
        if retrieval != "bm25":
            assert "exact scan" in res.plan          # the ANN indexes hold no stopwords
        # a label that is no stopword keeps the clean plan
        res = db.classify("Is the sky green? [MASK].", {"pos": ["blue"], "neg": ["cold"]},
                          retrieval=retrieval, exact=exact, k=64)
        assert "words: any" not in res.plan


def test_content_free_is_the_sentence_holding_the_mask():
    from npmdb.query.calibration import content_free

    assert content_free("A gorgeous, witty film. It was [MASK].") == "It was [MASK]."
    assert content_free("Dull! Slow? The movie was [MASK] overall.") == \
        "The movie was [MASK] overall."
    assert content_free("The movie was [MASK].") is None          # nothing to remove


def test_calibration_divides_by_the_templates_prior():
    from npmdb.query.calibration import calibrate
    from npmdb.query.result import Answer, Result

    def result(q, great, terrible):
        return Result((Answer("positive", great, 3), Answer("negative", terrible, 1)), query=q)

    # the review leans "great" 0.6 : 0.4, but the template alone gives 0.9 : 0.1
    res = calibrate(result("Bad. It was [MASK].", 6.0, 4.0), result("It was [MASK].", 9.0, 1.0))
    assert [a.text for a in res.answers] == ["negative", "positive"]
    assert abs(sum(a.score for a in res.answers) - 1.0) < 1e-9
    assert res.info["calibrated"]["template"] == "It was [MASK]."


def test_classify_calibrate_runs_the_template(tmp_path, tiny_encoder):
    import npmdb

    with npmdb.open(tmp_path / "db", encoder=tiny_encoder, progress=False) as db:
        db.add(CORPUS + YES_NO + [{"id": "r", "text": "A great film. A great cast. A terrible end."}])
        labels = {"positive": ["great"], "negative": ["terrible"]}
        res = db.classify("A dull, slow film. It was [MASK].", labels, retrieval="bm25",
                          calibrate=True)
        assert res.info["calibrated"]["template"] == "It was [MASK]."
        assert abs(sum(a.score for a in res) - 1.0) < 1e-9
        plain = db.classify("It was [MASK].", labels, retrieval="bm25", calibrate=True)
        assert "calibrated" not in plain.info                    # nothing to remove


def test_not_in_query_drops_answers_that_repeat_the_query(tmp_path, tiny_encoder):
    import npmdb
    from npmdb.query.text import query_ngrams

    assert "capital of" in query_ngrams("The capital of [MASK] is Rome.")
    assert "of is" not in query_ngrams("The capital of [MASK] is Rome.")   # not across the mask
    with npmdb.open(tmp_path / "db", encoder=tiny_encoder, progress=False) as db:
        db.add(CORPUS)
        q = "Berlin hosts many artists in [MASK]."
        plain = [a.text for a in db.fill_mask(q, retrieval="bm25", top=200, not_in_query=False)]
        kept = db.fill_mask(q, retrieval="bm25", top=200)              # the default
        grams = query_ngrams(q)
        assert any(t.casefold() in grams for t in plain)          # the repeats were there
        assert [a.text for a in kept] == [t for t in plain if t.casefold() not in grams]
        assert "phrase not in the query" in kept.plan


def test_query_ngrams_stay_linear_in_a_long_query():
    """Runs longer than an answer can be are never built: a 20,000-word query once made
    every run (quadratic in words, minutes per query)."""
    from npmdb.query.text import query_ngrams

    text = " ".join(f"w{i}" for i in range(20000)) + " [MASK]."
    grams = query_ngrams(text, 10)
    assert "w5 w6 w7" in grams and "w5 w6 w7 w8 w9 w10 w11 w12 w13 w14 w15" not in grams
    assert len(grams) <= 20000 * 10


def _strip_break_bits(db) -> int:
    """Rewrite every segment's stored flags without the BREAK bit, as a database written
    before that bit exists (the format is otherwise the same); returns tokens touched."""
    from npmdb.storage import format as F

    touched = 0

    def strip(txn):
        nonlocal touched
        cur = txn.cursor(db=db.env.dbs["segcols"])
        for key, raw in list(cur):
            if key[4:] != b"flags":
                continue
            flags = F.unpack_array(raw).copy()
            touched += int((flags & BREAK).astype(bool).sum())
            txn.put(key, F.pack_array(flags & np.uint8(~BREAK & 0xFF)), db=db.env.dbs["segcols"])
    db.env.write(strip)
    return touched


def test_spaced_breaks_from_offsets_alone():
    from npmdb.query.scoring import lacks_breaks, spaced_breaks

    for text, marks in [("Rome. Milan was next", ["."]),
                        # ")" touches words on neither side; the "." after it breaks
                        ("Berlin, Germany (painters; poets).", [",", "(", ";", "."]),
                        ("the U.S. Army", ["."]), ("an e-mail of 3.5 cents - or a/b", ["-"])]:
        offs = np.array([(m.start(), m.end()) for m in re.finditer(r"\w+|[^\w\s]", text)],
                        dtype=np.int32)
        stored = token_flags(text, offs) & np.uint8(~BREAK & 0xFF)   # an old segment's flags
        assert lacks_breaks(stored) and not lacks_breaks(token_flags(text, offs))
        got = spaced_breaks(stored, offs, np.array([0, len(offs)]))
        assert [text[s:e] for (s, e), f in zip(offs, got) if f & BREAK] == marks, text
        assert ((got & np.uint8(~BREAK & 0xFF)) == stored).all()     # only BREAK is added


def test_old_database_without_break_bits_answers_clean_spans(tmp_path, tiny_encoder):
    """A database stored before the BREAK bit keeps working, and its answers do not cross
    "." or "," either: the breaks are derived from the stored offsets at query time."""
    import npmdb

    path = tmp_path / "db"
    with npmdb.open(path, encoder=tiny_encoder, progress=False) as db:
        db.add(CORPUS)
        db.add([{"id": "more", "text": "Turin, then Genoa. Then Pisa; then Rome."}])  # 2 segments
        assert _strip_break_bits(db) > 10
    with npmdb.open(path, progress=False) as db:
        seen = 0
        for q in ("The race began in [MASK].", "[MASK] hosts many artists.",
                  "Then [MASK] came."):
            for retrieval in ("dense", "bm25"):
                for a in db.fill_mask(q, retrieval=retrieval, top=50, max_len=10):
                    seen += 1
                    assert not re.search(r"[,;:!?()]|\.\s", a.text), a.text
        assert seen > 20
        raw = [a.text for a in db.fill_mask("The race began in [MASK].", retrieval="bm25",
                                            top=500, clean_edges=False)]
        assert any(re.search(r"[,;]|\.\s", t) for t in raw)   # what the rule keeps out

