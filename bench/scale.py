"""Scale: ingest tokens/s local vs Ray (1 and 2 workers), per-token costs, GPU vs CPU.

    python -m bench.scale                       # dev-small, first 1,500 documents
    python -m bench.scale --docs 3000 --workers 1 2 --no-gpu

Measures, on the same documents (spread evenly over the corpus) and the default encoder
(all-MiniLM-L6-v2):

* ``db.add`` end to end: local, and ``engine=RayEngine(workers=w)`` on a local Ray cluster
  (cluster start reported apart; actor start-up and model loading are inside the Ray
  numbers, as a user sees them);
* each ingest stage alone (tokenise+flag+cut, encode, LMDB writes, BM25, dense index),
  as CPU seconds per token, with the bytes each stage leaves on disk per token, and the
  dense search time per segment and side -- the inputs of the billion-token plan in
  docs/SCALE.md;
* where CUDA is present: encoding tokens/s on the GPU against the CPU, and dense search
  (k = 1,024) on the GPU (FAISS ``GpuIndexFlatIP``) against hnswlib on the CPU, on the
  same data, with the machine named.

Wall-clock numbers on a shared machine are noisy: the load average before and after each
run is recorded, and CPU seconds (less sensitive to other tenants) are reported beside them.
Results: bench/results/scale.json and scale.md.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import resource
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from .common import SMALL_DATA, load_jsonl, machine, require_data, write_result


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _lmdb_used(db) -> int:
    """Bytes of LMDB pages in use (the data file may be larger: it grows in steps)."""
    info = db.env.env.info()
    return int((info["last_pgno"] + 1) * db.env.env.stat()["psize"])


def ingest_local(docs: list[dict], work: Path) -> dict:
    import npmdb

    path = work / "local"
    with npmdb.open(path, progress=False) as db:
        db.encoder_for(0)  # model load is not ingest
        load0, t0, c0 = _load(), time.perf_counter(), time.process_time()
        db.add(docs)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        st = db.stats()
    shutil.rmtree(path, ignore_errors=True)
    return {"engine": "local", "tokens": st["tokens"], "wall_s": wall, "tok_s": st["tokens"] / wall,
            "cpu_s": cpu, "load": [load0, _load()]}


def ingest_ray(docs: list[dict], work: Path, workers: int, cpus_per_worker: float,
               seed: list[dict] | None = None, worker_coding: bool = True) -> dict:
    """A Ray add of ``docs``. With ``seed``: into an ivf + int4 database whose template a
    local add of ``seed`` trained first (not timed), the IVF coded by the workers or, with
    ``worker_coding=False``, by the driver."""
    import npmdb
    from npmdb.distributed import RayEngine
    from npmdb.ingest import ray as ray_ingest

    path = work / f"ray{workers}"
    eng = RayEngine(workers=workers, cpus_per_worker=cpus_per_worker)
    kw = {} if seed is None else {"index": "ivf", "codec": "int4"}
    saved = ray_ingest._worker_index
    if not worker_coding:
        ray_ingest._worker_index = lambda writer, gen: None
    try:
        with npmdb.open(path, progress=False, **kw) as db:
            if seed is not None:
                db.add(seed)
            tokens0 = db.stats()["tokens"] if seed is not None else 0
            db.encoder_for(0)  # the driver's copy (for the encoder's path); not ingest
            load0, t0, c0 = _load(), time.perf_counter(), time.process_time()
            db.add(docs, engine=eng)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            st = db.stats()
            st["tokens"] -= tokens0
    finally:
        ray_ingest._worker_index = saved
    shutil.rmtree(path, ignore_errors=True)
    rep = dict(eng.report)
    name = f"ray x{workers}" + ("" if seed is None else
                                " ivf coded by " + ("workers" if worker_coding else "driver"))
    return {"engine": name, "workers": workers, "cpus_per_worker": cpus_per_worker,
            "indexed_by_workers": rep.get("pieces_indexed_by_workers", 0),
            "tokens": st["tokens"], "wall_s": wall, "tok_s": st["tokens"] / wall,
            "driver_cpu_s": cpu, "worker_cpu_s": rep.get("worker_cpu_s"),
            "worker_encode_wall_s": rep.get("worker_wall_s"), "pieces": rep.get("pieces"),
            "first_result_s": rep.get("first_result_s"),
            # steady-state encoding rate of the pool: tokens / encode seconds per actor
            "pool_encode_tok_s": (st["tokens"] / (rep["worker_wall_s"] / rep["actors"])
                                  if rep.get("worker_wall_s") else None),
            "actors": rep.get("actors"), "devices": rep.get("devices"),
            "load": [load0, _load()]}


def stages(docs: list[dict], work: Path, queries: list[str]) -> dict:
    """Each ingest stage alone, in CPU seconds per token and bytes per token."""
    import npmdb
    from npmdb.boundaries import VALID_END, VALID_START
    from npmdb.corpus import Document
    from npmdb.ingest import prepare
    from npmdb.ingest.local import encode_into
    from npmdb.storage.bm25 import build_bm25
    from npmdb.storage.dense import build_dense, load_dense
    from npmdb.storage.segment_writer import SegmentWriter, no_bar
    from npmdb.storage import codec as C

    path = work / "stages"
    out: dict[str, Any] = {}
    with npmdb.open(path, progress=False) as db:
        enc = db.encoder_for(0)
        items = [Document(d.get("id") or str(i), d.get("title", ""), d["text"], {})
                 for i, d in enumerate(docs)]
        c0 = time.process_time()
        prep = prepare(enc, items, 256, progress=False)
        n = len(prep.tokens)
        out["tokens"] = n
        out["chars_per_token"] = sum(len(d.text) for d in items) / n
        out["prepare_cpu_us_per_token"] = (time.process_time() - c0) / n * 1e6
        blocks = [prep.block(b) for b in range(prep.n_blocks)]
        c0, t0 = time.process_time(), time.perf_counter()
        for i in range(0, len(blocks), 256):
            enc.encode_blocks(blocks[i:i + 256])
        out["encode_cpu_us_per_token"] = (time.process_time() - c0) / n * 1e6
        out["encode_wall_us_per_token"] = (time.perf_counter() - t0) / n * 1e6
        lm0 = _lmdb_used(db)
        t0 = time.perf_counter()
        sw = SegmentWriter(db.env, db.path, 1, 0, codec=C.resolve_codec(db.config["codec"], 0, 1),
                           dense=db.config["dense"], params=db.dense_params, dim=enc.hidden_size)
        sw.add_documents(prep.docs, prep.columns())
        encode_into(sw, enc, prep.tokens, prep.block_ptr, no_bar(n, "", ""))
        sides = sw.index_vectors()
        starts_ends = (*sides["start"], *sides["end"])
        out["encode_and_store_wall_us_per_token"] = (time.perf_counter() - t0) / n * 1e6
        out["vector_bytes_per_token"] = _lmdb_used(db) - lm0
        out["vector_bytes_per_token"] /= n
        out["valid_start_fraction"] = float(np.mean((prep.flags & VALID_START) != 0))
        out["valid_end_fraction"] = float(np.mean((prep.flags & VALID_END) != 0))
        tmp = work / "stage-index"
        tmp.mkdir(parents=True, exist_ok=True)
        c0 = time.process_time()
        build_bm25(tmp / "bm25", sw.block_docs(prep.columns()))
        out["bm25_cpu_us_per_token"] = (time.process_time() - c0) / n * 1e6
        out["bm25_bytes_per_token"] = _dir_bytes(tmp / "bm25") / n
        dense = {}
        for kind in ("hnsw", "faiss-flat"):
            c0, t0 = time.process_time(), time.perf_counter()
            size, nvec = 0, 0
            for side, (pos, vecs) in (("start", starts_ends[:2]), ("end", starts_ends[2:])):
                f = tmp / f"{side}.{kind}"
                build_dense(kind, vecs.astype(np.float32), pos.astype(np.int64), db.dense_params, f)
                size += f.stat().st_size
                nvec += len(pos)
            dense[kind] = {"build_cpu_us_per_vector": (time.process_time() - c0) / nvec * 1e6,
                           "build_wall_us_per_vector": (time.perf_counter() - t0) / nvec * 1e6,
                           "bytes_per_vector": size / nvec, "vectors": nvec}
            idx = load_dense(kind, tmp / f"start.{kind}", enc.hidden_size, db.dense_params)
            qv = [enc.encode_query(q).start for q in queries]
            idx.search(qv[0], 1024)
            t0 = time.perf_counter()
            for q in qv:
                idx.search(q, 1024)
            dense[kind]["search_ms_per_side_k1024"] = (time.perf_counter() - t0) / len(qv) * 1e3
            dense[kind]["segment_vectors"] = len(idx)
        out["dense"] = dense
        # documents and token columns, as stored by the local path
        lm0 = _lmdb_used(db)
        sw.store_documents(prep.columns())
        out["docs_and_columns_bytes_per_token"] = (_lmdb_used(db) - lm0) / n
    out["driver_max_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    shutil.rmtree(path, ignore_errors=True)
    return out


def gpu(docs: list[dict], queries: list[str]) -> dict | None:
    """GPU against CPU on the same data: encoding and dense search."""
    import torch

    if not torch.cuda.is_available():
        return None
    from npmdb.boundaries import VALID_START
    from npmdb.corpus import Document
    from npmdb.encoder import Encoder
    from npmdb.ingest import prepare
    from npmdb.storage.dense import GpuFlat, HnswIndex, DenseParams, faiss_gpu_available

    out: dict[str, Any] = {"gpu": torch.cuda.get_device_name(0)}
    cpu_enc, gpu_enc = Encoder(None, device="cpu"), Encoder(None, device="cuda")
    items = [Document(str(i), "", d["text"], {}) for i, d in enumerate(docs)]
    prep = prepare(cpu_enc, items, 256, progress=False)
    blocks = [prep.block(b) for b in range(prep.n_blocks)]
    n = len(prep.tokens)
    for name, enc in (("cpu", cpu_enc), ("cuda", gpu_enc)):
        enc.encode_blocks(blocks[:64])  # warm-up (CUDA context, kernels)
        if name == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        hidden = []
        for i in range(0, len(blocks), 256):
            hidden.extend(enc.encode_blocks(blocks[i:i + 256]))
        if name == "cuda":
            torch.cuda.synchronize()
        out[f"encode_tok_s_{name}"] = n / (time.perf_counter() - t0)
        if name == "cpu":
            vecs = np.concatenate(hidden).astype(np.float16).astype(np.float32)
    out["encode_speedup"] = out["encode_tok_s_cuda"] / out["encode_tok_s_cpu"]
    pos = np.flatnonzero(prep.flags & VALID_START)
    x = vecs[pos]
    qv = [cpu_enc.encode_query(q).start for q in queries]
    hnsw = HnswIndex.build(x, pos, DenseParams(), os.cpu_count() or 1)
    t0 = time.perf_counter()
    for q in qv:
        hnsw.search(q, 1024)
    out["search_ms_cpu_hnsw_k1024"] = (time.perf_counter() - t0) / len(qv) * 1e3
    out["search_vectors"] = int(len(pos))
    if faiss_gpu_available():
        g = GpuFlat(x, pos)
        g.search(qv[0], 1024)
        t0 = time.perf_counter()
        for q in qv:
            g.search(q, 1024)
        out["search_ms_gpu_flat_k1024"] = (time.perf_counter() - t0) / len(qv) * 1e3
    else:
        out["search_ms_gpu_flat_k1024"] = None
        out["note"] = "FAISS without GPU support: GPU search not measured"
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=SMALL_DATA)
    ap.add_argument("--docs", type=int, default=1500)
    ap.add_argument("--workers", type=int, nargs="*", default=[1, 2])
    ap.add_argument("--no-ray", action="store_true")
    ap.add_argument("--no-gpu", action="store_true")
    ap.add_argument("--name", default="scale")
    ap.add_argument("--ivf", action="store_true",
                    help="Ray adds into a trained ivf + int4 database, the index coded by the "
                         "workers and by the driver (only these runs)")
    args = ap.parse_args(argv)
    require_data(args.data, "corpus.jsonl.gz", "cloze.jsonl", error=ap.error)

    corpus = load_jsonl(args.data / "corpus.jsonl.gz")
    step = max(1, len(corpus) // max(1, args.docs))
    docs = corpus[::step][: args.docs]  # spread over the corpus's sources
    queries = [c["query"] for c in load_jsonl(args.data / "cloze.jsonl")[:20]]
    cores = os.cpu_count() or 1
    out: dict[str, Any] = {"machine": machine() | {"cpu_model": _cpu_model(),
                                                   "mem_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)},
                           "docs": len(docs), "runs": []}
    work = Path(tempfile.mkdtemp(prefix="npmdb-scale-"))
    try:
        out["runs"].append(ingest_local(docs, work))
        print("local", out["runs"][-1], flush=True)
        if not args.no_ray:
            import ray

            t0 = time.perf_counter()
            ray.init(num_cpus=cores, include_dashboard=False, logging_level=logging.WARNING)
            out["ray_cluster_start_s"] = time.perf_counter() - t0
            out["ray_version"] = ray.__version__
            try:
                for w in args.workers:
                    if args.ivf:  # a seed of other documents trains the template
                        seed = corpus[1::step][: max(1000, args.docs // 2)]
                        for coded in (True, False):
                            out["runs"].append(ingest_ray(docs, work, w, max(1.0, cores / w),
                                                          seed, coded))
                            print("ray", out["runs"][-1], flush=True)
                        continue
                    out["runs"].append(ingest_ray(docs, work, w, max(1.0, cores / w)))
                    print("ray", out["runs"][-1], flush=True)
            finally:
                ray.shutdown()
        if args.ivf:
            write_result(args.name, out, render(out))
            print(render(out))
            return 0
        out["stages"] = stages(docs, work, queries)
        print("stages", out["stages"], flush=True)
        out["gpu"] = None if args.no_gpu else gpu(docs, queries)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    write_result(args.name, out, render(out))
    print(render(out))
    return 0


def render(out: dict) -> str:
    m = out["machine"]
    lines = [f"# Scale benchmark ({out['docs']} documents of dev-small, all-MiniLM-L6-v2)", "",
             f"Machine: {m['cpu_model']}, {m['cpus']} cores, {m.get('mem_gb')} GB, "
             f"Python {m['python']}, {m['time']}.", ""]
    if "ray_cluster_start_s" in out:
        lines.append(f"Ray {out.get('ray_version')}: local cluster start "
                     f"{out['ray_cluster_start_s']:.1f} s (not in the numbers below).")
        lines.append("")
    lines += ["| engine | tokens | wall s | tokens/s | first result s | pool encode tokens/s "
              "| CPU s (driver / workers) | load avg before, after |",
              "|---|---:|---:|---:|---:|---:|---|---|"]
    for r in out["runs"]:
        cpu = (f"{r['cpu_s']:.1f}" if "cpu_s" in r else
               f"{r['driver_cpu_s']:.1f} / {r['worker_cpu_s']:.1f}")
        name = r["engine"] + (f" ({r['cpus_per_worker']:g} CPU each)" if "workers" in r else "")
        first = f"{r['first_result_s']:.1f}" if r.get("first_result_s") else "-"
        pool = f"{r['pool_encode_tok_s']:.0f}" if r.get("pool_encode_tok_s") else "-"
        lines.append(f"| {name} | {r['tokens']} | {r['wall_s']:.1f} | {r['tok_s']:.0f} | {first} | "
                     f"{pool} | {cpu} | {r['load'][0][0]}, {r['load'][1][0]} |")
    st = out.get("stages")
    if st:
        lines += ["", "Per-token costs (local path, each stage alone):", "",
                  f"* {st['chars_per_token']:.2f} characters/token; valid starts "
                  f"{st['valid_start_fraction']:.3f}, valid ends {st['valid_end_fraction']:.3f} of tokens",
                  f"* tokenise + flag + cut: {st['prepare_cpu_us_per_token']:.1f} CPU µs/token",
                  f"* encode: {st['encode_cpu_us_per_token']:.0f} CPU µs/token "
                  f"({st['encode_wall_us_per_token']:.0f} wall µs/token)",
                  f"* vectors in LMDB: {st['vector_bytes_per_token']:.0f} B/token; documents + "
                  f"columns: {st['docs_and_columns_bytes_per_token']:.0f} B/token",
                  f"* BM25: {st['bm25_cpu_us_per_token']:.1f} CPU µs/token, "
                  f"{st['bm25_bytes_per_token']:.1f} B/token"]
        for kind, d in st["dense"].items():
            lines.append(f"* {kind}: build {d['build_cpu_us_per_vector']:.0f} CPU µs/vector "
                         f"({d['build_wall_us_per_vector']:.0f} wall), {d['bytes_per_vector']:.0f} "
                         f"B/vector; search k=1024 {d['search_ms_per_side_k1024']:.1f} ms per "
                         f"side over {d['segment_vectors']} vectors")
        lines.append(f"* driver peak RSS {st['driver_max_rss_mb']:.0f} MB")
    g = out.get("gpu")
    lines += ["", "GPU:", ""]
    if not g:
        lines.append("* not measured: no CUDA device on this machine")
    else:
        lines.append(f"* {g['gpu']}: encode {g['encode_tok_s_cuda']:.0f} tokens/s vs CPU "
                     f"{g['encode_tok_s_cpu']:.0f} (x{g['encode_speedup']:.1f})")
        gs = g.get("search_ms_gpu_flat_k1024")
        lines.append(f"* dense search k=1024 over {g['search_vectors']} vectors: GPU flat "
                     f"{'%.2f ms' % gs if gs is not None else 'n/a'} vs CPU hnswlib "
                     f"{g['search_ms_cpu_hnsw_k1024']:.2f} ms")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
