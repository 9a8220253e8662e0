"""``npmdb.train``: fine-tune the database's encoder with NPM's objective, refreshing as in REALM.

:func:`train` runs as a sequence of stages:

1. check the database and resolve the configuration (:mod:`npmdb.train.state`: presets,
   the saved run when resuming, explicit arguments last);
2. load HEAD's corpus as blocks and a :class:`~npmdb.train.batches.BatchSampler`;
3. copy the encoder into a :class:`~npmdb.train.step.Stepper` (AdamW, warm-up and
   decay) and run the loop: each step draws and masks a batch and takes one optimisation
   step (:mod:`npmdb.train.step`), with a progress bar and an optional callback;
4. every ``refresh_every`` steps a CPU copy of the parameters goes to a background thread
   (:class:`~npmdb.train.refresh.Refresher`) that writes a new embedding generation and
   version (tag ``train-step-N``) through ``db.write_generation`` while training
   continues; a final generation is always written at the end and becomes HEAD. With
   each generation the trainer's own state is saved under ``<db>/train/``, so
   ``train(db, steps=N, resume=True)`` continues from the last generation written;
5. report what was done (:class:`~npmdb.train.report.TrainReport`).
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from typing import TYPE_CHECKING, Any, Callable, Iterator

from npmdb.arguments import check_device
from npmdb.errors import DataError, NotSupportedError, OperationalError, ProgrammingError

from .batches import BatchSampler, load_blocks
from .lock import run_lock
from .reversals import with_pair_reversals
from .refresh import Refresher, RefreshDone, RefreshJob
from .report import History, TrainReport
from .state import (
    PRESETS, STATE_DIR, Checkpoint, TrainConfig, check_state_dir, load_train_state,
    resolve_config, run_meta, save_checkpoint, saved_run,
)
from .prefetch import BatchSource
from .step import Stepper, seed_step

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from npmdb.database import Database
    from npmdb.encoder import Encoder

__all__ = ["train", "TrainReport", "PRESETS", "STATE_DIR", "load_train_state"]


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
    span_unit: str = "token",
    span_length_p: float = 0.5,
    reverse_pairs: bool = False,
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
    max_seconds: float | None = None,
    prefetch: bool = False,
) -> TrainReport:
    """Fine-tune ``db``'s encoder with NPM's objective on its own corpus; refresh embeddings.

    Args:
        db: an open, writable :class:`npmdb.Database` with documents.
        steps: total optimizer steps of the run (with ``resume``: the new total, counted
            from the start of the saved run; by default the saved run's planned total, so
            a run ``max_seconds`` stopped continues to it). Required unless the preset
            sets it.
        batch_blocks: blocks per batch (>= 2); the in-batch candidates of a span are the
            tokens of the batch's other blocks. Default 16.
        lr: peak AdamW learning rate (linear warm-up over ``warmup`` of the steps, then
            linear decay to 0). Default 3e-5.
        objective: ``"phrase"`` (NPM: span masking, start and end losses), ``"token"``
            (NPM SINGLE: single tokens, one mask each) or ``"mixed"`` (each batch one or
            the other, with even odds).
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
        warmup: warm-up length as a fraction of ``steps`` (< 1) or a number of steps (at
            most ``steps``: the learning rate must reach its peak).
        weight_decay, max_grad_norm: AdamW decay (not on biases and LayerNorm) and the
            gradient-norm clip.
        mask_ratio, max_span_len: masking budget and the longest span (NPM: 0.15, 10).
        span_unit: ``"token"`` (NPM) or ``"word"``: span lengths and the budget counted in
            words, at least one word per block of two or more (see
            :func:`npmdb.train.masking.mask_spans`), so a word the tokenizer cuts into
            many pieces, or one in a short block, can be a target.
        span_length_p: span lengths are drawn from ``Geometric(span_length_p)``, clipped
            at ``max_span_len`` (NPM: 0.5, a mean near 2; SpanBERT's 0.2 gives longer
            spans).
        reverse_pairs: read each one-block document ``HEAD: GLOSS`` whose sides are short
            (a bilingual dictionary entry) both ways: training adds ``GLOSS: HEAD`` as a
            second block of that document (the database is not changed), so a word that
            occurs once in the corpus can be a target (:mod:`npmdb.train.reversals`).
            Off by default (NPM trains on the text as it is).
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
        progress: show a progress bar (loss, steps/s, masked spans per batch): True or
            False; default (None): the database's setting, else when stderr is a terminal.
        tag_prefix: generations are tagged ``f"{tag_prefix}{step}"``. These tags name
            the latest run's steps: a later run with the same prefix moves them to its own
            versions (unlike ``db.tag``, which refuses without ``move=True``), so a run's
            result that must survive ``vacuum`` wants a tag of its own.
        log_every, callback: call ``callback(dict)`` with step statistics every
            ``log_every`` steps (every step when 0).
        max_seconds: a time budget: stop taking steps once this many seconds of the loop
            have passed, and write the final generation at the step reached (the
            learning-rate schedule stays planned for ``steps``, so a run stopped early
            ends before its decay does; ``resume`` can continue it).
        prefetch: draw and mask the next batch in a background thread while the current
            step runs (:mod:`npmdb.train.prefetch`; the same batches, so the same run).
            Off by default: measured on an H100 it was slower (3.05 against 3.67 steps/s
            of 256 blocks), the masking thread and the step's kernel launches taking turns
            at the interpreter lock; on the CPU both compete for the same cores too.

    Returns:
        A :class:`TrainReport`.

    Raises:
        ProgrammingError: invalid arguments, an empty database, nothing to resume.
        OperationalError: the database is read-only, ``<db>/train/`` cannot hold the
            training state, the saved state is damaged or its generation was vacuumed,
            or a refresh (or saving the state after it) failed.
    """
    t_start = time.perf_counter()
    _check_writable(db)
    if max_seconds is not None and (isinstance(max_seconds, bool)
                                    or not isinstance(max_seconds, (int, float))
                                    or not max_seconds > 0):
        raise ProgrammingError(f"max_seconds must be a positive number of seconds, "
                               f"got {max_seconds!r}")
    if not isinstance(prefetch, bool):
        raise ProgrammingError(f"prefetch must be True or False, got {prefetch!r}")
    if progress is not None and not isinstance(progress, bool):  # "no" would show the bar
        raise ProgrammingError(f"progress must be True or False (or None: the database's "
                               f"setting), got {progress!r}")
    if callback is not None and not callable(callback):
        raise ProgrammingError(f"callback must be a function taking a dict of step "
                               f"statistics, got {callback!r}")
    with _one_run(db):
        saved = saved_run(db, preset=preset, resume=resume)
        cfg = resolve_config(dict(
            steps=steps, batch_blocks=batch_blocks, lr=lr, group_size=group_size,
            warmup=warmup,
            weight_decay=weight_decay, max_grad_norm=max_grad_norm, mask_ratio=mask_ratio,
            target_grad=target_grad, freeze_embeddings=freeze_embeddings,
            exclude_repeats=exclude_repeats, context_negatives=context_negatives,
            refresh_every=refresh_every, objective=objective, seed=seed, grouping=grouping,
            clean_edges=clean_edges, max_span_len=max_span_len, span_unit=span_unit,
            span_length_p=span_length_p, reverse_pairs=reverse_pairs,
            grad_cache=grad_cache, chunk_tokens=chunk_tokens, loss_chunk=loss_chunk,
            threads=threads,
            tag_prefix=tag_prefix, log_every=log_every), preset=preset, saved=saved)
        # each refresh saves the state there after its commit: a failure then would end the
        # run after the version committed, losing the steps since
        check_state_dir(db)
        if progress is None:
            progress = db.progress
        sampler, start_gen = _sampler(db, cfg, saved)
        dev = _device(device, cfg.threads)
        encoder = db.encoder_for(start_gen)
        stepper = Stepper(encoder, cfg, dev, saved)
        run = _Run(db, cfg, stepper, sampler, encoder, start_gen,
                   prefetch=prefetch)
        done, dropped = run.loop(progress, callback, max_seconds)
        head = next((v for v in db.versions() if v["head"]), None)
        return TrainReport(
            steps=run.step, steps_run=run.step - cfg.start_step, objective=cfg.objective,
            **run.history.summary(), seconds=time.perf_counter() - t_start,
            train_seconds=max(run.train_seconds, 1e-9),
            versions=tuple(d.version for d in done),
            generations=tuple(d.generation for d in done),
            tags=tuple(d.tag for d in done if d.tag),
            head_version=head["id"] if head else None,
            head_generation=head["generation"] if head else None, device=str(dev),
            resumed_from=cfg.start_step if saved is not None else None,
            refreshes_dropped=dropped, config=cfg.summary())


# --------------------------------------------------------------------------- stages

def _check_writable(db: "Database") -> None:
    if db is None or not hasattr(db, "snapshot"):
        raise ProgrammingError(f"train() needs an open npmdb.Database, got {type(db).__name__}")
    db.version  # noqa: B018 - a closed database raises InterfaceError here
    if db.readonly:
        raise OperationalError("cannot train: the database was opened read-only "
                               "(open it with readonly=False)")
    if db._writing().in_batch:  # its refreshes commit versions: they would wait on the batch
        raise ProgrammingError("cannot train inside db.batch(): training commits versions of "
                               "its own; train after the batch")
    # another process's writer now fails (or waits, per the handle's timeout) here, before
    # the first step; a refresh later waits for one (generations.REFRESH_LOCK_WAIT)
    with db._writing().hold():
        pass


@contextlib.contextmanager
def _one_run(db: "Database") -> Iterator[None]:
    """One training run on a database at a time (:mod:`npmdb.train.lock`): two runs both
    stepped, their versions alternated at HEAD (each its own encoder), the second moved the
    first's step tags, and both wrote the one saved state."""
    with contextlib.ExitStack() as stack:
        try:
            holder = stack.enter_context(run_lock(db.path))
        except OSError as exc:
            raise OperationalError(f"cannot train: cannot open the training lock in "
                                   f"{db.path} ({exc})") from exc
        if holder is not None:
            raise OperationalError(
                f"cannot train: another training run is going on {db.path}"
                + (f" (pid {holder})" if holder.isdigit() else "") + "; wait for it to end "
                "(or stop it), then train, or resume it")
        yield


