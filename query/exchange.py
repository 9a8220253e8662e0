"""A plan over shards: the coordinator's :class:`Exchange` operator and the shards' work.

A sharded database (``npmdb.open(path, readonly=True, engine="ray", shards=N)``) spreads
the segments of the version a query reads over N shards (:mod:`npmdb.shards`). The plan is
the one a single process runs; :func:`distribute` puts an :class:`Exchange` above each
scorer (``ScoreSpans`` / ``ScoreTokens``) and above a bare ``BM25Blocks`` (SEARCH). The
exchange runs its subtree on the shards in three steps and merges exactly what one
process would have computed:

1. ``term_stats`` (BM25 only, several segments): each shard's block count, field lengths
   and document frequencies; the coordinator sums them into the statistics one process
   uses (global IDFs and average lengths: the scores of one index over every block).
2. ``retrieve``: each shard searches its segments (ANN, exact scan, BM25). Dense searches
   over compressed codes also return the shard's best ``refine * k`` approximate
   candidates with their exact re-scores: the global best ``refine * k`` all lie in the
   shards' own best, so the coordinator picks them and their exact scores with no second
   round. The coordinator merges the global top ``k`` (and top blocks) per operator.
3. ``spans``: each shard gets the global candidates of its segments, assembles spans (or
   takes the tokens), computes their exact similarities and each occurrence's grouping
   key (its folded text, found in the shard's documents). The coordinator orders the
   occurrences as one process does (by segment), takes the softmax over all shards'
   unique starts and ends (the global normalisers), and hands the occurrences up.

Everything above the exchange (grouping by surface text, filters, order, limit) runs on
the coordinator; evidence and surface texts are asked, per occurrence, of the shard that
owns its segment (:class:`ShardSurfaces`).

A shard set is anything with ``n``, ``engine`` and ``map(method, requests)`` (one request
per shard that has segments; the results in the same order), and the shard side is
:class:`ShardWork` over a snapshot restricted to the shard's segments.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np

from npmdb.storage.bm25 import FieldStats, field_stats

from . import scoring as S
from .answers import (
    Aggregate, Located, ScoreSpans, ScoreTokens, Surfaces, block_prior, locate_in,
    scores_from_sims, span_sims, token_sims, widen_to_words,
)
from .operators import (
    BM25Blocks, DenseTopK, EncodeQuery, ExactTopK, _merge_topk, _split_found, _top_candidates,
)
from .physical import (
    BlockHits, Candidates, ExecState, Occurrences, Operator, QueryVectors, _empty, _fmt,
)
from .plan import Plan, StageStat
from .rows import BlockRows, block_rows

__all__ = ["Exchange", "ShardSet", "ShardWork", "ShardSurfaces", "distribute", "assign",
           "subtree"]

RETRIEVAL = (DenseTopK, ExactTopK, BM25Blocks)
SCORERS = (ScoreSpans, ScoreTokens)


class ShardSet(Protocol):
    n: int
    engine: str

    def map(self, method: str, requests: list[tuple[int, dict]]) -> list[Any]:
        """``method`` on shard ``i`` with ``request`` for each ``(i, request)``; results in
        order. Raises :class:`~npmdb.errors.OperationalError` when a shard cannot answer."""
        ...


def subtree(root: Operator) -> list[Operator]:
    """``root``'s operators, each once (a shared child, such as hybrid's one EncodeQuery,
    at its first place), in depth-first pre-order: the order by which the coordinator and
    the shards, each with its own copy of the subtree, name an operator."""
    out: list[Operator] = []
    seen: set[int] = set()

    def walk(op: Operator) -> None:
        if id(op) in seen:
            return
        seen.add(id(op))
        out.append(op)
        for c in op.children:
            walk(c)
    walk(root)
    return out


def assign(snap: Any, n: int) -> list[list[int]]:
    """The version's segments (indexes into ``snap.segments``) dealt to ``n`` shards,
    largest first to the least loaded (by tokens); each shard's list in segment order."""
    load = [0] * n
    owned: list[list[int]] = [[] for _ in range(n)]
    sizes = [int(seg.record.tokens) for seg in snap.segments]
    for si in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        j = min(range(n), key=lambda x: (load[x], x))
        owned[j].append(si)
        load[j] += sizes[si]
    return [sorted(o) for o in owned]


# -- the plan rewrite ------------------------------------------------------------------------


