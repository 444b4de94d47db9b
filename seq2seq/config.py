"""Typed, frozen run configuration: YAML file + ``key=value`` overrides.

The schema is a tree of frozen dataclasses; OmegaConf merges the defaults, a YAML file and
command-line overrides (``model.d_model=512``) and checks every key and type against the
schema, so an unknown key or a wrong type is an error that names the full key
(``model.d_modle``). The merged result is converted back to plain frozen dataclasses, so the
rest of the code reads ordinary attributes and never sees OmegaConf. Every field states its
rules in the schema (``rule``): how it behaves on resume and on fine-tuning, its choices, its
range (``Range``) and the searches it applies to.
A config from a file still holds placeholders (0 or null: left to the recipe or the
tokenizer); ``seq2seq.resolve`` turns it into a run's final config.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, cast, get_type_hints

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException


class ConfigError(ValueError):
    """A configuration file or override is invalid; the message names the key or file."""


# How a key behaves when a run resumes (``resume``) and when a run starts from a trained one
# (``finetune``, ``train.init_from``); every field of the sections below states both with
# ``rule``, and the tables of other modules derive from them (``RESUMABLE``, ``BATCHING``,
# ``seq2seq.training.init_from.FREE_MODEL_KEYS``, ``MODEL_CHOICES``, ``choices``).
FREE = "free"  # may change: it changes how the run goes on (or what a fine-tune trains)
FIXED = "fixed"  # resume: refused unless train.allow_config_change; fine-tune: the parent's
REMAPPED = "remapped"  # resume: as fixed, and with train.allow_config_change the data position
# is remapped by examples (seq2seq.training.batches.remap_position)
PARENT = "parent"  # fine-tune: replaced by the parent's value (its tokenizer is reused)
RESUME_RULES = (FREE, FIXED, REMAPPED)
FINETUNE_RULES = (FREE, FIXED, PARENT)


class Range(NamedTuple):
    """The values a numeric key may take: at least ``low`` and at most ``high`` (None: no
    bound), each bound excluded when ``low_open`` / ``high_open``; ``note`` says what a
    value means (``0 = off``). A null (an optional key left unset) is never out of range.

    The one statement of the rule: config validation (``problem``, ``range_problems``) and
    the command line's flags for the key (``seq2seq.cli.common.flag_type``) both read it.
    """

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    note: str = ""

    def contains(self, value: float) -> bool:
        """Whether ``value`` is in the range (NaN never is)."""
        low, high = self.low, self.high
        if low is not None and not (value > low if self.low_open else value >= low):
            return False
        return high is None or bool(value < high if self.high_open else value <= high)

    def text(self) -> str:
        """The rule as messages write it: ``≥ 1``, ``> 0``, ``in (0, 1] (1 = off)``."""
        if self.low is not None and self.high is not None:
            left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
            bounds = f"in {left}{self.low:g}, {self.high:g}{right}"
        elif self.low is not None:
            bounds = f"{'>' if self.low_open else '≥'} {self.low:g}"
        else:
            bounds = f"{'<' if self.high_open else '≤'} {self.high:g}"
        return bounds + (f" ({self.note})" if self.note else "")

    def problem(self, value: Any) -> str | None:
        """``must be ≥ 1, got 0`` for a value outside the range, else None."""
        if value is None or self.contains(value):
            return None
        return f"must be {self.text()}, got {value}"


SAMPLING = "sampling"  # Rule.only_for: read only by a search that samples (Strategy.samples)


class Rule(NamedTuple):
    """A key's rules: ``resume`` (one of ``RESUME_RULES``), ``finetune`` (one of
    ``FINETUNE_RULES``), its ``choices`` (empty: any value of its type), its ``range`` (None:
    any value of its type) and ``only_for``: ``SAMPLING`` for a key that only a search that
    samples reads (``decode.search`` sampling, or mbr with sampled candidates), empty for a
    key every search reads."""

    resume: str
    finetune: str
    choices: tuple[str, ...]
    range: Range | None = None
    only_for: str = ""


def rule(
    default: Any = dataclasses.MISSING,
    *,
    default_factory: Any = dataclasses.MISSING,
    resume: str,
    finetune: str = FREE,
    choices: tuple[str, ...] = (),
    range: Range | None = None,
    only_for: str = "",
) -> Any:
    """A schema field (``dataclasses.field``) with its ``Rule`` in its metadata."""
    return field(
        default=default,
        default_factory=default_factory,
        metadata={"rule": Rule(resume, finetune, choices, range, only_for)},
    )


@dataclass(frozen=True)
class SourceConfig:
    """Where one split of a parallel corpus comes from (read through Hugging Face ``datasets``).

    Attributes:
      format: ``text`` (two files ``{path}.{lang}``, optionally ``.gz``), ``tsv``/``csv`` (one
        file, columns ``src_column``/``tgt_column``, names or 0-based numbers), ``jsonl``
        (``{"translation": {lang: ...}}`` or flat ``{lang: ...}``), ``hub`` (``datasets``
        hub name ``path``, config ``name``, ``split``) or ``disk`` (``save_to_disk`` dir).
      path: file prefix, file, hub name or directory, depending on ``format``.
      name: hub dataset config name (e.g. ``de-en``), ``hub`` only.
      split: split name for ``hub``/``disk``.
      src_column / tgt_column: column names or numbers for ``tsv``/``csv``; default: the
        language codes for named columns, 0 and 1 otherwise.
      src_lang / tgt_lang: this corpus's direction (None: ``data.src_lang`` /
        ``data.tgt_lang``); the same files serve both directions.
      tag: a target-language tag such as ``<2es>`` prepended to every source sentence of this
        corpus (None: no tag); tags are added to the tokenizer's user-defined symbols, so each
        is one SentencePiece piece.
      weight: sampling weight of this corpus among the entries of a ``data.train`` list (a
        batch comes from corpus i with probability weight_i / Σ weights); unused otherwise.
    """

    format: str = "text"
    path: str = ""
    name: str | None = None
    split: str = "train"
    src_column: str | None = None
    tgt_column: str | None = None
    src_lang: str | None = None
    tgt_lang: str | None = None
    tag: str | None = None
    weight: float = 1.0


SPLITS = ("train", "dev", "test")


def _source(value: Any, key: str) -> SourceConfig:
    """One corpus entry as a SourceConfig (from a mapping of a YAML file or override)."""
    if isinstance(value, SourceConfig):
        return value
    if not isinstance(value, dict):
        raise ConfigError(f"{key} must be a mapping (format, path, ...), got {value!r}")
    try:
        merged = OmegaConf.merge(OmegaConf.structured(SourceConfig), value)
        return cast(SourceConfig, OmegaConf.to_object(merged))
    except OmegaConfBaseException as e:
        problem = str(e).splitlines()[0]
        raise ConfigError(f"{key}: {problem} (key: {key}.{getattr(e, 'full_key', '?')})") from e


@dataclass(frozen=True)
class DataConfig:
    """The corpus, its direction and how it is cut into batches.

    Attributes:
      src_lang / tgt_lang: language codes; the direction of translation is src → tgt.
      train / dev / test: where each split comes from: one ``SourceConfig``, or a list of them
        (several corpora, each with its own direction, ``tag`` and, for ``train``, sampling
        ``weight``; in YAML a list of mappings, on the command line
        ``data.train.<i>.<key>=value`` or the whole list). A list is read as a tuple;
        ``corpora(split)`` gives every split as a tuple.
      max_len: row length in tokens for both sides (packed rows and decode inputs).
      max_tokens: token budget per batch and side (rows = max_tokens // max_len); 0 = from
        the size of the training corpus (``seq2seq/data/recipe.py``).
      packing: pack several pairs per row with segment ids (else one pair per row).
      skip_empty: skip (and count) pairs with an empty side; if false such a pair is an error.
      max_length_ratio: training pairs whose token-length ratio exceeds this are dropped.
      concat_pairs_to_tokens: if > 0, consecutive training pairs (after the filters) are
        joined into pseudo-documents of up to this many tokens per side, never splitting a
        pair (``seq2seq/data/documents.py``; long inputs); at most ``max_len``. 0 = off.
    """

    src_lang: str = rule("en", resume=FIXED)
    tgt_lang: str = rule("es", resume=FIXED)
    # Any: a SourceConfig or a tuple of them (OmegaConf has no union of containers); the
    # mappings OmegaConf gives are converted in __post_init__.
    train: Any = rule(default_factory=lambda: {"path": "data/tatoeba-en-es/train"}, resume=FIXED)
    dev: Any = rule(default_factory=lambda: {"path": "data/tatoeba-en-es/dev"}, resume=FREE)
    test: Any = rule(default_factory=lambda: {"path": "data/tatoeba-en-es/test"}, resume=FREE)
    max_len: int = rule(64, resume=REMAPPED, range=Range(2, note="a token and EOS"))
    max_tokens: int = rule(0, resume=REMAPPED, range=Range(0, note="0 = from the corpus"))
    packing: bool = rule(True, resume=REMAPPED)
    skip_empty: bool = rule(True, resume=FIXED)
    max_length_ratio: float = rule(3.0, resume=FIXED, range=Range(0, low_open=True))
    concat_pairs_to_tokens: int = rule(0, resume=FIXED, range=Range(0, note="0 = off"))

    def __post_init__(self):
        for split in SPLITS:
            value = getattr(self, split)
            if isinstance(value, (list, tuple)):
                if not value:
                    raise ConfigError(f"data.{split} is an empty list: give at least one corpus")
                value = tuple(_source(v, f"data.{split}.{i}") for i, v in enumerate(value))
            else:
                value = _source(value, f"data.{split}")
            object.__setattr__(self, split, value)

    def corpora(self, split: str) -> tuple[SourceConfig, ...]:
        """The entries of ``split`` (``train``/``dev``/``test``) as a tuple (one for a single
        source)."""
        value = getattr(self, split)
        return value if isinstance(value, tuple) else (value,)

    def direction(self, source: SourceConfig) -> tuple[str, str]:
        """``(src_lang, tgt_lang)`` of a corpus entry (its own, else the data's)."""
        return source.src_lang or self.src_lang, source.tgt_lang or self.tgt_lang


@dataclass(frozen=True)
class TokenizerConfig:
    """SentencePiece model(s) trained on the training split (Kudo & Richardson 2018).

    Attributes:
      joint: one vocabulary for both languages, trained on both sides (``spm.model``); if
        false, a source and a target model, each trained on its own side
        (``spm.{src_lang}.model``, ``spm.{tgt_lang}.model``), which needs
        ``model.share_embeddings`` ``target`` or ``none``.
      model_file: an existing ``.model`` to use instead of training one (joint only).
      src_model_file / tgt_model_file: existing ``.model`` files for the source / target side
        (separate vocabularies only); an unset side is trained.
      vocab_size: pieces per model, including the 4 special ids (pad 0, unk 1, bos 2, eos 3)
        and the user-defined symbols.
      model_type: ``unigram`` or ``bpe``.
      character_coverage: share of the characters in the training text that get a piece of
        their own, in [0.98, 1] (SentencePiece's range); rarer ones become unk.
      input_sentence_size: sentences sampled for training; 0 = all, else more than 100.
      input_character_size: the sample is also capped at about this many characters (0 = no
        cap): SentencePiece's time and memory grow with them (about 25 bytes each; 50M
        characters are some 350k sentences of WMT length, and more than the shipped corpus
        holds). The sentence count is lowered to ``input_character_size`` over the mean
        sentence length, measured on 4,096 sentences spread over the text.
      user_defined_symbols: pieces that are never split (e.g. tags like ``<2es>``).
      normalization: SentencePiece's normalization rule, applied to training text and to
        every input: ``nmt_nfkc`` (NFKC plus NMT cleanups; the default), ``nfkc``,
        ``nmt_nfkc_cf`` / ``nfkc_cf`` (the same, case-folded) or ``identity`` (none).
      byte_fallback: spell a character outside the vocabulary as its UTF-8 byte pieces
        (256 pieces of the vocabulary) instead of the unknown piece; they decode back to
        the character.
      remove_extra_whitespaces: SentencePiece's whitespace handling: strip leading and
        trailing spaces and collapse runs of them (the default); false keeps them as written.
      vocab_file: a JSON object mapping pieces to model ids (Marian's ``vocab.json``, written
        by ``seq2seq-import``): the SentencePiece models only cut text into pieces and this
        map numbers them, one id space for both sides (so ``model.share_embeddings: all``
        works with separate models); its ``<pad>`` is pad and decoder start, ``</s>`` EOS.
        A relative path is read in the run directory. None: SentencePiece's own ids.
    """

    joint: bool = rule(True, resume=FIXED, finetune=PARENT)
    model_file: str | None = rule(None, resume=FIXED, finetune=PARENT)
    src_model_file: str | None = rule(None, resume=FIXED, finetune=PARENT)
    tgt_model_file: str | None = rule(None, resume=FIXED, finetune=PARENT)
    vocab_size: int = rule(8000, resume=FIXED, finetune=PARENT)
    model_type: str = rule("unigram", resume=FIXED, finetune=PARENT, choices=("unigram", "bpe"))
    character_coverage: float = rule(
        1.0,
        resume=FIXED,
        finetune=PARENT,
        range=Range(0.98, 1, note="SentencePiece's; 1 for small alphabets, 0.9995 for large ones"),
    )
    input_sentence_size: int = rule(
        1_000_000, resume=FIXED, finetune=PARENT, range=Range(0, note="0 = all, else > 100")
    )
    input_character_size: int = rule(
        50_000_000, resume=FIXED, finetune=PARENT, range=Range(0, note="0 = no cap")
    )
    user_defined_symbols: list[str] = rule(default_factory=list, resume=FIXED, finetune=PARENT)
    normalization: str = rule(
        "nmt_nfkc",
        resume=FIXED,
        finetune=PARENT,
        choices=("nmt_nfkc", "nfkc", "nmt_nfkc_cf", "nfkc_cf", "identity"),
    )
    byte_fallback: bool = rule(False, resume=FIXED, finetune=PARENT)
    remove_extra_whitespaces: bool = rule(True, resume=FIXED, finetune=PARENT)
    vocab_file: str | None = rule(None, resume=FIXED, finetune=PARENT)


# Choices that only run on a GPU backend: check_run_config refuses them elsewhere (named
# error), so the CPU test matrix tests that error instead of running them.
GPU_ONLY_CHOICES: dict[str, tuple[str, ...]] = {"attention": ("cudnn",)}


@dataclass(frozen=True)
class ModelConfig:
    """Transformer encoder-decoder hyperparameters (Vaswani et al. 2017, Table 3).

    Attributes:
      vocab_size: target vocabulary (and source too when shared); 0: the tokenizer's, filled
        in when the config is resolved (``seq2seq/resolve.py``).
      src_vocab_size: source vocabulary of separate vocabularies (0 = same as ``vocab_size``);
        filled from the tokenizer.
      d_model / num_heads / d_ff: model width, attention heads (d_model % num_heads == 0), FFN
        hidden width.
      num_encoder_layers / num_decoder_layers: stack depths.
      dropout_rate: residual dropout P_drop (§5.4): on each sublayer output before the residual
        add, and on the embeddings + positions. null: chosen when the config is resolved
        (``seq2seq/resolve.py``) from the passes over the training corpus
        (``seq2seq/data/recipe.py``).
      attention_dropout_rate: dropout on the attention weights (after softmax).
      activation_dropout_rate: dropout on the FFN hidden activation.
      activation: FFN nonlinearity: ``relu`` (paper), ``gelu`` (Hendrycks & Gimpel 2016, tanh
        approximation; Hugging Face's ``gelu_new``), ``gelu_erf`` (the exact x·Φ(x) with erf;
        Hugging Face's ``gelu``, MarianConfig's default), ``swish`` (x·sigmoid(x), SiLU;
        Ramachandran et al. 2017; Marian's), or the gated ``swiglu`` / ``geglu`` (Shazeer 2020;
        three d_model×d_ff matrices).
      norm: ``post`` (paper: LayerNorm(x + Sublayer(x))) or ``pre`` (x + Sublayer(LayerNorm(x))
        and a final LayerNorm per stack).
      positions: ``sinusoidal`` (§3.5), ``learned`` absolute (a ``max_len`` table per stack),
        ``relative`` (T5 bucketed bias per head, Raffel et al. 2020), ``rope`` (Su et al.
        2021), ``alibi`` (Press et al. 2022) or ``none``. Sinusoidal, RoPE and ALiBi have no
        length limit; ``learned`` fails for inputs longer than ``max_len``.
      sinusoidal_layout: where ``sinusoidal`` puts its sines and cosines: ``interleaved``
        (§3.5: sin at even, cos at odd features) or ``halves`` (all sines, then all cosines
        of the same frequencies: Marian's and OPUS-MT's table).
      relpos_buckets / relpos_max_distance: T5 relative-position buckets and the distance from
        which all positions share the last bucket (``relative`` only).
      rope_base: RoPE frequency base θ (Su et al. 2021, eq. 15; 10000).
      share_embeddings: ``all`` (one matrix for source, target and output projection, §3.4),
        ``target`` (source embedding; target embedding tied to the output projection) or
        ``none`` (three matrices). YAML ``true``/``false`` (the old boolean) mean ``all`` /
        ``target``.
      max_len: positions in the ``learned`` tables (unused by the other schemes).
      scale_embeddings: multiply token embeddings by √d_model (§3.4) before the positions are
        added; false: unscaled (Marian's ``scale_embedding: false``).
      logits_bias: add a learned bias ``[vocab]`` to the output logits (Marian's
        ``final_logits_bias``; zeros at init, trained like the other biases).
      norm_epsilon: ε of every LayerNorm (1e-6; PyTorch and Marian use 1e-5).
      dtype: compute dtype, ``float32`` or ``bfloat16``; parameters stay float32, matmuls
        accumulate in float32 (``model/precision.py``), and softmax, LayerNorm statistics,
        logits and the loss are float32.
      matmul_dtype: ``bfloat16`` rounds the operands of every projection (Q/K/V/output,
        FFN, logits) to bfloat16, in the forward and both gradient products, and accumulates in
        float32, while activations, residuals, LayerNorm, softmax and dropout stay in
        ``dtype`` (float32): bf16 matrix-unit speed (AMX, AVX512-BF16) without bfloat16
        elementwise work. ``float32``: operands as they are in ``dtype``.
      attention: ``dense`` (the whole score matrix; the reference), ``chunked`` (blockwise
        with an online softmax, O(n) memory in forward and backward, the same values) or
        ``cudnn`` (cuDNN flash attention in bfloat16, GPU only); see ``model/attention.py``.
      attention_q_block / attention_kv_block: ``chunked`` query and key block sizes.

    Raises:
      ConfigError: a string setting is not one of its choices (the message names the key).
    """

    vocab_size: int = rule(
        0, resume=FIXED, finetune=FIXED, range=Range(0, note="0 = the tokenizer's")
    )
    src_vocab_size: int = rule(
        0, resume=FIXED, finetune=FIXED, range=Range(0, note="0 = vocab_size or the tokenizer's")
    )
    d_model: int = rule(256, resume=FIXED, finetune=FIXED, range=Range(1))
    num_heads: int = rule(4, resume=FIXED, finetune=FIXED, range=Range(1))
    num_encoder_layers: int = rule(3, resume=FIXED, finetune=FIXED, range=Range(1))
    num_decoder_layers: int = rule(3, resume=FIXED, finetune=FIXED, range=Range(1))
    d_ff: int = rule(1024, resume=FIXED, finetune=FIXED, range=Range(1))
    dropout_rate: float | None = rule(0.1, resume=FREE, range=Range(0, 1, high_open=True))
    attention_dropout_rate: float = rule(0.0, resume=FREE, range=Range(0, 1, high_open=True))
    activation_dropout_rate: float = rule(0.0, resume=FREE, range=Range(0, 1, high_open=True))
    activation: str = rule(
        "relu",
        resume=FIXED,
        finetune=FIXED,
        choices=("relu", "gelu", "gelu_erf", "swish", "swiglu", "geglu"),
    )
    norm: str = rule("pre", resume=FIXED, finetune=FIXED, choices=("pre", "post"))
    positions: str = rule(
        "sinusoidal",
        resume=FIXED,
        finetune=FIXED,
        choices=("sinusoidal", "learned", "relative", "rope", "alibi", "none"),
    )
    sinusoidal_layout: str = rule(
        "interleaved", resume=FIXED, finetune=FIXED, choices=("interleaved", "halves")
    )
    relpos_buckets: int = rule(32, resume=FIXED, finetune=FIXED, range=Range(1))
    relpos_max_distance: int = rule(128, resume=FIXED, finetune=FIXED, range=Range(1))
    rope_base: float = rule(10_000.0, resume=FIXED, finetune=FIXED, range=Range(0, low_open=True))
    share_embeddings: str = rule(
        "all", resume=FIXED, finetune=FIXED, choices=("all", "target", "none")
    )
    max_len: int = rule(512, resume=FIXED, finetune=FIXED, range=Range(1))
    scale_embeddings: bool = rule(True, resume=FIXED, finetune=FIXED)
    logits_bias: bool = rule(False, resume=FIXED, finetune=FIXED)
    norm_epsilon: float = rule(1e-6, resume=FIXED, finetune=FIXED, range=Range(0, low_open=True))
    dtype: str = rule("float32", resume=FREE, choices=("float32", "bfloat16"))
    matmul_dtype: str = rule("float32", resume=FREE, choices=("float32", "bfloat16"))
    attention: str = rule("dense", resume=FREE, choices=("dense", "chunked", "cudnn"))
    attention_q_block: int = rule(256, resume=FREE, range=Range(1))
    attention_kv_block: int = rule(256, resume=FREE, range=Range(1))

    def __post_init__(self):
        # The field used to be a bool; YAML true/false arrive as bools or "True"/"False".
        legacy = {"true": "all", "false": "target"}
        sharing = str(self.share_embeddings)
        object.__setattr__(self, "share_embeddings", legacy.get(sharing.lower(), sharing))
        for key, choices in MODEL_CHOICES.items():
            if getattr(self, key) not in choices:
                raise ConfigError(
                    f"model.{key} must be one of {', '.join(choices)}; got {getattr(self, key)!r}"
                )

    @property
    def residual_dropout(self) -> float:
        """``dropout_rate`` once chosen.

        Raises:
          ConfigError: it is still null (a config not resolved by ``seq2seq.resolve``).
        """
        if self.dropout_rate is None:
            raise ConfigError("model.dropout_rate is null: resolve the config (seq2seq.resolve)")
        return self.dropout_rate


# Choices of the string-valued model settings (checked when a config is built).
MODEL_CHOICES: dict[str, tuple[str, ...]] = {
    f.name: f.metadata["rule"].choices
    for f in dataclasses.fields(ModelConfig)
    if f.metadata["rule"].choices
}


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation and the training loop.

    Attributes:
      seed: seeds the initial parameters, the dropout keys and the data order.
      steps: total optimizer steps; 0 = ``token_budget / (data.max_tokens · grad_accum_steps)``.
      token_budget: training tokens per side that ``steps`` = 0 spends (960 steps of 2,048
        tokens: about 15 minutes of the shipped preset on 2 CPU cores).
      learning_rate: peak learning rate, reached after ``warmup_steps`` (linear warmup), then
        decayed as ``schedule`` says.
      warmup_steps: steps of the linear warmup to ``learning_rate``; 0 = a fifth of ``steps``
        (``seq2seq/data/recipe.py``).
      schedule: the decay after the warmup (``seq2seq.training.step.learning_rate_schedule``):
        ``rsqrt`` (inverse square root) or ``linear`` (to zero at ``steps``).
      b1, b2, eps, weight_decay: AdamW (Loshchilov & Hutter 2019); decay skips biases/norms.
      clip_norm: global gradient-norm clip (0 disables).
      label_smoothing: ε of label-smoothed cross-entropy (Szegedy et al. 2016).
      grad_accum_steps: micro-batches per optimizer step; their gradients are summed and divided
        by their total number of real target tokens, so one step sees ``grad_accum_steps ×
        data.max_tokens`` tokens per side.
      max_skipped_steps: stop with an error after this many optimizer steps in a row with a
        non-finite loss or gradient (each is skipped; 0 = never stop).
      eval_every / checkpoint_every / log_every: intervals in steps. Every ``eval_every`` steps
        the dev split is scored (teacher-forced loss and accuracy, and BLEU if ``dev_bleu``).
      dev_bleu: also decode dev sentences and score them with sacreBLEU at each evaluation.
      bleu_subset: decode only the first N dev sentences for dev BLEU (0 = all of them).
      bleu_beam_size: beam size for dev BLEU (1 = greedy; 0 = ``decode.beam_size``): dev BLEU
        decodes with beam search and the other ``decode`` keys (length penalty, limits)
        whatever ``decode.search`` says (a sampled or MBR score moves with the seed, and MBR
        costs more); the test decode at the end uses ``decode.search``.
      best_metric: ``bleu`` (dev BLEU, higher is better; needs ``dev_bleu``), ``chrf`` (dev
        chrF, sacreBLEU's chrF2, higher is better; needs ``dev_bleu``) or ``loss`` (dev loss,
        lower is better): selects the best checkpoint and drives early stopping.
      keep_checkpoints: how many recent checkpoints are kept.
      keep_best: also keep the checkpoint with the best ``best_metric`` (a checkpoint is saved
        at every evaluation that improves it).
      patience: stop early after this many evaluations in a row without improving
        ``best_metric`` (0 = never); the count is checkpointed, so it survives resume.
      test_checkpoint: parameters decoded for the final test score: ``best`` (the best
        checkpoint, if any) or ``last``.
      max_seconds: stop (and checkpoint) after this much training wall time (0 = no limit).
      time_budget: size the run to this many seconds of training time (0 = off; dev
        evaluations and checkpoints are not counted). Before a new run's config is resolved,
        its compiled step is timed on random batches of its shapes
        (``seq2seq.training.probe``), and ``steps`` left to the recipe becomes the count the
        budget buys at that speed, which the warmup (a fifth) and the dropout rule count.
        When the run reaches the end of its warmup, the step count that fills the rest of
        the budget at the speed measured over the warmup
        (``seq2seq.data.recipe.steps_for_time_budget``) replaces ``steps`` as the run's end
        and the schedule's horizon, so a ``linear`` decay ends with the budget; the step is
        compiled once and reads the horizon as a value. The chosen count is logged and kept
        in the checkpoints (a resume keeps it; ``config.yaml`` keeps the resolved ``steps``)
        and in ``test.json`` (``steps``). The run's length then depends on the machine's
        speed. A given
        ``warmup_steps`` longer than the recipe's provisional steps raises them to it (the
        budget would otherwise never be applied).
      init_from: start from the weights of a trained run (a workdir: its newest checkpoint, or
        a checkpoint directory ``<workdir>/checkpoints/<step>``) instead of a random init,
        reusing its SentencePiece model(s) (copied into this workdir, not retrained); the model
        settings must match (those ``free`` on fine-tuning may differ: the dropout rates,
        ``dtype``, ``matmul_dtype`` and the attention kernel and its blocks). Only a
        run with no checkpoint of its own starts from it; a resume continues from its own
        checkpoint.
      init_optimizer: with ``init_from``, also load the optimizer state (Adam moments and
        update count): the learning-rate schedule then continues where the parent stopped
        (no second warmup), while this run's own step counter (``train.steps``, intervals,
        checkpoint names) starts at 0. Without it, a fresh optimizer and schedule.
      ema_decay: exponential moving average of the weights, ema ← d·ema + (1-d)·params after
        every optimizer step (ema starts at the initial weights; a skipped step leaves it);
        0 = off. When on, dev evaluation, the best checkpoint, the test decode and
        ``seq2seq-translate``/``seq2seq-evaluate`` of the run use the EMA weights;
        checkpoints hold both.
      lora_rank: rank r of low-rank adapters (LoRA, Hu et al. 2021) on the projections
        ``lora_targets`` of a model started from ``init_from``; only the adapters train
        (the base weights are frozen and get no optimizer state), and translate, evaluate,
        score, serve, export, average and a later ``init_from`` read the run with the
        adapters merged into the weights (``seq2seq/model/lora.py``). 0 = off (full
        fine-tuning). At most ``model.d_model``; needs ``init_from``, refuses
        ``init_optimizer``.
      lora_alpha: the adapters' scale α: a projection computes x·W + (α / r)·x·A·B (> 0).
      lora_targets: the projections that get adapters: ``query``, ``key``, ``value``,
        ``out`` (every self- and cross-attention), ``wi``, ``wi_gate`` (gated activations
        only), ``wo`` (the FFN), or the groups ``attention`` (the four) and ``ffn``.
      allow_config_change: resume a run whose saved ``config.yaml`` differs in a key that
        changes what the run is (model, tokenizer, training data, batch arithmetic, optimizer,
        schedule, seed); without it such a resume is refused (the keys whose rule is ``free``
        on resume, ``RESUMABLE``, may always change). The data position is then remapped by
        examples and ``summary.md`` records the changes.
      allow_data_change: resume a run whose training text changed since its tokenizer was
        trained (the files, or how they are read): the run's SentencePiece model(s) are kept
        and the new text is tokenized with them (pieces they lack become unknown or bytes).
        Without it such a resume is refused, naming the model and the files: a run with
        checkpoints never retrains its tokenizer, whose pieces their embeddings index. The
        tokenizer options may not change either way, and a run without checkpoints trains
        its tokenizer on the new text whatever this says.
    """

    seed: int = rule(0, resume=FIXED)
    steps: int = rule(0, resume=FREE, range=Range(0, note="0 = from train.token_budget"))
    token_budget: int = rule(960 * 2048, resume=FREE, range=Range(1))
    learning_rate: float = rule(2e-3, resume=FIXED, range=Range(0))
    warmup_steps: int = rule(0, resume=FIXED, range=Range(0, note="0 = a fifth of the steps"))
    schedule: str = rule("rsqrt", resume=FIXED, choices=("rsqrt", "linear"))
    b1: float = rule(0.9, resume=FIXED, range=Range(0, 1, high_open=True))
    b2: float = rule(0.98, resume=FIXED, range=Range(0, 1, high_open=True))
    eps: float = rule(1e-9, resume=FIXED, range=Range(0))
    weight_decay: float = rule(1e-4, resume=FIXED, range=Range(0))
    clip_norm: float = rule(1.0, resume=FIXED, range=Range(0, note="0 = off"))
    label_smoothing: float = rule(0.1, resume=FIXED, range=Range(0, 1, high_open=True))
    grad_accum_steps: int = rule(1, resume=FIXED, range=Range(1))
    max_skipped_steps: int = rule(10, resume=FREE, range=Range(0, note="0 = never stop"))
    eval_every: int = rule(500, resume=FREE, range=Range(1))
    checkpoint_every: int = rule(500, resume=FREE, range=Range(1))
    log_every: int = rule(50, resume=FREE, range=Range(1))
    dev_bleu: bool = rule(True, resume=FREE)
    bleu_subset: int = rule(500, resume=FREE, range=Range(0, note="0 = all"))
    bleu_beam_size: int = rule(1, resume=FREE, range=Range(0, note="0 = decode.beam_size"))
    best_metric: str = rule("bleu", resume=FIXED, choices=("bleu", "chrf", "loss"))
    keep_checkpoints: int = rule(3, resume=FREE, range=Range(0))
    keep_best: bool = rule(True, resume=FREE)
    patience: int = rule(0, resume=FREE, range=Range(0, note="0 = never"))
    test_checkpoint: str = rule("best", resume=FREE, choices=("best", "last"))
    max_seconds: float = rule(0.0, resume=FREE, range=Range(0, note="seconds; 0 = off"))
    time_budget: float = rule(0.0, resume=FREE, range=Range(0, note="seconds; 0 = off"))
    init_from: str | None = rule(None, resume=FIXED)
    init_optimizer: bool = rule(False, resume=FIXED)
    ema_decay: float = rule(
        0.0, resume=FIXED, range=Range(0, 1, high_open=True, note="0 = off; e.g. 0.999")
    )
    lora_rank: int = rule(0, resume=FIXED, range=Range(0, note="0 = off"))
    lora_alpha: float = rule(16.0, resume=FIXED, range=Range(0, low_open=True, note="scale α / r"))
    lora_targets: list[str] = rule(
        default_factory=lambda: ["attention"],
        resume=FIXED,
        choices=("attention", "ffn", "query", "key", "value", "out", "wi", "wi_gate", "wo"),
    )
    allow_config_change: bool = rule(False, resume=FREE)
    allow_data_change: bool = rule(False, resume=FREE)


@dataclass(frozen=True)
class DecodeConfig:
    """Decoding: beam search (Wu et al. 2016 length penalty ((5+|Y|)/6)^alpha), greedy search,
    sampling or minimum Bayes risk (MBR) decoding; one strategy each (``seq2seq.search``).

    The stopping and length rules are documented in ``seq2seq/decoding.py``.

    Attributes:
      search: ``beam``, ``greedy``, ``sampling`` (the n-best are independent samples) or ``mbr``
        (candidates chosen by expected chrF against the others; Freitag et al. 2023).
      beam_size: hypotheses kept per sentence (1 = greedy search).
      alpha: length-penalty exponent (≥ 0).
      length_penalty: ``gnmt`` ((5+|Y|)/6)^α, ``plain`` |Y|^α or ``none``.
      max_len_a / max_len_b: output length limit ``ceil(a · |source| + b)`` tokens (EOS
        included; ``output_limit``).
      min_length: at least this many tokens before EOS (0 = no minimum; the maximum wins).
      max_tokens: source-token budget per decoding batch.
      test_limit: decode only the first N test sentences at the end of training (0 = all).
      temperature: sampling temperature (> 0).
      top_k: sample among the k most probable tokens (0 = all; Fan et al. 2018).
      top_p: nucleus sampling mass in (0, 1] (1 = all; Holtzman et al. 2020).
      epsilon: drop tokens less probable than this, in [0, 1) (0 = off; epsilon sampling,
        Hewitt et al. 2022); null (the default) leaves it to the search,
        ``sampling_epsilon``: 0.02 for MBR's sampled candidates (Freitag et al. 2023,
        "Epsilon Sampling Rocks"), 0 for ``sampling``. A run's ``config.yaml`` keeps the null,
        so ``--search mbr`` on a run trained with beam search samples with 0.02 too.
      mbr_candidates: where MBR's candidates come from: ``sampling`` (the sampling keys) or
        ``beam`` (the n-best of a beam of ``mbr_size``; ``beam_size`` does not apply).
      mbr_size: MBR candidates per sentence, also its pseudo-references (≥ 2).
      seed: sampling seed; a sentence's samples depend on it and the sentence's line number.
      allow_unk: let the search produce the unknown piece (written `` ⁇ `` in the text);
        by default it is never generated.
    """

    search: str = rule("beam", resume=FREE, choices=("beam", "greedy", "sampling", "mbr"))
    beam_size: int = rule(4, resume=FREE, range=Range(1))
    alpha: float = rule(0.6, resume=FREE, range=Range(0))
    length_penalty: str = rule("gnmt", resume=FREE, choices=("gnmt", "plain", "none"))
    max_len_a: float = rule(1.5, resume=FREE, range=Range(0))
    max_len_b: int = rule(10, resume=FREE, range=Range(1))
    min_length: int = rule(0, resume=FREE, range=Range(0))
    max_tokens: int = rule(8192, resume=FREE, range=Range(1))
    test_limit: int = rule(0, resume=FREE, range=Range(0, note="0 = all"))
    temperature: float = rule(1.0, resume=FREE, range=Range(0, low_open=True), only_for=SAMPLING)
    top_k: int = rule(0, resume=FREE, range=Range(0, note="0 = off"), only_for=SAMPLING)
    top_p: float = rule(
        1.0, resume=FREE, range=Range(0, 1, low_open=True, note="1 = off"), only_for=SAMPLING
    )
    seed: int = rule(0, resume=FREE, only_for=SAMPLING)
    epsilon: float | None = rule(
        None, resume=FREE, range=Range(0, 1, high_open=True, note="0 = off"), only_for=SAMPLING
    )
    mbr_candidates: str = rule("sampling", resume=FREE, choices=("sampling", "beam"))
    mbr_size: int = rule(16, resume=FREE, range=Range(2, note="candidates per sentence"))
    allow_unk: bool = rule(False, resume=FREE)

    def __post_init__(self):
        for key in ("search", "mbr_candidates"):
            options = choices(f"decode.{key}")
            if getattr(self, key) not in options:
                raise ConfigError(
                    f"decode.{key} must be one of {', '.join(options)}; got {getattr(self, key)!r}"
                )

    @property
    def sampling_epsilon(self) -> float:
        """The ε that sampling uses: ``epsilon``, or when it is null the search's default,
        0.02 for MBR's sampled candidates (Freitag et al. 2023) and 0 (off) otherwise."""
        if self.epsilon is not None:
            return self.epsilon
        return 0.02 if self.search == "mbr" and self.mbr_candidates == "sampling" else 0.0

    def output_limit(self, source_tokens: int) -> int:
        """Output length limit in tokens, EOS included, for a source of ``source_tokens``
        tokens (EOS included): ``ceil(max_len_a · source_tokens + max_len_b)``, rounded to 1e-9
        first (so 0.1 · 30 is 3). The one rule of the search, its buckets and the export."""
        return math.ceil(round(self.max_len_a * source_tokens + self.max_len_b, 9))


