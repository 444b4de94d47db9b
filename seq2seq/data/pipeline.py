"""From config to batches: read the splits, train/load the tokenizers, tokenize, filter, pack.

Token ids are written once to the token store in ``{workdir}/tokens/`` (flat arrays plus
offsets, memory-mapped; see ``seq2seq.data.token_cache``), so a resumed or second run maps them
instead of tokenizing again, and every process of a host shares them through the page cache.
The training text is streamed in blocks and not kept; a resume whose training files are
unchanged (``file_identity``, see ``file_digests``) does not read it at all: the tokenizer,
the ids, the pair counts, the skipped pairs and the hashes of the training sources (for the
dev/test overlap counts) all come from what the first run stored. Training pairs may be dropped by
the length and ratio filters; dev and test pairs never are: over-long dev pairs and test
sources are truncated, and every drop and truncation is counted in ``PreparedData.stats``.
A run with checkpoints never retrains its tokenizer: changed training text is refused, or with
``train.allow_data_change`` tokenized with the run's model (``_tokenizers``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from datasets import Dataset, concatenate_datasets

from seq2seq.config import SPLITS, Config, ConfigError, replace
from seq2seq.data.batching import MixedBatches, PackedBatches, batch_rows
from seq2seq.data.documents import concat_pairs
from seq2seq.data.sources import (
    input_files,
    load_parallel,
    overlap_count,
    source_hashes,
)
from seq2seq.data.token_cache import (
    BLOCK,
    TokenIds,
    combine_digests,
    content_key,
    encode_blocks,
    encode_cached,
    file_digests,
    read_store,
    write_store,
)
from seq2seq.data.tokenizer import (
    Tokenizer,
    TokenizerPair,
    check_options,
    load_pair,
    train_or_load_pair,
)
from seq2seq.workdir import checkpoint_steps

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
      train_corpora: a name per training corpus (``corpus_labels``); ``train`` is a
        ``MixedBatches`` over them when there are several.
      dev_parts / test_parts: ``(name, sentences)`` of each dev/test entry, in the order
        ``dev_text`` / ``test_text`` (and the dev batches) concatenate them.
    """

    tokenizer: TokenizerPair
    train: PackedBatches | MixedBatches
    dev: PackedBatches
    dev_text: Corpus
    test_text: Corpus
    stats: dict[str, float] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    train_corpora: list[str] = field(default_factory=list)
    dev_parts: list[tuple[str, int]] = field(default_factory=list)
    test_parts: list[tuple[str, int]] = field(default_factory=list)


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
    tok = config.tokenizer
    if not tok.joint and tok.vocab_file is None and config.model.share_embeddings == "all":
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
    if not tokenizer.shared_ids and m.share_embeddings == "all":
        raise ConfigError(
            "the source and target tokenizers are separate models; set "
            "model.share_embeddings=target or none"
        )
    sizes = {"vocab_size": ("target", tokenizer.vocab_size)}
    if not tokenizer.shared_ids:
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


def corpus_tags(config: Config) -> list[str]:
    """The target-language tags of all corpus entries (train, dev, test), first use first."""
    tags = [s.tag for split in SPLITS for s in config.data.corpora(split) if s.tag]
    return list(dict.fromkeys(tags))


def check_corpora(config: Config) -> None:
    """Reject corpus entries that cannot work, before any data is read: sampling weights
    (≥ 0, finite, a positive sum, set only in a ``data.train`` list), tags (one token of no
    whitespace), directions (a source and a target language that differ).

    Raises:
      ConfigError: naming the entry (``data.train.1.weight``) and its value.
    """
    d = config.data
    for split in SPLITS:
        entries = d.corpora(split)
        several = isinstance(getattr(d, split), tuple)
        for i, s in enumerate(entries):
            key = f"data.{split}.{i}" if several else f"data.{split}"
            if not math.isfinite(s.weight) or s.weight < 0:
                raise ConfigError(f"{key}.weight must be a finite number >= 0, got {s.weight}")
            if s.weight != 1.0 and not (split == "train" and several):
                raise ConfigError(
                    f"{key}.weight={s.weight}: weights are for the entries of a data.train list"
                )
            if s.tag is not None and (not s.tag or any(c.isspace() for c in s.tag)):
                raise ConfigError(f"{key}.tag must be one token without whitespace, got {s.tag!r}")
            src, tgt = d.direction(s)
            if src == tgt:
                raise ConfigError(f"{key}: source and target language are both {src!r}")
        if split == "train" and several and sum(s.weight for s in entries) <= 0:
            raise ConfigError(
                f"the weights of data.train ({', '.join(str(s.weight) for s in entries)}) "
                "must sum to a positive number"
            )


