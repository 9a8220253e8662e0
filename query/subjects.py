"""Names of the query's subject: the head of a dictionary-style entry.

An entry's head is its title restated at the start of its text, with any other names of
the same thing in brackets, up to the first ": "::

    Washington (Evergreen State, WA): a state in northwestern United States on the Pacific

The head names the entry's subject. When the title or one of the other names occurs in
the query as whole words, each name in the head is a name of what the query asks about,
not an answer to it: "WA" for "Washington, which is an american state, is part of
[MASK]." (the issue's failure mode "answers copy ... the query's own subject", in other
words). An answer found only inside such heads is therefore dropped
(``not_subject_name``; not in NPM; :mod:`npmdb.query.answer_rules`). Text without such a head (running prose, a title that
the text does not restate) is untouched.
"""

from __future__ import annotations

from dataclasses import dataclass

from npmdb.errors import ProgrammingError

from .text import STOPWORDS, fold, split_mask

__all__ = ["EntryHead", "entry_head", "SubjectNames"]

# a head longer than this is not a head (a colon deep inside running text)
MAX_HEAD = 400


@dataclass(frozen=True, slots=True)
class EntryHead:
    """The head of an entry: ``text[:end]`` holds ``names`` (the title first)."""

    end: int
    names: tuple[str, ...]


def entry_head(title: str, text: str) -> EntryHead | None:
    """The head of ``text`` when it restates ``title`` (with bracketed other names) before
    its first ": ", else None."""
    if not title or not text.startswith(title):
        return None
    end = text.find(": ", len(title), MAX_HEAD)
    if end < 0:
        return None
    rest = text[len(title):end]
    if not rest:
        return EntryHead(end, (title,))
    if not (rest.startswith(" (") and rest.endswith(")")):
        return None
    others = tuple(n.strip() for n in rest[2:-1].split(",") if n.strip())
    return EntryHead(end, (title, *others))


def _word_char(c: str) -> bool:
    return c.isalnum() or c == "_"  # what a regular expression's \w matches


def _occurs_as_words(needle: str, hay: str) -> bool:
    """Whether ``needle`` occurs in ``hay`` with no word character on either side (a plain
    search, not a regular expression compiled for each name of each document read)."""
    i = hay.find(needle)
    while i >= 0:
        j = i + len(needle)
        if (i == 0 or not _word_char(hay[i - 1])) and (j == len(hay) or not _word_char(hay[j])):
            return True
        i = hay.find(needle, i + 1)
    return False


class SubjectNames:
    """Which entry heads name the subject of one query."""

    def __init__(self, query: str) -> None:
        try:
            before, after = split_mask(query)
        except ProgrammingError:  # no single mask (a classify template): the whole text
            before, after = query, ""
        self.query = fold(f"{before} {after}")

    def names_subject(self, head: EntryHead) -> bool:
        """Whether one of the head's names (none a stopword) occurs in the query as whole
        words."""
        for name in head.names:
            n = fold(name)
            if n and n not in STOPWORDS and _occurs_as_words(n, self.query):
                return True
        return False

    def head_end(self, title: str, text: str) -> int:
        """Where the head of ``text`` that names the query's subject ends (0: none)."""
        head = entry_head(title, text)
        return head.end if head is not None and self.names_subject(head) else 0
