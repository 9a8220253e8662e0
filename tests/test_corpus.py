"""Tests for npmdb.corpus: every input kind, every validation error, the bundled sample."""

from __future__ import annotations

import csv
import gzip
import json
import os
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npmdb.corpus import Document, count_hint, read_documents, sample_path
from npmdb.errors import DataError, InterfaceError, NotSupportedError


def docs(source, **kw):
    return list(read_documents(source, **kw))


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows),
                    encoding="utf-8")
    return path


# ------------------------------------------------------------------ in-memory iterables


def test_strings():
    out = docs(["hello", "", "wörld \x00 ∑ 🙂"])
    assert out == [Document(None, "", "hello", {}), Document(None, "", "", {}),
                   Document(None, "", "wörld \x00 ∑ 🙂", {})]


def test_bytes_and_bytearray():
    out = docs([b"caf\xc3\xa9", bytearray(b"x"), memoryview(b"y")])
    assert [d.text for d in out] == ["café", "x", "y"]


def test_invalid_utf8_bytes_names_index_and_offset():
    with pytest.raises(DataError, match=r"documents\[1\]: invalid UTF-8 at byte offset 3"):
        docs([b"ok", b"abc\xff"])


def test_dicts_full():
    out = docs([{"id": 7, "title": "T", "text": "body", "meta": {"a": [1, 2.5, None, True]},
                 "lang": "en"}])
    assert out == [Document("7", "T", "body", {"a": [1, 2.5, None, True], "lang": "en"})]


def test_dict_defaults_and_nulls():
    out = docs([{"text": "x"}, {"text": "y", "id": None, "title": None, "meta": None}])
    assert out == [Document(None, "", "x", {}), Document(None, "", "y", {})]


def test_dict_custom_field_names():
    out = docs([{"doc_id": "a", "name": "N", "body": "B", "id": 3}],
               text_field="body", id_field="doc_id", title_field="name")
    assert out == [Document("a", "N", "B", {"id": 3})]


def test_tuple_meta_becomes_list_and_meta_is_copied():
    meta = {"t": (1, 2)}
    (d,) = docs([{"text": "x", "meta": meta}])
    assert d.meta == {"t": [1, 2]}
    meta["t"] = "changed"
    assert d.meta == {"t": [1, 2]}


def test_document_items_are_revalidated():
    good = Document("a", "t", "x", {"k": 1})
    assert docs([good]) == [good]
    with pytest.raises(DataError, match=r"documents\[0\]: 'text' is int"):
        docs([Document("a", "t", 5, {})])  # type: ignore[arg-type]
    with pytest.raises(DataError, match=r"documents\[0\]: 'meta' is list"):
        docs([Document("a", "t", "x", [1])])  # type: ignore[arg-type]


def test_generator_source_is_streamed():
    seen = []

    def gen():
        for i in range(3):
            seen.append(i)
            yield f"t{i}"

    it = read_documents(gen())
    assert seen == []
    assert next(it).text == "t0"
    assert seen == [0]


def test_unsupported_item_type():
    with pytest.raises(DataError, match=r"documents\[2\]: expected a str, bytes, dict"):
        docs(["a", "b", 3])


@pytest.mark.parametrize("bad, kind", [(None, "null"), (3, "int"), (1.5, "float"),
                                       (["a"], "list"), ({"x": 1}, "dict")])
def test_non_text_text(bad, kind):
    with pytest.raises(DataError, match=rf"documents\[1\]: 'text' is {kind}\b.*not text"):
        docs([{"text": "ok"}, {"text": bad}])


def test_missing_text_field_lists_found_fields():
    with pytest.raises(DataError, match=r"documents\[0\]: no 'text' field \(found: 'id', 'body'\)"):
        docs([{"id": "a", "body": "x"}])


def test_missing_text_field_empty_dict():
    with pytest.raises(DataError, match=r"found: none"):
        docs([{}])


@pytest.mark.parametrize("bad", ["", 1.0, True, ["a"], b"id"])
def test_bad_id(bad):
    with pytest.raises(DataError, match=r"documents\[0\]: 'id'"):
        docs([{"id": bad, "text": "x"}])


def test_empty_id_message_says_what_to_do():
    with pytest.raises(DataError, match="leave it out"):
        docs([{"id": "", "text": "x"}])


