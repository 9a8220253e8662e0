"""BM25 over several segments against one: the same answers, and what it costs.

The corpus is added in 1, 4 and 16 adds of equal size (in corpus order, so segments hold
text of different kinds and lengths, as later adds do), built from the main database's
vectors (the encoder runs once; :func:`bench.codecs.build_replayed`). For each layout:

* agreement with the one-segment database: cloze queries whose top 3 BM25 blocks (text
  and title, what ``fill_mask`` retrieves) come from the same documents, and those whose
  blocks also have the same scores (to 1e-4, relative; documents tied at the last score may
  differ: block order breaks ties);
* cloze bm25 exact match (micro) of ``fill_mask``, the figure users see;
* ``db.search`` (limit 3, and 100) and bm25 ``fill_mask`` p50 / p99 milliseconds (query
  encoding included).

    python -m bench.bm25_segments --data npmdb/data/dev-small [--db PATH] [--limit N]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from .common import SMALL_DATA, WORK, load_jsonl, machine, percentiles, publish, require_data

LAYOUTS = (1, 4, 16)


def build(path: Path, source: Path, docs: list[dict], parts: int, log=print) -> None:
    """``docs`` added in ``parts`` adds, with the source database's vectors."""
    import shutil

    import npmdb
    from npmdb import ingest

    from .codecs import ReplayEncoder, _OneEncoder

    if (path / "data.mdb").exists():
        with npmdb.open(path, readonly=True, progress=False) as db:
            if db.count() == len(docs) and db.stats()["segments"] == parts:
                return
        shutil.rmtree(path)
    t0 = time.perf_counter()
    with npmdb.open(source, readonly=True, progress=False) as src:
        real = src.encoder_for(0)
        db = npmdb.open(path, encoder=real.info.path, progress=False)
        replay = _OneEncoder(ReplayEncoder(real, src))
        with db:
            size = -(-len(docs) // parts)
            for i in range(0, len(docs), size):
                with db.batch() as writer:
                    ingest.add(writer, replay, docs[i:i + size])
    log(f"  built {path.name}: {parts} segments in {time.perf_counter() - t0:.0f} s")


def _docs(hits: list[dict]) -> set[str]:
    return {h["doc_id"] for h in hits}


def _agree(a: list[dict], b: list[dict]) -> bool:
    if len(a) != len(b) or any(abs(x["score"] - y["score"]) > 1e-4 * max(1.0, abs(x["score"]))
                               for x, y in zip(a, b)):
        return False
    cut = a[-1]["score"] + 1e-3 if a else 0.0
    return {h["doc_id"] for h in a if h["score"] > cut} == {h["doc_id"] for h in b
                                                            if h["score"] > cut}


def run(main_db: Path, data: Path, work: Path, *, limit: int = 0, log=print) -> dict:
    import npmdb
    from npmdb.evaluation import evaluate
    from npmdb.query.text import bm25_text

    docs = load_jsonl(data / "corpus.jsonl.gz")
    rows = load_jsonl(data / "cloze.jsonl")
    rows = rows[:limit] if limit else rows
    texts = [bm25_text(r["query"]) for r in rows]
    out: dict = {"data": str(data), "queries": len(rows), "layouts": {}}
    first: list | None = None
    for parts in LAYOUTS:
        path = work / f"{data.name}-bm25-{parts}seg.npmdb"
        build(path, main_db, docs, parts, log)
        with npmdb.open(path, readonly=True, progress=False) as db:
            db.search(texts[0], limit=3, title=True)
            hits, ms = [], []
            for t in texts:
                t0 = time.perf_counter()
                hits.append(db.search(t, limit=3, title=True))
                ms.append((time.perf_counter() - t0) * 1000.0)
            first = first or hits
            wide = []
            for t in texts:
                t0 = time.perf_counter()
                db.search(t, limit=100, title=True)
                wide.append((time.perf_counter() - t0) * 1000.0)
            ev = evaluate(db, rows, retrieval="bm25", progress=False)
            fm = []
            for r in rows:
                t0 = time.perf_counter()
                db.fill_mask(r["query"], retrieval="bm25", evidence=1)
                fm.append((time.perf_counter() - t0) * 1000.0)
            row = {"segments": db.stats()["segments"],
                   "same_docs": sum(_docs(a) == _docs(b) for a, b in zip(hits, first)),
                   "agree": sum(_agree(a, b) for a, b in zip(hits, first)),
                   "em_micro": ev.micro, "search_ms": percentiles(ms),
                   "search_100_ms": percentiles(wide),
                   "fill_mask_ms": percentiles(fm)}
        out["layouts"][str(parts)] = row
        log(f"  {parts} segments: agree {row['agree']}/{len(rows)}, EM {row['em_micro']:.1f}, "
            f"search p50 {row['search_ms']['p50']:.2f} ms, "
            f"fill_mask p50 {row['fill_mask_ms']['p50']:.1f} ms")
    return out


def render(out: dict) -> str:
    lines = [f"# BM25 over several segments ({out['data']}, {out['queries']} cloze queries)",
             "", "| adds | segments | top-3 documents as one segment | same scores too | "
             "cloze bm25 EM | search p50 / p99 ms | search, limit 100, p50 ms | "
             "fill_mask bm25 p50 / p99 ms |", "|---|---|---|---|---|---|---|---|"]
    for parts, r in out["layouts"].items():
        s, f = r["search_ms"], r["fill_mask_ms"]
        lines.append(f"| {parts} | {r['segments']} | {r['same_docs']} / {out['queries']} | "
                     f"{r['agree']} / {out['queries']} | "
                     f"{r['em_micro']:.1f} | {s['p50']:.2f} / {s['p99']:.2f} | "
                     f"{r['search_100_ms']['p50']:.2f} | "
                     f"{f['p50']:.1f} / {f['p99']:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=SMALL_DATA)
    ap.add_argument("--db", type=Path, default=None,
                    help="the one-add database (built from the data's corpus if empty)")
    ap.add_argument("--limit", type=int, default=0, help="first N cloze queries (0 = all)")
    ap.add_argument("--name", default=None, help="result name (default bm25-segments-DATA)")
    args = ap.parse_args(argv)
    require_data(args.data, "corpus.jsonl.gz", "cloze.jsonl", error=ap.error)
    from .quality import build_db

    work = WORK
    work.mkdir(parents=True, exist_ok=True)
    main_db = args.db or work / f"{args.data.name}.npmdb"
    build_db(main_db, args.data / "corpus.jsonl.gz").close()
    out = run(main_db, args.data, work, limit=args.limit,
              log=lambda m: print(m, file=sys.stderr))
    out["machine"] = machine()
    return publish(args.name or f"bm25-segments-{args.data.name}", out, render)


if __name__ == "__main__":
    sys.exit(main())
