"""ANN quality: recall@k of the dense (HNSW) index against exact search, and its EM cost.

* recall@k: for each query's ``q_s`` (against valid starts) and ``q_e`` (valid ends), the
  fraction of the exact top-``k`` (numpy over every stored vector) that the index returns,
  per k (64, 256, 1024, 4096) and per search effort (``ef = max(ef_search_min,
  ef_factor * k)``); the milliseconds of both searches give the recall/speed curve.
* EM difference: ``fill_mask`` with the index (default settings) against ``exact=True``
  on cloze queries (k=1024): EM of each and the agreement of their top-1 answers (an
  untrained encoder has EM near 0, so agreement is the telling number).

    python -m bench.ann --data npmdb/data/dev-small [--db PATH] [--queries 100]
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from .common import SMALL_DATA, WORK, load_jsonl, publish, require_data

KS = (64, 256, 1024, 4096)
EF_FACTORS = (1.0, 1.5, 2.0, 3.0)


def exact_matrix(db, side: str) -> tuple[np.ndarray, np.ndarray]:
    """Positions and float32 vectors of every valid start (or end) of the main segment."""
    from npmdb.boundaries import VALID_END, VALID_START

    flag = VALID_START if side == "start" else VALID_END
    with db.snapshot() as snap:
        if len(snap.segments) != 1:
            raise RuntimeError("bench.ann expects a one-segment database")
        seg = snap.segments[0]
        pos = np.flatnonzero(seg.columns(snap.txn).flags & flag).astype(np.int64)
        vecs = np.empty((len(pos), seg.dim), np.float32)
        for a in range(0, len(pos), 65536):
            vecs[a:a + 65536] = seg.vectors(snap.txn, snap.generation, pos[a:a + 65536])
    return pos, vecs


def exact_topk(pos: np.ndarray, vecs: np.ndarray, q: np.ndarray, k: int) -> np.ndarray:
    sims = vecs @ q
    k = min(k, len(sims))
    part = np.argpartition(-sims, k - 1)[:k]
    return pos[part[np.argsort(-sims[part], kind="stable")]]


def recall(db, queries: list[str], ks=KS, ef_factors=EF_FACTORS, log=print) -> dict:
    enc = db.encoder
    qv = [enc.encode_query(q, "phrase") for q in queries]
    mats = {side: exact_matrix(db, side) for side in ("start", "end")}
    kmax = max(ks)
    exact = {side: [exact_topk(*mats[side], getattr(v, side), kmax) for v in qv]
             for side in mats}
    # exact search cost, for reference (numpy over the float32 matrix, one thread's worth)
    t0 = time.perf_counter()
    for v in qv[:20]:
        for side in mats:
            exact_topk(*mats[side], getattr(v, side), 1024)
    exact_ms = (time.perf_counter() - t0) * 1000.0 / max(min(len(qv), 20), 1)
    with db.snapshot() as snap:
        seg = snap.segments[0]
        idx = {side: seg.dense(snap.generation, side) for side in mats}
        base = idx["start"].params
        default_factor = base.ef_factor
        rows = []
        try:
            for f in sorted(set(ef_factors) | {default_factor}):
                for side in idx:
                    idx[side].params = replace(base, ef_factor=f)
                for k in ks:
                    rec, ms = [], []
                    for i, v in enumerate(qv):
                        t0 = time.perf_counter()
                        found = {side: idx[side].search(getattr(v, side), k)[0] for side in idx}
                        ms.append((time.perf_counter() - t0) * 1000.0)
                        for side in idx:
                            truth = exact[side][i][:k]
                            rec.append(len(np.intersect1d(found[side], truth)) / max(len(truth), 1))
                    rows.append({"ef_factor": f, "ef": max(base.ef_search_min, int(f * k), k),
                                 "k": k, "recall": float(np.mean(rec)),
                                 "recall_min": float(np.min(rec)),
                                 "search_ms_p50": float(np.median(ms)), "default": f == default_factor})
                    log(f"  ef_factor {f:g} k={k}: recall {rows[-1]['recall']:.4f} "
                        f"(min {rows[-1]['recall_min']:.3f}), both searches {rows[-1]['search_ms_p50']:.2f} ms")
        finally:
            for side in idx:
                idx[side].params = base
    n_vec = {side: int(len(mats[side][0])) for side in mats}
    log("HNSW build settings on a sample …")
    sweep = build_sweep(*mats["start"], np.stack([v.start for v in qv]), log=log)
    return {"rows": rows, "exact_numpy_ms": exact_ms, "vectors": n_vec, "build_sweep": sweep,
            "params": {"m": base.m, "ef_construction": base.ef_construction,
                       "ef_search_min": base.ef_search_min, "ef_factor": default_factor}}


BUILD_SWEEP = ((32, 200), (24, 100), (16, 100), (16, 64))


def build_sweep(pos: np.ndarray, vecs: np.ndarray, queries: np.ndarray, *, n: int = 50000,
                k: int = 1024, sweep=BUILD_SWEEP, log=print) -> list[dict]:
    """HNSW build cost and recall@k per (M, ef_construction) on a sample of ``n`` vectors
    (what the ingest/recall trade-off looks like; the cost per vector scales to a corpus)."""
    import os

    import hnswlib

    rng = np.random.default_rng(13)
    if len(pos) > n:
        sel = np.sort(rng.choice(len(pos), n, replace=False))
        pos, vecs = pos[sel], vecs[sel]
    k = min(k, len(pos))
    truth = [exact_topk(pos, vecs, q, k) for q in queries]
    rows = []
    for m, efc in sweep:
        idx = hnswlib.Index(space="ip", dim=vecs.shape[1])
        idx.init_index(max_elements=len(pos), M=m, ef_construction=efc, random_seed=13)
        t0 = time.perf_counter()
        idx.add_items(vecs, pos, num_threads=os.cpu_count() or 1)
        build = time.perf_counter() - t0
        for f in (1.5, 2.0):
            ef = max(256, int(f * k), k)
            idx.set_ef(ef)
            rec, ms = [], []
            for q, tr in zip(queries, truth):
                t0 = time.perf_counter()
                labels, _ = idx.knn_query(q[None], k=k, num_threads=1)
                ms.append((time.perf_counter() - t0) * 1000.0)
                rec.append(len(np.intersect1d(labels[0], tr)) / max(len(tr), 1))
            rows.append({"m": m, "ef_construction": efc, "ef": ef, "n": int(len(pos)),
                         "build_s": build, "build_us_per_vector": 1e6 * build / len(pos),
                         "recall": float(np.mean(rec)), "recall_min": float(np.min(rec)),
                         "search_ms_p50": float(np.median(ms))})
            log(f"  build M={m} efc={efc}: {rows[-1]['build_us_per_vector']:.0f} µs/vector; "
                f"ef={ef}: recall@{k} {rows[-1]['recall']:.4f}, {rows[-1]['search_ms_p50']:.2f} ms")
    return rows


def em_difference(db, rows: list[dict], k: int = 1024, log=print) -> dict:
    from .codecs import agreement, answers

    ann = answers(db, rows, k=k, exact=False)
    log(f"  ANN: EM {ann['em']:.1f} in {ann['seconds']:.0f} s")
    ex = answers(db, rows, k=k, exact=True)
    log(f"  exact: EM {ex['em']:.1f} in {ex['seconds']:.0f} s")
    return {"k": k, "n": len(rows), "em_ann": ann["em"], "em_exact": ex["em"],
            "em_delta": ann["em"] - ex["em"], "top1_agreement": agreement(ann["top"], ex["top"]),
            "ann_stage_ms": ann["stage_ms"], "exact_stage_ms": ex["stage_ms"]}


def run(main_db: Path, data: Path, *, queries: int = 100, em_queries: int = 200, ks=KS,
        log=print) -> dict:
    import npmdb

    cloze = load_jsonl(data / "cloze.jsonl")
    with npmdb.open(main_db, readonly=True, progress=False) as db:
        log(f"ANN recall on {queries} queries …")
        out = {"recall": recall(db, [r["query"] for r in cloze[:queries]], ks=ks, log=log)}
        log(f"ANN vs exact EM on {min(em_queries, len(cloze))} queries …")
        out["em"] = em_difference(db, cloze[:em_queries], log=log)
    return out


def render(out: dict) -> str:
    rec = out["recall"]
    lines = ["| ef_factor | k | ef | recall@k | min | both searches ms (p50) |",
             "|---|---|---|---|---|---|"]
    for r in rec["rows"]:
        mark = " (default)" if r["default"] else ""
        lines.append(f"| {r['ef_factor']:g}{mark} | {r['k']} | {r['ef']} | {r['recall']:.4f} | "
                     f"{r['recall_min']:.3f} | {r['search_ms_p50']:.2f} |")
    p = rec["params"]
    em = out["em"]
    lines += ["", f"HNSW M={p['m']}, ef_construction={p['ef_construction']}, "
              f"ef = max({p['ef_search_min']}, ef_factor·k); {rec['vectors']['start']} starts, "
              f"{rec['vectors']['end']} ends. Exact numpy top-1024 over both: "
              f"{rec['exact_numpy_ms']:.1f} ms per query.", "",
              f"EM at k={em['k']} on {em['n']} cloze queries: ANN {em['em_ann']:.1f}, exact "
              f"{em['em_exact']:.1f} (Δ {em['em_delta']:+.1f}); top-1 agreement "
              f"{em['top1_agreement']:.1f}%."]
    sweep = rec.get("build_sweep")
    if sweep:
        lines += ["", f"Build settings on a sample of {sweep[0]['n']} start vectors (index build "
                  "time per vector against recall; the ingest target needs the build of both "
                  "indexes to cost ≤ ~10% of encoding):", "",
                  "| M | ef_construction | build µs/vector | ef | recall@1024 | min | search ms |",
                  "|---|---|---|---|---|---|---|"]
        for r in sweep:
            lines.append(f"| {r['m']} | {r['ef_construction']} | {r['build_us_per_vector']:.0f} | "
                         f"{r['ef']} | {r['recall']:.4f} | {r['recall_min']:.3f} | "
                         f"{r['search_ms_p50']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=SMALL_DATA)
    ap.add_argument("--db", type=Path, default=None)
    ap.add_argument("--work", type=Path, default=WORK)
    ap.add_argument("--queries", type=int, default=100)
    ap.add_argument("--em-queries", type=int, default=200)
    args = ap.parse_args(argv)
    require_data(args.data, "cloze.jsonl", *(() if args.db else ("corpus.jsonl.gz",)), error=ap.error)
    from .__main__ import ensure_main_db

    main_db = args.db or ensure_main_db(args.data, args.work)
    out = run(main_db, args.data, queries=args.queries, em_queries=args.em_queries,
              log=lambda m: print(m, file=sys.stderr))
    return publish(f"ann-{args.data.name}", out, render)


if __name__ == "__main__":
    raise SystemExit(main())
