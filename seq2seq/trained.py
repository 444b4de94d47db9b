"""Tools on trained run directories: load a run (or an ensemble of runs or checkpoints) for
translation, average checkpoints.

Both read a run written by ``seq2seq-train`` (the layout in ``seq2seq.workdir``) and are called
by the command line (``seq2seq-translate``, ``seq2seq-evaluate``, ``seq2seq-average``).
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from seq2seq.config import Config, DecodeConfig, load_config, replace, save_config
from seq2seq.data.tokenizer import Tokenizer, TokenizerPair, load_pair, model_names, vocab_path
from seq2seq.decoding import EnsembleDef
from seq2seq.model.lora import merged
from seq2seq.training.checkpoints import Checkpointer, CheckpointError
from seq2seq.training.step import abstract_train_state, make_optimizer
from seq2seq.workdir import checkpoint_dir, checkpoint_steps, config_path

log = logging.getLogger(__name__)


def load_trained(
    workdir: str | Path, step: int | None = None, *, matmul_dtype: str | None = None
) -> tuple[Config, TokenizerPair, Any, Any]:
    """Load a run's config, tokenizer and parameters for translation/evaluation.

    Args:
      workdir: a run directory written by training.
      step: checkpoint step (default: ``default_step``, the one the run's test score used).
      matmul_dtype: ``model.matmul_dtype`` to decode with instead of the run's (``float32``
        or ``bfloat16``; it changes no parameter). With bfloat16 operands a sentence's
        log-probability moves by ~1e-3 with the sentences that share its batch
        (docs/design.md, "Scores and the batch"); float32 keeps it within ~1e-5.

    Returns:
      ``(config, tokenizer, graphdef, params)``. A run trained with LoRA adapters
      (``train.lora_rank``) comes back as the plain model, its adapters merged into the
      weights (``seq2seq.model.lora.merged``), and its config with ``train.lora_rank`` 0.

    Raises:
      FileNotFoundError: the directory has no config.yaml or no tokenizer.
      CheckpointError: no checkpoint, or it does not match the configured model.
    """
    workdir = Path(workdir)
    if not config_path(workdir).is_file():
        raise FileNotFoundError(f"{workdir} is not a run directory (no config.yaml)")
    config = load_config(config_path(workdir))
    if matmul_dtype is not None:
        config = replace(config, model=replace(config.model, matmul_dtype=matmul_dtype))
    tokenizer = load_pair(
        config.tokenizer, workdir, src_lang=config.data.src_lang, tgt_lang=config.data.tgt_lang
    )
    graphdef, abstract_state = abstract_train_state(config)
    step = checkpoint_step(workdir, step)
    checkpointer = Checkpointer(checkpoint_dir(workdir), async_save=False)
    try:
        state, _ = checkpointer.restore(abstract_state, step)
    finally:
        checkpointer.close()
    log.info("%s: the checkpoint of step %d", workdir, step)
    # the EMA when the run kept one; LoRA adapters folded into the weights
    graphdef, params = merged(graphdef, state.eval_params)
    return _plain(config), tokenizer, graphdef, params


def checkpoint_step(workdir: str | Path, step: int | None = None) -> int:
    """The step of the checkpoint ``load_trained(workdir, step)`` loads: ``step`` when given,
    else the run's default (``default_step``), read now (a later save may move the default).

    Raises:
      FileNotFoundError: ``workdir`` has no config.yaml.
      CheckpointError: no checkpoint.
    """
    if step is not None:
        return step
    workdir = Path(workdir)
    if not config_path(workdir).is_file():
        raise FileNotFoundError(f"{workdir} is not a run directory (no config.yaml)")
    checkpointer = Checkpointer(checkpoint_dir(workdir), async_save=False)
    try:
        step = default_step(checkpointer, load_config(config_path(workdir)))
    finally:
        checkpointer.close()
    if step is None:
        raise CheckpointError(f"no checkpoint in {checkpoint_dir(workdir)}")
    return step


def _plain(config: Config) -> Config:
    """``config`` of a run read with its LoRA adapters merged: ``train.lora_rank`` 0."""
    return replace(config, **{"train.lora_rank": 0}) if config.train.lora_rank else config


def _member_name(workdir: str | Path, step: int | None) -> str:
    return str(workdir) if step is None else f"{workdir} (step {step})"


def _pieces(tokenizer: Tokenizer) -> list[str]:
    return [tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)]


def check_same_vocabulary(
    first: str, first_tok: TokenizerPair, other: str, other_tok: TokenizerPair
) -> None:
    """Models of an ensemble read and write the same pieces: the SentencePiece models of both
    sides must list the same pieces in the same order (which fixes the special ids too).

    Raises:
      ValueError: a side differs; the message names both runs, the side, and the first
        differing id (or the sizes).
    """
    for side in ("source", "target"):
        a, b = _pieces(getattr(first_tok, side)), _pieces(getattr(other_tok, side))
        if a == b:
            continue
        if len(a) != len(b):
            detail = f"{len(a)} vs {len(b)} pieces"
        else:
            i = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
            detail = f"id {i} is {a[i]!r} vs {b[i]!r}"
        raise ValueError(
            f"{first} and {other} do not share the {side} vocabulary ({detail}); an ensemble "
            "needs runs trained with the same SentencePiece model(s)"
        )


def check_same_decode(
    members: Sequence[tuple[str | Path, int | None]], decodes: Sequence[DecodeConfig]
) -> None:
    """An ensemble decodes with one setting: the members' decode configs (after the command
    line's options) must be equal (``test_limit`` aside).

    Raises:
      ValueError: naming the first differing ``decode.*`` key, both runs and both values.
    """
    first = decodes[0]
    for (workdir, step), decode in zip(members[1:], decodes[1:]):
        for field in dataclasses.fields(DecodeConfig):
            if field.name == "test_limit":  # the end of training's test decode, not this one
                continue
            a, b = getattr(first, field.name), getattr(decode, field.name)
            if a != b:
                raise ValueError(
                    f"{_member_name(*members[0])} and {_member_name(workdir, step)} decode "
                    f"differently: decode.{field.name} is {a!r} vs {b!r}; an ensemble decodes "
                    "with one setting (set it on the command line where an option exists)"
                )


def load_ensemble(
    members: Sequence[tuple[str | Path, int | None]], *, matmul_dtype: str | None = None
) -> tuple[list[Config], TokenizerPair, EnsembleDef, tuple[Any, ...]]:
    """Load several trained models (runs, or checkpoints of one run) for ensemble decoding.

    Args:
      members: ``(workdir, step)`` of each model (step None: ``default_step``).
      matmul_dtype: as ``load_trained``, for every member.

    Returns:
      ``(configs, tokenizer of the first, graphdef, params)``: the ensemble as one model, its
      ``seq2seq.decoding.EnsembleDef`` and the tuple of the members' parameters (the
      ``Translator`` decodes it as a ``seq2seq.decoding.Ensemble``).

    Raises:
      ValueError: the members do not share the vocabularies (``check_same_vocabulary``).
      FileNotFoundError, CheckpointError: as ``load_trained``.
    """
    loaded = [load_trained(workdir, step, matmul_dtype=matmul_dtype) for workdir, step in members]
    first, tokenizer = _member_name(*members[0]), loaded[0][1]
    for (workdir, step), (_, other, _, _) in zip(members[1:], loaded[1:]):
        check_same_vocabulary(first, tokenizer, _member_name(workdir, step), other)
    return (
        [c for c, _, _, _ in loaded],
        tokenizer,
        EnsembleDef(tuple(g for _, _, g, _ in loaded)),
        tuple(p for _, _, _, p in loaded),
    )


def default_step(checkpointer: Checkpointer, config: Config) -> int | None:
    """The checkpoint a run's test score was decoded from: with ``train.test_checkpoint=best``
    the best one by ``train.best_metric`` (recorded in the newest checkpoint's metadata) if it is
    kept, else the newest; None when there is no checkpoint."""
    latest = checkpointer.latest_step()
    if latest is None or config.train.test_checkpoint != "best":
        return latest
    best = (checkpointer.metadata(latest).get("best") or {}).get("step")
    return best if best in checkpointer.all_steps() else latest


def average_checkpoints(
    workdir: str | Path,
    output: str | Path,
    *,
    steps: Sequence[int] | None = None,
    last: int | None = None,
    overwrite: bool = False,
) -> tuple[Path, list[int]]:
    """Average the parameters of several checkpoints into a new run directory.

    The mean is taken elementwise in float64 and stored in the parameters' dtype. ``output``
    gets the run's config (``workdir`` pointing at ``output``), tokenizer and one checkpoint
    named after the newest averaged step, whose optimizer state, RNG and step are those of the
    newest averaged checkpoint; its metadata records ``averaged_from``. A run trained with
    LoRA adapters is averaged with each checkpoint's adapters merged into its weights (the
    mean of the products, not the product of the means): the output is a plain run
    (``train.lora_rank`` 0) with a fresh optimizer state. ``seq2seq-translate``
    and ``seq2seq-evaluate`` read it with ``--workdir output``.

    Args:
      workdir: a run directory written by training.
      output: the new run directory.
      steps: the checkpoints to average; or
      last: average the newest ``last`` checkpoints.
      overwrite: replace checkpoints already in ``output``.

    Returns:
      ``(output, steps averaged)``.

    Raises:
      ValueError: neither or both of ``steps``/``last``, fewer than 1 step, a step that is not
        a checkpoint of ``workdir``, or ``output`` is ``workdir``.
      FileNotFoundError: ``workdir`` is not a run directory.
      FileExistsError: ``output`` already holds checkpoints and ``overwrite`` is False.
      CheckpointError: a checkpoint does not match the run's model.
    """
    workdir, output = Path(workdir), Path(output)
    if not config_path(workdir).is_file():
        raise FileNotFoundError(f"{workdir} is not a run directory (no config.yaml)")
    if output.resolve() == workdir.resolve():
        raise ValueError("the output must be a new directory, not the run directory itself")
    if (steps is None) == (last is None):
        raise ValueError("give either the steps to average or how many of the last ones")
    available = checkpoint_steps(workdir)
    if last is not None:
        if last < 1:
            raise ValueError(f"--last must be >= 1, got {last}")
        if last > len(available):
            raise ValueError(
                f"asked for the last {last} checkpoints but {checkpoint_dir(workdir)} "
                f"has {len(available)}: {available}"
            )
        steps = available[-last:]
    assert steps is not None  # exactly one of steps and last was given
    steps = sorted(set(int(s) for s in steps))
    missing = [s for s in steps if s not in available]
    if not steps or missing:
        raise ValueError(
            f"no checkpoint of step(s) {missing} in {checkpoint_dir(workdir)}; "
            f"available: {available}"
        )
    if checkpoint_steps(output) and not overwrite:
        raise FileExistsError(
            f"{output} already holds checkpoints; choose another output or overwrite"
        )

    config = load_config(config_path(workdir))
    graphdef, abstract = abstract_train_state(config)
    source = Checkpointer(checkpoint_dir(workdir), keep=None, async_save=False)
    try:
        total, newest, newest_plain = None, None, None
        meta: dict[str, Any] = {}
        for s in steps:
            state, meta = source.restore(abstract, s)
            # the weights decoded: the EMA when the run kept one (train.ema_decay)
            plain = merged(graphdef, state.eval_params)[1]
            params = jax.tree.map(lambda x: np.asarray(x, np.float64), plain)
            total = params if total is None else jax.tree.map(np.add, total, params)
            newest, newest_plain = state, plain
    finally:
        source.close()
    assert total is not None and newest is not None  # steps is not empty
    mean = jax.tree.map(lambda t, p: (t / len(steps)).astype(p.dtype), total, newest_plain)
    mean = jax.tree.map(jax.numpy.asarray, mean)
    averaged = newest.replace(params=mean, ema=None if newest.ema is None else mean)
    if config.train.lora_rank:  # the merged weights: a plain run and its optimizer state
        config = _plain(config)
        averaged = averaged.replace(opt_state=make_optimizer(config.train).init(mean))

    output.mkdir(parents=True, exist_ok=True)
    if overwrite and checkpoint_dir(output).exists():
        shutil.rmtree(checkpoint_dir(output))
    save_config(replace(config, workdir=str(output)), config_path(output))
    for stem in dict.fromkeys(
        model_names(config.tokenizer, config.data.src_lang, config.data.tgt_lang)
    ):  # joint: one; else one per side
        for name in (f"{stem}.model", f"{stem}.json"):
            if (workdir / name).is_file():
                shutil.copy2(workdir / name, output / name)
    vocab = vocab_path(config.tokenizer, workdir)
    if vocab is not None and not Path(config.tokenizer.vocab_file or "").is_absolute():
        shutil.copy2(vocab, vocab_path(config.tokenizer, output) or output)
    target = Checkpointer(checkpoint_dir(output), keep=None, async_save=False)
    try:
        target.save(steps[-1], averaged, {**meta, "averaged_from": steps, "source": str(workdir)})
    finally:
        target.close()
    (output / "summary.md").write_text(
        f"# Checkpoint average\n\nParameters: elementwise mean of checkpoints {steps} of "
        f"`{workdir}` (optimizer state, RNG and step from checkpoint {steps[-1]}).\n\n"
        f"Use it with `seq2seq-translate --workdir {output}` or "
        f"`seq2seq-evaluate --workdir {output}`.\n",
        encoding="utf-8",
    )
    return output, steps
