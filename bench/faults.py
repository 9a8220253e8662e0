"""Fault injection: SIGKILL a writer at random points, then check what survives; and fuzzing.

**Crash trials.** A zygote process imports npmdb (and torch) once and forks one writer per
trial. The writer runs 1-4 changes on a shared database — ``add``, ``delete``, a
``batch`` (add + delete), ``optimize``, ``vacuum`` or a training refresh
(:func:`npmdb.generations.write_generation`) — logging ``BEGIN`` before and ``COMMIT``
after each change (fsynced). It is killed with SIGKILL either after a random delay
(``timer``) or by a fault point (``point``): the k-th call of an LMDB write transaction
(before it or right after its commit), ``os.replace``, ``fsync_dir``, an index build, a
directory removal, the checkpoint save or ``env.sync`` makes it SIGKILL itself. After
each trial the harness checks, first through a read-only open (no recovery has run) and
then through a writer open (which recovers):

* the database opens, ``db.check()`` finds no damage, and HEAD is a complete version;
* the live documents are exactly the committed ones, or the committed ones plus the
  killed change if its commit landed — nothing of the killed change is half-visible; a
  killed refresh leaves the generation and tags as they were;
* every committed document is present (``get`` returns its exact text) and queryable
  (BM25 finds a sample by its unique word; dense and AS OF queries answer);
* after the writer open ``db.check()`` is clean: no orphaned segment, vector, index
  file, checkpoint or temporary directory; every 10th trial also vacuums and re-checks.

**Fuzzing** (``--fuzz N``): N query-language statements (grammar-aware generation,
mutations of valid statements, random text), N ``fill_mask`` option sets and N ``add``
inputs, run with hypothesis against a small database; only ``npmdb.Error`` subclasses
other than ``InternalError`` may escape, each case within a time limit, and the database
must check clean afterwards.

    python -m bench.faults [--trials 200] [--seed 7] [--fuzz 10000] [--out faults]

Results: ``bench/results/<out>.json`` and ``.md``. The test suite runs a short version
(``tests/test_reliability.py``, ``tests/test_bad_input.py``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent

OPS = ("add", "delete", "batch", "optimize", "vacuum", "refresh")
#: fault points: name -> (max k, the ops that reach it)
POINTS: dict[str, tuple[int, tuple[str, ...]]] = {
    "lmdb.write": (8, OPS),
    "lmdb.write.after": (8, OPS),
    "os.replace": (3, ("add", "batch", "optimize", "refresh")),
    "os.replace.after": (3, ("add", "batch", "optimize", "refresh")),
    "fsync_dir": (3, ("add", "batch", "optimize", "refresh")),
    "build_dense": (2, ("add", "batch", "optimize", "refresh")),
    "build_bm25": (1, ("add", "batch", "optimize")),
    "remove_dir": (3, ("add", "batch", "optimize", "vacuum", "refresh")),
    "save_checkpoint": (1, ("refresh",)),
    "sync": (2, OPS),
}
WORDS = ["river", "capital", "mountain", "Greece", "Salem", "Oregon", "currency", "yen",
         "Thessaloniki", "church", "island", "Spain", "writer", "saint", "harbour", "valley"]
QUERY = "Salem is the capital of [MASK]."


def token_of(doc_id: str) -> str:
    """A word only this document holds (BM25 finds the document by it)."""
    return "zq" + hashlib.blake2b(doc_id.encode(), digest_size=6).hexdigest()


def doc_text(doc_id: str) -> str:
    h = hashlib.blake2b(doc_id.encode(), digest_size=8).digest()
    w = [WORDS[b % len(WORDS)] for b in h[:4]]
    return (f"Document {doc_id} mentions {token_of(doc_id)}: the {w[0]} of {w[1]} is "
            f"{w[2]}, near {w[3]}.")


def make_tiny_encoder(path: Path, *, seed: int = 0, hidden: int = 32) -> Path:
    """A randomly initialised 2-layer BERT with the default encoder's tokenizer (fast)."""
    import torch
    from transformers import BertConfig, BertModel

    from npmdb.encoder import default_encoder_path

    src = default_encoder_path()
    path.mkdir(parents=True, exist_ok=True)
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json",
                 "special_tokens_map.json"):
        if (src / name).exists():
            shutil.copy(src / name, path / name)
    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=30522, hidden_size=hidden, num_hidden_layers=2,
                     num_attention_heads=2, intermediate_size=2 * hidden,
                     max_position_embeddings=512)
    BertModel(cfg).save_pretrained(path, safe_serialization=True)
    return path


# ============================================================ the writer (zygote + children)


