"""A physical plan: a tree of operators, printable (EXPLAIN) and executable (ANALYZE).

The tree reads top-down as in SQL EXPLAIN (the root produces the result); execution runs
children first. ``Plan.run`` records rows and milliseconds for every operator.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from npmdb.errors import Error, InternalError

from .operators import ExecState, Operator

__all__ = ["Plan", "StageStat"]


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

        def execute(op: Operator, depth: int) -> None:
            if id(op) in done:  # a shared child (hybrid: one EncodeQuery) runs once
                return
            done.add(id(op))
            for child in op.children:
                execute(child, depth + 1)
            t0 = time.perf_counter()
            try:
                rows = op.run(state)
            except Error:
                raise
            except Exception as exc:  # noqa: BLE001 - wrap as the executor does in sqlglot
                raise InternalError(f"operator {op.name!r} failed: {type(exc).__name__}: {exc}"
                                    ) from exc
            ms = (time.perf_counter() - t0) * 1000.0
            measured.append((op, StageStat(op.name, op.detail(), int(rows), ms, depth)))

        execute(self.root, 0)
        self._measured = measured
        self.stats = [st for _, st in measured]
        return state