def distribute(plan: Plan, shards: ShardSet) -> Plan:
    """``plan`` with an :class:`Exchange` over each scorer and each bare BM25 search."""

    def rewrite(op: Operator, parent: Operator | None) -> Operator:
        if isinstance(op, SCORERS):
            group_by = parent.group_by if isinstance(parent, Aggregate) else "phrase"
            return Exchange(shards, group_by, children=(op,))
        if isinstance(op, BM25Blocks) and isinstance(parent, BlockRows):
            return Exchange(shards, children=(op,))
        kids = tuple(rewrite(c, op) for c in op.children)
        return op if kids == op.children and all(a is b for a, b in zip(kids, op.children)) \
            else replace(op, children=kids)

    return Plan(rewrite(plan.root, None), kind=plan.kind, query=plan.query)


# -- the coordinator -------------------------------------------------------------------------


def _by_segment(parts: list[list[tuple]]) -> list[tuple]:
    """Per-shard lists of ``(segment, ...)`` entries merged into segment order (each
    shard's own order kept within a segment, as one process lists them)."""
    flat = [x for part in parts for x in part]
    return sorted(flat, key=lambda x: x[0])  # stable


def _exact_of(cands: list[tuple[int, np.ndarray, Any]], rescored: dict[int, tuple]) -> list:
    """The exact scores the shards computed for the chosen approximate candidates."""
    out = []
    for si, pos, _ in cands:
        have_pos, have_sc = rescored[si]
        order = np.argsort(have_pos, kind="stable")
        at = order[np.searchsorted(have_pos[order], pos)]
        out.append((si, pos, have_sc[at]))
    return out


