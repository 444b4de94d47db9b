"""The training loop: config → data → model → jit'd step → checkpoints/metrics → test BLEU.

Rerunning on the same working directory resumes from the latest checkpoint: the step, optimizer
state (and so the learning-rate schedule), RNG and data position all continue. SIGINT/SIGTERM
finish the current step, save a checkpoint and exit.
"""

from __future__ import annotations

import json
import logging
import signal
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np
from tqdm.auto import tqdm

from seq2seq import evaluation
from seq2seq.config import Config, replace, save_config
from seq2seq.data.pipeline import PreparedData, prepare
from seq2seq.model import build_model
from seq2seq.sharding import (Partitioner, initialize_distributed, is_main_process,
                              main_process_first)
from seq2seq.training.checkpoints import Checkpointer
from seq2seq.training.metrics import MetricsWriter
from seq2seq.training.step import (create_train_state, eval_step, learning_rate_schedule,
                                   make_optimizer, train_step)
from seq2seq.translation import Translator
from seq2seq.workdir import abstract_train_state, checkpoint_dir, config_path

log = logging.getLogger(__name__)


class Interrupted(Exception):
    """Training stopped on SIGINT/SIGTERM after saving a checkpoint at ``step``."""

    def __init__(self, step: int):
        super().__init__(f"interrupted at step {step}; checkpoint saved, rerun the same command to resume")
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


def _translate_and_score(translator: Translator, sources: list[str], references: list[str],
                         out_path: Path | None = None) -> tuple[evaluation.Scores, list[str]]:
    hyps = [h[0].text for h in translator.translate(sources, progress=True)]
    if out_path is not None:
        out_path.write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
    return evaluation.score(hyps, references), hyps


