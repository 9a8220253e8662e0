"""The ``npmdb`` command line: add, query, sql, shell, serve, search, versions, tag, restore,
train, eval, check, demo."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from contextlib import suppress
from pathlib import Path
from typing import Sequence

from .cli_versions import register as register_version_commands
from .cli_versions import check_paths, timeout_flag
from .errors import Error, ProgrammingError
from .opening import remove_if_never_written
from .output import print_result, print_table, shorten
from .query.result import json_text
from .query.spec import DEFAULT_K

__all__ = ["main"]

#: What `npmdb demo` asks first, before three of the sample's cloze questions: questions
#: whose answers the bundled sample holds (NPM's own example, "Hagios Demetrios is located
#: in [MASK].", needs a Wikipedia corpus: the sample has no such church, and answered it
#: "Java").
DEMO_QUERIES = [
    "Thessaloniki is a city in [MASK].",
    "Salem is the capital of [MASK].",
]


def cmd_add(args) -> int:
    import npmdb

    check_paths(args.files)
    engine = "local"
    if args.ray:  # checked before the database is opened: a missing extra fails first
        from .distributed import RayEngine, resolve_engine
        engine = resolve_engine(RayEngine(workers=args.workers))
    elif args.workers is not None:
        raise npmdb.ProgrammingError("--workers needs --ray")
    path = Path(args.db)
    existed, created = path.exists(), False
    try:
        with npmdb.open(args.db, encoder=args.encoder, progress=not args.quiet,
                        timeout=args.timeout) as db:
            created = db.created
            t0 = time.time()
            head = db.version
            # Paths (a str in a list is a text; a str alone would get db.add's hint about
            # raw text, which is Python's, not this command's)
            vid = db.add([Path(f) for f in args.files] if len(args.files) > 1
                         else Path(args.files[0]), message=args.message or "", engine=engine)
            if vid == head and head is None:  # a new database: none is left behind
                print("nothing to add: no documents in the input; no database was made")
            elif vid == head:
                print(f"nothing to add; version {vid} is unchanged")
            else:
                print(f"added {_added(db, vid)} documents in {time.time() - t0:.1f} s; "
                      f"version {vid}")
    except BaseException:
        if created:  # a failed first add leaves no database behind (nor its encoder choice)
            remove_if_never_written(path, made=not existed)
        raise
    if created and vid is None:  # nor does one that added nothing
        remove_if_never_written(path, made=not existed)
    return 0


def _added(db, vid: int) -> int:
    """Documents version ``vid`` holds beyond its parent's (not the count before this
    command: another writer may have committed while it waited for the lock)."""
    versions = {v["id"]: v for v in db.versions()}
    parent = versions.get(versions[vid]["parent"])
    return versions[vid]["docs"] - (parent["docs"] if parent else 0)


def _as_flags(message: str, names: Sequence[str]) -> str:
    """An API error about argument ``name`` (``"batch_blocks must be >= 2"``) as the
    command line spells it (``--batch-blocks``)."""
    import re

    def flag(m: "re.Match[str]") -> str:
        return f"--{m.group(1).replace('_', '-')}" if m.group(1) in names else m.group(0)

    def assignment(m: "re.Match[str]") -> str:  # steps=N, preset='demo': --steps N
        if m.group(1) not in names:
            return m.group(0)
        value = m.group(2).strip("'")
        name = f"--{m.group(1).replace('_', '-')}"
        return name if value == "True" else f"{name} {value}"
    message = re.sub(r"\b([a-z_]+)=('[^']*'|[^\s,;:)]+)", assignment, message)
    return re.sub(r"\b([a-z_]+)(?= must | is required)", flag, message)


def _fill_options(args, flags: Sequence[str]) -> dict:
    """The ``--option NAME=VALUE`` pairs of ``npmdb query`` and ``npmdb eval``, typed; a
    pair without ``=``, or one that repeats a flag of the command (``flags``), is the
    caller's mistake (ProgrammingError)."""
    from .arguments import parse_assignments

    try:
        options = parse_assignments(args.option, "--option")
    except ValueError as exc:
        raise ProgrammingError(str(exc)) from None
    for name in options:  # a flag of the command: one value, from the flag
        if name in flags:
            flag = "-k" if name == "k" else f"--{name.replace('_', '-')}"
            raise ProgrammingError(f"--option {name}=... repeats the flag {flag}: give it "
                                   "as the flag")
    return options