def _sampler(db: "Database", cfg: TrainConfig, saved: Checkpoint | None
             ) -> tuple[BatchSampler, int]:
    """HEAD's corpus as a batch sampler (at the saved position when resuming), and the
    generation whose encoder training starts from."""
    if db.version is None or db.count() == 0:
        raise ProgrammingError("the database has no documents to train on: add some with "
                               "db.add(...)")
    corpus = load_blocks(db)
    if cfg.reverse_pairs:
        tok = db.encoder_for(corpus.generation).tokenizer
        sep_id = tok.convert_tokens_to_ids(":")
        if sep_id is None or sep_id == tok.unk_token_id:
            raise NotSupportedError("reverse_pairs needs a tokenizer that has ':' as a token "
                                    "of its own; this encoder's has not: train without it")
        corpus, _ = with_pair_reversals(corpus, int(sep_id))
    if corpus.num_blocks < 2:
        raise ProgrammingError("training needs at least 2 blocks in the database")
    sampler = BatchSampler(corpus, batch_blocks=cfg.batch_blocks, group_size=cfg.group_size,
                           grouping=cfg.grouping, seed=cfg.seed)
    if saved is None:
        return sampler, corpus.generation
    sampler.load_state(saved.meta["sampler"])
    return sampler, saved.generation


