"""npmdb.train: batches, the training loop, REALM-style refresh, resume, no pickle.

Every test trains a tiny random encoder on a *copy* of the shared tiny database.
"""

from __future__ import annotations

import copy
import dataclasses
import shutil
import threading
from pathlib import Path

import msgpack
import numpy as np
import pytest
import torch

import npmdb
from npmdb.errors import OperationalError, ProgrammingError
from npmdb.train.batches import BatchSampler, NeighbourIndex, load_blocks
from npmdb.train.masking import mask_spans
from npmdb.train.loss import phrase_loss
from npmdb.train.rows import RowEncoder as _RowEncoder
from npmdb.train.step import backward as _backward, context_loss as _context_loss
from npmdb.train.trainer import STATE_DIR, TrainReport, load_train_state

FORBIDDEN = (".pt", ".pth", ".bin", ".pkl", ".pickle", ".ckpt")


@pytest.fixture()
def db_copy(tiny_db_path, tmp_path):
    path = tmp_path / "db"
    shutil.copytree(tiny_db_path, path)
    with npmdb.open(path, progress=False) as db:
        yield db


def no_pickles(root: Path) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.suffix in FORBIDDEN]


def complete_pairs(db) -> set[tuple[int, int]]:
    return {(v["id"], v["generation"]) for v in db.versions()}


# --------------------------------------------------------------------------- batches

def test_load_blocks_and_neighbours(tiny_db):
    corpus = load_blocks(tiny_db)
    assert corpus.num_blocks >= 600 and corpus.num_docs == 600
    assert corpus.ptr[-1] == len(corpus.tokens) == len(corpus.flags)
    assert np.all(np.diff(corpus.doc) >= 0)
    index = NeighbourIndex(corpus)
    # a block's best neighbours share at least one of its (usable) words
    for b in range(0, corpus.num_blocks, 97):
        nb, score = index.neighbours([b], 5)
        assert b not in nb.tolist()
        assert np.all(np.diff(score) <= 1e-12)
        mine = set(index.words(b).tolist())
        for n in nb.tolist():
            assert mine & set(index.words(n).tolist())


