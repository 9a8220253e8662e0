"""NPM scoring and aggregation as pure numpy functions (DESIGN.md section 1).

Nothing here knows about LMDB or indexes: inputs are arrays of positions, flags and
similarities; outputs are arrays of scores and group ids.
"""

from __future__ import annotations

import numpy as np

from npmdb.storage.format import (
    BREAK, PUNCT, STOPWORD, VALID_END, VALID_START, WORD_END, WORD_START,
)

__all__ = ["softmax", "log_softmax", "assemble_spans", "span_scores", "span_log_scores",
           "scores_and_logs", "softmax_and_logs",
           "label_logits", "group_keys", "group_log_sums", "rank_keys", "rank_order", "TINY",
           "lacks_breaks", "spaced_breaks", "sorted_unique", "unique_inverse"]

#: A probability, or a sum of them, below this has lost its digits to underflow (a small
#: ``tau`` puts a softmax's mass on a few candidates and leaves the rest at 0.0). Where a
#: query has scores below it, the scorers also keep each score's logarithm, and answers
#: whose scores are below it are ranked by those (:func:`rank_keys`); scores above it rank
#: exactly as before.
TINY = 1e-290


def sorted_unique(a: np.ndarray) -> np.ndarray:
    """``np.unique(a)`` of a 1-D array, by a sort: numpy 2's hashing ``unique`` is about
    3x slower on the few thousand keys a query has (measured: 330 us against 90 us for
    4,260 positions), and a query calls it several times."""
    s = np.sort(np.asarray(a).ravel())
    return s[_run_starts(s)] if len(s) > 1 else s


