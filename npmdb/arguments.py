"""Checks of the facade's arguments that several methods share: version references and
text that must be valid Unicode (``npmdb.Database``); ``NAME=VALUE`` command-line pairs."""

from __future__ import annotations

import numbers
from typing import Any, Mapping

from .errors import NotSupportedError, ProgrammingError

__all__ = ["check_ref", "check_text", "check_device", "check_location", "parse_assignments"]


def check_ref(ref: Any) -> None:
    """Version ids are u64 keys: a negative or huge id is no version (not an overflow)."""
    if isinstance(ref, numbers.Integral) and not isinstance(ref, bool) and \
            not 0 <= int(ref) < 2 ** 63:
        raise ProgrammingError(f"no version {ref}: version ids are integers >= 0; see "
                               "db.versions() for the versions that exist")


def check_text(value: Any, what: str) -> None:
    """Strings with lone surrogates cannot be encoded (tokenizer, LMDB keys): say so."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ProgrammingError(
                f"{what} contains a lone surrogate U+{ord(value[exc.start]):04X} at character "
                f"{exc.start}, which is not valid Unicode text (was it decoded with "
                "errors='surrogateescape'?)") from None
    elif isinstance(value, Mapping):
        for k, v in value.items():
            check_text(k, what)
            check_text(v, what)
    elif isinstance(value, (list, tuple)):
        for v in value:
            check_text(v, what)


def parse_assignments(items: list[str], flag: str) -> dict[str, Any]:
    """``NAME=VALUE`` pairs given to the command-line option ``flag``, as a dict: true /
    false, integers and numbers typed, anything else a string. Raises ValueError naming
    the pair that has no ``=`` or no name."""
    out: dict[str, Any] = {}
    for item in items:
        name, sep, raw = item.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"{flag} wants NAME=VALUE, got {item!r}")
        low = raw.strip().lower()
        value: Any = raw
        if low in ("true", "false"):
            value = low == "true"
        else:
            for kind in (int, float):
                try:
                    value = kind(raw)
                    break
                except ValueError:
                    pass
        out[name.strip()] = value
    return out


#: The torch device types npmdb runs its encoder on.
DEVICE_TYPES = ("cpu", "cuda", "mps")


def check_device(device: Any) -> Any:
    """``device`` when the encoder can run there (checked at open and by ``npmdb.train``:
    every query used to fail instead). Imports torch: call it only for a device given."""
    import torch

    if not isinstance(device, (str, torch.device)):
        raise ProgrammingError(f"device must be a torch device name such as 'cpu' or "
                               f"'cuda', got {device!r}")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ProgrammingError(f"unknown device {device!r} ({exc}): use 'cpu' or 'cuda'") from None
    if dev.type not in DEVICE_TYPES:
        raise NotSupportedError(f"device {device!r}: npmdb runs its encoder on "
                                f"{', '.join(DEVICE_TYPES)}; use 'cpu' (or leave device out)")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise NotSupportedError(f"device {device!r}: this torch has no MPS device; use 'cpu' "
                                "(or leave device out)")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise NotSupportedError(f"device {device!r}: this torch has no CUDA device; use 'cpu' "
                                "(or leave device out)")
    if dev.type == "cuda" and (dev.index or 0) >= torch.cuda.device_count():
        raise NotSupportedError(f"device {device!r}: this machine has "
                                f"{torch.cuda.device_count()} CUDA device(s), cuda:0 on")
    return device


def check_location(value: Any, what: str, expected: str) -> None:
    """A path argument (the database, a model directory) is a str or ``os.PathLike``."""
    import os

    if not isinstance(value, (str, os.PathLike)) or isinstance(os.fspath(value), bytes):
        raise ProgrammingError(f"{what} must be a str or pathlib.Path naming {expected}, got "
                               f"{type(value).__name__} {value!r:.80}")
    text = os.fspath(value)
    if not text.strip():
        raise ProgrammingError(f"{what} is empty: give {expected} (\".\" for the working "
                               "directory)")
    if "\0" in text:
        raise ProgrammingError(f"{what} {text!r:.80} holds a NUL character, which no path "
                               "can hold")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a name of bytes that are not UTF-8 (os.fsdecode's escapes)
        raise ProgrammingError(f"{what} {text!r:.80} is not valid UTF-8, which LMDB and "
                               "tantivy need: rename it") from None
