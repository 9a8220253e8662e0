"""Answers lost to compression: cloze EM of compact databases against float16 + exact.

    python -m bench.compact_em --ref build/dev.npmdb \\
        --db pq96+ivf=build/replay-1m-pq --db int4+ivf=build/replay-1m-int4 \\
        [--data ../shared/data/dev] [--queries 200]

``--ref`` is the real database (float16 vectors); each ``--db`` holds the same documents
with the same encoder's vectors in another codec and index (``bench.replay`` with one copy
writes exactly that: copy 0 carries no noise). Reported per database: dense and bm25 EM
(micro) and the change against the reference's exact scan (dense) and its bm25, with
bytes per token. Writes ``bench/results/compact-em-<data>.{json,md}``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .common import DEV_DATA, load_jsonl, publish, require_data
from .quality import evaluate_cloze


def run(ref: Path, dbs: dict[str, Path], data: Path, n: int) -> dict:
    import npmdb

    rows = load_jsonl(data / "cloze.jsonl")[:n]
    out: dict[str, dict] = {}
    for name, path, exact in [("float16 + exact scan (reference)", ref, True),
                              ("float16 + hnsw", ref, False)] + \
            [(k, v, False) for k, v in dbs.items()]:
        with npmdb.open(path, readonly=True, progress=False) as db:
            st = db.stats()
            out[name] = {
                "dense": evaluate_cloze(db, rows, "dense",
                                        options={"exact": True} if exact else {})["em_micro"],
                "bm25": evaluate_cloze(db, rows, "bm25")["em_micro"],
                "codec": st["config"]["codec"], "index": st["index"],
                "bytes_per_token": st["bytes_on_disk"] / max(st["tokens"], 1)}
    return {"data": str(data), "queries": len(rows), "dbs": out}


def render(out: dict) -> str:
    ref = out["dbs"]["float16 + exact scan (reference)"]
    lines = [f"## Answers lost to compression — {Path(out['data']).name}, {out['queries']} cloze "
             "queries", "", "| database | codec | index | B/token | EM dense | Δ dense | EM bm25 "
             "| Δ bm25 |", "|---|---|---|---|---|---|---|---|"]
    for name, r in out["dbs"].items():
        lines.append(f"| {name} | {r['codec']} | {', '.join(r['index'])} | "
                     f"{r['bytes_per_token']:.0f} | {r['dense']:.1f} | "
                     f"{r['dense'] - ref['dense']:+.1f} | {r['bm25']:.1f} | "
                     f"{r['bm25'] - ref['bm25']:+.1f} |")
    lines += ["", "B/token: every file of the database as it stands (an LMDB file never "
              "shrinks: a database converted in place reads larger than a fresh one).", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.compact_em",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--ref", type=Path, required=True)
    ap.add_argument("--db", action="append", default=[], metavar="NAME=PATH")
    ap.add_argument("--data", type=Path, default=DEV_DATA,
                    help="the data whose cloze.jsonl queries are asked (default: the dev corpus "
                         "beside the checkout, ../shared/data/dev, as the committed results)")
    ap.add_argument("--queries", type=int, default=200)
    a = ap.parse_args(argv)
    require_data(a.data, error=ap.error)
    dbs = {k: Path(v) for k, v in (x.split("=", 1) for x in a.db)}
    return publish(f"compact-em-{a.data.name}", run(a.ref, dbs, a.data, a.queries), render)


if __name__ == "__main__":
    raise SystemExit(main())