@dataclass(frozen=True)
class MeshConfig:
    """Device mesh for ``jax.jit`` over named axes (rules in ``seq2seq.sharding.RULES``).

    The product of the three sizes must equal the number of devices (of all processes);
    one size may be -1 to take the remaining devices.

    Attributes:
      data: data-parallel replicas (batch rows split, parameters replicated).
      fsdp: fully-sharded data parallel (batch rows split, and parameters and optimizer state
        split along ``embed``; gathered per layer when used; Rajbhandari et al. 2020, ZeRO-3).
      tensor: Megatron tensor parallel (attention heads, FFN hidden units and the vocabulary
        split; Shoeybi et al. 2019).
    """

    data: int = rule(-1, resume=FREE)
    fsdp: int = rule(1, resume=FREE)
    tensor: int = rule(1, resume=FREE)


@dataclass(frozen=True)
class DistributedConfig:
    """Multi-process (multi-host) start-up through ``jax.distributed.initialize``.

    Nothing happens for a single process (the default). Set ``coordinator_address``,
    ``num_processes`` and ``process_id`` explicitly (e.g. ``distributed.process_id=1`` on the
    command line of the second process), or set ``auto: true`` to let JAX read them from the
    cluster environment (SLURM, Open MPI, TPU pod slices, or the ``JAX_COORDINATOR_ADDRESS``
    variable with the others detected).

    Attributes:
      coordinator_address: ``host:port`` of process 0 (reachable from every process).
      num_processes: total number of processes.
      process_id: this process's index in ``[0, num_processes)``.
      auto: call ``jax.distributed.initialize()`` and let JAX detect the cluster.
      initialization_timeout: seconds to wait for all processes to connect.
    """

    coordinator_address: str | None = rule(None, resume=FREE)
    num_processes: int | None = rule(None, resume=FREE, range=Range(1))
    process_id: int | None = rule(None, resume=FREE, range=Range(0))
    auto: bool = rule(False, resume=FREE)
    initialization_timeout: int = rule(300, resume=FREE, range=Range(1, note="seconds"))


