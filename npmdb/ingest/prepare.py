"""The first ingest stage: documents → tokens with character offsets → boundary flags →
blocks (:class:`PreparedSegment`, the token columns of a segment before encoding)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

from ..blocks import cut_blocks
from ..boundaries import token_flags
from ..corpus import Document
from ..progress import progress_bar

if TYPE_CHECKING:  # pragma: no cover
    from ..encoder import Encoder

__all__ = ["PreparedSegment", "prepare"]


@dataclass(frozen=True)
class PreparedSegment:
    """Token columns of a segment, before encoding."""

    docs: list[Document]
    tokens: np.ndarray
    flags: np.ndarray
    offsets: np.ndarray
    block_ptr: np.ndarray
    block_doc: np.ndarray

    @property
    def n_blocks(self) -> int:
        return len(self.block_doc)

    def block(self, b: int) -> np.ndarray:
        return self.tokens[self.block_ptr[b]:self.block_ptr[b + 1]]

    def columns(self) -> dict[str, np.ndarray]:
        return {"tokens": self.tokens, "flags": self.flags, "offsets": self.offsets,
                "block_ptr": self.block_ptr, "block_doc": self.block_doc}


def prepare(encoder: "Encoder", docs: Sequence[Document], block_len: int,
            progress: bool | None = None) -> PreparedSegment:
    """Tokenize every document with offsets, flag word boundaries, cut blocks."""
    toks, flags, offs, ptr, bdoc = [], [], [], [0], []
    bar = progress_bar(len(docs), "tokenize", progress, "doc")
    step = 512
    for i in range(0, len(docs), step):
        chunk = docs[i:i + step]
        for j, (d, tt) in enumerate(zip(chunk, encoder.tokenize_batch([d.text for d in chunk]))):
            f = token_flags(d.text, tt.offsets)
            for a, b in cut_blocks(f, block_len):
                toks.append(tt.ids[a:b])
                flags.append(f[a:b])
                offs.append(tt.offsets[a:b])
                ptr.append(ptr[-1] + (b - a))
                bdoc.append(i + j)
        bar.update(len(chunk))
    bar.close()
    cat = lambda xs, dt, shape: np.concatenate(xs).astype(dt) if xs else np.zeros(shape, dt)  # noqa: E731
    return PreparedSegment(list(docs), cat(toks, np.int32, (0,)), cat(flags, np.uint8, (0,)),
                           cat(offs, np.int32, (0, 2)).reshape(-1, 2),
                           np.asarray(ptr, dtype=np.int64), np.asarray(bdoc, dtype=np.int32))