def cmd_query(args) -> int:
    import npmdb
    from .encoders import preload

    options = _fill_options(args, ("top", "k", "mode", "retrieval", "blocks", "max_len", "tau",
                                   "alpha", "exact", "version"))
    with npmdb.open(args.db, create=False, readonly=True, progress=False) as db:
        opts = dict(top=args.top, k=args.k, mode=args.mode, retrieval=args.retrieval,
                    blocks=args.blocks, max_len=args.max_len, tau=args.tau, alpha=args.alpha,
                    exact=args.exact, **options)
        if args.version is not None:
            opts["version"] = args.version
        load_s = preload(db, args.version)
        res = db.fill_mask(args.query, **opts)
        if args.json:  # with --explain, the answers and the plan as one object
            print(json_text({"answers": res.to_list(), "plan": res.plan} if args.explain
                            else res.to_list(), indent=1))
        else:
            print(args.query)
            print_result(res, load_s=load_s)
            if args.explain:
                print(res.plan)
    return 0


def cmd_sql(args) -> int:
    import npmdb

    try:
        params = json.loads(args.params) if args.params else None
    except json.JSONDecodeError as exc:
        raise ProgrammingError(f"--params is not JSON ({exc}): give a JSON list such as "
                               "'[\"Salem\", 3]' or an object such as '{\"q\": \"Salem\"}'") from None
    with npmdb.open(args.db, create=False, readonly=True, progress=False) as db:
        res = db.sql(args.statement, params)
        if args.json:
            print(json_text(res.to_list(), indent=1))
        else:
            print_result(res)
    return 0


def cmd_shell(args) -> int:
    from .shell import main as shell_main

    return shell_main(args.db)


def cmd_serve(args) -> int:
    from .serve import main as serve_main

    return serve_main(args)


def cmd_search(args) -> int:
    import npmdb

    with npmdb.open(args.db, create=False, readonly=True, progress=False) as db:
        for hit in db.search(args.text, limit=args.limit):
            print(f"{hit['score']:8.3f}  {hit['doc_id']}  {shorten(hit['snippet'], 90)}")
    return 0


def cmd_train(args) -> int:
    import npmdb

    from .evaluation import keep_if_better, load_questions

    # read the questions first: a bad file is an error before an hour of training
    questions = load_questions(args.keep_if_better) if args.keep_if_better else None
    with npmdb.open(args.db, create=False, progress=not args.quiet,
                    timeout=args.timeout) as db:
        before = db.version
        settings = dict(steps=args.steps, batch_blocks=args.batch_blocks, lr=args.lr,
                        objective=args.objective, refresh_every=args.refresh_every,
                        seed=args.seed, preset=args.preset, resume=args.resume,
                        threads=args.threads, max_seconds=args.max_seconds,
                        reverse_pairs=args.reverse_pairs)
        try:
            report = npmdb.train(db, **settings)
        except ProgrammingError as exc:  # "batch_blocks must be ..." names the flag
            raise ProgrammingError(_as_flags(str(exc), settings)) from None
        print(report)
        if questions is not None and report.versions:
            try:
                decision = keep_if_better(db, questions, before=before,
                                          trained=report.versions,
                                          retrieval=args.eval_retrieval,
                                          progress=False if args.quiet else None)
            except BaseException:  # Ctrl-C or a failure: an unchecked version is not kept
                _restore_unchecked(db, before, report.versions)
                raise
            print(f"\non {args.keep_if_better}:\n{decision}")
        elif questions is not None:
            print("\nthis run wrote no version: nothing to compare, HEAD unchanged")
    return 0


