"""The training loop: config → data → model → jit'd step → checkpoints/metrics → test BLEU.

Rerunning on the same working directory resumes from the latest checkpoint: the step, optimizer
state (and so the learning-rate schedule), RNG, data position (micro-batches consumed), counters
and the best-checkpoint / early-stopping bookkeeping all continue, so a resumed run computes
bitwise the same parameters as an uninterrupted one. SIGINT/SIGTERM finish the current step
(and an evaluation due at it), save a checkpoint and exit; with several processes, a signal to
any one of them stops all of them after the same step (``seq2seq.sharding.agree_to_stop``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import numpy as np
from tqdm.auto import tqdm

from seq2seq import evaluation
from seq2seq.config import Config, ConfigError, replace, save_config
from seq2seq.data.batching import PackedBatches
from seq2seq.data.pipeline import (PreparedData, check_vocabularies, decode_source_limit,
                                   fill_vocab_sizes, prepare)
from seq2seq.data.sources import FORMATS
from seq2seq.model import build_model
from seq2seq.sharding import (Partitioner, agree_to_stop, initialize_distributed,
                              is_main_process, main_process_first)
from seq2seq.training.checkpoints import Checkpointer
from seq2seq.training.early_stopping import MODES, BestTracker
from seq2seq.training.metrics import MetricsWriter
from seq2seq.training.step import (create_train_state, eval_step, learning_rate_schedule,
                                   make_optimizer, train_step)
from seq2seq.translation import Translator, check_decode_config
from seq2seq.workdir import abstract_train_state, checkpoint_dir, config_path, write_summary_md

log = logging.getLogger(__name__)


class Interrupted(Exception):
    """Training stopped on SIGINT/SIGTERM after saving a checkpoint at ``step``.

    Attributes:
      step: the step of the saved checkpoint.
      signum: the signal that stopped training (``signal.SIGINT`` or ``signal.SIGTERM``); the
        command exits with 128 + signum, the shell convention (130 and 143).
    """

    def __init__(self, step: int, signum: int = signal.SIGINT):
        super().__init__(f"interrupted at step {step}; checkpoint saved, rerun the same command to resume")
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

    def __init__(self):
        self.signum: int | None = None

    def __enter__(self):
        self._old = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def _handle(self, signum, frame):
        if self.signum is not None:  # second signal: stop now
            raise KeyboardInterrupt
        self.signum = signum
        log.warning("received %s: finishing this step and saving a checkpoint",
                    signal.Signals(signum).name)

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
    positive = ("steps", "grad_accum_steps", "eval_every", "checkpoint_every", "log_every")
    for key in positive:
        if getattr(t, key) < 1:
            raise ConfigError(f"train.{key} must be >= 1, got {getattr(t, key)}")
    for key in ("max_skipped_steps", "bleu_subset", "bleu_beam_size", "patience", "keep_checkpoints"):
        if getattr(t, key) < 0:
            raise ConfigError(f"train.{key} must be >= 0, got {getattr(t, key)}")
    if t.best_metric not in MODES:
        raise ConfigError(f"train.best_metric must be one of {sorted(MODES)}, got {t.best_metric!r}")
    if t.best_metric == "bleu" and not t.dev_bleu:
        raise ConfigError("train.best_metric=bleu needs train.dev_bleu=true (or use best_metric=loss)")
    if t.test_checkpoint not in ("best", "last"):
        raise ConfigError(f"train.test_checkpoint must be 'best' or 'last', got {t.test_checkpoint!r}")


def check_run_config(config: Config) -> Partitioner:
    """Every check that needs no data, run before any work starts (no file read or written).

    ``train`` (``check_train_config``), ``decode`` (``check_decode_config``), tokenizer and
    vocabulary settings (``check_vocabularies``), the data formats and batch arithmetic, the
    model (built abstractly, nothing allocated, so shape errors surface here and not after
    training the tokenizer) and the mesh (its sizes, whole heads and FFN units per ``tensor``
    shard, batch rows divisible by ``data × fsdp``).

    Returns:
      The run's ``Partitioner``.

    Raises:
      ConfigError / MeshError / ValueError: the message names the key and value at fault.
    """
    check_train_config(config)
    check_decode_config(config.decode)
    check_vocabularies(config)
    d, m = config.data, config.model
    for split in ("train", "dev", "test"):
        fmt = getattr(d, split).format
        if fmt not in FORMATS:
            raise ConfigError(f"data.{split}.format must be one of {', '.join(FORMATS)}; "
                              f"got {fmt!r}")
    if d.max_len < 2:
        raise ConfigError(f"data.max_len must be >= 2 (a token and EOS), got {d.max_len}")
    if d.max_tokens < d.max_len:
        raise ConfigError(f"data.max_tokens={d.max_tokens} is less than one row of "
                          f"data.max_len={d.max_len} tokens")
    if m.positions == "learned" and m.max_len < d.max_len:
        raise ConfigError(f"model.positions=learned has a table of model.max_len={m.max_len} "
                          f"positions, fewer than data.max_len={d.max_len}: raise model.max_len")
    if m.d_model % m.num_heads:
        raise ConfigError(f"model.d_model={m.d_model} is not divisible by "
                          f"model.num_heads={m.num_heads}")
    vocab = m.vocab_size or config.tokenizer.vocab_size
    abstract_train_state(replace(config, **{"model.vocab_size": vocab,
                                            "model.src_vocab_size": m.src_vocab_size or vocab}))
    partitioner = Partitioner.from_config(config)
    partitioner.process_rows(max(1, d.max_tokens // d.max_len))  # rows split over data × fsdp
    return partitioner


def train_batch(batches: PackedBatches, first: int, accum: int) -> dict[str, np.ndarray]:
    """Micro-batches ``first .. first+accum-1`` stacked as int32 ``[accum, rows, max_len]``.

    Optimizer step k of a run that never changed ``accum`` uses ``first = k · accum``; each
    micro-batch is a function of (seed, index) alone, so resumed runs see the same data.
    """
    micro = [batches.batch_at(first + i) for i in range(accum)]
    return {k: np.stack([m[k] for m in micro]) for k in micro[0]}


def evaluate_loss(params: Any, graphdef: Any, data: PreparedData, config: Config,
                  partitioner: Partitioner | None = None) -> dict[str, float]:
    """Dev-set teacher-forced metrics: per-token ``loss`` (smoothed), ``nll``, ``accuracy``, ``ppl``.

    ``partitioner``: the run's mesh (default: built from ``config.mesh``).
    """
    partitioner = partitioner or Partitioner.from_config(config)
    step = partitioner.jit_eval_step(eval_step, partitioner.shardings(params), graphdef=graphdef,
                                     bos_id=data.tokenizer.bos_id,
                                     label_smoothing=config.train.label_smoothing)
    totals = {"loss": 0.0, "nll": 0.0, "correct": 0.0, "tokens": 0.0}
    for batch in data.dev.epoch(0):
        m = step(params, partitioner.shard_batch(batch))
        for k, v in jax.device_get(m).items():
            totals[k] += float(v)
    n = max(totals["tokens"], 1.0)
    return {"loss": totals["loss"] / n, "nll": totals["nll"] / n,
            "accuracy": totals["correct"] / n, "ppl": float(np.exp(totals["nll"] / n))}


def evaluate_bleu(params: Any, graphdef: Any, data: PreparedData, config: Config,
                  partitioner: Partitioner | None = None) -> evaluation.Scores:
    """sacreBLEU BLEU/chrF of the first ``train.bleu_subset`` dev sentences (0 = all).

    Decodes with ``seq2seq.translation.Translator`` using beam ``train.bleu_beam_size`` (1 =
    greedy, 0 = ``decode.beam_size``) and the rest of the ``decode`` settings, on the run's
    mesh when ``partitioner`` is given.
    """
    t = config.train
    n = t.bleu_subset or len(data.dev_text.sources)
    sources, refs = data.dev_text.sources[:n], data.dev_text.targets[:n]
    decode = replace(config.decode, beam_size=t.bleu_beam_size or config.decode.beam_size)
    translator = Translator(graphdef, params, data.tokenizer, decode,
                            max_src_len=decode_source_limit(config), partitioner=partitioner)
    hyps = [h[0].text for h in translator.translate(sources)]
    return evaluation.score(hyps, refs)


def evaluate_dev(params: Any, graphdef: Any, data: PreparedData, config: Config,
                 partitioner: Partitioner | None = None) -> dict[str, float]:
    """``evaluate_loss`` plus, with ``train.dev_bleu``, ``bleu``, ``chrf`` and ``bleu_sentences``."""
    dev = evaluate_loss(params, graphdef, data, config, partitioner)
    if config.train.dev_bleu:
        scores = evaluate_bleu(params, graphdef, data, config, partitioner)
        dev.update(bleu=scores.bleu, chrf=scores.chrf, bleu_sentences=scores.num_sentences)
        log.debug("dev BLEU signature: %s", scores.bleu_signature)
    return dev


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

    @classmethod
    def from_meta(cls, meta: dict[str, Any] | None, step: int, config: Config) -> "Progress":
        """The progress saved in a checkpoint's metadata (None for a fresh run at step 0)."""
        t = config.train
        resumed, meta = meta is not None, meta or {}
        return cls(step=step, micro_batches=int(meta.get("micro_batches", step * t.grad_accum_steps)),
                   best=BestTracker.from_json(meta.get("best"), t.best_metric),
                   tokens_seen=int(meta.get("tokens_seen", 0)),
                   target_tokens_seen=int(meta.get("target_tokens_seen", 0)),
                   skipped_total=int(meta.get("skipped_total", 0)),
                   train_seconds=float(meta.get("train_seconds", 0.0)),
                   eval_seconds=float(meta.get("eval_seconds", 0.0)), dev=dict(meta.get("dev", {})),
                   last_saved=step if resumed else None)

    def to_meta(self, batches: PackedBatches) -> dict[str, Any]:
        """JSON metadata for a checkpoint at ``step`` (with the data epoch, for people)."""
        epoch, index = batches.locate(self.micro_batches)
        return {"step": self.step, "micro_batches": self.micro_batches, "data_epoch": epoch,
                "data_batch_in_epoch": index, "tokens_seen": self.tokens_seen,
                "target_tokens_seen": self.target_tokens_seen, "skipped_total": self.skipped_total,
                "train_seconds": self.train_seconds, "eval_seconds": self.eval_seconds,
                "dev": self.dev, "best": self.best.to_json()}


