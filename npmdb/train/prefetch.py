"""Masked batches in step order, drawn one step ahead in a background thread.

Drawing and masking a batch (:func:`~npmdb.train.step.draw_batch`) is NumPy and Python
work on the CPU that depends on nothing the model computes: the batch of step ``s`` is a
function of the seed, ``s`` and the sampler's position alone. On a GPU the fourth lease's
profile (``bench/results/gpu-h200-2026-11-26.md``) found it a third of every step's wall
time, with the GPU idle meanwhile. :class:`BatchSource` draws step ``s + 1``'s batch while
the caller trains on step ``s``; the batches, and so the run, are the same as drawing in
line (a test). Each :class:`Drawn` carries the sampler's state just after its own draw, the
position a checkpoint at that step records, so a resumed run continues exactly even though
the sampler itself is already one batch further on.

It did not pay where it was meant to: on an H100, 256-block batches of dev-small ran at
3.05 steps/s with it and 3.67 without (the fifth lease, same file), the masking thread and
the step's kernel launches taking turns at the interpreter lock. So
:func:`npmdb.train.train` leaves it off unless asked (``prefetch=True``).
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .step import batch_rng, draw_batch

if TYPE_CHECKING:  # pragma: no cover
    from npmdb.encoder import Encoder

    from .batches import BatchSampler
    from .masking import MaskedBatch
    from .state import TrainConfig

__all__ = ["Drawn", "BatchSource"]


@dataclass(frozen=True)
class Drawn:
    """The masked batch of ``step`` (0-based), the draws skipped for having nothing to
    mask, and the sampler's state right after this draw."""

    step: int
    batch: "MaskedBatch"
    skipped: int
    sampler_state: dict[str, Any]


class BatchSource:
    """Batches for steps ``start``, ``start + 1``, …; ``ahead=True`` draws the next one in a
    background thread while the caller works on the current one. A context manager: leaving
    it waits for a draw in flight (it is finite) and stops the thread."""

    def __init__(self, sampler: "BatchSampler", cfg: "TrainConfig", encoder: "Encoder",
                 start: int, *, ahead: bool) -> None:
        self.sampler, self.cfg, self.encoder = sampler, cfg, encoder
        self._next = start
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="npmdb-batches") if ahead else None
        self._pending: Future[Drawn] | None = None

    def _draw(self, step: int) -> Drawn:
        mb, skipped = draw_batch(self.sampler, batch_rng(self.cfg.seed, step), self.cfg,
                                 self.encoder)
        return Drawn(step, mb, skipped, self.sampler.state())

    def next(self) -> Drawn:
        """The batch of the next step (and, with ``ahead``, the one after it started)."""
        step = self._next
        self._next += 1
        if self._pool is None:
            return self._draw(step)
        pending = self._pending or self._pool.submit(self._draw, step)
        self._pending = self._pool.submit(self._draw, step + 1)
        return pending.result()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
            self._pending = None

    def __enter__(self) -> "BatchSource":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