def _install_point(name: str, k: int, note: Callable[[str], None]) -> None:
    """Make the k-th call of fault point ``name`` SIGKILL this process."""
    import npmdb.encoders
    import npmdb.generations
    from npmdb.storage import cleanup, segment_writer, segments
    from npmdb.storage import env as E

    calls = [0]

    def trip() -> None:
        calls[0] += 1
        if calls[0] == k:
            note(f"FIRE {name} {k}")
            os.kill(os.getpid(), signal.SIGKILL)

    def wrap(fn, after: bool):
        def hooked(*a, **kw):
            if not after:
                trip()
            out = fn(*a, **kw)
            if after:
                trip()
            return out
        return hooked

    targets = {
        "lmdb.write": [(E.Env, "write", False)],
        "lmdb.write.after": [(E.Env, "write", True)],
        "os.replace": [(os, "replace", False)],
        "os.replace.after": [(os, "replace", True)],
        "fsync_dir": [(segments, "fsync_dir", False), (npmdb.encoders, "fsync_dir", False)],
        "build_dense": [(segment_writer, "build_dense", True)],
        "build_bm25": [(segment_writer, "build_bm25", True)],
        "remove_dir": [(m, "remove_dir", False) for m in (segment_writer, cleanup,
                                                          npmdb.encoders)],
        "save_checkpoint": [(npmdb.generations, "save_checkpoint", True)],
        "sync": [(E.Env, "sync", False)],
    }[name]
    for obj, attr, after in targets:
        setattr(obj, attr, wrap(getattr(obj, attr), after))


def _child(db_path: str, model, seed: int, first: str, steps: int, point: str | None,
           k: int, log_path: str) -> None:
    import npmdb
    from npmdb.generations import write_generation

    rng = random.Random(seed)
    log = open(log_path, "a", buffering=1)

    def note(line: str) -> None:
        log.write(line + "\n")
        log.flush()
        os.fsync(log.fileno())

    if point:
        _install_point(point, k, note)
    with npmdb.open(db_path, progress=False) as db:
        live = sorted(d["id"] for d in db.documents())
        for step in range(steps):
            op = first if step == 0 else rng.choice(("add", "add", "delete", "batch",
                                                     "optimize", "vacuum", "refresh"))
            if op in ("delete", "batch") and len(live) < 3:
                op = "add"
            if op == "add":
                ids = [f"t{seed}-{step}-{i}" for i in range(rng.randint(3, 30))]
                note("BEGIN add " + json.dumps(ids))
                v = db.add([{"id": i, "text": doc_text(i)} for i in ids])
                live += ids
            elif op == "delete":
                gone = rng.sample(live, min(len(live) - 1, rng.randint(1, 5)))
                note("BEGIN delete " + json.dumps(gone))
                v = db.delete(gone)
                live = [x for x in live if x not in gone]
            elif op == "batch":
                ids = [f"b{seed}-{step}-{i}" for i in range(rng.randint(2, 8))]
                gone = rng.sample(live, 2)
                note("BEGIN batch " + json.dumps({"add": ids, "delete": gone}))
                with db.batch():
                    db.add([{"id": i, "text": doc_text(i)} for i in ids])
                    db.delete(gone)
                v = db.version
                live = [x for x in live if x not in gone] + ids
            elif op == "optimize":
                note("BEGIN optimize {}")
                v = db.optimize()
            elif op == "vacuum":
                keep = rng.random() < 0.7
                note("BEGIN vacuum " + json.dumps({"keep_tags": keep, "versions": [
                    x["id"] for x in db.versions()]}))
                db.vacuum(keep_tags=keep)
                v = db.version
            else:
                import torch
                tag = f"r{seed}-{step}" if rng.random() < 0.5 else None
                torch.manual_seed(seed * 10 + step)
                with torch.no_grad():
                    for p in model.parameters():
                        p.add_(torch.randn_like(p) * 0.02)
                note("BEGIN refresh " + json.dumps({"tag": tag}))
                v, g = write_generation(db, model, steps=seed, tag=tag)
                v = {"version": v, "generation": g}
            note(f"COMMIT {op} {json.dumps(v)}")


def worker_main(db_path: str, encoder: str) -> None:
    """The zygote: ``TRIAL n seed first steps point k delay_ms`` -> ``DONE n killed``."""
    import torch
    torch.set_num_threads(1)
    import transformers  # noqa: F401
    from transformers import AutoModel
    from transformers.utils import logging as hf_logging

    import npmdb  # noqa: F401
    import npmdb.database, npmdb.generations, npmdb.ingest, npmdb.maintenance  # noqa: F401,E401
    import npmdb.storage.segment_writer  # noqa: F401
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    model = AutoModel.from_pretrained(encoder, local_files_only=True)
    print("READY", flush=True)
    for line in sys.stdin:
        parts = line.split()
        if not parts or parts[0] == "QUIT":
            break
        n, seed, first, steps = int(parts[1]), int(parts[2]), parts[3], int(parts[4])
        point, k, delay_ms = (None if parts[5] == "-" else parts[5]), int(parts[6]), int(parts[7])
        log_path = parts[8]
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                _child(db_path, model, seed, first, steps, point, k, log_path)
            except BaseException as exc:  # noqa: BLE001
                sys.stderr.write(f"child error: {type(exc).__name__}: {exc}\n")
                traceback.print_exc()
                code = 1
            os._exit(code)
        deadline = time.monotonic() + delay_ms / 1000.0 if delay_ms > 0 else None
        killed, status = 0, 0
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if deadline is not None and time.monotonic() >= deadline:
                os.kill(pid, signal.SIGKILL)
                _, status = os.waitpid(pid, 0)
                break
            time.sleep(0.002)
        if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL:
            killed = 1
        code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -1
        print(f"DONE {n} {killed} {code}", flush=True)


# ============================================================ the checks after each trial


@dataclass
class State:
    """What has been committed, as the harness knows it."""

    live: set[str]
    generation: int = 0
    tags: set[str] = field(default_factory=set)
    version: int = 0


