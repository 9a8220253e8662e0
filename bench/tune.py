"""Cloze EM over a grid of query options (tau, k, blocks, alpha, bm25_prior) on one database.

The defaults (tau 1.0, k 1024, 3 BM25 blocks, alpha 0, bm25_prior 0.5) mostly follow NPM;
this shows what other settings give on a given database and encoder, e.g. after training
(the block prior's best weight depends on the scale of the encoder's similarities):

    python -m bench.tune --db demo.npmdb            # dev-small cloze, micro EM
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .common import SMALL_DATA, load_jsonl, machine, publish, require_data
from .quality import evaluate_cloze

GRID = (
    {"retrieval": "dense"}, {"retrieval": "dense", "k": 256}, {"retrieval": "dense", "k": 4096},
    {"retrieval": "dense", "tau": 0.5}, {"retrieval": "dense", "tau": 2.0},
    {"retrieval": "dense", "alpha": 0.5},
    {"retrieval": "bm25"}, {"retrieval": "bm25", "tau": 0.5}, {"retrieval": "bm25", "tau": 2.0},
    {"retrieval": "bm25", "blocks": 1}, {"retrieval": "bm25", "blocks": 5},
    {"retrieval": "bm25", "alpha": 0.5},
    {"retrieval": "bm25", "bm25_prior": 0.0}, {"retrieval": "bm25", "bm25_prior": 1.0},
)


def run(db, rows: list[dict], grid=GRID, log=print) -> list[dict]:
    out = []
    for opts in grid:
        opts = dict(opts)
        mode = opts.pop("retrieval")
        r = evaluate_cloze(db, rows, mode, **{k: v for k, v in opts.items() if k == "k"},
                           options={k: v for k, v in opts.items() if k != "k"})
        out.append({"retrieval": mode, **opts, "em_micro": r["em_micro"], "em_macro": r["em_macro"]})
        log(f"{mode} {opts}: EM {r['em_micro']:.1f}")
    return out


def render(res: dict) -> str:
    lines = [f"## Option grid — {res['db']} ({res['encoder']}, generation {res['generation']}; "
             f"{res['n']} cloze queries)", "", "| retrieval | options | EM micro | EM macro |",
             "|---|---|---|---|"]
    for r in res["rows"]:
        opts = ", ".join(f"{k}={v}" for k, v in r.items()
                         if k not in ("retrieval", "em_micro", "em_macro")) or "defaults"
        lines.append(f"| {r['retrieval']} | {opts} | {r['em_micro']:.1f} | {r['em_macro']:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    import npmdb

    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", type=Path, required=True)
    ap.add_argument("--data", type=Path, default=SMALL_DATA)
    ap.add_argument("--name", default=None, help="result name (bench/results/NAME.json)")
    args = ap.parse_args(argv)
    require_data(args.data, "cloze.jsonl", error=ap.error)
    rows = load_jsonl(args.data / "cloze.jsonl")
    with npmdb.open(args.db, readonly=True, progress=False) as db:
        with db.snapshot() as snap:
            gen = snap.generation
        res = {"db": str(args.db), "data": str(args.data), "n": len(rows), "machine": machine(),
               "encoder": db.encoder_for(gen).info.name, "generation": gen,
               "rows": run(db, rows, log=lambda m: print(m, file=sys.stderr))}
    return publish(args.name or f"tune-{args.data.name}", res, render)


if __name__ == "__main__":
    raise SystemExit(main())