@pytest.mark.parametrize("bad", [1, ["t"], b"t", {"a": 1}])
def test_bad_title(bad):
    with pytest.raises(DataError, match=r"documents\[0\]: 'title' is .*must be a str"):
        docs([{"title": bad, "text": "x"}])


@pytest.mark.parametrize("bad", ["str", [1], 3])
def test_non_dict_meta(bad):
    with pytest.raises(DataError, match=r"documents\[0\]: 'meta' is .*must be a dict"):
        docs([{"text": "x", "meta": bad}])


@pytest.mark.parametrize("meta, where", [
    ({"a": {1, 2}}, r"meta\['a'\] is set"),
    ({"a": b"raw"}, r"meta\['a'\] is bytes"),
    ({"a": [object()]}, r"meta\['a'\]\[0\] is object"),
    ({1: "x"}, r"meta has the key 1 of type int"),
    ({"a": {"b": {2: 1}}}, r"meta\['a'\]\['b'\] has the key 2"),
    ({"a": 2**70}, r"64-bit integer"),
])
def test_non_serialisable_meta(meta, where):
    with pytest.raises(DataError, match=where):
        docs([{"text": "x", "meta": meta}])


def test_non_serialisable_extra_key():
    with pytest.raises(DataError, match=r"meta\['when'\] is complex"):
        docs([{"text": "x", "when": 1j}])


def test_cyclic_meta():
    cyc: list = []
    cyc.append(cyc)
    with pytest.raises(DataError, match="nested more than"):
        docs([{"text": "x", "meta": {"c": cyc}}])


def test_meta_clash_with_extra_key():
    with pytest.raises(DataError, match="both a top-level field and a key of 'meta'"):
        docs([{"text": "x", "meta": {"a": 1}, "a": 2}])


def test_meta_is_msgpack_serialisable():
    msgpack = pytest.importorskip("msgpack")
    (d,) = docs([{"text": "x", "meta": {"a": [1, -2**63, 2**64 - 1, 0.5, None, {"b": "ü"}]}}])
    assert msgpack.unpackb(msgpack.packb(d.meta)) == d.meta


def test_lone_surrogate_rejected():
    with pytest.raises(DataError, match="lone surrogate U\\+D800"):
        docs(["ok", "a\ud800b"])


def test_wrong_source_types():
    with pytest.raises(InterfaceError, match="single bytes"):
        read_documents(b"text")
    with pytest.raises(InterfaceError, match="single dict"):
        read_documents({"text": "x"})
    with pytest.raises(InterfaceError, match="single Document"):
        read_documents(Document(None, "", "x", {}))
    with pytest.raises(InterfaceError, match="cannot read documents from int"):
        read_documents(5)  # type: ignore[arg-type]
    with pytest.raises(InterfaceError, match="text_field"):
        read_documents(["x"], text_field="")
    with pytest.raises(InterfaceError, match="must differ"):
        read_documents(["x"], text_field="id")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text()))
def test_unicode_round_trip(texts):
    out = docs(texts)
    assert [d.text for d in out] == texts
    assert all(d.id is None and d.title == "" and d.meta == {} for d in out)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.text()))
def test_unicode_round_trip_through_jsonl(tmp_path_factory, texts):
    path = tmp_path_factory.mktemp("rt") / "c.jsonl"
    write_jsonl(path, [{"text": t} for t in texts])
    assert [d.text for d in docs(path)] == texts


# ------------------------------------------------------------------ data frames / arrow


def test_pandas_dataframe():
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame({"id": ["a", "b"], "text": ["x", "y"], "n": [1, 2]})
    out = docs(frame)
    assert out == [Document("a", "", "x", {"n": 1}), Document("b", "", "y", {"n": 2})]
    assert count_hint(frame) == 2


def test_pandas_missing_text_is_reported_by_row():
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame({"text": ["x", None]})
    with pytest.raises(DataError, match=r"row 1: 'text' is (null|NaN)"):
        docs(frame)


def test_pandas_missing_title_and_id_are_missing():
    """pandas stores a missing str as NaN: a NaN title is no title, a NaN id lets the
    database assign one, as None does (and as in an Arrow table)."""
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame({"id": ["a", None], "title": [None, "B"], "text": ["x", "y"]})
    assert docs(frame) == [Document("a", "", "x", {}), Document(None, "B", "y", {})]


