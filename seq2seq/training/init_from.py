"""Fine-tuning: a run that starts from the weights of a trained run (``train.init_from``).

The parent is a run directory (its newest checkpoint) or one checkpoint directory
``<workdir>/checkpoints/<step>``. Its model settings must match this run's (those whose
rule in the schema is ``free`` may differ: the dropout rates, ``model.dtype``,
``model.matmul_dtype`` and the attention kernel and its blocks change no parameter); the
first key that differs is named with both values. The new run loads the parent's parameters
and, with ``train.init_optimizer``, its optimizer state; everything else (step 0, RNG from
``train.seed``, data position, counters, best-checkpoint bookkeeping, the EMA, which starts
at the loaded weights) starts fresh. Only a run without a checkpoint of its own starts so: a
resume continues from its own checkpoint.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from seq2seq.config import FIXED, FREE, Config, ConfigError, ModelConfig, load_config
from seq2seq.model.lora import merged
from seq2seq.sharding import Partitioner
from seq2seq.training.checkpoints import Checkpointer, _path
from seq2seq.training.step import (
    TrainSpec,
    TrainState,
    base_params,
    build_train_model,
    create_train_state,
    join_trainable,
    split_trainable,
    train_spec,
)
from seq2seq.workdir import checkpoint_dir, checkpoint_steps, config_path

log = logging.getLogger(__name__)

# Model settings a fine-tuning run may change (their rule in the schema, seq2seq/config.py):
# they change no parameter shape or meaning.
FREE_MODEL_KEYS = tuple(
    f.name for f in dataclasses.fields(ModelConfig) if f.metadata["rule"].finetune == FREE
)


@dataclass(frozen=True)
class Parent:
    """The run a fine-tuning run starts from.

    Attributes:
      workdir: the parent's run directory.
      step: the checkpoint loaded.
      config: the parent's saved ``config.yaml``.
    """

    workdir: Path
    step: int
    config: Config

    @functools.cached_property
    def spec(self) -> TrainSpec:
        """The parent's graph, abstract ``TrainState`` and optimizer (built once, on first
        use: the shape check and the restore share it)."""
        return train_spec(self.config)


def resolve_parent(config: Config) -> Parent | None:
    """The parent named by ``train.init_from`` (None when unset), reading only its
    ``config.yaml`` and its checkpoint folder names.

    Raises:
      ConfigError: the path is neither a run directory with a checkpoint nor a checkpoint
        directory of one, or it is this run's own workdir.
    """
    value = config.train.init_from
    if not value:
        return None
    key = f"train.init_from={value}"
    path = Path(value)
    if config_path(path).is_file():
        workdir = path
        steps = checkpoint_steps(workdir)
        if not steps:
            raise ConfigError(f"{key}: the run holds no checkpoint in {checkpoint_dir(workdir)}")
        step = steps[-1]
    elif path.name.isdigit() and config_path(path.parent.parent).is_file():
        workdir, step = path.parent.parent, int(path.name)
        if step not in checkpoint_steps(workdir):
            raise ConfigError(
                f"{key}: no checkpoint of step {step}; the run has {checkpoint_steps(workdir)}"
            )
    else:
        raise ConfigError(
            f"{key}: not a run directory (no config.yaml) nor a checkpoint directory "
            "<workdir>/checkpoints/<step> of one"
        )
    if workdir.resolve() == Path(config.workdir).resolve():
        raise ConfigError(f"{key} is this run's own workdir: rerun without it to resume")
    return Parent(workdir, step, load_config(config_path(workdir)))


def check_init_from(config: Config, parent: Parent | None) -> None:
    """Check ``train.init_from`` / ``train.init_optimizer`` settings before any work
    (``parent``: ``resolve_parent(config)``); the shapes follow in ``check_parent_shapes``.

    Raises:
      ConfigError: ``init_optimizer`` without ``init_from``; a tokenizer file set together with
        ``init_from`` (the parent's is used); the first model setting that differs from the
        parent's, with both values.
    """
    t = config.train
    if parent is None:
        if t.init_optimizer:
            raise ConfigError("train.init_optimizer=true needs train.init_from")
        return
    key = f"train.init_from={t.init_from}"
    tok = config.tokenizer
    if tok.model_file or tok.src_model_file or tok.tgt_model_file:
        raise ConfigError(
            f"{key} reuses the parent's SentencePiece model(s): leave tokenizer.model_file, "
            "src_model_file and tgt_model_file unset"
        )
    for f in dataclasses.fields(ModelConfig):
        if f.metadata["rule"].finetune != FIXED:
            continue
        have, want = getattr(parent.config.model, f.name), getattr(config.model, f.name)
        if f.name in ("vocab_size", "src_vocab_size") and want == 0:
            continue
        if have != want:
            raise ConfigError(
                f"{key}: the model does not match the parent's: model.{f.name} is {have!r} in "
                f"{config_path(parent.workdir)} but {want!r} here"
            )


def check_parent_shapes(config: Config, parent: Parent, mine: TrainState) -> None:
    """Compare this run's abstract ``TrainState`` (``mine``) with the parent's, allocating
    nothing.

    Raises:
      ConfigError: the first parameter whose shape differs, with both shapes; with
        ``train.init_optimizer``, an optimizer of another structure (e.g. ``train.clip_norm`` 0
        on one side only).
    """
    t, key = config.train, f"train.init_from={config.train.init_from}"
    theirs = parent.spec.abstract
    # the weights without adapters: a LoRA parent is read merged, a LoRA child adds its own
    leaves = jax.tree_util.tree_flatten_with_path(base_params(theirs.params))[0]
    shapes = {_path(k): v.shape for k, v in leaves}
    for k, v in jax.tree_util.tree_flatten_with_path(base_params(mine.params))[0]:
        name = _path(k).replace(".value", "")
        if shapes.get(_path(k)) != v.shape:
            raise ConfigError(
                f"{key}: parameter {name} has shape {shapes.get(_path(k))} in the parent but "
                f"{tuple(v.shape)} here"
            )
    structures = [str(jax.tree.structure(x.opt_state)) for x in (mine, theirs)]
    if t.init_optimizer and structures[0] != structures[1]:
        raise ConfigError(
            f"{key} with train.init_optimizer=true: the optimizer state of the parent has "
            "another structure (train.clip_norm is 0 on one side only?); set "
            "train.init_optimizer=false or match the parent's optimizer settings"
        )


def init_from_parent(
    config: Config, parent: Parent, partitioner: Partitioner, spec: TrainSpec
) -> tuple[Any, int]:
    """This run's initial TrainState from the parent's checkpoint, placed like
    ``spec.abstract`` (this run's ``TrainSpec``; its optimizer ``spec.tx`` starts fresh
    unless ``train.init_optimizer``).

    A parent trained with LoRA adapters is read with them merged into its weights
    (``seq2seq.model.lora.merged``); with ``train.lora_rank`` this run adds fresh adapters
    (``B`` = 0: its first step computes what the parent computes).

    Returns:
      (the state at step 0, the optimizer updates already made: the parent's step with
      ``train.init_optimizer``, else 0).

    Raises:
      CheckpointError: the parent's checkpoint cannot be read or does not match.
    """
    t, tx = config.train, spec.tx
    parent_graphdef, theirs = parent.spec.graphdef, parent.spec.abstract
    checkpointer = Checkpointer(checkpoint_dir(parent.workdir), async_save=False)
    try:
        restored, _ = checkpointer.restore(partitioner.abstract(theirs), parent.step)
    finally:
        checkpointer.close()

    def init(loaded: Any) -> Any:
        model = build_train_model(config)
        fresh = create_train_state(model, tx, t.seed, ema=t.ema_decay > 0)[1]
        params = merged(parent_graphdef, loaded.params)[1]
        if t.lora_rank:
            params = join_trainable(split_trainable(fresh.params, True)[0], params)
        trainable, _ = split_trainable(params, t.lora_rank > 0)
        return dataclasses.replace(
            fresh,
            params=params,
            opt_state=loaded.opt_state if t.init_optimizer else tx.init(trainable),
            ema=None if fresh.ema is None else jax.tree.map(jnp.copy, params),
        )

    state = jax.jit(init, out_shardings=partitioner.shardings(spec.abstract))(restored)
    log.info(
        "initialised from %s (step %d)%s",
        checkpoint_dir(parent.workdir) / str(parent.step),
        parent.step,
        " with its optimizer state" if t.init_optimizer else "; fresh optimizer and schedule",
    )
    return state, int(restored.step) if t.init_optimizer else 0
