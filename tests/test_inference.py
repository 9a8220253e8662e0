"""Inference defaults that follow NPM's released code (issue: answers worth reading)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from npmdb.boundaries import BREAK, VALID_END, VALID_START, is_break, token_flags
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
    ("named 'Xray' by, the ‘Finn’ one", ["'", "'", ",", "‘", "’"]),   # single quotes
    ("don't O'Brien's rock'n'roll", []),                     # apostrophes inside words
    ("by Eric S. Raymond and J. R. R. Tolkien. The end", ["."]),  # initials do not break
    ("vitamin C. They won World War I. The end", [".", "."]),   # sentence ends, no names
    ("The Farmers' Almanac, Jones' book", [","]),           # plural possessives
])
def test_break_flags_mark_clause_punctuation(text, marks):
    offs, got = [], []
    for m in re.finditer(r"\w+|[^\w\s]", text):
        offs.append((m.start(), m.end()))
    flags = token_flags(text, np.array(offs, dtype=np.int32))
    got = [text[s:e] for (s, e), f in zip(offs, flags) if f & BREAK]
    assert got == marks
    assert is_break("end.", 3, 4) and not is_break("a.b", 1, 2)


def _edges(text: str) -> list[str]:
    """Each word-like token of ``text`` with ``<`` where a phrase may start, ``>`` where
    it may end."""
    offs = [(m.start(), m.end()) for m in re.finditer(r"\w+|[^\w\s]", text)]
    flags = token_flags(text, np.array(offs, dtype=np.int32))
    return [f"{text[s:e]}{'<' if f & VALID_START else ''}{'>' if f & VALID_END else ''}"
            for (s, e), f in zip(offs, flags)]


def test_phrases_do_not_start_or_end_inside_a_joined_word():
    """"Hewlett" and "Packard" alone were answers from "Hewlett-Packard", "pee" from
    "kuhs'pee", "Free" from "Free/Open/NetBSD"; a possessive's word still ends ("Oregon")."""
    assert _edges("bought by Hewlett-Packard in 2002") == [
        "bought<>", "by", "Hewlett<", "-", "Packard>", "in", "2002<>"]
    assert _edges("kuhs'pee and Free/Open/NetBSD") == [
        "kuhs<", "'", "pee>", "and", "Free<", "/", "Open", "/", "NetBSD>"]
    assert _edges("Oregon's capital, O'Brien") == [
        "Oregon<>", "'", "s", "capital<>", ",", "O<", "'", "Brien>"]


def test_a_name_with_initials_is_one_phrase_and_an_initial_ends_none():
    """"Eric S. Raymond": the full stop after an initial is no sentence end (the answers
    were "Eric S" and "Raymond"), and "S" is not where a name ends."""
    assert _edges("by Eric S. Raymond") == ["by", "Eric<>", "S<", ".", "Raymond<>"]
    assert not is_break("Eric S. Raymond", 6, 7)
    assert is_break("in Paris. Then", 8, 9) and is_break("World War I. the", 11, 12)
    assert _edges("with vitamin C. They") == ["with", "vitamin<>", "C<>", ".", "They"]


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
        # nothing to remove: the scores stay plain, and the result says so
        assert plain.info["calibrated"]["template"] is None
        assert "nothing precedes" in plain.info["calibrated"]["skipped"]


def test_not_in_query_drops_answers_that_repeat_the_query(tmp_path, tiny_encoder):
    import npmdb
    from npmdb.query.text import query_ngrams

    assert "capital of" in query_ngrams("The capital of [MASK] is Rome.")
    assert "of is" not in query_ngrams("The capital of [MASK] is Rome.")   # not across the mask
    with npmdb.open(tmp_path / "db", encoder=tiny_encoder, progress=False) as db:
        db.add(CORPUS)
        q = "Berlin hosts many artists in [MASK]."
        plain = [a.text for a in db.fill_mask(q, retrieval="bm25", top=200, not_in_query=False,
                                              no_query_words=False)]
        kept = db.fill_mask(q, retrieval="bm25", top=200, no_query_words=False)
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
                        ("the U.S. army", ["."]), ("an e-mail of 3.5 cents - or a/b", ["-"])]:
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