def _spans(sampler, enc, n=20, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        blocks = sampler.next_batch(rng)
        assert len(blocks) == len(set(blocks)) == sampler.batch_blocks
        toks, ws, we, docs = sampler.arrays(blocks)
        mb = mask_spans(toks, ws, we, docs, mask_id=enc.mask_id, cls_id=enc.cls_id,
                        sep_id=enc.sep_id, pad_id=enc.pad_id, rng=rng)
        out.append(mb.num_spans)
    return float(np.mean(out))


def test_neighbour_grouping_masks_more_than_random(tiny_db):
    corpus = load_blocks(tiny_db)
    enc = tiny_db.encoder
    nb = _spans(BatchSampler(corpus, batch_blocks=16, grouping="neighbours"), enc)
    rnd = _spans(BatchSampler(corpus, batch_blocks=16, grouping="random"), enc)
    assert nb > 1.3 * rnd, (nb, rnd)


def _words(tokens, flags):
    from npmdb.boundaries import WORD_START
    starts = np.flatnonzero((flags & WORD_START) != 0).tolist()
    if not starts or starts[0] != 0:
        starts = [0] + starts
    ends = starts[1:] + [len(tokens)]
    return [(a, e, tuple(tokens[a:e].tolist())) for a, e in zip(starts, ends)]


def test_exclude_repeats_never_masks_a_visible_copy(tiny_db):
    corpus = load_blocks(tiny_db)
    enc = tiny_db.encoder
    sampler = BatchSampler(corpus, batch_blocks=16, seed=2)
    rng = np.random.default_rng(0)
    total = 0
    for _ in range(6):
        blocks = sampler.next_batch(rng)
        toks, ws, we, docs = sampler.arrays(blocks, exclude_repeats=True)
        mb = mask_spans(toks, ws, we, docs, mask_id=enc.mask_id, cls_id=enc.cls_id,
                        sep_id=enc.sep_id, pad_id=enc.pad_id, rng=rng,
                        boundary_positives=False)
        total += mb.num_spans
        for i in range(mb.num_spans):
            b, s0, n = int(mb.block[i]), int(mb.span_start[i]), int(mb.span_len[i])
            words = _words(toks[b], corpus.block_flags(blocks[b]))
            counts: dict = {}
            for _, _, w in words:
                counts[w] = counts.get(w, 0) + 1
            first = next(w for a, e, w in words if a <= s0 < e)
            last = next(w for a, e, w in words if a <= s0 + n - 1 < e)
            assert counts[first] == 1 and counts[last] == 1
            assert mb.positives(i)  # still has positives in other blocks
    assert total > 0


def test_sampler_state_round_trip(tiny_db):
    corpus = load_blocks(tiny_db)
    a = BatchSampler(corpus, batch_blocks=8, seed=3)
    for i in range(5):
        a.next_batch(np.random.default_rng(i))
    b = BatchSampler(corpus, batch_blocks=8, seed=0)
    b.load_state(a.state())
    for i in range(5, 9):
        assert a.next_batch(np.random.default_rng(i)) == b.next_batch(np.random.default_rng(i))


def test_grad_cache_equals_one_graph(tiny_db):
    corpus = load_blocks(tiny_db)
    enc = tiny_db.encoder
    sampler = BatchSampler(corpus, batch_blocks=12, seed=1)
    rng = np.random.default_rng(0)
    toks, ws, we, docs = sampler.arrays(sampler.next_batch(rng))
    mb = mask_spans(toks, ws, we, docs, mask_id=enc.mask_id, cls_id=enc.cls_id,
                    sep_id=enc.sep_id, pad_id=enc.pad_id, rng=rng)
    assert mb.num_spans > 0
    def run(cache: bool, chunk: int, train_mode: bool):
        model = copy.deepcopy(enc.model).train(train_mode)
        torch.manual_seed(0)
        stats = _backward(_RowEncoder(model, torch.device("cpu"), enc.pad_id, chunk), mb,
                          "phrase", grad_cache=cache)
        return stats.loss, {n: p.grad.clone() for n, p in model.named_parameters()
                            if p.grad is not None}

    # dropout on: the cached pass and its replay must draw the same dropout masks;
    # dropout off: chunking (padding, order) changes nothing either
    for a, b in [((False, 64, True), (True, 64, True)),
                 ((False, 100_000, False), (True, 48, False))]:
        (l1, g1), (l2, g2) = run(*a), run(*b)
        assert l1 == pytest.approx(l2, rel=1e-5)
        assert g1.keys() == g2.keys() and len(g1) > 10
        for n in g1:
            torch.testing.assert_close(g1[n], g2[n], rtol=1e-3, atol=1e-6)


def test_context_negatives_loss_against_naive(tiny_db):
    """Own block's visible tokens join the denominator; masked tokens never do."""
    import math

    corpus = load_blocks(tiny_db)
    enc = tiny_db.encoder
    sampler = BatchSampler(corpus, batch_blocks=8, seed=0)
    rng = np.random.default_rng(0)
    toks, ws, we, docs = sampler.arrays(sampler.next_batch(rng), exclude_repeats=True)
    mb = mask_spans(toks, ws, we, docs, mask_id=enc.mask_id, cls_id=enc.cls_id,
                    sep_id=enc.sep_id, pad_id=enc.pad_id, rng=rng, boundary_positives=False)
    B, Lt = mb.target_valid.shape
    M, h = mb.num_spans, 16
    assert M > 0
    g = torch.Generator().manual_seed(0)
    T = torch.randn(B, Lt, h, generator=g, dtype=torch.float64)
    qs = torch.randn(M, h, generator=g, dtype=torch.float64)
    qe = torch.randn(M, h, generator=g, dtype=torch.float64)
    masked = {(int(mb.block[j]), p) for j in range(M)
              for p in range(int(mb.span_start[j]) + 1,
                             int(mb.span_start[j]) + int(mb.span_len[j]) + 1)}
    valid = mb.target_valid.tolist()

    def nll(q, b, pos):
        den = sum(math.exp(float(q @ T[bb, p]) / math.sqrt(h)) for bb in range(B)
                  for p in range(Lt) if valid[bb][p] and not (bb == b and (bb, p) in masked))
        num = sum(math.exp(float(q @ T[bb, p]) / math.sqrt(h)) for bb, p in pos)
        return -math.log(num / den)

    want = np.mean([(nll(qs[i], int(mb.block[i]), [(b, s) for b, s, _ in mb.positives(i)])
                     + nll(qe[i], int(mb.block[i]), [(b, e) for b, _, e in mb.positives(i)]))
                    / 2 for i in range(M)])
    got, stats = _context_loss("phrase", qs, qe, T, mb, None)
    assert float(got) == pytest.approx(want, rel=1e-9)
    plain, _ = phrase_loss(qs, qe, T, mb)
    assert float(got) > float(plain)  # more negatives, larger loss
    assert stats.num_used == M


# --------------------------------------------------------------------------- training

def test_train_writes_a_tagged_generation(db_copy):
    db = db_copy
    v_old = db.version
    q = "Zambia is a republic in [MASK]."
    before = db.fill_mask(q, retrieval="dense")
    assert before.generation == 0
    report = npmdb.train(db, steps=3, batch_blocks=8, lr=1e-4, progress=False)
    assert isinstance(report, TrainReport)
    assert report.steps == report.steps_run == 3
    assert np.isfinite(report.final_loss) and np.isfinite(report.first_loss)
    assert report.spans_per_batch > 0 and report.device == "cpu"
    assert report.tags == ("train-step-3",) and len(report.generations) == 1
    head = db.versions()[-1]
    assert head["head"] and head["generation"] == report.generations[0] == 1
    assert head["tags"] == ["train-step-3"] and report.head_version == head["id"]
    new = db.fill_mask(q, retrieval="dense")
    assert (new.version, new.generation) == (head["id"], 1)
    old = db.fill_mask(q, version=v_old, retrieval="dense")  # the old version answers with its own encoder
    assert (old.version, old.generation) == (v_old, 0)
    assert [a.text for a in old.answers] == [a.text for a in before.answers]
    # the checkpoint is a safetensors file inside the database; nothing is pickled
    assert (db.path / "encoders" / "g1" / "model.safetensors").exists()
    assert [p.name[:8] for p in (db.path / STATE_DIR).glob("*.safetensors")] == ["state-3-"]
    assert no_pickles(db.path) == []
    assert "trained 3 steps" in str(report)


def test_loss_decreases_on_a_small_fixed_corpus(new_db):
    words = ["Paris", "Lyon", "Marseille", "Berlin", "Munich", "Hamburg", "Rome", "Milan"]
    docs = [f"{w} is a city. {w} lies in {c}. The river near {w} is wide."
            for w, c in zip(words, ["France"] * 3 + ["Germany"] * 3 + ["Italy"] * 2)]
    new_db.add(docs)
    losses: list[float] = []
    report = npmdb.train(new_db, steps=30, batch_blocks=8, lr=2e-3, warmup=2, progress=False,
                         callback=lambda d: losses.append(d["loss"]))
    assert len(losses) == 30 and all(np.isfinite(losses))
    assert np.mean(losses[-5:]) < 0.7 * np.mean(losses[:5]), losses
    assert report.final_loss < report.first_loss


def test_resume_continues_the_step_count(db_copy):
    db = db_copy
    with pytest.raises(ProgrammingError, match="nothing to resume"):
        npmdb.train(db, steps=4, resume=True, progress=False)
    r1 = npmdb.train(db, steps=4, batch_blocks=6, lr=1e-4, refresh_every=2, seed=7,
                     progress=False)
    assert r1.tags == ("train-step-2", "train-step-4")
    meta, tensors = load_train_state(db)
    assert meta["step"] == 4 and meta["generation"] == r1.generations[-1] and meta["seed"] == 7
    assert tensors and all(isinstance(t, torch.Tensor) for t in tensors.values())
    # the metadata is plain msgpack
    raw = msgpack.unpackb((db.path / STATE_DIR / "state.msgpack").read_bytes(), raw=False)
    assert raw["hyper"]["batch_blocks"] == 6
    with pytest.raises(ProgrammingError, match="already at step 4"):
        npmdb.train(db, steps=4, resume=True, progress=False)
    r2 = npmdb.train(db, steps=6, resume=True, progress=False)
    assert r2.resumed_from == 4 and r2.steps == 6 and r2.steps_run == 2
    assert r2.tags == ("train-step-6",) and r2.config["batch_blocks"] == 6
    assert r2.config["seed"] == 7
    assert load_train_state(db, tensors=False)[0]["step"] == 6
    assert no_pickles(db.path) == []


def test_time_budget_stops_early_writes_head_and_can_be_resumed(db_copy):
    """max_seconds: the run stops at the step it reached (each step here sleeps 0.3 s in
    the callback), writes that step's generation as HEAD and saves a resumable state."""
    import time

    db = db_copy
    r = npmdb.train(db, steps=50, batch_blocks=6, lr=1e-4, seed=3, progress=False,
                    max_seconds=0.5, callback=lambda d: time.sleep(0.3))
    assert 1 <= r.steps <= 3 and r.steps_run == r.steps
    assert r.tags == (f"train-step-{r.steps}",)
    assert db.versions()[-1]["tags"] == [f"train-step-{r.steps}"]
    assert load_train_state(db, tensors=False)[0]["step"] == r.steps
    r2 = npmdb.train(db, steps=r.steps + 1, resume=True, progress=False)
    assert r2.resumed_from == r.steps and r2.steps == r.steps + 1


def _losses(path, prefetch: bool) -> tuple[list[float], dict]:
    """Per-step losses of a 4-step training run on the database at ``path`` resumed to 6
    steps, and the sampler position each part's saved state records."""
    losses: list[float] = []
    states = []
    with npmdb.open(path, progress=False) as db:
        for kw in (dict(steps=4, batch_blocks=6, lr=1e-4, seed=5), dict(steps=6, resume=True)):
            npmdb.train(db, progress=False, prefetch=prefetch,
                        callback=lambda d: losses.append(d["loss"]), **kw)
            states.append(load_train_state(db, tensors=False)[0]["sampler"])
    return losses, states


def test_prefetch_trains_the_same_run(tiny_db_path, tmp_path):
    """Batches drawn a step ahead in a thread are the batches drawn in line: the same
    losses step by step, and the saved sampler position is that of the last batch trained
    on, not the one drawn ahead (else the resumed part would draw other batches)."""
    runs = {}
    for prefetch in (False, True):
        path = tmp_path / f"prefetch-{prefetch}"
        shutil.copytree(tiny_db_path, path)
        runs[prefetch] = _losses(path, prefetch)
    (inline, inline_states), (ahead, ahead_states) = runs[False], runs[True]
    assert len(inline) == 6 and ahead == inline
    assert ahead_states == inline_states and inline_states[0] != inline_states[1]


def test_refresh_while_querying(db_copy):
    db = db_copy
    seen: list[tuple[int, int]] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def query_loop():
        i = 0
        while not stop.is_set():
            try:
                mode = "bm25" if i % 2 else "dense"
                r = db.fill_mask("Lemnos is a Greek island in the [MASK].", retrieval=mode,
                                 top=3)
                seen.append((r.version, r.generation))
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)
                return
            i += 1

    t = threading.Thread(target=query_loop)
    t.start()
    try:
        report = npmdb.train(db, steps=15, batch_blocks=6, lr=1e-4, refresh_every=5,
                             progress=False)
    finally:
        stop.set()
        t.join()
    assert not errors, errors
    assert len(report.generations) >= 2  # at least one mid-training refresh, plus the final
    assert report.tags[-1] == "train-step-15"
    assert seen and set(seen) <= complete_pairs(db)
    assert len({g for _, g in seen}) >= 2  # queries ran before and after a refresh
    assert db.versions()[-1]["generation"] == report.generations[-1]
    assert (db.version, db.fill_mask("Lemnos is in [MASK].", retrieval="dense").generation) == \
        (report.head_version, report.head_generation)


