"""``npmdb.train``: fine-tune the database's encoder with NPM's objective, refreshing as in REALM.

One training step (DESIGN.md section 5; Min et al. 2023, §3.2):

1. :class:`~npmdb.train.batches.BatchSampler` draws ``batch_blocks`` blocks of HEAD's
   corpus in document groups (a seed document's consecutive blocks, then blocks of other
   documents that share rare words with it, so that spans co-occur);
2. :func:`~npmdb.train.masking.mask_spans` masks spans that occur in another block of
   the batch (geometric lengths, 15 % budget, each span -> two mask tokens), or
   :func:`~npmdb.train.masking.mask_tokens` for the token objective (NPM SINGLE);
3. the encoder (train mode, dropout on) encodes the masked blocks (queries ``q_s``/``q_e``
   at the two mask tokens) and the unmasked blocks (candidates: every other block's
   tokens); :func:`~npmdb.train.loss.phrase_loss` / :func:`~npmdb.train.loss.token_loss`
   give ``-log(sum_pos exp(sim) / sum_all exp(sim))`` with ``sim = a·b/sqrt(h)``, start and
   end separately;
4. AdamW, linear warm-up then linear decay to zero, gradient-norm clipping.

The in-batch set can exceed what fits at once with ``grad_cache=True``: all hidden states
are first computed without a graph, the loss's gradient with respect to them is taken,
then each chunk of rows is re-encoded (same dropout masks: its RNG state is replayed)
and back-propagated with that gradient (GradCache; Gao et al. 2021). The result equals
the one-graph step up to float rounding.

Every ``refresh_every`` steps a CPU copy of the parameters goes to a background thread
(:class:`~npmdb.train.refresh.Refresher`) that writes a new embedding generation and
version (tag ``train-step-N``) while training continues; a final generation is always
written at the end and becomes HEAD. With each generation the trainer stores its own
state (AdamW moments as safetensors, step / sampler / hyperparameters as msgpack) under
``<db>/train/``, so ``train(db, steps=N, resume=True)`` continues from the last
generation written. Nothing is pickled.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from npmdb.errors import OperationalError, ProgrammingError

from .batches import GROUPINGS, BatchSampler, load_blocks
from .refresh import Refresher, RefreshJob

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from npmdb.database import Database

__all__ = ["train", "TrainReport", "PRESETS", "STATE_DIR", "load_train_state"]

STATE_DIR = "train"
STATE_FORMAT = 1
OBJECTIVES = ("phrase", "token")

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


# --------------------------------------------------------------------------- report

@dataclasses.dataclass(frozen=True)
class TrainReport:
    """What a :func:`train` call did.

    ``steps`` is the step count reached (including steps of a resumed run);
    ``steps_run`` those run by this call. Losses are per-step means over masked spans;
    ``loss_curve`` holds ``(last step, mean loss)`` over about 20 equal windows.
    ``versions`` / ``generations`` / ``tags`` are what this call committed (the last one
    is HEAD); ``spans_per_batch`` and ``positives_per_span`` describe the masking.
    """

    steps: int
    steps_run: int
    objective: str
    final_loss: float
    first_loss: float
    final_accuracy: float
    loss_curve: tuple[tuple[int, float], ...]
    seconds: float
    train_seconds: float
    spans_per_batch: float
    positives_per_span: float
    skipped_batches: int
    versions: tuple[int, ...]
    generations: tuple[int, ...]
    tags: tuple[str, ...]
    head_version: int | None
    head_generation: int | None
    device: str
    resumed_from: int | None
    refreshes_dropped: int = 0
    config: dict = dataclasses.field(default_factory=dict, compare=False)

    @property
    def steps_per_second(self) -> float:
        return self.steps_run / self.train_seconds if self.train_seconds > 0 else 0.0

    def __str__(self) -> str:
        curve = " ".join(f"{loss:.2f}" for _, loss in self.loss_curve)
        gens = ", ".join(f"v{v}/g{g}" for v, g in zip(self.versions, self.generations)) or "none"
        lines = [
            f"trained {self.steps_run} steps ({self.objective} objective) on {self.device} in "
            f"{self.seconds:.1f} s ({self.steps_per_second:.2f} steps/s)"
            + (f", resumed from step {self.resumed_from}" if self.resumed_from else ""),
            f"loss {self.first_loss:.3f} -> {self.final_loss:.3f} (accuracy "
            f"{self.final_accuracy:.2f}); curve: {curve}",
            f"masked spans per batch {self.spans_per_batch:.1f}, positives per span "
            f"{self.positives_per_span:.1f}, batches with nothing to mask {self.skipped_batches}",
            f"generations written: {gens}; HEAD is version {self.head_version} "
            f"(generation {self.head_generation})",
        ]
        return "\n".join(lines)


# --------------------------------------------------------------------------- state I/O

def _state_paths(db: "Database") -> tuple[Path, Path]:
    d = db.path / STATE_DIR
    return d / "state.safetensors", d / "state.msgpack"


def _fsync_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _save_state(db: "Database", meta: dict, tensors: dict[str, "torch.Tensor"]) -> None:
    """Write the optimizer tensors (safetensors) then the metadata (msgpack), atomically each.

    The safetensors header carries the step, so a crash between the two writes is
    detected on load rather than mixing two checkpoints.
    """
    import msgpack
    from safetensors.torch import save

    st_path, mp_path = _state_paths(db)
    st_path.parent.mkdir(exist_ok=True)
    header = {"format": str(STATE_FORMAT), "step": str(meta["step"]),
              "generation": str(meta["generation"])}
    _fsync_write(st_path, save({k: v.contiguous() for k, v in tensors.items()}, metadata=header))
    _fsync_write(mp_path, msgpack.packb(meta, use_bin_type=True))
    fd = os.open(st_path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load_train_state(db: "Database", *, tensors: bool = True
                     ) -> tuple[dict, dict[str, "torch.Tensor"]] | None:
    """The saved training state ``(meta, optimizer tensors)`` of ``db``, or None."""
    import msgpack

    st_path, mp_path = _state_paths(db)
    if not mp_path.exists():
        return None
    meta = msgpack.unpackb(mp_path.read_bytes(), raw=False, strict_map_key=False)
    if int(meta.get("format", 0)) != STATE_FORMAT:
        raise OperationalError(f"{mp_path} has training-state format {meta.get('format')}, "
                               f"this npmdb reads {STATE_FORMAT}")
    if not tensors:
        return meta, {}
    from safetensors import safe_open

    if not st_path.exists():
        raise OperationalError(f"{st_path} is missing: the training state is incomplete")
    with safe_open(str(st_path), framework="pt") as fh:
        header = fh.metadata() or {}
        if header.get("step") != str(meta["step"]) or \
                header.get("generation") != str(meta["generation"]):
            raise OperationalError(
                f"the training state in {st_path.parent} is torn (optimizer at step "
                f"{header.get('step')}, metadata at step {meta['step']}): train again "
                "without resume")
        out = {k: fh.get_tensor(k) for k in fh.keys()}
    return meta, out


def _optimizer_tensors(opt: "torch.optim.Optimizer", names: dict[int, str]
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


def _load_optimizer_tensors(opt: "torch.optim.Optimizer", params: dict[str, "torch.Tensor"],
                            tensors: dict[str, "torch.Tensor"]) -> None:
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


# --------------------------------------------------------------------------- forward

def _autocast(device: "torch.device"):
    import contextlib

    import torch

    if device.type == "cuda":
        dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.autocast("cuda", dtype=dtype)
    return contextlib.nullcontext()


def _chunks(lengths: list[int], chunk_tokens: int, overhead: int = 96) -> list[list[int]]:
    """Rows grouped into forward passes of <= ``chunk_tokens`` padded tokens.

    Rows are sorted by length and cut where the padded cost ``sum(rows * longest) +
    overhead per pass`` is smallest (dynamic programming over the sorted lengths), so
    short blocks are not padded to a long one's length.
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    ls = [lengths[i] for i in order]
    n = len(ls)
    best = [0.0] + [math.inf] * n   # best[j]: cost of rows order[:j]
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        longest = ls[j - 1]
        for i in range(j - 1, -1, -1):
            rows = j - i
            if rows > 1 and rows * longest > chunk_tokens:
                break
            c = best[i] + rows * longest + overhead
            if c < best[j]:
                best[j], cut[j] = c, i
    out: list[list[int]] = []
    j = n
    while j > 0:
        out.append(order[cut[j]:j])
        j = cut[j]
    return out[::-1]


