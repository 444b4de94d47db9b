"""The loop's periodic actions: ``Action(name, every, run)`` runs ``run(loop)`` after every
``every``-th step, with ``Loop`` (what the actions read and change between steps) as its
argument. The built-in ones (``default_actions``): the time budget, logging, dev evaluation,
checkpointing, early stopping and the stop check; ``fit(..., actions=[...])`` adds more."""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np
from tqdm.auto import tqdm

from seq2seq.config import Config
from seq2seq.data.batching import MixedBatches, PackedBatches
from seq2seq.data.pipeline import PreparedData
from seq2seq.data.recipe import steps_for_time_budget
from seq2seq.sharding import Partitioner, agree_on_steps, agree_to_stop
from seq2seq.training.checkpoints import Checkpointer
from seq2seq.training.early_stopping import BestTracker
from seq2seq.training.metrics import MetricsWriter
from seq2seq.training.progress import Progress
from seq2seq.training.step import learning_rate_schedule

log = logging.getLogger(__name__)


@dataclass
class Loop:
    """What the periodic actions read and change between steps (one per ``fit``).

    Attributes:
      state: the current TrainState (replaced by every step).
      evaluate_dev: ``params → dev metrics`` (``dev_evaluator``), compiled once.
      progress: step, data position, counters, dev metrics and best/patience bookkeeping.
      pending: the metrics of the steps since the last ``log`` (device arrays).
      window_start / window_real: start time and real tokens of that logging window.
      window_wait: seconds of that window the loop waited for the next batch (``Prefetcher``).
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
    window_wait: float = 0.0
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
    seconds = time.perf_counter() - loop.window_start
    row = _train_row(
        loop.pending,
        p.step + p.schedule_offset,
        learning_rate_schedule(c, p.horizon),
        loop.window_real,
        seconds,
        loop.data.train,
        c.grad_accum_steps,
    )
    # the share of the window's training time the loop waited for the batch thread
    row["data_wait_share"] = min(loop.window_wait / max(seconds, 1e-9), 1.0)
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
        data_wait=f"{row['data_wait_share']:.0%}",
    )
    loop.pending, loop.window_start, loop.window_real = [], time.perf_counter(), 0
    loop.window_wait = 0.0


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
