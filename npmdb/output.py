"""How the command line prints a result: a query's answers with their evidence, or a
statement's rows as a plain table (the shell's cells, padded by display width)."""

from __future__ import annotations

import sys

from .shell import _cell, _pad, display_width

__all__ = ["print_result", "print_table", "shorten"]


def print_result(res, *, evidence: bool = True, load_s: float = 0.0, out=None) -> None:
    out = sys.stdout if out is None else out   # looked up per call: sys.stdout may be replaced
    if res.is_explain:
        print(res.plan, file=out)
        return
    if res.columns is not None and res.rows is not None:
        print_table(res.columns, res.rows, out)
        return
    if not res.answers:
        print("  (no answers)", file=out)
    for i, a in enumerate(res.answers, 1):
        text = _pad(repr(a.text), 40, False)  # 40 terminal columns (CJK is two wide)
        print(f"  {i:>2}. {text} score={a.score:.4f}  support={a.support}", file=out)
        if evidence:
            for e in a.evidence[:2]:
                snip = shorten(e.snippet, 100)
                print(f"        {e.doc_id} [{e.start}:{e.end}] {snip}", file=out)
    loaded = f" (loading the encoder first took {load_s:.1f} s)" if load_s >= 0.05 else ""
    print(f"  -- version {res.version}, generation {res.generation}, "
          f"{res.elapsed_ms:.1f} ms{loaded}", file=out)


def shorten(text: str, width: int) -> str:
    """``text`` on one line, cut to ``width`` characters with "…" (at a space where one
    is near; ``textwrap.shorten`` dropped a first word longer than the width whole)."""
    text = " ".join(text.split())
    if len(text) <= width:
        return text
    cut = text[:width - 1]
    space = cut.rfind(" ")
    return (cut[:space] if space > width // 2 else cut) + "…"


def print_table(columns, rows, out) -> None:
    # the shell's cells: NULL, JSON, one line, cut with "…", padded by display width
    cells = [[_cell(v, 60) for v in r] for r in rows]
    widths = [max([display_width(c)] + [display_width(r[i]) for r in cells])
              for i, c in enumerate(columns)]
    widths = [min(w, 60) for w in widths]
    print("  ".join(_pad(c, w, False) for c, w in zip(columns, widths)), file=out)
    print("  ".join("-" * w for w in widths), file=out)
    for r in cells:
        print("  ".join(_pad(v, w, False) for v, w in zip(r, widths)), file=out)
