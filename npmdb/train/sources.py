"""The default encoder's training corpus: general English text rebuilt offline from packages.

Every source is a reader over files that Debian packages install (``apt-get install`` them;
see :data:`SOURCES`), yielding documents ``{"id", "title", "text"}`` in the bundled sample
corpus's shape. :func:`build` samples each source deterministically, adds the part of the
bundled sample corpus that is not held out (:func:`held_out`), and returns the documents
with a manifest (counts, packages, licence files). Nothing here reads evaluation queries:
only corpus text.

The held-out fifth of the sample corpus (by a hash of the document id) is never trained
on, so ``bench/quality.py --split held-out`` measures the shipped encoder on facts whose
text it never saw. WordNet glosses of those documents are excluded too.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import random
import re
from pathlib import Path
from typing import Iterable, Iterator

from npmdb.errors import NotSupportedError, OperationalError

__all__ = ["Source", "SOURCES", "SCRIPT_LANGS", "held_out", "read_dictd", "read_wordnet",
           "read_fortunes", "pair_reversals", "pair_words", "script_pairs",
           "script_pair_documents", "build"]

DICTD = Path("/usr/share/dictd")
WORDNET = Path("/usr/share/wordnet")
FORTUNES = Path("/usr/share/games/fortunes")
HELD_OUT_FIFTH = 0  # documents whose id hashes to this residue mod 5 are held out


@dataclasses.dataclass(frozen=True)
class Source:
    """One package's text: how many documents to sample and under which licence."""

    name: str
    package: str
    licence: str
    count: int


# Sampled counts keep the corpus near 0.4M words with the sample corpus (two encoding passes of it fit the
# recipe's budget on 2 CPU cores).
SOURCES: tuple[Source, ...] = (
    Source("wordnet", "wordnet-base", "WordNet 3.0 licence (BSD-like)", 8000),
    Source("gcide", "dict-gcide", "GPL-3+ (GNU Collaborative International Dictionary)", 1500),
    Source("foldoc", "dict-foldoc", "GFDL-1.1+ (Free On-line Dictionary of Computing)", 500),
    Source("jargon", "dict-jargon", "public domain (The Jargon File)", 250),
    Source("devil", "dict-devil", "public domain (The Devil's Dictionary, 1911)", 300),
    Source("fortunes", "fortunes", "BSD-3-clause / public domain (fortune-mod data)", 1500),
    Source("freedict", "dict-freedict-{deu,fra,ita,spa,nld,swe}-eng and eng-*",
           "GPL-2+/GPL-3+/CC-BY-SA (FreeDict; per dictionary)", 3000),
    Source("script_pairs", "dict-freedict-{eng-ell,ell-eng,eng-rus,eng-jpn,eng-ara,ara-eng}",
           "GPL-2+/GPL-3+/CC-BY-SA (FreeDict; per dictionary)", 12000),
)

FREEDICT_LANGS = ("deu", "fra", "ita", "spa", "nld", "swe")
FORTUNE_FILES = ("fortunes", "literature", "wisdom", "people", "science", "humorists",
                 "education", "law", "politics", "medicine", "work", "food", "love",
                 "men-women", "riddles", "songs-poems", "platitudes", "miscellaneous")


def held_out(doc_id: str) -> bool:
    """True for the fifth of the sample corpus that the shipped encoder never trains on."""
    h = int(hashlib.sha256(doc_id.encode()).hexdigest()[:8], 16)
    return h % 5 == HELD_OUT_FIFTH


# --------------------------------------------------------------------------- readers

