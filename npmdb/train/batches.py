"""Document-grouped training batches drawn from a database snapshot.

NPM (Min et al. 2023, §3.2) masks only spans that co-occur in *another* block of the
batch, and relied on long documents: blocks of the same document share names and terms,
so a batch made of several documents' consecutive blocks has plenty of maskable spans.
Corpora of short documents break that: a one-block WordNet gloss shares nothing with a
random other gloss, so almost nothing can be masked. This module therefore builds each
batch from *groups*:

* a group starts at a seed document (documents are visited in a shuffled order, one epoch
  after another);
* a seed with several blocks contributes consecutive blocks (NPM's grouping);
* a group that still has room is filled with the seed's *neighbours*: blocks of other
  documents that share rare words with it, ranked by BM25 over whole words
  (``grouping="neighbours"``, the default). Ranking is done in memory from the snapshot's
  segment columns (the same token ids and word boundaries the masking uses), so no text
  is re-tokenised and no index is queried;
* several groups make one batch (``group_size`` blocks each), so the in-batch negatives
  come from several topics.

``grouping="documents"`` is NPM's plain scheme (same-document blocks, then random other
documents) and ``grouping="random"`` ignores documents altogether; both are kept for
comparison (``BatchSampler.stats`` counts how often a batch had nothing to mask).

Everything here is numpy; the sampler's whole state is a few integers (``state()`` /
``load_state()``) so that training can stop and resume exactly.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from npmdb.boundaries import VALID_END, VALID_START, WORD_END, WORD_START
from npmdb.errors import ProgrammingError

__all__ = ["CorpusBlocks", "load_blocks", "NeighbourIndex", "BatchSampler", "GROUPINGS"]

GROUPINGS = ("neighbours", "documents", "random")


@dataclasses.dataclass(frozen=True, eq=False)
class CorpusBlocks:
    """The live blocks of one version, concatenated (token-level columns).

    Block ``i`` holds ``tokens[ptr[i]:ptr[i+1]]``; ``doc[i]`` is a dense document number
    (blocks of one document are consecutive and in order); ``doc_blocks[d]`` is the
    ``(first, end)`` block range of document ``d``.
    """

    tokens: np.ndarray      # int32[N]
    flags: np.ndarray       # uint8[N]
    ptr: np.ndarray         # int64[B + 1]
    doc: np.ndarray         # int64[B]
    doc_blocks: np.ndarray  # int64[D, 2]
    version: int
    generation: int

    @property
    def num_blocks(self) -> int:
        return len(self.ptr) - 1

    @property
    def num_docs(self) -> int:
        return len(self.doc_blocks)

    def block(self, i: int) -> np.ndarray:
        return self.tokens[self.ptr[i]:self.ptr[i + 1]]

    def block_flags(self, i: int) -> np.ndarray:
        return self.flags[self.ptr[i]:self.ptr[i + 1]]

    def block_len(self, i: int) -> int:
        return int(self.ptr[i + 1] - self.ptr[i])

    @classmethod
    def from_blocks(cls, tokens: list[np.ndarray], flags: list[np.ndarray],
                    lens: np.ndarray, doc: np.ndarray, num_docs: int, version: int,
                    generation: int) -> "CorpusBlocks":
        """Blocks given in order (token and flag runs, their lengths, each one's dense
        document number, non-decreasing) as one corpus."""
        ptr = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        doc = np.asarray(doc, dtype=np.int64)
        bounds = np.searchsorted(doc, np.arange(num_docs + 1))
        doc_blocks = np.stack([bounds[:-1], bounds[1:]], axis=1).astype(np.int64)
        return cls(np.concatenate(tokens).astype(np.int32, copy=False),
                   np.concatenate(flags).astype(np.uint8, copy=False), ptr, doc, doc_blocks,
                   int(version), int(generation))


def load_blocks(db: Any, version: int | str | None = None) -> CorpusBlocks:
    """Read the token columns of every live block of ``version`` (HEAD by default).

    Deleted documents are left out; blocks with no tokens are dropped.
    """
    toks, flags, lens, docs = [], [], [], []
    next_doc = 0
    with db.snapshot(version) as snap:
        vid, gen = snap.manifest.id, snap.generation
        for si, seg in enumerate(snap.segments):
            cols = seg.columns(snap.txn)
            allowed = snap.allowed_docs(si)
            sizes = np.diff(cols.block_ptr).astype(np.int64)
            keep = sizes > 0
            if allowed is not None:
                keep &= allowed[cols.block_doc]
            idx = np.flatnonzero(keep)
            if idx.size == 0:
                continue
            tok_keep = np.repeat(keep, sizes)
            toks.append(np.asarray(cols.tokens)[tok_keep].astype(np.int32, copy=False))
            flags.append(np.asarray(cols.flags)[tok_keep].astype(np.uint8, copy=False))
            lens.append(sizes[idx])
            # dense document numbers, in segment order
            local = cols.block_doc[idx].astype(np.int64)
            _, dense = np.unique(local, return_inverse=True)
            docs.append(dense.reshape(-1) + next_doc)
            next_doc += int(dense.max()) + 1
    if not lens:
        raise ProgrammingError("the database has no documents to train on: add some with "
                               "db.add(...)")
    return CorpusBlocks.from_blocks(toks, flags, np.concatenate(lens), np.concatenate(docs),
                                    next_doc, vid, gen)


class NeighbourIndex:
    """BM25 over whole words (token-id tuples with clean edges), block to block.

    A *word* is a run of tokens from a word start to the next word end; only words that
    are neither stopwords nor punctuation count (``VALID_START`` at their first token).
    Words are keyed by a 64-bit hash of their token ids. Words in more than ``max_df``
    blocks are ignored (they cannot make a group topical, and skipping them keeps a query
    cheap); term frequency is binary (blocks are short) with BM25's length normalisation.
    """

    def __init__(self, corpus: CorpusBlocks, *, max_df: float | int = 0.02,
                 k1: float = 1.2, b: float = 0.75) -> None:
        B = corpus.num_blocks
        f = corpus.flags
        n = len(f)
        ws = (f & WORD_START) != 0
        ws[corpus.ptr[:-1][corpus.ptr[:-1] < n]] = True  # a block always starts a word
        word_of = np.cumsum(ws) - 1                      # word number of every token
        wstart = np.flatnonzero(ws)
        # polynomial hash of each word's token ids (uint64 arithmetic wraps)
        pos = np.arange(n, dtype=np.int64) - wstart[word_of]
        mult = np.uint64(0x9E3779B97F4A7C15)
        with np.errstate(over="ignore"):
            powers = _pow_table(int(pos.max()) + 1 if n else 1, mult)
            terms = (corpus.tokens.astype(np.uint64) + np.uint64(1)) * powers[pos]
            h = np.add.reduceat(terms, wstart) if n else np.zeros(0, np.uint64)
            h = h ^ (np.diff(np.append(wstart, n)).astype(np.uint64) * np.uint64(0xBF58476D1CE4E5B9))
        clean = (f[wstart] & VALID_START) != 0
        block_of_tok = np.repeat(np.arange(B, dtype=np.int64), np.diff(corpus.ptr))
        wblock = block_of_tok[wstart][clean]
        keys, wid = np.unique(h[clean], return_inverse=True)
        wid = wid.reshape(-1).astype(np.int64)
        W = len(keys)
        pair = np.unique(wblock * max(W, 1) + wid)  # distinct (block, word)
        pb, pw = pair // max(W, 1), pair % max(W, 1)
        df = np.bincount(pw, minlength=W)
        limit = max_df if isinstance(max_df, int) and not isinstance(max_df, bool) \
            else max(2, int(math.ceil(float(max_df) * B)))
        self.idf = np.log1p((B - df + 0.5) / (df + 0.5))
        self.usable = (df >= 2) & (df <= limit)
        # postings: word -> blocks (sorted by word, then block)
        order = np.argsort(pw, kind="stable")
        self._post_blocks = pb[order]
        self._post_bounds = np.searchsorted(pw[order], np.arange(W + 1))
        # block -> words
        self._bw_words = pw          # sorted by block (pair was sorted by block first)
        self._bw_bounds = np.searchsorted(pb, np.arange(B + 1))
        nw = np.diff(self._bw_bounds).astype(np.float64)
        avg = float(nw.mean()) if B else 1.0
        self._norm = (k1 + 1) / (1 + k1 * (1 - b + b * nw / max(avg, 1e-9)))
        self.num_blocks = B
        self.num_words = W

    def words(self, block: int) -> np.ndarray:
        """The usable word ids of ``block``."""
        w = self._bw_words[self._bw_bounds[block]:self._bw_bounds[block + 1]]
        return w[self.usable[w]]

    def neighbours(self, blocks: np.ndarray | list[int], k: int,
                   exclude: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` other blocks by BM25 with the words of ``blocks`` as the query.

        Returns ``(block ids, scores)``, best first; ``exclude`` (bool[B]) blocks are
        never returned (nor are the query blocks themselves).
        """
        words = np.unique(np.concatenate([self.words(int(b)) for b in blocks])) \
            if len(blocks) else np.zeros(0, np.int64)
        if words.size == 0 or k <= 0:
            return np.zeros(0, np.int64), np.zeros(0)
        lo, hi = self._post_bounds[words], self._post_bounds[words + 1]
        cnt = hi - lo
        cand = np.concatenate([self._post_blocks[a:b] for a, b in zip(lo, hi)])
        wts = np.repeat(self.idf[words], cnt)
        uniq, inv = np.unique(cand, return_inverse=True)
        score = np.bincount(inv.reshape(-1), weights=wts, minlength=len(uniq)) * self._norm[uniq]
        drop = np.isin(uniq, np.asarray(blocks, dtype=np.int64))
        if exclude is not None:
            drop |= exclude[uniq]
        uniq, score = uniq[~drop], score[~drop]
        if uniq.size > k:
            top = np.argpartition(-score, k - 1)[:k]
            uniq, score = uniq[top], score[top]
        order = np.lexsort((uniq, -score))
        return uniq[order], score[order]