@dataclass(frozen=True)
class Exchange(Operator):
    """Runs its subtree on the shards and merges what they found (see the module)."""

    shards: Any = field(compare=False, repr=False)
    group_by: str = "phrase"   # the grouping above (the shards compute its keys)
    children: tuple = ()
    remote = True              # the executor leaves the subtree to this operator

    def detail(self) -> str:
        return _fmt(shards=self.shards.n, engine=self.shards.engine)

    def run(self, st: ExecState) -> Any:
        snap = st.snapshot
        sub = self.children[0]
        ops = subtree(sub)
        owned = assign(snap, self.shards.n)
        todo = [i for i, segs in enumerate(owned) if segs]
        ctx = _Request(snap.manifest.id, snap.doc_filter, st.text)
        times: dict[int, list[float]] = {}
        counts: dict[int, int] = {}

        def ask(method: str, per_shard: dict[int, dict]) -> list[Any]:
            res = self.shards.map(method, [(i, {**ctx.payload(owned[i]), **per_shard.get(i, {})})
                                           for i in todo])
            for r in res:
                for j, ms in r.get("ms", {}).items():
                    times.setdefault(j, []).append(ms)
            return res

        qv = {}
        for j, op in enumerate(ops):  # the query is encoded once, here
            if isinstance(op, EncodeQuery):
                t = time.perf_counter()
                qv[j] = op.run(st)
                st.remote.append((op, StageStat(op.name, op.detail(), int(qv[j].count),
                                                (time.perf_counter() - t) * 1000.0, 0)))
        t0 = time.perf_counter()
        stats = None
        bm25 = next((op for op in ops if isinstance(op, BM25Blocks)), None)
        if bm25 is not None and len(snap.segments) > 1:
            stats = self._stats(bm25, ask("term_stats", {i: {"subtree": sub} for i in todo}))
        found = ask("retrieve", {i: {"subtree": sub, "qv": qv, "stats": stats} for i in todo})
        outputs = self._merge_retrieval(st, ops, qv, found)
        for j, out in outputs.items():
            counts[j] = int(out.count)
        if isinstance(sub, BM25Blocks):  # SEARCH: the blocks; their rows from the shards
            out = replace(outputs[0], rows_of=_BlockRowsOf(self.shards, ctx, owned))
        else:
            per_shard = {i: {"subtree": sub, "qv": qv, "group_by": self.group_by,
                             "outputs": _restrict(outputs, owned[i])} for i in todo}
            out = self._merge_spans(st, sub, ask("spans", per_shard), qv, ctx, owned)
            counts[0] = int(out.count)
        self._record(st, ops, times, counts)
        st.info["shards"] = {"n": self.shards.n, "engine": self.shards.engine,
                             "segments": [len(o) for o in owned],
                             "ms": round((time.perf_counter() - t0) * 1000.0, 3)}
        return out

    # merges ---------------------------------------------------------------------------

    @staticmethod
    def _stats(op: BM25Blocks, parts: list[dict]) -> dict[str, FieldStats]:
        """Each field's statistics over every shard (summed, as
        :func:`~npmdb.storage.bm25.field_stats` sums segments')."""
        return {f: sum((r["stats"][f] for r in parts[1:]), parts[0]["stats"][f])
                for f in op.fields}

    def _merge_retrieval(self, st: ExecState, ops: list[Operator], qv: dict,
                         found: list[dict]) -> dict[int, Any]:
        outputs: dict[int, Any] = {}
        for j, op in enumerate(ops):
            parts = [r["found"][j] for r in found if j in r["found"]]
            if isinstance(op, BM25Blocks):
                outputs[j] = op.best([h for p in parts for h in p["hits"]])
            elif isinstance(op, (DenseTopK, ExactTopK)):
                q = _query_of(ops, qv, op)
                exact = _by_segment([p["exact"] for p in parts])
                approx = _by_segment([p.get("approx", []) for p in parts])
                if approx:
                    # a shard whose segments are all exact (a small first IVF add) has
                    # no approximate hits: it sends no refine factor and no re-scores
                    refine = max(p.get("refine", 0) for p in parts)
                    rescored = {si: (pos, sc) for p in parts
                                for si, pos, sc in p.get("rescored", ())}
                    exact += _exact_of(_top_candidates(approx, op.k * refine), rescored)
                merged = _merge_topk(op.side, exact, op.k, q)
                if isinstance(op, DenseTopK):
                    kinds = sorted({k for p in parts for k in p["kinds"]})
                    merged = replace(merged, index=", ".join(kinds))
                outputs[j] = merged
        return outputs

    def _merge_spans(self, st: ExecState, sub: Operator, parts: list[dict], qv: dict,
                     ctx: "_Request", owned: list[list[int]]) -> Occurrences:
        seg = np.concatenate([p["seg"] for p in parts]) if parts else _empty(np.int64)
        order = np.argsort(seg, kind="stable")  # segment order, as one process has them
        cat = {name: np.concatenate([p[name] for p in parts])[order] if parts else
               _empty(np.int64 if name in ("seg", "s", "e", "docs") else np.float64)
               for name in ("seg", "s", "e", "sim_s", "sim_e", "docs")}
        keys_all = [k for p in parts for k in p["keys"]]
        keys = [keys_all[i] for i in order.tolist()]
        prior = np.concatenate([p.get("prior", np.zeros(len(p["s"]))) for p in parts]
                               )[order] if sub.prior and parts else None
        q = next(iter(qv.values())).vectors if qv else None
        occ = Occurrences(cat["seg"], cat["s"], cat["e"], q, sim_s=cat["sim_s"],
                          sim_e=cat["sim_e"])
        if isinstance(sub, ScoreSpans):
            score, logs, n_s, n_e = scores_from_sims(occ, sub.tau, sub.scoring, prior)
            st.info["unique_starts"], st.info["unique_ends"] = n_s, n_e
        else:
            assert isinstance(sub, ScoreTokens)
            score, logs = S.softmax_and_logs(occ.sim_s if prior is None else occ.sim_s + prior,
                                             sub.tau)
        surfaces = ShardSurfaces(self.shards, ctx, owned, occ.seg, occ.s, occ.e, keys,
                                 cat["docs"], widened=self.group_by == "word")
        return replace(occ, score=score, log_score=logs, surfaces=surfaces)

    def _record(self, st: ExecState, ops: list[Operator], times: dict[int, list[float]],
                counts: dict[int, int]) -> None:
        """EXPLAIN ANALYZE of the subtree: per operator the merged rows and the slowest
        shard's time, with every shard's time in its detail."""
        for j, op in enumerate(ops):
            ms = times.get(j)
            if ms is None and j not in counts:
                continue
            detail = op.detail()
            if ms:
                detail += (", " if detail else "") + "shard ms: " + " / ".join(
                    f"{m:.2f}" for m in ms)
            st.remote.append((op, StageStat(op.name, detail, counts.get(j, 0),
                                            max(ms) if ms else 0.0, 0)))


def _query_of(ops: list[Operator], qv: dict, op: Operator) -> Any:
    for c in op.children:
        if isinstance(c, EncodeQuery):
            return qv[ops.index(c)]
    raise RuntimeError(f"{op.name} has no EncodeQuery child")


def _restrict(outputs: dict[int, Any], segs: list[int]) -> dict[int, Any]:
    """The merged retrieval outputs of a shard's segments (global segment numbers)."""
    mine = set(segs)
    out: dict[int, Any] = {}
    for j, o in outputs.items():
        if isinstance(o, BlockHits):
            out[j] = BlockHits(tuple(h for h in o.hits if h[0] in mine))
        else:
            by_side = {side: {si: p for si, p in d.items() if si in mine}
                       for side, d in o.by_side.items()}
            out[j] = Candidates(by_side, 0)
    return out