def test_a_data_frames_missing_cells_are_none_as_in_its_parquet_file(tmp_path):
    """A str column's missing cell was stored as a float NaN (it escaped IS NULL and read
    'null' in Arrow), where the frame's Parquet file holds None."""
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame({"id": ["a", "b"], "text": ["x", "y"], "license": ["MIT", None],
                          "size": [1.5, float("nan")],
                          "kind": pd.Categorical(["k", None])})
    frame.to_parquet(tmp_path / "f.parquet")
    from_frame = [d.meta for d in docs(frame)]
    assert from_frame == [d.meta for d in docs(tmp_path / "f.parquet")]
    assert from_frame[1] == {"license": None, "size": None, "kind": None}
    assert from_frame[0] == {"license": "MIT", "size": 1.5, "kind": "k"}


def test_arrow_table():
    pa = pytest.importorskip("pyarrow")
    table = pa.table({"text": ["x", "y"], "title": ["A", None]})
    assert docs(table) == [Document(None, "A", "x", {}), Document(None, "", "y", {})]
    assert count_hint(table) == 2


# ------------------------------------------------------------------ paths


def test_str_source_missing_file_is_data_error(tmp_path):
    with pytest.raises(DataError, match="file not found.*pass a list of strings"):
        read_documents(str(tmp_path / "nope.jsonl"))
    with pytest.raises(DataError, match="file not found.*list of strings"):
        read_documents("some raw text\nwith lines")
    with pytest.raises(DataError, match="file not found"):
        read_documents("x" * 5000)
    with pytest.raises(DataError, match="file not found"):
        read_documents("nul\x00inside")


def test_pathlike_missing(tmp_path):
    with pytest.raises(DataError, match="file not found"):
        read_documents(tmp_path / "nope")
    with pytest.raises(DataError, match=r"documents\[1\]: file not found"):
        docs([tmp_path, tmp_path / "nope"])


def test_jsonl(tmp_path):
    p = write_jsonl(tmp_path / "c.jsonl", [{"id": 1, "title": "A", "text": "x"},
                                           {"text": "y", "src": "s"}])
    (tmp_path / "c.jsonl").write_bytes(p.read_bytes() + b"\n  \n")  # blank lines are skipped
    assert docs(p) == [Document("1", "A", "x", {}), Document(None, "", "y", {"src": "s"})]
    assert docs(str(p)) == docs(p)


def test_jsonl_bom_and_crlf(tmp_path):
    p = tmp_path / "c.jsonl"
    p.write_bytes(b"\xef\xbb\xbf" + b'{"text": "a"}\r\n{"text": "b"}\r\n')
    assert [d.text for d in docs(p)] == ["a", "b"]


def test_jsonl_string_lines(tmp_path):
    p = tmp_path / "c.jsonl"
    p.write_text('"just text"\n', encoding="utf-8")
    assert docs(p) == [Document(None, "", "just text", {})]


def test_jsonl_gz(tmp_path):
    p = tmp_path / "c.jsonl.gz"
    with gzip.open(p, "wt", encoding="utf-8") as f:
        f.write('{"id": "a", "text": "x"}\n{"id": "b", "text": "y"}\n')
    assert [d.id for d in docs(p)] == ["a", "b"]


def test_bad_gzip(tmp_path):
    p = tmp_path / "c.jsonl.gz"
    p.write_bytes(b"not gzip at all\n")
    with pytest.raises(DataError, match="not a valid gzip file"):
        docs(p)


def test_truncated_gzip(tmp_path):
    p = tmp_path / "c.jsonl.gz"
    data = gzip.compress(b"".join(b'{"text": "%d"}\n' % i for i in range(2000)))
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match="gzip"):
        docs(p)


def test_malformed_json_line(tmp_path):
    p = tmp_path / "c.jsonl"
    p.write_text('{"text": "ok"}\n{"text": oops}\n', encoding="utf-8")
    with pytest.raises(DataError, match=rf"{p.name}:2: malformed JSON at column 10"):
        docs(p)


def test_jsonl_line_not_object(tmp_path):
    p = tmp_path / "c.jsonl"
    p.write_text('{"text": "ok"}\n[1, 2]\n', encoding="utf-8")
    with pytest.raises(DataError, match=rf"{p.name}:2: expected a JSON object .*got an array"):
        docs(p)


