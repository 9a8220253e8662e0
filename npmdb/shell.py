"""``npmdb shell DB``: an interactive SQL prompt, in the manner of ``sqlite3`` and ``duckdb``.

Statements end with ``;`` and may span lines; lines starting with ``.`` are shell commands
(``.help`` lists them). On a terminal the prompt has history (kept across sessions in
``$NPMDB_HISTORY``, else ``$XDG_STATE_HOME/npmdb/history``, else
``~/.local/state/npmdb/history``) and keyword completion. When standard input is not a
terminal the statements are read from it, results printed, and the exit status is 1 after
the first error (which stops the run), else 0.

Only the public API is used: ``Database.sql``, ``versions``, ``checkout``; ``.checkout``
writes ``AS OF`` after the FROM source of statements that name no version (a textual
insertion: the statement is otherwise run as typed, so error positions before it hold).
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import sys
import threading
import signal
import time
import unicodedata
from pathlib import Path
from typing import Any, Iterable, TextIO

from .errors import Error, ProgrammingError, _Positioned
from .query.result import json_text
from .storage import versions as V

__all__ = ["Shell", "split_statements", "history_path", "main"]

KEYWORDS = (
    "SELECT", "FROM", "WHERE", "GROUP", "BY", "ORDER", "LIMIT", "OFFSET", "USING", "WITH",
    "AS", "OF", "AND", "OR", "NOT", "IN", "LIKE", "BETWEEN", "IS", "NULL", "TRUE", "FALSE",
    "ASC", "DESC", "EXPLAIN", "ANALYZE", "SHOW", "VERSIONS", "TAGS", "MASKED", "TOKENS",
    "CLASSIFY", "EVIDENCE", "SEARCH", "DOCUMENTS", "LABELS",
)
WORDS = ("phrase", "score", "support", "tokens", "length", "rank", "evidence", "doc_id",
         "title", "start", "end", "snippet", "version", "generation", "label", "text", "id",
         "meta", "block", "dense", "bm25", "hybrid", "exact", "blocks", "max_len", "tau",
         "alpha", "mode", "scoring", "clean_edges", "no_stopwords", "doc.title", "doc.id",
         "doc.text", "lower", "upper", "abs", "round", "coalesce")
MODES = ("table", "json", "csv", "line")
_WORD = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")

HELP = """\
.checkout REF        query version REF (an id or a tag) until .checkout HEAD
.explain [on|off]    print the plan with rows and ms per operator after each result
.help                show this message
.mode MODE           output mode: table, json, csv or line
.quit                exit (also .exit, or end of input)
.tags                list tags
.timer on|off        print the time each statement takes
.versions            list versions
Statements end with ';' and may span lines. See query/GRAMMAR.md for the language."""


def history_path() -> Path:
    """Where the prompt's history is kept across sessions."""
    if os.environ.get("NPMDB_HISTORY"):
        return Path(os.environ["NPMDB_HISTORY"])
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "npmdb" / "history"


def split_statements(text: str) -> tuple[list[str], str]:
    """Split ``text`` at top-level ``;`` (not inside quotes or comments).

    Returns the complete statements (each with its ``;``) and the unfinished rest."""
    out: list[str] = []
    start = i = 0
    n = len(text)
    while i < n:
        c = text[i]
        if c in "'\"":
            j = i + 1
            while j < n:
                if text[j] == c:
                    if j + 1 < n and text[j + 1] == c:  # doubled quote inside
                        j += 2
                        continue
                    break
                j += 1
            i = j + 1
            continue
        if text.startswith("--", i):
            j = text.find("\n", i)
            i = n if j == -1 else j + 1
            continue
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            i = n if j == -1 else j + 2
            continue
        if c == ";":
            out.append(text[start:i + 1])
            start = i + 1
        i += 1
    return out, text[start:]


def _is_blank(sql: str) -> bool:
    """True for text that holds nothing but white space, comments and semicolons."""
    i = 0
    while (i := _skip(sql, i)) < len(sql):
        if sql[i] != ";":
            return False
        i += 1
    return True