class _RowEncoder:
    """Encodes a list of variable-length rows in length-sorted chunks."""

    def __init__(self, model: Any, device: "torch.device", pad_id: int, chunk_tokens: int) -> None:
        self.model = model
        self.device = device
        self.pad_id = pad_id
        self.chunk_tokens = chunk_tokens

    def _run(self, ids: list["torch.Tensor"], rows: list[int]) -> "torch.Tensor":
        import torch

        width = max(int(ids[r].numel()) for r in rows)
        x = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        att = torch.zeros((len(rows), width), dtype=torch.long)
        for j, r in enumerate(rows):
            n = int(ids[r].numel())
            x[j, :n] = ids[r]
            att[j, :n] = 1
        with _autocast(self.device):
            out = self.model(input_ids=x.to(self.device),
                             attention_mask=att.to(self.device)).last_hidden_state
        return out

    def plan(self, ids: list["torch.Tensor"]) -> list[list[int]]:
        return _chunks([int(t.numel()) for t in ids], self.chunk_tokens)

    def forward(self, ids: list["torch.Tensor"], plan: list[list[int]], *,
                rng_states: list | None = None) -> list["torch.Tensor"]:
        """Per chunk ``[rows, width, h]`` hidden states (with the graph, if grad is on).

        With ``rng_states`` (a list), the RNG state before each chunk is appended to it.
        """
        outs = []
        for rows in plan:
            if rng_states is not None:
                rng_states.append(_rng_state(self.device))
            outs.append(self._run(ids, rows))
        return outs