TITLED = [
    {"id": "mai", "title": "Maiduguri", "text": "A city of the Borno state in Nigeria."},
    {"id": "kano", "title": "Kano", "text": "Kano is a city in Nigeria."},
    {"id": "box", "title": "Boxes", "text": "It is in the box. It is in the bag, it is in."},
    {"id": "bag", "title": "Bags", "text": "It is in the bag, in the bag."},
]


def test_bm25_text_cuts_a_question_at_its_question_mark():
    from npmdb.query.text import bm25_text

    assert bm25_text("Where is Maiduguri? It is in [MASK].", question=True) == \
        "Where is Maiduguri?"
    assert bm25_text("Where is Maiduguri? It is in [MASK].") == "Where is Maiduguri? It is in  ."
    assert bm25_text("Is [MASK] big? Yes.", question=True) == "Is   big? Yes."  # mask asked
    assert bm25_text("Maiduguri is in [MASK].", question=True) == "Maiduguri is in  ."


def _add(db, docs, split: bool) -> None:
    """``docs`` as one segment, or (``split``) as two: BM25 then uses global IDFs."""
    for part in ((docs[:2], docs[2:]) if split else (docs,)):
        db.add(part)


@pytest.mark.parametrize("split", [False, True])   # one segment / global IDFs over two
def test_bm25_title_and_question_options(tmp_path, tiny_encoder, split):
    import npmdb

    with npmdb.open(tmp_path / "db", encoder=tiny_encoder, progress=False) as db:
        _add(db, TITLED, split)

        def docs(q, **kw):
            res = db.fill_mask(q, retrieval="bm25", blocks=1, top=100, evidence=100, **kw)
            return {e.doc_id for a in res for e in a.evidence}, res.plan

        # "maiduguri" is only in a title: the text alone finds another block
        got, plan = docs("Maiduguri is a city in [MASK].", bm25_title=False)
        assert got and "mai" not in got and "text+title" not in plan
        got, plan = docs("Maiduguri is a city in [MASK].")          # the default
        assert got == {"mai"} and "fields: text+title" in plan
        assert [h["doc_id"] for h in db.search("Maiduguri city", limit=1, title=True)] == ["mai"]
        assert [h["doc_id"] for h in db.search("Maiduguri city", limit=1)] != ["mai"]
        # the words after the "?" pull in the block that repeats them
        q = "Where is Maiduguri? It is in [MASK]."
        got = docs(q)[0]
        assert got and "mai" not in got
        got, plan = docs(q, bm25_question=True)
        assert got == {"mai"} and "question only" in plan
        with pytest.raises(npmdb.ProgrammingError, match="bm25_title must be True or False"):
            db.fill_mask(q, bm25_title="yes")
        with pytest.raises(npmdb.ProgrammingError, match="bm25_question"):
            db.classify(q, {"a": ["x"]}, bm25_question=1)
        with pytest.raises(npmdb.ProgrammingError, match="title must be True or False"):
            db.search("x", title="yes")


def test_sql_with_bm25_options_runs_as_fill_mask(tmp_path, tiny_encoder):
    import npmdb

    with npmdb.open(tmp_path / "db", encoder=tiny_encoder, progress=False) as db:
        db.add(TITLED)
        q = "Where is Maiduguri? It is in [MASK]."
        for title, question in ((True, False), (False, False), (True, True)):
            res = db.sql(f"SELECT phrase, score FROM MASKED(?) USING bm25(blocks => 1) "
                         f"WITH bm25_title = {title}, bm25_question = {question} LIMIT 20", [q])
            want = db.fill_mask(q, retrieval="bm25", blocks=1, top=20, bm25_title=title,
                                bm25_question=question)
            assert [r[0] for r in res.rows] == [a.text for a in want]
        plan = db.sql("EXPLAIN SELECT * FROM MASKED(?) USING bm25 WITH bm25_title = FALSE, "
                      "bm25_question = TRUE", [q]).plan
        assert "bm25_title=false, bm25_question=true" in plan and "question only" in plan
        with pytest.raises(npmdb.ProgrammingError, match="bm25_title"):
            db.sql("SELECT * FROM MASKED(?) WITH bm25_title = 3", [q])


