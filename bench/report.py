"""BENCHMARKS.md and PNG plots from a suite run's JSON (``bench/results/bench-<data>.json``).

    python -m bench.report [bench/results/bench-dev.json] [--out PATH] [--plots DIR]

A full run's JSON in ``bench/results`` makes the root ``BENCHMARKS.md``; a quick or smoke
run's makes ``bench-<data>-quick.md`` / ``-smoke.md`` beside it, and a JSON elsewhere
``BENCHMARKS.md`` beside it (``--out`` chooses). Plots go beside the JSON (``--plots``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .common import RESULTS, ROOT
from .common import vs_limit as _vs

OUT_MD = ROOT / "BENCHMARKS.md"
_WARNED: set[str] = set()


def _warn_once(msg: str) -> None:
    if msg not in _WARNED:
        _WARNED.add(msg)
        print(msg, file=sys.stderr, flush=True)


def _tokens(n) -> str:
    """955268 → "955k tokens", 24.8e6 → "24.8M tokens"."""
    if not n:
        return ""
    n = int(n)
    if n >= 1_000_000:
        return f"{n / 1e6:.1f}M tokens"
    return f"{n / 1e3:.0f}k tokens" if n >= 1000 else f"{n} tokens"


def run_kind(res: dict, name: str = "") -> str | None:
    """"smoke", "quick" or None (a full run)."""
    if res.get("smoke") or name.endswith("-smoke"):
        return "smoke"
    if res.get("quick") or name.endswith("-quick"):
        return "quick"
    return None


def _lat(steps: dict, retrieval: str, mode: str, k) -> dict | None:
    for r in steps.get("latency", {}).get("latency", []):
        if r["retrieval"] == retrieval and r["mode"] == mode and (r["k"] == k or k is None):
            return r
    return None


def _stages(d: dict | None) -> str:
    if not d:
        return "–"
    return ", ".join(f"{k} {v:.1f}" for k, v in sorted(d.items(), key=lambda kv: -kv[1]))


def _ok(flag: bool | None) -> str:
    return "–" if flag is None else ("yes" if flag else "**no**")


def _codec_em(data: str | None = None, results_dir: Path = RESULTS) -> dict | None:
    """The last ``bench.codec_em`` run (its own run: its database, encoder and day), for
    the report's codec section only, never for a verdict: ``codec-em-<data>.json``, else
    the dev-small one, in ``results_dir`` then in ``bench/results``."""
    names = [f"codec-em-{Path(data).name}.json"] if data else []
    names.append("codec-em-dev-small.json")
    for d in dict.fromkeys([results_dir, RESULTS]):
        for n in names:
            if (d / n).exists():
                out = json.loads((d / n).read_text())
                out["_path"] = str(d / n)
                return out
    return None


def _run_encoder(res: dict) -> dict:
    return (res.get("steps", {}).get("main") or {}).get("encoder") or {}


def targets(res: dict) -> list[tuple[str, str, bool | None, str]]:
    """(target, measured, met, what bounds it) rows."""
    st = res["steps"]
    rows = []
    lat = st.get("latency", {})
    bd = lat.get("breakdown", {})
    d = _lat(st, "dense", "phrase", 1024)
    if d:
        rows.append(("dense fill_mask k=1024 p50 ≤ 25 ms", f"{_vs(d['p50'], 25)} ms",
                     d["p50"] <= 25, "median ms per operator: " + _stages(bd.get("dense"))))
        rows.append(("dense fill_mask k=1024 p99 ≤ 60 ms", f"{_vs(d['p99'], 60)} ms",
                     d["p99"] <= 60, "tail: see p99 per k below"))
        fwd = (bd.get("dense") or {}).get("EncodeQuery")
        if fwd:  # the same process: a machine's speed cancels out
            size = _tokens(lat.get("stats", {}).get("tokens"))
            rows.append((f"dense p50 (k=1024{', ' + size if size else ''}) ≤ 2× one "
                         "query-encoder forward",
                         f"×{_vs(d['p50'] / fwd, 2.0, 2)}", d["p50"] <= 2 * fwd,
                         f"p50 {d['p50']:.1f} ms; EncodeQuery (the forward, tokenizing "
                         f"included) {fwd:.1f} ms in the same process; the rest "
                         f"{d['p50'] - fwd:.1f} ms"))
    b = _lat(st, "bm25", "phrase", None)
    if b:
        rows.append(("bm25 fill_mask p50 ≤ 15 ms", f"{_vs(b['p50'], 15)} ms", b["p50"] <= 15,
                     "median ms per operator: " + _stages(bd.get("bm25"))))
    ann = st.get("ann", {})
    if ann.get("recall"):
        dflt = [r for r in ann["recall"]["rows"] if r["default"] and r["k"] == 1024]
        if dflt:
            r = dflt[0]
            rows.append(("ANN recall@1024 ≥ 0.98 (default settings)", _vs(r["recall"], 0.98, 4),
                         r["recall"] >= 0.98, f"ef={r['ef']}, both searches {r['search_ms_p50']:.1f} ms"))
    if ann.get("em"):
        e = ann["em"]
        sign = "+" if e["em_delta"] >= 0 else "-"
        rows.append(("ANN EM within 0.5 of exact", f"Δ {sign}{_vs(abs(e['em_delta']), 0.5)} EM "
                     f"(top-1 agreement {e['top1_agreement']:.1f}%)", abs(e["em_delta"]) <= 0.5,
                     f"EM ANN {e['em_ann']:.1f} / exact {e['em_exact']:.1f} on {e['n']} queries"))
    if lat.get("open_ms"):
        o = lat["open_ms"]["p50"]
        c = lat.get("open_cold", {})
        sizes = [f"{r['fraction']:.0%}: {r['open_ms']['p50']:.0f} ms"
                 for r in st.get("growth", {}).get("rows", []) if "open_ms" in r]
        why = ("by size: " + ", ".join(sizes) + ". ") if sizes else ""
        if c.get("open_ms") == c.get("open_ms") and "open_ms" in c:
            why += (f"In a new process the first open takes {c['open_ms']:.0f} ms: numpy, LMDB "
                    "and msgpack imports (the open itself is the warm figure)")
        rows.append(("open ≤ 0.2 s whatever the corpus size", f"{_vs(o, 200)} ms", o <= 200, why))
    ing = st.get("ingest", {})
    if "ratio" in ing:
        main = ing.get("stages_s") or st.get("main", {}).get("stages_s")
        rows.append(("ingest ≥ 90% of the encoder-alone speed",
                     f"{_vs(100 * ing['ratio'], 90, 0)}%",
                     ing["ratio"] >= 0.9, ("add, seconds per stage: " + _stages(main) +
                                           f"; the encoder alone: {ing['encoder_alone_s']:.1f}")
                     if main else ""))
    ivf = ing.get("ivf", {})
    if "ratio" in ivf:
        rows.append(("ingest into a trained ivf (int4) ≥ 85% of the encoder-alone speed",
                     f"{_vs(100 * ivf['ratio'], 85, 0)}%", ivf["ratio"] >= 0.85,
                     f"{ivf['add_tok_s']:.0f} tokens/s against {ivf['encoder_tok_s']:.0f}" +
                     (f"; add, seconds per stage: {_stages(ivf['stages_s'])}"
                      if ivf.get("stages_s") else "")))
    codec_step = st.get("codecs", {})
    cod = codec_step.get("codecs", {})
    small = [(n, r) for n, r in cod.items() if r["bytes_per_vector"] <= r["dim"] / 4]
    if small:  # decided by this run's own codec step, never by another run's file
        n, r = min(small, key=lambda nr: -nr[1]["em_delta"])
        ref = cod.get("float16", {}).get("em")
        enc = _run_encoder(res).get("name")
        on = (f"dense k={codec_step.get('k', 1024)}, {codec_step.get('queries', '?')} cloze "
              f"queries" + (f", encoder {enc}" if enc else ""))
        loss = -r["em_delta"]
        if ref is not None and ref <= 0:  # nothing to lose: the EM loss is not measured
            met = None
            why = (f"not measured in this run: float16 EM is 0 ({on}), so no codec can lose "
                   "EM; top-1 agreement with float16 is all this run says")
        else:
            met = r["em_delta"] >= -1.0
            why = (f"this run's codec step: EM {ref:.1f} (float16) → {r['em']:.1f} ({n}); {on}"
                   if ref is not None else f"this run's codec step; {on}")
        measured = ("+" if loss <= 0 else "-") + _vs(abs(loss), 1.0)
        rows.append((f"a codec at ≤ dim/4 bytes per token losing ≤ 1 EM point",
                     f"{n}: {r['bytes_per_vector']} B, ΔEM {measured}, top-1 agreement "
                     f"{r['top1_agreement']:.1f}%", met, why))
    peer = st.get("peers", {})
    if "ratio_p50" in peer:
        rows.append(("≥ 5× faster than LanceDB at equal answers",
                     f"×{_vs(peer['ratio_p50'], 5)} "
                     f"(answers agree {peer['agree_ann']:.0f}% ANN, {peer['agree_exact']:.0f}% exact)",
                     peer["ratio_p50"] >= 5, f"LanceDB p50 {peer['lance']['p50']:.0f} ms"))
    gr = st.get("growth", {})
    if "dense_p50_ratio" in gr:
        rows.append((f"10× more corpus costs ≤ 2× dense p50",
                     f"{gr['corpus_ratio']:.1f}× corpus → "
                     f"×{_vs(gr['dense_p50_ratio'], 2.0, 2)}",
                     gr["dense_p50_ratio"] <= 2.0,
                     "largest: " + _stages(gr["rows"][-1]["dense_stages"])))
    return rows


def render(res: dict, plots: dict[str, str], results_dir: Path = RESULTS) -> str:
    st = res["steps"]
    m = res["machine"]
    kind = {"smoke": " (**smoke run**: a few queries a step, proves the code runs; its "
                     "numbers mean nothing)",
            "quick": " (quick run: fewer queries, k and codecs)"}.get(run_kind(res), "")
    lines = ["# npmdb benchmarks", "",
             "Generated by `python -m bench` (`bench/report.py`); do not edit by hand. "
             f"Data: `{res['data']}`{kind}; "
             f"{m['cpus']} CPUs, Python {m['python']}, {m['time']}; last run "
             f"{res.get('total_s', 0) / 60:.1f} min. All numbers are medians (p50) or ratios; "
             "each step's numbers come from one run of that step, and every ratio compares "
             "numbers measured in the same step; latencies include query encoding.", ""]
    ran = [f"{name} {step['ran']}" for name, step in st.items() if step.get("ran")]
    if ran:
        lines += ["When each step last ran: " + ", ".join(ran) + ".", ""]
    if res.get("errors"):
        lines += ["**Steps that failed:** " + ", ".join(res["errors"]) + " (see the JSON).", ""]
    lines += ["## Targets", "", "| target | measured | met | what bounds it |", "|---|---|---|---|"]
    for t, meas, ok, why in targets(res):
        lines.append(f"| {t} | {meas} | {_ok(ok)} | {why} |")
    main = st.get("main", {})
    lat = st.get("latency", {})
    if lat.get("latency"):
        s = lat.get("stats", {})
        lines += ["", "## Latency", "",
                  f"{s.get('tokens')} tokens, {s.get('docs')} documents. p50 / p99 in ms.", "",
                  "| retrieval | mode | k | p50 | p99 |", "|---|---|---|---|---|"]
        for r in lat["latency"]:
            lines.append(f"| {r['retrieval']} | {r['mode']} | {r['k'] or '–'} | {r['p50']:.1f} | "
                         f"{r['p99']:.1f} |")
        lines += ["", "Median ms per operator (phrase mode, k=1024):", ""]
        for retrieval, stages in lat.get("breakdown", {}).items():
            lines.append(f"- {retrieval}: {_stages(stages)}")
        lines += ["", f"Open (read-only, existing database): p50 {lat['open_ms']['p50']:.1f} ms in a "
                  "process that has opened one before."]
        cold = lat.get("open_cold")
        if cold and cold.get("open_ms") == cold.get("open_ms"):
            lines.append(f"In a new process: `import npmdb` {cold['import_ms']:.0f} ms, then "
                         f"`npmdb.open` {cold['open_ms']:.0f} ms (its first call imports numpy, "
                         f"LMDB, msgpack), then the first query {cold['first_query_ms']:.0f} ms "
                         "(torch import and encoder load, columns and indexes read).")
        if "latency_vs_k" in plots:
            lines += ["", f"![latency against k]({plots['latency_vs_k']})"]
    ing = st.get("ingest", {})
    if "ratio" in ing:
        lines += ["", "## Ingest", "",
                  f"`db.add` of {ing['docs']} documents ({ing['tokens']} tokens): "
                  f"{ing['add_tok_s']:.0f} tokens/s; the encoder alone on the same blocks "
                  f"(tokenize + forward): {ing['encoder_tok_s']:.0f} tokens/s; ratio "
                  f"{ing['ratio']:.2f}."
                  + (" The encoder alone is timed just before and just after each add "
                     "(seconds: " + "; ".join(
                         "/".join(f"{t:.1f}" for t in x["encoder_alone_before_after_s"])
                         for x in (ing, ing.get("ivf", {}))
                         if "encoder_alone_before_after_s" in x)
                     + ") and the two averaged." if "encoder_alone_before_after_s" in ing
                     else "")]
        ivf = ing.get("ivf", {})
        if "ratio" in ivf:
            lines.append(f"Into a trained IVF with int4 rows (the large-corpus settings; the "
                         f"template trained by an untimed add of {ivf['warm_docs']} other "
                         f"documents): {ivf['add_tok_s']:.0f} tokens/s against "
                         f"{ivf['encoder_tok_s']:.0f}; ratio {ivf['ratio']:.2f}"
                         + (f" (re-run alone {ing['ivf_ran']})." if "ivf_ran" in ing else "."))
        if main.get("stages_s"):
            lines.append(f"Full corpus ({main['tokens']} tokens, {main['tok_s']:.0f} tokens/s), "
                         f"seconds per stage: {_stages(main['stages_s'])}.")
    ann = st.get("ann", {})
    if ann.get("recall"):
        from .ann import render as ann_render
        lines += ["", "## ANN against exact search", "", ann_render(ann).rstrip()]
        if "recall_vs_speed" in plots:
            lines += ["", f"![recall against speed]({plots['recall_vs_speed']})"]
    cod = st.get("codecs", {})
    if cod.get("codecs"):
        from .codecs import render as cod_render
        lines += ["", "## Vector codecs", "", cod_render(cod).rstrip()]
        if "bytes_vs_em" in plots:
            lines += ["", f"![bytes per token against answers]({plots['bytes_vs_em']})"]
    trained = _codec_em(res.get("data"), results_dir)
    if trained:
        from .codec_em import render as em_render
        enc = _run_encoder(res)
        same = bool(enc.get("fingerprint")) and trained.get("fingerprint") == enc["fingerprint"]
        when = (trained.get("machine") or {}).get("time", "?")
        lines += ["", f"`python -m bench.codec_em` (`{Path(trained['_path']).name}`), its own "
                  f"run of {when} on `{trained.get('db', '?')}` with the encoder "
                  f"`{trained.get('encoder', '?')}`, over `{trained.get('data', '?')}`: "
                  + ("the same encoder as this run's" if same else
                     "another run and encoder than this one's; the codec target above is "
                     "decided by this run's codec step alone") + ":", "",
                  em_render(trained).rstrip().split("\n", 2)[2]]
    peer = st.get("peers", {})
    if "lance" in peer:
        from .peers import render as peer_render
        lines += ["", "## Against LanceDB + Python", "", peer_render(peer).rstrip()]
    gr = st.get("growth", {})
    if gr.get("rows"):
        from .growth import render as gr_render
        lines += ["", "## Growth with corpus size", "", gr_render(gr).rstrip()]
    lines += serving_section()
    lines += scale_section()
    lines += ["", "## Reproduce", "", "    make bench            # = .venv/bin/python -m bench "
              "(../shared/data/dev)", "    python -m bench --data npmdb/data/dev-small --quick",
              "    python -m bench --only ann,codecs   # re-run some steps; others are kept", ""]
    return "\n".join(lines)


def serving_section(results_dir: Path = RESULTS) -> list[str]:
    """The last ``python -m bench.serve_load`` run (its own step, kept across suite runs)."""
    path = results_dir / "serve_load.md"
    if not path.exists():
        return []
    body = path.read_text(encoding="utf-8").rstrip().split("\n", 2)[2].strip()
    return ["", "## Serving (`npmdb serve`)", "", "`python -m bench.serve_load` (`make "
            "serve-load`), its own run:", "", body]


def _own_run(path: Path, title: str, how: str) -> list[str]:
    """A step's results file (its first line, the title, replaced) under ``title``."""
    if not path.exists():
        return []
    body = path.read_text(encoding="utf-8").rstrip().split("\n", 1)[1].strip()
    return ["", f"## {title}", "", f"{how}, its own run:", "", body]