def train(config: Config) -> dict[str, Any]:
    """Train (or resume) the run described by ``config``, then evaluate on the test split.

    Returns:
      A summary dict: final step, dev metrics, test BLEU/chrF with signatures, wall time.

    Raises:
      Interrupted: SIGINT/SIGTERM arrived; a checkpoint of the last finished step was saved.
      DataError / TokenizerError / ConfigError: bad input (messages name the culprit).
      CheckpointError: the existing checkpoint does not match the configured model.
    """
    wall_start = time.perf_counter()
    initialize_distributed(config.distributed)  # no-op for a single process
    main = is_main_process()  # only process 0 writes files other than checkpoints
    workdir = Path(config.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    with main_process_first("prepare"):  # the tokenizer is trained once, then loaded
        data = prepare(config, workdir)
    if config.model.vocab_size == 0:
        config = replace(config, **{"model.vocab_size": data.tokenizer.vocab_size})
    elif config.model.vocab_size != data.tokenizer.vocab_size:
        raise ValueError(f"model.vocab_size={config.model.vocab_size} but the tokenizer has "
                         f"{data.tokenizer.vocab_size} pieces; leave model.vocab_size at 0")
    if main:
        save_config(config, config_path(workdir))
    partitioner = Partitioner.from_config(config)
    log.info("%s", partitioner)

    tcfg = config.train
    tx = make_optimizer(tcfg)
    schedule = learning_rate_schedule(tcfg)
    checkpointer = Checkpointer(checkpoint_dir(workdir), keep=tcfg.keep_checkpoints)
    graphdef, abstract = abstract_train_state(config)
    if checkpointer.latest_step() is not None:
        state, meta = checkpointer.restore(partitioner.abstract(abstract))
        log.info("resumed from step %d (%s)", int(state.step), checkpoint_dir(workdir))
    else:
        state = partitioner.init_state(
            lambda: create_train_state(build_model(config.model, tcfg.seed), tx, tcfg.seed)[1],
            abstract)
        meta = {}
    n_params = sum(x.size for x in jax.tree.leaves(state.params))
    log.info("model: %.2fM parameters; %d rows x %d tokens per batch", n_params / 1e6,
             data.train.rows, data.train.max_len)

    metrics_writer = MetricsWriter(workdir, enabled=main)
    step = int(state.step)
    step_kw = dict(graphdef=graphdef, tx=tx, bos_id=data.tokenizer.bos_id,
                   label_smoothing=tcfg.label_smoothing)
    sharded_train_step = partitioner.jit_train_step(train_step, partitioner.shardings(abstract),
                                                    **step_kw)
    pending: list[dict[str, jax.Array]] = []
    window_start, window_real = time.perf_counter(), 0.0
    train_seconds = float(meta.get("train_seconds", 0.0))
    last_saved = step

    def save(step: int) -> None:
        nonlocal last_saved
        checkpointer.save(step, state, {"step": step, "train_seconds": train_seconds,
                                        "dev": meta.get("dev", {})})
        last_saved = step

    bar = tqdm(total=tcfg.steps, initial=step, desc="train", unit="step", dynamic_ncols=True,
               mininterval=2.0, disable=not main)
    with _StopFlag() as stop:
        while step < tcfg.steps:
            t0 = time.perf_counter()
            batch = data.train.batch_at(step)
            window_real += float((batch["tgt_segments"] > 0).sum() + (batch["src_segments"] > 0).sum())
            state, m = sharded_train_step(state, partitioner.shard_batch(batch))
            pending.append(m)
            step += 1
            bar.update(1)
            if step % tcfg.log_every == 0 or step == tcfg.steps:
                sums = {k: float(sum(jax.device_get([p[k] for p in pending]))) for k in pending[0]}
                now = time.perf_counter()
                tokens = max(sums["tokens"], 1.0)
                row = {"loss": sums["loss"] / tokens, "nll": sums["nll"] / tokens,
                       "accuracy": sums["correct"] / tokens,
                       "grad_norm": sums["grad_norm"] / len(pending),
                       "learning_rate": float(schedule(step - 1)),
                       "tokens_per_second": window_real / (now - window_start),
                       "target_tokens_per_second": tokens / (now - window_start),
                       "real_token_share": window_real / (2 * data.train.rows * data.train.max_len
                                                          * len(pending)),
                       "skipped_steps": sums["skipped"]}
                metrics_writer.write(step, "train", row)
                bar.set_postfix(loss=f"{row['loss']:.3f}", lr=f"{row['learning_rate']:.2e}",
                                tok_s=f"{row['tokens_per_second']:.0f}",
                                real=f"{row['real_token_share']:.0%}")
                pending, window_start, window_real = [], time.perf_counter(), 0.0
            train_seconds += time.perf_counter() - t0
            if step % tcfg.eval_every == 0 or step == tcfg.steps:
                dev = evaluate_loss(state.params, graphdef, data, config, partitioner)
                meta["dev"] = dev
                metrics_writer.write(step, "dev", dev)
                tqdm.write(f"step {step}: dev loss {dev['loss']:.3f} nll {dev['nll']:.3f} "
                           f"acc {dev['accuracy']:.1%} ppl {dev['ppl']:.2f}")
            if step % tcfg.checkpoint_every == 0 or step == tcfg.steps:
                save(step)
            if stop.signum is not None or (tcfg.max_seconds and train_seconds >= tcfg.max_seconds):
                break
    bar.close()
    if last_saved != step:
        save(step)
    checkpointer.close()
    if stop.signum is not None:
        metrics_writer.close()
        raise Interrupted(step)
    if step < tcfg.steps:
        log.warning("stopped at step %d of %d: train.max_seconds=%s reached", step, tcfg.steps,
                    tcfg.max_seconds)

    # -- test set ---------------------------------------------------------------------------
    translator = Translator(graphdef, state.params, data.tokenizer, config.decode,
                            max_src_len=max(config.data.max_len, 256), partitioner=partitioner)
    sources, refs = data.test_text.sources, data.test_text.targets
    if config.decode.test_limit:
        sources, refs = sources[: config.decode.test_limit], refs[: config.decode.test_limit]
    t0 = time.perf_counter()
    scores, hyps = _translate_and_score(translator, sources, refs,
                                        workdir / "test.hyp" if main else None)
    decode_seconds = time.perf_counter() - t0
    metrics_writer.write(step, "test", {"bleu": scores.bleu, "chrf": scores.chrf})
    metrics_writer.close()
    summary = {
        "step": step, "dev": meta.get("dev", {}), "test_bleu": scores.bleu,
        "test_chrf": scores.chrf, "bleu_signature": scores.bleu_signature,
        "chrf_signature": scores.chrf_signature, "test_sentences": scores.num_sentences,
        "train_seconds": train_seconds, "decode_seconds": decode_seconds,
        "wall_seconds": time.perf_counter() - wall_start, "parameters": int(n_params),
        "data": data.stats,
        "examples": [{"source": s, "reference": r, "hypothesis": h}
                     for s, r, h in list(zip(sources, refs, hyps))[:5]],
    }
    if main:
        (workdir / "test.json").write_text(json.dumps(summary, indent=1, ensure_ascii=False),
                                           encoding="utf-8")
    return summary