# "Madrid in Russian is [MASK]." finds the gloss of "Russian" by its title alone; the pair's
# document and Madrid's gloss match in their text.
PAIRS = [
    {"id": "ru", "title": "Russian", "text": "a native or inhabitant of Russia; the Slavic "
                                             "language of Russia and its neighbours"},
    {"id": "pair", "title": "Мадрид", "text": "Мадрид: Madrid"},
    {"id": "mad", "title": "Madrid", "text": "Madrid: the capital and largest city of Spain"},
    {"id": "far", "title": "Lima", "text": "Lima: the capital of Peru, a city of the coast"},
]


def _prior_answers(db, q, **kw):
    return db.fill_mask(q, retrieval="bm25", blocks=3, top=100, evidence=100, **kw)


@pytest.mark.parametrize("split", [False, True])   # one segment / global IDFs over two
def test_bm25_prior_weighs_each_block_by_its_text_score(tmp_path, tiny_encoder, split):
    import npmdb

    q = "Madrid in Russian is [MASK]."
    with npmdb.open(tmp_path / "db", encoder=tiny_encoder, progress=False) as db:
        _add(db, PAIRS, split)
        text = {h["doc_id"]: h["score"] for h in db.search("Madrid Russian", limit=4)}
        assert "ru" not in text and text["pair"] > text["mad"] > 0  # the title-only match
        npm = _prior_answers(db, q, bm25_prior=0)
        assert "text scores" not in npm.plan and "bm25_prior" not in npm.plan
        res = _prior_answers(db, q)                                      # the default
        assert "BM25Blocks (blocks=3, fields: text+title, text scores)" in res.plan
        assert "bm25_prior=0.5" in res.plan

        def mass(r):  # each document's share of the answers' scores
            got: dict[str, float] = {}
            for a in r:
                for e in a.evidence:
                    got[e.doc_id] = got.get(e.doc_id, 0.0) + e.score
            return got

        m0, m = mass(npm), mass(res)
        assert set(m0) == set(m) == {"ru", "pair", "mad"}   # the same three blocks
        # the title-only block loses mass and the best text match gains
        assert m["ru"] < m0["ru"] and m["pair"] / m["mad"] > m0["pair"] / m0["mad"]
        big = mass(_prior_answers(db, q, bm25_prior=100))
        assert big["pair"] > 0.99 * sum(big.values())
        assert db.fill_mask(q, retrieval="bm25", bm25_prior=100).top.text == "Мадрид"
        # dense retrieval has no blocks: the option changes nothing there
        dense = [(a.text, a.score) for a in db.fill_mask(q, top=10, retrieval="dense")]
        assert dense == [(a.text, a.score) for a in db.fill_mask(q, top=10, retrieval="dense",
                                                                 bm25_prior=7)]
        for bad, match in ((-1, "bm25_prior must be a finite number in"),
                           (float("nan"), "bm25_prior must be a finite number in"),
                           ("0.5", "bm25_prior must be a number"),
                           (True, "bm25_prior must be a number")):
            with pytest.raises(npmdb.ProgrammingError, match=match):
                db.fill_mask(q, retrieval="bm25", bm25_prior=bad)
        with pytest.raises(npmdb.ProgrammingError, match="bm25_prior"):
            db.classify(q, {"a": ["x"]}, retrieval="bm25", bm25_prior=1.0)


def test_sql_with_bm25_prior_runs_as_fill_mask(tmp_path, tiny_encoder):
    import npmdb

    q = "Madrid in Russian is [MASK]."
    with npmdb.open(tmp_path / "db", encoder=tiny_encoder, progress=False) as db:
        db.add(PAIRS)
        for w in (0, 0.5, 3):
            res = db.sql(f"SELECT phrase, score FROM MASKED(?) USING bm25 WITH bm25_prior = {w} "
                         "LIMIT 20", [q])
            want = db.fill_mask(q, retrieval="bm25", top=20, bm25_prior=w)
            assert [(r[0], r[1]) for r in res.rows] == [(a.text, a.score) for a in want]
        plan = db.sql("EXPLAIN SELECT * FROM MASKED(?) USING hybrid WITH bm25_prior = 2",
                      [q]).plan
        assert "Score (npm, tau=1.0, bm25_prior=2)" in plan and "text scores" in plan
        with pytest.raises(npmdb.QueryParseError, match="bm25_prior is not used by dense"):
            db.sql("EXPLAIN SELECT * FROM MASKED(?) USING dense WITH bm25_prior = 2", [q])
        plan = db.sql("EXPLAIN SELECT * FROM MASKED(?) USING dense", [q]).plan
        assert "bm25_prior" not in plan                     # dense: no blocks to weigh
        plan = db.sql("EXPLAIN SELECT * FROM MASKED(?) WITH bm25_prior = 2", [q]).plan
        assert "bm25_prior=2" in plan                       # bm25, the default
        with pytest.raises(npmdb.ProgrammingError, match="bm25_prior"):
            db.sql("SELECT * FROM MASKED(?) WITH bm25_prior = 'high'", [q])
        with pytest.raises(npmdb.ProgrammingError, match="bm25_prior"):
            db.sql("SELECT * FROM CLASSIFY(?, LABELS(a = 'x')) WITH bm25_prior = 1", [q])


