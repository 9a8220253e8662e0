"""NPM span / token masking (npmdb.train.masking) against naive reference code."""

from __future__ import annotations

import importlib.util
import math
import pathlib
import sys
from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

if importlib.util.find_spec("npmdb") is None:  # running from a checkout, not installed
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from npmdb.errors import DataError, ProgrammingError  # noqa: E402
from npmdb.train.masking import MaskedBatch, mask_spans, mask_tokens, word_counts  # noqa: E402

PAD, MASK, CLS, SEP = 0, 1, 2, 3
IDS = dict(mask_id=MASK, cls_id=CLS, sep_id=SEP, pad_id=PAD)


# --------------------------------------------------------------------------- data

def words_to_block(words: list[list[int]]) -> tuple[list[int], list[bool], list[bool]]:
    toks, ws, we = [], [], []
    for w in words:
        for k, t in enumerate(w):
            toks.append(t)
            ws.append(k == 0)
            we.append(k == len(w) - 1)
    return toks, ws, we


def realistic_batch(rng: np.random.Generator, n_docs: int = 4, blocks_per_doc: int = 3,
                    block_words: int = 60, vocab: int = 300):
    """Document-grouped blocks of multi-token words; frequent words and shared phrases
    repeat across blocks and documents, as in real text."""
    lexicon = [list(rng.integers(5, vocab, size=int(rng.choice([1, 1, 1, 2, 2, 3]))))
               for _ in range(120)]
    # Zipf-ish: a few very frequent words ("the", "of", ...)
    weights = 1.0 / np.arange(1, len(lexicon) + 1)
    weights /= weights.sum()
    phrases = [[int(i) for i in rng.choice(len(lexicon), size=int(rng.integers(2, 5)))]
               for _ in range(15)]
    blocks, ws, we, docs = [], [], [], []
    for d in range(n_docs):
        topic = [phrases[int(i)] for i in rng.choice(len(phrases), size=4)]
        for _ in range(blocks_per_doc):
            words: list[list[int]] = []
            while len(words) < block_words:
                if rng.random() < 0.15:
                    words.extend(lexicon[i] for i in topic[int(rng.integers(len(topic)))])
                else:
                    words.append(lexicon[int(rng.choice(len(lexicon), p=weights))])
            t, s, e = words_to_block(words[:block_words])
            blocks.append(np.array(t, dtype=np.int64))
            ws.append(np.array(s))
            we.append(np.array(e))
            docs.append(f"doc{d}")
    return blocks, ws, we, docs


# --------------------------------------------------------------------------- naive reference

def naive_occurrences(blocks, ws, we, tup, exclude_block, boundaries=True):
    """All (block, start, end) in target coordinates (+1 for [CLS]) of `tup` outside
    `exclude_block`, by brute force."""
    out = set()
    n = len(tup)
    for b in range(len(blocks)):
        if b == exclude_block:
            continue
        t = [int(x) for x in blocks[b]]
        for j in range(len(t) - n + 1):
            if tuple(t[j:j + n]) != tup:
                continue
            if boundaries and not (ws[b][j] and we[b][j + n - 1]):
                continue
            out.add((b, j + 1, j + n))
    return out


def spans_by_block(mb: MaskedBatch):
    out: dict[int, list[int]] = {}
    for i in range(mb.num_spans):
        out.setdefault(int(mb.block[i]), []).append(i)
    return out


