"""Load on a real ``npmdb serve``: concurrent clients over loopback for a bounded time.

For each retrieval mode, the same cloze queries are answered

* in process: ``db.fill_mask`` called by 1 thread, then by ``--clients`` threads at once;
* through the API: ``POST /api/fill_mask`` from 1 client, then from ``--clients`` clients
  at once (keep-alive connections, each looping until the time is up), against
  ``npmdb serve`` started as its own process on the same database.

Reported: requests, errors (must be 0), p50/p99 and the API p50 over the in-process p50
at the same concurrency (target ≤ 1.3×). Options are fill_mask's defaults (top 5, 3
occurrences each); the API also reads each occurrence's document for the page's context.

    python -m bench.serve_load [--db bench/work/dev-small.npmdb] [--clients 4] [--seconds 20]
    python -m bench.serve_load --modes '' --screenshot docs/serve.png   # the README's picture

Results: ``bench/results/serve_load.{json,md}`` for the documented run (20 s a row, 4
clients, bm25 and dense), which BENCHMARKS.md and the README cite; any other run is written
as ``serve_load-<modes>-<clients>c-<seconds>s`` unless ``--name`` says otherwise.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from .common import (SMALL_DATA, WORK, count, load_jsonl, percentiles, publish, require_data,
                     seconds, vs_limit)

NAME = "serve_load"
TARGET = 1.3
#: The documented run, whose results the README and BENCHMARKS.md cite (``NAME``).
DOCUMENTED = {"seconds": 20.0, "clients": 4, "modes": ("bm25", "dense")}


def result_name(seconds: float, clients: int, modes, name: str | None = None) -> str:
    """``name`` when given; ``NAME`` for the documented run (at least as long); else a name
    that says what ran, so a short run never replaces the cited one."""
    if name:
        return name
    if seconds >= DOCUMENTED["seconds"] and clients == DOCUMENTED["clients"] and \
            tuple(modes) == DOCUMENTED["modes"]:
        return NAME
    return f"{NAME}-{'-'.join(modes) or 'none'}-{clients}c-{seconds:g}s"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(db: Path, port: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "npmdb", "serve", str(db), "--port",
                             str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.time() + 300
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/versions", timeout=2).read()
            return proc
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                proc.kill()
                raise SystemExit("npmdb serve did not start: " + (proc.stderr.read() or ""))
            time.sleep(0.5)


def hammer(fn, queries: list[str], clients: int, seconds: float) -> dict:
    """``clients`` threads each calling ``fn(query)`` in a loop for ``seconds``."""
    lat: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    deadline = time.perf_counter() + seconds

    def worker(i: int) -> None:
        mine, bad = [], []
        n = i
        while time.perf_counter() < deadline:
            q = queries[n % len(queries)]
            n += clients
            t0 = time.perf_counter()
            try:
                fn(q)
                mine.append((time.perf_counter() - t0) * 1000)
            except Exception as exc:  # noqa: BLE001 - every failure is counted
                bad.append(f"{type(exc).__name__}: {exc}"[:200])
        with lock:
            lat.extend(mine)
            errors.extend(bad)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    out = percentiles(lat) if lat else {"p50": float("nan"), "p99": float("nan"), "n": 0}
    return out | {"requests": len(lat) + len(errors), "errors": len(errors),
                  "error_samples": errors[:5], "rps": round((len(lat) + len(errors)) / wall, 2),
                  "clients": clients, "seconds": round(wall, 2)}


def api_caller(base: str, opts: dict):
    import httpx

    local = threading.local()

    def call(q: str) -> None:
        if not hasattr(local, "client"):
            local.client = httpx.Client(base_url=base, timeout=60)
        r = local.client.post("/api/fill_mask", json={"query": q, **opts})
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {r.text[:150]}")
        r.json()
    return call


def screenshot(base: str, path: Path, query: str) -> None:
    """The query page after one bm25 query, in headless chromium (Playwright)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        page = b.new_page(viewport={"width": 1200, "height": 900})
        page.goto(base + "/")
        page.fill("#q", query)
        page.select_option("select[name=retrieval]", "bm25")
        page.fill("input[name=top]", "4")
        page.click("#ask button[type=submit]")
        page.wait_for_selector("#status.done")
        page.screenshot(path=str(path), full_page=True)
        b.close()