def test_token_objective(db_copy):
    report = npmdb.train(db_copy, steps=3, batch_blocks=6, objective="token", progress=False)
    assert report.objective == "token" and np.isfinite(report.final_loss)
    assert report.spans_per_batch > 0
    r = db_copy.fill_mask("Lemnos is in [MASK].", mode="token", retrieval="dense")
    assert r.generation == report.head_generation


def test_batch_objective_mixes_both_and_is_deterministic():
    from npmdb.train.step import batch_objective

    draws = [batch_objective("mixed", np.random.default_rng([7, i])) for i in range(200)]
    assert 60 < draws.count("token") < 140 and set(draws) == {"phrase", "token"}
    again = [batch_objective("mixed", np.random.default_rng([7, i])) for i in range(200)]
    assert draws == again  # a batch's generator decides: a resumed run draws the same
    assert batch_objective("phrase", np.random.default_rng(0)) == "phrase"
    assert batch_objective("token", np.random.default_rng(0)) == "token"


def test_mixed_objective_trains_both_kinds_of_batch(db_copy):
    report = npmdb.train(db_copy, steps=6, batch_blocks=6, objective="mixed", seed=3,
                         progress=False)
    assert report.objective == "mixed" and np.isfinite(report.final_loss)
    assert report.config["objective"] == "mixed"
    # the query paths of both objectives answer from the refreshed generation
    for mode in ("phrase", "token"):
        assert db_copy.fill_mask("Lemnos is in [MASK].", mode=mode, retrieval="dense").generation == \
            report.head_generation


