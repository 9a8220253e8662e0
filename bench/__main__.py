"""The benchmark suite: ``python -m bench`` (or ``make bench``).

    python -m bench                                   # ../shared/data/dev, the full run (< 1 h, 2 cores)
    python -m bench --data npmdb/data/dev-small --quick   # a few minutes: proves the suite runs

Steps (each prints progress on stderr, as lines where it is not a terminal: a log, ``| tee``;
a failing step is recorded and the run goes on):

1. main database: built from the data's corpus in one ``add`` (float16, HNSW) unless
   ``bench/work/<data>-main.npmdb`` already holds it; build time per stage.
2. latency: fill_mask p50/p99 per retrieval (dense, bm25, hybrid), mode (phrase, token)
   and k (64, 256, 1024, 4096); median ms per operator; open time.
3. ingest: ``add`` tokens/s against the encoder alone on the same documents.
4. ann: recall@k of HNSW against exact search, recall/speed per ef, EM difference.
5. codecs: bytes per token and EM / top-1 agreement per codec (float16, int8, pq, pq48).
6. peers: the LanceDB comparison (same vectors, same queries, answers checked).
7. growth: latency at 10%, 30%, 100% of the corpus.
8. report: ``bench/results/bench-<data>.json``, ``BENCHMARKS.md`` and PNG plots. Only a
   full run writes the root ``BENCHMARKS.md``; a ``--quick`` or ``--smoke`` run's report goes
   beside its JSON as ``bench-<data>-quick.md`` / ``-smoke.md`` (``--report PATH`` chooses),
   and with ``--results DIR`` to ``DIR/BENCHMARKS.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import time
import traceback
from pathlib import Path

from .common import DEV_DATA, RESULTS, ROOT, load_jsonl, machine, require_data

DEFAULT_DATA = DEV_DATA
STEPS = ("main", "latency", "ingest", "ann", "codecs", "peers", "growth")
_T0 = time.perf_counter()


def log(msg: str) -> None:
    m, s = divmod(time.perf_counter() - _T0, 60)
    print(f"[{int(m):3d}:{s:04.1f}] {msg}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _timed_ingest_stages(stages: dict):
    """Time the local ingest's stages while the block runs: prepare (tokenize, flag, cut
    blocks), encode (the model, vectors into the segment writer's codec), finish
    (documents, BM25 and dense index files, LMDB)."""
    from npmdb.ingest import local
    from npmdb.storage.segment_writer import SegmentWriter

    targets = [(local, "prepare", "prepare"), (local, "encode_into", "encode"),
               (SegmentWriter, "finish", "finish")]
    saved = []
    for owner, attr, label in targets:
        fn = getattr(owner, attr)
        saved.append((owner, attr, fn))

        def wrapped(*a, __fn=fn, __label=label, **k):
            t0 = time.perf_counter()
            try:
                return __fn(*a, **k)
            finally:
                stages[__label] = stages.get(__label, 0.0) + time.perf_counter() - t0
        setattr(owner, attr, wrapped)
    try:
        yield stages
    finally:
        for owner, attr, fn in saved:
            setattr(owner, attr, fn)


class _LogBar:
    """A progress bar for a log (stderr not a terminal, where ``npmdb.progress`` shows
    none): a line when the work starts, one every ``every`` seconds, one when it ends."""

    def __init__(self, total: int, desc: str, unit: str = "it", every: float = 30.0) -> None:
        self.total, self.desc, self.unit, self.every = total, desc, unit, every
        self.n, self.closed = 0, False
        self.t0 = self.last = time.perf_counter()
        log(f"  {desc}: {total} {unit} …")

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.perf_counter()
        if now - self.last >= self.every:
            self.last = now
            secs = now - self.t0
            rate = self.n / secs if secs > 0 else 0.0
            left = f", ~{(self.total - self.n) / rate:.0f} s left" if rate and self.total else ""
            pct = f" ({self.n / self.total:.0%})" if self.total else ""
            log(f"  {self.desc}: {self.n}/{self.total} {self.unit}{pct}, {rate:.0f} "
                f"{self.unit}/s{left}")

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            secs = time.perf_counter() - self.t0
            log(f"  {self.desc}: {self.n} {self.unit} in {secs:.1f} s")

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __getattr__(self, name):  # tqdm's other methods (set_postfix, refresh, ...): nothing
        return lambda *a, **k: None


@contextlib.contextmanager
def progress_lines(every: float = 30.0):
    """While the block runs, npmdb's progress bars (``npmdb.progress``: tqdm on a terminal,
    nothing otherwise) print :class:`_LogBar` lines where stderr is not a terminal; yields
    the ``progress=`` value for ``npmdb.open``."""
    if sys.stderr.isatty():
        yield None  # npmdb's own bars
        return
    import importlib

    from npmdb import progress as P

    modules = [P, importlib.import_module("npmdb.ingest.prepare")]
    saved = [(m, m.progress_bar) for m in modules]

    def bar(total, desc, enabled=None, unit="it"):
        return _LogBar(total, desc, unit, every) if enabled is not False else \
            saved[0][1](total, desc, False, unit)
    for m in modules:
        m.progress_bar = bar
    try:
        yield True
    finally:
        for m, fn in saved:
            m.progress_bar = fn


def _encoder_info(db) -> dict:
    info = db.encoder_for(0).info
    return {"name": info.name, "fingerprint": info.fingerprint}


def _usable(path: Path) -> bool:
    import npmdb

    try:
        with npmdb.open(path, readonly=True, progress=False) as db:
            if db.count() == 0 or db.stats()["segments"] != 1:
                return False
            db.fill_mask("The capital of France is [MASK].", retrieval="bm25", top=1)
            return True
    except Exception as exc:  # noqa: BLE001 - an old or damaged database is rebuilt
        log(f"  {path.name} is not usable ({type(exc).__name__}: {exc}); rebuilding")
        return False


def ensure_main_db(data: Path, work: Path, info: dict | None = None, encoder=None) -> Path:
    """The main database (float16, HNSW, one segment) for ``data``; built when missing."""
    import npmdb

    path = work / f"{data.name}-main.npmdb"
    work.mkdir(parents=True, exist_ok=True)
    if (path / "data.mdb").exists() and _usable(path):
        log(f"main database {path} reused")
        if info is not None:
            with npmdb.open(path, readonly=True, progress=False) as db:
                info.update({"path": str(path), "reused": True, "encoder": _encoder_info(db)})
        return path
    shutil.rmtree(path, ignore_errors=True)
    docs = load_jsonl(data / "corpus.jsonl.gz")
    log(f"building the main database {path} from {len(docs)} documents …")
    stages: dict = {}
    with progress_lines() as progress, \
            npmdb.open(path, encoder=encoder, progress=progress) as db:
        enc = _encoder_info(db)
        t0 = time.perf_counter()
        with _timed_ingest_stages(stages):
            db.add(docs)
        secs = time.perf_counter() - t0
        tokens = int(db.stats()["tokens"])
    log(f"  {tokens} tokens in {secs:.0f} s ({tokens / secs:.0f} tok/s); stages: "
        + ", ".join(f"{k} {v:.0f} s" for k, v in stages.items()))
    if info is not None:
        info.update({"path": str(path), "reused": False, "seconds": secs, "tokens": tokens,
                     "tok_s": tokens / secs, "stages_s": stages, "encoder": enc})
    return path


def step_latency(main_db: Path, data: Path, *, queries: int, ks, out: dict,
                 cold: bool = True) -> None:
    import npmdb

    from .latency import open_time, stage_breakdown, time_queries

    texts = [r["query"] for r in load_jsonl(data / "cloze.jsonl")][:queries]
    out["open_ms"] = open_time(main_db)
    out["open_cold"] = cold_open(main_db) if cold else {}
    if cold:
        log(f"  open: p50 {out['open_ms']['p50']:.1f} ms in a warm process; in a new process "
            f"{out['open_cold']['open_ms']:.0f} ms (+ {out['open_cold']['import_ms']:.0f} ms "
            "to import npmdb)")
    out["latency"], out["breakdown"] = [], {}
    with npmdb.open(main_db, readonly=True, progress=False) as db:
        out["stats"] = {k: v for k, v in db.stats().items() if k != "config"}
        for retrieval in ("dense", "bm25", "hybrid"):
            for mode in ("phrase", "token"):
                for k in (ks if retrieval != "bm25" else [1024]):
                    r = time_queries(db, texts, retrieval=retrieval, mode=mode, k=k)
                    row = {"retrieval": retrieval, "mode": mode,
                           "k": k if retrieval != "bm25" else None, **r}
                    out["latency"].append(row)
                    log(f"  {retrieval:>6} {mode:>6} k={row['k']}: p50 {r['p50']:.1f} ms, "
                        f"p99 {r['p99']:.1f} ms")
        for retrieval in ("dense", "bm25", "hybrid"):
            out["breakdown"][retrieval] = stage_breakdown(db, texts[:50], retrieval=retrieval,
                                                          k=1024)
            log(f"  stages ({retrieval}, k=1024): " + ", ".join(
                f"{k} {v:.1f}" for k, v in out["breakdown"][retrieval].items()))


def cold_open(path: Path) -> dict:
    """``npmdb.open`` in a fresh interpreter: the import, then the open (its lazy imports
    included), then the first bm25 query (encoder load included)."""
    import subprocess

    code = ("import time, json, sys\n"
            "t0 = time.perf_counter(); import npmdb; t1 = time.perf_counter()\n"
            "db = npmdb.open(sys.argv[1], readonly=True, progress=False); t2 = time.perf_counter()\n"
            "db.fill_mask('The capital of France is [MASK].', retrieval='bm25')\n"
            "t3 = time.perf_counter()\n"
            "print(json.dumps({'import_ms': 1e3 * (t1 - t0), 'open_ms': 1e3 * (t2 - t1),"
            " 'first_query_ms': 1e3 * (t3 - t2)}))\n")
    try:
        r = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                           text=True, timeout=600, cwd=ROOT)
        return json.loads(r.stdout.strip().splitlines()[-1])
    except Exception as exc:  # noqa: BLE001 - reported, not fatal
        return {"error": str(exc), "import_ms": float("nan"), "open_ms": float("nan"),
                "first_query_ms": float("nan")}


def step_ingest(data: Path, *, docs: int, out: dict, encoder=None) -> None:
    from .latency import ingest

    corpus = load_jsonl(data / "corpus.jsonl.gz")
    sample = corpus[:docs]
    stages: dict[str, float] = {}  # db.add's stages
    out.update(ingest(sample, encoder=encoder, timer=lambda: _timed_ingest_stages(stages)))
    out["stages_s"] = stages
    log(f"  add {out['add_tok_s']:.0f} tok/s, encoder alone {out['encoder_tok_s']:.0f} tok/s "
        f"(ratio {out['ratio']:.2f}) on {out['tokens']} tokens")
    # the large-corpus settings: an add into a trained IVF template, int4 rows; the
    # template is trained by an untimed first add of other documents
    warm = corpus[docs:docs + max(docs, 40)]
    ivf_stages: dict[str, float] = {}  # the timed add only, not the warm one
    out["ivf"] = ivf = ingest(sample, encoder=encoder, index="ivf", codec="int4", warm=warm,
                              timer=lambda: _timed_ingest_stages(ivf_stages))
    ivf["stages_s"] = ivf_stages
    log(f"  ivf+int4 add {ivf['add_tok_s']:.0f} tok/s, encoder alone "
        f"{ivf['encoder_tok_s']:.0f} tok/s (ratio {ivf['ratio']:.2f})")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--work", type=Path, default=ROOT / "bench" / "work")
    ap.add_argument("--quick", action="store_true",
                    help="fewer queries, k and codecs: a few minutes on dev-small")
    ap.add_argument("--only", default="", help=f"comma-separated steps of {','.join(STEPS)}")
    ap.add_argument("--skip", default="", help="comma-separated steps to skip")
    ap.add_argument("--queries", type=int, default=None, help="latency queries per setting")
    ap.add_argument("--lance-index", default="none", choices=("none", "ivf_pq"))
    ap.add_argument("--no-report", action="store_true", help="write no markdown report")
    ap.add_argument("--report", type=Path, default=None,
                    help="where the markdown report goes (default: BENCHMARKS.md for a full "
                         "run, bench-<data>-quick.md / -smoke.md beside the JSON for a quick "
                         "or smoke one, DIR/BENCHMARKS.md with --results DIR)")
    ap.add_argument("--smoke", action="store_true", help="a few queries of everything (tests)")
    ap.add_argument("--encoder", default=None, help="encoder directory for a new main database")
    ap.add_argument("--results", type=Path, default=RESULTS, help="where the JSON and the plots go")
    args = ap.parse_args(argv)
    os.environ.setdefault("RUST_LOG", "error")  # LanceDB chatter
    os.environ.setdefault("LANCE_LOG", "error")

    only = [s for s in args.only.split(",") if s]
    skip = [s for s in args.skip.split(",") if s]
    unknown = [s for s in only + skip if s not in STEPS]
    if unknown:  # before any work: it failed as a step after the main database's build
        ap.error(f"unknown step(s) {', '.join(unknown)}; the steps are {', '.join(STEPS)}")
    require_data(args.data, "corpus.jsonl.gz", "cloze.jsonl", error=ap.error)
    quick = args.quick
    q = args.queries or (30 if quick else 100)
    cfg = {"queries": q, "ks": [64, 1024] if quick else [64, 256, 1024, 4096],
           "ingest_docs": 1000 if quick else 1500, "ann_queries": 30 if quick else 100,
           "ann_ks": [64, 256, 1024, 4096], "em_queries": 40 if quick else 150,
           "codecs": ["float16", "int8", "pq"] if quick else ["float16", "int8", "pq", "pq48"],
           "codec_queries": 40 if quick else 200, "peer_queries": 20 if quick else 100,
           "growth_queries": 30 if quick else 100}
    if args.smoke:
        q = args.queries or 3
        cfg.update(queries=q, ks=[8, 64], ingest_docs=40, ann_queries=3, ann_ks=[8, 64],
                   em_queries=3, codecs=["float16", "int8", "pq"], codec_queries=3,
                   peer_queries=3, growth_queries=3)
    steps = [s for s in (only or STEPS) if s not in skip]
    name = f"bench-{args.data.name}" + ("-smoke" if args.smoke else "-quick" if quick else "")
    path = args.results / f"{name}.json"
    results: dict = {"data": str(args.data), "quick": quick, "smoke": args.smoke, "config": cfg,
                     "machine": machine(), "steps": {}, "errors": {}}
    if path.exists() and args.only:  # a partial re-run keeps the other steps' results
        old = json.loads(path.read_text())
        results["steps"] = old.get("steps", {})
        results["errors"] = old.get("errors", {})  # a step that failed stays failed

    def save() -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(results, indent=1, ensure_ascii=False, default=float))

    log(f"npmdb benchmarks on {args.data} ({'quick' if quick else 'full'}): steps {', '.join(steps)}")
    info: dict = {}
    main_db = ensure_main_db(args.data, args.work, info, encoder=args.encoder)
    results["steps"]["main"] = info
    save()
    from . import ann, codecs, growth, peers

    runners = {
        "latency": lambda out: step_latency(main_db, args.data, queries=q, ks=cfg["ks"], out=out,
                                              cold=not args.smoke),
        "ingest": lambda out: step_ingest(args.data, docs=cfg["ingest_docs"], out=out,
                                          encoder=args.encoder),
        "ann": lambda out: out.update(ann.run(main_db, args.data, queries=cfg["ann_queries"],
                                              em_queries=cfg["em_queries"], ks=cfg["ann_ks"],
                                              log=log)),
        "codecs": lambda out: out.update(codecs.run(main_db, args.data, args.work,
                                                    codecs=cfg["codecs"],
                                                    queries=cfg["codec_queries"], log=log)),
        "peers": lambda out: out.update(peers.run(main_db, args.data, args.work,
                                                  queries=cfg["peer_queries"],
                                                  index=args.lance_index, log=log)),
        "growth": lambda out: out.update(growth.run(main_db, args.data, args.work,
                                                    queries=cfg["growth_queries"], log=log)),
    }
    for step in steps:
        if step == "main":
            continue
        log(f"== {step} ==")
        t0 = time.perf_counter()
        out: dict = {}
        try:
            runners[step](out)
            results["errors"].pop(step, None)
        except Exception as exc:  # noqa: BLE001 - record, go on with the other steps
            log(f"  {step} FAILED: {type(exc).__name__}: {exc}")
            results["errors"][step] = traceback.format_exc()
        out["seconds"] = time.perf_counter() - t0
        out["ran"] = time.strftime("%Y-%m-%d %H:%M")
        results["steps"][step] = out
        save()
        log(f"  {step} done in {out['seconds']:.0f} s")
    results["total_s"] = time.perf_counter() - _T0
    save()
    if not args.no_report:
        from . import report

        md, plots = report.write_report(results, name, md_path=args.report,
                                        results_dir=args.results)
        log(f"wrote {path}, {md}" + (f" and {len(plots)} plots under {args.results}" if plots
                                     else " (no plots)"))
    log(f"total {results['total_s'] / 60:.1f} min")
    return 1 if results["errors"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
