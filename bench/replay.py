"""Build a larger database by replay, and measure what size costs.

    python -m bench.replay --src build/dev.npmdb --dst build/replay-10m --tokens 10000000 \\
        --index ivf [--codec float16] [--noise 0.05]

Encoding 100M tokens on 2 cores would take days, so a large database is made from a real
one: copy ``r`` of every document of ``--src`` gets the id ``r<r>:<id>`` and the same text,
title and token columns, and its *stored* vectors plus Gaussian noise, written through the
normal segment writer (one segment per source segment and copy, one version per copy;
``--segment-copies N`` puts N copies in each segment, as adds of that size would),
so the new database's codecs, index files, checksums and commits are exactly an ``add``'s.

The noise: each vector gets ``noise · ‖v‖/√d · N(0, I)``, i.e. a perturbation of relative
size ``noise`` (default 0.05: cosine to the original ~0.999). Copies then do not collapse
onto identical points (which would make an ANN index's lists and graphs degenerate), while
every copy keeps the neighbourhood of its original: a token's nearest neighbours are its
own copies and the originals' neighbours' copies, as in a corpus where text recurs. Query
answers are therefore the source's answers, each supported ``r`` times, and latency grows
with the candidates an index must scan, as it would on real text.

Then, in a fresh process: bytes per token on disk, open time, dense ``fill_mask`` p50/p99
at k=1024 on cloze queries of ``--data`` (default: the dev corpus beside the checkout,
``../shared/data/dev``, that the committed results used; a database of the bundled sample
wants ``--data npmdb/data/dev-small``; a missing one stops the run before anything is
built), and resident memory (RSS, anon). Results go to
``bench/results/replay-<name>.json`` / ``.md``; ``--measure-only`` re-measures an existing
``--dst``; ``--merge --src A --dst B`` makes B a copy of A with its segments merged into one
by ``optimize()`` (what a user runs once a corpus is loaded) and measures it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from .common import DEV_DATA, RESULTS, load_jsonl, percentiles, publish, require_data
from .memcap import MemoryCap, evict

_PROBE = r"""
import json, sys, time
import npmdb

def status():
    got = {}
    for line in open("/proc/self/status"):
        if line.startswith(("VmRSS", "RssAnon", "RssFile")):
            k, v = line.split(":")
            got[k] = int(v.split()[0]) / 1024
    return got

t = time.perf_counter()
import npmdb.database, npmdb.query.executor  # the modules a first open would import
import_s = time.perf_counter() - t
t = time.perf_counter()
ivf = json.loads(sys.argv[5]) if len(sys.argv) > 5 else {}  # IvfParams fields to search with
opts = {}
if ivf:
    from npmdb.storage.dense import DenseParams
    from npmdb.storage.ivf import IvfParams
    opts["dense_params"] = DenseParams(ivf=IvfParams(**ivf))