@dataclass(frozen=True)
class _Request:
    """What every request to a shard names: the version (by id: the shards read the
    coordinator's version even while HEAD moves), the document filter and the query."""

    version: int
    doc_filter: Any
    text: str

    def payload(self, segs: list[int]) -> dict:
        return {"version": self.version, "doc_filter": self.doc_filter, "text": self.text,
                "segments": segs}


def _owner(owned: list[list[int]]) -> dict[int, int]:
    return {si: i for i, segs in enumerate(owned) for si in segs}


class ShardSurfaces:
    """The surface texts of occurrences gathered from shards: the grouping keys came with
    them; texts, documents and evidence are asked of the shard owning each segment."""

    def __init__(self, shards: ShardSet, ctx: _Request, owned: list[list[int]],
                 seg: np.ndarray, s: np.ndarray, e: np.ndarray, keys: list, docs: np.ndarray,
                 *, widened: bool = False) -> None:
        self.shards, self.ctx, self.owned = shards, ctx, owned
        self.seg, self.s, self.e, self._keys, self.docs = seg, s, e, keys, docs
        self.widened = widened  # token occurrences already widened to words (group_by word)

    def keys(self) -> list:
        return self._keys

    def group_keys(self, group_by: str) -> list:
        return self._keys

    def texts(self, idx: list[int]) -> list[str]:
        return self._ask("texts", idx)

    def text(self, i: int) -> str:
        return self.texts([i])[0]

    def doc_id(self, si: int, local: int) -> str:
        return _scatter(self.shards, self.ctx, self.owned, "doc_ids", [(si, local)])[0]

    def locate(self, idx: list[int]) -> list[Located]:
        return self._ask("locate", idx)

    def _ask(self, method: str, idx: list[int]) -> list:
        """``method`` ('locate' | 'texts') of occurrences ``idx``, each asked of the shard
        that owns its segment; the answers in ``idx`` order."""
        items = [(int(self.seg[i]), int(self.s[i]), int(self.e[i])) for i in idx]
        return _scatter(self.shards, self.ctx, self.owned, method, items)


def _scatter(shards: ShardSet, ctx: _Request, owned: list[list[int]], method: str,
             items: list[tuple]) -> list:
    """``method`` of ``items`` (each starting with its segment), each asked of the shard
    that owns its segment; the answers in ``items`` order."""
    owner = _owner(owned)
    by_shard: dict[int, list[int]] = {}
    for n, item in enumerate(items):
        by_shard.setdefault(owner[item[0]], []).append(n)
    out: list[Any] = [None] * len(items)
    asks = sorted(by_shard)
    found = shards.map(method, [
        (i, {**ctx.payload(owned[i]), "items": [items[n] for n in by_shard[i]]})
        for i in asks]) if asks else []
    for i, got in zip(asks, found):
        for n, x in zip(by_shard[i], got):
            out[n] = x
    return out


@dataclass(frozen=True)
class _BlockRowsOf:
    """SEARCH rows of merged BM25 hits, from the shards that own the blocks."""

    shards: Any
    ctx: _Request
    owned: list

    def __call__(self, hits: Any) -> list[dict]:
        return _scatter(self.shards, self.ctx, self.owned, "block_rows", list(hits))


# -- the shard side ----------------------------------------------------------------------------


