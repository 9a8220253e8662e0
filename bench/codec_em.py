"""EM cost of the compact codecs with a *trained* encoder.

The suite's codec step measures the codecs with its main database's encoder (the shipped
default, unless ``--encoder``) and decides the codec target from that run alone. This builds
int8 and PQ copies of a given trained database's corpus with that database's current
encoder (a generation ``npmdb train`` wrote) and compares cloze EM (bm25 and dense) with the
float16 original; the suite's report shows the last such run as its own run, with its
encoder.

    python -m bench.codec_em --db demo.npmdb     # after `npmdb train demo.npmdb --preset demo`
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

from .common import SMALL_DATA, WORK, load_jsonl, machine, publish, require_data
from .quality import evaluate_cloze

CODECS = ("int8", "pq")
MODES = ("bm25", "dense")


def run(db_path: Path, data: Path, work: Path, codecs=CODECS, log=print) -> dict:
    import npmdb

    rows = load_jsonl(data / "cloze.jsonl")
    out: dict = {"db": str(db_path), "data": str(data), "machine": machine(), "codecs": {}}
    with npmdb.open(db_path, readonly=True, progress=False) as db:
        with db.snapshot() as snap:
            gen = snap.generation
        enc = db.encoder_for(gen)
        out["encoder"], out["generation"] = enc.info.name, gen
        out["fingerprint"] = enc.info.fingerprint  # what the suite's report compares
        ref = {m: evaluate_cloze(db, rows, m)["em_micro"] for m in MODES}
        out["codecs"]["float16"] = {"bytes_per_vector": 2 * enc.hidden_size, "em": ref}
        log(f"float16: {ref}")
        for codec in codecs:
            path = work / f"{db_path.stem}-{codec}.npmdb"
            shutil.rmtree(path, ignore_errors=True)
            t0 = time.perf_counter()
            with npmdb.open(path, encoder=enc.path, codec=codec, progress=False) as cdb:
                cdb.add(data / "corpus.jsonl.gz")
                built = time.perf_counter() - t0
                em = {m: evaluate_cloze(cdb, rows, m)["em_micro"] for m in MODES}
                from npmdb.storage.codec import load_codec
                bpv = load_codec(cdb.env, cdb.config["codec"]).bytes_per_vector(enc.hidden_size)
            out["codecs"][codec] = {"bytes_per_vector": bpv, "em": em, "build_s": built,
                                    "em_delta": {m: em[m] - ref[m] for m in MODES}}
            log(f"{codec}: {em} (Δ {out['codecs'][codec]['em_delta']})")
            shutil.rmtree(path, ignore_errors=True)
    return out


def render(out: dict) -> str:
    lines = [f"## Codec EM with a trained encoder ({out['encoder']}, generation "
             f"{out['generation']}; {out['data']} cloze, EM micro)", "",
             "| codec | bytes per token | EM bm25 | EM dense | Δ bm25 | Δ dense |",
             "|---|---|---|---|---|---|"]
    for name, r in out["codecs"].items():
        d = r.get("em_delta", {"bm25": 0.0, "dense": 0.0})
        lines.append(f"| {name} | {r['bytes_per_vector'] or '–'} | {r['em']['bm25']:.1f} | "
                     f"{r['em']['dense']:.1f} | {d['bm25']:+.1f} | {d['dense']:+.1f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", type=Path, required=True, help="a trained database")
    ap.add_argument("--data", type=Path, default=SMALL_DATA,
                    help="the data it was built from (corpus.jsonl.gz, cloze.jsonl)")
    ap.add_argument("--work", type=Path, default=WORK)
    args = ap.parse_args(argv)
    require_data(args.data, "corpus.jsonl.gz", "cloze.jsonl", error=ap.error)
    args.work.mkdir(parents=True, exist_ok=True)
    out = run(args.db, args.data, args.work, log=lambda m: print(m, file=sys.stderr))
    return publish(f"codec-em-{args.data.name}", out, render)


if __name__ == "__main__":
    raise SystemExit(main())
