"""Training npmdb's encoder with NPM's objective (span masking + contrastive losses)."""

from __future__ import annotations

import sys
import types
from typing import Any

__all__ = ["train", "TrainReport", "PRESETS"]


def __getattr__(name: str) -> Any:
    # Lazy: importing npmdb.train (or its masking/loss modules) does not load the trainer.
    if name in ("train", "TrainReport", "PRESETS"):
        from . import trainer
        return getattr(trainer, name)
    raise AttributeError(f"module 'npmdb.train' has no attribute {name!r}")


class _CallableModule(types.ModuleType):
    """``npmdb.train`` is both this package and the function: once the package is imported,
    Python binds the attribute ``npmdb.train`` to it (not to ``npmdb.__getattr__``'s
    function), so calling the package must train."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from .trainer import train
        return train(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
