"""Where a run stands and where it resumes from: ``Progress`` (everything besides the
TrainState that a checkpoint carries), ``load_or_init`` (the TrainState of a fresh, resumed
or fine-tuned run) and the host's count of skipped steps (``SkipCounter``, which raises
``TrainingDiverged``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import jax

from seq2seq.config import Config
from seq2seq.data.batching import MixedBatches, PackedBatches
from seq2seq.training.checkpoints import Checkpointer
from seq2seq.training.context import TrainContext
from seq2seq.training.early_stopping import BestTracker
from seq2seq.training.init_from import init_from_parent


class TrainingDiverged(RuntimeError):
    """``train.max_skipped_steps`` steps in a row had a non-finite loss or gradient.

    Attributes:
      step: the step at which training stopped (the last skipped one).
    """

    def __init__(self, message: str, step: int):
        super().__init__(message)
        self.step = step


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


def load_or_init(context: TrainContext, checkpointer: Checkpointer) -> tuple[Any, Any, int]:
    """(TrainState placed on the mesh, checkpoint meta or None, optimizer updates made before
    step 0). A run with a checkpoint resumes from it; else it starts from
    ``train.init_from`` when set (``context.parent``, ``seq2seq.training.init_from``), else
    from a random init; the abstract state and optimizer are the context's."""
    config, partitioner, abstract = context.config, context.partitioner, context.abstract
    if checkpointer.latest_step() is None:
        if context.parent is not None:
            state, offset = init_from_parent(config, context.parent, partitioner, context.spec)
            return state, None, offset
        return context.fresh_state(), None, 0
    state, meta = checkpointer.restore(partitioner.abstract(abstract))
    return state, meta, 0


class SkipCounter:
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