def test_no_query_words_drops_answers_that_copy_a_word_of_the_query(tmp_path, tiny_encoder):
    """Answers like "capital of Moldova" for "Where is Moldova? It is in [MASK]." hold the
    query's subject without being a run of the query's words: not_in_query keeps them,
    no_query_words (the default) drops them; stopwords of the query do not count."""
    import npmdb
    from npmdb.query.text import query_content_words, words_of

    assert query_content_words("Where is Moldova? It is in [MASK].") == {"moldova"}
    corpus = [{"id": "md", "title": "Moldova", "text": "Chisinau is the capital of Moldova, "
               "a country in Europe. Moldova borders Romania and is in Eastern Europe."}]
    with npmdb.open(tmp_path / "db", encoder=tiny_encoder, progress=False) as db:
        db.add(corpus)
        q = "Where is Moldova? It is in [MASK]."
        runs_only = [a.text for a in db.fill_mask(q, retrieval="bm25", top=500,
                                                  no_query_words=False)]
        assert any("moldova" in words_of(t).split() for t in runs_only)    # "capital of Moldova"
        res = db.fill_mask(q, retrieval="bm25", top=500)                     # the default
        got = [a.text for a in res]
        assert got == [t for t in runs_only if "moldova" not in words_of(t).split()]
        assert "Europe" in got and "Eastern Europe" in got
        assert "no word of the query" in res.plan
        sql = db.sql("SELECT phrase FROM MASKED(?) USING bm25 WITH no_query_words = FALSE "
                     "LIMIT 500", [q])
        assert [r[0] for r in sql.rows] == runs_only
        with pytest.raises(npmdb.ProgrammingError, match="no_query_words must be True or False"):
            db.fill_mask(q, no_query_words="no")


def test_calibration_runs_in_the_plan_for_sql_too(tmp_path, tiny_encoder):
    """classify(calibrate=True) and SQL's CLASSIFY ... WITH calibrate = TRUE give the same
    calibrated scores, the ones calibrate() computes from the two plain results; ORDER BY
    and WHERE see the calibrated scores."""
    import npmdb
    from npmdb.query.calibration import calibrate

    with npmdb.open(tmp_path / "db", encoder=tiny_encoder, progress=False) as db:
        db.add(CORPUS + [{"id": "r", "text": "A great film. A great cast. A terrible end."},
                         {"id": "s", "text": "It was great. It was terrible. It was good."}])
        labels = {"positive": ["great", "good"], "negative": ["terrible", "bad"]}
        q = "A dull, slow film. It was [MASK]."
        api = db.classify(q, labels, retrieval="bm25", calibrate=True)
        by_hand = calibrate(db.classify(q, labels, retrieval="bm25"),
                            db.classify("It was [MASK].", labels, retrieval="bm25"))
        assert [(a.text, round(a.score, 12)) for a in api] == \
            [(a.text, round(a.score, 12)) for a in by_hand]
        assert api.info["calibrated"] == by_hand.info["calibrated"]
        assert "calibrated by 'It was [MASK].'" in api.plan
        sql = db.sql("SELECT label, score FROM CLASSIFY(?, LABELS(positive = ('great', 'good'), "
                     "negative = ('terrible', 'bad'))) USING bm25 WITH calibrate = TRUE "
                     "ORDER BY score ASC", [q])
        assert [(r[0], round(r[1], 12)) for r in sql.rows] == \
            [(a.text, round(a.score, 12)) for a in reversed(api.answers)]
        explain = db.sql("EXPLAIN SELECT * FROM CLASSIFY(?, LABELS(p = 'great', n = 'bad')) "
                         "WITH calibrate = TRUE", [q]).plan
        assert "calibrate=true" in explain and "calibrated" in explain
        with pytest.raises(npmdb.ProgrammingError, match="calibrate"):
            db.classify(q, labels, calibrate="yes")
        with pytest.raises(npmdb.ProgrammingError, match="calibrate"):
            db.sql("SELECT * FROM MASKED(?) WITH calibrate = TRUE", [q])