def test_jsonl_errors_name_path_and_line(tmp_path):
    p = write_jsonl(tmp_path / "c.jsonl", [{"text": "a"}, {"text": "b"}, {"body": "c"}])
    with pytest.raises(DataError, match=rf"{p.name}:3: no 'text' field \(found: 'body'\)"):
        docs(p)
    p = write_jsonl(tmp_path / "d.jsonl", [{"text": "a"}, {"text": None}])
    with pytest.raises(DataError, match=rf"{p.name}:2: 'text' is null"):
        docs(p)
    p = write_jsonl(tmp_path / "e.jsonl", [{"text": "a", "meta": [1]}])
    with pytest.raises(DataError, match=rf"{p.name}:1: 'meta' is list"):
        docs(p)


def test_invalid_utf8_in_jsonl(tmp_path):
    p = tmp_path / "c.jsonl"
    p.write_bytes(b'{"text": "a"}\n{"text": "caf\xe9"}\n')
    with pytest.raises(DataError, match=rf"{p.name}:2: invalid UTF-8 at byte offset 27 "
                                        r"\(byte 0xe9\)"):
        docs(p)


def test_jsonl_is_streamed(tmp_path):
    p = tmp_path / "c.jsonl"
    p.write_text('{"text": "a"}\nnot json\n', encoding="utf-8")
    it = read_documents(p)
    assert next(it).text == "a"  # the bad second line is not read yet
    with pytest.raises(DataError, match=":2:"):
        next(it)


def test_json_list(tmp_path):
    p = tmp_path / "c.json"
    p.write_text(json.dumps([{"id": "a", "text": "x"}, "plain"], indent=2), encoding="utf-8")
    assert docs(p) == [Document("a", "", "x", {}), Document(None, "", "plain", {})]


def test_json_list_errors(tmp_path):
    p = tmp_path / "c.json"
    p.write_text('[\n{"text": "x"},\n{"text": 1}\n]', encoding="utf-8")
    with pytest.raises(DataError, match=rf"{p.name}: item 1: 'text' is int"):
        docs(p)
    p.write_text('[\n{"text": "x"},\n{"text": }\n]', encoding="utf-8")
    with pytest.raises(DataError, match=rf"{p.name}:3: malformed JSON at column 10"):
        docs(p)
    p.write_bytes(b'[\n{"text": "\xff"}]')
    with pytest.raises(DataError, match=rf"{p.name}:2: invalid UTF-8 at byte offset 12"):
        docs(p)


def test_json_as_jsonl_and_pretty_object_hint(tmp_path):
    p = write_jsonl(tmp_path / "c.json", [{"text": "x"}, {"text": "y"}])
    assert [d.text for d in docs(p)] == ["x", "y"]
    p.write_text('{\n  "text": "x"\n}\n', encoding="utf-8")
    with pytest.raises(DataError, match="JSON list of objects"):
        docs(p)
    p.write_text("  \n", encoding="utf-8")
    assert docs(p) == []


def test_csv(tmp_path):
    p = tmp_path / "c.csv"
    with open(p, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["id", "title", "text", "lang", "meta"])
        w.writerow(["a", "A", "line one\nline two, with comma", "en", '{"k": 1}'])
        w.writerow(["", "", "", "de", ""])
    assert docs(p) == [Document("a", "A", "line one\nline two, with comma", {"k": 1, "lang": "en"}),
                       Document(None, "", "", {"lang": "de"})]


def test_tsv(tmp_path):
    p = tmp_path / "c.tsv"
    p.write_text("text\tid\nhello world\t1\nsecond\t2\n", encoding="utf-8")
    assert docs(p) == [Document("1", "", "hello world", {}), Document("2", "", "second", {})]


