"""The default recipe: batch size, steps and warmup chosen from the training corpus (issue 21).

At a fixed budget of training tokens, a smaller corpus trains better with smaller and more
frequent updates. The rule, for every key left at 0 in the config:

* ``data.max_tokens`` = ``4096 · √(pairs / 100,000)``, clipped to [1024, 2048] tokens and
  rounded (in log scale) to a power-of-two number of rows of ``data.max_len`` tokens (so
  2,048 from about 12.5k pairs up, 1,024 below);
* ``train.steps`` = ``train.token_budget / (data.max_tokens · train.grad_accum_steps)``;
* ``train.warmup_steps`` = a fifth of ``train.steps``.

With ``train.time_budget`` (seconds) the steps above are provisional: at the end of the warmup
the training loop replaces them by ``steps_for_time_budget``, the count that fills the budget at
the speed measured so far.

``pairs`` counts every training pair read (after empty pairs are skipped, before the length
filters), summed over the corpora of a ``data.train`` list. The peak learning rate stays
``train.learning_rate``. The evidence is the quality table of ``scripts/compare.py --quality``
in ``docs/benchmarks.md``.
"""

from __future__ import annotations

import math

from seq2seq.config import Config, replace
from seq2seq.data.sources import load_parallel

REFERENCE_PAIRS = 100_000
REFERENCE_TOKENS = 4096  # the batch of REFERENCE_PAIRS before the clip
MAX_BATCH_TOKENS = 2048
MIN_BATCH_TOKENS = 1024
WARMUP_FRACTION = 0.2


def batch_tokens(pairs: int, max_len: int) -> int:
    """Tokens per batch and side for a corpus of ``pairs`` training pairs (the rule above).

    Returns a power-of-two multiple of ``max_len`` (at least one row).
    """
    target = REFERENCE_TOKENS * math.sqrt(max(pairs, 1) / REFERENCE_PAIRS)
    target = min(max(target, MIN_BATCH_TOKENS), MAX_BATCH_TOKENS)
    rows = 2 ** round(math.log2(max(target / max_len, 1.0)))
    return rows * max_len


def left_to_recipe(config: Config) -> bool:
    """Whether any of the recipe's keys is left to it (0); the corpus is read only for
    ``data.max_tokens``."""
    return not (config.data.max_tokens and config.train.steps and config.train.warmup_steps)


def count_pairs(config: Config) -> int:
    """Training pairs over every corpus of ``data.train`` (empty pairs skipped if configured).

    Raises:
      DataError / FileNotFoundError: a corpus cannot be read (the message names it).
    """
    d = config.data
    total = 0
    for source in d.corpora("train"):
        src_lang, tgt_lang = d.direction(source)
        total += len(
            load_parallel(source, src_lang, tgt_lang, skip_empty=d.skip_empty, split_name="train")
        )
    return total


def resolve(config: Config, pairs: int | None = None) -> tuple[Config, str]:
    """``config`` with the recipe's keys that are 0 filled in (the rule above; others kept),
    and a line saying what was chosen (empty if nothing was).

    ``pairs``: the training-pair count (None: ``count_pairs``, read only when needed).
    """
    if not left_to_recipe(config):
        return config, ""
    d, t = config.data, config.train
    changes: dict[str, int] = {}
    max_tokens = d.max_tokens
    if not max_tokens:
        pairs = count_pairs(config) if pairs is None else pairs
        max_tokens = changes["data.max_tokens"] = batch_tokens(pairs, d.max_len)
    steps = t.steps
    if not steps:
        per_step = max_tokens * max(t.grad_accum_steps, 1)
        steps = changes["train.steps"] = max(1, round(t.token_budget / per_step))
    if not t.warmup_steps:
        changes["train.warmup_steps"] = max(1, round(WARMUP_FRACTION * steps))
    told = f" for {pairs:,} training pairs" if pairs is not None else ""
    chosen = ", ".join(f"{k}={v}" for k, v in changes.items())
    return replace(config, **changes), f"recipe{told}: {chosen}"


def steps_for_time_budget(
    step: int, seconds: float, first_step: int, first_seconds: float, budget: float
) -> int:
    """The total step count that ends training at ``budget`` seconds of training time.

    At ``step``, after ``seconds`` of training time, with the rate measured since
    ``first_step`` (``first_seconds``; the first step of this process, after its compilation):
    ``step + floor((budget - seconds) · (step - first_step) / (seconds - first_seconds))``,
    and never fewer than ``step`` (a budget already spent ends the run here). Without a
    measured interval the rate is ``step / seconds``.
    """
    if step > first_step and seconds > first_seconds:
        rate = (step - first_step) / (seconds - first_seconds)
    else:
        rate = step / max(seconds, 1e-9)
    return step + max(0, math.floor((budget - seconds) * rate))
