"""The default recipe: batch size, steps and warmup chosen from the training corpus (issue 21).

At a fixed budget of training tokens, a smaller corpus trains better with smaller and more
frequent updates. The rule, for every key left at 0 in the config:

* ``data.max_tokens`` = ``4096 · √(pairs / 100,000)``, clipped to [1024, 2048] tokens and
  rounded (in log scale) to a power-of-two number of rows of ``data.max_len`` tokens (so
  2,048 from about 12.5k pairs up, 1,024 below);
* ``train.steps`` = ``train.token_budget / (data.max_tokens · train.grad_accum_steps)``;
* ``train.warmup_steps`` = a fifth of ``train.steps``;
* ``model.dropout_rate`` (when null) = ``0.02 · passes``, clipped to [0.1, 0.3], where
  ``passes`` = the tokens of ``train.steps`` (``steps · data.max_tokens · grad_accum_steps``,
  the token budget when the steps are left to it) over the corpus's target-side words: 2.4
  for the shipped 137k pairs, so 0.1; 16.5 for 20k pairs, so 0.3. A corpus seen many times
  is memorised, and residual dropout is what holds that back.

The config is resolved once, before any work (``seq2seq/resolve.py``): a resumed run keeps its
saved values, the rest come from ``resolve`` here. With ``train.time_budget`` (seconds) the
steps above are provisional (and at least a given ``train.warmup_steps``, so that the run
reaches the end of its warmup): ``seq2seq-train`` times its compiled step first
(``seq2seq.training.probe``) and resolves the recipe with the steps the budget buys at that
speed (``budget_steps``), so the warmup (a fifth) and the dropout count the run's real steps,
not the token budget's; at the end of the warmup a training action sets the run's end and the
schedule's horizon to ``steps_for_time_budget``, the count that fills the budget at the speed
measured so far. Before, on a 2-core CPU where 780 s bought about 510 steps of the provisional
960, the warmup took 38% of the run, and 20,000 pairs trained with dropout 0.3 where their real
steps give 0.17: 0.17 scored 23.52 and 25.07 dev BLEU against 0.3's 18.27 and 18.79 (seeds 1
and 2, ``docs/data/quality_before_timed_steps/small/``).

``pairs`` and the target-side words (split at whitespace) count every training pair read (after
empty pairs are skipped, before the length filters), summed over the corpora of a
``data.train`` list. The peak learning rate stays
``train.learning_rate``. The evidence is the quality table of
``python -m benchmarks.compare --quality`` in ``docs/benchmarks.md``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from seq2seq.config import Config, replace
from seq2seq.data.sources import load_parallel

REFERENCE_PAIRS = 100_000
REFERENCE_TOKENS = 4096  # the batch of REFERENCE_PAIRS before the clip
MAX_BATCH_TOKENS = 2048
MIN_BATCH_TOKENS = 1024
WARMUP_FRACTION = 0.2
DROPOUT_PER_PASS = 0.02
MIN_DROPOUT, MAX_DROPOUT = 0.1, 0.3


class CorpusSize(NamedTuple):
    """The training corpus as the recipe sees it: ``pairs`` and target-side ``words``."""

    pairs: int
    words: int


def batch_tokens(pairs: int, max_len: int) -> int:
    """Tokens per batch and side for a corpus of ``pairs`` training pairs (the rule above).

    Returns a power-of-two multiple of ``max_len`` (at least one row).
    """
    target = REFERENCE_TOKENS * math.sqrt(max(pairs, 1) / REFERENCE_PAIRS)
    target = min(max(target, MIN_BATCH_TOKENS), MAX_BATCH_TOKENS)
    rows = 2 ** round(math.log2(max(target / max_len, 1.0)))
    return rows * max_len


def dropout_rate(tokens: int, words: int) -> float:
    """Residual dropout for ``tokens`` of training (per side) over a corpus of ``words``
    target-side words: ``0.02 · tokens / words`` clipped to [0.1, 0.3], rounded to 0.01."""
    passes = tokens / max(words, 1)
    return round(min(max(DROPOUT_PER_PASS * passes, MIN_DROPOUT), MAX_DROPOUT), 2)


def left_to_recipe(config: Config) -> bool:
    """Whether any of the recipe's keys is left to it (0, or null for ``model.dropout_rate``);
    the corpus is read only for ``data.max_tokens`` and ``model.dropout_rate``."""
    return (
        not (config.data.max_tokens and config.train.steps and config.train.warmup_steps)
        or config.model.dropout_rate is None
    )


COUNT_BLOCK = 65_536  # target sentences held at a time while counting words


def count_corpus(config: Config) -> CorpusSize:
    """Training pairs and their target-side words over every corpus of ``data.train`` (empty
    pairs skipped if configured).

    Raises:
      DataError / FileNotFoundError: a corpus cannot be read (the message names it).
    """
    d = config.data
    pairs = words = 0
    for source in d.corpora("train"):
        src_lang, tgt_lang = d.direction(source)
        corpus = load_parallel(
            source, src_lang, tgt_lang, skip_empty=d.skip_empty, split_name="train"
        )
        pairs += len(corpus)
        for first in range(0, len(corpus), COUNT_BLOCK):  # a block at a time: bounded memory
            words += sum(
                len(line.split()) for line in corpus[first : first + COUNT_BLOCK]["target"]
            )
    return CorpusSize(pairs, words)


def resolve(
    config: Config, corpus: CorpusSize | None = None, budget_steps: int | None = None
) -> tuple[Config, str]:
    """``config`` with the recipe's keys that are 0 (``model.dropout_rate``: null) filled in
    (the rule above; others kept), and a line saying what was chosen (empty if nothing was).

    ``corpus``: the training corpus's size (None: ``count_corpus``, read only when needed).
    ``budget_steps``: with ``train.time_budget``, the steps the budget buys at the speed the
    step was timed at (``seq2seq.training.probe``); a ``train.steps`` left to the recipe is
    that count instead of the token budget's, so the warmup and dropout count it too.
    """
    if not left_to_recipe(config):
        return config, ""
    d, t = config.data, config.train
    changes: dict[str, float] = {}
    if not d.max_tokens or config.model.dropout_rate is None:
        corpus = count_corpus(config) if corpus is None else corpus
    max_tokens = d.max_tokens
    if not max_tokens:
        assert corpus is not None
        max_tokens = changes["data.max_tokens"] = batch_tokens(corpus.pairs, d.max_len)
    steps = t.steps
    if not steps:
        per_step = max_tokens * max(t.grad_accum_steps, 1)
        steps = changes["train.steps"] = max(1, round(t.token_budget / per_step))
        if t.time_budget and budget_steps:
            steps = changes["train.steps"] = max(1, budget_steps)
        if t.time_budget and t.warmup_steps > steps:
            # provisional: train.time_budget chooses the count at the end of the warmup, which
            # a shorter provisional run would never reach (the budget silently ignored)
            steps = changes["train.steps"] = t.warmup_steps
    if not t.warmup_steps:
        changes["train.warmup_steps"] = max(1, round(WARMUP_FRACTION * steps))
    if config.model.dropout_rate is None:
        assert corpus is not None
        tokens = steps * max_tokens * max(t.grad_accum_steps, 1)
        changes["model.dropout_rate"] = dropout_rate(tokens, corpus.words)
    told = (
        f" for {corpus.pairs:,} training pairs ({corpus.words:,} target words)"
        if corpus is not None
        else ""
    )
    chosen = ", ".join(f"{k}={v}" for k, v in changes.items())
    if t.time_budget and not t.steps and budget_steps and t.warmup_steps < steps:
        chosen += (
            f" (train.steps: what train.time_budget={t.time_budget:g} buys at the step's timed "
            "speed; the end of the warmup corrects the horizon from the real steps)"
        )
    elif t.time_budget and not t.steps and t.warmup_steps == steps:
        chosen += (
            f" (provisional, raised to train.warmup_steps: train.time_budget={t.time_budget:g} "
            "chooses the step count at the end of the warmup)"
        )
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
