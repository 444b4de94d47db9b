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

from seq2seq.config import Config, ConfigError
from seq2seq.data.batching import MixedBatches, PackedBatches
from seq2seq.data.pipeline import PreparedData
from seq2seq.data.recipe import steps_for_time_budget
from seq2seq.model.layers import GATED
from seq2seq.model.lora import TARGETS as LORA_TARGETS
from seq2seq.sharding import Partitioner, agree_on_steps, agree_to_stop, is_main_process
from seq2seq.training.checkpoints import Checkpointer, discarded_message
from seq2seq.training.early_stopping import MODES, BestTracker
from seq2seq.training.init_from import init_from_parent, resolve_parent
from seq2seq.training.metrics import MetricsWriter
from seq2seq.training.step import (
    SCHEDULES,
    abstract_train_state,
    build_train_model,
    create_train_state,
    learning_rate_schedule,
    make_eval_step,
    make_optimizer,
    sharded_train_step,
    train_size,
)
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


class TrainingDiverged(RuntimeError):
    """``train.max_skipped_steps`` steps in a row had a non-finite loss or gradient.

    Attributes:
      step: the step at which training stopped (the last skipped one).
    """

    def __init__(self, message: str, step: int):
        super().__init__(message)
        self.step = step


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


def check_train_config(config: Config) -> None:
    """Reject ``train`` settings the loop cannot honour.

    Raises:
      ConfigError: a value is out of range or settings contradict each other; the message
        names the key.
    """
    t = config.train
    positive = ("grad_accum_steps", "eval_every", "checkpoint_every", "log_every", "token_budget")
    for key in positive:
        if getattr(t, key) < 1:
            raise ConfigError(f"train.{key} must be >= 1, got {getattr(t, key)}")
    for key in ("max_seconds", "time_budget"):
        if getattr(t, key) < 0:
            raise ConfigError(f"train.{key} must be >= 0 seconds (0 = off), got {getattr(t, key)}")
    for key in (
        "steps",  # 0: from train.token_budget (seq2seq/data/recipe.py)
        "warmup_steps",  # 0: a fifth of the steps
        "max_skipped_steps",
        "bleu_subset",
        "bleu_beam_size",
        "patience",
        "keep_checkpoints",
    ):
        if getattr(t, key) < 0:
            raise ConfigError(f"train.{key} must be >= 0, got {getattr(t, key)}")
    if t.schedule not in SCHEDULES:
        raise ConfigError(
            f"train.schedule must be one of {', '.join(SCHEDULES)}, got {t.schedule!r}"
        )
    if t.schedule == "linear" and t.init_optimizer and t.init_from:
        raise ConfigError(
            "train.schedule=linear with train.init_optimizer=true: the parent's schedule has "
            "no linear decay left to continue; set train.init_optimizer=false (a fresh "
            "optimizer and schedule) or train.schedule=rsqrt"
        )
    if t.best_metric not in MODES:
        raise ConfigError(
            f"train.best_metric must be one of {sorted(MODES)}, got {t.best_metric!r}"
        )
    if t.best_metric in ("bleu", "chrf") and not t.dev_bleu:
        raise ConfigError(
            f"train.best_metric={t.best_metric} needs train.dev_bleu=true (dev BLEU and chrF "
            "are scored with it), or use best_metric=loss"
        )
    if not 0.0 <= t.ema_decay < 1.0:
        raise ConfigError(
            f"train.ema_decay must be in [0, 1) (0 = no EMA; e.g. 0.999), got {t.ema_decay}"
        )
    if t.test_checkpoint not in ("best", "last"):
        raise ConfigError(
            f"train.test_checkpoint must be 'best' or 'last', got {t.test_checkpoint!r}"
        )
    check_lora_config(config)