def scale_section(results_dir: Path = RESULTS) -> list[str]:
    """The dense index kinds compared (``python -m bench.ivf``), what compression costs in
    answers (``bench.compact_em``) and the replayed large databases (``bench.replay``):
    their own runs, kept across suite runs."""
    out = _own_run(results_dir / "ivf-dev.md", "Dense index kinds at 1M tokens (hnsw / ivf / "
                   "exact)", "`python -m bench.ivf --db <dev database> --data ../shared/data/dev`")
    out += _own_run(results_dir / "compact-em-dev.md", "Answers lost to compression (codec + "
                    "index, 1M tokens)", "`python -m bench.compact_em` (the dev database "
                    "against copies written with another codec and index by `bench.replay`)")
    out += _own_run(results_dir / "ivf-probes.md", "IVF lists probed against corpus size",
                    "`python -m bench.probes build/replay-1m-int4 build/replay-10m-int4` "
                    "(recall of the candidates against an exact scan of every stored vector)")
    for p in sorted(results_dir.glob("corpus-size-*.md")):
        head, body = p.read_text(encoding="utf-8").rstrip().split("\n", 1)
        out += ["", head, "", "`python -m bench.corpus_size` (the same settings at growing "
                "corpus sizes, each database measured in a fresh process, rounds in turn):",
                "", body.strip()]
    for p in sorted(results_dir.glob("shards-*.md")):
        head, body = p.read_text(encoding="utf-8").rstrip().split("\n", 1)
        out += ["", head, "", "`python -m bench.shards` (one process, then 1, 2 and 4 Ray "
                "shards on this machine's cores; what bounds it: docs/SCALE.md section 5), "
                "its own run:", "", body.strip()]
    path = results_dir / "scale-ray-ivf.md"
    if path.exists():
        body = path.read_text(encoding="utf-8").rstrip().split("\n", 1)[1].strip()
        out += ["", "## Ray ingest into an IVF database: the index coded by the workers or "
                "the driver", "", "`python -m bench.scale --ivf --workers 2 --name "
                "scale-ray-ivf`, its own run:", "", body]
    replays = sorted(results_dir.glob("replay-*.md"))
    if replays:
        out += ["", "## Replayed large databases", "",
                "`python -m bench.replay` (copies of the dev database's documents with their "
                "stored vectors plus noise, written through the segment writer; see its "
                "docstring), each its own run:"]
        for p in replays:
            head, body = p.read_text(encoding="utf-8").rstrip().split("\n", 1)
            out += ["", "### " + head.removeprefix("## "), "", body.strip()]
    return out