def _rng_state(device: "torch.device") -> tuple:
    import torch

    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda


def _set_rng_state(state: tuple, device: "torch.device") -> None:
    import torch

    cpu, cuda = state
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state(cuda, device)


def _assemble(outs: list["torch.Tensor"], plan: list[list[int]], n_rows: int, width: int
              ) -> "torch.Tensor":
    """``[n_rows, width, h]`` from per-chunk outputs (differentiable; padding is zero)."""
    import torch

    h = outs[0].shape[-1]
    full = outs[0].new_zeros((n_rows, width, h))
    for out, rows in zip(outs, plan):
        w = min(out.shape[1], width)
        idx = torch.as_tensor(rows, device=out.device)
        full = full.index_copy(0, idx, torch.nn.functional.pad(out[:, :w], (0, 0, 0, width - w)))
    return full


def _context_loss(objective: str, q_start: "torch.Tensor", q_end: "torch.Tensor",
                  target_hidden: "torch.Tensor", mb: Any, loss_chunk: int | None) -> tuple:
    """NPM's loss with the query's own block added to its candidates as negatives.

    NPM leaves a span's own block out of its candidates (its unmasked encoding holds
    the answer). Here the own block's *visible* tokens (every token but the masked
    span's) join the denominator, so predicting a word the context already shows is
    penalised. Only sound when no visible word equals the answer (``exclude_repeats``).
    Computed with :func:`~npmdb.train.loss.contrastive_nll`, one call per block (the
    own block becomes an ordinary candidate block for that block's queries only), so
    the score matrices add up to the same size as the plain loss's.
    """
    import torch

    from .loss import LossStats, contrastive_nll

    B, Lt = mb.target_valid.shape
    h = target_hidden.shape[-1]
    dev = target_hidden.device
    cand = target_hidden.reshape(B * Lt, h)
    cblock = torch.arange(B, device=dev).repeat_interleave(Lt)
    valid = mb.target_valid.to(dev).reshape(-1)
    M = int(mb.block.numel())
    starts = mb.pos_block.to(dev) * Lt + mb.pos_start.to(dev)
    ends = mb.pos_block.to(dev) * Lt + mb.pos_end.to(dev)
    blocks = mb.block.tolist()
    span_start, span_len = mb.span_start.tolist(), mb.span_len.tolist()
    pos_span = mb.pos_span.to(dev)
    out_s: list = [None] * M
    out_e: list = [None] * M
    for b in sorted(set(blocks)):
        qi = torch.tensor([i for i in range(M) if blocks[i] == b], device=dev)
        cb = cblock.clone()
        cb[b * Lt:(b + 1) * Lt] = -1          # own block: an ordinary candidate block
        cv = valid.clone()
        for i in qi.tolist():                  # ... without the masked spans' tokens
            a = b * Lt + span_start[i] + 1
            cv[a:a + span_len[i]] = False
        sel = torch.isin(pos_span, qi)
        local = torch.searchsorted(qi, pos_span[sel])
        qb = torch.full((len(qi),), b, device=dev)
        rs = contrastive_nll(q_start[qi], qb, cand, cb, local, starts[sel],
                             candidate_valid=cv, chunk_size=loss_chunk)
        re = rs if objective == "token" else contrastive_nll(
            q_end[qi], qb, cand, cb, local, ends[sel], candidate_valid=cv,
            chunk_size=loss_chunk)
        for j, i in enumerate(qi.tolist()):
            out_s[i] = (rs.nll[j], bool(rs.has_positive[j]), bool(rs.correct[j]))
            out_e[i] = (re.nll[j], bool(re.has_positive[j]), bool(re.correct[j]))
    used = [i for i in range(M) if out_s[i][1] and out_e[i][1]]
    if used:
        per = torch.stack([(out_s[i][0] + out_e[i][0]) / 2 for i in used])
        loss = per.mean()
        sl = float(torch.stack([out_s[i][0] for i in used]).detach().mean())
        el = float(torch.stack([out_e[i][0] for i in used]).detach().mean())
        sa = float(np.mean([out_s[i][2] for i in used]))
        ea = float(np.mean([out_e[i][2] for i in used]))
    else:
        loss = q_start.sum() * 0.0 + cand.sum() * 0.0
        sl = el = sa = ea = 0.0
    stats = LossStats(loss=float(loss.detach()), start_loss=sl, end_loss=el,
                      start_accuracy=sa, end_accuracy=ea, num_spans=M, num_used=len(used),
                      num_skipped=M - len(used), num_candidates=int(valid.sum()))
    return loss, stats