def test_csv_large_field(tmp_path):
    p = tmp_path / "c.csv"
    big = "w " * 200_000
    with open(p, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([["text"], [big]])
    assert docs(p)[0].text == big


def test_csv_errors(tmp_path):
    p = tmp_path / "c.csv"
    p.write_text("", encoding="utf-8")
    with pytest.raises(DataError, match="header row"):
        docs(p)
    p.write_text("id,body\n1,x\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"no 'text' column \(the header row has: 'id', 'body'\)"):
        docs(p)
    p.write_text("text,id\nx,1\ny,2,3\n", encoding="utf-8")
    with pytest.raises(DataError, match=rf"{p.name}:3: the row has 3 fields but the header has 2"):
        docs(p)
    p.write_text("text,meta\nx,[1]\n", encoding="utf-8")
    with pytest.raises(DataError, match=rf"{p.name}:2: the 'meta' column must hold a JSON object"):
        docs(p)
    p.write_text("text,meta\nx,{bad\n", encoding="utf-8")
    with pytest.raises(DataError, match="not valid JSON"):
        docs(p)
    p.write_text("text,text\nx,y\n", encoding="utf-8")
    with pytest.raises(DataError, match="duplicate column"):
        docs(p)
    p.write_bytes(b"text\nok\nbad \xff\n")
    with pytest.raises(DataError, match=rf"{p.name}:3: invalid UTF-8 at byte offset 12"):
        docs(p)
    # a stray quote used to make the rest of the file one document's text
    p.write_text('id,text\n1,Oslo is in Norway.\n2,"Paris is in France.\n3,Rome is in '
                 'Italy.\n4,Bern is in Switzerland.\n', encoding="utf-8")
    with pytest.raises(DataError, match=rf"{p.name}:3: malformed CSV in the row that starts "
                                        "on this line: .*a quote opened in this row never "
                                        "closes"):
        docs(p)
    # quotes inside an unquoted field stay characters, as the csv module reads them
    p.write_text('text\nhe said "hi" there\n', encoding="utf-8")
    assert docs(p)[0].text == 'he said "hi" there'


def test_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    p = tmp_path / "c.parquet"
    pq.write_table(pa.table({"id": [1, 2], "text": ["x", "y"], "score": [0.5, None]}), p)
    assert docs(p) == [Document("1", "", "x", {"score": 0.5}),
                       Document("2", "", "y", {"score": None})]
    assert count_hint(p) == 2
    q = tmp_path / "d.parquet"
    pq.write_table(pa.table({"body": ["x"]}), q)
    with pytest.raises(DataError, match=r"no 'text' column \(the columns are: 'body'\)"):
        docs(q)
    r = tmp_path / "e.parquet"
    pq.write_table(pa.table({"text": ["x", None]}), r)
    with pytest.raises(DataError, match=rf"{r.name}: row 1: 'text' is null"):
        docs(r)
    s = tmp_path / "f.parquet"
    s.write_bytes(b"garbage")
    with pytest.raises(DataError, match="not a valid Parquet file"):
        docs(s)


def test_parquet_without_pyarrow(tmp_path, monkeypatch):
    p = tmp_path / "c.parquet"
    p.write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(NotSupportedError, match="pip install pyarrow"):
        docs(p)


def test_plain_text_file(tmp_path):
    p = tmp_path / "notes.md"
    p.write_text("# Title\n\nbody \x00 ü\n", encoding="utf-8")
    assert docs(p) == [Document("notes.md", "notes", "# Title\n\nbody \x00 ü\n", {})]
    q = tmp_path / "data.weird"
    q.write_bytes(b"")
    assert docs(q) == [Document("data.weird", "data", "", {})]
    g = tmp_path / "zipped.txt.gz"
    g.write_bytes(gzip.compress("gz text".encode()))
    assert docs(g) == [Document("zipped.txt.gz", "zipped", "gz text", {})]
    # a version's digits are no extension ("Apache-2.0" was titled "Apache-2")
    for name, title in (("Apache-2.0", "Apache-2.0"), ("notes.v1.2", "notes.v1.2"),
                        ("CC0-1.0.txt", "CC0-1.0"), (".profile", ".profile"),
                        ("LICENSE", "LICENSE"), ("notes.v1", "notes.v1"),
                        ("README.markdown", "README")):
        (tmp_path / name).write_text("x", encoding="utf-8")
        assert docs(tmp_path / name)[0].title == title, name


def test_plain_text_invalid_utf8(tmp_path):
    p = tmp_path / "a.txt"
    p.write_bytes(b"line1\nline2 \xc3\x28\n")
    with pytest.raises(DataError, match=rf"{p.name}:2: invalid UTF-8 at byte offset 12 "
                                        r"\(byte 0xc3\)"):
        docs(p)


def test_directory_recursive_sorted_skips_hidden(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "z.txt").write_text("bz", encoding="utf-8")
    (tmp_path / "a.txt").write_text("a", encoding="utf-8")
    (tmp_path / ".hidden.txt").write_text("no", encoding="utf-8")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "x.txt").write_text("no", encoding="utf-8")
    (tmp_path / "c.jsonl").write_text('{"id": "j", "text": "jt"}\n', encoding="utf-8")
    (tmp_path / "b" / "a.md").write_text("ba", encoding="utf-8")
    out = docs(tmp_path)
    assert [(d.id, d.title, d.text) for d in out] == [
        ("a.txt", "a", "a"), ("b/a.md", "a", "ba"), ("b/z.txt", "z", "bz"), ("j", "", "jt")]
    assert docs(str(tmp_path)) == out


def test_directory_errors_name_the_file(tmp_path):
    (tmp_path / "sub").mkdir()
    bad = tmp_path / "sub" / "bad.jsonl"
    bad.write_text('{"text": 1}\n', encoding="utf-8")
    with pytest.raises(DataError, match=rf"sub{os.sep}bad.jsonl:1: 'text' is int"):
        docs(tmp_path)
    # an entry the walk may not look at (a link into /proc) is named, not the database
    bad.unlink()
    (tmp_path / "sub" / "locked").write_text("x", encoding="utf-8")
    real = Path.is_file

    def is_file(self):
        if self.name == "locked":
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Path, "is_file", is_file)
        with pytest.raises(DataError, match=r"locked': cannot read it \(Permission denied\)"):
            docs(tmp_path)


