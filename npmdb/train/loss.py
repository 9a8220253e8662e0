"""NPM's contrastive training losses (phrase mode and token mode), pure torch.

For a query vector ``q`` (the encoder's last hidden state at a mask token) from block
``b``, the candidates are **all** real tokens (never ``[CLS]``, ``[SEP]`` or padding) of
the *other* blocks of the batch, encoded without masks; the positives are the candidates
that start (for ``q_s``) or end (for ``q_e``) an occurrence of the masked span (see
:mod:`npmdb.train.masking`). With ``sim(a, c) = a·c / sqrt(h)``::

    nll(q) = -log( sum_{c in pos(q)} exp(sim(q, c)) / sum_{c in cand(q)} exp(sim(q, c)) )
           = logsumexp_{cand(q)} sim(q, c) - logsumexp_{pos(q)} sim(q, c)

Phrase loss (NPM §3.2): ``mean over spans of (nll(q_s) + nll(q_e)) / 2``; token loss
(NPM SINGLE): ``mean over masked tokens of nll(q)``. Spans without a positive among the
candidates contribute nothing and are counted in :attr:`LossStats.num_skipped`; when
every span is skipped the loss is an exact zero that still backpropagates (zero
gradients), so a training step never has to special-case it.

The denominator can be computed in candidate chunks (``chunk_size``) with a running
logsumexp; with ``checkpoint`` (default: on when chunking under autograd) each chunk's
``[M, chunk]`` score matrix is recomputed in the backward pass instead of being kept,
so peak memory is ``O(M * chunk_size)``. The numerator is computed from the positive
pairs directly (``O(P * h)``). Both are exact: chunked == unchunked up to float
rounding. The loss is differentiable with respect to the queries and the candidate
vectors alike, which is what gradient-cache style training needs (detach the
candidates, ``requires_grad_()``, call the loss, backward, read ``.grad``).

Scores are computed in at least float32 (float64 inputs stay float64).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Protocol

import torch
from torch.utils.checkpoint import checkpoint as _checkpoint

from npmdb.errors import DataError, ProgrammingError

__all__ = ["LossStats", "ContrastiveResult", "contrastive_nll", "phrase_loss", "token_loss"]


class _Batch(Protocol):  # what the losses read from a masking.MaskedBatch
    block: torch.Tensor
    target_valid: torch.Tensor
    pos_span: torch.Tensor
    pos_block: torch.Tensor
    pos_start: torch.Tensor
    pos_end: torch.Tensor


@dataclasses.dataclass(frozen=True)
class LossStats:
    """Numbers to log for one loss evaluation (plain floats / ints, detached).

    ``start_*`` / ``end_*`` are means over the spans used; in token mode both hold the
    token-mode values. ``*_accuracy`` is the fraction of used spans whose best-scoring
    candidate is a positive (ties count as correct).
    """

    loss: float
    start_loss: float
    end_loss: float
    start_accuracy: float
    end_accuracy: float
    num_spans: int
    num_used: int
    num_skipped: int
    num_candidates: int

    def as_dict(self) -> dict[str, float | int]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True, eq=False)
class ContrastiveResult:
    """Per-query output of :func:`contrastive_nll` (all ``[M]``).

    ``nll`` is only meaningful where ``has_positive``; elsewhere it is 0 and carries no
    gradient. ``correct``: the best-scoring candidate is a positive (no gradient).
    """

    nll: torch.Tensor
    has_positive: torch.Tensor
    correct: torch.Tensor


def _score_dtype(*ts: torch.Tensor) -> torch.dtype:
    dtype = torch.float32
    for t in ts:
        dtype = torch.promote_types(dtype, t.dtype)
    return dtype


def _chunk(q: torch.Tensor, qblock: torch.Tensor, cand: torch.Tensor,
           cblock: torch.Tensor, cvalid: torch.Tensor, scale: float
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """(logsumexp, max) over one chunk of the allowed candidates, each ``[M]``.

    The max carries no gradient; rows without an allowed candidate get a very negative
    finite value from both (not -inf: -inf would put NaN into logsumexp's backward).
    """
    with torch.autocast(device_type=q.device.type, enabled=False):
        s = (q @ cand.to(q.dtype).T) * scale
        allowed = cvalid[None, :] & (cblock[None, :] != qblock[:, None])
        s = s.masked_fill(~allowed, torch.finfo(s.dtype).min)
        return torch.logsumexp(s, dim=1), s.detach().amax(dim=1)


def contrastive_nll(
    queries: torch.Tensor,
    query_block: torch.Tensor,
    candidates: torch.Tensor,
    candidate_block: torch.Tensor,
    pos_query: torch.Tensor,
    pos_candidate: torch.Tensor,
    *,
    candidate_valid: torch.Tensor | None = None,
    scale: float | None = None,
    chunk_size: int | None = None,
    checkpoint: bool | None = None,
) -> ContrastiveResult:
    """NPM's per-query contrastive negative log-likelihood, the building block of the losses.

    Args:
        queries: ``[M, h]`` query vectors.
        query_block: ``[M]`` the block each query comes from (its own block: excluded
            from numerator and denominator).
        candidates: ``[N, h]`` candidate vectors (e.g. the flattened unmasked batch).
        candidate_block: ``[N]`` the block of each candidate.
        pos_query, pos_candidate: ``[P]`` positive pairs (query index, candidate index).
            Pairs whose candidate is invalid or in the query's own block are ignored
            (the numerator is always a subset of the denominator); duplicates count once.
        candidate_valid: ``[N]`` bool, False for special and padding tokens (never
            candidates). Default: all valid.
        scale: multiplies the dot product; default ``1 / sqrt(h)``.
        chunk_size: compute the denominator over this many candidates at a time.
        checkpoint: recompute each chunk in backward instead of storing its scores;
            default: True when chunking with autograd on.

    Returns:
        A :class:`ContrastiveResult`.
    """
    if queries.dim() != 2 or candidates.dim() != 2 or queries.shape[1] != candidates.shape[1]:
        raise DataError(f"queries {tuple(queries.shape)} and candidates "
                        f"{tuple(candidates.shape)} must be [M, h] and [N, h]")
    M, h = queries.shape
    N = candidates.shape[0]
    dev = queries.device
    query_block = query_block.to(dev, torch.long).reshape(-1)
    candidate_block = candidate_block.to(dev, torch.long).reshape(-1)
    pos_query = pos_query.to(dev, torch.long).reshape(-1)
    pos_candidate = pos_candidate.to(dev, torch.long).reshape(-1)
    if query_block.numel() != M or candidate_block.numel() != N \
            or pos_query.numel() != pos_candidate.numel():
        raise DataError("query_block, candidate_block and positive pairs have wrong sizes")
    if candidate_valid is None:
        candidate_valid = torch.ones(N, dtype=torch.bool, device=dev)
    else:
        candidate_valid = candidate_valid.to(dev, torch.bool).reshape(-1)
        if candidate_valid.numel() != N:
            raise DataError("candidate_valid must have one entry per candidate")
    if chunk_size is not None and chunk_size < 1:
        raise ProgrammingError(f"chunk_size must be >= 1, got {chunk_size}")
    if scale is None:
        scale = 1.0 / math.sqrt(h)
    dtype = _score_dtype(queries, candidates)
    q = queries.to(dtype)
    candidates = candidates.to(dev)

    # ---- numerator: logsumexp over the positive pairs of each query
    if pos_query.numel():
        if int(pos_query.min()) < 0 or int(pos_query.max()) >= M \
                or int(pos_candidate.min()) < 0 or int(pos_candidate.max()) >= N:
            raise DataError("positive pair index out of range")
        keep = candidate_valid[pos_candidate] & (candidate_block[pos_candidate]
                                                 != query_block[pos_query])
        key = torch.unique(pos_query[keep] * N + pos_candidate[keep])
        pq, pc = key // N, key % N
    else:
        pq = pc = pos_query
    with torch.autocast(device_type=dev.type, enabled=False):
        s_pos = (q[pq] * candidates[pc].to(dtype)).sum(-1) * scale
    npos = torch.zeros(M, dtype=torch.long, device=dev).index_add_(
        0, pq, torch.ones_like(pq))
    has_pos = npos > 0
    with torch.no_grad():
        mx = torch.full((M,), -math.inf, dtype=dtype, device=dev)
        mx = mx.scatter_reduce(0, pq, s_pos.detach(), reduce="amax", include_self=True)
        mx = torch.where(has_pos, mx, torch.zeros_like(mx))
    sum_exp = torch.zeros(M, dtype=dtype, device=dev).index_add(0, pq, torch.exp(s_pos - mx[pq]))
    lse_pos = mx + torch.log(torch.where(has_pos, sum_exp, torch.ones_like(sum_exp)))

    # ---- denominator: logsumexp over all allowed candidates, chunked
    step = N if not chunk_size else chunk_size
    use_ckpt = (checkpoint if checkpoint is not None
                else (chunk_size is not None and step < N and torch.is_grad_enabled()))
    parts = []
    maxes = []
    grad = torch.is_grad_enabled() and (q.requires_grad or candidates.requires_grad)
    for c0 in range(0, max(N, 1), max(step, 1)):
        c1 = min(c0 + step, N)
        args = (q, query_block, candidates[c0:c1], candidate_block[c0:c1],
                candidate_valid[c0:c1], scale)
        if use_ckpt and grad:
            lse, mxc = _checkpoint(_chunk, *args, use_reentrant=False)
        else:
            lse, mxc = _chunk(*args)
        parts.append(lse)
        maxes.append(mxc)
    lse_all = torch.logsumexp(torch.stack(parts, dim=1), dim=1)
    with torch.no_grad():
        best_all = torch.stack(maxes, dim=1).amax(dim=1)
        # the positive scores come from a different kernel than the chunk matmuls, so
        # compare with a rounding tolerance (near-ties count as correct)
        tol = 64 * torch.finfo(dtype).eps * (1 + best_all.abs())
        correct = has_pos & (mx >= best_all - tol)

    nll = torch.where(has_pos, lse_all - lse_pos, torch.zeros_like(lse_all))
    return ContrastiveResult(nll=nll, has_positive=has_pos, correct=correct)


def _flatten_targets(target_hidden: torch.Tensor, batch: _Batch
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    valid = batch.target_valid
    B, Lt = valid.shape
    if target_hidden.dim() == 3:
        if tuple(target_hidden.shape[:2]) != (B, Lt):
            raise DataError(f"target hidden states {tuple(target_hidden.shape)} do not match "
                            f"target_ids {(B, Lt)}")
        cand = target_hidden.reshape(B * Lt, target_hidden.shape[-1])
    elif target_hidden.dim() == 2 and target_hidden.shape[0] == B * Lt:
        cand = target_hidden
    else:
        raise DataError(f"target hidden states must be [B, L', h] or [B*L', h], got "
                        f"{tuple(target_hidden.shape)} for target_ids {(B, Lt)}")
    dev = target_hidden.device
    cblock = torch.arange(B, device=dev).repeat_interleave(Lt)
    return cand, cblock, valid.to(dev).reshape(-1), Lt


def _stats(loss: torch.Tensor, rs: ContrastiveResult, re: ContrastiveResult,
           used: torch.Tensor, n_cand: int) -> LossStats:
    n_used = int(used.sum())
    M = int(used.numel())
    if n_used:
        sl = float(rs.nll.detach()[used].mean())
        el = float(re.nll.detach()[used].mean())
        sa = float(rs.correct[used].float().mean())
        ea = float(re.correct[used].float().mean())
    else:
        sl = el = sa = ea = 0.0
    return LossStats(loss=float(loss.detach()), start_loss=sl, end_loss=el,
                     start_accuracy=sa, end_accuracy=ea, num_spans=M, num_used=n_used,
                     num_skipped=M - n_used, num_candidates=n_cand)


def _mean_used(x: torch.Tensor, used: torch.Tensor, anchors: list[torch.Tensor]) -> torch.Tensor:
    if bool(used.any()):
        return x[used].mean()
    # nothing to learn from: an exact zero that is still connected to the graph
    zero = x.sum() * 0.0
    for a in anchors:
        if a.requires_grad:
            zero = zero + a.sum() * 0.0
    return zero


def phrase_loss(
    query_start: torch.Tensor,
    query_end: torch.Tensor,
    target_hidden: torch.Tensor,
    batch: _Batch | Any,
    *,
    scale: float | None = None,
    chunk_size: int | None = None,
    checkpoint: bool | None = None,
) -> tuple[torch.Tensor, LossStats]:
    """NPM's phrase-mode loss of a masked batch.

    Args:
        query_start, query_end: ``[M, h]`` hidden states of the masked input at
            ``batch.start_mask_pos`` / ``batch.end_mask_pos`` (rows of ``batch.block``),
            one row per span in the batch's order.
        target_hidden: hidden states of the unmasked ``batch.target_ids``: ``[B, L', h]``
            or flattened ``[B*L', h]``.
        batch: a :class:`npmdb.train.masking.MaskedBatch` (``mode == "phrase"``), or
            anything with its ``block``, ``target_valid`` and ``pos_*`` fields.
        scale, chunk_size, checkpoint: as in :func:`contrastive_nll`.

    Returns:
        ``(loss, stats)``: ``loss`` = mean over the spans that have a positive of
        ``(nll(q_s) + nll(q_e)) / 2`` — start and end weigh equally, as in NPM.
    """
    M = int(batch.block.numel())
    if query_start.shape[0] != M or query_end.shape[0] != M:
        raise DataError(f"{M} spans but {query_start.shape[0]} start and "
                        f"{query_end.shape[0]} end queries")
    cand, cblock, valid, Lt = _flatten_targets(target_hidden, batch)
    dev = cand.device
    qblock = batch.block.to(dev)
    pos_q = batch.pos_span.to(dev)
    pb = batch.pos_block.to(dev) * Lt
    opts = dict(candidate_valid=valid, scale=scale, chunk_size=chunk_size,
                checkpoint=checkpoint)
    rs = contrastive_nll(query_start, qblock, cand, cblock, pos_q,
                         pb + batch.pos_start.to(dev), **opts)
    re = contrastive_nll(query_end, qblock, cand, cblock, pos_q,
                         pb + batch.pos_end.to(dev), **opts)
    used = rs.has_positive & re.has_positive
    loss = _mean_used((rs.nll + re.nll) / 2, used, [query_start, query_end, cand])
    return loss, _stats(loss, rs, re, used, int(valid.sum()))


def token_loss(
    query: torch.Tensor,
    target_hidden: torch.Tensor,
    batch: _Batch | Any,
    *,
    scale: float | None = None,
    chunk_size: int | None = None,
    checkpoint: bool | None = None,
) -> tuple[torch.Tensor, LossStats]:
    """NPM SINGLE's token-mode loss: mean over masked tokens with a positive of ``nll(q)``.

    ``query`` is ``[M, h]``, the hidden states at ``batch.start_mask_pos``; positives are
    ``batch.pos_start``. Other arguments and the return value as in :func:`phrase_loss`
    (``stats.start_*`` and ``stats.end_*`` both hold the token values).
    """
    M = int(batch.block.numel())
    if query.shape[0] != M:
        raise DataError(f"{M} masked tokens but {query.shape[0]} queries")
    cand, cblock, valid, Lt = _flatten_targets(target_hidden, batch)
    dev = cand.device
    r = contrastive_nll(query, batch.block.to(dev), cand, cblock, batch.pos_span.to(dev),
                        batch.pos_block.to(dev) * Lt + batch.pos_start.to(dev),
                        candidate_valid=valid, scale=scale, chunk_size=chunk_size,
                        checkpoint=checkpoint)
    used = r.has_positive
    loss = _mean_used(r.nll, used, [query, cand])
    return loss, _stats(loss, r, r, used, int(valid.sum()))
