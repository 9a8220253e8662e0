"""Query text: the mask a query holds, and the case- and white-space folding that answers
are grouped by (DESIGN.md section 1: never a lossy detokenisation)."""

from __future__ import annotations

import re

from npmdb.errors import ProgrammingError

__all__ = ["MASK_PATTERN", "STOPWORDS", "split_mask", "fold", "fold_view", "query_ngrams",
           "words_of", "snippet_bounds", "bm25_text", "query_content_words"]

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


def bm25_text(text: str, *, question: bool = False) -> str:
    """What BM25 searches for a masked query: the query with the mask blanked (NPM's
    restricted mode). ``question``: a query whose mask follows a question ("Where is
    Maiduguri? It is in [MASK].") searches the question alone, up to its first "?", as
    NPM's released code did for question tasks; a query with no "?" before the mask is
    searched whole."""
    m = MASK_PATTERN.search(text)
    if question and m is not None:
        q = text.find("?", 0, m.start())
        if q != -1:
            return text[:q + 1]
    return MASK_PATTERN.sub(" ", text)


def fold(text: str) -> str:
    """Case- and white-space folding: the key answers are grouped by (never lossy)."""
    return " ".join(text.split()).casefold()


def snippet_bounds(text: str, a: int, b: int, width: int) -> tuple[int, int]:
    """``[lo, hi)`` around ``text[a:b]``: up to ``width`` characters each side, cut at
    white space (the context an evidence snippet shows)."""
    lo, hi = max(0, a - width), min(len(text), b + width)
    if lo > 0:
        sp = text.find(" ", lo, a)
        lo = sp + 1 if sp != -1 else lo
    if hi < len(text):
        sp = text.rfind(" ", b, hi)
        hi = sp if sp != -1 else hi
    return lo, hi


_WORD = re.compile(r"\w+")


def words_of(text: str) -> str:
    """The folded words of ``text`` joined by one space (punctuation dropped)."""
    return " ".join(_WORD.findall(text.casefold()))


def query_ngrams(text: str, max_words: int = 20) -> frozenset[str]:
    """Every run of up to ``max_words`` consecutive words of a query (mask removed), as
    :func:`words_of` gives them: an answer equal to one only repeats the query ("capital",
    its own subject). Linear in the query's length (a span of ``max_len`` tokens holds at
    most ``max_len`` words, so longer runs could never match an answer)."""
    grams: set[str] = set()
    for part in MASK_PATTERN.split(text):
        words = _WORD.findall(part.casefold())
        grams.update(" ".join(words[i:j]) for i in range(len(words))
                     for j in range(i + 1, min(i + max_words, len(words)) + 1))
    return frozenset(grams)


def query_content_words(text: str) -> frozenset[str]:
    """The folded words of a query (mask removed) that are not stopwords: an answer holding
    one copies the query ("capital of Moldova" for "Where is Moldova?")."""
    return frozenset(w for w in _WORD.findall(MASK_PATTERN.sub(" ", text).casefold())
                     if w not in STOPWORDS)


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


# English stopwords (the NLTK list, which NPM's released code also used).
STOPWORDS: frozenset[str] = frozenset("""
i me my myself we our ours ourselves you your yours yourself yourselves he him his himself
she her hers herself it its itself they them their theirs themselves what which who whom
this that these those am is are was were be been being have has had having do does did
doing a an the and but if or because as until while of at by for with about against
between into through during before after above below to from up down in out on off over
under again further then once here there when where why how all any both each few more
most other some such no nor not only own same so than too very s t can will just don
should now d ll m o re ve y ain aren couldn didn doesn hadn hasn haven isn ma mightn
mustn needn shan shouldn wasn weren won wouldn
""".split())
