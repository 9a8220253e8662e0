"""The one query runner: ``execute(plan, ctx) -> Result``.

``fill_mask``, ``classify``, ``search`` and every SQL statement end here: the facade opens
an :class:`~npmdb.query.context.ExecContext` for one version, the planner (or the SQL
compiler) builds a :class:`~npmdb.query.plan.Plan`, and :func:`execute` runs it over the
context's snapshot and wraps what it produced as a :class:`~npmdb.query.result.Result`.

Running a plan: children first; sibling operators marked ``concurrent`` (the start and end
ANN searches) run side by side after a serial ``prepare`` that does their reads through
the snapshot's LMDB transaction (one thread at a time may use it). Every operator returns
a typed output (:class:`~npmdb.query.physical.Output`), kept per operator for its parent
(``state.inputs``).
Stages are recorded in serial order, with rows and milliseconds; a failure that is not an
:class:`~npmdb.errors.Error` reads "operator 'x' failed".
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

from npmdb.errors import Error, InternalError, ProgrammingError

from .context import ExecContext
from .physical import ExecState, Operator, Projection
from .plan import Plan, StageStat
from .result import Answer, Result

__all__ = ["execute", "run_plan"]

_BRANCHES: ThreadPoolExecutor | None = None  # concurrent sibling operators (not the
_BRANCHES_LOCK = threading.Lock()            # per-segment pool: no nested waits on one pool)


def _reset_after_fork() -> None:
    """A forked child has none of the parent's threads: its pool would take tasks that no
    thread runs (a query hung for ever). The child starts a pool of its own."""
    global _BRANCHES, _BRANCHES_LOCK
    _BRANCHES, _BRANCHES_LOCK = None, threading.Lock()


os.register_at_fork(after_in_child=_reset_after_fork)

_ANSWER_KINDS = ("masked", "classify")


def _branches() -> ThreadPoolExecutor:
    global _BRANCHES
    with _BRANCHES_LOCK:
        if _BRANCHES is None:
            _BRANCHES = ThreadPoolExecutor(4, thread_name_prefix="npmdb-branch")
    return _BRANCHES


def execute(plan: Plan, ctx: ExecContext) -> Result:
    """Run ``plan`` over ``ctx``'s snapshot: answers (fill_mask, classify) and, where the
    plan ends in a projection, its columns and rows."""
    snap = ctx.require()
    if ctx.shards is not None:
        from .exchange import distribute

        plan = distribute(plan, ctx.shards)
    if plan.kind in _ANSWER_KINDS and (not snap.segments or
                                       snap.manifest.stats.get("docs", 0) == 0):
        raise ProgrammingError("the database has no documents at this version: "
                               "add some with db.add(...)")
    state = run_plan(plan, ExecState(snap, plan.query, encode=ctx.encode))
    answers = tuple(Answer(g.text, float(g.score), g.support, tuple(g.evidence), g.n_tokens)
                    for g in state.groups)
    out = state.outputs.get(id(plan.root))
    columns, rows = (out.columns, out.rows) if isinstance(out, Projection) else (None, None)
    return Result(answers, query=plan.query, version=snap.manifest.id,
                  generation=snap.generation, stats=tuple(plan.stats),
                  plan=plan.explain(analyze=True), info=dict(state.info), columns=columns,
                  rows=rows)


def _timed(op: Operator, state: ExecState, depth: int) -> tuple[Operator, StageStat, Any]:
    t0 = time.perf_counter()
    try:
        out = op.run(state)
    except Error:
        raise
    except Exception as exc:  # noqa: BLE001 - wrap as the executor does in sqlglot
        raise InternalError(f"operator {op.name!r} failed: {type(exc).__name__}: {exc}"
                            ) from exc
    ms = (time.perf_counter() - t0) * 1000.0
    return op, StageStat(op.name, op.analyzed(out), int(out.count), ms, depth), out


def run_plan(plan: Plan, state: ExecState) -> ExecState:
    """Run every operator of ``plan`` over ``state``; records the stages on the plan."""
    measured: list[tuple[Operator, StageStat]] = []
    done: set[int] = set()

    def keep(result: tuple[Operator, StageStat, Any]) -> None:
        op, stat, out = result
        state.outputs[id(op)] = out
        measured.append((op, stat))

    def visit(op: Operator, depth: int) -> None:
        if id(op) in done:  # a shared child (hybrid: one EncodeQuery) runs once
            return
        done.add(id(op))
        if op.remote:  # an exchange: its subtree runs on the shards
            keep(_timed(op, state, depth))
            return
        together = [c for c in op.children if c.concurrent and id(c) not in done]
        if len(together) < 2:
            together = []
        side_by_side = {id(c) for c in together}
        for child in op.children:
            if id(child) in side_by_side:  # their inputs now; they run below, side by side
                for grandchild in child.children:
                    visit(grandchild, depth + 2)
            else:
                visit(child, depth + 1)
        if together:
            for child in together:
                done.add(id(child))
                child.prepare(state)  # serial: the snapshot's transaction
            futures = [_branches().submit(_timed, c, state, depth + 1) for c in together[1:]]
            try:
                keep(_timed(together[0], state, depth + 1))
            finally:  # a sibling still running after a failure would read a closed snapshot
                wait(futures)
            for f in futures:
                keep(f.result())
        keep(_timed(op, state, depth))

    state.root = plan.root
    visit(plan.root, 0)
    measured += state.remote
    # stages in the order a serial run records them (children first, left to right)
    rank: dict[int, int] = {}

    def post(op: Operator) -> None:
        if id(op) not in rank:
            for child in op.children:
                post(child)
            rank.setdefault(id(op), len(rank))
    post(plan.root)
    measured.sort(key=lambda m: rank[id(m[0])])
    plan.record(measured)
    return state
