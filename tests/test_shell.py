"""`npmdb shell`: statement splitting, output modes, piped stdin, and a real terminal (pty)."""

from __future__ import annotations

import io
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from npmdb.shell import Shell, format_rows, split_statements, with_version

sys.path.insert(0, str(Path(__file__).resolve().parent))  # --import-mode=importlib
from conftest import make_tiny_encoder  # noqa: E402

Q = "'Doha is the capital of [MASK].'"


def run_piped(db_path, text, tmp_path):
    env = dict(os.environ, NPMDB_HISTORY=str(tmp_path / "hist"))
    return subprocess.run([sys.executable, "-m", "npmdb", "shell", str(db_path)], input=text,
                          capture_output=True, text=True, timeout=180, env=env)


def test_split_statements():
    stmts, rest = split_statements("SELECT 'a;b' FROM x; -- c;\nSELECT \"q;\" /* ; */ ;SEL")
    assert stmts == ["SELECT 'a;b' FROM x;", " -- c;\nSELECT \"q;\" /* ; */ ;"]
    assert rest == "SEL"
    assert split_statements("SELECT 'it''s;' ;") == (["SELECT 'it''s;' ;"], "")


@pytest.mark.parametrize("statement,ref,want", [
    ("SELECT id FROM DOCUMENTS LIMIT 1", 1, "SELECT id FROM DOCUMENTS AS OF 1 LIMIT 1"),
    ("SELECT id FROM documents() WHERE x", "v'1", "SELECT id FROM documents() AS OF 'v''1' WHERE x"),
    ("SELECT phrase FROM MASKED('a (FROM) [MASK]') USING bm25", 3,
     "SELECT phrase FROM MASKED('a (FROM) [MASK]') AS OF 3 USING bm25"),
    ("EXPLAIN SELECT p FROM CLASSIFY('x', LABELS(a=('b', 'c'))) LIMIT 2;", "t",
     "EXPLAIN SELECT p FROM CLASSIFY('x', LABELS(a=('b', 'c'))) AS OF 't' LIMIT 2;"),
    ("SELECT id FROM DOCUMENTS as  of 1", 5, "SELECT id FROM DOCUMENTS as  of 1"),
    ("SHOW TAGS", 1, "SHOW TAGS"),
    ('SELECT "from" FROM /* c */ DOCUMENTS -- x\n LIMIT 1', 1,
     'SELECT "from" FROM /* c */ DOCUMENTS AS OF 1 -- x\n LIMIT 1'),
    ("SELECT doc.from_x FROM SEARCH(:q)", 1, "SELECT doc.from_x FROM SEARCH(:q) AS OF 1"),
    # a comment inside the source's arguments holds a parenthesis
    ("SELECT doc_id FROM SEARCH('x' /* ) */) LIMIT 3", 1,
     "SELECT doc_id FROM SEARCH('x' /* ) */) AS OF 1 LIMIT 3"),
    ("SELECT label FROM CLASSIFY('x', LABELS(a = ('b'), -- 1) first\n c = ('d')))", 2,
     "SELECT label FROM CLASSIFY('x', LABELS(a = ('b'), -- 1) first\n c = ('d'))) AS OF 2"),
])
def test_checkout_adds_as_of(statement, ref, want):
    assert with_version(statement, ref) == want


def test_output_modes():
    cols, rows = ["phrase", "score"], [("Qatar", 0.5), ("a,b", 1.25)]
    table = format_rows(cols, rows, "table").splitlines()
    assert table[1].startswith("│ phrase") and "0.5000 │" in table[3]
    assert len({len(line) for line in table}) == 1  # aligned
    assert format_rows(cols, rows, "csv") == 'phrase,score\nQatar,0.5\n"a,b",1.25'
    assert '"phrase": "Qatar"' in format_rows(cols, rows, "json")
    assert format_rows(cols, rows, "line").splitlines()[:2] == ["phrase = Qatar",
                                                                " score = 0.5000"]


def test_cells_are_one_line_of_printable_text_aligned_by_display_width():
    cols, rows = ["cjk", "ctl"], [("ドーハ", "a\rb\tc"), ("x", "Qatar")]
    table = format_rows(cols, rows, "table").splitlines()
    assert "a b c" in table[3] and "\r" not in "".join(table) and "\t" not in "".join(table)
    from npmdb.shell import display_width
    assert len({display_width(line) for line in table}) == 1  # ドーハ takes 6 columns
    assert display_width(format_rows(["x"], [("字" * 80,)], "table").splitlines()[3]) <= 64