def make_plots(res: dict, prefix: str, results_dir: Path = RESULTS) -> dict[str, str]:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # the bench extra installs it
        _warn_once("plots skipped: matplotlib is not installed (pip install -e '.[bench]', "
                   "which `make bench` does)")
        return {}
    st = res["steps"]
    out: dict[str, str] = {}
    results_dir.mkdir(parents=True, exist_ok=True)
    save = lambda fig, name: _save(fig, results_dir / name)  # noqa: E731
    rows = st.get("latency", {}).get("latency", [])
    if rows:
        fig, ax = plt.subplots(figsize=(6, 4))
        for retrieval in ("dense", "hybrid"):
            for mode in ("phrase", "token"):
                pts = sorted((r["k"], r["p50"]) for r in rows
                             if r["retrieval"] == retrieval and r["mode"] == mode and r["k"])
                if pts:
                    ax.plot(*zip(*pts), marker="o", label=f"{retrieval} {mode}")
        b = [r for r in rows if r["retrieval"] == "bm25" and r["mode"] == "phrase"]
        if b:
            ax.axhline(b[0]["p50"], color="grey", ls=":", label="bm25 phrase")
        ax.axhline(25, color="red", ls="--", lw=0.8, label="target (dense k=1024)")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("k")
        ax.set_ylabel("fill_mask p50 (ms)")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        out["latency_vs_k"] = save(fig, f"{prefix}-latency-vs-k.png")
    ann = st.get("ann", {}).get("recall")
    if ann:
        fig, ax = plt.subplots(figsize=(6, 4))
        for k in sorted({r["k"] for r in ann["rows"]}):
            pts = sorted((r["search_ms_p50"], r["recall"]) for r in ann["rows"] if r["k"] == k)
            ax.plot(*zip(*pts), marker="o", label=f"k={k}")
            dflt = [r for r in ann["rows"] if r["k"] == k and r["default"]]
            if dflt:
                ax.scatter([dflt[0]["search_ms_p50"]], [dflt[0]["recall"]], s=80,
                           facecolors="none", edgecolors="k")
        ax.axhline(0.98, color="red", ls="--", lw=0.8, label="target 0.98")
        ax.set_xlabel("start + end index search, p50 ms (circles: default ef)")
        ax.set_ylabel("recall@k against exact")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        out["recall_vs_speed"] = save(fig, f"{prefix}-recall-vs-speed.png")
    cod = st.get("codecs", {}).get("codecs")
    if cod:
        fig, ax = plt.subplots(figsize=(6, 4))
        xs = [r["vector_bytes_per_token"] for r in cod.values()]
        ax.plot(xs, [r["top1_agreement"] for r in cod.values()], "o-",
                label="top-1 agreement with float16 (%)")
        ax.plot(xs, [r["em"] for r in cod.values()], "s--", label="EM")
        for n, r in cod.items():
            ax.annotate(n, (r["vector_bytes_per_token"], r["top1_agreement"]),
                        textcoords="offset points", xytext=(4, 4), fontsize=8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("vector bytes per stored token")
        ax.set_ylabel("%")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        out["bytes_vs_em"] = save(fig, f"{prefix}-bytes-vs-em.png")
    return out


def _save(fig, path: Path) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt
    plt.close(fig)
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def report_path(res: dict, name: str, results_dir: Path = RESULTS) -> Path:
    """Where a run's markdown goes unless told: the root BENCHMARKS.md for a full run
    whose results are ``bench/results``; ``<name>.md`` beside them for a quick or smoke
    run (never the tracked report); ``results_dir/BENCHMARKS.md`` for results elsewhere
    (a test's temporary directory)."""
    if results_dir.resolve() != RESULTS.resolve():
        return results_dir / "BENCHMARKS.md"
    return results_dir / f"{name}.md" if run_kind(res, name) else OUT_MD


def write_report(res: dict, name: str, md_path: Path | None = None,
                 results_dir: Path = RESULTS) -> tuple[Path, dict[str, str]]:
    """Plots into ``results_dir``, the markdown to ``md_path`` (default
    :func:`report_path`); returns the markdown's path and the plots written."""
    import os

    md_path = report_path(res, name, results_dir) if md_path is None else md_path
    plots = make_plots(res, name, results_dir)
    md_path.parent.mkdir(parents=True, exist_ok=True)
    plots = {k: os.path.relpath(ROOT / v, md_path.parent.resolve())  # links from the report
             for k, v in plots.items()}
    md_path.write_text(_relink(render(res, plots, results_dir), md_path.parent.resolve()))
    return md_path, plots


def _relink(markdown: str, md_dir: Path) -> str:
    """Links that other results write from the repository's root (``](bench/results/x.png)``
    in a copied section) made relative to where this report is (they were broken in a
    report under bench/results)."""
    import os
    import re

    return re.sub(r"\]\((bench/results/[^)\s]+)\)",
                  lambda m: f"]({os.path.relpath(ROOT / m.group(1), md_dir)})", markdown)


def write(res: dict, name: str, md_path: Path | None = None,
          results_dir: Path = RESULTS) -> Path:
    """:func:`write_report`, the markdown's path only."""
    return write_report(res, name, md_path, results_dir)[0]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.report", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", type=Path, nargs="?", default=RESULTS / "bench-dev.json",
                    help="a suite run's results (default: %(default)s)")
    ap.add_argument("--out", type=Path, default=None,
                    help="the markdown report (default: BENCHMARKS.md for a full run in "
                         "bench/results, <name>.md beside a quick or smoke run's JSON, "
                         "BENCHMARKS.md beside a JSON elsewhere)")
    ap.add_argument("--plots", type=Path, default=None,
                    help="where the PNG plots go (default: beside the JSON)")
    args = ap.parse_args(argv)
    if not args.json.is_file():
        ap.error(f"no results file {args.json}: give a suite run's JSON "
                 "(python -m bench writes bench/results/bench-<data>.json)")
    try:
        res = json.loads(args.json.read_text(encoding="utf-8"))
    except ValueError as exc:
        ap.error(f"{args.json} is not JSON: {exc}")
    if not isinstance(res, dict) or "steps" not in res or "machine" not in res:
        ap.error(f"{args.json} is not a suite run's results (no steps / machine)")
    md_path = args.out or report_path(res, args.json.stem, args.json.parent)
    md, plots = write_report(res, args.json.stem, md_path, args.plots or args.json.parent)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