def check_batch(mb: MaskedBatch, blocks, ws, we, *, mode="phrase", ratio=0.15, max_len=10,
                max_spans=64, max_count=10, gap=1, boundary_positives=True,
                whole_words=False):
    """Every invariant of a masked batch, checked with plain Python loops."""
    B = len(blocks)
    n_masks = 2 if mode == "phrase" else 1
    assert mb.mode == mode
    assert mb.input_ids.shape[0] == B and mb.target_ids.shape[0] == B
    assert mb.input_ids.dtype == torch.long and mb.target_ids.dtype == torch.long
    # target encoding: [CLS] block [SEP] pad...
    for b in range(B):
        t = [int(x) for x in blocks[b]]
        row = mb.target_ids[b].tolist()
        assert row[:len(t) + 2] == [CLS] + t + [SEP]
        assert all(x == PAD for x in row[len(t) + 2:])
        assert mb.target_attention_mask[b].tolist() == \
            [1] * (len(t) + 2) + [0] * (len(row) - len(t) - 2)
        assert mb.target_valid[b].tolist() == \
            [False] + [True] * len(t) + [False] * (len(row) - len(t) - 1)

    per_block = spans_by_block(mb)
    counts: Counter = Counter()
    for b in range(B):
        t = [int(x) for x in blocks[b]]
        spans = per_block.get(b, [])
        assert len(spans) <= max_spans
        assert sum(int(mb.span_len[i]) for i in spans) <= math.floor(ratio * len(t) + 1e-9)
        # spans sorted, non-overlapping, not adjacent
        starts = [int(mb.span_start[i]) for i in spans]
        assert starts == sorted(starts)
        for a, c in zip(spans, spans[1:]):
            assert int(mb.span_start[c]) >= int(mb.span_start[a]) + int(mb.span_len[a]) + gap
        # decode the masked row back to the block
        row = mb.input_ids[b].tolist()
        att = mb.attention_mask[b].tolist()
        length = sum(att)
        assert att == [1] * length + [0] * (len(row) - length)
        assert all(x == PAD for x in row[length:])
        row = row[:length]
        assert row[0] == CLS and row[-1] == SEP
        decoded = []
        k = 1
        for i in spans:
            sm, em = int(mb.start_mask_pos[i]), int(mb.end_mask_pos[i])
            assert em == sm + n_masks - 1
            decoded.extend(row[k:sm])
            assert row[sm:em + 1] == [MASK] * n_masks
            decoded.extend(mb.span_tokens[i])
            k = em + 1
        decoded.extend(row[k:-1])
        assert decoded == t
        assert MASK not in [x for x in row[k:-1]]
        for i in spans:
            s, n = int(mb.span_start[i]), int(mb.span_len[i])
            tup = tuple(t[s:s + n])
            assert mb.span_tokens[i] == tup
            assert 1 <= n <= max_len
            if mode == "token":
                assert n == 1
            if mode == "phrase" or whole_words:
                assert ws[b][s] and we[b][s + n - 1], "span must start/end on word boundaries"
            counts[tup] += 1
            # positives: exactly the occurrences in other blocks, never the own block
            expect = naive_occurrences(blocks, ws, we, tup, b,
                                       boundaries=(mode == "phrase" and boundary_positives))
            got = mb.positives(i)
            assert len(got) == len(set(got))
            assert set(got) == expect
            assert expect, "a masked span must occur in another block"
            for pb, ps, pe in got:
                assert pb != b
                assert tuple(mb.target_ids[pb, ps:pe + 1].tolist()) == tup
    assert all(c <= max_count for c in counts.values())
    assert len(mb.span_tokens) == mb.num_spans == mb.block.numel()
    for name in ("pos_span", "pos_block", "pos_start", "pos_end"):
        assert getattr(mb, name).numel() == mb.num_positives
    return counts


# --------------------------------------------------------------------------- phrase mode

@pytest.mark.parametrize("seed", range(12))
def test_realistic_batches_satisfy_every_invariant(seed):
    rng = np.random.default_rng(seed)
    blocks, ws, we, docs = realistic_batch(rng)
    mb = mask_spans(blocks, ws, we, docs, rng=np.random.default_rng(1000 + seed), **IDS)
    assert mb.num_spans > 0
    assert mb.doc == tuple(docs)
    check_batch(mb, blocks, ws, we)
    # some spans are longer than one token (shared phrases exist)
    assert int(mb.span_len.max()) > 1


@pytest.mark.parametrize("seed", range(4))
def test_boundary_positives_off_counts_any_token_match(seed):
    rng = np.random.default_rng(seed)
    blocks, ws, we, docs = realistic_batch(rng)
    mb = mask_spans(blocks, ws, we, docs, rng=np.random.default_rng(seed),
                    boundary_positives=False, **IDS)
    assert mb.num_spans > 0
    check_batch(mb, blocks, ws, we, boundary_positives=False)


