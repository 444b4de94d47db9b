"""Validation of the ``train`` settings: ranges, choices and the rules between keys
(``check_train_config``), the LoRA keys among them (``check_lora_config``)."""

from __future__ import annotations

from seq2seq.config import Config, ConfigError
from seq2seq.model.layers import GATED
from seq2seq.model.lora import TARGETS as LORA_TARGETS
from seq2seq.training.early_stopping import MODES
from seq2seq.training.step import SCHEDULES


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
