"""A physical plan: a tree of operators, printable (EXPLAIN) and executable (ANALYZE).

The tree reads top-down as in SQL EXPLAIN (the root produces the result); execution runs
children first (:mod:`npmdb.query.executor`), which records rows and milliseconds for every
operator on the plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .lexer import one_line
from .physical import ExecState, Operator

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
    kind: str = "masked"          # masked | classify | rows
    query: str = ""               # the query text the operators read (EncodeQuery, BM25)
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
            d = stats[id(op)].detail if analyze and id(op) in stats else op.detail()
            if d:
                line += f" ({one_line(d)})"
            if analyze and id(op) in stats:
                st = stats[id(op)]
                line += f"  [rows={st.rows} time={st.ms:.2f} ms]"
            lines.append(line)
        return "\n".join(lines)

    def record(self, measured: list[tuple[Operator, StageStat]]) -> None:
        """Keep a run's stages (the executor calls this): ``stats`` and EXPLAIN ANALYZE."""
        self._measured = measured
        self.stats = [st for _, st in measured]

    def run(self, state: ExecState) -> ExecState:
        """Run the plan over a bare ``state`` (see :func:`npmdb.query.executor.run_plan`;
        queries go through :func:`npmdb.query.executor.execute`)."""
        from .executor import run_plan

        return run_plan(self, state)