@st.composite
def small_batches(draw):
    n_blocks = draw(st.integers(1, 6))
    vocab_hi = draw(st.integers(5, 9))  # tiny vocabularies: lots of repeats
    blocks, ws, we = [], [], []
    for _ in range(n_blocks):
        n = draw(st.integers(0, 40))
        toks = draw(st.lists(st.integers(5, vocab_hi), min_size=n, max_size=n))
        s = draw(st.lists(st.booleans(), min_size=n, max_size=n))
        e = draw(st.lists(st.booleans(), min_size=n, max_size=n))
        blocks.append(np.array(toks, dtype=np.int64))
        ws.append(np.array(s, dtype=bool))
        we.append(np.array(e, dtype=bool))
    return blocks, ws, we


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_batches(), st.integers(0, 2**32 - 1), st.sampled_from([0.15, 0.3, 1.0]),
       st.integers(1, 4), st.integers(1, 10))
def test_property_invariants(batch, seed, ratio, max_count, max_len):
    blocks, ws, we = batch
    mb = mask_spans(blocks, ws, we, rng=np.random.default_rng(seed), mask_ratio=ratio,
                    max_ngram_count=max_count, max_span_len=max_len, **IDS)
    check_batch(mb, blocks, ws, we, ratio=ratio, max_count=max_count, max_len=max_len)


@settings(max_examples=100, deadline=None)
@given(small_batches(), st.integers(0, 2**32 - 1), st.booleans())
def test_property_token_mode(batch, seed, whole_words):
    blocks, ws, we = batch
    mb = mask_tokens(blocks, ws, we, rng=np.random.default_rng(seed), mask_ratio=0.3,
                     max_token_count=3, whole_words=whole_words, **IDS)
    check_batch(mb, blocks, ws, we, mode="token", ratio=0.3, max_count=3,
                whole_words=whole_words)


def test_span_and_ngram_caps_are_enforced_and_reached():
    rng = np.random.default_rng(7)
    # long blocks over a 4-token vocabulary: every n-gram repeats everywhere
    blocks = [rng.integers(5, 9, size=2000) for _ in range(3)]
    mb = mask_spans(blocks, rng=np.random.default_rng(0), max_ngram_count=1000, **IDS)
    per_block = spans_by_block(mb)
    assert max(len(v) for v in per_block.values()) == 64  # the cap is reached, not passed
    ws = [np.ones(len(b), bool) for b in blocks]
    check_batch(mb, blocks, ws, ws, max_count=1000)

    mb = mask_spans(blocks, rng=np.random.default_rng(0), max_spans_per_block=3, **IDS)
    assert all(len(v) <= 3 for v in spans_by_block(mb).values())

    # the per-batch n-gram cap (default 10) binds: 4 one-token n-grams only
    blocks = [rng.integers(5, 9, size=200) for _ in range(8)]
    mb = mask_spans(blocks, rng=np.random.default_rng(0), max_span_len=1, **IDS)
    counts = Counter(mb.span_tokens)
    assert max(counts.values()) == 10
    assert mb.num_spans == 40
    check_batch(mb, blocks, [np.ones(200, bool)] * 8, [np.ones(200, bool)] * 8, max_len=1)


def test_no_co_occurrence_means_no_mask():
    blocks = [np.arange(10, 40), np.arange(50, 80)]
    mb = mask_spans(blocks, rng=np.random.default_rng(0), **IDS)
    assert mb.num_spans == 0 and mb.num_positives == 0
    assert mb.input_ids.tolist() == mb.target_ids.tolist()
    # a repeat inside the same block is not a positive either
    blocks = [np.array([10, 11, 12, 10, 11, 12] * 5), np.arange(50, 80)]
    mb = mask_spans(blocks, rng=np.random.default_rng(0), **IDS)
    assert mb.num_spans == 0
    # but a block of the same document is
    mb = mask_spans([np.arange(10, 40), np.arange(20, 50)], doc=["d", "d"],
                    rng=np.random.default_rng(0), **IDS)
    assert mb.num_spans > 0


def test_word_boundaries_respected_on_both_sides():
    # "ab" is one word [5, 6]; "a" alone is the word [5]
    words_a = [[5, 6], [9], [7], [8]] * 5
    words_b = [[5], [6, 9], [7, 8]] * 5
    ta, sa, ea = words_to_block(words_a)
    tb, sb, eb = words_to_block(words_b)
    blocks = [np.array(ta), np.array(tb)]
    ws = [np.array(sa), np.array(sb)]
    we = [np.array(ea), np.array(eb)]
    for seed in range(20):
        mb = mask_spans(blocks, ws, we, rng=np.random.default_rng(seed), mask_ratio=0.5, **IDS)
        check_batch(mb, blocks, ws, we, ratio=0.5)
        for tup in mb.span_tokens:
            # [5, 6] is a word in block 0 but not in block 1, so it never has a positive
            assert tup not in {(5, 6), (5,), (6,)}