def _parse(path: Path) -> tuple[list[tuple[str, Any, Any]], tuple[str, Any] | None, str | None]:
    """Committed changes (op, arg, result), the in-flight change, the fired point."""
    done, inflight, fired = [], None, None
    if not path.exists():
        return done, inflight, fired
    for line in path.read_text().splitlines():
        kind, rest = line.split(" ", 1)
        if kind == "BEGIN":
            op, arg = rest.split(" ", 1)
            inflight = (op, json.loads(arg))
        elif kind == "COMMIT":
            op, res = rest.split(" ", 1)
            done.append((inflight[0], inflight[1], json.loads(res)))
            inflight = None
        elif kind == "FIRE":
            fired = rest
    return done, inflight, fired


def _apply_live(live: set[str], op: str, arg: Any) -> set[str]:
    if op == "add":
        return live | set(arg)
    if op == "delete":
        return live - set(arg)
    if op == "batch":
        return (live | set(arg["add"])) - set(arg["delete"])
    return live


class TrialFailure(AssertionError):
    pass


def _ensure(cond: bool, msg: str) -> None:
    if not cond:
        raise TrialFailure(msg)


def _verify(db_path: Path, st: State, done, inflight, rng: random.Random, *, vacuum: bool
            ) -> dict[str, Any]:
    """Check the database after a trial; update ``st`` to what it now holds."""
    import npmdb

    last = st.version  # HEAD after the last change the log shows committed
    for op, arg, res in done:
        st.live = _apply_live(st.live, op, arg)
        if isinstance(res, dict):
            last = res["version"]
            st.generation = res["generation"]
            if arg.get("tag"):
                st.tags.add(arg["tag"])
        elif isinstance(res, int):
            last = res
    info: dict[str, Any] = {"landed": None}
    # 1. a reader's view before any recovery: complete, consistent, no damage
    with npmdb.open(db_path, readonly=True, progress=False) as db:
        rep = db.check(deep=True)
        _ensure(rep.ok, "before recovery: " + "; ".join(map(str, rep.errors[:3])))
        live_ro = {d["id"] for d in db.documents()}
    # 2. a writer's open: recovery, then everything must be clean
    with npmdb.open(db_path, progress=False) as db:
        rep = db.check(deep=True)
        _ensure(rep.clean, "after recovery: " + "; ".join(map(str, rep.problems[:3])))
        live = {d["id"] for d in db.documents()}
        _ensure(live == live_ro, "recovery changed the live documents")
        _ensure(db.count() == len(live), f"count {db.count()} != {len(live)} live documents")
        head = db.version
        gen = db.stats()["generation"]
        tags = {t for v in db.versions() for t in v["tags"]}
        if inflight is not None:
            op, arg = inflight
            landed = head != last
            if op == "vacuum":  # no new version: it landed if it dropped versions
                landed = {x["id"] for x in db.versions()} != set(arg["versions"])
            info["landed"] = landed
            if op in ("add", "delete", "batch"):
                want = _apply_live(st.live, op, arg) if landed else st.live
                _ensure(live == want, f"torn {op} (commit {'landed' if landed else 'lost'}): "
                                      f"{sorted(live ^ want)[:5]} differ")
                st.live = want
            elif op == "refresh":
                _ensure((gen > st.generation) == landed,
                        f"generation {gen} (was {st.generation}) after a killed refresh whose "
                        f"commit {'landed' if landed else 'did not land'}")
                if arg.get("tag"):
                    _ensure((arg["tag"] in tags) == landed,
                            f"tag {arg['tag']!r} {'missing' if landed else 'visible'} after a "
                            f"killed refresh whose commit {'landed' if landed else 'did not'}")
                if landed:
                    st.generation = gen
                    if arg.get("tag"):
                        st.tags.add(arg["tag"])
            elif op == "vacuum":
                _ensure(head == last, "a vacuum moved HEAD")
        else:
            _ensure(head == last, f"HEAD is version {head}, the log says {last}")
        _ensure(live == st.live, f"live documents differ from the committed state: "
                                 f"{sorted(live ^ st.live)[:5]}")
        _ensure(gen == st.generation, f"HEAD generation {gen}, expected {st.generation}")
        if any(op == "vacuum" and not arg.get("keep_tags", True) for op, arg, _ in done) or (
                inflight is not None and inflight[0] == "vacuum"):
            st.tags &= tags  # vacuum(keep_tags=False) drops tags of the versions it removes
        _ensure(st.tags <= tags, f"committed tags missing: {sorted(st.tags - tags)}")
        # every committed document is present with its exact text, and a sample answers
        for did in sorted(live):
            got = db.get(did)
            _ensure(got is not None and got["text"] == doc_text(did), f"document {did} lost")
        for did in rng.sample(sorted(live), min(4, len(live))):
            hits = db.search(token_of(did), limit=3)
            _ensure(any(h["doc_id"] == did for h in hits), f"BM25 does not find {did}")
        if live:
            res = db.fill_mask(QUERY, retrieval="bm25", top=3)
            _ensure(res.version == head, "a query answered from another version")
            res = db.fill_mask(QUERY, top=3, k=64, retrieval="dense")
            _ensure(res.generation == gen, "a dense query used another generation")
            for t in rng.sample(sorted(tags), min(1, len(tags))):
                db.fill_mask(QUERY, top=3, k=64, version=t, retrieval="dense")
        if vacuum:
            db.vacuum()
            rep = db.check(deep=True)
            _ensure(rep.clean, "after vacuum: " + "; ".join(map(str, rep.problems[:3])))
            st.tags &= {t for v in db.versions() for t in v["tags"]}
        st.version = head or 0
    return info


