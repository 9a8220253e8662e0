"""NPM's contrastive losses (npmdb.train.loss) against a naive per-span computation."""

from __future__ import annotations

import importlib.util
import math
import pathlib
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch

if importlib.util.find_spec("npmdb") is None:  # running from a checkout, not installed
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from npmdb.errors import DataError  # noqa: E402
from npmdb.train.loss import contrastive_nll, phrase_loss, token_loss  # noqa: E402
from npmdb.train.masking import mask_spans, mask_tokens  # noqa: E402

IDS = dict(mask_id=1, cls_id=2, sep_id=3, pad_id=0)


def make_batch(seed: int, mode: str = "phrase", n_blocks: int = 6):
    rng = np.random.default_rng(seed)
    blocks = [rng.integers(5, 25, size=int(rng.integers(15, 40))) for _ in range(n_blocks)]
    fn = mask_spans if mode == "phrase" else mask_tokens
    mb = fn(blocks, rng=np.random.default_rng(seed), mask_ratio=0.3, **IDS)
    assert mb.num_spans > 0
    return mb


def naive_nll(q, block, T, valid, positives):
    """-log(sum_pos exp(sim) / sum_{other blocks' real tokens} exp(sim)), in float64 loops."""
    q = np.asarray(q, dtype=np.float64)
    T = np.asarray(T, dtype=np.float64)
    h = q.shape[0]
    den = 0.0
    for b in range(T.shape[0]):
        if b == block:
            continue
        for p in range(T.shape[1]):
            if valid[b][p]:
                den += math.exp(float(q @ T[b, p]) / math.sqrt(h))
    num = sum(math.exp(float(q @ T[b, p]) / math.sqrt(h)) for b, p in positives)
    return -math.log(num / den)


def naive_phrase_loss(qs, qe, T, mb):
    valid = mb.target_valid.tolist()
    total = 0.0
    for i in range(mb.num_spans):
        pos = mb.positives(i)
        b = int(mb.block[i])
        ls = naive_nll(qs[i], b, T, valid, [(pb, s) for pb, s, _ in pos])
        le = naive_nll(qe[i], b, T, valid, [(pb, e) for pb, _, e in pos])
        total += (ls + le) / 2
    return total / mb.num_spans


def naive_token_loss(q, T, mb):
    valid = mb.target_valid.tolist()
    total = 0.0
    for i in range(mb.num_spans):
        pos = [(pb, s) for pb, s, _ in mb.positives(i)]
        total += naive_nll(q[i], int(mb.block[i]), T, valid, pos)
    return total / mb.num_spans