def _pow_table(n: int, mult: np.uint64) -> np.ndarray:
    out = np.ones(max(n, 1), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for i in range(1, len(out)):
            out[i] = out[i - 1] * mult
    return out


@dataclasses.dataclass
class SamplerStats:
    batches: int = 0
    blocks: int = 0
    neighbour_blocks: int = 0
    same_doc_blocks: int = 0
    random_blocks: int = 0


class BatchSampler:
    """Draws document-grouped batches of block ids (see the module docstring).

    Args:
        corpus: the blocks (:func:`load_blocks`).
        batch_blocks: blocks per batch (>= 2).
        group_size: blocks per group (seed document + its neighbours); default
            ``min(batch_blocks, 8)``.
        grouping: ``"neighbours"`` | ``"documents"`` | ``"random"``.
        pool: a seed's neighbours are drawn at random from its ``pool`` best BM25
            neighbours (some variety between epochs); the best ones are favoured.
        seed: the sampling order depends only on ``seed`` and the sampler state.
    """

    def __init__(self, corpus: CorpusBlocks, *, batch_blocks: int, group_size: int | None = None,
                 grouping: str = "neighbours", pool: int = 24, seed: int = 0,
                 max_df: float | int = 0.02, index: NeighbourIndex | None = None) -> None:
        if grouping not in GROUPINGS:
            raise ProgrammingError(f"grouping must be one of {GROUPINGS}, got {grouping!r}")
        if batch_blocks < 2:
            raise ProgrammingError(f"batch_blocks must be >= 2, got {batch_blocks}")
        self.corpus = corpus
        self.batch_blocks = int(batch_blocks)
        self.group_size = max(2, min(int(group_size or min(batch_blocks, 8)), batch_blocks))
        self.grouping = grouping
        self.pool = max(int(pool), self.group_size)
        self.seed = int(seed)
        self.index = (index or NeighbourIndex(corpus, max_df=max_df)) \
            if grouping == "neighbours" else None
        self.epoch = 0
        self.cursor = 0
        self.stats = SamplerStats()
        self._order = self._epoch_order(0)

    # -- state ---------------------------------------------------------------------

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "cursor": self.cursor, "seed": self.seed}

    def load_state(self, state: dict[str, int]) -> None:
        self.seed = int(state.get("seed", self.seed))
        self.epoch = int(state["epoch"])
        self.cursor = int(state["cursor"])
        self._order = self._epoch_order(self.epoch)

    def _epoch_order(self, epoch: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, epoch, 0x5EED])
        return rng.permutation(self.corpus.num_docs)

    def _next_seed(self) -> int:
        if self.cursor >= len(self._order):
            self.epoch += 1
            self.cursor = 0
            self._order = self._epoch_order(self.epoch)
        d = int(self._order[self.cursor])
        self.cursor += 1
        return d

    # -- batches -------------------------------------------------------------------

    def next_batch(self, rng: np.random.Generator) -> list[int]:
        """Block ids of the next batch: groups of related blocks, about ``batch_blocks``."""
        c = self.corpus
        B = c.num_blocks
        target = min(self.batch_blocks, B)
        taken = np.zeros(B, dtype=bool)
        out: list[int] = []
        while len(out) < target:
            room = min(self.group_size, target - len(out))
            d = self._next_seed()
            first, end = (int(x) for x in c.doc_blocks[d])
            if self.grouping == "random":
                cand = [b for b in rng.permutation(B)[: room * 4].tolist() if not taken[b]][:room]
                self._take(out, taken, cand, "random_blocks")
                continue
            n = end - first
            if n > room:  # NPM: a run of consecutive blocks of the document
                first = int(rng.integers(first, end - room + 1))
                end = first + room
            group = [b for b in range(first, end) if not taken[b]]
            self._take(out, taken, group, "same_doc_blocks")
            room -= len(group)
            if room <= 0:
                continue
            if self.grouping == "neighbours" and self.index is not None and group:
                nb, _ = self.index.neighbours(group, self.pool, exclude=taken)
                nb = [b for b in nb.tolist() if c.doc[b] != d]
                if len(nb) > room:
                    # favour the best-ranked: sample without replacement, weight 1/sqrt(rank)
                    w = 1.0 / np.sqrt(np.arange(1, len(nb) + 1))
                    pick = rng.choice(len(nb), size=room, replace=False, p=w / w.sum())
                    nb = [nb[i] for i in sorted(pick.tolist())]
                self._take(out, taken, nb, "neighbour_blocks")
        self.stats.batches += 1
        return out[:target]

    def _take(self, out: list[int], taken: np.ndarray, blocks: list[int], kind: str) -> None:
        for b in blocks:
            if not taken[b]:
                taken[b] = True
                out.append(int(b))
                self.stats.blocks += 1
                setattr(self.stats, kind, getattr(self.stats, kind) + 1)

    def arrays(self, blocks: list[int], *, clean_edges: bool = True,
               exclude_repeats: bool = False
               ) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray], list[int]]:
        """``(token ids, word_start, word_end, doc)`` of ``blocks`` for the masking.

        With ``clean_edges`` spans may only start/end where a retrieved phrase can
        (``VALID_START``/``VALID_END``: no stopword or punctuation at either edge);
        otherwise at any word boundary. With ``exclude_repeats`` a word that occurs more
        than once in its block can neither start nor end a masked span (so the answer to
        a masked span is never a copy of a word left visible in its own context; pair
        this with ``boundary_positives=False`` in the masking, since these flags also
        decide which occurrences count as positives).
        """
        c = self.corpus
        s_bit, e_bit = (VALID_START, VALID_END) if clean_edges else (WORD_START, WORD_END)
        toks, ws, we, docs = [], [], [], []
        for b in blocks:
            f = c.block_flags(b)
            t = c.block(b).astype(np.int64)
            st = (f & s_bit) != 0
            en = (f & e_bit) != 0
            if exclude_repeats:
                st, en = _drop_repeated_words(t, f, st, en)
            toks.append(t)
            ws.append(st)
            we.append(en)
            docs.append(int(c.doc[b]))
        return toks, ws, we, docs


def _drop_repeated_words(tokens: np.ndarray, flags: np.ndarray, st: np.ndarray,
                         en: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Clear start/end flags on every occurrence of a word that occurs twice or more."""
    n = len(tokens)
    if n < 2:
        return st, en
    wstart = (flags & WORD_START) != 0
    wstart[0] = True
    starts = np.flatnonzero(wstart)
    ends = np.append(starts[1:], n)
    seen: dict[tuple[int, ...], list[int]] = {}
    for i, (a, e) in enumerate(zip(starts.tolist(), ends.tolist())):
        seen.setdefault(tuple(tokens[a:e].tolist()), []).append(i)
    rep = [i for occ in seen.values() if len(occ) > 1 for i in occ]
    if not rep:
        return st, en
    st, en = st.copy(), en.copy()
    for i in rep:
        st[starts[i]:ends[i]] = False
        en[starts[i]:ends[i]] = False
    return st, en