_B64 = {c: i for i, c in enumerate(
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")}


def _b64(s: str) -> int:
    v = 0
    for c in s:
        v = v * 64 + _B64[c]
    return v


def read_dictd(name: str, root: Path = DICTD) -> Iterator[tuple[str, str]]:
    """``(headword, entry text)`` of a dictd database ``root/name.{index,dict.dz}``."""
    index, data = root / f"{name}.index", root / f"{name}.dict.dz"
    if not index.exists() or not data.exists():
        raise OperationalError(f"dictionary {name!r} is not installed ({index}): "
                               "install its Debian package (see npmdb.train.sources.SOURCES)")
    blob = gzip.open(data).read()
    for line in index.read_text(encoding="utf-8", errors="replace").splitlines():
        parts = line.split("\t")
        if len(parts) < 3 or parts[0].startswith("00-database"):
            continue
        off, n = _b64(parts[1]), _b64(parts[2])
        yield parts[0], blob[off:off + n].decode("utf-8", errors="replace")


_MARKUP = [(re.compile(r"\\[^\\\n]*\\"), ""),            # gcide pronunciation \Al"lo*cate\
           (re.compile(r"/[^/\n]*/"), ""),               # freedict IPA /ˈapɡə/
           (re.compile(r"\[(?:1913 Webster|WordNet[^\]]*|PJC|Obs\.|R\.|[A-Z]{2,6})\]"), ""),
           (re.compile(r"--[A-Z][\w. ]*\."), ""),         # --Bacon.
           (re.compile(r"[{}<>]"), ""),
           (re.compile(r"\s+"), " ")]


def clean(text: str, limit: int = 600) -> str:
    """Dictionary markup stripped, white space folded, cut at a sentence within ``limit``."""
    for pat, rep in _MARKUP:
        text = pat.sub(rep, text)
    text = text.strip()
    if len(text) > limit:
        cut = text.rfind(". ", 0, limit)
        text = text[:cut + 1] if cut > limit // 3 else text[:limit].rsplit(" ", 1)[0]
    return text


_ETYMOLOGY = re.compile(r"\[[^\]]*\]")
_LEAD = re.compile(r"^[\s,.;:]*(?:(?:v\. ?[ti]|n|v|a|adj|adv|prep|conj|interj|pron)\.[\s,;]*)*")


def _definition(head: str, entry: str) -> str:
    """``head: definition`` from a dictd entry (headword, pronunciation, etymology gone)."""
    body = clean(_ETYMOLOGY.sub("", _MARKUP[0][0].sub("", entry)), limit=10_000)
    if body.lower().startswith(head.lower()):
        body = body[len(head):]
    body = clean(_LEAD.sub("", body), limit=400)
    return f"{head}: {body}" if body else ""


def read_wordnet(root: Path = WORDNET, skip: set[str] = frozenset()) -> Iterator[dict]:
    """WordNet synsets as ``lemma (other lemmas): gloss`` (the sample corpus's form).

    Nouns get the sample corpus's ids (``wn:<offset>``), so ``skip`` can exclude them.
    """
    for pos, prefix in (("noun", "wn:"), ("verb", "wn-v:"), ("adj", "wn-a:"), ("adv", "wn-r:")):
        path = root / f"data.{pos}"
        if not path.exists():
            raise OperationalError(f"{path} is missing: apt-get install wordnet-base")
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith(" ") or "|" not in line:
                continue
            head, gloss = line.split("|", 1)
            f = head.split()
            doc_id = prefix + f[0]
            if doc_id in skip:
                continue
            n = int(f[3], 16)
            lemmas = [re.sub(r"\(\w+\)$", "", w).replace("_", " ") for w in f[4:4 + 2 * n:2]]
            title = lemmas[0]
            other = f" ({', '.join(lemmas[1:])})" if len(lemmas) > 1 else ""
            yield {"id": doc_id, "title": title, "text": f"{title}{other}: {gloss.strip()}"}


def read_fortunes(root: Path = FORTUNES) -> Iterator[dict]:
    """Fortune cookies of the prose files (no ASCII art), one document each."""
    for name in FORTUNE_FILES:
        path = root / name
        if not path.exists():
            continue
        for i, text in enumerate(path.read_text(encoding="utf-8", errors="replace")
                                 .split("\n%\n")):
            text = re.sub(r"\s+", " ", text).strip()
            letters = sum(c.isalpha() for c in text)
            if 40 <= len(text) <= 600 and letters > 0.7 * len(text.replace(" ", "")):
                yield {"id": f"fortune:{name}:{i}", "title": name, "text": text}


def _dictionary(name: str) -> Iterator[dict]:
    for i, (head, entry) in enumerate(read_dictd(name)):
        text = _definition(head, entry)
        if len(text) > len(head) + 12:
            yield {"id": f"{name}:{i}", "title": head, "text": text}


def _freedict_pairs(lang: str) -> Iterator[dict]:
    """Entries of ``lang-eng`` whose first English word is a headword of ``eng-lang``, with
    that entry: each pair occurs in two blocks, so its words can be training targets."""
    def first_line(entry: str) -> str:
        lines = [ln.strip() for ln in entry.split("\n")[1:] if ln.strip()]
        return clean(lines[0], 200) if lines else ""

    back = {}
    for head, entry in read_dictd(f"freedict-eng-{lang}"):
        back.setdefault(head.lower(), (head, first_line(entry)))
    for i, (head, entry) in enumerate(read_dictd(f"freedict-{lang}-eng")):
        eng = first_line(entry)
        key = eng.split(",")[0].strip().lower()
        if not eng or key not in back or not back[key][1]:
            continue
        yield {"id": f"freedict-{lang}-eng:{i}", "title": head, "text": f"{head}: {eng}"}
        bh, bt = back[key]
        yield {"id": f"freedict-eng-{lang}:{i}", "title": bh, "text": f"{bh}: {bt}"}


#: The Wikipedia sample that gensim ships for its tests (107 articles, ~0.5M words of
#: encyclopedic prose: "Algiers is the capital of Algeria" sentences that glosses never
#: have), read from gensim's wheel (``pip download --no-deps gensim``; never imported).
WIKIPEDIA_MEMBER = ("gensim/test/test_data/"
                    "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2")


def read_wikipedia(path: Path, max_words: int = 150) -> Iterator[dict]:
    """Articles of a MediaWiki XML dump (``.bz2``, or a wheel holding
    :data:`WIKIPEDIA_MEMBER`) as passages of at most ``max_words`` words, cut at
    sentence ends, their markup stripped (``mwparserfromhell``); redirects, lists of
    links and captions are skipped. Ids ``enwiki:<page id>:<n>``, titled by the article."""
    import bz2
    import xml.etree.ElementTree as ET
    import zipfile

    try:
        import mwparserfromhell
    except ImportError as exc:
        raise NotSupportedError("reading Wikipedia markup needs mwparserfromhell: "
                                "pip install 'npmdb[encoder]'") from exc
    path = Path(path)
    if not path.exists():
        raise OperationalError(f"{path} is missing: `pip download --no-deps gensim` fetches "
                               "the wheel that holds the Wikipedia sample (make encoder does)")
    raw = zipfile.ZipFile(path).open(WIKIPEDIA_MEMBER) if zipfile.is_zipfile(path) \
        else open(path, "rb")
    with raw, bz2.open(raw) as xml:
        for _, el in ET.iterparse(xml):
            if not el.tag.endswith("}page"):
                continue
            ns = el.tag[:-len("page")]
            title, pid = el.findtext(ns + "title") or "", el.findtext(ns + "id") or ""
            body = el.findtext(f"{ns}revision/{ns}text") or ""
            el.clear()
            if not body or body.lstrip().upper().startswith("#REDIRECT"):
                continue
            yield from _passages(title, pid, mwparserfromhell.parse(body).strip_code(),
                                 max_words)


def _passages(title: str, pid: str, plain: str, max_words: int) -> Iterator[dict]:
    paras = [re.sub(r"\s+", " ", p).strip() for p in plain.split("\n")]
    paras = [p for p in paras if len(p.split()) >= 8 and ":" not in p.split()[0]]
    words: list[str] = []
    n = 0
    for para in paras:
        for sentence in re.split(r"(?<=[.!?])\s+", para):
            w = sentence.split()
            if words and len(words) + len(w) > max_words:
                yield {"id": f"enwiki:{pid}:{n}", "title": title, "text": " ".join(words)}
                n, words = n + 1, []
            words += w
    if words:
        yield {"id": f"enwiki:{pid}:{n}", "title": title, "text": " ".join(words)}


#: Languages written in another script, as the sample corpus's translation pairs are:
#: code -> (name, FreeDict dictionaries whose headword is English, whose headword is
#: the foreign word). Debian packages ``dict-freedict-<pair>``; Russian has no rus-eng.
SCRIPT_LANGS: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    "ell": ("Greek", ("freedict-eng-ell",), ("freedict-ell-eng",)),
    "rus": ("Russian", ("freedict-eng-rus",), ()),
    "jpn": ("Japanese", ("freedict-eng-jpn",), ()),   # jpn-eng is headed by kana readings
    "ara": ("Arabic", ("freedict-eng-ara",), ("freedict-ara-eng",)),
}
_SCRIPT = {"ell": re.compile(r"[\u0370-\u03ff\u1f00-\u1fff]"),
           "rus": re.compile(r"[\u0400-\u04ff]"),
           "jpn": re.compile(r"[\u3040-\u30ff\u4e00-\u9fff]"),
           "ara": re.compile(r"[\u0600-\u06ff]")}
_ENGLISH = re.compile(r"^[A-Za-z][A-Za-z .'-]*$")
_NUMBERED = re.compile(r"^\d+\.\s*")


def _entry_lines(entry: str) -> tuple[str, list[str]]:
    """A FreeDict entry's headword as written (pronunciation and part of speech gone) and
    its translation lines."""
    lines = [ln.strip() for ln in entry.split("\n")]
    head = lines[0].split(" /")[0].split(" <")[0].strip()
    return head, [_NUMBERED.sub("", ln) for ln in lines[1:] if ln and not ln.startswith("(")]


def script_pairs(lang: str, root: Path = DICTD) -> Iterator[tuple[str, str]]:
    """``(foreign, english)`` word pairs of :data:`SCRIPT_LANGS` ``lang``: the first
    translation of each entry, the foreign side in its script, the English side plain
    words (a name keeps its capital: "Kabul" / "Кабул")."""
    _, eng_first, foreign_first = SCRIPT_LANGS[lang]
    script = _SCRIPT[lang]

    def first(items: list[str], ok) -> str:
        for ln in items:
            w = ln.split(",")[0].split(";")[0].strip()
            if w and ok(w):
                return w
        return ""

    def is_foreign(w: str) -> bool:
        return bool(script.search(w))

    def is_english(w: str) -> bool:
        return bool(_ENGLISH.match(w))

    for name, english_head in [(n, True) for n in eng_first] + [(n, False) for n in foreign_first]:
        head_ok, translation_ok = (is_english, is_foreign) if english_head else (is_foreign,
                                                                                 is_english)
        for _, entry in read_dictd(name, root):
            head, rest = _entry_lines(entry)
            translation = first(rest, translation_ok)
            if translation and head_ok(head):
                yield (translation, head) if english_head else (head, translation)


def script_pair_documents(lang: str, count: int, rng: random.Random, *,
                          exclude: set[str] = frozenset(), names: set[str] | None = None,
                          root: Path = DICTD) -> list[dict]:
    """``count`` pairs of ``lang`` as two documents each, so both words are targets: the
    dictionary's form (``"Кабул: Kabul"``, the sample corpus's) and an encyclopedia's
    (``"Kabul (Russian: Кабул)"``, as articles name a word in another language).

    Names are taken first: an English side with a capital, or, for a dictionary that
    capitalises every headword (eng-ara), one in ``names``. Words and names of at most
    three words only (no definitions). A pair either of whose sides is in ``exclude``
    (case-folded: the sample corpus's pairs, so its held-out split stays unseen) is
    skipped."""
    language = SCRIPT_LANGS[lang][0]
    seen: set[str] = set()
    found, other = [], []
    for foreign, eng in script_pairs(lang, root):
        key = foreign.casefold()
        if (key in seen or key in exclude or eng.casefold() in exclude
                or len(foreign.split()) > 3 or len(eng.split()) > 3):
            continue
        seen.add(key)
        is_name = eng in names if names is not None else eng[0].isupper()
        (found if is_name else other).append((foreign, eng))
    names_, words = found, other
    rng.shuffle(names_)
    rng.shuffle(words)
    docs = []
    for i, (foreign, eng) in enumerate((names_ + words)[:count]):
        docs.append({"id": f"pairs-{lang}:{i}", "title": foreign, "text": f"{foreign}: {eng}"})
        docs.append({"id": f"pairs-{lang}:{i}:en", "title": eng,
                     "text": f"{eng} ({language}: {foreign})"})
    return docs


def pair_words(docs: Iterable[dict], prefixes: tuple[str, ...] = ("freedict-",)) -> set[str]:
    """Case-folded words and names on either side of the dictionary pairs among ``docs``
    (``"Κιότο: Kyoto"`` gives ``κιότο`` and ``kyoto``)."""
    out: set[str] = set()
    for d in docs:
        if str(d.get("id", "")).startswith(prefixes):
            head, _, gloss = str(d.get("text", "")).partition(": ")
            for part in re.split(r"[,;()]", head + "," + gloss):
                if part.strip():
                    out.add(part.strip().casefold())
    return out


#: Sample-corpus documents that are dictionary pairs ("HEAD: translation"), by id prefix.
PAIR_PREFIXES = ("freedict-",)


def pair_reversals(docs: Iterable[dict], prefixes: tuple[str, ...] = PAIR_PREFIXES
                   ) -> list[dict]:
    """The other direction of each dictionary pair among ``docs``: ``"Κιότο: Kyoto"``
    gives ``"Kyoto: Κιότο"`` (id ``<id>:rev``, titled by the translation).

    The sample corpus holds one direction of each Greek, Russian, Arabic and Japanese pair,
    so each foreign word occurs in one block: NPM's masking (a span needs an occurrence in
    another block) never makes it a target, every training batch shows its wordpieces only
    as negatives, and the encoder learns to score them like punctuation (translation EM
    0.0 in every mode). With the reverse in the corpus, both words of a pair are targets,
    as with the packaged pairs (:func:`_freedict_pairs`). Only documents whose id starts
    with one of ``prefixes``, whose text is ``HEAD: GLOSS`` with the title opening
    ``HEAD``, are reversed."""
    out = []
    for d in docs:
        if not str(d.get("id", "")).startswith(prefixes):
            continue
        head, sep, gloss = str(d.get("text", "")).partition(": ")
        title = str(d.get("title") or "")
        if not sep or not gloss.strip() or not title or not head.startswith(title):
            continue
        out.append({"id": f"{d['id']}:rev", "title": gloss.split(";")[0].split("(")[0].strip(),
                    "text": f"{gloss.strip()}: {head.strip()}"})
    return out


def _sample(docs: Iterable[dict], count: int, rng: random.Random, pairs: bool = False
            ) -> list[dict]:
    docs = list(docs)
    if pairs:  # keep both entries of a pair
        groups = [docs[i:i + 2] for i in range(0, len(docs), 2)]
        rng.shuffle(groups)
        return [d for g in groups[:count // 2] for d in g]
    rng.shuffle(docs)
    return docs[:count]


def _script_sources(count: int, rng: random.Random, *, exclude: set[str]) -> list[dict]:
    """``count`` documents of :func:`script_pair_documents`, an equal share per language
    (eng-ara capitalises every headword: its names are those the other languages name)."""
    per = max(1, count // (2 * len(SCRIPT_LANGS)))
    names = {e for lang in SCRIPT_LANGS if lang != "ara"
             for _, e in script_pairs(lang) if e[0].isupper()}
    return [d for lang in SCRIPT_LANGS
            for d in script_pair_documents(lang, per, rng, exclude=exclude,
                                           names=names if lang == "ara" else None)]


def build(sample_docs: Iterable[dict], *, seed: int = 13, scale: float = 1.0,
          reverse_pairs: bool = True) -> tuple[list[dict], dict]:
    """The training corpus and its manifest.

    ``sample_docs`` is the bundled sample corpus; its held-out fifth is dropped.
    ``scale`` multiplies every source's count (tests use a small one).
    ``reverse_pairs``: add :func:`pair_reversals` of the kept sample documents, so each
    of their foreign words occurs in two blocks and can be a training target
    (bench/results/translation-dev-small-root-cause.md).
    """
    rng = random.Random(seed)
    sample = [d if isinstance(d, dict) else {"id": d.id, "title": d.title, "text": d.text}
              for d in sample_docs]
    kept = [d for d in sample if not held_out(d["id"])]
    skip = {d["id"] for d in sample}
    counts = {s.name: max(1, int(s.count * scale)) for s in SOURCES}
    per_lang = max(2, counts["freedict"] // len(FREEDICT_LANGS))
    readers = {
        "wordnet": lambda: _sample(read_wordnet(skip=skip), counts["wordnet"], rng),
        "gcide": lambda: _sample(_dictionary("gcide"), counts["gcide"], rng),
        "foldoc": lambda: _sample(_dictionary("foldoc"), counts["foldoc"], rng),
        "jargon": lambda: _sample(_dictionary("jargon"), counts["jargon"], rng),
        "devil": lambda: _sample(_dictionary("devil"), counts["devil"], rng),
        "fortunes": lambda: _sample(read_fortunes(), counts["fortunes"], rng),
        "freedict": lambda: [d for lang in FREEDICT_LANGS
                             for d in _sample(_freedict_pairs(lang), per_lang, rng, pairs=True)],
        # every sample pair, held out or not, stays out of the packaged ones
        "script_pairs": lambda: _script_sources(counts["script_pairs"], rng,
                                                exclude=pair_words(sample)),
    }
    reversed_pairs = pair_reversals(kept) if reverse_pairs else []
    docs: list[dict] = list(kept) + reversed_pairs
    manifest = {"seed": seed, "scale": scale,
                "sample": {"documents": len(kept), "held_out": len(sample) - len(kept),
                           "reversed_pairs": len(reversed_pairs),
                           "licence": "see npmdb/data/README.md"},
                "sources": {}}
    for src in SOURCES:
        got = readers[src.name]()
        docs.extend(got)
        manifest["sources"][src.name] = {"documents": len(got), "package": src.package,
                                         "licence": src.licence,
                                         "words": sum(len(d["text"].split()) for d in got)}
    rng.shuffle(docs)
    manifest["documents"] = len(docs)
    manifest["words"] = sum(len(d["text"].split()) for d in docs)
    return docs, manifest