def _backward(rows: _RowEncoder, mb: Any, objective: str, *, grad_cache: bool = False,
              loss_chunk: int | None = None, target_grad: bool = True,
              context_negatives: bool = False) -> Any:
    """Encode a masked batch, compute NPM's loss and back-propagate; returns LossStats.

    ``grad_cache``: no graph is kept across chunks (see the module docstring).
    ``target_grad=False`` encodes the unmasked blocks (the candidates) without a graph:
    only the masked side is back-propagated (cheaper, not NPM's objective exactly).
    """
    import contextlib

    import torch

    from .loss import phrase_loss, token_loss

    dev = rows.device
    B = mb.num_blocks
    L, Lt = mb.input_ids.shape[1], mb.target_ids.shape[1]
    am = mb.attention_mask.sum(1).tolist()
    tm = mb.target_attention_mask.sum(1).tolist()
    ids = [mb.input_ids[b, :int(am[b])].cpu() for b in range(B)] + \
          [mb.target_ids[b, :int(tm[b])].cpu() for b in range(B)]
    if target_grad:
        plan = rows.plan(ids)
        grad_chunk = [True] * len(plan)
    else:
        plan_q = rows.plan(ids[:B])
        plan_t = [[B + r for r in c] for c in rows.plan(ids[B:])]
        plan = plan_q + plan_t
        grad_chunk = [True] * len(plan_q) + [False] * len(plan_t)

    def loss_of(outs: list[torch.Tensor]):
        hidden = _assemble(outs, plan, 2 * B, max(L, Lt))
        hq, ht = hidden[:B, :L], hidden[B:, :Lt]
        qs = hq[mb.block, mb.start_mask_pos]
        qe = hq[mb.block, mb.end_mask_pos]
        if context_negatives:
            return _context_loss(objective, qs, qe, ht, mb, loss_chunk)
        if objective == "phrase":
            return phrase_loss(qs, qe, ht, mb, chunk_size=loss_chunk)
        return token_loss(qs, ht, mb, chunk_size=loss_chunk)

    def encode(chunk: list[int], grad: bool) -> torch.Tensor:
        with contextlib.nullcontext() if grad else torch.no_grad():
            return rows.forward(ids, [chunk])[0]

    if not grad_cache:
        loss, stats = loss_of([encode(c, g) for c, g in zip(plan, grad_chunk)])
        loss.backward()
        return stats
    states: list = []
    cached = []
    with torch.no_grad():
        for c in plan:
            states.append(_rng_state(dev))
            cached.append(rows.forward(ids, [c])[0])
    leaves = [x.detach().float().requires_grad_(g) for x, g in zip(cached, grad_chunk)]
    loss, stats = loss_of(leaves)
    loss.backward()
    after_state = _rng_state(dev)
    for leaf, chunk, st in zip(leaves, plan, states):
        if leaf.grad is None:
            continue
        _set_rng_state(st, dev)  # the same dropout masks as in the cached pass
        out = rows.forward(ids, [chunk])[0]
        out.float().backward(leaf.grad)
    _set_rng_state(after_state, dev)
    return stats

# --------------------------------------------------------------------------- helpers

def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ProgrammingError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ProgrammingError(f"{name} must be >= {minimum}, got {value}")
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


def _lr_lambda(total: int, warmup_steps: int) -> Callable[[int], float]:
    def f(step: int) -> float:  # step = optimizer steps taken so far
        if warmup_steps > 0 and step < warmup_steps:
            return (step + 1) / warmup_steps
        return max(0.0, (total - step) / max(1, total - warmup_steps))
    return f


def _progress(total: int, initial: int, enabled: bool | None):
    from tqdm.auto import tqdm

    disable = (not sys.stderr.isatty()) if enabled is None else (not enabled)
    return tqdm(total=total, initial=initial, desc="train", unit="step", disable=disable,
                dynamic_ncols=True, mininterval=0.5)


def _window_mean(xs: list[float], frac: float = 0.1, cap: int = 50) -> float:
    if not xs:
        return float("nan")
    n = max(1, min(cap, int(math.ceil(len(xs) * frac))))
    return float(np.mean(xs[-n:]))


