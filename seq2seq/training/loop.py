"""The training loop: prepared data → model → jit'd step → checkpoints/metrics (``fit``).

Rerunning on the same working directory resumes from the latest checkpoint: the step, optimizer
state (and so the learning-rate schedule), RNG, data position (micro-batches consumed), counters
and the best-checkpoint / early-stopping bookkeeping all continue, so a resumed run computes
bitwise the same parameters as an uninterrupted one. SIGINT/SIGTERM finish the current step
(and an evaluation due at it), save a checkpoint and exit; with several processes, a signal to
any one of them stops all of them after the same step (``seq2seq.sharding.agree_to_stop``).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import numpy as np
from tqdm.auto import tqdm

from seq2seq.config import Config
from seq2seq.data.pipeline import PreparedData
from seq2seq.sharding import Partitioner, agree_to_stop, is_main_process
from seq2seq.training.actions import Action, Loop, default_actions
from seq2seq.training.batches import Prefetcher, remap_position
from seq2seq.training.checkpoints import Checkpointer, discarded_message
from seq2seq.training.context import TrainContext, train_context
from seq2seq.training.early_stopping import MODES, BestTracker
from seq2seq.training.init_from import resolve_parent
from seq2seq.training.metrics import MetricsWriter
from seq2seq.training.progress import Progress, SkipCounter, load_or_init
from seq2seq.training.step import make_eval_step, train_size
from seq2seq.workdir import checkpoint_dir

log = logging.getLogger(__name__)

# Dev BLEU, given by the run layer: (params, graphdef, partitioner) → {"bleu", "chrf",
# "bleu_sentences"}; training itself never decodes.
DevBleu = Callable[[Any, Any, Partitioner], dict[str, float]]


class Interrupted(Exception):
    """Training stopped on SIGINT/SIGTERM after saving a checkpoint at ``step``.

    Attributes:
      step: the step of the saved checkpoint.
      signum: the signal that stopped training (``signal.SIGINT`` or ``signal.SIGTERM``); the
        command exits with 128 + signum, the shell convention (130 and 143).
    """

    def __init__(self, step: int, signum: int = signal.SIGINT):
        super().__init__(
            f"interrupted at step {step}; checkpoint saved, rerun the same command to resume"
        )
        self.step = step
        self.signum = int(signum)


class _StopFlag:
    """Turns SIGINT/SIGTERM into a flag checked between steps (restores handlers on exit)."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def __enter__(self):
        self._old = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def _handle(self, signum, frame):
        if self.signum is not None:  # second signal: stop now
            raise KeyboardInterrupt
        self.signum = signum
        log.warning(
            "received %s: finishing this step and saving a checkpoint", signal.Signals(signum).name
        )

    def __exit__(self, *exc):
        for s, h in self._old.items():
            signal.signal(s, h)


def dev_evaluator(
    graphdef: Any,
    param_shardings: Any,
    data: PreparedData,
    config: Config,
    partitioner: Partitioner,
    dev_bleu: DevBleu | None = None,
) -> Callable[[Any], dict[str, float]]:
    """``evaluate(params) → dev metrics``, its loss step compiled once for the run.

    The metrics: per-token teacher-forced ``loss`` (smoothed), ``nll``, ``accuracy``, ``ppl``
    and, with ``train.dev_bleu``, what ``dev_bleu(params, graphdef, partitioner)`` returns
    (``bleu``, ``chrf``, ``bleu_sentences``).

    Raises:
      ValueError: ``train.dev_bleu`` is on but no ``dev_bleu`` callable was given.
    """
    if config.train.dev_bleu and dev_bleu is None:
        raise ValueError(
            "train.dev_bleu=true needs a dev BLEU callable (seq2seq.run passes "
            "one); or set train.dev_bleu=false"
        )
    step = partitioner.jit(
        make_eval_step(
            graphdef,
            bos_id=data.tokenizer.bos_id,
            label_smoothing=config.train.label_smoothing,
            param_layout=partitioner.compute_layout(param_shardings),
        ),
        param_shardings,
    )

    def evaluate(params: Any) -> dict[str, float]:
        totals = {"loss": 0.0, "nll": 0.0, "correct": 0.0, "tokens": 0.0}
        for batch in data.dev.epoch(0):
            m = step(params, partitioner.shard_batch(batch))
            for k, v in jax.device_get(m).items():
                totals[k] += float(v)
        n = max(totals["tokens"], 1.0)
        dev = {
            "loss": totals["loss"] / n,
            "nll": totals["nll"] / n,
            "accuracy": totals["correct"] / n,
            "ppl": float(np.exp(totals["nll"] / n)),
        }
        if config.train.dev_bleu:
            assert dev_bleu is not None  # checked above
            dev.update(dev_bleu(params, graphdef, partitioner))
        return dev

    return evaluate