def _cell(v: Any, width: int | None = None) -> str:
    if v is None:
        s = "NULL"
    elif isinstance(v, float):
        s = f"{v:.4f}"
    elif isinstance(v, (list, dict, tuple)):
        s = json.dumps(v, ensure_ascii=False, default=str)
    else:
        s = str(v)
    # one line of printable text: a tab, a carriage return or another control character
    # would move the cursor and break the table
    s = "".join(c if c.isprintable() else " " for c in s)
    if width is not None and display_width(s) > width:
        s = _clip(s, width - 1) + "…"
    return s


def _char_width(c: str) -> int:
    if unicodedata.combining(c) or unicodedata.category(c) in ("Mn", "Me", "Cf"):
        return 0
    return 2 if unicodedata.east_asian_width(c) in ("W", "F") else 1


def display_width(s: str) -> int:
    """Columns ``s`` takes on a terminal: East Asian wide characters take two, combining
    marks none."""
    return sum(map(_char_width, s)) if not s.isascii() else len(s)


def _clip(s: str, width: int) -> str:
    """The longest prefix of ``s`` that fits in ``width`` columns."""
    used = 0
    for i, c in enumerate(s):
        used += _char_width(c)
        if used > width:
            return s[:i]
    return s


def _pad(s: str, width: int, right: bool) -> str:
    fill = " " * max(0, width - display_width(s))
    return fill + s if right else s + fill


def format_table(columns: Iterable[str], rows: Iterable[Iterable[Any]], *,
                 max_width: int = 60) -> str:
    """Rows as an aligned table with a header rule; numbers right-aligned."""
    columns = list(columns)
    rows = [list(r) for r in rows]
    cells = [[_cell(v, max_width) for v in r] for r in rows]
    numeric = [bool(rows) and all(isinstance(r[i], (int, float)) and not isinstance(r[i], bool)
                                  for r in rows if r[i] is not None)
               for i in range(len(columns))]
    widths = [max([display_width(c)] + [display_width(r[i]) for r in cells])
              for i, c in enumerate(columns)]

    def line(vals: list[str]) -> str:
        return "│ " + " │ ".join(_pad(v, w, num)
                                 for v, w, num in zip(vals, widths, numeric)) + " │"

    top = "┌─" + "─┬─".join("─" * w for w in widths) + "─┐"
    mid = "├─" + "─┼─".join("─" * w for w in widths) + "─┤"
    bot = "└─" + "─┴─".join("─" * w for w in widths) + "─┘"
    body = [line(r) for r in cells]
    head = "│ " + " │ ".join(_pad(c, w, False) for c, w in zip(columns, widths)) + " │"
    return "\n".join([top, head, mid, *body, bot])


def format_rows(columns: list[str], rows: list[tuple], mode: str) -> str:
    """Rows in one of :data:`MODES`."""
    if mode == "json":
        return json_text([dict(zip(columns, r)) for r in rows], indent=1)
    if mode == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(columns)
        for r in rows:
            w.writerow([json.dumps(v, ensure_ascii=False, default=str)
                        if isinstance(v, (list, dict, tuple)) else ("" if v is None else v)
                        for v in r])
        return buf.getvalue().rstrip("\n")
    if mode == "line":
        width = max((len(c) for c in columns), default=0)
        blocks = ["\n".join(f"{c.rjust(width)} = {_cell(v)}" for c, v in zip(columns, r))
                  for r in rows]
        return "\n\n".join(blocks)
    return format_table(columns, rows)


def _result_rows(res: Any) -> tuple[list[str], list[tuple]]:
    if res.columns is not None and res.rows is not None:
        return list(res.columns), [tuple(r) for r in res.rows]
    cols = ["text", "score", "support"]
    return cols, [(a.text, a.score, a.support) for a in res.answers]


_WORD = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")


def _skip(text: str, i: int) -> int:
    """Past white space and comments from ``i``."""
    n = len(text)
    while i < n:
        if text[i].isspace():
            i += 1
        elif text.startswith("--", i):
            j = text.find("\n", i)
            i = n if j == -1 else j + 1
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            if j == -1:  # unclosed: not blank; the lexer says so
                break
            i = j + 2
        else:
            break
    return i


