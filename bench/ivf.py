"""The dense index kinds compared on one real database: hnsw, ivf (IVF-PQ, memory-mapped
lists) and exact (a flat index), with the same stored vectors and the same encoder.

    python -m bench.ivf --db demo.npmdb --data npmdb/data/dev-small [--queries 200]

Each kind is a copy of ``--db`` converted by ``optimize(index=...)`` (vectors copied, not
re-encoded). Per kind: bytes per token of every file of the database and of the dense
index files alone, the conversion time (index build), dense recall@k of the candidates
against an exact scan (the engine's own ExactTopK), dense cloze EM and its change against
exact, fill_mask p50/p99 at k, open time, and the query process's RSS growth after the
queries (the index's resident cost). Writes ``bench/results/ivf-<data>.{json,md}``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from .common import SMALL_DATA, load_jsonl, publish, require_data
from .quality import evaluate_cloze
from .replay import measure

KINDS = ("hnsw", "ivf", "exact")


def _dense_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in (path / "segments").rglob("g*.*") if f.is_file())


def _compact_bytes(path: Path) -> int:
    """Every file of the database with data.mdb as a compacted copy would hold it (a
    conversion frees the old segment's pages, but an LMDB file never shrinks)."""
    import tempfile

    import lmdb

    env = lmdb.open(str(path), readonly=True, lock=False, max_dbs=32, subdir=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        env.copy(tmp, compact=True)
        mdb = sum(f.stat().st_size for f in Path(tmp).iterdir())
    env.close()
    rest = sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and f.name != "data.mdb")
    return mdb + rest


def _recall(db, rows: list[dict], k: int) -> float:
    """Mean over queries and sides of |ANN candidates ∩ exact candidates| / k."""
    from npmdb.query.operators import DenseTopK, EncodeQuery, ExactTopK
    from npmdb.query.physical import ExecState

    out = []
    with db.snapshot() as snap:
        for r in rows:
            st = ExecState(snap, r["query"], encode=None)
            enc = EncodeQuery("phrase")
            st.outputs[id(enc)] = enc.run(st)
            for side in ("start", "end"):
                ann, ex = DenseTopK(side, k, children=(enc,)), ExactTopK(side, k, children=(enc,))
                ann.prepare(st)
                a = ann.run(st).by_side[side]
                e = ex.run(st).by_side[side]
                got = {(si, int(p)) for si, ps in a.items() for p in ps}
                want = {(si, int(p)) for si, ps in e.items() for p in ps}
                out.append(len(got & want) / max(len(want), 1))
    return float(np.mean(out))


def run(db_path: Path, data: Path, work: Path, n_queries: int, k: int) -> dict:
    import npmdb

    rows = load_jsonl(data / "cloze.jsonl")[:n_queries]
    work.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict] = {}
    for kind in KINDS:
        dst = work / kind
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(db_path, dst)
        with npmdb.open(dst, progress=False) as db:
            t = time.perf_counter()
            db.optimize(index=kind)
            db.vacuum(keep_tags=False)
            build_s = time.perf_counter() - t
            st = db.stats()
            tokens = max(int(st["tokens"]), 1)
            em = evaluate_cloze(db, rows, "dense", k=k)
            em_exact = evaluate_cloze(db, rows, "dense", k=k, options={"exact": True}) \
                if kind == "hnsw" else None
            recall = _recall(db, rows[: min(60, len(rows))], k)
        probe = measure(dst, data, k, min(100, len(rows)))  # a fresh process
        results[kind] = {"tokens": tokens, "index": st["index"],
                         "bytes_per_token": st["bytes_on_disk"] / tokens,
                         "dense_bytes_per_token": _dense_bytes(dst) / tokens,
                         "build_s": build_s, "em_dense": em["em_micro"],
                         "recall": recall, "latency": probe["latency"],
                         "open_ms": probe["open_s"] * 1e3, "rss_mb": probe["rss"]["VmRSS"],
                         "rss_anon_mb": probe["rss"]["RssAnon"],
                         "compact_bytes_per_token": _compact_bytes(dst) / tokens}
        if em_exact is not None:
            results["exact_scan_em"] = em_exact["em_micro"]
        print(kind, results[kind], file=sys.stderr)
    return {"db": str(db_path), "data": str(data), "k": k, "queries": len(rows),
            "kinds": results}


def render(out: dict) -> str:
    r = out["kinds"]
    lines = [f"## Dense index kinds — {Path(out['data']).name} ({r['hnsw']['tokens']} tokens, "
             f"k={out['k']}, {out['queries']} cloze queries)", "",
             "| index | B/token (all files, LMDB compacted) | dense index B/token | build s | "
             "recall@k vs exact | EM dense | p50 ms | p99 ms | open ms | RSS MB (anon) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for kind in KINDS:
        x = r[kind]
        lines.append(f"| {kind} | {x['compact_bytes_per_token']:.0f} | "
                     f"{x['dense_bytes_per_token']:.0f} "
                     f"| {x['build_s']:.1f} | {x['recall']:.3f} | {x['em_dense']:.1f} | "
                     f"{x['latency']['p50']:.1f} | {x['latency']['p99']:.1f} | "
                     f"{x['open_ms']:.1f} | {x['rss_mb']:.0f} ({x['rss_anon_mb']:.0f}) |")
    lines += ["", f"EM with an exact scan of the stored vectors (exact=True): "
              f"{r['exact_scan_em']:.1f}. Each kind is the same database converted by "
              "optimize(index=...); latency, open and RSS are measured in a fresh process "
              "per kind after 100 queries (RSS: the process's pages, torch and the encoder "
              "included; anon: its own allocations, where in-RAM graphs live, not the "
              "memory-mapped files).", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", type=Path, required=True)
    ap.add_argument("--data", type=Path, default=SMALL_DATA)
    ap.add_argument("--work", type=Path, default=Path("build/bench-ivf"))
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("-k", type=int, default=1024)
    a = ap.parse_args(argv)
    require_data(a.data, "cloze.jsonl", error=ap.error)
    out = run(a.db, a.data, a.work, a.queries, a.k)
    return publish(f"ivf-{a.data.name}", out, render)


if __name__ == "__main__":
    raise SystemExit(main())
