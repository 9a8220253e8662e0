"""Latency and ingest speed.

* ``fill_mask`` p50/p99 per retrieval mode (dense, bm25, hybrid), per query mode (phrase,
  token) and per k (64, 256, 1024, 4096), query encoding included, on a warm database.
* ingest tokens/second of ``Database.add`` against the encoder alone on the same text
  (tokenize + forward passes over the same blocks), as a ratio.
* open time of an existing database.

    python -m bench.latency --data npmdb/data/dev-small [--db PATH] [--queries 100]
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
import tempfile
import time
from pathlib import Path

from .common import (SMALL_DATA, WORK, count, counts, load_jsonl, machine, percentiles,
                     require_data, write_result)

KS = (64, 256, 1024, 4096)


def time_queries(db, queries, **opts) -> dict:
    db.fill_mask(queries[0], **opts)  # warm: encoder, indexes, columns
    ms = []
    for q in queries:
        t0 = time.perf_counter()
        db.fill_mask(q, evidence=1, **opts)
        ms.append((time.perf_counter() - t0) * 1000.0)
    return percentiles(ms)


def stage_breakdown(db, queries, **opts) -> dict[str, float]:
    """Median milliseconds per plan operator (what bounds the latency)."""
    per: dict[str, list[float]] = {}
    for q in queries:
        res = db.fill_mask(q, evidence=1, **opts)
        for st in res.stats:
            per.setdefault(st.operator, []).append(st.ms)
    import numpy as np
    return {k: float(np.median(v)) for k, v in per.items()}


def ingest(docs: list[dict], encoder=None, index: str = "hnsw", codec: str = "float16",
           warm: list[dict] = (), timer=None) -> dict:
    """Tokens/s of db.add vs the encoder alone (tokenize + encode the same blocks), into
    a database of dense ``index`` and ``codec``; ``warm`` documents are added first,
    untimed (for ``ivf``: the add that trains the template, so the timed add is one into
    a trained index, as every add after a database's first). The encoder alone is timed
    just before and just after the add and the two averaged: on a shared machine its
    speed drifts by ±5 % between minutes, as much as the difference being measured."""
    import npmdb
    from npmdb.ingest import prepare

    tmp = Path(tempfile.mkdtemp(prefix="npmdb-ingest-"))
    try:
        t0 = time.perf_counter()
        with npmdb.open(tmp / "db", encoder=encoder, index=index, codec=codec,
                        progress=False) as db:
            db.encoder_for(0)  # model load is not ingest
            if warm:
                db.add(warm)
            before = db.stats()["tokens"]
            enc = db.encoder_for(0)

            def encoder_alone() -> float:
                t = time.perf_counter()
                prep = prepare(enc, [npmdb.Document(d.get("id"), d.get("title", ""),
                                                    d["text"], {}) for d in docs], 256,
                               progress=False)
                blocks = [prep.block(b) for b in range(prep.n_blocks)]
                for i in range(0, len(blocks), 256):
                    enc.encode_blocks(blocks[i:i + 256])
                return time.perf_counter() - t

            t_before = encoder_alone()
            t1 = time.perf_counter()
            with timer() if timer else contextlib.nullcontext():  # e.g. stage timers
                db.add(docs)
            t_add = time.perf_counter() - t1
            n_tokens = db.stats()["tokens"] - before
            t_after = encoder_alone()
            t_enc = (t_before + t_after) / 2
        return {"index": index, "codec": codec, "warm_docs": len(warm),
                "docs": len(docs), "tokens": n_tokens, "add_s": t_add, "encoder_alone_s": t_enc,
                "encoder_alone_before_after_s": [t_before, t_after],
                "add_tok_s": n_tokens / t_add, "encoder_tok_s": n_tokens / t_enc,
                "ratio": t_enc / t_add, "setup_s": t1 - t0}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def open_time(path: Path, repeats: int = 5) -> dict:
    import npmdb
    ms = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        db = npmdb.open(path, readonly=True, progress=False)
        ms.append((time.perf_counter() - t0) * 1000.0)
        db.close()
    return percentiles(ms)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.latency", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=SMALL_DATA)
    ap.add_argument("--db", type=Path, default=None)
    ap.add_argument("--queries", type=count, default=100)
    ap.add_argument("--ingest-docs", type=count, default=1500)
    ap.add_argument("--ks", type=counts, default=list(KS), help="dense k values: 64,1024")
    ap.add_argument("--name", default=None)
    args = ap.parse_args(argv)
    require_data(args.data, "corpus.jsonl.gz", "cloze.jsonl", error=ap.error)
    import npmdb

    try:
        return _run(args)
    except npmdb.Error as exc:  # a database path that is a file, a k past the limit
        ap.error(str(exc))


def _run(args) -> int:

    import npmdb
    from .quality import build_db

    db_path = args.db or WORK / f"{args.data.name}.npmdb"
    db_path.parent.mkdir(parents=True, exist_ok=True)
    build_db(db_path, args.data / "corpus.jsonl.gz").close()
    queries = [r["query"] for r in load_jsonl(args.data / "cloze.jsonl")][: args.queries]
    out = {"data": str(args.data), "db": str(db_path), "machine": machine(), "latency": [],
           "breakdown": {}}
    out["open_ms"] = open_time(db_path)
    ks = args.ks
    with npmdb.open(db_path, readonly=True, progress=False) as db:
        out["stats"] = {k: v for k, v in db.stats().items() if k != "config"}
        for retrieval in ("dense", "bm25", "hybrid"):
            for mode in ("phrase", "token"):
                for k in (ks if retrieval != "bm25" else [ks[0]]):
                    r = time_queries(db, queries, retrieval=retrieval, mode=mode, k=k)
                    row = {"retrieval": retrieval, "mode": mode, "k": k if retrieval != "bm25" else None, **r}
                    out["latency"].append(row)
                    print(f"{retrieval:>6} {mode:>6} k={row['k']}: p50 {r['p50']:.1f} ms  "
                          f"p99 {r['p99']:.1f} ms", file=sys.stderr)
        for retrieval in ("dense", "bm25"):
            out["breakdown"][retrieval] = stage_breakdown(db, queries[:30], retrieval=retrieval)
    docs = load_jsonl(args.data / "corpus.jsonl.gz")[: args.ingest_docs]
    out["ingest"] = ingest(docs)
    md = render(out)
    path = write_result(args.name or f"latency-{args.data.name}", out, md)
    print(md)
    print(f"wrote {path}", file=sys.stderr)
    return 0


def render(out: dict) -> str:
    lines = [f"## Latency — {out['data']} ({out['stats'].get('tokens')} tokens, "
             f"{out['machine']['cpus']} CPUs)", "",
             "| retrieval | mode | k | p50 ms | p99 ms |", "|---|---|---|---|---|"]
    for r in out["latency"]:
        lines.append(f"| {r['retrieval']} | {r['mode']} | {r['k'] or '–'} | {r['p50']:.1f} | {r['p99']:.1f} |")
    lines += ["", "Median ms per operator (phrase mode, k=1024):", ""]
    for retrieval, stages in out["breakdown"].items():
        lines.append(f"- {retrieval}: " + ", ".join(f"{k} {v:.1f}" for k, v in stages.items()))
    ing = out["ingest"]
    lines += ["", f"Open: p50 {out['open_ms']['p50']:.1f} ms.", "",
              f"Ingest: {ing['tokens']} tokens, add {ing['add_tok_s']:.0f} tok/s, encoder alone "
              f"{ing['encoder_tok_s']:.0f} tok/s (ratio {ing['ratio']:.2f})."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