def test_masked_queries_retrieve_bm25_blocks_by_default(tmp_path, tiny_encoder):
    """fill_mask, SQL MASKED/TOKENS without USING and `npmdb query` ask BM25 (NPM's
    restricted mode); classify keeps dense search; exact=True alone means a dense scan."""
    import npmdb
    from npmdb.cli import main

    q = "Where is Maiduguri? It is in [MASK]."
    with npmdb.open(tmp_path / "db", encoder=tiny_encoder, progress=False) as db:
        db.add(TITLED)
        plain = db.fill_mask(q, top=20)
        assert "BM25" in plain.plan and "DenseTopK" not in plain.plan
        assert [a.text for a in plain] == [a.text for a in db.fill_mask(q, top=20,
                                                                         retrieval="bm25")]
        dense = db.fill_mask(q, top=20, retrieval="dense")
        assert "BM25" not in dense.plan and "DenseTopK" in dense.plan
        for source in ("MASKED", "TOKENS"):
            sql = db.sql(f"SELECT phrase FROM {source}(?) LIMIT 20", [q])
            assert "BM25" in db.sql(f"EXPLAIN SELECT * FROM {source}(?)", [q]).plan
            assert sql.rows
        assert [r[0] for r in db.sql("SELECT phrase FROM MASKED(?) LIMIT 20", [q]).rows] == \
            [a.text for a in plain]
        labels = {"yes": ["Nigeria"], "no": ["Chad"]}
        assert "BM25" not in db.classify(q, labels).plan and \
            "DenseTopK" in db.classify(q, labels).plan
        assert "BM25" not in db.sql("EXPLAIN SELECT * FROM CLASSIFY(?, ?)",
                                    [q, labels]).plan
        exact = db.fill_mask(q, exact=True, top=20)   # an exact scan is of the dense vectors
        assert "BM25" not in exact.plan and "exact" in exact.plan
        assert [a.text for a in exact] == [a.text for a in db.fill_mask(
            q, exact=True, top=20, retrieval="dense")]
        with pytest.raises(npmdb.ProgrammingError, match="retrieval"):
            db.fill_mask(q, retrieval="bm52")
    rc = main(["query", str(tmp_path / "db"), q, "--explain"])
    assert rc == 0


def test_npmdb_query_times_the_query_not_the_encoders_load(tmp_path, tiny_encoder, capsys):
    """A one-shot `npmdb query` loads the encoder before it times the query (the load is
    seconds, once per process) and says how long the load took; an empty database loads
    nothing and the query says why."""
    import io

    import npmdb
    from npmdb.cli import main
    from npmdb.output import print_result as _print_result
    from npmdb.encoders import preload

    q = "Where is Maiduguri? It is in [MASK]."
    with npmdb.open(tmp_path / "db", encoder=tiny_encoder, progress=False) as db:
        db.add(TITLED)
    with npmdb.open(tmp_path / "db", create=False, readonly=True, progress=False) as db:
        assert not db._encoders._cache                # a fresh handle has loaded nothing
        assert preload(db) > 0
        loaded = db.encoder_for(0)
        res = db.fill_mask(q)
        assert db.encoder_for(0) is loaded            # the query used the loaded encoder
        out = io.StringIO()
        _print_result(res, load_s=2.5, out=out)
        assert f"{res.elapsed_ms:.1f} ms (loading the encoder first took 2.5 s)" in out.getvalue()
        out = io.StringIO()
        _print_result(res, out=out)
        assert "loading" not in out.getvalue()
        assert preload(db, version=1) < 1       # cached: no second load
    with npmdb.open(tmp_path / "empty", encoder=tiny_encoder, progress=False) as db:
        assert preload(db) == 0.0
    assert main(["query", str(tmp_path / "db"), q]) == 0
    assert "-- version 1, generation 0" in capsys.readouterr().out


