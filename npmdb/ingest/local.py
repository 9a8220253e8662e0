"""Local ingest: prepare documents, encode their blocks in this process, and hand the
vectors to the segment writer."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from ..corpus import Document
from .prepare import prepare

if TYPE_CHECKING:  # pragma: no cover
    from npmdb.storage.format import SegmentRecord
    from npmdb.storage.segment_writer import SegmentWriter
    from npmdb.storage.transaction import Writer

    from ..encoder import Encoder

__all__ = ["write_segment", "encode_into", "leaves_a_core", "WINDOW"]

WINDOW = 256  # blocks per encode_blocks call


def encode_into(sw: "SegmentWriter", encoder: "Encoder", tokens: np.ndarray,
                block_ptr: np.ndarray, bar, check: Callable[[], None] = lambda: None
                ) -> None:
    """Encode the blocks (``tokens[block_ptr[b]:block_ptr[b+1]]``) window by window and
    hand their vectors, in token order, to ``sw``; ``check()`` before each window raises
    to stop (the writer's handle was closed)."""
    sw.code_ahead = leaves_a_core(encoder)
    n_blocks = len(block_ptr) - 1
    for b0 in range(0, n_blocks, WINDOW):
        check()
        b1 = min(b0 + WINDOW, n_blocks)
        hidden = encoder.encode_blocks([tokens[block_ptr[b]:block_ptr[b + 1]]
                                        for b in range(b0, b1)])
        if hidden:
            sw.add_vectors(np.concatenate(hidden))
        bar.update(int(block_ptr[b1] - block_ptr[b0]))
    bar.close()


def leaves_a_core(encoder: "Encoder") -> bool:
    """Whether encoding leaves a CPU core free for the segment writer's background IVF
    coder: on a GPU, or with fewer torch threads than cores. Where the encoder has every
    core the coder's thread only competes with it: on 2 cores, a 307k-token add into a
    trained IVF took 9-17 s longer than the encoder alone with the coder alongside and
    12-17 s with the coding after (bench ingest step, five runs, 2026-11-25/26), no gain;
    with a core free (a replayed copy, no encoder) it halves the build."""
    if encoder.device.type != "cpu":
        return True
    import torch

    return (os.cpu_count() or 1) > torch.get_num_threads()


def write_segment(writer: "Writer", encoder: "Encoder", docs: Sequence[Document]
                  ) -> "SegmentRecord":
    """Write ``docs`` as a new segment of the writer's open transaction (not committed)."""
    seg = writer.allocate_segment()
    prep = prepare(encoder, docs, writer.block_len, writer.progress_enabled)
    sw = writer.segment_writer(seg, writer.generation)
    sw.add_documents(prep.docs, prep.columns())
    encode_into(sw, encoder, prep.tokens, prep.block_ptr,
                writer.progress(len(prep.tokens), "encode", "tok"), writer.check_open)
    return sw.finish()