def corpus_labels(config: Config, split: str) -> list[str]:
    """A name per entry of ``split``: its direction (``en-es``), numbered when repeated."""
    names = ["-".join(config.data.direction(s)) for s in config.data.corpora(split)]
    return [
        f"{n}#{names[:i].count(n) + 1}" if names.count(n) > 1 else n for i, n in enumerate(names)
    ]


def _read(config: Config, split: str, skipped: list[str]) -> list[Dataset]:
    """Each corpus entry of ``split`` as a dataset in its own direction, tag not yet added."""
    data, out = config.data, []
    for source in data.corpora(split):
        places: list[str] = []
        src_lang, tgt_lang = data.direction(source)
        out.append(
            load_parallel(
                source,
                src_lang,
                tgt_lang,
                skip_empty=data.skip_empty,
                split_name=split,
                skipped=places,
            )
        )
        skipped.extend(f"{split}\t{place}" for place in places)
    return out


def _tagged(config: Config, split: str, datasets: list[Dataset]) -> list[Corpus]:
    """The text of each entry, its tag (if any) and a space before every source."""
    out = []
    for source, ds in zip(config.data.corpora(split), datasets):
        corpus = _text(ds)
        if source.tag:
            corpus.sources = [f"{source.tag} {x}" for x in corpus.sources]
        out.append(corpus)
    return out


def _joined(parts: list[Corpus]) -> Corpus:
    return Corpus([x for c in parts for x in c.sources], [y for c in parts for y in c.targets])


def _check_tags(config: Config, tokenizer: TokenizerPair) -> None:
    """Every tag must be one piece of the source vocabulary (an unknown tag, e.g. with a
    reused tokenizer that lacks it, is an error)."""
    source = tokenizer.source
    for split in SPLITS:
        for i, s in enumerate(config.data.corpora(split)):
            if s.tag and source.piece_to_id(s.tag) == source.unk_id:
                raise ConfigError(
                    f"data.{split}.{i}.tag={s.tag!r} is not a piece of the source tokenizer "
                    f"{tokenizer.source.path}: an unknown tag (a tokenizer trained here adds "
                    "every tag to its user-defined symbols; a reused one must have it)"
                )


def unknown_rate(ids: Sequence[np.ndarray], unk_id: int) -> float:
    """Share of the tokens (EOS included) in ``ids`` that are the unknown piece, in [0, 1]."""
    total = sum(len(x) for x in ids)
    return sum(int(np.sum(x == unk_id)) for x in ids) / total if total else 0.0


def _text(ds) -> Corpus:
    return Corpus(list(ds["source"]), list(ds["target"]))


class _Column(Sequence):
    """One side of a training corpus, read from its dataset a block at a time (the text is
    never all in memory); ``prefix`` (a tag and a space) goes before every sentence.

    ``dataset`` is called on first use, so a resume that finds the tokenizer and the token
    store up to date never reads the text."""

    def __init__(self, dataset: Callable[[], Dataset], column: str, prefix: str = ""):
        self.dataset, self.column, self.prefix = dataset, column, prefix

    def __len__(self) -> int:
        return len(self.dataset())

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            first, stop, step = i.indices(len(self))
            if step != 1:
                return [self[j] for j in range(first, stop, step)]
            texts = self.dataset()[first:stop][self.column]
            return [self.prefix + t for t in texts] if self.prefix else texts
        return self.prefix + self.dataset()[int(i)][self.column]

    def __iter__(self) -> Iterator[str]:
        for first in range(0, len(self), BLOCK):
            yield from self[first : first + BLOCK]


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

    def __call__(self, tokenizer: Tokenizer, texts: Sequence[str], name: str) -> TokenIds:
        ids, hit, seconds = encode_cached(tokenizer, texts, self.cache_dir, name)
        self.count(hit, len(texts), seconds)
        return ids

    def count(self, hit: bool, sentences: int, seconds: float) -> None:
        """Tally one split side read from the store (``hit``) or tokenized now."""
        if hit:
            self.stats["token_cache_hits"] += 1
            self.stats["token_cache_seconds"] += seconds
        else:
            self.stats["tokenize_sentences"] += sentences
            self.stats["tokenize_seconds"] += seconds
            if self.stats["tokenize_seconds"] > 0:
                self.stats["tokenize_sentences_per_second"] = (
                    self.stats["tokenize_sentences"] / self.stats["tokenize_seconds"]
                )