@dataclass
class FitResult:
    """What ``fit`` leaves behind.

    Attributes:
      graphdef / state: the model graph and the final TrainState.
      progress: counters, dev metrics and best/patience bookkeeping at the end.
      stopped: ``finished``, ``early_stopping`` or ``max_seconds``.
      parameters: number of model parameters.
      checkpoints: steps of the checkpoints kept, ascending.
      best_checkpoint: the step of the kept best checkpoint, or None.
      test_params / test_step: the parameters chosen by ``train.test_checkpoint`` and their step.
      partitioner: the run's mesh and sharding rules.
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

    @property
    def best(self) -> BestTracker:
        """The best-metric tracker (``progress.best``)."""
        return self.progress.best


def _load_or_init(config: Config, checkpointer: Checkpointer, partitioner: Partitioner):
    """(graphdef, TrainState placed on the mesh, checkpoint meta or None)."""
    graphdef, abstract = abstract_train_state(config)
    if checkpointer.latest_step() is None:
        t = config.train
        state = partitioner.init_state(
            lambda: create_train_state(build_model(config.model, t.seed), make_optimizer(t), t.seed)[1],
            abstract)
        return graphdef, state, None
    state, meta = checkpointer.restore(partitioner.abstract(abstract))
    return graphdef, state, meta


def fit(config: Config, data: PreparedData) -> FitResult:
    """Run (or resume) the optimisation of ``config`` on ``data`` up to ``train.steps``.

    Every ``eval_every`` steps the dev split is scored (loss, accuracy, BLEU on a subset); a new
    best ``train.best_metric`` saves a checkpoint at once (kept besides the last
    ``keep_checkpoints``); ``patience`` evaluations without improvement stop early.

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
        checkpointer = cleanup.enter_context(contextlib.closing(Checkpointer(
            checkpoint_dir(workdir), keep=tcfg.keep_checkpoints,
            best_mode=MODES[tcfg.best_metric] if tcfg.keep_best else None, cleanup_tmp=True)))
        partitioner = Partitioner.from_config(config)
        log.info("%s", partitioner)
        graphdef, state, meta = _load_or_init(config, checkpointer, partitioner)
        progress = Progress.from_meta(meta, int(state.step), config)
        writer = cleanup.enter_context(contextlib.closing(
            MetricsWriter(workdir, resume_step=progress.last_saved, enabled=is_main_process())))
        if meta is not None:
            log.info("resumed from step %d (%s)%s", progress.step, checkpoint_dir(workdir),
                     f"; dropped {writer.dropped} metric records written after it"
                     if writer.dropped else "")
        n_params = sum(x.size for x in jax.tree.leaves(state.params))
        log.info("model: %.2fM parameters; %d micro-batch(es) of %d rows x %d tokens per step",
                 n_params / 1e6, tcfg.grad_accum_steps, data.train.rows, data.train.max_len)
        state, stopped = _train_loop(config, data, graphdef, state, progress, checkpointer, writer,
                                     partitioner)
        test_params, test_step = _test_params(config, checkpointer, state, progress.best,
                                              partitioner)
        return FitResult(graphdef, state, progress, stopped, int(n_params), checkpointer.all_steps(),
                         checkpointer.best_step(), test_params, test_step, partitioner)


