"""The run directory: where each artefact of a run lives, and loading a trained model from it.

Layout::

    workdir/
      config.yaml          resolved config (vocab_size filled in)
      spm.model, spm.json  SentencePiece model and the hash of its inputs (separate
                           vocabularies: spm.{src_lang}.model/.json, spm.{tgt_lang}.model/.json)
      tokens/              cached token ids of each split and side (seq2seq.data.token_cache)
      checkpoints/<step>/  orbax checkpoints (state + JSON bookkeeping)
      metrics.jsonl        one JSON object per log/eval event
      events.*             TensorBoard event files
      test.hyp, test.json  test-set hypotheses and scores
      summary.md           human-readable summary of the run
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax

from seq2seq.config import Config, load_config
from seq2seq.data.tokenizer import TokenizerPair, load_pair
from seq2seq.model import build_model
from seq2seq.training.checkpoints import Checkpointer, CheckpointError
from seq2seq.training.step import TrainState, create_train_state, make_optimizer


def config_path(workdir: str | Path) -> Path:
    """``workdir/config.yaml``."""
    return Path(workdir) / "config.yaml"


def tokenizer_path(workdir: str | Path) -> Path:
    """``workdir/spm.model``."""
    return Path(workdir) / "spm.model"


def checkpoint_dir(workdir: str | Path) -> Path:
    """``workdir/checkpoints``."""
    return Path(workdir) / "checkpoints"


def abstract_train_state(config: Config) -> tuple[Any, TrainState]:
    """``(graphdef, TrainState of jax.ShapeDtypeStruct)`` for ``config``, allocating nothing."""
    holder = {}

    def init():
        model = build_model(config.model, config.train.seed)
        graphdef, state = create_train_state(model, make_optimizer(config.train), config.train.seed)
        holder["graphdef"] = graphdef
        return state

    state = jax.eval_shape(init)
    return holder["graphdef"], state


def load_trained(workdir: str | Path, step: int | None = None) -> tuple[Config, TokenizerPair, Any, Any]:
    """Load a run's config, tokenizer and parameters for translation/evaluation.

    Args:
      workdir: a run directory written by training.
      step: checkpoint step (default: the latest).

    Returns:
      ``(config, tokenizer, graphdef, params)``.

    Raises:
      FileNotFoundError: the directory has no config.yaml or no tokenizer.
      CheckpointError: no checkpoint, or it does not match the configured model.
    """
    workdir = Path(workdir)
    if not config_path(workdir).is_file():
        raise FileNotFoundError(f"{workdir} is not a run directory (no config.yaml)")
    config = load_config(config_path(workdir))
    tokenizer = load_pair(config.tokenizer, workdir, src_lang=config.data.src_lang,
                          tgt_lang=config.data.tgt_lang)
    graphdef, abstract_state = abstract_train_state(config)
    checkpointer = Checkpointer(checkpoint_dir(workdir), async_save=False)
    try:
        step = checkpointer.latest_step() if step is None else step
        if step is None:
            raise CheckpointError(f"no checkpoint in {checkpoint_dir(workdir)}")
        state, _ = checkpointer.restore(abstract_state, step)
    finally:
        checkpointer.close()
    return config, tokenizer, graphdef, state.params