def test_a_name_occurs_in_the_query_as_whole_words_as_the_regular_expression_says():
    """subjects.py's plain search against the regular expression it replaced (which was
    compiled once for each name of each document read), on names at edges, inside
    words, beside underscores, digits and other scripts."""
    from npmdb.query.subjects import _occurs_as_words

    hays = ["washington wa is part of", "the wa_ river", "wa", "iowa and wa", "kwa wa",
            "ἀθῆναι athens", "42nd street 42", "new york-new jersey", "a  b", "wawa wa."]
    needles = ["wa", "wa_", "athens", "ἀθῆναι", "42", "new york", "new jersey", "a b",
               "york-new", "wawa", "w", "jersey"]
    for hay in hays:
        for needle in needles:
            regex = re.search(r"(?<!\w)" + re.escape(needle) + r"(?!\w)", hay) is not None
            assert _occurs_as_words(needle, hay) == regex, (needle, hay)


def test_entry_head_is_the_restated_title_and_its_other_names():
    from npmdb.query.subjects import SubjectNames, entry_head

    text = "Washington (Evergreen State, WA): a state in the northwestern United States"
    head = entry_head("Washington", text)
    assert head is not None and text[:head.end] == "Washington (Evergreen State, WA)"
    assert head.names == ("Washington", "Evergreen State", "WA")
    assert entry_head("Kabul", "Kabul: the capital of Afghanistan").names == ("Kabul",)
    assert entry_head("Kabul", "The capital: Kabul") is None          # the title not restated
    assert entry_head("Kabul", "Kabul is the capital. Note: big") is None   # not a head
    assert entry_head("", "Kabul: x") is None
    names = SubjectNames("Washington, which is an american state, is part of [MASK].")
    assert names.names_subject(head)
    assert names.head_end("Washington", text) == head.end
    assert not SubjectNames("Where is Oregon? It is in [MASK].").names_subject(head)
    # a name that is a stopword never matches ("OR" for Oregon against "or")
    oregon = entry_head("Oregon", "Oregon (Beaver State, OR): a state")
    assert not SubjectNames("Is it here or in [MASK]?").names_subject(oregon)
    assert not SubjectNames("Washingtonia grows in [MASK].").names_subject(head)  # whole words


SUBJECTS = [
    {"id": "wa", "title": "Washington",
     "text": "Washington (Evergreen State, WA): a state in the northwestern United States."},
    {"id": "or", "title": "Oregon",
     "text": "Oregon (Beaver State, OR): a state in the northwestern United States, south of WA."},
]


def test_not_subject_name_drops_answers_found_only_as_the_subjects_names(tmp_path, tiny_encoder):
    """"WA" in Washington's head is a name of the query's subject; an answer with an
    occurrence anywhere else (WA in Oregon's text) stays, as do other entries' heads."""
    import npmdb
    from npmdb.query.subjects import SubjectNames, entry_head

    q = "Washington, an American state, is part of [MASK]."
    names = SubjectNames(q)
    with npmdb.open(tmp_path / "db", encoder=tiny_encoder, progress=False) as db:
        db.add(SUBJECTS)
        kw = dict(retrieval="bm25", top=500, evidence=50, no_query_words=False,
                  not_in_query=False, whole_names=False)
        plain = db.fill_mask(q, not_subject_name=False, **kw)
        texts = {d["id"]: d for d in SUBJECTS}

        def only_in_heads(a) -> bool:
            return all(e.start < names.head_end(texts[e.doc_id]["title"], texts[e.doc_id]["text"])
                       for e in a.evidence)

        dropped = [a.text for a in plain if only_in_heads(a)]
        assert "Evergreen State" in dropped and "WA" not in dropped
        kept = db.fill_mask(q, **kw)                                   # the default
        assert [a.text for a in db.fill_mask(q, not_subject_name=True, **kw)] == \
            [a.text for a in kept]
        assert [a.text for a in kept] == [a.text for a in plain if not only_in_heads(a)]
        assert [a.score for a in kept] == [a.score for a in plain if not only_in_heads(a)]
        assert "Beaver State" in [a.text for a in kept]       # another entry's head
        assert "answer not only a name of the query's subject" in kept.plan
        for top in (1, 3):  # checked lazily up to the limit: the same first answers
            got = db.fill_mask(q, **{**kw, "top": top})
            assert [a.text for a in got] == [a.text for a in kept][:top]
        sql = "SELECT phrase FROM MASKED(?) USING bm25 WITH {}no_query_words = FALSE, " \
              "not_in_query = FALSE, whole_names = FALSE LIMIT 500"
        assert [r[0] for r in db.sql(sql.format(""), [q]).rows] == [a.text for a in kept]
        assert [r[0] for r in db.sql(sql.format("not_subject_name = FALSE, "), [q]).rows] == \
            [a.text for a in plain]
        # an answer filter (WHERE) or another order: the check runs above the order
        where = db.sql(sql.replace("LIMIT", "WHERE length(phrase) < 3 LIMIT").format(""), [q])
        assert "answer not only a name of the query's subject, first 500" in where.plan
        assert [r[0] for r in where.rows] == [a.text for a in kept if len(a.text.split()) < 3]
        assert entry_head("Oregon", texts["or"]["text"]) is not None
        with pytest.raises(npmdb.ProgrammingError, match="not_subject_name must be True or False"):
            db.fill_mask(q, not_subject_name="yes")