@dataclass
class FitResult:
    """What ``fit`` leaves behind.

    Attributes:
      graphdef / state: the model graph and the final TrainState.
      progress: counters, dev metrics and best/patience bookkeeping at the end.
      stopped: ``finished``, ``early_stopping`` or ``max_seconds``.
      parameters: number of model parameters (LoRA adapters included).
      trainable / moment_bytes: the parameters the optimizer updates and the bytes of its
        Adam moments (``seq2seq.training.step.train_size``).
      checkpoints: steps of the checkpoints kept, ascending.
      best_checkpoint: the step of the kept best checkpoint, or None.
      test_params / test_step: the parameters chosen by ``train.test_checkpoint`` and their step.
      partitioner: the run's mesh and sharding rules.
      discarded: steps of half-written checkpoints (a crash mid-save) deleted at the start.
      resume_note: ``discarded_message`` of them ("" when none), as logged.
    """

    graphdef: Any
    state: Any
    progress: Progress
    stopped: str
    parameters: int
    checkpoints: list[int]
    best_checkpoint: int | None
    test_params: Any
    test_step: int
    partitioner: Partitioner
    discarded: list[int] = field(default_factory=list)
    resume_note: str = ""
    trainable: int = 0
    moment_bytes: int = 0

    @property
    def best(self) -> BestTracker:
        """The best-metric tracker (``progress.best``)."""
        return self.progress.best


def fit(
    config: Config,
    data: PreparedData,
    *,
    dev_bleu: DevBleu | None = None,
    actions: Sequence[Action] = (),
    remap_data_from: Any = None,
    context: TrainContext | None = None,
) -> FitResult:
    """Run (or resume) the optimisation of ``config`` on ``data`` up to ``train.steps``.

    Every ``eval_every`` steps the dev split is scored (loss, accuracy, BLEU on a subset); a new
    best ``train.best_metric`` saves a checkpoint at once (kept besides the last
    ``keep_checkpoints``); ``patience`` evaluations without improvement stop early. Each of
    these is an ``Action`` of ``default_actions``; ``actions`` adds more (run after the
    checkpoint action, e.g. ``Action("histogram", 100, fn)``). ``dev_bleu`` scores dev BLEU
    (needed when ``train.dev_bleu``; ``seq2seq.run.dev_bleu`` makes one). ``remap_data_from``:
    the ``DataConfig`` the checkpoint was trained with when the batching changed since
    (``remap_position``). ``context``: the run's ``TrainContext`` (``seq2seq.run`` builds it
    from the resolved run; default: built here, with the parent resolved from the config).

    Returns:
      A FitResult; ``test_params`` are the parameters selected by ``train.test_checkpoint``.

    Raises:
      Interrupted: SIGINT/SIGTERM arrived; a checkpoint of the last finished step was saved.
      TrainingDiverged: ``train.max_skipped_steps`` non-finite steps in a row (nothing saved
        after the last good checkpoint; the message names the steps).
      CheckpointError: the existing checkpoint does not match the configured model.
    """
    if context is None:
        partitioner, bos_id = Partitioner.from_config(config), data.tokenizer.bos_id
        context = train_context(config, partitioner, bos_id=bos_id, parent=resolve_parent(config))
    tcfg, workdir, partitioner = config.train, Path(config.workdir), context.partitioner
    log.info("%s", partitioner)
    with contextlib.ExitStack() as cleanup:
        checkpointer = cleanup.enter_context(contextlib.closing(_checkpointer(config)))
        state, progress, meta = _start(context, checkpointer, data.train, remap_data_from)
        # the batch thread starts now: packing the epoch of the first batch (seconds at WMT
        # size) overlaps with compiling the step
        share = partitioner.process_share(data.train.rows)
        prefetch = cleanup.enter_context(
            Prefetcher(data.train, progress.micro_batches, tcfg.grad_accum_steps, share)
        )
        writer = cleanup.enter_context(
            contextlib.closing(
                MetricsWriter(workdir, resume_step=progress.last_saved, enabled=is_main_process())
            )
        )
        resume_note = _log_start(config, progress, meta, writer, checkpointer)
        size = _log_size(config, data, state)
        state, stopped = _train_loop(
            context, data, state, progress, checkpointer, writer, dev_bleu, prefetch, actions
        )
        return _result(context, checkpointer, state, progress, stopped, size, resume_note)