def run_faults(trials: int, *, seed: int = 7, workdir: Path | None = None,
               encoder: Path | None = None, point_share: float = 0.5, vacuum_every: int = 10,
               max_steps: int = 4, max_delay_ms: int = 1500, log: Callable[[str], None] = print,
               stop_after_failures: int = 5, schedule: list[dict] | None = None
               ) -> dict[str, Any]:
    """Run ``trials`` crash trials; returns counts and failures (see the module doc).

    ``schedule``: explicit trials instead of random ones, each a dict with ``op`` and
    either ``point`` and ``k`` or ``delay_ms`` (and optionally ``steps``)."""
    if schedule is not None:
        trials = len(schedule)
    import npmdb

    own = workdir is None
    workdir = Path(workdir or tempfile.mkdtemp(prefix="npmdb-faults-"))
    workdir.mkdir(parents=True, exist_ok=True)
    if encoder is None:
        encoder = workdir / "encoder"
        if not (encoder / "config.json").exists():
            make_tiny_encoder(encoder)
    db_path = workdir / "db"
    shutil.rmtree(db_path, ignore_errors=True)
    seed_ids = [f"seed-{i}" for i in range(24)]
    with npmdb.open(db_path, encoder=encoder, progress=False) as db:
        db.add([{"id": i, "text": doc_text(i)} for i in seed_ids])
        st = State(set(seed_ids), 0, set(), db.version)
    rng = random.Random(seed)
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "bench.faults", "--worker", str(db_path),
                             str(encoder)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=env, cwd=str(ROOT))
    counts: dict[str, Any] = {
        "trials": 0, "killed": 0, "killed_mid_change": 0, "killed_outside_change": 0,
        "completed": 0, "child_errors": 0, "landed": 0, "rolled_back": 0, "failures": 0,
        "by_op": {op: {"trials": 0, "killed_mid_change": 0, "landed": 0, "rolled_back": 0}
                  for op in OPS},
        "by_point": {}, "by_mode": {"timer": 0, "point": 0}, "vacuums": 0,
    }
    failures: list[dict[str, Any]] = []
    t0 = time.time()
    try:
        line = proc.stdout.readline().strip()
        if line != "READY":
            raise RuntimeError(f"fault worker did not start: {line!r}")
        for n in range(trials):
            first = OPS[n % len(OPS)]
            steps = rng.randint(1, max_steps)
            mode = "point" if rng.random() < point_share else "timer"
            point, k, delay = "-", 0, 0
            if schedule is not None:
                sch = schedule[n]
                first, steps = sch["op"], sch.get("steps", 1)
                point, k = sch.get("point") or "-", sch.get("k", 1)
                delay = sch.get("delay_ms", 0)
                mode = "timer" if point == "-" else "point"
            elif mode == "point":
                names = [p for p, (_, ops) in POINTS.items() if first in ops]
                point = rng.choice(names)
                k = rng.randint(1, POINTS[point][0])
            else:
                delay = rng.randint(5, max_delay_ms)
            trial_log = workdir / f"trial-{n}.log"
            trial_log.unlink(missing_ok=True)
            proc.stdin.write(f"TRIAL {n} {seed * 100000 + n} {first} {steps} {point} {k} "
                             f"{delay} {trial_log}\n")
            proc.stdin.flush()
            parts = proc.stdout.readline().split()
            if parts[:2] != ["DONE", str(n)]:
                raise RuntimeError(f"fault worker answered {parts!r}")
            killed, code = int(parts[2]), int(parts[3])
            done, inflight, fired = _parse(trial_log)
            counts["trials"] += 1
            counts["by_mode"][mode] += 1
            counts["by_op"][first]["trials"] += 1
            if mode == "point":
                bp = counts["by_point"].setdefault(point, {"trials": 0, "fired": 0})
                bp["trials"] += 1
                bp["fired"] += int(fired is not None)
            if killed:
                counts["killed"] += 1
                counts["killed_mid_change" if inflight else "killed_outside_change"] += 1
            elif code != 0:
                counts["child_errors"] += 1
            else:
                counts["completed"] += 1
            try:
                info = _verify(db_path, st, done, inflight, rng,
                               vacuum=vacuum_every > 0 and (n + 1) % vacuum_every == 0)
                if vacuum_every > 0 and (n + 1) % vacuum_every == 0:
                    counts["vacuums"] += 1
                if killed and inflight:
                    op = inflight[0]
                    counts["by_op"][op]["killed_mid_change"] += 1
                    if info["landed"]:
                        counts["landed"] += 1
                        counts["by_op"][op]["landed"] += 1
                    else:
                        counts["rolled_back"] += 1
                        counts["by_op"][op]["rolled_back"] += 1
                if not killed and code != 0:
                    raise TrialFailure(f"the writer failed without being killed (exit {code})")
            except Exception as exc:  # noqa: BLE001 - a failed trial is a result
                counts["failures"] += 1
                failures.append({"trial": n, "op": first, "mode": mode, "point": point, "k": k,
                                 "delay_ms": delay, "inflight": inflight and inflight[0],
                                 "error": f"{type(exc).__name__}: {exc}"})
                log(f"trial {n}: FAILED {failures[-1]}")
                # adopt what is there, so later trials test from a known state
                with npmdb.open(db_path, progress=False) as db:
                    st.live = {d["id"] for d in db.documents()}
                    st.generation = db.stats()["generation"]
                    st.tags = {t for v in db.versions() for t in v["tags"]}
                    st.version = db.version or 0
                if len(failures) >= stop_after_failures:
                    break
            if (n + 1) % 10 == 0:
                log(f"{n + 1}/{trials} trials, {counts['killed_mid_change']} killed mid-change, "
                    f"{counts['failures']} failures, {time.time() - t0:.0f} s")
    finally:
        try:
            proc.stdin.write("QUIT\n")
            proc.stdin.flush()
        except OSError:
            pass
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    with npmdb.open(db_path, progress=False) as db:
        final = {"docs": db.count(), "versions": len(db.versions()),
                 "segments": db.stats()["segments"], "generation": db.stats()["generation"]}
    counts["seconds"] = round(time.time() - t0, 1)
    if own:
        shutil.rmtree(workdir, ignore_errors=True)
    return {"counts": counts, "failures": failures, "final": final}