def _train_loop(config: Config, data: PreparedData, graphdef: Any, state: Any, progress: Progress,
                checkpointer: Checkpointer, writer: MetricsWriter,
                partitioner: Partitioner) -> tuple[Any, str]:
    """Steps, logging, evaluation, checkpoints and stopping rules; returns (state, why stopped)."""
    tcfg, p, accum = config.train, progress, config.train.grad_accum_steps
    schedule = learning_rate_schedule(tcfg)
    # micro-batches [accum, rows, length]: rows (axis 1) are split over data × fsdp
    sharded_step = partitioner.jit_train_step(
        train_step, partitioner.shardings(abstract_train_state(config)[1]), row_axis=1,
        graphdef=graphdef,
        tx=make_optimizer(tcfg), bos_id=data.tokenizer.bos_id, label_smoothing=tcfg.label_smoothing)
    pending: list[dict[str, jax.Array]] = []
    window_start, window_real = time.perf_counter(), 0

    def save(metric: float | None) -> None:
        checkpointer.save(p.step, state, p.to_meta(data.train), metric=metric)
        p.last_saved = p.step

    stopped, new_best = "finished", None
    bar = tqdm(total=tcfg.steps, initial=p.step, desc="train", unit="step", dynamic_ncols=True,
               mininterval=2.0, disable=not is_main_process())
    with _StopFlag() as stop, contextlib.closing(bar):
        batch = train_batch(data.train, p.micro_batches, accum) if p.step < tcfg.steps else None
        while p.step < tcfg.steps:
            t0 = time.perf_counter()
            target = int((batch["tgt_segments"] > 0).sum())
            real = target + int((batch["src_segments"] > 0).sum())
            state, m = sharded_step(state, partitioner.shard_batch(batch, row_axis=1))
            p.step, p.micro_batches = p.step + 1, p.micro_batches + accum
            if p.step < tcfg.steps:  # prepared on the host while the device computes
                batch = train_batch(data.train, p.micro_batches, accum)
            pending.append(m)
            window_real += real
            p.tokens_seen += real
            p.target_tokens_seen += target
            in_a_row = int(state.skipped)
            p.skipped_total += int(float(m["skipped"]))
            bar.update(1)
            if tcfg.max_skipped_steps and in_a_row >= tcfg.max_skipped_steps:
                raise TrainingDiverged(_diverged_message(p, in_a_row, tcfg.max_skipped_steps), p.step)
            if p.step % tcfg.log_every == 0 or p.step == tcfg.steps:
                row = _train_row(pending, p.step, schedule, window_real,
                                 time.perf_counter() - window_start, data.train, accum)
                writer.write(p.step, "train", row)
                bar.set_postfix(loss=f"{row['loss']:.3f}", lr=f"{row['learning_rate']:.2e}",
                                tok_s=f"{row['tokens_per_second']:.0f}",
                                real=f"{row['real_token_share']:.0%}")
                pending, window_start, window_real = [], time.perf_counter(), 0
            p.train_seconds += time.perf_counter() - t0

            # only improving checkpoints carry a metric, so orbax's best is our best
            new_best = None
            if p.step % tcfg.eval_every == 0 or p.step == tcfg.steps:
                t1 = time.perf_counter()
                p.dev = evaluate_dev(state.params, graphdef, data, config, partitioner)
                p.eval_seconds += time.perf_counter() - t1
                window_start += time.perf_counter() - t1  # tokens/s counts training time only
                improved = p.best.update(p.dev[tcfg.best_metric], p.step, loss=p.dev["loss"])
                writer.write(p.step, "dev", {**p.dev, f"best_{tcfg.best_metric}": p.best.value})
                tqdm.write(_dev_line(p.step, p.dev, p.best, improved))
                if improved:
                    new_best = p.best.value
                    if tcfg.keep_best:
                        save(new_best)
            if (p.step % tcfg.checkpoint_every == 0 or p.step == tcfg.steps) and p.last_saved != p.step:
                save(new_best)

            if p.best.should_stop(tcfg.patience):
                stopped = "early_stopping"
                log.info("early stopping at step %d: dev %s has not improved for %d evaluations "
                         "(best %.4g at step %s)", p.step, tcfg.best_metric,
                         p.best.evals_without_improvement, p.best.value, p.best.step)
                break
            # one decision for all processes: they must stop after the same step and save together
            signum, out_of_time = agree_to_stop(
                stop.signum, bool(tcfg.max_seconds) and p.train_seconds >= tcfg.max_seconds)
            if signum is not None:
                if stop.signum is None:
                    log.warning("another process received %s: stopping at step %d and saving a "
                                "checkpoint", signal.Signals(signum).name, p.step)
                break
            if out_of_time:
                stopped = "max_seconds"
                log.warning("stopping at step %d of %d: train.max_seconds=%s reached", p.step,
                            tcfg.steps, tcfg.max_seconds)
                break
        if p.last_saved != p.step:
            save(new_best)
        checkpointer.wait()
        # agreed again: a signal may also have come during the last step or the final save, or
        # together with early stopping; every process must raise (or not) alike
        signum, _ = agree_to_stop(stop.signum, False)
        if signum is not None:
            raise Interrupted(p.step, signum)
    return state, stopped