class ShardWork:
    """One request's work on a shard: ``snap`` is the version restricted to the shard's
    segments, ``segs`` their numbers in the whole version (local ``i`` is ``segs[i]``)."""

    def __init__(self, snap: Any, segs: list[int], text: str) -> None:
        self.snap, self.segs, self.text = snap, list(segs), text
        self.local = {g: i for i, g in enumerate(self.segs)}

    def _g(self, found: list[tuple]) -> list[tuple]:
        """Entries ``(local segment, ...)`` renamed to the version's segment numbers."""
        return [(self.segs[x[0]], *x[1:]) for x in found]

    def _state(self, ops: list[Operator], qv: dict) -> ExecState:
        st = ExecState(self.snap, self.text)
        for j, v in qv.items():
            st.outputs[id(ops[j])] = v
        return st

    def term_stats(self, sub: Operator) -> dict:
        """Each field's :class:`~npmdb.storage.bm25.FieldStats` over this shard's
        segments (the coordinator sums them)."""
        op = next(o for o in subtree(sub) if isinstance(o, BM25Blocks))
        bm25 = [seg.bm25() for seg in self.snap.segments]
        return {"stats": {f: field_stats(bm25, op.terms(self.text), f) for f in op.fields}}

    def retrieve(self, sub: Operator, qv: dict, stats: dict | None) -> dict:
        ops = subtree(sub)
        st = self._state(ops, qv)
        found: dict[int, dict] = {}
        ms: dict[int, float] = {}
        for j, op in enumerate(ops):
            if not isinstance(op, RETRIEVAL):
                continue
            t0 = time.perf_counter()
            if isinstance(op, BM25Blocks):
                found[j] = {"hits": self._g(op.search(st, op.terms(self.text), stats))}
            elif isinstance(op, ExactTopK):
                q = st.input(op, QueryVectors).side(op.side)
                found[j] = {"exact": self._g(op.search(st, q))}
            else:
                assert isinstance(op, DenseTopK)
                q = st.input(op, QueryVectors).side(op.side)
                exact, approx, refine = _split_found(op.search(st, q))
                part: dict[str, Any] = {"exact": self._g(exact), "kinds": op.kinds(st)}
                if approx:  # this shard's best refine * k, with their exact scores
                    top = _top_candidates(approx, op.k * refine)
                    part.update(approx=self._g(top), refine=refine,
                                rescored=self._g(op._rescore(st, q, top)))
                found[j] = part
            ms[j] = (time.perf_counter() - t0) * 1000.0
        return {"found": found, "ms": ms}

    def spans(self, sub: Operator, qv: dict, outputs: dict[int, Any], group_by: str) -> dict:
        ops = subtree(sub)
        st = self._state(ops, qv)
        for j, out in outputs.items():  # the global candidates of this shard's segments
            if isinstance(out, BlockHits):
                st.outputs[id(ops[j])] = BlockHits(tuple((self.local[h[0]], *h[1:])
                                                         for h in out.hits))
            else:
                by_side = {side: {self.local[si]: p for si, p in d.items()}
                           for side, d in out.by_side.items()}
                q = _query_of(ops, qv, ops[j])
                st.outputs[id(ops[j])] = Candidates(by_side, 0, q.vectors)
        ms: dict[int, float] = {}
        done = set(outputs) | set(qv)

        def run(op: Operator) -> None:  # children first, as the executor does
            j = ops.index(op)
            if j in done or op is sub:
                return
            for c in op.children:
                run(c)
            t0 = time.perf_counter()
            st.outputs[id(op)] = op.run(st)
            ms[j] = (time.perf_counter() - t0) * 1000.0
            done.add(j)

        for c in sub.children:
            run(c)
        t0 = time.perf_counter()
        if isinstance(sub, ScoreSpans):
            occ, _ = span_sims(self.snap, st.input(sub, Occurrences))
        else:
            occ = token_sims(self.snap, st.inputs(sub, Candidates))
        # the block prior before widening: an occurrence's block is where it was found
        prior = sub.prior * block_prior(st, sub, occ.seg, occ.s) if sub.prior else None
        if group_by == "word":
            occ = widen_to_words(self.snap, occ)
        sf = Surfaces(self.snap, occ.seg, occ.s, occ.e)
        keys = sf.group_keys(group_by)
        if group_by == "document":
            keys = [(self.segs[si], d) for si, d in keys]
        ms[0] = (time.perf_counter() - t0) * 1000.0
        seg = np.asarray(self.segs, np.int64)[occ.seg] if len(occ.seg) else occ.seg
        return {"seg": seg, "s": occ.s, "e": occ.e, "sim_s": np.asarray(occ.sim_s, np.float64),
                "sim_e": np.asarray(occ.sim_e if len(occ.sim_e) else np.zeros(len(occ.s)),
                                    np.float64),
                "docs": np.asarray(sf.docs, np.int64), "keys": keys, "ms": ms,
                **({"prior": prior} if prior is not None else {})}

    def locate(self, items: list[tuple[int, int, int]]) -> list[Located]:
        return locate_in(self.snap, [(self.local[si], s, e) for si, s, e in items])

    def texts(self, items: list[tuple[int, int, int]]) -> list[str]:
        """The surface texts of ``(segment, first, last)`` occurrences (each document read
        once)."""
        if not items:
            return []
        seg, s, e = (np.asarray(c, np.int64) for c in zip(*items))
        local = np.asarray([self.local[int(si)] for si in seg], np.int64)
        return Surfaces(self.snap, local, s, e).texts(list(range(len(items))))

    def doc_ids(self, docs: list[tuple[int, int]]) -> list[str]:
        return [self.snap.doc(self.local[si], local).id for si, local in docs]

    def block_rows(self, hits: list[tuple[int, int, float]]) -> list[dict]:
        return block_rows(self.snap, [(self.local[si], b, sc) for si, b, sc, *_ in hits])
