"""Dictionary pairs read both ways: training-only blocks for a user's own corpus.

NPM masks a span only where it also occurs in another block of the batch (its positive).
A bilingual dictionary entry, ``"Кампучия: Cambodia"``, usually holds its foreign word
once in the whole corpus, so the word is never a target, and an encoder trained from
the base on such text scores foreign words like punctuation. The shipped encoder's recipe
made them targets by adding each packaged pair reversed to its training text
(:func:`npmdb.train.sources.pair_reversals`). On top of the shipped encoder this option
does not keep translation (measured: ``bench/results/encoder-recipe-dev-small.md``; a
user run loses it with or without pairs in its batches), so it is off by default.

:func:`with_pair_reversals` does the same for a database's blocks without touching the
database: a one-block document that reads ``HEAD: GLOSS``, both sides short, gets a
second block ``GLOSS: HEAD`` in the training corpus only, right after its own, so the two
share a group (same-document blocks come first in a batch group) and each side's words
become targets with the other block as positive. The blocks are rearranged token by
token (ids and flags move together), which is exact for WordPiece tokenizers (BERT,
MiniLM); a byte-level BPE tokenizer's leading-space marker stays on the token that had it.
"""

from __future__ import annotations

import numpy as np

from npmdb.boundaries import PUNCT, WORD_START

from .batches import CorpusBlocks

__all__ = ["with_pair_reversals", "PAIR_MAX_WORDS"]

PAIR_MAX_WORDS = 4  # a side longer than this many words is a gloss, not a dictionary pair


def _words(flags: np.ndarray) -> int:
    return int(np.count_nonzero((flags & WORD_START) != 0))


def _reversed(tokens: np.ndarray, flags: np.ndarray, sep_id: int, max_words: int
              ) -> tuple[np.ndarray, np.ndarray] | None:
    """``GLOSS : HEAD`` for a block ``HEAD : GLOSS`` (one separator, both sides of 1 to
    ``max_words`` words and no other punctuation), else None."""
    at = np.flatnonzero(tokens == sep_id)
    if at.size != 1:
        return None
    i = int(at[0])
    head, gloss = slice(0, i), slice(i + 1, len(tokens))
    for side in (head, gloss):
        f = flags[side]
        if f.size == 0 or np.any((f & PUNCT) != 0) or not 1 <= _words(f) <= max_words:
            return None
    order = np.r_[np.arange(i + 1, len(tokens)), i, np.arange(0, i)]
    return tokens[order], flags[order]


def with_pair_reversals(corpus: CorpusBlocks, sep_id: int, *,
                        max_words: int = PAIR_MAX_WORDS) -> tuple[CorpusBlocks, int]:
    """``corpus`` with each one-block ``HEAD: GLOSS`` document followed by its reverse
    (a second block of the same document); returns it and the number of blocks added.

    ``sep_id`` is the tokenizer's id for ``":"``. A document of several blocks, a block
    with no separator or more than one, and a side with punctuation or more than
    ``max_words`` words are left as they are (a WordNet gloss is a definition, not a
    pair). The result has the same version and generation: it is what training reads,
    never what the database stores.
    """
    toks, flgs, lens, docs = [], [], [], []
    added = 0
    for d, (first, end) in enumerate(corpus.doc_blocks):
        for b in range(int(first), int(end)):
            toks.append(corpus.block(b))
            flgs.append(corpus.block_flags(b))
            lens.append(corpus.block_len(b))
            docs.append(d)
        if end - first != 1:
            continue
        rev = _reversed(corpus.block(int(first)), corpus.block_flags(int(first)), sep_id,
                        max_words)
        if rev is not None:
            toks.append(rev[0])
            flgs.append(rev[1])
            lens.append(len(rev[0]))
            docs.append(d)
            added += 1
    if not added:
        return corpus, 0
    return CorpusBlocks.from_blocks(toks, flgs, np.asarray(lens), np.asarray(docs),
                                    corpus.num_docs, corpus.version,
                                    corpus.generation), added
