"""Cutting a tokenised document into blocks of at most ``block_len`` tokens.

A block never crosses a document and, where possible, never splits a word: a cut backs off
to the last word start that fits. ``block_len`` counts the two special tokens ([CLS] and
[SEP]) the encoder adds, so a block holds at most ``block_len - 2`` document tokens.
"""

from __future__ import annotations

import numpy as np

from .boundaries import WORD_START

__all__ = ["cut_blocks"]


def cut_blocks(flags: np.ndarray, block_len: int) -> list[tuple[int, int]]:
    """Token ranges ``[start, end)`` covering ``0..len(flags)`` in blocks."""
    cap = block_len - 2
    if cap < 1:
        raise ValueError("block_len must be at least 3")
    n = len(flags)
    out: list[tuple[int, int]] = []
    start = 0
    while start < n:
        end = min(start + cap, n)
        if end < n and not flags[end] & WORD_START:
            starts = np.flatnonzero(flags[start + 1:end + 1] & WORD_START)
            if len(starts):
                end = start + 1 + int(starts[-1])
        out.append((start, end))
        start = end
    return out