def _device(device: str | None, threads: int | None) -> "torch.device":
    """The training device (CUDA when available); sets torch's CPU threads."""
    import torch

    torch.set_num_threads(threads or max(1, os.cpu_count() or 1))
    if not device:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(check_device(device))


class _Run:
    """One call's loop: steps, progress, callbacks and background refreshes."""

    def __init__(self, db: "Database", cfg: TrainConfig, stepper: Stepper,
                 sampler: BatchSampler, encoder: "Encoder", start_generation: int,
                 prefetch: bool = False) -> None:
        self.db, self.cfg, self.stepper, self.sampler = db, cfg, stepper, sampler
        self.prefetch = prefetch
        # the sampler's position after the last batch trained on (a checkpoint records it;
        # with prefetch the sampler itself is a batch ahead)
        self.sampler_state = sampler.state()
        self.encoder = encoder
        self.start_generation = start_generation
        self.history = History()
        self.step = cfg.start_step
        self.train_seconds = 0.0
        self._copy_seconds = 0.0

    def loop(self, progress: bool | None, callback: Callable[[dict], Any] | None,
             max_seconds: float | None = None) -> tuple[list[RefreshDone], int]:
        """Train to ``cfg.steps`` (or until ``max_seconds`` have passed); returns the
        refreshes committed and those dropped."""
        cfg, history = self.cfg, self.history
        bar = _progress(cfg.steps, self.step, progress)
        with contextlib.ExitStack() as stack:
            stack.callback(bar.close)
            refresher = stack.enter_context(Refresher(self.db))
            batches = stack.enter_context(BatchSource(self.sampler, cfg, self.encoder,
                                                      self.step, ahead=self.prefetch))
            t_loop = time.perf_counter()
            deadline = math.inf if max_seconds is None else t_loop + max_seconds
            while self.step < cfg.steps and time.perf_counter() < deadline:
                refresher.check()
                drawn = batches.next()
                mb = drawn.batch
                if mb.num_spans == 0 and not history.spans:  # before anything is committed
                    raise DataError(
                        f"nothing to train on: {drawn.skipped} batches of "
                        f"{cfg.batch_blocks} blocks held no {cfg.objective} target (a "
                        "masked span needs the same words in another block of the batch); "
                        "add more documents, or documents that share phrases")
                history.skipped += drawn.skipped
                seed_step(cfg.seed, self.step)
                stats = self.stepper.step(mb)
                self.step += 1
                self.sampler_state = drawn.sampler_state
                step = self.step
                lv = history.record(step, stats, mb)
                elapsed = time.perf_counter() - t_loop
                bar.update(1)
                if bar.n % 5 == 0 or step == cfg.steps:
                    bar.set_postfix(ordered_dict=dict(
                        history.recent(), gens=len(refresher.done),
                        refresh="busy" if refresher.busy else "idle"), refresh=False)
                if callback is not None and (cfg.log_every == 0 or step % cfg.log_every == 0
                                             or step == cfg.steps):
                    callback({"step": step, "loss": lv, "start_accuracy": stats.start_accuracy,
                              "end_accuracy": stats.end_accuracy, "spans": mb.num_spans,
                              "positives": mb.num_positives, "lr": self.stepper.lr,
                              "seconds": elapsed,
                              "generations": len(refresher.done)})
                if cfg.refresh_every and step % cfg.refresh_every == 0 and step < cfg.steps:
                    refresher.submit(self._refresh_job(step))
            self.train_seconds = time.perf_counter() - t_loop - self._copy_seconds
            refresher.submit(self._refresh_job(self.step))  # the final generation: HEAD
            bar.set_postfix(ordered_dict={"loss": history.recent()["loss"],
                                          "refresh": "final"})
            refresher.close(drain=True)
            return list(refresher.done), refresher.dropped

    def _refresh_job(self, step: int) -> RefreshJob:
        """A copy of the model at ``step`` to write as a generation, then save the state."""
        cfg = self.cfg
        t = time.perf_counter()
        model = self.stepper.model_copy()
        meta = run_meta(cfg, step=step, sampler=self.sampler_state,
                        start_generation=self.start_generation)
        opt_tensors = self.stepper.optimizer_state()
        tag = f"{cfg.tag_prefix}{step}" if cfg.tag_prefix else None

        def after(vid: int, gen: int) -> None:
            save_checkpoint(self.db, dict(meta, generation=gen, version=vid), opt_tensors)

        info = {"objective": cfg.objective, "step": step, "steps_total": cfg.steps,
                "seed": cfg.seed, "lr": cfg.lr, "batch_blocks": cfg.batch_blocks}
        job = RefreshJob(model, step, tag,
                         f"trained encoder, step {step}/{cfg.steps} ({cfg.objective} objective)",
                         info, after, after_what="saving the training state (what resume "
                         f"continues from) in {self.db.path / STATE_DIR}")
        self._copy_seconds += time.perf_counter() - t  # copying is refresh overhead
        return job


def _progress(total: int, initial: int, enabled: bool | None):
    from tqdm.auto import tqdm

    disable = (not sys.stderr.isatty()) if enabled is None else (not enabled)
    return tqdm(total=total, initial=initial, desc="train", unit="step", disable=disable,
                dynamic_ncols=True, mininterval=0.5)
