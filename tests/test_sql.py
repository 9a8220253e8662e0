"""``Database.sql``: binding, planning, execution and EXPLAIN of the query language.

Golden files live in tests/golden/explain: NAME.sql is a query, NAME.plan the text
``EXPLAIN`` prints for it. Regenerate with ``NPMDB_UPDATE_GOLDEN=1``.

Most tests run on the ``tiny_db`` database (600 sample documents, tiny random encoder);
oracles are ``fill_mask``/``classify``/``search``/``documents`` themselves, Python filters
over unfiltered results, and a database holding only the documents a filter allows.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import npmdb
from npmdb.boundaries import fold
from npmdb.errors import Error, NotSupportedError, ProgrammingError, QueryParseError
from npmdb.query import ast as A
from npmdb.query import logical as L
from npmdb.query.evaluate import like
from npmdb.query.rules import optimize
from npmdb.query.sql import bind, prepare
from npmdb.query.parser import parse

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden" / "explain"
UPDATE = os.environ.get("NPMDB_UPDATE_GOLDEN") == "1"

Q = "Thessaloniki is a city in [MASK]."
STATEMENT_1 = ("SELECT phrase, score, support FROM MASKED('Thessaloniki is a city in [MASK].') "
               "USING bm25(blocks => 3) WITH max_len = 10, tau = 1.0 ORDER BY score DESC LIMIT 5")
STATEMENT_2 = ("SELECT label, score FROM CLASSIFY('... It was [MASK].', LABELS(positive = "
               "('great', 'awesome'), negative = ('terrible', 'broken')))")
QUERIES = [
    "Thessaloniki is a city in [MASK].", "Salem is the capital of [MASK].",
    "The currency of Japan is the [MASK].", "Balearic Islands is situated in [MASK].",
    "A genus of [MASK] in the family.", "Мехико is [MASK].",
]


@pytest.fixture(scope="module")
def db(tiny_db_path):
    with npmdb.open(tiny_db_path, progress=False) as d:
        yield d


def key(answers):
    return [(a.text, a.score, a.support, a.tokens, a.evidence) for a in answers]


@contextmanager
def time_limit(seconds: float):
    """Fail (rather than hang) when the body runs longer than ``seconds``."""
    def on_alarm(signum, frame):
        raise TimeoutError(f"query ran longer than {seconds} s")
    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# ---------------------------------------------------------------- the issue's statements

@pytest.mark.parametrize("prefix", ["", "EXPLAIN ", "EXPLAIN ANALYZE "])
@pytest.mark.parametrize("statement", [STATEMENT_1, STATEMENT_2])
@pytest.mark.parametrize("as_param", [False, True])
def test_issue_statements_run_as_written(db, statement, prefix, as_param):
    text, params = prefix + statement, None
    if as_param:
        literal = "'Thessaloniki is a city in [MASK].'" if statement is STATEMENT_1 else "'... It was [MASK].'"
        params = [literal.strip("'")]
        text = text.replace(literal, "?")
    res = db.sql(text, params)
    if prefix:
        assert res.columns == ("plan",)
        assert "\n".join(r[0] for r in res.rows) == res.plan
        assert res.plan.startswith("logical plan:")
        assert "physical plan:" in res.plan and "rules applied:" in res.plan
        if "ANALYZE" in prefix:
            assert "rows=" in res.plan and "time=" in res.plan and "total:" in res.plan
        return
    if statement is STATEMENT_1:
        assert res.columns == ("phrase", "score", "support")
        want = db.fill_mask(Q, retrieval="bm25", blocks=3, max_len=10, tau=1.0, top=5)
    else:
        assert res.columns == ("label", "score")
        want = db.classify("... It was [MASK].", {"positive": ["great", "awesome"],
                                                  "negative": ["terrible", "broken"]})
    assert key(res.answers) == key(want.answers)
    assert [r[0] for r in res.rows] == [a.text for a in want.answers]
    assert [r[1] for r in res.rows] == [a.score for a in want.answers]


# ---------------------------------------------------------------- golden EXPLAIN

def _golden_names():
    return sorted(p.stem for p in GOLDEN.glob("*.sql"))


def test_golden_inventory():
    assert len(_golden_names()) >= 12


@pytest.fixture(scope="module")
def golden_db(tiny_db_path, tmp_path_factory):
    """The tiny database with the tag the golden statements ask for (EXPLAIN checks AS OF
    as the statement would)."""
    import shutil

    path = tmp_path_factory.mktemp("golden") / "db"
    shutil.copytree(tiny_db_path, path)
    with npmdb.open(path, progress=False) as d:
        d.tag("wiki-2019")
        yield d


@pytest.mark.parametrize("name", _golden_names())
def test_golden_explain(golden_db, name):
    query = (GOLDEN / f"{name}.sql").read_text(encoding="utf-8").strip()
    res = golden_db.sql("EXPLAIN " + query)
    got = "\n".join(r[0] for r in res.rows) + "\n"
    path = GOLDEN / f"{name}.plan"
    if UPDATE or not path.exists():
        if not UPDATE:
            pytest.fail(f"missing {path.name}; run with NPMDB_UPDATE_GOLDEN=1")
        path.write_text(got, encoding="utf-8")
    assert got == path.read_text(encoding="utf-8")


def test_explain_does_not_touch_the_database():
    _, compiled, notes = prepare("SELECT phrase FROM MASKED(?) USING exact WHERE doc.title = 'x'",
                                 ["a [MASK]"])
    assert compiled.spec.exact and compiled.spec.retrieval == "dense"
    assert compiled.spec.doc_filter.describe == "doc.title = 'x'"
    assert any(n.startswith("choose_exact_scan") for n in notes)
    assert any(n.startswith("push_document_predicates") for n in notes)
    text = compiled.physical().explain()
    assert "ExactTopK (side=start, k=1024, index=exact scan, docs: doc.title = 'x' (masked))" in text


# ---------------------------------------------------------------- equivalence with fill_mask

def _random_masked(rng: random.Random):
    mode = rng.choice(["phrase", "phrase", "token"])
    kw = {
        "top": rng.randint(1, 8), "k": rng.choice([16, 64, 256, 1024]),
        "retrieval": rng.choice(["dense", "bm25", "hybrid"]), "blocks": rng.randint(1, 5),
        "tau": rng.choice([0.5, 1.0, 2, 3.5]), "alpha": rng.choice([0.0, 0.5, -0.25]),
        "exact": rng.random() < 0.3, "evidence": rng.randint(0, 3), "offset": rng.randint(0, 2),
        "group_by": rng.choice(["phrase", "phrase", "tokens", "document"] + (["word"] if mode == "token" else [])),
    }
    if mode == "phrase":
        kw.update(max_len=rng.randint(1, 12), scoring=rng.choice(["npm", "raw"]),
                  clean_edges=rng.random() < 0.8, no_stopwords=rng.random() < 0.3)
    kw["mode"] = mode
    return kw


def _masked_sql(rng: random.Random, query: str, kw: dict) -> tuple[str, list]:
    """The same request as SQL, each value written literally or as a ? parameter."""
    params: list = []

    def v(x, bare_ok=True):
        if rng.random() < 0.5:
            params.append(x)
            return "?"
        if isinstance(x, bool):
            return "TRUE" if x else "FALSE"
        if isinstance(x, str):  # a bare word is read as a string in WITH
            return x if bare_ok and rng.random() < 0.5 else "'" + x.replace("'", "''") + "'"
        return repr(x)

    source = "MASKED"
    if kw["mode"] == "token":
        source = rng.choice(["TOKENS", "MASKED"])
    sql_from = f"{source}({v(query, bare_ok=False)})"
    options = []
    if kw["mode"] == "token" and source == "MASKED":
        options.append(("mode", "token"))
    method = kw["retrieval"]
    args = []
    if method == "dense" and kw["exact"] and rng.random() < 0.5:
        method = "exact"
    elif method != "bm25" and (kw["exact"] or rng.random() < 0.2):
        options.append(("exact", kw["exact"]))
    # an option the retrieval does not use is refused in SQL (fill_mask ignores it)
    if method in ("dense", "exact", "hybrid"):
        args.append(("k", kw["k"]))
    if method in ("bm25", "hybrid"):
        args.append(("blocks", kw["blocks"]))
    defaults = {"max_len": 10, "tau": 1.0, "alpha": 0.0, "scoring": "npm", "clean_edges": True,
                "no_stopwords": False, "evidence": 3}
    for name in defaults:  # a default value may be left out
        if name in kw and (kw[name] != defaults[name] or rng.random() < 0.5):
            options.append((name, kw[name]))
    # values are written in text order, so params line up with the ? of the text
    using = f" USING {method}(" + ", ".join(f"{a} => {v(x)}" for a, x in args) + ")"
    with_ = (" WITH " + ", ".join(f"{n} = {v(x)}" for n, x in options)) if options else ""
    group = f" GROUP BY {kw['group_by']}" if kw["group_by"] != "phrase" or rng.random() < 0.3 else ""
    tail = f" LIMIT {v(kw['top'])}"
    if kw["offset"] or rng.random() < 0.3:
        tail += f" OFFSET {v(kw['offset'])}"
    cols = rng.choice(["*", "phrase, score, support", "phrase, tokens, length, rank"])
    return f"SELECT {cols} FROM {sql_from}{using}{with_}{group}{tail}", params


@pytest.mark.parametrize("seed", range(40))
def test_sql_equals_fill_mask(db, seed):
    rng = random.Random(seed)
    query = rng.choice(QUERIES)
    kw = _random_masked(rng)
    text, params = _masked_sql(rng, query, kw)
    want = db.fill_mask(query, **kw)
    got = db.sql(text, params)
    assert key(got.answers) == key(want.answers), text
    assert (got.version, got.generation) == (want.version, want.generation)
    assert len(got.rows) == len(want.answers)
    if got.columns[:2] == ("phrase", "tokens"):
        for i, (row, a) in enumerate(zip(got.rows, want.answers)):
            assert row == (a.text, a.tokens, len(a.text.split()), kw["offset"] + i + 1)


@pytest.mark.parametrize("seed", range(15))
def test_sql_equals_classify(db, seed):
    rng = random.Random(1000 + seed)
    words = ["great", "terrible", "good", "bad", "city", "genus", "act", "name", "Spain"]
    labels = {}
    for name in rng.sample(["positive", "negative", "neutral", "other"], rng.randint(1, 3)):
        labels[name] = rng.sample(words, rng.randint(1, 3))
    query = rng.choice(["It was [MASK].", "The movie was [MASK].", Q])
    kw = {"tau": rng.choice([1.0, 5.0, 2.5]), "k": rng.choice([64, 1024]),
          "mode": rng.choice(["phrase", "token"]), "retrieval": rng.choice(["dense", "bm25", "hybrid"]),
          "exact": rng.random() < 0.3, "evidence": rng.randint(0, 2), "max_len": rng.randint(1, 5)}
    top, offset = rng.choice([0, 1, 2]), rng.choice([0, 0, 1])
    want = db.classify(query, labels, top=top, offset=offset, **kw)
    using = {"dense": f"dense(k => {kw['k']})", "bm25": "bm25(blocks => 3)",
             "hybrid": f"hybrid(k => {kw['k']}, blocks => 3)"}[kw["retrieval"]]
    # only options the retrieval and mode use: SQL refuses the others (classify ignores them)
    options = f"tau = {kw['tau']}, mode = {kw['mode']}, evidence = {kw['evidence']}"
    if kw["retrieval"] != "bm25":
        options += f", exact = {kw['exact']}"
    if kw["mode"] == "phrase":
        options += f", max_len = {kw['max_len']}"
    tail = (f" LIMIT {top}" if top else "") + (f" OFFSET {offset}" if offset else "")
    label_sql = ", ".join(f"{n} = (" + ", ".join("?" for _ in ws) + ")" for n, ws in labels.items())
    params = [query] + [w for ws in labels.values() for w in ws]
    text = (f"SELECT label, score, support FROM CLASSIFY(?, LABELS({label_sql})) "
            f"USING {using} WITH {options}{tail}")
    got = db.sql(text, params)
    assert key(got.answers) == key(want.answers), text
    assert [r[0] for r in got.rows] == [a.text for a in want.answers]
    # a mapping bound to the labels parameter is the same request
    got2 = db.sql(f"SELECT label FROM CLASSIFY(:q, :labels) USING {using} WITH {options}{tail}",
                  {"q": query, "labels": labels})
    assert key(got2.answers) == key(want.answers)


# ---------------------------------------------------------------- WHERE / ORDER BY on answers

@pytest.fixture(scope="module")
def everything(db):
    """Every answer of one query, best first, and the query."""
    q = "Salem is the capital of [MASK]."
    return q, db.fill_mask(q, top=100_000, evidence=0).answers


ANSWER_CASES = [
    ("phrase LIKE '%a%'", lambda a: "a" in a.text.lower()),
    ("phrase NOT LIKE 'a%'", lambda a: not a.text.lower().startswith("a")),
    ("phrase LIKE '_a%'", lambda a: len(a.text) >= 2 and a.text.lower()[1] == "a"),
    ("phrase LIKE '%'", lambda a: True),
    ("length(phrase) <= 2", lambda a: len(a.text.split()) <= 2),
    ("length(phrase) BETWEEN 2 AND 3", lambda a: 2 <= len(a.text.split()) <= 3),
    ("length(phrase) NOT BETWEEN 2 AND 3", lambda a: not 2 <= len(a.text.split()) <= 3),
    ("support >= 2", lambda a: a.support >= 2),
    ("score > 0.0005 AND support = 1", lambda a: a.score > 0.0005 and a.support == 1),
    ("NOT (support > 1) OR length(phrase) = 3", lambda a: a.support <= 1 or len(a.text.split()) == 3),
    ("tokens > 2 AND NOT phrase LIKE '%e%'", lambda a: a.tokens > 2 and "e" not in a.text.lower()),
    ("lower(phrase) = phrase", lambda a: a.text.lower() == a.text),
    ("length(phrase) * 2 + 1 >= 5", lambda a: len(a.text.split()) * 2 + 1 >= 5),
    ("phrase IS NOT NULL AND score IS NOT NULL", lambda a: True),
    ("1 = 0", lambda a: False),
]


@pytest.mark.parametrize("cond,oracle", ANSWER_CASES, ids=[c for c, _ in ANSWER_CASES])
def test_where_on_answers_matches_python_filter(db, everything, cond, oracle):
    q, answers = everything
    res = db.sql(f"SELECT phrase, score, support FROM MASKED(?) WITH evidence = 0 WHERE {cond} LIMIT 7", [q])
    want = [a for a in answers if oracle(a)][:7]
    assert key(res.answers) == key(want)
    assert [r[0] for r in res.rows] == [a.text for a in want]


def test_in_lists_bind_and_expand(db, everything):
    q, answers = everything
    some = [a.text for a in answers[:3]]
    res = db.sql("SELECT phrase FROM MASKED(?) WITH evidence = 0 WHERE phrase IN (?, ?) LIMIT 10",
                 [q, some[0], some[2]])
    assert [r[0] for r in res.rows] == [some[0], some[2]]
    res = db.sql("SELECT phrase FROM MASKED(:q) WITH evidence = 0 WHERE phrase NOT IN (:bad) LIMIT 4",
                 {"q": q, "bad": some})
    assert [r[0] for r in res.rows] == [a.text for a in answers[3:7]]


def test_order_by(db, everything):
    q, answers = everything
    top = lambda text, p=(): db.sql(text, [q, *p])  # noqa: E731
    res = top("SELECT phrase, support FROM MASKED(?) WITH evidence = 0 ORDER BY support DESC, score DESC LIMIT 6")
    want = sorted(answers, key=lambda a: (-a.support, -a.score))[:6]
    assert [r[0] for r in res.rows] == [a.text for a in want]
    res = top("SELECT phrase FROM MASKED(?) WITH evidence = 0 ORDER BY phrase LIMIT 5")
    assert [r[0] for r in res.rows] == [a.text for a in sorted(answers, key=lambda a: a.text)[:5]]
    res = top("SELECT phrase, score AS s FROM MASKED(?) WITH evidence = 0 ORDER BY s LIMIT 3")
    assert [r[0] for r in res.rows] == [a.text for a in sorted(answers, key=lambda a: a.score)[:3]]
    res = top("SELECT phrase, length(phrase) FROM MASKED(?) WITH evidence = 0 ORDER BY 2 DESC, score DESC LIMIT 4")
    want = sorted(answers, key=lambda a: (-len(a.text.split()), -a.score))[:4]
    assert [r[0] for r in res.rows] == [a.text for a in want]
    assert [r[1] for r in res.rows] == [len(a.text.split()) for a in want]
    # an alias that is also a source column's name: ORDER BY names the column shown
    res = top("SELECT phrase, score AS support FROM MASKED(?) WITH evidence = 0 "
              "ORDER BY support DESC LIMIT 6")
    assert [r[1] for r in res.rows] == sorted((r[1] for r in res.rows), reverse=True)
    assert [r[0] for r in res.rows] == [a.text for a in sorted(answers,
                                                               key=lambda a: -a.score)[:6]]


def test_projection_columns(db):
    res = db.sql("SELECT *, tokens, length, rank, version, generation, evidence, doc_id, title, "
                 "start, \"end\", snippet, text, label FROM MASKED(?) LIMIT 3 OFFSET 1", [Q])
    want = db.fill_mask(Q, top=3, offset=1)
    assert res.columns == ("phrase", "score", "support", "tokens", "length", "rank", "version",
                           "generation", "evidence", "doc_id", "title", "start", "end", "snippet",
                           "text", "label")
    for i, (row, a) in enumerate(zip(res.rows, want.answers)):
        d = dict(zip(res.columns, row))
        ev = a.evidence[0]
        assert (d["phrase"], d["score"], d["support"], d["tokens"]) == (a.text, a.score, a.support, a.tokens)
        assert d["rank"] == i + 2 and d["version"] == want.version and d["generation"] == want.generation
        assert d["length"] == len(a.text.split()) and d["text"] == d["label"] == a.text
        assert (d["doc_id"], d["title"], d["start"], d["end"], d["snippet"]) == \
            (ev.doc_id, ev.title, ev.start, ev.end, ev.snippet)
        assert d["evidence"] == [dataclasses.asdict(e) for e in a.evidence]
    assert res.to_list()[0]["phrase"] == want.answers[0].text
    assert len(res) == 3 and res.answers == want.answers


def test_limit_zero_and_offset_past_the_end(db):
    res = db.sql("SELECT phrase FROM MASKED(?) LIMIT 0", [Q])
    assert res.rows == () and res.answers == () and res.columns == ("phrase",)
    assert res.version == db.version
    res = db.sql("SELECT phrase FROM MASKED(?) USING bm25(blocks => 1) LIMIT 5 OFFSET 100000", [Q])
    assert res.rows == ()


# ---------------------------------------------------------------- document filters

def _long_docs(db, n):
    docs = sorted((d for d in db.documents() if d["id"].startswith("wn:")), key=lambda d: -len(d["text"]))
    return docs[:n]


@pytest.mark.parametrize("using", ["dense", "bm25", "hybrid", "exact", "dense(k => 8)", "exact(k => 4)"])
def test_title_filter_restricts_retrieval_and_fills_limit(db, using):
    docs = _long_docs(db, 2)
    titles = {d["title"] for d in docs}
    q = "Hagios Demetrios is located in [MASK]."
    res = db.sql(f"SELECT phrase, title FROM MASKED(?) USING {using} WITH evidence = 1000 "
                 "WHERE doc.title IN (?, ?) LIMIT 5", [q, *sorted(titles)])
    assert len(res.rows) == 5  # the corpus allows it: the two documents hold many phrases
    assert {e.title for a in res.answers for e in a.evidence} <= titles
    assert sum(len(a.evidence) for a in res.answers) == sum(a.support for a in res.answers)
    ev = db.sql(f"SELECT title, doc_id FROM EVIDENCE(?) USING {using} WHERE title IN (?, ?) LIMIT 5",
                [q, *sorted(titles)])
    assert ev.rows and {r[0] for r in ev.rows} <= titles
    # unfiltered, those documents do not hold the top answers: the filter is not a post-filter
    plain = db.fill_mask(q, top=5, evidence=1000)
    assert not {e.title for a in plain.answers for e in a.evidence} <= titles


def test_document_filter_equals_a_database_of_those_documents(db, new_db, sample_corpus):
    keep = [d for d in sample_corpus[:600] if d["title"].lower().startswith(("s", "t"))]
    new_db.add(keep)
    q = "Thessaloniki is a city in [MASK]."
    want = new_db.fill_mask(q, exact=True, k=64, top=6, evidence=1000)
    got = db.sql("SELECT phrase FROM MASKED(?) USING exact(k => 64) WITH evidence = 1000 "
                 "WHERE doc.title LIKE 's%' OR doc.title LIKE 'T%' LIMIT 6", [q])
    assert [(a.text, a.support, a.tokens) for a in got.answers] == \
        [(a.text, a.support, a.tokens) for a in want.answers]
    assert [a.score for a in got.answers] == pytest.approx([a.score for a in want.answers], rel=1e-9)
    assert [sorted((e.doc_id, e.start, e.end) for e in a.evidence) for a in got.answers] == \
        [sorted((e.doc_id, e.start, e.end) for e in a.evidence) for a in want.answers]
    bm = new_db.fill_mask(q, retrieval="bm25", blocks=2, top=6)
    got = db.sql("SELECT phrase FROM MASKED(?) USING bm25(blocks => 2) "
                 "WHERE lower(doc.title) LIKE 's%' OR lower(title) LIKE 't%' LIMIT 6", [q])
    assert [a.text for a in got.answers] and {e.doc_id for a in got.answers for e in a.evidence} <= \
        {d["id"] for d in keep}


def test_meta_filters(new_db):
    docs = [{"id": f"d{i}", "title": f"Doc {i}", "text": f"Salem is the capital of State{i} and "
             f"city number {i} in the region of Area{i}.", "meta": {"year": 1990 + i * 5, "lang": "en" if i % 2 else "fr",
                                                                 "tags": {"kind": "city"}}}
            for i in range(8)]
    new_db.add(docs)
    res = new_db.sql("SELECT id, meta.year, doc.meta.tags.kind FROM DOCUMENTS WHERE doc.meta.year >= 2000 "
                     "AND meta.lang = 'en' ORDER BY meta.year DESC")
    want = sorted((d for d in docs if d["meta"]["year"] >= 2000 and d["meta"]["lang"] == "en"),
                  key=lambda d: -d["meta"]["year"])
    assert res.rows == tuple((d["id"], d["meta"]["year"], "city") for d in want)
    allowed = {d["id"] for d in want}
    ev = new_db.sql("SELECT doc_id FROM EVIDENCE('Salem is the capital of [MASK].') "
                    "WHERE doc.meta.year >= 2000 AND doc.meta.lang = 'en' LIMIT 50")
    assert ev.rows and {r[0] for r in ev.rows} <= allowed
    res = new_db.sql("SELECT phrase FROM MASKED('Salem is the capital of [MASK].') USING bm25(blocks => 8) "
                     "WITH evidence = 100 WHERE doc.meta.missing IS NULL AND doc.meta.year BETWEEN 1995 AND 2000")
    assert {e.doc_id for a in res.answers for e in a.evidence} <= {"d1", "d2"}
    assert len(res.rows) == 5


def test_mixed_or_is_not_supported_on_answers(db):
    with pytest.raises(NotSupportedError, match="mixes document columns") as exc:
        db.sql("SELECT phrase FROM MASKED(?) WHERE doc.title = 'x' OR phrase = 'y'", [Q])
    assert "line 1, column 36" in str(exc.value) and "^" in str(exc.value)


def test_mixed_or_filters_rows(db):
    """A row has one document, so on row sources a mixed condition filters rows."""
    docs = list(db.documents())
    res = db.sql("SELECT id FROM DOCUMENTS WHERE (title LIKE 'Sa%' OR generation > 0) AND id LIKE 'wn:%'")
    assert [r[0] for r in res.rows] == [d["id"] for d in docs if d["id"].startswith("wn:")
                                        and d["title"].lower().startswith("sa")]
    assert "evaluated on rows" in db.sql("EXPLAIN SELECT id FROM DOCUMENTS WHERE title = 'a' OR "
                                         "version = 1").plan
    every = db.sql("SELECT phrase, title, score FROM EVIDENCE(?) LIMIT 5", [Q]).rows
    res = db.sql("SELECT phrase, title, score FROM EVIDENCE(?) WHERE title LIKE 'М%' OR score > 0.003 LIMIT 5", [Q])
    assert list(res.rows) == [r for r in every if r[1].lower().startswith("м") or r[2] > 0.003]


# ---------------------------------------------------------------- EVIDENCE, SEARCH, DOCUMENTS

def test_evidence_rows_are_every_occurrence(db):
    res = db.sql("SELECT * FROM EVIDENCE(?)", [Q])
    answers = db.fill_mask(Q, top=5, evidence=0).answers
    assert res.columns == ("phrase", "doc_id", "title", "start", "end", "snippet", "score")
    assert len(res.rows) == sum(a.support for a in answers)
    assert [a.text for a in res.answers] == [a.text for a in answers]
    texts = {}
    for phrase, doc_id, title, start, end, snippet, score in res.rows:
        doc = texts.get(doc_id) or texts.setdefault(doc_id, db.get(doc_id))
        assert doc["title"] == title
        assert fold(doc["text"][start:end]) == fold(phrase)
        assert doc["text"][start:end] in snippet.replace("…", "")
    # answer order is kept, occurrences best first within an answer
    order = [r[0] for r in res.rows]
    assert order == sorted(order, key=[a.text for a in answers].index)
    res = db.sql("SELECT phrase, score FROM EVIDENCE(?) WITH evidence = 1 LIMIT 4", [Q])
    assert [r[0] for r in res.rows] == [a.text for a in answers[:4]]
    # evidence = 0 keeps no occurrence on MASKED; on EVIDENCE it listed every one
    with pytest.raises(npmdb.QueryParseError, match="EVIDENCE lists occurrences") as err:
        db.sql("SELECT phrase FROM EVIDENCE(?) WITH evidence = 0", [Q])
    assert err.value.column == len("SELECT phrase FROM EVIDENCE(?) WITH ") + 1


def test_evidence_row_predicates_and_order(db):
    all_rows = db.sql("SELECT phrase, doc_id, score, tokens FROM EVIDENCE(?)", [Q]).rows
    want = sorted((r for r in all_rows if r[2] > 0.002), key=lambda r: r[1], reverse=True)
    res = db.sql("SELECT phrase, doc_id, score, tokens FROM EVIDENCE(?) WHERE score > ? "
                 "ORDER BY doc_id DESC", [Q, 0.002])
    assert list(res.rows) == want
    res = db.sql("SELECT phrase, doc_id, score, tokens FROM EVIDENCE(?) WHERE score > ? "
                 "ORDER BY doc_id DESC LIMIT 2", [Q, 0.002])
    assert len(want) > 2 and list(res.rows) == want[:2]
    # answer_score is the answer's: it chooses answers before the top-5 cut, as phrase does
    answers = db.fill_mask(Q, top=0, evidence=0)
    cut = answers[4].score  # below the fifth answer's score: answers past the top 5
    res = db.sql("SELECT phrase, answer_score FROM EVIDENCE(?) WHERE answer_score < ?",
                 [Q, cut])
    assert res.rows and all(r[1] < cut for r in res.rows)
    assert {r[0] for r in res.rows} == {a.text for a in answers if a.score < cut}.intersection(
        a.text for a in [a for a in answers if a.score < cut][:5])


@pytest.mark.parametrize("query", [
    "SELECT doc_id, title, score FROM SEARCH('city river') ORDER BY title DESC",
    "SELECT doc_id, score, snippet FROM SEARCH('city river') ORDER BY score",
    "SELECT doc_id, score FROM SEARCH('city river') WHERE score < 9",
    "SELECT doc_id, snippet FROM SEARCH('city river') WHERE snippet LIKE '%river%' ORDER BY doc_id",
    "SELECT phrase, start, score FROM EVIDENCE('Thessaloniki is a city in [MASK].') ORDER BY start",
    "SELECT phrase, doc_id FROM EVIDENCE('Thessaloniki is a city in [MASK].')",
    "SELECT phrase, doc_id FROM EVIDENCE('Thessaloniki is a city in [MASK].') ORDER BY doc_id DESC",
    "SELECT id, title FROM DOCUMENTS WHERE title LIKE 'S%' ORDER BY title DESC",
])
def test_limit_returns_the_first_rows_of_the_same_query(db, query):
    """SQL's LIMIT n OFFSET m takes rows m..m+n of the query without it, whatever it
    filters and orders by: SEARCH takes enough blocks, EVIDENCE counts occurrence rows."""
    rows = db.sql(query).rows
    assert len(rows) >= 4, rows
    for n, m in ((1, 0), (2, 0), (3, 1), (2, 2)):
        got = db.sql(f"{query} LIMIT {n} OFFSET {m}")
        assert list(got.rows) == list(rows[m:m + n]), (n, m)
        assert len(got) == len(list(got)) == n


def test_result_is_a_sequence_of_what_len_counts(db):
    """A SQL result iterates and indexes its rows (as to_list's dicts); a fill_mask result
    its answers; len counts the same items either way."""
    for query in ("SELECT id, title FROM DOCUMENTS LIMIT 3", "SELECT * FROM SEARCH('city') LIMIT 3",
                  f"SELECT phrase, doc_id FROM EVIDENCE('{Q}') LIMIT 3",
                  f"SELECT phrase, score FROM MASKED('{Q}') LIMIT 3"):
        res = db.sql(query)
        assert len(res) == 3 and list(res) == res.to_list() == res[:3]
        assert res[0] == res.to_list()[0] and res[-1] == res.to_list()[-1]
        assert repr(res).count("\n") == 3
    res = db.fill_mask(Q, top=3)
    assert len(res) == len(list(res)) == 3 and all(isinstance(a, npmdb.Answer) for a in res)
    assert res[0] is res.top


def test_masked_answers_are_not_ordered_by_expressions(db):
    for order in ("-score", "score * 2 DESC", "s2"):
        with pytest.raises(QueryParseError, match="ordered by a column, not an expression"):
            db.sql(f"SELECT phrase, score * 2 AS s2 FROM MASKED(?) ORDER BY {order} LIMIT 2", [Q])
    rows = db.sql("SELECT phrase, start FROM EVIDENCE(?) ORDER BY -start", [Q]).rows
    assert [r[1] for r in rows] == sorted((r[1] for r in rows), reverse=True)


def test_search_equals_db_search(db):
    got = db.sql("SELECT doc_id, title, block, score, snippet FROM SEARCH(?) LIMIT 7", ["city river"])
    assert got.to_list() == db.search("city river", limit=7)
    assert db.sql("SELECT * FROM SEARCH('city')").to_list() == db.search("city")
    got = db.sql("SELECT doc_id, title, block, score, snippet FROM SEARCH('city') LIMIT 3 OFFSET 2")
    assert got.to_list() == db.search("city", limit=5)[2:]
    # a document filter restricts BM25 itself: the top 4 of the allowed documents
    allowed = [h for h in db.search("the", limit=1000) if h["title"].lower().startswith(("s", "м"))]
    res = db.sql("SELECT doc_id, block, title, text, start, \"end\" FROM SEARCH('the') "
                 "WHERE title LIKE 's%' OR title LIKE 'М%' LIMIT 4")
    assert len(allowed) >= 4
    assert [(r[0], r[1]) for r in res.rows] == [(h["doc_id"], h["block"]) for h in allowed[:4]]
    for doc_id, _, title, text, start, end in res.rows:
        assert db.get(doc_id)["text"][start:end] == text and title[0].lower() in "sм"


def test_documents(db):
    docs = list(db.documents())
    res = db.sql("SELECT * FROM DOCUMENTS LIMIT 3 OFFSET 2")
    assert res.columns == ("id", "title", "text", "meta")
    assert res.to_list() == docs[2:5]
    res = db.sql("SELECT id, title FROM DOCUMENTS WHERE title LIKE 'Sa%' OR id = ?", [docs[0]["id"]])
    want = [d for d in docs if d["title"].lower().startswith("sa") or d["id"] == docs[0]["id"]]
    assert [r[0] for r in res.rows] == [d["id"] for d in want]
    res = db.sql("SELECT id FROM DOCUMENTS WHERE id LIKE 'wn:%' ORDER BY id DESC LIMIT 2")
    assert [r[0] for r in res.rows] == sorted((d["id"] for d in docs if d["id"].startswith("wn:")),
                                              reverse=True)[:2]
    assert len(db.sql("SELECT id FROM DOCUMENTS").rows) == len(docs)


# ---------------------------------------------------------------- versions

def test_versions_tags_and_as_of(new_db, sample_corpus):
    first = new_db.add(sample_corpus[:40])
    new_db.tag("first")
    second = new_db.add(sample_corpus[40:80])
    res = new_db.sql("SHOW VERSIONS")
    assert [r[0] for r in res.rows] == [first, second] and res.columns[0] == "id"
    assert dict(zip(res.columns, res.rows[0]))["tags"] == "first"
    assert new_db.sql("SHOW TAGS").rows == (("first", first),)
    ids = {d["id"] for d in sample_corpus[:40]}
    for ref in ("'first'", str(first), "?"):
        res = new_db.sql(f"SELECT id FROM DOCUMENTS AS OF {ref}", [first] if ref == "?" else None)
        assert {r[0] for r in res.rows} == ids and res.version == first
    res = new_db.sql("SELECT phrase FROM MASKED(?) AS OF 'first' WITH evidence = 100", [Q])
    want = new_db.fill_mask(Q, version="first", evidence=100)
    assert res.version == first and key(res.answers) == key(want.answers)
    assert {e.doc_id for a in res.answers for e in a.evidence} <= ids
    assert new_db.sql("SELECT phrase FROM MASKED(?)", [Q]).version == second
    with pytest.raises(QueryParseError, match="no version or tag named 'frist'; did you mean 'first'"):
        new_db.sql("SELECT phrase FROM MASKED(?) AS OF 'frist'", [Q])
    with pytest.raises(QueryParseError, match="no version or tag named 'frist'"):
        new_db.sql("EXPLAIN ANALYZE SELECT phrase FROM MASKED(?) AS OF 'frist'", [Q])


# ---------------------------------------------------------------- parameters

def test_parameters_are_bound_never_spliced(db):
    tricky = "It's [MASK]') UNION SELECT * FROM DOCUMENTS --"
    res = db.sql("SELECT phrase FROM MASKED(?) LIMIT 3", [tricky])
    assert key(res.answers) == key(db.fill_mask(tricky, top=3).answers)
    stmt = bind(parse("SELECT phrase FROM MASKED(:q) WHERE phrase = :p"), {"q": tricky, "p": "x'"}, "")
    assert stmt.source.query.value == tricky and stmt.where.right.value == "x'"


@pytest.mark.parametrize("text,params,match", [
    ("SELECT phrase FROM MASKED(?)", None, r"no value for parameter \?0"),
    ("SELECT phrase FROM MASKED(?) LIMIT ?", ["a [MASK]"], r"no value for parameter \?1"),
    ("SELECT phrase FROM MASKED(?)", ["a [MASK]", 3], r"value 1 \(3\) is unused"),
    ("SELECT phrase FROM MASKED(:q)", {"x": "a [MASK]"}, "no value for parameter :q"),
    ("SELECT phrase FROM MASKED(:q)", {"q": "a [MASK]", "extra": 1}, "unused parameter :extra"),
    ("SELECT phrase FROM MASKED(?)", {"q": "a [MASK]"}, "needs params as a sequence"),
    ("SELECT phrase FROM MASKED(:q)", ["a [MASK]"], "needs params as a mapping"),
    ("SELECT phrase FROM MASKED('a [MASK]')", ["x"], "value 0 .* is unused"),
    ("SELECT phrase FROM MASKED(?)", "a [MASK]", "params must be a sequence"),
    ("SELECT phrase FROM MASKED(?)", [3], "MASKED takes a string"),
    ("SELECT phrase FROM MASKED(?) WITH tau = ?", ["a [MASK]", float("nan")], "finite"),
    ("SELECT phrase FROM MASKED(?) WITH tau = ?", ["a [MASK]", [1]], "a list binds only"),
    ("SELECT phrase FROM MASKED(?) LIMIT ?", ["a [MASK]", -1], "non-negative integer"),
    ("SELECT phrase FROM MASKED(?) WHERE phrase IN (?)", ["a [MASK]", []], "empty list"),
    ("SELECT label FROM CLASSIFY(?, ?)", ["a [MASK]", ["great"]], "labels"),
    ("SELECT phrase FROM MASKED(?) WITH k = ?", ["a [MASK]", object()], "unsupported type"),
])
def test_parameter_errors(db, text, params, match):
    with pytest.raises(ProgrammingError, match=match):
        db.sql(text, params)


# ---------------------------------------------------------------- errors

@pytest.mark.parametrize("text,match,column", [
    ("SELECT phrse FROM MASKED('a [MASK]')", "unknown column 'phrse' in MASKED; did you mean phrase", 8),
    ("SELECT phrase FROM MASKED('a [MASK]') WITH tua = 1", "unknown option 'tua' for MASKED; did you mean tau", 44),
    ("SELECT phrase FROM MASKED('a [MASK]') WITH top = 3", "write LIMIT instead", 44),
    ("SELECT phrase FROM MASKED('a [MASK]') USING bm25(block => 3)", "did you mean blocks", 50),
    ("SELECT lenght(phrase) FROM MASKED('a [MASK]')", "unknown function lenght\\(\\); did you mean length", 8),
    ("SELECT phrase FROM MASKED('a [MASK]') GROUP BY phrses", "unknown GROUP BY key 'phrses'; did you mean phrase", 48),
    ("SELECT phrase FROM MASKED('a [MASK]') WHERE doc.titel = 'x'", "did you mean doc.title", 45),
    ("SELECT phrase FROM MASKED('a [MASK]') WHERE phrase > 3", "cannot compare text with number", 45),
    ("SELECT phrase FROM MASKED('a [MASK]') WHERE snippet = 'x'", "not known when answers are filtered", 45),
    ("SELECT phrase FROM MASKED('no mask') ", "exactly one mask", 27),
    ("SELECT phrase FROM MASKED('a [MASK]') WITH max_len = 100", "max_len must be between 1 and 64", 44),
    ("SELECT phrase FROM MASKED('a [MASK]') WITH exact = 1", "exact takes TRUE or FALSE", 52),
    ("SELECT phrase FROM MASKED('a [MASK]') WITH tau = 1e9", r"tau must be a finite number in", 44),
    ("SELECT phrase FROM MASKED('a [MASK]') WITH alpha = -20", r"alpha must be a finite number", 44),
    ("SELECT phrase FROM MASKED('a [MASK]') WITH scoring = rwa", "did you mean raw", 54),
    ("SELECT phrase FROM MASKED('a [MASK]') ORDER BY doc.title", "cannot be ordered by a document column", 48),
    ("SELECT count(*) FROM MASKED('a [MASK]')", "aggregate function count", 8),
    ("SELECT count(*) FROM DOCUMENTS", r"count\(\) is not supported: db.count\(\) counts", 8),
    ("SELECT phrase FROM SEARCH('x')", "unknown column 'phrase' in SEARCH", 8),
    ("SELECT id FROM DOCUMENTS WITH k = 3", "DOCUMENTS takes no WITH options", 31),
    ("SELECT phrase FROM TOKENS('a [MASK]') WITH mode = phrase", "TOKENS\\(...\\) is token mode", 44),
    ("SELECT phrase FROM MASKED('a [MASK]') USING dense(k => 3) WITH k = 4", "k is given twice", 64),
    ("SELCT phrase FROM MASKED('a [MASK]')", "did you mean SELECT", 1),
    ("SELECT phrase FROM MASKED('a [MASK]'\nLIMIT 3", r"expected .*'\)'", 1),
])
def test_errors_are_positioned(db, text, match, column):
    with pytest.raises(QueryParseError, match=match) as exc:
        db.sql(text)
    err = exc.value
    assert err.column == column
    assert "^" in str(err) and f"column {column}" in str(err)


def test_error_names_what_was_expected(db):
    with pytest.raises(QueryParseError) as exc:
        db.sql("SELECT phrase FROM MASKED('a [MASK]') WITH tua = 1")
    assert "tau" in exc.value.expected and exc.value.line == 1


def test_runtime_type_errors_are_data_errors_naming_the_row(new_db):
    """A value that a valid statement cannot use is the data's problem (DataError), placed
    in the statement and in the document (or answer) that holds it."""
    new_db.add([{"id": "a", "text": "Paris is a city in France.", "meta": {"year": "old"}},
                {"id": "b", "text": "Rome is a city in Italy.", "meta": {"year": 1999}}])
    with pytest.raises(npmdb.QueryDataError, match=r"cannot compare text with number.*"
                                                   r"\(in document 'a'\)"):
        new_db.sql("SELECT id FROM DOCUMENTS WHERE doc.meta.year > 1990")
    with pytest.raises(npmdb.DataError, match="expected a condition"):
        new_db.sql("SELECT id FROM DOCUMENTS WHERE doc.meta.year")
    # ORDER BY too: placed, naming a document of each type (it was a bare DataError)
    with pytest.raises(npmdb.QueryDataError, match=r"cannot sort values of different types "
                       r"\(text in document 'a', number in document 'b'\)") as err:
        new_db.sql("SELECT id FROM DOCUMENTS ORDER BY doc.meta.year")
    assert err.value.column == len("SELECT id FROM DOCUMENTS ORDER BY ") + 1
    assert new_db.sql("SELECT id FROM DOCUMENTS WHERE doc.meta.year = 1999").rows == (("b",),)
    # the same condition in another statement: the error points into that statement
    other = "SELECT phrase FROM MASKED('Paris is a city in [MASK].') WHERE doc.meta.year > 1990"
    for statement in ("SELECT doc_id FROM SEARCH('city') WHERE doc.meta.year > 1990", other):
        with pytest.raises(npmdb.QueryDataError) as err:
            new_db.sql(statement)
        assert statement in str(err.value)
        column = int(str(err.value).split(", column ")[1].split(")")[0])
        assert statement[column - 1:].startswith("doc.meta.year > 1990")
    # a deleted or replaced document is no row: its old value fails no statement (the
    # filter read every document of the segment, and the error outlived db.update)
    new_db.update([{"id": "a", "text": "Paris is a city in France.", "meta": {"year": 1950}}])
    assert new_db.sql("SELECT id FROM DOCUMENTS WHERE doc.meta.year > 1900 ORDER BY "
                      "doc.meta.year").rows == (("a",), ("b",))
    new_db.add([{"id": "c", "text": "Oslo.", "meta": {"year": {"old": True}}},
                {"id": "d", "text": "Bergen.", "meta": {"year": {"old": False}}}])
    with pytest.raises(npmdb.QueryDataError, match="values of type dict have no order"):
        new_db.sql("SELECT id FROM DOCUMENTS WHERE id IN ('c', 'd') ORDER BY doc.meta.year")
    new_db.delete(["c", "d"])
    assert new_db.sql("SELECT id FROM DOCUMENTS WHERE doc.meta.year < 2000").rows == (
        ("b",), ("a",))


def test_to_arrow_takes_columns_of_mixed_types(new_db):
    """A meta field that is a number in one document and a string or list in another
    becomes a column of strings (JSON), not a pyarrow error; consistent columns keep
    their type."""
    pa = pytest.importorskip("pyarrow")
    new_db.add([{"id": "a", "text": "Paris is a city in France.", "meta": {"year": 2001}},
                {"id": "b", "text": "Rome is a city in Italy.", "meta": {"year": "old", "tags": [1]}},
                {"id": "c", "text": "Oslo is a city in Norway."}])
    t = new_db.sql("SELECT id, meta.year FROM DOCUMENTS").to_arrow()
    assert t.column("meta.year").to_pylist() == ["2001", "old", None]
    t = new_db.sql("SELECT * FROM DOCUMENTS").to_arrow()
    assert t.column("meta").type == pa.string() and t.num_rows == 3
    assert json.loads(t.column("meta").to_pylist()[1]) == {"year": "old", "tags": [1]}
    t = new_db.sql("SELECT id, meta.year FROM DOCUMENTS WHERE id != 'b'").to_arrow()
    assert t.column("meta.year").type == pa.int64()
    # integers that no one Arrow integer type holds: strings too, not an OverflowError
    new_db.add([{"id": "d", "text": "Big.", "meta": {"n": 2 ** 64 - 1}},
                {"id": "e", "text": "Small.", "meta": {"n": -1}}])
    t = new_db.sql("SELECT meta.n FROM DOCUMENTS WHERE id IN ('d', 'e') ORDER BY id").to_arrow()
    assert t.column("meta.n").to_pylist() == [str(2 ** 64 - 1), "-1"]


def test_select_items_need_distinct_names(db):
    """A row is a dict of column names: two items with one name would lose one's values."""
    for statement, column in (("SELECT id, title AS id FROM DOCUMENTS", 12),
                              ("SELECT phrase, score AS phrase FROM MASKED('x [MASK].')", 16)):
        with pytest.raises(QueryParseError, match="two select items are named") as err:
            db.sql(statement)
        assert err.value.column == column
    assert db.sql("SELECT id, title AS id2 FROM DOCUMENTS LIMIT 1").columns == ("id", "id2")


def test_like_matcher():
    assert like("a%b_c")("AxxbZc") and not like("a%b_c")("axxbc")
    assert like("%%")("") and like("_")("x") and not like("_")("")
    assert like("%ab%ab%")("xxabyyab") and not like("%ab%ab%")("xxab")
    assert like("ab%ba")("aba") is False and like("a%a")("aa")
    assert not like("%" + "a%" * 40 + "b")("a" * 5000)  # no catastrophic backtracking


def test_logical_plan_is_printable_and_rules_are_separate():
    from npmdb.query.binder import build

    text = "SELECT phrase FROM MASKED('a [MASK]') USING exact WHERE doc.id = 'x' AND support > 1"
    raw = build(parse(text), text)
    assert isinstance(L.chain(raw)[-1], L.Retrieve) and L.chain(raw)[-1].method == "exact"
    assert "Filter[where] (doc.id = 'x' AND support > 1)" in L.explain(raw)
    plan, notes = optimize(raw, text)
    assert [n.split(":")[0] for n in notes] == ["choose_exact_scan", "push_document_predicates",
                                                 "split_answer_predicates", "default_limit",
                                                 "fold_limit_into_top"]
    printed = L.explain(plan)
    assert "Filter[answer] (support > 1)" in printed and "docs: doc.id = 'x'" in printed


def test_cli_sql(db, tiny_db_path):
    # another process: LMDB opens an environment once per process
    def cli(*args):
        return subprocess.run([sys.executable, "-m", "npmdb", "sql", str(tiny_db_path), *args],
                              capture_output=True, text=True, timeout=60)

    out = cli("SELECT doc_id, block FROM SEARCH(?) LIMIT 3", "--params", json.dumps(["city"]), "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [{"doc_id": h["doc_id"], "block": h["block"]}
                                      for h in db.search("city", limit=3)]
    out = cli("SELECT phrse FROM MASKED('a [MASK]')")
    assert out.returncode == 2 and "did you mean phrase" in out.stderr
    # the table: one line a row, whatever the cells hold (a text with newlines, NULL, JSON)
    out = cli("SELECT id, text, meta, doc.meta.none AS missing FROM DOCUMENTS LIMIT 4")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 2 + 4 and "NULL" in lines[2] and "{" in lines[2]


# ---------------------------------------------------------------- fuzzing

FRAGMENTS = [
    "SELECT", "EXPLAIN", "ANALYZE", "SHOW", "VERSIONS", "TAGS", "FROM", "MASKED", "TOKENS",
    "CLASSIFY", "EVIDENCE", "SEARCH", "DOCUMENTS", "LABELS", "(", ")", ",", "*", ".", "phrase",
    "score", "support", "label", "tokens", "length", "doc.title", "doc.meta.year", "doc.id",
    "doc_id", "title", "id", "meta", "snippet", "rank", "length(phrase)", "lower(title)",
    "'x [MASK]'", "'Paris is the capital of [MASK].'", "'city'", "'great'", "'%a%'", "''",
    "?", ":q", "WHERE", "AND", "OR", "NOT", "LIKE", "IN", "BETWEEN", "IS", "NULL", "=", "<", ">=",
    "!=", "+", "-", "/", "0", "1", "5", "-1", "2.5", "1e9", "99999999999", "USING", "bm25",
    "dense", "hybrid", "exact", "blocks", "k", "=>", "WITH", "tau", "max_len", "alpha", "mode",
    "'token'", "evidence", "GROUP", "BY", "document", "ORDER", "DESC", "ASC", "LIMIT", "OFFSET",
    "AS", "OF", "'HEAD'", ";", "TRUE", "FALSE", "pos", "=", "positive", "--", "/*", "*/", "\n",
]
VALID = [
    STATEMENT_1, STATEMENT_2,
    "SELECT * FROM MASKED(?) USING hybrid(k => 64, blocks => 2) WITH evidence = 1 LIMIT 3",
    "SELECT tokens, score FROM TOKENS('The capital of Greece is [MASK].') USING dense(k => 64) LIMIT 4",
    "SELECT phrase, doc_id FROM EVIDENCE('Salem is the capital of [MASK].') WHERE title LIKE 'S%' LIMIT 2",
    "SELECT doc_id, title, score FROM SEARCH('city') WHERE score > 1 ORDER BY title LIMIT 5",
    "SELECT id, title FROM DOCUMENTS WHERE title LIKE 'Sa%' OR id IN ('wn:1', 'x') LIMIT 10",
    "EXPLAIN ANALYZE SELECT phrase FROM MASKED(:q) USING exact(k => 32) WHERE length(phrase) <= 2 AND "
    "doc.id LIKE 'wn:%' ORDER BY support DESC LIMIT 5 OFFSET 1",
    "SELECT phrase FROM MASKED('a [MASK] b') AS OF 1 USING bm25(blocks => 2) WITH max_len = 3, "
    "tau = 0.5, alpha = 1, scoring = raw, no_stopwords = TRUE GROUP BY tokens",
    "SHOW VERSIONS", "SHOW TAGS",
]
PARAMS = st.sampled_from([None, [], [Q], [Q, 2], {"q": Q}, {"q": 3}, [1.5, "a"], ["x [MASK]"] * 3])


FUZZ_OUTCOMES: dict[str, int] = {}


def _run_safely(db, text, params):
    outcome = "ok"
    try:
        with time_limit(20):
            db.sql(text, params)
    except Error as exc:  # every failure must be an npmdb.Error; anything else fails the test
        outcome = type(exc).__name__
    FUZZ_OUTCOMES[outcome] = FUZZ_OUTCOMES.get(outcome, 0) + 1


_fuzz = settings(max_examples=120, deadline=None, derandomize=True,
                 suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@_fuzz
@given(text=st.lists(st.sampled_from(FRAGMENTS), max_size=24).map(" ".join), params=PARAMS)
def test_fuzz_token_soup(db, text, params):
    _run_safely(db, text, params)


@_fuzz
@given(base=st.sampled_from(VALID), edits=st.lists(st.tuples(
    st.sampled_from(["delete", "insert", "replace", "duplicate"]), st.integers(0, 10_000),
    st.integers(1, 12), st.sampled_from(FRAGMENTS + list("()',;:?*-=.0123456789 \"`\\"))),
    max_size=4), params=PARAMS, fit=st.booleans())
def test_fuzz_mutated_queries(db, base, edits, params, fit):
    text = base
    for op, at, n, frag in edits:
        i = at % (len(text) + 1)
        if op == "delete":
            text = text[:i] + text[i + n:]
        elif op == "insert":
            text = text[:i] + frag + text[i:]
        elif op == "replace":
            text = text[:i] + frag + text[i + n:]
        else:
            text = text[:i] + text[i:i + n] + text[i:]
    if fit:  # values for exactly the parameters the text has, so that most edits execute
        try:
            found = A.params(parse(text))
        except Error:
            found = ()
        names = {p.name for p in found if p.name}
        params = {n: Q for n in names} if names else ([Q] * len(found) if found else None)
    _run_safely(db, text, params)


@_fuzz
@given(text=st.text(max_size=60), params=PARAMS)
def test_fuzz_random_text(db, text, params):
    _run_safely(db, text, params)


_VALUES = st.sampled_from(["0", "1", "3", "64", "1000000000000", "-1", "0.5", "1e308", "-2.5",
                           "TRUE", "FALSE", "NULL", "'raw'", "token", "phrase", "''", "?"])
_PREDICATES = st.sampled_from([
    "phrase LIKE '%a%'", "length(phrase) <= 2", "support > 1", "score > 0.001", "doc.title LIKE 'S%'",
    "doc.id IN ('wn:00236194', 'x')", "doc.meta.year >= 2000", "title = 'springboard'", "tokens < 3",
    "phrase NOT IN ('act', 'genus')", "label = 'positive'", "snippet LIKE '%'", "id LIKE 'wn:%'",
    "score BETWEEN 0 AND 1", "doc.meta.x IS NULL", "lower(phrase) = 'act'", "1 = 1", "phrase > 3",
    "round(score, 2) >= 0", "coalesce(doc.meta.year, 0) = 0", "start > 3", "-score < 0",
])


@st.composite
def generated_queries(draw):
    """Grammatical statements with random (often invalid) choices of columns and values."""
    source = draw(st.sampled_from([
        "MASKED(?)", "TOKENS(?)", "EVIDENCE(?)", "SEARCH('city')", "DOCUMENTS",
        "CLASSIFY(?, LABELS(positive = ('great', 'act'), negative = 'genus'))"]))
    cols = draw(st.lists(st.sampled_from(["*", "phrase", "score", "support", "label", "tokens",
                                          "length(phrase)", "doc_id", "title", "snippet", "rank",
                                          "id", "text", "meta", "block", "evidence", "doc.meta.x"]),
                         min_size=1, max_size=4))
    sane = draw(st.integers(0, 4)) > 0  # mostly values of the right kind, so that most run
    if sane:
        pool = {"MASKED(?)": ["phrase", "score", "support", "tokens", "length(phrase)", "rank", "title"],
                "SEARCH('city')": ["doc_id", "title", "score", "block", "snippet"],
                "DOCUMENTS": ["id", "title", "meta", "text"]}.get(source, ["phrase", "score", "doc_id"])
        cols = [c if c in pool or c == "*" else pool[i % len(pool)] for i, c in enumerate(cols)]
    # each name once ('*' names its columns too)
    cols = ["*"] if "*" in cols else list(dict.fromkeys(cols))
    text = f"SELECT {', '.join(cols)} FROM {source}"
    if draw(st.booleans()):
        text += " AS OF " + draw(st.sampled_from(["1", "'HEAD'", "'nope'", "0"]))
    masked = source not in ("SEARCH('city')", "DOCUMENTS")
    method = "dense" if source.startswith("CLASSIFY") else "bm25"  # without USING
    if draw(st.booleans()) and (masked or not sane):
        method = draw(st.sampled_from(["dense", "bm25", "hybrid", "exact"]))
        arg = draw(st.sampled_from(["", "k", "blocks"]))
        if sane:
            arg = {"bm25": "blocks", "dense": "k", "exact": "k"}.get(method, arg)
        value = draw(st.sampled_from(["1", "3", "64", "1000000000000"]) if sane else _VALUES)
        text += f" USING {method}" + (f"({arg} => {value})" if arg else "")
    opts = draw(st.lists(st.sampled_from(["k", "blocks", "max_len", "tau", "exact", "clean_edges",
                                          "evidence", "mode", "alpha", "scoring", "no_stopwords"]),
                         max_size=4, unique=True))
    if sane:
        # options the retrieval or the mode (token, where it may be) uses: SQL refuses others
        unused = {"bm25": {"k", "exact"}, "dense": {"blocks"}, "exact": {"blocks"}}.get(method, set())
        if source == "TOKENS(?)" or "mode" in opts:
            unused |= {"max_len", "scoring", "no_stopwords", "clean_edges"}
        opts = [o for o in opts if masked and o not in text and o not in unused
                and not (source.startswith("CLASSIFY") and o in ("alpha", "scoring", "no_stopwords"))]
    good = {"k": ["1", "16", "100000"], "blocks": ["1", "7", "100000"], "max_len": ["1", "5", "64"],
            "tau": ["0.1", "1", "50"], "alpha": ["-1", "0", "2.5"], "exact": ["TRUE", "FALSE"],
            "clean_edges": ["TRUE", "FALSE"], "no_stopwords": ["TRUE", "FALSE"], "scoring": ["raw", "npm"],
            "evidence": ["1", "2", "1000"], "mode": ["token", "'phrase'"]}
    if opts:
        text += " WITH " + ", ".join(
            f"{o} = {draw(st.sampled_from(good[o]) if sane else _VALUES)}" for o in opts)
    preds = draw(st.lists(_PREDICATES, max_size=3 if not sane else 1))
    if preds:
        text += " WHERE " + draw(st.sampled_from([" AND ", " OR "])).join(preds)
    if draw(st.booleans()):
        text += " GROUP BY " + draw(st.sampled_from(["phrase", "tokens", "document", "word", "label"]))
    if draw(st.booleans()):
        text += " ORDER BY " + draw(st.sampled_from(["score DESC", "phrase", "1", "support, length(phrase)",
                                                     "title", "doc_id DESC", "length"]))
    if draw(st.booleans()):
        text += " LIMIT " + draw(st.sampled_from(["0", "1", "5", "1000000000", "?"]))
    if draw(st.booleans()):
        text += " OFFSET " + draw(st.sampled_from(["0", "3", "1000000000"]))
    if draw(st.integers(0, 5)) == 0:
        text = draw(st.sampled_from(["EXPLAIN ", "EXPLAIN ANALYZE "])) + text
    return text


@settings(_fuzz, max_examples=300)
@given(text=generated_queries(), value=st.sampled_from([Q, "Salem is the capital of [MASK].", 3, 0.5, "x"]))
def test_fuzz_generated_queries(db, text, value):
    _run_safely(db, text, [value] * text.count("?"))


def test_fuzzing_reached_execution():
    """The mutated queries above must not all die in the parser."""
    if not FUZZ_OUTCOMES:
        pytest.skip("run with the fuzz tests")
    assert FUZZ_OUTCOMES.get("ok", 0) >= 100, FUZZ_OUTCOMES


# ---------------------------------------------------------------- values, names and options

def test_integers_hold_to_64_bits(db):
    one = "SELECT {} AS v FROM DOCUMENTS LIMIT 1"
    assert db.sql(one.format("-9223372036854775808")).rows == ((-2 ** 63,),)
    assert db.sql(one.format("?"), [-2 ** 63]).rows == ((-2 ** 63,),)
    for text in ("9223372036854775808", "5 - 9223372036854775808"):
        with pytest.raises(QueryParseError, match="integer out of range"):
            db.sql(one.format(text))
    # computed values: the literals' range, as a DataError placed in the statement and row
    for text, message in (("9223372036854775807 + 1", "integer out of range"),
                          ("-(-9223372036854775808)", "integer out of range"),
                          ("abs(-9223372036854775807 - 1)", "integer out of range"),
                          ("1e308 * 10", "number out of range"),
                          ("*".join(["9223372036854775807"] * 20) + " + 0.5",
                           "integer out of range")):
        with pytest.raises(npmdb.QueryDataError, match=message) as err:
            db.sql(one.format(text))
        assert err.value.column == 8 and "(in document " in str(err.value)


def test_round_takes_halves_away_from_zero(db):
    got = db.sql("SELECT round(2.5) AS a, round(0.5) AS b, round(-2.5) AS c, "
                 "round(2.675, 2) AS d, round(25, -1) AS e, round(7) AS f "
                 "FROM DOCUMENTS LIMIT 1").rows
    assert got == ((3.0, 1.0, -3.0, 2.68, 30, 7),)
    assert isinstance(got[0][4], int)


def test_column_names_come_from_the_statement_not_the_values(db):
    q = "SELECT ?, ? + 1 FROM DOCUMENTS LIMIT 1"
    for values in ([1, 1], [2, 5]):
        assert db.sql(q, values).columns == ("?", "? + 1")
    for values in ([1, 2], [1, 1]):  # refused whatever the values
        with pytest.raises(QueryParseError, match="two select items are named '\\?'"):
            db.sql("SELECT ?, ? FROM DOCUMENTS LIMIT 1", values)
    assert db.sql("SELECT :a AS a FROM DOCUMENTS LIMIT 1", {"a": 3}).columns == ("a",)


def test_select_star_twice_is_refused_like_a_repeated_column(db):
    for text in ("SELECT *, * FROM DOCUMENTS", "SELECT title, * FROM DOCUMENTS",
                 "SELECT *, id FROM DOCUMENTS"):
        with pytest.raises(QueryParseError, match="two select items are named"):
            db.sql(text)


def test_order_by_an_alias_in_any_case(db):
    want = db.sql("SELECT id FROM DOCUMENTS ORDER BY id DESC LIMIT 3").rows
    assert db.sql("SELECT id AS X FROM DOCUMENTS ORDER BY x DESC LIMIT 3").rows == want
    assert db.sql("SELECT id AS x FROM DOCUMENTS ORDER BY X DESC LIMIT 3").rows == want


def test_explain_checks_as_of_like_the_statement(db):
    for prefix in ("", "EXPLAIN ", "EXPLAIN ANALYZE "):
        with pytest.raises(QueryParseError, match="no version or tag named 'no-such-tag'"):
            db.sql(prefix + "SELECT id FROM DOCUMENTS AS OF 'no-such-tag'")


@pytest.mark.parametrize("text, message", [
    ("SELECT phrase FROM MASKED(?) WITH k = 7", "k is not used by bm25 retrieval "
                                                 "\\(the default of MASKED\\)"),
    ("SELECT phrase FROM MASKED(?) USING bm25(blocks => 3) WITH exact = TRUE",
     "exact is not used by bm25 retrieval"),
    ("SELECT phrase FROM MASKED(?) USING dense(k => 32) WITH blocks = 1",
     "blocks is not used by dense retrieval"),
    ("SELECT phrase FROM MASKED(?) USING exact(k => 32) WITH bm25_prior = 1",
     "bm25_prior is not used by exact retrieval"),
    ("SELECT phrase FROM TOKENS(?) WITH max_len = 1", "max_len is not used by token mode"),
    ("SELECT phrase FROM MASKED(?) WITH mode = token, clean_edges = FALSE",
     "clean_edges is not used by token mode"),
    ("SELECT label FROM CLASSIFY(?, LABELS(a = 'good', b = 'bad')) WITH bm25_title = FALSE",
     "bm25_title is not used by dense retrieval \\(the default of CLASSIFY\\)"),
    ("SELECT phrase, doc_id FROM MASKED(?) WITH evidence = 0",
     "doc_id comes from an answer's best occurrence"),
    ("SELECT phrase, snippet FROM MASKED(?) WITH evidence = 0", "snippet comes from"),
])
def test_options_the_plan_would_not_use_are_refused(db, text, message):
    with pytest.raises(QueryParseError, match=message):
        db.sql(text, [Q] if "CLASSIFY" not in text else ["It was [MASK]."])


def test_options_the_plan_uses_are_accepted(db):
    want = db.fill_mask(Q, retrieval="dense", k=64, exact=True)
    got = db.sql("SELECT phrase FROM MASKED(?) WITH exact = TRUE, k = 64", [Q])
    assert key(got.answers) == key(want.answers)
    got = db.sql("SELECT phrase, evidence FROM MASKED(?) WITH evidence = 0", [Q])
    assert got.rows and all(r[1] == [] for r in got.rows)


def test_in_a_list_of_values_is_a_set_lookup_that_compares_as_equals_does():
    """``x IN (literals)`` is a set lookup (a 200,000-id list took seconds per row scan); it
    must give what the item-by-item '=' gives: numbers across int, float and TRUE/FALSE,
    text exactly, NULL as unknown."""
    from npmdb.query.evaluate import compile_expr
    from npmdb.query.parser import parse

    rng = random.Random(7)
    pool = [None, True, False, 0, 1, 1.0, 2, 2.5, "a", "1", ""]
    values = pool + [[1], {"x": 1}, "A"]

    def sql(v):
        if v is None or isinstance(v, bool):
            return {None: "NULL", True: "TRUE", False: "FALSE"}[v]
        return repr(v) if not isinstance(v, str) else f"'{v}'"

    for _ in range(300):
        items = ", ".join(sql(v) for v in rng.sample(pool, rng.randint(1, 5)))
        for neg in ("", "NOT "):
            # upper('qqqq') equals none of the values and keeps the list off the fast path
            where = parse(f"SELECT x FROM DOCUMENTS WHERE x {neg}IN ({items}) "
                          f"OR x {neg}IN ({items}, upper('qqqq'))").where
            fast, slow = (compile_expr(o) for o in where.operands)
            for v in values:
                assert fast({"x": v}) == slow({"x": v}), (items, neg, v)


def test_like_underscore_is_one_character_whatever_its_lower_case():
    from npmdb.query.evaluate import like

    assert like("_")("İ") and like("i_")("iİ") and like("%İst%")("İstanbul")
    assert like("ab_")("ABc") and not like("_")("ab")


def test_a_missing_number_in_meta_is_no_overflow(new_db):
    """A data frame's missing number is stored as NaN: arithmetic over it gives NaN, which
    compares as nothing, as before; only infinity is out of range."""
    new_db.add([{"id": "a", "text": "Paris is a city in France.", "meta": {"year": 1999.0}},
                {"id": "b", "text": "Rome is a city in Italy.", "meta": {"year": float("nan")}}])
    rows = dict(new_db.sql("SELECT id, doc.meta.year + 1 AS y FROM DOCUMENTS").rows)
    assert rows["a"] == 2000.0 and rows["b"] != rows["b"]
    assert new_db.sql("SELECT id FROM DOCUMENTS WHERE doc.meta.year * 2 > 0").rows == (("a",),)
    with pytest.raises(npmdb.QueryDataError, match="out of range"):
        new_db.sql("SELECT doc.meta.year * 1e308 AS y FROM DOCUMENTS")


def test_refused_options_and_values_name_what_the_user_wrote(db):
    with pytest.raises(QueryParseError, match=r"blocks is not used by dense retrieval "
                                              r"\(chosen by exact = TRUE\)"):
        db.sql("SELECT phrase FROM MASKED(?) WITH exact = TRUE, blocks = 3", [Q])
    # exact = FALSE is what bm25 does anyway
    want = db.sql("SELECT phrase FROM MASKED(?)", [Q]).rows
    assert db.sql("SELECT phrase FROM MASKED(?) WITH exact = FALSE", [Q]).rows == want
    with pytest.raises(QueryParseError, match="title comes from an answer's best occurrence"):
        db.sql("SELECT lower(title) AS t FROM MASKED(?) WITH evidence = 0", [Q])
    with pytest.raises(npmdb.QueryDataError, match=r"\(in answer '[^']+'\)"):
        db.sql("SELECT phrase, 9223372036854775807 + support AS x FROM MASKED(?) "
               "WITH evidence = 0", [Q])
    with pytest.raises(npmdb.QueryDataError, match=r"\(in answer '[^']+', document '[^']+'\)"):
        db.sql("SELECT phrase, 9223372036854775807 + support AS x FROM MASKED(?)", [Q])


def test_positioned_errors_survive_pickling():
    """A shard's worker process raises them too: they cross processes whole."""
    import pickle

    for cls in (QueryParseError, npmdb.QueryDataError):
        e = cls("bad value", text="SELECT x FROM DOCUMENTS", line=1, column=8, expected=("a",))
        back = pickle.loads(pickle.dumps(e))
        assert type(back) is cls and str(back) == str(e)
        assert (back.line, back.column, back.expected) == (1, 8, ("a",))


def test_top_zero_is_every_answer_and_limit_zero_is_none(db):
    """Documented: ``fill_mask(top=0)`` returns every answer, which SQL does not spell;
    ``LIMIT 0`` returns no rows."""
    every = db.fill_mask(Q, top=0).answers
    assert len(every) > 5
    assert [a.text for a in db.fill_mask(Q, top=len(every) + 10).answers] == \
        [a.text for a in every]
    assert db.sql("SELECT phrase FROM MASKED(?) LIMIT 0", [Q]).rows == ()


def test_order_by_a_field_holding_nan_sorts_it_with_the_nulls(new_db):
    """NaN (a DataFrame's missing number) compared as a number left the rows unsorted."""
    sizes = [5.0, float("nan"), 50.0, 1.0, None, 20.0]
    new_db.add([{"id": f"d{i}", "text": f"Town {i} is in Norway.",
                 "meta": {} if s is None else {"size": s}} for i, s in enumerate(sizes)])
    for order, want in (("DESC", [50.0, 20.0, 5.0, 1.0]), ("ASC", [1.0, 5.0, 20.0, 50.0])):
        got = [r[0] for r in new_db.sql(f"SELECT doc.meta.size FROM DOCUMENTS "
                                        f"ORDER BY doc.meta.size {order}").rows]
        assert got[:4] == want and all(v is None or v != v for v in got[4:]), got


def test_to_pandas_keeps_whole_numbers_with_a_gap_exact(new_db):
    """An int column with a missing value became float64 (2**53 + 1 read ...992.0)."""
    new_db.add([{"id": "a", "text": "x y", "meta": {"n": 2 ** 53 + 1}},
                {"id": "b", "text": "x z", "meta": {}}])
    frame = new_db.sql("SELECT id, doc.meta.n FROM DOCUMENTS ORDER BY id").to_pandas()
    assert str(frame["doc.meta.n"].dtype) == "Int64"
    assert int(frame["doc.meta.n"][0]) == 2 ** 53 + 1 and frame["doc.meta.n"].isna()[1]


def test_integer_division_like_on_booleans_and_one_line_plans(new_db):
    """`/` of integers is an integer, truncated toward zero (a float quotient lost 64-bit
    values); LIKE reads TRUE as 1, as `=` does (it read 'True'); a line break in a string
    literal stays inside its EXPLAIN row (it split the operator's line in two)."""
    new_db.add([{"id": "a", "text": "Paris.", "meta": {"n": 2 ** 63 - 1, "b": True}}])
    row = new_db.sql("SELECT 7 / 2 AS a, -7 / 2 AS b, 7 / -2 AS c, 7 / 2.0 AS d, "
                     "doc.meta.n / 1 = doc.meta.n AS e, 1 / 0 AS f, "
                     "doc.meta.b LIKE '1' AS g, doc.meta.b LIKE 'true' AS h "
                     "FROM DOCUMENTS").to_list()[0]
    assert row == {"a": 3, "b": -3, "c": -3, "d": 3.5, "e": True, "f": None, "g": True,
                   "h": False}
    with pytest.raises(npmdb.QueryDataError, match="integer out of range"):
        new_db.sql("SELECT -9223372036854775808 / -1 AS x FROM DOCUMENTS")
    rows = {}
    for brk in ("z", "\n", "\r\n", "\u2028", "\x85", "\x0b"):
        for statement in ("EXPLAIN SELECT id FROM DOCUMENTS WHERE title = 'a{}b' ORDER BY id",
                          "EXPLAIN SELECT phrase FROM MASKED('a{}b [MASK]') WHERE phrase LIKE "
                          "'x{}y'"):
            plan = new_db.sql(statement.replace("{}", brk)).rows
            rows.setdefault(statement, set()).add(len(plan))
        # names too: an alias, a meta key, a label (they were printed raw)
        for statement in ('EXPLAIN SELECT id AS "a{}b" FROM DOCUMENTS',
                          'EXPLAIN SELECT id FROM DOCUMENTS WHERE doc.meta."k{}z" = 1',
                          "EXPLAIN SELECT label FROM CLASSIFY('x [MASK]', "
                          "LABELS(\"p{}q\" = 'great', n = 'bad'))"):
            plan = new_db.sql(statement.replace("{}", brk)).rows
            rows.setdefault(statement, set()).add(len(plan))
    assert all(len(n) == 1 for n in rows.values()), rows



@pytest.mark.parametrize("statement, message", [
    ("SELECT id FROM DOCUMENTS GROUP BY id", "DOCUMENTS rows cannot be grouped"),
    ("SELECT doc_id FROM SEARCH('x')\nGROUP BY doc_id", "SEARCH rows cannot be grouped"),
    ("SELECT label FROM CLASSIFY('a [MASK]', LABELS(a = 'b')) GROUP BY phrase",
     "GROUP BY label, not phrase"),
])
def test_group_by_errors_point_at_the_key(db, statement, message):
    """They pointed at the statement's first column."""
    with pytest.raises(QueryParseError, match=message) as err:
        db.sql(statement)
    line = statement.splitlines()[err.value.line - 1]
    assert line[err.value.column - 1:].split()[0] in ("id", "doc_id", "phrase"), err.value
