"""NPM's masking for training: spans that co-occur in another block of the batch.

Pure functions over numpy arrays (plus torch for the output tensors); no model, no I/O.

A *batch* is a list of blocks (document-grouped: several blocks of the same documents
appear together, so that spans co-occur). Each block is a 1-D integer array of token ids
**without** special tokens, with per-token boolean arrays ``word_start`` / ``word_end``
(the token begins / ends a word).

Phrase mode (:func:`mask_spans`, NPM; Min et al. 2023, §3.2 and appendix A.3):

* a *candidate span* is a token n-gram of 1..``max_span_len`` tokens that starts at a
  word start, ends at a word end, and whose exact token-id tuple also occurs (on word
  boundaries, see ``boundary_positives``) in at least one **other** block of the batch.
  Other blocks of the same document count; the span's own block never does;
* per block, span lengths are drawn from ``Geometric(p=0.5)`` clipped to
  ``max_span_len`` and a span of that length is drawn uniformly among the free
  candidates; masking stops when the budget (``floor(mask_ratio * len(block))``
  tokens, i.e. at most 15 %) is spent, at ``max_spans_per_block`` spans (64), or after
  ``max_failures`` consecutive draws found no candidate;
* spans never overlap and are never adjacent (``min_gap`` = 1 unmasked token between
  them); one n-gram (token tuple) is masked at most ``max_ngram_count`` (10) times per
  batch; blocks are visited in a random order so that cap favours no block;
* every masked span is replaced by **two** mask tokens (``q_s`` and ``q_e`` are read at
  them), so masked sequences are shorter/longer than the originals.

Token mode (:func:`mask_tokens`, NPM SINGLE): spans of exactly one token, one mask token
each; positives are the same token id anywhere in the other blocks.

Targets are defined over the *unmasked* encoding of the batch, ``target_ids`` =
``[CLS] block [SEP]`` padded (what the encoder encodes to give candidate vectors). For
every masked span the positives are stored in coordinate form: entry ``k`` says that
span ``pos_span[k]`` has an occurrence in block ``pos_block[k]`` whose first token is at
``target_ids[pos_block[k], pos_start[k]]`` and whose last token is at
``target_ids[pos_block[k], pos_end[k]]``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, Callable

import numpy as np
import torch

from npmdb.errors import DataError, ProgrammingError

__all__ = ["MaskedBatch", "mask_spans", "mask_tokens", "word_counts", "SPAN_UNITS"]

#: How span lengths and the masking budget are counted (``mask_spans(span_unit=...)``).
SPAN_UNITS = ("token", "word")


@dataclasses.dataclass(frozen=True, eq=False)
class MaskedBatch:
    """A masked training batch and the positives of every masked span.

    Shapes: ``B`` blocks, ``L`` masked length, ``L'`` target length, ``M`` masked spans,
    ``P`` (span, occurrence) positive pairs. All index tensors are ``torch.long``.

    Attributes:
        mode: ``"phrase"`` (two mask tokens per span) or ``"token"`` (one).
        input_ids: ``[B, L]`` ``[CLS] masked block [SEP]``, right-padded with ``pad_id``.
        attention_mask: ``[B, L]`` 1 for real tokens, 0 for padding.
        target_ids: ``[B, L']`` ``[CLS] block [SEP]`` (unmasked), right-padded.
        target_attention_mask: ``[B, L']``.
        target_valid: ``[B, L']`` bool, True for the tokens that are candidates in the
            loss (every token of a block; never ``[CLS]``, ``[SEP]`` or padding).
        doc: the document id of every block (as given, or ``None``).
        block: ``[M]`` the block each span was masked in (spans sorted by block, start).
        start_mask_pos, end_mask_pos: ``[M]`` positions in ``input_ids[block]`` of the
            span's first and last mask token (equal in token mode).
        span_start: ``[M]`` offset of the span's first token in its block (no ``[CLS]``),
            so its tokens in ``target_ids`` are ``span_start+1 .. span_start+span_len``.
        span_len: ``[M]`` number of tokens in the span.
        span_tokens: the token-id tuple of every span.
        pos_span, pos_block, pos_start, pos_end: ``[P]`` positives in coordinate form;
            positions index ``target_ids`` (so include the ``[CLS]`` offset). Sorted by
            span, then block, then position; ``pos_block != block[pos_span]`` always.
    """

    mode: str
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    target_ids: torch.Tensor
    target_attention_mask: torch.Tensor
    target_valid: torch.Tensor
    doc: tuple[Any, ...]
    block: torch.Tensor
    start_mask_pos: torch.Tensor
    end_mask_pos: torch.Tensor
    span_start: torch.Tensor
    span_len: torch.Tensor
    span_tokens: tuple[tuple[int, ...], ...]
    pos_span: torch.Tensor
    pos_block: torch.Tensor
    pos_start: torch.Tensor
    pos_end: torch.Tensor

    @property
    def num_blocks(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_spans(self) -> int:
        return int(self.block.shape[0])

    @property
    def num_positives(self) -> int:
        return int(self.pos_span.shape[0])

    def positives(self, span: int) -> list[tuple[int, int, int]]:
        """``(block, start, end)`` in ``target_ids`` coordinates of one span's positives."""
        sel = (self.pos_span == span).nonzero().flatten()
        return [(int(self.pos_block[k]), int(self.pos_start[k]), int(self.pos_end[k]))
                for k in sel.tolist()]

    def to(self, device: torch.device | str) -> MaskedBatch:
        """A copy with every tensor moved to ``device``."""
        moved = {f.name: getattr(self, f.name).to(device)
                 for f in dataclasses.fields(self)
                 if isinstance(getattr(self, f.name), torch.Tensor)}
        return dataclasses.replace(self, **moved)


# --------------------------------------------------------------------------- helpers

def _as_block(x: Any, i: int) -> np.ndarray:
    a = np.asarray(x)
    if a.ndim != 1:
        raise DataError(f"block {i}: expected a 1-D array of token ids, got shape {a.shape}")
    if a.size and not np.issubdtype(a.dtype, np.integer):
        raise DataError(f"block {i}: token ids must be integers, got dtype {a.dtype}")
    return a.astype(np.int64, copy=False)


def _as_flags(x: Any, n: int, i: int, name: str) -> np.ndarray:
    if x is None:
        return np.ones(n, dtype=bool)
    a = np.asarray(x, dtype=bool)
    if a.shape != (n,):
        raise DataError(f"block {i}: {name} has shape {a.shape}, expected ({n},)")
    return a


def _prepare(blocks: Sequence[Any], word_start: Sequence[Any] | None,
             word_end: Sequence[Any] | None, doc: Sequence[Any] | None
             ) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray], tuple[Any, ...]]:
    if isinstance(blocks, np.ndarray) and blocks.ndim == 2:
        blocks = list(blocks)
    blocks = list(blocks)
    if not blocks:
        raise DataError("a training batch needs at least one block")
    B = len(blocks)
    for name, arg in (("word_start", word_start), ("word_end", word_end), ("doc", doc)):
        if arg is not None and len(arg) != B:
            raise DataError(f"{name} has {len(arg)} entries for {B} blocks")
    toks = [_as_block(b, i) for i, b in enumerate(blocks)]
    ws = [_as_flags(None if word_start is None else word_start[i], len(t), i, "word_start")
          for i, t in enumerate(toks)]
    we = [_as_flags(None if word_end is None else word_end[i], len(t), i, "word_end")
          for i, t in enumerate(toks)]
    docs = tuple(doc) if doc is not None else (None,) * B
    return toks, ws, we, docs


def _check_options(mask_ratio: float, max_span_len: int, max_spans_per_block: int,
                   max_ngram_count: int, min_gap: int, max_failures: int,
                   geometric_p: float, max_length: int | None) -> None:
    if not 0.0 <= mask_ratio <= 1.0:
        raise ProgrammingError(f"mask_ratio must be in [0, 1], got {mask_ratio}")
    if max_span_len < 1:
        raise ProgrammingError(f"max_span_len must be >= 1, got {max_span_len}")
    if max_spans_per_block < 0 or max_ngram_count < 0 or max_failures < 1 or min_gap < 0:
        raise ProgrammingError("max_spans_per_block, max_ngram_count and min_gap must be "
                               ">= 0 and max_failures >= 1")
    if not 0.0 < geometric_p <= 1.0:
        raise ProgrammingError(f"geometric_p must be in (0, 1], got {geometric_p}")
    if max_length is not None and max_length < 2:
        raise ProgrammingError(f"max_length must be >= 2, got {max_length}")


class _NgramIndex:
    """Every n-gram (n = 1..max_n) of the batch grouped by its token tuple.

    ``query_rule(n, fws, fwe, i, j)`` / ``positive_rule(...)`` say which windows
    ``flat[i..j]`` may be masked / may serve as a positive. For each length and block the
    index keeps the maskable windows that have a positive occurrence in another block
    (``cand[n][b] = (starts, group ids)``), and for each group its positive occurrences.
    """

    def __init__(self, toks: list[np.ndarray], ws: list[np.ndarray], we: list[np.ndarray],
                 max_n: int, query_rule: Callable[..., np.ndarray],
                 positive_rule: Callable[..., np.ndarray]) -> None:
        B = len(toks)
        lens = np.array([len(t) for t in toks], dtype=np.int64)
        N = int(lens.sum())
        flat = np.concatenate(toks) if N else np.zeros(0, np.int64)
        fws = np.concatenate(ws) if N else np.zeros(0, bool)
        fwe = np.concatenate(we) if N else np.zeros(0, bool)
        fb = np.repeat(np.arange(B, dtype=np.int64), lens)
        offs = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        fp = np.arange(N, dtype=np.int64) - offs[fb]
        after = (lens - 1)[fb] - fp  # tokens after flat[i] in its own block

        self.cand: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
        empty = (np.zeros(0, np.int64), np.zeros(0, np.int64))
        pos_g, pos_b, pos_s, pos_n = [], [], [], []
        n_groups = 0
        for n in range(1, max_n + 1):
            self.cand[n] = [empty] * B
            i = np.flatnonzero(after >= n - 1)
            if i.size == 0:
                continue
            j = i + (n - 1)
            q_ok = np.asarray(query_rule(n, fws, fwe, i, j), dtype=bool)
            p_ok = np.asarray(positive_rule(n, fws, fwe, i, j), dtype=bool)
            keep = q_ok | p_ok
            i, j, q_ok, p_ok = i[keep], j[keep], q_ok[keep], p_ok[keep]
            if i.size == 0:
                continue
            win = np.lib.stride_tricks.sliding_window_view(flat, n)[i]
            keys = np.ascontiguousarray(win).view(np.dtype((np.void, 8 * n))).ravel()
            uniq, inv = np.unique(keys, return_inverse=True)
            inv = inv.ravel().astype(np.int64)
            G = len(uniq)
            wb = fb[i]
            # distinct (group, block) pairs among positive-eligible windows
            pkeys = np.unique(inv[p_ok] * B + wb[p_ok])
            nblocks = np.bincount(pkeys // B, minlength=G)
            q = np.flatnonzero(q_ok)
            qkey = inv[q] * B + wb[q]
            if len(pkeys):
                loc = np.minimum(np.searchsorted(pkeys, qkey), len(pkeys) - 1)
                own = pkeys[loc] == qkey  # the window's own block has a positive occurrence
            else:
                own = np.zeros(len(q), dtype=bool)
            q = q[nblocks[inv[q]] - own.astype(np.int64) >= 1]
            # q is in flat order: block-major, start ascending
            qb = wb[q]
            bounds = np.searchsorted(qb, np.arange(B + 1))
            qs = fp[i[q]]
            qg = inv[q] + n_groups
            for b in np.flatnonzero(np.diff(bounds)):
                self.cand[n][b] = (qs[bounds[b]:bounds[b + 1]], qg[bounds[b]:bounds[b + 1]])
            pos_g.append(inv[p_ok] + n_groups)
            pos_b.append(wb[p_ok])
            pos_s.append(fp[i[p_ok]])
            pos_n.append(np.full(int(p_ok.sum()), n, np.int64))
            n_groups += G
        self.n_groups = n_groups
        if pos_g:
            g = np.concatenate(pos_g)
            order = np.argsort(g, kind="stable")  # within a group: block, then position
            self._pb = np.concatenate(pos_b)[order]
            self._ps = np.concatenate(pos_s)[order]
            self._gbounds = np.searchsorted(g[order], np.arange(n_groups + 1))
        else:
            self._pb = self._ps = np.zeros(0, np.int64)
            self._gbounds = np.zeros(n_groups + 1, np.int64)

    def positives(self, group: int, block: int) -> tuple[np.ndarray, np.ndarray]:
        """(blocks, starts) of the group's positive occurrences outside ``block``."""
        lo, hi = self._gbounds[group], self._gbounds[group + 1]
        b, s = self._pb[lo:hi], self._ps[lo:hi]
        keep = b != block
        return b[keep], s[keep]


def _word_candidates(index: "_NgramIndex", b: int, cw: np.ndarray, w: int, max_n: int
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Block ``b``'s maskable spans of exactly ``w`` words (``cw``: running count of word
    starts), of any number of tokens up to ``max_n``: (starts, groups, token lengths)."""
    starts, groups, lens = [], [], []
    for n in range(w, max_n + 1):
        st, gr = index.cand[n][b]
        if st.size:
            sel = (cw[st + n] - cw[st]) == w
            starts.append(st[sel])
            groups.append(gr[sel])
            lens.append(np.full(int(sel.sum()), n, np.int64))
    if not starts:
        empty = np.zeros(0, np.int64)
        return empty, empty, empty
    return np.concatenate(starts), np.concatenate(groups), np.concatenate(lens)


def word_counts(ws: np.ndarray, we: np.ndarray) -> np.ndarray:
    """Running count of word starts (``out[i]`` = words that start before token ``i``;
    length ``len(ws) + 1``): a word starts at a token flagged as a start, after a token
    flagged as an end, and at the block's first token."""
    n = len(ws)
    first = np.asarray(ws, dtype=bool).copy()
    if n:
        first[0] = True
        first[1:] |= np.asarray(we, dtype=bool)[:-1]
    return np.concatenate([[0], np.cumsum(first)]).astype(np.int64)


def _mask(toks: list[np.ndarray], index: _NgramIndex, docs: tuple[Any, ...], *,
          mode: str, n_masks: int, sample_len: Callable[[], int], rng: np.random.Generator,
          mask_id: int, cls_id: int, sep_id: int, pad_id: int, mask_ratio: float,
          max_spans_per_block: int, max_ngram_count: int, min_gap: int, max_failures: int,
          max_length: int | None, word_counts: list[np.ndarray] | None = None,
          max_span_len: int = 0) -> MaskedBatch:
    """``word_counts`` (per block, the running count of word starts, length ``L + 1``):
    span lengths and the budget are counted in words (``span_unit="word"``)."""
    B = len(toks)
    counts = np.zeros(index.n_groups, dtype=np.int64)
    chosen: list[list[tuple[int, int, int]]] = [[] for _ in range(B)]
    for b in rng.permutation(B).tolist():
        L = len(toks[b])
        cw = None if word_counts is None else word_counts[b]
        if cw is None:
            remaining = int(math.floor(mask_ratio * L + 1e-9))
        else:  # at least one word of a block with two or more (short blocks: a pair)
            words = int(cw[-1])
            remaining = max(1, int(math.floor(mask_ratio * words + 1e-9))) if words >= 2 else 0
        masked = np.zeros(L, dtype=np.int64)
        cur_len = L + 2  # length of the masked sequence with [CLS] and [SEP]
        fails = 0
        taken = chosen[b]
        while remaining > 0 and len(taken) < max_spans_per_block and fails < max_failures:
            w = n = sample_len()
            if cw is None:
                if n > remaining:
                    fails += 1
                    continue
                starts, groups = index.cand[n][b]
                lens = np.full(starts.size, n, np.int64)
            else:  # every candidate of ``w`` words, whatever its number of tokens
                if w > remaining:
                    fails += 1
                    continue
                starts, groups, lens = _word_candidates(index, b, cw, w, max_span_len)
            if max_length is not None:
                fit = cur_len + n_masks - lens <= max_length
                starts, groups, lens = starts[fit], groups[fit], lens[fit]
            if starts.size == 0:
                fails += 1
                continue
            ok = counts[groups] < max_ngram_count
            c = np.concatenate([[0], np.cumsum(masked)])
            lo = np.maximum(starts - min_gap, 0)
            hi = np.minimum(starts + lens + min_gap, L)
            ok &= (c[hi] - c[lo]) == 0
            idx = np.flatnonzero(ok)
            if idx.size == 0:
                fails += 1
                continue
            k = int(idx[rng.integers(idx.size)])
            s, g, n = int(starts[k]), int(groups[k]), int(lens[k])
            masked[s:s + n] = 1
            counts[g] += 1
            remaining -= n if cw is None else w
            cur_len += n_masks - n
            taken.append((s, n, g))
            fails = 0

    # ---- assemble tensors
    rows: list[np.ndarray] = []
    sp_block, sp_smask, sp_emask, sp_start, sp_len, sp_tokens = [], [], [], [], [], []
    p_span, p_block, p_start, p_end = [], [], [], []
    m = 0
    cls = np.array([cls_id], np.int64)
    sep = np.array([sep_id], np.int64)
    masks = np.full(n_masks, mask_id, np.int64)
    for b in range(B):
        t = toks[b]
        pieces = [cls]
        length = 1
        prev = 0
        for s, n, g in sorted(chosen[b]):
            pieces.append(t[prev:s])
            length += s - prev
            sp_block.append(b)
            sp_smask.append(length)
            sp_emask.append(length + n_masks - 1)
            sp_start.append(s)
            sp_len.append(n)
            sp_tokens.append(tuple(int(x) for x in t[s:s + n]))
            pieces.append(masks)
            length += n_masks
            prev = s + n
            pb, ps = index.positives(g, b)
            if pb.size == 0:  # cannot happen: candidates were chosen for having positives
                raise AssertionError("masked span without a positive")
            p_span.append(np.full(pb.size, m, np.int64))
            p_block.append(pb)
            p_start.append(ps + 1)
            p_end.append(ps + n)
            m += 1
        pieces.append(t[prev:])
        pieces.append(sep)
        rows.append(np.concatenate(pieces))

    def pad(seqs: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(r) for r in seqs)
        ids = np.full((len(seqs), width), pad_id, np.int64)
        att = np.zeros((len(seqs), width), np.int64)
        for r, seq in enumerate(seqs):
            ids[r, :len(seq)] = seq
            att[r, :len(seq)] = 1
        return torch.from_numpy(ids), torch.from_numpy(att)

    input_ids, attention_mask = pad(rows)
    target_ids, target_attention = pad([np.concatenate([cls, t, sep]) for t in toks])
    valid = np.zeros(tuple(target_ids.shape), dtype=bool)
    for b, t in enumerate(toks):
        valid[b, 1:len(t) + 1] = True

    def lt(x: list[int] | list[np.ndarray]) -> torch.Tensor:
        if x and isinstance(x[0], np.ndarray):
            return torch.from_numpy(np.concatenate(x).astype(np.int64))
        return torch.tensor(x, dtype=torch.long)

    return MaskedBatch(
        mode=mode, input_ids=input_ids, attention_mask=attention_mask,
        target_ids=target_ids, target_attention_mask=target_attention,
        target_valid=torch.from_numpy(valid), doc=docs,
        block=lt(sp_block), start_mask_pos=lt(sp_smask), end_mask_pos=lt(sp_emask),
        span_start=lt(sp_start), span_len=lt(sp_len), span_tokens=tuple(sp_tokens),
        pos_span=lt(p_span), pos_block=lt(p_block), pos_start=lt(p_start), pos_end=lt(p_end),
    )


# --------------------------------------------------------------------------- public API

def mask_spans(
    blocks: Sequence[Any],
    word_start: Sequence[Any] | None = None,
    word_end: Sequence[Any] | None = None,
    doc: Sequence[Any] | None = None,
    *,
    mask_id: int,
    cls_id: int,
    sep_id: int,
    pad_id: int,
    rng: np.random.Generator,
    mask_ratio: float = 0.15,
    max_span_len: int = 10,
    geometric_p: float = 0.5,
    max_spans_per_block: int = 64,
    max_ngram_count: int = 10,
    min_gap: int = 1,
    boundary_positives: bool = True,
    max_failures: int = 25,
    max_length: int | None = None,
    span_unit: str = "token",
) -> MaskedBatch:
    """NPM phrase-mode masking of a document-grouped batch (see the module docstring).

    Args:
        blocks: ``B`` 1-D integer arrays of token ids, without special tokens.
        word_start, word_end: per block, a bool array (same length) saying whether each
            token begins / ends a word. ``None`` means every token is a whole word.
        doc: per block, its document id (kept in the result; co-occurrences in other
            blocks of the same document count as positives).
        mask_id, cls_id, sep_id, pad_id: the tokenizer's special token ids.
        rng: the only source of randomness: equal generators give equal batches.
        mask_ratio: budget: at most ``floor(mask_ratio * len(block))`` tokens masked.
        max_span_len: span lengths are ``min(Geometric(geometric_p), max_span_len)``.
        max_spans_per_block: at most this many spans per block.
        max_ngram_count: one token tuple is masked at most this many times per batch.
        min_gap: unmasked tokens required between two spans (1: never adjacent).
        boundary_positives: if True (default) an occurrence in another block is a
            positive only when it, too, starts at a word start and ends at a word end
            (the only spans retrieval can return); if False any token match counts.
        max_failures: a block stops after this many consecutive length draws for which
            no free candidate span existed (or it would overrun the budget).
        max_length: if given, no block's masked sequence (with [CLS]/[SEP]) grows beyond
            it (a 1-token span becomes two mask tokens, adding one position).
        span_unit: ``"token"`` (NPM: lengths and the budget in tokens) or ``"word"``:
            a span is ``Geometric(geometric_p)`` *words* of up to ``max_span_len``
            tokens, and the budget is ``mask_ratio`` of the block's words, at least one
            word in a block of two or more. A word that the tokenizer cuts into many
            pieces (a Greek or Cyrillic name is one piece a letter under BERT's vocabulary)
            is then drawn as often as a short one, and a short block (a dictionary pair,
            "Κιότο: Kyoto") still gets a span: in tokens, a 5-piece word is drawn once in
            32 spans and never fits a 15 % budget of a 12-token block.

    Returns:
        A :class:`MaskedBatch` with ``mode == "phrase"``.
    """
    _check_options(mask_ratio, max_span_len, max_spans_per_block, max_ngram_count,
                   min_gap, max_failures, geometric_p, max_length)
    if span_unit not in SPAN_UNITS:
        raise ProgrammingError(f"span_unit must be one of {SPAN_UNITS}, got {span_unit!r}")
    toks, ws, we, docs = _prepare(blocks, word_start, word_end, doc)

    def boundary(n: int, fws: np.ndarray, fwe: np.ndarray, i: np.ndarray, j: np.ndarray
                 ) -> np.ndarray:
        return fws[i] & fwe[j]

    def anywhere(n: int, fws: np.ndarray, fwe: np.ndarray, i: np.ndarray, j: np.ndarray
                 ) -> np.ndarray:
        return np.ones(i.shape, dtype=bool)

    index = _NgramIndex(toks, ws, we, max_span_len, boundary,
                        boundary if boundary_positives else anywhere)

    def sample_len() -> int:
        return min(int(rng.geometric(geometric_p)), max_span_len)

    return _mask(toks, index, docs, mode="phrase", n_masks=2, sample_len=sample_len, rng=rng,
                 mask_id=mask_id, cls_id=cls_id, sep_id=sep_id, pad_id=pad_id,
                 mask_ratio=mask_ratio, max_spans_per_block=max_spans_per_block,
                 max_ngram_count=max_ngram_count, min_gap=min_gap,
                 max_failures=max_failures, max_length=max_length,
                 word_counts=[word_counts(a, e) for a, e in zip(ws, we)]
                 if span_unit == "word" else None, max_span_len=max_span_len)


def mask_tokens(
    blocks: Sequence[Any],
    word_start: Sequence[Any] | None = None,
    word_end: Sequence[Any] | None = None,
    doc: Sequence[Any] | None = None,
    *,
    mask_id: int,
    cls_id: int,
    sep_id: int,
    pad_id: int,
    rng: np.random.Generator,
    mask_ratio: float = 0.15,
    max_spans_per_block: int = 64,
    max_token_count: int = 10,
    min_gap: int = 1,
    whole_words: bool = False,
    max_failures: int = 25,
    max_length: int | None = None,
) -> MaskedBatch:
    """NPM SINGLE (token-mode) masking: single tokens, one mask token each.

    A token can be masked if the same token id occurs anywhere in another block of the
    batch (the positives); with ``whole_words=True`` only single-token words
    (``word_start & word_end``) are masked. Budget, span cap, gap, per-token cap
    (``max_token_count``) and randomness are as in :func:`mask_spans`. The result has
    ``mode == "token"``, ``span_len == 1``, ``start_mask_pos == end_mask_pos`` and
    ``pos_start == pos_end``.
    """
    _check_options(mask_ratio, 1, max_spans_per_block, max_token_count, min_gap,
                   max_failures, 0.5, max_length)
    toks, ws, we, docs = _prepare(blocks, word_start, word_end, doc)

    def query(n: int, fws: np.ndarray, fwe: np.ndarray, i: np.ndarray, j: np.ndarray
              ) -> np.ndarray:
        return (fws[i] & fwe[j]) if whole_words else np.ones(i.shape, dtype=bool)

    def anywhere(n: int, fws: np.ndarray, fwe: np.ndarray, i: np.ndarray, j: np.ndarray
                 ) -> np.ndarray:
        return np.ones(i.shape, dtype=bool)

    index = _NgramIndex(toks, ws, we, 1, query, anywhere)
    return _mask(toks, index, docs, mode="token", n_masks=1, sample_len=lambda: 1, rng=rng,
                 mask_id=mask_id, cls_id=cls_id, sep_id=sep_id, pad_id=pad_id,
                 mask_ratio=mask_ratio, max_spans_per_block=max_spans_per_block,
                 max_ngram_count=max_token_count, min_gap=min_gap,
                 max_failures=max_failures, max_length=max_length)
