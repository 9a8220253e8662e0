"""Word boundaries and clean phrase edges, from character offsets alone.

DESIGN.md section 1: a token is a *valid start* if it begins a word and a *valid end* if
it ends one; by default neither may be punctuation or a stopword ("clean edges").

A boundary lies between two adjacent tokens when there is a gap between them in the text
(white space, or characters the tokenizer dropped), when either is punctuation, or when
either is a CJK ideograph (each ideograph is a word, as BERT's tokenizer treats it).
Working from offsets rather than wordpiece markers ("##", "Ġ") makes the rule the same
for BERT, RoBERTa and MPNet tokenizers.
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache

import numpy as np

__all__ = [
    "WORD_START", "WORD_END", "VALID_START", "VALID_END", "STOPWORD", "PUNCT", "BREAK",
    "STOPWORDS", "token_flags", "is_punct", "fold", "fold_view",
]

# Answer keys are folded by the query layer; re-exported here for callers that had them.
from npmdb.query.text import fold, fold_view  # noqa: E402

# Per-token flag bits (uint8), stored with every block: defined with the storage layout.
from npmdb.storage.format import (  # noqa: E402
    BREAK, PUNCT, STOPWORD, VALID_END, VALID_START, WORD_END, WORD_START,
)

# English stopwords (the NLTK list, which NPM's released code also used): query/text.py.
from npmdb.query.text import STOPWORDS  # noqa: E402


# Stopword entries that are contraction fragments ("it's", "don't", "we'll"): stopwords
# only right after an apostrophe, so the "S" of "U.S." can still end a phrase.
CONTRACTION_PARTS = frozenset({"s", "t", "d", "ll", "m", "o", "re", "ve", "y"})
APOSTROPHES = frozenset("'’ʼ`")


@lru_cache(maxsize=65536)
def is_punct(s: str) -> bool:
    """True if ``s`` is non-empty and made only of punctuation and symbols."""
    return bool(s) and all(unicodedata.category(ch)[0] in "PS" for ch in s)


# Punctuation that ends a clause or a sentence wherever it stands. NPM's released code
# never returns a span holding "." or ","; these are the marks a phrase answer does not
# cross ("Rome. Milan was next", "X): the capital of Y").
CLAUSE_MARKS = frozenset(",;:!?()[]{}\"“”«»—–…。、；：！？（）")
# Marks that break only with white space (or the text's edge) after them: "U.S.", "3.5",
# "e-mail" and "a/b" stay inside one phrase; "ends." and "a - b" do not.
SPACED_MARKS = frozenset(".-/")


# Single quotes: an apostrophe inside a word ("don't", "O'Brien") or a quote mark, which
# opens after white space and closes before it ("named 'Xray' by", "the ‘Finn’ character").
QUOTES = frozenset("'‘’‛‚`")


def _spaced(text: str, at: int) -> bool:
    """White space, or the text's edge, at character ``at``."""
    return at < 0 or at >= len(text) or text[at].isspace()


_INITIAL = re.compile(r"[A-Z]\.")
_AFTER_NAME = re.compile(r"(?:^|\s)[A-Z][\w'’-]*\.?\s+$")


def is_initial(text: str, start: int, end: int) -> bool:
    """True if the token ``text[start:end]`` is the full stop of a name's initial: one
    capital letter (not "I") alone before it, white space then a capital after it, and a
    name around it: a capitalised word before the initial ("Eric S. Raymond", "Harry S.
    Truman") or another initial after it ("by J. R. R. Tolkien"). "vitamin C. They" and
    "World War I. The" end sentences."""
    if not (text[start:end] == "." and start >= 1 and text[start - 1].isupper()
            and text[start - 1] != "I"
            and (start < 2 or text[start - 2].isspace() or text[start - 2] == ".")
            and end + 1 < len(text) and text[end].isspace() and text[end + 1].isupper()):
        return False
    after = text[end:].lstrip()
    return bool(_INITIAL.match(after) or _AFTER_NAME.search(text[max(0, start - 41):start - 1]))


def is_break(text: str, start: int, end: int) -> bool:
    """True if the token ``text[start:end]`` is clause or sentence punctuation, or a
    single quote that opens or closes a quotation."""
    tok = text[start:end]
    if not tok or not is_punct(tok):
        return False
    if any(ch in CLAUSE_MARKS for ch in tok):
        return True
    if all(ch in QUOTES for ch in tok):
        if tok in APOSTROPHES and not _spaced(text, start - 1) and text[start - 1] in "sS":
            return False  # a plural's possessive ("Farmers' Almanac"), not a closing quote
        return _spaced(text, start - 1) or _spaced(text, end)
    if tok[-1] in SPACED_MARKS:
        return _spaced(text, end) and not is_initial(text, start, end)
    return False


# Marks that join two words into one when nothing separates them from either
# ("Hewlett-Packard", "Free/Open/NetBSD", "O'Brien", "U.S", "3.5"): a phrase does not start
# or end inside such a word ("Packard" alone was an answer).
JOINERS = frozenset("-‐‑/.'’")