def test_span_length_p_sets_span_lengths_and_is_saved(db_copy):
    from npmdb.train.state import resolve_config
    from npmdb.train.step import draw_batch

    blocks = load_blocks(db_copy)

    def mean_len(p: float) -> float:
        cfg = dataclasses.replace(_config(), span_length_p=p)
        sampler = BatchSampler(blocks, batch_blocks=8, group_size=4, seed=0)
        lens = []
        for i in range(12):
            mb, _ = draw_batch(sampler, np.random.default_rng([1, i]), cfg, db_copy.encoder)
            lens += mb.span_len.tolist()
        return float(np.mean(lens))

    def _config():
        return resolve_config(dict(
            steps=1, batch_blocks=8, lr=None, group_size=None, warmup=None,
            weight_decay=None, max_grad_norm=None, mask_ratio=None, target_grad=None,
            freeze_embeddings=None, exclude_repeats=None, context_negatives=None,
            refresh_every=None, objective="phrase", seed=0, grouping="neighbours",
            clean_edges=True, max_span_len=10, span_unit="token", grad_cache=False,
            chunk_tokens=4096, loss_chunk=None, threads=None, tag_prefix="t",
            log_every=0), preset=None, saved=None)

    assert _config().span_length_p == 0.5  # NPM's
    assert mean_len(0.2) > mean_len(1.0) == 1.0  # p = 1: every span one token
    report = npmdb.train(db_copy, steps=2, batch_blocks=6, span_length_p=0.2, progress=False)
    assert np.isfinite(report.final_loss) and report.config["span_length_p"] == 0.2


def test_word_span_unit_trains_and_is_saved(db_copy):
    report = npmdb.train(db_copy, steps=2, batch_blocks=6, span_unit="word", progress=False)
    assert np.isfinite(report.final_loss) and report.spans_per_batch > 0
    assert report.config["span_unit"] == "word"


def test_grad_cache_training_runs(db_copy):
    report = npmdb.train(db_copy, steps=2, batch_blocks=8, grad_cache=True, chunk_tokens=512,
                         loss_chunk=256, progress=False)
    assert report.steps == 2 and np.isfinite(report.final_loss)


def test_npmdb_train_is_callable_after_submodule_import(db_copy):
    import npmdb.train.masking  # noqa: F401 - binds the attribute npmdb.train to the package
    assert callable(npmdb.train)
    report = npmdb.train(db_copy, steps=1, batch_blocks=4, progress=False)
    assert report.steps == 1


def test_cli_train(db_copy, capsys):
    from npmdb.cli import main

    path = str(db_copy.path)
    db_copy.close()
    assert main(["train", path, "--steps", "2", "--batch-blocks", "4", "-q"]) == 0
    assert "trained 2 steps" in capsys.readouterr().out
    with npmdb.open(path, progress=False) as db:
        assert db.versions()[-1]["tags"] == ["train-step-2"]


