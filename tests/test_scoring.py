"""Span scores where a small tau underflows them: answers still rank by their exact scores.

The oracle computes NPM's span score ``P_s + P_e`` and an answer's sum in Python's
``decimal`` (an exponent range far below float64's), so it knows the order float64 loses.
"""

from __future__ import annotations

from decimal import Decimal, getcontext

import numpy as np
import pytest

from npmdb.query import scoring as S
from npmdb.query.answers import _make_groups, scores_from_sims
from npmdb.query.physical import Occurrences

getcontext().prec = 40


def _softmax_decimal(x: np.ndarray, tau: float) -> list[Decimal]:
    z = [Decimal(float(v)) / Decimal(tau) for v in x]
    top = max(z)
    e = [(v - top).exp() for v in z]
    total = sum(e)
    return [v / total for v in e]


def _exact_sums(s_ids, e_ids, sims_s, sims_e, keys, tau) -> dict:
    """Each answer's summed score; the softmaxes run over the starts and ends that some
    span uses, as NPM's do."""
    used_s, used_e = sorted(set(s_ids.tolist())), sorted(set(e_ids.tolist()))
    ps = dict(zip(used_s, _softmax_decimal(sims_s[used_s], tau)))
    pe = dict(zip(used_e, _softmax_decimal(sims_e[used_e], tau)))
    sums: dict = {}
    for i, k in enumerate(keys):
        sums[k] = sums.get(k, Decimal(0)) + ps[s_ids[i]] + pe[e_ids[i]]
    return sums


def test_log_softmax_and_span_log_scores_agree_where_nothing_underflows():
    rng = np.random.default_rng(0)
    sims_s, sims_e = rng.normal(size=30), rng.normal(size=20)
    s_ids, e_ids = rng.integers(0, 30, 200), rng.integers(0, 20, 200)
    np.testing.assert_allclose(np.exp(S.log_softmax(sims_s, 0.7)), S.softmax(sims_s, 0.7))
    score, _, _ = S.span_scores(s_ids, e_ids, sims_s, sims_e, tau=0.7)
    np.testing.assert_allclose(np.exp(S.span_log_scores(s_ids, e_ids, sims_s, sims_e, tau=0.7)),
                               score)
    gid = rng.integers(0, 12, 200)
    np.testing.assert_allclose(np.exp(S.group_log_sums(gid, 13, np.log(score))),
                               np.bincount(gid, weights=score, minlength=13))
    assert S.group_log_sums(gid, 13, np.log(score))[12] == -np.inf  # a group with no member


def test_rank_order_is_lexsort_above_tiny_and_by_logs_below():
    values = np.array([0.5, 0.0, 0.5, 0.0, 1e-300, 0.25])
    logs = np.array([np.log(0.5), -900.0, np.log(0.5), -800.0, -690.7, np.log(0.25)])
    assert S.rank_order(values).tolist() == [0, 2, 5, 4, 1, 3]       # ties: first seen
    assert S.rank_order(values, logs).tolist() == [0, 2, 5, 4, 3, 1]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("top_n", [0, 20])
def test_underflowed_answers_rank_as_exact_arithmetic_ranks_them(seed, top_n):
    rng = np.random.default_rng(seed)
    n_s, n_e, n = 150, 150, 300
    sims_s, sims_e = rng.normal(size=n_s) * 3, rng.normal(size=n_e) * 3
    s = np.sort(rng.choice(10_000, n_s, replace=False))
    e = np.sort(rng.choice(10_000, n_e, replace=False))
    s_ids, e_ids = rng.integers(0, n_s, n), rng.integers(0, n_e, n)
    keys = [f"a{k}" for k in rng.integers(0, 60, n)]
    tau = 1e-3
    occ = Occurrences(np.zeros(n, np.int64), s[s_ids], e[e_ids],
                      sim_s=sims_s[s_ids], sim_e=sims_e[e_ids])
    score, logs, _, _ = scores_from_sims(occ, tau, "npm")
    assert logs is not None and (score == 0.0).sum() > n // 2      # float64 lost most scores
    groups = _make_groups(keys, lambda idx: [keys[i] for i in idx], score,
                          np.ones(n, np.int64), top_n=top_n, logs=logs)
    # rank them as OrderBy does (top_n: the best top_n come back in first-seen order)
    ranked = S.rank_order(np.array([g.score for g in groups]),
                          np.array([g.log_score for g in groups]))
    groups = [groups[i] for i in ranked.tolist()]
    # above TINY, float64's order (its ties: first seen); below, the exact one
    head = [g for g in groups if g.score >= S.TINY]
    assert groups[: len(head)] == head and len(head) < len(groups)
    assert all(a.score >= b.score for a, b in zip(head, head[1:]))
    # each answer at least as good as the next, up to float64's rounding of the logs
    exact = _exact_sums(s_ids, e_ids, sims_s, sims_e, keys, tau)
    logs_of = [float(exact[g.key].ln()) for g in groups[len(head):]]
    assert all(a >= b - 1e-12 * abs(b) for a, b in zip(logs_of, logs_of[1:]))
    if top_n:  # and no answer left out was better than the worst one kept
        worst = logs_of[-1]
        left_out = set(keys) - {g.key for g in groups}
        assert all(float(exact[k].ln()) <= worst + 1e-12 * abs(worst) for k in left_out)
    else:
        assert logs_of[0] - logs_of[-1] > 100  # the tail spans many orders of magnitude