def _curve(steps: list[int], losses: list[float], bins: int = 20) -> tuple[tuple[int, float], ...]:
    if not losses:
        return ()
    edges = np.linspace(0, len(losses), min(bins, len(losses)) + 1).astype(int)
    return tuple((int(steps[b - 1]), float(np.mean(losses[a:b])))
                 for a, b in zip(edges[:-1], edges[1:]) if b > a)


# --------------------------------------------------------------------------- train

_UNSET: Any = object()


def train(
    db: "Database",
    *,
    steps: int | None = None,
    batch_blocks: int | None = None,
    lr: float | None = None,
    objective: str = "phrase",
    refresh_every: int | None = None,
    seed: int = 0,
    resume: bool = False,
    preset: str | None = None,
    group_size: int | None = None,
    grouping: str = "neighbours",
    warmup: float | None = None,
    weight_decay: float | None = None,
    max_grad_norm: float | None = None,
    mask_ratio: float | None = None,
    max_span_len: int = 10,
    clean_edges: bool = True,
    grad_cache: bool = False,
    target_grad: bool | None = None,
    freeze_embeddings: bool | None = None,
    exclude_repeats: bool | None = None,
    context_negatives: bool | None = None,
    chunk_tokens: int = 4096,
    loss_chunk: int | None = None,
    device: str | None = None,
    threads: int | None = None,
    progress: bool | None = None,
    tag_prefix: str = "train-step-",
    log_every: int = 0,
    callback: Callable[[dict], Any] | None = None,
) -> TrainReport:
    """Fine-tune ``db``'s encoder with NPM's objective on its own corpus; refresh embeddings.

    Args:
        db: an open, writable :class:`npmdb.Database` with documents.
        steps: total optimizer steps of the run (with ``resume``: the new total, counted
            from the start of the saved run). Required unless the preset sets it.
        batch_blocks: blocks per batch (>= 2); the in-batch candidates of a span are the
            tokens of the batch's other blocks. Default 16.
        lr: peak AdamW learning rate (linear warm-up over ``warmup`` of the steps, then
            linear decay to 0). Default 3e-5.
        objective: ``"phrase"`` (NPM: span masking, start and end losses) or ``"token"``
            (NPM SINGLE: single tokens, one mask each).
        refresh_every: every this many steps, write an embedding generation from a copy of
            the parameters in the background (tag ``train-step-N``) while training
            continues; 0: only at the end. A final generation is always written and
            becomes HEAD.
        seed: seeds batch sampling, masking and dropout (a run is reproducible).
        resume: continue the run saved with the database's last training generation
            (``<db>/train/``): its hyperparameters, seed, optimizer and sampler state are
            restored; only ``steps`` (the new total) and ``refresh_every`` come from
            this call.
        preset: ``"default"`` or ``"demo"`` (the recipe tuned for the bundled dev-small
            corpus on 2 CPU cores); fills the hyperparameters not passed explicitly.
        group_size: blocks per document group in a batch (seed + neighbours); default 8.
        grouping: ``"neighbours"`` (default: same-document blocks, then BM25 neighbours
            sharing rare words), ``"documents"`` (NPM: same-document blocks, then random
            documents) or ``"random"``.
        warmup: warm-up length as a fraction of ``steps`` (< 1) or a number of steps.
        weight_decay, max_grad_norm: AdamW decay (not on biases and LayerNorm) and the
            gradient-norm clip.
        mask_ratio, max_span_len: masking budget and the longest span (NPM: 0.15, 10).
        clean_edges: mask only spans whose edges are valid phrase edges (no stopword or
            punctuation at either end) — the spans retrieval can return; False: any
            word-aligned span, as in NPM.
        exclude_repeats: never mask a span that starts or ends on a word occurring twice
            or more in its own block, so the answer is never a copy of a word left visible
            in the context (cloze-style fact queries never ask for a word the query already
            names); positives then count every occurrence in the other blocks.
        context_negatives: add each span's own block (its visible tokens, not the masked
            span) to its candidates as negatives — NPM leaves the own block out; this
            teaches the model not to answer with a word the context already shows.
            Needs ``exclude_repeats``.
        target_grad: back-propagate through the unmasked (candidate) encodings too, as
            NPM does (default); False encodes them without a graph (about a third
            cheaper).
        freeze_embeddings: keep the word-embedding matrix fixed (saves the optimizer
            work on the largest tensor).
        grad_cache: compute the step in chunks of ``chunk_tokens`` (padded) tokens with a
            cache of the hidden states (GradCache), so the batch can be larger than
            activation memory allows; exact up to rounding.
        chunk_tokens: padded tokens per forward pass (rows are grouped by length).
        loss_chunk: candidates per chunk of the loss's denominator (memory bound).
        device: ``"cpu"``, ``"cuda"``…; default: CUDA when available (bfloat16 mixed
            precision there), else CPU.
        threads: torch CPU threads (``torch.set_num_threads``, process-wide); default
            ``os.cpu_count()``. On a machine shared with other busy processes, 1 is often
            faster (threads waiting on a descheduled peer spin).
        progress: show a progress bar (loss, steps/s, masked spans per batch); default:
            the database's setting, else when stderr is a terminal.
        tag_prefix: generations are tagged ``f"{tag_prefix}{step}"``.
        log_every, callback: call ``callback(dict)`` with step statistics every
            ``log_every`` steps (every step when 0).

    Returns:
        A :class:`TrainReport`.

    Raises:
        ProgrammingError: invalid arguments, an empty database, nothing to resume.
        OperationalError: the database is read-only, or a refresh failed.
    """
    import torch

    from .masking import mask_spans, mask_tokens

    t_start = time.perf_counter()
    # ---- arguments
    if db is None or not hasattr(db, "snapshot"):
        raise ProgrammingError(f"train() needs an open npmdb.Database, got {type(db).__name__}")
    db._check_open()
    if db.readonly:
        raise OperationalError("cannot train: the database was opened read-only "
                               "(open it with readonly=False)")
    if preset is not None and preset not in PRESETS:
        raise ProgrammingError(f"unknown preset {preset!r}: use one of {sorted(PRESETS)}")
    if not isinstance(resume, bool):
        raise ProgrammingError(f"resume must be True or False, got {resume!r}")
    saved = None
    if resume:
        saved = load_train_state(db)
        if saved is None:
            raise ProgrammingError(f"nothing to resume: {db.path / STATE_DIR} holds no training "
                                   "state (train without resume=True first)")
    explicit = dict(steps=steps, batch_blocks=batch_blocks, lr=lr, group_size=group_size,
                    warmup=warmup, weight_decay=weight_decay, max_grad_norm=max_grad_norm,
                    mask_ratio=mask_ratio, target_grad=target_grad,
                    freeze_embeddings=freeze_embeddings, exclude_repeats=exclude_repeats,
                    context_negatives=context_negatives, refresh_every=refresh_every)
    hp: dict[str, Any] = dict(PRESETS["default"])
    hp["steps"] = None
    if saved is not None:
        hp.update({k: v for k, v in saved[0]["hyper"].items() if k in _PRESET_KEYS})
    elif preset is not None:
        hp.update(PRESETS[preset])
    hp.update({k: v for k, v in explicit.items() if v is not None
               and (saved is None or k in ("steps", "refresh_every"))})
    if hp["steps"] is None:
        raise ProgrammingError("steps is required: train(db, steps=N) (or preset='demo')")
    steps = _check_int("steps", hp["steps"], 1)
    batch_blocks = _check_int("batch_blocks", hp["batch_blocks"], 2)
    group_size = _check_int("group_size", hp["group_size"], 2)
    lr = _check_float("lr", hp["lr"], 0.0, 1.0, lo_open=True)
    warmup_v = _check_float("warmup", hp["warmup"], 0.0)
    weight_decay = _check_float("weight_decay", hp["weight_decay"], 0.0)
    max_grad_norm = _check_float("max_grad_norm", hp["max_grad_norm"], 0.0)
    mask_ratio = _check_float("mask_ratio", hp["mask_ratio"], 0.0, 1.0, lo_open=True)
    target_grad = bool(hp["target_grad"])
    freeze_embeddings = bool(hp["freeze_embeddings"])
    exclude_repeats = bool(hp["exclude_repeats"])
    context_negatives = bool(hp["context_negatives"])
    if context_negatives and not exclude_repeats:
        raise ProgrammingError("context_negatives=True needs exclude_repeats=True (a visible "
                               "copy of the answer would become a negative)")
    if saved is not None:
        s = saved[0]
        objective, seed = s["objective"], int(s["seed"])
        grouping, clean_edges = s["hyper"]["grouping"], bool(s["hyper"]["clean_edges"])
        max_span_len = int(s["hyper"]["max_span_len"])
    if objective not in OBJECTIVES:
        raise ProgrammingError(f"unknown objective {objective!r}: use 'phrase' or 'token'")
    if grouping not in GROUPINGS:
        raise ProgrammingError(f"grouping must be one of {GROUPINGS}, got {grouping!r}")
    refresh_every = _check_int("refresh_every", hp["refresh_every"], 0)
    seed = _check_int("seed", seed, 0)
    max_span_len = _check_int("max_span_len", max_span_len, 1)
    chunk_tokens = _check_int("chunk_tokens", chunk_tokens, 1)
    log_every = _check_int("log_every", log_every, 0)
    if loss_chunk is not None:
        loss_chunk = _check_int("loss_chunk", loss_chunk, 1)
    if threads is not None:
        threads = _check_int("threads", threads, 1)
    if not isinstance(tag_prefix, str):
        raise ProgrammingError("tag_prefix must be a string")
    start_step = int(saved[0]["step"]) if saved is not None else 0
    if start_step >= steps:
        raise ProgrammingError(f"the saved run is already at step {start_step}: pass "
                               f"steps > {start_step} to train further")
    warmup_steps = int(round(warmup_v * steps)) if warmup_v < 1 else int(warmup_v)
    if progress is None:
        progress = db.progress

    # ---- data
    if db.version is None or db.count() == 0:
        raise ProgrammingError("the database has no documents to train on: add some with "
                               "db.add(...)")
    corpus = load_blocks(db)
    if corpus.num_blocks < 2:
        raise ProgrammingError("training needs at least 2 blocks in the database")
    sampler = BatchSampler(corpus, batch_blocks=batch_blocks, group_size=group_size,
                           grouping=grouping, seed=seed)
    if saved is not None:
        sampler.load_state(saved[0]["sampler"])

    # ---- model
    torch.set_num_threads(threads or max(1, os.cpu_count() or 1))
    dev = torch.device(device) if device else torch.device(
        "cuda" if torch.cuda.is_available() else "cpu")
    start_gen = int(saved[0]["generation"]) if saved is not None else corpus.generation
    base = db.encoder_for(start_gen)
    mask_id, cls_id, sep_id, pad_id = base.mask_id, base.cls_id, base.sep_id, base.pad_id
    max_length = base.max_positions
    model = copy.deepcopy(base.model).to(dev)
    model.train()
    for p in model.parameters():
        p.requires_grad_(True)
    if freeze_embeddings:
        model.get_input_embeddings().weight.requires_grad_(False)
    named = {n: p for n, p in model.named_parameters() if p.requires_grad}
    names = {id(p): n for n, p in named.items()}
    no_decay = [p for n, p in named.items() if n.endswith("bias") or "LayerNorm" in n
                or "layer_norm" in n or p.dim() < 2]
    decay = [p for n, p in named.items() if not any(p is q for q in no_decay)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=lr,
                            betas=(0.9, 0.98), eps=1e-6)
    if saved is not None:
        _load_optimizer_tensors(opt, named, saved[1])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda(steps, warmup_steps))
    sched.last_epoch = start_step  # fast-forward the schedule
    for g, f in zip(opt.param_groups, sched.lr_lambdas):
        g["lr"] = g["initial_lr"] * f(start_step)
    rows = _RowEncoder(model, dev, pad_id, chunk_tokens)

    hyper = dict(batch_blocks=batch_blocks, lr=lr, group_size=group_size, warmup=warmup_v,
                 weight_decay=weight_decay, max_grad_norm=max_grad_norm,
                 mask_ratio=mask_ratio, grouping=grouping, clean_edges=clean_edges,
                 max_span_len=max_span_len, target_grad=target_grad,
                 freeze_embeddings=freeze_embeddings, exclude_repeats=exclude_repeats,
                 context_negatives=context_negatives, refresh_every=refresh_every)

    # ---- loop state
    losses: list[float] = []
    loss_steps: list[int] = []
    accs: list[float] = []
    spans_hist: list[int] = []
    pos_hist: list[float] = []
    skipped = 0
    copy_seconds = 0.0

    def snapshot_job(step: int) -> RefreshJob:
        nonlocal copy_seconds
        t = time.perf_counter()
        cpu_model = copy.deepcopy(model).to("cpu").eval()
        for p in cpu_model.parameters():
            p.requires_grad_(False)
        meta = {"format": STATE_FORMAT, "step": step, "steps_total": steps, "seed": seed,
                "objective": objective, "hyper": hyper, "sampler": sampler.state(),
                "start_generation": start_gen, "time": time.time()}
        opt_tensors = _optimizer_tensors(opt, names)
        tag = f"{tag_prefix}{step}" if tag_prefix else None

        def after(vid: int, gen: int) -> None:
            _save_state(db, dict(meta, generation=gen, version=vid), opt_tensors)

        info = {"objective": objective, "step": step, "steps_total": steps, "seed": seed,
                "lr": lr, "batch_blocks": batch_blocks}
        job = RefreshJob(cpu_model, step, tag,
                         f"trained encoder, step {step}/{steps} ({objective} objective)",
                         info, after)
        copy_seconds += time.perf_counter() - t  # copying is refresh overhead
        return job

    bar = _progress(steps, start_step, progress)
    step = start_step
    with contextlib.ExitStack() as stack:
        stack.callback(bar.close)
        refresher = stack.enter_context(Refresher(db))
        t_loop = time.perf_counter()
        while step < steps:
            refresher.check()
            rng = np.random.default_rng([seed, step, 0xB47C])
            torch.manual_seed(int(seed * 1_000_003 + step) % (2 ** 63))
            # ---- batch (retry a few times if nothing could be masked)
            mb = None
            for _attempt in range(8):
                blocks = sampler.next_batch(rng)
                toks, ws, we, docs = sampler.arrays(blocks, clean_edges=clean_edges,
                                                    exclude_repeats=exclude_repeats)
                if objective == "phrase":
                    mb = mask_spans(toks, ws, we, docs, mask_id=mask_id, cls_id=cls_id,
                                    sep_id=sep_id, pad_id=pad_id, rng=rng,
                                    mask_ratio=mask_ratio, max_span_len=max_span_len,
                                    max_length=max_length,
                                    boundary_positives=not exclude_repeats)
                else:
                    mb = mask_tokens(toks, ws, we, docs, mask_id=mask_id, cls_id=cls_id,
                                     sep_id=sep_id, pad_id=pad_id, rng=rng,
                                     mask_ratio=mask_ratio, whole_words=clean_edges,
                                     max_length=max_length)
                if mb.num_spans > 0:
                    break
                skipped += 1
            assert mb is not None
            # ---- forward / backward
            opt.zero_grad(set_to_none=True)
            stats = _backward(rows, mb.to(dev), objective, grad_cache=grad_cache,
                              loss_chunk=loss_chunk, target_grad=target_grad,
                              context_negatives=context_negatives)
            if max_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
            opt.step()
            sched.step()
            step += 1
            # ---- bookkeeping
            lv = float(stats.loss)
            if not math.isfinite(lv):
                raise OperationalError(f"the training loss became {lv} at step {step}: lower "
                                       "the learning rate")
            if stats.num_used:
                losses.append(lv)
                loss_steps.append(step)
                accs.append((stats.start_accuracy + stats.end_accuracy) / 2)
            spans_hist.append(mb.num_spans)
            pos_hist.append(mb.num_positives / max(1, mb.num_spans))
            elapsed = time.perf_counter() - t_loop
            bar.update(1)
            if bar.n % 5 == 0 or step == steps:
                bar.set_postfix(ordered_dict={
                    "loss": f"{_window_mean(losses, 1.0, 20):.3f}",
                    "acc": f"{_window_mean(accs, 1.0, 20):.2f}",
                    "spans": f"{np.mean(spans_hist[-20:]):.1f}",
                    "gens": len(refresher.done),
                    "refresh": "busy" if refresher.busy else "idle"}, refresh=False)
            if callback is not None and (log_every == 0 or step % log_every == 0 or step == steps):
                callback({"step": step, "loss": lv, "start_accuracy": stats.start_accuracy,
                          "end_accuracy": stats.end_accuracy, "spans": mb.num_spans,
                          "positives": mb.num_positives, "lr": float(sched.get_last_lr()[0]),
                          "seconds": elapsed, "generations": len(refresher.done)})
            # ---- refresh
            if refresh_every and step % refresh_every == 0 and step < steps:
                refresher.submit(snapshot_job(step))
        train_time = time.perf_counter() - t_loop - copy_seconds
        refresher.submit(snapshot_job(steps))  # the final generation becomes HEAD
        bar.set_postfix(ordered_dict={"loss": f"{_window_mean(losses, 1.0, 20):.3f}",
                                      "refresh": "final"})
        refresher.close(drain=True)
        done = list(refresher.done)
        dropped = refresher.dropped

    with db.env.read() as txn:
        from npmdb.storage import versions as V
        head = V.head(txn, db.env.dbs)
    n0 = max(1, min(50, int(math.ceil(len(losses) * 0.1)))) if losses else 1
    return TrainReport(
        steps=step, steps_run=step - start_step, objective=objective,
        final_loss=_window_mean(losses), first_loss=float(np.mean(losses[:n0])) if losses else
        float("nan"), final_accuracy=_window_mean(accs), loss_curve=_curve(loss_steps, losses),
        seconds=time.perf_counter() - t_start, train_seconds=max(train_time, 1e-9),
        spans_per_batch=float(np.mean(spans_hist)) if spans_hist else 0.0,
        positives_per_span=float(np.mean(pos_hist)) if pos_hist else 0.0,
        skipped_batches=skipped, versions=tuple(d.version for d in done),
        generations=tuple(d.generation for d in done),
        tags=tuple(d.tag for d in done if d.tag), head_version=head.id if head else None,
        head_generation=head.generation if head else None, device=str(dev),
        resumed_from=start_step if saved is not None else None, refreshes_dropped=dropped,
        config=dict(hyper, steps=steps, objective=objective, seed=seed,
                    refresh_every=refresh_every, grad_cache=grad_cache, preset=preset),
    )
