"""Answer quality: exact match on masked-span queries, per retrieval mode.

EM uses SQuAD normalisation and any gold answer; it is macro-averaged over answer lengths
1, 2, 3, 4+ words (``answer_ngram``) as in the NPM paper, and reported micro too. The
translation probe uses ``max_len=20`` (NPM's setting for entity translation). Sentiment
is closed-set classification over a review corpus (the ``sentiment_train`` texts).

    python -m bench.quality --data npmdb/data/dev-small            # builds/reuses a db
    python -m bench.quality --data ../shared/data/dev --db dev.npmdb --version train-step-400
"""

from __future__ import annotations

import argparse
import sys
import time
from functools import partial
from pathlib import Path

from npmdb.arguments import parse_assignments
from npmdb.evaluation import evaluate

from .common import SMALL_DATA, WORK, count, load_jsonl, machine, require_data, write_result

MODES = ("bm25", "dense", "hybrid")
#: The files of ``--data`` that each task reads.
TASK_FILES = {"cloze": ("cloze.jsonl",), "translation": ("translation.jsonl",),
              "sentiment": ("sentiment_train.jsonl", "sentiment_test.jsonl")}


def evaluate_cloze(db, rows: list[dict], mode: str, *, max_len: int = 10, version=None,
                   k: int = 1024, options: dict | None = None) -> dict:
    """``npmdb.evaluate`` of ``rows`` (top answer, exact match) as this report's dict."""
    ev = evaluate(db, rows, version=version, retrieval=mode, max_len=max_len, k=k,
                  progress=False, **(options or {}))
    n_len, n_rel = ev.sizes("length"), ev.sizes("relation")
    return {"mode": mode, "n": ev.n, "em_macro": ev.length_macro,
            "em_relation_macro": ev.relation_macro, "em_micro": ev.micro,
            "by_length": {b: {"n": n_len[b], "em": em} for b, em in ev.by_length.items()},
            "by_relation": {g: {"n": n_rel[g], "em": em} for g, em in ev.by_relation.items()},
            "seconds": ev.seconds}


# Sentiment verbalisers: NPM's single words, and fuzzy ones (several words per label, as
# NPM's fuzzy verbalisers for SST-2 and its kin).
VERBALIZERS = {
    "single": {"positive": ["great"], "negative": ["terrible"]},
    "fuzzy": {"positive": ["great", "good", "excellent", "wonderful", "amazing", "fantastic",
                           "brilliant", "superb", "enjoyable", "beautiful"],
              "negative": ["terrible", "bad", "awful", "horrible", "poor", "dreadful",
                           "boring", "dull", "mediocre", "disappointing"]},
}


def evaluate_sentiment(db, rows: list[dict], *, version=None, k: int | None = None,
                       retrieval: str = "dense", verbalizer: str = "single",
                       options: dict | None = None) -> dict:
    """Accuracy as NPM scores it, and with contextual calibration (what
    ``classify(calibrate=True)`` returns; the template's prior is asked once per template)."""
    from npmdb.query import calibration

    correct = abstained = correct_cal = 0
    labels = VERBALIZERS[verbalizer]
    kw = dict(retrieval=retrieval, version=version, evidence=0, **({"k": k} if k else {}),
              **(options or {}))
    priors: dict[str, object] = {}
    t0 = time.time()
    for r in rows:
        res = db.classify(r["query"], labels, **kw)
        pred = res.top.text if res.top and res.top.score > 0 else None
        abstained += pred is None   # neither label word among the k retrieved candidates
        correct += pred == r["label"]
        template = calibration.content_free(r["query"])
        if template is not None and template not in priors:
            priors[template] = db.classify(template, labels, **kw)
        cal = calibration.calibrate(res, priors[template]) if template is not None else res
        correct_cal += (cal.top.text if cal.top and pred is not None else None) == r["label"]
    n = max(len(rows), 1)
    return {"mode": retrieval, "verbalizer": verbalizer, "n": len(rows),
            "accuracy": 100.0 * correct / n,
            "accuracy_calibrated": 100.0 * correct_cal / n, "abstained": abstained,
            "seconds": time.time() - t0}