# ============================================================ fuzzing


def fuzz_db(path: Path, encoder: Path):
    """A small database for fuzzing: 60 documents, two versions, a tag."""
    import npmdb

    db = npmdb.open(path, encoder=encoder, progress=False)
    if db.count() == 0:
        ids = [f"f{i}" for i in range(60)]
        db.add([{"id": i, "title": f"Title {i}", "text": doc_text(i),
                 "meta": {"n": n, "year": 1990 + n % 30}} for n, i in enumerate(ids[:40])])
        db.tag("v1")
        db.add([{"id": i, "text": doc_text(i)} for i in ids[40:]])
    return db


def query_strategies():
    """Hypothesis strategies: (statement, params) pairs for ``db.sql``."""
    from hypothesis import strategies as st

    mask_q = st.sampled_from([
        "Salem is the capital of [MASK].", "The [MASK] of Greece.", "<mask> is a river.",
        "x [MASK]", "[MASK]", "no mask here", "two [MASK] [MASK]", "", "\x00 [MASK] \x00",
        "Москва [MASK] 東京", "it's [MASK]", "\ud800 [MASK]"])
    ident = st.sampled_from(["phrase", "score", "support", "label", "tokens", "doc_id", "title",
                             "snippet", "id", "text", "start", "end", "rank", "version",
                             "doc.meta.year", "doc.title", "n_tokens", "bogus", "\"order\"", "*"])
    value = st.one_of(
        st.integers(-3, 5000).map(str), st.floats(allow_nan=False, allow_infinity=False,
                                                  width=32).map(lambda f: repr(float(f))),
        st.sampled_from(["TRUE", "FALSE", "NULL", "'x'", "'bm25'", "phrase", "token", "?",
                         ":p", "1e309", "99999999999999999999", "-0", ".5", "1.", "'%'"]))
    options = st.lists(st.tuples(st.sampled_from(
        ["max_len", "tau", "alpha", "top", "k", "mode", "scoring", "group_by", "clean_edges",
         "no_stopwords", "evidence", "exact", "blocks", "bogus", "retrieval"]), value),
        max_size=4)
    using = st.one_of(st.just(""), st.builds(
        lambda m, args: f" USING {m}(" + ", ".join(f"{a} => {v}" for a, v in args) + ")",
        st.sampled_from(["dense", "bm25", "hybrid", "exact", "nope"]),
        st.lists(st.tuples(st.sampled_from(["k", "blocks", "n", "x"]), value), max_size=3)))
    where = st.one_of(st.just(""), st.builds(
        lambda a, op, b: f" WHERE {a} {op} {b}", ident,
        st.sampled_from(["=", "!=", "<", ">=", "LIKE", "NOT LIKE", "IS", "IS NOT", "IN", "AND",
                         "BETWEEN"]), value))
    source = st.one_of(
        st.builds(lambda f, q: f"{f}('{q.replace(chr(39), chr(39) * 2)}')",
                  st.sampled_from(["MASKED", "TOKENS", "EVIDENCE", "SEARCH"]), mask_q),
        st.builds(lambda q: f"CLASSIFY('{q}', LABELS(pos = ('great', 'good'), neg = 'bad'))",
                  mask_q.map(lambda q: q.replace("'", "''"))),
        st.just("DOCUMENTS"), st.just("DOCUMENTS()"), st.just("MASKED(?)"),
        st.just("MASKED(:q)"), st.just("CLASSIFY(?, ?)"), st.just("NOWHERE('x')"))
    select = st.builds(
        lambda cols, src, asof, use, opts, wh, order, limit, offset: (
            f"SELECT {', '.join(cols)} FROM {src}{asof}{use}"
            + (" WITH " + ", ".join(f"{a} = {v}" for a, v in opts) if opts else "")
            + wh + order + limit + offset),
        st.lists(ident, min_size=1, max_size=4), source,
        st.sampled_from(["", " AS OF 'v1'", " AS OF 1", " AS OF 'nope'", " AS OF 999",
                         " AS OF ?", " AS OF 'HEAD'"]),
        using, options, where,
        st.sampled_from(["", " ORDER BY score DESC", " ORDER BY phrase", " ORDER BY 1",
                         " ORDER BY nothing ASC"]),
        st.sampled_from(["", " LIMIT 3", " LIMIT 0", " LIMIT ?", " LIMIT -1",
                         " LIMIT 99999999999999999999"]),
        st.sampled_from(["", " OFFSET 1", " OFFSET ?"]))
    statement = st.one_of(
        select, select.map(lambda s: "EXPLAIN " + s), select.map(lambda s: "EXPLAIN ANALYZE " + s),
        st.sampled_from(["SHOW VERSIONS", "SHOW TAGS", "SHOW NOTHING"]))

    def mutate(s: str, data) -> str:
        ops = data.draw(st.lists(st.tuples(st.integers(0, max(len(s), 1)),
                                           st.sampled_from(["del", "ins", "dup"]),
                                           st.sampled_from(list("'\"(),;=?:*-./\\\x00 éX1\n"))),
                                 max_size=3))
        for at, how, ch in ops:
            at = min(at, len(s))
            if how == "del":
                s = s[:at] + s[at + 1:]
            elif how == "ins":
                s = s[:at] + ch + s[at:]
            else:
                s = s[:at] + s[at:at + 8] + s[at:]
        return s

    param = st.one_of(st.none(), st.booleans(), st.integers(-2 ** 70, 2 ** 70),
                      st.floats(), st.text(max_size=20), mask_q,
                      st.lists(st.text(max_size=5), max_size=3),
                      st.dictionaries(st.text(max_size=5), st.lists(st.text(max_size=5),
                                                                    max_size=2), max_size=2),
                      st.binary(max_size=4))
    params = st.one_of(st.none(), st.lists(param, max_size=3),
                       st.dictionaries(st.sampled_from(["q", "p", "x"]), param, max_size=3),
                       st.integers(), st.text(max_size=3))

    # statements that should run: valid columns for the source, sane options
    cols = {"MASKED": ["phrase", "score", "support", "tokens", "length", "doc_id", "title",
                       "start", "end", "snippet", "version", "generation"],
            "TOKENS": ["phrase", "score", "support", "tokens", "doc_id"],
            "EVIDENCE": ["phrase", "score", "doc_id", "title", "start", "end", "snippet"],
            "SEARCH": ["doc_id", "title", "snippet", "score", "start", "end", "text"],
            "DOCUMENTS": ["id", "title", "text", "meta"],
            "CLASSIFY": ["label", "score"]}
    good_q = st.sampled_from(["Salem is the capital of [MASK].", "The [MASK] of Greece.",
                              "<mask> is a river.", "Москва [MASK] 東京", "it''s [MASK]",
                              "\x00 [MASK] \x00", "[MASK]"])

    @st.composite
    def sane(draw):
        src = draw(st.sampled_from(list(cols)))
        sel = ", ".join(draw(st.lists(st.sampled_from(cols[src]), min_size=1, max_size=3,
                                      unique=True)))
        q = draw(good_q)
        frm = {"MASKED": f"MASKED('{q}')", "TOKENS": f"TOKENS('{q}')",
               "EVIDENCE": f"EVIDENCE('{q}')", "SEARCH": "SEARCH('river capital')",
               "DOCUMENTS": "DOCUMENTS",
               "CLASSIFY": f"CLASSIFY('{q}', LABELS(pos = ('great', 'good'), neg = 'bad'))"}[src]
        text = f"SELECT {sel} FROM {frm}"
        if src in ("MASKED", "TOKENS", "EVIDENCE", "CLASSIFY"):
            text += draw(st.sampled_from(["", " AS OF 'v1'", " AS OF 1", " AS OF 'HEAD'"]))
            text += draw(st.sampled_from(["", " USING bm25(blocks => 2)", " USING dense(k => 64)",
                                          " USING hybrid(k => 32, blocks => 1)",
                                          " USING exact(k => 16)"]))
            opts = draw(st.lists(st.sampled_from(["max_len = 5", "tau = 0.5", "alpha = 0.5",
                                                  "clean_edges = FALSE", "no_stopwords = TRUE",
                                                  "evidence = 2", "scoring = 'raw'"]),
                                 max_size=3, unique=True))
            if src == "CLASSIFY":
                opts = [o for o in opts if o.startswith("tau")]
            elif src == "TOKENS":  # token mode takes no phrase options (SQL refuses them)
                opts = [o for o in opts if o.split(" =")[0] not in
                        ("max_len", "clean_edges", "no_stopwords", "scoring")]
            if opts:
                text += " WITH " + ", ".join(opts)
        col = cols[src][0]
        text += draw(st.sampled_from(["", f" WHERE {col} IS NOT NULL",
                                      f" WHERE length({col}) <= 12" if src != "DOCUMENTS"
                                      else " WHERE title LIKE 'T%'"]))
        text += draw(st.sampled_from(["", f" ORDER BY {col} DESC", " ORDER BY score"]))
        text += draw(st.sampled_from(["", " LIMIT 3", " LIMIT 0", " LIMIT 3 OFFSET 1"]))
        return draw(st.sampled_from(["", "EXPLAIN ", "EXPLAIN ANALYZE "])) + text

    @st.composite
    def case(draw):
        kind = draw(st.sampled_from(["sane", "sane", "generated", "generated", "mutated",
                                     "random"]))
        if kind == "random":
            text = draw(st.text(max_size=120))
        elif kind == "sane":
            return draw(sane()), None
        else:
            text = draw(statement)
            if kind == "mutated":
                text = mutate(text, draw(st.data()))
        return text, draw(params)

    return case()