def _result(
    context: TrainContext,
    checkpointer: Checkpointer,
    state: Any,
    progress: Progress,
    stopped: str,
    size: Any,
    resume_note: str,
) -> FitResult:
    """``fit``'s result, with the test decode's parameters (``_test_params``)."""
    test_params, test_step = _test_params(context, checkpointer, state, progress.best)
    return FitResult(
        context.graphdef,
        state,
        progress,
        stopped,
        int(size.parameters),
        checkpointer.all_steps(),
        checkpointer.best_step(),
        test_params,
        test_step,
        context.partitioner,
        checkpointer.discarded,
        resume_note,
        size.trainable,
        size.moment_bytes,
    )


def _checkpointer(config: Config) -> Checkpointer:
    """The run's checkpoint manager (half-written saves of a crash deleted)."""
    t = config.train
    return Checkpointer(
        checkpoint_dir(Path(config.workdir)),
        keep=t.keep_checkpoints,
        best_mode=MODES[t.best_metric] if t.keep_best else None,
        cleanup_tmp=True,
    )


def _start(
    context: TrainContext, checkpointer: Checkpointer, batches: Any, remap_data_from: Any
) -> tuple[Any, Progress, Any]:
    """The state to train from (``load_or_init``), its ``Progress`` and the checkpoint's meta
    (None for a new run); a resume whose batching changed has its data position remapped."""
    config = context.config
    state, meta, offset = load_or_init(context, checkpointer)
    progress = Progress.from_meta(meta, int(state.step), config)
    progress.schedule_offset = progress.schedule_offset or offset
    if meta is not None and remap_data_from is not None:
        old = progress.micro_batches
        progress.micro_batches = remap_position(batches, old, remap_data_from)
        epoch, index = batches.locate(progress.micro_batches)
        log.warning(
            "the batching changed: data position remapped by examples from "
            "micro-batch %d to %d (epoch %d, batch %d of %d)",
            old,
            progress.micro_batches,
            epoch,
            index,
            batches.batches_in_epoch(epoch),
        )
    return state, progress, meta


def _log_start(
    config: Config,
    progress: Progress,
    meta: Any,
    writer: MetricsWriter,
    checkpointer: Checkpointer,
) -> str:
    """Log where the run starts (a resume, deleted half-written checkpoints, a run already
    past ``train.steps``); returns the note on deleted checkpoints ("" when none)."""
    workdir = Path(config.workdir)
    if meta is not None:
        log.info(
            "resumed from step %d (%s)%s",
            progress.step,
            checkpoint_dir(workdir),
            f"; dropped {writer.dropped} metric records written after it" if writer.dropped else "",
        )
    resume_note = discarded_message(checkpointer.discarded, None if meta is None else progress.step)
    if resume_note:
        log.warning("%s (%s)", resume_note, checkpoint_dir(workdir))
    if progress.step > progress.steps(config):
        log.warning(
            "the run is at step %d, past train.steps=%d: nothing to train (raise "
            "train.steps to go on)",
            progress.step,
            progress.steps(config),
        )
    return resume_note


def _log_size(config: Config, data: PreparedData, state: Any) -> Any:
    """Log the model's size and what it trains; returns ``train_size(state)``."""
    tcfg, size = config.train, train_size(state)
    n_params = size.parameters
    log.info(
        "model: %.2fM parameters; %d micro-batch(es) of %d rows x %d tokens per step",
        n_params / 1e6,
        tcfg.grad_accum_steps,
        data.train.rows,
        data.train.max_len,
    )
    log.info(
        "trained: %s parameters (%.2f%%)%s; Adam moments %.2f MB",
        f"{size.trainable:,}",
        100.0 * size.trainable / max(n_params, 1),
        f", LoRA rank {tcfg.lora_rank} (alpha {tcfg.lora_alpha:g}) on "
        f"{', '.join(tcfg.lora_targets)}; the other weights frozen"
        if tcfg.lora_rank
        else "",
        size.moment_bytes / 1e6,
    )
    return size