@dataclass(frozen=True)
class Config:
    """A whole run: where it lives and every section above.

    Attributes:
      workdir: the run directory: checkpoints, the resolved ``config.yaml``, the tokenizer,
        logs and scores; a rerun there resumes the run.
    """

    workdir: str = rule("runs/default", resume=FREE)
    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    mesh: MeshConfig = field(default_factory=MeshConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)


def _section(f: dataclasses.Field) -> Any:
    """The dataclass of a section field of ``Config`` (``data``, ``model``, ...), else None."""
    factory = f.default_factory
    return factory if isinstance(factory, type) and dataclasses.is_dataclass(factory) else None


def rules(section: Any = Config, prefix: str = "") -> dict[str, Rule]:
    """``{"train.steps": Rule(...), ...}``: the rule of every key of the schema, by its dotted
    key (a corpus split such as ``data.train`` is one key: its entries' keys follow it).

    Raises:
      ConfigError: a field states no rule (give it one with ``rule``).
    """
    out: dict[str, Rule] = {}
    for f in dataclasses.fields(section):
        if _section(f) is not None:
            out.update(rules(_section(f), f"{prefix}{f.name}."))
        elif "rule" in f.metadata:
            out[prefix + f.name] = f.metadata["rule"]
        else:
            raise ConfigError(f"{prefix}{f.name} has no rule in the schema (seq2seq/config.py)")
    return out