def run(args) -> dict:
    import npmdb

    queries = [r["query"] for r in load_jsonl(args.data / "cloze.jsonl")]
    out: dict = {"db": str(args.db), "queries": len(queries), "clients": args.clients,
                 "seconds": args.seconds, "target": TARGET, "modes": {}}
    with npmdb.open(args.db, create=False, readonly=True, progress=False) as db:
        st = db.stats()
        out |= {"docs": st["docs"], "tokens": st["tokens"]}
        for mode in args.modes:
            opts = {"retrieval": mode}
            db.fill_mask(queries[0], **opts)  # warm
            r1 = hammer(lambda q: db.fill_mask(q, **opts), queries, 1, args.seconds)
            rc = hammer(lambda q: db.fill_mask(q, **opts), queries, args.clients, args.seconds)
            out["modes"][mode] = {"in_process_1": r1, "in_process_c": rc}
    port = _free_port()
    proc = start_server(args.db, port)
    try:
        base = f"http://127.0.0.1:{port}"
        if args.screenshot:
            screenshot(base, args.screenshot, "Thessaloniki is a city in [MASK].")
        for mode in args.modes:
            call = api_caller(base, {"retrieval": mode})
            call(queries[0])
            m = out["modes"][mode]
            m["api_1"] = hammer(call, queries, 1, args.seconds)
            m["api_c"] = hammer(call, queries, args.clients, args.seconds)
            m["ratio_1"] = m["api_1"]["p50"] / m["in_process_1"]["p50"]
            m["ratio_c"] = m["api_c"]["p50"] / m["in_process_c"]["p50"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    out["errors"] = sum(m[k]["errors"] for m in out["modes"].values()
                        for k in ("in_process_1", "in_process_c", "api_1", "api_c"))
    return out


def render(out: dict) -> str:
    c = out["clients"]
    lines = [f"# npmdb serve under load", "",
             f"{out['docs']} documents, {out['tokens']} tokens ({out['db']}); "
             f"{out['queries']} cloze queries cycled; {out['seconds']} s per row; "
             f"{out['machine']['cpus']} CPUs, {out['machine']['time']}. Latencies in ms; "
             "API = `POST /api/fill_mask` over loopback to `npmdb serve` in its own process "
             "(keep-alive clients); in process = `db.fill_mask` on threads.", "",
             "| retrieval | clients | in-process p50 / p99 | API p50 / p99 | API ÷ in-process "
             "(p50) | API requests/s | errors |",
             "|---|---|---|---|---|---|---|"]
    for mode, m in out["modes"].items():
        for n, a, b, r in ((1, m["in_process_1"], m["api_1"], m["ratio_1"]),
                           (c, m["in_process_c"], m["api_c"], m["ratio_c"])):
            ok = "" if r <= out["target"] else f" (over {out['target']}×)"
            lines.append(f"| {mode} | {n} | {a['p50']:.1f} / {a['p99']:.1f} | "
                         f"{b['p50']:.1f} / {b['p99']:.1f} | "
                         f"×{vs_limit(r, out['target'], 2)}{ok} | "
                         f"{b['rps']:.1f} | "
                         f"{a['errors'] + b['errors']} |")
    lines += ["", f"Errors in all: {out['errors']} (target 0). Target: API p50 ≤ "
              f"{out['target']}× the in-process p50 at the same concurrency.", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.serve_load",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=SMALL_DATA)
    ap.add_argument("--db", type=Path, default=WORK / "dev-small.npmdb",
                    help="database (built from the data's corpus when missing)")
    ap.add_argument("--clients", type=count, default=4)
    ap.add_argument("--seconds", type=seconds, default=20.0)
    ap.add_argument("--modes", default="bm25,dense", help="'' measures nothing")
    ap.add_argument("--screenshot", type=Path, default=None,
                    help="save the query page (headless chromium) to this PNG")
    ap.add_argument("--name", default=None,
                    help=f"results name (default: {NAME} for the documented run of 20 s, 4 "
                         f"clients, bm25,dense; {NAME}-<modes>-<clients>c-<seconds>s otherwise)")
    args = ap.parse_args(argv)
    args.modes = [m for m in args.modes.split(",") if m]
    unknown = [m for m in args.modes if m not in ("bm25", "dense", "hybrid")]
    if unknown:
        ap.error(f"unknown mode(s) {', '.join(unknown)}: --modes takes bm25, dense, hybrid")
    require_data(args.data, error=ap.error)
    import npmdb

    try:
        if not (args.db / "data.mdb").exists():
            print(f"building {args.db} from {args.data} …", file=sys.stderr)
            with npmdb.open(args.db, progress=True) as db:
                db.add(args.data / "corpus.jsonl.gz", message="sample corpus")
        out = run(args)
    except npmdb.Error as exc:  # a database path that is a file, …
        ap.error(str(exc))
    if not args.modes:
        return 0
    publish(result_name(args.seconds, args.clients, args.modes, args.name), out, render)
    return 0 if out["errors"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