def test_name_fragment_is_part_of_a_run_of_capitalised_words():
    from npmdb.query.names import name_fragment

    text = "a city of New York in the United States; Rome. Milan was next, then Turin"
    at = {w: (text.index(w), text.index(w) + len(w)) for w in
          ("New", "York", "New York", "United", "States", "United States", "Rome", "Milan",
           "Turin", "city")}
    frag = {w: name_fragment(text, a, b) for w, (a, b) in at.items()}
    assert frag == {"New": True, "York": True, "New York": False, "United": True,
                    "States": True, "United States": False, "Rome": False, "Milan": False,
                    "Turin": False, "city": False}
    assert name_fragment("Южная Корея", 6, 11)          # any script's capitals
    assert not name_fragment("the  Korea", 5, 10)         # two spaces: not one name


def test_name_particles_join_capitalised_words_into_one_name():
    from npmdb.query.names import name_fragment

    text = ("an island in the Gulf of Guinea, first King of Great Britain; Rio de Janeiro "
            "and Ludwig van Beethoven. King of beasts; Bay of  Bengal; a city of Peru")
    at = {w: (text.index(w), text.index(w) + len(w)) for w in
          ("Gulf of Guinea", "Gulf", "Guinea", "King", "Great Britain", "King of Great",
           "Rio", "Janeiro", "Rio de Janeiro", "Beethoven", "Ludwig", "Bengal", "Peru")}
    at["King of beasts"] = (text.index("King of beasts"), text.index("King of beasts") + 4)
    frag = {w: name_fragment(text, a, b) for w, (a, b) in at.items()}
    assert frag == {"Gulf of Guinea": False, "Gulf": True, "Guinea": True, "King": True,
                    "Great Britain": True, "King of Great": True, "Rio": True,
                    "Janeiro": True, "Rio de Janeiro": False, "Beethoven": True,
                    "Ludwig": True,
                    "King of beasts": False,   # the word after the particle is lowercase
                    "Bengal": False,           # two spaces after the particle
                    "Peru": False}             # "a city of Peru": "city" is lowercase
    assert name_fragment("the Gulf Of Guinea", 4, 8)      # "Of" capitalised: a plain run


NAMES = [
    {"id": "nz", "title": "North Island",
     "text": "North Island: the northernmost of the two main islands of New Zealand."},
    {"id": "nj", "title": "Trenton", "text": "Trenton: the capital of New Jersey, on the river."},
    {"id": "ny", "title": "Albany", "text": "Albany: the capital of New York; New is old here."},
]