def test_cli_train_errors_name_the_flags(db_copy, capsys):
    """`npmdb train DB --batch-blocks 1` says `--batch-blocks must be >= 2`, not the
    Python argument's name; nothing is trained."""
    from npmdb.cli import main

    path = str(db_copy.path)
    db_copy.close()
    for argv, flag in ((["--batch-blocks", "1"], "--batch-blocks"),
                       (["--steps", "2", "--lr", "-1"], "--lr"),
                       (["--steps", "2", "--refresh-every", "-3"], "--refresh-every"),
                       (["--steps", "2", "--max-seconds", "-1"], "--max-seconds")):
        assert main(["train", path, "--steps", "2", *argv, "-q"]) != 0
        err = capsys.readouterr().err
        assert f"{flag} must be" in err and "_" not in err.split(" must")[0], err
    # no steps: the flags as typed, once ("--steps N", never "steps=N" or "--preset='demo'")
    assert main(["train", path, "-q"]) != 0
    err = capsys.readouterr().err
    assert "--steps N" in err and "--preset demo" in err, err
    assert "=" not in err and "command line" not in err, err
    with npmdb.open(path, progress=False) as db:
        assert len(db.versions()) == 1


def test_resume_without_steps_continues_to_the_saved_total(db_copy, capsys):
    """`npmdb train DB --preset demo --max-seconds S` then `--preset demo --resume`: the
    resumed run continues to the saved run's planned total (it used to say "steps is
    required … (or preset='demo')" though the preset was given)."""
    from npmdb.cli import main

    path = db_copy.path
    db_copy.close()
    assert main(["train", str(path), "--preset", "demo", "--max-seconds", "0.1", "-q"]) == 0
    first = load_train_state_at(path)
    assert first["steps_total"] == 400 and 1 <= first["step"] < 400
    capsys.readouterr()
    assert main(["train", str(path), "--preset", "demo", "--resume", "--max-seconds", "0.1",
                 "-q"]) == 0, capsys.readouterr().err
    second = load_train_state_at(path)
    assert second["steps_total"] == 400 and second["step"] > first["step"]
    with npmdb.open(path, progress=False) as db:
        from npmdb.train.state import load_checkpoint, resolve_config

        args = dict(steps=None, batch_blocks=None, lr=None, group_size=None, warmup=None,
                    weight_decay=None, max_grad_norm=None, mask_ratio=None, target_grad=None,
                    freeze_embeddings=None, exclude_repeats=None, context_negatives=None,
                    refresh_every=None, objective="phrase", seed=0, grouping="neighbours",
                    clean_edges=True, max_span_len=10, grad_cache=False, chunk_tokens=4096,
                    loss_chunk=None, threads=None, tag_prefix="train-step-", log_every=0)
        cfg = resolve_config(args, preset=None, saved=load_checkpoint(db))  # no preset either
        assert (cfg.steps, cfg.start_step, cfg.batch_blocks) == (400, second["step"], 32)
        # a saved state without its total (written by hand): say what to pass, not the preset
        mp = path / STATE_DIR / "state.msgpack"
        meta = msgpack.unpackb(mp.read_bytes(), raw=False)
        del meta["steps_total"]
        mp.write_bytes(msgpack.packb(meta))
        with pytest.raises(ProgrammingError, match=r"records no total.*pass steps=N \(N > "):
            npmdb.train(db, resume=True, progress=False)


def load_train_state_at(path: Path) -> dict:
    with npmdb.open(path, progress=False) as db:
        return load_train_state(db, tensors=False)[0]


def test_damaged_training_state_is_an_operational_error(db_copy, capsys):
    """A truncated or overwritten state file is an OperationalError naming the file and
    saying to train without resume (it was SafetensorError, ValueError, msgpack's
    FormatError or AttributeError, and a traceback from the CLI); training without resume
    then replaces the state."""
    from npmdb.cli import main

    db = db_copy
    npmdb.train(db, steps=2, batch_blocks=4, progress=False)
    (st,) = (db.path / STATE_DIR).glob("state-2-*.safetensors")
    mp = db.path / STATE_DIR / "state.msgpack"
    good_st, good_mp = st.read_bytes(), mp.read_bytes()
    meta = msgpack.unpackb(good_mp, raw=False)
    flipped = bytearray(good_st)
    flipped[-4] ^= 0x01  # a byte inside the last tensor: safetensors alone still loads it
    damages = [
        (st, good_st[:1000]), (st, good_st[:-8]), (st, b""), (st, bytes(flipped)),
        (mp, good_mp[:20]), (mp, b"\xc1garbage"), (mp, msgpack.packb([1, 2])),
        (mp, msgpack.packb({**meta, "hyper": None})),
        (mp, msgpack.packb({**meta, "step": "two"})),
        (mp, msgpack.packb({**meta, "optimizer": 2})),
        (mp, msgpack.packb({k: v for k, v in meta.items() if k != "sampler"})),
    ]
    versions = db.versions()
    for f, data in damages:
        f.write_bytes(data)
        with pytest.raises(OperationalError,
                           match=rf"training state in .* is damaged: {f.name} .*train again "
                                 "without resume"):
            npmdb.train(db, steps=3, resume=True, progress=False)
        st.write_bytes(good_st)
        mp.write_bytes(good_mp)
    assert db.versions() == versions
    # a file the OS will not read is not called damaged (it may be whole)
    mp.unlink()
    mp.mkdir()
    with pytest.raises(OperationalError,
                       match=r"state\.msgpack cannot be read \(IsADirectoryError.*permissions"):
        npmdb.train(db, steps=3, resume=True, progress=False)
    mp.rmdir()
    mp.write_bytes(good_mp[:20])
    path = str(db.path)
    db.close()
    assert main(["train", path, "--steps", "3", "--resume", "-q"]) == 2
    err = capsys.readouterr().err
    assert "state.msgpack" in err and "without resume" in err and "Traceback" not in err
    with npmdb.open(path, progress=False) as db:
        npmdb.train(db, steps=1, batch_blocks=4, progress=False)  # not resumed: replaces it
        assert load_train_state(db)[0]["step"] == 1


