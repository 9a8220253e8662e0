"""How many IVF lists a search must probe as the corpus grows (``storage.ivf.probe_count``).

    python -m bench.probes build/replay-1m-int4 build/replay-10m-int4 \\
        --settings 48x2,24x2,16x2,48x3,16x3,8x3 [--queries 20] [-k 1024]

For each database and each ``NPROBExREFINE`` setting (a fixed number of lists: the
minimum is set to the maximum, so the adaptive rule is off), the dense start and end
candidates of ``DenseTopK`` (PQ search, then the best ``refine``·k re-scored exactly)
against an exact scan of every stored vector (``ExactTopK``): recall@k, and the median
milliseconds of ``DenseTopK`` per side. ``default`` in the list measures the shipped
``IvfParams()`` (lists chosen by :func:`probe_count`). The exact top-k is computed once per
query and side (at 10M tokens ~6 s each on 2 cores).

Results: ``bench/results/ivf-probes.json`` / ``.md``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

from .common import DEV_DATA, load_jsonl, machine, publish, require_data


def _params(setting: str):
    from npmdb.storage.dense import DenseParams
    from npmdb.storage.ivf import IvfParams

    if setting == "default":
        return DenseParams()
    nprobe, refine = (int(v) for v in setting.split("x"))
    return DenseParams(ivf=IvfParams(nprobe=nprobe, min_nprobe=nprobe, refine=refine))


def measure(db_path: Path, settings: list[str], rows: list[dict], k: int, log=print) -> dict:
    import npmdb
    from npmdb.query.operators import DenseTopK, EncodeQuery, ExactTopK
    from npmdb.query.physical import ExecState

    exact: dict[tuple[int, str], set] = {}
    out: dict = {"db": str(db_path), "settings": []}
    for setting in settings:
        db = npmdb.open(db_path, readonly=True, progress=False, dense_params=_params(setting))
        ms, recalls, probes = [], [], set()
        try:
            with db.snapshot() as snap:
                out["tokens"] = int(db.stats()["tokens"])
                out["entries"] = snap.ivf_entries()
                for i, r in enumerate(rows):
                    st = ExecState(snap, r["query"], encode=None)
                    enc = EncodeQuery("phrase")
                    st.outputs[id(enc)] = enc.run(st)
                    for side in ("start", "end"):
                        op = DenseTopK(side, k, children=(enc,))
                        op.prepare(st)
                        t0 = time.perf_counter()
                        got = op.run(st).by_side[side]
                        ms.append((time.perf_counter() - t0) * 1000.0)
                        for si in range(len(snap.segments)):
                            idx = snap.dense(si, side)
                            if getattr(idx, "approximate", False) and idx.kind == "ivf":
                                probes.add(idx.probes(k * idx.refine, snap.ivf_entries()))
                        if (i, side) not in exact:
                            want = ExactTopK(side, k, children=(enc,)).run(st).by_side[side]
                            exact[i, side] = {(si, int(p)) for si, ps in want.items() for p in ps}
                        found = {(si, int(p)) for si, ps in got.items() for p in ps}
                        recalls.append(len(found & exact[i, side]) / max(len(exact[i, side]), 1))
        finally:
            db.close()
        row = {"setting": setting, "probes": sorted(probes), "recall": float(np.mean(recalls)),
               "recall_min": float(np.min(recalls)), "ms_p50": statistics.median(ms)}
        out["settings"].append(row)
        log(f"{db_path.name} {setting}: probes {row['probes']} recall {row['recall']:.3f} "
            f"DenseTopK {row['ms_p50']:.1f} ms a side")
    return out


def render(out: dict) -> str:
    lines = [f"## IVF probes against corpus size — k = {out['k']}, {out['queries']} cloze "
             "queries, start and end sides", "",
             "| database | tokens | IVF entries | setting (nprobe x refine) | lists probed | "
             "recall@k vs exact | min | DenseTopK ms a side (p50) |",
             "|---|---:|---:|---|---|---:|---:|---:|"]
    for d in out["dbs"]:
        for s in d["settings"]:
            lines.append(f"| {Path(d['db']).name} | {d['tokens']:,} | {d['entries']:,} | "
                         f"{s['setting']} | {', '.join(map(str, s['probes']))} | "
                         f"{s['recall']:.3f} | {s['recall_min']:.3f} | {s['ms_p50']:.1f} |")
    lines += ["", "`default` is `IvfParams()`: lists chosen by `storage.ivf.probe_count` "
              "(about `scan` entries per candidate wanted, between `min_nprobe` and "
              "`nprobe`). Timings are one pass on a shared 2-core machine with the exact "
              "scans in the same process: read them as relative."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.probes", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dbs", type=Path, nargs="+")
    ap.add_argument("--data", type=Path, default=DEV_DATA,
                    help="the data whose cloze.jsonl queries are asked (default: the dev corpus "
                         "beside the checkout, ../shared/data/dev, as the committed results)")
    ap.add_argument("--settings", default="default,48x2,24x2,16x2,48x3,16x3,8x3")
    ap.add_argument("--queries", type=int, default=20)
    ap.add_argument("-k", type=int, default=1024)
    ap.add_argument("--name", default="ivf-probes")
    args = ap.parse_args(argv)
    require_data(args.data, error=ap.error)
    rows = load_jsonl(args.data / "cloze.jsonl")[: args.queries]
    settings = args.settings.split(",")
    out = {"machine": machine(), "k": args.k, "queries": len(rows),
           "dbs": [measure(p, settings, rows, args.k) for p in args.dbs]}
    return publish(args.name, out, render)


if __name__ == "__main__":
    raise SystemExit(main())