def build_db(path: Path, corpus: Path, encoder=None):
    import npmdb

    db = npmdb.open(path, encoder=encoder, progress=True)
    if db.count() == 0:
        print(f"building {path} from {corpus} …", file=sys.stderr)
        db.add(corpus)
    return db


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.quality", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=SMALL_DATA)
    ap.add_argument("--db", type=Path, default=None, help="database (built from the data's corpus if empty)")
    ap.add_argument("--sentiment-db", type=Path, default=None,
                    help="review database (built from sentiment_train texts if empty; default: "
                         "one per encoder under bench/work)")
    ap.add_argument("--encoder", default=None)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--tasks", default="cloze,translation,sentiment")
    ap.add_argument("--limit", type=partial(count, zero=True), default=0,
                    help="first N queries per task (0 = all)")
    ap.add_argument("--version", default=None, help="AS OF this version id or tag")
    ap.add_argument("--name", default=None, help="result file name (bench/results/NAME.json; a --split run appends -split-SPLIT)")
    ap.add_argument("--split", choices=("all", "held-out", "trained"), default="all",
                    help="cloze/translation queries whose support documents the shipped "
                         "encoder never trained on (held-out), or did (trained); "
                         "see npmdb.train.sources.held_out")
    ap.add_argument("--k", type=int, default=None, help="dense k (default: fill_mask's)")
    ap.add_argument("--option", action="append", default=[], metavar="NAME=VALUE",
                    help="a query option for every query (repeatable), e.g. bm25_title=true; "
                         "sentiment gets those that classify takes")
    ap.add_argument("--verbalizer", choices=sorted(VERBALIZERS), default="single",
                    help="sentiment label words: 'single' (great / terrible) or 'fuzzy'")
    args = ap.parse_args(argv)
    import npmdb

    try:
        return run(args, ap)
    except npmdb.Error as exc:  # a bad version, option or question: say so, no traceback
        ap.error(str(exc))


def run(args: argparse.Namespace, ap: argparse.ArgumentParser) -> int:
    tasks = [t for t in args.tasks.split(",") if t]
    if unknown := [t for t in tasks if t not in TASK_FILES]:
        ap.error(f"unknown task {', '.join(unknown)}: --tasks takes {','.join(TASK_FILES)}")
    require_data(args.data, *(() if args.db and args.db.exists() else ("corpus.jsonl.gz",)),
                 *(f for t in tasks for f in TASK_FILES[t]), error=ap.error)
    options = parse_options(args.option, ap)
    from dataclasses import fields as _fields

    from npmdb.query.spec import ClassifySpec
    sentiment_options = {n: v for n, v in options.items()
                         if n in {f.name for f in _fields(ClassifySpec)}}

    data = args.data
    db_path = args.db or WORK / f"{data.name}.npmdb"
    db_path.parent.mkdir(parents=True, exist_ok=True)
    modes = [m for m in args.modes.split(",") if m]
    version = int(args.version) if args.version and args.version.isdigit() else args.version
    out: dict = {"data": str(data), "db": str(db_path), "version": args.version,
                 "machine": machine(), "options": options, "verbalizer": args.verbalizer,
                 "tasks": {}}
    db = build_db(db_path, data / "corpus.jsonl.gz", args.encoder)
    with db:
        # the encoder that answers at --version (a trained generation has its own)
        with db.snapshot(version) as snap:
            gen = snap.generation
        enc = db.encoder_for(gen)
        enc_info, enc_path = enc.info, enc.path
        out["encoder"] = enc_info.name
        out["generation"] = gen
        out["stats"] = {k: v for k, v in db.stats().items() if k != "config"}
        from npmdb.train.sources import held_out

        def lim(task: str) -> list[dict]:
            rows = load_jsonl(data / f"{task}.jsonl")
            if args.split != "all":
                want = args.split == "held-out"
                rows = [r for r in rows if r.get("support_ids")
                        and all(held_out(i) for i in r["support_ids"]) == want]
            if not rows:
                where = (f"--split {args.split} (only rows with support_ids are split)"
                         if args.split != "all" else str(data / f"{task}.jsonl"))
                print(f"{task}: no queries in {where}; skipped", file=sys.stderr)
                out["empty"].append(task)
            return rows[: args.limit] if args.limit else rows
        out["split"], out["empty"] = args.split, []
        kw = {"k": args.k} if args.k else {}
        for task, max_len in (("cloze", 10), ("translation", 20)):
            if task in tasks and (rows := lim(task)):
                out["tasks"][task] = {m: evaluate_cloze(db, rows, m, max_len=max_len,
                                                        version=version, options=options, **kw)
                                      for m in modes}
    if "sentiment" in tasks and args.split != "all":  # its reviews have no split
        print("sentiment is not scored in a --split run (the reviews are not the corpus "
              "the encoder trained on or held out)", file=sys.stderr)
    elif "sentiment" in tasks:
        # Reviews are the reference corpus for sentiment (data README); they are encoded
        # with the same encoder as the evaluated version, so a trained generation is
        # judged on sentiment with its own weights.
        sdb_path = args.sentiment_db or (WORK /
                                         f"{data.name}-reviews-{enc_info.fingerprint[:12]}.npmdb")
        import npmdb
        with npmdb.open(sdb_path, encoder=enc_path, progress=True) as sdb:
            if sdb.count() == 0:
                train_rows = load_jsonl(data / "sentiment_train.jsonl")
                sdb.add([{"id": r["id"], "text": r["text"]} for r in train_rows])
            rows = load_jsonl(data / "sentiment_test.jsonl")
            rows = rows[: args.limit] if args.limit else rows
            out["tasks"]["sentiment"] = {"dense": evaluate_sentiment(
                sdb, rows, version=None, k=args.k, verbalizer=args.verbalizer,
                options=sentiment_options)}
    md = render(out)
    name = args.name or (f"quality-{data.name}" + (f"-{args.version}" if args.version else ""))
    split = f"-split-{args.split}" if args.split != "all" else ""
    if not name.endswith(split):   # a split run never overwrites the whole set's file
        name += split
    path = write_result(name, out, md)
    print(md)
    print(f"wrote {path}", file=sys.stderr)
    return 0


