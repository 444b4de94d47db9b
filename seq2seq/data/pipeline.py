"""From config to batches: read the splits, train/load the tokenizers, tokenize, filter, pack.

Token ids are cached in ``{workdir}/tokens/`` (see ``seq2seq.data.token_cache``), so a resumed
or second run reads them back instead of tokenizing again. Training pairs may be dropped by
the length and ratio filters; dev and test pairs never are: over-long dev pairs and test
sources are truncated, and every drop and truncation is counted in ``PreparedData.stats``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from seq2seq.config import Config, ConfigError, replace
from seq2seq.data.batching import PackedBatches
from seq2seq.data.documents import concat_pairs
from seq2seq.data.sources import load_parallel, overlap_report
from seq2seq.data.token_cache import encode_cached
from seq2seq.data.tokenizer import Tokenizer, TokenizerPair, check_options, train_or_load_pair

log = logging.getLogger(__name__)

# Sources up to this many tokens are decoded whole even when data.max_len is smaller
# (positions are sinusoidal, so the model can read past its training length).
MIN_DECODE_SOURCE_LEN = 256


@dataclass
class Corpus:
    """Raw text of one split: aligned ``sources`` and ``targets``."""

    sources: list[str]
    targets: list[str]


@dataclass
class PreparedData:
    """Everything training needs from the data side.

    Attributes:
      tokenizer: the run's source and target tokenizers (one model twice when joint); it can
        be used as a ``Tokenizer`` for translation (encode = source, decode = target).
      train: packed, shuffled training batches (batch k is a function of (seed, k)).
      dev: packed dev batches in corpus order (for loss/accuracy).
      dev_text / test_text: raw dev/test pairs (for BLEU).
      stats: what was read, dropped, truncated and cached, and how fast (see ``prepare``).
      skipped: ``split<TAB>file:line`` of every pair skipped for an empty side, in file order.
    """

    tokenizer: TokenizerPair
    train: PackedBatches
    dev: PackedBatches
    dev_text: Corpus
    test_text: Corpus
    stats: dict[str, float] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)


def decode_source_limit(config: Config) -> int:
    """Longest source, in tokens, that translation decodes whole: ``max(data.max_len, 256)``,
    and at most ``model.max_len`` with ``learned`` positions (the table has no more rows).

    The training loop gives this to ``Translator(max_src_len=...)`` for the test split, and
    ``prepare`` counts the test sources beyond it (``test_sources_truncated``).
    """
    limit = max(config.data.max_len, MIN_DECODE_SOURCE_LEN)
    return min(limit, config.model.max_len) if config.model.positions == "learned" else limit


def check_vocabularies(config: Config) -> None:
    """Reject tokenizer/model settings that cannot work together, before any data is read.

    Raises:
      ConfigError: separate vocabularies (``tokenizer.joint=false``) with
        ``model.share_embeddings=all``, or an invalid tokenizer option.
    """
    if not config.tokenizer.joint and config.model.share_embeddings == "all":
        raise ConfigError(
            "tokenizer.joint=false gives the source and target separate "
            "vocabularies, which cannot share one embedding matrix: set "
            "model.share_embeddings=target or none (or tokenizer.joint=true)"
        )
    try:
        check_options(config.tokenizer)
    except ValueError as e:
        raise ConfigError(str(e)) from e


def fill_vocab_sizes(config: Config, tokenizer: TokenizerPair) -> Config:
    """``config`` with ``model.vocab_size`` (and ``model.src_vocab_size`` for separate
    vocabularies) set from the tokenizers where they are 0.

    Raises:
      ConfigError: a size set in the config differs from the tokenizer's, or separate
        vocabularies meet ``model.share_embeddings=all``.
    """
    m = config.model
    if not tokenizer.joint and m.share_embeddings == "all":
        raise ConfigError(
            "the source and target tokenizers are separate models; set "
            "model.share_embeddings=target or none"
        )
    sizes = {"vocab_size": ("target", tokenizer.vocab_size)}
    if not tokenizer.joint:
        sizes["src_vocab_size"] = ("source", tokenizer.src_vocab_size)
    elif m.src_vocab_size not in (0, tokenizer.vocab_size):
        raise ConfigError(
            f"model.src_vocab_size={m.src_vocab_size} but the vocabulary is joint "
            f"({tokenizer.vocab_size} pieces); leave model.src_vocab_size at 0"
        )
    changes = {}
    for key, (side, size) in sizes.items():
        current = getattr(m, key)
        if current == 0:
            changes[f"model.{key}"] = size
        elif current != size:
            raise ConfigError(
                f"model.{key}={current} but the {side} tokenizer has {size} "
                f"pieces; leave model.{key} at 0"
            )
    return replace(config, **changes) if changes else config


def _read(config: Config, split: str, skipped: list[str]):
    data, places = config.data, list[str]()
    ds = load_parallel(
        getattr(data, split),
        data.src_lang,
        data.tgt_lang,
        skip_empty=data.skip_empty,
        split_name=split,
        skipped=places,
    )
    skipped.extend(f"{split}\t{place}" for place in places)
    return ds


def unknown_rate(ids: Sequence[np.ndarray], unk_id: int) -> float:
    """Share of the tokens (EOS included) in ``ids`` that are the unknown piece, in [0, 1]."""
    total = sum(len(x) for x in ids)
    return sum(int(np.sum(x == unk_id)) for x in ids) / total if total else 0.0


def _text(ds) -> Corpus:
    return Corpus(list(ds["source"]), list(ds["target"]))


def _truncate(
    ids: list[np.ndarray], max_len: int, eos_id: int
) -> tuple[list[np.ndarray], np.ndarray]:
    """Cut sequences longer than ``max_len`` to ``max_len - 1`` tokens + EOS.

    Returns the sequences and a bool ``[n]`` mask of the ones cut.
    """
    out, cut = [], np.zeros(len(ids), bool)
    for i, x in enumerate(ids):
        if len(x) > max_len:
            x = np.concatenate([x[: max_len - 1], [eos_id]]).astype(np.int32)
            cut[i] = True
        out.append(x)
    return out, cut


class _Encoder:
    """Tokenizes through the cache and tallies throughput and cache use into ``stats``."""

    def __init__(self, cache_dir: Path, stats: dict[str, float]):
        self.cache_dir, self.stats = cache_dir, stats
        for key in (
            "tokenize_sentences",
            "tokenize_seconds",
            "token_cache_hits",
            "token_cache_seconds",
        ):
            stats[key] = 0

    def __call__(self, tokenizer: Tokenizer, texts: Sequence[str], name: str) -> list[np.ndarray]:
        ids, hit, seconds = encode_cached(tokenizer, texts, self.cache_dir, name)
        if hit:
            self.stats["token_cache_hits"] += 1
            self.stats["token_cache_seconds"] += seconds
        else:
            self.stats["tokenize_sentences"] += len(texts)
            self.stats["tokenize_seconds"] += seconds
            if self.stats["tokenize_seconds"] > 0:
                self.stats["tokenize_sentences_per_second"] = (
                    self.stats["tokenize_sentences"] / self.stats["tokenize_seconds"]
                )
        return ids


def prepare(config: Config, workdir: str | Path, *, need_test: bool = True) -> PreparedData:
    """Read, tokenize and batch the corpus of ``config`` for a run in ``workdir``.

    Training pairs longer than ``data.max_len`` tokens on either side, or whose length ratio
    exceeds ``data.max_length_ratio``, are dropped (counted). Dev pairs are truncated to
    ``data.max_len`` tokens per side, test sources to ``decode_source_limit(config)``
    (counted); no dev or test pair is dropped.

    ``stats`` holds: ``train_pairs_read``, ``train_pairs`` (kept),
    ``train_pairs_dropped_length``, ``train_pairs_dropped_ratio``, ``train_documents``
    (with ``data.concat_pairs_to_tokens``: the pseudo-documents the kept pairs make), ``dev_pairs``,
    ``dev_pairs_truncated``, ``test_pairs``, ``test_sources_truncated``,
    ``dev_sources_in_train`` / ``test_sources_in_train`` (overlap), ``train_real_token_share``
    (epoch 0, in [0, 1]), ``read_seconds``, ``tokenizer_seconds`` (train or load the models),
    ``tokenize_sentences`` and ``tokenize_seconds`` (sentences tokenized now, not from the
    cache), ``tokenize_sentences_per_second`` (only when some were), ``token_cache_hits``
    (split sides read from the cache), ``token_cache_seconds`` and the unknown-piece rate
    of each side of each split (kept training pairs; dev and test before truncation), e.g.
    ``train_source_unknown_rate`` (share of tokens, EOS included, in [0, 1]).

    Raises:
      ConfigError: tokenizer settings that cannot work (see ``check_vocabularies``).
      DataError: a split cannot be read (see ``seq2seq.data.sources``).
      TokenizerError: a tokenizer cannot be trained or loaded.
      ValueError: no training pair survives the filters.
    """
    d = config.data
    check_vocabularies(config)
    start = time.perf_counter()
    skipped: list[str] = []
    train_ds, dev_ds = _read(config, "train", skipped), _read(config, "dev", skipped)
    test_ds = _read(config, "test", skipped) if need_test else None
    train, dev = _text(train_ds), _text(dev_ds)
    test = _text(test_ds) if need_test else Corpus([], [])
    stats: dict[str, float] = {
        "train_pairs_read": len(train.sources),
        "dev_pairs": len(dev.sources),
        "test_pairs": len(test.sources),
        "read_seconds": time.perf_counter() - start,
    }
    start = time.perf_counter()
    tokenizer = train_or_load_pair(
        train.sources,
        train.targets,
        config.tokenizer,
        workdir,
        src_lang=d.src_lang,
        tgt_lang=d.tgt_lang,
    )
    stats["tokenizer_seconds"] = time.perf_counter() - start
    encode = _Encoder(Path(workdir) / "tokens", stats)

    src = encode(tokenizer.source, train.sources, "train.source")
    tgt = encode(tokenizer.target, train.targets, "train.target")
    src_len = np.array([len(x) for x in src])
    tgt_len = np.array([len(x) for x in tgt])
    ratio = np.maximum(src_len, tgt_len) / np.maximum(np.minimum(src_len, tgt_len), 1)
    keep = np.flatnonzero(
        (src_len <= d.max_len) & (tgt_len <= d.max_len) & (ratio <= d.max_length_ratio)
    )
    stats["train_pairs_dropped_length"] = int(np.sum((src_len > d.max_len) | (tgt_len > d.max_len)))
    stats["train_pairs_dropped_ratio"] = int(
        len(src) - len(keep) - stats["train_pairs_dropped_length"]
    )
    stats["train_pairs"] = len(keep)
    if len(keep) == 0:
        raise ValueError(
            f"no training pair is within max_len={d.max_len} tokens and ratio "
            f"{d.max_length_ratio}; raise data.max_len"
        )
    src = [src[i] for i in keep]
    tgt = [tgt[i] for i in keep]
    if d.concat_pairs_to_tokens > 0:  # pseudo-documents (long inputs)
        src, tgt = concat_pairs(src, tgt, d.concat_pairs_to_tokens, tokenizer.eos_id)
        stats["train_documents"] = len(src)
    rows = max(1, d.max_tokens // d.max_len)
    train_batches = PackedBatches(
        src, tgt, max_len=d.max_len, rows=rows, seed=config.train.seed, packing=d.packing
    )
    stats["train_real_token_share"] = train_batches.real_token_share(0)

    dev_src, cut_src = _truncate(
        encode(tokenizer.source, dev.sources, "dev.source"), d.max_len, tokenizer.eos_id
    )
    dev_tgt, cut_tgt = _truncate(
        encode(tokenizer.target, dev.targets, "dev.target"), d.max_len, tokenizer.eos_id
    )
    stats["dev_pairs_truncated"] = int(np.sum(cut_src | cut_tgt))
    dev_batches = PackedBatches(
        dev_src, dev_tgt, max_len=d.max_len, rows=rows, packing=d.packing, shuffle=False
    )
    unknown = {
        "train.source": (src, tokenizer.source),
        "train.target": (tgt, tokenizer.target),
        "dev.source": (dev_src, tokenizer.source),
        "dev.target": (dev_tgt, tokenizer.target),
    }
    if need_test:
        test_src = encode(tokenizer.source, test.sources, "test.source")
        limit = decode_source_limit(config)
        stats["test_sources_truncated"] = int(sum(len(x) > limit for x in test_src))
        test_tgt = encode(tokenizer.target, test.targets, "test.target")
        unknown.update(
            {
                "test.source": (test_src, tokenizer.source),
                "test.target": (test_tgt, tokenizer.target),
            }
        )
    for name, (ids, tok) in unknown.items():
        stats[f"{name.replace('.', '_')}_unknown_rate"] = unknown_rate(ids, tok.unk_id)
    log.info(
        "unknown pieces (share of tokens): %s",
        ", ".join(
            f"{name} {stats[name.replace('.', '_') + '_unknown_rate']:.3%}" for name in unknown
        ),
    )

    stats["dev_sources_in_train"] = overlap_report(train_ds, dev_ds)
    if need_test:
        stats["test_sources_in_train"] = overlap_report(train_ds, test_ds)
    if stats["dev_pairs_truncated"]:
        log.warning(
            "dev: %d pairs longer than data.max_len=%d tokens truncated (none dropped)",
            stats["dev_pairs_truncated"],
            d.max_len,
        )
    if stats.get("test_sources_truncated"):
        log.warning(
            "test: %d sources longer than %d tokens will be truncated (none dropped)",
            stats["test_sources_truncated"],
            decode_source_limit(config),
        )
    log.info("data: %s", ", ".join(f"{k}={v:.6g}" for k, v in stats.items()))
    return PreparedData(tokenizer, train_batches, dev_batches, dev, test, stats, skipped)