def test_a_kill_while_the_state_is_saved_leaves_the_previous_state(db_copy):
    """The optimizer file and the metadata were replaced one after the other under one name
    each: a kill between them left a newer optimizer beside older metadata, and resume was
    refused for good ("torn"). Each step's optimizer file has its own name now and the
    metadata's replacement commits it: the previous state resumes."""
    import subprocess
    import sys

    path = db_copy.path
    npmdb.train(db_copy, steps=2, batch_blocks=4, progress=False)
    db_copy.close()
    child = f"""
import os, npmdb
from npmdb.train import state as S
real = S._fsync_write
def killed_before_the_metadata(path, data):
    if path.name == "state.msgpack":
        os._exit(9)  # the process dies between the optimizer file and the metadata
    real(path, data)
S._fsync_write = killed_before_the_metadata
with npmdb.open({str(path)!r}, progress=False) as db:
    npmdb.train(db, steps=4, resume=True, progress=False)
"""
    assert subprocess.run([sys.executable, "-c", child], timeout=600).returncode == 9
    d = path / STATE_DIR
    assert sorted(p.name[:8] for p in d.glob("*.safetensors")) == ["state-2-", "state-4-"]
    with npmdb.open(path, progress=False) as db:
        assert load_train_state(db)[0]["step"] == 2
        report = npmdb.train(db, steps=4, resume=True, progress=False)
        assert "trained 2 steps" in str(report)
        assert load_train_state(db)[0]["step"] == 4
    assert [p.name[:8] for p in d.glob("*.safetensors")] == ["state-4-"]


def test_one_training_run_at_a_time(db_copy):
    """A second run while one is going was not refused: both stepped, their versions
    alternated at HEAD and the second moved the first's step tags."""
    db = db_copy
    errors = []

    def second(stats):
        if stats["step"] == 1:
            try:
                npmdb.train(db, steps=2, batch_blocks=4, progress=False)
            except OperationalError as exc:
                errors.append(str(exc))

    npmdb.train(db, steps=2, batch_blocks=4, progress=False, callback=second)
    assert len(errors) == 1 and "another training run is going on" in errors[0], errors
    assert [v["tags"] for v in db.versions()][-1] == ["train-step-2"]
    assert len(db.versions()) == 2
    npmdb.train(db, steps=3, resume=True, progress=False)  # the lock went with the run


def test_resume_refuses_settings_it_would_not_use(db_copy, capsys):
    """--resume kept the saved run's settings and ignored --lr, --batch-blocks,
    --objective and --seed without a word."""
    from npmdb.cli import main

    npmdb.train(db_copy, steps=2, batch_blocks=4, lr=1e-4, progress=False)
    with pytest.raises(ProgrammingError, match=r"resume continues the saved run .* "
                                               r"lr=0.001 \(saved: 0.0001\)"):
        npmdb.train(db_copy, steps=3, resume=True, lr=1e-3, progress=False)
    with pytest.raises(ProgrammingError, match=r"objective='token' \(saved: 'phrase'\)"):
        npmdb.train(db_copy, steps=3, resume=True, objective="token", progress=False)
    path = str(db_copy.path)
    db_copy.close()
    assert main(["train", path, "--resume", "--steps", "3", "--batch-blocks", "8", "-q"]) == 2
    assert "--batch-blocks 8 (saved: 4)" in capsys.readouterr().err
    assert main(["train", path, "--resume", "--steps", "3", "--batch-blocks", "4", "-q"]) == 0


def test_vacuum_removes_a_training_state_whose_generation_it_removed(db_copy):
    """Resume refuses such a state for good, and its files stayed until a new run."""
    db = db_copy
    db.tag("start", db.version)
    npmdb.train(db, steps=2, batch_blocks=4, progress=False)
    assert db.vacuum()["training_state"] == 0     # HEAD reads the state's generation
    assert list((db.path / STATE_DIR).glob("state*"))
    db.restore("start")
    db.untag("train-step-2")
    assert db.vacuum()["training_state"] == 1
    assert not list((db.path / STATE_DIR).glob("state*"))
    with pytest.raises(ProgrammingError, match="nothing to resume"):
        npmdb.train(db, steps=3, resume=True, progress=False)


