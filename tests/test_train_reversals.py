"""reverse_pairs: dictionary pairs read both ways, for training only (npmdb.train.reversals)."""

from __future__ import annotations

import numpy as np
import pytest

import npmdb
from npmdb.errors import ProgrammingError
from npmdb.train.batches import BatchSampler, load_blocks
from npmdb.train.reversals import with_pair_reversals
from npmdb.train.state import resolve_config
from npmdb.train.step import draw_batch

PAIRS = ["Κιότο: Kyoto", "Кампучия: Cambodia", "Αθήνα: Athens", "Москва: Moscow",
         "Λονδίνο: London", "Париж: Paris", "Ρώμη: Rome", "Берлин: Berlin",
         "Μαδρίτη: Madrid", "Варшава: Warsaw", "Λισαβόνα: Lisbon", "Прага: Prague"]
NOT_PAIRS = [
    "Algiers (Algerian capital): the capital and largest city of Algeria",  # punctuation
    "Cape Verde: a republic on a group of islands in the Atlantic Ocean",  # a long gloss
    "no separator in this one",
    "one: two: three",  # two separators
]


def _sep(db) -> int:
    return int(db.encoder.tokenizer.convert_tokens_to_ids(":"))


def _config(**kw):
    args = dict(steps=1, batch_blocks=8, lr=None, group_size=None, warmup=None,
                weight_decay=None, max_grad_norm=None, mask_ratio=None, target_grad=None,
                freeze_embeddings=None, exclude_repeats=None, context_negatives=None,
                refresh_every=None, objective="phrase", seed=0, grouping="documents",
                clean_edges=True, max_span_len=10, span_unit="word", grad_cache=False,
                chunk_tokens=4096, loss_chunk=None, threads=None, tag_prefix="t",
                log_every=0)
    return resolve_config({**args, **kw}, preset=None, saved=None)


def test_each_pair_gets_its_reverse_as_a_second_block(new_db):
    new_db.add([{"id": f"p{i}", "title": t.split(":")[0], "text": t}
                for i, t in enumerate(PAIRS[:2])]
               + [{"id": f"n{i}", "text": t} for i, t in enumerate(NOT_PAIRS)])
    corpus = load_blocks(new_db)
    out, added = with_pair_reversals(corpus, _sep(new_db))
    assert added == 2 and out.num_blocks == corpus.num_blocks + 2
    assert out.num_docs == corpus.num_docs
    assert (out.version, out.generation) == (corpus.version, corpus.generation)
    dec = new_db.encoder.tokenizer.decode
    by_doc = {}
    for d, (first, end) in enumerate(out.doc_blocks):
        by_doc[d] = [dec(out.block(b).tolist()) for b in range(first, end)]
    two = [blocks for blocks in by_doc.values() if len(blocks) == 2]
    assert sorted(b[1] for b in two) == ["cambodia : кампучия", "kyoto : κιοτο"]
    for first, second in two:  # the same tokens and flags, the sides swapped
        assert first.split(" : ") == second.split(" : ")[::-1]
    for d, (first, end) in enumerate(out.doc_blocks):
        if end - first == 2:
            a, b = out.block_flags(first), out.block_flags(first + 1)
            assert sorted(a.tolist()) == sorted(b.tolist())
    assert sum(len(b) == 1 for b in by_doc.values()) == len(NOT_PAIRS)
    # nothing to reverse: the corpus comes back as it was
    assert with_pair_reversals(corpus, -1) == (corpus, 0)


def test_reversed_pairs_make_words_that_occur_once_targets(new_db):
    """Each foreign word occurs once: NPM's masking finds nothing to mask until the pair is
    read both ways, and then masks them (the other direction is the positive)."""
    new_db.add([{"id": f"p{i}", "text": t} for i, t in enumerate(PAIRS)])
    corpus = load_blocks(new_db)
    cfg = _config()

    def spans(c) -> int:
        sampler = BatchSampler(c, batch_blocks=8, group_size=2, grouping="documents", seed=0)
        return sum(draw_batch(sampler, np.random.default_rng([3, i]), cfg,
                              new_db.encoder)[0].num_spans for i in range(6))

    assert spans(corpus) == 0
    assert spans(with_pair_reversals(corpus, _sep(new_db))[0]) > 0


def test_train_with_reverse_pairs_is_saved_and_resumed(new_db):
    new_db.add([{"id": f"p{i}", "text": t} for i, t in enumerate(PAIRS)]
               + [{"id": f"n{i}", "text": t} for i, t in enumerate(NOT_PAIRS)])
    rep = npmdb.train(new_db, steps=2, batch_blocks=8, span_unit="word", reverse_pairs=True,
                      progress=False)
    assert rep.config["reverse_pairs"] is True and np.isfinite(rep.final_loss)
    assert rep.spans_per_batch > 0
    again = npmdb.train(new_db, steps=3, resume=True, progress=False)
    assert again.config["reverse_pairs"] is True and again.steps == 3
    off = npmdb.train(new_db, steps=1, batch_blocks=8, progress=False)
    assert off.config["reverse_pairs"] is False  # NPM's default: the text as it is


def test_reverse_pairs_must_be_a_bool(tiny_db):
    with pytest.raises(ProgrammingError, match="reverse_pairs must be True or False"):
        npmdb.train(tiny_db, steps=1, reverse_pairs="yes", progress=False)


def test_cli_train_reverse_pairs(new_db, capsys):
    from npmdb.cli import main

    new_db.add([{"id": f"p{i}", "text": t} for i, t in enumerate(PAIRS)])
    path = str(new_db.path)
    new_db.close()
    assert main(["train", path, "--steps", "1", "--batch-blocks", "4", "--reverse-pairs",
                 "-q"]) == 0
    assert "trained 1 steps" in capsys.readouterr().out
    with npmdb.open(path, progress=False) as db:
        assert db.versions()[-1]["tags"] == ["train-step-1"]