def option_strategies():
    """Hypothesis strategies: (query, kwargs) for ``fill_mask``: valid values half the time,
    anything the other half."""
    from hypothesis import strategies as st

    anyv = st.one_of(st.none(), st.booleans(), st.integers(-5, 10 ** 6), st.integers(),
                     st.floats(), st.text(max_size=8), st.lists(st.integers(), max_size=2),
                     st.sampled_from(["phrase", "token", "dense", "bm25", "hybrid", "npm", "raw",
                                      "word", "document", "v1", "HEAD"]))
    good = {"top": st.integers(0, 50), "k": st.integers(1, 5000),
            "mode": st.sampled_from(["phrase", "token"]),
            "retrieval": st.sampled_from(["dense", "bm25", "hybrid"]),
            "blocks": st.integers(1, 100), "max_len": st.integers(1, 64),
            "tau": st.floats(0.01, 100), "alpha": st.floats(-2, 2),
            "exact": st.booleans(), "scoring": st.sampled_from(["npm", "raw"]),
            "group_by": st.sampled_from(["phrase", "tokens", "document", "word"]),
            "clean_edges": st.booleans(), "no_stopwords": st.booleans(),
            "evidence": st.integers(0, 20), "offset": st.integers(0, 20),
            "version": st.sampled_from([None, 1, 2, "v1", "HEAD", 999, "nope", -1])}
    keys = st.sampled_from([*good, "bogus"])
    pair = keys.flatmap(lambda k: st.tuples(st.just(k), st.one_of(good.get(k, anyv), anyv)
                                            if k in good else anyv))
    valid = st.sampled_from(list(good)).flatmap(lambda k: st.tuples(st.just(k), good[k]))
    kwargs = st.one_of(st.lists(valid, max_size=4).map(dict),
                       st.lists(pair, max_size=4).map(dict))
    query = st.one_of(st.sampled_from(["Salem is the capital of [MASK].", "[MASK]",
                                       "a <mask> b", "x [mask] y", "Москва [MASK]"]),
                      st.text(max_size=40), st.none(), st.integers(), st.binary(max_size=5))
    return st.tuples(query, kwargs)


