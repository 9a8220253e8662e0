"""Latency against corpus size: the first 10%, 30% and 100% of the corpus's documents.

The smaller databases are built from the main database's vectors (the encoder runs
once; see :func:`bench.codecs.build_replayed`), with the same index settings. For each
size: dense fill_mask (phrase, k=1024) and bm25 p50/p99, query encoding included, and
the median milliseconds per operator; the ratio of the 100% p50 to the 10% p50 is the
growth (target: 10× the corpus costs at most 2× the dense p50).

    python -m bench.growth --data npmdb/data/dev-small [--db PATH] [--queries 100]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .common import SMALL_DATA, WORK, load_jsonl, publish, require_data

FRACTIONS = (0.1, 0.3, 1.0)


def run(main_db: Path, data: Path, work: Path, *, queries: int = 100, k: int = 1024,
        fractions=FRACTIONS, log=print) -> dict:
    import npmdb

    from .codecs import build_replayed
    from .latency import open_time, stage_breakdown, time_queries

    docs = load_jsonl(data / "corpus.jsonl.gz")
    texts = [r["query"] for r in load_jsonl(data / "cloze.jsonl")][:queries]
    rows = []
    for frac in fractions:
        if frac >= 1.0:
            path = main_db
        else:
            path = work / f"{data.name}-{int(round(frac * 100))}pct.npmdb"
            log(f"growth {frac:.0%}: building {path.name} …")
            build_replayed(path, main_db, docs[: max(1, int(round(frac * len(docs))))], log=log)
        opened = open_time(path)
        with npmdb.open(path, readonly=True, progress=False) as db:
            tokens = int(db.stats()["tokens"])
            dense = time_queries(db, texts, retrieval="dense", k=k)
            bm25 = time_queries(db, texts, retrieval="bm25")
            stages = stage_breakdown(db, texts[:30], retrieval="dense", k=k)
        rows.append({"fraction": frac, "tokens": tokens, "dense": dense, "bm25": bm25,
                     "dense_stages": stages, "open_ms": opened})
        log(f"  {frac:.0%} ({tokens} tokens): dense p50 {dense['p50']:.1f} ms, "
            f"bm25 p50 {bm25['p50']:.1f} ms")
    lo, hi = rows[0], rows[-1]
    return {"k": k, "queries": len(texts), "rows": rows,
            "corpus_ratio": hi["tokens"] / max(lo["tokens"], 1),
            "dense_p50_ratio": hi["dense"]["p50"] / lo["dense"]["p50"],
            "bm25_p50_ratio": hi["bm25"]["p50"] / lo["bm25"]["p50"]}


def render(out: dict) -> str:
    lines = ["| corpus | tokens | open ms | dense p50 | dense p99 | bm25 p50 | dense stages (median ms) |",
             "|---|---|---|---|---|---|---|"]
    for r in out["rows"]:
        st = ", ".join(f"{k} {v:.1f}" for k, v in r["dense_stages"].items())
        lines.append(f"| {r['fraction']:.0%} | {r['tokens']} | {r['open_ms']['p50']:.0f} | "
                     f"{r['dense']['p50']:.1f} | "
                     f"{r['dense']['p99']:.1f} | {r['bm25']['p50']:.1f} | {st} |")
    lines += ["", f"{out['corpus_ratio']:.1f}× the corpus costs ×{out['dense_p50_ratio']:.2f} "
              f"dense p50 (k={out['k']}) and ×{out['bm25_p50_ratio']:.2f} bm25 p50."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=SMALL_DATA)
    ap.add_argument("--db", type=Path, default=None)
    ap.add_argument("--work", type=Path, default=WORK)
    ap.add_argument("--queries", type=int, default=100)
    args = ap.parse_args(argv)
    require_data(args.data, "corpus.jsonl.gz", "cloze.jsonl", error=ap.error)
    from .__main__ import ensure_main_db

    main_db = args.db or ensure_main_db(args.data, args.work)
    out = run(main_db, args.data, args.work, queries=args.queries,
              log=lambda m: print(m, file=sys.stderr))
    return publish(f"growth-{args.data.name}", out, render)


if __name__ == "__main__":
    raise SystemExit(main())