class _Chained(Sequence):
    """Several sequences of sentences read one after the other (iteration only), no copy."""

    def __init__(self, parts: Sequence[Sequence[str]]):
        self.parts = parts

    def __len__(self) -> int:
        return sum(len(p) for p in self.parts)

    def __getitem__(self, i):  # type: ignore[override]
        for part in self.parts:
            if i < len(part):
                return part[i]
            i -= len(part)
        raise IndexError(i)

    def __iter__(self) -> Iterator[str]:
        for part in self.parts:
            yield from part


# What makes the token store of a training corpus side, beyond its files' contents: bump when
# reading or cleaning the text changes (seq2seq.data.sources).
READER_VERSION = 1


class _TrainText:
    """The training corpora, read only when the tokenizer or the token store needs the text.

    A corpus of plain files (``text``/``tsv``/``csv``/``jsonl``) is identified by
    ``inputs(i)``: its files' fingerprint (``file_digests``: a ``stat`` and a few sampled
    blocks per file when they have not changed) and how they are read. The tokenizer and the
    token store are keyed by it, so a resume with unchanged files never reads the text;
    changed files give a new fingerprint, a tokenizer check against the text, and a new
    store. ``files`` holds the digest of every file fingerprinted so far (path → SHA-256).
    """

    def __init__(self, config: Config, cache: Path):
        self.config, self.cache = config, cache
        self.sources = config.data.corpora("train")
        self._datasets: list[Dataset | None] = [None] * len(self.sources)
        self._inputs: list[str | None | bool] = [False] * len(self.sources)  # False: not yet
        self.files: dict[str, str] = {}
        self.skipped: list[list[str]] = [[] for _ in self.sources]
        self.read_seconds = 0.0

    def dataset(self, i: int) -> Dataset:
        """Corpus ``i`` as ``load_parallel`` reads it (read on first use)."""
        ds = self._datasets[i]
        if ds is None:
            start, places = time.perf_counter(), list[str]()
            source, data = self.sources[i], self.config.data
            ds = load_parallel(
                source,
                *data.direction(source),
                skip_empty=data.skip_empty,
                split_name="train",
                skipped=places,
            )
            self._datasets[i] = ds
            self.skipped[i] = [f"train\t{place}" for place in places]
            self.read_seconds += time.perf_counter() - start
        return ds

    def column(self, i: int, side: str) -> _Column:
        tag = self.sources[i].tag if side == "source" else None
        return _Column(lambda: self.dataset(i), side, f"{tag} " if tag else "")

    def columns(self, side: str) -> list[_Column]:
        return [self.column(i, side) for i in range(len(self.sources))]

    def inputs(self, i: int) -> str | None:
        """Fingerprint of corpus ``i``'s files and how they are read; None: not plain files."""
        known = self._inputs[i]
        if known is False:
            source, data = self.sources[i], self.config.data
            files = input_files(source, *data.direction(source))
            known = None
            if files is not None:
                how = {k: v for k, v in vars(source).items() if k != "weight"}
                how.update(skip_empty=data.skip_empty, reader=READER_VERSION)
                how["direction"] = list(data.direction(source))
                digests = file_digests(files, self.cache / "files.json")
                self.files.update(zip((str(f.resolve()) for f in files), digests))
                text = f"{json.dumps(how, sort_keys=True)}|{combine_digests(digests)}"
                known = hashlib.sha256(text.encode()).hexdigest()
            self._inputs[i] = known
        return known  # type: ignore[return-value]

    def inputs_all(self) -> str | None:
        every = [self.inputs(i) for i in range(len(self.sources))]
        return None if None in every else hashlib.sha256("|".join(every).encode()).hexdigest()  # type: ignore[arg-type]

    def encode(
        self, encode: _Encoder, tokenizer: Tokenizer, i: int, side: str, name: str
    ) -> tuple[TokenIds, dict]:
        """Corpus ``i``'s ``side`` as token ids, from the store when it is up to date; the
        store's ``meta`` holds ``key``, and on the source side ``pairs_read`` and
        ``skipped`` (so a resume needs no text for them either)."""
        start = time.perf_counter()
        inputs = self.inputs(i)
        text = self.column(i, side)
        key = content_key(
            None if inputs else text, tokenizer, inputs=f"{inputs}|{side}" if inputs else None
        )
        stored = read_store(self.cache, f"{name}.{side}", key)
        if stored is not None:
            encode.count(True, len(stored[0]), time.perf_counter() - start)
            self.skipped[i] = list(stored[1].get("skipped", []))
            return stored[0], {**stored[1], "key": key}
        start = time.perf_counter()
        meta = {"pairs_read": len(text), "skipped": self.skipped[i]} if side == "source" else {}
        ids = write_store(
            self.cache,
            f"{name}.{side}",
            key,
            encode_blocks(tokenizer, text),
            tokenizer.vocab_size,
            meta,
        )
        if side == "source":
            self._write_hashes(i, f"{name}.{side}", key)
        encode.count(False, len(ids), time.perf_counter() - start)
        return ids, {**meta, "key": key}

    def _write_hashes(self, i: int, name: str, key: str) -> np.ndarray:
        untagged = _Column(lambda: self.dataset(i), "source")
        hashes = np.unique(
            np.concatenate(
                [source_hashes(untagged[a : a + BLOCK]) for a in range(0, len(untagged), BLOCK)]
            )
        )
        path = self.cache / f"{name}.{key[:32]}.hashes"
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        hashes.tofile(tmp)
        tmp.replace(path)
        return hashes

    def hashes(self, i: int, meta: dict) -> np.ndarray:
        """Sorted unique ``source_hashes`` of corpus ``i``'s sources (untagged, as read)."""
        name = f"train{i}.source" if len(self.sources) > 1 else "train.source"
        path = self.cache / f"{name}.{meta['key'][:32]}.hashes"
        if path.is_file() and path.stat().st_size % 8 == 0:
            return np.fromfile(path, np.uint64)
        return self._write_hashes(i, name, meta["key"])


