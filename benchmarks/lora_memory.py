"""Trainable parameters and optimizer memory of LoRA against full fine-tuning, without training.

For each config (the shipped preset and the paper's Transformer base by default) and each
setting (full fine-tuning, LoRA at a few ranks and targets), builds the run's train state
abstractly (``seq2seq.training.step.abstract_train_state`` under ``jax.eval_shape``: nothing is
allocated) and prints a markdown table: the model's parameters, those the optimizer updates,
the bytes of the Adam moments (``train_size``: two float32 numbers per trained parameter) and
of the whole train state (parameters + moments; float32, no EMA).

The configs are read, not resolved (the preset's corpus and Transformer base's hub dataset are
not needed for shapes): ``model.vocab_size`` left at 0 becomes ``tokenizer.vocab_size`` (what
a trained tokenizer gives) and a null ``model.dropout_rate`` 0.1 (no parameter depends on it).

Usage::

    python -m benchmarks.lora_memory
    python -m benchmarks.lora_memory --config configs/tatoeba_en_es.yaml --rank 4 --rank 16
"""

from __future__ import annotations

import argparse
import datetime
import platform

import jax

from seq2seq.config import Config, load_config, replace
from seq2seq.training.step import abstract_train_state, train_size

CONFIGS = ("configs/tatoeba_en_es.yaml", "configs/transformer_base.yaml")
TARGETS = (("attention",), ("attention", "ffn"))


def shaped(path: str) -> Config:
    """The config at ``path`` with the placeholders that shape the model filled (see above)."""
    config = load_config(path)
    m = config.model
    return replace(
        config,
        **{
            "model.vocab_size": m.vocab_size or config.tokenizer.vocab_size,
            "model.dropout_rate": 0.1 if m.dropout_rate is None else m.dropout_rate,
        },
    )


def rows(config: Config, ranks: list[int]) -> list[tuple[str, int, int, int, int]]:
    """``(setting, parameters, trained, moment bytes, state bytes)`` for full fine-tuning and
    every rank × target set."""
    settings: list[tuple[str, int, tuple[str, ...]]] = [("full fine-tuning", 0, ("attention",))]
    settings += [(f"LoRA r={r}, {' + '.join(t)}", r, t) for r in ranks for t in TARGETS]
    out = []
    for name, rank, targets in settings:
        c = replace(
            config,
            **{
                "train.lora_rank": rank,
                "train.lora_alpha": 2.0 * max(rank, 1),
                "train.lora_targets": list(targets),
                "train.ema_decay": 0.0,
            },
        )
        _, state = abstract_train_state(c)
        size = train_size(state)
        params_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state.params))
        out.append(
            (
                name,
                size.parameters,
                size.trainable,
                size.moment_bytes,
                params_bytes + size.moment_bytes,
            )
        )
    return out


def table(path: str, config: Config, ranks: list[int]) -> str:
    m = config.model
    lines = [
        f"`{path}`: d_model {m.d_model}, d_ff {m.d_ff}, layers {m.num_encoder_layers}+"
        f"{m.num_decoder_layers}, vocabulary {m.vocab_size}",
        "",
        "| setting | parameters | trained | trained share | Adam moments | train state |",
        "|---|--:|--:|--:|--:|--:|",
    ]
    for name, params, trained, moments, state in rows(config, ranks):
        lines.append(
            f"| {name} | {params:,} | {trained:,} | {100 * trained / params:.2f}% | "
            f"{moments / 2**20:.2f} MiB | {state / 2**20:.1f} MiB |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", action="append", help="a config file (repeatable)")
    parser.add_argument("--rank", action="append", type=int, help="a LoRA rank (repeatable)")
    args = parser.parse_args(argv)
    ranks = args.rank or [8]
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    print(f"LoRA vs full fine-tuning, {stamp}, jax {jax.__version__}, {platform.machine()}")
    print("(alpha = 2·rank; nothing allocated: shapes from jax.eval_shape)\n")
    for path in args.config or CONFIGS:
        print(table(path, shaped(path), ranks))
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