def test_whole_names_drops_answers_found_only_inside_a_longer_name(tmp_path, tiny_encoder,
                                                                    capsys):
    """"New" of "New Zealand", "New Jersey" and "New York" is no answer, unless it also
    occurs alone ("New is old here" keeps it); whole names stay, scores unchanged."""
    import npmdb
    from npmdb.query.names import name_fragment

    q = "North Island is situated in [MASK]."
    docs = {d["id"]: d["text"] for d in NAMES}
    with npmdb.open(tmp_path / "db", encoder=tiny_encoder, progress=False) as db:
        db.add(NAMES)
        kw = dict(retrieval="bm25", top=500, evidence=50, not_subject_name=False)
        plain = db.fill_mask(q, whole_names=False, **kw)

        def fragments_only(a) -> bool:
            return all(name_fragment(docs[e.doc_id], e.start, e.end) for e in a.evidence)

        dropped = [a.text for a in plain if fragments_only(a)]
        assert "Zealand" in dropped and "New Jersey" not in dropped and "New" not in dropped
        kept = db.fill_mask(q, **kw)                                    # the default
        assert [(a.text, a.score) for a in kept] == \
            [(a.text, a.score) for a in plain if not fragments_only(a)]
        assert "answer not only part of a longer name" in kept.plan
        one = db.fill_mask(q, **{**kw, "top": 1})
        assert [a.text for a in one] == [a.text for a in kept][:1]
        rows = db.sql("SELECT phrase FROM MASKED(?) USING bm25 WITH not_subject_name = FALSE, "
                      "whole_names = FALSE LIMIT 500", [q]).rows
        assert [r[0] for r in rows] == [a.text for a in plain]
        with pytest.raises(npmdb.ProgrammingError, match="whole_names must be True or False"):
            db.fill_mask(q, whole_names=1)
    from npmdb.cli import main                 # `npmdb query --option` reaches the same switch
    for flags, want in ((["--option", "whole_names=false"], plain), ([], kept)):
        assert main(["query", str(tmp_path / "db"), q, "--json", "--top", "500",
                     "--retrieval", "bm25", "--option", "not_subject_name=false",
                     "--option", "evidence=50", *flags]) == 0
        got = json.loads(capsys.readouterr().out)
        assert [r["text"] for r in got] == [a.text for a in want]
    for bad, says in (("whole_names", "--option wants NAME=VALUE, got 'whole_names'"),
                      ("whole_name=false", "unknown option 'whole_name'")):
        assert main(["query", str(tmp_path / "db"), q, "--option", bad]) == 2
        assert says in capsys.readouterr().err


@pytest.mark.parametrize("sql", [False, True])
def test_query_word_filters_judge_a_documents_occurrences_not_its_id(tiny_db, sql):
    """group_by='document': the filters used to test the answer's text, which is the
    document's id, so every 'wn:' document went for a query holding 'wn', and the documents
    kept were scored by occurrences the filters should have dropped."""
    from npmdb.boundaries import fold
    from npmdb.query.text import query_content_words

    q = "psychological feature wn is a feature of the [MASK] life."
    if sql:
        rows = tiny_db.sql("SELECT phrase, doc_id, start, end FROM EVIDENCE(?) "
                           "GROUP BY document LIMIT 40", [q]).rows
        ids = {r[0] for r in rows}
        spans = [(r[1], r[2], r[3]) for r in rows]
    else:
        res = tiny_db.fill_mask(q, group_by="document", evidence=50)
        ids = {a.text for a in res.answers}
        spans = [(e.doc_id, e.start, e.end) for a in res.answers for e in a.evidence]
    assert any(i.startswith("wn:") for i in ids)
    content = query_content_words(q)
    for doc_id, a, b in spans:
        words = set(fold(tiny_db.get(doc_id)["text"][a:b]).split())
        assert content.isdisjoint(words), (doc_id, a, b)


def test_a_word_of_several_pieces_is_one_occurrence_in_token_word_grouping(tiny_db):
    """Token mode, group_by='word': the first and the last piece of a word both widen to
    the word, so support counted pieces and evidence listed the same span twice."""
    res = tiny_db.fill_mask("capitalization is the sale of [MASK] stock.", mode="token",
                            group_by="word", top=20, evidence=50)
    assert res.answers
    several = 0
    for a in res.answers:
        spans = [(e.doc_id, e.start, e.end) for e in a.evidence]
        assert len(spans) == len(set(spans)) == a.support, a
        several += len(a.text) > 6
    assert several  # words long enough to be several pieces are among the answers