db = npmdb.open(sys.argv[1], readonly=True, progress=False, **opts)
open_s = time.perf_counter() - t
qs = json.loads(sys.argv[2]); k = int(sys.argv[3]); passes = int(sys.argv[4])
t = time.perf_counter(); db.fill_mask(qs[0], k=k, retrieval="dense"); first_s = time.perf_counter() - t
pass_ms = []
for _ in range(passes):  # the last pass is reported; earlier ones warm the working set
    ms, stages = [], {}
    for q in qs:
        t = time.perf_counter(); res = db.fill_mask(q, k=k, evidence=1, retrieval="dense")
        ms.append((time.perf_counter() - t) * 1e3)
        for s in res.stats:
            stages.setdefault(s.operator, []).append(s.ms)
    pass_ms.append(sorted(ms)[len(ms) // 2])
st = db.stats()
print(json.dumps({"open_s": open_s, "import_s": import_s, "first_s": first_s, "ms": ms,
                  "pass_p50": pass_ms, "rss": status(),
                  "stages": {k: sorted(v)[len(v) // 2] for k, v in stages.items()},
                  "tokens": st["tokens"], "bytes": st["bytes_on_disk"], "index": st["index"],
                  "segments": st["segments"]}))
"""


def replay(src: Path, dst: Path, tokens: int, index: str, codec: str, noise: float,
           log=print, segment_copies: int = 1, lists: int | None = None) -> dict:
    """Write copies of ``src`` into a new database ``dst`` until it holds ``tokens``;
    ``segment_copies`` copies of each source segment go into one new segment (one
    version each), as ``add`` calls of that many copies' documents would write them.
    ``lists``: the IVF template's coarse lists (default: the first segment's own choice,
    ~4·√n of its sample), trained on 64 rows a list as ``optimize()``'s retrain draws."""
    import npmdb
    from npmdb.corpus import Document
    from npmdb.storage.dense import DenseParams
    from npmdb.storage.ivf import POINTS_PER_LIST, IvfParams

    if segment_copies < 1:
        raise SystemExit(f"--segment-copies must be at least 1, got {segment_copies}")
    ivf = IvfParams()
    if lists is not None:
        ivf = IvfParams(nlist=lists, train_points=max(ivf.train_points, POINTS_PER_LIST * lists))
    rng = np.random.default_rng(7)
    t0 = time.perf_counter()
    with npmdb.open(src, readonly=True, progress=False) as s, \
            npmdb.open(dst, encoder=s.encoder_for(0).path, index=index, codec=codec,
                       dense_params=DenseParams(ivf=ivf),
                       progress=False) as d:  # the source's encoder: its vectors, its dim
        src_tokens = int(s.stats()["tokens"])
        copies = max(1, -(-tokens // src_tokens))
        have = int(d.stats()["tokens"])
        start = have // src_tokens
        for r0 in range(start, copies, segment_copies):
            group = range(r0, min(r0 + segment_copies, copies))
            t = time.perf_counter()
            with s.snapshot() as snap, d.batch(f"replay copies {group.start}-{group.stop - 1}") as w:
                for seg in snap.segments:
                    cols = seg.columns(snap.txn)
                    docs = [seg.doc(snap.txn, i) for i in range(seg.record.docs)]
                    sw = w.segment_writer(w.allocate_segment(), w.generation)
                    ids = []
                    for r in group:  # every copy's documents first: the segment's tokens
                        rid = [f"r{r}:{x.id}" for x in docs]
                        sw.add_documents(
                            [Document(i, x.title, x.text, x.meta) for i, x in zip(rid, docs)],
                            {"tokens": cols.tokens, "flags": cols.flags,
                             "offsets": cols.offsets, "block_ptr": cols.block_ptr,
                             "block_doc": cols.block_doc})
                        ids += rid
                    for r in group:  # then their vectors, in the same order
                        for base, stored in seg.iter_chunks(snap.txn, snap.generation):
                            v = seg.codec.decode(np.asarray(stored))
                            if r and noise:
                                scale = noise * np.linalg.norm(v, axis=1, keepdims=True) / \
                                    np.sqrt(v.shape[1])
                                v = v + scale * rng.standard_normal(v.shape, dtype=np.float32)
                            sw.add_vectors(v.astype(np.float16))
                    w.append(sw.finish(), ids)
            log(f"copies {group.start + 1}-{group.stop}/{copies}: "
                f"{time.perf_counter() - t:.0f} s, {d.stats()['tokens']} tokens")
    return {"src": str(src), "dst": str(dst), "copies": copies, "noise": noise,
            "index": index, "codec": codec, "segment_copies": segment_copies,
            "lists": lists, "build_s": time.perf_counter() - t0}


def merge(src: Path, dst: Path, log=print, retrain: bool | None = None) -> dict:
    """``dst``: a copy of ``src`` with its segments merged by ``optimize(retrain=...)``
    (IVF codes copied, not computed again, unless the template is retrained), vacuumed,
    its LMDB file then copied compacted (LMDB never shrinks a file: the pages the old
    segments held stay free in it)."""
    import shutil
    import tempfile

    import lmdb

    import npmdb

    t0 = time.perf_counter()
    if src.resolve() != dst.resolve():
        if dst.exists():
            raise SystemExit(f"{dst} exists: remove it or choose another --dst")
        shutil.copytree(src, dst)
    copy_s = time.perf_counter() - t0
    with npmdb.open(dst, progress=True) as db:
        before = db.stats()["segments"]
        t = time.perf_counter()
        db.optimize(retrain=retrain)
        optimize_s = time.perf_counter() - t
        message = db.versions()[-1]["message"]
        db.vacuum()
    uncompacted = (dst / "data.mdb").stat().st_size
    free = shutil.disk_usage(dst).free
    if free < 1.2 * uncompacted:  # the compacted copy is written beside the file
        log(f"data.mdb left uncompacted ({uncompacted / 1e9:.1f} GB, {free / 1e9:.1f} GB free):"
            " its bytes on disk count the pages the old segments held")
        return {"src": str(src), "dst": str(dst), "merged_segments": before,
                "optimize_s": optimize_s, "copy_s": copy_s, "optimize": message,
                "retrain": retrain, "compacted": False}
    with tempfile.TemporaryDirectory(dir=dst) as tmp:
        env = lmdb.open(str(dst), readonly=True, lock=False, max_dbs=64, subdir=True)
        env.copy(tmp, compact=True)
        env.close()
        Path(tmp, "data.mdb").replace(dst / "data.mdb")
    log(f"merged {before} segments in {optimize_s:.1f} s ({message}); data.mdb "
        f"{uncompacted / 1e9:.2f} GB -> {(dst / 'data.mdb').stat().st_size / 1e9:.2f} GB "
        "compacted")
    rec = RESULTS / f"replay-{src.name}.json"
    src_build = json.loads(rec.read_text()).get("build", {}) if rec.exists() else {}
    return {"src": str(src), "dst": str(dst), "merged_segments": before,
            "optimize_s": optimize_s, "copy_s": copy_s, "optimize": message,
            "retrain": retrain, "data_mdb_before_compaction":
            uncompacted, "copies": src_build.get("copies"), "noise": src_build.get("noise"),
            "build_s": (src_build.get("build_s") or 0.0) + optimize_s,
            "note": f"{src.name} ({src_build.get('build_s', float('nan')):.0f} s) merged "
                    f"by optimize() ({optimize_s:.0f} s)"}


def measure(dst: Path, data: Path, k: int, n: int, cap_mb: float | None = None,
            ivf: dict | None = None) -> dict:
    """``dst`` measured in a fresh process. With ``cap_mb`` the process runs in a memory
    cgroup of that limit (``bench.memcap``), starting from an evicted page cache, and runs
    the queries twice: the first pass reads the working set in, the second is reported
    (``pass_p50`` has both, ``peak_mb`` the most memory the cgroup was charged). ``ivf``:
    ``IvfParams`` fields the process searches with (e.g. ``{"refine": 12}``)."""
    qs = [r["query"] for r in load_jsonl(data / "cloze.jsonl")[:n]]
    cmd = [sys.executable, "-c", _PROBE, str(dst), json.dumps(qs), str(k)]
    extra = [json.dumps(ivf or {})]
    if cap_mb is None:
        out = subprocess.run(cmd + ["1"] + extra, capture_output=True, text=True)
    else:
        evict(dst)
        with MemoryCap(cap_mb) as cap:
            out = subprocess.run(cmd + ["2"] + extra, capture_output=True, text=True,
                                 preexec_fn=cap.preexec)
            peak = cap.peak_mb()
    if out.returncode:
        raise RuntimeError(f"the measuring process failed on {dst}:\n{out.stderr[-3000:]}")
    got = json.loads(out.stdout.strip().splitlines()[-1])
    if cap_mb is not None:
        got.update(cap_mb=cap_mb, peak_mb=peak)
    got["latency"] = percentiles(got.pop("ms"))
    got["bytes_per_token"] = got["bytes"] / max(got["tokens"], 1)
    return got


def render(out: dict) -> str:
    m = out["measured"]
    b = out.get("build", {})
    return "\n".join([
        f"## Replayed database {Path(out['dst']).name}: {m['tokens']:,} tokens, "
        f"{m['segments']} segments, index {m['index']}", "",
        "| tokens | B/token | open ms | first query s | dense p50 ms | p99 ms | RSS MB | "
        "anon MB | build s |", "|---|---|---|---|---|---|---|---|---|",
        f"| {m['tokens']:,} | {m['bytes_per_token']:.0f} | {m['open_s'] * 1e3:.1f} | "
        f"{m['first_s']:.1f} | {m['latency']['p50']:.1f} | {m['latency']['p99']:.1f} | "
        f"{m['rss']['VmRSS']:.0f} | {m['rss']['RssAnon']:.0f} | "
        f"{b.get('build_s', float('nan')):.0f} |", "",
        "Median ms per operator: " + ", ".join(f"{k} {v:.1f}" for k, v in
                                               sorted(m["stages"].items(), key=lambda x: -x[1])),
        "", f"k={out['k']}, {out['queries']} cloze queries, measured in a fresh process "
        f"(RSS after the queries; the LMDB file and IVF lists are memory-mapped). " + (
            f"Built as {b['note']}." if "note" in b else
            f"Built from {b.get('src', '?')} by {b.get('copies', '?')} copies "
            f"({b.get('segment_copies', 1)} a segment), noise {b.get('noise', '?')}."),
        ""])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.replay",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", type=Path, required=True)
    ap.add_argument("--dst", type=Path, required=True)
    ap.add_argument("--tokens", type=int, default=10_000_000)
    ap.add_argument("--index", default="ivf")
    ap.add_argument("--codec", default="float16")
    ap.add_argument("--noise", type=float, default=0.05)
    ap.add_argument("--segment-copies", type=int, default=1,
                    help="copies of each source segment written into one new segment")
    ap.add_argument("--lists", type=int, default=None,
                    help="the IVF template's coarse lists (default: the first segment's "
                         "choice); e.g. 8192 for 100M tokens, what optimize() retrains to")
    ap.add_argument("--data", type=Path, default=DEV_DATA,
                    help="the data whose cloze.jsonl queries are measured (default: the dev "
                         "corpus beside the checkout, ../shared/data/dev, as the committed "
                         "results; checked before anything is built)")
    ap.add_argument("--queries", type=int, default=100)
    ap.add_argument("-k", type=int, default=1024)
    ap.add_argument("--measure-only", action="store_true")
    ap.add_argument("--merge", action="store_true",
                    help="copy --src and merge its segments into one with optimize() (--dst "
                         "the same as --src: in place)")
    ap.add_argument("--retrain", choices=("auto", "yes", "no"), default="auto",
                    help="--merge: optimize()'s retrain of the IVF template (auto: when "
                         "the corpus has outgrown its lists)")
    a = ap.parse_args(argv)
    require_data(a.data, error=ap.error)  # before the build: it is read only after it
    out: dict = {"dst": str(a.dst), "k": a.k, "queries": a.queries, "data": str(a.data)}
    if a.merge:
        out["build"] = merge(a.src, a.dst, log=lambda m: print(m, file=sys.stderr, flush=True),
                             retrain={"auto": None, "yes": True, "no": False}[a.retrain])
    elif not a.measure_only:
        out["build"] = replay(a.src, a.dst, a.tokens, a.index, a.codec, a.noise,
                              log=lambda m: print(m, file=sys.stderr, flush=True),
                              segment_copies=a.segment_copies, lists=a.lists)
    else:  # keep how the database was built, from the run that built it
        prev = RESULTS / f"replay-{a.dst.name}.json"
        if prev.exists():
            out["build"] = json.loads(prev.read_text()).get("build", {})
    out["measured"] = measure(a.dst, a.data, a.k, a.queries)
    in_place = a.merge and a.src.resolve() == a.dst.resolve()  # keep the as-written record
    return publish(f"replay-{a.dst.name}" + ("-optimized" if in_place else ""), out, render)


if __name__ == "__main__":
    raise SystemExit(main())
