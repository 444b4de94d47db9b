"""From config to batches: read the splits, train/load the tokenizer, tokenize, filter, pack."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from seq2seq.config import Config
from seq2seq.data.batching import PackedBatches
from seq2seq.data.sources import load_parallel, overlap_report
from seq2seq.data.tokenizer import Tokenizer, train_or_load

log = logging.getLogger(__name__)


@dataclass
class Corpus:
    """Raw text of one split: aligned ``sources`` and ``targets``."""

    sources: list[str]
    targets: list[str]


@dataclass
class PreparedData:
    """Everything training needs from the data side.

    Attributes:
      tokenizer: the run's SentencePiece tokenizer.
      train: packed, shuffled training batches (batch k is a function of (seed, k)).
      dev: packed dev batches in corpus order (for loss/accuracy).
      dev_text / test_text: raw dev/test pairs (for BLEU).
      stats: counts reported to the user (pairs, filtered, truncated, overlap, throughput).
    """

    tokenizer: Tokenizer
    train: PackedBatches
    dev: PackedBatches
    dev_text: Corpus
    test_text: Corpus
    stats: dict[str, float] = field(default_factory=dict)


def _read(config: Config, split: str):
    data = config.data
    return load_parallel(getattr(data, split), data.src_lang, data.tgt_lang,
                         skip_empty=data.skip_empty, split_name=split)


def _text(ds) -> Corpus:
    return Corpus(list(ds["source"]), list(ds["target"]))


def _truncate(ids: list[np.ndarray], max_len: int, eos_id: int) -> tuple[list[np.ndarray], int]:
    out, count = [], 0
    for x in ids:
        if len(x) > max_len:
            x = np.concatenate([x[: max_len - 1], [eos_id]]).astype(np.int32)
            count += 1
        out.append(x)
    return out, count


def prepare(config: Config, workdir: str | Path, *, need_test: bool = True) -> PreparedData:
    """Read, tokenize and batch the corpus of ``config`` for a run in ``workdir``.

    Training pairs longer than ``data.max_len`` tokens on either side, or whose length ratio
    exceeds ``data.max_length_ratio``, are dropped (counted); dev pairs are truncated (counted).

    Raises:
      DataError: a split cannot be read (see ``seq2seq.data.sources``).
      TokenizerError: the tokenizer cannot be trained.
      ValueError: no training pair survives the filters.
    """
    d = config.data
    start = time.perf_counter()
    train_ds, dev_ds = _read(config, "train"), _read(config, "dev")
    test_ds = _read(config, "test") if need_test else None
    train, dev = _text(train_ds), _text(dev_ds)
    test = _text(test_ds) if need_test else Corpus([], [])
    stats: dict[str, float] = {"train_pairs_read": len(train.sources), "dev_pairs": len(dev.sources),
                               "test_pairs": len(test.sources), "read_seconds": time.perf_counter() - start}
    tokenizer = train_or_load(train.sources + train.targets, config.tokenizer, workdir)

    start = time.perf_counter()
    src, tgt = tokenizer.encode(train.sources), tokenizer.encode(train.targets)
    seconds = time.perf_counter() - start
    stats["tokenize_sentences_per_second"] = 2 * len(src) / max(seconds, 1e-9)
    src_len = np.array([len(x) for x in src])
    tgt_len = np.array([len(x) for x in tgt])
    ratio = np.maximum(src_len, tgt_len) / np.maximum(np.minimum(src_len, tgt_len), 1)
    keep = np.flatnonzero((src_len <= d.max_len) & (tgt_len <= d.max_len) & (ratio <= d.max_length_ratio))
    stats["train_pairs_dropped_length"] = int(np.sum((src_len > d.max_len) | (tgt_len > d.max_len)))
    stats["train_pairs_dropped_ratio"] = int(len(src) - len(keep) - stats["train_pairs_dropped_length"])
    stats["train_pairs"] = len(keep)
    if len(keep) == 0:
        raise ValueError(f"no training pair is within max_len={d.max_len} tokens and ratio "
                         f"{d.max_length_ratio}; raise data.max_len")
    src = [src[i] for i in keep]
    tgt = [tgt[i] for i in keep]
    rows = max(1, d.max_tokens // d.max_len)
    train_batches = PackedBatches(src, tgt, max_len=d.max_len, rows=rows, seed=config.train.seed,
                                  packing=d.packing)

    dev_src, n1 = _truncate(tokenizer.encode(dev.sources), d.max_len, tokenizer.eos_id)
    dev_tgt, n2 = _truncate(tokenizer.encode(dev.targets), d.max_len, tokenizer.eos_id)
    stats["dev_pairs_truncated"] = max(n1, n2)
    dev_batches = PackedBatches(dev_src, dev_tgt, max_len=d.max_len, rows=rows, packing=d.packing,
                                shuffle=False)

    stats["dev_sources_in_train"] = overlap_report(train_ds, dev_ds)
    if need_test:
        stats["test_sources_in_train"] = overlap_report(train_ds, test_ds)
    log.info("data: %s", ", ".join(f"{k}={v:.6g}" for k, v in stats.items()))
    return PreparedData(tokenizer, train_batches, dev_batches, dev, test, stats)