def rule_of(key: str) -> Rule:
    """The rule of a dotted key as ``flatten`` writes it (``data.dev.path``: ``data.dev``'s).

    Raises:
      KeyError: the key is not in the schema.
    """
    table = rules()
    parts = key.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in table:
            return table[".".join(parts[:n])]
    raise KeyError(key)


def choices(key: str) -> tuple[str, ...]:
    """The choices of a dotted key (``train.schedule``), empty when it has none."""
    return rule_of(key).choices


def range_of(key: str) -> Range | None:
    """The ``Range`` of a dotted key (``decode.top_p``), None when it has none."""
    return rule_of(key).range


def key_type(key: str) -> type:
    """The type of a dotted key's values (``int`` for ``decode.beam_size``; ``float`` for the
    optional ``decode.epsilon``: the type besides None).

    Raises:
      KeyError: the key is not a leaf of the schema.
    """
    section: Any = Config
    *heads, name = key.split(".")
    for head in heads:
        section = get_type_hints(section).get(head)
        if not (isinstance(section, type) and dataclasses.is_dataclass(section)):
            raise KeyError(key)
    hint = get_type_hints(section).get(name)
    if hint is None:
        raise KeyError(key)
    found = [t for t in getattr(hint, "__args__", (hint,)) if t is not type(None)]
    return cast(type, found[0])


