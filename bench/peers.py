"""What a user would build instead: the same token vectors in LanceDB, phrases in Python.

The main database's stored vectors (the same encoder, the same tokens) go into two real
LanceDB tables, ``starts`` and ``ends`` (valid starts / valid ends: position + float16
vector). A query is encoded with the same encoder; LanceDB's own vector search (dot
product; exact, no index by default, or IVF_PQ with ``--lance-index``) returns the top-k
starts and ends; a straightforward Python loop assembles phrases (forward from starts,
backward from ends, inside the block, up to ``max_len``, valid edges); the endpoints'
vectors are fetched back from the tables (``take``) to score every span exactly with
NPM's softmaxes; occurrences are grouped by their folded surface text. The token
metadata (flags, block bounds, offsets) and document texts are loaded into memory once,
as such a user would.

We report the p50/p99 of this pipeline and of ``npmdb.fill_mask`` (dense, k=1024) on the
same queries, the latency ratio, and how often the top-1 answers agree (with npmdb's
default ANN and with its exact mode).

    python -m bench.peers --data npmdb/data/dev-small [--db PATH] [--queries 100]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from .common import SMALL_DATA, WORK, load_jsonl, percentiles, publish, require_data


class LancePipeline:
    def __init__(self, main_db: Path, root: Path, *, index: str = "none", log=print) -> None:
        import lancedb
        import pyarrow as pa

        import npmdb
        from npmdb.boundaries import VALID_END, VALID_START

        self.src = npmdb.open(main_db, readonly=True, progress=False)
        self.encoder = self.src.encoder
        t0 = time.perf_counter()
        with self.src.snapshot() as snap:
            if len(snap.segments) != 1:
                raise RuntimeError("bench.peers expects a one-segment database")
            seg = snap.segments[0]
            cols = seg.columns(snap.txn)
            self.flags = cols.flags
            block_of = cols.block_of(np.arange(cols.n_tokens))
            self.block_start = cols.block_ptr[block_of].astype(np.int64)
            self.block_end = cols.block_ptr[block_of + 1].astype(np.int64)
            self.offsets = cols.offsets
            doc_of = cols.block_doc[block_of]
            self.doc_of = doc_of
            self.texts = {int(d): seg.doc(snap.txn, int(d)).text for d in np.unique(doc_of)}
            fresh = True  # rebuilt every run: the main database may have changed
            shutil.rmtree(root, ignore_errors=True)
            root.mkdir(parents=True, exist_ok=True)
            self.db = lancedb.connect(str(root))
            self.pos = {}
            for side, flag in (("start", VALID_START), ("end", VALID_END)):
                pos = np.flatnonzero(cols.flags & flag).astype(np.int64)
                self.pos[side] = pos
                name = side + "s"
                if fresh:
                    tbl = None
                    for a in range(0, len(pos), 65536):
                        p = pos[a:a + 65536]
                        v = seg.vectors(snap.txn, snap.generation, p).astype(np.float16)
                        batch = pa.table({"pos": p, "vector": pa.FixedSizeListArray.from_arrays(
                            pa.array(v.ravel()), v.shape[1])})
                        if tbl is None:
                            tbl = self.db.create_table(name, batch, mode="overwrite")
                        else:
                            tbl.add(batch)
                    if index != "none" and tbl is not None:
                        tbl.create_index(metric="dot", index_type=index.upper(),
                                         num_sub_vectors=max(seg.dim // 8, 1))
        self.tables = {side: self.db.open_table(side + "s") for side in ("start", "end")}
        self.datasets = {side: t.to_lance() for side, t in self.tables.items()}
        self.index = index
        self.setup_s = time.perf_counter() - t0
        self.scale = 1.0 / np.sqrt(self.encoder.hidden_size)
        log(f"  LanceDB tables ready in {self.setup_s:.1f} s "
            f"({len(self.pos['start'])} starts, {len(self.pos['end'])} ends, index {index})")

    def close(self) -> None:
        self.src.close()

    def _search(self, side: str, q: np.ndarray, k: int) -> np.ndarray:
        qb = self.tables[side].search(q.astype(np.float32)).metric("dot").limit(k)
        if self.index != "none":
            qb = qb.nprobes(64).refine_factor(4)
        return qb.select(["pos", "_distance"]).to_arrow().column("pos").to_numpy()

    def _vectors(self, side: str, positions: list[int]) -> np.ndarray:
        rows = np.searchsorted(self.pos[side], np.asarray(positions, np.int64))
        tbl = self.datasets[side].take(rows.tolist(), columns=["vector"])
        flat = tbl.column("vector").combine_chunks().flatten().to_numpy(zero_copy_only=False)
        return flat.reshape(len(positions), -1).astype(np.float32)

    def fill_mask(self, text: str, *, k: int = 1024, max_len: int = 10, top: int = 5,
                  tau: float = 1.0) -> list[tuple[str, float]]:
        from npmdb.boundaries import VALID_END, VALID_START, fold

        qv = self.encoder.encode_query(text, "phrase")
        starts = self._search("start", qv.start, k)
        ends = self._search("end", qv.end, k)
        flags, bs, be = self.flags, self.block_start, self.block_end
        spans = set()
        for s in starts.tolist():
            for e in range(s, min(s + max_len, int(be[s]))):
                if flags[e] & VALID_END:
                    spans.add((s, e))
        for e in ends.tolist():
            for s in range(e, max(e - max_len, int(bs[e]) - 1), -1):
                if flags[s] & VALID_START:
                    spans.add((s, e))
        if not spans:
            return []
        spans_l = sorted(spans)
        S = sorted({s for s, _ in spans_l})
        E = sorted({e for _, e in spans_l})
        sim_s = self._vectors("start", S) @ qv.start * self.scale
        sim_e = self._vectors("end", E) @ qv.end * self.scale

        def softmax(x):
            z = np.exp((x - x.max()) / tau)
            return z / z.sum()

        ps = dict(zip(S, softmax(sim_s).tolist()))
        pe = dict(zip(E, softmax(sim_e).tolist()))
        groups: dict[str, list] = {}
        for s, e in spans_l:
            d = int(self.doc_of[s])
            surface = self.texts[d][int(self.offsets[s, 0]):int(self.offsets[e, 1])]
            g = groups.setdefault(fold(surface), [0.0, surface])
            g[0] += ps[s] + pe[e]
        best = sorted(groups.values(), key=lambda g: -g[0])[:top]
        return [(t, sc) for sc, t in best]


def _norm(t):
    return None if t is None else " ".join(t.lower().split())


def run(main_db: Path, data: Path, work: Path, *, queries: int = 100, k: int = 1024,
        index: str = "none", log=print) -> dict:
    import npmdb

    rows = load_jsonl(data / "cloze.jsonl")[:queries]
    texts = [r["query"] for r in rows]
    log(f"LanceDB comparison: {len(texts)} queries, k={k} …")
    lance = LancePipeline(main_db, work / f"{data.name}-lance", index=index, log=log)
    out: dict = {"k": k, "queries": len(texts), "lance_index": index,
                 "lance_setup_s": lance.setup_s}
    try:
        lance.fill_mask(texts[0], k=k)
        lance_ms, lance_top = [], []
        for q in texts:
            t0 = time.perf_counter()
            ans = lance.fill_mask(q, k=k, top=1)
            lance_ms.append((time.perf_counter() - t0) * 1000.0)
            lance_top.append(_norm(ans[0][0]) if ans else None)
    finally:
        lance.close()
    with npmdb.open(main_db, readonly=True, progress=False) as db:
        db.fill_mask(texts[0], k=k, retrieval="dense")
        res = {}
        for exact in (False, True):
            ms, tops = [], []
            for q in texts:
                t0 = time.perf_counter()
                r = db.fill_mask(q, k=k, top=1, exact=exact, evidence=1, retrieval="dense")
                ms.append((time.perf_counter() - t0) * 1000.0)
                tops.append(_norm(r.top.text) if r.top else None)
            res[exact] = (ms, tops)
    from .codecs import agreement

    out["lance"] = percentiles(lance_ms)
    out["npmdb"] = percentiles(res[False][0])
    out["npmdb_exact"] = percentiles(res[True][0])
    out["ratio_p50"] = out["lance"]["p50"] / out["npmdb"]["p50"]
    out["ratio_p50_exact"] = out["lance"]["p50"] / out["npmdb_exact"]["p50"]
    out["agree_ann"] = agreement(lance_top, res[False][1])
    out["agree_exact"] = agreement(lance_top, res[True][1])
    log(f"  LanceDB p50 {out['lance']['p50']:.0f} ms, npmdb p50 {out['npmdb']['p50']:.1f} ms "
        f"(×{out['ratio_p50']:.1f}); top-1 agreement {out['agree_ann']:.0f}% (ANN), "
        f"{out['agree_exact']:.0f}% (exact)")
    return out


def render(out: dict) -> str:
    return "\n".join([
        "| pipeline | p50 ms | p99 ms | top-1 = LanceDB's |", "|---|---|---|---|",
        f"| LanceDB tables + Python phrases (index: {out['lance_index']}) | "
        f"{out['lance']['p50']:.1f} | {out['lance']['p99']:.1f} | – |",
        f"| npmdb fill_mask dense (HNSW) | {out['npmdb']['p50']:.1f} | {out['npmdb']['p99']:.1f} "
        f"| {out['agree_ann']:.1f}% |",
        f"| npmdb fill_mask dense exact=True | {out['npmdb_exact']['p50']:.1f} | "
        f"{out['npmdb_exact']['p99']:.1f} | {out['agree_exact']:.1f}% |", "",
        f"k={out['k']}, {out['queries']} cloze queries, query encoding included in every "
        f"pipeline. npmdb is ×{out['ratio_p50']:.1f} faster at p50 (×{out['ratio_p50_exact']:.1f} "
        "in exact mode)."]) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=SMALL_DATA)
    ap.add_argument("--db", type=Path, default=None)
    ap.add_argument("--work", type=Path, default=WORK)
    ap.add_argument("--queries", type=int, default=100)
    ap.add_argument("--lance-index", default="none", choices=("none", "ivf_pq"))
    args = ap.parse_args(argv)
    require_data(args.data, "cloze.jsonl", *(() if args.db else ("corpus.jsonl.gz",)), error=ap.error)
    from .__main__ import ensure_main_db

    main_db = args.db or ensure_main_db(args.data, args.work)
    out = run(main_db, args.data, args.work, queries=args.queries, index=args.lance_index,
              log=lambda m: print(m, file=sys.stderr))
    return publish(f"peers-{args.data.name}", out, render)


if __name__ == "__main__":
    os.environ.setdefault("RUST_LOG", "error")
    raise SystemExit(main())