def rand_states(mb, h=16, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    B, Lt = mb.target_ids.shape
    T = torch.randn(B, Lt, h, generator=g, dtype=dtype)
    qs = torch.randn(mb.num_spans, h, generator=g, dtype=dtype)
    qe = torch.randn(mb.num_spans, h, generator=g, dtype=dtype)
    return qs, qe, T


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_phrase_loss_matches_naive(seed, dtype):
    mb = make_batch(seed)
    qs, qe, T = rand_states(mb, seed=seed, dtype=dtype)
    loss, stats = phrase_loss(qs, qe, T, mb)
    ref = naive_phrase_loss(qs.double().numpy(), qe.double().numpy(), T.double().numpy(), mb)
    assert abs(loss.item() - ref) < 1e-5
    assert stats.num_spans == mb.num_spans == stats.num_used and stats.num_skipped == 0
    assert stats.num_candidates == int(mb.target_valid.sum())
    assert abs((stats.start_loss + stats.end_loss) / 2 - ref) < 1e-5
    # the flattened [B*L', h] form gives the same value
    loss2, _ = phrase_loss(qs, qe, T.reshape(-1, T.shape[-1]), mb)
    assert abs(loss2.item() - loss.item()) < 1e-9


@pytest.mark.parametrize("seed", range(4))
def test_token_loss_matches_naive(seed):
    mb = make_batch(seed, mode="token")
    q, _, T = rand_states(mb, seed=seed)
    loss, stats = token_loss(q, T, mb)
    ref = naive_token_loss(q.numpy(), T.numpy(), mb)
    assert abs(loss.item() - ref) < 1e-5
    assert stats.start_loss == stats.end_loss and stats.num_used == mb.num_spans


@pytest.mark.parametrize("chunk", [1, 3, 7, 64, 10_000])
@pytest.mark.parametrize("ckpt", [None, True, False])
def test_chunked_equals_unchunked_values_and_gradients(chunk, ckpt):
    mb = make_batch(11)
    qs, qe, T = rand_states(mb, seed=1)
    leaves = [x.clone().requires_grad_() for x in (qs, qe, T)]
    full, s_full = phrase_loss(*leaves, mb)
    full.backward()
    g_full = [x.grad.clone() for x in leaves]
    leaves2 = [x.clone().requires_grad_() for x in (qs, qe, T)]
    part, s_part = phrase_loss(*leaves2, mb, chunk_size=chunk, checkpoint=ckpt)
    part.backward()
    assert abs(full.item() - part.item()) < 1e-10
    for a, b in zip(g_full, leaves2):
        assert torch.allclose(a, b.grad, atol=1e-10)
    assert s_full.start_accuracy == s_part.start_accuracy
    assert s_full.end_accuracy == s_part.end_accuracy

    mbt = make_batch(11, "token")
    q, _, T = rand_states(mbt, seed=2)
    full, _ = token_loss(q, T, mbt)
    part, _ = token_loss(q, T, mbt, chunk_size=chunk, checkpoint=ckpt)
    assert abs(full.item() - part.item()) < 1e-10


def one_block_batch():
    """Spans only in block 0; positives in blocks 1 and 2; block 0 also has a token
    equal to the positives' (which must not count)."""
    valid = torch.zeros(3, 6, dtype=torch.bool)
    valid[:, 1:5] = True
    return SimpleNamespace(
        block=torch.tensor([0, 0]),
        target_valid=valid,
        pos_span=torch.tensor([0, 0, 1]),
        pos_block=torch.tensor([1, 2, 2]),
        pos_start=torch.tensor([1, 2, 3]),
        pos_end=torch.tensor([2, 3, 4]),
    )


def test_own_block_excluded_from_numerator_and_denominator():
    mb = one_block_batch()
    g = torch.Generator().manual_seed(0)
    T = torch.randn(3, 6, 8, generator=g, dtype=torch.float64)
    qs = torch.randn(2, 8, generator=g, dtype=torch.float64)
    qe = torch.randn(2, 8, generator=g, dtype=torch.float64)
    base, _ = phrase_loss(qs, qe, T, mb)
    T2 = T.clone()
    T2[0] = torch.randn(6, 8, generator=g, dtype=torch.float64) * 10  # own block
    T2[1:, 0] = 100.0  # [CLS]
    T2[1:, 5] = -100.0  # [SEP] / pad
    same, _ = phrase_loss(qs, qe, T2, mb)
    assert same.item() == pytest.approx(base.item(), abs=1e-12)
    T3 = T.clone()
    T3[1, 4] += 1.0  # a real candidate of another block
    assert abs(phrase_loss(qs, qe, T3, mb)[0].item() - base.item()) > 1e-6
    # gradients reach other blocks' real tokens only
    Tg = T.clone().requires_grad_()
    phrase_loss(qs, qe, Tg, mb)[0].backward()
    assert torch.count_nonzero(Tg.grad[0]) == 0
    assert torch.count_nonzero(Tg.grad[1:, 0]) == 0 and torch.count_nonzero(Tg.grad[1:, 5]) == 0
    assert torch.count_nonzero(Tg.grad[1:, 1:5]) > 0
    # naive check on this hand-made batch too
    valid = mb.target_valid.tolist()
    ref = 0.0
    for i, pos in enumerate([[(1, 1, 2), (2, 2, 3)], [(2, 3, 4)]]):
        ref += (naive_nll(qs[i].numpy(), 0, T.numpy(), valid, [(b, s) for b, s, _ in pos])
                + naive_nll(qe[i].numpy(), 0, T.numpy(), valid, [(b, e) for b, _, e in pos])) / 2
    assert base.item() == pytest.approx(ref / 2, abs=1e-10)


def test_own_block_positive_is_ignored_and_span_skipped():
    mb = one_block_batch()
    mb.pos_block = torch.tensor([1, 2, 0])  # span 1's only positive is in its own block
    T = torch.randn(3, 6, 8, dtype=torch.float64)
    qs = torch.randn(2, 8, dtype=torch.float64)
    qe = torch.randn(2, 8, dtype=torch.float64)
    loss, stats = phrase_loss(qs, qe, T, mb)
    assert stats.num_used == 1 and stats.num_skipped == 1
    valid = mb.target_valid.tolist()
    ref = (naive_nll(qs[0].numpy(), 0, T.numpy(), valid, [(1, 1), (2, 2)])
           + naive_nll(qe[0].numpy(), 0, T.numpy(), valid, [(1, 2), (2, 3)])) / 2
    assert loss.item() == pytest.approx(ref, abs=1e-10)


def test_no_positive_at_all_gives_zero_loss_that_backpropagates():
    mb = one_block_batch()
    for name in ("pos_span", "pos_block", "pos_start", "pos_end"):
        setattr(mb, name, torch.zeros(0, dtype=torch.long))
    T = torch.randn(3, 6, 8, requires_grad=True)
    qs = torch.randn(2, 8, requires_grad=True)
    qe = torch.randn(2, 8, requires_grad=True)
    loss, stats = phrase_loss(qs, qe, T, mb, chunk_size=4)
    assert loss.item() == 0.0 and stats.num_skipped == 2 and stats.num_used == 0
    loss.backward()
    for x in (qs, qe, T):
        assert x.grad is not None and torch.isfinite(x.grad).all()
        assert torch.count_nonzero(x.grad) == 0


def test_gradients_flow_and_are_finite():
    mb = make_batch(3)
    qs, qe, T = (x.float().requires_grad_() for x in rand_states(mb, seed=3))
    loss, _ = phrase_loss(qs, qe, T, mb, chunk_size=50)
    loss.backward()
    for x in (qs, qe, T):
        assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    assert (qs.grad.abs().sum(1) > 0).all() and (qe.grad.abs().sum(1) > 0).all()

    mbt = make_batch(3, "token")
    q, _, T = (x.float().requires_grad_() for x in rand_states(mbt, seed=3))
    loss, _ = token_loss(q, T, mbt, chunk_size=33)
    loss.backward()
    assert (q.grad.abs().sum(1) > 0).all() and T.grad.abs().sum() > 0


def test_loss_decreases_with_a_few_steps_and_accuracy_reported():
    mb = make_batch(4)
    qs, qe, T = (x.float() for x in rand_states(mb, seed=4))
    qs.requires_grad_()
    qe.requires_grad_()
    opt = torch.optim.SGD([qs, qe], lr=5.0)
    first = None
    for _ in range(100):
        opt.zero_grad()
        loss, stats = phrase_loss(qs, qe, T, mb)
        loss.backward()
        opt.step()
        first = first if first is not None else loss.item()
    assert loss.item() < first / 2
    assert stats.start_accuracy > 0.5 and stats.end_accuracy > 0.5


def test_gradient_matches_finite_differences():
    mb = one_block_batch()
    g = torch.Generator().manual_seed(5)
    T = torch.randn(3, 6, 4, generator=g, dtype=torch.float64, requires_grad=True)
    qs = torch.randn(2, 4, generator=g, dtype=torch.float64, requires_grad=True)
    qe = torch.randn(2, 4, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda a, b, c: phrase_loss(a, b, c, mb, chunk_size=5)[0], (qs, qe, T))


def test_contrastive_nll_direct_and_large_scores_are_stable():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(3, 8, generator=g) * 1000  # huge similarities: naive exp overflows
    C = torch.randn(20, 8, generator=g) * 1000
    cb = torch.arange(20) % 4
    qb = torch.tensor([0, 1, 2])
    pq = torch.tensor([0, 1, 1, 2, 2])
    pc = torch.tensor([1, 2, 6, 3, 3])  # duplicate pair counts once
    r = contrastive_nll(q, qb, C, cb, pq, pc, chunk_size=6)
    assert torch.isfinite(r.nll).all() and r.has_positive.all()
    s = (q.double() @ C.double().T) / math.sqrt(8)
    for i, pos in enumerate([[1], [2, 6], [3]]):
        allowed = cb != qb[i]
        ref = torch.logsumexp(s[i][allowed], 0) - torch.logsumexp(s[i][pos], 0)
        assert r.nll[i].item() == pytest.approx(ref.item(), rel=1e-4, abs=1e-3)
        assert bool(r.correct[i]) == bool(s[i][pos].max() >= s[i][allowed].max())


def test_bad_shapes_raise():
    mb = make_batch(0)
    qs, qe, T = rand_states(mb)
    with pytest.raises(DataError):
        phrase_loss(qs[:-1], qe, T, mb)
    with pytest.raises(DataError):
        phrase_loss(qs, qe, T[:, :-1], mb)
    with pytest.raises(DataError):
        token_loss(qs[:-1], T, mb)


def test_batch_without_spans():
    mb = mask_spans([np.arange(10, 30), np.arange(40, 60)], rng=np.random.default_rng(0), **IDS)
    assert mb.num_spans == 0
    T = torch.randn(2, 22, 8, requires_grad=True)
    q = torch.zeros(0, 8, requires_grad=True)
    loss, stats = phrase_loss(q, q, T, mb, chunk_size=7)
    loss.backward()
    assert loss.item() == 0.0 and stats.num_spans == 0 and stats.num_candidates == 40
    loss, stats = token_loss(q, T, mb)
    assert loss.item() == 0.0 and stats.num_skipped == 0
