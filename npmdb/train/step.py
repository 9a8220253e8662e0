"""One optimisation step of NPM's objective (DESIGN.md section 5; Min et al. 2023, §3.2).

:func:`draw_batch` draws ``batch_blocks`` blocks from the
:class:`~npmdb.train.batches.BatchSampler` and masks them
(:func:`~npmdb.train.masking.mask_spans`, or :func:`~npmdb.train.masking.mask_tokens` for
the token objective), drawing again when nothing could be masked. :class:`Stepper` holds
the trainable copy of the encoder with its AdamW optimizer (linear warm-up, then linear
decay to zero) and takes the step: :func:`backward` encodes the masked blocks (queries
``q_s``/``q_e`` at the two mask tokens) and the unmasked blocks (candidates: every other
block's tokens), computes :func:`~npmdb.train.loss.phrase_loss` /
:func:`~npmdb.train.loss.token_loss` and back-propagates; then the gradient norm is
clipped and the optimizer steps.

With ``grad_cache=True`` all hidden states are first computed without a graph, the
loss's gradient with respect to them is taken, then each chunk of rows is re-encoded
(same dropout masks: its RNG state is replayed) and back-propagated with that gradient
(GradCache; Gao et al. 2021). The result equals the one-graph step up to float rounding.
"""

from __future__ import annotations

import contextlib
import copy
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from .rows import RowEncoder, assemble, rng_state, set_rng_state
from .state import Checkpoint, TrainConfig, load_optimizer_tensors, optimizer_tensors

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from npmdb.encoder import Encoder

    from .batches import BatchSampler
    from .loss import LossStats
    from .masking import MaskedBatch

__all__ = ["Stepper", "draw_batch", "batch_objective", "seed_step", "batch_rng", "backward", "context_loss"]


def seed_step(seed: int, step: int) -> None:
    """Seeds torch (dropout) for ``step``: call it in the thread that takes the step."""
    import torch

    torch.manual_seed(int(seed * 1_000_003 + step) % (2 ** 63))


def batch_rng(seed: int, step: int) -> np.random.Generator:
    """``step``'s sampling / masking generator (touches no global state: any thread)."""
    return np.random.default_rng([seed, step, 0xB47C])


def batch_objective(objective: str, rng: np.random.Generator) -> str:
    """The objective of one batch: ``objective`` itself, or for ``"mixed"`` phrase or
    token with even odds (drawn from the batch's own generator, so a resumed run draws
    the same)."""
    if objective != "mixed":
        return objective
    return "token" if rng.random() < 0.5 else "phrase"


def draw_batch(sampler: "BatchSampler", rng: np.random.Generator, cfg: TrainConfig,
               encoder: "Encoder", *, attempts: int = 8) -> tuple["MaskedBatch", int]:
    """A masked batch, and how many draws had nothing to mask (up to ``attempts`` draws)."""
    from .masking import mask_spans, mask_tokens

    mb = None
    skipped = 0
    special = dict(mask_id=encoder.mask_id, cls_id=encoder.cls_id, sep_id=encoder.sep_id,
                   pad_id=encoder.pad_id, rng=rng, mask_ratio=cfg.mask_ratio,
                   max_length=encoder.max_positions)
    objective = batch_objective(cfg.objective, rng)
    for _attempt in range(attempts):
        blocks = sampler.next_batch(rng)
        toks, ws, we, docs = sampler.arrays(blocks, clean_edges=cfg.clean_edges,
                                            exclude_repeats=cfg.exclude_repeats)
        if objective == "phrase":
            mb = mask_spans(toks, ws, we, docs, max_span_len=cfg.max_span_len,
                            span_unit=cfg.span_unit, geometric_p=cfg.span_length_p,
                            boundary_positives=not cfg.exclude_repeats, **special)
        else:
            mb = mask_tokens(toks, ws, we, docs, whole_words=cfg.clean_edges, **special)
        if mb.num_spans > 0:
            break
        skipped += 1
    assert mb is not None
    return mb, skipped