def add_strategies():
    """Hypothesis strategies: what ``db.add`` may be given."""
    from hypothesis import strategies as st

    text = st.one_of(st.text(max_size=60), st.sampled_from(
        ["", " ", "\x00", "a\x00b", "\ud800", "Москва 東京 القاهرة 🎉", "e\u0301" * 5,
         "word " * 300, "\n\n\t", "x" * 3000]))
    scalar = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8),
                       st.binary(max_size=4))
    meta = st.one_of(st.none(), st.dictionaries(st.text(max_size=5), st.one_of(
        scalar, st.lists(scalar, max_size=3), st.dictionaries(st.text(max_size=3), scalar,
                                                             max_size=2)), max_size=3),
        scalar, st.lists(scalar, max_size=2))
    ident = st.one_of(st.none(), st.text(max_size=10), st.integers(), st.floats(),
                      st.sampled_from(["dup", "dup", "", "\x00", "\ud800", "f1"]), st.binary(max_size=3))
    doc = st.one_of(
        text, st.binary(max_size=20),
        st.fixed_dictionaries({"text": text}, optional={"id": ident, "title": st.one_of(
            text, scalar), "meta": meta, "extra": scalar}),
        st.fixed_dictionaries({}, optional={"id": ident, "body": text}),
        st.integers(), st.none(), st.lists(st.text(max_size=3), max_size=2))
    # a str source is a path: only paths that do not exist (never read "/" or the cwd)
    missing = st.sampled_from(["no/such/file.jsonl", "missing.txt", "nope.parquet", ""])
    return st.one_of(st.lists(doc, max_size=5), st.lists(doc, max_size=5), st.none(),
                     st.integers(), missing, st.binary(max_size=10),
                     st.dictionaries(st.text(max_size=3), text, max_size=2))


class Hang(Exception):
    pass


def _alarm(seconds: int):
    def handler(signum, frame):
        raise Hang(f"no answer within {seconds} s")
    signal.signal(signal.SIGALRM, handler)
    return seconds