def _past_quoted(text: str, i: int) -> int:
    q, n, j = text[i], len(text), i + 1
    while j < n:
        if text[j] == q:
            if j + 1 < n and text[j + 1] == q:
                j += 2
                continue
            return j + 1
        j += 1
    return n


def version_row(v: dict) -> tuple:
    """One of ``db.versions()`` as a table row: id, local time, parent, tags, docs, tokens,
    generation, head ("*"), message."""
    return (v["id"], time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(v["time"])),
            v["parent"], ",".join(v["tags"]), v["docs"], v["tokens"], v["generation"],
            "*" if v["head"] else "", v["message"])


def with_version(statement: str, ref: int | str) -> str:
    """``statement`` with ``AS OF ref`` after its FROM source when it names no version."""
    at = version_insert(statement, ref)
    return statement if at is None else statement[:at[0]] + at[1] + statement[at[0]:]


def version_insert(statement: str, ref: int | str) -> tuple[int, str] | None:
    """Where :func:`with_version` writes ``AS OF ref`` into ``statement``, and what; None
    where it names a version or has no FROM source."""
    text, i, n, depth = statement, 0, len(statement), 0
    while i < n:
        i = _skip(text, i)
        if i >= n:
            break
        c = text[i]
        if c in "'\"":
            i = _past_quoted(text, i)
        elif c == "(":
            depth, i = depth + 1, i + 1
        elif c == ")":
            depth, i = depth - 1, i + 1
        elif (m := _WORD.match(text, i)) and (i == 0 or not (text[i - 1].isalnum()
                                                             or text[i - 1] in "_.:")):
            i = m.end()
            if depth or m.group().upper() != "FROM":
                continue
            j = _skip(text, i)
            src = _WORD.match(text, j)
            if not src:
                return statement
            end = src.end()
            k = _skip(text, end)
            if k < n and text[k] == "(":
                d = 0
                while k < n:
                    if text[k] in "'\"":
                        k = _past_quoted(text, k)
                        continue
                    if text.startswith(("--", "/*"), k):
                        k = max(_skip(text, k), k + 2)  # an unclosed /* stops at its end
                        continue
                    if text[k] == "(":
                        d += 1
                    elif text[k] == ")":
                        d -= 1
                        if d == 0:
                            k += 1
                            break
                    k += 1
                end = k
            nxt = _skip(text, end)
            w1 = _WORD.match(text, nxt)
            if w1 and w1.group().upper() == "AS":
                w2 = _WORD.match(text, _skip(text, w1.end()))
                if w2 and w2.group().upper() == "OF":
                    return None
            lit = str(ref) if isinstance(ref, int) else "'" + str(ref).replace("'", "''") + "'"
            return end, f" AS OF {lit}"
        else:
            i += 1
    return None


def as_typed(exc: Error, statement: str, at: tuple[int, str] | None) -> Error:
    """A positioned error about ``statement`` with ``.checkout``'s ``AS OF`` written in
    (``at``) as an error about the statement as the user typed it (the caret line showed
    text they never typed)."""
    if at is None or not isinstance(exc, _Positioned):
        return exc
    from .query.lexer import line_col, offset_of

    written = statement[:at[0]] + at[1] + statement[at[0]:]
    off = offset_of(written, exc.line, exc.column)
    off = off if off < at[0] else max(at[0], off - len(at[1]))
    line, column = line_col(statement, off)
    return type(exc)(exc.short_message, text=statement, line=line, column=column,
                     expected=exc.expected)