def _diverged_message(p: Progress, in_a_row: int, limit: int) -> str:
    newest = ("no checkpoint was saved" if p.last_saved is None
              else f"the newest checkpoint is step {p.last_saved}")
    return (f"stopped at step {p.step}: steps {p.step - in_a_row + 1}..{p.step} ({in_a_row} in a "
            f"row, train.max_skipped_steps={limit}) had a non-finite loss or gradient and were "
            f"skipped; {newest}. Lower train.learning_rate or raise train.warmup_steps, then rerun.")


def _train_row(pending, step, schedule, real, seconds, batches: PackedBatches, accum) -> dict[str, float]:
    sums = {k: float(sum(jax.device_get([p[k] for p in pending]))) for k in pending[0]}
    tokens = max(sums["tokens"], 1.0)
    capacity = 2 * batches.rows * batches.max_len * accum * len(pending)
    return {"loss": sums["loss"] / tokens, "nll": sums["nll"] / tokens,
            "accuracy": sums["correct"] / tokens, "grad_norm": sums["grad_norm"] / len(pending),
            "learning_rate": float(schedule(step - 1)),
            "tokens_per_second": real / max(seconds, 1e-9),
            "target_tokens_per_second": tokens / max(seconds, 1e-9),
            "real_token_share": real / capacity, "skipped_steps": sums["skipped"]}


