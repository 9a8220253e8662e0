"""Concurrency soak: one writer process and N reader processes on one database.

The writer commits versions as fast as it can for the whole run — adds, deletes, updates,
batches, tags, and now and then an ``optimize``, a ``vacuum`` and a training refresh
(:func:`npmdb.generations.write_generation`) — and logs each version's document count.
Each reader loops over query kinds (``fill_mask`` with bm25 and dense retrieval, ``sql``,
``search``, ``get``, an ``AS OF`` query of a tagged version, a full snapshot scan) and
checks every answer:

* no exception of any kind;
* no torn version: inside one snapshot the live documents number exactly what the
  manifest says, and (checked afterwards) what the writer logged for that version;
* the anchor documents (never deleted) are always there, with their exact text;
* a reader never sees HEAD go backwards.

By default the LMDB map starts small (``--initial-map``, 4 MiB) so that it must grow
during the run while readers hold snapshots (map growth in the writer, adoption of the
new size in the readers).

    python -m bench.soak [--seconds 180] [--readers 4] [--out soak]

Results: ``bench/results/<out>.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
ANCHORS = 40
QUERIES = ["Salem is the capital of [MASK].", "The currency of Japan is the [MASK].",
           "Thessaloniki is a city in [MASK].", "The [MASK] of Greece."]


def _set_map(initial_map: int) -> None:
    if initial_map:
        from npmdb.storage import env as E
        E.INITIAL_MAP = initial_map


def anchor_text(i: int) -> str:
    from .faults import doc_text
    return doc_text(f"anchor-{i}")


def setup(path: Path, encoder: Path, initial_map: int) -> None:
    import npmdb

    _set_map(initial_map)
    with npmdb.open(path, encoder=encoder, progress=False) as db:
        db.add([{"id": f"anchor-{i}", "title": f"Anchor {i}", "text": anchor_text(i)}
                for i in range(ANCHORS)])
        db.tag("base")


def writer(path: str, seconds: float, out: str, seed: int, initial_map: int) -> None:
    import torch
    from transformers import AutoModel

    import npmdb
    from npmdb.generations import write_generation

    from .faults import doc_text

    _set_map(initial_map)
    torch.set_num_threads(1)
    rng = random.Random(seed)
    deadline = time.time() + seconds
    log = open(out + ".versions", "w", buffering=1)
    stats: dict[str, Any] = {"versions": 0, "ops": {}, "errors": [], "map_sizes": set()}
    model = None
    live: list[str] = []
    n = 0
    with npmdb.open(path, progress=False) as db:
        last = [db.version]

        def commit(op: str, vid) -> None:
            stats["ops"][op] = stats["ops"].get(op, 0) + 1
            if vid is None or vid == last[0]:
                return
            last[0] = vid
            stats["versions"] += 1
            log.write(f"{vid} {db.count(vid)}\n")
            stats["map_sizes"].add(db.env.env.info()["map_size"])

        while time.time() < deadline:
            n += 1
            r = rng.random()
            try:
                if r < 0.40 or len(live) < 10:
                    ids = [f"w{n}-{i}" for i in range(rng.randint(5, 40))]
                    commit("add", db.add([{"id": i, "text": doc_text(i) + " filler " * 40}
                                          for i in ids]))
                    live += ids
                elif r < 0.55:
                    gone = rng.sample(live, rng.randint(1, 8))
                    commit("delete", db.delete(gone))
                    live = [x for x in live if x not in set(gone)]
                elif r < 0.65:
                    ids = rng.sample(live, 3)
                    commit("update", db.update([{"id": i, "text": doc_text(i) + " (updated)"}
                                                for i in ids]))
                elif r < 0.75:
                    ids = [f"b{n}-{i}" for i in range(rng.randint(2, 6))]
                    gone = rng.sample(live, 2)
                    with db.batch():
                        db.add([{"id": i, "text": doc_text(i)} for i in ids])
                        db.delete(gone)
                    commit("batch", db.version)
                    live = [x for x in live if x not in set(gone)] + ids
                elif r < 0.82:
                    db.tag(f"t{n}")
                    stats["ops"]["tag"] = stats["ops"].get("tag", 0) + 1
                elif r < 0.88:
                    commit("optimize", db.optimize())
                elif r < 0.94:
                    db.vacuum(older_than=20.0)
                    stats["ops"]["vacuum"] = stats["ops"].get("vacuum", 0) + 1
                else:
                    if model is None:
                        model = AutoModel.from_pretrained(db.encoder_for(0).info.path,
                                                          local_files_only=True)
                    with torch.no_grad():
                        for p in model.parameters():
                            p.add_(torch.randn_like(p) * 0.01)
                    vid, _ = write_generation(db, model, steps=n)
                    commit("refresh", vid)
            except Exception as exc:  # noqa: BLE001 - reported
                stats["errors"].append(f"{type(exc).__name__}: {exc}")
                if len(stats["errors"]) > 20:
                    break
    stats["map_sizes"] = sorted(stats["map_sizes"])
    Path(out).write_text(json.dumps(stats))


def reader(path: str, seconds: float, out: str, seed: int, initial_map: int) -> None:
    import npmdb

    _set_map(initial_map)
    rng = random.Random(seed)
    deadline = time.time() + seconds
    served: dict[str, int] = {}
    errors: list[str] = []
    seen: dict[int, int] = {}  # version -> live documents counted in its snapshot
    last_head = -1
    anchors = {f"anchor-{i}": anchor_text(i) for i in range(ANCHORS)}
    kinds = ["bm25", "dense", "sql", "search", "get", "asof", "scan"]
    with npmdb.open(path, readonly=True, progress=False) as db:
        while time.time() < deadline:
            kind = rng.choice(kinds)
            q = rng.choice(QUERIES)
            try:
                if kind == "bm25":
                    res = db.fill_mask(q, retrieval="bm25", top=5)
                    v = res.version
                elif kind == "dense":
                    res = db.fill_mask(q, top=5, k=128, retrieval="dense")
                    v = res.version
                elif kind == "sql":
                    res = db.sql("SELECT phrase, score, support FROM MASKED(?) USING hybrid("
                                 "k => 64, blocks => 2) ORDER BY score DESC LIMIT 5", [q])
                    v = res.version
                elif kind == "search":
                    hits = db.search("zq", limit=5)
                    v = None
                    if hits is None:
                        raise AssertionError("search returned None")
                elif kind == "get":
                    did = rng.choice(list(anchors))
                    d = db.get(did)
                    if d is None or d["text"] != anchors[did]:
                        raise AssertionError(f"anchor {did} missing or changed")
                    v = None
                elif kind == "asof":
                    res = db.fill_mask(q, retrieval="bm25", top=3, version="base")
                    if any(e.doc_id not in anchors for a in res for e in a.evidence):
                        raise AssertionError("AS OF 'base' answered from a later document")
                    v = None
                else:
                    with db.snapshot() as snap:
                        m = snap.manifest
                        n = 0
                        ids = set()
                        for seg in snap.segments:
                            dead = set(m.deleted.get(seg.seg, ()))
                            for local in range(seg.record.docs):
                                if local not in dead:
                                    ids.add(seg.doc(snap.txn, local).id)
                                    n += 1
                        if n != m.stats["docs"] or len(ids) != n:
                            raise AssertionError(f"torn version {m.id}: {n} documents ("
                                                 f"{len(ids)} ids), manifest says "
                                                 f"{m.stats['docs']}")
                        if not set(anchors) <= ids:
                            raise AssertionError(f"version {m.id} lacks anchors")
                        seen[m.id] = n
                        v = m.id
                if v is not None:
                    if v < last_head:
                        raise AssertionError(f"HEAD went back from {last_head} to {v}")
                    last_head = v
                served[kind] = served.get(kind, 0) + 1
            except Exception as exc:  # noqa: BLE001 - the finding
                msg = f"{kind}: {type(exc).__name__}: {exc}"
                if "READERS_FULL" in msg:  # who holds LMDB's reader slots?
                    rows = db.env.env.readers().splitlines()[1:]
                    pids: dict[str, int] = {}
                    for row in rows:
                        pids[row.split()[0]] = pids.get(row.split()[0], 0) + 1
                    msg += f" (slots by pid: {pids}; this pid {os.getpid()})"
                errors.append(msg)
                if len(errors) > 50:
                    break
    Path(out).write_text(json.dumps({"served": served, "errors": errors, "seen": seen,
                                     "last_head": last_head}))


def run_soak(seconds: float = 180.0, readers: int = 4, *, workdir: Path | None = None,
             encoder: Path | None = None, initial_map: int = 4 << 20, seed: int = 0,
             log=print) -> dict[str, Any]:
    """Run the soak; returns the aggregated counts (see the module doc)."""
    from .faults import make_tiny_encoder

    own = workdir is None
    workdir = Path(workdir or tempfile.mkdtemp(prefix="npmdb-soak-"))
    workdir.mkdir(parents=True, exist_ok=True)
    if encoder is None:
        encoder = workdir / "encoder"
        if not (encoder / "config.json").exists():
            make_tiny_encoder(encoder)
    db = workdir / "db"
    shutil.rmtree(db, ignore_errors=True)
    setup(db, encoder, initial_map)
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(ROOT),
               OMP_NUM_THREADS="1")
    procs = []
    start = time.time()
    for i in range(readers):
        procs.append(("reader", i, subprocess.Popen(
            [sys.executable, "-m", "bench.soak", "--role", "reader", "--db", str(db),
             "--seconds", str(seconds), "--result", str(workdir / f"reader-{i}.json"),
             "--seed", str(seed + i + 1), "--initial-map", str(initial_map)],
            env=env, cwd=str(ROOT))))
    time.sleep(min(5.0, seconds / 10))  # let readers import and open first
    wsec = max(1.0, seconds - (time.time() - start))
    procs.append(("writer", 0, subprocess.Popen(
        [sys.executable, "-m", "bench.soak", "--role", "writer", "--db", str(db),
         "--seconds", str(wsec), "--result", str(workdir / "writer.json"), "--seed",
         str(seed), "--initial-map", str(initial_map)], env=env, cwd=str(ROOT))))
    codes = {}
    for role, i, p in procs:
        try:
            codes[f"{role}-{i}"] = p.wait(timeout=seconds + 600)
        except subprocess.TimeoutExpired:
            p.kill()
            codes[f"{role}-{i}"] = "timeout"
    w = json.loads((workdir / "writer.json").read_text()) if (workdir / "writer.json").exists() \
        else {"versions": 0, "ops": {}, "errors": ["writer wrote no result"], "map_sizes": []}
    logged = {}
    vf = workdir / "writer.json.versions"
    if vf.exists():
        for line in vf.read_text().splitlines():
            a, b = line.split()
            logged[int(a)] = int(b)
    rs = []
    for i in range(readers):
        f = workdir / f"reader-{i}.json"
        rs.append(json.loads(f.read_text()) if f.exists() else
                  {"served": {}, "errors": [f"reader {i} wrote no result"], "seen": {}})
    torn = []
    for r in rs:
        for vid, n in r["seen"].items():
            if int(vid) in logged and logged[int(vid)] != n:
                torn.append(f"version {vid}: reader counted {n}, writer logged {logged[int(vid)]}")
    import npmdb
    with npmdb.open(db, progress=False) as d:
        rep = d.check()
        final = {"docs": d.count(), "versions_kept": len(d.versions()),
                 "map_size": d.env.env.info()["map_size"],
                 "data_mb": round((db / "data.mdb").stat().st_size / 2 ** 20, 1)}
    served = {}
    for r in rs:
        for k, v in r["served"].items():
            served[k] = served.get(k, 0) + v
    out = {
        "seconds": round(time.time() - start, 1), "readers": readers,
        "queries_served": sum(served.values()), "served_by_kind": served,
        "versions_committed": w["versions"], "writer_ops": w["ops"],
        "writer_errors": w["errors"], "reader_errors": [e for r in rs for e in r["errors"]],
        "torn": torn, "snapshots_checked_against_writer_log": sum(
            1 for r in rs for vid in r["seen"] if int(vid) in logged),
        "map_sizes_seen_by_writer": w["map_sizes"], "exit_codes": codes,
        "check_after": {"ok": rep.ok, "clean": rep.clean,
                        "problems": [str(p) for p in rep.problems[:5]]},
        "final": final, "initial_map": initial_map,
    }
    out["errors"] = len(out["reader_errors"]) + len(out["writer_errors"]) + len(torn) + sum(
        1 for c in codes.values() if c != 0)
    if own:
        shutil.rmtree(workdir, ignore_errors=True)
    return out


def markdown(r: dict[str, Any]) -> str:
    lines = ["# Concurrency soak", "",
             f"One writer and {r['readers']} reader processes for {r['seconds']} s "
             f"(initial LMDB map {r['initial_map'] // 2 ** 20} MiB; the writer's map grew "
             f"through {len(r['map_sizes_seen_by_writer'])} sizes, up to "
             f"{max(r['map_sizes_seen_by_writer'] or [0]) // 2 ** 20} MiB).", "",
             "| queries served | versions committed | errors | torn versions | snapshots "
             "checked against the writer's log |", "|---:|---:|---:|---:|---:|",
             f"| {r['queries_served']} | {r['versions_committed']} | {r['errors']} | "
             f"{len(r['torn'])} | {r['snapshots_checked_against_writer_log']} |", "",
             f"Queries by kind: {json.dumps(r['served_by_kind'])}.", "",
             f"Writer operations: {json.dumps(r['writer_ops'])}.", "",
             f"`check()` afterwards: {r['check_after']}. Final: {r['final']}.", ""]
    for e in (r["reader_errors"] + r["writer_errors"] + r["torn"])[:20]:
        lines.append(f"- {e}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=180.0)
    ap.add_argument("--readers", type=int, default=4)
    ap.add_argument("--out", default="soak")
    ap.add_argument("--initial-map", type=int, default=4 << 20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--role", choices=("reader", "writer"), help=argparse.SUPPRESS)
    ap.add_argument("--db", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.role == "reader":
        reader(args.db, args.seconds, args.result, args.seed, args.initial_map)
        return 0
    if args.role == "writer":
        writer(args.db, args.seconds, args.result, args.seed, args.initial_map)
        return 0
    from .common import machine, write_result

    res = run_soak(args.seconds, args.readers, initial_map=args.initial_map, seed=args.seed)
    res["machine"] = machine()
    print(json.dumps({k: res[k] for k in ("queries_served", "versions_committed", "errors",
                                          "torn", "check_after")}, indent=1))
    path = write_result(args.out, res, markdown(res))
    print(f"wrote {path}")
    return 1 if res["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