def check_lora_config(config: Config) -> None:
    """``train.lora_rank``, ``lora_alpha`` and ``lora_targets`` (``seq2seq/model/lora.py``).

    Raises:
      ConfigError: a negative rank or one above ``model.d_model``; with a rank, α ≤ 0, no or
        an unknown target, ``wi_gate`` without a gated activation, no ``train.init_from``
        (the adapters adapt a trained model) or ``train.init_optimizer`` (the parent's
        moments are those of the full weights); the message names the key and value.
    """
    t, m = config.train, config.model
    if t.lora_rank < 0:
        raise ConfigError(f"train.lora_rank must be >= 0 (0 = off), got {t.lora_rank}")
    targets = list(t.lora_targets)
    unknown = [x for x in targets if x not in LORA_TARGETS]
    if unknown:
        raise ConfigError(
            f"train.lora_targets: unknown projection {unknown[0]!r}; choose from "
            f"{', '.join(LORA_TARGETS)}"
        )
    if not t.lora_rank:
        return
    if t.lora_rank > m.d_model:
        raise ConfigError(
            f"train.lora_rank={t.lora_rank} is above model.d_model={m.d_model}: an adapter of "
            "full rank or more is no low-rank adaptation"
        )
    if not t.lora_alpha > 0:
        raise ConfigError(f"train.lora_alpha must be > 0 (scale α / r), got {t.lora_alpha}")
    if not targets:
        raise ConfigError("train.lora_targets is empty: name the projections to adapt")
    if "wi_gate" in targets and m.activation not in GATED:
        raise ConfigError(
            f"train.lora_targets names wi_gate, which model.activation={m.activation} lacks "
            f"(gated activations only: {', '.join(GATED)})"
        )
    if not t.init_from:
        raise ConfigError(
            f"train.lora_rank={t.lora_rank} needs train.init_from: the adapters adapt a "
            "trained model whose weights stay frozen"
        )
    if t.init_optimizer:
        raise ConfigError(
            f"train.lora_rank={t.lora_rank} with train.init_optimizer=true: the parent's Adam "
            "moments are those of the full weights; set train.init_optimizer=false"
        )


class HostBatch(dict):
    """A step's micro-batches on the host (``train_batch``), with the real tokens of the
    global batch: ``real_tokens`` (both sides) and ``target_tokens``."""

    real_tokens: int = 0
    target_tokens: int = 0


def train_batch(
    batches: PackedBatches | MixedBatches,
    first: int,
    accum: int,
    share: tuple[int, int] = (0, 1),
) -> HostBatch:
    """Micro-batches ``first .. first+accum-1`` stacked as int32 ``[accum, rows, max_len]``.

    Optimizer step k of a run that never changed ``accum`` uses ``first = k · accum``; each
    micro-batch is a function of (seed, index) alone, so resumed runs see the same data.
    ``share``: ``(index, count)`` of ``Partitioner.process_share``: only the rows this
    process feeds are laid out (``[accum, rows // count, max_len]``); the token counts are
    always the global batch's.
    """
    micro = [batches.batch_at(first + i, *share) for i in range(accum)]
    out = HostBatch({k: np.stack([m[k] for m in micro]) for k in micro[0]})
    counts = np.sum([batches.tokens_at(first + i) for i in range(accum)], axis=0)
    out.real_tokens, out.target_tokens = int(counts.sum()), int(counts[1])
    return out