def test_list_of_paths_and_mixed(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", [{"text": "x"}])
    b = tmp_path / "b.txt"
    b.write_text("y", encoding="utf-8")
    assert [d.text for d in docs([a, b])] == ["x", "y"]
    assert [d.text for d in docs((b, "raw", {"text": "z"}))] == ["y", "raw", "z"]
    # a str inside a list is text, even if it names an existing file
    assert docs([str(b)]) == [Document(None, "", str(b), {})]


def test_empty_directory_and_empty_list(tmp_path):
    assert docs(tmp_path) == []
    assert docs([]) == []


# ------------------------------------------------------------------ count_hint / sample data


def test_count_hint(tmp_path):
    assert count_hint(["a", "b", "c"]) == 3
    assert count_hint(("a",)) == 1
    assert count_hint([]) == 0
    assert count_hint(x for x in "ab") is None
    assert count_hint(iter(["a"])) is None
    assert count_hint(str(tmp_path)) is None
    assert count_hint(tmp_path) is None
    assert count_hint([tmp_path]) is None
    assert count_hint("not a path") is None
    assert count_hint({"text": "x"}) is None


def test_sample_corpus():
    path = sample_path("corpus.jsonl.gz")
    assert path.is_file()
    out = docs(path)
    assert len(out) == 8207
    assert all(isinstance(d.id, str) and d.id for d in out)
    assert len({d.id for d in out}) == 8207
    assert all(isinstance(d.title, str) and isinstance(d.text, str) and d.text for d in out)
    assert sum(1 for d in out if d.id.startswith("wn:")) == 7807
    assert out[0].id == "freedict-ell-eng:10062"
    stats = json.loads(sample_path("stats.json").read_text(encoding="utf-8"))
    assert stats["corpus_docs"] == 8207


def test_sample_files_present_and_readme():
    for name in ["cloze.jsonl", "translation.jsonl", "sentiment_test.jsonl",
                 "sentiment_train.jsonl", "stats.json", "corpus.jsonl.gz"]:
        assert sample_path(name).is_file()
    readme = sample_path("stats.json").parent.parent / "README.md"
    text = readme.read_text(encoding="utf-8")
    assert "WordNet 3.0 Copyright 2006 by Princeton University" in text
    assert "## Sources and licences" in text


def test_sample_path_unknown():
    with pytest.raises(DataError, match=r"no bundled sample file named 'nope'.*corpus\.jsonl\.gz"):
        sample_path("nope")


# ------------------------------------------------------------------ npmdb add FILE ...

def test_cli_add_reads_every_file_it_is_given(tmp_path, tiny_encoder, capsys):
    """`npmdb add DB A B` ingests the documents of both files (not their paths as texts);
    a missing file among them fails the whole call and commits nothing."""
    import npmdb
    from npmdb.cli import main

    a = write_jsonl(tmp_path / "a.jsonl", [{"id": "j1", "text": "Jasper is a town in Alberta."}])
    b = tmp_path / "b.txt"
    b.write_text("Banff is a town in Alberta.", encoding="utf-8")
    db = tmp_path / "x.npmdb"
    assert main(["add", str(db), str(a), str(b), "--encoder", str(tiny_encoder), "-q"]) == 0
    assert "added 2 documents" in capsys.readouterr().out
    with npmdb.open(db, progress=False) as d:
        texts = sorted(doc["text"] for doc in d.documents())
        assert texts == ["Banff is a town in Alberta.", "Jasper is a town in Alberta."]
        assert d.get("j1")["text"] == "Jasper is a town in Alberta."
        versions = len(d.versions())
    assert main(["add", str(db), str(a), str(tmp_path / "missing.jsonl"), "-q"]) == 2
    assert "missing.jsonl" in capsys.readouterr().err
    with npmdb.open(db, progress=False) as d:
        assert d.count() == 2 and len(d.versions()) == versions
    (tmp_path / "empty").mkdir()             # nothing to add: no "added 0 ...; version N"
    assert main(["add", str(db), str(tmp_path / "empty"), "-q"]) == 0
    assert "nothing to add; version" in capsys.readouterr().out
    assert main(["add", str(db), str(a), "--timeout", "-5", "-q"]) == 2
    assert "timeout must be" in capsys.readouterr().err


# ------------------------------------------------------------------ ingest edge cases (a hunt)

def test_an_assigned_id_skips_ids_the_same_add_gives(new_db, tmp_path):
    """'doc-1' given later in the call used to collide with the id assigned to an id-less
    document before it: a valid add was refused as a duplicate."""
    new_db.add(["a text", {"id": "doc-1", "text": "b text"}])
    assert sorted(d["id"] for d in new_db.documents()) == ["doc-1", "doc-2"]
    a = write_jsonl(tmp_path / "a.jsonl", [{"text": "no id"}])
    b = write_jsonl(tmp_path / "b.jsonl", [{"id": "doc-3", "text": "given"}])
    new_db.add([a, b])
    assert new_db.get("doc-3")["text"] == "given" and new_db.count() == 4
    new_db.update(["plain", {"id": "doc-5", "text": "b"}])
    assert new_db.get("doc-5")["text"] == "b" and new_db.count() == 6


@pytest.mark.parametrize("name,body", [
    ("deep.jsonl", '{"text": "x", "meta": ' + "[" * 5000 + "]" * 5000 + "}\n"),
    ("long.jsonl", '{"text": "x", "n": ' + "1" * 5000 + "}\n"),
    ("deep.json", '[{"text": "x", "meta": ' + "[" * 5000 + "]" * 5000 + "}]"),
    ("long.csv", 'text,meta\nx,"{""a"": ' + "1" * 5000 + '}"\n'),
])
def test_json_python_will_not_read_is_a_data_error(tmp_path, name, body):
    (tmp_path / name).write_text(body)
    with pytest.raises(DataError, match="nested too deeply|number too long"):
        list(read_documents(tmp_path / name))


def test_a_directory_follows_its_links_once_and_refuses_a_broken_one(tmp_path):
    root, other = tmp_path / "corpus", tmp_path / "other"
    root.mkdir()
    other.mkdir()
    write_jsonl(other / "o.jsonl", [{"id": "o1", "text": "behind a linked directory"}])
    write_jsonl(root / "a.jsonl", [{"id": "a1", "text": "here"}])
    os.symlink(other, root / "linked")
    os.symlink(root, other / "loop")             # a loop back: each directory read once
    assert sorted(d.id for d in read_documents(root)) == ["a1", "o1"]
    os.symlink(tmp_path / "missing.jsonl", root / "broken.jsonl")
    with pytest.raises(DataError, match="broken symbolic link"):
        list(read_documents(root))


def test_an_open_file_is_refused_with_what_to_pass(tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", [{"id": "a", "text": "hello"}])
    with open(path) as f, pytest.raises(InterfaceError, match="pass its path"):
        list(read_documents(f))


def test_numpy_scalars_and_arrays_are_ids_and_meta():
    import numpy as np

    doc, = read_documents([{"id": np.int64(7), "text": "x",
                            "meta": {"f": np.float32(0.5), "tags": np.array(["a", "b"])}}])
    assert doc.id == "7" and doc.meta == {"f": 0.5, "tags": ["a", "b"]}


def test_a_data_frame_is_read_as_its_file_would_be(tmp_path):
    import io

    import numpy as np
    import pandas as pd

    indexed = pd.DataFrame({"id": ["k1", "k2"], "text": ["a", "b"]}).set_index("id")
    assert [d.id for d in read_documents(indexed)] == ["k1", "k2"]   # were doc-1, doc-2
    blanks = pd.read_csv(io.StringIO("id,text\n1,one\n,three\n"))       # a float id column
    assert [d.id for d in read_documents(blanks)] == ["1", None]
    tagged = pd.DataFrame({"text": ["a"], "tags": [np.array(["x", "y"])]})  # read_parquet's lists
    assert [d.meta for d in read_documents(tagged)] == [{"tags": ["x", "y"]}]
    twice = pd.DataFrame([[1, "a", "b"]], columns=["id", "text", "text"])
    with pytest.raises(DataError, match="two columns named 'text'"):
        list(read_documents(twice))
    both = pd.DataFrame({"id": ["k1"], "text": ["a"]}).set_index("id", drop=False)
    assert [d.id for d in read_documents(both)] == ["k1"]


# ------------------------------------------------------------------ a second ingest hunt

@pytest.mark.parametrize("empty", ["", "  "])
def test_an_empty_path_is_refused_not_the_working_directory(empty, tmp_path, monkeypatch):
    """Path("") is "." : db.add("") added every file of the working directory (a Path("")
    is Path(".") itself, so it still reads the working directory, as "." does)."""
    (tmp_path / "notes.txt").write_text("not for the database", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError, match="an empty path names no file"):
        list(read_documents(empty))


def test_a_directory_holding_a_database_is_read_without_it(tmp_path, tiny_encoder):
    """`npmdb add my.npmdb .` read the database's own data.mdb as a text file ("invalid
    UTF-8 ... re-encode it", advice that would destroy the database)."""
    import npmdb

    (tmp_path / "a.txt").write_text("Banff is a town in Alberta.", encoding="utf-8")
    with npmdb.open(tmp_path / "my.npmdb", encoder=tiny_encoder, progress=False) as db:
        db.add(["Jasper is a town in Alberta."])
    assert [d.id for d in read_documents(tmp_path)] == ["a.txt"]


def test_frame_ids_that_are_no_integer_are_an_id_error():
    pd = pytest.importorskip("pandas")
    for ids in ([float("inf"), 1.0], [1e20, float("nan")]):
        frame = pd.DataFrame({"id": ids, "text": ["x", "y"]})
        with pytest.raises(DataError, match=r"row 0: 'id' is float"):
            list(read_documents(frame))  # it was OverflowError / TypeError from pandas


def test_frame_rows_without_meta_get_empty_meta():
    """pandas fills a meta column's missing cells with NaN (pd.read_json(lines=True) does):
    they were refused as "'meta' is float (nan)" although the same JSONL is accepted."""
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame([{"id": "a", "text": "first", "meta": {"x": 1}},
                          {"id": "b", "text": "second"}])
    assert [d.meta for d in read_documents(frame)] == [{"x": 1}, {}]


def test_text_under_another_name_says_how_to_name_it(tmp_path):
    """The hint said "pass text_field=", which neither db.add nor npmdb add takes."""
    path = write_jsonl(tmp_path / "body.jsonl", [{"id": "a", "body": "Banff is a town."}])
    with pytest.raises(DataError, match=r"rename it to 'text', or from Python add "
                                        r"npmdb\.corpus\.read_documents\(SOURCE, text_field="):
        list(read_documents(path))
    assert [d.text for d in read_documents(path, text_field="body")] == ["Banff is a town."]


def test_a_first_cli_add_of_nothing_leaves_no_database(tmp_path, tiny_encoder, capsys):
    """It exited 0 with "version None is unchanged" and left a database that kept its
    encoder choice, so a later add with another encoder was refused."""
    from npmdb.cli import main

    empty = write_jsonl(tmp_path / "empty.jsonl", [])
    db = tmp_path / "new.npmdb"
    assert main(["add", str(db), str(empty), "--encoder", str(tiny_encoder), "-q"]) == 0
    assert "no database was made" in capsys.readouterr().out
    assert not db.exists()
    assert main(["add", str(db), "", "--encoder", str(tiny_encoder), "-q"]) == 2
    assert "an empty path names no file" in capsys.readouterr().err
    assert main(["add", str(db), str(tmp_path / "missing.jsonl"), "-q"]) == 2
    err = capsys.readouterr().err
    assert "file not found" in err and "db.add([text])" not in err  # Python's advice
    assert not db.exists()


def test_csv_with_bare_carriage_returns_says_how_to_convert(tmp_path):
    """csv's own message was "open the file in universal-newline mode?", Python's advice."""
    path = tmp_path / "cr.csv"
    path.write_bytes(b"id,text\r1,hello there\r2,bye now\r")
    with pytest.raises(DataError, match=r"bare carriage return .*convert them") as exc:
        list(read_documents(path))
    assert "universal-newline" not in str(exc.value)