def _dev_line(step: int, dev: dict[str, float], best: BestTracker, improved: bool) -> str:
    line = (f"step {step}: dev loss {dev['loss']:.3f} nll {dev['nll']:.3f} "
            f"acc {dev['accuracy']:.1%} ppl {dev['ppl']:.2f}")
    if "bleu" in dev:
        line += f" BLEU {dev['bleu']:.2f} ({int(dev['bleu_sentences'])} sentences)"
    mark = "new best" if improved else f"best {best.value:.4g} at step {best.step}"
    return f"{line} [{best.metric}: {mark}]"


def _test_params(config: Config, checkpointer: Checkpointer, state: Any, best: BestTracker,
                 partitioner: Partitioner) -> tuple[Any, int]:
    """Parameters for the final test decode: the best checkpoint's or the last ones, and their step."""
    step = int(state.step)
    want = best.step if config.train.test_checkpoint == "best" else None
    if want is None or want == step:
        return state.params, step
    if want not in checkpointer.all_steps():
        log.warning("best checkpoint (step %d) was not kept (train.keep_best=false); testing the "
                    "last parameters (step %d)", want, step)
        return state.params, step
    _, abstract = abstract_train_state(config)
    restored, _ = checkpointer.restore(partitioner.abstract(abstract), want)
    log.info("testing the best checkpoint (step %d, dev %s %.4g)", want, best.metric, best.value)
    return restored.params, want


def _translate_and_score(translator: Translator, sources: list[str], references: list[str],
                         out_path: Path | None = None) -> tuple[evaluation.Scores, list[str]]:
    hyps = [h[0].text for h in translator.translate(sources, progress=True)]
    if out_path is not None:
        out_path.write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
    return evaluation.score(hyps, references), hyps