class Shell:
    """The shell's state and its commands; :meth:`run` drives one session."""

    def __init__(self, db: Any, *, out: TextIO | None = None, err: TextIO | None = None
                 ) -> None:
        self.db = db
        self.out = sys.stdout if out is None else out   # looked up now, not at import
        self.err = sys.stderr if err is None else err
        self.mode = "table"
        self.timer = False
        self.explain = False
        self.ref: int | str | None = None  # .checkout; None is HEAD

    def load_encoder_in_background(self) -> threading.Thread:
        """Start loading HEAD's encoder (torch and the model: seconds) while the user types,
        so the first query does not wait for it; a query that comes sooner waits on the
        encoders' lock for the same load. Where the encoder cannot be loaded (its model
        directory is gone) this stops quietly: the first query says why."""
        from .encoders import preload

        t = threading.Thread(target=preload, args=(self.db,), name="npmdb-shell-encoder",
                             daemon=True)
        t.start()
        return t

    # -- output ----------------------------------------------------------------------

    def echo(self, text: str = "") -> None:
        print(text, file=self.out, flush=True)

    def error(self, exc: BaseException | str) -> None:
        if isinstance(exc, BaseException):
            print(f"Error: {type(exc).__name__}: {exc}", file=self.err, flush=True)
        else:
            print(f"Error: {exc}", file=self.err, flush=True)

    # -- statements ------------------------------------------------------------------

    def execute(self, statement: str) -> bool:
        """Run one statement or dot-command; False when it failed."""
        text = statement.strip()
        if not text or _is_blank(text):
            return True
        if text.startswith("."):
            return self.command(text)
        t0 = time.perf_counter()
        at = version_insert(text, self.ref) if self.ref is not None else None
        try:
            res = self.db.sql(text if at is None else text[:at[0]] + at[1] + text[at[0]:])
        except Error as exc:
            self.error(as_typed(exc, text, at))
            return False
        ms = (time.perf_counter() - t0) * 1000
        if res.is_explain:
            self.echo(res.plan)
        else:
            cols, rows = _result_rows(res)
            self.echo(format_rows(cols, rows, self.mode))
            if self.explain and res.plan:
                self.echo(res.plan)
        if self.timer:
            self.echo(f"Run Time: {ms:.1f} ms")
        return True

    def command(self, line: str) -> bool:
        parts = line.split()
        name, args = parts[0].lower(), parts[1:]
        try:
            if name in (".quit", ".exit"):
                raise EOFError
            if name == ".help":
                self.echo(HELP)
            elif name == ".mode":
                if len(args) != 1 or args[0].lower() not in MODES:
                    raise ProgrammingError(f"usage: .mode {'|'.join(MODES)}")
                self.mode = args[0].lower()
            elif name in (".timer", ".explain"):
                flag = {"on": True, "off": False}.get(args[0].lower()) if args else (
                    None if name == ".timer" else not self.explain)
                if flag is None or len(args) > 1:
                    raise ProgrammingError(f"usage: {name} on|off")
                setattr(self, name[1:], flag)
            elif name == ".versions":
                rows = [version_row(v) for v in self.db.versions()]
                self.echo(format_rows(["id", "time", "parent", "tags", "docs", "tokens",
                                       "generation", "head", "message"], rows, self.mode))
            elif name == ".tags":
                rows = [(t, v["id"]) for v in self.db.versions() for t in v["tags"]]
                self.echo(format_rows(["tag", "version"], rows, self.mode))
            elif name == ".checkout":
                if not args:
                    raise ProgrammingError("usage: .checkout REF (a version id, a tag, or HEAD)")
                ref: int | str = line.strip()[len(parts[0]):].strip()  # a tag may hold spaces
                if ref.upper() == "HEAD":
                    self.ref = None
                    self.echo("querying HEAD")
                else:
                    ref = V.parse_ref(ref)
                    view = self.db.checkout(ref)
                    self.ref = view.version
                    self.echo(f"querying version {view.version}")
            else:
                raise ProgrammingError(f"unknown command {name}; .help lists the commands")
        except Error as exc:
            self.error(exc)
            return False
        return True

    def prompt(self) -> str:
        at = "" if self.ref is None else f"@{self.ref}"
        return f"npmdb{at}> "

    # -- sessions --------------------------------------------------------------------

    def run_script(self, source: TextIO) -> int:
        """Statements from a file or pipe: 0, or 1 after the first error (which stops).
        A statement without its ``;`` at the end of the input runs too."""
        buf = ""
        try:
            for n, line in enumerate(source):
                if n == 0:
                    line = line.removeprefix("\ufeff")  # a byte-order mark (Windows editors)
                if _is_blank(buf) and line.lstrip().startswith("."):
                    buf = ""
                    if not self.execute(line):
                        return 1
                    continue
                buf += line
                if ";" not in line:  # no statement can end here: do not rescan the buffer
                    continue
                stmts, buf = split_statements(buf)
                for s in stmts:
                    if not self.execute(s):
                        return 1
            if not _is_blank(buf) and not self.execute(buf):
                return 1
        except EOFError:  # .quit
            pass
        return 0

    def _run_at_prompt(self, statement: str) -> bool:
        """:meth:`execute` where Ctrl-C cancels the statement, not the session (as in
        sqlite3); False when it was cancelled."""
        try:
            self.execute(statement)
        except KeyboardInterrupt:
            print(file=self.out)
            self.error("interrupted")
            return False
        return True

    def run_interactive(self, name: str | None = None) -> int:
        """The prompt, with readline history and completion where readline exists;
        ``name``: the database as the user named it (its full path by default)."""
        # Ctrl-C cancels a statement (as in sqlite3) even where the shell was started with
        # SIGINT ignored (a parent that ignores it passes that on, and Python then installs
        # no handler of its own)
        if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        rl = _setup_readline()
        self.echo(f"npmdb shell on {name or self.db.path} — .help for commands, .quit to leave")
        buf = ""
        try:
            while True:
                try:
                    line = input(self.prompt() if not buf else "   ...> ")
                except KeyboardInterrupt:
                    print(file=self.out)
                    buf = ""
                    continue
                if _is_blank(buf) and line.lstrip().startswith("."):
                    buf = ""
                    self._run_at_prompt(line)
                    continue
                buf += line + "\n"
                if ";" in line:
                    stmts, buf = split_statements(buf)
                    for s in stmts:
                        if not self._run_at_prompt(s):
                            buf = ""  # Ctrl-C drops the rest of what was typed
                            break
                if _is_blank(buf):
                    buf = ""
        except EOFError:
            print(file=self.out)
            if not _is_blank(buf):  # Ctrl-D after a statement without its ";": run it,
                try:                # as a script's last statement runs
                    self._run_at_prompt(buf)
                except EOFError:
                    pass
        finally:
            if rl is not None:
                with _quiet():
                    path = history_path()
                    path.parent.mkdir(parents=True, exist_ok=True)
                    rl.set_history_length(5000)
                    rl.write_history_file(str(path))
        return 0