def range_problems(section: Any, prefix: str) -> list[str]:
    """``decode.top_p must be in (0, 1] (1 = off), got 1.5`` for every value of ``section``
    (a schema dataclass such as a ``DecodeConfig``, its keys under ``prefix``) outside its
    key's ``Range``, in the schema's order."""
    out = []
    for f in dataclasses.fields(section):
        found = f.metadata.get("rule")
        problem = found.range.problem(getattr(section, f.name)) if found and found.range else None
        if problem:
            out.append(f"{prefix}{f.name} {problem}")
    return out


def check_ranges(section: Any, prefix: str) -> None:
    """Refuse the values of ``section`` outside their keys' ``Range`` (``range_problems``).

    Raises:
      ConfigError: every such value, ``train.eval_every must be ≥ 1, got 0``, joined by ``; ``.
    """
    problems = range_problems(section, prefix)
    if problems:
        raise ConfigError("; ".join(problems))


# Keys that may change when a run resumes, and those whose change moves the data position.
RESUMABLE = tuple(k for k, r in rules().items() if r.resume == FREE)
BATCHING = tuple(k for k, r in rules().items() if r.resume == REMAPPED)
# Keys that only a search that samples reads (their flags are refused with any other search).
SAMPLING_ONLY = tuple(k for k, r in rules().items() if r.only_for == SAMPLING)


