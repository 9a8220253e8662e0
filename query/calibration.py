"""Contextual calibration of closed-set classification (Zhao et al. 2021, "Calibrate
before use").

A label whose word is frequent in the corpus ("great" 87 times in the sample reviews,
"terrible" 10) collects more retrieved candidates whatever the input says. Calibration
divides each label's probability by its probability for a *content-free* query: the
template alone, with the input removed (here: the sentence that holds the mask, the
rest of the query dropped). ``P(label | x) / P(label | template)``, renormalised.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Mapping

from .result import Result
from .text import MASK_PATTERN

__all__ = ["content_free", "calibrate", "probabilities", "calibrated_scores", "EPS"]

#: Smoothing of a label the template never retrieved (and of every label's probability).
EPS = 1e-3

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def content_free(text: str) -> str | None:
    """The sentence of ``text`` that holds the mask, or None when nothing precedes it
    (no input to remove: calibration would divide the query by itself)."""
    m = MASK_PATTERN.search(text)
    if m is None:
        return None
    cuts = [c.end() for c in _SENTENCE_END.finditer(text, 0, m.start())]
    if not cuts:
        return None
    template = text[cuts[-1]:].strip()
    return template or None


def probabilities(scores: Mapping[str, float], eps: float = EPS,
                  logs: Mapping[str, float] | None = None) -> dict[str, float]:
    """Each label's share of the labels' total score, smoothed by ``eps``. ``logs``: the
    scores' logarithms (a classification's ``label_log_scores``), exact where a small tau
    overflowed the scores to inf."""
    n = max(len(scores), 1)
    if logs is not None and any(v > -math.inf for v in logs.values()):
        top = max(logs.values())
        e = {t: math.exp(logs[t] - top) for t in scores}
        total = sum(e.values())
        return {t: (e[t] / total + eps) / (1 + eps * n) for t in scores}
    total = sum(v for v in scores.values() if math.isfinite(v))
    return {t: ((v / total if total > 0 else 0.0) + eps) / (1 + eps * n)
            for t, v in scores.items()}


def calibrated_scores(scores: Mapping[str, float], prior: Mapping[str, float],
                      eps: float = EPS, logs: Mapping[str, float] | None = None
                      ) -> dict[str, float]:
    """``P(l|x) / P(l|template)`` normalised over the labels: ``scores`` are the labels'
    scores for the query (``logs``: their logarithms), ``prior`` the template's label
    probabilities (:func:`probabilities` of its scores); a label the prior lacks gets
    ``eps``."""
    p = probabilities(scores, eps, logs)
    raw = {t: p[t] / prior.get(t, eps) for t in p}
    z = sum(raw.values()) or 1.0
    return {t: v / z for t, v in raw.items()}


def calibrate(res: Result, prior: Result, *, eps: float = EPS) -> Result:
    """``res`` with each label's score replaced by ``P(l|x) / P(l|template)``, normalised
    over the labels and re-ranked (what ``classify(calibrate=True)`` computes in its plan;
    here for results already run, as the benchmark reuses one prior per template)."""
    q = probabilities({a.text: a.score for a in prior.answers}, eps,
                      prior.info.get("label_log_scores"))
    cal = calibrated_scores({a.text: a.score for a in res.answers}, q, eps,
                            res.info.get("label_log_scores"))
    answers = sorted((dataclasses.replace(a, score=cal[a.text]) for a in res.answers),
                     key=lambda a: -a.score)
    info = {**res.info, "calibrated": {"template": prior.query,
                                       "prior": {t: round(v, 6) for t, v in q.items()}}}
    return dataclasses.replace(res, answers=tuple(answers), info=info)
