"""Vector codecs: bytes per stored token and answer quality per codec.

For each codec (float16, int8, pq = dim/4 bytes, pq with dim/8 bytes) a copy of the main
database is built from the *same* vectors (replayed from the main float16 database, so the
encoder runs once), with an exact (flat) dense index so that only the codec differs. On
the cloze queries each copy answers with dense retrieval at k=1024 and we report:

* bytes per stored token: vectors (LMDB values), the codec's own state, and the indexes
  of the main database (HNSW start + end, BM25) for the total a deployment would store;
* EM (SQuAD normalisation) and its difference to float16, and the agreement of the top-1
  answer with float16 (an untrained encoder has EM near 0, so agreement is the telling
  number);
* the median milliseconds of ScoreSpans (where stored vectors are decoded).

    python -m bench.codecs --data npmdb/data/dev-small [--db bench/work/dev-small-float16.npmdb]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from npmdb.evaluation import exact_match

from .common import SMALL_DATA, WORK, load_jsonl, publish, require_data

CODECS = ("float16", "int8", "pq", "pq48")


# -- building a database from replayed vectors -------------------------------------------


class ReplayEncoder:
    """Stands in for the encoder during ``add``: ``encode_blocks`` returns the vectors the
    source database stored for the same tokens, in order (the same documents added in
    the same order give the same blocks). Everything else goes to the real encoder."""

    def __init__(self, real, source_db, n_tokens: int | None = None) -> None:
        self._real = real
        self._src = source_db
        self._cursor = 0
        with source_db.snapshot() as snap:
            if len(snap.segments) != 1:
                raise RuntimeError("the source database must have one segment (one add)")
            self._seg = snap.segments[0]
            self._gen = snap.generation
            self._tokens = self._seg.columns(snap.txn).tokens
        self._limit = n_tokens or len(self._tokens)

    def __getattr__(self, name):
        return getattr(self._real, name)

    def encode_blocks(self, blocks, **_kw):
        sizes = [len(b) for b in blocks]
        lo, hi = self._cursor, self._cursor + sum(sizes)
        if hi > self._limit:
            raise RuntimeError("replay ran past the source database's tokens")
        ids = np.concatenate(blocks) if blocks else np.zeros(0, np.int32)
        if not np.array_equal(ids, self._tokens[lo:hi]):
            raise RuntimeError(f"replayed blocks differ from the source at tokens {lo}..{hi}")
        with self._src.snapshot() as snap:
            vecs = self._seg.vectors(snap.txn, self._gen, np.arange(lo, hi))
        self._cursor = hi
        return np.split(vecs, np.cumsum(sizes)[:-1]) if blocks else []


class _OneEncoder:
    """An encoder cache (``get(generation)``) that always gives the one encoder."""

    def __init__(self, encoder) -> None:
        self.encoder, self.device = encoder, None

    def get(self, gen: int):
        return self.encoder


def build_replayed(path: Path, source: Path, docs: list[dict], *, codec: str = "float16",
                   dense: str = "hnsw", log=print) -> dict:
    """Build ``path`` from ``docs`` (a prefix of the source's documents, in its order) with
    the source database's vectors instead of running the encoder."""
    import npmdb

    if (path / "data.mdb").exists():
        with npmdb.open(path, readonly=True, progress=False) as db:
            if db.count():
                return {"path": str(path), "reused": True}
        shutil.rmtree(path)
    t0 = time.perf_counter()
    with npmdb.open(source, readonly=True, progress=False) as src:
        real = src.encoder_for(0)
        db = npmdb.open(path, encoder=real.info.path, codec=codec, dense=dense, progress=False)
    from npmdb import ingest

    with npmdb.open(source, readonly=True, progress=False) as src, db:
        replay = _OneEncoder(ReplayEncoder(src.encoder_for(0), src))
        with db.batch() as writer:  # the ingest pipeline, with the replaying encoder
            ingest.add(writer, replay, docs)
        tokens = db.stats()["tokens"]
    s = time.perf_counter() - t0
    log(f"  built {path.name} ({codec}, {dense}): {tokens} tokens in {s:.0f} s")
    return {"path": str(path), "reused": False, "seconds": s, "tokens": tokens}


# -- bytes per token ---------------------------------------------------------------------


def storage_bytes(path: Path) -> dict:
    """Bytes by kind: vector values, codec state, other LMDB values, index files."""
    import npmdb
    from npmdb.storage import format as F

    out = {"vectors": 0, "codec_state": 0, "lmdb_other": 0, "hnsw": 0, "dense_other": 0,
           "bm25": 0, "tokens": 0, "vector_rows": 0, "bytes_per_row": 0}
    with npmdb.open(path, readonly=True, progress=False) as db:
        out["tokens"] = int(db.stats()["tokens"])
        with db.env.read() as txn:
            for name, dbi in db.env.dbs.items():
                cur = txn.cursor(db=dbi)
                for k, v in cur.iternext(keys=True, values=True):
                    if name == "vectors":
                        out["vectors"] += len(v)
                        arr = F.unpack_array(v)
                        out["vector_rows"] += int(arr.shape[0])
                        out["bytes_per_row"] = int(arr.shape[1] * arr.dtype.itemsize)
                    elif name == "meta" and bytes(k).startswith(b"codec:"):
                        out["codec_state"] += len(v)
                    else:
                        out["lmdb_other"] += len(k) + len(v)
    for f in (path / "segments").rglob("*"):
        if not f.is_file():
            continue
        if "bm25" in f.parts:
            out["bm25"] += f.stat().st_size
        elif f.suffix == ".hnsw":
            out["hnsw"] += f.stat().st_size
        else:
            out["dense_other"] += f.stat().st_size
    n = max(out["tokens"], 1)
    out["per_token"] = {k: out[k] / n for k in ("vectors", "codec_state", "lmdb_other", "hnsw",
                                                 "dense_other", "bm25")}
    return out


# -- answers -----------------------------------------------------------------------------


def answers(db, rows: list[dict], *, k: int = 1024, exact: bool = False,
            retrieval: str = "dense") -> dict:
    """Top-1 answers, EM and per-operator medians for ``rows`` (cloze records)."""
    tops, oks, stages = [], [], {}
    t0 = time.perf_counter()
    for r in rows:
        res = db.fill_mask(r["query"], top=1, k=k, retrieval=retrieval, exact=exact,
                           evidence=0)
        top = res.top.text if res.top else None
        tops.append(None if top is None else " ".join(top.lower().split()))
        oks.append(exact_match(top, r.get("answers", [])))
        for st in res.stats:
            stages.setdefault(st.operator, []).append(st.ms)
    return {"top": tops, "em": 100.0 * sum(oks) / max(len(oks), 1), "n": len(rows),
            "stage_ms": {s: float(np.median(v)) for s, v in stages.items()},
            "seconds": time.perf_counter() - t0}


def agreement(a: list, b: list) -> float:
    return 100.0 * sum(x == y for x, y in zip(a, b)) / max(len(a), 1)


def run(main_db: Path, data: Path, work: Path, *, codecs=CODECS, queries: int = 200,
        k: int = 1024, log=print) -> dict:
    """Build one flat-index copy per codec from the main database's vectors; compare."""
    import npmdb

    docs = load_jsonl(data / "corpus.jsonl.gz")
    rows = load_jsonl(data / "cloze.jsonl")[:queries]
    out: dict = {"k": k, "queries": len(rows), "codecs": {}, "main": storage_bytes(main_db)}
    main_pt = out["main"]["per_token"]
    index_pt = main_pt["hnsw"] + main_pt["bm25"]
    ref = None
    for name in codecs:
        path = work / f"{data.name}-codec-{name}.npmdb"
        log(f"codec {name}: building {path.name} …")
        built = build_replayed(path, main_db, docs, codec=name, dense="faiss-flat", log=log)
        sizes = storage_bytes(path)
        with npmdb.open(path, readonly=True, progress=False) as db:
            dim = int(db.config["dim"])
            res = answers(db, rows, k=k)
        if ref is None:
            ref = res
        pt = sizes["per_token"]
        row = {"build": built, "dim": dim, "bytes_per_vector": sizes["bytes_per_row"],
               "vector_bytes_per_token": pt["vectors"],
               "codec_state_bytes": sizes["codec_state"],
               "total_bytes_per_token": pt["vectors"] + pt["codec_state"] + pt["lmdb_other"]
               + index_pt,
               "em": res["em"], "em_delta": res["em"] - ref["em"],
               "top1_agreement": agreement(res["top"], ref["top"]),
               "score_ms": res["stage_ms"].get("ScoreSpans"), "stage_ms": res["stage_ms"],
               "top": res["top"]}
        out["codecs"][name] = row
        log(f"  {name}: {row['bytes_per_vector']} B/vector, {pt['vectors']:.0f} B/token vectors, "
            f"EM {res['em']:.1f} ({row['em_delta']:+.1f}), top-1 agreement with float16 "
            f"{row['top1_agreement']:.1f}%, ScoreSpans {row['score_ms']:.1f} ms")
    out["index_bytes_per_token"] = {"hnsw": main_pt["hnsw"], "bm25": main_pt["bm25"]}
    return out


def render(out: dict) -> str:
    lines = [f"| codec | B/vector | vectors B/token | total B/token (with HNSW+BM25) | EM | ΔEM | "
             f"top-1 = float16 | ScoreSpans ms |", "|---|---|---|---|---|---|---|---|"]
    for name, r in out["codecs"].items():
        lines.append(f"| {name} | {r['bytes_per_vector']} | {r['vector_bytes_per_token']:.0f} | "
                     f"{r['total_bytes_per_token']:.0f} | {r['em']:.1f} | {r['em_delta']:+.1f} | "
                     f"{r['top1_agreement']:.1f}% | {r['score_ms']:.1f} |")
    ix = out["index_bytes_per_token"]
    lines += ["", f"Indexes of the main database, per token: HNSW (start + end, float32) "
              f"{ix['hnsw']:.0f} B, BM25 {ix['bm25']:.0f} B. Dense k={out['k']}, "
              f"{out['queries']} cloze queries; each codec's copy uses an exact (flat) index "
              "over its own decoded vectors, so only the codec differs."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=SMALL_DATA)
    ap.add_argument("--db", type=Path, default=None, help="main float16 database (one add)")
    ap.add_argument("--work", type=Path, default=WORK)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--codecs", default=",".join(CODECS))
    args = ap.parse_args(argv)
    require_data(args.data, "corpus.jsonl.gz", "cloze.jsonl", error=ap.error)
    from .__main__ import ensure_main_db

    main_db = args.db or ensure_main_db(args.data, args.work)
    out = run(main_db, args.data, args.work, codecs=args.codecs.split(","), queries=args.queries,
              log=lambda m: print(m, file=sys.stderr))
    return publish(f"codecs-{args.data.name}", out, render)


if __name__ == "__main__":
    os.environ.setdefault("RUST_LOG", "error")
    raise SystemExit(main())
