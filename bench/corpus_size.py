"""The scale step: what a database costs as its corpus grows, at the same settings.

    python -m bench.corpus_size build/replay-1m-int4 build/replay-3m-int4 \\
        build/replay-10m-int4 [--rounds 2] [--queries 100] [--name int4]

Databases merged into one segment (``python -m bench.replay --merge``) can join the list:
the plot draws them as a second line.

Each database (the real 1M-token dev database written at the settings, then larger ones
made by ``bench.replay``) is measured in a fresh process by ``bench.replay.measure``:
bytes per token on disk, open time (imports excluded), dense ``fill_mask`` p50/p99 at
k=1024 on the same cloze queries, the median query-encoder forward pass in that process
(``EncodeQuery``), and resident memory after the queries (VmRSS; RssAnon, the memory the
process owns; RssFile, pages of the LMDB file and IVF lists it mapped, which the kernel
can drop). The databases are measured in turn for ``--rounds`` rounds and the median of
the rounds is kept, so a slow moment of the shared machine does not land on one size.
Build times come from each database's ``bench.replay`` record.

Then, where a cgroup memory controller is writable (root on Linux), each database is
measured once more under a memory limit of ``--cap-ratio`` (default 1.3) times the first
database's VmRSS (``bench.memcap``): VmRSS counts file pages the kernel leaves mapped while
RAM is free, so the capped p50 is what says whether a larger database still serves in the
memory of the smaller one.

Results: ``bench/results/corpus-size-<name>.json`` / ``.md`` and a plot of each measure
against corpus size (``corpus-size-<name>.png``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from npmdb.arguments import parse_assignments

from .common import DEV_DATA, RESULTS, publish, require_data
from .memcap import MemoryCap
from .report import _save
from .replay import measure


def _median_run(runs: list[dict]) -> dict:
    """The round whose p50 is the median (its other figures belong to the same run)."""
    order = sorted(runs, key=lambda r: r["latency"]["p50"])
    return order[len(order) // 2]


def run(paths: list[Path], data: Path, k: int, queries: int, rounds: int,
        cap_ratio: float = 0.0, log=print, ivf: dict | None = None) -> dict:
    runs: dict[str, list[dict]] = {str(p): [] for p in paths}
    for r in range(rounds):
        for p in paths:
            got = measure(p, data, k, queries, ivf=ivf)
            runs[str(p)].append(got)
            log(f"round {r + 1}/{rounds} {p.name}: {got['tokens']:,} tokens, p50 "
                f"{got['latency']['p50']:.1f} ms, anon {got['rss']['RssAnon']:.0f} MB")
    rows = []
    for p in paths:
        m = _median_run(runs[str(p)])
        rec = RESULTS / f"replay-{p.name}.json"
        build = json.loads(rec.read_text()).get("build", {}) if rec.exists() else {}
        rows.append({"db": p.name, "tokens": m["tokens"], "segments": m["segments"],
                     "index": m["index"], "bytes_per_token": m["bytes_per_token"],
                     "open_ms": m["open_s"] * 1e3, "first_s": m["first_s"],
                     "p50": m["latency"]["p50"], "p99": m["latency"]["p99"],
                     "p50_rounds": [x["latency"]["p50"] for x in runs[str(p)]],
                     "encode_ms": m["stages"].get("EncodeQuery", float("nan")),
                     "stages": m["stages"], "rss_mb": m["rss"]["VmRSS"],
                     "anon_mb": m["rss"]["RssAnon"], "file_mb": m["rss"]["RssFile"],
                     "build_s": build.get("build_s"), "build": build})
    out = {"k": k, "queries": queries, "rounds": rounds, "rows": rows, "ivf": ivf or {}}
    why = MemoryCap.available() if cap_ratio > 0 else "not asked for"
    if why:
        log(f"no memory-capped runs: {why}")
        return out
    out["cap_mb"] = cap_ratio * rows[0]["rss_mb"]
    out["cap_ratio"] = cap_ratio
    for p, row in zip(paths, rows):
        got = measure(p, data, k, queries, cap_mb=out["cap_mb"])
        row["capped"] = {"p50": got["latency"]["p50"], "p99": got["latency"]["p99"],
                         "pass_p50": got["pass_p50"], "rss_mb": got["rss"]["VmRSS"],
                         "anon_mb": got["rss"]["RssAnon"], "file_mb": got["rss"]["RssFile"],
                         "peak_mb": got["peak_mb"]}
        row["p50_capped"], row["rss_capped_mb"] = got["latency"]["p50"], got["rss"]["VmRSS"]
        log(f"capped at {out['cap_mb']:.0f} MB {p.name}: p50 {got['latency']['p50']:.1f} ms "
            f"(first pass {got['pass_p50'][0]:.1f}), VmRSS {got['rss']['VmRSS']:.0f} MB")
    return out


def render(out: dict) -> str:
    rows = out["rows"]
    base = rows[0]
    lines = [f"## Corpus size against cost ({out.get('name', '')})", "",
             "| database | tokens | segments | B/token | open ms | p50 ms | p99 ms | "
             "p50 / encoder forward | anon MB | RSS MB (file) | build s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        b = r["build_s"]
        lines.append(
            f"| {r['db']} | {r['tokens']:,} | {r['segments']} | {r['bytes_per_token']:.0f} | "
            f"{r['open_ms']:.1f} | {r['p50']:.1f} | {r['p99']:.1f} | "
            f"{r['p50'] / r['encode_ms']:.1f}× | {r['anon_mb']:.0f} | "
            f"{r['rss_mb']:.0f} ({r['file_mb']:.0f}) | {'–' if b is None else f'{b:.0f}'} |")
    lines += ["", f"Against {base['db']} ({base['tokens']:,} tokens):", ""]
    for r in rows[1:]:
        x = r["tokens"] / base["tokens"]
        lines.append(f"- {r['db']} ({x:.1f}× the tokens): p50 ×{r['p50'] / base['p50']:.2f}, "
                     f"anon memory ×{r['anon_mb'] / base['anon_mb']:.2f}, VmRSS "
                     f"×{r['rss_mb'] / base['rss_mb']:.2f}, bytes per token "
                     f"×{r['bytes_per_token'] / base['bytes_per_token']:.2f}")
    stages = sorted(base["stages"], key=lambda s: -base["stages"][s])[:6]
    lines += ["", "Median ms per operator: " + "; ".join(
        f"{r['db']}: " + ", ".join(f"{s} {r['stages'].get(s, 0):.1f}" for s in stages)
        for r in rows)]
    lines += ["", f"k={out['k']}, {out['queries']} cloze queries per database and round, "
              f"{out['rounds']} rounds in turn (median round kept; p50 of each round: " +
              "; ".join(f"{r['db']} " + "/".join(f"{x:.0f}" for x in r["p50_rounds"])
                        for r in rows) + "). Open excludes imports. The encoder forward is "
              "the median EncodeQuery of the same process." + (
                  " Searched with IvfParams(" + ", ".join(
                      f"{n}={v}" for n, v in out["ivf"].items()) + ")." if out.get("ivf")
                  else ""), ""]
    if "cap_mb" in out:
        lines += _render_capped(out)
    if out.get("plot"):
        lines += [f"![cost against corpus size]({out['plot']})", ""]
    return "\n".join(lines)


def _render_capped(out: dict) -> list[str]:
    rows = out["rows"]
    base = rows[0]
    lines = [f"### Under a memory limit: {out['cap_mb']:.0f} MB, {out['cap_ratio']:g}× the "
             f"VmRSS of {base['db']}", "",
             "| database | p50 ms (2nd pass) | p50 ms (1st pass) | p99 ms | vs uncapped p50 | "
             "VmRSS MB (file) | VmRSS vs uncapped 1M | peak charged MB |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        c = r["capped"]
        peak = "–" if c["peak_mb"] is None else f"{c['peak_mb']:.0f}"
        lines.append(f"| {r['db']} | {c['p50']:.1f} | {c['pass_p50'][0]:.1f} | {c['p99']:.1f} | "
                     f"×{c['p50'] / r['p50']:.2f} | {c['rss_mb']:.0f} ({c['file_mb']:.0f}) | "
                     f"×{c['rss_mb'] / base['rss_mb']:.2f} | {peak} |")
    lines += ["", "Each database in a fresh process inside a memory cgroup of that limit "
              "(page cache included), its files evicted from the page cache first, the same "
              "queries run twice (the first pass reads the working set from disk). A p50 "
              "close to the uncapped one means the database serves within the limit; the "
              "uncapped VmRSS above is the file pages the kernel left mapped because RAM was "
              "free (`bench/memcap.py`).", ""]
    return lines


def plot(out: dict, path: Path) -> str | None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - the bench extra installs it
        return None
    rows = out["rows"]
    # one line per layout: the databases as written (a segment per add) and, where the
    # run has them, the same merged into one segment by optimize() (single-segment rows
    # belong to both)
    layouts = [("", [r for r in rows if r["segments"] > 1 or r is rows[0]])]
    merged = [r for r in rows if r["segments"] == 1]
    if len(merged) > 1 and len(merged) < len(rows):
        layouts = [(" (as written)", layouts[0][1]), (" (optimized)", merged)]
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.6))
    panels = [("bytes per token on disk", [("B/token", "bytes_per_token")]),
              ("memory (MB)", [("anon", "anon_mb"), ("VmRSS", "rss_mb"),
                               ("VmRSS under the cap", "rss_capped_mb")]),
              ("dense fill_mask, k=1024 (ms)", [("p50", "p50"), ("p99", "p99"),
                                                ("p50 under the cap", "p50_capped")]),
              ("open (ms) and build (s)", [("open ms", "open_ms"), ("build s", "build_s")])]
    for ax, (title, series) in zip(axes, panels):
        for label, key in series:
            for (suffix, part), style in zip(layouts, ("-", "--")):
                pts = [(r["tokens"] / 1e6, r[key]) for r in part if r.get(key) is not None]
                if pts:
                    ax.plot(*zip(*pts), style, marker="o", label=label + suffix)
        ax.set_xscale("log")
        ax.set_ylim(bottom=0)
        ax.set_xlabel("corpus tokens (millions)")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    return _save(fig, path)  # the path from the repository root, as BENCHMARKS.md links it


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.corpus_size",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("dbs", type=Path, nargs="+", help="databases, smallest first")
    ap.add_argument("--data", type=Path, default=DEV_DATA,
                    help="the data whose cloze.jsonl queries are asked (default: the dev corpus "
                         "beside the checkout, ../shared/data/dev, as the committed results)")
    ap.add_argument("--queries", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("-k", type=int, default=1024)
    ap.add_argument("--name", default="default")
    ap.add_argument("--cap-ratio", type=float, default=1.3,
                    help="also measure each database under a memory limit of this multiple "
                         "of the first one's VmRSS (needs a writable cgroup; 0: skip)")
    ap.add_argument("--ivf", action="append", default=[], metavar="NAME=VALUE",
                    help="an IvfParams field every database is searched with (repeatable), "
                         "e.g. refine=12")
    a = ap.parse_args(argv)
    require_data(a.data, error=ap.error)
    try:
        ivf = parse_assignments(a.ivf, "--ivf")
    except ValueError as exc:
        ap.error(str(exc))
    out = run(a.dbs, a.data, a.k, a.queries, a.rounds, a.cap_ratio,
              log=lambda m: print(m, file=sys.stderr, flush=True), ivf=ivf)
    out["name"] = a.name
    out["plot"] = plot(out, RESULTS / f"corpus-size-{a.name}.png")
    return publish(f"corpus-size-{a.name}", out, render)


if __name__ == "__main__":
    raise SystemExit(main())