def _restore_unchecked(db, before, trained) -> None:
    """--keep-if-better did not finish its comparison: HEAD, a trained version nothing
    checked, goes back to ``before`` (it stayed HEAD, and a later --keep-if-better took it
    for the version before training)."""
    if before is None or db.version not in trained:
        return
    vid = db.restore(before, message="keep-if-better did not finish: the trained version "
                                     "was not compared")
    print(f"npmdb: the comparison did not finish; version {vid} restores version {before} "
          f"(HEAD before training); the trained versions {', '.join(map(str, trained))} "
          "stay readable", file=sys.stderr)


def cmd_eval(args) -> int:
    import npmdb
    from .evaluation import check_settings, load_questions
    from .storage.versions import parse_ref

    if args.questions_out and not args.json:
        raise ProgrammingError("--questions-out adds each question's top answer to the JSON "
                               "output: give --json too")
    options = _fill_options(args, ("retrieval", "max_len", "version"))
    questions = load_questions(args.questions)
    # every retrieval and version is checked (each once) before the first question is asked
    retrievals = list(dict.fromkeys(r.strip() for r in args.retrieval.split(",") if r.strip()))
    if not retrievals:
        raise ProgrammingError(f"--retrieval {args.retrieval!r} names no retrieval: give "
                               "bm25, dense or hybrid, or several joined by commas")
    for r in retrievals:
        check_settings(r, args.max_len, options)
    with npmdb.open(args.db, create=False, readonly=True, progress=False) as db:
        versions = list(dict.fromkeys(db.checkout(parse_ref(v)).version  # tags: ids, once
                                      for v in args.version or ["HEAD"]))
        runs = [npmdb.evaluate(db, questions, version=v, retrieval=r, max_len=args.max_len,
                               progress=False if args.quiet else None, **options)
                for v in versions for r in retrievals]
    comparisons = _comparisons(runs, len(versions), len(retrievals))
    if args.json:
        print(json_text([dict(e.summary(), questions=e.to_list() if args.questions_out else None,
                              comparison=c.summary() if c else None)
                         for e, c in zip(runs, comparisons)], indent=1))
        return 0
    print(f"{len(questions)} questions from {args.questions}; exact match in %")
    _print_evaluations(runs, comparisons)
    return 0


def _comparisons(runs, n_versions: int, n_retrievals: int) -> list:
    """For each run, its comparison against its base (None for a base): each later version
    against the first on the same retrieval (runs are ordered by version, then retrieval);
    with one version, each retrieval against the first."""
    from .evaluation import compare

    base = {e.retrieval: e for e in runs[:n_retrievals]} if n_versions > 1 else \
        {e.retrieval: runs[0] for e in runs}
    return [None if e is base[e.retrieval] else compare(base[e.retrieval], e) for e in runs]


def _print_evaluations(runs, comparisons=(), *, groups: bool = True) -> None:
    """The figures of ``runs`` (one row each), per answer length and relation when
    ``groups``, and each comparison's questions gained and lost."""
    print_table(("version", "gen", "retrieval", "micro", "length-macro", "relation-macro",
                  "seconds"),
                 [(e.version, e.generation, e.retrieval, f"{e.micro:.1f}",
                   f"{e.length_macro:.1f}", f"{e.relation_macro:.1f}", f"{e.seconds:.1f}")
                  for e in runs], sys.stdout)
    for title, by in (("answer length (words)", "length"), ("relation", "relation")):
        counts = runs[0].sizes(by)  # every run asks the same questions
        if not groups or len(counts) < 2:
            continue
        print()
        print_table((title, "n") + tuple(f"v{e.version} {e.retrieval}" for e in runs),
                     [(k or "(none)", n) + tuple(f"{getattr(e, f'by_{by}')[k]:.1f}" for e in runs)
                      for k, n in counts.items()], sys.stdout)
    several_relations = len(runs[0].sizes("relation")) > 1
    for c in filter(None, comparisons):
        moved = ", ".join(f"{g or '(none)'} +{a} -{b}" for g, (a, b) in c.by_relation().items())
        print(f"\n{c}" + (f"\n  questions gained / lost by relation: {moved}"
                           if moved and several_relations else ""))