def test_deterministic_given_generator():
    blocks, ws, we, docs = realistic_batch(np.random.default_rng(3))
    a = mask_spans(blocks, ws, we, docs, rng=np.random.default_rng(42), **IDS)
    b = mask_spans(blocks, ws, we, docs, rng=np.random.default_rng(42), **IDS)
    c = mask_spans(blocks, ws, we, docs, rng=np.random.default_rng(43), **IDS)
    for name in ("input_ids", "block", "start_mask_pos", "pos_span", "pos_block", "pos_start"):
        assert torch.equal(getattr(a, name), getattr(b, name))
    assert a.span_tokens == b.span_tokens
    assert not torch.equal(a.input_ids, c.input_ids)


def test_geometric_length_distribution():
    # each block appears twice in the batch, over a large vocabulary: every n-gram of a
    # block co-occurs exactly in its twin, so nothing but the sampler shapes lengths
    rng = np.random.default_rng(0)
    lengths = []
    for it in range(30):
        base = [rng.integers(5, 30000, size=256) for _ in range(8)]
        blocks = base + [b.copy() for b in base]
        mb = mask_spans(blocks, rng=np.random.default_rng(it), **IDS)
        lengths.extend(mb.span_len.tolist())
    lengths = np.array(lengths)
    assert len(lengths) > 2000
    # E[min(Geometric(0.5), 10)] = 1.998; the budget's end favours short spans slightly
    assert 1.7 < lengths.mean() < 2.1
    frac1 = float((lengths == 1).mean())
    frac2 = float((lengths == 2).mean())
    assert 0.42 < frac1 < 0.62
    assert 0.18 < frac2 < 0.32
    assert lengths.max() <= 10 and (lengths >= 5).any()


def test_max_length_bounds_masked_sequence():
    blocks = [np.array([5, 6] * 20), np.array([6, 5] * 20)]
    for seed in range(10):
        mb = mask_spans(blocks, rng=np.random.default_rng(seed), mask_ratio=0.5,
                        max_span_len=1, max_length=44, **IDS)
        assert int(mb.attention_mask.sum(1).max()) <= 44
        assert mb.num_spans <= 4  # 42 tokens + 1 position per 1-token span


def test_token_mode_basics():
    blocks, ws, we, docs = realistic_batch(np.random.default_rng(5))
    mb = mask_tokens(blocks, ws, we, docs, rng=np.random.default_rng(0), **IDS)
    assert mb.mode == "token" and mb.num_spans > 0
    assert torch.equal(mb.start_mask_pos, mb.end_mask_pos)
    assert torch.equal(mb.pos_start, mb.pos_end)
    assert bool((mb.span_len == 1).all())
    check_batch(mb, blocks, ws, we, mode="token")
    # about 15% of each block is masked when candidates abound
    frac = mb.span_len.sum().item() / sum(len(b) for b in blocks)
    assert 0.10 < frac <= 0.15


def test_to_moves_tensors():
    blocks, ws, we, docs = realistic_batch(np.random.default_rng(1), n_docs=2)
    mb = mask_spans(blocks, ws, we, docs, rng=np.random.default_rng(0), **IDS)
    mb2 = mb.to("cpu")
    assert torch.equal(mb2.input_ids, mb.input_ids) and mb2.span_tokens == mb.span_tokens


def test_bad_input_raises():
    rng = np.random.default_rng(0)
    with pytest.raises(DataError):
        mask_spans([], rng=rng, **IDS)
    with pytest.raises(DataError):
        mask_spans([np.arange(5)], [np.ones(4, bool)], rng=rng, **IDS)
    with pytest.raises(DataError):
        mask_spans([np.arange(5), np.arange(5)], doc=["a"], rng=rng, **IDS)
    with pytest.raises(DataError):
        mask_spans([np.zeros((2, 3), np.int64)], rng=rng, **IDS)
    with pytest.raises(DataError):
        mask_spans([np.array([1.5, 2.0])], rng=rng, **IDS)
    with pytest.raises(ProgrammingError):
        mask_spans([np.arange(5)], rng=rng, mask_ratio=1.5, **IDS)
    with pytest.raises(ProgrammingError):
        mask_spans([np.arange(5)], rng=rng, max_span_len=0, **IDS)