@pytest.mark.parametrize("retrieval", ["bm25", "dense"])
def test_evidence_rows_rank_underflowed_occurrences_as_fill_mask_does(tiny_db, retrieval):
    q = "capitalization is the sale of [MASK] stock."
    want = tiny_db.fill_mask(q, retrieval=retrieval, tau=1e-3, group_by="document", top=5,
                             evidence=4)
    rows = tiny_db.sql(f"SELECT phrase, doc_id, start, end FROM EVIDENCE(?) USING {retrieval} "
                       "WITH tau = 0.001, evidence = 4 GROUP BY document LIMIT 20", [q]).rows
    got = [(r[1], r[2], r[3]) for r in rows]
    wanted = [(e.doc_id, e.start, e.end) for a in want.answers for e in a.evidence]
    assert got[:len(wanted)] == wanted   # LIMIT counts rows: later answers may follow
    assert sum(e.score == 0.0 for a in want.answers for e in a.evidence) >= 2


def test_labels_whose_scores_overflow_rank_by_their_logs():
    """A label's score is ``sum(exp(logit))``; a small tau overflows it to inf for every
    label, which used to leave the first label listed on top."""
    from npmdb.query.tail import OrderBy, _sort_value
    from npmdb.query.physical import Group

    groups = [Group("a", "a", float("inf"), log_score=800.0),
              Group("b", "b", float("inf"), log_score=900.0),
              Group("c", "c", 3.0, log_score=np.log(3.0)), Group("d", "d", 0.0)]
    assert OrderBy.keys == (("score", True),)
    ranked = sorted(groups, key=lambda g: _sort_value(g, "score"), reverse=True)
    assert [g.text for g in ranked] == ["b", "a", "c", "d"]
    values = np.array([g.score for g in groups])
    logs = np.array([g.log_score if g.log_score is not None else -np.inf for g in groups])
    assert S.rank_order(values, logs).tolist() == [1, 0, 2, 3]


def test_label_probabilities_from_logs_where_scores_overflowed(tiny_db):
    from npmdb.query.calibration import probabilities

    p = probabilities({"a": float("inf"), "b": float("inf"), "c": 0.0},
                      logs={"a": 800.0, "b": 801.0, "c": -np.inf}, eps=0.0)
    assert p["b"] == pytest.approx(np.e / (1 + np.e)) and p["c"] == 0.0
    same = {"a": 2.0, "b": 6.0}
    assert probabilities(same, logs={k: np.log(v) for k, v in same.items()}) == \
        pytest.approx(probabilities(same))
    labels = {"yes": ["the", "a"], "no": ["of", "in"]}
    q = "Some words here. It was [MASK]."
    plain = tiny_db.classify(q, labels, tau=1e-3)
    assert all(np.isinf(a.score) for a in plain.answers)       # the case in question
    logs = plain.info["label_log_scores"]
    assert [a.text for a in plain.answers] == sorted(logs, key=logs.get, reverse=True)
    cal = tiny_db.classify(q, labels, tau=1e-3, calibrate=True)
    assert all(np.isfinite(a.score) for a in cal.answers)
    assert sum(a.score for a in cal.answers) == pytest.approx(1.0)


def test_scores_keep_no_logs_where_nothing_underflows():
    occ = Occurrences(np.zeros(3, np.int64), np.array([0, 1, 2]), np.array([1, 2, 3]),
                      sim_s=np.array([0.1, 0.2, 0.3]), sim_e=np.array([0.3, 0.2, 0.1]))
    score, logs, _, _ = scores_from_sims(occ, 1.0, "npm")
    assert logs is None and (score > 0).all()


def test_fill_mask_at_a_tiny_tau_ranks_the_same_on_every_path(tiny_db):
    """The top-n fast path, the full aggregation and SQL's ORDER BY agree on the order of
    answers whose scores underflowed to 0.0."""
    q = "The capital of France is [MASK]."
    every = tiny_db.fill_mask(q, retrieval="dense", tau=1e-3, top=0).to_list()
    assert sum(a["score"] == 0.0 for a in every) >= 10
    top = tiny_db.fill_mask(q, retrieval="dense", tau=1e-3, top=12).to_list()
    assert [a["text"] for a in top] == [a["text"] for a in every[:12]]
    rows = tiny_db.sql("SELECT phrase FROM MASKED(?) USING dense WITH tau = 0.001 "
                       "ORDER BY score DESC LIMIT 12", [q]).to_list()
    assert [r["phrase"] for r in rows] == [a["text"] for a in top]