def prepare_run(config: Config) -> tuple[Config, PreparedData]:
    """Check the config, create the workdir, prepare the data and write ``config.yaml``.

    Returns:
      The config with ``model.vocab_size`` filled in from the tokenizer, and the data.

    Raises:
      ConfigError / MeshError: invalid settings (``check_run_config``), before any work.
      ValueError: ``model.vocab_size`` disagrees with the tokenizer (and data errors, see
        ``seq2seq.data.pipeline.prepare``).
    """
    initialize_distributed(config.distributed)  # no-op for a single process; before devices
    check_run_config(config)
    workdir = Path(config.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    with main_process_first("prepare"):  # the tokenizer is trained once, then loaded
        data = prepare(config, workdir)
    config = fill_vocab_sizes(config, data.tokenizer)
    if is_main_process():  # only process 0 writes files other than checkpoints
        save_config(config, config_path(workdir))
    return config, data


def train(config: Config) -> dict[str, Any]:
    """Train (or resume) the run described by ``config``, then evaluate on the test split.

    Writes ``test.hyp``, ``test.json`` (the summary below) and ``summary.md`` to the workdir.

    Returns:
      A summary dict: ``status`` (``finished``, ``early_stopping`` or ``max_seconds``),
      ``step``, last ``dev`` metrics, ``best`` (metric, value, step, dev loss),
      ``best_checkpoint``, ``test_step`` (checkpoint decoded), ``test_bleu``/``test_chrf`` with signatures,
      ``tokens_seen`` (real source+target tokens), ``train_seconds`` (all runs), this run's
      ``wall_seconds``, ``checkpoints``, ``examples``.

    Raises:
      Interrupted: SIGINT/SIGTERM arrived; a checkpoint of the last finished step was saved.
      TrainingDiverged: too many non-finite steps in a row.
      DataError / TokenizerError / ConfigError: bad input (messages name the culprit).
      CheckpointError: the existing checkpoint does not match the configured model.
    """
    wall_start = time.perf_counter()
    config, data = prepare_run(config)
    workdir = Path(config.workdir)
    try:
        result = fit(config, data)
    except (Interrupted, TrainingDiverged) as e:
        status = "interrupted" if isinstance(e, Interrupted) else "diverged"
        if is_main_process():
            write_summary_md(workdir, config, {"status": status, "message": str(e), "step": e.step,
                                               "wall_seconds": time.perf_counter() - wall_start})
        raise

    translator = Translator(result.graphdef, result.test_params, data.tokenizer, config.decode,
                            max_src_len=decode_source_limit(config), partitioner=result.partitioner)
    sources, refs = data.test_text.sources, data.test_text.targets
    if config.decode.test_limit:
        sources, refs = sources[: config.decode.test_limit], refs[: config.decode.test_limit]
    main = is_main_process()
    t0 = time.perf_counter()
    scores, hyps = _translate_and_score(translator, sources, refs,
                                        workdir / "test.hyp" if main else None)
    decode_seconds = time.perf_counter() - t0
    step = int(result.state.step)
    writer = MetricsWriter(workdir, enabled=main)
    writer.write(step, "test", {"bleu": scores.bleu, "chrf": scores.chrf, "checkpoint": result.test_step})
    writer.close()
    p = result.progress
    summary = {
        "status": result.stopped, "step": step, "dev": p.dev,
        "best": result.best.to_json(), "best_checkpoint": result.best_checkpoint,
        "test_step": result.test_step, "test_bleu": scores.bleu, "test_chrf": scores.chrf,
        "bleu_signature": scores.bleu_signature, "chrf_signature": scores.chrf_signature,
        "test_sentences": scores.num_sentences, "tokens_seen": p.tokens_seen,
        "target_tokens_seen": p.target_tokens_seen, "skipped_steps": p.skipped_total,
        "train_seconds": p.train_seconds, "eval_seconds": p.eval_seconds,
        "decode_seconds": decode_seconds, "wall_seconds": time.perf_counter() - wall_start,
        "parameters": result.parameters, "checkpoints": result.checkpoints, "data": data.stats,
        "examples": [{"source": s, "reference": r, "hypothesis": h}
                     for s, r, h in list(zip(sources, refs, hyps))[:5]],
    }
    if main:
        (workdir / "test.json").write_text(json.dumps(summary, indent=1, ensure_ascii=False),
                                           encoding="utf-8")
        write_summary_md(workdir, config, summary)
    return summary
