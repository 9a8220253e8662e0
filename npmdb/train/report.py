"""What a training run did: per-step statistics (:class:`History`) and the :class:`TrainReport`."""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

import numpy as np

from npmdb.errors import OperationalError

if TYPE_CHECKING:  # pragma: no cover
    from .loss import LossStats
    from .masking import MaskedBatch

__all__ = ["TrainReport", "History"]


@dataclasses.dataclass(frozen=True)
class TrainReport:
    """What a :func:`train` call did.

    ``steps`` is the step count reached (including steps of a resumed run);
    ``steps_run`` those run by this call. Losses are per-step means over masked spans;
    ``loss_curve`` holds ``(last step, mean loss)`` over about 20 equal windows.
    ``versions`` / ``generations`` / ``tags`` are what this call committed (the last one
    is HEAD); ``spans_per_batch`` and ``positives_per_span`` describe the masking.
    """

    steps: int
    steps_run: int
    objective: str
    final_loss: float
    first_loss: float
    final_accuracy: float
    loss_curve: tuple[tuple[int, float], ...]
    seconds: float
    train_seconds: float
    spans_per_batch: float
    positives_per_span: float
    skipped_batches: int
    versions: tuple[int, ...]
    generations: tuple[int, ...]
    tags: tuple[str, ...]
    head_version: int | None
    head_generation: int | None
    device: str
    resumed_from: int | None
    refreshes_dropped: int = 0
    config: dict = dataclasses.field(default_factory=dict, compare=False)

    @property
    def steps_per_second(self) -> float:
        return self.steps_run / self.train_seconds if self.train_seconds > 0 else 0.0

    def __str__(self) -> str:
        curve = " ".join(f"{loss:.2f}" for _, loss in self.loss_curve)
        gens = ", ".join(f"v{v}/g{g}" for v, g in zip(self.versions, self.generations)) or "none"
        lines = [
            f"trained {self.steps_run} steps ({self.objective} objective) on {self.device} in "
            f"{self.seconds:.1f} s (steps {self.train_seconds:.1f} s, "
            f"{self.steps_per_second:.2f} steps/s; the rest loading, re-embedding, saving)"
            + (f", resumed from step {self.resumed_from}" if self.resumed_from else ""),
            f"loss {self.first_loss:.3f} -> {self.final_loss:.3f} (accuracy "
            f"{self.final_accuracy:.2f}); curve: {curve}",
            f"masked spans per batch {self.spans_per_batch:.1f}, positives per span "
            f"{self.positives_per_span:.1f}, batches with nothing to mask {self.skipped_batches}",
            f"generations written: {gens}; HEAD is version {self.head_version} "
            f"(generation {self.head_generation})"
            + (f"; {self.refreshes_dropped} refreshes skipped (a newer one was due before "
               "the last finished)" if self.refreshes_dropped else ""),
        ]
        return "\n".join(lines)


class History:
    """The statistics of a run's steps, for the progress bar, callbacks and the report."""

    def __init__(self) -> None:
        self.losses: list[float] = []
        self.loss_steps: list[int] = []
        self.accuracies: list[float] = []
        self.spans: list[int] = []
        self.positives: list[float] = []
        self.skipped = 0  # draws with nothing to mask

    def record(self, step: int, stats: "LossStats", mb: "MaskedBatch") -> float:
        """Adds step ``step``'s loss and masking; returns the loss (refused if not finite)."""
        lv = float(stats.loss)
        if not math.isfinite(lv):
            raise OperationalError(f"the training loss became {lv} at step {step}: lower "
                                   "the learning rate")
        if stats.num_used:
            self.losses.append(lv)
            self.loss_steps.append(step)
            self.accuracies.append((stats.start_accuracy + stats.end_accuracy) / 2)
        self.spans.append(mb.num_spans)
        self.positives.append(mb.num_positives / max(1, mb.num_spans))
        return lv

    def recent(self) -> dict[str, str]:
        """Mean loss, accuracy and masked spans of the last 20 steps (progress bar text)."""
        return {"loss": f"{_window_mean(self.losses, 1.0, 20):.3f}",
                "acc": f"{_window_mean(self.accuracies, 1.0, 20):.2f}",
                "spans": f"{np.mean(self.spans[-20:]):.1f}"}

    def summary(self) -> dict[str, Any]:
        """The loss and masking fields of a :class:`TrainReport`."""
        losses = self.losses
        n0 = max(1, min(50, int(math.ceil(len(losses) * 0.1)))) if losses else 1
        return dict(
            final_loss=_window_mean(losses),
            first_loss=float(np.mean(losses[:n0])) if losses else float("nan"),
            final_accuracy=_window_mean(self.accuracies),
            loss_curve=_curve(self.loss_steps, losses),
            spans_per_batch=float(np.mean(self.spans)) if self.spans else 0.0,
            positives_per_span=float(np.mean(self.positives)) if self.positives else 0.0,
            skipped_batches=self.skipped)


def _window_mean(xs: list[float], frac: float = 0.1, cap: int = 50) -> float:
    if not xs:
        return float("nan")
    n = max(1, min(cap, int(math.ceil(len(xs) * frac))))
    return float(np.mean(xs[-n:]))


def _curve(steps: list[int], losses: list[float], bins: int = 20) -> tuple[tuple[int, float], ...]:
    if not losses:
        return ()
    edges = np.linspace(0, len(losses), min(bins, len(losses)) + 1).astype(int)
    return tuple((int(steps[b - 1]), float(np.mean(losses[a:b])))
                 for a, b in zip(edges[:-1], edges[1:]) if b > a)
