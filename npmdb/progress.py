"""Progress bars for long work (ingest, encoding, index builds, training)."""

from __future__ import annotations

import sys
from typing import Any, Callable

__all__ = ["progress_bar", "bar_factory"]


def progress_bar(total: int, desc: str, enabled: bool | None, unit: str = "it") -> Any:
    """A tqdm bar on stderr; ``enabled=None``: shown when stderr is a terminal."""
    from tqdm.auto import tqdm

    disable = (not sys.stderr.isatty()) if enabled is None else (not enabled)
    return tqdm(total=total, desc=desc, unit=unit, disable=disable, leave=False,
                dynamic_ncols=True, mininterval=0.5)


def bar_factory(enabled: bool | None) -> Callable[[int, str, str], Any]:
    """``make(total, desc, unit)`` for :func:`progress_bar` with ``enabled`` fixed."""
    return lambda total, desc, unit="it": progress_bar(total, desc, enabled, unit)
