"""Retraining a generation's IVF template for the corpus it now indexes (``optimize``).

A generation's template is trained once, on a sample of its first IVF segment
(:mod:`npmdb.storage.ivf`), with lists sized for that sample: 1,024 at the defaults. Every
search probes at least ``min_nprobe`` lists, so as the corpus grows past what those lists
were sized for, each probed list holds more entries and a search scans more: at 100M
tokens the 1,024 lists held 51k entries each and the scan was the query's largest cost
(bench/results/corpus-size-int4-ivf-100m.md).

``optimize`` therefore plans (:func:`plan`) whether HEAD's corpus has outgrown its
template (:func:`npmdb.storage.ivf.outgrown`), and if so trains a new one with
:func:`npmdb.storage.ivf.corpus_nlist` lists on a sample of HEAD's stored start and end
vectors (:func:`train_for`), codes the merged segment against it, and commits the
template with the segment in one transaction: HEAD's segments always share one template,
and older versions keep their segments, whose IVF files carry their own lists.

    retrain   plan(...)            -> RetrainPlan (entries, lists now, lists wanted, why)
              sample_rows(...)     -> float32 rows: stored starts and ends, a share of each chunk
              train_for(...)       -> the serialised template
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from npmdb.errors import ProgrammingError

from . import format as F
from . import ivf

if TYPE_CHECKING:  # pragma: no cover
    from .segments import SegmentReader

__all__ = ["RetrainPlan", "plan", "index_entries", "sample_rows", "train_for"]

VALID = F.VALID_START | F.VALID_END
MAX_CHUNKS = 65536  # vector chunks a sample draws from (4.3G tokens at 65,536 a chunk)


@dataclass(frozen=True)
class RetrainPlan:
    """What ``optimize`` does with the generation's IVF template: ``entries`` (valid
    starts and ends of HEAD), the template's lists now (``current``, None before one is
    trained) and the lists a template for this corpus has (``wanted``); ``retrain``
    whether it trains one, and ``reason`` why (or why not)."""

    entries: int
    current: int | None
    wanted: int
    retrain: bool
    reason: str

    def __str__(self) -> str:
        now = "none" if self.current is None else f"{self.current:,} lists"
        return (f"IVF template: {now}, {self.entries:,} entries, {self.wanted:,} lists wanted: "
                f"{'retrain' if self.retrain else 'keep'} ({self.reason})")


def index_entries(readers: Sequence["SegmentReader"], txn) -> int:
    """The entries an IVF index over these segments holds: their tokens that are a valid
    start or a valid end (each once)."""
    return sum(int(np.count_nonzero(r.columns(txn).flags & VALID)) for r in readers)


def plan(entries: int, template: bytes | None, params: ivf.IvfParams,
         retrain: bool | None) -> RetrainPlan:
    """Whether to retrain: ``retrain`` True or False decides; None (auto) retrains when the
    corpus has outgrown the template's lists, or -- before any template exists -- would
    outgrow the one its first segment trains from its own sample."""
    if retrain is not None and not isinstance(retrain, bool):
        raise ProgrammingError(f"retrain must be True, False or None (auto), got {retrain!r}")
    wanted = ivf.trainable_nlist(entries, params)
    current = ivf.template_nlist(template) if template is not None else None
    if entries < ivf.MIN_TRAIN:
        return RetrainPlan(entries, current, wanted, False,
                           f"fewer than {ivf.MIN_TRAIN:,} entries to train on")
    if retrain is not None:
        return RetrainPlan(entries, current, wanted, retrain, "asked")
    first = current if current is not None else ivf.corpus_nlist(
        min(entries, params.train_points), params)
    if ivf.outgrown(first, entries, params):
        return RetrainPlan(entries, current, wanted, True,
                           f"{entries / first:,.0f} entries a list, over "
                           f"{ivf.RETRAIN_FACTOR:g} x {params.list_entries:,}")
    return RetrainPlan(entries, current, wanted, False,
                       f"{entries / first:,.0f} entries a list, within "
                       f"{ivf.RETRAIN_FACTOR:g} x {params.list_entries:,}")


def sample_rows(readers: Sequence["SegmentReader"], txn, gen: int, want: int,
                progress: Callable | None = None, seed: int = 13) -> np.ndarray:
    """About ``want`` stored start and end vectors of generation ``gen`` (float32, as the
    IVF index codes them), an equal share drawn at random from every vector chunk of every
    segment (up to :data:`MAX_CHUNKS` chunks), so the sample covers the whole corpus.

    A chunk holds 65,536 tokens: rows from a few whole chunks would be a few stretches of
    the corpus, and k-means would fit its lists to those (a 25M-token replay retrained on 4
    chunks' rows lost 0.15 of its recall). Only the drawn rows' pages are read."""
    chunks = [(i, c) for i, r in enumerate(readers)
              for c in range((r.record.tokens + r.chunk - 1) // r.chunk)]
    rng = np.random.default_rng(seed)
    if len(chunks) > MAX_CHUNKS:
        chunks = [chunks[j] for j in np.sort(rng.choice(len(chunks), MAX_CHUNKS,
                                                        replace=False))]
    share = -(-want // max(len(chunks), 1))
    bar = progress(want, "ivf sample", "vec") if progress else None
    parts = []
    for i, c in chunks:
        r = readers[i]
        a, z = c * r.chunk, min((c + 1) * r.chunk, r.record.tokens)
        keep = np.flatnonzero(r.columns(txn).flags[a:z] & VALID)
        if len(keep) > share:
            keep = np.sort(rng.choice(keep, share, replace=False))
        if not len(keep):
            continue
        parts.append(np.asarray(r.codec.decode(r.stored_chunk(txn, gen, c)[keep]),
                                dtype=np.float32))
        if bar:
            bar.update(len(keep))
    if bar:
        bar.close()
    return np.concatenate(parts) if parts else np.zeros((0, readers[0].record.dim), np.float32)


def train_for(readers: Sequence["SegmentReader"], txn, gen: int, params: ivf.IvfParams,
              nlist: int, progress: Callable | None = None) -> bytes:
    """A template of ``nlist`` lists trained on a sample of these segments' starts and ends
    (:data:`ivf.POINTS_PER_LIST` a list, at least ``params.train_points``)."""
    want = max(params.train_points, ivf.POINTS_PER_LIST * nlist)
    sample = sample_rows(readers, txn, gen, want, progress)
    nlist = min(nlist, max(len(sample) // 39, 1))  # deleted rows sampled: fewer, if short
    bar = progress(1, f"ivf train ({nlist:,} lists)", "template") if progress else None
    template = ivf.train_template(sample, params, nlist=nlist)
    if bar:
        bar.update(1)
        bar.close()
    return template
