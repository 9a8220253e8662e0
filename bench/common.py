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
