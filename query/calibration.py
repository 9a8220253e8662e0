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

from .result import Result
from .text import MASK_PATTERN

__all__ = ["content_free", "calibrate"]

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


def calibrate(res: Result, prior: Result, *, eps: float = 1e-3) -> Result:
    """``res`` with each label's score replaced by ``P(l|x) / P(l|template)``, normalised
    over the labels and re-ranked. ``eps`` smooths a label the template never retrieved."""
    def probs(r: Result) -> dict[str, float]:
        total = sum(a.score for a in r.answers if math.isfinite(a.score))
        n = max(len(r.answers), 1)
        return {a.text: ((a.score / total if total > 0 else 0.0) + eps) / (1 + eps * n)
                for a in r.answers}

    p, q = probs(res), probs(prior)
    raw = {t: p[t] / q.get(t, eps) for t in p}
    z = sum(raw.values()) or 1.0
    answers = sorted((dataclasses.replace(a, score=raw[a.text] / z) for a in res.answers),
                     key=lambda a: -a.score)
    info = {**res.info, "calibrated": {"template": prior.query,
                                       "prior": {t: round(v, 6) for t, v in q.items()}}}
    return dataclasses.replace(res, answers=tuple(answers), info=info)
