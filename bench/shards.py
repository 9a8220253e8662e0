"""Sharded search: query p50 and throughput with 1, 2 and 4 shards.

    python -m bench.shards build/replay-10m-int4 [--shards 1 2 4] [--queries 40]
        [--clients 4] [--engine ray] [--data ../shared/data/dev]

For each shard count the database is opened read-only with ``engine=ray, shards=N`` (the
Ray actors on a local cluster of this machine's cores) and, as the baseline, in one process
without shards. Each setting answers the same dense cloze queries (k=1024, top 5, evidence
1): one at a time (p50, p99) and from ``--clients`` threads at once (queries per second).
The per-stage figures (EXPLAIN ANALYZE) say where the time goes: the shards' retrieval and
span work, and the coordinator's encoding, merge, grouping and evidence. The settings run
in turn for ``--rounds`` rounds; the median round is kept.

Results: ``bench/results/shards-<db>.json`` / ``.md``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .common import SMALL_DATA, load_jsonl, percentiles, publish, require_data


def _stages(res) -> dict[str, float]:
    out: dict[str, float] = {}
    for st in res.stats:
        out[st.operator] = out.get(st.operator, 0.0) + st.ms
    return out


def measure(path: Path, shards: int, engine: str, queries: list[str], clients: int, k: int
            ) -> dict:
    import npmdb

    kw = {} if shards == 0 else {"engine": engine, "shards": shards}
    t0 = time.perf_counter()
    with npmdb.open(path, readonly=True, progress=False, **kw) as db:
        open_s = time.perf_counter() - t0
        db.fill_mask(queries[0], k=k, retrieval="dense")  # warm: encoder, indexes, actors
        ms, stages = [], []
        for q in queries:
            t = time.perf_counter()
            res = db.fill_mask(q, k=k, top=5, evidence=1, retrieval="dense")
            ms.append((time.perf_counter() - t) * 1000.0)
            stages.append(_stages(res))
        t = time.perf_counter()
        with ThreadPoolExecutor(clients) as pool:
            list(pool.map(lambda q: db.fill_mask(q, k=k, top=5, evidence=1, retrieval="dense"), queries))
        qps = len(queries) / (time.perf_counter() - t)
    names = sorted({n for s in stages for n in s})
    return {"shards": shards, "engine": engine if shards else "one process",
            "open_s": open_s, "latency": percentiles(ms), "qps": qps,
            "stages": {n: statistics.median(s.get(n, 0.0) for s in stages) for n in names}}


def run(path: Path, data: Path, counts: list[int], engine: str, n: int, clients: int, k: int,
        rounds: int, log=print) -> dict:
    queries = [r["query"] for r in load_jsonl(data / "cloze.jsonl")[:n]]
    settings = [0] + counts
    if engine == "ray":  # one local cluster for every setting: `open` times the actors only
        import logging

        import ray

        if not ray.is_initialized():
            ray.init(include_dashboard=False, logging_level=logging.WARNING)
    runs: dict[int, list[dict]] = {s: [] for s in settings}
    for r in range(rounds):
        for s in settings:
            got = measure(path, s, engine, queries, clients, k)
            runs[s].append(got)
            log(f"round {r + 1}/{rounds}, shards={s}: p50 {got['latency']['p50']:.1f} ms, "
                f"{got['qps']:.2f} q/s")
    rows = []
    for s in settings:
        order = sorted(runs[s], key=lambda x: x["latency"]["p50"])
        rows.append({**order[len(order) // 2],
                     "p50_rounds": [x["latency"]["p50"] for x in runs[s]]})
    import npmdb

    with npmdb.open(path, readonly=True, progress=False) as db:
        st = db.stats()
    return {"db": path.name, "tokens": st["tokens"], "segments": st["segments"],
            "index": st.get("index"), "k": k, "queries": len(queries), "clients": clients,
            "rounds": rounds, "rows": rows}


def render(out: dict) -> str:
    base = out["rows"][0]
    lines = [f"## Sharded search — {out['db']} ({out['tokens']:,} tokens, {out['segments']} "
             f"segments, index {out['index']})", "",
             f"Dense `fill_mask`, k={out['k']}, top 5, evidence 1, {out['queries']} cloze "
             f"queries one at a time (p50, p99) and from {out['clients']} client threads "
             f"(throughput); median of {out['rounds']} rounds taken in turn; "
             f"{out['machine']['cpus']} cores.", "",
             "| shards | engine | p50 ms | p99 ms | p50 vs one process | queries/s | "
             "q/s vs one process | open s | p50 of each round |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in out["rows"]:
        lines.append(
            f"| {r['shards'] or '–'} | {r['engine']} | {r['latency']['p50']:.1f} | "
            f"{r['latency']['p99']:.1f} | ×{r['latency']['p50'] / base['latency']['p50']:.2f} | "
            f"{r['qps']:.2f} | ×{r['qps'] / base['qps']:.2f} | {r['open_s']:.2f} | "
            f"{' / '.join(f'{x:.0f}' for x in r['p50_rounds'])} |")
    names = [n for n in ("EncodeQuery", "Exchange", "DenseTopK", "AssembleSpans", "ScoreSpans",
                         "Aggregate", "AttachEvidence") if any(n in r["stages"] for r in out["rows"])]
    lines += ["", "Median stage times (ms; on shards: the slowest shard's; `Exchange` is the "
              "whole distributed part, from the coordinator):", "",
              "| shards | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for r in out["rows"]:
        lines.append(f"| {r['shards'] or '–'} | " + " | ".join(
            f"{r['stages'].get(n, float('nan')):.1f}" for n in names) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.shards", description=__doc__.split("\n")[0])
    ap.add_argument("db", type=Path)
    ap.add_argument("--data", type=Path, default=SMALL_DATA)
    ap.add_argument("--shards", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--engine", default="ray", choices=("ray", "local"))
    ap.add_argument("--queries", type=int, default=40)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--k", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args(argv)
    require_data(args.data, "cloze.jsonl", error=ap.error)
    if not (args.db / "data.mdb").exists():
        print(f"no database at {args.db}: build one with python -m bench.replay", file=sys.stderr)
        return 2
    out = run(args.db, args.data, args.shards, args.engine, args.queries, args.clients, args.k,
              args.rounds, log=lambda m: print(m, file=sys.stderr))
    return publish(f"shards-{args.db.name}", out, render)


if __name__ == "__main__":
    sys.exit(main())
