"""GPU check: what a short lease of a GPU machine should measure, in one command.

    python -m bench.gpu                 # dev-small, 1,500 documents; ~3 minutes on an H200
    python -m bench.gpu --steps 20 --docs 600

Where CUDA is present:

* encoding tokens/s on the GPU against the CPU (``bench.scale.gpu``: also dense search,
  k = 1,024, hnswlib on the CPU against FAISS's GPU flat index when FAISS has GPU support);
* training steps/s at 64 blocks a batch (``npmdb.train``, the recipe's hyperparameters),
  with the forward passes as npmdb runs them (``npmdb.encoder.forward_context``: no cuDNN
  attention) and, for comparison, with cuDNN's attention allowed (the default of torch and
  transformers on Hopper), the median of the steps after ``--warmup``.

Without CUDA the training timing runs once on the CPU (a smoke test of this script).
Results: bench/results/gpu.json and gpu.md.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from .common import SMALL_DATA, load_jsonl, machine, require_data, write_result


def _cudnn_allowed(device):
    """autocast only: SDPA picks its kernel as torch and transformers would."""
    import torch

    if device.type != "cuda":
        return contextlib.nullcontext()
    return torch.autocast("cuda", dtype=torch.bfloat16)


def train_rate(docs: list[dict], work: Path, *, steps: int, batch: int, warmup: int,
               cudnn: bool, encoder: str | None = None) -> dict[str, Any]:
    """Median seconds per training step (after ``warmup`` steps) on a fresh database."""
    import torch

    import npmdb
    import npmdb.train.rows as rows
    from npmdb.train.recipe import RECIPE, training_db_options

    path = work / f"train-{'cudnn' if cudnn else 'npmdb'}"
    cuda = torch.cuda.is_available()
    marks: list[float] = []

    def on_step(_: dict) -> None:
        if cuda:
            torch.cuda.synchronize()
        marks.append(time.perf_counter())

    saved = rows.forward_context
    if cudnn:
        rows.forward_context = _cudnn_allowed
    try:
        with npmdb.open(path, progress=False, **training_db_options(encoder)) as db:
            db.add(docs)
            hp = {k: RECIPE[k] for k in ("lr", "group_size", "span_unit", "seed")}
            t0 = time.perf_counter()
            rep = npmdb.train(db, steps=steps, batch_blocks=batch, progress=False,
                              callback=on_step, max_seconds=120, **hp)
            total = time.perf_counter() - t0
    finally:
        rows.forward_context = saved
    gaps = [b - a for a, b in zip(marks, marks[1:])][warmup:]
    return {"cudnn_attention": cudnn, "device": rep.device, "steps": rep.steps,
            "batch_blocks": batch, "median_step_s": statistics.median(gaps) if gaps else None,
            "steps_per_s": 1 / statistics.median(gaps) if gaps else None,
            "train_s": round(rep.train_seconds, 2), "with_final_refresh_s": round(total, 2)}


def main(argv: list[str] | None = None) -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=SMALL_DATA)
    ap.add_argument("--docs", type=int, default=1500)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--name", default="gpu")
    ap.add_argument("--encoder", default=None, help="default: npmdb's shipped encoder")
    args = ap.parse_args(argv)
    require_data(args.data, "corpus.jsonl.gz", "cloze.jsonl", error=ap.error)

    corpus = load_jsonl(args.data / "corpus.jsonl.gz")
    docs = corpus[:: max(1, len(corpus) // args.docs)][: args.docs]
    queries = [c["query"] for c in load_jsonl(args.data / "cloze.jsonl")[:20]]
    cuda = torch.cuda.is_available()
    out: dict[str, Any] = {"machine": machine(), "docs": len(docs), "cuda": cuda,
                           "gpu": torch.cuda.get_device_name(0) if cuda else None,
                           "torch": torch.__version__, "training": []}
    with tempfile.TemporaryDirectory(prefix="npmdb-gpu-") as tmp:
        for cudnn in ((False, True) if cuda else (False,)):
            out["training"].append(train_rate(docs, Path(tmp), steps=args.steps,
                                              batch=args.batch, warmup=args.warmup,
                                              cudnn=cudnn, encoder=args.encoder))
            print(out["training"][-1], flush=True)
    if cuda:
        from .scale import gpu

        out["encode_search"] = gpu(docs, queries)
        print(out["encode_search"], flush=True)
    write_result(args.name, out, render(out))
    print(render(out))
    return 0


def render(out: dict) -> str:
    lines = [f"## GPU check — {out['gpu'] or 'no CUDA (CPU smoke run)'}, torch {out['torch']}, "
             f"{out['docs']} documents", "",
             "| training | device | batch | steps | median s/step | steps/s |",
             "|---|---|---|---|---|---|"]
    for t in out["training"]:
        how = "cuDNN attention allowed" if t["cudnn_attention"] else "npmdb (no cuDNN attention)"
        med = "–" if t["median_step_s"] is None else f"{t['median_step_s']:.3f}"
        rate = "–" if t["steps_per_s"] is None else f"{t['steps_per_s']:.2f}"
        lines.append(f"| {how} | {t['device']} | {t['batch_blocks']} | {t['steps']} | "
                     f"{med} | {rate} |")
    es = out.get("encode_search")
    if es:
        lines += ["", f"Encoding: {es['encode_tok_s_cuda']:,.0f} tokens/s on the GPU, "
                      f"{es['encode_tok_s_cpu']:,.0f} on the CPU (×{es['encode_speedup']:.1f}). "
                      f"Dense search k=1,024 over {es['search_vectors']:,} vectors: hnswlib on "
                      f"the CPU {es['search_ms_cpu_hnsw_k1024']:.2f} ms, GPU flat "
                      + ("not measured (" + es.get("note", "") + ")"
                         if es["search_ms_gpu_flat_k1024"] is None
                         else f"{es['search_ms_gpu_flat_k1024']:.2f} ms") + "."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