def cmd_check(args) -> int:
    import npmdb

    with npmdb.open(args.db, create=False, readonly=True, progress=False) as db:
        report = db.check(deep=not args.quick)
        if args.json:
            print(json_text(report.to_dict(), indent=1))
        else:
            print(report)
    return 0 if report.ok else 1


def cmd_demo(args) -> int:
    import npmdb
    from . import encoder as enc_names
    from .corpus import sample_path

    path = Path(args.db)
    with npmdb.open(path, progress=not args.quiet) as db:
        if db.count() == 0:
            print(f"ingesting the bundled sample corpus (dev-small, 8,207 documents) into {path} …")
            t0 = time.time()
            db.add(sample_path("corpus.jsonl.gz"), message="sample corpus")
            st = db.stats()
            print(f"  {st['docs']} documents, {st['blocks']} blocks, {st['tokens']} tokens "
                  f"in {time.time() - t0:.1f} s")
        else:
            print(f"using the existing database {path} ({db.count()} documents)")
        cloze = [json.loads(l) for l in open(sample_path("cloze.jsonl"), encoding="utf-8")][:3]
        queries = DEMO_QUERIES + [c["query"] for c in cloze]
        for retrieval in ("bm25", "dense"):
            print(f"\n== retrieval={retrieval} (encoder: {db.encoder.info.name}, "
                  f"generation {db.stats()['generation']}) ==")
            for q in queries:
                res = db.fill_mask(q, retrieval=retrieval, top=3)
                print(q)
                print_result(res, evidence=retrieval == "bm25")
        # How often the top answer is right, on the sample's questions with known answers
        # (what `npmdb eval` reports), so the answers above can be read for what they are.
        cloze_path = sample_path("cloze.jsonl")
        try:  # as a user would type it, where the package sits below the working directory
            cloze_path = cloze_path.relative_to(Path.cwd())
        except ValueError:
            pass
        print(f"\n== how often is the top answer right? the sample's questions with known "
              f"answers (`npmdb eval {path} {cloze_path}`) ==")
        runs = [npmdb.evaluate(db, cloze_path, retrieval=r, progress=not args.quiet)
                for r in ("bm25", "dense")]
        print(f"{runs[0].n} cloze questions, exact match in %:")
        _print_evaluations(runs, groups=False)
        name = db.encoder.info.name
        if name == enc_names.BASE_NAME:
            print("\nAn untrained sentence encoder ranks poorly; train it with "
                  f"`npmdb train {path} --preset demo` (about 7 minutes on 2 cores; see README).")
        elif name == enc_names.SHIPPED_NAME:
            print(f"\nEncoder {name}: npmdb's shipped encoder (MiniLM trained with npmdb.train; "
                  "see README). Queries retrieve BM25 blocks by default (NPM's restricted mode; "
                  "`npmdb query`, `fill_mask` and `npmdb eval` alike): dense retrieval alone "
                  "finds answers of the right kind (an island group for an island group) but "
                  "rarely the right one with an encoder this small. `npmdb train DB --preset "
                  "demo` fine-tunes it on a database's own "
                  "corpus; measure before you keep it (`npmdb eval DB QUESTIONS.jsonl --version 1 "
                  "--version 2`, or train with `--keep-if-better QUESTIONS.jsonl`): on this "
                  "sample corpus and on dev it adds no bm25 points and loses translation "
                  "(README, Training).")
        else:
            print(f"\nEncoder {name}.")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="npmdb", description="An embedded datastore and query engine for nonparametric "
        "masked language models: a [MASK] is filled with a phrase retrieved from the corpus. "
        "Start with `npmdb demo`.")
    sub = p.add_subparsers(dest="command", required=True)

    a = sub.add_parser("add", help="add documents (JSONL[.gz], Parquet, CSV, text files)")
    a.add_argument("db")
    a.add_argument("files", nargs="+")
    a.add_argument("--encoder", default=None, help="local Hugging Face model directory")
    a.add_argument("--message", default="")
    timeout_flag(a)
    a.add_argument("--ray", action="store_true",
                   help="encode on a Ray cluster (pip install 'npmdb[ray]'; RAY_ADDRESS picks "
                        "the cluster, else a local one is started)")
    a.add_argument("--workers", type=int, default=None,
                   help="with --ray: encoder actors (default: one per GPU, else per CPU)")
    a.add_argument("-q", "--quiet", action="store_true")
    a.set_defaults(fn=cmd_add)

    q = sub.add_parser("query", help="fill a [MASK] with phrases from the corpus")
    q.add_argument("db")
    q.add_argument("query")
    q.add_argument("--top", type=int, default=5, help="answers to print (0: every one)")
    q.add_argument("-k", type=int, default=DEFAULT_K)
    q.add_argument("--mode", default="phrase", choices=("phrase", "token"))
    q.add_argument("--retrieval", default=None, choices=("bm25", "dense", "hybrid"),
                   help="bm25 (default; dense with --exact), dense or hybrid")
    q.add_argument("--blocks", type=int, default=3)
    q.add_argument("--max-len", type=int, default=10)
    q.add_argument("--tau", type=float, default=1.0)
    q.add_argument("--alpha", type=float, default=0.0)
    q.add_argument("--exact", action="store_true")
    q.add_argument("--version", default=None, help="version id or tag (AS OF)")
    q.add_argument("--json", action="store_true")
    q.add_argument("--explain", action="store_true", help="print the plan with timings")
    q.add_argument("--option", action="append", default=[], metavar="NAME=VALUE",
                   help="any other fill_mask option (repeatable), e.g. whole_names=false, "
                        "bm25_prior=1, evidence=3")
    q.set_defaults(fn=cmd_query)

    s = sub.add_parser("sql", help="run a query-language statement")
    s.add_argument("db")
    s.add_argument("statement")
    s.add_argument("--params", default=None, help="JSON list or object of parameters")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_sql)

    sh = sub.add_parser("shell", help="interactive SQL prompt (reads stdin when piped)")
    sh.add_argument("db")
    sh.set_defaults(fn=cmd_shell)

    sv = sub.add_parser("serve", help="web page and JSON API (pip install 'npmdb[serve]')")
    sv.add_argument("db")
    sv.add_argument("--host", default="127.0.0.1",
                    help="address to bind (not loopback: needs --token or NPMDB_TOKEN)")
    sv.add_argument("--port", type=int, default=8000)
    sv.add_argument("--token", default=None, help="access token (default: $NPMDB_TOKEN)")
    sv.add_argument("--write", action="store_true",
                    help="add the add/delete/tag endpoints (behind the token)")
    sv.add_argument("--time-limit", type=float, default=30.0, help="seconds per request")
    sv.add_argument("--shards", type=int, default=None,
                    help="spread each query's segments over N shards (read-only)")
    sv.add_argument("--ray", action="store_true",
                    help="with --shards: the shards are Ray actors (RAY_ADDRESS picks the "
                         "cluster); without it they run in this process")
    sv.set_defaults(fn=cmd_serve)

    se = sub.add_parser("search", help="BM25 search over blocks")
    se.add_argument("db")
    se.add_argument("text")
    se.add_argument("--limit", type=int, default=10)
    se.set_defaults(fn=cmd_search)

    register_version_commands(sub)

    tr = sub.add_parser("train", help="train the encoder with NPM's objective; refresh embeddings")
    tr.add_argument("db")
    tr.add_argument("--timeout", type=float, default=0.0,
                    help="seconds to wait for another writer before the first step (each "
                         "refresh waits up to 10 minutes for one)")
    tr.add_argument("--preset", default=None, choices=("default", "demo"),
                    help="hyperparameters: 'demo' is the recipe tuned for the bundled sample "
                         "on 2 CPU cores (400 steps, 32 blocks, lr 1e-4; 7-15 minutes there, "
                         "longer where blocks are full); 'default' is NPM's "
                         "(16 blocks, lr 3e-5; give --steps), also what no preset means; "
                         "flags below override. The shipped encoder's own recipe is "
                         "`make encoder` (python -m npmdb.train.recipe)")
    tr.add_argument("--steps", type=int, default=None, help="optimizer steps (required "
                    "unless --preset sets them; with --resume, the saved run's total)")
    tr.add_argument("--batch-blocks", type=int, default=None, help="blocks per batch (16)")
    tr.add_argument("--lr", type=float, default=None, help="peak learning rate (3e-5)")
    tr.add_argument("--objective", default="phrase", choices=("phrase", "token", "mixed"),
                    help="NPM's span objective, NPM SINGLE's token one, or each batch either")
    tr.add_argument("--refresh-every", type=int, default=None,
                    help="write a refreshed version every N steps (0: only at the end)")
    tr.add_argument("--reverse-pairs", action="store_true",
                    help="also train on each short 'HEAD: GLOSS' entry (a bilingual "
                         "dictionary's) read the other way, so a word that occurs once can "
                         "be a target; the database is not changed")
    tr.add_argument("--resume", action="store_true", help="continue the saved run")
    tr.add_argument("--max-seconds", type=float, default=None,
                    help="time budget: stop stepping after this many seconds and write the "
                         "final version at the step reached (--resume continues it); that "
                         "version's re-embedding of every document comes on top")
    tr.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--keep-if-better", metavar="QUESTIONS", default=None,
                    help="questions with known answers (as `npmdb eval` reads): after training, "
                         "keep the trained version as HEAD only if it answers more of them "
                         "than HEAD when this call started; otherwise restore that one (the "
                         "trained version stays readable)")
    tr.add_argument("--eval-retrieval", default="bm25", choices=("bm25", "dense", "hybrid"),
                    help="the retrieval --keep-if-better asks with (bm25)")
    tr.add_argument("-q", "--quiet", action="store_true")
    tr.set_defaults(fn=cmd_train)

    ev = sub.add_parser("eval", help="exact match of questions with known answers, per version "
                        "(did training help?)")
    ev.add_argument("db")
    ev.add_argument("questions", help='JSONL(.gz): one {"query": "... [MASK] ...", "answers": '
                    '[...], "relation": optional group} a line')
    ev.add_argument("--version", action="append", default=None,
                    help="version id or tag to measure (repeatable; default: HEAD)")
    ev.add_argument("--retrieval", default="bm25",
                    help="bm25, dense, hybrid, or several joined by commas (default bm25)")
    ev.add_argument("--max-len", type=int, default=10, help="longest answer in tokens (10)")
    ev.add_argument("--option", action="append", default=[], metavar="NAME=VALUE",
                    help="a fill_mask option for every question (repeatable), e.g. blocks=1")
    ev.add_argument("--json", action="store_true", help="the figures as JSON")
    ev.add_argument("--questions-out", action="store_true",
                    help="with --json: each question's top answer too")
    ev.add_argument("-q", "--quiet", action="store_true")
    ev.set_defaults(fn=cmd_eval)

    c = sub.add_parser("check", help="verify checksums and references (exit 1 if damaged)")
    c.add_argument("db")
    c.add_argument("--quick", action="store_true",
                   help="skip vector payloads, hnswlib structure and encoder weights")
    c.add_argument("--json", action="store_true")
    c.set_defaults(fn=cmd_check)

    d = sub.add_parser("demo", help="ingest the bundled sample corpus and answer queries")
    d.add_argument("db", nargs="?", default="demo.npmdb")
    d.add_argument("-q", "--quiet", action="store_true")
    d.set_defaults(fn=cmd_demo)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.fn(args) or 0)
    except Error as exc:
        print(f"npmdb: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("npmdb: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`npmdb sql ... | head`): stop quietly
        with suppress(OSError, ValueError, AttributeError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a command killed by the pipe


if __name__ == "__main__":
    raise SystemExit(main())