def remap_position(batches: PackedBatches | MixedBatches, position: int, old: Any) -> int:
    """The micro-batch of ``batches`` that starts where ``position`` micro-batches of the old
    batching (``old``: a ``DataConfig`` with ``max_len``, ``max_tokens``, ``packing``) ended.

    Epoch e shuffles the pairs with ``(seed, e)`` whatever the batching, so the same epoch is
    resumed at the first batch after the same share of its pairs (pairs longer than the old
    ``max_len`` are left out of the old view: the old run dropped them).

    Raises:
      ConfigError: several training corpora (their positions cannot be remapped).
    """
    if isinstance(batches, MixedBatches):
        raise ConfigError(
            "data.max_tokens, data.max_len and data.packing cannot change on resume with "
            "several training corpora (data.train is a list): resume with the saved values"
        )
    keep = np.flatnonzero(
        (batches.src_lengths <= old.max_len) & (batches.tgt_lengths <= old.max_len)
    )
    before = PackedBatches(
        batches.src.select(keep),
        batches.tgt.select(keep),
        max_len=old.max_len,
        rows=old.max_tokens // old.max_len,
        seed=batches.seed,
        packing=old.packing,
    )
    epoch, index = before.locate(position)
    rows = before.epoch_packing(epoch)
    share = int(rows.offsets[min(index * before.rows, len(rows))]) / max(len(keep), 1)
    seen = share * len(batches.src)  # pairs of this epoch already trained on, in the new view
    pairs = batches.epoch_packing(epoch).offsets[1:]  # pairs in the first k+1 rows
    rows_seen = int(np.searchsorted(pairs, seen - 1e-6)) + 1 if seen > 0 else 0
    start = sum(batches.batches_in_epoch(e) for e in range(epoch))
    return start + min(-(-rows_seen // batches.rows), batches.batches_in_epoch(epoch))


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
class Progress:
    """Where a run stands: everything besides the TrainState that a checkpoint must carry.

    Attributes:
      step: optimizer steps taken.
      micro_batches: training micro-batches consumed (the data position; batch k of the data
        is a function of (seed, k) alone).
      tokens_seen / target_tokens_seen: real (non-padding) tokens trained on, both sides / target.
      skipped_total: steps skipped for a non-finite loss or gradient.
      train_seconds / eval_seconds: wall time in training steps / dev evaluations, all runs.
      dev: the latest dev metrics.
      best: best-metric and patience bookkeeping.
      last_saved: the step of the newest checkpoint (None before the first one).
      schedule_offset: optimizer updates made before this run's step 0 (the parent's step
        with ``train.init_from`` and ``train.init_optimizer``): the learning rate logged at
        step k is the schedule's at ``k + schedule_offset``.
      horizon: the step count ``train.time_budget`` chose at the end of the warmup (the run's
        end and the schedule's horizon); None: not chosen, ``train.steps`` holds.
    """

    step: int
    micro_batches: int
    best: BestTracker
    tokens_seen: int = 0
    target_tokens_seen: int = 0
    skipped_total: int = 0
    train_seconds: float = 0.0
    eval_seconds: float = 0.0
    dev: dict[str, float] = field(default_factory=dict)
    last_saved: int | None = None
    schedule_offset: int = 0
    horizon: int | None = None

    @classmethod
    def from_meta(cls, meta: dict[str, Any] | None, step: int, config: Config) -> Progress:
        """The progress saved in a checkpoint's metadata (None for a fresh run at step 0)."""
        t = config.train
        resumed, meta = meta is not None, meta or {}
        return cls(
            step=step,
            micro_batches=int(meta.get("micro_batches", step * t.grad_accum_steps)),
            best=BestTracker.from_json(meta.get("best"), t.best_metric),
            tokens_seen=int(meta.get("tokens_seen", 0)),
            target_tokens_seen=int(meta.get("target_tokens_seen", 0)),
            skipped_total=int(meta.get("skipped_total", 0)),
            train_seconds=float(meta.get("train_seconds", 0.0)),
            eval_seconds=float(meta.get("eval_seconds", 0.0)),
            dev=dict(meta.get("dev", {})),
            last_saved=step if resumed else None,
            schedule_offset=int(meta.get("schedule_offset", 0)),
            horizon=meta.get("horizon") if t.time_budget else None,
        )

    def steps(self, config: Config) -> int:
        """The run's step count: ``horizon`` when chosen, else ``train.steps``."""
        return config.train.steps if self.horizon is None else self.horizon

    def to_meta(self, batches: PackedBatches | MixedBatches) -> dict[str, Any]:
        """JSON metadata for a checkpoint at ``step`` (with the data epoch, for people, and the
        micro-batches each training corpus served when there are several)."""
        epoch, index = batches.locate(self.micro_batches)
        extra = {}
        if isinstance(batches, MixedBatches):
            extra["corpus_batches"] = [int(n) for n in batches.counts(self.micro_batches)]
        return {
            **extra,
            "step": self.step,
            "micro_batches": self.micro_batches,
            "data_epoch": epoch,
            "data_batch_in_epoch": index,
            "tokens_seen": self.tokens_seen,
            "target_tokens_seen": self.target_tokens_seen,
            "skipped_total": self.skipped_total,
            "train_seconds": self.train_seconds,
            "eval_seconds": self.eval_seconds,
            "dev": self.dev,
            "best": self.best.to_json(),
            "schedule_offset": self.schedule_offset,
            **({} if self.horizon is None else {"horizon": self.horizon}),
        }


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


def _load_or_init(config: Config, checkpointer: Checkpointer, partitioner: Partitioner):
    """(graphdef, TrainState placed on the mesh, checkpoint meta or None, optimizer updates
    made before step 0). A run with a checkpoint resumes from it; else it starts from
    ``train.init_from`` when set (``seq2seq.training.init_from``), else from a random init."""
    graphdef, abstract = abstract_train_state(config)
    if checkpointer.latest_step() is None:
        t = config.train
        parent = resolve_parent(config)
        if parent is not None:
            state, offset = init_from_parent(config, parent, partitioner, abstract)
            return graphdef, state, None, offset
        state = partitioner.init_state(
            lambda: create_train_state(
                build_train_model(config), make_optimizer(t), t.seed, ema=t.ema_decay > 0
            )[1],
            abstract,
        )
        return graphdef, state, None, 0
    state, meta = checkpointer.restore(partitioner.abstract(abstract))
    return graphdef, state, meta, 0


def fit(
    config: Config,
    data: PreparedData,
    *,
    dev_bleu: DevBleu | None = None,
    actions: Sequence[Action] = (),
    remap_data_from: Any = None,
) -> FitResult:
    """Run (or resume) the optimisation of ``config`` on ``data`` up to ``train.steps``.

    Every ``eval_every`` steps the dev split is scored (loss, accuracy, BLEU on a subset); a new
    best ``train.best_metric`` saves a checkpoint at once (kept besides the last
    ``keep_checkpoints``); ``patience`` evaluations without improvement stop early. Each of
    these is an ``Action`` of ``default_actions``; ``actions`` adds more (run after the
    checkpoint action, e.g. ``Action("histogram", 100, fn)``). ``dev_bleu`` scores dev BLEU
    (needed when ``train.dev_bleu``; ``seq2seq.run.dev_bleu`` makes one). ``remap_data_from``:
    the ``DataConfig`` the checkpoint was trained with when the batching changed since
    (``remap_position``).

    Returns:
      A FitResult; ``test_params`` are the parameters selected by ``train.test_checkpoint``.

    Raises:
      Interrupted: SIGINT/SIGTERM arrived; a checkpoint of the last finished step was saved.
      TrainingDiverged: ``train.max_skipped_steps`` non-finite steps in a row (nothing saved
        after the last good checkpoint; the message names the steps).
      CheckpointError: the existing checkpoint does not match the configured model.
    """
    tcfg = config.train
    workdir = Path(config.workdir)
    with contextlib.ExitStack() as cleanup:
        checkpointer = cleanup.enter_context(
            contextlib.closing(
                Checkpointer(
                    checkpoint_dir(workdir),
                    keep=tcfg.keep_checkpoints,
                    best_mode=MODES[tcfg.best_metric] if tcfg.keep_best else None,
                    cleanup_tmp=True,
                )
            )
        )
        partitioner = Partitioner.from_config(config)
        log.info("%s", partitioner)
        graphdef, state, meta, offset = _load_or_init(config, checkpointer, partitioner)
        progress = Progress.from_meta(meta, int(state.step), config)
        progress.schedule_offset = progress.schedule_offset or offset
        if meta is not None and remap_data_from is not None:
            old = progress.micro_batches
            progress.micro_batches = remap_position(data.train, old, remap_data_from)
            epoch, index = data.train.locate(progress.micro_batches)
            log.warning(
                "the batching changed: data position remapped by examples from "
                "micro-batch %d to %d (epoch %d, batch %d of %d)",
                old,
                progress.micro_batches,
                epoch,
                index,
                data.train.batches_in_epoch(epoch),
            )
        writer = cleanup.enter_context(
            contextlib.closing(
                MetricsWriter(workdir, resume_step=progress.last_saved, enabled=is_main_process())
            )
        )
        if meta is not None:
            log.info(
                "resumed from step %d (%s)%s",
                progress.step,
                checkpoint_dir(workdir),
                f"; dropped {writer.dropped} metric records written after it"
                if writer.dropped
                else "",
            )
        resume_note = discarded_message(
            checkpointer.discarded, None if meta is None else progress.step
        )
        if resume_note:
            log.warning("%s (%s)", resume_note, checkpoint_dir(workdir))
        if progress.step > progress.steps(config):
            log.warning(
                "the run is at step %d, past train.steps=%d: nothing to train (raise "
                "train.steps to go on)",
                progress.step,
                progress.steps(config),
            )
        size = train_size(state)
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
        state, stopped = _train_loop(
            config,
            data,
            graphdef,
            state,
            progress,
            checkpointer,
            writer,
            dev_bleu,
            partitioner,
            actions,
        )
        test_params, test_step = _test_params(
            config, checkpointer, state, progress.best, partitioner
        )
        return FitResult(
            graphdef,
            state,
            progress,
            stopped,
            int(n_params),
            checkpointer.all_steps(),
            checkpointer.best_step(),
            test_params,
            test_step,
            partitioner,
            checkpointer.discarded,
            resume_note,
            size.trainable,
            size.moment_bytes,
        )


@dataclass
class Loop:
    """What the periodic actions read and change between steps (one per ``fit``).

    Attributes:
      state: the current TrainState (replaced by every step).
      evaluate_dev: ``params → dev metrics`` (``dev_evaluator``), compiled once.
      progress: step, data position, counters, dev metrics and best/patience bookkeeping.
      pending: the metrics of the steps since the last ``log`` (device arrays).
      window_start / window_real: start time and real tokens of that logging window.
      new_best: the best-metric value if this step's evaluation improved it, else None
        (a checkpoint saved at this step carries it, so orbax's best is our best).
      stopped: set by an action to end the loop after this step: ``early_stopping``,
        ``max_seconds`` or ``signal``.
      signum: the signal agreed on by all processes (``stop``), or None.
      horizon: with ``train.time_budget``, ``progress.steps`` as the replicated int32 scalar
        the compiled step reads (the schedule's horizon; None without a time budget).
      first: ``(step, train seconds)`` after this process's first step (its compilation
        done): where ``train.time_budget`` measures the speed from.
    """

    config: Config
    data: PreparedData
    graphdef: Any
    partitioner: Partitioner
    checkpointer: Checkpointer
    writer: MetricsWriter
    evaluate_dev: Callable[[Any], dict[str, float]]
    bar: Any
    state: Any
    progress: Progress
    stop_flag: Any = None
    pending: list = field(default_factory=list)
    window_start: float = field(default_factory=time.perf_counter)
    window_real: int = 0
    new_best: float | None = None
    stopped: str | None = None
    signum: int | None = None
    horizon: Any = None
    first: tuple[int, float] | None = None

    @property
    def steps(self) -> int:
        """The run's step count (``Progress.steps``)."""
        return self.progress.steps(self.config)

    def set_horizon(self, steps: int | None) -> None:
        """Make ``steps`` the run's step count and the schedule's horizon (no recompilation)."""
        self.progress.horizon = steps
        self.horizon = jax.device_put(np.int32(self.steps), self.partitioner.replicated)
        self.bar.total = self.steps
        self.bar.refresh()

    def save(self) -> None:
        """Checkpoint the state at this step (with ``new_best`` as its metric)."""
        p = self.progress
        self.checkpointer.save(p.step, self.state, p.to_meta(self.data.train), metric=self.new_best)
        p.last_saved = p.step


@dataclass(frozen=True)
class Action:
    """A periodic action of the loop: ``run(loop)`` after every ``every``-th step, and after
    the last step when ``at_end``. Actions run in their order in the list; one that sets
    ``loop.stopped`` ends the loop after this step (the actions after it do not run)."""

    name: str
    every: int
    run: Callable[[Loop], None]
    at_end: bool = True

    def due(self, step: int, last: bool) -> bool:
        return step % self.every == 0 or (self.at_end and last)


def log_train(loop: Loop) -> None:
    """A ``train`` metrics record over the steps since the last one, and the progress bar."""
    p, c = loop.progress, loop.config.train
    row = _train_row(
        loop.pending,
        p.step + p.schedule_offset,
        learning_rate_schedule(c, p.horizon),
        loop.window_real,
        time.perf_counter() - loop.window_start,
        loop.data.train,
        c.grad_accum_steps,
    )
    batches = loop.data.train
    if isinstance(batches, MixedBatches):  # the observed share of each corpus so far
        counts = batches.counts(p.micro_batches)
        shares = counts / max(int(counts.sum()), 1)
        row.update({f"corpus_share_{n}": float(x) for n, x in zip(loop.data.train_corpora, shares)})
        log.info(
            "step %d: corpus shares of the %d micro-batches so far: %s",
            p.step,
            int(counts.sum()),
            ", ".join(
                f"{n} {x:.1%} (weight {w:.1%})"
                for n, x, w in zip(loop.data.train_corpora, shares, batches.weights)
            ),
        )
    loop.writer.write(p.step, "train", row)
    loop.bar.set_postfix(
        loss=f"{row['loss']:.3f}",
        lr=f"{row['learning_rate']:.2e}",
        tok_s=f"{row['tokens_per_second']:.0f}",
        real=f"{row['real_token_share']:.0%}",
    )
    loop.pending, loop.window_start, loop.window_real = [], time.perf_counter(), 0


def evaluate(loop: Loop) -> None:
    """Dev loss/accuracy (and BLEU); a new best ``train.best_metric`` is checkpointed at once
    when ``train.keep_best``."""
    p, c = loop.progress, loop.config.train
    t1 = time.perf_counter()
    p.dev = loop.evaluate_dev(loop.state.eval_params)  # the EMA when it is kept
    p.eval_seconds += time.perf_counter() - t1
    loop.window_start += time.perf_counter() - t1  # tokens/s counts training time only
    improved = p.best.update(p.dev[c.best_metric], p.step, loss=p.dev["loss"])
    loop.writer.write(p.step, "dev", {**p.dev, f"best_{c.best_metric}": p.best.value})
    tqdm.write(_dev_line(p.step, p.dev, p.best, improved))
    if improved:
        loop.new_best = p.best.value
        if c.keep_best:
            loop.save()


def checkpoint(loop: Loop) -> None:
    """A checkpoint every ``train.checkpoint_every`` steps (unless this step has one)."""
    if loop.progress.last_saved != loop.progress.step:
        loop.save()


def early_stopping(loop: Loop) -> None:
    """Stop after ``train.patience`` evaluations without improvement."""
    p, c = loop.progress, loop.config.train
    if p.best.should_stop(c.patience):
        loop.stopped = "early_stopping"
        log.info(
            "early stopping at step %d: dev %s has not improved for %d evaluations "
            "(best %.4g at step %s)",
            p.step,
            c.best_metric,
            p.best.evals_without_improvement,
            p.best.value,
            p.best.step,
        )


def stop_requested(loop: Loop) -> None:
    """SIGINT/SIGTERM or ``train.max_seconds``, decided once for all processes: they must
    stop after the same step and save together."""
    p, c = loop.progress, loop.config.train
    own = loop.stop_flag.signum
    signum, out_of_time = agree_to_stop(
        own, bool(c.max_seconds) and p.train_seconds >= c.max_seconds
    )
    if signum is not None:
        if own is None:
            log.warning(
                "another process received %s: stopping at step %d and saving a checkpoint",
                signal.Signals(signum).name,
                p.step,
            )
        loop.stopped, loop.signum = "signal", signum
    elif out_of_time:
        loop.stopped = "max_seconds"
        log.warning(
            "stopping at step %d of %d: train.max_seconds=%s reached",
            p.step,
            loop.steps,
            c.max_seconds,
        )


def time_budget(loop: Loop) -> None:
    """``train.time_budget`` at the end of the warmup: the run's step count (and the schedule's
    horizon) becomes ``steps_for_time_budget`` at the speed measured since this process's first
    step, agreed by all processes, logged and shown by the progress bar. A run resumed after
    the warmup keeps the count its checkpoint holds."""
    p, c = loop.progress, loop.config.train
    if p.step != c.warmup_steps or p.horizon is not None or loop.first is None:
        return
    first, seconds = loop.first, p.train_seconds
    steps = agree_on_steps(steps_for_time_budget(p.step, seconds, *first, c.time_budget))
    log.info(
        "train.time_budget=%gs: %.3f s/step over steps %d-%d, %.0f s of %g spent; "
        "train.steps=%d (was %d)",
        c.time_budget,
        (seconds - first[1]) / max(p.step - first[0], 1),
        first[0] + 1,
        p.step,
        seconds,
        c.time_budget,
        steps,
        loop.steps,
    )
    loop.set_horizon(steps)


def default_actions(config: Config, extra: Sequence[Action] = ()) -> list[Action]:
    """The loop's actions in order: the time budget (with ``train.time_budget``), log,
    evaluate, checkpoint, ``extra``, early stopping, the stop check."""
    t = config.train
    budget = [Action("time_budget", max(t.warmup_steps, 1), time_budget, at_end=False)]
    return [
        *(budget if t.time_budget else []),
        Action("log", t.log_every, log_train),
        Action("evaluate", t.eval_every, evaluate),
        Action("checkpoint", t.checkpoint_every, checkpoint),
        *extra,
        Action("early_stopping", 1, early_stopping),
        Action("stop", 1, stop_requested),
    ]


def _train_loop(
    config: Config,
    data: PreparedData,
    graphdef: Any,
    state: Any,
    progress: Progress,
    checkpointer: Checkpointer,
    writer: MetricsWriter,
    dev_bleu: DevBleu | None,
    partitioner: Partitioner,
    extra_actions: Sequence[Action] = (),
) -> tuple[Any, str]:
    """The driver: run steps and, after each, the actions that are due; returns (state, why
    stopped). The step is compiled once; with ``train.time_budget`` it reads the schedule's
    horizon as an argument (``Loop.horizon``), which the ``time_budget`` action sets."""
    tcfg, p, accum = config.train, progress, config.train.grad_accum_steps
    shardings = partitioner.shardings(abstract_train_state(config)[1])
    runtime_horizon = bool(tcfg.time_budget)
    # micro-batches [accum, rows, length]: rows (axis 1) are split over data × fsdp
    sharded_step = sharded_train_step(
        partitioner,
        shardings,
        graphdef,
        make_optimizer(tcfg),
        bos_id=data.tokenizer.bos_id,
        label_smoothing=tcfg.label_smoothing,
        row_axis=1,
        ema_decay=tcfg.ema_decay,
        runtime_horizon=runtime_horizon,
        lora=tcfg.lora_rank > 0,
    )
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
    skips = _SkipCounter(int(loop.state.skipped), tcfg.max_skipped_steps)
    with _StopFlag() as stop, contextlib.closing(bar):
        loop.stop_flag = stop
        share, rows = partitioner.process_share(data.train.rows), data.train.rows
        batch = (
            train_batch(data.train, p.micro_batches, accum, share) if p.step < loop.steps else None
        )
        while p.step < loop.steps:
            if batch is None:  # the time budget raised the step count past the prepared ones
                batch = train_batch(data.train, p.micro_batches, accum, share)
            t0 = time.perf_counter()
            target, real = batch.target_tokens, batch.real_tokens
            loop.state, m = sharded_step(
                loop.state, partitioner.shard_batch(batch, 1, rows), *horizon
            )
            p.step, p.micro_batches = p.step + 1, p.micro_batches + accum
            # prepared on the host while the device computes
            batch = (
                train_batch(data.train, p.micro_batches, accum, share)
                if p.step < loop.steps
                else None
            )
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


class _SkipCounter:
    """The host's count of steps skipped in a row (``TrainState.skipped`` on the device),
    from the ``skipped`` metric of each step, read when the caller allows."""

    def __init__(self, in_a_row: int, limit: int):
        self.in_a_row, self.limit = in_a_row, limit
        self.unread: list[tuple[int, jax.Array]] = []  # (step, skipped flag)

    def read(self, p: Progress, *, keep_newest: bool) -> None:
        """Read the flags (all, or all but the newest step's, which may still be running).

        Raises:
          TrainingDiverged: ``limit`` steps in a row were skipped.
        """
        n = len(self.unread) - 1 if keep_newest else len(self.unread)
        for step, flag in self.unread[:n]:
            skipped = int(float(flag))
            p.skipped_total += skipped
            self.in_a_row = self.in_a_row + 1 if skipped else 0
            if self.limit and self.in_a_row >= self.limit:
                raise TrainingDiverged(_diverged_message(p, step, self.in_a_row, self.limit), step)
        del self.unread[:n]


def _diverged_message(p: Progress, step: int, in_a_row: int, limit: int) -> str:
    newest = (
        "no checkpoint was saved"
        if p.last_saved is None
        else f"the newest checkpoint is step {p.last_saved}"
    )
    return (
        f"stopped at step {step}: steps {step - in_a_row + 1}..{step} ({in_a_row} in a "
        f"row, train.max_skipped_steps={limit}) had a non-finite loss or gradient and were "
        f"skipped; {newest}. Lower train.learning_rate or raise train.warmup_steps, then rerun."
    )


def _train_row(
    pending, step, schedule, real, seconds, batches: PackedBatches | MixedBatches, accum
) -> dict[str, float]:
    sums = {k: float(sum(jax.device_get([p[k] for p in pending]))) for k in pending[0]}
    tokens = max(sums["tokens"], 1.0)
    capacity = 2 * batches.rows * batches.max_len * accum * len(pending)
    return {
        "loss": sums["loss"] / tokens,
        "nll": sums["nll"] / tokens,
        "accuracy": sums["correct"] / tokens,
        "grad_norm": sums["grad_norm"] / len(pending),
        "learning_rate": float(schedule(step - 1)),
        "tokens_per_second": real / max(seconds, 1e-9),
        "target_tokens_per_second": tokens / max(seconds, 1e-9),
        "real_token_share": real / capacity,
        "skipped_steps": sums["skipped"],
    }


def _dev_line(step: int, dev: dict[str, float], best: BestTracker, improved: bool) -> str:
    line = (
        f"step {step}: dev loss {dev['loss']:.3f} nll {dev['nll']:.3f} "
        f"acc {dev['accuracy']:.1%} ppl {dev['ppl']:.2f}"
    )
    if "bleu" in dev:
        line += f" BLEU {dev['bleu']:.2f} ({int(dev['bleu_sentences'])} sentences)"
    if "chrf" in dev:
        line += f" chrF {dev['chrf']:.2f}"
    mark = "new best" if improved else f"best {best.value:.4g} at step {best.step}"
    return f"{line} [{best.metric}: {mark}]"


def _test_params(
    config: Config,
    checkpointer: Checkpointer,
    state: Any,
    best: BestTracker,
    partitioner: Partitioner,
) -> tuple[Any, int]:
    """Parameters for the final test decode (the best checkpoint's or the last) and their step."""
    step = int(state.step)
    want = best.step if config.train.test_checkpoint == "best" else None
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
    _, abstract = abstract_train_state(config)
    restored, _ = checkpointer.restore(partitioner.abstract(abstract), want)
    log.info("testing the best checkpoint (step %d, dev %s %.4g)", want, best.metric, best.value)
    return restored.eval_params, want