def test_speed_reasonable_for_64_blocks_of_256():
    import time
    blocks, ws, we, docs = realistic_batch(np.random.default_rng(0), n_docs=16,
                                           blocks_per_doc=4, block_words=160)
    blocks = [b[:256] for b in blocks]
    ws = [w[:256] for w in ws]
    we = [e[:256] for e in we]
    t0 = time.perf_counter()
    mb = mask_spans(blocks, ws, we, docs, rng=np.random.default_rng(0), **IDS)
    elapsed = time.perf_counter() - t0
    assert mb.num_spans > 64
    assert elapsed < 2.0


# --------------------------------------------------------------------------- span_unit="word"

# A dictionary pair in both directions, as the training corpus holds it: a Greek name that
# BERT's vocabulary cuts into one piece a letter (7 tokens, one word), a colon, an English
# name (1 token); and the reverse pair in another block.
GREEK = [40, 41, 42, 43, 44, 45, 46]
COLON, KYOTO = 50, 51


def pair_blocks():
    toks_a = GREEK + [COLON, KYOTO]
    toks_b = [KYOTO, COLON] + GREEK
    def flags(toks):
        ws = [t == GREEK[0] or t == KYOTO for t in toks]   # the colon is no clean edge
        we = [t == GREEK[-1] or t == KYOTO for t in toks]
        return ws, we
    (wa, ea), (wb, eb) = flags(toks_a), flags(toks_b)
    return [toks_a, toks_b], [wa, wb], [ea, eb]


def masked_words(mb):
    return [tuple(t) for t in mb.span_tokens]


def test_word_units_make_a_many_piece_word_in_a_short_block_a_target():
    blocks, ws, we = pair_blocks()
    tok_spans, word_spans = Counter(), Counter()
    for seed in range(200):
        tok_spans.update(masked_words(mask_spans(blocks, ws, we, [0, 1],
                                                 rng=np.random.default_rng(seed), **IDS)))
        mb = mask_spans(blocks, ws, we, [0, 1], rng=np.random.default_rng(seed),
                        span_unit="word", **IDS)
        word_spans.update(masked_words(mb))
        # a word's positive is the whole word in the other block, never the own block
        for m, (b, n) in enumerate(zip(mb.block.tolist(), mb.span_len.tolist())):
            sel = (mb.pos_span == m).nonzero().flatten().tolist()
            assert sel and all(int(mb.pos_block[k]) != b for k in sel)
            assert all(int(mb.pos_end[k] - mb.pos_start[k]) + 1 == n for k in sel)
    # in tokens the budget of a 9-token block is one token: the Greek word never fits
    assert tok_spans[tuple(GREEK)] == 0
    # in words each block masks one of its words: the Greek name about half the time
    assert 120 < word_spans[tuple(GREEK)] < 280
    assert word_spans[(KYOTO,)] > 100
    assert set(word_spans) == {tuple(GREEK), (KYOTO,)}


def test_word_units_budget_counts_words():
    rng = np.random.default_rng(3)
    blocks, ws, we, docs = realistic_batch(rng)
    for seed in range(5):
        mb = mask_spans(blocks, ws, we, docs, rng=np.random.default_rng(seed),
                        span_unit="word", **IDS)
        assert mb.num_spans > 0
        for b in range(len(blocks)):
            cw = word_counts(np.asarray(ws[b]), np.asarray(we[b]))
            words = [int(cw[s + n] - cw[s]) for bb, s, n in
                     zip(mb.block.tolist(), mb.span_start.tolist(), mb.span_len.tolist())
                     if bb == b]
            assert sum(words) <= max(1, math.floor(0.15 * int(cw[-1])))
            assert all(1 <= w for w in words)


def test_word_counts_and_bad_span_unit():
    # words: [a] [b c] [d] where d follows an end flag without its own start flag
    cw = word_counts(np.array([1, 1, 0, 0], bool), np.array([1, 0, 1, 0], bool))
    assert cw.tolist() == [0, 1, 2, 2, 3]
    with pytest.raises(ProgrammingError, match="span_unit"):
        mask_spans([[5, 6]], rng=np.random.default_rng(0), span_unit="char", **IDS)