def _set_corpus_lists(merged: Any, layer: Any) -> Any:
    """Apply ``layer``'s ``data.{train,dev,test}`` to ``merged`` where a list is involved
    (OmegaConf cannot merge a list into a mapping): a list replaces the split; over a list,
    ``{"<i>": {...}}`` (from ``data.train.<i>.key=value``) merges into entry i. Returns the
    layer without the keys it applied.
    """
    data = layer.get("data") if isinstance(layer, DictConfig) else None
    if not isinstance(data, DictConfig):
        return layer
    layer = copy.deepcopy(layer)
    OmegaConf.set_readonly(merged.data, False)  # frozen dataclass: a list is assigned here
    for split in SPLITS:
        if split not in layer.data:
            continue
        value, current = layer.data[split], merged.data[split]
        if isinstance(value, ListConfig):
            merged.data[split] = value
        elif isinstance(current, ListConfig) and isinstance(value, DictConfig):
            for index in value:
                name = str(index)
                if not name.isdigit() or int(name) >= len(current):
                    raise ConfigError(
                        f"data.{split} is a list of {len(current)} corpora: set an entry's key "
                        f"as data.{split}.<i>.<key> (i < {len(current)}) or give the whole "
                        f"list, not data.{split}.{name}"
                    )
                current[int(name)] = OmegaConf.merge(current[int(name)], value[index])
        else:
            continue
        del layer.data[split]
    return layer


