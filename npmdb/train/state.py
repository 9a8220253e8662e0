"""A training run's configuration and its saved state.

:func:`resolve_config` turns :func:`~npmdb.train.train`'s arguments into a frozen
:class:`TrainConfig`: the ``"default"`` preset, then the named preset (or, when resuming,
the saved run's hyperparameters), then the arguments passed explicitly (on resume only
``steps`` and ``refresh_every``; ``steps`` defaults to the saved run's planned total),
each value checked.

With each generation it writes, the trainer saves its state under ``<db>/train/``: AdamW's
moments as safetensors (``state.safetensors``) and the step, seed, sampler position and
hyperparameters as msgpack (``state.msgpack``); :func:`load_checkpoint` reads them back
as a :class:`Checkpoint`. Nothing is pickled.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import math
import os
import secrets
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from npmdb.errors import OperationalError, ProgrammingError
from npmdb.storage import versions as V

from .batches import GROUPINGS
from .masking import SPAN_UNITS

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from npmdb.database import Database

__all__ = ["PRESETS", "STATE_DIR", "TrainConfig", "Checkpoint", "resolve_config",
           "saved_run", "load_checkpoint", "load_train_state", "save_checkpoint",
           "check_state_dir", "optimizer_tensors", "load_optimizer_tensors"]

STATE_DIR = "train"
STATE_FORMAT = 1
OBJECTIVES = ("phrase", "token", "mixed")

# Hyperparameters a preset may set; explicit keyword arguments always win.
PRESETS: dict[str, dict[str, Any]] = {
    # NPM-like defaults (the signature): small learning rate, 16 blocks.
    "default": dict(batch_blocks=16, lr=3e-5, group_size=8, warmup=0.06,
                    weight_decay=0.01, max_grad_norm=1.0, mask_ratio=0.15,
                    target_grad=True, freeze_embeddings=False, exclude_repeats=False,
                    context_negatives=False, refresh_every=0),
    # The recipe tuned on the bundled dev-small corpus with all-MiniLM-L6-v2 on 2 CPU
    # cores (<= 30 min with refreshes); see the README/report for its numbers.
    "demo": dict(steps=400, batch_blocks=32, lr=1e-4, group_size=8, warmup=0.06,
                 weight_decay=0.01, max_grad_norm=1.0, mask_ratio=0.15),
}
_PRESET_KEYS = ("steps", "batch_blocks", "lr", "group_size", "warmup", "weight_decay",
                "max_grad_norm", "mask_ratio", "target_grad", "freeze_embeddings",
                "exclude_repeats", "context_negatives", "refresh_every")


# --------------------------------------------------------------------------- config

@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """The checked settings of one :func:`~npmdb.train.train` call (see its docstring)."""

    steps: int
    batch_blocks: int
    lr: float
    group_size: int
    warmup: float
    weight_decay: float
    max_grad_norm: float
    mask_ratio: float
    target_grad: bool
    freeze_embeddings: bool
    exclude_repeats: bool
    context_negatives: bool
    refresh_every: int
    objective: str
    seed: int
    grouping: str
    clean_edges: bool
    max_span_len: int
    grad_cache: bool
    chunk_tokens: int
    loss_chunk: int | None
    threads: int | None
    tag_prefix: str
    log_every: int
    preset: str | None
    start_step: int = 0  # the saved run's step when resuming
    span_unit: str = "token"  # masking: span lengths and budget in tokens (NPM) or words
    span_length_p: float = 0.5  # masking: span lengths ~ Geometric(p), clipped (NPM: 0.5)
    reverse_pairs: bool = False  # training reads each short "HEAD: GLOSS" block both ways

    @property
    def warmup_steps(self) -> int:
        """``warmup`` as a number of steps (a fraction of ``steps`` when < 1)."""
        w = self.warmup
        return int(round(w * self.steps)) if w < 1 else int(w)

    def hyper(self) -> dict[str, Any]:
        """The hyperparameters saved with the run (and restored on resume)."""
        return dict(batch_blocks=self.batch_blocks, lr=self.lr, group_size=self.group_size,
                    warmup=self.warmup, weight_decay=self.weight_decay,
                    max_grad_norm=self.max_grad_norm, mask_ratio=self.mask_ratio,
                    grouping=self.grouping, clean_edges=self.clean_edges,
                    max_span_len=self.max_span_len, span_unit=self.span_unit,
                    span_length_p=self.span_length_p, target_grad=self.target_grad,
                    freeze_embeddings=self.freeze_embeddings,
                    exclude_repeats=self.exclude_repeats,
                    context_negatives=self.context_negatives,
                    reverse_pairs=self.reverse_pairs, refresh_every=self.refresh_every)

    def summary(self) -> dict[str, Any]:
        """What :attr:`TrainReport.config <npmdb.train.TrainReport.config>` shows."""
        return dict(self.hyper(), steps=self.steps, objective=self.objective, seed=self.seed,
                    refresh_every=self.refresh_every, grad_cache=self.grad_cache,
                    preset=self.preset)


def saved_run(db: "Database", *, preset: str | None, resume: Any) -> "Checkpoint | None":
    """Checks ``preset`` and ``resume``; with ``resume``, the saved run (which must exist)."""
    if preset is not None and preset not in PRESETS:
        raise ProgrammingError(f"unknown preset {preset!r}: use one of {sorted(PRESETS)}")
    if not isinstance(resume, bool):
        raise ProgrammingError(f"resume must be True or False, got {resume!r}")
    if not resume:
        return None
    saved = load_checkpoint(db)
    if saved is None:
        raise ProgrammingError(f"nothing to resume: {db.path / STATE_DIR} holds no training "
                               "state (train without resume=True first)")
    if saved.generation not in {v["generation"] for v in db.versions()}:
        # a vacuum dropped every version of it (e.g. after a restore and an untag); an
        # encoder cached in this process would hide that, a new process could not load it
        raise OperationalError(
            f"the saved run cannot be resumed: its embedding generation {saved.generation} "
            f"(step {saved.step}) is no longer in the database (a vacuum removed the "
            "versions that read it): train without resume (--resume) to start a new run")
    return saved


def resolve_config(args: Mapping[str, Any], *, preset: str | None,
                   saved: "Checkpoint | None") -> TrainConfig:
    """``args``: train()'s keyword arguments (None: not passed) -> a checked config.

    Precedence: ``PRESETS["default"]`` < ``PRESETS[preset]`` or the saved run's
    hyperparameters < explicit arguments (on resume only ``steps`` and ``refresh_every``;
    the saved objective, seed, grouping, clean_edges and span settings are kept). On
    resume ``steps`` defaults to the saved run's ``steps_total`` (its planned total: a
    run that ``max_seconds`` stopped early continues to it), else to the preset's.
    A ``warmup`` of more steps than ``steps`` is refused: the learning rate would never
    reach its peak.
    """
    hp: dict[str, Any] = dict(PRESETS["default"])
    hp["steps"] = None
    s = saved.meta if saved is not None else None
    if s is not None:
        hp.update({k: v for k, v in s["hyper"].items() if k in _PRESET_KEYS})
        _check_resumable(args, s)
    elif preset is not None:
        hp.update(PRESETS[preset])
    hp.update({k: args[k] for k in _PRESET_KEYS if args[k] is not None
               and (s is None or k in ("steps", "refresh_every"))})
    if hp["steps"] is None and s is not None:
        # resuming continues to the saved run's planned total (a run stopped early by
        # max_seconds), else to the preset's
        hp["steps"] = s.get("steps_total", PRESETS.get(preset or "default", {}).get("steps"))
    if hp["steps"] is None:
        if s is not None:
            raise ProgrammingError(
                f"steps is required: the saved run (at step {saved.step}) records no total "
                f"number of steps; pass steps=N (N > {saved.step}) with resume=True")
        if preset is not None:
            raise ProgrammingError(
                f"steps is required: preset {preset!r} sets no number of steps; pass "
                "steps=N (or use preset='demo', which sets 400)")
        raise ProgrammingError("steps is required: pass steps=N, or preset='demo' (400 "
                               "steps)")
    steps = _check_int("steps", hp["steps"], 1)
    batch_blocks = _check_int("batch_blocks", hp["batch_blocks"], 2)
    group_size = _check_int("group_size", hp["group_size"], 2)
    lr = _check_float("lr", hp["lr"], 0.0, 1.0, lo_open=True)
    warmup = _check_float("warmup", hp["warmup"], 0.0)
    if warmup >= 1 and int(warmup) > steps:  # a number of steps (below 1: a fraction)
        if s is not None:
            raise ProgrammingError(
                f"the saved run warms up over {int(warmup)} steps, more than steps={steps}: "
                f"the learning rate would never reach its peak (lr={hp['lr']}); pass "
                f"steps >= {int(warmup)}")
        raise ProgrammingError(
            f"warmup={warmup:g} steps is more than steps={steps}: the learning rate would "
            f"never reach its peak (lr={hp['lr']}); pass warmup <= steps, or a fraction of "
            "the steps below 1 (e.g. 0.06)")
    weight_decay = _check_float("weight_decay", hp["weight_decay"], 0.0)
    max_grad_norm = _check_float("max_grad_norm", hp["max_grad_norm"], 0.0)
    mask_ratio = _check_float("mask_ratio", hp["mask_ratio"], 0.0, 1.0, lo_open=True)
    exclude_repeats = _check_bool("exclude_repeats", hp["exclude_repeats"])
    context_negatives = _check_bool("context_negatives", hp["context_negatives"])
    target_grad = _check_bool("target_grad", hp["target_grad"])
    freeze_embeddings = _check_bool("freeze_embeddings", hp["freeze_embeddings"])
    grad_cache = _check_bool("grad_cache", args["grad_cache"])
    if context_negatives and not exclude_repeats:
        raise ProgrammingError("context_negatives=True needs exclude_repeats=True (a visible "
                               "copy of the answer would become a negative)")
    objective, seed, grouping = args["objective"], args["seed"], args["grouping"]
    clean_edges, max_span_len = args["clean_edges"], args["max_span_len"]
    span_unit = args.get("span_unit", "token")
    span_length_p = args.get("span_length_p", 0.5)
    reverse_pairs = args.get("reverse_pairs", False)
    if s is not None:
        objective, seed = s["objective"], int(s["seed"])
        grouping, clean_edges = s["hyper"]["grouping"], bool(s["hyper"]["clean_edges"])
        max_span_len = int(s["hyper"]["max_span_len"])
        span_unit = s["hyper"].get("span_unit", "token")  # runs saved before the option
        span_length_p = s["hyper"].get("span_length_p", 0.5)  # ditto
        reverse_pairs = bool(s["hyper"].get("reverse_pairs", False))  # ditto
    _check_bool("reverse_pairs", reverse_pairs)
    _check_bool("clean_edges", clean_edges)
    if span_unit not in SPAN_UNITS:
        raise ProgrammingError(f"span_unit must be one of {SPAN_UNITS}, got {span_unit!r}")
    if objective not in OBJECTIVES:
        raise ProgrammingError(f"unknown objective {objective!r}: use 'phrase', 'token' or "
                               "'mixed'")
    if grouping not in GROUPINGS:
        raise ProgrammingError(f"grouping must be one of {GROUPINGS}, got {grouping!r}")
    refresh_every = _check_int("refresh_every", hp["refresh_every"], 0)
    seed = _check_int("seed", seed, 0)
    max_span_len = _check_int("max_span_len", max_span_len, 1)
    span_length_p = _check_float("span_length_p", span_length_p, 0.0, 1.0, lo_open=True)
    chunk_tokens = _check_int("chunk_tokens", args["chunk_tokens"], 1)
    log_every = _check_int("log_every", args["log_every"], 0)
    loss_chunk, threads = args["loss_chunk"], args["threads"]
    if loss_chunk is not None:
        loss_chunk = _check_int("loss_chunk", loss_chunk, 1)
    if threads is not None:
        threads = _check_int("threads", threads, 1)
    if not isinstance(args["tag_prefix"], str):
        raise ProgrammingError("tag_prefix must be a string")
    if args["tag_prefix"]:  # the last tag is the longest; a bad one would end the run
        V.check_tag_name(f"{args['tag_prefix']}{steps}")
    start_step = saved.step if saved is not None else 0
    if start_step >= steps:
        raise ProgrammingError(f"the saved run is already at step {start_step}: pass "
                               f"steps > {start_step} (--steps) to train further")
    return TrainConfig(
        steps=steps, batch_blocks=batch_blocks, lr=lr, group_size=group_size, warmup=warmup,
        weight_decay=weight_decay, max_grad_norm=max_grad_norm, mask_ratio=mask_ratio,
        target_grad=target_grad, freeze_embeddings=freeze_embeddings,
        exclude_repeats=exclude_repeats, context_negatives=context_negatives,
        refresh_every=refresh_every, objective=objective, seed=seed, grouping=grouping,
        clean_edges=clean_edges, max_span_len=max_span_len, grad_cache=grad_cache,
        chunk_tokens=chunk_tokens, loss_chunk=loss_chunk, threads=threads,
        tag_prefix=args["tag_prefix"], log_every=log_every, preset=preset,
        start_step=start_step, span_unit=span_unit, span_length_p=span_length_p,
        reverse_pairs=reverse_pairs)


#: Settings a resumed run keeps from the saved run, and the value each has when not given.
_KEPT_ON_RESUME = {"objective": "phrase", "seed": 0, "grouping": "neighbours",
                   "clean_edges": True, "max_span_len": 10, "span_unit": "token",
                   "span_length_p": 0.5, "reverse_pairs": False}


def _check_resumable(args: dict, s: dict) -> None:
    """Refuse settings that a resumed run would not use (it keeps the saved run's): they
    were ignored without a word (``--resume --lr 1e-3`` trained at the saved lr)."""
    saved = {**s["hyper"], "objective": s["objective"], "seed": s["seed"]}
    given = {k: args[k] for k in _PRESET_KEYS if k not in ("steps", "refresh_every")
             and args.get(k) is not None}
    given.update({k: args[k] for k, default in _KEPT_ON_RESUME.items()
                  if k in args and args[k] != default})
    differ = sorted(k for k, v in given.items() if k in saved and v != saved[k])
    if differ:
        raise ProgrammingError(
            "resume continues the saved run with its own settings; "
            + ", ".join(f"{k}={given[k]!r} (saved: {saved[k]!r})" for k in differ)
            + " would not be used: leave them out, or train again without resume")


def _check_bool(name: str, value: Any) -> bool:
    """A switch is True or False: "no" or None would read as on or off by truthiness."""
    if not isinstance(value, bool):
        raise ProgrammingError(f"{name} must be True or False, got {value!r}")
    return value


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ProgrammingError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ProgrammingError(f"{name} must be >= {minimum}, got {value}")
    if value >= 2 ** 63:  # a run's settings are stored (msgpack) with every checkpoint
        raise ProgrammingError(f"{name} must be below 2**63, got {value}")
    return int(value)


def _check_float(name: str, value: Any, lo: float, hi: float = math.inf, *,
                 lo_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise ProgrammingError(f"{name} must be a number, got {value!r}")
    v = float(value)
    if not math.isfinite(v) or v < lo or (lo_open and v == lo) or v > hi:
        bound = f"({lo}, {hi}]" if lo_open else f"[{lo}, {hi}]"
        raise ProgrammingError(f"{name} must be in {bound}, got {value!r}")
    return v


# --------------------------------------------------------------------------- saved state

@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """A saved run: ``meta`` (msgpack: step, generation, seed, objective, hyper, sampler…)
    and ``optimizer`` (AdamW's state as ``{"<param name>/<field>": tensor}``)."""

    meta: dict
    optimizer: dict[str, "torch.Tensor"]

    @property
    def step(self) -> int:
        return int(self.meta["step"])

    @property
    def generation(self) -> int:
        return int(self.meta["generation"])


def run_meta(cfg: TrainConfig, *, step: int, sampler: dict, start_generation: int) -> dict:
    """The msgpack metadata of the run at ``step`` (the generation is added once written)."""
    return {"format": STATE_FORMAT, "step": step, "steps_total": cfg.steps, "seed": cfg.seed,
            "objective": cfg.objective, "hyper": cfg.hyper(), "sampler": sampler,
            "start_generation": start_generation, "time": time.time()}


def _state_paths(db: "Database") -> tuple[Path, Path]:
    """The legacy optimizer file (one name for every step) and the metadata file."""
    d = db.path / STATE_DIR
    return d / "state.safetensors", d / "state.msgpack"


def optimizer_path(db: "Database", meta: dict) -> Path:
    """The optimizer file the metadata ``meta`` names (``state-<step>-<id>.safetensors``; states
    written before each step had its own file name ``state.safetensors``)."""
    name = meta.get("optimizer", "state.safetensors")
    return db.path / STATE_DIR / Path(str(name)).name


def _fsync_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def save_checkpoint(db: "Database", meta: dict, tensors: dict[str, "torch.Tensor"]) -> None:
    """Write the optimizer tensors (safetensors, a file of this step's own name), then the
    metadata (msgpack) that names it, atomically each; then remove the other optimizer
    files. The metadata's replacement is the commit: a crash before it leaves the previous
    state whole (it overwrote the one optimizer file, and the previous step's metadata
    then named a newer optimizer: the state was torn, and resume refused for good).
    """
    import msgpack
    from safetensors.torch import save

    legacy, mp_path = _state_paths(db)
    d = mp_path.parent
    d.mkdir(exist_ok=True)
    header = {"format": str(STATE_FORMAT), "step": str(meta["step"]),
              "generation": str(meta["generation"])}
    data = save({k: v.contiguous() for k, v in tensors.items()}, metadata=header)
    # a name no earlier save used: the same step can be saved twice (a resumed run that
    # stops before its first step), and overwriting the file the metadata names would
    # tear the state again
    name = f"state-{int(meta['step'])}-{secrets.token_hex(4)}.safetensors"
    _fsync_write(d / name, data)
    meta = dict(meta, optimizer=name, optimizer_sha256=hashlib.sha256(data).hexdigest())
    del data
    _fsync_write(mp_path, msgpack.packb(meta, use_bin_type=True))
    _fsync_dir(d)
    for old in [legacy, *d.glob("state-*.safetensors*")]:
        if old.name != name and old.exists():
            old.unlink()


def _fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load_checkpoint(db: "Database", *, tensors: bool = True) -> Checkpoint | None:
    """The saved training state of ``db`` (without the optimizer's unless ``tensors``).

    A state that cannot be read (a truncated or overwritten file, a changed byte the
    optimizer file's sha256 catches, metadata of the wrong shape, the two files from
    different steps) is an OperationalError saying which file and to train again without
    resume, never msgpack's or safetensors' own exception. A file the operating system
    will not read (permissions, an I/O error) is an OperationalError saying so: the state
    may be whole.
    """
    import msgpack

    _, mp_path = _state_paths(db)
    if not mp_path.exists():
        return None
    raw = _read(mp_path)
    try:
        meta = msgpack.unpackb(raw, raw=False, strict_map_key=False)
    except Exception as exc:  # noqa: BLE001 - ValueError, msgpack's FormatError…
        raise _damaged(mp_path, f"cannot be read ({_why(exc)})") from exc
    _check_meta(meta, mp_path)
    if not tensors:
        return Checkpoint(meta, {})
    from safetensors import safe_open

    st_path = optimizer_path(db, meta)
    if not st_path.exists():
        raise OperationalError(f"{st_path} is missing: the training state is incomplete")
    try:
        with safe_open(str(st_path), framework="pt") as fh:
            header = fh.metadata() or {}
            if header.get("step") != str(meta["step"]) or \
                    header.get("generation") != str(meta["generation"]):
                raise OperationalError(
                    f"the training state in {st_path.parent} is torn (optimizer at step "
                    f"{header.get('step')}, metadata at step {meta['step']}): train again "
                    "without resume")
            out = {k: fh.get_tensor(k) for k in fh.keys()}
    except OperationalError:
        raise
    except OSError as exc:
        raise _unreadable(st_path, exc) from exc
    except Exception as exc:  # noqa: BLE001 - SafetensorError…
        raise _damaged(st_path, f"cannot be read ({_why(exc)})") from exc
    digest = meta.get("optimizer_sha256")  # absent in states written before it was kept
    if digest is not None and _sha256(st_path) != digest:
        raise _damaged(st_path, "does not match the sha256 its metadata recorded (a byte "
                                "changed since it was written)")
    return Checkpoint(meta, out)


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise _unreadable(path, exc) from exc


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    except OSError as exc:
        raise _unreadable(path, exc) from exc
    return h.hexdigest()


def _unreadable(path: Path, exc: OSError) -> OperationalError:
    return OperationalError(
        f"the training state file {path} cannot be read ({_why(exc)}); fix its permissions "
        "or the disk and resume, or train again without resume")


def _damaged(path: Path, what: str) -> OperationalError:
    return OperationalError(
        f"the training state in {path.parent} is damaged: {path.name} {what}; train again "
        "without resume (the new run's state replaces it)")


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _check_meta(meta: Any, path: Path) -> None:
    """``state.msgpack``'s content has the shape :func:`run_meta` writes (else damaged)."""
    def is_int(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2 ** 63

    if not isinstance(meta, dict):
        raise _damaged(path, f"holds a {type(meta).__name__}, not the map npmdb writes")
    fmt = meta.get("format")
    if not is_int(fmt):
        raise _damaged(path, f"has no format number (format: {fmt!r})")
    if fmt != STATE_FORMAT:
        raise OperationalError(f"{path} has training-state format {fmt}, "
                               f"this npmdb reads {STATE_FORMAT}")
    for key in ("step", "generation", "seed"):
        if not is_int(meta.get(key)):
            raise _damaged(path, f"has no valid {key} ({meta.get(key)!r})")
    if "steps_total" in meta and not is_int(meta["steps_total"]):
        raise _damaged(path, f"has no valid steps_total ({meta['steps_total']!r})")
    if "optimizer" in meta and not (isinstance(meta["optimizer"], str) and
                                    meta["optimizer"].startswith("state-")):
        raise _damaged(path, f"names no valid optimizer file ({meta['optimizer']!r})")
    if not isinstance(meta.get("objective"), str):
        raise _damaged(path, f"has no valid objective ({meta.get('objective')!r})")
    hyper, sampler = meta.get("hyper"), meta.get("sampler")
    if not isinstance(hyper, dict) or not all(
            k in hyper for k in ("grouping", "clean_edges", "max_span_len")):
        raise _damaged(path, "has no valid hyperparameters (hyper)")
    if not isinstance(sampler, dict) or not all(
            is_int(sampler.get(k)) for k in ("epoch", "cursor")):
        raise _damaged(path, "has no valid sampler position (sampler)")


def check_state_dir(db: "Database") -> None:
    """Refuse a run whose state :func:`save_checkpoint` could not write (``<db>/train``
    a file, not writable…), before its first step rather than after its first commit."""
    d = db.path / STATE_DIR
    made = False
    try:
        if not d.is_dir():
            d.mkdir()  # a file (or a broken link) in its place raises FileExistsError
            made = True
        probe = d / f".probe-{os.getpid()}.tmp"
        try:
            with open(probe, "wb") as fh:
                fh.write(b"npmdb")
        finally:
            probe.unlink(missing_ok=True)
        if made:  # save_checkpoint makes it again; a refused run leaves nothing behind
            with contextlib.suppress(OSError):
                d.rmdir()
    except OSError as exc:
        raise OperationalError(
            f"cannot train: the training state could not be saved in {d} ({exc}); make "
            "it a writable directory (or remove what is in its place) and train again. "
            "Nothing was trained or committed") from exc


def load_train_state(db: "Database", *, tensors: bool = True
                     ) -> tuple[dict, dict[str, "torch.Tensor"]] | None:
    """The saved training state ``(meta, optimizer tensors)`` of ``db``, or None."""
    saved = load_checkpoint(db, tensors=tensors)
    return None if saved is None else (saved.meta, saved.optimizer)


def optimizer_tensors(opt: "torch.optim.Optimizer", names: dict[int, str]
                      ) -> dict[str, "torch.Tensor"]:
    """AdamW's per-parameter state as ``{"<param name>/<field>": CPU tensor}`` (copies)."""
    import torch

    out: dict[str, torch.Tensor] = {}
    for p, st in opt.state.items():
        name = names.get(id(p))
        if name is None:
            continue
        for field, val in st.items():
            if isinstance(val, torch.Tensor):
                out[f"{name}/{field}"] = val.detach().to("cpu", copy=True)
            else:
                out[f"{name}/{field}"] = torch.tensor(float(val))
    return out


def load_optimizer_tensors(opt: "torch.optim.Optimizer", params: dict[str, "torch.Tensor"],
                           tensors: dict[str, "torch.Tensor"]) -> None:
    """Put saved :func:`optimizer_tensors` back into ``opt`` (``params``: name -> param)."""
    import torch

    by_param: dict[str, dict[str, torch.Tensor]] = {}
    for key, val in tensors.items():
        name, _, field = key.rpartition("/")
        by_param.setdefault(name, {})[field] = val
    for name, fields in by_param.items():
        p = params.get(name)
        if p is None:
            raise OperationalError(f"the saved optimizer state names parameter {name!r}, "
                                   "which the model does not have")
        st = {}
        for field, val in fields.items():
            if field == "step":
                st[field] = val.to(torch.float32)  # AdamW keeps step as a CPU float tensor
            else:
                st[field] = val.to(p.device, p.dtype)
        opt.state[p] = st