def prepare(
    config: Config,
    workdir: str | Path,
    *,
    need_test: bool = True,
    tokenizer: TokenizerPair | None = None,
) -> PreparedData:
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

    Several corpora (a list in ``data.train``/``dev``/``test``): each entry is read in its own
    direction, its ``tag`` prepended to its sources; the tokenizer is trained on all training
    corpora with every tag among its user-defined symbols; each training corpus is filtered
    and packed on its own (``train_{i}_pairs`` etc. in ``stats``) and sampled by its weight
    (``MixedBatches``); dev and test entries are concatenated in order (``dev_parts``,
    ``test_parts``). ``tokenizer``: use these models instead of training or loading the run's;
    with ``train.init_from`` the models in ``workdir`` (copied from the parent by
    ``seq2seq.run``) are loaded, never trained.

    Raises:
      ConfigError: tokenizer settings that cannot work (see ``check_vocabularies``), or a
        tag that is not one piece of a given tokenizer.
      DataError: a split cannot be read (see ``seq2seq.data.sources``).
      TokenizerError: a tokenizer cannot be trained or loaded.
      ValueError: no training pair survives the filters.
    """
    check_vocabularies(config)
    cache = Path(workdir) / "tokens"
    skipped: list[str] = []
    text, stats = _read_splits(config, cache, skipped, need_test)
    tokenizer = _tokenizers(config, workdir, text.train, tokenizer, stats)
    encode = _Encoder(cache, stats)
    rows = batch_rows(config.data)
    train = _train_batches(config, text.train, tokenizer, encode, rows, stats, skipped)
    dev_batches, unknown = _dev_batches(config, text.dev, tokenizer, encode, rows, stats)
    unknown = {
        "train.source": (train.sources, tokenizer.source),
        "train.target": (train.targets, tokenizer.target),
        **unknown,
    }
    if need_test:
        unknown.update(_test_tokens(config, text.test, tokenizer, encode, stats))
    _report(config, stats, unknown, train.hashes, text, need_test)

    def parts(split: str, corpora: list[Corpus]) -> list[tuple[str, int]]:
        return list(zip(corpus_labels(config, split), (len(c.sources) for c in corpora)))

    return PreparedData(
        tokenizer,
        train.batches,
        dev_batches,
        text.dev,
        text.test,
        stats,
        skipped,
        corpus_labels(config, "train"),
        parts("dev", text.dev_parts),
        parts("test", text.test_parts) if need_test else [],
    )


@dataclass
class _Splits:
    """The text of a run's splits (``_read_splits``): the training corpora (read lazily),
    the dev and test datasets as read, tagged per entry (``*_parts``) and joined."""

    train: _TrainText
    dev_ds: list[Dataset]
    test_ds: list[Dataset]
    dev_parts: list[Corpus]
    test_parts: list[Corpus]
    dev: Corpus
    test: Corpus


def _read_splits(
    config: Config, cache: Path, skipped: list[str], need_test: bool
) -> tuple[_Splits, dict[str, float]]:
    """Read the dev and test splits (no test split unless ``need_test``) and check that every
    plain training file can be read (the training text itself is read when needed).

    Returns:
      The splits, and the stats begun with ``train_pairs_read`` (0 until the training
      corpora are encoded), ``dev_pairs``, ``test_pairs`` and ``read_seconds``. Pairs
      skipped for an empty side are appended to ``skipped``.

    Raises:
      DataError: a split cannot be read (a missing training file is named first).
    """
    start = time.perf_counter()
    train = _TrainText(config, cache)
    for i, source in enumerate(train.sources):  # a missing training file is named first
        if source.format in ("text", "tsv", "csv", "jsonl") and train.inputs(i) is None:
            train.dataset(i)  # raises the reader's DataError naming the file
    dev_ds = _read(config, "dev", skipped)
    test_ds = _read(config, "test", skipped) if need_test else []
    dev_parts = _tagged(config, "dev", dev_ds)
    test_parts = _tagged(config, "test", test_ds) if need_test else []
    dev, test = _joined(dev_parts), _joined(test_parts)
    stats: dict[str, float] = {
        "train_pairs_read": 0,
        "dev_pairs": len(dev.sources),
        "test_pairs": len(test.sources),
        "read_seconds": time.perf_counter() - start,
    }
    return _Splits(train, dev_ds, test_ds, dev_parts, test_parts, dev, test), stats


def _tokenizers(
    config: Config,
    workdir: str | Path,
    train: _TrainText,
    tokenizer: TokenizerPair | None,
    stats: dict[str, float],
) -> TokenizerPair:
    """The run's tokenizers: ``tokenizer`` when given; with ``train.init_from`` the models in
    ``workdir`` (the parent's, copied there by the run); else trained on the training
    corpora (every corpus tag among the user-defined symbols) or loaded when already trained.
    A run with checkpoints never retrains them (their embeddings index the pieces): a change
    of the training text is refused, or with ``train.allow_data_change`` the models are kept
    for the new text (``train_or_load``'s ``on_change``). Sets
    ``stats["tokenizer_seconds"]`` (reading the training text not included).

    Raises:
      ConfigError: a corpus tag is not one piece of the tokenizer.
      TokenizerError: a tokenizer cannot be trained or loaded, or the training text of a run
        with checkpoints changed (the message names the model, the files and how to go on).
    """
    d = config.data
    start = time.perf_counter()
    if tokenizer is None and config.train.init_from:  # the parent's, copied here by the run
        tokenizer = load_pair(config.tokenizer, workdir, src_lang=d.src_lang, tgt_lang=d.tgt_lang)
    if tokenizer is None:
        tags = [t for t in corpus_tags(config) if t not in config.tokenizer.user_defined_symbols]
        options = config.tokenizer
        if tags:
            options = replace(options, user_defined_symbols=[*options.user_defined_symbols, *tags])
        inputs, on_change = train.inputs_all(), "retrain"
        if checkpoint_steps(workdir):
            on_change = "keep" if config.train.allow_data_change else "refuse"
        tokenizer = train_or_load_pair(
            _Chained(train.columns("source")),
            _Chained(train.columns("target")),
            options,
            workdir,
            src_lang=d.src_lang,
            tgt_lang=d.tgt_lang,
            inputs=inputs,
            files=train.files if inputs else None,
            on_change=on_change,
        )
    _check_tags(config, tokenizer)
    stats["tokenizer_seconds"] = time.perf_counter() - start - train.read_seconds
    return tokenizer


@dataclass
class _TrainTokens:
    """The training side of ``prepare`` (``_train_batches``): the batches, the kept pairs'
    token ids per corpus (for the unknown-piece rates) and the source hashes of every pair
    read (for the dev/test overlap)."""

    batches: PackedBatches | MixedBatches
    sources: list[TokenIds]
    targets: list[TokenIds]
    hashes: list[np.ndarray]


def _train_batches(
    config: Config,
    train: _TrainText,
    tokenizer: TokenizerPair,
    encode: _Encoder,
    rows: int,
    stats: dict[str, float],
    skipped: list[str],
) -> _TrainTokens:
    """Each training corpus through the token store, filtered by ``data.max_len`` and
    ``data.max_length_ratio``, optionally concatenated into pseudo-documents, and packed in
    ``rows`` rows; several corpora are mixed by their weights (``MixedBatches``).

    Counts the pairs read, dropped and kept into ``stats`` (per corpus too when there are
    several), adds the time spent reading the training text to ``read_seconds`` and the
    training pairs skipped for an empty side to the front of ``skipped``.

    Raises:
      ValueError: no training pair of a corpus survives the filters.
    """
    d = config.data
    several = len(train.sources) > 1
    cache = encode.cache_dir
    kept_src: list[TokenIds] = []
    kept_tgt: list[TokenIds] = []
    packed = []
    train_hashes = []
    for i in range(len(train.sources)):
        name = f"train{i}" if several else "train"
        src, src_meta = train.encode(encode, tokenizer.source, i, "source", name)
        tgt, _ = train.encode(encode, tokenizer.target, i, "target", name)
        stats["train_pairs_read"] += src_meta["pairs_read"]
        train_hashes.append(train.hashes(i, src_meta))
        src_len, tgt_len = src.lengths, tgt.lengths
        ratio = np.maximum(src_len, tgt_len) / np.maximum(np.minimum(src_len, tgt_len), 1)
        keep = np.flatnonzero(
            (src_len <= d.max_len) & (tgt_len <= d.max_len) & (ratio <= d.max_length_ratio)
        )
        long = int(np.sum((src_len > d.max_len) | (tgt_len > d.max_len)))
        for key, value in (
            ("train_pairs_dropped_length", long),
            ("train_pairs_dropped_ratio", len(src) - len(keep) - long),
            ("train_pairs", len(keep)),
        ):
            stats[key] = stats.get(key, 0) + value
            if several:
                stats[key.replace("train_", f"train_{i}_")] = value
        if len(keep) == 0:
            which = f" of data.train.{i}" if several else ""
            raise ValueError(
                f"no training pair{which} is within max_len={d.max_len} tokens and ratio "
                f"{d.max_length_ratio}; raise data.max_len"
            )
        src, tgt = src.select(keep), tgt.select(keep)
        if d.concat_pairs_to_tokens > 0:  # pseudo-documents (long inputs)
            docs = concat_pairs(
                src.to_list(), tgt.to_list(), d.concat_pairs_to_tokens, tokenizer.eos_id
            )
            src, tgt = TokenIds.from_list(docs[0]), TokenIds.from_list(docs[1])
            stats["train_documents"] = stats.get("train_documents", 0) + len(src)
        kept_src.append(src)
        kept_tgt.append(tgt)
        batching = json.dumps(
            [src_meta["key"], d.max_len, d.max_length_ratio, d.concat_pairs_to_tokens, rows]
            + [config.train.seed, d.packing]
        )
        sizes = f"{name}.epochs.{hashlib.sha256(batching.encode()).hexdigest()[:16]}.json"
        packed.append(
            PackedBatches(
                src,
                tgt,
                max_len=d.max_len,
                rows=rows,
                seed=config.train.seed,
                packing=d.packing,
                sizes_file=cache / sizes,
            )
        )
    skipped[:0] = [place for places in train.skipped for place in places]  # train first
    stats["read_seconds"] += train.read_seconds
    train_batches: PackedBatches | MixedBatches = packed[0]
    if several:
        train_batches = MixedBatches(
            packed, [s.weight for s in d.corpora("train")], seed=config.train.seed
        )
    stats["train_real_token_share"] = train_batches.real_token_share(0)
    return _TrainTokens(train_batches, kept_src, kept_tgt, train_hashes)


_Unknown = dict[str, tuple[list[TokenIds], Tokenizer]]  # split.side → (ids, its tokenizer)


def _dev_batches(
    config: Config,
    dev: Corpus,
    tokenizer: TokenizerPair,
    encode: _Encoder,
    rows: int,
    stats: dict[str, float],
) -> tuple[PackedBatches, _Unknown]:
    """The dev pairs through the token store, truncated to ``data.max_len`` tokens per side
    (counted in ``stats["dev_pairs_truncated"]``) and packed in corpus order.

    Returns:
      The dev batches, and the ids of each side for the unknown-piece rates.
    """
    d = config.data
    dev_src, cut_src = _truncate(
        encode(tokenizer.source, dev.sources, "dev.source").to_list(), d.max_len, tokenizer.eos_id
    )
    dev_tgt, cut_tgt = _truncate(
        encode(tokenizer.target, dev.targets, "dev.target").to_list(), d.max_len, tokenizer.eos_id
    )
    stats["dev_pairs_truncated"] = int(np.sum(cut_src | cut_tgt))
    dev_batches = PackedBatches(
        dev_src, dev_tgt, max_len=d.max_len, rows=rows, packing=d.packing, shuffle=False
    )
    return dev_batches, {
        "dev.source": ([TokenIds.from_list(dev_src)], tokenizer.source),
        "dev.target": ([TokenIds.from_list(dev_tgt)], tokenizer.target),
    }


def _test_tokens(
    config: Config,
    test: Corpus,
    tokenizer: TokenizerPair,
    encode: _Encoder,
    stats: dict[str, float],
) -> _Unknown:
    """The test pairs through the token store (only their unknown-piece rates and the count
    of sources above ``decode_source_limit``, ``stats["test_sources_truncated"]``, are needed
    now: the test split is decoded from its text)."""
    test_src = encode(tokenizer.source, test.sources, "test.source")
    limit = decode_source_limit(config)
    stats["test_sources_truncated"] = int(np.sum(test_src.lengths > limit))
    test_tgt = encode(tokenizer.target, test.targets, "test.target")
    return {
        "test.source": ([test_src], tokenizer.source),
        "test.target": ([test_tgt], tokenizer.target),
    }


def _report(
    config: Config,
    stats: dict[str, float],
    unknown: _Unknown,
    train_hashes: list[np.ndarray],
    text: _Splits,
    need_test: bool,
) -> None:
    """Complete ``stats`` with the unknown-piece rate of each split side in ``unknown`` and
    the dev/test sources also in the training data, and log them (with a warning for
    truncated dev pairs or test sources)."""
    for name, (ids, tok) in unknown.items():
        tokens = sum(int(x.lengths.sum()) for x in ids)
        unk = sum(x.count(tok.unk_id) for x in ids)
        stats[f"{name.replace('.', '_')}_unknown_rate"] = unk / tokens if tokens else 0.0
    log.info(
        "unknown pieces (share of tokens): %s",
        ", ".join(
            f"{name} {stats[name.replace('.', '_') + '_unknown_rate']:.3%}" for name in unknown
        ),
    )

    # each corpus's hashes are sorted and unique already
    seen = train_hashes[0] if len(train_hashes) == 1 else np.unique(np.concatenate(train_hashes))
    stats["dev_sources_in_train"] = overlap_count(seen, concatenate_datasets(text.dev_ds))
    if need_test:
        stats["test_sources_in_train"] = overlap_count(seen, concatenate_datasets(text.test_ds))
    del seen
    if stats["dev_pairs_truncated"]:
        log.warning(
            "dev: %d pairs longer than data.max_len=%d tokens truncated (none dropped)",
            stats["dev_pairs_truncated"],
            config.data.max_len,
        )
    if stats.get("test_sources_truncated"):
        log.warning(
            "test: %d sources longer than %d tokens will be truncated (none dropped)",
            stats["test_sources_truncated"],
            decode_source_limit(config),
        )
    log.info("data: %s", ", ".join(f"{k}={v:.6g}" for k, v in stats.items()))


def split_text(config: Config, split: str) -> Corpus:
    """The raw text of a whole split, every entry in its direction and with its tag, in
    order (what the run trained or was scored on; e.g. ``seq2seq-evaluate`` on the test
    split).

    Raises:
      DataError: a corpus entry cannot be read.
    """
    return _joined(_tagged(config, split, _read(config, split, [])))
