"""A brute-force reference implementation of DESIGN.md section 1 (the query contract).

Written from the spec, not from the engine: nothing here imports ``npmdb.query``. It reads
the stored data of a database once through ``db.snapshot()`` (token columns, every token's
vector, the documents), encodes queries with the snapshot's own encoder, and then answers
fill-mask and classification queries by exhaustive numpy computation:

* candidates: exact top-``k`` valid starts / valid ends by ``sim(q, c) = q·E(c)/sqrt(h)``
  over *every* stored token (dense), every token of the BM25 blocks (bm25), or both;
* phrases: forward from each candidate start and backward from each candidate end, up to
  ``max_len`` tokens, inside one block, from a valid start to a valid end;
* scores: ``P_s = softmax(sim_s/tau)`` over the set S of all candidate spans' starts,
  ``P_e`` likewise over E, span score ``P_s[s] + P_e[e]``; with ``bm25_prior`` each
  candidate of a retrieved BM25 block first gains that weight times the block's BM25
  score on its text alone (``db.search`` without titles gives the score);
* answers: occurrences grouped by ``" ".join(text.split()).casefold()`` of the document
  text sliced through the character offsets, score = sum * n_tokens ** alpha;
* token mode: top-``k`` tokens that are a valid start or a valid end, softmax(sim/tau),
  summed per folded token text;
* classification: per label, sum of exp(sim_s/tau + sim_e/tau) over candidate spans (or
  exp(sim/tau) over candidate tokens) whose folded text is one of the label's words.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np

# Flag bits, as documented in npmdb/boundaries.py (the stored per-token flags).
VALID_START = 1 << 0
VALID_END = 1 << 1
BREAK = 1 << 6     # clause/sentence punctuation: NPM never returns a span holding "." or ","

MASK_RE = re.compile(r"\[MASK\]|<mask>", re.IGNORECASE)


def fold(text: str) -> str:
    return " ".join(text.split()).casefold()


def _query_grams(text: str) -> set[str]:
    """Runs of consecutive words on either side of the mask, case-folded."""
    grams: set[str] = set()
    for part in re.split(r"\[MASK\]|<mask>", text, flags=re.IGNORECASE):
        w = re.findall(r"\w+", part.casefold())
        grams.update(" ".join(w[i:j]) for i in range(len(w)) for j in range(i + 1, len(w) + 1))
    return grams


def _subject_head_end(title: str, text: str, query: str) -> int:
    """DESIGN.md's entry head: ``text`` starts with ``title``, then optionally its other
    names in brackets, then ": " (within the first 400 characters). Where the title or one
    of those names (not a stopword) is a whole-word run of the query, the head's end; else
    0."""
    from npmdb.boundaries import STOPWORDS

    if not title or not text.startswith(title):
        return 0
    colon = text.find(": ", len(title))
    if colon < 0 or colon + 2 > 400:
        return 0
    between = text[len(title):colon]
    if between and not re.fullmatch(r" \(.*\)", between, flags=re.DOTALL):
        return 0
    names = [title] + [n.strip() for n in between[2:-1].split(",")] if between else [title]
    q = fold(MASK_RE.sub(" ", query))
    for n in map(fold, names):
        if n and n not in STOPWORDS and re.search(rf"(?<!\w){re.escape(n)}(?!\w)", q):
            return colon
    return 0


_PARTICLES = ("of", "de", "da", "di", "do", "du", "del", "della", "des", "dos", "das",
              "van", "von", "der", "den", "la", "le")


def _word_ending_at(text: str, i: int) -> tuple[str, int] | None:
    """The word that ends at ``i`` (exclusive) and starts after one space, and where that
    space is; None when no such word."""
    j = i
    while j > 0 and (text[j - 1].isalnum() or text[j - 1] == "_"):
        j -= 1
    if j == i:
        return None
    return text[j:i], j - 1


def _word_starting_at(text: str, i: int) -> tuple[str, int] | None:
    j = i
    while j < len(text) and (text[j].isalnum() or text[j] == "_"):
        j += 1
    return (text[i:j], j) if j > i else None


def _inside_a_name(text: str, start: int, end: int) -> bool:
    """DESIGN.md's name fragment: the span's first word is capitalised and the word just
    before it (one space between) is too, or is a name particle ("of", "de", "van", ...)
    with a capitalised word one space before it; likewise its last word and the words
    after."""
    words = text[start:end].split()
    if not words:
        return False
    if words[0][0].isupper() and start >= 1 and text[start - 1] == " ":
        w = _word_ending_at(text, start - 1)
        if w is not None:
            if w[0][0].isupper():
                return True
            if w[0] in _PARTICLES and w[1] >= 1 and text[w[1]] == " ":
                v = _word_ending_at(text, w[1])
                if v is not None and v[0][0].isupper():
                    return True
    if words[-1][0].isupper() and end < len(text) and text[end] == " ":
        w = _word_starting_at(text, end + 1)
        if w is not None:
            if w[0][0].isupper():
                return True
            if w[0] in _PARTICLES and w[1] < len(text) and text[w[1]] == " ":
                v = _word_starting_at(text, w[1] + 1)
                if v is not None and v[0][0].isupper():
                    return True
    return False


def _softmax(x: np.ndarray, tau: float) -> np.ndarray:
    z = np.asarray(x, dtype=np.float64) / tau
    z = z - z.max()
    e = np.exp(z)
    return e / e.sum()


def _logsumexp(z: list[float]) -> float:
    if not z:
        return float("-inf")
    m = max(z)
    return m + math.log(sum(math.exp(v - m) for v in z))


def _topk(idx: np.ndarray, sims: np.ndarray, k: int) -> tuple[np.ndarray, float]:
    """Top ``k`` of ``idx`` by ``sims``; also the gap between the k-th and (k+1)-th sims
    (``inf`` when everything is taken), which tells whether the cut is a tie."""
    order = np.argsort(-sims, kind="stable")
    if len(order) <= k:
        return idx[order], float("inf")
    gap = float(sims[order[k - 1]] - sims[order[k]])
    return idx[order[:k]], gap


@dataclass
class OracleAnswer:
    key: str
    score: float = 0.0
    support: int = 0
    n_tokens: set = field(default_factory=set)
    # alpha != 0 and one folded text was tokenised two ways: n_tokens ** alpha is ambiguous
    ambiguous: bool = False
    # (doc_id, char start, char end, occurrence score)
    occurrences: list = field(default_factory=list)


@dataclass
class OracleResult:
    answers: dict[str, OracleAnswer]
    gap: float            # smallest top-k cut gap over the sides used (inf: no cut)
    n_spans: int = 0
    n_starts: int = 0
    n_ends: int = 0

    def ranked(self) -> list[OracleAnswer]:
        return sorted(self.answers.values(), key=lambda a: -a.score)


@dataclass
class OracleLabels:
    log_score: dict[str, float]   # label -> log(score); -inf when nothing matched
    support: dict[str, int]       # label -> matching candidates
    gap: float


class Oracle:
    """Everything one version of a database stores, loaded into numpy arrays."""

    def __init__(self, db, version=None) -> None:
        self.db = db
        toks_flags, offs, seg_of, blk_lo, blk_hi, doc_of, vecs = [], [], [], [], [], [], []
        alive_parts: list[np.ndarray] = []
        self.docs: list[tuple[str, str, str]] = []      # (id, title, text), global order
        self.block_index: dict[tuple[int, int], tuple[int, int]] = {}  # (si, b) -> [lo, hi)
        self.doc_seg: dict[str, int] = {}
        base = 0
        with db.snapshot(version) as snap:
            self.generation = snap.generation
            self.version = snap.manifest.id
            for si, seg in enumerate(snap.segments):
                cols = seg.columns(snap.txn)
                n = len(cols.tokens)
                dead = set(snap.manifest.deleted.get(seg.seg, ()))
                n_docs = seg.record.docs
                doc_base = len(self.docs)
                for local in range(n_docs):
                    d = snap.doc(si, local)
                    self.docs.append((d.id, d.title, d.text))
                    if local not in dead:
                        self.doc_seg[d.id] = si
                alive_doc = np.array([i not in dead for i in range(n_docs)], dtype=bool)
                ptr = np.asarray(cols.block_ptr, dtype=np.int64)
                tok_blk_lo = np.empty(n, np.int64)
                tok_blk_hi = np.empty(n, np.int64)
                tok_doc = np.empty(n, np.int64)
                for b in range(len(ptr) - 1):
                    lo, hi = int(ptr[b]), int(ptr[b + 1])
                    tok_blk_lo[lo:hi] = base + lo
                    tok_blk_hi[lo:hi] = base + hi
                    tok_doc[lo:hi] = int(cols.block_doc[b])
                    self.block_index[(si, b)] = (base + lo, base + hi)
                toks_flags.append(np.asarray(cols.flags, dtype=np.uint8).copy())
                offs.append(np.asarray(cols.offsets, dtype=np.int64).reshape(-1, 2).copy())
                seg_of.append(np.full(n, si, np.int64))
                blk_lo.append(tok_blk_lo)
                blk_hi.append(tok_blk_hi)
                doc_of.append(tok_doc + doc_base)
                v = seg.vectors(snap.txn, snap.generation, np.arange(n, dtype=np.int64))
                vecs.append(np.asarray(v, dtype=np.float64))
                alive_parts.append(alive_doc[tok_doc])
                base += n
        self.flags = np.concatenate(toks_flags) if toks_flags else np.zeros(0, np.uint8)
        self.offsets = np.concatenate(offs) if offs else np.zeros((0, 2), np.int64)
        self.seg_of = np.concatenate(seg_of) if seg_of else np.zeros(0, np.int64)
        self.block_lo = np.concatenate(blk_lo) if blk_lo else np.zeros(0, np.int64)
        self.block_hi = np.concatenate(blk_hi) if blk_hi else np.zeros(0, np.int64)
        self.doc_of = np.concatenate(doc_of) if doc_of else np.zeros(0, np.int64)
        self.vectors = np.concatenate(vecs) if vecs else np.zeros((0, 1))
        self.alive = np.concatenate(alive_parts) if alive_parts else np.zeros(0, bool)
        self.hidden = self.vectors.shape[1]
        self.n_tokens = len(self.flags)

    # -- pieces --------------------------------------------------------------------------

    def encode(self, text: str, mode: str):
        return self.db.encoder_for(self.generation).encode_query(text, mode)

    def sims(self, q: np.ndarray) -> np.ndarray:
        # einsum, not ``@``: a multi-threaded OpenBLAS call leaves its threads spinning, which
        # slows the next torch forward pass (query encoding) ~20x on a 2-core machine.
        q = np.asarray(q, dtype=np.float64)
        return np.einsum("ij,j->i", self.vectors, q) / math.sqrt(self.hidden)

    def surface(self, s: int, e: int) -> str:
        return self.docs[int(self.doc_of[s])][2][int(self.offsets[s, 0]):int(self.offsets[e, 1])]

    def bm25_blocks(self, text: str, n: int, *, title: bool = True) -> list[tuple[int, int]]:
        """Global token ranges of the top ``n`` BM25 blocks for ``text`` with its mask
        blanked, titles matched too (fill_mask's default ``bm25_title``)."""
        hits = self.db.search(MASK_RE.sub(" ", text), limit=n, version=self.version,
                              title=title)
        out = []
        for h in hits:
            si = self.doc_seg[h["doc_id"]]
            out.append(self.block_index[(si, int(h["block"]))])
        return out

    def block_prior(self, text: str, blocks: list[tuple[int, int]], weight: float
                    ) -> np.ndarray:
        """Per token, ``weight`` x the BM25 score on its text alone (no title) of the
        retrieved block holding it; 0 outside ``blocks`` (fill_mask's ``bm25_prior``)."""
        out = np.zeros(self.n_tokens)
        if not weight or not blocks:
            return out
        hits = self.db.search(MASK_RE.sub(" ", text), limit=len(self.block_index),
                              version=self.version)
        text_score = {self.block_index[(self.doc_seg[h["doc_id"]], int(h["block"]))]: h["score"]
                      for h in hits}
        for lo, hi in blocks:
            out[lo:hi] = weight * text_score.get((lo, hi), 0.0)
        return out

    def _mask(self, bit: int) -> np.ndarray:
        return ((self.flags & bit) != 0) & self.alive

    def _candidates(self, side_bits: int, sims: np.ndarray, *, retrieval: str, k: int,
                    blocks: list[tuple[int, int]]) -> tuple[set[int], float]:
        cands: set[int] = set()
        gap = float("inf")
        if retrieval in ("dense", "hybrid"):
            idx = np.flatnonzero(self._mask(side_bits))
            top, gap = _topk(idx, sims[idx], k)
            cands.update(int(i) for i in top)
        if retrieval in ("bm25", "hybrid"):
            for lo, hi in blocks:
                for t in range(lo, hi):
                    if self.flags[t] & side_bits:
                        cands.add(t)
        return cands, gap

    def _spans(self, starts: set[int], ends: set[int], max_len: int) -> set[tuple[int, int]]:
        spans: set[tuple[int, int]] = set()
        vs = (self.flags & VALID_START) != 0
        ve = (self.flags & VALID_END) != 0
        brk = (self.flags & BREAK) != 0
        for s in starts:
            if not vs[s]:
                continue
            hi = int(self.block_hi[s])
            for e in range(s, min(s + max_len, hi)):
                if brk[e]:
                    break
                if ve[e]:
                    spans.add((s, e))
        for e in ends:
            if not ve[e]:
                continue
            lo = int(self.block_lo[e])
            for s in range(e, max(e - max_len, lo - 1), -1):
                if brk[s]:
                    break
                if vs[s]:
                    spans.add((s, e))
        return spans

    # -- queries -------------------------------------------------------------------------

    def fill_mask(self, text: str, *, mode: str = "phrase", retrieval: str = "dense",
                  k: int = 1024, blocks: int = 3, max_len: int = 10, tau: float = 1.0,
                  alpha: float = 0.0, scoring: str = "npm", qv=None,
                  not_in_query: bool = True, no_query_words: bool = True,
                  not_subject_name: bool = True, whole_names: bool = True,
                  bm25_prior: float = 0.5) -> OracleResult:
        """All answers (not only the top few) of a masked query. ``scoring='raw'`` is
        DensePhrases' ``sim_s + sim_e`` instead of NPM's ``P_s + P_e``. ``not_in_query``
        drops answers whose words are a run of the query's words, ``no_query_words`` those
        holding any word of the query that is not a stopword, ``not_subject_name`` those
        found only in entry heads that name the query's subject, ``whole_names`` those found
        only inside a longer run of capitalised words (npmdb's defaults; an answer needs one
        occurrence that passes both).
        ``bm25_prior``: each candidate's similarity gains that times its BM25 block's
        text score before scoring (candidates are chosen by the plain similarity)."""
        qv = qv if qv is not None else self.encode(text, mode)
        blk = self.bm25_blocks(text, blocks) if retrieval in ("bm25", "hybrid") else []
        prior = self.block_prior(text, blk, bm25_prior)
        answers: dict[str, OracleAnswer] = {}

        def add(key_text: str, s: int, e: int, score: float) -> None:
            key = fold(key_text)
            a = answers.get(key)
            if a is None:
                a = answers[key] = OracleAnswer(key)
            a.score += score
            a.support += 1
            a.n_tokens.add(e - s + 1)
            d = self.docs[int(self.doc_of[s])]
            a.occurrences.append((d[0], int(self.offsets[s, 0]), int(self.offsets[e, 1]), score))

        if mode == "token":
            sims = self.sims(qv.token)
            cands, gap = self._candidates(VALID_START | VALID_END, sims, retrieval=retrieval,
                                          k=k, blocks=blk)
            toks = sorted(cands)
            if toks:
                p = _softmax(sims[toks] + prior[toks], tau)
                for t, pt in zip(toks, p):
                    add(self.surface(t, t), t, t, float(pt))
            res = OracleResult(answers, gap, len(toks), len(toks), len(toks))
        else:
            sims_s, sims_e = self.sims(qv.start), self.sims(qv.end)
            starts, gap_s = self._candidates(VALID_START, sims_s, retrieval=retrieval, k=k,
                                             blocks=blk)
            ends, gap_e = self._candidates(VALID_END, sims_e, retrieval=retrieval, k=k,
                                           blocks=blk)
            spans = sorted(self._spans(starts, ends, max_len))
            S = sorted({s for s, _ in spans})
            E = sorted({e for _, e in spans})
            if spans:
                zs, ze = sims_s[S] + prior[S], sims_e[E] + prior[E]
                if scoring == "raw":
                    ps, pe = dict(zip(S, zs)), dict(zip(E, ze))
                else:
                    ps, pe = dict(zip(S, _softmax(zs, tau))), dict(zip(E, _softmax(ze, tau)))
                for s, e in spans:
                    add(self.surface(s, e), s, e, float(ps[s] + pe[e]))
            res = OracleResult(answers, min(gap_s, gap_e), len(spans), len(S), len(E))
        if alpha:
            for a in answers.values():
                # n_tokens is ambiguous only if one folded text was tokenised two ways
                a.score *= float(min(a.n_tokens)) ** alpha
                a.ambiguous = len(a.n_tokens) > 1
        if not_in_query:
            grams = _query_grams(text)
            for key in [k for k in answers if " ".join(re.findall(r"\w+", k)) in grams]:
                del answers[key]
        if no_query_words:
            # the stopword list is data the engine and the oracle share (NLTK's)
            from npmdb.boundaries import STOPWORDS

            words = set(re.findall(r"\w+", MASK_RE.sub(" ", text).casefold())) - STOPWORDS
            for key in [k for k in answers if words & set(re.findall(r"\w+", k))]:
                del answers[key]
        if not_subject_name or whole_names:
            by_id = {d[0]: d for d in self.docs}
            heads: dict[str, int] = {}  # only the documents that answers were found in

            def proper(doc: str, start: int, end: int) -> bool:
                _, title, body = by_id[doc]
                if doc not in heads:
                    heads[doc] = _subject_head_end(title, body, text) if not_subject_name else 0
                return start >= heads[doc] and not (
                    whole_names and _inside_a_name(body, start, end))

            for key in [k for k, a in answers.items()
                        if not any(proper(doc, s, e) for doc, s, e, _ in a.occurrences)]:
                del answers[key]
        return res

    def classify(self, text: str, labels: dict[str, list[str]], *, mode: str = "phrase",
                 retrieval: str = "dense", k: int = 1024, blocks: int = 3, max_len: int = 10,
                 tau: float = 5.0, qv=None) -> "OracleLabels":
        """Per label: the log of sum of exp(sim_s/tau + sim_e/tau) (phrase mode) or of
        exp(sim/tau) (token mode) over the candidates whose folded text is one of its words
        (-inf when none is), and how many candidates matched."""
        qv = qv if qv is not None else self.encode(text, mode)
        blk = self.bm25_blocks(text, blocks) if retrieval in ("bm25", "hybrid") else []
        words = {lbl: {fold(w) for w in ws} for lbl, ws in labels.items()}
        logits: dict[str, list[float]] = {lbl: [] for lbl in labels}
        if mode == "token":
            sims = self.sims(qv.token)
            cands, gap = self._candidates(VALID_START | VALID_END, sims, retrieval=retrieval,
                                          k=k, blocks=blk)
            items = [(t, t, sims[t] / tau) for t in cands]
        else:
            sims_s, sims_e = self.sims(qv.start), self.sims(qv.end)
            starts, gap_s = self._candidates(VALID_START, sims_s, retrieval=retrieval, k=k,
                                             blocks=blk)
            ends, gap_e = self._candidates(VALID_END, sims_e, retrieval=retrieval, k=k,
                                           blocks=blk)
            gap = min(gap_s, gap_e)
            items = [(s, e, sims_s[s] / tau + sims_e[e] / tau)
                     for s, e in self._spans(starts, ends, max_len)]
        for s, e, z in items:
            key = fold(self.surface(s, e))
            for lbl, ws in words.items():
                if key in ws:
                    logits[lbl].append(float(z))
        return OracleLabels({lbl: _logsumexp(z) for lbl, z in logits.items()},
                            {lbl: len(z) for lbl, z in logits.items()}, gap)

    def cut_gap(self, text: str, *, mode: str, k: int, qv=None) -> float:
        """Smallest gap at the dense top-``k`` cut over the sides a query uses."""
        qv = qv if qv is not None else self.encode(text, mode)
        if mode == "token":
            vecs = [(VALID_START | VALID_END, qv.token)]
        else:
            vecs = [(VALID_START, qv.start), (VALID_END, qv.end)]
        gap = float("inf")
        for bit, q in vecs:
            idx = np.flatnonzero(self._mask(bit))
            gap = min(gap, _topk(idx, self.sims(q)[idx], k)[1])
        return gap

    def untied_k(self, text: str, *, mode: str, k: int, min_gap: float = 1e-4, qv=None
                 ) -> int:
        """The smallest ``k' >= k`` whose top-k' cut is not a (near-)tie on any side."""
        qv = qv if qv is not None else self.encode(text, mode)
        for kk in range(k, k + 200):
            if self.cut_gap(text, mode=mode, k=kk, qv=qv) > min_gap:
                return kk
        return k + 200


# -- comparing an engine Result with the oracle ------------------------------------------

SCORE_TOL = 1e-4   # |engine score - oracle score| allowed per answer
TIE_TOL = 1e-6     # answers whose oracle scores are this close to the cut are interchangeable


def compare(result, oracle: OracleResult, top: int, *, score_tol: float = SCORE_TOL,
            tie_tol: float = TIE_TOL) -> list[str]:
    """Problems found comparing an engine :class:`Result` with the oracle's answers
    (empty list: they agree). Ties at the ``top`` cut are not counted as disagreements."""
    problems: list[str] = []
    ranked = oracle.ranked()
    want_n = min(top, len(ranked))
    if len(result.answers) != want_n:
        problems.append(f"engine returned {len(result.answers)} answers, oracle has {want_n}")
    seen = set()
    prev = float("inf")
    for a in result.answers:
        key = fold(a.text)
        if key in seen:
            problems.append(f"answer {key!r} appears twice")
        seen.add(key)
        if a.score > prev + 1e-12:
            problems.append(f"answers not sorted by score at {key!r}")
        prev = a.score
        o = oracle.answers.get(key)
        if o is None:
            problems.append(f"engine answer {key!r} is not a candidate phrase in the oracle")
            continue
        if a.tokens not in o.n_tokens:
            problems.append(f"{key!r}: engine says {a.tokens} tokens, oracle {sorted(o.n_tokens)}")
        if abs(a.score - o.score) > score_tol and not o.ambiguous:
            problems.append(f"{key!r}: engine score {a.score:.6g} vs oracle {o.score:.6g}")
        if a.support != o.support:
            problems.append(f"{key!r}: engine support {a.support} vs oracle {o.support}")
    if want_n:
        cut = ranked[want_n - 1].score
        for o in ranked[:want_n]:
            if o.score > cut + tie_tol and o.key not in seen:
                problems.append(f"oracle answer {o.key!r} ({o.score:.6g}) missing from the "
                                "engine's top")
        for key in seen:
            o = oracle.answers.get(key)
            if o is not None and o.score < cut - tie_tol - score_tol:
                problems.append(f"engine answer {key!r} ({o.score:.6g}) is below the oracle's "
                                f"top-{want_n} cut ({cut:.6g})")
        # the best answer must agree unless the first two are tied
        if result.answers:
            best = ranked[0]
            tied = len(ranked) > 1 and ranked[1].score > best.score - tie_tol
            if not tied and fold(result.answers[0].text) != best.key:
                problems.append(f"top answer {fold(result.answers[0].text)!r} vs oracle "
                                f"{best.key!r}")
    return problems