def unique_inverse(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(a, return_inverse=True)`` of a 1-D integer array, in one pass when
    ``a`` is already sorted (a query's span starts are)."""
    a = np.asarray(a)
    if len(a) > 1 and bool((a[1:] >= a[:-1]).all()):
        keep = _run_starts(a)
        return a[keep], np.cumsum(keep) - 1
    return np.unique(a, return_inverse=True)


def _run_starts(s: np.ndarray) -> np.ndarray:
    """Of a sorted array (2 or more values): True where a run of equal values starts."""
    keep = np.empty(len(s), dtype=bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return keep


def softmax(x: np.ndarray, tau: float) -> np.ndarray:
    """``softmax(x / tau)`` in float64."""
    if len(x) == 0:
        return np.zeros(0, dtype=np.float64)
    z = np.asarray(x, dtype=np.float64) / tau
    z -= z.max()
    e = np.exp(z)
    return e / e.sum()


def log_softmax(x: np.ndarray, tau: float) -> np.ndarray:
    """``log(softmax(x / tau))`` in float64, exact where :func:`softmax` underflows."""
    if len(x) == 0:
        return np.zeros(0, dtype=np.float64)
    z = np.asarray(x, dtype=np.float64) / tau
    z -= z.max()
    return z - np.log(np.exp(z).sum())


def assemble_spans(starts: np.ndarray, ends: np.ndarray, flags: np.ndarray,
                   block_start: np.ndarray, block_end: np.ndarray, *, max_len: int,
                   clean_edges: bool = True, no_stopwords: bool = False) -> np.ndarray:
    """Candidate spans ``(s, e)`` (inclusive token positions) of one segment.

    From each candidate start, spans going forward up to ``max_len`` tokens that end at a
    valid end; from each candidate end, spans going backward likewise; the union, sorted.
    With ``clean_edges`` a span also never holds clause or sentence punctuation (the
    ``BREAK`` flag: NPM never returns a span with "." or ","); ``no_stopwords`` drops
    spans holding a stopword anywhere.
    ``block_start``/``block_end`` give each candidate's block bounds (``[start, end)``),
    aligned with ``starts`` then ``ends``: arrays of length ``len(starts) + len(ends)``.
    """
    # flags are read only at the positions a span touches: a segment's whole flag column
    # per query would cost O(segment tokens) (11 ms a query per 1M-token segment)
    start_bit = VALID_START if clean_edges else WORD_START
    end_bit = VALID_END if clean_edges else WORD_END
    steps = np.arange(max_len, dtype=np.int64)
    ns = len(starts)
    parts = []
    if ns:
        s0 = np.asarray(starts, dtype=np.int64)
        valid = (flags[s0] & start_bit) != 0
        s = s0[valid]
        bend = np.asarray(block_end[:ns], dtype=np.int64)[valid]
        e = s[:, None] + steps[None, :]
        keep = e < bend[:, None]
        e_c = np.where(keep, e, s[:, None])
        keep &= (flags[e_c] & end_bit) != 0
        ss = np.broadcast_to(s[:, None], e.shape)
        parts.append(np.stack([ss[keep], e[keep]], axis=1))
    if len(ends):
        e0 = np.asarray(ends, dtype=np.int64)
        valid = (flags[e0] & end_bit) != 0
        e0 = e0[valid]
        bstart = np.asarray(block_start[ns:], dtype=np.int64)[valid]
        s = e0[:, None] - steps[None, :]
        keep = s >= bstart[:, None]
        s_c = np.where(keep, s, e0[:, None])
        keep &= (flags[s_c] & start_bit) != 0
        ee = np.broadcast_to(e0[:, None], s.shape)
        parts.append(np.stack([s[keep], ee[keep]], axis=1))
    if not parts:
        return np.zeros((0, 2), dtype=np.int64)
    spans = np.concatenate(parts)
    if len(spans) == 0:
        return spans.reshape(0, 2)
    key = sorted_unique(spans[:, 0] * (1 << 32) + spans[:, 1])  # sorted unique (s, e)
    spans = np.stack([key >> 32, key & ((1 << 32) - 1)], axis=1)
    banned = (BREAK if clean_edges else 0) | (STOPWORD if no_stopwords else 0)
    if banned:  # no banned flag on any token of the span (at most max_len of them)
        width = np.arange(int((spans[:, 1] - spans[:, 0]).max()) + 1, dtype=np.int64)
        inside = width[None, :] <= (spans[:, 1] - spans[:, 0])[:, None]
        at = np.where(inside, spans[:, :1] + width[None, :], spans[:, :1])
        spans = spans[~(((flags[at] & banned) != 0) & inside).any(axis=1)]
    return spans


def lacks_breaks(flags: np.ndarray) -> bool:
    """True for flags written before the ``BREAK`` bit existed: punctuation, but no token
    marked as clause or sentence punctuation (any real text has a full stop or a comma)."""
    return not (flags & BREAK).any() and bool((flags & PUNCT).any())


def spaced_breaks(flags: np.ndarray, offsets: np.ndarray, block_ptr: np.ndarray) -> np.ndarray:
    """``flags`` with ``BREAK`` set, for a segment stored without it, from what it does
    store: a punctuation token with white space (or its block's edge) on either side is
    a break ("Rome. Milan", "Berlin, Germany", "X (Y", "a - b"); one inside a word is not
    ("U.S", "3.5", "e-mail"). Ingest's rule (``npmdb.boundaries.is_break``) also reads the
    characters: this one also breaks "Tom & Jerry" and keeps "1,000" whole."""
    n = len(flags)
    out = np.array(flags, dtype=np.uint8, copy=True)
    if n == 0:
        return out
    starts = np.asarray(offsets[:, 0], np.int64)
    ends = np.asarray(offsets[:, 1], np.int64)
    gap = np.ones(n + 1, dtype=bool)          # gap[i]: white space just before token i
    gap[1:n] = starts[1:] > ends[:-1]
    edges = np.asarray(block_ptr, np.int64)
    gap[edges] = True                         # a block's first token and its end
    brk = ((flags & PUNCT) != 0) & (gap[:-1] | gap[1:])
    out[brk] |= BREAK
    return out


def span_scores(start_ids: np.ndarray, end_ids: np.ndarray, sim_start: np.ndarray,
                sim_end: np.ndarray, *, tau: float, scoring: str = "npm"
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Scores of spans whose start/end are ``start_ids``/``end_ids`` into the unique start
    set S (similarities ``sim_start``) and end set E (``sim_end``).

    ``npm``: ``P_s[s] + P_e[e]`` with ``P = softmax(sim / tau)`` over S and over E.
    ``raw`` (DensePhrases): ``sim_s + sim_e``. Returns (scores, P_s, P_e).
    """
    if scoring == "npm":
        ps, pe = softmax(sim_start, tau), softmax(sim_end, tau)
        return ps[start_ids] + pe[end_ids], ps, pe
    if scoring == "raw":
        ss = np.asarray(sim_start, np.float64)
        se = np.asarray(sim_end, np.float64)
        return ss[start_ids] + se[end_ids], ss, se
    raise ValueError(scoring)


def span_log_scores(start_ids: np.ndarray, end_ids: np.ndarray, sim_start: np.ndarray,
                    sim_end: np.ndarray, *, tau: float) -> np.ndarray:
    """``log`` of :func:`span_scores`' ``npm`` scores, computed in log space."""
    return np.logaddexp(log_softmax(sim_start, tau)[start_ids],
                        log_softmax(sim_end, tau)[end_ids])


def scores_and_logs(start_ids: np.ndarray, end_ids: np.ndarray, sim_start: np.ndarray,
                    sim_end: np.ndarray, tau: float, scoring: str = "npm"
                    ) -> tuple[np.ndarray, np.ndarray | None]:
    """:func:`span_scores`, and their logs where some underflowed (``npm`` scoring only)."""
    score, _, _ = span_scores(start_ids, end_ids, sim_start, sim_end, tau=tau, scoring=scoring)
    return score, (span_log_scores(start_ids, end_ids, sim_start, sim_end, tau=tau)
                   if scoring == "npm" and _underflows(score) else None)


def softmax_and_logs(x: np.ndarray, tau: float) -> tuple[np.ndarray, np.ndarray | None]:
    """:func:`softmax`, and its logs where some underflowed (token mode)."""
    score = softmax(x, tau)
    return score, log_softmax(x, tau) if _underflows(score) else None


def _underflows(score: np.ndarray) -> bool:
    return bool(len(score)) and float(score.min()) < TINY


def group_log_sums(gid: np.ndarray, n: int, logs: np.ndarray) -> np.ndarray:
    """Per group ``log(sum(exp(logs)))`` of the members ``gid`` assigns it (-inf: none)."""
    top = np.full(n, -np.inf)
    np.maximum.at(top, gid, logs)
    shift = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore"):
        return shift + np.log(np.bincount(gid, weights=np.exp(logs - shift[gid]), minlength=n))


def rank_keys(values: np.ndarray, logs: np.ndarray | None) -> tuple[np.ndarray, ...]:
    """``np.lexsort`` keys (least significant first) that put ``values`` best first; with
    ``logs`` (their logarithms), values below :data:`TINY`, and infinite ones (a label's
    ``exp`` that overflowed), are ranked by their logs."""
    values = np.asarray(values, np.float64)
    if logs is None:
        return (-values,)
    low = values < TINY
    return -np.where(low | np.isinf(values), logs, 0.0), -np.where(low, 0.0, values)


def rank_order(values: np.ndarray, logs: np.ndarray | None = None) -> np.ndarray:
    """Indices of ``values`` best first (:func:`rank_keys`; ties: the lower index first)."""
    return np.lexsort((np.arange(len(values)), *rank_keys(values, logs)))


def label_logits(sim_start: np.ndarray, sim_end: np.ndarray | None, tau: float) -> np.ndarray:
    """Per-candidate log-weights for closed-set classification (DESIGN.md section 1):
    ``sim(q_s, s)/tau + sim(q_e, e)/tau`` in phrase mode, ``sim(q, c)/tau`` in token mode."""
    z = np.asarray(sim_start, np.float64) / tau
    if sim_end is not None:
        z = z + np.asarray(sim_end, np.float64) / tau
    return z


def group_keys(keys: list) -> tuple[np.ndarray, list]:
    """Dense group ids for ``keys`` (first-seen order) and the distinct keys."""
    distinct = list(dict.fromkeys(keys))           # C loops: first-seen order
    index = dict(zip(distinct, range(len(distinct))))
    ids = np.fromiter(map(index.__getitem__, keys), dtype=np.int64, count=len(keys))
    return ids, distinct