#: Query options a flag of this report sets, and the flag.
FLAG_OPTIONS = {"k": "--k", "version": "--version", "retrieval": "--modes"}
#: Query options the report sets itself, and why.
FIXED_OPTIONS = {"max_len": "each task sets it (10 for cloze, 20 for translation: NPM's)",
                 "evidence": "the report asks for answers without evidence"}


def parse_options(items: list[str], ap: argparse.ArgumentParser) -> dict:
    """``NAME=VALUE`` pairs as query options: true/false, integers and numbers typed."""
    try:
        options = parse_assignments(items, "--option")
    except ValueError as exc:
        ap.error(str(exc))
    for name in options:
        if name in FLAG_OPTIONS:
            ap.error(f"--option {name}=... repeats the flag {FLAG_OPTIONS[name]}: give it as "
                     "the flag")
        if name in FIXED_OPTIONS:
            ap.error(f"--option {name}=...: {FIXED_OPTIONS[name]}; drop it")
    return options


def render(out: dict) -> str:
    opts = ", ".join(f"{k}={v}" for k, v in (out.get("options") or {}).items())
    verb = out.get("verbalizer", "single")
    lines = [f"## Quality — {out['data']} (encoder {out.get('encoder')}, version "
             f"{out.get('version') or 'HEAD'}, queries: {out.get('split', 'all')}"
             + (f"; options: {opts}" if opts else "")
             + (f"; verbalizer: {verb}" if verb != "single" else "") + ")", "",
             "| task | mode | n | EM macro (1/2/3/4+) | EM micro | EM relation-macro "
             "| 1 | 2 | 3 | 4+ | s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for task in ("cloze", "translation"):
        for mode, r in out["tasks"].get(task, {}).items():
            bl = r["by_length"]
            cells = [f"{bl[b]['em']:.1f}" if b in bl else "–" for b in ("1", "2", "3", "4+")]
            rel = r.get("em_relation_macro")
            lines.append(f"| {task} | {mode} | {r['n']} | {r['em_macro']:.1f} | {r['em_micro']:.1f} | "
                         + (f"{rel:.1f}" if rel is not None else "–") + " | "
                         + " | ".join(cells) + f" | {r['seconds']:.0f} |")
    for mode, r in out["tasks"].get("sentiment", {}).items():
        cal = r.get("accuracy_calibrated")
        lines.append(f"| sentiment (accuracy; {r.get('abstained', 0)} abstained"
                     + (f"; calibrated {cal:.1f}" if cal is not None else "") + f") | {mode} | {r['n']} | "
                     f"{r['accuracy']:.1f} | | | | | | | "
                     f"{r['seconds']:.0f} |")
    lines += [f"\n{task}: no queries in this split (n = 0)" for task in out.get("empty", ())]
    for task in ("cloze", "translation"):
        runs = out["tasks"].get(task, {})
        if not runs:
            continue
        names = list(next(iter(runs.values()))["by_relation"])
        lines += ["", f"| {task}: EM by relation | " + " | ".join(names) + " |",
                  "|---|" + "---:|" * len(names)]
        for mode, r in runs.items():
            by = r["by_relation"]
            lines.append(f"| {mode} | " + " | ".join(
                f"{by[n]['em']:.1f} ({by[n]['n']})" if n in by else "–" for n in names) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
