"""Whole names: an occurrence that is only part of a longer capitalised name.

A run of capitalised words joined by single spaces reads as one name: "New York", "South
Korea", "Prince Edward Island". A span that starts or ends inside such a run ("New",
"Korea", "Edward Island") is a fragment of the name, and an answer found only as such
fragments is not an answer (``whole_names``; not in NPM): summed over "New York", "New
Jersey" and "New Mexico", "New" can outscore each of them. The test reads the text next
to the occurrence: the word before its start and the word after its end, each joined to it
by one space, and the occurrence's own first and last word.
"""

from __future__ import annotations

import re

__all__ = ["name_fragment"]

_WORD_BEFORE = re.compile(r"(\w+) $")
_WORD_AFTER = re.compile(r" (\w+)")


def _capitalised(word: str) -> bool:
    return bool(word) and word[0].isupper()


def name_fragment(text: str, start: int, end: int) -> bool:
    """Whether ``text[start:end]`` starts or ends inside a run of capitalised words."""
    span = text[start:end].split()
    if not span:
        return False
    before = _WORD_BEFORE.search(text, max(0, start - 64), start)
    if before is not None and _capitalised(before.group(1)) and _capitalised(span[0]):
        return True
    after = _WORD_AFTER.match(text, end)
    return after is not None and _capitalised(after.group(1)) and _capitalised(span[-1])
