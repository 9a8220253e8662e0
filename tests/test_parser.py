"""The query front end: lexer, parser, syntax tree dump and printer.

Golden files live in tests/golden/parser: NAME.sql is a query, NAME.tree the expected
``ast.dump`` followed by the canonical SQL, or, for ``error_*`` inputs, the rendered
QueryParseError. Regenerate with ``NPMDB_UPDATE_GOLDEN=1``.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parent.parent

try:
    import npmdb.query.parser  # noqa: F401
except ModuleNotFoundError:  # not installed: map npmdb.query onto ./query
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import npmdb  # noqa: F401

    if "npmdb.query" not in sys.modules:
        _spec = importlib.util.spec_from_file_location(
            "npmdb.query", ROOT / "query" / "__init__.py", submodule_search_locations=[str(ROOT / "query")])
        _mod = importlib.util.module_from_spec(_spec)
        sys.modules["npmdb.query"] = _mod
        _spec.loader.exec_module(_mod)

from npmdb.errors import Error, InterfaceError, ProgrammingError, QueryParseError  # noqa: E402
from npmdb.query import ast as A  # noqa: E402
from npmdb.query.lexer import KEYWORDS, MAX_QUERY_LENGTH, line_col, tokenize  # noqa: E402
from npmdb.query.parser import MAX_DEPTH, parse, parse_expression  # noqa: E402
from npmdb.query.printer import to_sql  # noqa: E402

GOLDEN = ROOT / "tests" / "golden" / "parser"
UPDATE = os.environ.get("NPMDB_UPDATE_GOLDEN") == "1"
CASES = sorted(p.stem for p in GOLDEN.glob("*.sql"))
VALID = [c for c in CASES if not c.startswith("error_")]
ERRORS = [c for c in CASES if c.startswith("error_")]
EXAMPLES = int(os.environ.get("NPMDB_FUZZ_EXAMPLES", "300"))  # raise it for a longer fuzzing run
FUZZ = settings(max_examples=EXAMPLES, deadline=2000, suppress_health_check=[HealthCheck.too_slow])


def _read(name: str) -> str:
    return (GOLDEN / f"{name}.sql").read_text(encoding="utf-8")


def _render(name: str) -> str:
    text = _read(name)
    try:
        tree = parse(text)
    except QueryParseError as exc:
        return f"QueryParseError: {exc}\n"
    return f"{A.dump(tree)}\n\n-- canonical SQL\n{to_sql(tree)}\n"


# ---------------------------------------------------------------- golden files

def test_golden_inventory():
    assert len(VALID) >= 25 and len(ERRORS) >= 10


@pytest.mark.parametrize("name", CASES)
def test_golden(name):
    actual = _render(name)
    expected_path = GOLDEN / f"{name}.tree"
    if UPDATE or not expected_path.exists():
        if not UPDATE:
            pytest.fail(f"missing {expected_path.name}; run with NPMDB_UPDATE_GOLDEN=1")
        expected_path.write_text(actual, encoding="utf-8")
    assert actual == expected_path.read_text(encoding="utf-8")
    assert actual.startswith("QueryParseError: ") == name.startswith("error_")


@pytest.mark.parametrize("name", VALID)
def test_golden_round_trip(name):
    tree = parse(_read(name))
    sql = to_sql(tree)
    assert parse(sql) == tree
    assert to_sql(parse(sql)) == sql  # canonical text is a fixed point


# ---------------------------------------------------------------- specific behaviour

def test_tree_shapes():
    t = parse("SELECT phrase, score FROM MASKED('a [MASK]') USING bm25(blocks => 3) "
              "WITH max_len = 10, tau = 1.0 ORDER BY score DESC LIMIT 5")
    assert t == A.Select(
        columns=(A.SelectItem(A.Name(("phrase",))), A.SelectItem(A.Name(("score",)))),
        source=A.Masked(A.Literal("a [MASK]")),
        using=A.Using("bm25", (A.Option("blocks", A.Literal(3)),)),
        options=(A.Option("max_len", A.Literal(10)), A.Option("tau", A.Literal(1.0))),
        order_by=(A.OrderItem(A.Name(("score",)), descending=True),),
        limit=A.Literal(5),
    )
    assert t.source.pos == 26 and t.pos == 0  # positions kept, but not compared
    assert isinstance(parse("SELECT * FROM TOKENS('[MASK]')").source, A.Masked)
    assert parse("SELECT * FROM TOKENS('[MASK]')").source.tokens is True


def test_literal_kinds_are_distinct():
    assert A.Literal(1) != A.Literal(1.0) != A.Literal(True)
    assert A.Literal(1) == A.Literal(1) and hash(A.Literal("x")) == hash(A.Literal("x", pos=3))
    assert parse_expression("1").kind == "integer"
    assert parse_expression("1.0").kind == "float"
    assert parse_expression("true") == A.Literal(True)
    assert parse_expression("null") == A.Literal(None)
    assert parse_expression("-3") == A.Literal(-3)
    assert parse_expression("-(3)") == A.UnaryOp("-", A.Literal(3))
    with pytest.raises(TypeError):
        A.Literal([1])


def test_params_numbered_in_text_order():
    t = parse("SELECT a FROM MASKED(?) AS OF :v USING bm25(blocks => ?) WITH tau = ? "
              "WHERE x IN (?, :y) LIMIT ? OFFSET ?")
    ps = A.params(t)
    assert [(p.name, p.index) for p in ps] == [
        (None, 0), ("v", None), (None, 1), (None, 2), (None, 3), ("y", None), (None, 4), (None, 5)]
    assert A.params(parse(to_sql(t))) == ps


def test_normalisations():
    e = parse_expression("a <> b")
    assert e == A.BinaryOp("!=", A.Name(("a",)), A.Name(("b",)))
    t = parse("select X from masked('m') using HYBRID(K => 1) with TAU = 1 group by PHRASE")
    assert t.using.method == "hybrid" and t.using.args[0].name == "k"
    assert t.options[0].name == "tau" and t.group_by == "phrase"
    assert t.columns[0].expr == A.Name(("X",))  # names keep their spelling
    assert parse_expression("LENGTH(x)") == A.Call("length", (A.Name(("x",)),))
    # A bare word as an option value is a string.
    assert parse("SELECT a FROM MASKED('m') WITH mode = token").options[0].value == A.Literal("token")
    # USING exact == USING exact(); label words: 'w' == ('w')
    assert parse("SELECT a FROM MASKED('m') USING exact") == parse("SELECT a FROM MASKED('m') USING exact()")
    assert (parse("SELECT a FROM CLASSIFY('m', LABELS(p = 'w'))")
            == parse("SELECT a FROM CLASSIFY('m', LABELS(p = ('w')))"))


def test_bool_chains_are_flat_but_parentheses_nest():
    a, b, c = (A.Name((x,)) for x in "abc")
    assert parse_expression("a AND b AND c") == A.BoolOp("AND", (a, b, c))
    assert parse_expression("(a AND b) AND c") == A.BoolOp("AND", (A.BoolOp("AND", (a, b)), c))
    assert parse_expression("a OR b AND c") == A.BoolOp("OR", (a, A.BoolOp("AND", (b, c))))
    assert parse_expression("NOT a = b") == A.UnaryOp("NOT", A.BinaryOp("=", a, b))


def test_strings_comments_and_escapes():
    t = parse("SELECT a -- comment 'not a string\nFROM MASKED('it''s -- [MASK] /* x */') /* c */")
    assert t.source.query == A.Literal("it's -- [MASK] /* x */")
    assert to_sql(t) == "SELECT a FROM MASKED('it''s -- [MASK] /* x */')"


def test_printer_never_writes_a_comment():
    e = A.BinaryOp("-", A.Name(("a",)), A.UnaryOp("-", A.UnaryOp("-", A.Literal(-1))))
    sql = to_sql(e)
    assert "--" not in sql
    assert parse_expression(sql) == e


def test_dump_is_deterministic_and_skips_defaults():
    t = parse("SELECT phrase FROM MASKED('x [MASK]')")
    assert A.dump(t) == A.dump(parse(to_sql(t)))
    assert "descending" not in A.dump(t) and "pos" not in A.dump(t)
    assert A.dump(t).splitlines()[0] == "Select"


def test_walk_visits_in_text_order():
    t = parse("SELECT a, b FROM MASKED('q') WHERE c = d")
    names = [n.parts[0] for n in A.walk(t) if isinstance(n, A.Name)]
    assert names == ["a", "b", "c", "d"]


def test_answer_columns_listed():
    from npmdb.query.logical import column_names

    for col in ("phrase", "score", "support", "tokens", "length", "evidence", "doc_id", "title",
                "start", "end", "snippet", "label", "version", "generation", "rank"):
        assert col in column_names("MASKED")


# ---------------------------------------------------------------- errors

def _error(text: str) -> QueryParseError:
    with pytest.raises(QueryParseError) as info:
        parse(text)
    assert isinstance(info.value, ProgrammingError)
    return info.value


@pytest.mark.parametrize("text, line, column, expected", [
    ("SELECT phrase\nFROM MASKED('x')\nLIMT 5", 3, 1, "LIMIT"),
    ("SELECT phrase,\n  score\n  FORM MASKED('x')", 3, 3, "FROM"),
    ("\n\n   SELECT a FROM MASKED('x'\n   LIMIT 5", 4, 4, "')'"),
    ("SELECT a\r\nFROM DOCUMENTS\r\nWHERE a = 'open", 3, 11, "closing \"'\""),
    ("SELECT a FROM DOCUMENTS\n\n  WHERE (a = 1", 3, 15, "')'"),
    ("SELECT a FROM MASKED('é\nç') WHERE ) ", 2, 11, "an expression"),
])
def test_error_positions(text, line, column, expected):
    err = _error(text)
    assert (err.line, err.column) == (line, column)
    assert expected in err.expected
    src = text.splitlines()[line - 1]
    assert f"\n  {src}\n  {' ' * (column - 1)}^" in str(err)


@pytest.mark.parametrize("text, hint", [
    ("SELCT a FROM DOCUMENTS", "did you mean SELECT?"),
    ("SELECT a FROM MASKD('x')", "did you mean MASKED?"),
    ("SELECT a FROM CLASIFY('x', LABELS(a = 'b'))", "did you mean CLASSIFY?"),
    ("SELECT a FROM MASKED('x') USING bm52", "did you mean bm25?"),
    ("SELECT a FROM MASKED('x') USING dens(k => 1)", "did you mean dense?"),
    ("SELECT a FROM MASKED('x') WHER a = 1", "did you mean WHERE?"),
    ("SELECT a FROM MASKED('x') GROPU BY phrase", "did you mean GROUP?"),
    ("SELECT a FROM MASKED('x') LIMIT 1 OFSET 2", "did you mean OFFSET?"),
    ("EXPLAIN ANALYSE SELECT a FROM DOCUMENTS", "did you mean ANALYZE?"),
    ("SHOW TAG", "did you mean TAGS?"),
])
def test_did_you_mean(text, hint):
    assert hint in str(_error(text))


@pytest.mark.parametrize("text, message", [
    ("", "empty query"),
    ("   -- only a comment\n", "empty query"),
    ("SELECT 'abc", "unterminated string"),
    ('SELECT "abc', "unterminated quoted identifier"),
    ('SELECT "" FROM DOCUMENTS', "empty quoted identifier"),
    ("SELECT a /* x", "unterminated comment"),
    ("SELECT 1.2.3", "bad number"),
    ("SELECT 12abc", "bad number"),
    ("SELECT 1e", "bad number"),
    ("SELECT 1e999 FROM DOCUMENTS", "number out of range"),
    ("SELECT 9223372036854775808 FROM DOCUMENTS", "integer out of range"),
    ("SELECT a FROM DOCUMENTS WHERE a # b", "unexpected character '#'"),
    ("SELECT a FROM DOCUMENTS WHERE a ! b", "unexpected character '!'"),
    ("SELECT a FROM DOCUMENTS WHERE a = : b", "bad parameter"),
    ("SELECT a FROM DOCUMENTS WHERE a = \x00", "unexpected character U+0000"),
    ("SELECT a FROM DOCUMENTS; SELECT b FROM DOCUMENTS", "one statement per query"),
    ("SELECT a FROM DOCUMENTS;;", "one statement per query"),
    ("SELECT a FROM DOCUMENTS LIMIT 1 WHERE a", "WHERE must come before LIMIT"),
    ("SELECT a FROM DOCUMENTS WHERE a WHERE b", "duplicate WHERE clause"),
    ("SELECT a FROM MASKED('x') WITH k = 1, K = 2", "duplicate option 'k'"),
    ("SELECT a FROM MASKED('x') USING hybrid(k => 1, k => 2)", "duplicate option 'k'"),
    ("SELECT a FROM CLASSIFY('x', LABELS(a = 'b', a = 'c'))", "duplicate label 'a'"),
    ("SELECT a FROM CLASSIFY('x', LABELS('' = 'b', c = 'd'))", "label names must be non-empty"),
    ("SELECT a FROM DOCUMENTS LIMIT 1.5", "LIMIT takes an integer"),
    ("SELECT a FROM DOCUMENTS OFFSET -2", "OFFSET must not be negative"),
    ("SELECT limit FROM DOCUMENTS", "LIMIT is a reserved word"),
    ("SELECT a FROM DOCUMENTS WHERE a = b = c", "unexpected '='"),
])
def test_error_messages(text, message):
    assert message in str(_error(text))


def test_an_empty_label_name_is_refused_where_it_stands():
    err = _error("SELECT label FROM CLASSIFY('x [MASK]', LABELS(a = 'b', '' = 'c'))")
    assert err.column == 56


def test_nesting_limit():
    ok = "SELECT a FROM DOCUMENTS WHERE " + "(" * (MAX_DEPTH - 1) + "a" + ")" * (MAX_DEPTH - 1)
    parse(ok)
    for deep in ("(" * 100_000 + "a" + ")" * 100_000, "NOT " * 10_000 + "a", "- " * 10_000 + "a",
                 "f(" * 5_000 + ")" * 5_000, " + ".join(["a"] * 5_000), "a IN (" * 5_000 + "1" + ")" * 5_000):
        assert "nested too deeply" in str(_error("SELECT a FROM DOCUMENTS WHERE " + deep))


def test_long_flat_queries_are_fine():
    t = parse("SELECT a FROM DOCUMENTS WHERE " + " AND ".join(f"a{i} = {i}" for i in range(5_000)))
    assert len(t.where.operands) == 5_000
    assert parse(to_sql(t)) == t


def test_size_cap():
    assert "too long" in str(_error("SELECT '" + "x" * MAX_QUERY_LENGTH + "'"))


def test_non_string_input():
    with pytest.raises(InterfaceError):
        parse(b"SELECT a FROM DOCUMENTS")  # type: ignore[arg-type]


def test_line_col_matches_splitlines():
    text = "a\r\nb\x0bc\u2028d\n"
    assert [line_col(text, text.index(ch)) for ch in "abcd"] == [(1, 1), (2, 1), (3, 1), (4, 1)]


# ---------------------------------------------------------------- fuzzing: only npmdb errors

def _parse_or_error(text: str) -> None:
    try:
        tree = parse(text)
    except QueryParseError as exc:
        assert exc.line >= 1 and exc.column >= 1
        str(exc)
        return
    except Error as exc:  # anything else from npmdb would be a bug in the parser
        raise AssertionError(f"{type(exc).__name__}: {exc}") from exc
    sql = to_sql(tree)
    assert parse(sql) == tree, (text, sql)


_ALPHABET = st.sampled_from(list("SELECTFROMWHEREselectfrom *,()'\";:?.-+/=<>!\n\t#0123456789abcxyz_é[]"))


@FUZZ
@given(st.text())
def test_fuzz_random_text(text):
    _parse_or_error(text)


@FUZZ
@given(st.text(_ALPHABET, max_size=80))
def test_fuzz_sql_like_text(text):
    _parse_or_error(text)


@FUZZ
@given(st.lists(st.sampled_from(
    sorted(KEYWORDS) + ["MASKED", "TOKENS", "CLASSIFY", "LABELS", "EVIDENCE", "SEARCH", "DOCUMENTS",
                        "VERSIONS", "TAGS", "phrase", "doc.title", "'x [MASK]'", "1", "-2.5", "?", ":p",
                        "(", ")", ",", "=", "=>", "<>", "*", "-", ";", "bm25", "length"]), max_size=30))
def test_fuzz_token_soup(words):
    _parse_or_error(" ".join(words))


_GOLDEN_TEXTS = [_read(c) for c in CASES]
_SNIPPETS = ["(", ")", "'", '"', ",", "--", "/*", "*/", ";", "?", ":", ".", "-", "NOT ", " AND ",
             "SELECT ", " FROM ", "WHERE ", "LIMIT 1", "''", "1e", "\n", "\x00", "é"]


@st.composite
def _char_mutation(draw):
    text = draw(st.sampled_from(_GOLDEN_TEXTS))
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(text)))
        op = draw(st.sampled_from(["delete", "insert", "swap", "duplicate"]))
        if op == "delete":
            text = text[:i] + text[i + 1:]
        elif op == "insert":
            text = text[:i] + draw(st.sampled_from(_SNIPPETS) | st.characters()) + text[i:]
        elif op == "swap" and i + 1 < len(text):
            text = text[:i] + text[i + 1] + text[i] + text[i + 2:]
        else:
            j = draw(st.integers(i, min(len(text), i + 10)))
            text = text[:j] + text[i:j] + text[j:]
    return text


@st.composite
def _token_mutation(draw):
    text = draw(st.sampled_from([t for t in _GOLDEN_TEXTS if not _lex_fails(t)]))
    pieces = [tok.text for tok in tokenize(text) if tok.kind != "eof"]
    for _ in range(draw(st.integers(1, 3))):
        if not pieces:
            break
        i = draw(st.integers(0, len(pieces) - 1))
        op = draw(st.sampled_from(["delete", "duplicate", "swap", "replace"]))
        if op == "delete":
            del pieces[i]
        elif op == "duplicate":
            pieces.insert(i, pieces[i])
        elif op == "swap":
            j = draw(st.integers(0, len(pieces) - 1))
            pieces[i], pieces[j] = pieces[j], pieces[i]
        else:
            pieces[i] = draw(st.sampled_from(pieces + _SNIPPETS + sorted(KEYWORDS)))
    return " ".join(pieces)


def _lex_fails(text: str) -> bool:
    try:
        tokenize(text)
    except QueryParseError:
        return True
    return False


@FUZZ
@given(_char_mutation())
def test_fuzz_character_mutations(text):
    _parse_or_error(text)


@FUZZ
@given(_token_mutation())
def test_fuzz_token_mutations(text):
    _parse_or_error(text)


# ---------------------------------------------------------------- generated trees round-trip

_ident = st.from_regex(r"[a-z_][a-z0-9_]{0,7}", fullmatch=True)
_any_name = _ident | st.text(min_size=1, max_size=8)
_param = st.builds(A.Param, name=st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,5}", fullmatch=True)) | st.just(A.Param(index=-1))
_int = st.integers(-(2**63) + 1, 2**63 - 1)
_literal = st.one_of(
    st.builds(A.Literal, st.text(max_size=12)),
    st.builds(A.Literal, _int),
    st.builds(A.Literal, st.floats(allow_nan=False, allow_infinity=False)),
    st.builds(A.Literal, st.booleans()),
    st.just(A.Literal(None)),
)
_leaf = st.one_of(_literal, _param, st.builds(A.Name, st.lists(_any_name, min_size=1, max_size=3).map(tuple)))


def _extend(inner):
    two_plus = st.lists(inner, min_size=2, max_size=4).map(tuple)
    return st.one_of(
        st.builds(A.Call, _ident, st.lists(inner | st.just(A.Star()), max_size=3).map(tuple)),
        st.builds(A.UnaryOp, st.sampled_from(["NOT", "-"]), inner),
        st.builds(A.BinaryOp, st.sampled_from(A.COMPARISON_OPS + A.ARITHMETIC_OPS), inner, inner),
        st.builds(A.BoolOp, st.sampled_from(["AND", "OR"]), two_plus),
        st.builds(A.Like, inner, inner, st.booleans()),
        st.builds(A.InList, inner, st.lists(inner, min_size=1, max_size=3).map(tuple), st.booleans()),
        st.builds(A.Between, inner, inner, inner, st.booleans()),
        st.builds(A.IsNull, inner, st.booleans()),
    )


_expr = st.recursive(_leaf, _extend, max_leaves=12)
_text_arg = st.builds(A.Literal, st.text(max_size=20)) | _param
_value = _literal | _param


def _unique_options():
    return st.lists(st.tuples(_ident, _value), max_size=3, unique_by=lambda t: t[0]).map(
        lambda xs: tuple(A.Option(n, v) for n, v in xs))


_labels = st.lists(st.tuples(_any_name, st.lists(_text_arg, min_size=1, max_size=3).map(tuple)),
                   min_size=1, max_size=3, unique_by=lambda t: t[0]).map(
    lambda xs: tuple(A.Label(n, w) for n, w in xs))
_source = st.one_of(
    st.builds(A.Masked, _text_arg, st.booleans()),
    st.builds(A.Classify, _text_arg, _labels | _param),
    st.builds(A.Evidence, _text_arg),
    st.builds(A.Search, _text_arg),
    st.just(A.Documents()),
)
_item = st.builds(A.SelectItem, _expr, st.none() | _any_name) | st.just(A.SelectItem(A.Star()))
_count = st.none() | st.builds(A.Literal, st.integers(0, 2**63 - 1)) | _param
_select = st.builds(
    A.Select,
    columns=st.lists(_item, min_size=1, max_size=4).map(tuple),
    source=_source,
    as_of=st.none() | st.builds(A.Literal, st.text(max_size=8)) | st.builds(A.Literal, st.integers(0, 10**6)) | _param,
    using=st.none() | st.builds(A.Using, st.sampled_from(A.RETRIEVAL_METHODS), _unique_options()),
    options=_unique_options(),
    where=st.none() | _expr,
    group_by=st.none() | _ident,
    order_by=st.lists(st.builds(A.OrderItem, _expr, st.booleans()), max_size=3).map(tuple),
    limit=_count,
    offset=_count,
)
_statement = st.one_of(
    _select,
    st.builds(A.Explain, _select, st.booleans()),
    st.builds(A.Show, st.sampled_from(A.SHOW_TARGETS)),
)


def _renumber(node, counter=None):
    """Number positional Params 0, 1, ... in text order (the order the parser assigns)."""
    counter = counter if counter is not None else [0]
    if isinstance(node, tuple):
        return tuple(_renumber(x, counter) for x in node)
    if isinstance(node, A.Param):
        if node.name is None:
            counter[0] += 1
            return A.Param(index=counter[0] - 1)
        return node
    if isinstance(node, A.Node):
        changes = {f.name: _renumber(getattr(node, f.name), counter)
                   for f in dataclasses.fields(node) if f.init and f.compare}
        return dataclasses.replace(node, **changes)
    return node


@settings(max_examples=EXAMPLES + 100, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
@given(_statement)
def test_generated_trees_round_trip(tree):
    tree = _renumber(tree)
    sql = to_sql(tree)
    assert parse(sql) == tree, sql
    assert to_sql(parse(sql)) == sql
    assert A.dump(parse(sql)) == A.dump(tree)


@FUZZ
@given(_expr)
def test_generated_expressions_round_trip(expr):
    expr = _renumber(expr)
    assume(not isinstance(expr, A.Star))
    assert parse_expression(to_sql(expr)) == expr