def test_saving_the_same_step_twice_never_overwrites_the_named_optimizer(db_copy):
    """A resumed run that stops before its first step saves the step it resumed from
    again: with one name per step that overwrote the file the metadata names, and a kill
    between the two writes tore the state once more."""
    from npmdb.train import state as S

    db = db_copy
    npmdb.train(db, steps=2, batch_blocks=4, progress=False)
    ck = S.load_checkpoint(db)
    named = S.optimizer_path(db, ck.meta)
    before = named.read_bytes()
    meta = {k: v for k, v in ck.meta.items() if k not in ("optimizer", "optimizer_sha256")}
    real = S._fsync_write

    def killed_before_the_metadata(path, data):
        if path.name == "state.msgpack":
            raise OSError("killed")
        real(path, data)

    S._fsync_write = killed_before_the_metadata
    try:
        with pytest.raises(OSError, match="killed"):
            S.save_checkpoint(db, meta, ck.optimizer)
    finally:
        S._fsync_write = real
    assert named.read_bytes() == before
    assert S.load_checkpoint(db).meta["step"] == 2


def test_a_state_saved_before_optimizer_files_had_step_names_resumes(db_copy):
    """Metadata without ``optimizer`` names the one file ``state.safetensors``."""
    db = db_copy
    npmdb.train(db, steps=2, batch_blocks=4, progress=False)
    d = db.path / STATE_DIR
    next(d.glob("state-2-*.safetensors")).rename(d / "state.safetensors")
    meta = msgpack.unpackb((d / "state.msgpack").read_bytes(), raw=False)
    del meta["optimizer"]
    (d / "state.msgpack").write_bytes(msgpack.packb(meta))
    assert load_train_state(db)[0]["step"] == 2
    npmdb.train(db, steps=3, resume=True, batch_blocks=4, progress=False)
    assert [p.name[:8] for p in d.glob("*.safetensors")] == ["state-3-"]


def test_state_dir_that_cannot_be_written(db_copy):
    """``<db>/train`` that cannot hold the state (a file in its place): refused before the
    first step, nothing committed (it used to train, commit the refresh, then report that
    "refreshing the embeddings failed"). If saving fails after a refresh committed anyway,
    the message says the version was committed and that saving the state failed."""
    db = db_copy
    versions, steps = db.versions(), []
    (db.path / STATE_DIR).write_text("not a directory")
    with pytest.raises(OperationalError, match=r"training state could not be saved in .*"
                                               r"train .*Nothing was trained or committed"):
        npmdb.train(db, steps=2, batch_blocks=4, progress=False,
                    callback=lambda d: steps.append(d["step"]))
    assert steps == [] and db.versions() == versions
    (db.path / STATE_DIR).unlink()

    def block_the_state_dir(d):  # the state dir cannot be made once training has begun
        if d["step"] == 1:
            (db.path / STATE_DIR).write_text("in the way")

    with pytest.raises(OperationalError) as err:
        npmdb.train(db, steps=2, batch_blocks=4, progress=False, callback=block_the_state_dir)
    head = db.versions()[-1]
    assert head["head"] and head["tags"] == ["train-step-2"] and head["id"] > versions[-1]["id"]
    msg = str(err.value)
    assert f"the refresh committed version {head['id']} (embedding generation " \
           f"{head['generation']}, step 2)" in msg
    assert "saving the training state" in msg and "refreshing the embeddings failed" not in msg


def test_resume_after_the_saved_generation_was_vacuumed(db_copy):
    """restore + untag + vacuum dropped the saved run's generation: resume says so and says
    to train without resume (in this process it used to resume from the cached encoder
    of a deleted checkpoint; a new process got "generation 1 is not recorded")."""
    import shutil

    db = db_copy
    before = db.version
    npmdb.train(db, steps=1, batch_blocks=4, progress=False)
    db.restore(before)
    db.untag("train-step-1")
    kept = db.path.parent / "kept-state"
    shutil.copytree(db.path / STATE_DIR, kept)
    assert db.vacuum()["training_state"] == 1  # a vacuum now removes such a state
    shutil.rmtree(db.path / STATE_DIR)
    shutil.copytree(kept, db.path / STATE_DIR)  # as one vacuumed before that was left
    match = r"generation 1 \(step 1\) is no longer in the database.*vacuum.*without resume"
    with pytest.raises(OperationalError, match=match):
        npmdb.train(db, steps=2, resume=True, progress=False)
    path = db.path
    db.close()
    with npmdb.open(path, progress=False) as again:
        with pytest.raises(OperationalError, match=match):
            npmdb.train(again, steps=2, resume=True, progress=False)


# --------------------------------------------------------------------------- arguments