def _merge(*layers: Any) -> Config:
    try:
        merged = OmegaConf.structured(Config)
        for layer in layers:
            merged = OmegaConf.merge(merged, _set_corpus_lists(merged, layer))
        return cast(Config, OmegaConf.to_object(merged))
    except OmegaConfBaseException as e:  # names the full key and the bad value
        raise ConfigError(str(e).splitlines()[0] + f" (key: {getattr(e, 'full_key', '?')})") from e


def _former_keys(layer: Any, where: str) -> Any:
    """``layer`` with keys of earlier versions written as today's: ``decode.sampling: true``
    (configs and runs from before ``decode.search``) is ``decode.search: sampling``, ``false``
    is nothing.

    Raises:
      ConfigError: ``decode.sampling: true`` beside another ``decode.search`` (names ``where``).
    """
    decode = layer.get("decode") if isinstance(layer, DictConfig) else None
    if not isinstance(decode, DictConfig) or "sampling" not in decode:
        return layer
    layer = copy.deepcopy(layer)
    if str(layer.decode.pop("sampling")).lower() == "true":
        if layer.decode.get("search", "sampling") != "sampling":
            raise ConfigError(
                f"{where}: decode.sampling=true contradicts decode.search="
                f"{layer.decode.search}; set decode.search alone"
            )
        layer.decode.search = "sampling"
    return layer


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> Config:
    """Build a Config from defaults, an optional YAML file and ``key=value`` overrides.

    Args:
      path: YAML file whose nested mapping mirrors ``Config``; None for defaults only.
      overrides: strings like ``train.steps=100`` or ``data.packing=false``; values are parsed
        as YAML scalars.

    Raises:
      ConfigError: the file is missing or not a mapping, an override lacks ``=``, a key is not
        in the schema, or a value has the wrong type; the message names the file or key.
    """
    layers: list[Any] = []
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}")
        try:
            data = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f"{p}:{mark.line + 1}" if mark is not None else str(p)
            problem = getattr(e, "problem", None) or str(e).splitlines()[0]
            raise ConfigError(f"{where}: invalid YAML: {problem}") from e
        if not isinstance(data, dict):
            raise ConfigError(f"{p}: top level must be a mapping, got {type(data).__name__}")
        layers.append(_former_keys(OmegaConf.create(data), str(p)))
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key=value")
    # one layer per override: a later one may replace a split by a list of corpora
    layers += [_former_keys(OmegaConf.from_dotlist([item]), repr(item)) for item in overrides]
    try:
        return _merge(*layers)
    except ConfigError as e:
        message = str(e)
        for item in reversed(list(overrides)):  # the last override of a key is the one used
            key = item.partition("=")[0].strip()
            if f"(key: {key})" in message or message.startswith((f"{key} ", f"{key}=")):
                raise ConfigError(f"override {item!r}: {message}") from e
        raise ConfigError(f"{path or 'overrides'}: {message}") from e