def _train_loop(
    context: TrainContext,
    data: PreparedData,
    state: Any,
    progress: Progress,
    checkpointer: Checkpointer,
    writer: MetricsWriter,
    dev_bleu: DevBleu | None,
    prefetch: Prefetcher,
    extra_actions: Sequence[Action] = (),
) -> tuple[Any, str]:
    """The driver: run steps and, after each, the actions that are due; returns (state, why
    stopped). The step is compiled once; with ``train.time_budget`` it reads the schedule's
    horizon as an argument (``Loop.horizon``), which the ``time_budget`` action sets."""
    config, graphdef, partitioner = context.config, context.graphdef, context.partitioner
    tcfg, p, accum = config.train, progress, config.train.grad_accum_steps
    # the step seq2seq-plan compiles ahead of time too (seq2seq.training.context)
    shardings, sharded_step = context.shardings, context.step
    runtime_horizon = context.runtime_horizon
    evaluate_dev = dev_evaluator(graphdef, shardings.params, data, config, partitioner, dev_bleu)
    actions = default_actions(config, extra_actions)
    bar = tqdm(
        total=p.steps(config),
        initial=p.step,
        desc="train",
        unit="step",
        dynamic_ncols=True,
        mininterval=2.0,
        disable=not is_main_process(),
    )
    loop = Loop(
        config, data, graphdef, partitioner, checkpointer, writer, evaluate_dev, bar, state, p
    )
    if runtime_horizon:
        loop.set_horizon(p.horizon)
    horizon = (loop.horizon,) if runtime_horizon else ()
    # Each step's skip flag is read on the host one step late, after the next step has been
    # dispatched, so that the host never waits for the device between steps; an action that
    # needs the state (log, evaluate, checkpoint, extras) first reads every flag.
    host_only = ("early_stopping", "stop")
    skips = SkipCounter(int(loop.state.skipped), tcfg.max_skipped_steps)
    rows = data.train.rows
    # the next steps' batches are laid out by a background thread (``prefetch``, started by
    # ``fit`` at the data position) while the device works
    with _StopFlag() as stop, contextlib.closing(bar):
        loop.stop_flag = stop
        while p.step < loop.steps:
            t0 = time.perf_counter()
            batch = prefetch.get()
            loop.window_wait += time.perf_counter() - t0
            target, real = batch.target_tokens, batch.real_tokens
            loop.state, m = sharded_step(
                loop.state, partitioner.shard_batch(batch, 1, rows), *horizon
            )
            p.step, p.micro_batches = p.step + 1, p.micro_batches + accum
            loop.pending.append(m)
            loop.window_real += real
            p.tokens_seen += real
            p.target_tokens_seen += target
            last = p.step == loop.steps
            skips.unread.append((p.step, m["skipped"]))
            needs_state = last or any(
                a.due(p.step, last) for a in actions if a.name not in host_only
            )
            skips.read(p, keep_newest=not needs_state)
            bar.update(1)
            p.train_seconds += time.perf_counter() - t0
            if loop.first is None:
                loop.first = (p.step, p.train_seconds)

            loop.new_best = None
            for action in actions:  # "last" as it stands: the time budget may have moved it
                if action.due(p.step, p.step == loop.steps):
                    action.run(loop)
                    if loop.stopped:
                        break
            horizon = (loop.horizon,) if runtime_horizon else ()
            if loop.stopped:
                break
        skips.read(p, keep_newest=False)
        if p.last_saved != p.step:
            loop.save()
        checkpointer.wait()
        # agreed again: a signal may also have come during the last step or the final save, or
        # together with early stopping; every process must raise (or not) alike
        signum, _ = agree_to_stop(stop.signum, False)
        if signum is not None:
            raise Interrupted(p.step, signum)
    stopped = loop.stopped if loop.stopped in ("early_stopping", "max_seconds") else "finished"
    return loop.state, stopped


def _test_params(
    context: TrainContext, checkpointer: Checkpointer, state: Any, best: BestTracker
) -> tuple[Any, int]:
    """Parameters for the final test decode (the best checkpoint's or the last) and their step."""
    step = int(state.step)
    want = best.step if context.config.train.test_checkpoint == "best" else None
    if want is None or want == step:
        return state.eval_params, step
    if want not in checkpointer.all_steps():
        log.warning(
            "best checkpoint (step %d) was not kept (train.keep_best=false); testing the "
            "last parameters (step %d)",
            want,
            step,
        )
        return state.eval_params, step
    abstract = context.partitioner.abstract(context.abstract)
    restored, _ = checkpointer.restore(abstract, want)
    log.info("testing the best checkpoint (step %d, dev %s %.4g)", want, best.metric, best.value)
    return restored.eval_params, want