@pytest.mark.parametrize("kwargs, match", [
    ({"steps": 0}, "steps must be >= 1"),
    ({"steps": 2.5}, "steps must be an integer"),
    ({}, "steps is required"),
    ({"steps": 2, "objective": "mlm"}, "unknown objective"),
    ({"steps": 2, "batch_blocks": 1}, "batch_blocks must be >= 2"),
    ({"steps": 2, "lr": 0}, "lr must be in"),
    ({"steps": 2, "refresh_every": -1}, "refresh_every must be >= 0"),
    ({"steps": 2, "preset": "huge"}, "unknown preset"),
    ({"steps": 2, "grouping": "topics"}, "grouping must be one of"),
    ({"steps": 2, "context_negatives": True}, "needs exclude_repeats"),
    ({"steps": 2, "span_unit": "char"}, "span_unit must be one of"),
    ({"steps": 2, "span_length_p": 0}, "span_length_p must be in"),
    ({"steps": 2, "span_length_p": 1.5}, "span_length_p must be in"),
    ({"steps": 2, "max_seconds": 0}, "max_seconds must be a positive"),
    ({"steps": 2, "max_seconds": -3.0}, "max_seconds must be a positive"),
    ({"steps": 2, "max_seconds": "60"}, "max_seconds must be a positive"),
    ({"steps": 2, "prefetch": "yes"}, "prefetch must be True or False"),
    # switches are True or False: "no" read as on, None as off
    ({"steps": 2, "freeze_embeddings": "no"}, "freeze_embeddings must be True or False"),
    ({"steps": 2, "exclude_repeats": "false"}, "exclude_repeats must be True or False"),
    ({"steps": 2, "target_grad": 1}, "target_grad must be True or False"),
    ({"steps": 2, "clean_edges": None}, "clean_edges must be True or False"),
    ({"steps": 2, "grad_cache": "no"}, "grad_cache must be True or False"),
    ({"steps": 2, "progress": "no"}, "progress must be True or False"),
    ({"steps": 2, "progress": 1}, "progress must be True or False"),
    # a warm-up longer than the run: the learning rate would never reach its peak
    ({"steps": 2, "warmup": 5000}, "warmup=5000 steps is more than steps=2.*never reach"),
    # the preset given has no steps: say so, not "or preset=..." for a preset given
    ({"preset": "default"}, "preset 'default' sets no number of steps"),
    ({"steps": 2, "callback": 5}, "callback must be a function"),
    # checked before the first step, not when the last version is written
    ({"steps": 20, "tag_prefix": "0"}, "invalid tag name '020'"),
    ({"steps": 2, "tag_prefix": "x" * 400}, "at most 400 bytes"),
    ({"steps": 10 ** 30, "max_seconds": 1}, "steps must be below 2"),
    ({"steps": 2, "device": "tpu"}, "unknown device 'tpu'"),
])
def test_bad_arguments(tiny_db, kwargs, match):
    with pytest.raises(ProgrammingError, match=match):
        npmdb.train(tiny_db, **{"progress": False, **kwargs})


def test_refused_before_any_step(tmp_path, tiny_encoder):
    """Training inside a batch, and a corpus with nothing to mask, fail before the first
    step and commit nothing."""
    from npmdb.errors import DataError

    with npmdb.open(tmp_path / "db", encoder=tiny_encoder, progress=False) as db:
        db.add([f"Word{i}: gloss{i}" for i in range(12)])  # no phrase recurs in a batch
        with db.batch():
            with pytest.raises(ProgrammingError, match="inside db.batch"):
                npmdb.train(db, steps=2, batch_blocks=4, progress=False)
        with pytest.raises(DataError, match="nothing to train on"):
            npmdb.train(db, steps=2, batch_blocks=4, progress=False)
        assert len(db.versions()) == 1


def test_readonly_and_empty(tiny_db_path, tmp_path, new_db):
    path = tmp_path / "ro"
    shutil.copytree(tiny_db_path, path)
    with npmdb.open(path, readonly=True, progress=False) as db:
        with pytest.raises(OperationalError, match="read-only"):
            npmdb.train(db, steps=1)
    with pytest.raises(ProgrammingError, match="no documents"):
        npmdb.train(new_db, steps=1, progress=False)
    assert no_pickles(path) == []


_HOLD = """
import sys, time
from pathlib import Path
import npmdb
with npmdb.open(sys.argv[1], progress=False, timeout=60) as db:
    with db.batch():
        db.add(["Another process adds this while training runs."])
        Path(sys.argv[2]).write_text("holding")
        time.sleep(float(sys.argv[3]))
"""


def _hold_lock(path: Path, flag: Path, seconds: float):
    import subprocess
    import sys
    import time

    proc = subprocess.Popen([sys.executable, "-c", _HOLD, str(path), str(flag), str(seconds)])
    deadline = time.monotonic() + 60
    while not flag.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the holder did not start"
        time.sleep(0.05)
    return proc


def test_another_writer_fails_training_before_its_first_step_and_refreshes_wait(db_copy,
                                                                               tmp_path):
    """Another process holding the writer: training fails before any step (it used to run
    every step and then lose them all on the final refresh). A writer that takes the lock
    while training runs makes the refresh wait for it, not fail."""
    path = db_copy.path
    db_copy.close()
    steps = []
    proc = _hold_lock(path, tmp_path / "held-1", 20)
    try:
        with npmdb.open(path, progress=False) as db:
            with pytest.raises(npmdb.OperationalError, match="locked by another writer"):
                npmdb.train(db, steps=2, batch_blocks=4, progress=False,
                            callback=lambda s: steps.append(s["step"]))
            assert steps == [] and not db.versions()[-1]["message"].startswith("trained")
    finally:
        proc.kill()
        proc.wait()
    holders = []

    def take_the_lock(stats):  # another process takes the writer mid-run for 3 s
        if stats["step"] == 1:
            holders.append(_hold_lock(path, tmp_path / "held-2", 3))

    with npmdb.open(path, progress=False) as db:
        before = db.version
        rep = npmdb.train(db, steps=2, batch_blocks=4, refresh_every=0, log_every=1,
                          progress=False, callback=take_the_lock)
        assert holders and holders[0].wait(60) == 0
        assert rep.versions and rep.versions[-1] == db.version > before + 1  # after its add
        assert db.count() == 1 + db.count(before)
