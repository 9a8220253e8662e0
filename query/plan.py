"""A physical plan: a tree of operators, printable (EXPLAIN) and executable (ANALYZE).

The tree reads top-down as in SQL EXPLAIN (the root produces the result); execution runs
children first. ``Plan.run`` records rows and milliseconds for every operator.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from npmdb.errors import Error, InternalError

from .operators import ExecState, Operator

__all__ = ["Plan", "StageStat"]

_BRANCHES: ThreadPoolExecutor | None = None  # concurrent sibling operators (not the
_BRANCHES_LOCK = threading.Lock()            # per-segment pool: no nested waits on one pool)


def _branches() -> ThreadPoolExecutor:
    global _BRANCHES
    with _BRANCHES_LOCK:
        if _BRANCHES is None:
            _BRANCHES = ThreadPoolExecutor(4, thread_name_prefix="npmdb-branch")
    return _BRANCHES


@dataclass(frozen=True, slots=True)
class StageStat:
    operator: str
    detail: str
    rows: int
    ms: float
    depth: int = 0


@dataclass
class Plan:
    root: Operator
    kind: str = "masked"          # masked | classify | evidence
    stats: list[StageStat] = field(default_factory=list)

    def operators(self) -> list[tuple[int, Operator]]:
        """(depth, operator) in EXPLAIN order: root first, children indented below."""
        out: list[tuple[int, Operator]] = []

        def walk(op: Operator, depth: int) -> None:
            out.append((depth, op))
            for child in op.children:
                walk(child, depth + 1)

        walk(self.root, 0)
        return out

    def explain(self, analyze: bool = False) -> str:
        lines = []
        stats = {id(op): st for op, st in getattr(self, "_measured", [])}
        for depth, op in self.operators():
            line = "  " * depth + ("-> " if depth else "") + op.name
            d = op.detail()
            if d:
                line += f" ({d})"
            if analyze and id(op) in stats:
                st = stats[id(op)]
                line += f"  [rows={st.rows} time={st.ms:.2f} ms]"
            lines.append(line)
        return "\n".join(lines)

    def run(self, state: ExecState) -> ExecState:
        measured: list[tuple[Operator, StageStat]] = []

        done: set[int] = set()

        def timed(op: Operator, depth: int) -> tuple[Operator, StageStat]:
            t0 = time.perf_counter()
            try:
                rows = op.run(state)
            except Error:
                raise
            except Exception as exc:  # noqa: BLE001 - wrap as the executor does in sqlglot
                raise InternalError(f"operator {op.name!r} failed: {type(exc).__name__}: {exc}"
                                    ) from exc
            ms = (time.perf_counter() - t0) * 1000.0
            return op, StageStat(op.name, op.detail(), int(rows), ms, depth)

        def execute(op: Operator, depth: int) -> None:
            if id(op) in done:  # a shared child (hybrid: one EncodeQuery) runs once
                return
            done.add(id(op))
            together = [c for c in op.children if c.concurrent and id(c) not in done]
            if len(together) < 2:
                together = []
            side_by_side = {id(c) for c in together}
            for child in op.children:
                if id(child) in side_by_side:  # their inputs now; they run below, side by side
                    for grandchild in child.children:
                        execute(grandchild, depth + 2)
                else:
                    execute(child, depth + 1)
            if together:
                for child in together:
                    done.add(id(child))
                    child.prepare(state)  # serial: the snapshot's transaction
                futures = [_branches().submit(timed, c, depth + 1) for c in together[1:]]
                measured.append(timed(together[0], depth + 1))
                measured.extend(f.result() for f in futures)
            measured.append(timed(op, depth))

        execute(self.root, 0)
        # stages in the order a serial run records them (children first, left to right)
        rank: dict[int, int] = {}

        def post(op: Operator) -> None:
            if id(op) not in rank:
                for child in op.children:
                    post(child)
                rank.setdefault(id(op), len(rank))
        post(self.root)
        measured.sort(key=lambda m: rank[id(m[0])])
        self._measured = measured
        self.stats = [st for _, st in measured]
        return state