def _joins(text: str, start: int, end: int) -> bool:
    """True if the token ``text[start:end]`` is a joiner with a letter or digit touching
    it on both sides; an apostrophe before a contraction's or a possessive's ending
    ("Oregon's", "don't") joins nothing: "Oregon" ends there."""
    tok = text[start:end]
    if not (len(tok) == 1 and tok in JOINERS and start >= 1 and end < len(text)
            and text[start - 1].isalnum() and text[end].isalnum()):
        return False
    if tok in APOSTROPHES:
        tail = end
        while tail < len(text) and text[tail].isalpha():
            tail += 1
        return text[end:tail].casefold() not in CONTRACTION_PARTS
    return True


#: Categories of characters that are not seen alone: format controls (a zero-width
#: joiner), combining and enclosing marks (an emoji's variation selector). Between two
#: emoji (symbols, so word boundaries) they made words of their own, and answers.
INVISIBLE = frozenset({"Cf", "Mn", "Me"})


def is_invisible(word: str) -> bool:
    """True if ``word`` is made only of characters that are not seen alone (INVISIBLE)."""
    return all(unicodedata.category(ch) in INVISIBLE for ch in word)


def _is_ending(tok: str) -> bool:
    """True for a contraction's or possessive's ending with its apostrophe ("'s", "’ll")."""
    return len(tok) > 1 and tok[0] in APOSTROPHES and tok[1:].casefold() in CONTRACTION_PARTS


def is_cjk(ch: str) -> bool:
    cp = ord(ch)
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF
            or 0x2A700 <= cp <= 0x2CEAF or 0xF900 <= cp <= 0xFAFF or 0x2F800 <= cp <= 0x2FA1F)


def token_flags(text: str, offsets: np.ndarray) -> np.ndarray:
    """Flag bits for each token of ``text``.

    ``offsets`` is an ``(n, 2)`` integer array of character spans into ``text`` (no special
    tokens; spans already trimmed of surrounding white space). Returns ``uint8[n]``. A span
    trimmed to nothing (a byte-level tokenizer's white-space token, RoBERTa's "Ċ" or "Ġ")
    is a word boundary on both sides and no word: no flag at all.
    """
    n = len(offsets)
    flags = np.zeros(n, dtype=np.uint8)
    if n == 0:
        return flags
    starts = [int(s) for s in offsets[:, 0]]
    ends = [int(e) for e in offsets[:, 1]]
    punct = [is_punct(text[s:e]) for s, e in zip(starts, ends)]
    cjk_first = [e > s and is_cjk(text[s]) for s, e in zip(starts, ends)]
    cjk_last = [e > s and is_cjk(text[e - 1]) for s, e in zip(starts, ends)]
    empty = [e <= s for s, e in zip(starts, ends)]
    # a byte-level tokenizer's "'s" or "'ll" (one token): the ending is a word of its own,
    # as BERT's "'" "s" are, so "Oregon" ends before "'s" ("Oregon's" was the only phrase)
    ending = [_is_ending(text[s:e]) and (e >= len(text) or not text[e].isalnum())
              for s, e in zip(starts, ends)]   # not "Mu'tazila"

    # boundary[i]: a word boundary lies just before token i.
    boundary = [True] * (n + 1)
    for i in range(1, n):
        boundary[i] = (
            starts[i] > ends[i - 1] or punct[i] or punct[i - 1]
            or cjk_first[i] or cjk_last[i - 1] or empty[i] or empty[i - 1] or ending[i]
        )
    ws = 0
    for i in range(1, n + 1):
        if not boundary[i]:
            continue
        we = i - 1  # word spans tokens ws..we
        if empty[ws]:  # white space alone (its own word: boundaries on both sides)
            ws = i
            continue
        word = text[starts[ws]:ends[we]]
        low = word.casefold()
        is_stop = (low in STOPWORDS and (
            low not in CONTRACTION_PARTS
            or (starts[ws] > 0 and text[starts[ws] - 1] in APOSTROPHES))) or (
            ws == we and ending[ws])
        is_p = is_punct(word)
        clean = not (is_stop or is_p or is_invisible(word))
        # inside a joined word ("Hewlett-Packard"), or an initial ("Eric S")
        inside_before = ws > 0 and _joins(text, starts[ws - 1], ends[ws - 1])
        inside_after = we + 1 < n and (_joins(text, starts[we + 1], ends[we + 1]) or
                                       is_initial(text, starts[we + 1], ends[we + 1]))
        flags[ws] |= WORD_START | (VALID_START if clean and not inside_before else 0)
        flags[we] |= WORD_END | (VALID_END if clean and not inside_after else 0)
        if is_stop:
            flags[ws:we + 1] |= STOPWORD
        ws = i
    for i in range(n):
        if punct[i]:
            flags[i] |= PUNCT | (BREAK if is_break(text, starts[i], ends[i]) else 0)
    return flags
