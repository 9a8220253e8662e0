"""Query text: the mask a query holds, and the case- and white-space folding that answers
are grouped by (DESIGN.md section 1: never a lossy detokenisation)."""

from __future__ import annotations

import re

from npmdb.errors import ProgrammingError

__all__ = ["MASK_PATTERN", "split_mask", "fold", "fold_view"]

MASK_PATTERN = re.compile(r"\[MASK\]|<mask>", re.IGNORECASE)


def split_mask(text: str, own_mask: str = "[MASK]") -> tuple[str, str]:
    """Split a query at its single mask: ``[MASK]``, ``<mask>`` or the tokenizer's own."""
    if not isinstance(text, str):
        raise ProgrammingError(f"the query must be a string, not {type(text).__name__}")
    pattern = MASK_PATTERN
    if own_mask and own_mask.lower() not in ("[mask]", "<mask>"):
        pattern = re.compile(MASK_PATTERN.pattern + "|" + re.escape(own_mask), re.IGNORECASE)
    found = list(pattern.finditer(text))
    if len(found) != 1:
        raise ProgrammingError(
            f"a query needs exactly one mask ([MASK] or <mask>), found {len(found)} in {text!r}")
    m = found[0]
    return text[:m.start()], text[m.end():]


def fold(text: str) -> str:
    """Case- and white-space folding: the key answers are grouped by (never lossy)."""
    return " ".join(text.split()).casefold()


def fold_view(text: str) -> str | None:
    """``text.casefold()`` where slicing it folds the slice: for every span ``[a:b)`` with
    no white space at its edges, ``fold(text[a:b]) == fold_view(text)[a:b]``.

    None where that does not hold: case folding changes the length somewhere (``ß`` ->
    ``ss``; every character folds to at least one, so equal lengths mean one each), or a
    white-space run is not a single space (folding would collapse it).
    """
    folded = text.casefold()
    if len(folded) != len(text) or " ".join(text.split()) != text.strip():
        return None
    return folded
