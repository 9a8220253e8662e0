"""Shared helpers for the benchmarks: data loading, result files (exact match is
:mod:`npmdb.evaluation`'s, what ``npmdb eval`` reports)."""

from __future__ import annotations

import gzip
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = RESULTS.parent.parent
#: The dev corpus beside the checkout (``make bench``; the committed ``dev`` results),
#: found from the repository, not from the working directory. A user's clone may lack it.
DEV_DATA = ROOT.parent / "shared" / "data" / "dev"
#: The bundled sample data (corpus.jsonl.gz, cloze.jsonl, ...).
SMALL_DATA = ROOT / "npmdb" / "data" / "dev-small"
#: Databases the benchmarks build (found from the repository, as the data).
WORK = ROOT / "bench" / "work"


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def require_data(data: Path, *files: str, error=None) -> None:
    """Stop before any work when ``data`` lacks one of ``files`` (default: the cloze
    queries): ``error(message)`` (an argparse parser's ``error``: usage, exit 2) or
    ``SystemExit(message)``."""
    missing = [f for f in (files or ("cloze.jsonl",)) if not (Path(data) / f).is_file()]
    if not missing:
        return
    msg = (f"no {' or '.join(missing)} in {data}: pass --data DIR, the data directory of "
           f"the database's corpus, holding {', '.join(files or ('cloze.jsonl',))} (e.g. the "
           f"bundled sample data: --data {_shown(SMALL_DATA)})")
    if error is not None:
        error(msg)
    raise SystemExit(msg)


def count(text: str, *, zero: bool = False) -> int:
    """An argparse type: a whole number above 0 (``zero``: 0 too)."""
    import argparse

    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if n < (0 if zero else 1):
        raise argparse.ArgumentTypeError(f"must be {'0 or more' if zero else 'at least 1'}, "
                                         f"got {n}")
    return n


def counts(text: str) -> list[int]:
    """An argparse type: whole numbers above 0, joined by commas (``64,1024``)."""
    return [count(t) for t in text.split(",") if t.strip()] or [count("")]


def seconds(text: str) -> float:
    """An argparse type: a positive number of seconds."""
    import argparse
    import math

    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not (math.isfinite(v) and v > 0):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return v


def load_jsonl(path: Path) -> list[dict]:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def machine() -> dict[str, Any]:
    import os
    return {"python": platform.python_version(), "machine": platform.machine(),
            "cpus": os.cpu_count(), "time": time.strftime("%Y-%m-%d %H:%M:%S")}


def write_result(name: str, payload: dict, markdown: str) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(payload, indent=1, ensure_ascii=False))
    (RESULTS / f"{name}.md").write_text(markdown)
    return path


def publish(name: str, out: dict, render) -> int:
    """A step run on its own: stamp the machine, write ``bench/results/NAME.{json,md}``,
    print the table; returns the exit status."""
    out.setdefault("machine", machine())
    md = render(out)
    path = write_result(name, out, md)
    print(md)
    print(f"wrote {path}", file=sys.stderr)
    return 0


def percentiles(ms: list[float]) -> dict[str, float]:
    a = np.asarray(ms)
    return {"p50": float(np.percentile(a, 50)), "p99": float(np.percentile(a, 99)),
            "mean": float(a.mean()), "n": int(len(a))}


def vs_limit(value: float, limit: float, digits: int = 1) -> str:
    """``value`` with ``digits`` decimals, or more where the rounded figure would sit on
    the other side of (or on) ``limit`` than the value does: 84.67 against 85 prints
    84.7, not 85, so the figure and the verdict beside it agree."""
    side = (value > limit) - (value < limit)
    for d in range(digits, digits + 6):
        r = round(value, d)
        if (r > limit) - (r < limit) == side:
            return f"{value:.{d}f}"
    return repr(value)