def check_position_limits(
    config: Config, source_limit: int, source_key: str, *, capped: bool = False
) -> None:
    """Decoding lengths must fit a ``learned`` position table (``model.max_len`` rows; the
    other schemes have no limit): sources of up to S tokens and outputs of up to
    ``decode.output_limit(S)`` tokens, where S is ``source_limit``
    (set by ``source_key``), or ``min(source_limit, model.max_len)`` when ``capped``. A gather
    past the table would be clamped silently.

    Raises:
      ConfigError: naming the keys and their values, and a ``model.max_len`` that fits.
    """
    m, d = config.model, config.decode
    if m.positions != "learned":
        return
    table = f"model.positions=learned has a table of model.max_len={m.max_len} positions"
    if source_limit > m.max_len and not capped:
        raise ConfigError(
            f"{table}, fewer than the {source_limit} source tokens of "
            f"{source_key}; lower {source_key} or raise model.max_len"
        )

    def longest(rows: int) -> int:
        return d.output_limit(min(source_limit, rows) if capped else source_limit)

    if longest(m.max_len) > m.max_len:
        fits = next(n for n in range(m.max_len, longest(source_limit) + 2) if longest(n) <= n)
        source = min(source_limit, m.max_len) if capped else source_limit
        raise ConfigError(
            f"{table}, but outputs may reach decode.max_len_a={d.max_len_a} × "
            f"{source} source tokens ({source_key}) + decode.max_len_b="
            f"{d.max_len_b} = {longest(m.max_len)} tokens; set model.max_len="
            f"{fits} or more, or lower decode.max_len_a / decode.max_len_b"
        )


def replace(config: Any, **changes: Any) -> Any:
    """``dataclasses.replace`` with dotted keys: ``replace(c, **{"model.d_model": 8})``."""
    nested: dict[str, dict[str, Any]] = {}
    flat: dict[str, Any] = {}
    for key, value in changes.items():
        head, _, rest = key.partition(".")
        if rest:
            nested.setdefault(head, {})[rest] = value
        else:
            flat[head] = value
    for head, sub in nested.items():
        flat[head] = replace(getattr(config, head), **sub)
    return dataclasses.replace(config, **flat)


def to_dict(config: Any) -> dict[str, Any]:
    """The config as nested plain dicts and lists (for YAML/JSON)."""

    def plain(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        return [plain(v) for v in value] if isinstance(value, (list, tuple)) else value

    return cast(dict[str, Any], plain(dataclasses.asdict(config)))


def flatten(config: Any, prefix: str = "") -> dict[str, Any]:
    """``{"train.steps": 4000, ...}``: every leaf of a config by its dotted key."""
    out: dict[str, Any] = {}
    for key, value in (to_dict(config) if dataclasses.is_dataclass(config) else config).items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def config_yaml(config: Config) -> str:
    """The config as YAML text, keys in the dataclasses' order (what ``load_config`` reads)."""
    return yaml.safe_dump(to_dict(config), sort_keys=False)


def save_config(config: Config, path: str | Path) -> None:
    """Write the resolved config as YAML (loadable again with ``load_config``)."""
    Path(path).write_text(config_yaml(config), encoding="utf-8")