class _quiet:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return exc[0] is not None and issubclass(exc[0], OSError)


def _completer(text: str, state: int) -> str | None:
    words = [w for w in KEYWORDS if w.startswith(text.upper())]
    words = [w if text[:1].isupper() or not text else w.lower() for w in words]
    words += [w for w in WORDS if w.startswith(text)]
    if text.startswith("."):
        words = [c for c in (".checkout", ".exit", ".explain", ".help", ".mode", ".quit",
                             ".tags", ".timer", ".versions") if c.startswith(text)]
    return words[state] if state < len(words) else None


def _setup_readline():
    try:
        import readline
    except ImportError:  # pragma: no cover - Windows without pyreadline
        return None
    with _quiet():
        readline.read_history_file(str(history_path()))
    readline.set_completer(_completer)
    readline.set_completer_delims(" \t\n(),;=<>'\"")
    if "libedit" in (readline.__doc__ or ""):
        readline.parse_and_bind("bind ^I rl_complete")
    else:
        readline.parse_and_bind("tab: complete")
    return readline


def main(db_path: str, *, stdin: TextIO | None = None) -> int:
    """Open ``db_path`` read-only and run the shell on standard input."""
    import npmdb

    stdin = stdin or sys.stdin or io.StringIO("")  # None: the process has no stdin
    if isinstance(stdin, io.TextIOWrapper):
        # undecodable bytes reach the statement as lone surrogates, which the query
        # reports as such (strict decoding would end the session with a traceback)
        stdin.reconfigure(errors="surrogateescape")
    with npmdb.open(db_path, create=False, readonly=True, progress=False) as db:
        shell = Shell(db)
        if stdin.isatty():
            loading = shell.load_encoder_in_background()
            try:
                return shell.run_interactive(str(db_path))
            finally:
                loading.join()   # never close the database under a load in progress
        return shell.run_script(stdin)