def run_fuzz(db, cases: int, *, timeout_s: int = 20, seed: int = 0,
             log: Callable[[str], None] = print) -> dict[str, Any]:
    """``cases`` each of query-language, fill_mask-option and add inputs against ``db``.
    Returns counts per outcome and the failures (non-npmdb exceptions, InternalError,
    hangs)."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    import npmdb

    out: dict[str, Any] = {}
    failures: list[dict[str, str]] = []
    _alarm(timeout_s)

    examples: dict[str, dict[str, str]] = {}

    def run_one(kind: str, fn, shown) -> str:
        signal.alarm(timeout_s)
        try:
            fn()
            return "ok"
        except npmdb.InternalError as exc:
            failures.append({"kind": kind, "input": repr(shown)[:300],
                             "error": f"InternalError: {exc}"[:400]})
            return "InternalError"
        except npmdb.Error as exc:
            examples.setdefault(kind, {}).setdefault(
                type(exc).__name__, f"{repr(shown)[:200]} -> {str(exc)[:200]}")
            return type(exc).__name__
        except Hang as exc:
            failures.append({"kind": kind, "input": repr(shown)[:300], "error": str(exc)})
            return "hang"
        except Exception as exc:  # noqa: BLE001 - the finding
            failures.append({"kind": kind, "input": repr(shown)[:300],
                             "error": f"{type(exc).__name__}: {exc}"[:400]})
            return type(exc).__name__
        finally:
            signal.alarm(0)

    common = dict(max_examples=cases, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck), print_blob=False)
    added: dict[str, str] = {}
    for kind, strategy, call in (
            ("sql", query_strategies(), lambda c: db.sql(c[0], c[1])),
            ("fill_mask", option_strategies(), lambda c: db.fill_mask(c[0], **c[1])),
            ("add", add_strategies(), lambda c: _fuzz_add(db, c, added))):
        tally: dict[str, int] = {}
        t0 = time.time()

        @settings(**common)
        @given(strategy)
        def prop(c):
            r = run_one(kind, lambda: call(c), c)
            tally[r] = tally.get(r, 0) + 1

        prop()
        out[kind] = {"cases": sum(tally.values()), "outcomes": tally,
                     "seconds": round(time.time() - t0, 1)}
        log(f"fuzz {kind}: {out[kind]}")
    rep = db.check()
    for did, text in added.items():
        got = db.get(did)
        if got is None or got["text"] != text:
            failures.append({"kind": "add", "input": did, "error": "added text did not round-trip"})
    out["check_after"] = {"ok": rep.ok, "clean": rep.clean, "problems": [str(p) for p in
                                                                         rep.problems[:5]]}
    out["examples"] = examples
    out["failures"] = failures
    return out


def _fuzz_add(db, docs, added: dict[str, str]) -> None:
    before = db.version
    try:
        db.add(docs)
    except BaseException:
        if db.version != before:
            raise AssertionError("a failed add changed the version") from None
        raise
    if isinstance(docs, list):
        for d in docs:
            if isinstance(d, dict) and isinstance(d.get("id"), str) and isinstance(d.get("text"), str):
                added[d["id"]] = d["text"]


# ============================================================ report


def markdown(res: dict[str, Any]) -> str:
    c = res["faults"]["counts"]
    lines = ["# Fault injection", "",
             f"{c['trials']} SIGKILL trials ({c['by_mode']['timer']} after a random delay, "
             f"{c['by_mode']['point']} at fault points) in {c['seconds']} s.", "",
             "| trials | killed | killed mid-change | commit landed | rolled back | killed "
             "outside a change | finished | failures |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|",
             f"| {c['trials']} | {c['killed']} | {c['killed_mid_change']} | {c['landed']} | "
             f"{c['rolled_back']} | {c['killed_outside_change']} | {c['completed']} | "
             f"{c['failures']} |", "", "| first change | trials | killed mid-change (any change) "
             "| landed | rolled back |", "|---|---:|---:|---:|---:|"]
    for op, d in c["by_op"].items():
        lines.append(f"| {op} | {d['trials']} | {d['killed_mid_change']} | {d['landed']} | "
                     f"{d['rolled_back']} |")
    lines += ["", "| fault point | trials | fired |", "|---|---:|---:|"]
    for p, d in sorted(c["by_point"].items()):
        lines.append(f"| {p} | {d['trials']} | {d['fired']} |")
    lines += ["", f"Vacuums with a clean check afterwards: {c['vacuums']}. Final database: "
              f"{res['faults']['final']}.", ""]
    if res["faults"]["failures"]:
        lines += ["## Failures", ""] + [f"- {json.dumps(f)}" for f in res["faults"]["failures"]]
    fz = res.get("fuzz")
    if fz:
        lines += ["", "# Fuzzing", "", "| target | cases | outcomes | seconds |",
                  "|---|---:|---|---:|"]
        for kind in ("sql", "fill_mask", "add"):
            d = fz[kind]
            lines.append(f"| {kind} | {d['cases']} | {json.dumps(d['outcomes'])} | "
                         f"{d['seconds']} |")
        lines += ["", f"Failures (non-npmdb exceptions, InternalError, hangs): "
                  f"{len(fz['failures'])}. Check afterwards: {fz['check_after']}.", ""]
        lines += [f"- {json.dumps(f, ensure_ascii=False)}" for f in fz["failures"][:20]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--fuzz", type=int, default=0, help="fuzz cases per target (0: none)")
    ap.add_argument("--out", default="faults")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--worker", nargs=2, metavar=("DB", "ENCODER"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker_main(*args.worker)
        return 0
    from .common import machine, write_result

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="npmdb-faults-"))
    res: dict[str, Any] = {"machine": machine(), "seed": args.seed}
    res["faults"] = run_faults(args.trials, seed=args.seed, workdir=workdir)
    print(json.dumps(res["faults"]["counts"], indent=1))
    if args.fuzz:
        with fuzz_db(workdir / "fuzz-db", workdir / "encoder") as db:
            res["fuzz"] = run_fuzz(db, args.fuzz, seed=args.seed)
    path = write_result(args.out, res, markdown(res))
    print(f"wrote {path}")
    if not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    failed = res["faults"]["counts"]["failures"] or (res.get("fuzz") or {}).get("failures")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
