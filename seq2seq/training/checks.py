"""Validation of the ``train`` settings: ranges, choices and the rules between keys
(``check_train_config``), the LoRA keys among them (``check_lora_config``)."""

from __future__ import annotations

from seq2seq.config import Config, ConfigError, check_ranges, choices
from seq2seq.model.layers import GATED
from seq2seq.training.step import SCHEDULES


def check_train_config(config: Config) -> None:
    """Reject ``train`` settings the loop cannot honour.

    Raises:
      ConfigError: a value outside its key's ``Range`` (all of them, in the schema's order),
        not one of its choices, or settings that contradict each other; the message names
        the key.
    """
    t = config.train
    check_ranges(t, "train.")  # each key's Range in the schema
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
    metrics, kept = choices("train.best_metric"), choices("train.test_checkpoint")
    if t.best_metric not in metrics:
        raise ConfigError(
            f"train.best_metric must be one of {', '.join(metrics)}, got {t.best_metric!r}"
        )
    if t.best_metric in ("bleu", "chrf") and not t.dev_bleu:
        raise ConfigError(
            f"train.best_metric={t.best_metric} needs train.dev_bleu=true (dev BLEU and chrF "
            "are scored with it), or use best_metric=loss"
        )
    if t.test_checkpoint not in kept:
        raise ConfigError(
            f"train.test_checkpoint must be one of {', '.join(kept)}, got {t.test_checkpoint!r}"
        )
    check_lora_config(config)


def check_lora_config(config: Config) -> None:
    """``train.lora_rank``, ``lora_alpha`` and ``lora_targets`` (``seq2seq/model/lora.py``).

    Their ranges (a rank ≥ 0, α > 0) are the schema's, checked by ``check_train_config``.

    Raises:
      ConfigError: a rank above ``model.d_model``; with a rank, no or an unknown target,
        ``wi_gate`` without a gated activation, no ``train.init_from`` (the adapters adapt
        a trained model) or ``train.init_optimizer`` (the parent's moments are those of the
        full weights); the message names the key and value.
    """
    t, m = config.train, config.model
    targets = list(t.lora_targets)
    unknown = [x for x in targets if x not in choices("train.lora_targets")]
    if unknown:
        raise ConfigError(
            f"train.lora_targets: unknown projection {unknown[0]!r}; choose from "
            f"{', '.join(choices('train.lora_targets'))}"
        )
    if not t.lora_rank:
        return
    if t.lora_rank > m.d_model:
        raise ConfigError(
            f"train.lora_rank={t.lora_rank} is above model.d_model={m.d_model}: an adapter of "
            "full rank or more is no low-rank adaptation"
        )
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