def test_cli_snippets_are_cut_not_dropped(versioned_db_path, capsys):
    from npmdb.cli import main
    from npmdb.output import shorten as _shorten

    assert _shorten("x" * 200, 20) == "x" * 19 + "…"  # textwrap.shorten gave "[...]"
    assert _shorten("hello world  this is\n a test", 20) == "hello world this…"
    assert main(["search", str(versioned_db_path), "capital", "--limit", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and all(len(line.split("  ")[-1]) > 10 for line in lines)


def test_json_output_is_strict_json():
    import json

    def refuse(name):
        raise AssertionError(f"not JSON: {name}")

    text = format_rows(["big", "n", "ok"], [(float("inf"), float("nan"), 1.5)], "json")
    assert json.loads(text, parse_constant=refuse) == [{"big": None, "n": None, "ok": 1.5}]


def test_scripts_the_shell_used_to_misread(versioned_db_path):
    import npmdb

    with npmdb.open(versioned_db_path, readonly=True, progress=False) as db:
        def run(script):
            out, err = io.StringIO(), io.StringIO()
            return Shell(db, out=out, err=err).run_script(io.StringIO(script)), \
                out.getvalue(), err.getvalue()

        # a dot-command after a comment, or after a statement and a trailing comment
        for script in ("-- list\n.mode csv\nSHOW TAGS;\n",
                       "/* header */\n.mode csv\nSHOW TAGS;\n",
                       "SHOW TAGS; -- first\n.mode csv\nSHOW TAGS;\n",
                       "\ufeff.mode csv\nSHOW TAGS;\n",          # a byte-order mark
                       "\ufeffSHOW TAGS;\n.mode csv\nSHOW TAGS;\n"):
            rc, out, err = run(script)
            assert rc == 0 and "tag,version" in out and not err, (script, err)
        rc, out, err = run("/* never closed\nSHOW TAGS;\n")    # was: nothing, exit 0
        assert rc == 1 and "unterminated comment" in err
        rc, out, err = run("SELECT id AS plan FROM DOCUMENTS LIMIT 2;")
        assert rc == 0 and "ScanDocuments" not in out and out.count("│") == 2 * 3
        rc, out, _ = run("EXPLAIN SELECT id FROM DOCUMENTS LIMIT 2;")
        assert rc == 0 and "ScanDocuments" in out
        # a statement over thousands of lines is split once, not once per line
        ids = ",\n".join(f"'id{i}'" for i in range(6000))
        t0 = time.perf_counter()
        rc, out, err = run(f"SELECT id FROM DOCUMENTS WHERE id IN (\n{ids}\n);\n")
        assert rc == 0 and not err and time.perf_counter() - t0 < 30


def test_commands_in_process(versioned_db_path):
    import npmdb

    out, err = io.StringIO(), io.StringIO()
    with npmdb.open(versioned_db_path, readonly=True, progress=False) as db:
        sh = Shell(db, out=out, err=err)
        script = (".mode csv\n.timer on\n.explain on\n"
                  f"SELECT phrase FROM MASKED({Q}) USING bm25 LIMIT 1;\n"
                  ".explain off\n.timer off\n.tags\n.versions\n"
                  ".checkout first\nSELECT count(*) FROM DOCUMENTS;\n")
        assert sh.run_script(io.StringIO(script)) == 1  # count(*) is not in the dialect
        text = out.getvalue()
        assert "phrase\n" in text and "Run Time:" in text and "BM25Blocks" in text
        assert "tag,version\nfirst,1" in text and "querying version 1" in text
        assert "Error:" in err.getvalue()
        # the caret line is the statement as typed (it showed the AS OF .checkout adds)
        assert "  SELECT count(*) FROM DOCUMENTS;\n" + " " * 9 + "^" in err.getvalue()
        assert "AS OF" not in err.getvalue()
        sh.err = err = io.StringIO()
        sh.run_script(io.StringIO("SELECT id FROM DOCUMENTS WHERE idd = 'x';\n"))
        assert "(line 1, column 32)" in err.getvalue() and "  SELECT id FROM DOCUMENTS " \
            "WHERE idd = 'x';\n" + " " * 33 + "^" in err.getvalue(), err.getvalue()
        assert sh.ref == 1
        sh.out = out = io.StringIO()
        sh.run_script(io.StringIO("SELECT id FROM DOCUMENTS LIMIT 1000;\n.checkout HEAD\n"
                                  "SELECT id FROM DOCUMENTS LIMIT 1000;"))
        lines = out.getvalue().splitlines()
        assert lines.count("id") == 2 and len(lines) == 2 + 300 + 1 + 400
        for bad in (".mode xml", ".timer maybe", ".checkout", ".frobnicate", ".checkout nope",
                    ".checkout ²", ".checkout 99999999999999999999999"):
            assert sh.execute(bad) is False
        assert sh.execute(".help") and sh.execute("  ") and sh.execute("-- only a comment;")
        assert sh.execute(".mode CSV") and sh.mode == "csv"  # as .timer ON is accepted


def test_piped_stdin_prints_a_table_and_exits_0(versioned_db_path, tmp_path):
    p = run_piped(versioned_db_path,
                  f"SELECT phrase, score, support\n  FROM MASKED({Q})\n  USING bm25 LIMIT 3;\n"
                  "SHOW TAGS;\n", tmp_path)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[1].split() == ["│", "phrase", "│", "score", "│", "support", "│"]
    assert "│ first │" in p.stdout
    assert p.stderr == ""


def test_piped_stdin_error_exits_1_with_caret(versioned_db_path, tmp_path):
    p = run_piped(versioned_db_path, "SELECT id FROM DOCUMENTS LIMIT 1;\n"
                                     "SELECT phrase\nFROM MASKED('a [MASK]')\nORDER score;\n"
                                     "SELECT id FROM DOCUMENTS LIMIT 1;\n", tmp_path)
    assert p.returncode == 1
    assert "line 3, column 7" in p.stderr
    caret = p.stderr.splitlines()
    i = next(n for n, line in enumerate(caret) if line.strip() == "ORDER score;")
    assert caret[i + 1].index("^") == caret[i].index("score")
    assert p.stdout.count("│ id") == 1  # the statement after the error did not run


def test_piped_odd_stdin_and_cli_output(versioned_db_path, tmp_path):
    import json

    env = dict(os.environ, NPMDB_HISTORY=str(tmp_path / "hist"),
               PYTHONIOENCODING="utf-8:strict")
    shell = [sys.executable, "-m", "npmdb", "shell", str(versioned_db_path)]
    # undecodable bytes: the query names the bad character, no traceback
    p = subprocess.run(shell, input=b"SELECT id FROM DOCUMENTS WHERE title = '\xff';\n",
                       capture_output=True, timeout=180, env=env)
    assert p.returncode == 1 and b"Traceback" not in p.stderr and b"surrogate" in p.stderr
    # no stdin at all (closed): nothing to run
    p = subprocess.run(shell, stdin=subprocess.DEVNULL, capture_output=True, timeout=180,
                       env=env)
    assert p.returncode == 0 and not p.stderr
    p = subprocess.run(" ".join(map(shlex.quote, shell)) + " <&-", shell=True,
                       capture_output=True, timeout=180, env=env)
    assert p.returncode == 0 and b"Traceback" not in p.stderr, p.stderr
    sql = [sys.executable, "-m", "npmdb", "sql", str(versioned_db_path)]
    p = subprocess.run(sql + ["SELECT 1e308 * 10 AS big, id FROM DOCUMENTS LIMIT 1", "--json"],
                       capture_output=True, text=True, timeout=180, env=env)
    # a value past float's range is the statement's DataError, never a non-finite number
    assert p.returncode == 2 and "number out of range" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr and not p.stdout
    p = subprocess.run(sql + ["SELECT id AS plan FROM DOCUMENTS LIMIT 2"], capture_output=True,
                       text=True, timeout=180, env=env)
    assert p.returncode == 0 and "ScanDocuments" not in p.stdout and ":" in p.stdout


def test_terminal_session_history_and_completion(versioned_db_path, tmp_path):
    pexpect = pytest.importorskip("pexpect")
    env = dict(os.environ, NPMDB_HISTORY=str(tmp_path / "state" / "history"), TERM="xterm")

    def spawn():
        child = pexpect.spawn(sys.executable, ["-m", "npmdb", "shell", versioned_db_path.name],
                              cwd=str(versioned_db_path.parent), env=env, encoding="utf-8",
                              timeout=120, dimensions=(40, 200))
        child.expect_exact(f"npmdb shell on {versioned_db_path.name} — .help")  # as typed
        child.expect_exact("npmdb> ")
        return child

    child = spawn()
    child.sendline("SELECT id, title")              # a statement over three lines
    child.expect_exact("...> ")
    child.sendline("  FROM DOCUMENTS WHERE id = 'freedict-eng-jpn:8705'")
    child.expect_exact("...> ")
    child.sendline(";")
    child.expect("ドーハ")
    child.expect_exact("npmdb> ")
    child.sendline("SELEC id FROM DOCUMENTS;")      # a parse error, then the prompt again
    child.expect_exact("did you mean SELECT?")
    child.expect_exact("^")
    child.expect_exact("npmdb> ")
    child.send("SHOW TA\t")                          # keyword completion: TA -> TAGS
    child.send(";\r")
    child.expect_exact("first")
    child.expect_exact("npmdb> ")
    child.sendline(".checkout first")
    child.expect_exact("npmdb@1> ")
    child.sendline(".quit")
    child.expect(pexpect.EOF)
    child.close()
    hist = (tmp_path / "state" / "history").read_text()
    assert "SHOW TAGS;" in hist and ".checkout first" in hist

    child = spawn()                                  # history from the last session
    child.send("\x1b[A")                             # up: .quit
    child.send("\x1b[A")                             # up: .checkout first
    child.send("\r")
    child.expect_exact("npmdb@1> ")
    child.sendeof()
    child.expect(pexpect.EOF)


def test_terminal_ctrl_c_cancels_the_statement_and_ctrl_d_runs_the_unfinished_one(
        versioned_db_path, tmp_path):
    pexpect = pytest.importorskip("pexpect")
    env = dict(os.environ, NPMDB_HISTORY=str(tmp_path / "history"), TERM="xterm")
    import signal

    # started with SIGINT ignored, as a parent that ignores it leaves it (a full test run
    # did): the prompt still takes Ctrl-C
    child = pexpect.spawn(sys.executable, ["-m", "npmdb", "shell", str(versioned_db_path)],
                          env=env, encoding="utf-8", timeout=120, dimensions=(40, 200),
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    child.expect_exact("npmdb> ")
    # the first query waits for the encoder the prompt loads in the background (seconds
    # of torch); Ctrl-C then cancels it and the session goes on
    child.sendline(f"SELECT phrase FROM MASKED({Q}) LIMIT 1;")
    time.sleep(0.5)
    child.sendintr()
    child.expect_exact("interrupted")
    child.expect_exact("npmdb> ")
    child.sendline("SHOW TAGS")                      # no ";" yet
    child.expect_exact("...> ")
    child.sendeof()                                  # Ctrl-D runs it, as a script's end does
    child.expect_exact("first")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_an_interactive_session_loads_the_encoder_while_the_user_types(versioned_db_path,
                                                                      tmp_path):
    """The prompt starts loading HEAD's encoder in the background, so the first query does
    not wait seconds for torch and the model; where the encoder cannot be loaded (its model
    directory is gone) the background load stops quietly and the first query says why."""
    import shutil
    import threading

    import npmdb

    with npmdb.open(versioned_db_path, create=False, readonly=True, progress=False) as db:
        out, err = io.StringIO(), io.StringIO()
        sh = Shell(db, out=out, err=err)
        assert not db._encoders._cache                # a fresh handle has loaded nothing
        sh.load_encoder_in_background().join(timeout=120)
        assert db._encoders._cache                    # loaded by the background thread
        loaded = db.encoder
        assert sh.execute(f"SELECT phrase FROM MASKED({Q}) LIMIT 1;")
        assert db.encoder is loaded and "phrase" in out.getvalue() and not err.getvalue()

    enc = make_tiny_encoder(tmp_path / "enc")
    with npmdb.open(tmp_path / "db", encoder=enc, progress=False) as db:
        db.add([{"id": "d", "text": "Doha is the capital of Qatar."}])
    shutil.rmtree(enc)
    failures = []
    hook, threading.excepthook = threading.excepthook, failures.append
    try:
        with npmdb.open(tmp_path / "db", create=False, readonly=True, progress=False) as db:
            err = io.StringIO()
            sh = Shell(db, out=io.StringIO(), err=err)
            t = sh.load_encoder_in_background()
            t.join(timeout=120)
            assert not t.is_alive() and not failures  # the thread ended without raising
            assert not sh.execute(f"SELECT phrase FROM MASKED({Q}) LIMIT 1;")
            assert "OperationalError" in err.getvalue(), err.getvalue()
    finally:
        threading.excepthook = hook


def test_checkout_a_tag_with_spaces(tmp_path, tiny_encoder):
    import npmdb

    with npmdb.open(tmp_path / "db", encoder=tiny_encoder, progress=False) as db:
        db.add([{"id": "a", "text": "Oslo is the capital of Norway."}])
        db.tag("before the  update")
        db.add([{"id": "b", "text": "Bergen is a city in Norway."}])
        out, err = io.StringIO(), io.StringIO()
        sh = Shell(db, out=out, err=err)
        assert sh.execute(".checkout before the  update") and sh.ref == 1, err.getvalue()


def test_query_output_aligns_wide_characters():
    """`npmdb query` padded answers by characters: a CJK answer pushed its score two
    columns right per character."""
    import io

    from npmdb.output import print_result as _print_result
    from npmdb.query.result import Answer, Result
    from npmdb.shell import display_width

    out = io.StringIO()
    res = Result(answers=(Answer("東京都", 1.0, 1), Answer("Paris", 0.5, 1)), stats=(),
                 version=1, generation=0)
    _print_result(res, evidence=False, out=out)
    lines = [line for line in out.getvalue().splitlines() if "score=" in line]
    assert len({display_width(line[:line.index("score=")]) for line in lines}) == 1