class Stepper:
    """A trainable copy of ``encoder``'s model on ``device`` with AdamW and its schedule,
    restored from ``saved`` when resuming; :meth:`step` takes one optimisation step."""

    def __init__(self, encoder: "Encoder", cfg: TrainConfig, device: "torch.device",
                 saved: Checkpoint | None = None) -> None:
        import torch

        self.cfg = cfg
        self.device = device
        model = copy.deepcopy(encoder.model).to(device)
        model.train()
        for p in model.parameters():
            p.requires_grad_(True)
        if cfg.freeze_embeddings:
            model.get_input_embeddings().weight.requires_grad_(False)
        named = {n: p for n, p in model.named_parameters() if p.requires_grad}
        self._names = {id(p): n for n, p in named.items()}
        no_decay = [p for n, p in named.items() if n.endswith("bias") or "LayerNorm" in n
                    or "layer_norm" in n or p.dim() < 2]
        decay = [p for n, p in named.items() if not any(p is q for q in no_decay)]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                                 {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr,
                                betas=(0.9, 0.98), eps=1e-6)
        if saved is not None:
            load_optimizer_tensors(opt, named, saved.optimizer)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda(cfg.steps, cfg.warmup_steps))
        sched.last_epoch = cfg.start_step  # fast-forward the schedule
        for g, f in zip(opt.param_groups, sched.lr_lambdas):
            g["lr"] = g["initial_lr"] * f(cfg.start_step)
        self.model, self.optimizer, self.schedule = model, opt, sched
        self.rows = RowEncoder(model, device, encoder.pad_id, cfg.chunk_tokens)

    def step(self, mb: "MaskedBatch") -> "LossStats":
        """Forward, loss, backward, clip, AdamW and schedule step on the batch ``mb``."""
        import torch

        cfg = self.cfg
        self.optimizer.zero_grad(set_to_none=True)
        stats = backward(self.rows, mb.to(self.device), mb.mode, grad_cache=cfg.grad_cache,
                         loss_chunk=cfg.loss_chunk, target_grad=cfg.target_grad,
                         context_negatives=cfg.context_negatives)
        if cfg.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
        self.optimizer.step()
        self.schedule.step()
        return stats

    @property
    def lr(self) -> float:
        """The learning rate of the next step."""
        return float(self.schedule.get_last_lr()[0])

    def model_copy(self) -> Any:
        """A frozen CPU copy of the model in eval mode (training goes on updating its own)."""
        cpu_model = copy.deepcopy(self.model).to("cpu").eval()
        for p in cpu_model.parameters():
            p.requires_grad_(False)
        return cpu_model

    def optimizer_state(self) -> dict[str, "torch.Tensor"]:
        """CPU copies of the optimizer's state, by parameter name (see ``state``)."""
        return optimizer_tensors(self.optimizer, self._names)


def _lr_lambda(total: int, warmup_steps: int) -> Callable[[int], float]:
    def f(step: int) -> float:  # step = optimizer steps taken so far
        if warmup_steps > 0 and step < warmup_steps:
            return (step + 1) / warmup_steps
        return max(0.0, (total - step) / max(1, total - warmup_steps))
    return f


def context_loss(objective: str, q_start: "torch.Tensor", q_end: "torch.Tensor",
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


def backward(rows: RowEncoder, mb: Any, objective: str, *, grad_cache: bool = False,
              loss_chunk: int | None = None, target_grad: bool = True,
              context_negatives: bool = False) -> Any:
    """Encode a masked batch, compute NPM's loss and back-propagate; returns LossStats.

    ``grad_cache``: no graph is kept across chunks (see the module docstring).
    ``target_grad=False`` encodes the unmasked blocks (the candidates) without a graph:
    only the masked side is back-propagated (cheaper, not NPM's objective exactly).
    """
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
        hidden = assemble(outs, plan, 2 * B, max(L, Lt))
        hq, ht = hidden[:B, :L], hidden[B:, :Lt]
        qs = hq[mb.block, mb.start_mask_pos]
        qe = hq[mb.block, mb.end_mask_pos]
        if context_negatives:
            return context_loss(objective, qs, qe, ht, mb, loss_chunk)
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
            states.append(rng_state(dev))
            cached.append(rows.forward(ids, [c])[0])
    leaves = [x.detach().float().requires_grad_(g) for x, g in zip(cached, grad_chunk)]
    loss, stats = loss_of(leaves)
    loss.backward()
    after_state = rng_state(dev)
    for leaf, chunk, st in zip(leaves, plan, states):
        if leaf.grad is None:
            continue
        set_rng_state(st, dev)  # the same dropout masks as in the cached pass
        out = rows.forward(ids, [chunk])[0]
        out.float().backward(leaf.grad)
    set_rng_state(after_state, dev)
    return stats
